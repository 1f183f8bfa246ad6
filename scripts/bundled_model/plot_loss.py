#!/usr/bin/env python3
"""Draw the loss curve of a training log (train.py --log) as a standalone SVG:
training LM and MTP losses per logged step, and the held-out losses of the
periodic evaluations as points. No plotting library needed."""

import argparse
import json
from pathlib import Path

W, H = 720, 400
LEFT, RIGHT, TOP, BOTTOM = 60, 20, 30, 50
SERIES = [  # (label, colour, source, key)
    ("train LM loss", "#1f77b4", "curve", "lm_loss"),
    ("train MTP loss", "#ff7f0e", "curve", "mtp_loss"),
    ("held-out LM loss", "#2ca02c", "evals", "lm_loss"),
    ("held-out MTP loss", "#d62728", "evals", "mtp_loss"),
]


def render(log: dict, series=SERIES, title: str = "loss (nats/token)") -> str:
    """The SVG text: each series is (label, colour, log key of a list of
    records, record key); "curve" series are lines, others points."""
    steps = log["steps"]
    values = [r[k] for _, _, src, k in series for r in log[src] if k in r]
    y_max = min(max(values), 9.0)
    y_min = 0.0

    def px(step):
        return LEFT + (W - LEFT - RIGHT) * step / max(1, steps)

    def py(v):
        v = min(v, y_max)
        return TOP + (H - TOP - BOTTOM) * (1 - (v - y_min) / (y_max - y_min))

    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" viewBox="0 0 {W} {H}" '
           'font-family="sans-serif" font-size="12">',
           f'<rect width="{W}" height="{H}" fill="white"/>']
    for i in range(int(y_max) + 1):
        y = py(i)
        out.append(f'<line x1="{LEFT}" y1="{y:.1f}" x2="{W - RIGHT}" y2="{y:.1f}" stroke="#ddd"/>')
        out.append(f'<text x="{LEFT - 8}" y="{y + 4:.1f}" text-anchor="end">{i}</text>')
    tick = max(1, round(steps / 7, -2))
    for s in range(0, steps + 1, int(tick)):
        x = px(s)
        out.append(f'<line x1="{x:.1f}" y1="{H - BOTTOM}" x2="{x:.1f}" y2="{H - BOTTOM + 5}" stroke="#333"/>')
        out.append(f'<text x="{x:.1f}" y="{H - BOTTOM + 18}" text-anchor="middle">{s}</text>')
    out.append(f'<line x1="{LEFT}" y1="{H - BOTTOM}" x2="{W - RIGHT}" y2="{H - BOTTOM}" stroke="#333"/>')
    out.append(f'<line x1="{LEFT}" y1="{TOP}" x2="{LEFT}" y2="{H - BOTTOM}" stroke="#333"/>')
    out.append(f'<text x="{(W + LEFT) / 2}" y="{H - 12}" text-anchor="middle">step</text>')
    out.append(f'<text x="16" y="{(H - BOTTOM + TOP) / 2}" text-anchor="middle" '
               f'transform="rotate(-90 16 {(H - BOTTOM + TOP) / 2})">{title}</text>')
    for i, (label, colour, src, key) in enumerate(series):
        pts = [(px(r["step"]), py(r[key])) for r in log[src] if key in r]
        if src == "curve":
            path = " ".join(f"{x:.1f},{y:.1f}" for x, y in pts)
            out.append(f'<polyline points="{path}" fill="none" stroke="{colour}" stroke-width="1.5"/>')
        else:
            out += [f'<circle cx="{x:.1f}" cy="{y:.1f}" r="3.5" fill="{colour}"/>' for x, y in pts]
        lx, ly = W - RIGHT - 170, TOP + 10 + 18 * i
        out.append(f'<rect x="{lx}" y="{ly - 9}" width="12" height="12" fill="{colour}"/>')
        out.append(f'<text x="{lx + 18}" y="{ly + 1}">{label}</text>')
    out.append("</svg>")
    return "\n".join(out) + "\n"


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--log", type=Path, required=True)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    args.out.write_text(render(json.loads(args.log.read_text())))


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Turn a DFlash drafter's training_log.json (train_dflash.py) into the model
card's figures: the loss curve as an SVG (plot_loss.render) and, on stdout,
markdown tables of the training curve and of the held-out acceptance by block
position for each evaluated block size.

Usage: python3 scripts/bundled_model/dflash_report.py --log DIR/training_log.json --svg DIR/loss_curve.svg
"""

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from plot_loss import render  # noqa: E402

SERIES = [  # (label, colour, source, key)
    ("train loss (weighted CE)", "#1f77b4", "curve", "loss"),
    ("held-out loss", "#d62728", "evals", "heldout_loss"),
]


def curve_table(log: dict, rows: int = 10) -> list[str]:
    """The first and last logged steps and (at most `rows`) evaluation steps,
    each with the training record logged at or just before it."""
    curve = log["curve"]
    evals = {e["step"]: e for e in log["evals"]}
    shown = sorted(evals)
    if len(shown) > rows:
        shown = [shown[round(i * (len(shown) - 1) / (rows - 1))] for i in range(rows)]
    picks = sorted({curve[0]["step"], *shown, curve[-1]["step"]})
    out = ["| step | seconds | lr | train loss | train top-1 | held-out loss* | held-out accepted per block (16)* |",
           "|---|---|---|---|---|---|---|"]
    for s in picks:
        r = max((c for c in curve if c["step"] <= s), key=lambda c: c["step"])
        e = evals.get(s)
        loss = f"{e['heldout_loss']:.3f}" if e else ""
        length = f"{e['block_16']['acceptance_length']:.2f}" if e else ""
        out.append(f"| {s} | {r['seconds']:.0f} | {r['lr']:.1e} | {r['loss']:.3f} | {r['top1']:.3f} | {loss} | {length} |")
    return out


def acceptance_table(final: dict) -> list[str]:
    sizes = sorted(int(k.split("_")[1]) for k in final if k.startswith("block_"))
    longest = max(sizes) - 1
    out = ["| block size | accepted drafts per block | tokens per step | " +
           " | ".join(f"k={k}" for k in range(1, longest + 1)) + " |",
           "|---|---|---|" + "---|" * longest]
    for b in sizes:
        e = final[f"block_{b}"]
        rates = [f"{r:.3f}" for r in e["acceptance_by_position"]] + [""] * (longest - (b - 1))
        out.append(f"| {b} | {e['acceptance_length']:.2f} | {1 + e['acceptance_length']:.2f} | " +
                   " | ".join(rates) + " |")
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--log", type=Path, required=True)
    ap.add_argument("--svg", type=Path, required=True)
    args = ap.parse_args()
    log = json.loads(args.log.read_text())
    args.svg.write_text(render(log, SERIES))
    final = log["final_eval_float32_bf16_weights"]
    pool, held = log["train_pool"], log["heldout_pool"]
    print(f"{log['steps']} steps, {log['train_seconds']:.0f} s of training, {log['total_seconds']:.0f} s in all "
          f"on {log['device_name']} (torch {log['torch']}); training data: {pool['sequences']} continuations "
          f"({pool['generated_tokens']} generated tokens, {pool['seconds']:.0f} s); held-out: {held['sequences']} "
          f"continuations, {final['block_16']['anchors']} anchors; held-out loss {final['heldout_loss']:.3f}.")
    print()
    print("\n".join(curve_table(log)))
    print()
    print("\\* Every `--eval-every` steps on the held-out continuations, bf16 autocast, block 16.")
    print()
    print("\n".join(acceptance_table(final)))


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Tables of this report from the raw JSON: python3 raw/summarize.py raw"""
import collections
import glob
import gzip
import json
import os
import sys

root = sys.argv[1] if len(sys.argv) > 1 else os.path.dirname(__file__)


def steps(j):
    d = {}
    for x in j.get("decode", []):
        d[f"decode b{x['batch']} ms"] = x["step_time"]["median_ms"]
    for x in j.get("verify", []):
        d[f"verify b{x['batch']} k{x['k']} ms"] = x["step_time"]["median_ms"]
    for x in (j.get("speculative") or {}).get("runs", []):
        d[f"replay b{x['batch']} tok/s"] = x["speculative_tokens_per_s"]
    return d


def ab(folder, prefix, variants):
    runs = collections.defaultdict(dict)
    for f in sorted(glob.glob(os.path.join(root, folder, f"{prefix}_*.json"))):
        v, r = os.path.basename(f)[len(prefix) + 1:-5].rsplit("_", 1)
        runs[v][r] = steps(json.load(open(f)))
    keys = list(next(iter(runs[variants[0]].values())).keys())
    print(f"\n{folder}/{prefix}: " + " | ".join(variants) + " (rounds in order)")
    for k in keys:
        cells = ["/".join(f"{runs[v][r][k]:.3f}" if "ms" in k else f"{runs[v][r][k]:.1f}"
                          for r in sorted(runs[v])) for v in variants]
        print(f"  {k:18s} " + " | ".join(cells))


ab("norm-rows", "q36", ["base", "verify", "4"])
ab("route-in-router", "q36", ["old", "new"])
ab("route-in-router", "df7", ["old", "new"])
ab("moe-block-rows", "q36", ["base", "g4", "g16", "d16", "d64"])
ab("decode-splits-ab", "q36", ["base", "seq1"])
ab("state-slots", "q36", ["copy", "swap"])
ab("state-slots", "df7", ["copy", "swap"])
ab("state-slots", "df15", ["copy", "swap"])

print("\nreplay through serve against bench-model (state-slots, final binary)")
for mode in ["default", "bi"]:
    res = json.load(open(os.path.join(root, "state-slots", f"serve-replay-{mode}", "result.json")))["result"]
    bm = json.load(open(os.path.join(root, "state-slots", f"bm_replay_{mode}.json")))["speculative"]["runs"]
    bm = {x["batch"]: x for x in bm}
    for c in res["stream_curve"]:
        b = bm[c["concurrency"]]
        acc = "/".join(f"{p['median']:.2f}" for p in c["per_position_acceptance"])
        print(f"  {mode:7s} streams {c['concurrency']}: serve {c['aggregate_tps']['median']:.1f} tok/s "
              f"(CV {100 * c['aggregate_tps']['cv']:.2f} %, {c['tokens_per_step']['median']:.2f} a step, {acc}); "
              f"bench-model {b['speculative_tokens_per_s']:.1f} "
              f"({b['acceptance_length']:.2f} a step); ratio {c['aggregate_tps']['median'] / b['speculative_tokens_per_s']:.3f}")

print("\nKESTREL_DECODE_SPLITS as committed (decode-splits/)")
res = json.load(open(os.path.join(root, "decode-splits", "serve-replay", "result.json")))["result"]
bms = {v: json.load(open(os.path.join(root, "decode-splits", f"bm_{v}.json"))) for v in ["sequence", "step"]}
for v, j in bms.items():
    print(f"  bench-model {v:8s} " + "  ".join(f"{k} {x:.3f}" if "ms" in k else f"{k} {x:.1f}" for k, x in steps(j).items()))
seq = {x["batch"]: x for x in bms["sequence"]["speculative"]["runs"]}
for c in res["stream_curve"]:
    b = seq[c["concurrency"]]
    acc = "/".join(f"{p['median']:.2f}" for p in c["per_position_acceptance"])
    print(f"  serve streams {c['concurrency']}: {c['aggregate_tps']['median']:.1f} tok/s (CV {100 * c['aggregate_tps']['cv']:.2f} %, "
          f"{c['tokens_per_step']['median']:.2f} a step, {acc}); bench-model (sequence) {b['speculative_tokens_per_s']:.1f}; "
          f"ratio {c['aggregate_tps']['median'] / b['speculative_tokens_per_s']:.3f}")

print("\nkernel durations of one eager step (ncu, final/)")
for what in ["verify", "decode"]:
    rows = []
    with gzip.open(os.path.join(root, "final", f"ncu_{what}.csv.gz"), "rt") as f:
        import csv
        for r in csv.reader(l for l in f if l.startswith('"')):
            if r[0] != "ID":
                rows.append((r[4], float(r[14].replace(",", ""))))
    ends = [i for i, r in enumerate(rows) if r[0] == "argmax_merge"]
    step = rows[ends[-2] + 1:ends[-1] + 1]
    total = sum(ns for _, ns in step)
    by = collections.Counter()
    calls = collections.Counter()
    for name, ns in step:
        by[name] += ns
        calls[name] += 1
    print(f"  {what}: {len(step)} kernels, {total / 1e3:.0f} us")
    for name, ns in by.most_common(9):
        print(f"    {name:28s} {calls[name]:4d} {ns / 1e3:8.1f} us {100 * ns / total:5.1f} %")

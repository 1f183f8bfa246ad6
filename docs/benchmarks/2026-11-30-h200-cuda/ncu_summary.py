# Summarise an ncu CSV (gpu__time_duration.sum per launch) by kernel name.
# Usage: ncu_summary.py CSV MODE  (MODE: all | last-step: kernels after the
# second-to-last argmax_rows, i.e. the last decode step)
import csv, sys, collections, json
rows = []
with open(sys.argv[1]) as f:
    lines = [l for l in f if l.startswith('"')]
for r in csv.DictReader(lines):
    if r.get("Metric Name") != "gpu__time_duration.sum":
        continue
    v = float(r["Metric Value"].replace(",", ""))
    unit = r.get("Metric Unit", "ns")
    ns = v * {"ns": 1, "nsecond": 1, "us": 1e3, "usecond": 1e3, "ms": 1e6, "msecond": 1e6}.get(unit, 1)
    rows.append((int(r["ID"]), r["Kernel Name"].split("(")[0], ns))
rows.sort()
names = [n for _, n, _ in rows]
if sys.argv[2] == "last-step":
    ends = [i for i, n in enumerate(names) if n.startswith("argmax_rows")]
    rows = rows[ends[-2] + 1 : ends[-1] + 1]
else:
    rows = [r for r in rows if not r[1].startswith("dummy_fill")]
runs = int(sys.argv[3]) if len(sys.argv) > 3 else 1  # identical runs profiled: per-run figures
agg = collections.OrderedDict()
for _, n, ns in rows:
    key = n if len(n) < 60 else n[:60]
    c, t = agg.get(key, (0, 0.0))
    agg[key] = (c + 1, t + ns / (runs if sys.argv[2] == "all" else 1))
total = sum(t for c, t in agg.values())
out = sorted(agg.items(), key=lambda kv: -kv[1][1])
print(f"{len(rows)} launches over {runs if sys.argv[2] == 'all' else 1} run(s), {total/1e6:.3f} ms of kernel time per run")
for k, (c, t) in out:
    print(f"  {k:<60} {c:>6} {t/1e6:>9.3f} ms  {100*t/total:5.1f}%")
json.dump({"launches": len(rows), "kernel_ms": total / 1e6,
           "kernels": [{"name": k, "launches": c, "ms": t / 1e6} for k, (c, t) in out]},
          open(sys.argv[1] + ".summary.json", "w"), indent=1)

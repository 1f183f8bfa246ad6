import json, sys, glob, os
R = sys.argv[1]
def load(p):
    try: return json.load(open(p))
    except Exception as e: return None
rows = {}
for f in sorted(glob.glob(f"{R}/q36_*_*.json")):
    v, rnd = os.path.basename(f)[4:-5].split("_")
    d = load(f)
    if not d: continue
    for x in d["decode"]:
        rows.setdefault(f"decode b{x['batch']} ms", {}).setdefault(v, []).append(x["step_time"]["median_ms"])
    for x in d["verify"]:
        rows.setdefault(f"verify b{x['batch']} k{x['k']} ms", {}).setdefault(v, []).append(x["step_time"]["median_ms"])
    for x in d["speculative"]["runs"] if d.get("speculative") else []:
        rows.setdefault(f"mtp replay b{x['batch']} tok/s", {}).setdefault(v, []).append(round(x["speculative_tokens_per_s"], 1))
        rows.setdefault(f"mtp replay b{x['batch']} plain tok/s", {}).setdefault(v, []).append(round(x["plain_tokens_per_s"], 1))
        rows.setdefault(f"mtp replay b{x['batch']} same", {}).setdefault(v, []).append(f"{x['outputs_same_as_plain']}/{x['requests']}")
for f in sorted(glob.glob(f"{R}/dflash*_*_*.json")):
    name = os.path.basename(f)[:-5]
    k, v, rnd = name.split("_")
    d = load(f)
    if not d: continue
    for x in d["speculative"]["runs"]:
        rows.setdefault(f"{k} replay b{x['batch']} tok/s", {}).setdefault(v, []).append(round(x["speculative_tokens_per_s"], 1))
        rows.setdefault(f"{k} replay b{x['batch']} acc len", {}).setdefault(v, []).append(round(x["acceptance_length"], 2))
for k, d in rows.items():
    print(f"{k:32s} old {d.get('old')}  new {d.get('new')}")

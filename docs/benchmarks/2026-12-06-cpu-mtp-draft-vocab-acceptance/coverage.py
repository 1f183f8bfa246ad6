"""Share of the held-out greedy output tokens in reference.json that each
draft vocabulary holds. Usage: python3 coverage.py RAW_FOLDER (run from the
repository root)."""
import json
import sys

raw = sys.argv[1]
ref = json.load(open("models/kestrel-tiny-qwen35/reference/reference.json"))
outputs = [t for p in ref["greedy"]["prompts"] for t in p["output_ids"]]
for n in (2048, 1024, 512, 256):
    lines = open(f"{raw}/draft_vocab_{n}.txt")
    ids = {int(l) for l in lines if l.strip() and not l.startswith("#")}
    held = sum(t in ids for t in outputs)
    print(f"{n:5d} ids: {held}/{len(outputs)} output tokens ({held / len(outputs):.1%})")

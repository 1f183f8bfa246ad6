"""Greedy completions of several prompts at once through `kestrel serve`;
writes each prompt's text, the wall time and the server's spec counters.

Usage: python3 scripts/concurrent_greedy.py BASE_URL OUT.json [CONCURRENCY]
(CONCURRENCY defaults to 8, all prompts at once; 1 sends them one by one)."""
import json, sys, threading, time, urllib.request

base, out = sys.argv[1], sys.argv[2]
concurrency = int(sys.argv[3]) if len(sys.argv) > 3 else 8
slots = threading.Semaphore(concurrency)
MODEL = json.load(urllib.request.urlopen(base + "/v1/models"))["data"][0]["id"]
PROMPTS = [
    "def fibonacci(n):", "The history of the city begins", "import numpy as np\n\n",
    "Once upon a time, a small bird", "class Stack:\n    def __init__(self):",
    "In mathematics, a prime number", "for i in range(10):", "The quick brown fox",
]

def one(i, res):
    body = {"model": MODEL, "prompt": PROMPTS[i], "max_tokens": 128, "temperature": 0}
    req = urllib.request.Request(base + "/v1/completions", data=json.dumps(body).encode(),
                                 headers={"content-type": "application/json"})
    with slots:
        t0 = time.perf_counter()
        d = json.load(urllib.request.urlopen(req))
    res[i] = {"text": d["choices"][0]["text"], "tokens": d["usage"]["completion_tokens"],
              "s": time.perf_counter() - t0}

rounds = []
for r in range(3):
    res = [None] * len(PROMPTS)
    t0 = time.perf_counter()
    ts = [threading.Thread(target=one, args=(i, res)) for i in range(len(PROMPTS))]
    [t.start() for t in ts]; [t.join() for t in ts]
    wall = time.perf_counter() - t0
    rounds.append({"wall_s": wall, "tok_s": sum(x["tokens"] for x in res) / wall, "results": res})
metrics = urllib.request.urlopen(base + "/metrics").read().decode()
spec = [l for l in metrics.splitlines() if "spec_decode" in l and not l.startswith("#")]
json.dump({"concurrency": concurrency, "rounds": rounds, "spec_metrics": spec}, open(out, "w"), indent=1)
print(json.dumps({"tok_s": [round(x["tok_s"], 1) for x in rounds], "spec": spec}))

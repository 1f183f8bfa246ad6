"""Decode speed of constrained against unconstrained requests through
`kestrel serve` (greedy, streamed, one at a time, 3 rounds each).

Usage: python3 scripts/structured_speed.py BASE_URL OUT.json"""
import json, statistics, sys, time, urllib.request

base = sys.argv[1]
out = sys.argv[2]
MODEL = json.load(urllib.request.urlopen(base + "/v1/models"))["data"][0]["id"]
SCHEMA = {"type": "object", "properties": {"items": {"type": "array", "items": {
    "type": "object", "properties": {"name": {"type": "string"}, "n": {"type": "integer"},
    "tags": {"type": "array", "items": {"type": "string", "enum": ["a", "b", "c"]}}},
    "required": ["name", "n", "tags"]}, "minItems": 40}}, "required": ["items"]}
CASES = {
    "plain": {},
    "regex": {"guided_regex": "[a-z ]+"},
    "json_schema": {"response_format": {"type": "json_schema", "json_schema": {"name": "s", "schema": SCHEMA}}},
    "json_object": {"response_format": {"type": "json_object"}},
}

def one(extra):
    body = {"model": MODEL, "messages": [{"role": "user", "content": "Write a long list of things, as much as you can."}],
            "max_tokens": 256, "min_tokens": 256, "temperature": 0, "stream": True,
            "stream_options": {"include_usage": True},
            "chat_template_kwargs": {"enable_thinking": False}, **extra}
    req = urllib.request.Request(base + "/v1/chat/completions", data=json.dumps(body).encode(),
                                 headers={"content-type": "application/json"})
    t0 = time.perf_counter(); times = []; usage = None; finish = None
    with urllib.request.urlopen(req) as r:
        for line in r:
            line = line.decode().strip()
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            d = json.loads(line[6:])
            if d.get("usage"):
                usage = d["usage"]
            for c in d.get("choices", []):
                if c.get("finish_reason"):
                    finish = c["finish_reason"]
                delta = c.get("delta", {})
                if delta.get("content") or delta.get("reasoning_content"):
                    times.append(time.perf_counter() - t0)
    n = usage["completion_tokens"]
    dec = (times[-1] - times[0]) if len(times) > 1 else float("nan")
    return {"ttft_s": times[0] if times else None, "tokens": n, "finish": finish,
            "decode_tok_s": (n - 1) / dec if dec > 0 else None}

res = {}
for name, extra in CASES.items():
    try:
        one(extra)  # warm-up (grammar compile, graphs)
        runs = [one(extra) for _ in range(3)]
    except Exception as e:
        res[name] = {"error": str(e)}
        print(name, e)
        continue
    res[name] = {"runs": runs, "median_decode_tok_s": statistics.median(r["decode_tok_s"] for r in runs if r["decode_tok_s"])}
    print(name, json.dumps(res[name]))
json.dump(res, open(out, "w"), indent=1)

#!/usr/bin/env bash
# One run on the GPU: DFlash drafter passes (full and reduced vocabulary, blocks 2/8/16, batches
# 1/8), verify steps, plain decode on dummy Qwen3.6; then the bundled model served on CUDA,
# plain against DFlash, 8 concurrent greedy completions.
set -u
# Run from the repository root: K is the kestrel binary, OUT the folder for the results.
K=${K:-kestrel}
OUT=${OUT:-bench-out}
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > $OUT/gpu.txt 2>&1
git rev-parse HEAD > $OUT/commit.txt 2>/dev/null
COMMON="--backend cuda --config configs/qwen3.6-35b-a3b/config.json --load-format dummy --prefill 512 --prefill-runs 1 --steps 20 --warmup 3"
timeout 300 $K bench-model $COMMON --decode-batch 1,8 \
  --dflash-drafter configs/qwen3.6-35b-a3b-dflash/config.json --dflash-blocks 2,8,16 --dflash-batches 1,8 \
  --draft-vocab-size 32768 --context 1024 --verify-k 1,7,15 --verify-batches 1,8 \
  --json $OUT/dflash_c1024.json > $OUT/dflash_c1024.txt 2> $OUT/dflash_c1024.err
echo "bench rc $?" >> $OUT/status.txt
tail -5 $OUT/dflash_c1024.err >> $OUT/status.txt
serve_run() { # name, concurrency, extra args
  local name=$1 conc=$2; shift 2
  $K serve --backend cuda --port 8123 "$@" > $OUT/serve_$name.log 2>&1 &
  local pid=$!
  for i in $(seq 1 120); do curl -sf localhost:8123/health >/dev/null && break; sleep 1; done
  timeout 150 python3 scripts/concurrent_greedy.py http://localhost:8123 $OUT/greedy_$name.json $conc > $OUT/greedy_$name.txt 2>&1
  echo "$name rc $?" >> $OUT/status.txt
  kill $pid; wait $pid 2>/dev/null
}
serve_run plain_c8 8
serve_run dflash_c8 8 --speculative dflash
serve_run dflash_vocab_c8 8 --speculative dflash --draft-vocab docs/benchmarks/2026-12-03-h200-dflash-budget-vocab-adaptive/raw/bundled_vocab2048.txt
serve_run dflash_adaptive_c8 8 --speculative dflash --adaptive-drafts
serve_run plain_c1 1
serve_run dflash_c1 1 --speculative dflash
python3 - <<'PY' >> $OUT/status.txt
import json, os
o = os.environ["OUT"]
def load(n): return json.load(open(f"{o}/greedy_{n}.json"))
def texts(d): return [x["text"] for r in d["rounds"] for x in r["results"]]
for plain, spec in [("plain_c8", "dflash_c8"), ("plain_c8", "dflash_vocab_c8"), ("plain_c8", "dflash_adaptive_c8"), ("plain_c1", "dflash_c1"), ("plain_c8", "plain_c1")]:
    try:
        a, b = load(plain), load(spec)
        same = sum(x == y for x, y in zip(texts(a), texts(b)))
        print(spec, "vs", plain, "identical", same, "of", len(texts(a)))
        print("  ", plain, [round(r["tok_s"], 1) for r in a["rounds"]], spec, [round(r["tok_s"], 1) for r in b["rounds"]])
        print("  ", b["spec_metrics"])
    except Exception as e:
        print("compare failed", plain, spec, e)
PY
# Whole steps, replay proposer: DFlash's published acceptance (0.871^i, i = 1..15) and an MTP
# profile (k = 3), the row budget on (auto), draft lengths fixed and adapted.
DFLASH_PROFILE=$(python3 -c "print(','.join(f'{0.871**i:.4f}' for i in range(1, 16)))")
REPLAY="--backend cuda --config configs/qwen3.6-35b-a3b/config.json --load-format dummy --prefill --decode-batch --breakdown-steps 0 --context 1024 --speculative replay --replay-tokens 128 --replay-batches 1,8"
for p in dflash mtp; do
  if [ $p = dflash ]; then A=$DFLASH_PROFILE; else A=0.87,0.74,0.61; fi
  for mode in fixed adaptive; do
    X=""; [ $mode = adaptive ] && X="--adaptive-drafts"
    timeout 150 $K bench-model $REPLAY --acceptance $A $X --json $OUT/replay_${p}_$mode.json > $OUT/replay_${p}_$mode.txt 2> $OUT/replay_${p}_$mode.err
    echo "replay $p $mode rc $?" >> $OUT/status.txt
  done
done
cat $OUT/status.txt

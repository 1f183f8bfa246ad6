#!/usr/bin/env bash
# The committed code: the GPU suite, then drafter passes, verify steps,
# plain decode and the replay proposer (MTP profile, DFlash k = 15) on the
# Qwen3.6 dummy, and the bundled model served with its drafter.
# K: the kestrel binary, T: the GPU test binary (cargo test -p kestrel-cuda --features gpu-tests
# --no-run), R: where the outputs go; run from the repository root with the bundled
# model's weights in place. The verify step of batch 8, k = 15 ran out of the H100's memory
# (this bench-model call keeps the caches of every verify batch), so the drafter-pass figures
# of this call are missing: they come from the second call below (dflash_passes.*).
set -u
export KESTREL_REQUIRE_CUDA=1
timeout 280 $T --test-threads=1 --skip fp8_fixtures > $R/gpu_all.txt 2>&1; echo "gpu suite rc $? at $SECONDS s"
grep -E "test result|panicked|FAILED" $R/gpu_all.txt | head -8
C=configs/qwen3.6-35b-a3b/config.json
D=configs/qwen3.6-35b-a3b-dflash/config.json
timeout 120 $K bench-model --backend cuda --config $C --load-format dummy --prefill 512 --prefill-runs 1 --steps 20 --warmup 3 \
  --decode-batch 1,8 --dflash-drafter $D --dflash-blocks 8,16 --dflash-batches 1,2,4,8 --context 1024 \
  --verify-k 3,7,15 --verify-batches 1,2,4,8 --breakdown-steps 0 --json $R/dflash.json > $R/dflash.txt 2>&1
echo "dflash rc $? at $SECONDS s"
DF=$(python3 -c "print(','.join(f'{0.871**i:.4f}' for i in range(1, 16)))")
timeout 90 $K bench-model --backend cuda --load-format dummy --config $C --prefill --decode-batch --breakdown-steps 0 \
  --context 1024 --speculative replay --acceptance 0.87,0.74,0.61 --replay-batches 1,8 --replay-tokens 128 \
  --json $R/replay_mtp.json > $R/replay_mtp.txt 2>&1; echo "replay mtp rc $? at $SECONDS s"
grep -E "^ +[0-9]" $R/replay_mtp.txt | tail -2
timeout 90 $K bench-model --backend cuda --load-format dummy --config $C --prefill --decode-batch --breakdown-steps 0 \
  --context 1024 --speculative replay --acceptance $DF --replay-batches 1,8 --replay-tokens 128 \
  --json $R/replay_df15.json > $R/replay_df15.txt 2>&1; echo "replay df15 rc $? at $SECONDS s"
grep -E "^ +[0-9]" $R/replay_df15.txt | tail -2
serve() {  # name args...
  local name=$1; shift
  $K serve --backend cuda --port 8123 "$@" > $R/serve_$name.log 2>&1 & local pid=$!
  for i in $(seq 60); do curl -sf localhost:8123/v1/models > /dev/null && break; sleep 1; done
  for c in 8 1; do timeout 120 python3 scripts/concurrent_greedy.py http://localhost:8123 $R/greedy_${name}_c$c.json $c > /dev/null; done
  kill $pid; wait $pid 2>/dev/null
}
serve plain
serve dflash --speculative dflash
python3 - $R <<'PY'
import json,sys
R=sys.argv[1]
for c in (8,1):
    base=[x["text"] for x in json.load(open(f"{R}/greedy_plain_c{c}.json"))["rounds"][0]["results"]]
    for n in ("plain","dflash"):
        d=json.load(open(f"{R}/greedy_{n}_c{c}.json"))
        same=sum(x["text"]==b for r in d["rounds"] for x,b in zip(r["results"],base))
        print(n, "c", c, "tok/s", [round(r["tok_s"],1) for r in d["rounds"]], "same as plain", same, "/", 3*len(base))
PY

# Second call (dflash_passes.*, replay_*_seq.*): passes without the batch-8 verify, and the
# replay proposer with one sequence's decode splits.
D=configs/qwen3.6-35b-a3b-dflash/config.json
$K bench-model --backend cuda --config $C --load-format dummy --prefill 512 --prefill-runs 1 --steps 20 --warmup 3 \
  --decode-batch 1,8 --dflash-drafter $D --dflash-blocks 8,16 --dflash-batches 1,2,4,8 --context 1024 \
  --verify-k 3,15 --verify-batches 1 --breakdown-steps 0 --json $R/dflash_passes.json > $R/dflash_passes.txt 2>&1
for p in mtp df15; do
  if [ $p = mtp ]; then A=0.87,0.74,0.61; else A=$DF; fi
  KESTREL_DECODE_SPLITS=sequence $K bench-model --backend cuda --load-format dummy --config $C --prefill --decode-batch \
    --breakdown-steps 0 --context 1024 --speculative replay --acceptance $A --replay-batches 1,8 --replay-tokens 128 \
    --json $R/replay_${p}_seq.json > $R/replay_${p}_seq.txt 2>&1
done

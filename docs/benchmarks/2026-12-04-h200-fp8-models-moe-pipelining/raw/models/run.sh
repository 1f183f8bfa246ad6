#!/usr/bin/env bash
# Qwen3-30B-A3B and Qwen3-Next-80B-A3B, BF16 and FP8 (dummy weights at the real shapes),
# next to Qwen3.6-35B-A3B, one binary; Qwen3-Next-80B FP8 served through `kestrel serve`.
set -u
export PYTHONUNBUFFERED=1
OUT=${OUT:-bench-out}
R=$OUT/r; mkdir -p $R
# Run from the repository root: K is the kestrel binary, OUT the folder for the results.
K=${K:-kestrel}
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > $R/gpu.txt 2>&1
log() { echo "$(date +%T) $*" | tee -a $R/status.txt; }
V="--prefill 8192 --decode-batch 1,8 --breakdown-steps 0 --context 1024 --steps 30"
for m in qwen3.6-35b-a3b qwen3-30b-a3b qwen3-next-80b-a3b; do for q in bf16 fp8; do
  [ $m = qwen3-next-80b-a3b ] && [ $q = bf16 ] && continue   # 160 GB: does not fit
  Q=""; [ $q = fp8 ] && Q="--quantization fp8"
  timeout 300 $K bench-model --backend cuda --config configs/$m/config.json --load-format dummy $Q $V --json $R/${m}_$q.json > $R/${m}_$q.txt 2>&1; log "$m $q rc $?"
done; done
# Served: the config with the bundled model's tokenizer (its 4,096 ids lie inside the model's vocabulary).
M=/tmp/next80b; mkdir -p $M; cp configs/qwen3-next-80b-a3b/config.json $M/
cp models/kestrel-tiny-qwen35/{tokenizer.json,tokenizer_config.json,chat_template.jinja} $M/
$K serve --model $M --load-format dummy --quantization fp8 --port 8123 > $R/next80b_serve.log 2>&1 &
SP=$!
for i in $(seq 1 240); do curl -sf localhost:8123/health >/dev/null && break; sleep 1; done
log "serve up after $i s"
curl -s localhost:8123/v1/chat/completions -H 'content-type: application/json' \
  -d '{"model":"next80b","messages":[{"role":"user","content":"def fib(n):"}],"max_tokens":64,"temperature":0}' > $R/next80b_chat.json; log "chat rc $?"
nvidia-smi --query-gpu=memory.used --format=csv > $R/next80b_mem.txt
timeout 120 python3 scripts/concurrent_greedy.py http://localhost:8123 $R/next80b_greedy_c8.json 8 > $R/next80b_greedy_c8.txt 2>&1; log "greedy c8 rc $?"
timeout 120 python3 scripts/concurrent_greedy.py http://localhost:8123 $R/next80b_greedy_c1.json 1 > $R/next80b_greedy_c1.txt 2>&1; log "greedy c1 rc $?"
kill $SP; wait $SP 2>/dev/null
cd $R && tar cJf $OUT/all.tar.xz . && cp status.txt $OUT/status.txt

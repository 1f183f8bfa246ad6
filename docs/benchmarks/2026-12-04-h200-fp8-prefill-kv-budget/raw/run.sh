#!/usr/bin/env bash
# FP8 prefill expert GEMMs reading FP8, the KV cache sized from device memory.
# Run from the repository root: K the kestrel binary, T the GPU test binary, PART which half.
set -u
export PYTHONUNBUFFERED=1
OUT=${OUT:-bench-out}
R=$OUT/r; mkdir -p $R
K=${K:-kestrel}
log() { echo "$(date +%T) $*" | tee -a $R/status.txt; }
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > $R/gpu.txt 2>&1
PART=${PART:-all}
C36="--backend cuda --config configs/qwen3.6-35b-a3b/config.json --load-format dummy"
if [ $PART = tests-bench ] || [ $PART = all ]; then
  KESTREL_REQUIRE_CUDA=1 timeout 300 $T --test-threads=1 > $R/gpu_tests.txt 2>&1; log "gpu tests rc $?"
  V="--prefill 8192 --decode-batch 1,8 --breakdown-steps 0 --context 1024 --steps 30"
  for round in 1 2 3; do for m in qwen3.6-35b-a3b qwen3-30b-a3b; do for q in bf16 fp8; do
    Q=""; [ $q = fp8 ] && Q="--quantization fp8"
    timeout 200 $K bench-model --backend cuda --config configs/$m/config.json --load-format dummy $Q $V \
      --json $R/${m}_${q}_$round.json > $R/${m}_${q}_$round.txt 2>&1; log "$m $q round $round rc $?"
  done; done; done
  for q in bf16 fp8; do
    Q=""; [ $q = fp8 ] && Q="--quantization fp8"
    timeout 200 $K bench-model $C36 $Q --prefill --decode-batch --breakdown-steps 0 --context 1024 \
      --speculative replay --acceptance 0.87,0.74,0.61 --replay-batches 1,8 --replay-tokens 128 \
      --json $R/replay_$q.json > $R/replay_$q.txt 2>&1; log "replay $q rc $?"
    timeout 200 $K bench-model $C36 $Q --prefill --decode-batch --breakdown-steps 0 --context 1024 \
      --mtp-draft-k 1,3 --mtp-draft-batches 1,8 --draft-vocab-size 65536 \
      --json $R/mtp_draft_$q.json > $R/mtp_draft_$q.txt 2>&1; log "mtp draft $q rc $?"
  done
fi
if [ $PART = serve-profile ] || [ $PART = all ]; then
  serve_one() {  # name config quant util
    local name=$1 cfg=$2 q=$3 util=$4 M=/tmp/m_$1
    mkdir -p $M; cp configs/$cfg/config.json $M/; cp .devrun/tok/* $M/
    local Q=""; [ $q = fp8 ] && Q="--quantization fp8"
    $K serve --model $M --load-format dummy $Q --gpu-memory-utilization $util --port 8123 \
      --served-model-name m > $R/serve_$name.log 2>&1 &
    local SP=$!
    for i in $(seq 1 90); do curl -sf localhost:8123/health >/dev/null && break; sleep 1; done
    log "serve $name up after $i s"
    curl -s localhost:8123/v1/chat/completions -H 'content-type: application/json' \
      -d '{"model":"m","messages":[{"role":"user","content":"def fib(n):"}],"max_tokens":32,"temperature":0}' \
      -o $R/chat_$name.json -w '%{http_code}\n' >> $R/status.txt
    nvidia-smi --query-gpu=memory.used,memory.total --format=csv > $R/mem_$name.txt
    kill $SP; wait $SP 2>/dev/null
  }
  serve_one qwen36_bf16 qwen3.6-35b-a3b bf16 0.9
  serve_one qwen36_fp8 qwen3.6-35b-a3b fp8 0.9
  serve_one qwen36_fp8_u05 qwen3.6-35b-a3b fp8 0.5
  serve_one next80b_fp8 qwen3-next-80b-a3b fp8 0.9
  for q in bf16 fp8; do
    Q=""; [ $q = fp8 ] && Q="--quantization fp8"
    timeout 200 ncu --clock-control none --metrics gpu__time_duration.sum --csv -k "regex:^(?!dummy_fill|fp8_dummy)" \
      $K bench-model $C36 $Q --prefill 8192 --decode-batch --breakdown-steps 0 --prefill-runs 1 --warmup 0 --eager \
      > $R/ncu_${q}_prefill.csv 2> $R/ncu_${q}_prefill.err; log "ncu $q rc $?"
  done
fi
if [ $PART = exp ]; then
  KESTREL_REQUIRE_CUDA=1 timeout 200 $T --test-threads=1 fp8 > $R/gpu_tests_fp8.txt 2>&1; log "gpu tests fp8 rc $?"
  KESTREL_REQUIRE_CUDA=1 timeout 200 $T --test-threads=1 moe > $R/gpu_tests_moe.txt 2>&1; log "gpu tests moe rc $?"
  V="--prefill 8192 --decode-batch 1,8 --breakdown-steps 0 --context 1024 --steps 30"
  for round in 1 2; do for m in qwen3.6-35b-a3b qwen3-30b-a3b; do for q in bf16 fp8; do
    Q=""; [ $q = fp8 ] && Q="--quantization fp8"
    timeout 200 $K bench-model --backend cuda --config configs/$m/config.json --load-format dummy $Q $V \
      --json $R/${m}_${q}_$round.json > $R/${m}_${q}_$round.txt 2>&1; log "$m $q round $round rc $?"
  done; done; done
  timeout 200 ncu --clock-control none --metrics gpu__time_duration.sum --csv -k "regex:moe_.*gemm" \
    $K bench-model $C36 --quantization fp8 --prefill 8192 --decode-batch --breakdown-steps 0 --prefill-runs 1 --warmup 0 --eager \
    > $R/ncu_fp8_prefill.csv 2> $R/ncu_fp8_prefill.err; log "ncu fp8 rc $?"
fi
if [ $PART = lmhead ]; then
  KESTREL_REQUIRE_CUDA=1 timeout 250 $T --test-threads=1 fp8 > $R/gpu_tests_fp8.txt 2>&1; log "gpu tests fp8 rc $?"
  V="--prefill 8192 --decode-batch 1,8 --breakdown-steps 0 --context 1024 --steps 30"
  for round in 1 2; do for q in bf16 fp8; do for h in auto fp8; do
    Q=""; [ $q = fp8 ] && Q="--quantization fp8"
    timeout 200 $K bench-model $C36 $Q --lm-head-dtype $h $V --json $R/qwen36_${q}_head-${h}_$round.json \
      > $R/qwen36_${q}_head-${h}_$round.txt 2>&1; log "qwen3.6 $q head $h round $round rc $?"
  done; done; done
  for h in auto fp8; do
    timeout 200 $K bench-model $C36 --quantization fp8 --lm-head-dtype $h --prefill --decode-batch --breakdown-steps 0 --context 1024 \
      --speculative replay --acceptance 0.87,0.74,0.61 --replay-batches 1,8 --replay-tokens 128 \
      --json $R/replay_fp8_head-$h.json > $R/replay_fp8_head-$h.txt 2>&1; log "replay head $h rc $?"
    timeout 200 $K bench-model $C36 --quantization fp8 --lm-head-dtype $h --prefill --decode-batch --breakdown-steps 0 --context 1024 \
      --mtp-draft-k 1,3 --mtp-draft-batches 1,8 --draft-vocab-size 65536 \
      --json $R/mtp_draft_fp8_head-$h.json > $R/mtp_draft_fp8_head-$h.txt 2>&1; log "mtp draft head $h rc $?"
  done
  M=/tmp/m_lmhead; mkdir -p $M; cp configs/qwen3.6-35b-a3b/config.json $M/; cp .devrun/tok/* $M/
  $K serve --model $M --load-format dummy --quantization fp8 --lm-head-dtype fp8 --speculative mtp --num-speculative-tokens 2 \
    --port 8123 --served-model-name m > $R/serve_lmhead.log 2>&1 &
  SP=$!
  for i in $(seq 1 90); do curl -sf localhost:8123/health >/dev/null && break; sleep 1; done
  log "serve lm_head fp8 + mtp up after $i s"
  curl -s localhost:8123/v1/chat/completions -H 'content-type: application/json' \
    -d '{"model":"m","messages":[{"role":"user","content":"def fib(n):"}],"max_tokens":32,"temperature":0}' \
    -o $R/chat_lmhead.json -w '%{http_code}\n' >> $R/status.txt
  kill $SP; wait $SP 2>/dev/null
fi
if [ $PART = gemv ]; then
  KESTREL_REQUIRE_CUDA=1 timeout 250 $T --test-threads=1 > $R/gpu_tests.txt 2>&1; log "gpu tests rc $?"
  V="--prefill 8192 --decode-batch 1,8 --breakdown-steps 0 --context 1024 --steps 30"
  for round in 1 2; do for run in "qwen3.6-35b-a3b bf16 auto" "qwen3.6-35b-a3b fp8 auto" "qwen3.6-35b-a3b fp8 fp8" "qwen3-30b-a3b fp8 auto"; do
    set -- $run; Q=""; [ $2 = fp8 ] && Q="--quantization fp8"
    timeout 200 $K bench-model --backend cuda --config configs/$1/config.json --load-format dummy $Q --lm-head-dtype $3 $V \
      --json $R/${1}_${2}_head-${3}_$round.json > $R/${1}_${2}_head-${3}_$round.txt 2>&1; log "$run round $round rc $?"
  done; done
  timeout 200 $K bench-model $C36 --quantization fp8 --prefill --decode-batch --breakdown-steps 0 --context 1024 \
    --speculative replay --acceptance 0.87,0.74,0.61 --replay-batches 1,8 --replay-tokens 128 \
    --json $R/replay_fp8.json > $R/replay_fp8.txt 2>&1; log "replay fp8 rc $?"
fi
cd $R && tar cJf $OUT/all_$PART.tar.xz . && cp status.txt $OUT/status.txt

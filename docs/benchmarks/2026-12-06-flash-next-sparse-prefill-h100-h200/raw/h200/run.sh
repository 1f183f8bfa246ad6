#!/usr/bin/env bash
# H200, binaries of d0b39cb (also the n-gram rows gathered on every core): the
# Flash-Next GPU checks, the 12-layer model in BF16 and FP8 at contexts 1K and
# 8K, then the 48-layer model in FP8. K, T, R as in ../h100-before/run.sh.
# The 48-layer outputs here are from a second call on the same machine that
# ran only that command (the first call's copies did not come back).
set -u
export KESTREL_REQUIRE_CUDA=1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > $R/gpu.txt 2>&1
$T --test-threads=1 --nocapture flash_next > $R/gpu_flash_next.txt 2>&1
C=configs/qwen3.8-flash-next-12-layers/config.json
B="bench-model --backend cuda --load-format dummy --max-batched-tokens 2048"
for ctx in 1024 8192; do
  P=--prefill; [ $ctx = 1024 ] && P="--prefill 1024,2048,4096,8192 --prefill-runs 3"
  $K $B --config $C $P --decode-batch 1,8 --context $ctx --steps 30 \
    --json $R/fn12_bf16_ctx$ctx.json > $R/fn12_bf16_ctx$ctx.txt 2>&1
  P=--prefill; [ $ctx = 1024 ] && P="--prefill 8192 --prefill-runs 3"
  $K $B --config $C --quantization fp8 $P --decode-batch 1,8 --context $ctx --steps 30 \
    --breakdown-steps 0 --json $R/fn12_fp8_ctx$ctx.json > $R/fn12_fp8_ctx$ctx.txt 2>&1
done
$K $B --config configs/qwen3.8-flash-next/config.json --quantization fp8 \
  --prefill 1024,8192 --prefill-runs 1 --decode-batch 1,8 --context 1024 --steps 20 --breakdown-steps 1 \
  --json $R/fn48_fp8.json > $R/fn48_fp8.txt 2>&1
nvidia-smi --query-gpu=memory.used --format=csv >> $R/gpu.txt

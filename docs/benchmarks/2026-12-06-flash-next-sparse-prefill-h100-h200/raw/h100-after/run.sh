#!/usr/bin/env bash
# H100, binaries of 1e257f2 (selection as blocks, pages of a block, splits by
# rows, the top-k on every core): the Flash-Next GPU checks, then the 12-layer
# model. K, T, R as in ../h100-before/run.sh.
set -u
export KESTREL_REQUIRE_CUDA=1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > $R/gpu.txt 2>&1
$T --test-threads=1 --nocapture flash_next > $R/gpu_flash_next.txt 2>&1
C=configs/qwen3.8-flash-next-12-layers/config.json
B="bench-model --backend cuda --load-format dummy --max-batched-tokens 2048"
$K $B --config $C --prefill 1024,2048,4096,8192 --prefill-runs 3 --decode-batch 1,8 --context 8192 \
  --steps 30 --json $R/fn12_bf16.json > $R/fn12_bf16.txt 2>&1
$K $B --config $C --quantization fp8 --prefill 8192 --prefill-runs 3 --decode-batch 1,8 \
  --context 8192 --steps 30 --breakdown-steps 0 --json $R/fn12_fp8.json > $R/fn12_fp8.txt 2>&1

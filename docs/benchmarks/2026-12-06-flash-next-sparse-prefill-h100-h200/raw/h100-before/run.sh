#!/usr/bin/env bash
# H100, binaries of f0d9185: the Flash-Next GPU checks, the 12-layer model in
# BF16 (1K and 8K prefill, decode at 1K and 8K) and FP8, the rest of the GPU
# suite. K: the kestrel binary (cargo build --release -p kestrel), T: the GPU
# test binary (cargo test -p kestrel-cuda --features gpu-tests --no-run),
# R: where the outputs go. From the repository root.
set -u
export KESTREL_REQUIRE_CUDA=1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > $R/gpu.txt 2>&1
$T --test-threads=1 --nocapture flash_next > $R/gpu_flash_next.txt 2>&1
C=configs/qwen3.8-flash-next-12-layers/config.json
B="bench-model --backend cuda --load-format dummy --max-batched-tokens 2048"
$K $B --config $C --prefill 1024,8192 --prefill-runs 3 --decode-batch 1,8 --context 1024 \
  --steps 30 --json $R/fn12_bf16_ctx1024.json > $R/fn12_bf16_ctx1024.txt 2>&1
$K $B --config $C --prefill --decode-batch 1,8 --context 8192 \
  --steps 30 --json $R/fn12_bf16_ctx8192.json > $R/fn12_bf16_ctx8192.txt 2>&1
$K $B --config $C --quantization fp8 --prefill 8192 --prefill-runs 3 --decode-batch 1,8 \
  --context 1024 --steps 30 --breakdown-steps 0 --json $R/fn12_fp8_ctx1024.json > $R/fn12_fp8_ctx1024.txt 2>&1
# Its output file did not come back (one file too many); the summary line is in the README.
$T --test-threads=1 --skip flash_next > $R/gpu_tests.txt 2>&1

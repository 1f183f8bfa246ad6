#!/usr/bin/env bash
# Run 1: the Flash-Next GPU checks, a 12-layer Flash-Next bench, the rest of
# the GPU suite. K: the kestrel binary, T: the GPU test binary
# (cargo test -p kestrel-cuda --features gpu-tests --no-run), R: where the
# outputs go. From the repository root.
set -u
export KESTREL_REQUIRE_CUDA=1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > $R/gpu.txt 2>&1
$T --test-threads=1 --nocapture flash_next > $R/gpu_flash_next.txt 2>&1
C=configs/qwen3.8-flash-next-12-layers/config.json
$K bench-model --backend cuda --config $C --load-format dummy --prefill 1024,8192 \
  --prefill-runs 3 --decode-batch 1,8 --context 1024 --steps 30 --max-batched-tokens 2048 \
  --json $R/flash_next_ctx1024.json > $R/flash_next_ctx1024.txt 2>&1
$T --test-threads=1 --skip flash_next > $R/gpu_tests.txt 2>&1

#!/usr/bin/env bash
# H100: the fused hyper-connection kernels. T: the GPU test binary of 7342bbc
# (the fused kernels on unconditionally there), K: kestrel of c9cca32
# (KESTREL_HYPER_FUSION read by the default build then; now an experiments
# switch). R: where the outputs go.
set -u
export KESTREL_REQUIRE_CUDA=1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > $R/gpu.txt 2>&1
$T --test-threads=1 --nocapture flash_next > $R/gpu_flash_next.txt 2>&1
C=configs/qwen3.8-flash-next-12-layers/config.json
for f in off on; do
  KESTREL_HYPER_FUSION=$f $K bench-model --backend cuda --load-format dummy --config $C \
    --prefill 1024 --prefill-runs 3 --decode-batch 1,8 --context 1024 --steps 30 --breakdown-steps 0 \
    --json $R/fn12_fusion_$f.json > $R/fn12_fusion_$f.txt 2>&1
done

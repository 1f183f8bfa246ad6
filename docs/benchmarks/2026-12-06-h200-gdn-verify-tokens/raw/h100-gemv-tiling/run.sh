#!/usr/bin/env bash
# H100. K, T: built from da04ec4 with gemv_m4_r2.patch applied (a measurement
# build: KESTREL_AB_GEMV=all sends every 4-row launch of a verify step to a
# kernel of 2 weight rows per warp, 4 chunks deep; =small only those whose
# grid at 4 rows per warp would be under two blocks per SM). R: outputs.
set -u
export KESTREL_REQUIRE_CUDA=1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > $R/gpu.txt 2>&1
KESTREL_AB_GEMV=all $T --test-threads=1 speculative_shapes > $R/gpu_spec_all.txt 2>&1 || exit 1
C=configs/qwen3.6-35b-a3b/config.json
for round in 1 2; do for v in off all small; do
  KESTREL_AB_GEMV=$v $K bench-model --backend cuda --load-format dummy --config $C \
    --prefill --decode-batch 1 --context 1024 --steps 30 --breakdown-steps 0 --verify-k 3 --verify-batches 1 \
    --speculative replay --acceptance 0.87,0.74,0.61 --replay-batches 1 --replay-tokens 128 \
    --json $R/q36_${v}_$round.json > $R/q36_${v}_$round.txt 2>&1
done; done

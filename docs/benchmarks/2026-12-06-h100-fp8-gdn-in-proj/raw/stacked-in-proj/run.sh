#!/usr/bin/env bash
# The device call of raw/stacked-in-proj/ (K: the kestrel binary, T: the GPU test binary).
# Arms, alternating, selected by environment switches of the measured build only:
#   new   - the GDN in_proj as an FP8 part and a bf16 part, gemv_norm in one launch (committed)
#   apart - the same parts, one gemv_norm launch per part (KESTREL_AB_PARTS_APART=1)
#   dense - the whole in_proj dense bf16, as before (KESTREL_AB_DENSE_INPROJ=1)
set -u
R=results; mkdir -p $R
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > $R/gpu.txt
(cd crates/kestrel-cuda && timeout 200 $T --test-threads=1 fp8 matmul speculative precision --nocapture) > $R/tests.txt 2>&1
Q="--backend cuda --config configs/qwen3.6-35b-a3b/config.json --load-format dummy --breakdown-steps 0 --context 1024"
for ab in new apart dense; do
  unset KESTREL_AB_DENSE_INPROJ KESTREL_AB_PARTS_APART
  if [ $ab = dense ]; then export KESTREL_AB_DENSE_INPROJ=1; fi
  if [ $ab = apart ]; then export KESTREL_AB_PARTS_APART=1; fi
  $K bench-model $Q --quantization fp8 --prefill 8192 --decode-batch 1,2,8 --steps 30 --verify-k 3 --verify-batches 1,2 --json $R/fp8_${ab}_r1.json > $R/fp8_${ab}_r1.txt 2>&1
  $K bench-model $Q --quantization fp8 --prefill --decode-batch --speculative replay --acceptance 0.87,0.74,0.61 --replay-batches 1,8 --replay-tokens 128 --json $R/replay_${ab}_r1.json > $R/replay_${ab}_r1.txt 2>&1
done
unset KESTREL_AB_DENSE_INPROJ KESTREL_AB_PARTS_APART
$K bench-model $Q --prefill 8192 --decode-batch 1,2,8 --steps 30 --verify-k 3 --verify-batches 1,2 --json $R/bf16_r1.json > $R/bf16_r1.txt 2>&1

#!/usr/bin/env bash
# H200. K: kestrel, T: the GPU test binary (`cargo test -p kestrel-cuda
# --features gpu-tests --no-run`), both built from the change with the
# previous gdn_decode.cu compiled in as a second module that
# KESTREL_AB_OLD=1 selects (a measurement build only; not committed).
# R: where the outputs go. Run from the repository root.
set -u
export KESTREL_REQUIRE_CUDA=1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > $R/gpu.txt 2>&1
$T --test-threads=1 gated_delta_net speculative_shapes > $R/gpu_gdn.txt 2>&1 || exit 1
C=configs/qwen3.6-35b-a3b/config.json
DF=$(python3 -c "print(','.join(f'{0.871**i:.4f}' for i in range(1, 16)))")
RP="--backend cuda --load-format dummy --config $C --prefill --decode-batch --breakdown-steps 0 --context 1024 --speculative replay --replay-tokens 128 --replay-batches 1"
for round in 1 2; do for v in new old; do
  if [ $v = old ]; then export KESTREL_AB_OLD=1; else unset KESTREL_AB_OLD; fi
  $K bench-model --backend cuda --load-format dummy --config $C \
    --prefill --decode-batch 1,8 --context 1024 --steps 30 --breakdown-steps 0 --verify-k 3,7,15 --verify-batches 1,4 \
    --speculative replay --acceptance 0.87,0.74,0.61 --replay-batches 1,8 --replay-tokens 128 \
    --json $R/q36_${v}_$round.json > $R/q36_${v}_$round.txt 2>&1
  $K bench-model $RP --acceptance $DF --json $R/dflash15_${v}_$round.json > $R/dflash15_${v}_$round.txt 2>&1
done; done
unset KESTREL_AB_OLD
$T --test-threads=1 --skip gated_delta_net --skip speculative_shapes > $R/gpu_rest.txt 2>&1
for v in new old; do
  if [ $v = old ]; then export KESTREL_AB_OLD=1; else unset KESTREL_AB_OLD; fi
  ncu --clock-control none --metrics gpu__time_duration.sum --csv -k 'regex:gdn_decode' \
    $K bench-model --backend cuda --config $C --load-format dummy --eager --prefill --decode-batch 1 \
    --breakdown-steps 0 --context 1024 --warmup 1 --steps 2 --verify-k 3,15 --verify-batches 1 > $R/ncu_gdn_$v.csv 2> $R/ncu_gdn_$v.err
done
unset KESTREL_AB_OLD
ncu --clock-control none -k 'regex:^gemv_m4$' -c 4 --section SpeedOfLight --section Occupancy \
  --section WarpStateStats --section MemoryWorkloadAnalysis \
  $K bench-model --backend cuda --config $C --load-format dummy --eager --prefill --decode-batch 1 \
  --breakdown-steps 0 --context 1024 --warmup 0 --steps 1 --verify-k 3 --verify-batches 1 > $R/ncu_gemv_m4.txt 2> $R/ncu_gemv_m4.err

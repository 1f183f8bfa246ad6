#!/usr/bin/env bash
# H100. K, T: built from 19da696 plus a measurement switch, KESTREL_AB_COPY=1,
# that copies the kept checkpoint into the live slot as before (not
# committed). MODEL: as in ../norm-rows/run.sh. R: where the outputs go.
set -u
export KESTREL_REQUIRE_CUDA=1
$T --test-threads=1 speculative mixed_steps recorded_decode > $R/gpu_spec.txt 2>&1
C=configs/qwen3.6-35b-a3b/config.json
DF7=$(python3 -c "print(','.join(f'{0.871**i:.4f}' for i in range(1, 8)))")
DF=$(python3 -c "print(','.join(f'{0.871**i:.4f}' for i in range(1, 16)))")
ab() { if [ $1 = swap ]; then unset KESTREL_AB_COPY; else export KESTREL_AB_COPY=1; fi; }
for round in 1 2 3; do for v in swap copy; do
  ab $v
  $K bench-model --backend cuda --load-format dummy --config $C \
    --prefill --decode-batch 1,8 --context 1024 --steps 30 --breakdown-steps 0 --verify-k 3 --verify-batches 1 \
    --speculative replay --acceptance 0.87,0.74,0.61 --replay-batches 1,8 --replay-tokens 128 \
    --json $R/q36_${v}_$round.json > $R/q36_${v}_$round.txt 2>&1
  for p in 7 15; do
    if [ $p = 15 ]; then A=$DF; else A=$DF7; fi
    $K bench-model --backend cuda --load-format dummy --config $C --prefill --decode-batch --breakdown-steps 0 \
      --context 1024 --speculative replay --replay-tokens 128 --replay-batches 1 --acceptance $A \
      --json $R/df${p}_${v}_$round.json > $R/df${p}_${v}_$round.txt 2>&1
  done
done; done
unset KESTREL_AB_COPY
for mode in default bi; do
  if [ $mode = bi ]; then P=bench/profiles/kestrel-cuda-dummy-replay-batch-invariant.toml; X=--batch-invariant
  else P=bench/profiles/kestrel-cuda-dummy-replay.toml; X=; fi
  $K bench run --profile $P --server-program $K --model-dir $MODEL --workload bench/workloads/replay-decode.toml \
    --port 0 --out $R/serve-replay-$mode > $R/serve-replay-$mode.txt 2>&1
  $K bench-model --backend cuda --load-format dummy --config $C --prefill --decode-batch --breakdown-steps 0 \
    --context 1024 $X --speculative replay --acceptance 0.87,0.74,0.61 --replay-batches 1,8 --replay-tokens 128 \
    --json $R/bm_replay_$mode.json > $R/bm_replay_$mode.txt 2>&1
done

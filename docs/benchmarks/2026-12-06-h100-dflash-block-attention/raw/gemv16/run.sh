#!/usr/bin/env bash
# 16-row gemv passes with 6 or 8 weight rows a warp (KESTREL_AB_G16=6|8,
# AB-only) against the committed 4: spec on = off at Qwen3.6 shapes under
# each, verify steps of 16 rows and the DFlash replay at k = 15, alternating.
# K: the kestrel binary, T: the GPU test binary (cargo test -p kestrel-cuda --features gpu-tests
# --no-run), R: where the outputs go; run from the repository root with the bundled
# model's weights in place. The AB-only switches named above were in the timed builds only.
set -u
export KESTREL_REQUIRE_CUDA=1
C=configs/qwen3.6-35b-a3b/config.json
for v in 6 8; do
  KESTREL_AB_G16=$v timeout 100 $T --test-threads=1 speculative_shapes matmul > $R/gpu_$v.txt 2>&1; echo "gpu $v rc $? at $SECONDS s"
  grep -E "^test |test result|panicked" $R/gpu_$v.txt | head -5
done
DF=$(python3 -c "print(','.join(f'{0.871**i:.4f}' for i in range(1, 16)))")
ab() { if [ $1 = 4 ]; then unset KESTREL_AB_G16; else export KESTREL_AB_G16=$1; fi; }
for round in 1 2; do
  for v in 4 6 8; do
    ab $v
    timeout 90 $K bench-model --backend cuda --load-format dummy --config $C --prefill --decode-batch --breakdown-steps 0 \
      --context 1024 --steps 20 --verify-k 3,7,15 --verify-batches 1,2,4 --json $R/v_${v}_$round.json > $R/v_${v}_$round.txt 2>&1
    echo "verify $v $round rc $? at $SECONDS s"; grep -E "^ +[124] +(3|7|15) " $R/v_${v}_$round.txt | tr -s ' ' | tr '\n' ';'; echo
    timeout 60 $K bench-model --backend cuda --load-format dummy --config $C --prefill --decode-batch --breakdown-steps 0 \
      --context 1024 --speculative replay --replay-tokens 128 --replay-batches 1 --acceptance $DF \
      --json $R/df15_${v}_$round.json > $R/df15_${v}_$round.txt 2>&1; echo "df15 $v $round rc $? at $SECONDS s"
    grep -E "^ +[0-9]" $R/df15_${v}_$round.txt | tail -1
  done
done

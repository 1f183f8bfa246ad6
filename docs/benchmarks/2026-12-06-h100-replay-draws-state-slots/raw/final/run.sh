#!/usr/bin/env bash
# H100. K, T: built from 19da696 as committed. R: where the outputs go.
# The FP8 fixtures were not on the machine, so their two tests are skipped.
set -u
export KESTREL_REQUIRE_CUDA=1
$T --test-threads=1 --skip fp8_fixtures > $R/gpu_all.txt 2>&1
C=configs/qwen3.6-35b-a3b/config.json
for what in verify decode; do
  if [ $what = verify ]; then X="--decode-batch --verify-k 3 --verify-batches 1"; else X="--decode-batch 1"; fi
  ncu --clock-control none --metrics gpu__time_duration.sum --csv -k 'regex:^(?!dummy_fill)' \
    $K bench-model --backend cuda --config $C --load-format dummy --eager --prefill $X --breakdown-steps 0 \
    --context 1024 --warmup 0 --steps 1 > $R/ncu_$what.csv 2> $R/ncu_$what.err
  gzip $R/ncu_$what.csv
done

#!/usr/bin/env bash
# H100. K: built from 2da8a39 plus a measurement switch (not committed),
# KESTREL_AB_SEQ1=1: the gemv K split and the attention key splits of a
# one-sequence step in every decode-shaped step (what cab23bd then made
# KESTREL_DECODE_SPLITS=sequence). MODEL: as in ../norm-rows/run.sh. R: where
# the outputs go.
set -u
export KESTREL_REQUIRE_CUDA=1
C=configs/qwen3.6-35b-a3b/config.json
for round in 1 2; do
  for v in base seq1; do
    if [ $v = seq1 ]; then export KESTREL_AB_SEQ1=1; else unset KESTREL_AB_SEQ1; fi
    $K bench-model --backend cuda --load-format dummy --config $C \
      --prefill --decode-batch 1,2,4,8 --context 1024 --steps 30 --breakdown-steps 0 --verify-k 3 --verify-batches 1,2 \
      --speculative replay --acceptance 0.87,0.74,0.61 --replay-batches 1,8 --replay-tokens 128 \
      --json $R/q36_${v}_$round.json > $R/q36_${v}_$round.txt 2>&1
  done
done
export KESTREL_AB_SEQ1=1
$K bench run --profile bench/profiles/kestrel-cuda-dummy-replay.toml --server-program $K --model-dir $MODEL \
  --workload bench/workloads/replay-decode.toml --port 0 --out $R/serve-replay-seq1 > $R/serve-replay-seq1.txt 2>&1

#!/usr/bin/env bash
# H100. K, T: built from cab23bd as committed (the serve replay profile sets
# KESTREL_DECODE_SPLITS=sequence). MODEL: as in ../norm-rows/run.sh. R: where
# the outputs go.
set -u
export KESTREL_REQUIRE_CUDA=1
C=configs/qwen3.6-35b-a3b/config.json
KESTREL_DECODE_SPLITS=sequence $T --test-threads=1 speculative_shapes mixed_steps > $R/gpu_seq.txt 2>&1
$K bench run --profile bench/profiles/kestrel-cuda-dummy-replay.toml --server-program $K --model-dir $MODEL \
  --workload bench/workloads/replay-decode.toml --port 0 --out $R/serve-replay > $R/serve-replay.txt 2>&1
for v in sequence step; do
  KESTREL_DECODE_SPLITS=$v $K bench-model --backend cuda --load-format dummy --config $C \
    --prefill --decode-batch 1,2,4,8 --context 1024 --steps 30 --breakdown-steps 0 \
    --speculative replay --acceptance 0.87,0.74,0.61 --replay-batches 1,8 --replay-tokens 128 \
    --json $R/bm_$v.json > $R/bm_$v.txt 2>&1
done

#!/usr/bin/env bash
# H100. K: kestrel, T: the GPU test binary (`cargo test -p kestrel-cuda
# --features gpu-tests --no-run`), both from a measurement build in which
# KESTREL_AB_NORM picks the rows `gemv_norm` takes (unset: up to 2, as
# committed; `verify`: up to 4 in steps with more rows than sequences; `4`:
# up to 4 always), with gemv_norm_m3 / _m4 compiled in. Not committed.
# MODEL: a folder with configs/qwen3.6-35b-a3b/config.json and the tokenizer
# of testdata/tokenizer/qwen3_6 (decompressed). R: where the outputs go.
# The replay proposer of this build numbered steps by draft calls (the
# first version of the step-keyed draws).
set -u
C=configs/qwen3.6-35b-a3b/config.json
ab() { if [ $1 = base ]; then unset KESTREL_AB_NORM; else export KESTREL_AB_NORM=$1; fi; }
bm() {
  ab $1
  $K bench-model --backend cuda --load-format dummy --config $C \
    --prefill --decode-batch 1,4,8 --context 1024 --steps 30 --breakdown-steps 0 --verify-k 1,2,3 --verify-batches 1,2 \
    --speculative replay --acceptance 0.87,0.74,0.61 --replay-batches 1,8 --replay-tokens 128 \
    --json $R/q36_$1_$2.json > $R/q36_$1_$2.txt 2>&1
}
for v in base verify 4; do bm $v 1; done
ab verify
$K bench run --profile bench/profiles/kestrel-cuda-dummy-replay.toml --server-program $K \
  --model-dir $MODEL --workload bench/workloads/replay-decode.toml --port 0 --out $R/serve-replay-first-draws
for round in 2 3; do for v in 4 verify base; do bm $v $round; done; done
unset KESTREL_AB_NORM
for v in verify 4; do KESTREL_AB_NORM=$v $T --test-threads=1 speculative_shapes > $R/gpu_spec_$v.txt 2>&1; done

#!/usr/bin/env bash
# H100. K, T: a measurement build in which the router product of 3..8 tokens
# routes them in its last block (moe_router_route_m*, not committed);
# KESTREL_AB_ROUTE=0 gives the committed path (gemv_m<T> and then
# moe_topk). R: where the outputs go.
set -u
export KESTREL_REQUIRE_CUDA=1
$T --test-threads=1 speculative_shapes moe mixed_steps > $R/gpu_a.txt 2>&1 || exit 1
C=configs/qwen3.6-35b-a3b/config.json
DF7=$(python3 -c "print(','.join(f'{0.871**i:.4f}' for i in range(1, 8)))")
ab() { if [ $1 = new ]; then unset KESTREL_AB_ROUTE; else export KESTREL_AB_ROUTE=0; fi; }
for round in 1 2 3; do for v in new old; do
  ab $v
  $K bench-model --backend cuda --load-format dummy --config $C \
    --prefill --decode-batch 1,4,8 --context 1024 --steps 30 --breakdown-steps 0 --verify-k 1,2,3 --verify-batches 1,2 \
    --speculative replay --acceptance 0.87,0.74,0.61 --replay-batches 1,8 --replay-tokens 128 \
    --json $R/q36_${v}_$round.json > $R/q36_${v}_$round.txt 2>&1
  $K bench-model --backend cuda --load-format dummy --config $C --prefill --decode-batch --breakdown-steps 0 \
    --context 1024 --speculative replay --replay-tokens 128 --replay-batches 1 --acceptance $DF7 \
    --json $R/df7_${v}_$round.json > $R/df7_${v}_$round.txt 2>&1
done; done
unset KESTREL_AB_ROUTE
$T --test-threads=1 --skip speculative_shapes --skip moe --skip mixed_steps --skip fp8_fixtures > $R/gpu_rest.txt 2>&1

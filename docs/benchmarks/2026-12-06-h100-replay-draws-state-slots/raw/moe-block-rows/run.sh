#!/usr/bin/env bash
# H100. K: built from 36fb82a plus a measurement switch (not committed):
# from 3 tokens on, KESTREL_AB_GU_ROWS / KESTREL_AB_DN_ROWS replace the
# intermediate rows of a moe_gate_up block (committed: 8) and the hidden
# rows of a moe_down block (committed: 32). R: where the outputs go.
set -u
export KESTREL_REQUIRE_CUDA=1
C=configs/qwen3.6-35b-a3b/config.json
for round in 1 2; do
  for v in base g4 g16 d16 d64; do
    unset KESTREL_AB_GU_ROWS KESTREL_AB_DN_ROWS
    case $v in g4) export KESTREL_AB_GU_ROWS=4;; g16) export KESTREL_AB_GU_ROWS=16;;
      d16) export KESTREL_AB_DN_ROWS=16;; d64) export KESTREL_AB_DN_ROWS=64;; esac
    $K bench-model --backend cuda --load-format dummy --config $C \
      --prefill --decode-batch 4,8 --context 1024 --steps 30 --breakdown-steps 0 --verify-k 3 --verify-batches 1,2 \
      --speculative replay --acceptance 0.87,0.74,0.61 --replay-batches 1,8 --replay-tokens 128 \
      --json $R/q36_${v}_$round.json > $R/q36_${v}_$round.txt 2>&1
  done
done

#!/usr/bin/env bash
# Qwen3.6 prefill by size and with the row-invariant cuBLASLt algorithm chosen
# for several reference row counts. KESTREL_AB_LT_ROWS existed only in this
# measurement build (it replaced ROW_INVARIANT_ROWS); main chose 1,024 from it.
C=configs/qwen3.6-35b-a3b/config.json
bm() {
  env $1 K bench-model --backend cuda --load-format dummy --config $C --prefill 1024,2048,4096,8192 \
    --prefill-runs 5 --decode-batch --breakdown-steps 0 --json q36_$2.json > q36_$2.txt 2>&1
}
for round in 1 2; do
  bm KESTREL_PROMPT_ROWS=by-size size$round
  for ref in 8192 4096 2048 1024; do bm "KESTREL_PROMPT_ROWS=invariant KESTREL_AB_LT_ROWS=$ref" inv${ref}_$round; done
done

#!/usr/bin/env bash
# One upload per drafter pass layer (the pack) against one per array
# (KESTREL_AB_UPLOADS=1, AB-only): block-attention GPU checks, passes
# alternating, three rounds.
# K: the kestrel binary, T: the GPU test binary, R: where the outputs go; run from the
# repository root. The AB-only switch was in the timed build only.
set -u
export KESTREL_REQUIRE_CUDA=1
timeout 120 $T --test-threads=1 block_attention > $R/gpu_block.txt 2>&1; echo "gpu block rc $? at $SECONDS s"
grep -E "test result|panicked" $R/gpu_block.txt
C=configs/qwen3.6-35b-a3b/config.json
D=configs/qwen3.6-35b-a3b-dflash/config.json
for round in 1 2 3; do
  for v in pack arrays; do
    if [ $v = pack ]; then unset KESTREL_AB_UPLOADS; else export KESTREL_AB_UPLOADS=1; fi
    timeout 90 $K bench-model --backend cuda --config $C --load-format dummy --prefill 512 --prefill-runs 1 --decode-batch \
      --breakdown-steps 0 --steps 40 --warmup 5 --dflash-drafter $D --dflash-blocks 8,16 --dflash-batches 1,2,4,8 --context 1024 \
      --json $R/pass_${v}_$round.json > $R/pass_${v}_$round.txt 2>&1
    echo "pass $v $round rc $? at $SECONDS s"; grep -E "^ +[0-9]+ +[0-9]+ +248320" $R/pass_${v}_$round.txt | tr -s ' ' | cut -d' ' -f2,3,5 | tr '\n' ';'; echo
  done
done

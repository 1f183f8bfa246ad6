#!/usr/bin/env bash
# Where a DFlash step goes on the H100: drafter passes (block 8/16, batch 1/8)
# and verify steps (k 3/7/15), timed; then per-kernel times (ncu) of one verify
# k=15 step at batch 1 and of drafter passes of 16 at batch 1 and 8.
# K: the kestrel binary, T: the GPU test binary (cargo test -p kestrel-cuda --features gpu-tests
# --no-run), R: where the outputs go; run from the repository root with the bundled
# model's weights in place. The AB-only switches named above were in the timed builds only.
set -u
export KESTREL_REQUIRE_CUDA=1
C=configs/qwen3.6-35b-a3b/config.json
D=configs/qwen3.6-35b-a3b-dflash/config.json
COMMON="--backend cuda --config $C --load-format dummy --prefill 512 --prefill-runs 1"
timeout 120 $K bench-model $COMMON --steps 20 --warmup 3 --decode-batch 1,8 --dflash-drafter $D --dflash-blocks 8,16 \
  --dflash-batches 1,8 --context 1024 --verify-k 3,7,15 --verify-batches 1,8 --breakdown-steps 0 \
  --json $R/dflash.json > $R/dflash.txt 2>&1; echo "dflash rc $? at $SECONDS s"
grep -E "^ +[0-9]|pass|verify" $R/dflash.txt | head -30
ncu --clock-control none --metrics gpu__time_duration.sum --csv -k 'regex:^(?!dummy_fill)' \
  $K bench-model $COMMON --eager --decode-batch --verify-k 15 --verify-batches 1 --breakdown-steps 0 \
  --context 1024 --warmup 0 --steps 1 > $R/ncu_verify15.csv 2> $R/ncu_verify15.err; echo "ncu v15 rc $? at $SECONDS s"
for b in 1 8; do
ncu --clock-control none --metrics gpu__time_duration.sum --csv -k 'regex:^(?!dummy_fill)' \
  $K bench-model $COMMON --eager --decode-batch --dflash-drafter $D --dflash-blocks 16 --dflash-batches $b \
  --breakdown-steps 0 --context 1024 --warmup 0 --steps 1 > $R/ncu_pass16_b$b.csv 2> $R/ncu_pass16_b$b.err
echo "ncu pass b$b rc $? at $SECONDS s"
done
gzip $R/*.csv

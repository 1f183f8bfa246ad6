#!/usr/bin/env bash
# gemv_fp8 m5..8/m16 converting each chunk once (new) against the previous kernels (old,
# KESTREL_AB_FP8_OLD=1), both with the stacked in_proj.
set -u
START=$(date +%s)
# K: the kestrel binary, T: the GPU test binary.
R=results; mkdir -p $R
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > $R/gpu.txt
# (the fixtures are read from the repository root)
export KESTREL_REQUIRE_CUDA=1
(cd crates/kestrel-cuda && timeout 60 $T --test-threads=1 cuda_matches_cpu::fp8 --nocapture) > $R/tests.txt 2>&1
echo "tests rc $? t=$(( $(date +%s) - START ))" >> $R/tests.txt
grep -E "^test |test result|rc |FAIL" $R/tests.txt | tail -5
Q="--backend cuda --config configs/qwen3.6-35b-a3b/config.json --load-format dummy --breakdown-steps 0 --context 1024 --quantization fp8"
for ab in new old; do
  unset KESTREL_AB_FP8_OLD; [ $ab = old ] && export KESTREL_AB_FP8_OLD=1
  timeout 50 $K bench-model $Q --decode-batch 1,8 --steps 20 --verify-k 3,15 --verify-batches 1,2 --json $R/fp8_${ab}.json > $R/fp8_${ab}.txt 2>&1
  echo "fp8 $ab rc $? t=$(( $(date +%s) - START ))"
  timeout 50 $K bench-model $Q --decode-batch --speculative replay --acceptance 0.87,0.74,0.61 --replay-batches 8 --replay-tokens 96 --json $R/replay_${ab}.json > $R/replay_${ab}.txt 2>&1
  echo "replay $ab rc $? t=$(( $(date +%s) - START ))"
done
for f in $R/replay_*.txt; do echo "== $f"; grep -hE -A2 "same out" $f | tail -1; done
python3 - <<'P'
import json
for ab in ('new','old'):
    try: d=json.load(open(f'results/fp8_{ab}.json'))
    except Exception as e: print(ab, e); continue
    print(ab, [(x['batch'], round(x['step_time']['median_ms'],3)) for x in d['decode']], [(v['batch'], v['k'], round(v['step_time']['median_ms'],3)) for v in d['verify']])
P
tar czf $OUT/raw.tgz -C $R .

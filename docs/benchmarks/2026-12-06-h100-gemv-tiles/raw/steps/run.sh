#!/usr/bin/env bash
# gemv tiles: GPU checks, then the new tiles (KESTREL_AB_BASE=0) against the previous ones
# (KESTREL_AB_BASE=1, a switch of the measured build only, not committed), alternating.
set -u
python3 -c "import lzma,shutil
for n in ('kestrel','gpu'):
    with lzma.open('.devrun/'+n+'.xz') as f, open('.devrun/'+n,'wb') as o: shutil.copyfileobj(f,o)"
chmod +x .devrun/kestrel .devrun/gpu; K=$PWD/.devrun/kestrel; T=$PWD/.devrun/gpu
R=${TMPDIR:-/tmp}/r; mkdir -p $R
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > $R/gpu.txt
mkdir -p "$(dirname "$BUILD_DIR")" && ln -sfn "$PWD" "$BUILD_DIR"  # BUILD_DIR: the checkout the test binary was built in (its fixture paths)
export KESTREL_REQUIRE_CUDA=1
(cd crates/kestrel-cuda && timeout 200 $T --test-threads=1 matmul fp8 speculative precision) > $R/tests.txt 2>&1
echo "tests rc $?" >> $R/tests.txt
grep -E "^test |test result|rc " $R/tests.txt | tail -20
Q="--backend cuda --config configs/qwen3.6-35b-a3b/config.json --load-format dummy --prefill --breakdown-steps 0 --context 1024"
for round in 1 2; do
  for ab in 0 1; do
    KESTREL_AB_BASE=$ab timeout 60 $K bench-model $Q --decode-batch 1,2,8 --steps 30 --verify-k 3 --verify-batches 1,2 --json $R/bf16_ab${ab}_r${round}.json > $R/bf16_ab${ab}_r${round}.txt 2>&1
    echo "bf16 ab=$ab r=$round rc $?"
    KESTREL_AB_BASE=$ab timeout 60 $K bench-model $Q --quantization fp8 --decode-batch 1,2,8 --steps 30 --verify-k 3 --verify-batches 1,2 --json $R/fp8_ab${ab}_r${round}.json > $R/fp8_ab${ab}_r${round}.txt 2>&1
    echo "fp8 ab=$ab r=$round rc $?"
    KESTREL_AB_BASE=$ab timeout 90 $K bench-model $Q --decode-batch --speculative replay --acceptance 0.87,0.74,0.61 --replay-batches 1,8 --replay-tokens 128 --json $R/replay_ab${ab}_r${round}.json > $R/replay_ab${ab}_r${round}.txt 2>&1
    echo "replay ab=$ab r=$round rc $?"
  done
done
grep -hE "^decode|^verify|replay|tok/s" $R/bf16_ab0_r1.txt | head -20
tar czf $OUT/raw.tgz -C $R .
cp $R/tests.txt $OUT/

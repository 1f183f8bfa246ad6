#!/usr/bin/env bash
set -u
python3 -c "import lzma,shutil
with lzma.open('.devrun/kestrel.xz') as f, open('.devrun/kestrel','wb') as o: shutil.copyfileobj(f,o)"
chmod +x .devrun/kestrel; K=$PWD/.devrun/kestrel
C="--backend cuda --config configs/qwen3.8-flash-next-12-layers/config.json --load-format dummy"
for g in 0 1; do
  KESTREL_CUDA_GRAPHS=$g timeout 50 $K bench-model $C --prefill --decode-batch 1,8 --context 1024 --steps 30 --breakdown-steps 0 --json $OUT/decode2_g${g}.json > $OUT/decode2_g${g}.txt 2>&1
  echo "graphs=$g rc $?"; grep -iE "^decode" $OUT/decode2_g${g}.txt | tail -2
done
timeout 50 $K bench-model $C --prefill --decode-batch 1,8 --context 4096 --steps 20 --breakdown-steps 0 --json $OUT/decode4k.json > $OUT/decode4k.txt 2>&1
echo "4k rc $?"; grep -iE "^decode" $OUT/decode4k.txt | tail -2

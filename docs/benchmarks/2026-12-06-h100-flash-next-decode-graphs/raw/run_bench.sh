#!/usr/bin/env bash
set -u
python3 -c "import lzma,shutil
with lzma.open('.devrun/kestrel.xz') as f, open('.devrun/kestrel','wb') as o: shutil.copyfileobj(f,o)"
chmod +x .devrun/kestrel; K=$PWD/.devrun/kestrel
C="--backend cuda --config configs/qwen3.8-flash-next-12-layers/config.json --load-format dummy"
for g in 1 0; do
  KESTREL_CUDA_GRAPHS=$g timeout 70 $K bench-model $C --prefill --decode-batch 1,8 --context 1024 --steps 20 --breakdown-steps 0 --json $OUT/decode_g${g}.json > $OUT/decode_g${g}.txt 2>&1
  echo "graphs=$g rc $?"; grep -iE "decode|tok/s" $OUT/decode_g${g}.txt | tail -4
done

#!/usr/bin/env bash
# Flash-Next decode graphs: the GPU checks. Files go straight to $OUT.
set -u
python3 -c "import lzma,shutil
with lzma.open('.devrun/gpu.xz') as f, open('.devrun/gpu','wb') as o: shutil.copyfileobj(f,o)"
chmod +x .devrun/gpu; T=$PWD/.devrun/gpu
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > $OUT/gpu.txt
export KESTREL_REQUIRE_CUDA=1
# the fixtures are found through the build's workspace path: link it to this checkout
ln -sfn "$PWD" "$BUILD_WORKSPACE"
(cd crates/kestrel-cuda && timeout 150 $T --test-threads=1 --nocapture flash_next) > $OUT/tests.txt 2>&1
echo "tests rc $?" >> $OUT/tests.txt
grep -E "^test |test result|steps of 3|request [0-9]|rc |panicked" $OUT/tests.txt | tail -16

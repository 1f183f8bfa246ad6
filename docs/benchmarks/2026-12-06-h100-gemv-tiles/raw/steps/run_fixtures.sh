set -u
python3 -c "import lzma,shutil
with lzma.open('.devrun/gpu.xz') as f, open('.devrun/gpu','wb') as o: shutil.copyfileobj(f,o)"
chmod +x .devrun/gpu; T=$PWD/.devrun/gpu
mkdir -p "$(dirname "$BUILD_DIR")" && ln -sfn "$PWD" "$BUILD_DIR"  # BUILD_DIR: the checkout the test binary was built in (its fixture paths)
export KESTREL_REQUIRE_CUDA=1
(cd crates/kestrel-cuda && timeout 200 $T --test-threads=1 fp8_checkpoints speculative::) > $OUT/tests2.txt 2>&1
echo "tests rc $?" >> $OUT/tests2.txt
grep -E "^test |test result|rc " $OUT/tests2.txt

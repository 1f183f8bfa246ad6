#!/usr/bin/env bash
# attention_block (one launch for every sequence's drafter block) against
# the per-row decode-kernel path (KESTREL_AB_BLOCK_OLD=1, AB-only): GPU
# block-attention checks, drafter passes alternating, the bundled model
# served with its drafter (output vs plain), ncu of passes of 16.
# K: the kestrel binary, T: the GPU test binary (cargo test -p kestrel-cuda --features gpu-tests
# --no-run), R: where the outputs go; run from the repository root with the bundled
# model's weights in place. The AB-only switches named above were in the timed builds only.
set -u
export KESTREL_REQUIRE_CUDA=1
timeout 120 $T --test-threads=1 block_attention > $R/gpu_block.txt 2>&1; echo "gpu block rc $? at $SECONDS s"
grep -E "^test |test result|panicked|block_attention" $R/gpu_block.txt | head -20
C=configs/qwen3.6-35b-a3b/config.json
D=configs/qwen3.6-35b-a3b-dflash/config.json
COMMON="--backend cuda --config $C --load-format dummy --prefill 512 --prefill-runs 1 --decode-batch --breakdown-steps 0"
ab() { if [ $1 = new ]; then unset KESTREL_AB_BLOCK_OLD; else export KESTREL_AB_BLOCK_OLD=1; fi; }
for round in 1 2; do
  for v in new old; do
    ab $v
    timeout 90 $K bench-model $COMMON --steps 20 --warmup 3 --dflash-drafter $D --dflash-blocks 8,16 \
      --dflash-batches 1,2,4,8 --context 1024 --json $R/pass_${v}_$round.json > $R/pass_${v}_$round.txt 2>&1
    echo "pass $v $round rc $? at $SECONDS s"; grep -E "^ +[0-9]+ +[0-9]+ +248320" $R/pass_${v}_$round.txt | tr -s ' ' | tr '\n' ';'; echo
  done
done
for v in new old; do
  ab $v
  timeout 60 $K bench-model $COMMON --steps 20 --warmup 3 --dflash-drafter $D --dflash-blocks 16 \
    --dflash-batches 1 --context 8192 --json $R/pass8k_$v.json > $R/pass8k_$v.txt 2>&1
  echo "pass8k $v rc $? at $SECONDS s"; grep -E "^ +[0-9]+ +[0-9]+ +248320" $R/pass8k_$v.txt | tr -s ' '
done
serve() {  # name args...
  local name=$1; shift
  $K serve --backend cuda --port 8123 "$@" > $R/serve_$name.log 2>&1 & local pid=$!
  for i in $(seq 60); do curl -sf localhost:8123/v1/models > /dev/null && break; sleep 1; done
  for c in 8 1; do timeout 120 python3 scripts/concurrent_greedy.py http://localhost:8123 $R/greedy_${name}_c$c.json $c; done
  kill $pid; wait $pid 2>/dev/null
}
unset KESTREL_AB_BLOCK_OLD
serve plain
serve dflash --speculative dflash
export KESTREL_AB_BLOCK_OLD=1; serve dflash_old --speculative dflash; unset KESTREL_AB_BLOCK_OLD
python3 - $R <<'PY'
import json,sys
R=sys.argv[1]
for c in (8,1):
    base=[x["text"] for x in json.load(open(f"{R}/greedy_plain_c{c}.json"))["rounds"][0]["results"]]
    for n in ("dflash","dflash_old"):
        d=json.load(open(f"{R}/greedy_{n}_c{c}.json"))
        same=sum(x["text"]==b for r in d["rounds"] for x,b in zip(r["results"],base))
        print(n, "c", c, "tok/s", [round(r["tok_s"],1) for r in d["rounds"]], "same as plain", same, "/", 3*len(base))
PY
echo "serve done at $SECONDS s"
for b in 1 8; do
ncu --clock-control none --metrics gpu__time_duration.sum --csv -k 'regex:^(?!dummy_fill)' \
  $K bench-model $COMMON --eager --dflash-drafter $D --dflash-blocks 16 --dflash-batches $b \
  --context 1024 --warmup 0 --steps 1 > $R/ncu_pass16_b$b.csv 2> $R/ncu_pass16_b$b.err
echo "ncu pass b$b rc $? at $SECONDS s"
done
gzip $R/*.csv

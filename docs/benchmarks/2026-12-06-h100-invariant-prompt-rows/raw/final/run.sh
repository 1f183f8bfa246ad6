#!/usr/bin/env bash
# Final code: cold TTFT through serve (long-8k) with invariant prompt rows and
# by size; Qwen3.6 prefill and decode, both modes alternating.
set -u
R=RES; mkdir -p $R
cd "$(dirname "$0")/.."
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > $R/gpu.txt 2>&1
cat $R/gpu.txt
finish() { tar czf $OUT/res.tgz -C /tmp res; }
trap finish EXIT
unxz() { python3 -c "import lzma,sys; open(sys.argv[2],'wb').write(lzma.decompress(open(sys.argv[1],'rb').read()))" "$1" "$2"; }
unxz BUNDLE/kestrel.xz K; chmod +x K
M=MODEL; mkdir -p $M; cp BUNDLE/q36/config.json BUNDLE/q36/tokenizer_config.json $M/
unxz BUNDLE/q36/tokenizer.json.xz $M/tokenizer.json
log() { echo "$(date +%T) $*"; }
ttft() {
  log "ttft $2"
  env $1 KESTREL=K timeout 200 scripts/serve-ttft.sh $R/ttft_$2 --model-dir $M \
    --profile bench/profiles/kestrel-cuda-dummy-cache-on.toml --workload bench/workloads/long-8k.toml \
    -- --backend cuda --config $M/config.json --load-format dummy > $R/ttft_$2.txt 2>&1
  log "rc $?"
  grep -E "^\| (cold|primed) \| TTFT|Outcome" $R/ttft_$2/bench/summary.md
  python3 -c "import json,sys; c=json.load(open(sys.argv[1])); print('cold', c['serve_cold_ttft_ms'], 'bench-model', c['bench_model_prefill']['time']['all_ms'])" $R/ttft_$2/comparison.json
}
ttft KESTREL_PROMPT_ROWS=invariant inv1
ttft KESTREL_PROMPT_ROWS=by-size size1
ttft KESTREL_PROMPT_ROWS=invariant inv2
ttft KESTREL_PROMPT_ROWS=by-size size2
C=configs/qwen3.6-35b-a3b/config.json
bm() {
  timeout 150 env $1 K bench-model --backend cuda --load-format dummy --config $C --prefill 1024,2048,7259,8192 \
    --prefill-runs 5 --decode-batch 1,8 --context 1024 --steps 20 --breakdown-steps 0 \
    --json $R/q36_$2.json > $R/q36_$2.txt 2>&1; log "bench $2 rc $?"
  grep -E "^ +[0-9]+ +[0-9.]+ " $R/q36_$2.txt | awk '{printf "%s:%s ", $1, $2=="1"?$3:$2} END {print ""}'
}
for round in 1 2; do
  bm KESTREL_PROMPT_ROWS=invariant inv$round
  bm KESTREL_PROMPT_ROWS=by-size size$round
done

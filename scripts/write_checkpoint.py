#!/usr/bin/env python3
"""Write a checkpoint at full shapes from a config.json, with random BF16 values.

Load-time measurements need real files in the layout the official checkpoints use, without
downloading tens of gigabytes: this writes sharded `model-0000X-of-0000Y.safetensors` files,
`model.safetensors.index.json` and `config.json` with Hugging Face's tensor names for qwen3,
qwen3_moe, qwen3_5_moe (Qwen3.5/3.6, including the MTP head) and qwen3_next. Experts are stored
one by one (`...mlp.experts.E.{gate,up,down}_proj.weight`), as in the published checkpoints;
`--stacked-experts` writes transformers' fused `experts.gate_up_proj` / `experts.down_proj`
instead. Vision-tower weights of Qwen3.5/3.6 are not written: kestrel does not read them.

Values: matrices are random BF16 of magnitude 2^-7..2^-5 with random signs (about the 0.02
standard deviation of the configs' initialiser, never NaN or Inf), so that a model built from the
files runs with finite activations; norm weights are the identity (0 for zero-centred norms),
`A_log` and `dt_bias` are 0. Random bytes come from one pool drawn from `--seed`, each tensor
starting at its own offset in it, so writing runs at disk speed. Only the standard library is
needed (no torch, no numpy).

No tokenizer is written: `kestrel bench-model` needs none (it feeds token ids). `generate` and
`serve` need the real model's tokenizer files (`tokenizer.json`, `tokenizer_config.json`,
`chat_template.jinja`) copied in; the bundled model's tokenizer has another vocabulary.

Usage:
  python3 scripts/write_checkpoint.py --config configs/qwen3.6-35b-a3b/config.json --out DIR \
      [--layers N] [--shard-gb 4] [--seed 0] [--stacked-experts] [--no-mtp] [--shard-dirs A,B]

`--layers N` keeps the first N layers of the config (its `layer_types` cut to N entries; if none
of them is full attention the last one is made full attention, so that every block kind is
present) and writes that config.json.

`--shard-dirs A,B` writes the shards into those folders in turn, each linked from `--out` by a
symbolic link of its own name: for a host where no one filesystem holds the whole checkpoint
(the full Qwen3.6-35B-A3B is 71 GB).
"""

import argparse
import json
import os
import random
import struct
import sys

POOL_BYTES = 64 << 20
WRITE_CHUNK = 16 << 20
BF16_ONE = b"\x80\x3f"
BF16_ZERO = b"\x00\x00"


def text_config(root):
    """The language model's section of the config and its tensor-name prefix."""
    if root["model_type"] == "qwen3_5_moe":
        return root["text_config"], "model.language_model."
    if root["model_type"] in ("qwen3", "qwen3_moe", "qwen3_next", "qwen3_5_moe_text"):
        return root, "model."
    sys.exit(f"unsupported model_type {root['model_type']!r}")


def cut_layers(root, n):
    """The config with only its first n layers."""
    cfg, _ = text_config(root)
    total = cfg["num_hidden_layers"]
    if not 1 <= n <= total:
        sys.exit(f"--layers must be in 1..={total}")
    cfg["num_hidden_layers"] = n
    if "layer_types" in cfg:
        types = cfg["layer_types"][:n]
        if "full_attention" not in types:
            types[-1] = "full_attention"
        cfg["layer_types"] = types
    if "mlp_only_layers" in cfg:
        cfg["mlp_only_layers"] = [i for i in cfg["mlp_only_layers"] if i < n]
    return root


def layer_types(cfg):
    n = cfg["num_hidden_layers"]
    if cfg.get("layer_types"):
        return cfg["layer_types"]
    if "linear_num_key_heads" in cfg:
        interval = cfg.get("full_attention_interval", 4)
        return [
            "full_attention" if (i + 1) % interval == 0 else "linear_attention" for i in range(n)
        ]
    return ["full_attention"] * n


def attention(p, cfg, hybrid):
    h, hq, hkv = cfg["hidden_size"], cfg["num_attention_heads"], cfg["num_key_value_heads"]
    d = cfg.get("head_dim") or h // hq
    gated = cfg.get("attn_output_gate", hybrid)
    yield f"{p}q_proj.weight", [hq * d * (2 if gated else 1), h], "matrix"
    yield f"{p}k_proj.weight", [hkv * d, h], "matrix"
    yield f"{p}v_proj.weight", [hkv * d, h], "matrix"
    yield f"{p}o_proj.weight", [h, hq * d], "matrix"
    yield f"{p}q_norm.weight", [d], "norm"
    yield f"{p}k_norm.weight", [d], "norm"


def linear_attention(p, cfg, next_layout):
    h = cfg["hidden_size"]
    hk, hv = cfg["linear_num_key_heads"], cfg["linear_num_value_heads"]
    dk, dv = cfg["linear_key_head_dim"], cfg["linear_value_head_dim"]
    k = cfg.get("linear_conv_kernel_dim", 4)
    conv = 2 * hk * dk + hv * dv
    if next_layout:
        r = hv // hk
        yield f"{p}in_proj_qkvz.weight", [hk * (2 * dk + 2 * r * dv), h], "matrix"
        yield f"{p}in_proj_ba.weight", [hk * 2 * r, h], "matrix"
    else:
        yield f"{p}in_proj_qkv.weight", [conv, h], "matrix"
        yield f"{p}in_proj_z.weight", [hv * dv, h], "matrix"
        yield f"{p}in_proj_b.weight", [hv, h], "matrix"
        yield f"{p}in_proj_a.weight", [hv, h], "matrix"
    yield f"{p}conv1d.weight", [conv, 1, k], "matrix"
    yield f"{p}A_log", [hv], "zero"
    yield f"{p}dt_bias", [hv], "zero"
    yield f"{p}norm.weight", [dv], "one"
    yield f"{p}out_proj.weight", [h, hv * dv], "matrix"


def moe(p, cfg, stacked):
    h, e, i = cfg["hidden_size"], cfg["num_experts"], cfg["moe_intermediate_size"]
    yield f"{p}gate.weight", [e, h], "matrix"
    if stacked:
        yield f"{p}experts.gate_up_proj", [e, 2 * i, h], "matrix"
        yield f"{p}experts.down_proj", [e, h, i], "matrix"
    else:
        for x in range(e):
            yield f"{p}experts.{x}.gate_proj.weight", [i, h], "matrix"
            yield f"{p}experts.{x}.up_proj.weight", [i, h], "matrix"
            yield f"{p}experts.{x}.down_proj.weight", [h, i], "matrix"
    si = cfg.get("shared_expert_intermediate_size") or 0
    if si > 0 and "linear_num_key_heads" in cfg:
        yield f"{p}shared_expert.gate_proj.weight", [si, h], "matrix"
        yield f"{p}shared_expert.up_proj.weight", [si, h], "matrix"
        yield f"{p}shared_expert.down_proj.weight", [h, si], "matrix"
        yield f"{p}shared_expert_gate.weight", [1, h], "matrix"


def dense_mlp(p, cfg):
    h, i = cfg["hidden_size"], cfg["intermediate_size"]
    yield f"{p}gate_proj.weight", [i, h], "matrix"
    yield f"{p}up_proj.weight", [i, h], "matrix"
    yield f"{p}down_proj.weight", [h, i], "matrix"


def is_sparse(cfg, i):
    if not cfg.get("num_experts"):
        return False
    if "linear_num_key_heads" in cfg and "decoder_sparse_step" not in cfg:
        return True
    step = max(cfg.get("decoder_sparse_step", 1), 1)
    return i not in cfg.get("mlp_only_layers", []) and (i + 1) % step == 0


def layer(p, cfg, kind, sparse, model_type, stacked):
    hybrid = "linear_num_key_heads" in cfg
    norm = "norm"
    yield f"{p}input_layernorm.weight", [cfg["hidden_size"]], norm
    if kind == "full_attention":
        yield from attention(f"{p}self_attn.", cfg, hybrid)
    else:
        yield from linear_attention(f"{p}linear_attn.", cfg, model_type == "qwen3_next")
    yield f"{p}post_attention_layernorm.weight", [cfg["hidden_size"]], norm
    if sparse:
        yield from moe(f"{p}mlp.", cfg, stacked)
    else:
        yield from dense_mlp(f"{p}mlp.", cfg)


def tensors(root, stacked, mtp):
    """(name, shape, fill) of every tensor, in the order they are written."""
    cfg, prefix = text_config(root)
    h, v = cfg["hidden_size"], cfg["vocab_size"]
    yield f"{prefix}embed_tokens.weight", [v, h], "matrix"
    for i, kind in enumerate(layer_types(cfg)):
        yield from layer(
            f"{prefix}layers.{i}.", cfg, kind, is_sparse(cfg, i), root["model_type"], stacked
        )
    yield f"{prefix}norm.weight", [h], "norm"
    if not root.get("tie_word_embeddings", cfg.get("tie_word_embeddings", False)):
        yield "lm_head.weight", [v, h], "matrix"
    if cfg.get("mtp_num_hidden_layers", 0) > 0 and mtp:
        yield "mtp.fc.weight", [h, 2 * h], "matrix"
        yield "mtp.pre_fc_norm_embedding.weight", [h], "norm"
        yield "mtp.pre_fc_norm_hidden.weight", [h], "norm"
        yield from layer(
            "mtp.layers.0.", cfg, "full_attention", bool(cfg.get("num_experts")),
            root["model_type"], stacked,
        )
        yield "mtp.norm.weight", [h], "norm"


def random_pool(seed):
    """POOL_BYTES of little-endian BF16 values: random mantissas, exponents 120-121, signs."""
    rng = random.Random(seed)
    n = POOL_BYTES // 2
    # The high byte is the sign and the top seven exponent bits; keep the sign, fix the rest.
    high_of = bytes((b & 0x80) | 0x3C for b in range(256))
    pool = bytearray(POOL_BYTES)
    pool[0::2] = rng.randbytes(n)
    pool[1::2] = rng.randbytes(n).translate(high_of)
    return memoryview(bytes(pool))


def write_values(f, fill, nbytes, pool, rng, zero_centred):
    if fill == "norm":
        fill = "zero" if zero_centred else "one"
    if fill in ("one", "zero"):
        f.write((BF16_ONE if fill == "one" else BF16_ZERO) * (nbytes // 2))
        return
    offset = rng.randrange(0, POOL_BYTES // 2) * 2
    while nbytes > 0:
        take = min(nbytes, WRITE_CHUNK, POOL_BYTES - offset)
        f.write(pool[offset : offset + take])
        nbytes -= take
        offset = (offset + take) % POOL_BYTES


def shard(plan, shard_bytes):
    shards, current, size = [], [], 0
    for t in plan:
        nbytes = 2 * prod(t[1])
        if current and size + nbytes > shard_bytes:
            shards.append(current)
            current, size = [], 0
        current.append(t)
        size += nbytes
    if current:
        shards.append(current)
    return shards


def prod(shape):
    n = 1
    for d in shape:
        n *= d
    return n


def header(entries):
    meta, offset = {"__metadata__": {"format": "pt"}}, 0
    for name, shape, _ in entries:
        nbytes = 2 * prod(shape)
        meta[name] = {"dtype": "BF16", "shape": shape, "data_offsets": [offset, offset + nbytes]}
        offset += nbytes
    text = json.dumps(meta, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--config", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--layers", type=int)
    ap.add_argument("--shard-gb", type=float, default=4.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--stacked-experts", action="store_true")
    ap.add_argument("--no-mtp", action="store_true", help="leave out the MTP head's weights")
    ap.add_argument("--shard-dirs", help="comma-separated folders to write the shards into in turn")
    args = ap.parse_args()
    shard_dirs = args.shard_dirs.split(",") if args.shard_dirs else [args.out]
    for d in shard_dirs:
        os.makedirs(d, exist_ok=True)

    with open(args.config) as f:
        root = json.load(f)
    if args.layers is not None:
        root = cut_layers(root, args.layers)
    cfg, _ = text_config(root)
    zero_centred = "linear_num_key_heads" in cfg
    plan = list(tensors(root, args.stacked_experts, not args.no_mtp))
    shards = shard(plan, int(args.shard_gb * 1e9))
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "config.json"), "w") as f:
        json.dump(root, f, indent=2)
        f.write("\n")

    pool, rng = random_pool(args.seed), random.Random(args.seed + 1)
    weight_map, total = {}, 0
    for k, entries in enumerate(shards):
        name = f"model-{k + 1:05d}-of-{len(shards):05d}.safetensors"
        path = os.path.join(shard_dirs[k % len(shard_dirs)], name)
        if os.path.abspath(os.path.dirname(path)) != os.path.abspath(args.out):
            link = os.path.join(args.out, name)
            if os.path.lexists(link):
                os.remove(link)
            os.symlink(os.path.abspath(path), link)
        with open(path, "wb") as f:
            f.write(header(entries))
            for tensor, shape, fill in entries:
                write_values(f, fill, 2 * prod(shape), pool, rng, zero_centred)
                weight_map[tensor] = name
                total += 2 * prod(shape)
        print(f"{name}: {len(entries)} tensors", file=sys.stderr)
    with open(os.path.join(args.out, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=2)
        f.write("\n")
    print(f"{len(plan)} tensors, {total / 1e9:.2f} GB in {len(shards)} shards", file=sys.stderr)


if __name__ == "__main__":
    main()

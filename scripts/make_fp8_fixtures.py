#!/usr/bin/env python3
"""Build the block-FP8 test fixtures under testdata/fp8/ from the golden tiny models.

For each architecture in testdata/golden/ this writes, in the on-disk format of Qwen's
official -FP8 checkpoints:
  <arch>/model/         config.json with a quantization_config (quant_method fp8, fmt e4m3,
                        weight_block_size [128, 128], activation_scheme dynamic,
                        modules_to_not_convert) and the checkpoint: every linear-layer matrix
                        (attention q/k/v/o, Gated DeltaNet in_proj_qkv/in_proj_z/in_proj_qkvz/
                        out_proj, dense and shared-expert gate/up/down, routed experts) as
                        F8_E4M3 with a `<name>_scale_inv` tensor of one scale per 128x128 block
                        ([ceil(rows/128), ceil(cols/128)]); routed experts stored one by one
                        (`experts.{e}.{gate,up,down}_proj.weight`) even where the golden model
                        stacks them; everything else (embeddings, lm_head, norms, router,
                        shared_expert_gate, in_proj_a/b/ba, conv1d, A_log, dt_bias, mtp.fc, the
                        vision tower) as stored. Scales are float32 for qwen3 and qwen3_moe and
                        bfloat16 for qwen3_5_moe and qwen3_next, so both dtypes are covered.
  <arch>/dequantized/   the golden config.json and the same tensors with every FP8 weight
                        replaced by its exact float32 value, e4m3(code) * scale_inv: the
                        reference the FP8 checkpoint must reproduce.

Quantisation (the rule the official checkpoints follow): per block, scale_inv = amax / 448
(a bfloat16 scale is rounded first, and the codes are computed with the rounded scale), codes =
e4m3fn(w / scale_inv) rounded to nearest-even and saturated at 448; an all-zero block gets
scale 1. Deterministic: no randomness at all.

Usage: python3 scripts/make_fp8_fixtures.py [--golden DIR] [--out DIR]
Needs numpy and ml_dtypes (for the e4m3fn and bfloat16 casts).
"""

import argparse
import json
import struct
import sys
from pathlib import Path

import ml_dtypes
import numpy as np

ROOT = Path(__file__).resolve().parent.parent
BLOCK = 128
ARCHES = {"qwen3": "F32", "qwen3_moe": "F32", "qwen3_5_moe": "BF16", "qwen3_next": "BF16"}
NOT_CONVERTED = ["lm_head", "model.visual", "mtp.fc"]
DTYPES = {
    "F32": np.dtype(np.float32),
    "F16": np.dtype(np.float16),
    "BF16": np.dtype(ml_dtypes.bfloat16),
    "F8_E4M3": np.dtype(ml_dtypes.float8_e4m3fn),
}
NAMES = {v: k for k, v in DTYPES.items()}


def read_safetensors(path):
    data = path.read_bytes()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8 : 8 + n])
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        start, end = info["data_offsets"]
        raw = data[8 + n + start : 8 + n + end]
        out[name] = np.frombuffer(raw, dtype=DTYPES[info["dtype"]]).reshape(info["shape"])
    return out


def write_safetensors(path, tensors):
    header, offset, blobs = {}, 0, []
    for name in sorted(tensors):
        t = np.ascontiguousarray(tensors[name])
        raw = t.tobytes()
        header[name] = {"dtype": NAMES[t.dtype], "shape": list(t.shape), "data_offsets": [offset, offset + len(raw)]}
        blobs.append(raw)
        offset += len(raw)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    path.write_bytes(struct.pack("<Q", len(text)) + text + b"".join(blobs))


def quantizable(name):
    """The official checkpoints' FP8 weights: linear-layer matrices but the BF16 exceptions."""
    gdn_input = name.endswith(("in_proj_qkv.weight", "in_proj_z.weight", "in_proj_qkvz.weight"))
    if not (name.endswith("_proj.weight") or gdn_input) or name.startswith("mtp.fc") or ".visual." in name:
        return False
    return not any(x in name for x in ("in_proj_a.", "in_proj_b.", "in_proj_ba."))


def quantize(w, scale_dtype):
    """Codes (e4m3fn) and scales of a [rows, cols] matrix, one scale per 128x128 block."""
    w = w.astype(np.float32)
    rows, cols = w.shape
    sr, sc = -(-rows // BLOCK), -(-cols // BLOCK)
    scales = np.zeros((sr, sc), dtype=np.float32)
    codes = np.zeros((rows, cols), dtype=ml_dtypes.float8_e4m3fn)
    for i in range(sr):
        for j in range(sc):
            block = w[i * BLOCK : (i + 1) * BLOCK, j * BLOCK : (j + 1) * BLOCK]
            amax = np.float32(np.abs(block).max())
            s = amax / np.float32(448.0) if amax > 0 else np.float32(1.0)
            s = np.float32(s).astype(DTYPES[scale_dtype]).astype(np.float32)
            q = np.clip(block / s, np.float32(-448.0), np.float32(448.0))
            codes[i * BLOCK : (i + 1) * BLOCK, j * BLOCK : (j + 1) * BLOCK] = q.astype(ml_dtypes.float8_e4m3fn)
            scales[i, j] = s
    return codes, scales.astype(DTYPES[scale_dtype])


def dequantize(codes, scales):
    values = codes.astype(np.float32)
    full = np.repeat(np.repeat(scales.astype(np.float32), BLOCK, axis=0), BLOCK, axis=1)
    return values * full[: values.shape[0], : values.shape[1]]


def unstack_experts(name, t):
    """`experts.gate_up_proj` [E, 2I, H] / `experts.down_proj` [E, H, I] as one tensor per expert."""
    prefix = name[: -len("gate_up_proj")] if name.endswith("gate_up_proj") else name[: -len("down_proj")]
    out = {}
    for e in range(t.shape[0]):
        if name.endswith("gate_up_proj"):
            half = t.shape[1] // 2
            out[f"{prefix}{e}.gate_proj.weight"] = t[e, :half]
            out[f"{prefix}{e}.up_proj.weight"] = t[e, half:]
        else:
            out[f"{prefix}{e}.down_proj.weight"] = t[e]
    return out


def shards_of(model_dir):
    index = model_dir / "model.safetensors.index.json"
    if index.exists():
        weight_map = json.loads(index.read_text())["weight_map"]
        return sorted(set(weight_map.values()))
    return ["model.safetensors"]


def build(arch, golden, out):
    scale_dtype = ARCHES[arch]
    src = golden / arch / "model"
    fp8_dir, deq_dir = out / arch / "model", out / arch / "dequantized"
    fp8_dir.mkdir(parents=True, exist_ok=True)
    deq_dir.mkdir(parents=True, exist_ok=True)
    config = json.loads((src / "config.json").read_text())
    (deq_dir / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    config["quantization_config"] = {
        "activation_scheme": "dynamic",
        "fmt": "e4m3",
        "quant_method": "fp8",
        "weight_block_size": [BLOCK, BLOCK],
        "modules_to_not_convert": NOT_CONVERTED,
    }
    (fp8_dir / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    shards = shards_of(src)
    weight_map, dequantized, counts = {}, {}, {"fp8": 0, "kept": 0}
    for shard in shards:
        tensors = {}
        for name, t in read_safetensors(src / shard).items():
            parts = unstack_experts(name, t) if name.endswith(("experts.gate_up_proj", "experts.down_proj")) else {name: t}
            for part, value in parts.items():
                if quantizable(part):
                    codes, scales = quantize(value, scale_dtype)
                    tensors[part] = codes
                    tensors[part + "_scale_inv"] = scales
                    dequantized[part] = dequantize(codes, scales)
                    counts["fp8"] += 1
                else:
                    tensors[part] = value
                    dequantized[part] = value
                    counts["kept"] += 1
        write_safetensors(fp8_dir / shard, tensors)
        weight_map.update({name: shard for name in tensors})
    if len(shards) > 1:
        index = {"metadata": {}, "weight_map": dict(sorted(weight_map.items()))}
        (fp8_dir / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")
    write_safetensors(deq_dir / "model.safetensors", dequantized)
    print(f"{arch}: {counts['fp8']} FP8 weights ({scale_dtype} scales), {counts['kept']} kept as stored")


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--golden", type=Path, default=ROOT / "testdata" / "golden")
    parser.add_argument("--out", type=Path, default=ROOT / "testdata" / "fp8")
    args = parser.parse_args()
    for arch in ARCHES:
        build(arch, args.golden, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Checkpoint folders: real tensor names and layouts, dtype, shards, and the load-back check."""

import json
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file

import transformers


def stacked_experts_layout(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """transformers' own names already match the checkpoint (Qwen3 dense, Qwen3.6: stacked
    mlp.experts.gate_up_proj [E, 2I, H] and mlp.experts.down_proj [E, H, I])."""
    return dict(state)


def per_expert_layout(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """transformers 5 keeps experts stacked; Qwen3-30B-A3B and Qwen3-Next store them one by one
    as mlp.experts.{e}.{gate,up,down}_proj.weight ([I, H], [I, H], [H, I])."""
    out = {}
    for name, tensor in state.items():
        if name.endswith("mlp.experts.gate_up_proj"):
            base = name[: -len("gate_up_proj")]
            inter = tensor.shape[1] // 2
            for e in range(tensor.shape[0]):
                out[f"{base}{e}.gate_proj.weight"] = tensor[e, :inter]
                out[f"{base}{e}.up_proj.weight"] = tensor[e, inter:]
        elif name.endswith("mlp.experts.down_proj"):
            base = name[: -len("down_proj")]
            for e in range(tensor.shape[0]):
                out[f"{base}{e}.down_proj.weight"] = tensor[e]
        else:
            out[name] = tensor
    return out


# Buffers transformers derives from the config (hash multipliers, prime vocabulary sizes and
# offsets); real checkpoints do not store them.
QWEN4_EXP_DERIVED_BUFFERS = ("layer_multipliers", "ngram_heads_vocab_sizes", "ngram_heads_offsets")


def qwen4_exp_layout(state: dict[str, torch.Tensor], parts: int = 4) -> dict[str, torch.Tensor]:
    """Qwen3.8-Flash-Next: stacked experts as Qwen3.6, no derived n-gram buffers, and each PLE
    n-gram table cut along its rows into `split_ngram_parts` equal shards named
    `ngram_embedding.shard_{i}.weight` (transformers concatenates them in index order)."""
    out = {}
    for name, tensor in state.items():
        if name.rsplit(".", 1)[-1] in QWEN4_EXP_DERIVED_BUFFERS:
            continue
        if name.endswith("ngram_embedding.weight"):
            base = name[: -len("weight")]
            if tensor.shape[0] % parts:
                raise RuntimeError(f"{name}: {tensor.shape[0]} rows do not split into {parts} shards")
            for i, shard in enumerate(tensor.chunk(parts, dim=0)):
                out[f"{base}shard_{i}.weight"] = shard
            continue
        out[name] = tensor
    return out


def write_checkpoint(model_dir: Path, tensors: dict[str, torch.Tensor], dtype: torch.dtype, num_shards: int) -> None:
    """Write `tensors` cast to `dtype`, as model.safetensors or as shards plus the index."""
    names = sorted(tensors)
    stored = {n: tensors[n].detach().to(dtype).contiguous() for n in names}
    sizes = {n: t.numel() * t.element_size() for n, t in stored.items()}
    total = sum(sizes.values())
    if num_shards == 1:
        save_file(stored, str(model_dir / "model.safetensors"), metadata={"format": "pt"})
        return
    # Contiguous runs of the sorted names, cut at about equal byte counts.
    shards: list[list[str]] = [[] for _ in range(num_shards)]
    running = 0
    for n in names:
        shards[min(num_shards - 1, running * num_shards // total)].append(n)
        running += sizes[n]
    weight_map = {}
    for i, shard in enumerate(shards):
        file = f"model-{i + 1:05d}-of-{num_shards:05d}.safetensors"
        save_file({n: stored[n] for n in shard}, str(model_dir / file), metadata={"format": "pt"})
        weight_map.update({n: file for n in shard})
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (model_dir / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")


def read_checkpoint(model_dir: Path) -> dict[str, torch.Tensor]:
    out = {}
    for file in sorted(model_dir.glob("*.safetensors")):
        with safe_open(str(file), framework="pt") as f:
            for name in f.keys():
                out[name] = f.get_tensor(name)
    return out


def load_reference_model(model_class: str, model_dir: Path, is_moe: bool):
    """Load the folder the way a user would, in float32, failing on any missing/unexpected key
    (transformers itself drops mtp.* through _keys_to_ignore_on_load_unexpected)."""
    cls = getattr(transformers, model_class)
    kwargs = {"dtype": torch.float32, "attn_implementation": "eager", "output_loading_info": True}
    if is_moe:
        kwargs["experts_implementation"] = "eager"
    model, info = cls.from_pretrained(str(model_dir), **kwargs)
    # The derived n-gram buffers are not stored; transformers reports them missing and rebuilds
    # them from the config (_init_weights), which is what a real checkpoint relies on too.
    info["missing_keys"] = {
        k for k in info.get("missing_keys", ()) if k.rsplit(".", 1)[-1] not in QWEN4_EXP_DERIVED_BUFFERS
    }
    problems = {k: v for k, v in info.items() if v}
    if problems:
        raise RuntimeError(f"{model_dir}: loading reported {problems}")
    return model.eval()


def verify_loaded_weights(layout, model, stored: dict[str, torch.Tensor]) -> int:
    """Every stored tensor except mtp.* must equal its loaded float32 parameter bit for bit, and
    every parameter must come from a stored tensor. Returns the number of tensors checked."""
    loaded = layout(dict(model.state_dict()))
    expected = {k: v for k, v in stored.items() if not k.startswith("mtp.")}
    if set(loaded) != set(expected):
        not_loaded = sorted(set(expected) - set(loaded))[:5]
        not_stored = sorted(set(loaded) - set(expected))[:5]
        raise RuntimeError(f"name mismatch: not loaded {not_loaded}, not stored {not_stored}")
    for name, tensor in expected.items():
        if not torch.equal(loaded[name], tensor.float()):
            raise RuntimeError(f"loaded {name} differs from the stored tensor")
    return len(expected)

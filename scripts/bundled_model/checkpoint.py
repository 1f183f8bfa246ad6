"""Config and checkpoint layout of the bundled tiny model, in the exact form of
a Qwen3.5/3.6-MoE release: a `qwen3_5_moe` wrapper config with the language
model under `text_config`, tensors under `model.language_model.`, an untied
`lm_head.weight` and the MTP head under `mtp.`. There is no vision tower.
"""

import json
import shutil
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from transformers import Qwen3_5MoeTextConfig

from mtp import MultiTokenPredictor

TEXT_PREFIX = "model.language_model."

# The architecture of the bundled model. Every ratio of Qwen3.6-35B-A3B is
# kept (3 linear-attention : 1 full-attention layers, GQA, gated attention
# with a quarter of the head dim rotated, twice as many GDN value heads as key
# heads, top-k routed experts plus a gated shared expert, one MTP layer);
# only the widths are small. bf16 weights stay under 25 MB.
ARCHITECTURE = dict(
    hidden_size=256,
    num_hidden_layers=8,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=64,
    linear_num_key_heads=2,
    linear_num_value_heads=4,
    linear_key_head_dim=64,
    linear_value_head_dim=64,
    linear_conv_kernel_dim=4,
    num_experts=8,
    num_experts_per_tok=2,
    moe_intermediate_size=96,
    shared_expert_intermediate_size=128,
    max_position_embeddings=4096,
    rms_norm_eps=1e-6,
    rope_theta=10_000_000.0,
    partial_rotary_factor=0.25,
    full_attention_interval=4,
    mtp_num_hidden_layers=1,
)


def build_text_config(vocab_size: int, eos_id: int, arch: dict = ARCHITECTURE) -> Qwen3_5MoeTextConfig:
    arch = dict(arch)
    interval = arch.pop("full_attention_interval")
    n = arch["num_hidden_layers"]
    if n % interval:
        raise ValueError(f"num_hidden_layers {n} is not a multiple of full_attention_interval {interval}")
    rotary_dim = int(arch["head_dim"] * arch["partial_rotary_factor"])
    half = rotary_dim // 2
    # mRoPE splits the rotary frequency pairs into (time, height, width)
    # sections like [11, 11, 10] for 32 pairs; keep the same proportions.
    t = round(half * 11 / 32)
    mrope_section = [t, t, half - 2 * t]
    layer_types = ["full_attention" if (i + 1) % interval == 0 else "linear_attention" for i in range(n)]
    return Qwen3_5MoeTextConfig(
        vocab_size=vocab_size,
        layer_types=layer_types,
        rope_parameters={
            "rope_type": "default",
            "rope_theta": arch.pop("rope_theta"),
            "partial_rotary_factor": arch["partial_rotary_factor"],
            "mrope_section": mrope_section,
            "mrope_interleaved": True,
        },
        tie_word_embeddings=False,
        attn_output_gate=True,
        mamba_ssm_dtype="float32",
        mtp_use_dedicated_embeddings=False,
        bos_token_id=None,
        eos_token_id=eos_id,
        hidden_act="silu",
        **arch,
    )


def text_config_dict(text_cfg: Qwen3_5MoeTextConfig) -> dict:
    d = text_cfg.to_diff_dict()
    d.pop("transformers_version", None)
    d["full_attention_interval"] = ARCHITECTURE["full_attention_interval"]
    d["dtype"] = "bfloat16"
    return dict(sorted(d.items()))


def wrapper_config_dict(text_cfg: Qwen3_5MoeTextConfig, ids: dict) -> dict:
    import transformers

    return {
        "architectures": ["Qwen3_5MoeForConditionalGeneration"],
        "model_type": "qwen3_5_moe",
        "image_token_id": ids["<|image_pad|>"],
        "video_token_id": ids["<|video_pad|>"],
        "vision_start_token_id": ids["<|vision_start|>"],
        "vision_end_token_id": ids["<|vision_end|>"],
        "tie_word_embeddings": False,
        "text_config": text_config_dict(text_cfg),
        "transformers_version": transformers.__version__,
    }


def generation_config_dict(ids: dict) -> dict:
    # Same shape as Qwen3.5/3.6's: stop on <|im_end|> or <|endoftext|>,
    # sampling defaults of the thinking mode.
    return {
        "bos_token_id": ids["<|endoftext|>"],
        "pad_token_id": ids["<|endoftext|>"],
        "eos_token_id": [ids["<|im_end|>"], ids["<|endoftext|>"]],
        "do_sample": True,
        "temperature": 0.6,
        "top_k": 20,
        "top_p": 0.95,
    }


def export_state_dict(lm, mtp: MultiTokenPredictor) -> dict:
    """Checkpoint names of a Qwen3.5/3.6-MoE release, in bf16."""
    out = {}
    for name, t in lm.state_dict().items():
        if name.startswith("model."):
            out[TEXT_PREFIX + name[len("model."):]] = t
        elif name == "lm_head.weight":
            out[name] = t
        else:
            raise ValueError(f"unexpected tensor {name} in the language model")
    for name, t in mtp.state_dict().items():
        out["mtp." + name] = t
    return {k: v.detach().to("cpu", torch.bfloat16).contiguous() for k, v in sorted(out.items())}


def save_folder(out_dir: Path, lm, mtp, text_cfg, tokenizer_dir: Path, ids: dict):
    out_dir.mkdir(parents=True, exist_ok=True)
    save_file(export_state_dict(lm, mtp), str(out_dir / "model.safetensors"), metadata={"format": "pt"})
    (out_dir / "config.json").write_text(json.dumps(wrapper_config_dict(text_cfg, ids), indent=2) + "\n")
    (out_dir / "generation_config.json").write_text(json.dumps(generation_config_dict(ids), indent=2) + "\n")
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        shutil.copyfile(tokenizer_dir / name, out_dir / name)


def load_mtp(model_dir: Path, text_cfg, device="cpu") -> MultiTokenPredictor:
    """The MTP head of a saved folder, in float32."""
    tensors = load_file(str(Path(model_dir) / "model.safetensors"))
    mtp = MultiTokenPredictor(text_cfg)
    sd = {k[len("mtp."):]: v.float() for k, v in tensors.items() if k.startswith("mtp.")}
    missing, unexpected = mtp.load_state_dict(sd, strict=False)
    if missing or unexpected:
        raise ValueError(f"MTP tensors do not match: missing {missing}, unexpected {unexpected}")
    return mtp.to(device).eval()

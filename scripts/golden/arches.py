"""The fixture architectures: config, transformers class, storage and layout choices.

Dtypes and sharding differ on purpose so that a loader meets all three dtypes, a single file
and a sharded folder with its index.
"""

from dataclasses import dataclass
from typing import Callable

import torch

from . import configs
from .checkpoint import per_expert_layout, qwen4_exp_layout, stacked_experts_layout


@dataclass(frozen=True)
class Arch:
    name: str
    config: Callable[[], dict]
    model_class: str  # the transformers class that loads the folder
    store_dtype: torch.dtype
    num_shards: int
    layout: Callable[[dict], dict]  # transformers state dict -> checkpoint tensors
    zero_centred_norms: bool
    is_moe: bool
    is_hybrid: bool
    has_mtp: bool = False
    # Positions of every prompt set to this token (the n-gram history restarts after EOS).
    eos_positions: tuple[int, ...] = ()
    eos_token_id: int = 2


ARCHES = [
    Arch(
        name="qwen3",
        config=configs.qwen3_config,
        model_class="Qwen3ForCausalLM",
        store_dtype=torch.float32,
        num_shards=1,
        layout=stacked_experts_layout,
        zero_centred_norms=False,
        is_moe=False,
        is_hybrid=False,
    ),
    Arch(
        name="qwen3_moe",
        config=configs.qwen3_moe_config,
        model_class="Qwen3MoeForCausalLM",
        store_dtype=torch.float16,
        num_shards=2,
        layout=per_expert_layout,
        zero_centred_norms=False,
        is_moe=True,
        is_hybrid=False,
    ),
    Arch(
        name="qwen3_5_moe",
        config=configs.qwen3_5_moe_config,
        model_class="Qwen3_5MoeForConditionalGeneration",
        store_dtype=torch.bfloat16,
        num_shards=2,
        layout=stacked_experts_layout,
        zero_centred_norms=True,
        is_moe=True,
        is_hybrid=True,
        has_mtp=True,
    ),
    Arch(
        name="qwen3_next",
        config=configs.qwen3_next_config,
        model_class="Qwen3NextForCausalLM",
        store_dtype=torch.bfloat16,
        num_shards=1,
        layout=per_expert_layout,
        zero_centred_norms=True,
        is_moe=True,
        is_hybrid=True,
    ),
    Arch(
        name="qwen4_exp",
        config=configs.qwen4_exp_config,
        model_class="Qwen4ExpForConditionalGeneration",
        store_dtype=torch.bfloat16,
        num_shards=2,
        layout=qwen4_exp_layout,
        zero_centred_norms=True,
        is_moe=True,
        is_hybrid=True,
        eos_positions=(3, 21, 22, 57),
    ),
]

DTYPE_NAMES = {torch.bfloat16: "bfloat16", torch.float16: "float16", torch.float32: "float32"}

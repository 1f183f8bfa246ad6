"""Seeded weight initialisation, scaled so logits have a spread and decisions are not near-ties.

transformers' own init (std 0.02, unit norms) gives nearly uniform logits on a tiny model, where
any numerical noise flips the argmax. These rules keep every activation around unit scale.
"""

import math

import torch
from torch import nn

# Logit scale: lm_head rows have std LM_SCALE / sqrt(hidden) times a log-normal row factor, whose
# heavier upper tail separates the top-1 from the top-2 more than a Gaussian would.
LM_SCALE = 10.0
LM_ROW_SPREAD = 0.25


def normal(shape, std, gen) -> torch.Tensor:
    return torch.randn(shape, generator=gen, dtype=torch.float64).mul(std).float()


def uniform(shape, lo, hi, gen) -> torch.Tensor:
    return (torch.rand(shape, generator=gen, dtype=torch.float64) * (hi - lo) + lo).float()


def is_norm_weight(name: str, p: torch.Tensor) -> bool:
    parts = name.split(".")
    return p.ndim == 1 and len(parts) >= 2 and "norm" in parts[-2]


def init_weights(module: nn.Module, zero_centred_norms: bool, gen: torch.Generator) -> None:
    """Refill every parameter of `module` deterministically, chosen by its name."""
    with torch.no_grad():
        for name, p in module.named_parameters():
            p.copy_(initial_value(name, p, zero_centred_norms, gen))


def initial_value(name: str, p: torch.Tensor, zero_centred_norms: bool, gen) -> torch.Tensor:
    shape = tuple(p.shape)
    if ".visual." in f".{name}":
        # The vision tower is never run on text-only input; keep it small.
        return normal(shape, 0.02, gen)
    if name.endswith("embed_tokens.weight"):
        return normal(shape, 1.0, gen)
    if name.endswith("lm_head.weight"):
        rows = normal((shape[0], 1), LM_ROW_SPREAD, gen).exp()
        return normal(shape, LM_SCALE / math.sqrt(shape[1]), gen) * rows
    if name.endswith("linear_attn.norm.weight"):
        # The gated RMSNorm inside Gated DeltaNet multiplies by the plain weight.
        return 1.0 + normal(shape, 0.2, gen)
    if is_norm_weight(name, p):
        # Zero-centred norms (Qwen3.5, Qwen3-Next) scale by (1 + w). A random w of this size makes
        # a port that forgets the +1 (or adds it where it does not belong) fail loudly.
        return normal(shape, 0.3, gen) if zero_centred_norms else 1.0 + normal(shape, 0.2, gen)
    if name.endswith("A_log"):
        # A in [1, 16] as in the real init; the decay exp(-A * softplus(a + dt_bias)) then spans
        # long and short memories.
        return uniform(shape, 1.0, 16.0, gen).log()
    if name.endswith("dt_bias"):
        # Mamba-style: dt log-uniform in [1e-3, 1e-1], stored as its inverse softplus.
        dt = uniform(shape, math.log(1e-3), math.log(1e-1), gen).exp()
        return dt + torch.log(-torch.expm1(-dt))
    if name.endswith("conv1d.weight"):
        return normal(shape, 0.5, gen)
    if name.endswith("mlp.experts.gate_up_proj") or name.endswith("mlp.experts.down_proj"):
        return normal(shape, 1.0 / math.sqrt(shape[2]), gen)
    if name.endswith("mlp.gate.weight"):
        # Router logits with a spread of ~4 keep the top-k choice away from ties.
        return normal(shape, 4.0 / math.sqrt(shape[1]), gen)
    if p.ndim == 2:
        return normal(shape, 1.0 / math.sqrt(shape[1]), gen)
    if name.endswith(".bias"):
        return torch.zeros(shape)
    raise RuntimeError(f"no init rule for parameter {name} {shape}")

"""A PyTorch reference of the DFlash drafter's forward, written from the published
description (arXiv 2602.06036 and the z-lab checkpoint format), for kestrel's fixtures.

The drafter is a stack of Qwen3-style layers (plain RMSNorm weights, q/k norm per head,
full rotary embedding, SwiGLU MLP) with three differences from a causal decoder:

- its keys and values come from two sources: the *context* (the target's hidden states at
  `target_layer_ids`, concatenated, projected by `fc` and normed by `hidden_norm`; every
  layer applies its own k/v projections to the same projected features), and the *block*
  being drafted;
- the block's queries attend to all context rows and to every row of the block: no causal
  mask inside the block;
- it has no embedding or lm_head: the block `[anchor, mask x (B-1)]` is embedded with the
  target's table and the drafter's final `norm` output goes through the target's lm_head.

Positions are absolute: context row i sits at its token's position, the block at
`start .. start+B-1` where `start` is the anchor's position. Keys get RoPE at their own
positions, queries at the block's.
"""

import torch


def rms_norm(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    """Qwen3's RMSNorm, plain weight: `w * x / sqrt(mean(x^2) + eps)`, in float32."""
    x = x.float()
    return w.float() * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))


def rotate(x: torch.Tensor, positions: torch.Tensor, theta: float) -> torch.Tensor:
    """Rotate-half RoPE over the whole head: x is [..., T, heads, D], positions [..., T]
    (on x's device; leading batch dimensions are allowed, for the trainer)."""
    d = x.shape[-1]
    inv_freq = 1.0 / (theta ** (torch.arange(0, d, 2, dtype=torch.int64, device=positions.device).float() / d))
    angle = positions.float()[..., None] * inv_freq
    cos = torch.cat([angle, angle], -1).cos()[..., None, :]
    sin = torch.cat([angle, angle], -1).sin()[..., None, :]
    lo, hi = x[..., : d // 2], x[..., d // 2 :]
    return x * cos + torch.cat([-hi, lo], -1) * sin


class Drafter:
    """Weights as a dict of float32 tensors with the checkpoint's names."""

    def __init__(self, config: dict, weights: dict[str, torch.Tensor]):
        self.cfg = config
        self.w = {k: v.float() for k, v in weights.items()}
        self.eps = config["rms_norm_eps"]
        self.theta = float(config["rope_theta"])
        self.hq = config["num_attention_heads"]
        self.hkv = config["num_key_value_heads"]
        self.d = config["head_dim"]
        self.layers = config["num_hidden_layers"]

    def project_context(self, taps: torch.Tensor) -> torch.Tensor:
        """[C, len(target_layer_ids) * H] concatenated target states -> [C, H]."""
        return rms_norm(taps.float() @ self.w["fc.weight"].T, self.w["hidden_norm.weight"], self.eps)

    def layer_kv(self, i: int, x: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Layer i's keys (normed, rotated) and values of rows x at `positions`."""
        p = f"layers.{i}.self_attn."
        k = (x @ self.w[p + "k_proj.weight"].T).view(-1, self.hkv, self.d)
        k = rotate(rms_norm(k, self.w[p + "k_norm.weight"], self.eps), positions, self.theta)
        v = (x @ self.w[p + "v_proj.weight"].T).view(-1, self.hkv, self.d)
        return k, v

    def context_kv(self, context: torch.Tensor, positions: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Every layer's context keys and values (what a draft cache holds)."""
        return [self.layer_kv(i, context, positions) for i in range(self.layers)]

    def block(self, embedded: torch.Tensor, start: int, cached: list) -> torch.Tensor:
        """Hidden states after the final norm for the block rows `embedded` [B, H]."""
        b = embedded.shape[0]
        positions = torch.arange(start, start + b)
        x = embedded.float()
        group = self.hq // self.hkv
        for i in range(self.layers):
            p = f"layers.{i}."
            h = rms_norm(x, self.w[p + "input_layernorm.weight"], self.eps)
            q = (h @ self.w[p + "self_attn.q_proj.weight"].T).view(b, self.hq, self.d)
            q = rotate(rms_norm(q, self.w[p + "self_attn.q_norm.weight"], self.eps), positions, self.theta)
            k_blk, v_blk = self.layer_kv(i, h, positions)
            k = torch.cat([cached[i][0], k_blk], 0)
            v = torch.cat([cached[i][1], v_blk], 0)
            heads = []
            for head in range(self.hq):
                kv = head // group
                scores = (q[:, head] @ k[:, kv].T) * self.d**-0.5
                heads.append(torch.softmax(scores, -1) @ v[:, kv])
            attn = torch.stack(heads, 1).reshape(b, self.hq * self.d)
            x = x + attn @ self.w[p + "self_attn.o_proj.weight"].T
            h = rms_norm(x, self.w[p + "post_attention_layernorm.weight"], self.eps)
            gate = h @ self.w[p + "mlp.gate_proj.weight"].T
            up = h @ self.w[p + "mlp.up_proj.weight"].T
            x = x + (torch.nn.functional.silu(gate) * up) @ self.w[p + "mlp.down_proj.weight"].T
        return rms_norm(x, self.w["norm.weight"], self.eps)

    def block_sdpa(self, embedded: torch.Tensor, start: int, cached: list) -> torch.Tensor:
        """`block` through torch's scaled_dot_product_attention: a second code path for the
        same numbers, to check the hand-written softmax against."""
        b = embedded.shape[0]
        positions = torch.arange(start, start + b)
        x = embedded.float()
        for i in range(self.layers):
            p = f"layers.{i}."
            h = rms_norm(x, self.w[p + "input_layernorm.weight"], self.eps)
            q = (h @ self.w[p + "self_attn.q_proj.weight"].T).view(b, self.hq, self.d)
            q = rotate(rms_norm(q, self.w[p + "self_attn.q_norm.weight"], self.eps), positions, self.theta)
            k_blk, v_blk = self.layer_kv(i, h, positions)
            k = torch.cat([cached[i][0], k_blk], 0).transpose(0, 1)
            v = torch.cat([cached[i][1], v_blk], 0).transpose(0, 1)
            out = torch.nn.functional.scaled_dot_product_attention(
                q.transpose(0, 1), k, v, is_causal=False, enable_gqa=True
            )
            x = x + out.transpose(0, 1).reshape(b, -1) @ self.w[p + "self_attn.o_proj.weight"].T
            h = rms_norm(x, self.w[p + "post_attention_layernorm.weight"], self.eps)
            gate = h @ self.w[p + "mlp.gate_proj.weight"].T
            up = h @ self.w[p + "mlp.up_proj.weight"].T
            x = x + (torch.nn.functional.silu(gate) * up) @ self.w[p + "mlp.down_proj.weight"].T
        return rms_norm(x, self.w["norm.weight"], self.eps)

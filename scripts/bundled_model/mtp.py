"""The multi-token-prediction (MTP) head of Qwen3.5/3.6, as vLLM's
`Qwen3_5MultiTokenPredictor` runs it, built from transformers' decoder layer.

For slot t it reads the target's last hidden state h_t (after the final
norm, as vLLM passes it) and the embedding of token t+1, and its logits predict token t+2:

    x = fc(cat(pre_fc_norm_embedding(embed(token_{t+1})), pre_fc_norm_hidden(h_t)))
    x = decoder_layer(x)            # one full-attention layer with its own MoE
    logits = lm_head(norm(x))       # embedding and lm_head shared with the target

All three norms are the zero-centred RMSNorm of the decoder (x * (1 + w)).
Module names match the checkpoint tensors `mtp.fc.weight`,
`mtp.pre_fc_norm_embedding.weight`, `mtp.pre_fc_norm_hidden.weight`,
`mtp.layers.0.*` and `mtp.norm.weight`.
"""

import copy

import torch
from torch import nn
from transformers.models.qwen3_5_moe.modeling_qwen3_5_moe import (
    Qwen3_5MoeDecoderLayer,
    Qwen3_5MoeRMSNorm,
)


def mtp_layer_config(text_config):
    """A copy of the text config that describes the MTP stack: its layers are
    full-attention layers numbered from 0 (the decoder layer picks its mixer
    from `layer_types[layer_idx]`)."""
    cfg = copy.deepcopy(text_config)
    n = getattr(text_config, "mtp_num_hidden_layers", 1)
    cfg.num_hidden_layers = n
    cfg.layer_types = ["full_attention"] * n
    # A standalone decoder layer takes its kernels from the config; a config
    # that never went through a PreTrainedModel has none chosen yet.
    if cfg._attn_implementation is None:
        cfg._attn_implementation = "sdpa"
    if cfg._experts_implementation is None:
        cfg._experts_implementation = "eager"
    return cfg


def causal_mask(length: int, dtype, device) -> torch.Tensor:
    """Additive [1, 1, T, T] mask, so causality does not depend on which
    attention kernel the config picked."""
    m = torch.full((length, length), torch.finfo(dtype).min, dtype=dtype, device=device).triu(1)
    return m[None, None]


class MultiTokenPredictor(nn.Module):
    def __init__(self, text_config):
        super().__init__()
        cfg = mtp_layer_config(text_config)
        h, eps = cfg.hidden_size, cfg.rms_norm_eps
        self.fc = nn.Linear(2 * h, h, bias=False)
        self.pre_fc_norm_embedding = Qwen3_5MoeRMSNorm(h, eps=eps)
        self.pre_fc_norm_hidden = Qwen3_5MoeRMSNorm(h, eps=eps)
        self.layers = nn.ModuleList([Qwen3_5MoeDecoderLayer(cfg, i) for i in range(cfg.num_hidden_layers)])
        self.norm = Qwen3_5MoeRMSNorm(h, eps=eps)

    def forward(self, hidden, next_embeds, position_embeddings, step: int = 0):
        """hidden: [B, T, H] target states after the final norm at slots t;
        next_embeds: [B, T, H] embeddings of tokens t+1; position_embeddings:
        (cos, sin) from the target's rotary embedding for the slot positions.
        Returns the normed output [B, T, H]; apply the shared lm_head to it.
        Attention is causal over the T slots."""
        x = torch.cat([self.pre_fc_norm_embedding(next_embeds), self.pre_fc_norm_hidden(hidden)], dim=-1)
        x = self.fc(x)
        mask = causal_mask(x.shape[1], x.dtype if x.is_floating_point() else torch.float32, x.device)
        x = self.layers[step % len(self.layers)](x, position_embeddings=position_embeddings, attention_mask=mask)
        return self.norm(x)

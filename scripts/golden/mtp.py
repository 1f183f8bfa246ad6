"""The MTP head of Qwen3.5 / 3.6 (mtp.* tensors, which transformers does not load).

Built from transformers' own Qwen3.5-MoE layer classes with the forward semantics of vLLM's
Qwen3_5MultiTokenPredictor (vllm/model_executor/models/qwen3_5_mtp.py) and the way vLLM's
speculative proposer feeds it (the target model's returned hidden states, i.e. after the final
norm; input ids shifted left by one; positions of the target rows).
"""

import copy

import torch
from torch import nn
from transformers.models.qwen3_5_moe.modeling_qwen3_5_moe import (
    Qwen3_5MoeDecoderLayer,
    Qwen3_5MoeRMSNorm,
    Qwen3_5MoeTextRotaryEmbedding,
)

from .probes import RouterProbe, decoder_stack, margins, target_hidden_states


class Qwen35MtpHead(nn.Module):
    """h' = fc(cat(pre_fc_norm_embedding(embed(token_{t+1})), pre_fc_norm_hidden(h_t)));
    then one full-attention decoder layer with its own MoE, mtp.norm, and the shared lm_head.
    All RMSNorms here are the zero-centred (1 + w) kind. state_dict keys (after the "mtp."
    prefix) match the checkpoint: fc, pre_fc_norm_embedding, pre_fc_norm_hidden, layers.0.*, norm.
    """

    def __init__(self, text_config):
        super().__init__()
        cfg = copy.deepcopy(text_config)
        cfg.layer_types = ["full_attention"]
        cfg.num_hidden_layers = 1
        h = cfg.hidden_size
        self.fc = nn.Linear(2 * h, h, bias=False)
        self.pre_fc_norm_embedding = Qwen3_5MoeRMSNorm(h, eps=cfg.rms_norm_eps)
        self.pre_fc_norm_hidden = Qwen3_5MoeRMSNorm(h, eps=cfg.rms_norm_eps)
        self.layers = nn.ModuleList([Qwen3_5MoeDecoderLayer(cfg, 0)])
        self.norm = Qwen3_5MoeRMSNorm(h, eps=cfg.rms_norm_eps)
        self.rotary = Qwen3_5MoeTextRotaryEmbedding(cfg)

    def checkpoint_tensors(self) -> dict[str, torch.Tensor]:
        return {f"mtp.{k}": v for k, v in self.state_dict().items() if not k.startswith("rotary.")}

    def load_checkpoint_tensors(self, stored: dict[str, torch.Tensor]) -> None:
        state = {k[len("mtp.") :]: v.float() for k, v in stored.items() if k.startswith("mtp.")}
        missing, unexpected = self.load_state_dict(state, strict=False)
        missing = [m for m in missing if not m.startswith("rotary.")]
        if missing or unexpected:
            raise RuntimeError(f"mtp tensors: missing {missing}, unexpected {unexpected}")

    def forward(self, token_embeds, target_hidden, positions):
        """token_embeds, target_hidden: [T, H] (row t: embed(token_{t+1}) and h_t); positions: [T].
        Returns the hidden state after mtp.norm, [T, H]. Attention is causal over the rows, as
        with the MTP layer's own KV cache filled row by row."""
        x = torch.cat([self.pre_fc_norm_embedding(token_embeds), self.pre_fc_norm_hidden(target_hidden)], dim=-1)
        x = self.fc(x)[None]
        t = x.shape[1]
        cos_sin = self.rotary(x, positions.view(1, 1, -1).expand(3, 1, -1))
        mask = torch.full((t, t), float("-inf")).triu(1)[None, None]
        x = self.layers[0](x, position_embeddings=cos_sin, attention_mask=mask)
        return self.norm(x)[0]


@torch.no_grad()
def mtp_logits(model, mtp: Qwen35MtpHead, ids: list[int], hidden: torch.Tensor) -> torch.Tensor:
    """Row t (0 <= t <= T-2): logits from (hidden[t], ids[t+1]) at position t; predicts ids[t+2]."""
    emb = decoder_stack(model).embed_tokens(torch.tensor(ids[1:]))
    h = mtp(emb, hidden[:-1], torch.arange(len(ids) - 1))
    return model.lm_head(h).float()


SEMANTICS = (
    "Row t of mtp.{i}.logits (t = 0 .. len-2) = lm_head(mtp.norm(L(fc(cat("
    "pre_fc_norm_embedding(embed_tokens(ids[t+1])), pre_fc_norm_hidden(h_t)))))), where h_t = "
    "mtp.{i}.target_hidden_post_norm[t] is the target's hidden state at position t AFTER "
    "model.language_model.norm (the tensor its lm_head scores; vLLM hands the MTP head the target "
    "model's returned hidden states, which are post-norm) and L = mtp.layers.0 (full attention "
    "with output gate + its own MoE with shared expert), causal over rows 0..t (its own KV "
    "cache), RoPE position of row t = t. The row predicts token ids[t+2]. Concat order is "
    "[embedding, hidden]. All mtp norms are zero-centred (1 + w). embed_tokens and lm_head are "
    "the target's (model.language_model.embed_tokens.weight, lm_head.weight)."
)
ALTERNATIVE = (
    "mtp.{i}.logits_from_pre_norm_hidden: the same computation fed h_t = "
    "mtp.{i}.target_hidden_pre_norm[t] (output of the last decoder layer, before the final "
    "norm). Recorded only to tell the two conventions apart; vLLM uses the post-norm one."
)


def add_mtp_reference(model, mtp: Qwen35MtpHead, prompts, tensors: dict, top_k: int) -> dict:
    """Fill tensors with the MTP reference of every prompt; return its metadata."""
    probe = RouterProbe(mtp, top_k)
    entries = []
    for i, ids in enumerate(prompts):
        pre, post = target_hidden_states(model, ids)
        # The post-norm hidden must reproduce the teacher-forced logits.
        if not torch.allclose(model.lm_head(post), tensors[f"teacher_forced.{i}.logits"], atol=1e-4, rtol=0):
            raise RuntimeError("target hidden states do not reproduce the teacher-forced logits")
        logits = mtp_logits(model, mtp, ids, post)
        tensors[f"mtp.{i}.target_hidden_post_norm"] = post
        tensors[f"mtp.{i}.target_hidden_pre_norm"] = pre
        tensors[f"mtp.{i}.logits"] = logits
        tensors[f"mtp.{i}.logits_from_pre_norm_hidden"] = mtp_logits(model, mtp, ids, pre)
        entries.append(
            {
                "prompt_index": i,
                "logits_tensor": f"mtp.{i}.logits",
                "rows": len(ids) - 1,
                "min_margin": margins(logits).min().item(),
            }
        )
    return {
        "semantics": SEMANTICS,
        "alternative": ALTERNATIVE,
        "rope_note": "the MTP layer uses the target's partial (0.25) rotary; a constant position "
        "offset for all rows (t or t+1) gives the same logits up to rounding",
        "prompts": entries,
        "min_router_topk_logit_gap": probe.close(),
    }

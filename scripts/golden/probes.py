"""Forward passes through a loaded transformers model, and the statistics taken from them."""

import torch


def positions(start: int, n: int) -> torch.Tensor:
    return torch.arange(start, start + n)[None]


@torch.no_grad()
def full_logits(model, ids: list[int]) -> torch.Tensor:
    """One forward over the whole sequence without a cache: [T, V]."""
    out = model(input_ids=torch.tensor([ids]), position_ids=positions(0, len(ids)), use_cache=False)
    return out.logits[0].float()


@torch.no_grad()
def greedy_with_cache(model, prompt: list[int], new_tokens: int) -> tuple[list[int], torch.Tensor]:
    """Prefill the prompt in one pass, then decode one token at a time through the cache.
    Returns the new tokens and, for each, the logits that chose it: [new_tokens, V]."""
    out = model(input_ids=torch.tensor([prompt]), position_ids=positions(0, len(prompt)), use_cache=True)
    cache = out.past_key_values
    step_logits, tokens = [], []
    logits = out.logits[0, -1].float()
    for k in range(new_tokens):
        step_logits.append(logits)
        tok = int(logits.argmax())
        tokens.append(tok)
        if k + 1 == new_tokens:
            break
        out = model(
            input_ids=torch.tensor([[tok]]),
            position_ids=positions(len(prompt) + k, 1),
            past_key_values=cache,
            use_cache=True,
        )
        logits = out.logits[0, -1].float()
    return tokens, torch.stack(step_logits)


@torch.no_grad()
def token_by_token_logits(model, ids: list[int]) -> torch.Tensor:
    """Every position through the single-token cached path. For the hybrids this is the
    recurrent gated delta rule and causal_conv1d_update after the first token, where
    full_logits uses the chunked rule (chunk 64) and the full causal conv."""
    out = model(input_ids=torch.tensor([ids[:1]]), position_ids=positions(0, 1), use_cache=True)
    cache = out.past_key_values
    rows = [out.logits[0, -1].float()]
    for i in range(1, len(ids)):
        out = model(
            input_ids=torch.tensor([[ids[i]]]), position_ids=positions(i, 1), past_key_values=cache, use_cache=True
        )
        rows.append(out.logits[0, -1].float())
    return torch.stack(rows)


def margins(logits: torch.Tensor) -> torch.Tensor:
    """Top-1 minus top-2 logit per row."""
    top2 = logits.topk(2, dim=-1).values
    return top2[..., 0] - top2[..., 1]


def diff_stats(a: torch.Tensor, b: torch.Tensor) -> dict:
    d = (a - b).abs()
    return {
        "max_abs": d.max().item(),
        "max_abs_over_max_abs_logit": d.max().item() / b.abs().max().item(),
        "max_rel_elementwise_floor_1": (d / b.abs().clamp_min(1.0)).max().item(),
    }


def worst(stats: list[dict]) -> dict:
    return {k: max(s[k] for s in stats) for k in stats[0]}


class RouterProbe:
    """Smallest gap between the k-th and (k+1)-th router logit seen by any MoE router of a
    module while attached: how far expert selection stays from a tie."""

    def __init__(self, module, top_k: int):
        self.top_k = top_k
        self.min_gap = float("inf")
        self.handles = [
            m.register_forward_hook(self._hook) for m in module.modules() if type(m).__name__.endswith("TopKRouter")
        ]
        if not self.handles:
            raise RuntimeError("no router found to probe")

    def _hook(self, _module, _inputs, output):
        top = output[0].float().topk(self.top_k + 1, dim=-1).values
        self.min_gap = min(self.min_gap, (top[:, self.top_k - 1] - top[:, self.top_k]).min().item())

    def close(self) -> float:
        for h in self.handles:
            h.remove()
        return self.min_gap


def decoder_stack(model):
    """The module holding embed_tokens, layers and the final norm."""
    inner = model.model
    return getattr(inner, "language_model", inner)


@torch.no_grad()
def target_hidden_states(model, ids: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """Hidden states of every position, [T, H] each: (output of the last decoder layer,
    the same after the final norm)."""
    stack = decoder_stack(model)
    captured = {}
    handle = stack.layers[-1].register_forward_hook(lambda _m, _i, out: captured.update(pre=out))
    out = stack(input_ids=torch.tensor([ids]), position_ids=positions(0, len(ids)), use_cache=False)
    handle.remove()
    pre = captured["pre"][0] if isinstance(captured["pre"], tuple) else captured["pre"]
    return pre[0].float(), out.last_hidden_state[0].float()

#!/usr/bin/env python3
"""Train kestrel's bundled tiny Qwen3.5/3.6-MoE model with its MTP head.

The language model is transformers' Qwen3_5MoeForCausalLM built from a small
text config (checkpoint.ARCHITECTURE); the MTP head (mtp.py) is trained jointly:
loss = LM loss + mtp_weight * MTP loss + router load-balancing loss, where the
MTP loss predicts token t+2 from the target's hidden state after the final norm at t and
token t+1. Training runs for --steps steps, or, without --steps, for as many
steps as fit --time-budget seconds (measured on the first steps). At the end
the weights are rounded to bf16, evaluated in float32 on held-out windows,
and saved as a Hugging Face folder (checkpoint.save_folder).

Inputs: --data-dir with train.bin / test.bin (tokenize_corpus.py) and
--tokenizer-dir with tokenizer.json, tokenizer_config.json, chat_template.jinja.
"""

import argparse
import json
import math
import os
import random
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))

from checkpoint import ARCHITECTURE, build_text_config, save_folder  # noqa: E402
from mtp import MultiTokenPredictor  # noqa: E402
from tokenizers import Tokenizer  # noqa: E402
from transformers import Qwen3_5MoeForCausalLM  # noqa: E402
from transformers.models.qwen3_5_moe.modeling_qwen3_5_moe import (  # noqa: E402
    Qwen3_5MoeTopKRouter,
    load_balancing_loss_func,
)


def parse_args():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data-dir", type=Path, required=True)
    ap.add_argument("--tokenizer-dir", type=Path, required=True)
    ap.add_argument("--out-dir", type=Path, required=True, help="model folder to write")
    ap.add_argument("--log", type=Path, required=True, help="training log (JSON) to write")
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--seq-len", type=int, default=512)
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--steps", type=int, default=None, help="fixed step count (else sized by --time-budget)")
    ap.add_argument("--time-budget", type=float, default=300.0, help="seconds of training when --steps is unset")
    ap.add_argument("--calibration-steps", type=int, default=12)
    ap.add_argument("--max-epochs", type=float, default=6.0,
                    help="cap on the time-sized step count, in passes over the training tokens")
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--min-lr-ratio", type=float, default=0.1)
    ap.add_argument("--warmup", type=int, default=100)
    ap.add_argument("--weight-decay", type=float, default=0.1)
    ap.add_argument("--mtp-weight", type=float, default=0.3)
    ap.add_argument("--aux-weight", type=float, default=0.01, help="router load-balancing loss weight")
    ap.add_argument("--log-every", type=int, default=25)
    ap.add_argument("--eval-every", type=int, default=250)
    ap.add_argument("--eval-windows", type=int, default=256, help="held-out windows of --seq-len tokens")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--no-autocast", action="store_true", help="train in float32 (bf16 autocast by default)")
    return ap.parse_args()


def seed_everything(seed: int):
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    torch.cuda.manual_seed_all(seed)


def read_ids(path: Path) -> torch.Tensor:
    return torch.from_numpy(np.fromfile(path, dtype=np.uint16).astype(np.int64))


def eval_windows(ids: torch.Tensor, seq_len: int, count: int) -> torch.Tensor:
    """The fixed held-out set: consecutive non-overlapping windows of
    seq_len + 1 tokens from the start of the held-out stream."""
    n = min(count, (ids.numel() - 1) // seq_len)
    return torch.stack([ids[i * seq_len: i * seq_len + seq_len + 1] for i in range(n)])


class TinyQwen35WithMtp(torch.nn.Module):
    """A language model plus its MTP head; one forward gives both heads'
    losses. Hooks keep the target's hidden state after the final norm (the
    MTP input) and every router's logits (for the load-balancing loss)."""

    def __init__(self, lm, mtp):
        super().__init__()
        self.lm = lm
        self.mtp = mtp
        self._final_hidden = None
        self._router_logits = []
        self.lm.model.norm.register_forward_hook(self._keep_final_hidden)
        for m in self.modules():
            if isinstance(m, Qwen3_5MoeTopKRouter):
                m.register_forward_hook(self._keep_router_logits)

    @classmethod
    def fresh(cls, text_cfg):
        lm = Qwen3_5MoeForCausalLM(text_cfg)
        # The MTP layer is built from the model's post-init config so that it
        # uses the same attention and expert kernels.
        mtp = MultiTokenPredictor(lm.config)
        mtp.apply(lm._init_weights)
        return cls(lm, mtp)

    def _keep_final_hidden(self, module, args, output):
        # The MTP head reads the target's output after the final norm: that is
        # what vLLM's model forward returns and its MTP proposer passes on.
        self._final_hidden = output

    def _keep_router_logits(self, module, args, output):
        self._router_logits.append(output[0])

    def forward(self, window: torch.Tensor):
        """window: [B, T+1] token ids. Returns per-token NLL sums and counts of
        the LM and MTP heads, the router loss, and both heads' logits."""
        self._router_logits = []
        inputs, targets = window[:, :-1], window[:, 1:]
        out = self.lm(input_ids=inputs, use_cache=False)
        logits = out.logits  # [B, T, V]
        hidden = self._final_hidden  # [B, T, H], after the final norm

        # MTP slot t (0..T-2): hidden h_t and token t+1 predict token t+2.
        # Slot t sits at position t, as vLLM's drafter feeds it.
        b, t = inputs.shape
        pos = torch.arange(t - 1, device=window.device)
        position_ids = pos.view(1, 1, -1).expand(3, b, -1)
        emb = self.lm.model.embed_tokens(inputs[:, 1:])
        cos_sin = self.lm.model.rotary_emb(emb, position_ids)
        mtp_hidden = self.mtp(hidden[:, :-1], emb, cos_sin)
        mtp_logits = self.lm.lm_head(mtp_hidden)  # [B, T-1, V]
        mtp_targets = window[:, 2:]

        lm_nll = F.cross_entropy(logits.float().flatten(0, 1), targets.flatten(), reduction="sum")
        mtp_nll = F.cross_entropy(mtp_logits.float().flatten(0, 1), mtp_targets.flatten(), reduction="sum")
        cfg = self.lm.config
        aux = load_balancing_loss_func(tuple(self._router_logits), cfg.num_experts, cfg.num_experts_per_tok)
        return {
            "lm_nll": lm_nll, "lm_count": targets.numel(),
            "mtp_nll": mtp_nll, "mtp_count": mtp_targets.numel(),
            "aux": aux, "logits": logits, "mtp_logits": mtp_logits,
        }


def lr_at(step: int, total: int, args) -> float:
    if step < args.warmup:
        return args.lr * (step + 1) / args.warmup
    progress = min(1.0, (step - args.warmup) / max(1, total - args.warmup))
    return args.lr * (args.min_lr_ratio + (1 - args.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress)))


def make_optimizer(model, args):
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        # Norm weights, GDN gates and embeddings are not shrunk towards zero.
        if p.ndim < 2 or "embed_tokens" in name or name.endswith(("A_log", "dt_bias")):
            no_decay.append(p)
        else:
            decay.append(p)
    groups = [{"params": decay, "weight_decay": args.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    fused = args.device.startswith("cuda")
    return torch.optim.AdamW(groups, lr=args.lr, betas=(0.9, 0.95), eps=1e-8, fused=fused)


@torch.no_grad()
def evaluate(model, windows: torch.Tensor, device, batch: int, autocast: bool) -> dict:
    """Held-out perplexity of both heads, MTP top-1 accuracy against the
    corpus, and how often the MTP draft equals the LM's own greedy choice
    for the same token (the greedy acceptance rate of a one-token draft)."""
    model.eval()
    tot = {"lm_nll": 0.0, "lm_count": 0, "mtp_nll": 0.0, "mtp_count": 0,
           "lm_correct": 0, "mtp_correct": 0, "mtp_agree": 0}
    for i in range(0, windows.shape[0], batch):
        w = windows[i: i + batch].to(device)
        with torch.autocast(device_type=device.split(":")[0], dtype=torch.bfloat16, enabled=autocast):
            r = model(w)
        for k in ("lm_nll", "mtp_nll"):
            tot[k] += float(r[k])
        tot["lm_count"] += r["lm_count"]
        tot["mtp_count"] += r["mtp_count"]
        lm_pred = r["logits"].argmax(-1)
        mtp_pred = r["mtp_logits"].argmax(-1)
        tot["lm_correct"] += int((lm_pred == w[:, 1:]).sum())
        tot["mtp_correct"] += int((mtp_pred == w[:, 2:]).sum())
        # LM greedy prediction of token t+2 comes from position t+1.
        tot["mtp_agree"] += int((mtp_pred == lm_pred[:, 1:]).sum())
    model.train()
    lm_loss = tot["lm_nll"] / tot["lm_count"]
    mtp_loss = tot["mtp_nll"] / tot["mtp_count"]
    return {
        "windows": int(windows.shape[0]), "tokens": tot["lm_count"],
        "lm_loss": lm_loss, "lm_perplexity": math.exp(lm_loss), "lm_top1": tot["lm_correct"] / tot["lm_count"],
        "mtp_loss": mtp_loss, "mtp_perplexity": math.exp(mtp_loss),
        "mtp_top1": tot["mtp_correct"] / tot["mtp_count"],
        "mtp_agrees_with_lm_greedy": tot["mtp_agree"] / tot["mtp_count"],
    }


def probe_experts_kernel(model, device, autocast):
    """transformers picks grouped_mm for the experts; if that kernel cannot
    run this dtype on this device, fall back to the per-expert loop."""
    w = torch.randint(0, model.lm.config.vocab_size, (2, 65), device=device)
    try:
        with torch.autocast(device_type=device.split(":")[0], dtype=torch.bfloat16, enabled=autocast):
            r = model(w)
        (r["lm_nll"] + r["mtp_nll"]).backward()
    except (RuntimeError, NotImplementedError) as e:
        print(f"grouped_mm experts failed ({e}); using the eager per-expert loop", flush=True)
        model.lm.set_experts_implementation("eager")
        for layer in model.mtp.layers:
            layer.mlp.experts.config._experts_implementation = "eager"
    model.zero_grad(set_to_none=True)


def count_params(model) -> dict:
    n = lambda mod: sum(p.numel() for p in mod.parameters())  # noqa: E731
    lm, mtp = model.lm, model.mtp
    experts = sum(p.numel() for name, p in model.named_parameters() if ".experts." in name)
    cfg = lm.config
    inactive = experts * (1 - cfg.num_experts_per_tok / cfg.num_experts)
    return {
        "total": n(model), "language_model": n(lm), "mtp": n(mtp),
        "embedding": lm.model.embed_tokens.weight.numel(), "lm_head": lm.lm_head.weight.numel(),
        "routed_experts": experts, "active_per_token": int(n(model) - inactive),
    }


def main():
    args = parse_args()
    seed_everything(args.seed)
    device = args.device
    autocast = not args.no_autocast
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False

    ids = json.loads((args.tokenizer_dir / "special_tokens.json").read_text())
    vocab_size = Tokenizer.from_file(str(args.tokenizer_dir / "tokenizer.json")).get_vocab_size()
    text_cfg = build_text_config(vocab_size, ids["<|endoftext|>"])

    train_ids = read_ids(args.data_dir / "train.bin")
    test_ids = read_ids(args.data_dir / "test.bin")
    if int(max(train_ids.max(), test_ids.max())) >= vocab_size:
        raise SystemExit("error: token ids outside the vocabulary; re-run tokenize_corpus.py")
    held_out = eval_windows(test_ids, args.seq_len, args.eval_windows)

    model = TinyQwen35WithMtp.fresh(text_cfg).to(device)
    params = count_params(model)
    print(f"device {device} ({torch.cuda.get_device_name() if device.startswith('cuda') else 'cpu'}), "
          f"torch {torch.__version__}, params {params}", flush=True)
    print(f"experts implementation: {model.lm.config._experts_implementation}, "
          f"attention: {model.lm.config._attn_implementation}", flush=True)
    probe_experts_kernel(model, device, autocast)
    opt = make_optimizer(model, args)

    # Training windows: uniform random offsets from a seeded generator.
    gen = torch.Generator().manual_seed(args.seed)
    n_offsets = train_ids.numel() - args.seq_len - 1

    def next_batch():
        offs = torch.randint(0, n_offsets, (args.batch_size,), generator=gen)
        idx = offs[:, None] + torch.arange(args.seq_len + 1)[None]
        return train_ids[idx].to(device, non_blocking=True)

    total_steps = args.steps
    planned_by = "--steps" if args.steps else None
    log = {"args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
           "params": params, "curve": [], "evals": []}
    tokens_per_step = args.batch_size * args.seq_len
    t_start = time.time()
    t_calib = None
    step = 0
    model.train()
    while total_steps is None or step < total_steps:
        if total_steps is None and step == args.calibration_steps + 2:
            # Steps 0-1 include allocator and kernel warm-up; time the next ones.
            if device.startswith("cuda"):
                torch.cuda.synchronize()
            per_step = (time.time() - t_calib) / args.calibration_steps
            by_time = int(args.time_budget / per_step)
            by_epochs = int(args.max_epochs * train_ids.numel() / tokens_per_step)
            total_steps = max(step + 1, min(by_time, by_epochs))
            planned_by = (f"time budget {args.time_budget:.0f}s at {per_step * 1000:.0f} ms/step"
                          if by_time <= by_epochs else f"{args.max_epochs} epochs")
            print(f"planned {total_steps} steps ({planned_by})", flush=True)
        if step == 2:
            if device.startswith("cuda"):
                torch.cuda.synchronize()
            t_calib = time.time()
        lr = lr_at(step, total_steps or 10 ** 9, args)
        for g in opt.param_groups:
            g["lr"] = lr
        w = next_batch()
        with torch.autocast(device_type=device.split(":")[0], dtype=torch.bfloat16, enabled=autocast):
            r = model(w)
            lm_loss = r["lm_nll"] / r["lm_count"]
            mtp_loss = r["mtp_nll"] / r["mtp_count"]
            loss = lm_loss + args.mtp_weight * mtp_loss + args.aux_weight * r["aux"]
        opt.zero_grad(set_to_none=True)
        loss.backward()
        gnorm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if step % args.log_every == 0 or step == (total_steps or 0) - 1:
            rec = {"step": step, "tokens": (step + 1) * tokens_per_step, "seconds": round(time.time() - t_start, 2),
                   "lr": lr, "loss": loss.item(), "lm_loss": lm_loss.item(), "mtp_loss": mtp_loss.item(),
                   "aux": r["aux"].item(), "grad_norm": gnorm.item()}
            log["curve"].append(rec)
            print(json.dumps(rec), flush=True)
        if args.eval_every and step > 0 and step % args.eval_every == 0:
            ev = evaluate(model, held_out[:32], device, 16, autocast)
            ev["step"] = step
            log["evals"].append(ev)
            print("eval", json.dumps(ev), flush=True)
        step += 1
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    train_seconds = time.time() - t_start

    # Evaluate exactly what is saved: bf16 weights, computed in float32.
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(p.to(torch.bfloat16).float())
    final = evaluate(model, held_out, device, 16, autocast=False)
    print("final", json.dumps(final), flush=True)
    save_folder(args.out_dir, model.lm, model.mtp, text_cfg, args.tokenizer_dir, ids)
    log.update({
        "steps": step, "planned_by": planned_by, "tokens_seen": step * tokens_per_step,
        "train_tokens_available": int(train_ids.numel()), "epochs": step * tokens_per_step / train_ids.numel(),
        "train_seconds": round(train_seconds, 1), "final_eval_float32_bf16_weights": final,
        "device_name": torch.cuda.get_device_name() if device.startswith("cuda") else "cpu",
        "torch": torch.__version__, "architecture": ARCHITECTURE,
        "saved_bytes": {p.name: p.stat().st_size for p in sorted(args.out_dir.iterdir())},
    })
    args.log.parent.mkdir(parents=True, exist_ok=True)
    args.log.write_text(json.dumps(log, indent=1) + "\n")
    size = sum(log["saved_bytes"].values())
    print(f"saved {args.out_dir} ({size / 1e6:.2f} MB) after {step} steps, {train_seconds:.0f}s", flush=True)
    if size > 25_000_000:
        raise SystemExit(f"error: model folder is {size} bytes, over the 25 MB budget")


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    main()

#!/usr/bin/env python3
"""Train a DFlash block drafter (arXiv 2602.06036) for the bundled model and save
it in the z-lab checkpoint form that kestrel loads (docs/dflash.md).

The target (models/kestrel-tiny-qwen35, transformers' AutoModelForCausalLM) is
frozen and runs in float32, as kestrel's CPU backend computes it. The recipe:

1. Data: the target's own greedy continuations. Prompts are cut from the
   tokenized corpus (train.bin; half of them start at a document start), the
   target continues each greedily to --seq-len tokens. Those sequences are
   what the drafter meets when kestrel serves the model greedily, and along
   them the target's next-token argmax *is* the greedy continuation, so a
   block's labels are exactly the tokens greedy verification accepts. (On
   corpus text the teacher-forced argmax at position a+k assumes the corpus
   tokens a+1..a+k-1, which greedy decoding would not have produced.)
2. Features: one more teacher-forced float32 pass over each sequence records
   the residual stream after the layers `target_layer_ids` (forward hooks;
   transformers' hidden_states[id + 1], what kestrel's step_with_taps copies)
   and the argmax labels. They stay in memory (bf16) for the whole run.
3. Training: per sequence, --anchors random anchor positions a in the
   generated part. Block j is [token at a, mask x (B-1)] at positions
   a..a+B-1; its queries see the context rows at positions < a (the projected
   features of the true prefix) and the rows of their own block, nothing else
   (one attention mask over all anchors of a sequence, so the context keys are
   computed once). The target's embedding and lm_head are frozen and shared.
   Loss: cross-entropy of block row k (1..B-1) against the target's greedy
   token at position a+k, weighted by exp(-(k-1)/gamma) (the paper's decay
   toward early positions: a late draft only counts if all before it are
   accepted). Each anchor's block length is drawn from --train-block-sizes,
   since kestrel drafts a block of K+1 rows for --num-speculative-tokens K and
   the block's rows see each other (a shorter block is a different input).
4. Held-out: continuations of prompts from test.bin, anchors every 16
   positions; acceptance at block position k = share of anchors whose drafts
   1..k all equal the target's greedy tokens; acceptance length = mean number
   of accepted drafts per block (kestrel's tokens per step is that plus one).

Writes --out-dir: config.json, model.safetensors (bf16), training_log.json and
reference.json (drafts of the saved bf16 drafter, computed by
scripts/dflash_reference.py, for kestrel's agreement test).

Budget: --gen-seconds for the continuations, --max-seconds for training (the
learning-rate schedule is laid over that time unless --steps is given).
"""

import argparse
import json
import math
import os
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

from dflash_reference import Drafter, rms_norm, rotate  # noqa: E402
from make_reference import check_weights  # noqa: E402
from train import read_ids, seed_everything  # noqa: E402
from transformers import AutoModelForCausalLM  # noqa: E402

ROOT = HERE.parent.parent
# Never produced from text: the chat template does not write it and
# tokenize_corpus.py refuses any added token inside the corpus, so training
# never moved its embedding row and it means nothing but "mask" to the drafter.
MASK_TOKEN = "<|fim_pad|>"
EVAL_BLOCK_SIZES = (8, 12, 16)
EVAL_ANCHOR_STRIDE = 16


def parse_args():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target-dir", type=Path, default=ROOT / "models" / "kestrel-tiny-qwen35")
    ap.add_argument("--data-dir", type=Path, required=True, help="train.bin and test.bin of tokenize_corpus.py")
    ap.add_argument("--out-dir", type=Path, required=True)
    ap.add_argument("--seed", type=int, default=2602)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    # Drafter shape.
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--kv-heads", type=int, default=2)
    ap.add_argument("--head-dim", type=int, default=64)
    ap.add_argument("--intermediate", type=int, default=512)
    ap.add_argument("--rope-theta", type=float, default=1_000_000.0)
    ap.add_argument("--block-size", type=int, default=16)
    ap.add_argument("--target-layer-ids", default="1,3,5,7", help="comma-separated target layers to tap")
    # Data.
    ap.add_argument("--seq-len", type=int, default=512, help="prompt + greedy continuation, tokens")
    ap.add_argument("--prompt-lens", default="32,64,128,256", help="prompt lengths, cycled over generation batches")
    ap.add_argument("--gen-batch", type=int, default=1024, help="sequences continued at once")
    ap.add_argument("--gen-sequences", type=int, default=8192, help="most training sequences")
    ap.add_argument("--gen-seconds", type=float, default=75.0,
                    help="no new generation batch starts when the last one would end past this")
    ap.add_argument("--feature-batch", type=int, default=32, help="sequences per teacher-forced feature pass")
    ap.add_argument("--eval-sequences", type=int, default=64, help="held-out continuations")
    ap.add_argument("--eval-prompt-lens", default="64",
                    help="their prompt lengths, one generation batch each (one batch costs as much as a training one)")
    # Optimisation.
    ap.add_argument("--max-seconds", type=float, default=150.0, help="training time (evaluations excluded)")
    ap.add_argument("--steps", type=int, default=None, help="fixed step count instead of --max-seconds")
    ap.add_argument("--batch-size", type=int, default=64, help="sequences per step")
    ap.add_argument("--anchors", type=int, default=32, help="anchors (blocks) per sequence per step")
    ap.add_argument("--train-block-sizes", default="8,12,16")
    ap.add_argument("--gamma", type=float, default=7.0,
                    help="loss weight of block row k is exp(-(k-1)/gamma); 7 is the paper's value for 16-token blocks")
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--min-lr-ratio", type=float, default=0.1)
    ap.add_argument("--warmup", type=int, default=100)
    ap.add_argument("--weight-decay", type=float, default=0.01)
    ap.add_argument("--log-every", type=int, default=25)
    ap.add_argument("--eval-every", type=int, default=250)
    ap.add_argument("--no-autocast", action="store_true", help="train the drafter in float32 (bf16 autocast by default)")
    return ap.parse_args()


def ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def sync(device: str):
    if device.startswith("cuda"):
        torch.cuda.synchronize()


# ---------------------------------------------------------------- target ----

def load_target(model_dir: Path, device: str):
    """The bundled model in float32, frozen, checked against its checkpoint."""
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    check_weights(model, model_dir)
    model = model.to(device).eval()
    for p in model.parameters():
        p.requires_grad_(False)
    # transformers picks grouped_mm for the experts; where that kernel cannot
    # run float32 on this device, the per-expert loop computes the same.
    try:
        with torch.no_grad():
            model(input_ids=torch.zeros(2, 8, dtype=torch.long, device=device), use_cache=False)
    except (RuntimeError, NotImplementedError) as e:
        print(f"grouped_mm experts failed ({e}); using the eager per-expert loop", flush=True)
        model.set_experts_implementation("eager")
    return model


@torch.no_grad()
def greedy_continue(model, prompts: torch.Tensor, total: int) -> torch.Tensor:
    """[N, P] prompts -> [N, total]: each prompt followed by the target's greedy
    continuation (float32, with the model's cache)."""
    out = model(input_ids=prompts, use_cache=True, logits_to_keep=1)
    cache = out.past_key_values
    pieces = [prompts, out.logits[:, -1:].argmax(-1)]
    for _ in range(total - prompts.shape[1] - 1):
        out = model(input_ids=pieces[-1], past_key_values=cache, use_cache=True)
        pieces.append(out.logits[:, -1:].argmax(-1))
    return torch.cat(pieces, 1)


@torch.no_grad()
def tapped(model, seqs: torch.Tensor, layer_ids: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """One teacher-forced pass over [N, T] sequences: the residual stream after
    each tapped layer, concatenated ([N, T, taps * H], float32), and the
    target's logits [N, T, V]."""
    layers = model.model.layers
    captured = {}
    hooks = [
        layers[i].register_forward_hook(
            lambda _m, _a, out, i=i: captured.__setitem__(i, out[0] if isinstance(out, tuple) else out))
        for i in layer_ids
    ]
    try:
        logits = model(input_ids=seqs, use_cache=False).logits
    finally:
        for h in hooks:
            h.remove()
    return torch.cat([captured[i].float() for i in layer_ids], -1), logits


@torch.no_grad()
def features(model, seqs: torch.Tensor, layer_ids: list[int], batch: int) -> tuple[torch.Tensor, torch.Tensor]:
    """`tapped` in batches, kept compactly: taps in bf16 and, instead of the
    logits, their argmax ([N, T]: label[t] is the greedy token for position
    t + 1)."""
    taps, labels = [], []
    for s in range(0, seqs.shape[0], batch):
        t, logits = tapped(model, seqs[s: s + batch], layer_ids)
        taps.append(t.to(torch.bfloat16))
        labels.append(logits.argmax(-1))
    return torch.cat(taps), torch.cat(labels)


def document_starts(ids: torch.Tensor, eot: int) -> torch.Tensor:
    starts = (ids == eot).nonzero().flatten() + 1
    return torch.cat([torch.zeros(1, dtype=starts.dtype), starts[starts < ids.numel()]])


def sample_prompts(ids: torch.Tensor, starts: torch.Tensor, n: int, p: int, gen: torch.Generator) -> torch.Tensor:
    """n prompts of p tokens: half begin at a document start, half anywhere."""
    usable = starts[starts + p <= ids.numel()]
    at_start = usable[torch.randint(0, usable.numel(), (n // 2,), generator=gen)]
    anywhere = torch.randint(0, ids.numel() - p, (n - n // 2,), generator=gen)
    offs = torch.cat([at_start, anywhere])
    return ids[offs[:, None] + torch.arange(p)[None]]


class Pool:
    """Sequences with their prompt lengths, tapped features and greedy labels."""

    def __init__(self):
        self.seqs, self.prompt_len, self.taps, self.labels = [], [], [], []

    def add(self, seqs, p, taps, labels):
        self.seqs.append(seqs)
        self.prompt_len.append(torch.full((seqs.shape[0],), p, dtype=torch.long, device=seqs.device))
        self.taps.append(taps)
        self.labels.append(labels)

    def finish(self):
        self.seqs, self.prompt_len = torch.cat(self.seqs), torch.cat(self.prompt_len)
        self.taps, self.labels = torch.cat(self.taps), torch.cat(self.labels)
        return self

    def __len__(self):
        return self.seqs.shape[0]


def build_pool(model, ids, starts, args, layer_ids, prompt_lens, batch, count, seconds, gen, what) -> tuple[Pool, dict]:
    """Greedy continuations of `count` prompts, `batch` at a time, the prompt
    length cycling over `prompt_lens`; no new batch starts when the last
    one's time would take the whole past `seconds`."""
    pool = Pool()
    t0 = time.time()
    made, batches, last, generated = 0, 0, 0.0, 0
    agree, compared = 0, 0
    while made < count and (batches == 0 or time.time() - t0 + last <= seconds):
        tb = time.time()
        p = prompt_lens[batches % len(prompt_lens)]
        n = min(batch, count - made)
        prompts = sample_prompts(ids, starts, n, p, gen).to(args.device)
        seqs = greedy_continue(model, prompts, args.seq_len)
        taps, labels = features(model, seqs, layer_ids, args.feature_batch)
        # The cached decode and the full pass must agree on the greedy tokens
        # (up to float32 near-ties), or the labels would not be the continuation.
        agree += int((labels[:, p - 1:-1] == seqs[:, p:]).sum())
        compared += seqs[:, p:].numel()
        pool.add(seqs, p, taps, labels)
        made += n
        generated += seqs[:, p:].numel()
        batches += 1
        sync(args.device)
        last = time.time() - tb
        print(json.dumps({"pool": what, "batch": batches, "prompt_len": p, "sequences": made,
                          "seconds": round(time.time() - t0, 1)}), flush=True)
    stats = {"sequences": made, "batches": batches, "seconds": round(time.time() - t0, 1),
             "generated_tokens": generated,
             "cached_decode_agrees_with_full_pass": agree / max(1, compared)}
    if stats["cached_decode_agrees_with_full_pass"] < 0.99:
        raise SystemExit(f"error: greedy decode and teacher-forced argmax disagree: {stats}")
    return pool.finish(), stats


# --------------------------------------------------------------- drafter ----

class Norm(torch.nn.Module):
    """Qwen3's RMSNorm with a plain weight (dflash_reference.rms_norm)."""

    def __init__(self, n: int, eps: float):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(n))
        self.eps = eps

    def forward(self, x):
        return rms_norm(x, self.weight, self.eps)


def linear(i: int, o: int) -> torch.nn.Linear:
    return torch.nn.Linear(i, o, bias=False)


class Attention(torch.nn.Module):
    def __init__(self, cfg):
        super().__init__()
        h, hq, hkv, d = cfg["hidden_size"], cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
        self.q_proj, self.k_proj = linear(h, hq * d), linear(h, hkv * d)
        self.v_proj, self.o_proj = linear(h, hkv * d), linear(hq * d, h)
        self.q_norm, self.k_norm = Norm(d, cfg["rms_norm_eps"]), Norm(d, cfg["rms_norm_eps"])


class Mlp(torch.nn.Module):
    def __init__(self, cfg):
        super().__init__()
        h, i = cfg["hidden_size"], cfg["intermediate_size"]
        self.gate_proj, self.up_proj, self.down_proj = linear(h, i), linear(h, i), linear(i, h)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Layer(torch.nn.Module):
    def __init__(self, cfg):
        super().__init__()
        eps = cfg["rms_norm_eps"]
        self.input_layernorm = Norm(cfg["hidden_size"], eps)
        self.self_attn = Attention(cfg)
        self.post_attention_layernorm = Norm(cfg["hidden_size"], eps)
        self.mlp = Mlp(cfg)


class DflashTrainer(torch.nn.Module):
    """The drafter with the checkpoint's parameter names, batched over many
    blocks per sequence. The forward is dflash_reference.Drafter's (checked
    against it on the saved weights before saving)."""

    def __init__(self, cfg):
        super().__init__()
        h = cfg["hidden_size"]
        taps = len(cfg["dflash_config"]["target_layer_ids"])
        self.cfg = cfg
        self.fc = linear(taps * h, h)
        self.hidden_norm = Norm(h, cfg["rms_norm_eps"])
        self.layers = torch.nn.ModuleList(Layer(cfg) for _ in range(cfg["num_hidden_layers"]))
        self.norm = Norm(h, cfg["rms_norm_eps"])
        for m in self.modules():
            if isinstance(m, torch.nn.Linear):
                torch.nn.init.normal_(m.weight, std=0.02)

    def forward(self, taps, block_emb, block_pos, mask):
        """taps [S, T, taps*H] (context rows at positions 0..T-1), block_emb
        [S, Q, H] at block_pos [S, Q], mask [S, Q, T + Q] (True: may attend).
        Returns the final-norm output of the block rows [S, Q, H]."""
        cfg = self.cfg
        hq, hkv, d = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
        theta = float(cfg["rope_theta"])
        s, t = taps.shape[:2]
        q_rows = block_emb.shape[1]
        ctx_pos = torch.arange(t, device=taps.device).expand(s, t)
        ctx = self.hidden_norm(self.fc(taps.to(self.fc.weight.dtype)))
        x = block_emb
        for layer in self.layers:
            a = layer.self_attn
            h = layer.input_layernorm(x)
            q = rotate(a.q_norm(a.q_proj(h).view(s, q_rows, hq, d)), block_pos, theta)
            k_ctx = rotate(a.k_norm(a.k_proj(ctx).view(s, t, hkv, d)), ctx_pos, theta)
            k_blk = rotate(a.k_norm(a.k_proj(h).view(s, q_rows, hkv, d)), block_pos, theta)
            v = torch.cat([a.v_proj(ctx).view(s, t, hkv, d), a.v_proj(h).view(s, q_rows, hkv, d)], 1)
            k = torch.cat([k_ctx, k_blk], 1)
            dtype = v.dtype
            group = hq // hkv
            out = F.scaled_dot_product_attention(
                q.transpose(1, 2).to(dtype),
                k.transpose(1, 2).repeat_interleave(group, 1).to(dtype),
                v.transpose(1, 2).repeat_interleave(group, 1),
                attn_mask=mask[:, None],
            )
            x = x + a.o_proj(out.transpose(1, 2).reshape(s, q_rows, hq * d))
            x = x + layer.mlp(layer.post_attention_layernorm(x))
        return self.norm(x)


def drafter_config(target_text: dict, args, mask_id: int, layer_ids: list[int]) -> dict:
    """The z-lab form kestrel's DflashConfig reads (the fixture's layout)."""
    return {
        "architectures": ["DFlashDraftModel"],
        "model_type": "qwen3",
        "attention_bias": False,
        "attention_dropout": 0.0,
        "hidden_act": "silu",
        "hidden_size": target_text["hidden_size"],
        "intermediate_size": args.intermediate,
        "num_hidden_layers": args.layers,
        "num_attention_heads": args.heads,
        "num_key_value_heads": args.kv_heads,
        "head_dim": args.head_dim,
        "rms_norm_eps": target_text["rms_norm_eps"],
        "rope_theta": args.rope_theta,
        "max_position_embeddings": target_text["max_position_embeddings"],
        "vocab_size": target_text["vocab_size"],
        "tie_word_embeddings": False,
        "layer_types": ["full_attention"] * args.layers,
        "use_sliding_window": False,
        "sliding_window": None,
        "block_size": args.block_size,
        "num_target_layers": target_text["num_hidden_layers"],
        "dflash_config": {"mask_token_id": mask_id, "target_layer_ids": layer_ids},
        "dtype": "bfloat16",
    }


# ---------------------------------------------------------------- blocks ----

def blocks(pool: Pool, idx, anchors, lens, block: int, embed, mask_id: int):
    """Inputs of the blocks at `anchors` [S, A] (lengths `lens` [S, A]) of the
    pool's sequences `idx` [S]: embedded rows, positions, attention mask, and
    per mask row its label and whether it counts."""
    seqs, labels = pool.seqs[idx], pool.labels[idx]
    s, t = seqs.shape
    a_count = anchors.shape[1]
    dev = seqs.device
    offs = torch.arange(block, device=dev)
    ids = torch.full((s, a_count, block), mask_id, dtype=torch.long, device=dev)
    ids[:, :, 0] = seqs.gather(1, anchors)
    pos = (anchors[:, :, None] + offs).reshape(s, -1)
    q = a_count * block
    anchor_of_row = anchors.repeat_interleave(block, 1)  # [S, Q]
    ctx_ok = torch.arange(t, device=dev)[None, None, :] < anchor_of_row[:, :, None]
    blk = torch.arange(q, device=dev) // block
    row_in_blk = torch.arange(q, device=dev) % block
    same = (blk[:, None] == blk[None, :])[None]
    key_live = row_in_blk[None, :] < lens.repeat_interleave(block, 1)  # [S, Q] per key row
    mask = torch.cat([ctx_ok, same & key_live[:, None, :]], -1)
    # Row k (1..block-1) predicts position a+k: the greedy label at a+k-1.
    at = anchors[:, :, None] + offs[1:] - 1  # [S, A, block-1]
    live = (offs[1:][None, None] < lens[:, :, None]) & (at <= t - 1)
    tgt = labels.gather(1, at.clamp(max=t - 1).reshape(s, -1)).reshape(s, a_count, block - 1)
    return embed[ids].reshape(s, q, -1), pos, mask, tgt, live


def block_logits(drafter, pool, idx, anchors, lens, block, embed, lm_head, mask_id):
    emb, pos, mask, tgt, live = blocks(pool, idx, anchors, lens, block, embed, mask_id)
    hidden = drafter(pool.taps[idx], emb, pos, mask)
    s, a_count = anchors.shape
    hidden = hidden.view(s, a_count, block, -1)[:, :, 1:]
    return F.linear(hidden, lm_head), tgt, live


def weighted_ce(logits, tgt, live, weights):
    ce = F.cross_entropy(logits.float().flatten(0, -2), tgt.flatten(), reduction="none").view(tgt.shape)
    w = weights[None, None, :] * live
    return (ce * w).sum() / w.sum().clamp(min=1e-9)


@torch.no_grad()
def evaluate(drafter, pool, block_sizes, embed, lm_head, mask_id, weights, args, autocast) -> dict:
    """Held-out loss (block 16 rows, the training weights) and greedy
    acceptance by block position for each block size in block_sizes."""
    drafter.eval()
    dev = pool.seqs.device
    t = args.seq_len
    full = args.block_size
    result = {}
    per_seq = []
    for i in range(len(pool)):
        p = int(pool.prompt_len[i])
        per_seq.append(list(range(p, t - full + 2, EVAL_ANCHOR_STRIDE)))
    a_count = min(len(a) for a in per_seq)
    anchors_all = torch.tensor([a[:a_count] for a in per_seq], device=dev)
    for b in block_sizes:
        accepted = torch.zeros(full - 1, device=dev)
        loss_sum, loss_n, n = 0.0, 0, 0
        for s in range(0, len(pool), 16):
            idx = torch.arange(s, min(s + 16, len(pool)), device=dev)
            anchors = anchors_all[idx]
            lens = torch.full_like(anchors, b)
            with torch.autocast(device_type=dev.type, dtype=torch.bfloat16, enabled=autocast):
                logits, tgt, live = block_logits(drafter, pool, idx, anchors, lens, full, embed, lm_head, mask_id)
            if b == full:
                loss_sum += float(weighted_ce(logits, tgt, live, weights)) * idx.numel()
                loss_n += idx.numel()
            run = (logits.argmax(-1) == tgt)[:, :, : b - 1].int().cumprod(-1)  # accepted prefix
            accepted[: b - 1] += run.sum((0, 1)).float()
            n += anchors.numel()
        rates = (accepted[: b - 1] / n).tolist()
        result[f"block_{b}"] = {"acceptance_by_position": [round(r, 4) for r in rates],
                                "acceptance_length": round(sum(rates), 4), "anchors": n}
        if b == full:
            result["heldout_loss"] = loss_sum / loss_n
    drafter.train()
    return result


# ------------------------------------------------------------- reference ----

def write_reference(drafter_dir: Path, cfg: dict, target, pool: Pool, embed, lm_head, trainer, layer_ids) -> dict:
    """Drafts of the saved drafter (its bf16 weights read back, float32
    compute by scripts/dflash_reference.py) for one held-out continuation at
    several context lengths, each context the float32 taps of the true
    prefix. The batched trainer must give the same logits on the same
    inputs. kestrel's test replays the sequence through its own target and
    drafter and compares the drafts (rows past a near-tie excepted)."""
    ref = Drafter(cfg, load_file(str(drafter_dir / "model.safetensors")))
    p = int(pool.prompt_len[0])
    seq = pool.seqs[0, : min(pool.seqs.shape[1], p + 48)]
    taps = tapped(target, seq[None], layer_ids)[0][0].cpu()
    seq = seq.cpu()
    embed, lm_head = embed.float().cpu(), lm_head.float().cpu()
    trainer = trainer.float().cpu().eval()
    block = cfg["block_size"]
    mask_id = cfg["dflash_config"]["mask_token_id"]
    steps, worst = [], 0.0
    # Inside the prompt, at its end, and as decoding extends the context.
    for c in sorted({c for c in (p - 20, p - 7, p, p + 1, p + 9, p + 30) if 1 <= c < seq.numel()}):
        cached = ref.context_kv(ref.project_context(taps[:c]), torch.arange(c))
        ids = [int(seq[c])] + [mask_id] * (block - 1)
        logits = (ref.block(embed[ids], c, cached) @ lm_head.T)[1:]
        with torch.no_grad():
            mine = trainer(taps[None, :c], embed[ids][None], torch.arange(c, c + block)[None],
                           torch.ones(1, block, c + block, dtype=torch.bool))[0, 1:] @ lm_head.T
        worst = max(worst, float((mine - logits).abs().max()))
        top2 = logits.topk(2, -1).values
        steps.append({"context_len": c, "anchor": int(seq[c]), "drafts": logits.argmax(-1).tolist(),
                      "margins": [round(float(m), 5) for m in (top2[:, 0] - top2[:, 1])]})
    if worst > 1e-3:
        raise SystemExit(f"error: the trainer's forward differs from dflash_reference.py by {worst}")
    reference = {
        "target": "models/kestrel-tiny-qwen35",
        "sequence": seq.tolist(),
        "sequence_source": f"a held-out prompt of {p} tokens and the target's float32 greedy continuation",
        "block_size": block,
        "mask_token_id": mask_id,
        "target_layer_ids": layer_ids,
        "steps": steps,
        "trainer_vs_reference_max_abs_logit": worst,
        "torch_version": torch.__version__,
    }
    # One line per key and per step: readable, and diffs stay small.
    lines = [f" {json.dumps(k)}: {json.dumps(v)}" for k, v in reference.items() if k != "steps"]
    lines.append(' "steps": [\n' + ",\n".join(f"  {json.dumps(st)}" for st in steps) + "\n ]")
    (drafter_dir / "reference.json").write_text("{\n" + ",\n".join(lines) + "\n}\n")
    return {"trainer_vs_reference_max_abs_logit": worst}


# ------------------------------------------------------------------ main ----

def lr_at(step: int, progress: float, args) -> float:
    if step < args.warmup:
        return args.lr * (step + 1) / args.warmup
    return args.lr * (args.min_lr_ratio + (1 - args.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * min(1.0, progress))))


def main():
    args = parse_args()
    t_begin = time.time()
    seed_everything(args.seed)
    device = args.device
    autocast = not args.no_autocast
    # The target's greedy labels should be those of a float32 computation.
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    layer_ids = ints(args.target_layer_ids)
    block = args.block_size
    train_blocks = ints(args.train_block_sizes)
    if max(train_blocks) > block or min(train_blocks) < 2:
        raise SystemExit("error: --train-block-sizes must lie in 2..--block-size")

    if args.seq_len - max(ints(args.prompt_lens) + ints(args.eval_prompt_lens)) < block:
        raise SystemExit("error: every prompt must leave at least --block-size generated tokens in --seq-len")

    target_cfg = json.loads((args.target_dir / "config.json").read_text())["text_config"]
    tok = json.loads((args.target_dir / "tokenizer.json").read_text())
    added = {a["content"]: a["id"] for a in tok["added_tokens"]}
    mask_id, eot = added[MASK_TOKEN], added["<|endoftext|>"]
    target = load_target(args.target_dir, device)
    embed = target.get_input_embeddings().weight.detach()
    lm_head = target.get_output_embeddings().weight.detach()
    cfg = drafter_config(target_cfg, args, mask_id, layer_ids)
    print(f"device {device} ({torch.cuda.get_device_name() if device.startswith('cuda') else 'cpu'}), "
          f"torch {torch.__version__}, experts {target.config._experts_implementation}, "
          f"mask {MASK_TOKEN} = {mask_id}, taps {layer_ids}", flush=True)

    train_ids, test_ids = read_ids(args.data_dir / "train.bin"), read_ids(args.data_dir / "test.bin")
    gen = torch.Generator().manual_seed(args.seed)
    eval_lens = ints(args.eval_prompt_lens)
    eval_pool, eval_stats = build_pool(target, test_ids, document_starts(test_ids, eot), args, layer_ids,
                                       eval_lens, -(-args.eval_sequences // len(eval_lens)),
                                       args.eval_sequences, float("inf"),
                                       torch.Generator().manual_seed(args.seed + 1), "held-out")
    pool, pool_stats = build_pool(target, train_ids, document_starts(train_ids, eot), args, layer_ids,
                                  ints(args.prompt_lens), args.gen_batch, args.gen_sequences,
                                  args.gen_seconds, gen, "train")
    t_data = time.time() - t_begin

    drafter = DflashTrainer(cfg).to(device)
    n_params = sum(p.numel() for p in drafter.parameters())
    decay = [p for n, p in drafter.named_parameters() if p.ndim >= 2]
    no_decay = [p for n, p in drafter.named_parameters() if p.ndim < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": args.weight_decay},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=args.lr, betas=(0.9, 0.95), eps=1e-8)
    weights = torch.exp(-torch.arange(block - 1, device=device, dtype=torch.float32) / args.gamma)
    sizes = torch.tensor(train_blocks, device=device)
    gen_dev = torch.Generator(device=device).manual_seed(args.seed + 2)

    log = {"args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
           "config": cfg, "params": n_params, "train_pool": pool_stats, "heldout_pool": eval_stats,
           "data_seconds": round(t_data, 1), "curve": [], "evals": []}
    print(json.dumps({"params": n_params, "train_pool": pool_stats, "heldout_pool": eval_stats}), flush=True)

    def run_eval(step, sizes_):
        ev = evaluate(drafter, eval_pool, sizes_, embed, lm_head, mask_id, weights, args, autocast)
        ev["step"] = step
        log["evals"].append(ev)
        print("eval", json.dumps(ev), flush=True)

    n_train = len(pool)
    train_time, step = 0.0, 0
    drafter.train()
    while True:
        progress = step / args.steps if args.steps else train_time / args.max_seconds
        if progress >= 1.0:
            break
        sync(device)
        t0 = time.time()
        lr = lr_at(step, progress, args)
        for g in opt.param_groups:
            g["lr"] = lr
        idx = torch.randint(0, n_train, (args.batch_size,), device=device, generator=gen_dev)
        p = pool.prompt_len[idx]
        u = torch.rand(args.batch_size, args.anchors, device=device, generator=gen_dev)
        anchors = p[:, None] + (u * (args.seq_len - p)[:, None]).long()
        lens = sizes[torch.randint(0, sizes.numel(), anchors.shape, device=device, generator=gen_dev)]
        with torch.autocast(device_type=device.split(":")[0], dtype=torch.bfloat16, enabled=autocast):
            logits, tgt, live = block_logits(drafter, pool, idx, anchors, lens, block, embed, lm_head, mask_id)
            loss = weighted_ce(logits, tgt, live, weights)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        gnorm = torch.nn.utils.clip_grad_norm_(drafter.parameters(), 1.0)
        opt.step()
        sync(device)
        train_time += time.time() - t0
        if step % args.log_every == 0:
            with torch.no_grad():
                top1 = ((logits.argmax(-1) == tgt) & live).sum() / live.sum()
            rec = {"step": step, "seconds": round(train_time, 2), "lr": lr, "loss": loss.item(),
                   "top1": top1.item(), "grad_norm": gnorm.item()}
            log["curve"].append(rec)
            print(json.dumps(rec), flush=True)
        if args.eval_every and step > 0 and step % args.eval_every == 0:
            run_eval(step, (block,))
        step += 1

    # Evaluate exactly what is saved: bf16 weights, computed in float32.
    with torch.no_grad():
        for prm in drafter.parameters():
            prm.copy_(prm.to(torch.bfloat16).float())
    final = evaluate(drafter, eval_pool, EVAL_BLOCK_SIZES, embed, lm_head, mask_id, weights, args, False)
    final["step"] = step
    print("final", json.dumps(final), flush=True)

    args.out_dir.mkdir(parents=True, exist_ok=True)
    tensors = {k: v.detach().to("cpu", torch.bfloat16).contiguous() for k, v in sorted(drafter.state_dict().items())}
    save_file(tensors, str(args.out_dir / "model.safetensors"), metadata={"format": "pt"})
    (args.out_dir / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    agreement = write_reference(args.out_dir, cfg, target, eval_pool, embed, lm_head, drafter, layer_ids)
    log.update({
        "steps": step, "train_seconds": round(train_time, 1), "total_seconds": round(time.time() - t_begin, 1),
        "final_eval_float32_bf16_weights": final, "reference": agreement,
        "device_name": torch.cuda.get_device_name() if device.startswith("cuda") else "cpu",
        "torch": torch.__version__, "mask_token": MASK_TOKEN,
    })
    (args.out_dir / "training_log.json").write_text(json.dumps(log, indent=1) + "\n")
    size = sum(f.stat().st_size for f in args.out_dir.iterdir())
    print(f"saved {args.out_dir} ({size / 1e6:.2f} MB): {step} steps, {train_time:.0f}s training, "
          f"{time.time() - t_begin:.0f}s in all", flush=True)


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    main()

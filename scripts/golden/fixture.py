"""Build one architecture's fixture: pick a seed, write the model folder, record references."""

import json
import shutil
from pathlib import Path

import torch
from safetensors.torch import save_file

import transformers
from transformers import AutoConfig

from .arches import DTYPE_NAMES, Arch
from .checkpoint import load_reference_model, read_checkpoint, verify_loaded_weights, write_checkpoint
from .configs import VOCAB
from .mtp import Qwen35MtpHead, add_mtp_reference
from .probes import (
    RouterProbe,
    diff_stats,
    full_logits,
    greedy_with_cache,
    margins,
    token_by_token_logits,
    worst,
)
from .weights import init_weights

# Teacher-forced prompt lengths: 100 > 64, so the hybrids run two chunks of the chunked rule.
PROMPT_LENGTHS = (5, 40, 100)
# Greedy continuations start from these prompts (a short one, and one longer than a chunk).
GREEDY_PROMPTS = (0, 2)
GREEDY_NEW_TOKENS = 32
SEED_TRIES = 12
# A seed is kept only if no greedy step is a near-tie and the paths do not collapse into a
# repeated token; among those, the one farthest from ties (greedy margin and router gap,
# each relative to the scale below) wins.
MIN_GREEDY_MARGIN = 0.05
MIN_DISTINCT_TOKENS = 8
ROUTER_GAP_SCALE = 1e-3
# Agreement demanded inside transformers between the chunked/full and the recurrent/cached
# paths, relative to the largest |logit|; a larger gap means the fixture cannot be trusted.
MAX_SELF_DISAGREEMENT = 1e-4


def make_prompts(seed: int, arch: Arch | None = None) -> list[list[int]]:
    gen = torch.Generator().manual_seed(seed)
    prompts = [torch.randint(0, VOCAB, (n,), generator=gen).tolist() for n in PROMPT_LENGTHS]
    for p in prompts:
        for pos in arch.eos_positions if arch else ():
            if pos < len(p):
                p[pos] = arch.eos_token_id
    return prompts


def top_k(model) -> int:
    return model.config.get_text_config().num_experts_per_tok


def build_candidate(arch: Arch, seed: int, model_dir: Path):
    """Write config and weights for one seed and load them back. Returns (model, number of
    verified tensors, mtp head or None)."""
    if model_dir.exists():
        shutil.rmtree(model_dir)
    model_dir.mkdir(parents=True)
    (model_dir / "config.json").write_text(json.dumps(arch.config(), indent=2) + "\n")
    config = AutoConfig.from_pretrained(str(model_dir))
    gen = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)  # construction draws from the global generator before we refill
    fresh = getattr(transformers, arch.model_class)._from_config(config, dtype=torch.float32)
    init_weights(fresh, arch.zero_centred_norms, gen)
    tensors = arch.layout(dict(fresh.state_dict()))
    if arch.has_mtp:
        mtp_init = Qwen35MtpHead(config.text_config)
        init_weights(mtp_init, True, gen)
        tensors.update(mtp_init.checkpoint_tensors())
    write_checkpoint(model_dir, tensors, arch.store_dtype, arch.num_shards)

    model = load_reference_model(arch.model_class, model_dir, arch.is_moe)
    stored = read_checkpoint(model_dir)
    n_verified = verify_loaded_weights(arch.layout, model, stored)
    mtp = None
    if arch.has_mtp:
        mtp = Qwen35MtpHead(model.config.text_config).eval()
        mtp.load_checkpoint_tensors(stored)
    return model, n_verified, mtp


def candidate_metrics(model, prompts, is_moe: bool) -> dict:
    probe = RouterProbe(model, top_k(model)) if is_moe else None
    greedy = [greedy_with_cache(model, prompts[i], GREEDY_NEW_TOKENS) for i in GREEDY_PROMPTS]
    for p in prompts:
        full_logits(model, p)
    return {
        "min_greedy_margin": min(margins(step).min().item() for _, step in greedy),
        "min_distinct_tokens": min(len(set(ids)) for ids, _ in greedy),
        "min_router_gap": probe.close() if probe else float("inf"),
    }


def choose_seed(arch: Arch, base_seed: int, prompts, model_dir: Path) -> tuple[int, dict]:
    scores = {}
    for attempt in range(SEED_TRIES):
        seed = base_seed * 1000 + attempt
        scores[seed] = candidate_metrics(build_candidate(arch, seed, model_dir)[0], prompts, arch.is_moe)
        print(f"  {arch.name}: seed {seed} {scores[seed]}", flush=True)
    eligible = {
        s: m
        for s, m in scores.items()
        if m["min_greedy_margin"] > MIN_GREEDY_MARGIN and m["min_distinct_tokens"] >= MIN_DISTINCT_TOKENS
    }
    if not eligible:
        raise RuntimeError(f"{arch.name}: no seed gave greedy margins above {MIN_GREEDY_MARGIN}")

    def distance_from_ties(s: int) -> float:
        m = eligible[s]
        return min(m["min_greedy_margin"] / MIN_GREEDY_MARGIN, m["min_router_gap"] / ROUTER_GAP_SCALE)

    best = max(eligible, key=distance_from_ties)
    return best, scores[best]


def teacher_forced_reference(model, prompts, tensors: dict) -> tuple[list[dict], list[dict]]:
    entries, self_diffs = [], []
    for i, ids in enumerate(prompts):
        logits = full_logits(model, ids)
        m = margins(logits)
        tensors[f"teacher_forced.{i}.logits"] = logits
        tensors[f"teacher_forced.{i}.margin"] = m
        self_diffs.append(diff_stats(token_by_token_logits(model, ids), logits))
        entries.append(
            {
                "index": i,
                "input_ids": ids,
                "logits_tensor": f"teacher_forced.{i}.logits",
                "margin_tensor": f"teacher_forced.{i}.margin",
                "min_margin": m.min().item(),
                "positions_with_margin_below_1e-3": int((m < 1e-3).sum()),
            }
        )
    return entries, self_diffs


def greedy_reference(arch: Arch, model, prompts, tensors: dict) -> tuple[list[dict], list[dict]]:
    entries, self_diffs = [], []
    for j, p in enumerate(GREEDY_PROMPTS):
        ids = prompts[p]
        new_ids, step_logits = greedy_with_cache(model, ids, GREEDY_NEW_TOKENS)
        full = full_logits(model, ids + new_ids)[len(ids) - 1 : len(ids) - 1 + len(new_ids)]
        if full.argmax(-1).tolist() != new_ids:
            raise RuntimeError(f"{arch.name}: the full forward disagrees with the cached greedy path")
        self_diffs.append(diff_stats(step_logits, full))
        tensors[f"greedy.{j}.step_logits"] = step_logits
        entries.append(
            {
                "index": j,
                "prompt_index": p,
                "prompt_ids": ids,
                "new_ids": new_ids,
                "step_logits_tensor": f"greedy.{j}.step_logits",
                "min_margin": margins(step_logits).min().item(),
                "min_margin_full_forward": margins(full).min().item(),
            }
        )
    return entries, self_diffs


def run_arch(arch: Arch, out_root: Path, base_seed: int) -> dict:
    arch_dir = out_root / arch.name
    model_dir = arch_dir / "model"
    prompts = make_prompts(base_seed, arch)
    seed, metrics = choose_seed(arch, base_seed, prompts, model_dir)
    model, n_verified, mtp = build_candidate(arch, seed, model_dir)

    tensors: dict[str, torch.Tensor] = {}
    teacher_forced, tf_diffs = teacher_forced_reference(model, prompts, tensors)
    greedy, greedy_diffs = greedy_reference(arch, model, prompts, tensors)
    consistency = {
        "note": "float32 differences inside transformers between two code paths on these weights; "
        "a port cannot be expected to agree more closely than this",
        "greedy_cached_decode_vs_full_forward": worst(greedy_diffs),
        "token_by_token_cached_vs_full_forward": worst(tf_diffs),
    }
    if arch.is_hybrid:
        consistency["gdn_paths"] = (
            "the full forward runs torch_chunk_gated_delta_rule (chunk 64) and causal_conv1d_fn; "
            "token_by_token runs torch_recurrent_gated_delta_rule and causal_conv1d_update after "
            "the first token"
        )
    for key in ("greedy_cached_decode_vs_full_forward", "token_by_token_cached_vs_full_forward"):
        if consistency[key]["max_abs_over_max_abs_logit"] > MAX_SELF_DISAGREEMENT:
            raise RuntimeError(f"{arch.name}: transformers disagrees with itself: {key} {consistency[key]}")

    all_logits = torch.cat([tensors[f"teacher_forced.{i}.logits"] for i in range(len(prompts))])
    meta = {
        "arch": arch.name,
        "transformers_version": transformers.__version__,
        "torch_version": torch.__version__,
        "seed": seed,
        "model_class": arch.model_class,
        "stored_dtype": DTYPE_NAMES[arch.store_dtype],
        "num_shards": arch.num_shards,
        "num_checkpoint_tensors_verified": n_verified,
        "reference_dtype": "float32, computed from the stored (rounded) weights read back by transformers",
        "attention_and_experts_implementation": "eager",
        "positions": "position_ids = arange(len) from 0 for every sequence; no BOS, no padding, batch 1",
        "teacher_forced": teacher_forced,
        "greedy": greedy,
        "greedy_new_tokens": GREEDY_NEW_TOKENS,
        "greedy_semantics": "greedy.{j}.step_logits[k] is the distribution whose argmax is new_ids[k]: "
        "k = 0 is the last row of a one-pass prefill of prompt_ids, step k > 0 is a single-token "
        "decode of new_ids[k-1] at position len(prompt_ids) + k - 1 through the cache",
        "min_greedy_margin": min(g["min_margin"] for g in greedy),
        "min_teacher_forced_margin": min(t["min_margin"] for t in teacher_forced),
        "logit_scale": {"std": all_logits.std().item(), "max_abs": all_logits.abs().max().item()},
        "transformers_self_consistency": consistency,
    }
    if arch.is_moe:
        meta["min_router_topk_logit_gap"] = metrics["min_router_gap"]
        meta["min_router_topk_logit_gap_note"] = (
            "smallest gap between the k-th and (k+1)-th router logit over every MoE layer, "
            "teacher-forced and greedy inputs; a port's router noise must stay below it"
        )
    if arch.has_mtp:
        meta["mtp"] = add_mtp_reference(model, mtp, prompts, tensors, top_k(model))
    save_file(
        {k: v.contiguous() for k, v in tensors.items()}, str(arch_dir / "reference.safetensors"), metadata={"format": "pt"}
    )
    (arch_dir / "reference.json").write_text(json.dumps(meta, indent=2) + "\n")
    return meta

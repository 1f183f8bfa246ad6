#!/usr/bin/env python3
"""Check a bundled-model folder against its recorded reference, on this
machine, with transformers' AutoModelForCausalLM in float32:

  * teacher-forced LM logits, final-norm hidden states and MTP logits of the two
    stored prompts must match within --atol;
  * greedy continuations must match up to the first step whose recorded
    top-1/top-2 margin is below --min-margin (a near-tie may flip);
  * perplexity on the first --windows stored held-out windows must match the
    recorded value within --ppl-rtol (with the default 16 windows).

Exits non-zero on a mismatch. Runs in about a minute on two CPU cores.
"""

import argparse
import json
import sys
from pathlib import Path

import torch
from safetensors.torch import load_file

sys.path.insert(0, str(Path(__file__).resolve().parent))

from checkpoint import load_mtp  # noqa: E402
from make_reference import teacher_forced  # noqa: E402
from train import TinyQwen35WithMtp, evaluate  # noqa: E402
from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model-dir", type=Path, required=True)
    ap.add_argument("--reference-dir", type=Path, required=True, help="holds reference.json and reference.safetensors")
    ap.add_argument("--atol", type=float, default=2e-3)
    ap.add_argument("--min-margin", type=float, default=0.05)
    ap.add_argument("--prompts", type=int, default=3, help="greedy prompts to re-run")
    ap.add_argument("--windows", type=int, default=16)
    ap.add_argument("--ppl-rtol", type=float, default=1e-4)
    args = ap.parse_args()
    torch.set_grad_enabled(False)

    ref = json.loads((args.reference_dir / "reference.json").read_text())
    ref_t = load_file(str(args.reference_dir / "reference.safetensors"))
    tok = AutoTokenizer.from_pretrained(args.model_dir)
    model = AutoModelForCausalLM.from_pretrained(args.model_dir, dtype=torch.float32).eval()
    pair = TinyQwen35WithMtp(model, load_mtp(args.model_dir, model.config)).eval()
    failures = []

    ids_list = [p["input_ids"] for p in ref["teacher_forced"]["prompts"]]
    for i, p in enumerate(ref["teacher_forced"]["prompts"]):
        if tok.encode(p["text"]) != p["input_ids"]:
            failures.append(f"teacher-forced prompt {i}: tokenization differs")
    got, _ = teacher_forced(pair, tok, ids_list, "cpu")
    for k, v in got.items():
        if not v.is_floating_point():
            continue
        diff = float((v - ref_t[k]).abs().max())
        print(f"{k}: max abs diff {diff:.2e}")
        if diff > args.atol:
            failures.append(f"{k}: max abs diff {diff} > {args.atol}")

    for p in ref["greedy"]["prompts"][: args.prompts]:
        if tok.encode(p["prompt"]) != p["prompt_ids"]:
            failures.append(f"{p['path']}: prompt tokenization differs")
        x = torch.tensor([p["prompt_ids"]])
        n = len(p["output_ids"])
        out = model.generate(x, attention_mask=torch.ones_like(x), do_sample=False, max_new_tokens=n,
                             min_new_tokens=n, temperature=None, top_p=None, top_k=None,
                             pad_token_id=tok.pad_token_id)[0, x.shape[1]:].tolist()
        firm = next((i for i, m in enumerate(p["margins"]) if m < args.min_margin), n)
        same = out[:firm] == p["output_ids"][:firm]
        print(f"greedy {p['path']}: {'ok' if same else 'MISMATCH'} over the first {firm} firm tokens, "
              f"{sum(a == b for a, b in zip(out, p['output_ids']))}/{n} equal")
        if not same:
            failures.append(f"greedy {p['path']} differs before the first near-tie")

    windows = ref_t["heldout.windows"][: args.windows].long()
    ev = evaluate(pair, windows, "cpu", 4, autocast=False)
    want = ref["heldout"]["first_16_windows"]["lm_perplexity"] if args.windows == 16 else None
    print(f"held-out perplexity over {args.windows} windows: {ev['lm_perplexity']:.6f} (recorded {want}); "
          f"MTP top-1 {ev['mtp_top1']:.4f}")
    if want is not None and abs(ev["lm_perplexity"] - want) > args.ppl_rtol * want:
        failures.append(f"perplexity {ev['lm_perplexity']} != {want}")

    if failures:
        print("FAILED:\n  " + "\n  ".join(failures))
        sys.exit(1)
    print("reference reproduced")


if __name__ == "__main__":
    main()

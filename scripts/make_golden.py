#!/usr/bin/env python3
"""Build the golden test fixtures under testdata/golden/ from Hugging Face transformers.

For each architecture (qwen3, qwen3_moe, qwen3_5_moe, qwen3_next, qwen4_exp) this:
  1. writes a tiny config.json in the form the real checkpoint uses,
  2. fills a randomly initialised model with seeded, deliberately scaled weights,
  3. writes them as safetensors with the real checkpoint tensor names and layouts (per-expert or
     stacked experts, one file or shards with an index, float32 / float16 / bfloat16),
  4. loads the folder back with transformers in float32 and checks that every stored tensor
     landed in its parameter, so the references use the rounded, stored weights,
  5. records float32 references: teacher-forced logits, greedy continuations and their top-1 /
     top-2 margins, how far transformers' cached paths drift from its full forward, and for
     qwen3_5_moe the MTP head's logits.

Usage: python3 scripts/make_golden.py [--out DIR] [--arch NAME ...] [--seed N]
Needs torch, transformers 5.17 and safetensors; runs on CPU in a couple of minutes.
"""

import argparse
import json
import sys
from pathlib import Path

import torch

from golden.arches import ARCHES
from golden.fixture import run_arch


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parent.parent / "testdata" / "golden")
    parser.add_argument("--arch", action="append", choices=[a.name for a in ARCHES], help="default: all")
    parser.add_argument("--seed", type=int, default=7, help="base seed; architecture i uses seed + i")
    args = parser.parse_args()
    # One thread keeps CPU reductions in the same order from run to run.
    torch.set_num_threads(1)
    summary = {}
    for index, arch in enumerate(ARCHES):
        if args.arch and arch.name not in args.arch:
            continue
        print(f"building {arch.name}", flush=True)
        meta = run_arch(arch, args.out, args.seed + index)
        summary[arch.name] = {
            "seed": meta["seed"],
            "min_greedy_margin": meta["min_greedy_margin"],
            "min_router_topk_logit_gap": meta.get("min_router_topk_logit_gap"),
            "transformers_self_consistency": meta["transformers_self_consistency"],
        }
    print(json.dumps(summary, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())

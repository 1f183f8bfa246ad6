#!/usr/bin/env python3
"""Record reference outputs of a saved bundled-model folder, loaded with
transformers' AutoModelForCausalLM unchanged, in float32.

Writes --out-json (reference.json) and --out-tensors (reference.safetensors):
  * how the folder loaded (missing / unexpected tensors) and a check that
    every loaded parameter equals its bf16 checkpoint tensor;
  * held-out perplexity of the LM and the MTP head on fixed windows (the
    windows themselves are stored, so no corpus is needed to check them);
  * greedy continuations of 10 held-out prompts, with the top-1/top-2 logit
    margin of every generated token (a tiny margin marks a near-tie that a
    different but correct implementation may resolve the other way);
  * teacher-forced logits, final-norm hidden states and MTP logits of 2 short
    prompts (one plain code, one rendered with the chat template).
"""

import argparse
import json
import math
import sys
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import load_file, save_file

sys.path.insert(0, str(Path(__file__).resolve().parent))

from checkpoint import TEXT_PREFIX, load_mtp  # noqa: E402
from train import TinyQwen35WithMtp, eval_windows, evaluate, read_ids  # noqa: E402
from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: E402

TEACHER_FORCED_CODE = "def fibonacci(n):\n    a, b = 0, 1\n    for _ in range(n):\n        a, b = b, a + b\n    return a\n"
TEACHER_FORCED_CHAT = [
    {"role": "system", "content": "You are a helpful assistant."},
    {"role": "user", "content": "Write a function that reverses a list."},
]


def parse_args():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model-dir", type=Path, required=True)
    ap.add_argument("--data-dir", type=Path, required=True, help="holds test.bin and test.jsonl")
    ap.add_argument("--out-json", type=Path, required=True)
    ap.add_argument("--out-tensors", type=Path, required=True)
    ap.add_argument("--seq-len", type=int, default=512)
    ap.add_argument("--eval-windows", type=int, default=256)
    ap.add_argument("--prompts", type=int, default=10)
    ap.add_argument("--new-tokens", type=int, default=48)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    return ap.parse_args()


def check_weights(model, model_dir: Path) -> dict:
    """Each parameter of the loaded model must equal its checkpoint tensor."""
    ckpt = load_file(str(model_dir / "model.safetensors"))
    worst, compared = 0.0, 0
    for name, p in model.state_dict().items():
        key = TEXT_PREFIX + name[len("model."):] if name.startswith("model.") else name
        if key not in ckpt:
            raise SystemExit(f"error: loaded parameter {name} has no checkpoint tensor {key}")
        worst = max(worst, float((p.detach().cpu() - ckpt[key].float()).abs().max()))
        compared += 1
    if worst != 0.0:
        raise SystemExit(f"error: loaded weights differ from the checkpoint by up to {worst}")
    return {"parameters_compared": compared, "max_abs_difference": worst}


def held_out_prompts(data_dir: Path, tok, count: int) -> list:
    """Leading lines of `count` held-out files spread over the sorted list:
    the smallest number of whole lines that reaches 40 tokens."""
    docs = [json.loads(line) for line in open(data_dir / "test.jsonl", encoding="utf-8")]
    picks = [docs[round(i * (len(docs) - 1) / max(1, count - 1))] for i in range(count)]
    prompts = []
    for d in picks:
        text = ""
        for line in d["text"].splitlines(keepends=True):
            text += line
            if len(tok.encode(text)) >= 40:
                break
        prompts.append({"path": d["path"], "text": text})
    return prompts


@torch.no_grad()
def greedy(model, tok, prompts, new_tokens, device) -> list:
    out = []
    for p in prompts:
        ids = tok.encode(p["text"])
        x = torch.tensor([ids], device=device)
        gen = model.generate(x, attention_mask=torch.ones_like(x), do_sample=False, max_new_tokens=new_tokens,
                             min_new_tokens=new_tokens, temperature=None, top_p=None, top_k=None,
                             output_scores=True, return_dict_in_generate=True, pad_token_id=tok.pad_token_id)
        new = gen.sequences[0, len(ids):].tolist()
        margins = []
        for s in gen.scores:
            top2 = s[0].float().topk(2).values
            margins.append(float(top2[0] - top2[1]))
        # The cached (recurrent) decode must agree with one full forward.
        full = model(gen.sequences).logits[0, len(ids) - 1: -1].argmax(-1).tolist()
        out.append({"path": p["path"], "prompt": p["text"], "prompt_ids": ids, "output_ids": new,
                    "output_text": tok.decode(new), "min_margin": min(margins), "margins": margins,
                    "full_forward_argmax_agrees": full == new})
    return out


@torch.no_grad()
def teacher_forced(pair, tok, ids_list, device) -> tuple:
    """Logits of the LM at every position, the hidden states after the final norm, and the
    MTP logits: slot t uses h_t and token t+1 (predicting t+2); the extra last
    slot uses the LM's greedy token after the prompt, as a drafter would."""
    tensors, meta = {}, []
    for i, ids in enumerate(ids_list):
        x = torch.tensor([ids], device=device)
        out = pair.lm(input_ids=x, use_cache=False)
        hidden = pair._final_hidden
        logits = out.logits
        nxt = logits[:, -1].argmax(-1, keepdim=True)
        follow = torch.cat([x[:, 1:], nxt], dim=1)  # token t+1 for every slot t
        pos = torch.arange(x.shape[1], device=device).view(1, 1, -1).expand(3, 1, -1)
        emb = pair.lm.model.embed_tokens(follow)
        mtp_logits = pair.lm.lm_head(pair.mtp(hidden, emb, pair.lm.model.rotary_emb(emb, pos)))
        tensors[f"teacher_forced.{i}.input_ids"] = x[0].cpu().to(torch.int64)
        tensors[f"teacher_forced.{i}.logits"] = logits[0].float().cpu()
        tensors[f"teacher_forced.{i}.final_hidden"] = hidden[0].float().cpu()
        tensors[f"teacher_forced.{i}.mtp_logits"] = mtp_logits[0].float().cpu()
        meta.append({"input_ids": ids, "text": tok.decode(ids), "greedy_next": int(nxt),
                     "lm_argmax": logits[0].argmax(-1).tolist(), "mtp_argmax": mtp_logits[0].argmax(-1).tolist()})
    return tensors, meta


def main():
    args = parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    device = args.device

    tok = AutoTokenizer.from_pretrained(args.model_dir)
    model, info = AutoModelForCausalLM.from_pretrained(args.model_dir, dtype=torch.float32,
                                                       output_loading_info=True)
    unexpected_non_mtp = [k for k in info["unexpected_keys"] if not k.startswith("mtp.")]
    if info["missing_keys"] or unexpected_non_mtp or info.get("mismatched_keys"):
        raise SystemExit(f"error: loading info {info}")
    weights = check_weights(model, args.model_dir)
    model = model.to(device).eval()
    mtp = load_mtp(args.model_dir, model.config, device)
    pair = TinyQwen35WithMtp(model, mtp).eval()

    windows = eval_windows(read_ids(args.data_dir / "test.bin"), args.seq_len, args.eval_windows)
    all_windows = evaluate(pair, windows, device, 16, autocast=False)
    first16 = evaluate(pair, windows[:16], device, 16, autocast=False)

    prompts = held_out_prompts(args.data_dir, tok, args.prompts)
    continuations = greedy(model, tok, prompts, args.new_tokens, device)

    chat_text = tok.apply_chat_template(TEACHER_FORCED_CHAT, tokenize=False, add_generation_prompt=True,
                                        enable_thinking=False)
    tf_ids = [tok.encode(TEACHER_FORCED_CODE), tok.encode(chat_text)]
    tensors, tf_meta = teacher_forced(pair, tok, tf_ids, device)
    noise = None
    if device != "cpu":
        # The same computation on the CPU shows how far two float32
        # implementations drift apart on this model: a floor for tolerances.
        cpu_pair = TinyQwen35WithMtp(model.to("cpu"), mtp.to("cpu")).eval()
        cpu_tensors, _ = teacher_forced(cpu_pair, tok, tf_ids, "cpu")
        noise = {k: float((cpu_tensors[k] - v).abs().max()) for k, v in tensors.items() if v.is_floating_point()}
    tensors["heldout.windows"] = windows.to(torch.int32)
    args.out_tensors.parent.mkdir(parents=True, exist_ok=True)
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(args.out_tensors))

    ref = {
        "loaded_with": "transformers AutoModelForCausalLM.from_pretrained(dtype=torch.float32), unchanged",
        "device": str(torch.cuda.get_device_name()) if device.startswith("cuda") else "cpu",
        "torch": torch.__version__,
        "model_class": type(model).__name__,
        "loading": {"missing_keys": sorted(info["missing_keys"]), "unexpected_keys": sorted(info["unexpected_keys"])},
        "weights_equal_checkpoint": weights,
        "heldout": {
            "definition": ("test.bin split into consecutive windows of seq_len+1 tokens from offset 0 "
                           "(window i = ids[i*seq_len : i*seq_len+seq_len+1]); every window is one "
                           "sequence from an empty state; LM loss over its seq_len next-token targets; "
                           "MTP slot t (t = 0..seq_len-2) reads the hidden state after the final norm at t and token "
                           "t+1 and is scored on token t+2. Stored as heldout.windows in the tensors file."),
            "seq_len": args.seq_len,
            "all_windows": all_windows,
            "first_16_windows": first16,
        },
        "greedy": {"new_tokens": args.new_tokens, "prompts": continuations},
        "teacher_forced": {
            "tensors": "teacher_forced.{i}.{input_ids,logits,final_hidden,mtp_logits} in the tensors file",
            "mtp_convention": ("slot t reads final_hidden[t] and token t+1 at position t; the last slot "
                               "reads the LM's greedy next token (greedy_next)"),
            "prompts": tf_meta,
            "gpu_vs_cpu_float32_max_abs_diff": noise,
        },
    }
    args.out_json.write_text(json.dumps(ref, indent=1) + "\n")
    agree = sum(c["full_forward_argmax_agrees"] for c in continuations)
    print(json.dumps({"heldout": all_windows, "greedy_full_forward_agrees": f"{agree}/{len(continuations)}",
                      "noise": noise}, indent=1))
    if not math.isfinite(all_windows["lm_perplexity"]):
        raise SystemExit("error: perplexity is not finite")


if __name__ == "__main__":
    np.set_printoptions(precision=4)
    main()

#!/usr/bin/env python3
"""Time library kernels on the shapes of an 8K-token prefill, as yardsticks
for kestrel's own kernels: what PyTorch's CUTLASS grouped GEMM, its
attention backends, cuBLAS, and (when importable) FLA's Triton Gated
DeltaNet reach on the same GPU.

Runs on a CUDA machine with PyTorch; FLA is optional (put `fla-core` and
`einops` on PYTHONPATH). Prints one JSON object: every timing is the median
of `--iters` runs between CUDA events, after warm-up, on random inputs with
uniform random routing (as kestrel's dummy weights route).

    python3 scripts/peer_kernels_bench.py --tokens 8192 --json peer.json
"""

import argparse
import json
import math
import statistics

import torch
import torch.nn.functional as F


def timed(fn, iters):
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(iters):
        a = torch.cuda.Event(enable_timing=True)
        b = torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    return statistics.median(times)


def ceilings(iters):
    n = 8192
    a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    ms = timed(lambda: a @ b, iters)
    src = torch.empty(2 << 30, device="cuda", dtype=torch.uint8)
    dst = torch.empty_like(src)
    copy_ms = timed(lambda: dst.copy_(src), iters)
    return {
        "cublas_bf16_8192_cubed_tflops": 2 * n**3 / ms / 1e9,
        "copy_2gib_tb_per_s": 2 * src.numel() / copy_ms / 1e9,
    }


def routing_offsets(tokens, experts, top_k):
    logits = torch.randn(tokens, experts, device="cuda")
    ids = logits.topk(top_k, dim=-1).indices.flatten()
    counts = torch.bincount(ids, minlength=experts)
    return counts.cumsum(0).to(torch.int32), counts


def grouped_gemm(tokens, experts, top_k, hidden, inter, iters):
    """gate_up [E, 2I, H] and down [E, H, I] over the grouped rows."""
    offs, counts = routing_offsets(tokens, experts, top_k)
    rows = tokens * top_k
    out = {"rows_per_expert_max": int(counts.max()), "rows_per_expert_min": int(counts.min())}
    for name, n, k in (("gate_up", 2 * inter, hidden), ("down", hidden, inter)):
        a = torch.randn(rows, k, device="cuda", dtype=torch.bfloat16)
        w = torch.randn(experts, n, k, device="cuda", dtype=torch.bfloat16) * 0.02
        flops = 2 * rows * n * k
        try:
            ms = timed(lambda: torch._grouped_mm(a, w.transpose(-2, -1), offs=offs), iters)
            out[name] = {"ms": ms, "tflops": flops / ms / 1e9}
        except Exception as e:  # noqa: BLE001 - report what the library refused
            out[name] = {"error": str(e)[:300]}
        # The same FLOPs as one dense GEMM (cuBLAS), the ceiling of a grouping.
        dense_w = w[0]
        ms = timed(lambda: a @ dense_w.t(), iters)
        out[name + "_dense_same_flops"] = {"ms": ms, "tflops": flops / ms / 1e9}
    return out


def attention(tokens, hq, hkv, d, iters):
    q = torch.randn(1, hq, tokens, d, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(1, hkv, tokens, d, device="cuda", dtype=torch.bfloat16)
    v = torch.randn(1, hkv, tokens, d, device="cuda", dtype=torch.bfloat16)
    # Causal: half the square of scores, QK^T and PV.
    flops = 4 * hq * d * tokens * tokens / 2
    from torch.nn.attention import SDPBackend, sdpa_kernel

    out = {}
    for name, backend in (
        ("flash", SDPBackend.FLASH_ATTENTION),
        ("cudnn", SDPBackend.CUDNN_ATTENTION),
        ("efficient", SDPBackend.EFFICIENT_ATTENTION),
    ):
        try:
            kk, vv = k, v
            gqa = {"enable_gqa": True}
            if backend == SDPBackend.EFFICIENT_ATTENTION:
                kk = k.repeat_interleave(hq // hkv, dim=1)
                vv = v.repeat_interleave(hq // hkv, dim=1)
                gqa = {}

            def run():
                with sdpa_kernel(backend):
                    return F.scaled_dot_product_attention(q, kk, vv, is_causal=True, **gqa)

            ms = timed(run, iters)
            out[name] = {"ms": ms, "tflops": flops / ms / 1e9}
        except Exception as e:  # noqa: BLE001
            out[name] = {"error": str(e)[:300]}
    return out


def gated_delta_net(tokens, hk, hv, d, iters):
    try:
        from fla.ops.gated_delta_rule import chunk_gated_delta_rule
    except Exception as e:  # noqa: BLE001
        return {"error": "fla not importable: " + str(e)[:200]}
    q = torch.randn(1, tokens, hk, d, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(1, tokens, hk, d, device="cuda", dtype=torch.bfloat16)
    v = torch.randn(1, tokens, hv, d, device="cuda", dtype=torch.bfloat16)
    g = F.logsigmoid(torch.randn(1, tokens, hv, device="cuda", dtype=torch.float32))
    beta = torch.rand(1, tokens, hv, device="cuda", dtype=torch.bfloat16)
    h0 = torch.zeros(1, hv, d, d, device="cuda", dtype=torch.float32)

    def run():
        return chunk_gated_delta_rule(
            q, k, v, g, beta, scale=1 / math.sqrt(d), initial_state=h0,
            output_final_state=True, use_qk_l2norm_in_kernel=True,
        )

    try:
        return {"fla_chunk_gated_delta_rule_ms": timed(run, iters)}
    except Exception as e:  # noqa: BLE001
        return {"error": str(e)[:300]}


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tokens", type=int, default=8192)
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--json")
    a = p.parse_args()
    torch.manual_seed(0)
    t = a.tokens
    res = {
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "tokens": t,
        "ceilings": ceilings(a.iters),
        # Qwen3.6-35B-A3B: 256 experts top-8, hidden 2048, expert 512;
        # attention 16 q / 2 kv heads of 256; DeltaNet 16 k / 32 v heads of 128.
        "qwen3.6_experts": grouped_gemm(t, 256, 8, 2048, 512, a.iters),
        "qwen3.6_shared_expert_dense": grouped_gemm(t, 1, 1, 2048, 512, a.iters),
        "qwen3.6_attention_d256": attention(t, 16, 2, 256, a.iters),
        "qwen3.6_gated_delta_net": gated_delta_net(t, 16, 32, 128, a.iters),
        # Qwen3-30B-A3B: 128 experts top-8, hidden 2048, expert 768; 32 q / 4 kv heads of 128.
        "qwen3_30b_experts": grouped_gemm(t, 128, 8, 2048, 768, a.iters),
        "qwen3_30b_attention_d128": attention(t, 32, 4, 128, a.iters),
    }
    text = json.dumps(res, indent=2)
    print(text)
    if a.json:
        with open(a.json, "w") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    main()

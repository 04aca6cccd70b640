"""Block-scaled fp8 linear (128x128 weight blocks, 1x128 activation groups) on the H200: r9k against the peers a
vLLM user would pick instead, side by side in one run.

GEMM (A pre-quantised: fp8 e4m3fn with fp32 1x128 scales; the same operands for all three):
* ``r9k``: ``kernels.fp8.fp8_block_gemm`` (its default kernel for the shape: the Gluon kernels on Hopper);
* ``vllm``: vLLM's Triton kernel ``w8a8_triton_block_scaled_mm`` (quantization/utils/fp8_utils.py, with its
  tuned configs for the device where it has them), what ``TritonFp8BlockScaledMMKernel`` runs;
* ``torch``: torch's block-scaled ``torch._scaled_mm`` (scale_a [M, K/128] column-major for BlockWise1x128,
  scale_b [K/128, N/128] for BlockWise128x128; CUTLASS on sm90), called as vLLM's
  ``BlockWiseTorchFP8ScaledMMLinearKernel`` calls it (M padded to a multiple of 4).
Linear (a bf16 activation in, bf16 out: the activation quant included):
* ``r9k``: ``kernels.fp8.fp8_linear`` (what the dispatch runs: r9k's quant, then its GEMM, through the cached plan);
* ``vllm``: vLLM's Triton per-token-group quant kernel (its fallback where its compiled op is absent, as on the
  device here) then ``w8a8_triton_block_scaled_mm``;
* ``torch``: the same vLLM quant (column-major scales) then the block-scaled ``torch._scaled_mm``.

Times (us): ``eager`` = calls back to back, host included, cycling over enough weight copies that they do not
stay in the L2; ``do_bench`` = triton's do_bench median (an L2 flush before each call); ``graph`` = CUDA-graph
replay of the same cycle (the GPU's time); ``host`` = host time per call issued (the launch path). Every output
is checked against the float64 product of the same fp8 operands.

Usage (CUDA): python -m benchmarks.fp8_linear [--json F] [--quick]
"""
from __future__ import annotations

import argparse
import functools
import json
import sys

import torch

from benchmarks._timing import do_bench_us, eager_loop, graph_us, host_us

SHAPES = [(1, 4096, 4096), (16, 4096, 4096), (32, 4096, 4096), (64, 4096, 4096), (128, 4096, 4096),
          (256, 4096, 4096), (1, 8192, 8192), (16, 8192, 8192), (4096, 4096, 4096), (8192, 8192, 8192)]
L2_BYTES = 60 * 2**20


def vllm_quant(x, colmajor: bool):
    """vLLM's per-token-group quant by its Triton fallback kernels (fp8_utils, the branch it takes where its
    compiled op is not used): (q [M, K] e4m3fn, s [M, K/128] fp32, row- or column-major)."""
    from vllm.model_executor.layers.quantization.utils import fp8_utils
    from vllm.model_executor.layers.quantization.utils.quant_utils import get_fp8_min_max

    M, K = x.shape
    q = torch.empty(M, K, dtype=torch.float8_e4m3fn, device=x.device)
    fmin, fmax = get_fp8_min_max()
    if colmajor:
        s = torch.empty(K // 128, M, dtype=torch.float32, device=x.device).t()
        fp8_utils._per_token_group_quant_fp8_colmajor[(M * K // 128,)](
            x, q, s, 128, K, x.stride(0), s.stride(1), 1e-10, fp8_min=fmin, fp8_max=fmax, use_ue8m0=False,
            BLOCK=128, num_warps=1, num_stages=1)
    else:
        s = torch.empty(M, K // 128, dtype=torch.float32, device=x.device)
        fp8_utils._per_token_group_quant_fp8[(M * K // 128,)](
            x, q, s, 128, K, x.stride(0), 1e-10, fp8_min=fmin, fp8_max=fmax, use_ue8m0=False, BLOCK=128,
            num_warps=1, num_stages=1)
    return q, s


def torch_block_mm(qa, sa_cm, qb, sb):
    """torch's block-scaled _scaled_mm as vLLM's BlockWiseTorchFP8ScaledMMLinearKernel calls it."""
    M = qa.shape[0]
    pad = (-M) % 4
    if pad:
        ap = qa.new_empty((M + pad, qa.shape[1]))
        ap[:M] = qa
        sp = sa_cm.new_empty((sa_cm.shape[1], M + pad)).t()
        sp[:M] = sa_cm
        qa, sa_cm = ap, sp
    out = torch._scaled_mm(qa, qb.t(), scale_a=sa_cm, scale_b=sb.t(), out_dtype=torch.bfloat16)
    out = out[0] if isinstance(out, tuple) else out
    return out[:M] if pad else out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json")
    ap.add_argument("--quick", action="store_true", help="M = 1, 16 at 4096^2 and 4096^3 only")
    args = ap.parse_args(argv)
    from vllm.model_executor.layers.quantization.utils.fp8_utils import w8a8_triton_block_scaled_mm

    import kernels.fp8 as F

    shapes = [s for s in SHAPES if not args.quick or s in ((1, 4096, 4096), (16, 4096, 4096), (4096, 4096, 4096))]
    res = []
    print(f"{'M x N x K':>18} {'what':>6} {'peer':>6} | {'eager':>8} {'do_bench':>8} {'graph':>8} {'host':>7} | rel",
          flush=True)
    for M, N, K in shapes:
        torch.manual_seed(0)
        copies = max(1, min(8, -(-2 * L2_BYTES // (N * K))))  # weights cycled so they do not stay in the L2
        ws = [F.fp8_quant_block_weight_ref(torch.randn(N, K, device="cuda")) for _ in range(copies)]
        x = torch.randn(M, K, device="cuda").bfloat16()
        qa, sa = F.fp8_quant_group(x)
        sa_cm = sa.t().contiguous().t()
        ref = F.fp8_block_gemm_ref(qa, sa, ws[0][0], ws[0][1], torch.float64)
        gemm = {
            "r9k": [lambda qb=qb, sb=sb: F.fp8_block_gemm(qa, sa, qb, sb) for qb, sb in ws],
            "vllm": [lambda qb=qb, sb=sb: w8a8_triton_block_scaled_mm(qa, qb, sa, sb, [128, 128], torch.bfloat16)
                     for qb, sb in ws],
            "torch": [lambda qb=qb, sb=sb: torch_block_mm(qa, sa_cm, qb, sb) for qb, sb in ws],
        }
        def vllm_linear(qb, sb):
            q, s = vllm_quant(x, False)
            return w8a8_triton_block_scaled_mm(q, qb, s, sb, [128, 128], torch.bfloat16)

        def torch_linear(qb, sb):
            q, s = vllm_quant(x, True)
            return torch_block_mm(q, s, qb, sb)

        lin = {
            "r9k": [functools.partial(F.fp8_linear, x, qb, sb, torch.bfloat16) for qb, sb in ws],
            "vllm": [functools.partial(vllm_linear, qb, sb) for qb, sb in ws],
            "torch": [functools.partial(torch_linear, qb, sb) for qb, sb in ws],
        }
        big = M * N * K >= 2**34
        for what, table in (("gemm", gemm), ("linear", lin)):
            for peer, fns in table.items():
                row = dict(M=M, N=N, K=K, what=what, peer=peer)
                try:
                    out = fns[0]()
                    row["rel"] = ((out.double() - ref).norm() / ref.norm()).item()
                    row["eager"] = eager_loop(fns, min_ms=20 if big else 30, reps=3 if big else 5)
                    row["do_bench"] = do_bench_us(fns[0])
                    row["graph"] = graph_us(fns, replays=8 if big else 24)
                    row["host"] = host_us(fns, n=20 if big else 200) if not big else float("nan")
                except Exception as e:  # keep the others
                    print(f"{M}x{N}x{K} {what} {peer} FAILED {type(e).__name__}: {str(e)[:300]}", file=sys.stderr,
                          flush=True)
                    continue
                res.append(row)
                print(f"{f'{M}x{N}x{K}':>18} {what:>6} {peer:>6} | {row['eager']:8.2f} {row['do_bench']:8.2f} "
                      f"{row['graph']:8.2f} {row['host']:7.1f} | {row['rel']:.1e}", flush=True)
        del ws
        torch.cuda.empty_cache()
    # summary: r9k against each peer, graph replay and eager
    print("\nsummary: time of the peer / time of r9k (> 1: r9k faster); eager / graph of r9k's own linear")
    for M, N, K in shapes:
        for what in ("gemm", "linear"):
            rows = {r["peer"]: r for r in res if (r["M"], r["N"], r["K"], r["what"]) == (M, N, K, what)}
            if "r9k" not in rows:
                continue
            r = rows["r9k"]
            parts = [f"{p} graph {rows[p]['graph'] / r['graph']:.2f} eager {rows[p]['eager'] / r['eager']:.2f}"
                     for p in ("vllm", "torch") if p in rows]
            print(f"{f'{M}x{N}x{K}':>18} {what:>6}: " + "; ".join(parts)
                  + f"; r9k eager/graph {r['eager'] / r['graph']:.2f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

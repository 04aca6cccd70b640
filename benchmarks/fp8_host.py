"""Where the eager time of r9k's fp8 linear goes on the device's host, and the prefill kernel's tile at M = 128-256.

* host: us of host time a call (calls issued back to back, the GPU left behind) of the pieces of
  ``kernels.fp8.fp8_linear`` at 16 x 4096 x 4096: a ``torch.empty``; an empty Triton kernel of 14 arguments
  launched through Triton's JIT dispatcher and through kernels/_launch.py's cached compiled kernel; the
  activation quant alone (one launch); the whole linear (two launches); torch's block-scaled ``_scaled_mm``
  (one C++ op) for scale; then cProfile's top entries of 300 fp8_linear calls.
* tiles: ``fp8_block_gemm`` (pre-quantised A) at M = 128 and 256 x 4096^2 / 8192^2 by CUDA-graph replay (the weights
  cycled beyond the L2) with the default prefill kernel (128 x 128 tiles: M = 128 x N = 4096 is 32 tiles for 132
  SMs) against the same kernel at BN = 64 and 32, and torch's block-scaled _scaled_mm.

Usage (CUDA, Hopper): python -m benchmarks.fp8_host
"""
from __future__ import annotations

import cProfile
import io
import pstats

import torch
import triton
import triton.language as tl

import kernels.fp8 as F
from benchmarks._timing import graph_us, host_us
from benchmarks.fp8_linear import L2_BYTES, torch_block_mm


@triton.jit
def _empty(a, b, c, d, e, f, g, h, i, j, k, l, m, n: tl.constexpr):  # noqa: E741
    pass


def main() -> int:
    from kernels._launch import launcher

    M, N, K = 16, 4096, 4096
    torch.manual_seed(0)
    qb, sb = F.fp8_quant_block_weight_ref(torch.randn(N, K, device="cuda"))
    x = torch.randn(M, K, device="cuda").bfloat16()
    qa, sa = F.fp8_quant_group(x)
    t = torch.empty(16, device="cuda")
    args = (t, t, t, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 4)
    lau = launcher(_empty)
    sa_cm = sa.t().contiguous().t()
    rows = {
        "torch.empty(16 x 4096 bf16)": lambda: torch.empty(M, K, device="cuda", dtype=torch.bfloat16),
        "empty Triton kernel, JIT dispatcher": lambda: _empty[(1,)](*args),
        "empty Triton kernel, cached launch": lambda: lau((1,), args),
        "fp8_quant_group (one launch)": lambda: F.fp8_quant_group(x),
        "fp8_linear (quant + GEMM: two launches)": lambda: F.fp8_linear(x, qb, sb, torch.bfloat16),
        "fp8_block_gemm, general path (one launch)": lambda: F.fp8_block_gemm(qa, sa, qb, sb),
        "torch._scaled_mm block-scaled (one C++ op)": lambda: torch_block_mm(qa, sa_cm, qb, sb),
    }
    print("host us a call (issued back to back):")
    for name, fn in rows.items():
        print(f"  {name:<44} {host_us(fn, n=500):8.1f}", flush=True)
    pr = cProfile.Profile()
    F.fp8_linear(x, qb, sb, torch.bfloat16)
    torch.cuda.synchronize()
    pr.enable()
    for _ in range(300):
        F.fp8_linear(x, qb, sb, torch.bfloat16)
    pr.disable()
    torch.cuda.synchronize()
    s = io.StringIO()
    pstats.Stats(pr, stream=s).sort_stats("tottime").print_stats(14)
    print(s.getvalue(), flush=True)

    print("graph-replay us, pre-quantised A (weights cycled beyond the L2):")
    for M, N, K in ((128, 4096, 4096), (256, 4096, 4096), (128, 8192, 8192), (256, 8192, 8192)):
        copies = max(1, min(8, -(-2 * L2_BYTES // (N * K))))
        ws = [F.fp8_quant_block_weight_ref(torch.randn(N, K, device="cuda")) for _ in range(copies)]
        x = torch.randn(M, K, device="cuda").bfloat16()
        qa, sa = F.fp8_quant_group(x)
        sa_cm = sa.t().contiguous().t()
        ref = F.fp8_block_gemm(qa, sa, *ws[0])
        line = []
        for name, cfg in (("default", None), ("ws2 bn64", dict(kernel="wgmma", WS=2, BN=64)),
                          ("ws2 bn32", dict(kernel="wgmma", WS=2, BN=32))):
            try:
                out = F.fp8_block_gemm(qa, sa, *ws[0], config=cfg)
                same = torch.equal(out, ref)
                us = graph_us([lambda qb=qb, sb=sb, cfg=cfg: F.fp8_block_gemm(qa, sa, qb, sb, config=cfg)
                               for qb, sb in ws])
                line.append(f"{name} {us:.2f} (same bits: {same})")
            except Exception as e:  # keep the others
                line.append(f"{name} FAILED {type(e).__name__}: {str(e)[:120]}")
        us = graph_us([lambda qb=qb, sb=sb: torch_block_mm(qa, sa_cm, qb, sb) for qb, sb in ws])
        print(f"  {M}x{N}x{K}: " + "; ".join(line) + f"; torch {us:.2f}", flush=True)
        del ws
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

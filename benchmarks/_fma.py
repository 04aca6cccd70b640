"""The FMA probe kernel (Triton, CUDA): dependent fp32 FMA chains with no memory traffic between a load and a store.

Two users: :func:`benchmarks._timing.warm_clocks` keeps the SMs busy with it, and
:func:`benchmarks.kernels.ceilings.fp32_fma` measures the device's FMA rate with it."""
from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _fma_probe_kernel(x, y, N_ITER: tl.constexpr):
    offs = tl.program_id(0) * 1024 + tl.arange(0, 1024)
    a = tl.load(x + offs)
    b = a * 0.999
    c = a * 1.001
    d = a + 0.5
    for _ in range(N_ITER):
        a = a * 0.9999 + 0.0001
        b = b * 0.9999 + 0.0001
        c = c * 0.9999 + 0.0001
        d = d * 0.9999 + 0.0001
    tl.store(y + offs, a + b + c + d)


def fma_probe(x: torch.Tensor, y: torch.Tensor, n_iter: int) -> None:
    """``n_iter`` rounds of 4 dependent FMA chains on every element of x (a multiple of 1024 fp32), into y."""
    _fma_probe_kernel[(x.numel() // 1024,)](x, y, N_ITER=n_iter, num_warps=4)

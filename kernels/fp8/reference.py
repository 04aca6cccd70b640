"""The references of the fp8 kernels (plain PyTorch, no Triton): the per-token-group activation quant, the
per-128x128-block weight quant, and the block-scaled GEMM with its sums in any dtype (float64 for the gates)."""
from __future__ import annotations

import torch

from kernels._util import cdiv
from kernels.fp8.common import AMAX_FLOOR, FP8_DTYPE, FP8_MAX, GROUP, _fmt


def fp8_quant_group_ref(x: torch.Tensor, fmt: str = "e4m3fn", group: int = GROUP):
    """Per-token-group quant in plain torch: returns ``(q [M, K] fp8, s [M, K/group] fp32)``."""
    fmax = FP8_MAX[_fmt(fmt)]
    M, K = x.shape
    if K % group:
        raise ValueError(f"K={K} is not a multiple of the group size {group}")
    xg = x.float().reshape(M, K // group, group)
    amax = xg.abs().amax(-1).clamp_min(AMAX_FLOOR)
    s = amax / torch.full_like(amax, fmax)  # tensor / tensor: IEEE division (CUDA's tensor / scalar multiplies
    q = (xg / s[..., None]).clamp(-fmax, fmax).to(FP8_DTYPE[fmt])  # by the reciprocal, another rounding)
    return q.reshape(M, K), s


def fp8_quant_block_weight_ref(w: torch.Tensor, fmt: str = "e4m3fn", block: int = GROUP):
    """Per-128x128-block weight quant (amax over the block): ``(qw [N, K] fp8, sw [ceil(N/128), K/128])``."""
    fmax = FP8_MAX[_fmt(fmt)]
    N, K = w.shape
    nb, kb = cdiv(N, block), K // block
    wp = torch.zeros(nb * block, K, dtype=torch.float32, device=w.device)
    wp[:N] = w.float()
    wb = wp.reshape(nb, block, kb, block)
    s = wb.abs().amax(dim=(1, 3)).clamp_min(AMAX_FLOOR) / fmax
    q = (wb / s[:, None, :, None]).clamp(-fmax, fmax).reshape(nb * block, K)[:N].to(FP8_DTYPE[fmt])
    return q, s


def fp8_block_gemm_ref(qa, sa, qb, sb, out_dtype=torch.bfloat16, group: int = GROUP) -> torch.Tensor:
    """float64 reference: dequantise both operands exactly and multiply. Returns ``[M, N]`` in ``out_dtype``
    (pass ``torch.float64`` for the unrounded product)."""
    M, K = qa.shape
    N = qb.shape[0]
    a = qa.double() * sa.double().repeat_interleave(group, dim=1)[:, :K]
    sbe = sb.double().repeat_interleave(group, dim=0)[:N].repeat_interleave(group, dim=1)[:, :K]
    b = qb.double() * sbe
    return (a @ b.t()).to(out_dtype)

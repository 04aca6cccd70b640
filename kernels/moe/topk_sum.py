"""``moe_topk_sum``: the fused top-k weighted sum with the sigmoid-gated shared expert, one launch (the package
docstring, kernels/moe/__init__.py, gives the function)."""
from __future__ import annotations

import torch

from kernels._util import _interpreting

try:
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover
    triton = None
    tl = None


if triton is not None:

    @triton.jit
    def _topk_sum_kernel(y, w, shared, gate, out, H, syt, syk, swt, sst, sot,
                         K: tl.constexpr, BH: tl.constexpr, HAS_SHARED: tl.constexpr, HAS_GATE: tl.constexpr,
                         RNE_FIX: tl.constexpr):
        # grid: (T, cdiv(H, BH))
        t = tl.program_id(0).to(tl.int64)
        offs = tl.program_id(1) * BH + tl.arange(0, BH)
        hm = offs < H
        acc = tl.zeros((BH,), dtype=tl.float32)
        for j in tl.static_range(K):
            wj = tl.load(w + t * swt + j).to(tl.float32)
            yj = tl.load(y + t * syt + j * syk + offs, mask=hm, other=0.0).to(tl.float32)
            acc += wj * yj
        if HAS_SHARED:
            sv = tl.load(shared + t * sst + offs, mask=hm, other=0.0).to(tl.float32)
            if HAS_GATE:
                g = tl.load(gate + t).to(tl.float32)
                sv = sv * (1.0 / (1.0 + tl.exp(-g)))
            else:
                sv = sv * 0.5
            acc += sv
        if RNE_FIX:  # Triton 3.9's interpreter truncates fp32 -> bf16: round to nearest even on the bits
            if out.dtype.element_ty == tl.bfloat16:
                bits = acc.to(tl.uint32, bitcast=True)
                acc = ((bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000).to(tl.float32, bitcast=True)
        tl.store(out + t * sot + offs, acc.to(out.dtype.element_ty), mask=hm)


def moe_topk_sum(y: torch.Tensor, w: torch.Tensor, shared: torch.Tensor | None = None,
                 gate: torch.Tensor | None = None, out: torch.Tensor | None = None, BH: int | None = None):
    """The fused top-k weighted sum plus the sigmoid-gated shared expert, one launch (see the module doc).

    Args:
        y: ``[T, k, H]`` experts' outputs (bf16/fp16/fp32), last dim contiguous.
        w: ``[T, k]`` router weights (any float dtype).
        shared: optional ``[T, H]`` shared expert output; gate: optional ``[T]`` or ``[T, 1]`` gate logits
            (sigmoid applied here; without a gate the shared term is weighted sigmoid(0) = 0.5).
        out: optional ``[T, H]``; default a new tensor in y's dtype.
    """
    T, k, H = y.shape
    if w.shape != (T, k):
        raise ValueError(f"w must be [{T}, {k}], got {tuple(w.shape)}")
    if y.stride(-1) != 1:
        raise ValueError("y must have a contiguous last dim")
    w = w.contiguous()
    if shared is not None and (shared.shape != (T, H) or shared.stride(-1) != 1):
        raise ValueError(f"shared must be [{T}, {H}] with a contiguous last dim")
    if gate is not None:
        gate = gate.reshape(T).contiguous()
    if out is None:
        out = torch.empty(T, H, dtype=y.dtype, device=y.device)
    if T == 0:
        return out
    BH = BH or min(1024 if not _interpreting() else 128, triton.next_power_of_2(H))
    _topk_sum_kernel[(T, triton.cdiv(H, BH))](
        y, w, shared if shared is not None else y, gate if gate is not None else w, out, H,
        y.stride(0), y.stride(1), w.stride(0), shared.stride(0) if shared is not None else 0, out.stride(0),
        K=k, BH=BH, HAS_SHARED=shared is not None, HAS_GATE=gate is not None, RNE_FIX=_interpreting(), num_warps=4,
    )
    return out

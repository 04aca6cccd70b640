"""The reference of :func:`kernels.moe.moe_topk_sum` (plain PyTorch). The expert cache's reference is its own host
path (``ExpertCache(..., device_plan=False)``), against which the device path is gated."""
from __future__ import annotations

import torch


def moe_topk_sum_ref(y: torch.Tensor, w: torch.Tensor, shared: torch.Tensor | None = None,
                     gate: torch.Tensor | None = None, out_dtype: torch.dtype | None = None) -> torch.Tensor:
    """fp32 reference of :func:`moe_topk_sum`, in the kernel's order (pass float64 inputs for the exact sum)."""
    acc_t = torch.float64 if y.dtype == torch.float64 else torch.float32
    T, k, H = y.shape
    acc = torch.zeros(T, H, dtype=acc_t, device=y.device)
    for j in range(k):
        acc = acc + w[:, j, None].to(acc_t) * y[:, j].to(acc_t)
    if shared is not None:
        g = gate.to(acc_t) if gate is not None else torch.zeros(T, dtype=acc_t, device=y.device)
        acc = acc + shared.to(acc_t) * (1.0 / (1.0 + torch.exp(-g)))[:, None]  # the kernel's sigmoid
    return acc.to(out_dtype or y.dtype)

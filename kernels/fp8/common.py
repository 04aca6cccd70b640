"""What the fp8 modules share: the quant group (128), the fp8 formats and their ranges, the activation check."""
from __future__ import annotations

import torch

GROUP = 128
FP8_MAX = {"e4m3fn": 448.0, "e4m3fnuz": 224.0}
FP8_DTYPE = {"e4m3fn": torch.float8_e4m3fn, "e4m3fnuz": torch.float8_e4m3fnuz}
AMAX_FLOOR = 1e-10


def _fmt(fmt: str) -> str:
    if fmt not in FP8_MAX:
        raise ValueError(f"fp8 format must be one of {sorted(FP8_MAX)}, got {fmt!r}")
    return fmt


def _fmt_of(t: torch.Tensor) -> str:
    for k, v in FP8_DTYPE.items():
        if t.dtype == v:
            return k
    raise ValueError(f"expected an fp8 tensor (e4m3fn or e4m3fnuz), got {t.dtype}")


def _check_x(x: torch.Tensor, name: str = "x") -> tuple[int, int]:
    if x.dim() != 2:
        raise ValueError(f"{name} must be [M, K], got {tuple(x.shape)}")
    M, K = x.shape
    if K % GROUP:
        raise ValueError(f"{name}: K={K} is not a multiple of {GROUP}")
    if x.stride(1) != 1:
        raise ValueError(f"{name} must have a contiguous last dim")
    return M, K

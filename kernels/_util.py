"""Host-side helpers shared by the kernel families (kept free of torch and Triton imports)."""
from __future__ import annotations

import os


def _interpreting() -> bool:
    """Whether Triton's interpreter is on (``TRITON_INTERPRET`` set and not "0"): kernels then run on the CPU,
    one program after another in Python."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def cdiv(a: int, b: int) -> int:
    """``ceil(a / b)`` for ints (b > 0), as ``triton.cdiv``."""
    return -(-int(a) // int(b))


def pow2(n: int) -> int:
    """The smallest power of two >= n (1 for n <= 1), as ``triton.next_power_of_2`` for n >= 1, without its
    wrapper's host cost."""
    return 1 << (int(n) - 1).bit_length() if n > 1 else 1

"""What the GDN kernels share: vLLM's pad slot id and the rounding of fp32 results to the output dtype."""
from __future__ import annotations

try:  # the references and argument checks work without Triton
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - exercised only where triton is absent
    triton = None
    tl = None

PAD_SLOT_ID = -1


if triton is not None:

    @triton.jit
    def _cast(x, dtype: tl.constexpr, RNE_FIX: tl.constexpr):
        """x (fp32) to dtype, rounding to nearest even. Under TRITON_INTERPRET=1 (RNE_FIX) Triton's interpreter
        truncates fp32 -> bf16, so the rounding is done here on the bits first; compiled code rounds itself."""
        if RNE_FIX:
            if dtype == tl.bfloat16:
                b = x.to(tl.uint32, bitcast=True)
                b = (b + 0x7FFF + ((b >> 16) & 1)) & 0xFFFF0000
                x = b.to(tl.float32, bitcast=True)
        return x.to(dtype)

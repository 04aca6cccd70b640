"""``fp8_quant_group``: the per-token-group-128 activation quant (the package docstring, kernels/fp8/__init__.py,
gives the function), and the exact division the fused quant of the GEMM's A-load shares with it."""
from __future__ import annotations

import torch

from kernels._util import _interpreting
from kernels.fp8.common import FP8_DTYPE, FP8_MAX, GROUP, _check_x, _fmt

try:  # the references work without Triton
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover
    triton = None
    tl = None


if triton is not None:

    @triton.jit
    def _rne_e4m3(y, RNE_FIX: tl.constexpr):
        """y (fp32, |y| <= 448) to e4m3fn. Under TRITON_INTERPRET=1 (RNE_FIX) Triton 3.9's interpreter loses the
        carry when rounding up crosses a binade (124.2 -> 64), so y is first rounded here to a 3-bit mantissa
        (normal range) or to a multiple of 2^-9 (subnormals), after which the conversion is exact; compiled code
        converts with the hardware's round-to-nearest-even."""
        if RNE_FIX:  # on |y|, the sign put back on the bits (the interpreter also drops the sign of -0)
            ay = tl.abs(y)
            b = ay.to(tl.uint32, bitcast=True)
            b = (b + 0x7FFFF + ((b >> 20) & 1)) & 0xFFF00000
            yn = b.to(tl.float32, bitcast=True)
            ys = (ay + 24576.0) - 24576.0  # 1.5 * 2^14: rounds to a multiple of 2^-9, nearest even
            ay = tl.where(ay < 0.015625, ys, yn)
            bits = ay.to(tl.float8e4nv).to(tl.uint8, bitcast=True)
            neg = (y.to(tl.uint32, bitcast=True) >> 31).to(tl.uint8)
            return (bits | (neg << 7)).to(tl.float8e4nv, bitcast=True)
        return y.to(tl.float8e4nv)

    @triton.jit
    def _div_exact(ax, s, r):
        """RN(ax / s) for ax [BM, 128] fp32 >= 0 and the row scales s [BM] > 0, with r = RN(1 / s) [BM]:
        three flops an element instead of IEEE division's ~10 and a slow-path branch. q0 = RN(ax r) is within
        a few ulps; the residual ax - q0 s is exact in one FMA; one FMA correction by r then gives the correctly
        rounded quotient (Markstein's scheme). Checked bit for bit against IEEE division: every bf16
        significand and every fp16 significand against every one of the 2^23 fp32 scale significands, in both
        quotient binades, plus 2^31 random and adversarial fp32 pairs (tests/kernels/fp8/test_quant.py keeps a
        sample). Scale invariance carries that to every exponent while the residual stays normal; it does
        whenever the quotient is >= 2^-11 (s >= 1e-10/448 bounds the exponents), and a smaller quotient is
        off by at most a few of its own ulps, so it still rounds to fp8 zero, as the reference's does."""
        q = ax * r[:, None]
        res = tl.fma(-q, s[:, None], ax)
        return tl.fma(res, r[:, None], q)

    @triton.jit
    def _div_probe_kernel(x, s, out, n, BLOCK: tl.constexpr):
        # out[i] = _div_exact(x[i], s[i]) (x >= 0, s > 0, fp32): the quotient the fused quant computes
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        msk = offs < n
        xv = tl.load(x + offs, mask=msk, other=0.0)
        sv = tl.load(s + offs, mask=msk, other=1.0)
        r = tl.math.div_rn(tl.full(sv.shape, 1.0, tl.float32), sv)
        q = _div_exact(xv[:, None], sv, r)
        tl.store(out + offs[:, None], q, mask=msk[:, None])

    @triton.jit
    def _quant_tile(x, FMAX: tl.constexpr, FNUZ: tl.constexpr, RNE_FIX: tl.constexpr, FAST_DIV: tl.constexpr):
        """x [BM, 128] fp32 -> (q [BM, 128] e4m3fn holding the MMA operand, s [BM] fp32, bits [BM, 128] uint8
        as stored for the format). For fnuz the operand is the e4m3fn value of 2 q (exactly), bits its fnuz
        encoding. The quotient is taken on |x| (round to nearest even is odd-symmetric, so RN(|x|/s) = |RN(x/s)|)
        and x's sign bit put back (one LOP3), which also keeps -0 -> -0 as torch does. FAST_DIV: _div_exact,
        otherwise IEEE div_rn; bit-identical results."""
        ax = tl.abs(x)
        amax = tl.maximum(tl.max(ax, axis=1), 1e-10)
        s = tl.math.div_rn(amax, tl.full(amax.shape, FMAX, tl.float32))
        if FAST_DIV:
            r = tl.math.div_rn(tl.full(amax.shape, 1.0, tl.float32), s)
            y = _div_exact(ax, s, r)
        else:
            y = tl.math.div_rn(ax, tl.broadcast_to(s[:, None], ax.shape))
        y = tl.minimum(y, FMAX)
        if FNUZ:
            y = y * 2.0
        sign = x.to(tl.uint32, bitcast=True) & 0x80000000
        y = (y.to(tl.uint32, bitcast=True) | sign).to(tl.float32, bitcast=True)
        q = _rne_e4m3(y, RNE_FIX)
        bits = q.to(tl.uint8, bitcast=True)
        if FNUZ:
            bits = tl.where(bits == 0x80, 0, bits)
        return q, s, bits

    @triton.jit
    def _quant_group_kernel(x, q, s, M, K, sxm, sqm, ssm, BM: tl.constexpr, GPP: tl.constexpr,
                            FMAX: tl.constexpr, FNUZ: tl.constexpr, RNE_FIX: tl.constexpr, FAST_DIV: tl.constexpr):
        # grid: (cdiv(M, BM), K // 128 // GPP); each program quantises GPP groups (GPP divides K/128) of BM rows
        pid_m = tl.program_id(0)
        offs_m = pid_m * BM + tl.arange(0, BM)
        mm = offs_m < M
        for i in tl.static_range(GPP):
            g = tl.program_id(1) * GPP + i
            offs_k = g * 128 + tl.arange(0, 128)
            xt = tl.load(x + offs_m[:, None].to(tl.int64) * sxm + offs_k[None, :], mask=mm[:, None], other=0.0)
            _, sc, bits = _quant_tile(xt.to(tl.float32), FMAX, FNUZ, RNE_FIX, FAST_DIV)
            tl.store(q + offs_m[:, None].to(tl.int64) * sqm + offs_k[None, :], bits, mask=mm[:, None])
            tl.store(s + offs_m * ssm + g, sc, mask=mm)


def fp8_quant_group(x: torch.Tensor, fmt: str = "e4m3fn", BM: int | None = None, GPP: int | None = None,
                    fast_div: bool = True):
    """Per-token-group-128 quant of ``x`` ``[M, K]`` (bf16/fp16/fp32). Returns ``(q [M, K] fp8 of fmt,
    s [M, K/128] fp32)``; bit-identical to :func:`fp8_quant_group_ref` (either ``fast_div``). Each program
    quantises ``BM`` rows by ``GPP`` groups. Raises ValueError for a bad shape, stride or format."""
    fmt = _fmt(fmt)
    M, K = _check_x(x)
    q = torch.empty(M, K, dtype=torch.uint8, device=x.device)
    s = torch.empty(M, K // GROUP, dtype=torch.float32, device=x.device)
    if M == 0:
        return q.view(FP8_DTYPE[fmt]), s
    BM = BM or (4 if _interpreting() else 16)
    GPP = GPP or (1 if _interpreting() else 2)
    while (K // GROUP) % GPP:
        GPP -= 1
    _quant_group_kernel[(triton.cdiv(M, BM), K // GROUP // GPP)](
        x, q, s, M, K, x.stride(0), q.stride(0), s.stride(0),
        BM=BM, GPP=GPP, FMAX=FP8_MAX[fmt], FNUZ=fmt == "e4m3fnuz", RNE_FIX=_interpreting(), FAST_DIV=fast_div,
        num_warps=4,
    )
    return q.view(FP8_DTYPE[fmt]), s


def fast_div_probe(x: torch.Tensor, s: torch.Tensor, BLOCK: int = 1024) -> torch.Tensor:
    """The fused quant's division on its own: ``RN(x / s)`` by :func:`_div_exact` for fp32 ``x >= 0`` and
    ``s > 0`` (same shape, any shape). For the gates: must equal ``x / s`` bit for bit."""
    if x.dtype != torch.float32 or s.dtype != torch.float32 or x.shape != s.shape:
        raise ValueError("x and s must be float32 tensors of one shape")
    xf, sf = x.contiguous().reshape(-1), s.contiguous().reshape(-1)
    out = torch.empty_like(xf)
    if xf.numel():
        _div_probe_kernel[(triton.cdiv(xf.numel(), BLOCK),)](xf, sf, out, xf.numel(), BLOCK=BLOCK)
    return out.reshape(x.shape)

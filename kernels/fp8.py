"""fp8 per-token-group activation quant and the block-scaled fp8 GEMM whose A-load does that quant itself.

Two Triton kernels and their references:

``fp8_quant_group`` / ``fp8_quant_group_ref``
    Per-token-group-128 quant (DeepSeek-V3 / vLLM ``per_token_group_quant_fp8``). For each row ``m`` and each
    group ``g`` of 128 consecutive columns, in fp32::

        amax   = max(max_j |x[m, 128 g + j]|, 1e-10)
        s[m,g] = amax / FMAX                                       (IEEE division, one rounding)
        q[m,j] = fp8(clamp(x[m, j] / s[m, g], -FMAX, FMAX))        (IEEE division, round to nearest even)

    e4m3fn: FMAX = 448; e4m3fnuz (the ROCm encoding, exponent bias 8): FMAX = 224 (vLLM's choice). The fnuz
    value of a bit pattern is half the e4m3fn value of the same bits (except 0x80: fn's -0, fnuz's NaN), so the
    kernels quantise ``2 x / s`` to e4m3fn (the doubling is exact) and store its bits, with -0 mapped to +0:
    the same bits as torch's ``.to(torch.float8_e4m3fnuz)`` of ``x / s``, on hardware with no fnuz converter.

``fp8_block_gemm`` / ``fp8_block_gemm_qa`` / ``fp8_block_gemm_ref``
    ``out[m, n] = sum_kb (sum_{k in block kb} qa[m, k] qb[n, k]) * sa[m, kb] * sb[n // 128, kb]`` with
    ``qb`` the weight ``[N, K]`` (row-major: K contiguous) in fp8, ``sb`` its scales per 128x128 block
    ``[ceil(N/128), K/128]``, and ``qa, sa`` the activation quantised per token and group of 128 as above.
    The inner sums run in the tensor cores at fp32 (exact per product; the accumulation in the MMA's
    precision), the block scales are applied per K-block in fp32, the result is rounded once to ``out_dtype``.
    ``fp8_block_gemm`` reads a pre-quantised A; ``fp8_block_gemm_qa`` reads the bf16/fp16/fp32 activation and
    quantises each ``[BLOCK_M, 128]`` tile in its A-load (the same fp32 operations, so the operands fed to the
    MMA are bit-identical to ``fp8_quant_group``'s output: ``store_a=`` writes them out to prove it).

Layout: x ``[M, K]`` with K a multiple of 128 and the last dim contiguous; weights ``[N, K]`` contiguous.
Under ``TRITON_INTERPRET=1`` the fp8 conversions and ``tl.dot`` on fp8 run (on numpy), so the CPU gates test
the same code at small shapes.
"""
from __future__ import annotations

import os

import torch

try:  # the references work without Triton
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover
    triton = None
    tl = None

GROUP = 128
FP8_MAX = {"e4m3fn": 448.0, "e4m3fnuz": 224.0}
FP8_DTYPE = {"e4m3fn": torch.float8_e4m3fn, "e4m3fnuz": torch.float8_e4m3fnuz}
AMAX_FLOOR = 1e-10


def _interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def _fmt(fmt: str) -> str:
    if fmt not in FP8_MAX:
        raise ValueError(f"fp8 format must be one of {sorted(FP8_MAX)}, got {fmt!r}")
    return fmt


# ============================================================================================================
# references
# ============================================================================================================
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
    nb, kb = -(-N // block), K // block
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


# ============================================================================================================
# Triton kernels
# ============================================================================================================
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
    def _quant_tile(x, FMAX: tl.constexpr, FNUZ: tl.constexpr, RNE_FIX: tl.constexpr):
        """x [BM, 128] fp32 -> (q [BM, 128] e4m3fn holding the MMA operand, s [BM] fp32, bits [BM, 128] uint8
        as stored for the format). For fnuz the operand is the e4m3fn value of 2 q (exactly), bits its fnuz
        encoding."""
        amax = tl.max(tl.abs(x), axis=1)
        amax = tl.maximum(amax, 1e-10)
        s = tl.math.div_rn(amax, tl.full(amax.shape, FMAX, tl.float32))
        y = tl.math.div_rn(x, tl.broadcast_to(s[:, None], x.shape))
        y = tl.minimum(tl.maximum(y, -FMAX), FMAX)
        if FNUZ:
            y = y * 2.0
        q = _rne_e4m3(y, RNE_FIX)
        bits = q.to(tl.uint8, bitcast=True)
        if FNUZ:
            bits = tl.where(bits == 0x80, 0, bits)
        return q, s, bits

    @triton.jit
    def _quant_group_kernel(x, q, s, M, K, sxm, sqm, ssm,
                            BM: tl.constexpr, FMAX: tl.constexpr, FNUZ: tl.constexpr, RNE_FIX: tl.constexpr):
        # grid: (cdiv(M, BM), K // 128)
        pid_m = tl.program_id(0)
        g = tl.program_id(1)
        offs_m = pid_m * BM + tl.arange(0, BM)
        offs_k = g * 128 + tl.arange(0, 128)
        mm = offs_m < M
        xt = tl.load(x + offs_m[:, None].to(tl.int64) * sxm + offs_k[None, :], mask=mm[:, None], other=0.0)
        _, sc, bits = _quant_tile(xt.to(tl.float32), FMAX, FNUZ, RNE_FIX)
        tl.store(q + offs_m[:, None].to(tl.int64) * sqm + offs_k[None, :], bits, mask=mm[:, None])
        tl.store(s + offs_m * ssm + g, sc, mask=mm)

    @triton.jit
    def _block_gemm_kernel(
        a, sa, b, sb, c, qa_out, sa_out, M, N, K,
        sam, ssam, sbn, ssbn, scm, sqm, ssqm,
        BM: tl.constexpr, BN: tl.constexpr, GROUP_M: tl.constexpr,
        QUANT_A: tl.constexpr, STORE_A: tl.constexpr, FMAX: tl.constexpr, A_FNUZ: tl.constexpr,
        B_FNUZ: tl.constexpr, RNE_FIX: tl.constexpr,
    ):
        # grid: (cdiv(M, BM) * cdiv(N, BN),); BN divides 128, so a program's columns share one weight block row.
        pid = tl.program_id(0)
        num_m = tl.cdiv(M, BM)
        num_n = tl.cdiv(N, BN)
        group = GROUP_M * num_n
        first_m = (pid // group) * GROUP_M
        gsize = tl.minimum(num_m - first_m, GROUP_M)
        pid_m = first_m + (pid % group) % gsize
        pid_n = (pid % group) // gsize
        offs_m = pid_m * BM + tl.arange(0, BM)
        offs_n = pid_n * BN + tl.arange(0, BN)
        offs_k = tl.arange(0, 128)
        mm = offs_m < M
        nm = offs_n < N
        a_rows = a + offs_m[:, None].to(tl.int64) * sam + offs_k[None, :]
        b_cols = b + offs_n[None, :].to(tl.int64) * sbn + offs_k[:, None]
        sb_row = sb + ((pid_n * BN) // 128) * ssbn
        half_a = 0.5 if A_FNUZ else 1.0
        half_b = 0.5 if B_FNUZ else 1.0
        acc = tl.zeros((BM, BN), dtype=tl.float32)
        for kb in range(0, K // 128):
            if QUANT_A:
                xt = tl.load(a_rows, mask=mm[:, None], other=0.0).to(tl.float32)
                qa, sca, bits = _quant_tile(xt, FMAX, A_FNUZ, RNE_FIX)
                if STORE_A:
                    if pid_n == 0:
                        tl.store(qa_out + offs_m[:, None].to(tl.int64) * sqm + kb * 128 + offs_k[None, :], bits,
                                 mask=mm[:, None])
                        tl.store(sa_out + offs_m * ssqm + kb, sca, mask=mm)
            else:
                bits = tl.load(a_rows, mask=mm[:, None], other=0)
                # fnuz bits read as e4m3fn are twice the fnuz value: half_a undoes it
                qa = bits.to(tl.float8e4nv, bitcast=True)
                sca = tl.load(sa + offs_m * ssam + kb, mask=mm, other=0.0)
            bb = tl.load(b_cols, mask=nm[None, :], other=0)
            qb = bb.to(tl.float8e4nv, bitcast=True)
            scb = tl.load(sb_row + kb)
            acc += tl.dot(qa, qb) * ((sca * half_a)[:, None] * (scb * half_b))
            a_rows += 128
            b_cols += 128
        tl.store(c + offs_m[:, None].to(tl.int64) * scm + offs_n[None, :], acc.to(c.dtype.element_ty),
                 mask=mm[:, None] & nm[None, :])


def _check_x(x: torch.Tensor, name: str = "x") -> tuple[int, int]:
    if x.dim() != 2:
        raise ValueError(f"{name} must be [M, K], got {tuple(x.shape)}")
    M, K = x.shape
    if K % GROUP:
        raise ValueError(f"{name}: K={K} is not a multiple of {GROUP}")
    if x.stride(1) != 1:
        raise ValueError(f"{name} must have a contiguous last dim")
    return M, K


def fp8_quant_group(x: torch.Tensor, fmt: str = "e4m3fn", BM: int | None = None):
    """Per-token-group-128 quant of ``x`` ``[M, K]`` (bf16/fp16/fp32). Returns ``(q [M, K] fp8 of fmt,
    s [M, K/128] fp32)``; bit-identical to :func:`fp8_quant_group_ref`."""
    fmt = _fmt(fmt)
    M, K = _check_x(x)
    q = torch.empty(M, K, dtype=torch.uint8, device=x.device)
    s = torch.empty(M, K // GROUP, dtype=torch.float32, device=x.device)
    if M == 0:
        return q.view(FP8_DTYPE[fmt]), s
    BM = BM or (4 if _interpreting() else 8)
    _quant_group_kernel[(triton.cdiv(M, BM), K // GROUP)](
        x, q, s, M, K, x.stride(0), q.stride(0), s.stride(0),
        BM=BM, FMAX=FP8_MAX[fmt], FNUZ=fmt == "e4m3fnuz", RNE_FIX=_interpreting(), num_warps=4,
    )
    return q.view(FP8_DTYPE[fmt]), s


def _fmt_of(t: torch.Tensor) -> str:
    for k, v in FP8_DTYPE.items():
        if t.dtype == v:
            return k
    raise ValueError(f"expected an fp8 tensor (e4m3fn or e4m3fnuz), got {t.dtype}")


def default_gemm_config(M: int, N: int, quant_a: bool) -> dict:
    """Tile config by shape: small tiles under the interpreter; on the GPU, decode shapes get narrow N tiles
    (enough programs to stream the weight), prefill shapes 128x128 tiles (first H200 sweep: NOTES_II.md)."""
    if _interpreting():
        return dict(BM=16, BN=32, GROUP_M=2, num_warps=4, num_stages=1)
    if M <= 16:
        return dict(BM=16, BN=32, GROUP_M=1, num_warps=4, num_stages=4)
    if M <= 64:
        return dict(BM=64, BN=64, GROUP_M=1, num_warps=4, num_stages=4)
    return dict(BM=128, BN=128, GROUP_M=8, num_warps=8, num_stages=3)


def _gemm(a, sa, b, sb, out_dtype, quant_a, fmt, store_a, config):
    M, K = _check_x(a, "a")
    N, Kb = b.shape
    if Kb != K:
        raise ValueError(f"a is [M, {K}] but b is [{N}, {Kb}]")
    if not b.is_contiguous():
        raise ValueError("b must be contiguous [N, K]")
    if sb.shape != (triton.cdiv(N, GROUP), K // GROUP):
        raise ValueError(f"sb must be [{triton.cdiv(N, GROUP)}, {K // GROUP}], got {tuple(sb.shape)}")
    b_fnuz = _fmt_of(b) == "e4m3fnuz"
    cfg = dict(default_gemm_config(M, N, quant_a))
    cfg.update(config or {})
    if 128 % cfg["BN"]:
        raise ValueError("BN must divide 128 (one weight block row per program)")
    c = torch.empty(M, N, dtype=out_dtype, device=a.device)
    qa_out = sa_out = None
    if store_a:
        qa_out = torch.empty(M, K, dtype=torch.uint8, device=a.device)
        sa_out = torch.empty(M, K // GROUP, dtype=torch.float32, device=a.device)
    if M == 0 or N == 0:
        return (c, qa_out, sa_out) if store_a else c
    if quant_a:
        a_fnuz = fmt == "e4m3fnuz"
        a_arg, sa_arg = a, sb
    else:
        a_fnuz = _fmt_of(a) == "e4m3fnuz"
        if sa.shape != (M, K // GROUP):
            raise ValueError(f"sa must be [{M}, {K // GROUP}], got {tuple(sa.shape)}")
        a_arg, sa_arg = a.view(torch.uint8), sa
    grid = (triton.cdiv(M, cfg["BM"]) * triton.cdiv(N, cfg["BN"]),)
    _block_gemm_kernel[grid](
        a_arg, sa_arg, b.view(torch.uint8), sb, c,
        qa_out if store_a else c, sa_out if store_a else c, M, N, K,
        a_arg.stride(0), sa_arg.stride(0), b.stride(0), sb.stride(0), c.stride(0),
        qa_out.stride(0) if store_a else 0, sa_out.stride(0) if store_a else 0,
        BM=cfg["BM"], BN=cfg["BN"], GROUP_M=cfg["GROUP_M"], QUANT_A=quant_a, STORE_A=store_a,
        FMAX=FP8_MAX[fmt] if quant_a else 448.0, A_FNUZ=a_fnuz, B_FNUZ=b_fnuz, RNE_FIX=_interpreting(),
        num_warps=cfg["num_warps"], num_stages=cfg["num_stages"],
    )
    if store_a:
        return c, qa_out.view(FP8_DTYPE[fmt]), sa_out
    return c


def fp8_block_gemm(qa, sa, qb, sb, out_dtype=torch.bfloat16, config: dict | None = None) -> torch.Tensor:
    """``[M, N]`` = (qa, sa) @ (qb, sb)^T, block-scaled (see the module docstring). qa ``[M, K]`` fp8 with
    sa ``[M, K/128]`` fp32; qb ``[N, K]`` fp8 with sb ``[ceil(N/128), K/128]`` fp32; either fp8 format."""
    return _gemm(qa, sa, qb, sb, out_dtype, False, _fmt_of(qa), False, config)


def fp8_block_gemm_qa(x, qb, sb, fmt: str = "e4m3fn", out_dtype=torch.bfloat16, store_a: bool = False,
                      config: dict | None = None):
    """The block-scaled GEMM with the per-token-group-128 quant of ``x`` ``[M, K]`` (bf16/fp16/fp32) in its
    A-load. With ``store_a`` returns ``(out, qa, sa)``: the operands it fed the MMA (written by the programs of
    the first column tile), bit-identical to ``fp8_quant_group(x, fmt)``."""
    return _gemm(x, None, qb, sb, out_dtype, True, _fmt(fmt), store_a, config)

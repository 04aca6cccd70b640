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
    ``fp8_quant_then_gemm`` is the two-launch baseline (quant kernel, then the pre-quantised GEMM).

GEMM kernels, chosen by :func:`default_gemm_config` (any key overridable through ``config=``):
``_block_gemm_kernel`` (the tile kernel: [BM, BN] output tiles, GROUP_M swizzle, BN dividing 128 or a
multiple of it, KPI K-blocks per iteration; the fused quant, decode shapes off Hopper, prefill without TMA),
``_block_gemm_tma_kernel`` (prefill with a pre-quantised A on a GPU with TMA other than the Hopper-with-Gluon
case: the same sums in the same order, its tiles moved by tensor descriptors, a persistent grid; bit-identical
to the tile kernel), ``_small_m_kernel`` (M <= 64: swap-AB so the weight rows fill the wgmma's 64-row side,
split-K over ~4 waves of programs, fp32 partials reduced in a fixed order either by
``_splitk_reduce_kernel`` or by the tile's last-arriving split; deterministic either way), and on a Hopper GPU
with Triton's Gluon and a pre-quantised A the defaults of kernels/fp8/wgmma.py: kernel="wgmma" (prefill,
warp-specialised, bit-identical to the tile kernel) and kernel="wgmma_small_m" (decode).
The fused quant divides by the row scale with :func:`_div_exact` (reciprocal once per row, then one
multiply and two FMAs an element): the IEEE quotient bit for bit, so the operands stay identical.

Layout: x ``[M, K]`` with K a multiple of 128 and the last dim contiguous; weights ``[N, K]`` contiguous.
Under ``TRITON_INTERPRET=1`` the fp8 conversions and ``tl.dot`` on fp8 run (on numpy), so the CPU gates test
the same code at small shapes.

Modules: :mod:`kernels.fp8.quant` (the activation quant), :mod:`kernels.fp8.gemm` (the Triton GEMM kernels, the
config table, the choice of kernel), :mod:`kernels.fp8.wgmma` (the Gluon kernels for Hopper),
:mod:`kernels.fp8.linear` (``fp8_linear`` and ``fp8_block_gemm``: through launch plans per weight and M bucket;
``fp8_linear`` is what the vLLM dispatch runs), :mod:`kernels.fp8.reference` (the references), :mod:`kernels.fp8.common` (the formats and the group).
The design, the figures against torch's and vLLM's kernels and the alternatives measured: docs/kernels/fp8.md.
"""
from kernels.fp8.common import FP8_DTYPE, FP8_MAX, GROUP
from kernels.fp8.gemm import (KERNELS, SMALL_M_MAX, TILE_DEFAULT, TMA_DEFAULT, WGMMA_DEFAULT, WGMMA_SMALL_M_DEFAULT,
                              default_gemm_config, fp8_block_gemm_qa, fp8_quant_then_gemm, pick_split_k,
                              small_m_config, tma_supported)
from kernels.fp8.linear import fp8_block_gemm, fp8_linear
from kernels.fp8.quant import fast_div_probe, fp8_quant_group
from kernels.fp8.reference import fp8_block_gemm_ref, fp8_quant_block_weight_ref, fp8_quant_group_ref

__all__ = ["fp8_quant_group", "fp8_quant_group_ref", "fp8_quant_block_weight_ref", "fp8_block_gemm",
           "fp8_block_gemm_qa", "fp8_block_gemm_ref", "fp8_quant_then_gemm", "fp8_linear", "fast_div_probe",
           "default_gemm_config", "small_m_config", "pick_split_k", "tma_supported", "GROUP", "FP8_MAX",
           "FP8_DTYPE", "SMALL_M_MAX", "KERNELS", "TILE_DEFAULT", "TMA_DEFAULT", "WGMMA_DEFAULT",
           "WGMMA_SMALL_M_DEFAULT"]

"""Unit gates for kernels/fp8.py: the per-token-group-128 quant against torch (bit for bit), the block-scaled
fp8 GEMM against its float64 reference, and the GEMM with the quant in its A-load against quant-then-GEMM.

Bounds: the quant is exact (same fp32 operations, IEEE division, round to nearest even), so q and s must
equal the reference bit for bit, for e4m3fn (max 448) and e4m3fnuz (max 224). The GEMM is compared with the
float64 product of the same dequantised operands: the products are exact in fp32 and the fp32 accumulation
over K <= 4096 adds at most ~K * 2^-24 relative (the H100/H200 fp8 MMA accumulates with fewer bits: bound
1e-3 for an fp32 output), plus the output rounding: 2^-9 per element for bf16 (bound 4e-3 norm-wise).
The fused GEMM's operands (written out with store_a) must equal fp8_quant_group's bit for bit.
"""
from __future__ import annotations

import pytest
import torch

from kernels.fp8 import (fp8_block_gemm, fp8_block_gemm_qa, fp8_block_gemm_ref, fp8_quant_block_weight_ref,
                         fp8_quant_group, fp8_quant_group_ref)

FMTS = ["e4m3fn", "e4m3fnuz"]
BOUND = {torch.float32: 1e-3, torch.bfloat16: 4e-3}


def rel(out, ref):
    out, ref = out.double().cpu(), ref.double().cpu()
    return ((out - ref).norm() / ref.norm()).item()


def act(gen, M, K, device, dtype=torch.bfloat16):
    """Activations with per-row magnitudes over 6 decades, one all-zero group and one outlier per row."""
    x = torch.randn(M, K, generator=gen, dtype=torch.float64)
    x *= 10.0 ** (torch.rand(M, 1, generator=gen, dtype=torch.float64) * 6 - 3)
    x[:, 5] *= 50.0
    if M > 1 and K > 128:
        x[1, 128:256] = 0.0
    return x.to(device=device, dtype=dtype)


def gemm_shapes(mode):
    if mode == "interp":
        return [(5, 64, 256), (33, 96, 128)]
    return [(1, 4096, 4096), (16, 4096, 4096), (200, 1000, 2048), (4096, 4096, 4096)]


@pytest.mark.parametrize("fmt", FMTS)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
def test_quant_group_bit_identical(mode, device, gen, fmt, dtype):
    shapes = [(7, 256), (1, 128), (0, 128)] if mode == "interp" else [(4096, 7168), (3, 128), (1000, 2048)]
    for M, K in shapes:
        x = act(gen, M, K, device, dtype)
        q, s = fp8_quant_group(x, fmt)
        qr, sr = fp8_quant_group_ref(x, fmt)
        assert q.dtype == qr.dtype and s.shape == sr.shape
        assert torch.equal(s, sr)
        assert torch.equal(q.view(torch.uint8), qr.view(torch.uint8)), (q.view(torch.uint8) != qr.view(torch.uint8)).sum()


def test_quant_rounding_edges(mode, device):
    """Ties, binade carries (124.2 -> 128), subnormals, saturation and the amax floor."""
    fmax = 448.0
    vals = torch.tensor([fmax, 124.17, 120.0, 124.0, 132.0, -0.0, 1e-12, -2.0 ** -10, 2.0 ** -9 * 1.5,
                         0.015, 0.0156, -300.5, 447.0, 3.0 * 2 ** -8], dtype=torch.float32)
    x = torch.zeros(2, 128)
    x[0, : len(vals)] = vals
    x = x.to(device)
    for fmt in FMTS:
        q, s = fp8_quant_group(x, fmt)
        qr, sr = fp8_quant_group_ref(x, fmt)
        assert torch.equal(q.view(torch.uint8), qr.view(torch.uint8)) and torch.equal(s, sr)
        assert s[1, 0].item() == pytest.approx(1e-10 / (448.0 if fmt == "e4m3fn" else 224.0))


@pytest.mark.parametrize("fmt", FMTS)
@pytest.mark.parametrize("out_dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_block_gemm_matches_reference(mode, device, gen, fmt, out_dtype):
    for M, N, K in gemm_shapes(mode):
        x = act(gen, M, K, device)
        w = torch.randn(N, K, generator=gen).to(device) * 0.05
        qb, sb = fp8_quant_block_weight_ref(w, fmt)
        qa, sa = fp8_quant_group_ref(x, fmt)
        c = torch.full((M, N), float("nan"), device=device)
        c = fp8_block_gemm(qa, sa, qb, sb, out_dtype)
        assert not torch.isnan(c).any()
        ref = fp8_block_gemm_ref(qa, sa, qb, sb, torch.float64)
        assert rel(c, ref) < BOUND[out_dtype], (M, N, K, rel(c, ref))


@pytest.mark.parametrize("fmt", FMTS)
def test_fused_quant_gemm_identical_operands(mode, device, gen, fmt):
    for M, N, K in gemm_shapes(mode):
        x = act(gen, M, K, device)
        w = torch.randn(N, K, generator=gen).to(device) * 0.05
        qb, sb = fp8_quant_block_weight_ref(w, fmt)
        qa, sa = fp8_quant_group(x, fmt)
        c_split = fp8_block_gemm(qa, sa, qb, sb, torch.bfloat16)
        c_fused, qa_f, sa_f = fp8_block_gemm_qa(x, qb, sb, fmt, torch.bfloat16, store_a=True)
        assert torch.equal(qa_f.view(torch.uint8), qa.view(torch.uint8))
        assert torch.equal(sa_f, sa)
        ref = fp8_block_gemm_ref(qa, sa, qb, sb, torch.float64)
        assert rel(c_fused, ref) < BOUND[torch.bfloat16]
        assert rel(c_fused, c_split) < BOUND[torch.bfloat16]
        c_plain = fp8_block_gemm_qa(x, qb, sb, fmt, torch.bfloat16)
        assert torch.equal(c_plain, c_fused)  # storing the operands does not change the product


def test_gemm_argument_checks(mode, device):
    x = torch.zeros(4, 100, device=device)
    qb = torch.zeros(128, 128, device=device).to(torch.float8_e4m3fn)
    sb = torch.ones(1, 1, device=device)
    with pytest.raises(ValueError):
        fp8_block_gemm_qa(x, qb, sb)
    with pytest.raises(ValueError):
        fp8_quant_group(torch.zeros(2, 128, device=device), "e5m2")

"""Gates of the TMA prefill GEMM (kernels/fp8.py, _block_gemm_tma_kernel, session 5): A, B and C tiles moved
by tensor descriptors and a persistent grid, the same per-K-block sums and scale-FMAs in the same order as the
pointer-based tile kernel, so the two must agree bit for bit; and where it cannot run (fused quant, no TMA,
misaligned rows, BN over 128) an explicit request is refused with the reason and the default falls back to the
tile kernel. On the CPU through Triton's interpreter (which runs tensor descriptors) and on an H200.
"""
from __future__ import annotations

import pytest
import torch

import kernels.fp8.gemm as F
from kernels.fp8 import fp8_block_gemm, fp8_block_gemm_qa, fp8_block_gemm_ref
from tests.kernels.cases import fp8_operands as operands

BOUND = {"gpu": 4e-3, "interp": 6e-3}  # bf16 output against float64, as tests/kernels/test_fp8.py


def rel(out, ref):
    out, ref = out.double().cpu(), ref.double().cpu()
    return ((out - ref).norm() / ref.norm()).item()


def tiles(mode):
    # (BM, BN, num_warps, num_stages, PROGRAMS): fewer programs than tiles, so the persistent loop turns
    if mode == "interp":
        return [(16, 32, 4, 1, 4), (32, 16, 4, 1, 3)]
    return [(128, 128, 8, 3, 5), (128, 128, 8, 3, None), (64, 128, 4, 4, 7)]


@pytest.mark.parametrize("fmts", [("e4m3fn", "e4m3fn"), ("e4m3fnuz", "e4m3fn"), ("e4m3fnuz", "e4m3fnuz")],
                         ids=["fn", "fnuz-a", "fnuz"])
@pytest.mark.parametrize("kpi", [1, 2])
def test_tma_kernel_bit_identical_to_tile_kernel(mode, device, fmts, kpi):
    shapes = [(37, 96, 256), (16, 32, 384)] if mode == "interp" else [(300, 384, 512), (1000, 1000, 2048)]
    for M, N, K in shapes:
        _, qa, sa, _, _ = operands(1, M, N, K, device, fmts[0])
        _, _, _, qb, sb = operands(2, M, N, K, device, fmts[1])
        ref = fp8_block_gemm_ref(qa, sa, qb, sb, torch.float64)
        for BM, BN, w, st, progs in tiles(mode):
            base = dict(BM=BM, BN=BN, GROUP_M=2, KPI=kpi, num_warps=w, num_stages=st)
            c_tile = fp8_block_gemm(qa, sa, qb, sb, config=dict(base, kernel="tile"))
            c_tma = fp8_block_gemm(qa, sa, qb, sb, config=dict(base, kernel="tma", PROGRAMS=progs))
            assert torch.equal(c_tma, c_tile), (M, N, K, BM, BN, progs, rel(c_tma, c_tile))
            assert rel(c_tma, ref) < BOUND[mode], (M, N, K, rel(c_tma, ref))


def test_tma_refused_where_it_cannot_run(mode, device):
    """An explicit kernel='tma' that cannot run raises ValueError naming why; nothing is launched."""
    M, N, K = 32, 64, 256
    x, qa, sa, qb, sb = operands(3, M, N, K, device)
    with pytest.raises(ValueError, match="pre-quantised A"):
        fp8_block_gemm_qa(x, qb, sb, config=dict(kernel="tma"))
    with pytest.raises(ValueError, match="BN dividing 128"):
        fp8_block_gemm(qa, sa, qb, sb, config=dict(kernel="tma", BN=256))
    big = torch.zeros(M, K + 16, dtype=torch.uint8, device=device)
    qa_off = big[:, 8:8 + K].view(qa.dtype)                       # base 8 bytes off a 16-byte boundary
    qa_off.copy_(qa)
    with pytest.raises(ValueError, match="a needs a 16-byte aligned base"):
        fp8_block_gemm(qa_off, sa, qb, sb, config=dict(kernel="tma"))
    _, qa2, sa2, qb2, sb2 = operands(4, M, 100, K, device)           # C rows of 200 bytes: not TMA-addressable
    with pytest.raises(ValueError, match="out needs a 16-byte aligned"):
        fp8_block_gemm(qa2, sa2, qb2, sb2, config=dict(kernel="tma"))


def test_default_picks_tma_only_where_it_runs(mode, device):
    """default_gemm_config: the TMA kernel for a pre-quantised prefill on a TMA device, the tile kernel for the
    fused quant and without TMA; and a default call whose C rows TMA cannot address falls back to the tile
    kernel with the right product."""
    if mode == "gpu":
        assert F.default_gemm_config(4096, 4096, 4096, tma=True) == F.TMA_DEFAULT
        assert F.default_gemm_config(4096, 4096, 4096, quant_a=True, tma=True)["kernel"] == "tile"
        assert F.default_gemm_config(4096, 4096, 4096)["kernel"] == "tile"
        assert F.default_gemm_config(16, 4096, 4096, tma=True)["kernel"] == "tile"   # without Gluon, decode
        # stays the tile kernel (on Hopper with Gluon see test_fp8_wgmma.test_default_selection)
    M, N, K = (300, 100, 512) if mode == "gpu" else (20, 100, 256)
    _, qa, sa, qb, sb = operands(5, M, N, K, device)
    c = fp8_block_gemm(qa, sa, qb, sb)
    assert rel(c, fp8_block_gemm_ref(qa, sa, qb, sb, torch.float64)) < BOUND[mode]


def test_tma_supported_by_device():
    assert F.tma_supported("cpu") is F._interpreting()

"""The TMA prefill GEMM (kernels/fp8/gemm.py, _block_gemm_tma_kernel): A, B and C tiles moved by tensor
descriptors and a persistent grid, the same per-K-block sums and scale-FMAs in the same order as the pointer-based
tile kernel, so the two agree bit for bit (edge shapes, PROGRAMS 1 and past the tile count, fnuz, strided and
column-major scales, fp16 / fp32 / fp64 outputs); where it cannot run (fused quant, no TMA, misaligned rows or
bases, BN over 128) an explicit request is refused with the reason and the default falls back to the tile
kernel; a config without "kernel" tunes the tile kernel."""
from __future__ import annotations

import pytest
import torch

import kernels.fp8.gemm as F
from kernels.fp8 import fp8_block_gemm, fp8_block_gemm_qa, fp8_block_gemm_ref
from tests.kernels.cases import fp8_operands as operands
from tests.kernels.cases import interp_only, rel


BOUND = {"gpu": 4e-3, "interp": 6e-3}  # bf16 output against float64, as tests/kernels/fp8/test_block_gemm.py


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


FP8_BOUND = 6e-3      # bf16 output against float64 under the interpreter, as tests/kernels/fp8/test_tma.py


def fp8_operands(seed, M, N, K, device, fmt="e4m3fn"):
    return operands(seed, M, N, K, device, fmt)[1:]


CFG_SMALL = dict(BM=16, BN=32, GROUP_M=2, KPI=1, num_warps=4, num_stages=1)


TMA_CASES = {
    "programs=1": (17, 64, 256, dict(CFG_SMALL, PROGRAMS=1)),
    "programs>tiles": (17, 64, 256, dict(CFG_SMALL, PROGRAMS=1000)),
    "M=1": (1, 64, 256, dict(CFG_SMALL, PROGRAMS=3)),
    "M=1 N=16": (1, 16, 256, dict(CFG_SMALL, KPI=2, PROGRAMS=2)),
    "N=40": (17, 40, 256, dict(CFG_SMALL, PROGRAMS=3)),
    "N=72": (17, 72, 256, dict(CFG_SMALL, PROGRAMS=3)),
    "N=8 K=128 kpi2": (17, 8, 128, dict(CFG_SMALL, KPI=2, PROGRAMS=2)),
    "K=128 kpi2": (17, 64, 128, dict(CFG_SMALL, KPI=2, PROGRAMS=3)),
    "K=384 kpi2": (17, 64, 384, dict(CFG_SMALL, KPI=2, PROGRAMS=3)),
    "N=200 BN64 G8": (40, 200, 384, dict(CFG_SMALL, BN=64, GROUP_M=8, KPI=2, PROGRAMS=5)),
    "BM32 BN128 G1": (40, 136, 256, dict(CFG_SMALL, BM=32, BN=128, GROUP_M=1, PROGRAMS=2)),
    "TMA_DEFAULT tile": (17, 64, 256, dict(F.TMA_DEFAULT)),
}


@pytest.mark.parametrize("case", list(TMA_CASES), ids=list(TMA_CASES))
def test_tma_bit_identical_to_tile_on_edge_shapes(mode, device, case):
    """PROGRAMS 1 and above the tile count, odd M (1, 17), N not a multiple of BN, a single
    K-block with KPI=2, odd K-blocks with KPI=2, the default 128 x 128 tile on a small problem: the TMA kernel
    equals the tile kernel bit for bit and the reference within the bf16 bound."""
    interp_only(mode)
    M, N, K, cfg = TMA_CASES[case]
    qa, sa, qb, sb = fp8_operands(3, M, N, K, device)
    tile_cfg = {k: v for k, v in cfg.items() if k != "PROGRAMS"}
    c_tile = fp8_block_gemm(qa, sa, qb, sb, config=dict(tile_cfg, kernel="tile"))
    c_tma = fp8_block_gemm(qa, sa, qb, sb, config=dict(cfg, kernel="tma"))
    assert torch.equal(c_tma, c_tile)
    assert rel(c_tma, fp8_block_gemm_ref(qa, sa, qb, sb, torch.float64)) < FP8_BOUND


@pytest.mark.parametrize("variant", ["fnuz", "fnuz-b", "colmajor-scales", "strided-sa", "padded-A-rows",
                                     "expanded-A", "fp16", "fp32", "fp64", "M=0"])
def test_tma_operand_variants(mode, device, variant):
    """Fnuz operands (both, or B only), column-major sa/sb, a strided sa, A with 16-byte-aligned
    padded rows, an expanded A (row stride 0), fp16/fp32/fp64 outputs, and M = 0: TMA equals tile bit for bit
    (and the reference where it is not empty)."""
    interp_only(mode)
    M, N, K = 17, 64, 256
    fa, fb = {"fnuz": ("e4m3fnuz", "e4m3fnuz"), "fnuz-b": ("e4m3fn", "e4m3fnuz")}.get(variant, ("e4m3fn", "e4m3fn"))
    qa, sa, _, _ = fp8_operands(1, M, N, K, device, fa)
    _, _, qb, sb = fp8_operands(2, M, N, K, device, fb)
    out = {"fp16": torch.float16, "fp32": torch.float32, "fp64": torch.float64}.get(variant, torch.bfloat16)
    if variant == "colmajor-scales":
        sa, sb = sa.t().contiguous().t(), sb.t().contiguous().t()
    elif variant == "strided-sa":
        s2 = torch.zeros(M, 2 * sa.shape[1], device=device)[:, ::2]
        s2.copy_(sa)
        sa = s2
    elif variant == "padded-A-rows":
        big = torch.zeros(M, K + 16, dtype=torch.uint8, device=device)
        big[:, :K] = qa.view(torch.uint8)
        qa = big[:, :K].view(qa.dtype)
    elif variant == "expanded-A":
        qa, sa = qa[:1].expand(M, K), sa[:1].expand(M, -1)
    elif variant == "M=0":
        qa, sa = qa[:0], sa[:0]
    cfg = dict(CFG_SMALL, KPI=2, PROGRAMS=3)
    c_tile = fp8_block_gemm(qa, sa, qb, sb, out, config=dict(cfg, kernel="tile"))
    c_tma = fp8_block_gemm(qa, sa, qb, sb, out, config=dict(cfg, kernel="tma"))
    assert c_tma.dtype == out and torch.equal(c_tma, c_tile)
    if qa.shape[0]:
        bound = FP8_BOUND if out == torch.bfloat16 else 1e-3
        assert rel(c_tma, fp8_block_gemm_ref(qa, sa, qb, sb, torch.float64)) < bound


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


def test_tma_layout_refusals_and_unknown_kernel(mode, device):
    """An explicit kernel='tma' on A with a non-16-byte row stride, A or B at a misaligned base
    raises ValueError naming the operand (the tile kernel still computes them); BN not dividing 128 is refused;
    an unknown kernel name (M > 0) raises ValueError listing the kernels."""
    interp_only(mode)
    M, N, K = 17, 64, 256
    qa, sa, qb, sb = fp8_operands(1, M, N, K, device)
    big = torch.zeros(M, K + 8, dtype=torch.uint8, device=device)
    big[:, :K] = qa.view(torch.uint8)
    qa_rows = big[:, :K].view(qa.dtype)
    flat = torch.zeros(M * K + 8, dtype=torch.uint8, device=device)
    qa_base = flat[8:].view(M, K)
    qa_base.copy_(qa.view(torch.uint8))
    qa_base = qa_base.view(qa.dtype)
    flat_b = torch.zeros(N * K + 8, dtype=torch.uint8, device=device)
    qb_base = flat_b[8:].view(N, K)
    qb_base.copy_(qb.view(torch.uint8))
    qb_base = qb_base.view(qb.dtype)
    ref = fp8_block_gemm_ref(qa, sa, qb, sb, torch.float64)
    for a_, b_, name in ((qa_rows, qb, "a"), (qa_base, qb, "a"), (qa, qb_base, "b")):
        with pytest.raises(ValueError, match=f"{name} needs a 16-byte aligned"):
            fp8_block_gemm(a_, sa, b_, sb, config=dict(CFG_SMALL, kernel="tma"))
        assert rel(fp8_block_gemm(a_, sa, b_, sb, config=dict(CFG_SMALL, kernel="tile")), ref) < FP8_BOUND
    with pytest.raises(ValueError, match="BN"):
        fp8_block_gemm(qa, sa, qb, sb, config=dict(CFG_SMALL, kernel="tma", BN=48))
    for bad in ("bogus", "TMA", None):
        with pytest.raises(ValueError, match="unknown kernel"):
            fp8_block_gemm(qa, sa, qb, sb, config=dict(kernel=bad))


@pytest.mark.parametrize("M, cfg, key", [
    (17, dict(CFG_SMALL, kernel="tma", PROGRAMS=-2), "PROGRAMS"),      # silently clamped to 1 program
    (17, dict(CFG_SMALL, kernel="tma", PROGRAMS=2.5), "PROGRAMS"),     # silently int()-ed to 2
    (17, dict(CFG_SMALL, kernel="tma", BM=0), "BM"),                   # ZeroDivisionError from triton.cdiv
    (17, dict(CFG_SMALL, kernel="tma", BM=24), "BM"),                  # "Shape element 0 must be a power of 2"
    (0, dict(kernel="bogus"), "kernel"),                           # M = 0: returns an empty tensor
    (0, dict(CFG_SMALL, kernel="tma", GROUP_M=0), "GROUP_M"),          # M = 0: returns an empty tensor
], ids=["programs-neg", "programs-float", "bm0", "bm24", "bogus-kernel-m0", "group0-m0"])
def test_tma_bad_tuning_values_refused_naming_the_key(mode, device, M, cfg, key):
    """Before the fix: invalid TMA tuning values are accepted silently or fail with an error that does not name
    the key: PROGRAMS <= 0 or non-int is clamped/truncated, BM=0 raises ZeroDivisionError, a BM that is not a
    power of two fails inside TensorDescriptor ('Shape element 0 ...'), and with M = 0 an unknown kernel name or
    GROUP_M=0 is not checked at all (the early return comes before the kernel dispatch). Expected: ValueError
    naming the offending key, whatever M, as BN and KPI already do."""
    interp_only(mode)
    qa, sa, qb, sb = fp8_operands(2, max(M, 1), 64, 256, device)
    qa, sa = qa[:M], sa[:M]
    with pytest.raises(ValueError, match=key):
        fp8_block_gemm(qa, sa, qb, sb, config=cfg)


def test_tma_group_m_zero_refused_or_right(mode, device):
    """Before the fix (the same cause, a real launch, memory-safe because TMA stores are clipped):
    kernel='tma' with GROUP_M=0 returns without error and the output is not the product (rel error ~1e30 or NaN:
    the returned tensor is mostly torch.empty garbage). Expected: ValueError, or the correct product."""
    interp_only(mode)
    qa, sa, qb, sb = fp8_operands(3, 33, 64, 256, device)
    ref = fp8_block_gemm_ref(qa, sa, qb, sb, torch.float64)
    try:
        c = fp8_block_gemm(qa, sa, qb, sb, config=dict(CFG_SMALL, kernel="tma", GROUP_M=0, PROGRAMS=2))
    except ValueError:
        return
    assert torch.isfinite(c).all() and rel(c, ref) < FP8_BOUND, rel(c, ref)


def test_default_picks_tma_only_where_it_runs(mode, device):
    """default_gemm_config: the TMA kernel for a pre-quantised prefill on a TMA device, the tile kernel for the
    fused quant and without TMA; and a default call whose C rows TMA cannot address falls back to the tile
    kernel with the right product."""
    if mode == "gpu":
        assert F.default_gemm_config(4096, 4096, 4096, tma=True) == F.TMA_DEFAULT
        assert F.default_gemm_config(4096, 4096, 4096, quant_a=True, tma=True)["kernel"] == "tile"
        assert F.default_gemm_config(4096, 4096, 4096)["kernel"] == "tile"
        assert F.default_gemm_config(16, 4096, 4096, tma=True)["kernel"] == "tile"   # without Gluon, decode
        # stays the tile kernel (on Hopper with Gluon see fp8/test_wgmma.py::test_default_selection)
    M, N, K = (300, 100, 512) if mode == "gpu" else (20, 100, 256)
    _, qa, sa, qb, sb = operands(5, M, N, K, device)
    c = fp8_block_gemm(qa, sa, qb, sb)
    assert rel(c, fp8_block_gemm_ref(qa, sa, qb, sb, torch.float64)) < BOUND[mode]


def test_a_kernel_less_override_tunes_the_tile_kernel(mode, device, monkeypatch):
    """Before the fix: on a TMA GPU the default for a pre-quantised prefill is kernel='tma', and a ``config``
    without a "kernel" key was merged into it. An override that is valid for the tile kernel (BN=256: the tile kernel
    takes BN a multiple of 128, and the tile default honoured it) raised "kernel='tma' needs BN dividing
    128" although the caller never asked for TMA; the contract is that only an *explicit* TMA request
    raises and the default falls back to the tile kernel. Expected: the default falls back to the tile kernel
    (result equal to an explicit kernel='tile' call with the same keys). The GPU's choice is emulated under
    the interpreter (_interpreting -> False for the config choice, tma_supported -> True)."""
    interp_only(mode)
    qa, sa, qb, sb = fp8_operands(4, 128, 256, 256, device)
    monkeypatch.setattr(F, "_interpreting", lambda: False)
    monkeypatch.setattr(F, "tma_supported", lambda dev: True)
    assert F.default_gemm_config(128, 256, 256, tma=True)["kernel"] == "tma"     # what _gemm picks here (CPU
    # tensors: no Gluon kernel)
    expect = fp8_block_gemm(qa, sa, qb, sb, config=dict(F.TILE_DEFAULT, KPI=2, BN=256))
    got = fp8_block_gemm(qa, sa, qb, sb, config=dict(BN=256))                # before the fix: ValueError
    assert torch.equal(got, expect)


def test_tma_supported_by_device():
    assert F.tma_supported("cpu") is F._interpreting()

"""The Gluon fp8 kernels (kernels/fp8/wgmma.py), which run on a Hopper GPU only (Gluon has no CPU interpreter):
on the GPU the prefill kernels bit-identical to the tile kernel, the decode kernels within the bound and
deterministic, UNROLL and the split-K reduce giving the same fp32 bits as one block and one split at a time, long
K, fnuz and fp32 outputs, CUDA-graph capture; on the CPU, that an explicit request is refused with the reason,
the config checks (stages, registers, WS / MODE / ROTATE / UNROLL types, missing scales), the Triton versions
Gluon is built for, ROCm excluded, and the default table."""
from __future__ import annotations

import re

import pytest
import torch

import kernels.fp8.gemm as F
import kernels.fp8.wgmma as W
from kernels.fp8 import fp8_block_gemm, fp8_block_gemm_qa, fp8_block_gemm_ref
from kernels.fp8.wgmma import gluon_problem, gluon_supported
from tests.kernels.cases import fp8_operands
from tests.kernels.cases import fp8_operands as operands
from tests.kernels.cases import rel


BOUND = 4e-3  # bf16 output against float64, as tests/kernels/fp8/test_block_gemm.py


def need_hopper(device):
    if not gluon_supported(device):
        pytest.skip(f"{device}: the Gluon kernels need a Hopper GPU")


@pytest.mark.parametrize("fmts", [("e4m3fn", "e4m3fn"), ("e4m3fnuz", "e4m3fn")], ids=["fn", "fnuz-a"])
def test_wgmma_bit_identical_to_tile_kernel(mode, device, fmts):
    if mode == "interp":
        pytest.skip("Gluon has no interpreter (refusal: test_wgmma_refused_where_it_cannot_run)")
    need_hopper(device)
    for M, N, K in [(300, 384, 512), (1000, 1000, 2048), (129, 256, 128), (4096, 4096, 4096)]:
        _, qa, sa, _, _ = operands(1, M, N, K, device, fmts[0])
        _, _, _, qb, sb = operands(2, M, N, K, device, fmts[1])
        ref = fp8_block_gemm_ref(qa, sa, qb, sb, torch.float64) if M * N * K <= 2**31 else None
        c_tile = fp8_block_gemm(qa, sa, qb, sb, config=dict(kernel="tile", BM=128, BN=128, GROUP_M=8, KPI=1,
                                                            num_warps=8, num_stages=3))
        for cfg in [  # WS=2 (the default), WS=1, WS=0 with MODE 0 / 1 / 2; persistent loops turning
                dict(), dict(PROGRAMS=5, GROUP_M=2), dict(num_stages=6, PROGRAMS=7), dict(BN=64, PROGRAMS=5),
                dict(WS=1), dict(WS=1, MODE=2, PROGRAMS=5), dict(WS=1, num_stages=6, PROGRAMS=7),
                dict(WS=1, MODE=2, BM=64, num_warps=4, BN=64),
                dict(WS=0), dict(WS=0, num_stages=3, PROGRAMS=5, GROUP_M=2), dict(WS=0, num_stages=6, PROGRAMS=7),
                dict(WS=0, BM=64, num_warps=4, BN=64, PROGRAMS=3), dict(WS=0, MODE=1, PROGRAMS=7),
                dict(WS=0, MODE=2)]:
            c = fp8_block_gemm(qa, sa, qb, sb, config=dict(cfg, kernel="wgmma"))
            assert torch.equal(c, c_tile), (M, N, K, cfg, rel(c, c_tile))
        if ref is not None:
            assert rel(c_tile, ref) < BOUND


def poison(M, N, device):
    """NaN into the caching allocator's free blocks of an [M, N] bf16 output and an fp32 workspace, so that an
    output the kernel did not write (or a partial it did not sum) cannot pass as an earlier call's result."""
    for shape, dt in (((M, N), torch.bfloat16), ((64, M, N), torch.float32)):
        torch.full(shape, float("nan"), dtype=dt, device=device)


@pytest.mark.parametrize("M", [1, 5, 16, 32, 64])
def test_wgmma_small_m_within_bound_and_deterministic(mode, device, M):
    if mode == "interp":
        pytest.skip("Gluon has no interpreter")
    need_hopper(device)
    for N, K in [(4096, 4096), (300, 384), (1000, 2048)]:
        _, qa, sa, qb, sb = operands(3, M, N, K, device)
        ref = fp8_block_gemm_ref(qa, sa, qb, sb, torch.float64)
        for cfg in [dict(), dict(SPLIT_K=1), dict(SPLIT_K=3), dict(BN=128, num_warps=8), dict(num_stages=2),
                    dict(SPLIT_K=K // 128), dict(ROTATE=True, SPLIT_K=3), dict(SPLIT_K=5), dict(SPLIT_K=9, UNROLL=2),
                    dict(UNROLL=4, num_stages=8), dict(SWAP_AB=False, BN=32, num_stages=8, UNROLL=4),
                    dict(SPLIT_K=7),
                    dict(SWAP_AB=False, BN=32, num_stages=16), dict(SWAP_AB=False, BN=8, num_stages=3),
                    dict(SWAP_AB=False, BN=64, num_stages=16)]:
            poison(M, N, device)
            c = fp8_block_gemm(qa, sa, qb, sb, config=dict(cfg, kernel="wgmma_small_m"))
            assert rel(c, ref) < BOUND, (M, N, K, cfg, rel(c, ref))
            poison(M, N, device)
            again = fp8_block_gemm(qa, sa, qb, sb, config=dict(cfg, kernel="wgmma_small_m"))
            assert torch.equal(c, again), (M, N, K, cfg)  # the split order is fixed, the counters were reset


def test_unroll_gives_the_same_bits(mode, device):
    """UNROLL 2 / 4 (K-blocks' wgmmas issued back to back into their own accumulators, folded in order) equal
    UNROLL 1 bit for bit in fp32 (a bf16 output would hide a fold in another order: 0-1 of 16384 bf16
    elements differed where 11840 fp32 ones did), in both decode kernels. The K-blocks
    of a program are not a multiple of UNROLL (7, 11, 5 + 6...: tails of 1 to 3 blocks), the ring is as deep
    as UNROLL (2 stages) or shallower (3 stages: UNROLL 4 runs as 2), and ROTATE is on in one case."""
    if mode == "interp":
        pytest.skip("Gluon has no interpreter")
    need_hopper(device)
    for M, N, K in [(16, 512, 896), (3, 384, 1408), (64, 256, 4096)]:
        _, qa, sa, qb, sb = operands(9, M, N, K, device)
        for cfg in [dict(SPLIT_K=1, num_stages=8), dict(SPLIT_K=1, num_stages=2), dict(SPLIT_K=1, num_stages=3),
                    dict(SPLIT_K=2, num_stages=8), dict(ROTATE=True, SPLIT_K=2, num_stages=4),
                    dict(SWAP_AB=False, BN=32, num_stages=8), dict(SWAP_AB=False, BN=64, num_stages=3),
                    dict(SWAP_AB=False, BN=64, num_stages=2)]:
            cfg = dict(cfg, kernel="wgmma_small_m")
            one = fp8_block_gemm(qa, sa, qb, sb, out_dtype=torch.float32, config=dict(cfg, UNROLL=1))
            for u in (2, 4):
                got = fp8_block_gemm(qa, sa, qb, sb, out_dtype=torch.float32, config=dict(cfg, UNROLL=u))
                assert torch.equal(got.view(torch.int32), one.view(torch.int32)), (M, K, cfg, u)


@pytest.mark.parametrize("M", [17, 32, 33, 64])
def test_decode_defaults_within_bound(mode, device, M):
    """The shape's own default (config=None) at M 17-64, N = K = 4096: the split kernel with a
    32-token tile (M 17-32) and the kernel without split-K at BN 64 with UNROLL 4 (M 33-64); within the bound
    of the float64 product and the same bits from call to call."""
    if mode == "interp":
        pytest.skip("Gluon has no interpreter")
    need_hopper(device)
    _, qa, sa, qb, sb = operands(11, M, 4096, 4096, device)
    ref = fp8_block_gemm_ref(qa, sa, qb, sb, torch.float64)
    c = fp8_block_gemm(qa, sa, qb, sb)
    assert rel(c, ref) < BOUND, rel(c, ref)
    assert torch.equal(fp8_block_gemm(qa, sa, qb, sb), c)


@pytest.mark.parametrize("split", [2, 5, 9])
def test_split_k_sums_the_splits_in_order(mode, device, split):
    """With an fp32 output the split-K kernel's result is exactly the fp32 sum, in split order 0, 1, ..., of
    the one-split kernel run on each split's K-range (the same per-block folds): the reduce adds every
    partial once, in a fixed order, also past four splits (where it loads four at a time)."""
    if mode == "interp":
        pytest.skip("Gluon has no interpreter")
    need_hopper(device)
    M, N, K = 5, 320, 1152  # 9 K-blocks: split 2 -> 5 + 4 blocks, 5 -> 2 x 4 + 1, 9 -> one each
    _, qa, sa, qb, sb = operands(10, M, N, K, device)
    cfg = dict(kernel="wgmma_small_m", SPLIT_K=split)
    got = fp8_block_gemm(qa, sa, qb, sb, out_dtype=torch.float32, config=cfg)
    assert torch.equal(fp8_block_gemm(qa, sa, qb, sb, out_dtype=torch.float32, config=cfg), got)  # counters reset
    kb_per = -(-9 // split)
    want = None
    for lo in range(0, 9, kb_per):
        hi = min(lo + kb_per, 9)
        part = fp8_block_gemm(qa[:, lo * 128:hi * 128].contiguous(), sa[:, lo:hi].contiguous(),
                              qb[:, lo * 128:hi * 128].contiguous(), sb[:, lo:hi].contiguous(),
                              out_dtype=torch.float32, config=dict(cfg, SPLIT_K=1))
        want = part if want is None else want + part
    assert torch.equal(got.view(torch.int32), want.view(torch.int32)), (split, (got - want).abs().max().item())


def test_wgmma_small_m_fnuz_and_fp32_out(mode, device):
    if mode == "interp":
        pytest.skip("Gluon has no interpreter")
    need_hopper(device)
    M, N, K = 7, 512, 1024
    _, qa, sa, _, _ = operands(4, M, N, K, device, "e4m3fnuz")
    _, _, _, qb, sb = operands(5, M, N, K, device, "e4m3fnuz")
    ref = fp8_block_gemm_ref(qa, sa, qb, sb, torch.float64)
    c = fp8_block_gemm(qa, sa, qb, sb, out_dtype=torch.float32, config=dict(kernel="wgmma_small_m", SPLIT_K=2))
    assert c.dtype == torch.float32 and rel(c, ref) < 2e-4, rel(c, ref)  # no bf16 rounding (~1e-3)


def test_wgmma_small_m_long_k(mode, device):
    """K = 53248 (a 405B down projection): the decode kernels stage every K-block's scales of a program; the
    split kernel now splits K so that they stay within SCALES_MAX and the stages plus scales fit shared memory
    (OutOfResources before that fix), and the kernel without split-K refuses K > 16384."""
    if mode == "interp":
        pytest.skip("Gluon has no interpreter")
    need_hopper(device)
    for M, K in [(16, 53248), (64, 53248), (64, 18432)]:
        _, qa, sa, qb, sb = operands(7, M, 256, K, device)
        ref = fp8_block_gemm_ref(qa, sa, qb, sb, torch.float64)
        for cfg in [None, dict(kernel="wgmma_small_m", SPLIT_K=1),
                    dict(kernel="wgmma_small_m", BN=128, num_warps=8, SPLIT_K=1, num_stages=8)]:
            c = fp8_block_gemm(qa, sa, qb, sb, config=cfg)
            assert rel(c, ref) < BOUND, (M, K, cfg, rel(c, ref))
    _, qa, sa, qb, sb = operands(8, 64, 256, 18432, device)
    with pytest.raises(ValueError, match="K=18432 is over 16384"):
        fp8_block_gemm(qa, sa, qb, sb, config=dict(kernel="wgmma_small_m", SWAP_AB=False, BN=32))


def test_default_with_a_one_byte_or_fp32_output(mode, device):
    """The default at M > 64 with an fp8 or fp32 output is not the Gluon prefill kernel (it stores bf16 /
    fp16 by TMA; an fp8 output raised ValueError there before that was fixed)."""
    if mode == "interp":
        pytest.skip("GPU defaults")
    M, N, K = 256, 512, 1024
    _, qa, sa, qb, sb = operands(9, M, N, K, device)
    ref = fp8_block_gemm_ref(qa, sa, qb, sb, torch.float64)
    c32 = fp8_block_gemm(qa, sa, qb, sb, out_dtype=torch.float32)
    assert rel(c32, ref) < 2e-4
    c8 = fp8_block_gemm(qa, sa, qb, sb, out_dtype=torch.float8_e4m3fn)
    assert c8.dtype == torch.float8_e4m3fn and rel(c8.float(), ref) < 0.07  # e4m3's 3 mantissa bits


def test_split_k_under_cuda_graph_capture(mode, device):
    """The split-K decode kernel's tile counters: the first call on a stream inside CUDA-graph capture must
    not leave an unzeroed buffer behind for eager calls (the zeroing is only recorded); the graph replays
    right, and eager calls on that stream after the capture are right too."""
    if mode == "interp":
        pytest.skip("CUDA graphs")
    need_hopper(device)
    M, N, K = 16, 4096, 4096
    _, qa, sa, qb, sb = operands(10, M, N, K, device)
    ref = fp8_block_gemm_ref(qa, sa, qb, sb, torch.float64)
    fp8_block_gemm(qa, sa, qb, sb)  # compiled (and its counters made) on the default stream, not on `stream`
    stream = torch.cuda.Stream()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.stream(stream):
        with torch.cuda.graph(graph, stream=stream):
            out = fp8_block_gemm(qa, sa, qb, sb)
        for _ in range(3):  # eager on the capture's stream before any replay
            assert rel(fp8_block_gemm(qa, sa, qb, sb), ref) < BOUND
    out.fill_(float("nan"))
    for _ in range(3):
        graph.replay()
        torch.cuda.synchronize()
        assert rel(out, ref) < BOUND
    assert F.default_gemm_config(M, N, K, gluon=True)["SPLIT_K"] == "auto"  # a split-K default indeed


def test_wgmma_refused_where_it_cannot_run(mode, device):
    """An explicit Gluon kernel that cannot run raises ValueError naming why; nothing is launched."""
    M, N, K = 80, 256, 256
    x, qa, sa, qb, sb = operands(6, M, N, K, device)
    for kernel in ("wgmma", "wgmma_small_m"):
        with pytest.raises(ValueError, match="pre-quantised A"):
            fp8_block_gemm_qa(x, qb, sb, config=dict(kernel=kernel))
    if not gluon_supported(device):
        for kernel, rows in (("wgmma", M), ("wgmma_small_m", 4)):
            with pytest.raises(ValueError, match=re.escape(gluon_problem(device))):  # the device or the Triton
                fp8_block_gemm(qa[:rows], sa[:rows], qb, sb, config=dict(kernel=kernel))
        return
    with pytest.raises(ValueError, match="token tile"):
        fp8_block_gemm(qa, sa, qb, sb, config=dict(kernel="wgmma_small_m"))  # M = 80 > 64
    with pytest.raises(ValueError, match="2-byte output"):
        fp8_block_gemm(qa, sa, qb, sb, out_dtype=torch.float32, config=dict(kernel="wgmma"))
    with pytest.raises(ValueError, match="BM 64 or 128"):
        fp8_block_gemm(qa, sa, qb, sb, config=dict(kernel="wgmma", WS=0, BM=256))
    with pytest.raises(ValueError, match="WS=2 splits a 128-row tile"):
        fp8_block_gemm(qa, sa, qb, sb, config=dict(kernel="wgmma", BM=64, num_warps=4))
    with pytest.raises(ValueError, match="BN 64 or 128"):
        fp8_block_gemm(qa[:4], sa[:4], qb, sb, config=dict(kernel="wgmma_small_m", BN=32))


def test_wgmma_config_checks_on_any_device():
    """Config values no Gluon kernel can run are refused before any device check or launch."""
    base = dict(BM=128, BN=128, GROUP_M=8, num_warps=8, num_stages=4)
    with pytest.raises(ValueError, match="BM / 16 warps"):
        F._check_config(dict(base, kernel="wgmma", num_warps=4))
    with pytest.raises(ValueError, match="SPLIT_K"):
        F._check_config(dict(F.WGMMA_SMALL_M_DEFAULT, SPLIT_K=0))
    with pytest.raises(ValueError, match="token tile"):
        F._check_config(dict(F.WGMMA_SMALL_M_DEFAULT, BM=128))
    with pytest.raises(ValueError, match="WS=3"):
        F._check_config(dict(F.WGMMA_DEFAULT, WS=3))
    with pytest.raises(ValueError, match="MODE=2 does not exist with WS=2"):
        F._check_config(dict(F.WGMMA_DEFAULT, MODE=2))
    with pytest.raises(ValueError, match="MODE=1 does not exist with WS=1"):
        F._check_config(dict(F.WGMMA_DEFAULT, WS=1, MODE=1))
    with pytest.raises(ValueError, match="ROTATE"):
        F._check_config(dict(F.WGMMA_SMALL_M_DEFAULT, ROTATE="yes"))
    for u in (0, 3, 8, "2", True, 2.0):
        with pytest.raises(ValueError, match="UNROLL"):
            F._check_config(dict(F.WGMMA_SMALL_M_DEFAULT, UNROLL=u))
    for u in (1, 2, 4):
        F._check_config(dict(F.WGMMA_SMALL_M_DEFAULT, UNROLL=u))
        F._check_config(dict(F.WGMMA_SMALL_M_DEFAULT, SWAP_AB=False, BN=32, UNROLL=u))
    for regs in (16, 216, 228, 264):
        with pytest.raises(ValueError, match="CONSUMER_REGS"):
            F._check_config(dict(F.WGMMA_DEFAULT, CONSUMER_REGS=regs))
    for regs in (224, 256):
        F._check_config(dict(F.WGMMA_DEFAULT, CONSUMER_REGS=regs))
    F._check_config(dict(F.WGMMA_DEFAULT))
    F._check_config(dict(F.WGMMA_SMALL_M_DEFAULT))
    F._check_config(dict(F.WGMMA_DEFAULT, WS=1, MODE=2))


def test_wgmma_num_stages_is_bounded():
    """WS=1 / 2 pass num_stages to STAGES uncapped (only WS=0 is capped at K/128): a static_range of that length
    and [STAGES, 128, 128] buffers. 10**9 passes _check_config (compile hang / OutOfResources on the GPU)."""
    with pytest.raises(ValueError, match="num_stages"):
        F._check_config(dict(F.WGMMA_DEFAULT, num_stages=10**9))


@pytest.mark.parametrize("regs", [24, 128, 216])
def test_consumer_regs_leave_a_valid_budget_for_the_default_partition(regs):
    """WS=2 runs at maxnreg 168 with 3 warpgroups (default consumer, worker consumer, producer padded to a
    warpgroup at 24): Triton's AllocateWarpGroups gives the default partition 168 + (168 - regs) + (168 - 24)
    = 480 - regs, which must be <= 256 (setmaxnreg's range): regs >= 224. _check_config allowed [24, 256]."""
    assert 480 - regs > 256
    with pytest.raises(ValueError, match="CONSUMER_REGS"):
        F._check_config(dict(F.WGMMA_DEFAULT, CONSUMER_REGS=regs))


@pytest.mark.parametrize("bad", [dict(WS=2.0), dict(WS=1.0, MODE=2.0), dict(WS=True), dict(MODE=False, WS=0)])
def test_ws_and_mode_must_be_ints(bad):
    """num_stages / PROGRAMS / GROUP_M reject floats and bools; WS and MODE accept 2.0, True, False."""
    with pytest.raises((ValueError, TypeError), match="WS|MODE"):
        F._check_config(dict(F.WGMMA_DEFAULT, BM=128, num_warps=8, **bad))


@pytest.mark.parametrize("rot", ["no", "False", -1, 2.5])
def test_rotate_must_be_a_bool(rot):
    """ROTATE is launched as bool(cfg.get("ROTATE")): ROTATE="False" or "no" rotates."""
    with pytest.raises((ValueError, TypeError), match="ROTATE"):
        F._check_config(dict(F.WGMMA_SMALL_M_DEFAULT, ROTATE=rot))


@pytest.mark.parametrize("kernel", ["wgmma", "wgmma_small_m"])
def test_missing_scales_raise_a_named_error(kernel):
    """sa=None / sb=None reach ``t.dtype`` / ``sb.shape``: AttributeError instead of an error naming sa / sb."""
    _, qa, sa, qb, sb = fp8_operands(1, 8, 256, 256, "cpu")
    with pytest.raises((ValueError, TypeError), match="sa"):
        F.fp8_block_gemm(qa, None, qb, sb, config=dict(kernel=kernel))
    with pytest.raises((ValueError, TypeError), match="sb"):
        F.fp8_block_gemm(qa, sa, qb, None, config=dict(kernel=kernel))


@pytest.mark.parametrize("u", ["2", 2.5, 3, 0, -4, 8, True])
def test_launch_unroll_refuses_what_the_kernels_cannot_run(u):
    """_unroll cast UNROLL with int(): "2" and 2.5 became 2, 3 / 0 / -4 / 8 passed to the kernels, whose
    loop knows 1, 2 and 4 only (3 folded the wrong blocks; 0 built a kernel without a wgmma). A direct
    launch_small_m_wgmma / launch_rows_wgmma call skips fp8._check_config."""
    with pytest.raises(ValueError, match="UNROLL"):
        W._unroll(dict(UNROLL=u), 8)


def test_unroll_capped_at_the_stages():
    """The launch halves UNROLL until the ring holds a group's K-blocks (the refills go to the stages a group
    read): pure Python, any device."""
    from kernels.fp8.wgmma import _unroll
    assert [_unroll(dict(UNROLL=4), s) for s in (1, 2, 3, 4, 8)] == [1, 2, 2, 4, 4]
    assert [_unroll(dict(UNROLL=2), s) for s in (1, 2)] == [1, 2]
    assert _unroll({}, 8) == 1


@pytest.mark.parametrize("version, ok", [("3.4.0", False), ("3.5.0", True), ("3.6.0", True), ("3.8.1", True),
                                         ("3.9.0", False), ("3.10.0+git1234", False), ("4.0.0", False)])
def test_gluon_needs_a_triton_with_its_tma_api(monkeypatch, version, ok):
    """Triton 3.9 renamed Gluon's TMA copies (the old names raise RuntimeError when a kernel compiles), and the
    project pins 3.9 on the CPU: on a Hopper GPU with it the default path picked these kernels and failed to
    compile every call. gluon_supported now checks the version (on a faked Hopper device here) and an explicit
    request says why."""
    import triton

    import kernels.fp8.wgmma as W
    monkeypatch.setattr(triton, "__version__", version)
    monkeypatch.setattr(W, "HAVE_GLUON", True)
    monkeypatch.setattr(torch.version, "hip", None, raising=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    assert W.gluon_supported("cuda:0") == ok
    if not ok:
        assert f"this is {version}" in W.gluon_problem("cuda:0")


def test_gluon_supported_is_false_on_rocm(monkeypatch):
    """ROCm reports gfx9xx as compute capability 9.x (MI300X: (9, 4), MI250: (9, 0)); gluon_supported then says
    True, so _gemm's default (M <= 64, pre-quantised A) picks the Hopper-only wgmma_small_m kernel there.
    tma_supported excludes ROCm (torch.version.hip); gluon_supported does not."""
    monkeypatch.setattr(torch.version, "hip", "6.2.41133", raising=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 4))
    monkeypatch.setattr(W, "HAVE_GLUON", True)
    monkeypatch.setattr(F, "_interpreting", lambda: False)
    assert not F.tma_supported("cuda:0")  # the existing rule
    assert not W.gluon_supported("cuda:0")  # was True on an MI300X


def test_default_selection(monkeypatch):
    """Which kernel the shape gets on a Hopper GPU with Gluon (gluon=True: _gemm passes it there), and that
    without Gluon nothing changes (the Triton kernels' table); every default config passes _check_config. The
    GPU's table, also under the interpreter (which otherwise picks its own small tiles)."""
    monkeypatch.setattr(F, "_interpreting", lambda: False)
    want = {1: ("wgmma_small_m", True, 16), 16: ("wgmma_small_m", True, 16), 17: ("wgmma_small_m", True, 32),
            32: ("wgmma_small_m", True, 32), 33: ("wgmma_small_m", False, 64), 64: ("wgmma_small_m", False, 64)}
    for M, (kernel, swap, bm) in want.items():
        cfg = F.default_gemm_config(M, 4096, 4096, tma=True, gluon=True)
        F._check_config(cfg)
        assert (cfg["kernel"], cfg.get("SWAP_AB", True), cfg["BM"]) == (kernel, swap, bm), (M, cfg)
    assert F.default_gemm_config(32, 4096, 4096, tma=True, gluon=True)["SPLIT_K"] == "auto"
    assert (F.default_gemm_config(64, 4096, 4096, tma=True, gluon=True)["BN"],
            F.default_gemm_config(64, 4096, 4096, tma=True, gluon=True)["UNROLL"]) == (64, 4)
    long_k = F.default_gemm_config(64, 4096, 32768, tma=True, gluon=True)  # the no-split kernel stages every
    assert long_k.get("SWAP_AB", True) and long_k["SPLIT_K"] == 1          # K-block's scales: K <= 16384
    assert F.default_gemm_config(4096, 4096, 4096, tma=True, gluon=True) == F.WGMMA_DEFAULT
    # few tiles (M = 65-256 at N = 4096, 65-128 at N = 8192): 64-column tiles; 128 tiles and more: 128
    for M, N, bn in ((65, 4096, 64), (256, 4096, 64), (128, 8192, 64), (256, 8192, 128), (257, 4096, 128)):
        assert F.default_gemm_config(M, N, 4096, tma=True, gluon=True) == dict(F.WGMMA_DEFAULT, BN=bn), (M, N)
    # no 2-byte TMA-addressable output: the tile kernel; the fused quant never takes a Gluon kernel
    assert F.default_gemm_config(4096, 4096, 4096, tma=False, gluon=True)["kernel"] == "tile"
    assert F.default_gemm_config(4096, 4096, 4096, quant_a=True, tma=True, gluon=True)["kernel"] == "tile"
    assert F.default_gemm_config(8, 4096, 4096, quant_a=True, tma=True, gluon=True)["kernel"] == "tile"
    for M in (1, 16, 64, 65, 4096):
        assert "wgmma" not in F.default_gemm_config(M, 4096, 4096, tma=True)["kernel"]

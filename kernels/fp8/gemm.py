"""The block-scaled fp8 GEMM: its Triton kernels (tile, TMA, small-M split-K), the config table, the dispatch to
the Gluon kernels of :mod:`kernels.fp8.wgmma`, and ``fp8_block_gemm`` / ``fp8_block_gemm_qa`` /
``fp8_quant_then_gemm`` (the package docstring, kernels/fp8/__init__.py, gives the math)."""
from __future__ import annotations

import torch

from kernels._util import _interpreting
from kernels.fp8.common import FP8_DTYPE, FP8_MAX, GROUP, _check_x, _fmt, _fmt_of
from kernels.fp8.quant import _quant_tile, fp8_quant_group
from kernels.target import Target, target_of

try:  # the references work without Triton
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover
    triton = None
    tl = None


if triton is not None:

    @triton.jit
    def _load_a(a, sa, qa_out, sa_out, offs_m, mm, offs_k, kb, a_ptrs, ssam, sqm, ssqm, do_store,
                QUANT_A: tl.constexpr, STORE_A: tl.constexpr, FMAX: tl.constexpr, A_FNUZ: tl.constexpr,
                RNE_FIX: tl.constexpr, FAST_DIV: tl.constexpr):
        """The [BM, 128] A operand of K-block kb (e4m3fn; fnuz bits read as e4m3fn are twice the value: the
        caller's half_a undoes it) and its row scales [BM]: loaded, or quantised here from bf16/fp16/fp32."""
        if QUANT_A:
            xt = tl.load(a_ptrs, mask=mm[:, None], other=0.0).to(tl.float32)
            qa, sca, bits = _quant_tile(xt, FMAX, A_FNUZ, RNE_FIX, FAST_DIV)
            if STORE_A:
                if do_store:
                    tl.store(qa_out + offs_m[:, None].to(tl.int64) * sqm + kb * 128 + offs_k[None, :], bits,
                             mask=mm[:, None])
                    tl.store(sa_out + offs_m * ssqm + kb, sca, mask=mm)
        else:
            qa = tl.load(a_ptrs, mask=mm[:, None], other=0).to(tl.float8e4nv, bitcast=True)
            sca = tl.load(sa + offs_m * ssam + kb, mask=mm, other=0.0)
        return qa, sca

    @triton.jit
    def _swizzle_tile(tile, num_m, num_n, GROUP_M: tl.constexpr):
        """(pid_m, pid_n) of output tile ``tile`` (int32 scalar) in GROUP_M-swizzled order: GROUP_M row tiles
        share each column tile in turn, so their B blocks are reused from L2 (Triton's matmul tutorial order).
        num_m / num_n: the row / column tile counts."""
        group = GROUP_M * num_n
        first_m = (tile // group) * GROUP_M
        gsize = tl.minimum(num_m - first_m, GROUP_M)
        return first_m + (tile % group) % gsize, (tile % group) // gsize

    @triton.jit
    def _block_gemm_kernel(
        a, sa, b, sb, c, qa_out, sa_out, M, N, K,
        sam, ssam, sbn, ssbn, scm, sqm, ssqm,
        BM: tl.constexpr, BN: tl.constexpr, GROUP_M: tl.constexpr, KPI: tl.constexpr,
        QUANT_A: tl.constexpr, STORE_A: tl.constexpr, FMAX: tl.constexpr, A_FNUZ: tl.constexpr,
        HALF: tl.constexpr, RNE_FIX: tl.constexpr, FAST_DIV: tl.constexpr,
    ):
        # Prefill tiles [BM, BN]. grid: (cdiv(M, BM) * cdiv(N, BN),), GROUP_M-swizzled for L2 reuse.
        # BN divides 128 (one weight-scale per program and K-block) or is a multiple of 128 (a [BN] vector).
        # KPI K-blocks per loop iteration: their dots are issued before the first scale-FMA waits on its own,
        # so one block's fp32 scaling overlaps the next block's MMA.
        pid_m, pid_n = _swizzle_tile(tl.program_id(0), tl.cdiv(M, BM), tl.cdiv(N, BN), GROUP_M)
        offs_m = pid_m * BM + tl.arange(0, BM)
        offs_n = pid_n * BN + tl.arange(0, BN)
        offs_k = tl.arange(0, 128)
        mm = offs_m < M
        nm = offs_n < N
        a_rows = a + offs_m[:, None].to(tl.int64) * sam + offs_k[None, :]
        b_cols = b + offs_n[None, :].to(tl.int64) * sbn + offs_k[:, None]
        if BN <= 128:
            sb_ptr = sb + ((pid_n * BN) // 128) * ssbn
        else:
            sb_ptr = sb + (offs_n // 128) * ssbn
        acc = tl.zeros((BM, BN), dtype=tl.float32)
        for kb0 in range(0, K // 128, KPI):
            # KPI == 2: both blocks' operands, then both dots, then both scale-FMAs (order matters, see above)
            qa0, sa0 = _load_a(a, sa, qa_out, sa_out, offs_m, mm, offs_k, kb0, a_rows, ssam, sqm, ssqm,
                               pid_n == 0, QUANT_A, STORE_A, FMAX, A_FNUZ, RNE_FIX, FAST_DIV)
            qb0 = tl.load(b_cols, mask=nm[None, :], other=0).to(tl.float8e4nv, bitcast=True)
            if BN > 128:
                sb0 = tl.load(sb_ptr + kb0, mask=nm, other=0.0)
            else:
                sb0 = tl.load(sb_ptr + kb0)
            if KPI == 2:
                qa1, sa1 = _load_a(a, sa, qa_out, sa_out, offs_m, mm, offs_k, kb0 + 1, a_rows + 128, ssam, sqm,
                                   ssqm, pid_n == 0, QUANT_A, STORE_A, FMAX, A_FNUZ, RNE_FIX, FAST_DIV)
                qb1 = tl.load(b_cols + 128, mask=nm[None, :], other=0).to(tl.float8e4nv, bitcast=True)
                if BN > 128:
                    sb1 = tl.load(sb_ptr + kb0 + 1, mask=nm, other=0.0)
                else:
                    sb1 = tl.load(sb_ptr + kb0 + 1)
                d0 = tl.dot(qa0, qb0)
                d1 = tl.dot(qa1, qb1)
                acc += d0 * ((sa0 * HALF)[:, None] * sb0)
                acc += d1 * ((sa1 * HALF)[:, None] * sb1)
            else:
                acc += tl.dot(qa0, qb0) * ((sa0 * HALF)[:, None] * sb0)
            a_rows += 128 * KPI
            b_cols += 128 * KPI
        tl.store(c + offs_m[:, None].to(tl.int64) * scm + offs_n[None, :], acc.to(c.dtype.element_ty),
                 mask=mm[:, None] & nm[None, :])

    @triton.jit
    def _block_gemm_tma_kernel(
        a_desc, b_desc, c_desc, sa, sb, M, N, K, ssam, ssbn, programs,
        BM: tl.constexpr, BN: tl.constexpr, GROUP_M: tl.constexpr, KPI: tl.constexpr, HALF: tl.constexpr,
    ):
        """The pre-quantised prefill GEMM with its tiles moved by TMA. Tensor descriptors: a_desc over A [M, K]
        e4m3fn in blocks [BM, 128], b_desc over B [N, K] e4m3fn in [BN, 128], c_desc over C [M, N] in [BM, BN]
        (rows past M or N read as zeros and are not written). sa [M, K/128] fp32 (row stride ssam) and
        sb [ceil(N/128), K/128] fp32 (row stride ssbn) are the block scales, HALF the fnuz correction (see
        _gemm). A persistent grid of ``programs`` programs walks the GROUP_M-swizzled output tiles; KPI K-blocks
        a turn (2 needs an even K/128: the host passes 1 otherwise). BN divides 128 (one weight scale per tile
        and K-block). The per-K-block sums and scale-FMAs are _block_gemm_kernel's, in the same order, so the
        two are bit-identical (tests/kernels/fp8/test_tma.py).
        Why: the pointer-based tile kernel spends registers and issue slots on [BM, 128] pointer blocks, and
        its loads are not TMA. On the H200 this kernel reaches ~0.65 of _scaled_mm's throughput at 4096^3
        against the tile kernel's ~0.42 in the same sweep (2026-12-01; docs/kernels/fp8.md)."""
        num_m = tl.cdiv(M, BM)
        num_n = tl.cdiv(N, BN)
        for tile in tl.range(tl.program_id(0), num_m * num_n, programs, flatten=True):
            pid_m, pid_n = _swizzle_tile(tile, num_m, num_n, GROUP_M)
            om = pid_m * BM
            on = pid_n * BN
            offs_m = om + tl.arange(0, BM)
            mm = offs_m < M
            p_sa = sa + offs_m * ssam
            p_sb = sb + (on // 128) * ssbn
            acc = tl.zeros((BM, BN), dtype=tl.float32)
            for kb in range(0, K // 128, KPI):
                # KPI == 2: both blocks' dots issued before the first scale-FMA (as _block_gemm_kernel)
                a0 = a_desc.load([om, kb * 128])
                b0 = b_desc.load([on, kb * 128])
                s0 = tl.load(p_sa + kb, mask=mm, other=0.0) * HALF * tl.load(p_sb + kb)
                if KPI == 2:
                    a1 = a_desc.load([om, kb * 128 + 128])
                    b1 = b_desc.load([on, kb * 128 + 128])
                    s1 = tl.load(p_sa + kb + 1, mask=mm, other=0.0) * HALF * tl.load(p_sb + kb + 1)
                    d0 = tl.dot(a0, b0.T)
                    d1 = tl.dot(a1, b1.T)
                    acc += d0 * s0[:, None]
                    acc += d1 * s1[:, None]
                else:
                    acc += tl.dot(a0, b0.T) * s0[:, None]
            c_desc.store([om, on], acc.to(c_desc.dtype))

    @triton.jit
    def _small_m_kernel(
        a, sa, b, sb, c, ws, lock, qa_out, sa_out, M, N, K, KB_PER, SPLIT_K,
        sam, ssam, sbn, ssbn, scm, sqm, ssqm,
        BM: tl.constexpr, BN: tl.constexpr, REDUCE: tl.constexpr,
        QUANT_A: tl.constexpr, STORE_A: tl.constexpr, FMAX: tl.constexpr, A_FNUZ: tl.constexpr,
        HALF: tl.constexpr, RNE_FIX: tl.constexpr, FAST_DIV: tl.constexpr,
    ):
        # Decode (small M), swap-AB: each program computes out^T tile [BN, BM] = W[BN, K range] @ A[BM, K range]^T
        # so the weight rows fill the wgmma's M (>= 64) and the few tokens its N (>= 16): on sm_90 an fp8 dot
        # with a 16-row A would fall back to mma.sync with both operands upcast to fp16.
        # grid: (cdiv(N, BN), SPLIT_K, cdiv(M, BM)); split pid_k owns K-blocks [pid_k KB_PER, +KB_PER). SPLIT_K
        # is a runtime int (no recompile per split count).
        # REDUCE 0: SPLIT_K == 1, store out directly. 1: store the fp32 partial in ws [SPLIT_K, M, N]
        # (_splitk_reduce_kernel sums it). 2: same, then the last-arriving split of a tile (an acq_rel counter
        # per tile in lock, reset by that program) sums ws in split order 0..SPLIT_K-1 itself: one launch,
        # deterministic; lock must start zeroed and not be shared by concurrent launches.
        pid_n = tl.program_id(0)
        pid_k = tl.program_id(1)
        pid_m = tl.program_id(2)
        offs_n = pid_n * BN + tl.arange(0, BN)
        offs_m = pid_m * BM + tl.arange(0, BM)
        offs_k = tl.arange(0, 128)
        nm = offs_n < N
        mm = offs_m < M
        kb_lo = pid_k * KB_PER
        kb_hi = tl.minimum(kb_lo + KB_PER, K // 128)
        a_rows = a + offs_m[:, None].to(tl.int64) * sam + kb_lo * 128 + offs_k[None, :]
        w_rows = b + offs_n[:, None].to(tl.int64) * sbn + kb_lo * 128 + offs_k[None, :]
        if BN <= 128:
            sb_ptr = sb + ((pid_n * BN) // 128) * ssbn
        else:
            sb_ptr = sb + (offs_n // 128) * ssbn
        acc = tl.zeros((BN, BM), dtype=tl.float32)
        for kb in range(kb_lo, kb_hi):
            qa, sca = _load_a(a, sa, qa_out, sa_out, offs_m, mm, offs_k, kb, a_rows, ssam, sqm, ssqm,
                              pid_n == 0, QUANT_A, STORE_A, FMAX, A_FNUZ, RNE_FIX, FAST_DIV)
            w = tl.load(w_rows, mask=nm[:, None], other=0).to(tl.float8e4nv, bitcast=True)
            if BN <= 128:
                scb = tl.load(sb_ptr + kb)
                acc += tl.dot(w, tl.trans(qa)) * (scb * (sca * HALF)[None, :])
            else:
                scb = tl.load(sb_ptr + kb, mask=nm, other=0.0)
                acc += tl.dot(w, tl.trans(qa)) * (scb[:, None] * (sca * HALF)[None, :])
            a_rows += 128
            w_rows += 128
        omask = nm[:, None] & mm[None, :]
        if REDUCE == 0:
            tl.store(c + offs_m[None, :].to(tl.int64) * scm + offs_n[:, None], acc.to(c.dtype.element_ty), mask=omask)
        else:
            MN = M * N
            tile = offs_m[None, :].to(tl.int64) * N + offs_n[:, None]
            tl.store(ws + pid_k * MN + tile, acc, mask=omask)
            if REDUCE == 2:
                tl.debug_barrier()  # every thread's partial is issued before the (one-thread) release below
                tid = pid_m * tl.num_programs(0) + pid_n
                prev = tl.atomic_add(lock + tid, 1, sem="acq_rel", scope="gpu")
                if prev == SPLIT_K - 1:
                    tot = tl.load(ws + tile, mask=omask, other=0.0, cache_modifier=".cg")  # .cg: from L2, not L1
                    for s in range(1, SPLIT_K):
                        tot += tl.load(ws + s * MN + tile, mask=omask, other=0.0, cache_modifier=".cg")
                    tl.store(c + offs_m[None, :].to(tl.int64) * scm + offs_n[:, None], tot.to(c.dtype.element_ty),
                             mask=omask)
                    tl.atomic_xchg(lock + tid, 0, sem="relaxed", scope="gpu")  # ready for the next launch

    @triton.jit
    def _splitk_reduce_kernel(ws, c, M, N, scm, SPLIT_K, BLOCK: tl.constexpr):
        # out[m, n] = sum_{s = 0..SPLIT_K-1} ws[s, m, n] in that order (deterministic), cast to out's dtype.
        offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
        MN = M * N
        msk = offs < MN
        tot = tl.load(ws + offs, mask=msk, other=0.0)
        for s in range(1, SPLIT_K):
            tot += tl.load(ws + s * MN + offs, mask=msk, other=0.0)
        tl.store(c + (offs // N) * scm + offs % N, tot.to(c.dtype.element_ty), mask=msk)


# Config table (H200, 132 SMs). "small_m": the swap-AB split-K kernel, "tile": the [BM, BN] prefill kernel.
# Keys of a config: kernel; BM, BN, num_warps, num_stages; tile: GROUP_M, KPI (K-blocks per iteration);
# small_m: SPLIT_K ("auto": enough programs for WAVES waves of the SMs), REDUCE (1: second kernel, 2: last
# split reduces; see _small_m_kernel); both: FAST_DIV (fused quant's division, bit-identical either way).
SMALL_M_MAX = 64
NUM_SMS = 132
WAVES = 4
TILE_DEFAULT = dict(kernel="tile", BM=128, BN=128, GROUP_M=8, KPI=1, num_warps=8, num_stages=3, FAST_DIV=True)
# AMD (ROCm) prefill tiles, M > 64, by wave size: 64 KiB of LDS a workgroup on gfx1201 and gfx942 alike, a
# quarter of the H200's. TILE_DEFAULT there asks for 128 KiB (Triton refuses the launch: OutOfResources) and
# spills 132 (gfx1201) / 86 (gfx942) VGPRs. Chosen by compiling candidates for each target with no card at hand
# (benchmarks/portability: registers, spills and LDS read from the built hsaco, Triton 3.9.0): the largest tile
# that builds with no VGPR spill, two stages (one K-block loaded while the previous one's MMA runs: the least
# that overlaps, and the conservative pick where only the card can tell which depth is faster; docs/kernels/
# portability.md, "What only the card can settle"). Pre-quantised A: 128 x 128, 8 warps, one K-block a turn
# (two spill 4 VGPRs on gfx1201): 32 KiB of LDS, 234 VGPRs on gfx1201, 167 on gfx942. Quant in the A-load:
# 128 x 128 spills 103 VGPRs on gfx1201, so 64 x 128 there (24 KiB, 193 VGPRs); 128 x 128 on gfx942 (48 KiB,
# 227 VGPRs with its AGPRs).
# Keyed by (wave size, whether the matrix instructions take e4m3fn): (32, True) is gfx12 (RDNA4: WMMA fp8),
# (64, False) gfx942 (CDNA3: the dot upcast to fp16 MFMAs). Another AMD target (gfx950: wave64 with fp8 MFMAs
# and 160 KiB of LDS; gfx11: wave32 without fp8 WMMA) has no row: no tile was checked there.
AMD_TILE_PREFILL = {(32, True): dict(kernel="tile", BM=128, BN=128, GROUP_M=8, KPI=1, num_warps=8, num_stages=2,
                                     FAST_DIV=True),
                    (64, False): dict(kernel="tile", BM=128, BN=128, GROUP_M=8, KPI=1, num_warps=8, num_stages=2,
                                      FAST_DIV=True)}
AMD_TILE_PREFILL_QA = {(32, True): dict(AMD_TILE_PREFILL[(32, True)], BM=64),
                       (64, False): dict(AMD_TILE_PREFILL[(64, False)])}
# "tma": _block_gemm_tma_kernel, pre-quantised A on a GPU with TMA (compute capability 9+, not ROCm); keys as
# "tile" plus PROGRAMS (the persistent grid; default the device's SM count)
TMA_DEFAULT = dict(kernel="tma", BM=128, BN=128, GROUP_M=8, KPI=2, num_warps=8, num_stages=3)


def pick_split_k(M: int, N: int, K: int, BM: int, BN: int, waves: int = WAVES, sms: int = NUM_SMS) -> int:
    """Splits of K for the small-M kernel: about ``waves * sms`` programs, never an empty split."""
    kb = K // GROUP
    tiles = triton.cdiv(N, BN) * triton.cdiv(M, BM)
    split = max(1, min(kb, round(waves * sms / max(tiles, 1))))
    return triton.cdiv(kb, triton.cdiv(kb, split))


def tma_supported(device) -> bool:
    """Whether _block_gemm_tma_kernel can run on ``device``: a CUDA GPU of compute capability 9 or more (TMA),
    not ROCm; or Triton's interpreter, which runs tensor descriptors on the CPU. A CPU tensor outside the
    interpreter (the portability gate's stand-in drivers compile for a target from CPU tensors) has what the
    target Triton compiles for has (:func:`kernels.target.target_of`)."""
    if _interpreting():
        return True
    device = torch.device(device)
    if device.type == "cpu":
        try:
            return target_of(device).tma
        except RuntimeError:  # no active Triton driver: nothing can launch here
            return False
    return (device.type == "cuda" and torch.version.hip is None
            and torch.cuda.get_device_capability(device)[0] >= 9)


KERNELS = ("tile", "tma", "small_m", "wgmma", "wgmma_small_m")
# "wgmma" / "wgmma_small_m": the Gluon kernels of kernels/fp8/wgmma.py (Hopper only, pre-quantised A; an
# explicit request elsewhere raises ValueError with the reason). Keys (KPI and FAST_DIV are not read):
# wgmma: BM, BN, GROUP_M, PROGRAMS as "tma"; num_stages the shared-memory stages of A and B (uncapped for
# WS 1 / 2: too many fail to build, OutOfResources); num_warps = BM / 16 (the consumer warps; WS=2 runs them
# as two partitions of 4 plus a producer warp whatever it says). WS: 0 (no warp specialisation; MODE 0 / 1
# / 2, see _block_gemm_wgmma_kernel), 1 (one producer warp, the consumers one partition; MODE 0 or 2), 2 (two
# consumer partitions of 64 rows: BM 128, MODE 0 only; the default). CONSUMER_REGS: WS=2's second consumer's
# register budget (setmaxnreg), a multiple of 8 in [24, 256], default 232.
# wgmma_small_m: BM the token tile (16, 32 or 64, at least M; follows M when not given), BN 64 or 128 weight
# rows a program (BN / 16 warps), SPLIT_K an int or "auto" (about PROGRAMS programs, default two per SM),
# num_stages K-blocks in flight a program (capped at its K-blocks and by shared memory), ROTATE (each N-tile's
# programs start at a different K-block; measured no faster); SWAP_AB=False: the kernel without split-K
# (_rows_wgmma_kernel: tokens padded to 64 on the wgmma's M side, BN 8..64 weight rows a program, 4 warps;
# the default for 32 < M <= 64). UNROLL (1, 2 or 4; both decode kernels): K-blocks whose wgmmas are issued
# back to back into their own accumulators before one wait, then folded in order (the same sums as 1; capped at
# the stages in flight). H200 figures: docs/kernels/fp8.md.
WGMMA_DEFAULT = dict(kernel="wgmma", BM=128, BN=128, GROUP_M=8, num_warps=8, num_stages=4, WS=2)
WGMMA_SMALL_M_DEFAULT = dict(kernel="wgmma_small_m", BM=16, BN=64, SPLIT_K="auto", num_warps=4, num_stages=4)


def _check_config(cfg: dict) -> None:
    """ValueError naming the key of a config (see the table above :data:`TILE_DEFAULT`) that no kernel can run:
    BM / BN / num_warps not a positive power of two, num_stages or GROUP_M not a positive int, PROGRAMS not
    None, 0 (the default: one program per SM) or a positive int, an unknown kernel, and the Gluon kernels' keys
    (WS, MODE, CONSUMER_REGS, SPLIT_K, ROTATE, SWAP_AB, UNROLL). KPI, REDUCE and the BN rules
    of each kernel are checked in _gemm."""
    def pos_int(v) -> bool:
        return isinstance(v, int) and not isinstance(v, bool) and v > 0

    if cfg.get("kernel") not in KERNELS:
        raise ValueError(f"unknown kernel {cfg.get('kernel')!r} (one of {', '.join(KERNELS)})")
    for key in ("BM", "BN", "num_warps"):
        v = cfg.get(key)
        if not pos_int(v) or v & (v - 1):
            raise ValueError(f"{key}={v!r} must be a positive power of two")
    if not pos_int(cfg.get("num_stages")) or cfg["num_stages"] > 32:
        raise ValueError(f"num_stages={cfg.get('num_stages')!r} must be a positive int, at most 32")
    if cfg["kernel"] in ("tile", "tma", "wgmma") and (not pos_int(cfg.get("GROUP_M")) or cfg["GROUP_M"] > 1024):
        raise ValueError(f"GROUP_M={cfg.get('GROUP_M')!r} must be a positive int, at most 1024 (rows of tiles a "
                         f"swizzle group; GROUP_M times the column tiles is an int32 in the kernels)")
    p = cfg.get("PROGRAMS")
    if cfg["kernel"] in ("tma", "wgmma", "wgmma_small_m") and p is not None and p != 0 and not pos_int(p):
        raise ValueError(f"PROGRAMS={p!r} must be a positive int, or None / 0 for one program per SM")
    u = cfg.get("UNROLL", 1)
    if cfg["kernel"] == "wgmma_small_m" and (type(u) is not int or u not in (1, 2, 4)):
        raise ValueError(f"UNROLL={u!r} must be the int 1, 2 or 4 (K-blocks' wgmmas in flight at once)")
    if cfg["kernel"] == "wgmma_small_m" and not cfg.get("SWAP_AB", True):
        if cfg["BN"] not in (8, 16, 32, 64) or cfg["num_warps"] != 4 or cfg["BM"] > 64:
            raise ValueError(f"wgmma_small_m with SWAP_AB=False needs BN 8, 16, 32 or 64, 4 warps and BM <= 64, "
                             f"got BN={cfg['BN']}, num_warps={cfg['num_warps']}, BM={cfg['BM']}")
    elif cfg["kernel"] == "wgmma_small_m":
        if cfg["BM"] not in (16, 32, 64):
            raise ValueError(f"BM={cfg['BM']} must be 16, 32 or 64 for wgmma_small_m (the token tile)")
        if cfg["BN"] not in (64, 128) or cfg["num_warps"] != cfg["BN"] // 16:
            raise ValueError(f"wgmma_small_m needs BN 64 or 128 with BN / 16 warps, got BN={cfg['BN']}, "
                             f"num_warps={cfg['num_warps']}")
        if not isinstance(cfg.get("ROTATE", False), bool) or not isinstance(cfg.get("SWAP_AB", True), bool):
            raise ValueError(f"ROTATE={cfg.get('ROTATE')!r} and SWAP_AB={cfg.get('SWAP_AB')!r} must be bools")
        sk = cfg.get("SPLIT_K", "auto")
        if sk != "auto" and not pos_int(sk):
            raise ValueError(f"SPLIT_K={sk!r} must be a positive int or 'auto'")
    if cfg["kernel"] == "wgmma":
        ws, mode = cfg.get("WS", 0), cfg.get("MODE", 0)
        if type(ws) is not int or type(mode) is not int or ws not in (0, 1, 2) or mode not in (0, 1, 2):
            raise ValueError(f"WS={ws!r} and MODE={mode!r} must each be the int 0, 1 or 2")
        if (ws == 2 and mode != 0) or (ws == 1 and mode == 1):
            raise ValueError(f"MODE={mode} does not exist with WS={ws} (WS=1: MODE 0 or 2; WS=2: MODE 0)")
        if ws == 2 and cfg["BM"] != 128:
            raise ValueError(f"WS=2 splits a 128-row tile between two consumer warpgroups, got BM={cfg['BM']}")
        cr = cfg.get("CONSUMER_REGS", 232)
        # WS=2 starts at maxnreg 168 over three warpgroups (the producer's padded): the default consumer gets
        # 3 * 168 - 24 - CONSUMER_REGS registers (Triton's warp-group allocation), at most setmaxnreg's 256
        if ws == 2 and (not pos_int(cr) or cr % 8 or not 224 <= cr <= 256):
            raise ValueError(f"CONSUMER_REGS={cr!r} must be a multiple of 8 in [224, 256] (the other consumer "
                             f"gets 480 - CONSUMER_REGS registers, at most 256)")
    if cfg["kernel"] == "wgmma" and (cfg["BM"] not in (64, 128) or cfg["BN"] not in (16, 32, 64, 128)
                                     or cfg["num_warps"] != cfg["BM"] // 16):
        raise ValueError(f"wgmma needs BM 64 or 128 with BM / 16 warps and BN dividing 128, got BM={cfg['BM']}, "
                         f"BN={cfg['BN']}, num_warps={cfg['num_warps']}")


def _tma_layout_problem(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor) -> str | None:
    """Why A [M, K], B [N, K] (fp8) and C [M, N] cannot be TMA tensors (16-byte aligned base and row stride),
    or None."""
    for name, t in (("a", a), ("b", b), ("out", c)):
        if t.data_ptr() % 16 or (t.stride(0) * t.element_size()) % 16:
            hint = f" (N = {c.shape[1]}: a multiple of {16 // t.element_size()})" if name == "out" else ""
            return (f"{name} needs a 16-byte aligned base and row stride for TMA (row stride "
                    f"{t.stride(0)} x {t.element_size()} bytes{hint})")
    return None


def default_gemm_config(M: int, N: int, K: int, quant_a: bool = False, a_itemsize: int = 2,
                        tma: bool = False, gluon: bool = False, target: Target | None = None) -> dict:
    """Tile config by shape and target (:class:`kernels.target.Target`: None or a CUDA target, the H200's table
    below; an AMD one, the same decode tiles and :data:`AMD_TILE_PREFILL` / :data:`AMD_TILE_PREFILL_QA` at
    M > 64, by its wave size and whether it has fp8 matrix instructions; a target with no row, or an LDS limit
    under 64 KiB, raises ValueError: no tile was checked there, and the vLLM dispatch hands such a call to
    vLLM's kernel). Under the interpreter small tiles. On a Hopper GPU with Triton's Gluon (``gluon``:
    _gemm passes it where A and B are TMA-addressable) and a pre-quantised A, the Gluon kernels of
    kernels/fp8/wgmma.py (H200, 2026-12-01; docs/kernels/fp8.md): M <=
    16 the swap-AB split-K decode kernel (:data:`WGMMA_SMALL_M_DEFAULT`), M <= 32 the same with a 32-token
    tile, M <= 64 with K <= 16384 the kernel without split-K (SWAP_AB=False, 64 weight rows a program, UNROLL
    4; longer K: the split kernel, one split), larger M with a 2-byte output (``tma``) the warp-specialised
    prefill kernel (:data:`WGMMA_DEFAULT`). Elsewhere (``gluon`` false: also Triton outside
    kernels.fp8.wgmma.GLUON_TRITON), the
    winners of the H200 sweep of 2026-11-29 (N = K = 4096 and 8192; docs/kernels/fp8.md):

    * M <= 64: the tile kernel at 16 x 32 (mma.sync; 18.6 us pre-quantised / 27.6 us fused at M=16, N=K=4096),
      faster there than every swap-AB split-K config tried (26.9-54.8 us): the small-M kernel stays available
      (``config=dict(kernel="small_m", ...)``) but is not the default. For M <= 16, two K-blocks a turn
      (KPI 2; pre-quantised A only: the fused quant runs KPI 1 on the GPU, see _gemm): by kernel time
      10.8 / 11.1 / 27.6 us at M = 1 / 16 x 4096^2 / 16 x 8192^2 against 13.7 / 14.5 / 35.6 with KPI 1, the
      fastest of the 4 tiles timed that way (2026-11-29);
    * larger M, pre-quantised A, bf16/fp16 output, where the device has TMA (``tma``: _gemm passes it, see
      :func:`tma_supported`): the TMA kernel
      (:data:`TMA_DEFAULT`: 128 x 128, 8 warps, 3 stages, two K-blocks a turn, a persistent grid of one program
      per SM): 825-874 TFLOP/s at 4096^3 / 8192^3 in the exploration, 871 / 891 in the sweep (H200,
      2026-12-01); elsewhere the
      tile kernel at 128 x 128, 8 warps, 3 stages, two K-blocks a turn (560.6 / 614.1 TFLOP/s);
    * larger M, quant in the A-load: 64 x 256, 8 warps, 4 stages (227 / 245 TFLOP/s); 3 stages when A has more
      than 2 bytes an element (``a_itemsize``: the fused tile holds A in its own dtype, and fp32 A at 4 stages
      needs 232 KiB of shared memory, past the H200's 227 KiB: OutOfResources in the GPU gate
      test_default_and_small_m_configs_give_the_product[gpu-65], 2026-11-30).
    """
    if _interpreting():
        if M <= SMALL_M_MAX:
            return dict(kernel="small_m", BM=16, BN=64, SPLIT_K="auto", REDUCE=1, num_warps=4, num_stages=1,
                        FAST_DIV=True)
        return dict(kernel="tile", BM=16, BN=32, GROUP_M=2, KPI=1, num_warps=4, num_stages=1, FAST_DIV=True)
    if gluon and not quant_a:  # Hopper with Gluon, A and B TMA-addressable: kernels/fp8/wgmma.py
        if M <= 16:
            return dict(WGMMA_SMALL_M_DEFAULT)
        if M <= 32:  # split as M <= 16 since the four-at-a-time reduce: 9.63 / 20.83 us at 32 x 4096^2 /
            # 32 x 8192^2 against 11.30 / 20.80 with one split (H200, 2026-12-01; read flush)
            return dict(WGMMA_SMALL_M_DEFAULT, BM=32)
        if M <= SMALL_M_MAX and K <= 16384:  # no split, 64 weight rows a program, four K-blocks' wgmmas at once:
            # 10.53 / 22.56 us at 64 x 4096^2 / 64 x 8192^2 against 11.49 / 25.25 with BN 32 and one at a time
            # (H200, 2026-12-01); its staged scales bound K (kernels.fp8.wgmma.SCALES_MAX)
            return dict(WGMMA_SMALL_M_DEFAULT, BM=64, BN=64, SWAP_AB=False, num_stages=8, UNROLL=4)
        if M <= SMALL_M_MAX:
            return dict(WGMMA_SMALL_M_DEFAULT, BM=64, SPLIT_K=1, num_stages=8)
        if tma:
            if triton.cdiv(M, 128) * triton.cdiv(N, 128) <= 64:
                # at most 64 tiles of 128 x 128 leave half the 132 SMs idle: 64-column tiles, the same sums
                # (bit-identical). H200, graph replay (docs/kernels/fp8.md; the runner's fp8_gemm, variant ws2_bn64):
                # 13.09 / 13.38 us at M = 128 / 256 x 4096^2 against 16.96 / 16.74 (torch's block-scaled
                # _scaled_mm 14.72 / 14.87), 27.25 against 31.60 at 128 x 8192^2; at 256 x 8192^2 (128 tiles)
                # BN 64 was slower, 45.60 against 33.23
                return dict(WGMMA_DEFAULT, BN=64)
            return dict(WGMMA_DEFAULT)
    amd = target is not None and target.is_amd
    if amd and M > SMALL_M_MAX:
        table = AMD_TILE_PREFILL_QA if quant_a else AMD_TILE_PREFILL
        row = table.get((target.warp_size, target.fp8_mma))
        if row is None or target.lds_bytes < 65536:
            raise ValueError(f"no fp8 GEMM tile was checked for {target.backend}:{target.arch} (wave "
                             f"{target.warp_size}, fp8 matrix instructions: {target.fp8_mma}, {target.lds_bytes} B "
                             f"of LDS a workgroup); give config=")
        return dict(row)
    # decode tiles: the same on AMD (36 KiB of LDS at M <= 16, 18 KiB above; no spill on gfx1201 or gfx942)
    if M <= 16:  # two K-blocks a turn: best at M = 1 and 16 by kernel time (H200, 2026-11-29)
        return dict(kernel="tile", BM=16, BN=32, GROUP_M=1, KPI=2, num_warps=4, num_stages=4, FAST_DIV=True)
    if M <= SMALL_M_MAX:
        return dict(kernel="tile", BM=16, BN=32, GROUP_M=1, KPI=1, num_warps=4, num_stages=4, FAST_DIV=True)
    if quant_a:
        return dict(kernel="tile", BM=64, BN=256, GROUP_M=8, KPI=1, num_warps=8,
                    num_stages=4 if a_itemsize <= 2 else 3, FAST_DIV=True)
    if tma:
        return dict(TMA_DEFAULT)
    return dict(TILE_DEFAULT, KPI=2)


def small_m_config(M: int) -> dict:
    """The swap-AB split-K kernel's config for M <= 64: BM the next of 16 / 32 / 64 over M, 64 weight rows (one
    m64 wgmma per warpgroup), split-K to ~4 waves, the reduce in a second launch."""
    BM = 16 if M <= 16 else (32 if M <= 32 else 64)
    return dict(kernel="small_m", BM=BM, BN=64, SPLIT_K="auto", REDUCE=1, num_warps=4,
                num_stages=1 if _interpreting() else 4, FAST_DIV=True)


_LOCKS: dict = {}


def _lock_buffer(device, n: int) -> torch.Tensor:
    """Zeroed int32 tile counters for the split-K kernels' last-arriving reduce (small_m REDUCE=2 and
    wgmma_small_m with more than one split), one buffer per (device, stream), grown on demand (kernels reset
    theirs). Per stream because two such launches running at once must not share counters; launches on one
    stream run one after another. (Not for CUDA graphs replayed on several streams at once.)"""
    dev = device if isinstance(device, torch.device) else torch.device(device)
    stream = 0
    if dev.type == "cuda":
        # (torch's raw getters, without torch.cuda's wrappers: a split-K launch of a launch plan calls this)
        if torch._C._cuda_isCurrentStreamCapturing():
            # under CUDA-graph capture the zeroing is recorded, not run: a buffer cached here would be garbage for
            # eager calls and other graphs. This one belongs to the graph, zeroed at the start of every replay.
            return torch.zeros(max(n, 1), dtype=torch.int32, device=dev)
        stream = torch._C._cuda_getCurrentRawStream(dev.index if dev.index is not None else
                                                    torch.cuda.current_device())
    key = (str(dev), stream)
    buf = _LOCKS.get(key)
    if buf is None or buf.numel() < n:
        buf = torch.zeros(max(n, 1024), dtype=torch.int32, device=device)
        _LOCKS[key] = buf
    return buf


def _gemm(a, sa, b, sb, out_dtype, quant_a, fmt, store_a, config):
    M, K = _check_x(a, "a")
    for name, t in (("b", b), ("sb", sb)) + ((("sa", sa),) if not quant_a else ()):
        if not isinstance(t, torch.Tensor):
            raise ValueError(f"{name} must be a tensor, got {type(t).__name__}")
    if b.dim() != 2:
        raise ValueError(f"b must be [N, K], got {tuple(b.shape)}")
    N, Kb = b.shape
    if Kb != K:
        raise ValueError(f"a is [M, {K}] but b is [{N}, {Kb}]")
    if not b.is_contiguous():
        raise ValueError("b must be contiguous [N, K]")
    if sb.shape != (triton.cdiv(N, GROUP), K // GROUP):
        raise ValueError(f"sb must be [{triton.cdiv(N, GROUP)}, {K // GROUP}], got {tuple(sb.shape)}")
    for name, t in (("sb", sb),) if quant_a else (("sa", sa), ("sb", sb)):
        if t.dtype != torch.float32:
            raise ValueError(f"{name} must be float32 block scales, got {t.dtype}")
    sb = sb.contiguous()  # the kernels read scales row-major; a column-major (DeepGEMM-style) layout is copied
    b_fnuz = _fmt_of(b) == "e4m3fnuz"
    c = torch.empty(M, N, dtype=out_dtype, device=a.device)
    # the TMA (and Gluon prefill) kernel by default only where it can run: a pre-quantised A and C that TMA can
    # address, and a
    # 2-byte output (with an fp32 C, TMA_DEFAULT's build asked for 262,168 B of shared memory, past the H200's
    # 232,448: OutOfResources in the GPU gate, 2026-12-01; an explicit kernel="tma" with an fp32 C is launched
    # as asked and may fail so)
    tma_ok = (not quant_a and c.element_size() <= 2 and tma_supported(a.device)
              and _tma_layout_problem(a, b, c) is None)
    itemsize = a.element_size() if quant_a else 1
    gluon_ok = False
    if not quant_a and not _interpreting() and a.is_cuda:
        from kernels.fp8.wgmma import gluon_supported

        gluon_ok = (gluon_supported(a.device) and _tma_layout_problem(a, b, b) is None
                    and (M <= SMALL_M_MAX or c.dtype in (torch.bfloat16, torch.float16)))
    target = None if _interpreting() else target_of(a.device)
    cfg = dict(default_gemm_config(M, N, K, quant_a, itemsize, tma=tma_ok and not _interpreting(),
                                   gluon=gluon_ok, target=target))
    if config:
        want = config.get("kernel")
        if want is not None and want not in KERNELS:
            raise ValueError(f"unknown kernel {want!r} (one of {', '.join(KERNELS)})")
        if want is None and cfg["kernel"] in ("tma", "wgmma", "wgmma_small_m"):
            # tuning keys without a kernel name keep their meaning from before the TMA and Gluon kernels: the
            # tile kernel's (or the small-M kernel's under the interpreter); naming a kernel tunes that one
            cfg = dict(default_gemm_config(M, N, K, quant_a, itemsize, target=target))
        elif want is not None and (want != cfg["kernel"] or want == "wgmma_small_m"):
            # (wgmma_small_m named: its own defaults, the split kernel, not the shape's variant of it)
            cfg = dict({"tile": TILE_DEFAULT, "tma": TMA_DEFAULT, "wgmma": WGMMA_DEFAULT,
                        "wgmma_small_m": WGMMA_SMALL_M_DEFAULT}.get(want) or small_m_config(M))
        cfg.update(config)
        if cfg["kernel"] == "wgmma_small_m" and "BM" not in config:  # the token tile follows M
            cfg["BM"] = 16 if M <= 16 else (32 if M <= 32 else 64)
    _check_config(cfg)
    if cfg["kernel"] == "tma":
        why = ("it reads a pre-quantised A (not the fused quant)" if quant_a else
               None if tma_supported(a.device) else f"{a.device} has no TMA (compute capability 9+, CUDA)")
        why = why or _tma_layout_problem(a, b, c)
        if why:
            raise ValueError(f"kernel='tma': {why}")
        if 128 % cfg["BN"]:
            raise ValueError(f"kernel='tma' needs BN dividing 128, got BN={cfg['BN']}")
    if cfg["kernel"] in ("wgmma", "wgmma_small_m"):
        from kernels.fp8.wgmma import gluon_problem

        why = "it reads a pre-quantised A (not the fused quant)" if quant_a else gluon_problem(a.device)
        why = why or _tma_layout_problem(a, b, c if cfg["kernel"] == "wgmma" else b)
        if not why and cfg["kernel"] == "wgmma" and c.dtype not in (torch.bfloat16, torch.float16):
            why = f"it stores a 2-byte output (bf16 or fp16) by TMA, not {c.dtype}"
        if not why and cfg["kernel"] == "wgmma_small_m" and M > cfg["BM"]:
            why = f"M={M} is more than its token tile BM={cfg['BM']}"
        if why:
            raise ValueError(f"kernel={cfg['kernel']!r}: {why}")
    BN = cfg["BN"]
    if 128 % BN and BN % 128:
        raise ValueError(f"BN={BN} must divide 128 or be a multiple of it")
    if cfg["kernel"] in ("tile", "tma") and cfg.get("KPI", 1) not in (1, 2):
        raise ValueError(f"KPI={cfg.get('KPI')} must be 1 or 2 (K-blocks per loop turn)")
    if cfg["kernel"] == "small_m" and int(cfg.get("REDUCE", 1)) not in (1, 2):
        raise ValueError(f"REDUCE={cfg.get('REDUCE')} must be 1 (a second launch) or 2 (the last split sums)")
    qa_out = sa_out = None
    if store_a:
        qa_out = torch.empty(M, K, dtype=torch.uint8, device=a.device)
        sa_out = torch.empty(M, K // GROUP, dtype=torch.float32, device=a.device)
    if M == 0 or N == 0 or K == 0:
        if K == 0:
            c.zero_()  # an empty sum
        return (c, qa_out.view(FP8_DTYPE[fmt]), sa_out) if store_a else c
    if quant_a:
        a_fnuz = fmt == "e4m3fnuz"
        a_arg, sa_arg = a, sb  # sa unused: any fp32 tensor
    else:
        a_fnuz = _fmt_of(a) == "e4m3fnuz"
        if sa.shape != (M, K // GROUP):
            raise ValueError(f"sa must be [{M}, {K // GROUP}], got {tuple(sa.shape)}")
        a_arg, sa_arg = a.view(torch.uint8), sa.contiguous()  # row-major scales (see sb)
    # fnuz bits read as e4m3fn are twice the fnuz value: HALF undoes it per operand
    half = (0.5 if a_fnuz else 1.0) * (0.5 if b_fnuz else 1.0)
    common = dict(QUANT_A=quant_a, STORE_A=store_a, FMAX=FP8_MAX[fmt] if quant_a else 448.0, A_FNUZ=a_fnuz,
                  HALF=half, RNE_FIX=_interpreting(), FAST_DIV=bool(cfg.get("FAST_DIV", True)),
                  num_warps=cfg["num_warps"], num_stages=cfg["num_stages"])
    qo, so = (qa_out, sa_out) if store_a else (c, c)
    sqm, ssqm = (qa_out.stride(0), sa_out.stride(0)) if store_a else (0, 0)
    kpi = cfg.get("KPI", 1)  # tile and TMA kernels: one K-block a turn where K/128 does not divide by KPI
    if (K // GROUP) % kpi:
        kpi = 1
    if cfg["kernel"] == "tile":
        if quant_a and not _interpreting():
            # KPI=2 with the quant in the A-load failed the operand-identity gate on the H200 (2026-11-29,
            # test_fused_quant_gemm_identical_operands[tile_kpi2]; cause not established): one K-block a turn
            kpi = 1
        grid = (triton.cdiv(M, cfg["BM"]) * triton.cdiv(N, BN),)
        _block_gemm_kernel[grid](
            a_arg, sa_arg, b.view(torch.uint8), sb, c, qo, so, M, N, K,
            a_arg.stride(0), sa_arg.stride(0), b.stride(0), sb.stride(0), c.stride(0), sqm, ssqm,
            BM=cfg["BM"], BN=BN, GROUP_M=cfg["GROUP_M"], KPI=kpi, **common,
        )
    elif cfg["kernel"] == "tma":
        from triton.tools.tensor_descriptor import TensorDescriptor

        BM = cfg["BM"]
        tiles = triton.cdiv(M, BM) * triton.cdiv(N, BN)
        sms = (NUM_SMS if _interpreting() else torch.cuda.get_device_properties(a.device).multi_processor_count
               if a.is_cuda else target.units or NUM_SMS)
        programs = min(cfg.get("PROGRAMS") or sms, tiles)
        # fnuz bits are read as e4m3fn (HALF undoes the doubling), as in the pointer kernels
        a8, b8 = a.view(torch.float8_e4m3fn), b.view(torch.float8_e4m3fn)
        _block_gemm_tma_kernel[(programs,)](
            TensorDescriptor.from_tensor(a8, [BM, GROUP]), TensorDescriptor.from_tensor(b8, [BN, GROUP]),
            TensorDescriptor.from_tensor(c, [BM, BN]), sa_arg, sb, M, N, K, sa_arg.stride(0), sb.stride(0),
            programs, BM=BM, BN=BN, GROUP_M=cfg["GROUP_M"], KPI=kpi, HALF=half,
            num_warps=cfg["num_warps"], num_stages=cfg["num_stages"],
        )
    elif cfg["kernel"] in ("wgmma", "wgmma_small_m"):
        from kernels.fp8 import wgmma as fp8_wgmma

        a8, b8 = a.view(torch.float8_e4m3fn), b.view(torch.float8_e4m3fn)  # fnuz bits: HALF, as above
        sms = torch.cuda.get_device_properties(a.device).multi_processor_count
        if cfg["kernel"] == "wgmma":
            tiles = triton.cdiv(M, cfg["BM"]) * triton.cdiv(N, BN)
            fp8_wgmma.launch_wgmma(a8, sa_arg, b8, sb, c, half, cfg, min(cfg.get("PROGRAMS") or sms, tiles))
        elif not cfg.get("SWAP_AB", True):
            fp8_wgmma.launch_rows_wgmma(a8, sa_arg, b8, sb, c, half, cfg)
        else:
            kb, n_tiles = K // GROUP, triton.cdiv(N, BN)
            split = cfg.get("SPLIT_K", "auto")
            if split == "auto":  # about PROGRAMS programs (default two an SM), never an empty split
                split = max(1, min(kb, round((cfg.get("PROGRAMS") or 2 * sms) / n_tiles)))
            split = min(int(split), kb)
            if split * M * N >= 2**31:  # the workspace is indexed in int32
                split = 1
            fp8_wgmma.launch_small_m_wgmma(a8, sa_arg, b8, sb, c, half, cfg, split, _lock_buffer(a.device, n_tiles))
    elif cfg["kernel"] == "small_m":
        kb = K // GROUP
        split = cfg["SPLIT_K"]
        split = pick_split_k(M, N, K, cfg["BM"], BN) if split == "auto" else max(1, min(int(split), kb))
        kb_per = triton.cdiv(kb, split)
        split = triton.cdiv(kb, kb_per)  # no empty split
        if split * M * N >= 2**31:  # the workspace is indexed in int32
            split, kb_per = 1, kb
        reduce = 0 if split == 1 else int(cfg.get("REDUCE", 1))
        grid = (triton.cdiv(N, BN), split, triton.cdiv(M, cfg["BM"]))
        ws = torch.empty(split, M, N, dtype=torch.float32, device=a.device) if reduce else c
        lock = _lock_buffer(a.device, grid[0] * grid[2]) if reduce == 2 else c
        _small_m_kernel[grid](
            a_arg, sa_arg, b.view(torch.uint8), sb, c, ws, lock, qo, so, M, N, K, kb_per, split,
            a_arg.stride(0), sa_arg.stride(0), b.stride(0), sb.stride(0), c.stride(0), sqm, ssqm,
            BM=cfg["BM"], BN=BN, REDUCE=reduce, **common,
        )
        if reduce == 1:
            BLOCK = 1024
            _splitk_reduce_kernel[(triton.cdiv(M * N, BLOCK),)](ws, c, M, N, c.stride(0), split, BLOCK=BLOCK,
                                                                 num_warps=4)
    else:
        raise ValueError(f"unknown kernel {cfg['kernel']!r} (one of {', '.join(KERNELS)})")
    if store_a:
        return c, qa_out.view(FP8_DTYPE[fmt]), sa_out
    return c


def fp8_block_gemm(qa, sa, qb, sb, out_dtype=torch.bfloat16, config: dict | None = None) -> torch.Tensor:
    """``[M, N]`` = (qa, sa) @ (qb, sb)^T, block-scaled (see the module docstring). qa ``[M, K]`` fp8 with
    sa ``[M, K/128]`` fp32; qb ``[N, K]`` fp8 with sb ``[ceil(N/128), K/128]`` fp32; either fp8 format.
    ``config`` overrides the default config's keys (:func:`default_gemm_config`): with ``kernel`` it picks the
    kernel (``"tile"``, ``"tma"``, ``"small_m"``, ``"wgmma"``, ``"wgmma_small_m"``) and overrides that
    kernel's defaults; without it, it overrides the keys of the kernel the shape defaults to, except where that
    is the TMA or a Gluon kernel (a TMA GPU with a 2-byte output at M > 64; a Hopper GPU with Gluon at any M):
    there a config without ``kernel`` tunes the kernel that was the default before those existed (the tile
    kernel on a GPU); name the kernel to tune it.

    Raises:
        ValueError: mismatched shapes or dtypes (scales not float32); an invalid config value (see
            :func:`_check_config`; BN neither dividing 128 nor a multiple of it, KPI not 1 or 2);
            ``kernel="tma"`` where it cannot run (no TMA on the device, a base or row stride of A, B or the
            output not 16-byte aligned, BN not dividing 128); ``kernel="wgmma"`` / ``"wgmma_small_m"`` where
            they cannot run (not a Hopper GPU with Gluon, the fused quant, TMA alignment, a non-2-byte output
            for "wgmma", M over the token tile for "wgmma_small_m").
        triton.runtime.errors.OutOfResources: a config whose shared memory does not fit the device."""
    return _gemm(qa, sa, qb, sb, out_dtype, False, _fmt_of(qa), False, config)


def fp8_block_gemm_qa(x, qb, sb, fmt: str = "e4m3fn", out_dtype=torch.bfloat16, store_a: bool = False,
                      config: dict | None = None):
    """The block-scaled GEMM with the per-token-group-128 quant of ``x`` ``[M, K]`` (bf16/fp16/fp32) in its
    A-load. With ``store_a`` returns ``(out, qa, sa)``: the operands it fed the MMA (written by the programs of
    the first column tile), bit-identical to ``fp8_quant_group(x, fmt)``."""
    return _gemm(x, None, qb, sb, out_dtype, True, _fmt(fmt), store_a, config)


def fp8_quant_then_gemm(x, qb, sb, fmt: str = "e4m3fn", out_dtype=torch.bfloat16, config: dict | None = None,
                        quant_cfg: dict | None = None) -> torch.Tensor:
    """Two launches: :func:`fp8_quant_group` then :func:`fp8_block_gemm` (the baseline the fused path must
    beat). Same operands, so the same result as :func:`fp8_block_gemm_qa` up to the MMA's sum order."""
    qa, sa = fp8_quant_group(x, fmt, **(quant_cfg or {}))
    return fp8_block_gemm(qa, sa, qb, sb, out_dtype, config)

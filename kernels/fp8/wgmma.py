"""Block-scaled fp8 GEMMs for Hopper written in Gluon (Triton's explicit-layout dialect, Triton 3.5-3.8: GLUON_TRITON).

Prefill (``kernels.fp8`` kernel="wgmma", the default there for M > 64 with a pre-quantised A and a 2-byte
output). Each 128-wide K-block's product is a fresh zero-initialised fp32 wgmma folded into the accumulator
with the block's scales, ``acc = acc + d * (sa[m, kb] * HALF * sb[n / 128, kb])`` (the per-128 "promotion" to
CUDA cores of DeepSeek-V3, arXiv:2412.19437 section 3.3.2), the tile kernel's sums in the same order: the
output is bit-identical to ``fp8_block_gemm(..., config=dict(kernel="tile"))`` (tests/kernels/fp8/test_wgmma.py
on the H200). Three schedules (config key WS), measured on the H200 (2026-12-01; docs/kernels/fp8.md):

* WS=0, :func:`_block_gemm_wgmma_kernel`: one partition issues its own TMA loads and wgmmas. MODE 0 overlaps a
  block's fold with the next block's wgmma inside a warpgroup, MODE 1 does so two blocks a turn, MODE 2 not at
  all. MODE 2 was as fast as MODE 0 (0.60 of _scaled_mm at 4096^3): the fold was not the bound. ncu showed the
  warps stalled at the CTA barriers Triton puts around every TMA issue, with 0.32-0.43 instructions issued a
  cycle per scheduler and L2 at 42-56 % of peak (Nsight Compute).
* WS=1, :func:`_block_gemm_ws_kernel`: one producer warp issues every load, paced by per-stage barriers;
  0.72-0.75 of _scaled_mm at 4096^3 with MODE 2. Its two consumer warpgroups are still one partition, held in step by
  the partition barrier before each "stage empty" arrival.
* WS=2 (default), :func:`_block_gemm_ws2_kernel`: the two consumer warpgroups in two partitions of 64 rows
  each, each arriving on the stage's barrier itself, so one's scale-FMAs run while the other's wgmma does (the
  overlap of CUTLASS's sm90 "ping-pong" warp-specialised schedule, without its ordering barrier):
  0.836 and 0.815 of _scaled_mm at 4096^3 and 8192^3 (medians of nine rounds).

Decode (kernel="wgmma_small_m", the default for M <= 64): :func:`_small_m_wgmma_kernel` (M <= 32), swap-AB
split-K with up to num_stages K-blocks of a program in flight by TMA and the block scales staged in shared
memory; :func:`_rows_wgmma_kernel` (SWAP_AB=False; 32 < M <= 64), no split of K, the tokens padded to the
wgmma's 64 rows. Both take UNROLL (1, 2, 4): that many K-blocks' wgmmas in flight before one wait, folded in
order (the same bits). Against _scaled_mm they are 1.05-1.47x its time at 1-64 x 4096^2, and ~1.0-1.1x at
16 x 8192^2: the bare TMA stream of the weights on the split kernel's grid is 5.5-5.6 us of its 7.3-8.4 at
4096^2, the split-K reduce 1.3-2.4 (docs/kernels/fp8.md).

Nothing here runs under the CPU interpreter (Gluon has none); the CPU gates run the tile kernel, whose sums
the prefill kernels repeat, and the refusals of these kernels.

Layout: A ``[M, K]`` e4m3fn, B ``[N, K]`` e4m3fn, both K-contiguous with K a multiple of 128; C ``[M, N]``
(prefill: bf16/fp16); sa ``[M, K/128]`` fp32, sb ``[ceil(N/128), K/128]`` fp32, row-major.
"""
from __future__ import annotations

import functools

import torch

try:
    import triton
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.hopper import (
        fence_async_shared, mbarrier, tma, warpgroup_mma, warpgroup_mma_wait)
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor
    HAVE_GLUON = True
except ImportError:  # pragma: no cover - Triton without Gluon (< 3.5) or no Triton
    HAVE_GLUON = False

GROUP = 128
SMALL_M_SMEM = 192 * 1024  # the decode kernels' stages and scales stay under this (the H200: 227 KiB a block)
SCALES_MAX = 32 * 1024  # bytes of block scales a decode program stages (registers, then shared memory)


# [from, to) of the Triton versions whose Gluon API these kernels are written against: 3.5 brought Gluon, 3.9
# replaced tma.async_copy_global_to_shared / async_copy_shared_to_global by async_load / async_store (the old
# names raise there). Built and gated on the H200 with 3.6.
GLUON_TRITON = ((3, 5), (3, 9))


GLUON = True  # the Gluon kernels taken where they can run (see set_gluon)


def set_gluon(on: bool) -> None:
    """Take the Gluon kernels where they can run (True, the default) or never (False: the Triton kernels a GPU
    without Gluon runs, the path ROCm takes; what the host-time benchmark measures off Hopper on the H200)."""
    global GLUON
    if not isinstance(on, bool):
        raise TypeError(f"set_gluon takes a bool, got {on!r}")
    GLUON = on


def _triton_version() -> tuple[int, int]:
    return _major_minor(triton.__version__)


@functools.lru_cache(maxsize=None)
def _major_minor(version: str) -> tuple[int, int]:
    # "3.10.0+git1234" -> (3, 10); cached: gluon_problem runs on every fp8 GEMM call on a GPU
    major, minor = (version.split(".") + ["0"])[:2]
    return int(major), int("".join(ch for ch in minor if ch.isdigit()) or 0)


def gluon_problem(device) -> str | None:
    """None where these kernels can run (``kernels.fp8.fp8_block_gemm(..., config=dict(kernel="wgmma"))`` or
    ``"wgmma_small_m"``), else why not: Gluon importable from a Triton in :data:`GLUON_TRITON`, an NVIDIA
    CUDA device (not ROCm, which reports gfx9xx as 9.x) of compute capability 9.x (Hopper's wgmma)."""
    device = torch.device(device)
    if not GLUON:
        return "the Gluon kernels are switched off (kernels.fp8.wgmma.set_gluon)"
    if not HAVE_GLUON:
        return "Triton's Gluon is not importable (Triton >= 3.5)"
    if not GLUON_TRITON[0] <= _triton_version() < GLUON_TRITON[1]:
        lo, hi = GLUON_TRITON
        return (f"the Gluon kernels are written for Triton {lo[0]}.{lo[1]} to {hi[0]}.{hi[1] - 1} (this is "
                f"{triton.__version__}; 3.9 renamed Gluon's TMA copies)")
    if (device.type != "cuda" or torch.version.hip is not None or not torch.cuda.is_available()
            or torch.cuda.get_device_capability(device)[0] != 9):
        return f"{device} is not a Hopper GPU (NVIDIA CUDA, compute capability 9.x)"
    return None


def gluon_supported(device) -> bool:
    """True where :func:`gluon_problem` finds nothing in the way."""
    return gluon_problem(device) is None


if HAVE_GLUON:
    @gluon.jit
    def _tile_coords(tile, num_m, num_n, GROUP_M: gl.constexpr):
        # GROUP_M-swizzled order, as _block_gemm_tma_kernel: GROUP_M row tiles share each column tile in turn
        group = GROUP_M * num_n
        first_m = (tile // group) * GROUP_M
        gsize = gl.maximum(gl.minimum(num_m - first_m, GROUP_M), 1)  # >= 1: the WS=0 kernel also asks for
        # the tile after its last (masked off), where num_m - first_m may be 0: no remainder by zero
        pid_m = first_m + (tile % group) % gsize
        pid_n = (tile % group) // gsize
        return pid_m, pid_n

    @gluon.jit
    def _load_stage(s, live, om, on, k, a_desc, b_desc, a_bufs, b_bufs, bars):
        # the TMA loads of A [BM, 128] at (om, k) and B [BN, 128] at (on, k) into stage s; nothing if not live
        bar = bars.index(s)
        mbarrier.expect(bar, a_desc.block_type.nbytes + b_desc.block_type.nbytes, pred=live)
        tma.async_copy_global_to_shared(a_desc, [om, k], bar, a_bufs.index(s), pred=live)
        tma.async_copy_global_to_shared(b_desc, [on, k], bar, b_bufs.index(s), pred=live)

    @gluon.jit
    def _alloc_stages(x_desc, y_desc, STAGES: gl.constexpr, ARRIVALS: gl.constexpr):
        """Shared memory for a STAGES-deep ring of two operand blocks (x_desc's and y_desc's block shapes and
        layouts) and one mbarrier a stage, initialised to expect ARRIVALS arrivals."""
        x_bufs = gl.allocate_shared_memory(x_desc.dtype, [STAGES] + x_desc.block_type.shape, x_desc.layout)
        y_bufs = gl.allocate_shared_memory(y_desc.dtype, [STAGES] + y_desc.block_type.shape, y_desc.layout)
        bars = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        for i in gl.static_range(STAGES):
            mbarrier.init(bars.index(i), count=ARRIVALS)
        return x_bufs, y_bufs, bars

    @gluon.jit
    def _alloc_ring(a_desc, b_desc, STAGES: gl.constexpr, EMPTY_ARRIVALS: gl.constexpr):
        """The warp-specialised kernels' ring: STAGES A and B blocks, a "ready" barrier a stage (the producer's
        TMA bytes) and an "empty" one (EMPTY_ARRIVALS consumer arrivals)."""
        a_bufs = gl.allocate_shared_memory(a_desc.dtype, [STAGES] + a_desc.block_type.shape, a_desc.layout)
        b_bufs = gl.allocate_shared_memory(b_desc.dtype, [STAGES] + b_desc.block_type.shape, b_desc.layout)
        ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        for i in gl.static_range(STAGES):
            mbarrier.init(ready.index(i), count=1)
            mbarrier.init(empty.index(i), count=EMPTY_ARRIVALS)
        return a_bufs, b_bufs, ready, empty

    @gluon.jit
    def _block_scale(p_sa, p_sb, kb, mm, HALF: gl.constexpr):
        # K-block kb's fold factor sa[m, kb] * HALF * sb[n / 128, kb] for the rows of p_sa (masked by mm), in
        # the tile kernel's order of operations
        return gl.load(p_sa + kb, mask=mm, other=0.0) * HALF * gl.load(p_sb + kb)

    @gluon.jit
    def _store_tile(c_desc, c_smem, acc, om, on):
        # C tile at (om, on) by TMA through c_smem, once the previous store from c_smem has left it
        tma.store_wait(pendings=0)
        c_smem.store(acc.to(c_desc.dtype))
        fence_async_shared()
        tma.async_copy_shared_to_global(c_desc, [om, on], c_smem)

    @gluon.jit
    def _stage_scales(sa, ssam, p_sb, kb_lo, nkb, M, KBP: gl.constexpr, BT: gl.constexpr, HALF: gl.constexpr,
                      num_warps: gl.constexpr):
        """The decode kernels' fold factors of K-blocks kb_lo .. kb_lo + nkb - 1 (row j: sb[., kb_lo + j] *
        (sa[m, kb_lo + j] HALF) for the BT token columns m < M; zeros elsewhere) in shared memory, [KBP, BT]
        fp32, returned as KBP rows of a rank-1 view so that ``.index(j)`` is row j. p_sb: the program's row of
        sb."""
        sl: gl.constexpr = gl.BlockedLayout([1, 1], [1, 32], [num_warps, 1], [1, 0])
        kk = gl.arange(0, KBP, layout=gl.SliceLayout(1, sl))
        mv = gl.arange(0, BT, layout=gl.SliceLayout(0, sl))
        km = kk < nkb
        scb = gl.load(p_sb + kb_lo + kk, mask=km, other=0.0)
        sca = gl.load(sa + mv[None, :] * ssam + (kb_lo + kk)[:, None], mask=km[:, None] & (mv < M)[None, :],
                      other=0.0)
        s_smem = gl.allocate_shared_memory(gl.float32, [KBP, BT], gl.SwizzledSharedLayout(1, 1, 1, order=[1, 0]))
        s_smem.store(scb[:, None] * (sca * HALF))
        # the same unswizzled row-major bytes viewed as KBP rows of a rank-1 layout
        return s_smem._reinterpret(gl.float32, [KBP, BT], gl.SwizzledSharedLayout(1, 1, 1, order=[0]))

    @gluon.jit
    def _refill(s, j, KB, more, om, on, om_next, on_next, a_desc, b_desc, a_bufs, b_bufs, bars):
        # stage s is free: load K-block j of this tile (om, on) or, past its last, K-block j - KB of the next
        # tile (om_next, on_next; only if there is one: ``more``). j - KB < KB as STAGES <= KB.
        nxt = j >= KB
        _load_stage(s, (j < KB) | more, gl.where(nxt, om_next, om), gl.where(nxt, on_next, on),
                    gl.where(nxt, j - KB, j) * 128, a_desc, b_desc, a_bufs, b_bufs, bars)

    @gluon.jit
    def _block_gemm_wgmma_kernel(a_desc, b_desc, c_desc, sa, sb, M, N, K, ssam, ssbn,
                                 HALF: gl.constexpr, GROUP_M: gl.constexpr, STAGES: gl.constexpr,
                                 MODE: gl.constexpr, num_warps: gl.constexpr):
        """C = (A, sa) @ (B, sb)^T on a persistent grid (one program per SM, tiles ``pid, pid + nprog, ...``).
        Descriptors: a_desc [BM, 128] and b_desc [BN, 128] e4m3fn blocks, c_desc [BM, BN] (rows past M or N read
        as zeros, not written). BN divides 128 (one weight scale per tile and K-block). The loads run STAGES
        steps ahead across tile boundaries (step = one tile's K-block); each wgmma's inputs are released to
        the next load once it has been waited for. HALF: the fnuz correction (see kernels.fp8._gemm). MODE 0:
        a block's fold overlaps the next block's wgmma (one product copied a block); 1: two blocks a turn, the
        two products trading roles (no copy; 255 registers and spills under Triton 3.6); 2: no overlap."""
        BM: gl.constexpr = c_desc.block_type.shape[0]
        BN: gl.constexpr = c_desc.block_type.shape[1]
        gl.static_assert(a_desc.block_type.shape[1] == 128)
        gl.static_assert(128 % BN == 0)
        # wgmma layout: warps stacked along M (m16 a warp; a warpgroup of 4 covers 64 rows), n = BN, k = 32 fp8
        mma: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                                      instr_shape=[16, BN, 32])
        rows: gl.constexpr = gl.SliceLayout(1, mma)

        a_bufs, b_bufs, bars = _alloc_stages(a_desc, b_desc, STAGES, 1)
        c_smem = gl.allocate_shared_memory(c_desc.dtype, c_desc.block_type.shape, c_desc.layout)

        pid = gl.program_id(0)
        nprog = gl.num_programs(0)
        num_m = gl.cdiv(M, BM)
        num_n = gl.cdiv(N, BN)
        tiles = num_m * num_n
        KB = K // 128
        my_tiles = gl.maximum(gl.cdiv(tiles - pid, nprog), 0)
        # the loads run STAGES K-blocks ahead (STAGES <= KB: the host caps it), into the next tile near the end
        pm, pn = _tile_coords(pid, num_m, num_n, GROUP_M)
        for i in gl.static_range(STAGES):
            _load_stage(i, my_tiles > 0, pm * BM, pn * BN, i * 128, a_desc, b_desc, a_bufs, b_bufs, bars)

        zero = gl.zeros((BM, BN), dtype=gl.float32, layout=mma)
        c = 0  # this program's step counter (one step: a tile's K-block)
        for t in range(my_tiles):
            pid_m, pid_n = _tile_coords(pid + t * nprog, num_m, num_n, GROUP_M)
            nm_, nn_ = _tile_coords(pid + (t + 1) * nprog, num_m, num_n, GROUP_M)
            om = pid_m * BM
            on = pid_n * BN
            om_next = nm_ * BM
            on_next = nn_ * BN
            more = t + 1 < my_tiles
            offs_m = om + gl.arange(0, BM, layout=rows)
            mm = offs_m < M
            p_sa = sa + offs_m * ssam
            p_sb = sb + (on // 128) * ssbn

            s = c % STAGES
            mbarrier.wait(bars.index(s), (c // STAGES) & 1)
            x = warpgroup_mma(a_bufs.index(s), b_bufs.index(s).permute((1, 0)), zero, use_acc=False,
                              is_async=True)
            sx = _block_scale(p_sa, p_sb, 0, mm, HALF)
            x = warpgroup_mma_wait(0, deps=(x,))
            _refill(s, STAGES, KB, more, om, on, om_next, on_next, a_desc, b_desc, a_bufs, b_bufs, bars)
            acc = zero
            if MODE == 1:
                # Two K-blocks a turn with x and y trading roles. x: K-block kb - 1's product, complete; each
                # half-turn issues kb's wgmma, folds kb - 1 in while it runs, then waits for it. Each wgmma
                # takes the dead product of its own register set as its (unread, use_acc=False) input, so it
                # writes in place: no zeroing, no copy at the back edge, and no wgmma in flight across it
                # (ptxas serialises every wgmma of a kernel whose in-flight accumulators a copy reads: C7514).
                y = zero
                for kb in range(1, KB - 1, 2):
                    c += 1
                    s = c % STAGES
                    mbarrier.wait(bars.index(s), (c // STAGES) & 1)
                    y = warpgroup_mma(a_bufs.index(s), b_bufs.index(s).permute((1, 0)), y, use_acc=False,
                                      is_async=True)
                    sy = _block_scale(p_sa, p_sb, kb, mm, HALF)
                    acc = acc + x * sx[:, None]
                    y = warpgroup_mma_wait(0, deps=(y,))
                    _refill(s, kb + STAGES, KB, more, om, on, om_next, on_next, a_desc, b_desc, a_bufs, b_bufs,
                            bars)
                    c += 1
                    s = c % STAGES
                    mbarrier.wait(bars.index(s), (c // STAGES) & 1)
                    x = warpgroup_mma(a_bufs.index(s), b_bufs.index(s).permute((1, 0)), x, use_acc=False,
                                      is_async=True)
                    sx = gl.load(p_sa + kb + 1, mask=mm, other=0.0) * HALF * gl.load(p_sb + kb + 1)
                    acc = acc + y * sy[:, None]
                    x = warpgroup_mma_wait(0, deps=(x,))
                    _refill(s, kb + 1 + STAGES, KB, more, om, on, om_next, on_next, a_desc, b_desc, a_bufs,
                            b_bufs, bars)
                if KB % 2 == 0:  # one K-block left after the pairs
                    c += 1
                    s = c % STAGES
                    mbarrier.wait(bars.index(s), (c // STAGES) & 1)
                    y = warpgroup_mma(a_bufs.index(s), b_bufs.index(s).permute((1, 0)), y, use_acc=False,
                                      is_async=True)
                    sy = gl.load(p_sa + KB - 1, mask=mm, other=0.0) * HALF * gl.load(p_sb + KB - 1)
                    acc = acc + x * sx[:, None]
                    y = warpgroup_mma_wait(0, deps=(y,))
                    _refill(s, KB - 1 + STAGES, KB, more, om, on, om_next, on_next, a_desc, b_desc, a_bufs,
                            b_bufs, bars)
                    x = y  # one copy a tile
                    sx = sy
            elif MODE == 2:  # control: the tile kernel's order, each fold waiting for its own wgmma
                for kb in range(1, KB):
                    acc = acc + x * sx[:, None]
                    c += 1
                    s = c % STAGES
                    mbarrier.wait(bars.index(s), (c // STAGES) & 1)
                    x = warpgroup_mma(a_bufs.index(s), b_bufs.index(s).permute((1, 0)), x, use_acc=False,
                                      is_async=True)
                    sx = _block_scale(p_sa, p_sb, kb, mm, HALF)
                    x = warpgroup_mma_wait(0, deps=(x,))
                    _refill(s, kb + STAGES, KB, more, om, on, om_next, on_next, a_desc, b_desc, a_bufs, b_bufs, bars)
            else:
                for kb in range(1, KB):
                    # x: K-block kb - 1's product, complete. Issue kb's wgmma, fold kb - 1 in while it runs, then
                    # wait for it. No wgmma is in flight across the loop's back edge: ptxas serialises every
                    # wgmma of a kernel whose in-flight accumulators a copy reads (C7514).
                    c += 1
                    s = c % STAGES
                    mbarrier.wait(bars.index(s), (c // STAGES) & 1)
                    y = warpgroup_mma(a_bufs.index(s), b_bufs.index(s).permute((1, 0)), zero, use_acc=False,
                                      is_async=True)
                    sy = _block_scale(p_sa, p_sb, kb, mm, HALF)
                    acc = acc + x * sx[:, None]
                    x = warpgroup_mma_wait(0, deps=(y,))
                    _refill(s, kb + STAGES, KB, more, om, on, om_next, on_next, a_desc, b_desc, a_bufs, b_bufs, bars)
                    sx = sy
            acc = acc + x * sx[:, None]
            c += 1
            _store_tile(c_desc, c_smem, acc, om, on)
        tma.store_wait(pendings=0)
        for i in gl.static_range(STAGES):
            mbarrier.invalidate(bars.index(i))


    @gluon.jit
    def _ws_load_partition(a_desc, b_desc, a_bufs, b_bufs, ready, empty, M, N, K,
                           GROUP_M: gl.constexpr, STAGES: gl.constexpr):
        # the producer (one warp): every K-block of every tile of this program, STAGES ahead of the MMAs,
        # each stage refilled once the consumers have released it (empty)
        BM: gl.constexpr = a_desc.block_type.shape[0]
        BN: gl.constexpr = b_desc.block_type.shape[0]
        pid = gl.program_id(0)
        nprog = gl.num_programs(0)
        num_m = gl.cdiv(M, BM)
        num_n = gl.cdiv(N, BN)
        KB = K // 128
        p = 0
        for tile in range(pid, num_m * num_n, nprog):
            pid_m, pid_n = _tile_coords(tile, num_m, num_n, GROUP_M)
            for kb in range(KB):
                s = p % STAGES
                mbarrier.wait(empty.index(s), ((p // STAGES) & 1) ^ 1)  # a fresh barrier passes phase 1
                bar = ready.index(s)
                mbarrier.expect(bar, a_desc.block_type.nbytes + b_desc.block_type.nbytes)
                tma.async_copy_global_to_shared(a_desc, [pid_m * BM, kb * 128], bar, a_bufs.index(s))
                tma.async_copy_global_to_shared(b_desc, [pid_n * BN, kb * 128], bar, b_bufs.index(s))
                p += 1

    @gluon.jit
    def _consume_tile(a_bufs, b_bufs, ready, empty, c, KB, p_sa, p_sb, mm, zero, HALF: gl.constexpr,
                      STAGES: gl.constexpr, ROWS: gl.constexpr, ROW0: gl.constexpr = 0):
        # A warp-specialised consumer's tile, K-block by K-block in order: wait for the stage, wgmma (rows
        # [ROW0, ROW0 + ROWS) of the A block; ROWS 0: all of it), release the stage, fold with the block's
        # scales. c: the ring's step counter in and out. Returns (acc, c).
        acc = zero
        for kb in range(KB):
            s = c % STAGES
            sx = _block_scale(p_sa, p_sb, kb, mm, HALF)
            mbarrier.wait(ready.index(s), (c // STAGES) & 1)
            if ROWS == 0:
                a = a_bufs.index(s)
            else:
                a = a_bufs.index(s).slice(ROW0, ROWS)
            x = warpgroup_mma(a, b_bufs.index(s).permute((1, 0)), zero, use_acc=False, is_async=True)
            x = warpgroup_mma_wait(0, deps=(x,))
            mbarrier.arrive(empty.index(s), count=1)
            acc = acc + x * sx[:, None]
            c += 1
        return acc, c

    @gluon.jit
    def _ws_mma_partition(a_bufs, b_bufs, ready, empty, c_desc, c_smem, sa, sb, M, N, K, ssam, ssbn,
                          HALF: gl.constexpr, GROUP_M: gl.constexpr, STAGES: gl.constexpr, MODE: gl.constexpr,
                          num_warps: gl.constexpr):
        # the consumers (the kernel's num_warps): per K-block wait for its stage, wgmma, release the stage,
        # fold with the block's scales (MODE 0: K-block kb - 1's fold overlaps kb's wgmma; 2: in order)
        BM: gl.constexpr = c_desc.block_type.shape[0]
        BN: gl.constexpr = c_desc.block_type.shape[1]
        mma: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                                      instr_shape=[16, BN, 32])
        rows: gl.constexpr = gl.SliceLayout(1, mma)
        pid = gl.program_id(0)
        nprog = gl.num_programs(0)
        num_m = gl.cdiv(M, BM)
        num_n = gl.cdiv(N, BN)
        KB = K // 128
        zero = gl.zeros((BM, BN), dtype=gl.float32, layout=mma)
        c = 0
        for tile in range(pid, num_m * num_n, nprog):
            pid_m, pid_n = _tile_coords(tile, num_m, num_n, GROUP_M)
            om = pid_m * BM
            on = pid_n * BN
            offs_m = om + gl.arange(0, BM, layout=rows)
            mm = offs_m < M
            p_sa = sa + offs_m * ssam
            p_sb = sb + (on // 128) * ssbn
            acc = zero
            if MODE == 0:
                s = c % STAGES
                mbarrier.wait(ready.index(s), (c // STAGES) & 1)
                x = warpgroup_mma(a_bufs.index(s), b_bufs.index(s).permute((1, 0)), zero, use_acc=False,
                                  is_async=True)
                sx = _block_scale(p_sa, p_sb, 0, mm, HALF)
                x = warpgroup_mma_wait(0, deps=(x,))
                mbarrier.arrive(empty.index(s), count=1)
                c += 1
                for kb in range(1, KB):
                    s = c % STAGES
                    mbarrier.wait(ready.index(s), (c // STAGES) & 1)
                    y = warpgroup_mma(a_bufs.index(s), b_bufs.index(s).permute((1, 0)), zero, use_acc=False,
                                      is_async=True)
                    sy = _block_scale(p_sa, p_sb, kb, mm, HALF)
                    acc = acc + x * sx[:, None]
                    x = warpgroup_mma_wait(0, deps=(y,))
                    mbarrier.arrive(empty.index(s), count=1)
                    sx = sy
                    c += 1
                acc = acc + x * sx[:, None]
            else:
                acc, c = _consume_tile(a_bufs, b_bufs, ready, empty, c, KB, p_sa, p_sb, mm, zero, HALF, STAGES, 0)
            _store_tile(c_desc, c_smem, acc, om, on)
        tma.store_wait(pendings=0)

    @gluon.jit
    def _block_gemm_ws_kernel(a_desc, b_desc, c_desc, sa, sb, M, N, K, ssam, ssbn,
                              HALF: gl.constexpr, GROUP_M: gl.constexpr, STAGES: gl.constexpr,
                              MODE: gl.constexpr, num_warps: gl.constexpr):
        """The prefill GEMM of :func:`_block_gemm_wgmma_kernel` (same tiles, sums and order, persistent grid),
        warp-specialised: one producer warp issues every TMA load, paced by per-stage "empty" barriers that
        the consumers arrive on once their wgmma has read the stage, and the consumers (num_warps) wait only
        on per-stage "ready" barriers. Why: with the loads issued by the consumers themselves, Triton puts
        CTA-wide barriers around every TMA issue (ncu on the H200: warps stalled on a CTA barrier, 0.32-0.43
        instructions issued a cycle per scheduler, L2 at 42-56 % of peak: neither the memory nor the issue
        rate is the bound)."""
        BN: gl.constexpr = c_desc.block_type.shape[1]
        gl.static_assert(a_desc.block_type.shape[1] == 128)
        gl.static_assert(128 % BN == 0)
        a_bufs, b_bufs, ready, empty = _alloc_ring(a_desc, b_desc, STAGES, 1)
        c_smem = gl.allocate_shared_memory(c_desc.dtype, c_desc.block_type.shape, c_desc.layout)
        gl.warp_specialize([
            (_ws_mma_partition, (a_bufs, b_bufs, ready, empty, c_desc, c_smem, sa, sb, M, N, K, ssam, ssbn,
                                 HALF, GROUP_M, STAGES, MODE, num_warps)),
            (_ws_load_partition, (a_desc, b_desc, a_bufs, b_bufs, ready, empty, M, N, K, GROUP_M, STAGES)),
        ], [1], [24])

    @gluon.jit
    def _ws2_consumer(HALF_ROWS: gl.constexpr, a_bufs, b_bufs, ready, empty, c_desc, c_bufs, sa, sb, M, N, K,
                      ssam, ssbn, HALF: gl.constexpr, GROUP_M: gl.constexpr, STAGES: gl.constexpr):
        # one consumer warpgroup: rows [HALF_ROWS * 64, +64) of every tile, its own wgmma waits, its own
        # arrival on the stage's "empty" barrier (count 2), its own half of C
        BM: gl.constexpr = 128
        BN: gl.constexpr = c_desc.block_type.shape[1]
        mma: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                      instr_shape=[16, BN, 32])
        rows: gl.constexpr = gl.SliceLayout(1, mma)
        pid = gl.program_id(0)
        nprog = gl.num_programs(0)
        num_m = gl.cdiv(M, BM)
        num_n = gl.cdiv(N, BN)
        KB = K // 128
        zero = gl.zeros((64, BN), dtype=gl.float32, layout=mma)
        c_smem = c_bufs.index(HALF_ROWS)
        c = 0
        for tile in range(pid, num_m * num_n, nprog):
            pid_m, pid_n = _tile_coords(tile, num_m, num_n, GROUP_M)
            om = pid_m * BM + HALF_ROWS * 64
            on = pid_n * BN
            offs_m = om + gl.arange(0, 64, layout=rows)
            mm = offs_m < M
            p_sa = sa + offs_m * ssam
            p_sb = sb + (on // 128) * ssbn
            acc, c = _consume_tile(a_bufs, b_bufs, ready, empty, c, KB, p_sa, p_sb, mm, zero, HALF, STAGES, 64,
                                   HALF_ROWS * 64)
            _store_tile(c_desc, c_smem, acc, om, on)
        tma.store_wait(pendings=0)

    @gluon.jit
    def _block_gemm_ws2_kernel(a_desc, b_desc, c_desc, sa, sb, M, N, K, ssam, ssbn,
                               HALF: gl.constexpr, GROUP_M: gl.constexpr, STAGES: gl.constexpr,
                               CONSUMER_REGS: gl.constexpr, num_warps: gl.constexpr):
        """:func:`_block_gemm_ws_kernel` with its two consumer warpgroups in two partitions (the default one,
        num_warps = 4, and a worker of 4 warps), each owning 64 rows of the 128-row tile: each waits only
        for its own wgmma and arrives on the stage's "empty" barrier itself (count 2), so the two are never
        held in step and one's scale-FMAs run while the other's wgmma does (the overlap of a ping-pong
        schedule, not its ordering). c_desc: blocks [64, BN]. Same sums in the same order as the tile kernel."""
        BN: gl.constexpr = c_desc.block_type.shape[1]
        gl.static_assert(a_desc.block_type.shape[0] == 128)
        gl.static_assert(c_desc.block_type.shape[0] == 64)
        gl.static_assert(128 % BN == 0)
        gl.static_assert(num_warps == 4)
        a_bufs, b_bufs, ready, empty = _alloc_ring(a_desc, b_desc, STAGES, 2)  # an arrival from each consumer
        c_bufs = gl.allocate_shared_memory(c_desc.dtype, [2] + c_desc.block_type.shape, c_desc.layout)
        gl.warp_specialize([
            (_ws2_consumer, (0, a_bufs, b_bufs, ready, empty, c_desc, c_bufs, sa, sb, M, N, K, ssam, ssbn,
                             HALF, GROUP_M, STAGES)),
            (_ws2_consumer, (1, a_bufs, b_bufs, ready, empty, c_desc, c_bufs, sa, sb, M, N, K, ssam, ssbn,
                             HALF, GROUP_M, STAGES)),
            (_ws_load_partition, (a_desc, b_desc, a_bufs, b_bufs, ready, empty, M, N, K, GROUP_M, STAGES)),
        ], [4, 1], [CONSUMER_REGS, 24])

    @gluon.jit
    def _mma_block(j, x_bufs, y_bufs, bars, zero, STAGES: gl.constexpr):
        # K-block j's product x[s] @ y[s]^T (s = j % STAGES) once its TMA bytes are in: an async wgmma into a
        # fresh accumulator (the caller waits, so several blocks' wgmmas can be in flight at once)
        s = j % STAGES
        mbarrier.wait(bars.index(s), (j // STAGES) & 1)
        return warpgroup_mma(x_bufs.index(s), y_bufs.index(s).permute((1, 0)), zero, use_acc=False, is_async=True)

    @gluon.jit
    def _mma_group(j, x_bufs, y_bufs, bars, zero, STAGES: gl.constexpr, UNROLL: gl.constexpr):
        """K-blocks j .. j + UNROLL - 1's products (:func:`_mma_block`) issued back to back, then one wait:
        (d0, d1, d2, d3), the blocks past UNROLL returned as ``zero`` (unused by the caller)."""
        t0 = _mma_block(j, x_bufs, y_bufs, bars, zero, STAGES)
        if UNROLL == 1:
            d0 = warpgroup_mma_wait(0, deps=[t0])
            d1 = zero
            d2 = zero
            d3 = zero
        elif UNROLL == 2:
            t1 = _mma_block(j + 1, x_bufs, y_bufs, bars, zero, STAGES)
            d0, d1 = warpgroup_mma_wait(0, deps=[t0, t1])
            d2 = zero
            d3 = zero
        else:
            t1 = _mma_block(j + 1, x_bufs, y_bufs, bars, zero, STAGES)
            t2 = _mma_block(j + 2, x_bufs, y_bufs, bars, zero, STAGES)
            t3 = _mma_block(j + 3, x_bufs, y_bufs, bars, zero, STAGES)
            d0, d1, d2, d3 = warpgroup_mma_wait(0, deps=[t0, t1, t2, t3])
        return d0, d1, d2, d3

    @gluon.jit
    def _rot_scale(s_rows, j, rot, nkb, layout: gl.constexpr):
        # the staged fold factors of the program's j-th K-block in its rotated order (ROTATE), in ``layout``
        jj = j + rot
        return s_rows.index(gl.where(jj >= nkb, jj - nkb, jj)).load(layout)

    @gluon.jit
    def _issue_small_m_load(j, nkb, rot, kb_lo, n0, w_desc, a_desc, w_bufs, a_bufs, bars, STAGES: gl.constexpr):
        # the program's j-th K-block (in its rotated order) into stage j % STAGES: weights [BN, 128] at row n0,
        # tokens [BT, 128]; nothing past its last block
        jj = j + rot
        k = (kb_lo + gl.where(jj >= nkb, jj - nkb, jj)) * 128
        _load_stage(j % STAGES, j < nkb, n0, 0, k, w_desc, a_desc, w_bufs, a_bufs, bars)

    @gluon.jit
    def _sum_partials(p, MN, omask, SPLIT_K):
        """sum_sp p[sp MN] over sp = 0..SPLIT_K-1, added in that order (deterministic), read through L2 (.cg:
        other programs wrote them; not a stale L1). Why four at a time: one load at a time, each add waiting for
        its load, put SPLIT_K - 1 dependent L2 reads after the last weight block; four at a time saved 0.26-0.44
        us of the default at 1-16 x 4096^2 and 16 x 8192^2 (H200, 2026-12-01)."""
        v0 = gl.load(p, mask=omask, other=0.0, cache_modifier=".cg")
        v1 = gl.load(p + MN, mask=omask & (SPLIT_K > 1), other=0.0, cache_modifier=".cg")
        v2 = gl.load(p + 2 * MN, mask=omask & (SPLIT_K > 2), other=0.0, cache_modifier=".cg")
        v3 = gl.load(p + 3 * MN, mask=omask & (SPLIT_K > 3), other=0.0, cache_modifier=".cg")
        tot = v0
        tot = gl.where(SPLIT_K > 1, tot + v1, tot)  # not tot + 0.0 past the last split: -0.0 stays -0.0
        tot = gl.where(SPLIT_K > 2, tot + v2, tot)
        tot = gl.where(SPLIT_K > 3, tot + v3, tot)
        for sp in range(4, SPLIT_K, 4):
            v0 = gl.load(p + sp * MN, mask=omask, other=0.0, cache_modifier=".cg")
            v1 = gl.load(p + (sp + 1) * MN, mask=omask & (sp + 1 < SPLIT_K), other=0.0, cache_modifier=".cg")
            v2 = gl.load(p + (sp + 2) * MN, mask=omask & (sp + 2 < SPLIT_K), other=0.0, cache_modifier=".cg")
            v3 = gl.load(p + (sp + 3) * MN, mask=omask & (sp + 3 < SPLIT_K), other=0.0, cache_modifier=".cg")
            tot = tot + v0
            tot = gl.where(sp + 1 < SPLIT_K, tot + v1, tot)
            tot = gl.where(sp + 2 < SPLIT_K, tot + v2, tot)
            tot = gl.where(sp + 3 < SPLIT_K, tot + v3, tot)
        return tot

    @gluon.jit
    def _split_k_epilogue(acc, out, ws, lock, tile, omask, MN, pid_n, pid_k, SPLIT_K):
        """The split-K kernels' reduce, one launch, deterministic: the program's fp32 partial ``acc`` of output
        tile pid_n (element offsets ``tile`` into an [M, N] plane, ``omask``) goes to ws [SPLIT_K, M, N] and is
        counted on lock[pid_n] (acq_rel); the last split to arrive sums the partials in split order
        (:func:`_sum_partials`) into ``out`` (pointers, cast to their dtype) and resets the counter. (An acquire
        read first, letting a program that finds every other split counted skip its store and release, was
        slower: 7.65 against 7.30 us at 1 x 4096^2; so was a counter-free reduce, the grid's last split polling
        the others' slots for a sentinel, 7.46 against 7.26 at M = 1 and 1.1-3.2x at M >= 16: H200, 2026-12-01;
        the code is in commit f23ad72.)"""
        gl.store(ws + pid_k * MN + tile, acc, mask=omask)
        gl.thread_barrier()  # every thread's partial is issued before the (one-thread) release below
        prev = gl.atomic_add(lock + pid_n, 1, sem="acq_rel", scope="gpu")
        if prev == SPLIT_K - 1:
            gl.store(out, _sum_partials(ws + tile, MN, omask, SPLIT_K).to(out.dtype.element_ty), mask=omask)
            gl.atomic_xchg(lock + pid_n, 0, sem="relaxed", scope="gpu")  # ready for the next launch

    @gluon.jit
    def _small_m_wgmma_kernel(w_desc, a_desc, sa, sb, c, ws, lock, M, N, K, KB_PER, SPLIT_K, ssam, ssbn, scm,
                              HALF: gl.constexpr, KBP: gl.constexpr, STAGES: gl.constexpr, ROTATE: gl.constexpr,
                              num_warps: gl.constexpr, UNROLL: gl.constexpr = 1):
        """Decode (M <= BT): out^T [BN, BT] = W [BN, K-range] @ A [BT, K-range]^T, swap-AB as
        kernels.fp8._small_m_kernel (the weight rows on the wgmma's 64-row side, the tokens on its n), grid
        (cdiv(N, BN), SPLIT_K): program (pid_n, pid_k) owns K-blocks [pid_k KB_PER, +KB_PER) (KB_PER <= KBP, a
        power of two). Descriptors: w_desc [BN, 128] over B [N, K], a_desc [BT, 128] over A [M, K] (rows past
        M read as zeros). Why: the weight stream is the whole cost at decode, so STAGES K-blocks of the program
        are in flight by TMA (all of them when STAGES >= KB_PER) and the block scales (sb[n / 128, kb] * sa[m, kb] HALF,
        as _small_m_kernel) are read once into shared memory before the first MMA instead of one dependent
        load a K-block. SPLIT_K > 1: the fp32 partial goes to ws [SPLIT_K, M, N]; the last program of an
        output tile to arrive (an acq_rel counter per tile in lock, reset by it) sums ws in split order
        0..SPLIT_K-1 and stores out: one launch, deterministic."""
        BN: gl.constexpr = w_desc.block_type.shape[0]
        BT: gl.constexpr = a_desc.block_type.shape[0]
        gl.static_assert(128 % BN == 0)
        gl.static_assert((UNROLL == 1) or (UNROLL == 2) or (UNROLL == 4))  # the loop below knows these three
        gl.static_assert(UNROLL <= STAGES)  # a group's blocks are all in the ring before its wait
        mma: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                                      instr_shape=[16, BT, 32])
        nl: gl.constexpr = gl.SliceLayout(1, mma)
        ml: gl.constexpr = gl.SliceLayout(0, mma)

        pid_n = gl.program_id(0)
        pid_k = gl.program_id(1)
        n0 = pid_n * BN
        kb_lo = pid_k * KB_PER
        nkb = gl.minimum(kb_lo + KB_PER, K // 128) - kb_lo
        # ROTATE: program pid_n walks its K-blocks from pid_n mod nkb on, so that the programs of all N-tiles
        # do not ask for the same token block of A at the same moment
        rot = (pid_n % gl.maximum(nkb, 1)) if ROTATE else 0

        w_bufs, a_bufs, bars = _alloc_stages(w_desc, a_desc, STAGES, 1)
        for i in gl.static_range(STAGES):
            _issue_small_m_load(i, nkb, rot, kb_lo, n0, w_desc, a_desc, w_bufs, a_bufs, bars, STAGES)

        # every K-block's scale of this program, [KBP, BT], into shared memory (row j: K-block kb_lo + j)
        s_rows = _stage_scales(sa, ssam, sb + (n0 // 128) * ssbn, kb_lo, nkb, M, KBP, BT, HALF, num_warps)

        zero = gl.zeros((BN, BT), dtype=gl.float32, layout=mma)
        acc = zero
        nfull = nkb - nkb % UNROLL
        for j in range(0, nfull, UNROLL):  # UNROLL K-blocks' wgmmas in flight at once, folded in order
            d0, d1, d2, d3 = _mma_group(j, w_bufs, a_bufs, bars, zero, STAGES, UNROLL)
            for u in gl.static_range(UNROLL):  # the stages just read are free
                _issue_small_m_load(j + u + STAGES, nkb, rot, kb_lo, n0, w_desc, a_desc, w_bufs, a_bufs, bars,
                                    STAGES)
            acc = acc + d0 * _rot_scale(s_rows, j, rot, nkb, ml)[None, :]
            if UNROLL >= 2:
                acc = acc + d1 * _rot_scale(s_rows, j + 1, rot, nkb, ml)[None, :]
            if UNROLL == 4:
                acc = acc + d2 * _rot_scale(s_rows, j + 2, rot, nkb, ml)[None, :]
                acc = acc + d3 * _rot_scale(s_rows, j + 3, rot, nkb, ml)[None, :]
        for j in range(nfull, nkb):  # the last nkb % UNROLL blocks one at a time
            d = warpgroup_mma_wait(0, deps=[_mma_block(j, w_bufs, a_bufs, bars, zero, STAGES)])
            _issue_small_m_load(j + STAGES, nkb, rot, kb_lo, n0, w_desc, a_desc, w_bufs, a_bufs, bars, STAGES)
            acc = acc + d * _rot_scale(s_rows, j, rot, nkb, ml)[None, :]
        for i in gl.static_range(STAGES):
            mbarrier.invalidate(bars.index(i))

        offs_n = n0 + gl.arange(0, BN, layout=nl)
        offs_m = gl.arange(0, BT, layout=ml)
        omask = (offs_n < N)[:, None] & (offs_m < M)[None, :]
        out = c + offs_m[None, :] * scm + offs_n[:, None]
        if SPLIT_K == 1:
            gl.store(out, acc.to(c.dtype.element_ty), mask=omask)
        else:
            _split_k_epilogue(acc, out, ws, lock, offs_m[None, :] * N + offs_n[:, None], omask, M * N, pid_n, pid_k,
                              SPLIT_K)

    @gluon.jit
    def _rows_wgmma_kernel(w_desc, a_desc, sa, sb, c, M, N, K, ssam, ssbn, scm,
                           HALF: gl.constexpr, KBP: gl.constexpr, STAGES: gl.constexpr, UNROLL: gl.constexpr = 1):
        """Decode without split-K: out [64 (M <= 64 tokens), BN] = A [64, K] @ W [BN, K]^T for the program's
        BN weight rows (grid cdiv(N, BN), BN 8..64 dividing 128, one warpgroup), all of K in one program, so
        there is no partial to reduce. The tokens are padded to the wgmma's 64-row side (TMA zero-fills the
        rows past M; wasted MMA work is cheap at decode, the weight stream is the cost). STAGES K-blocks are in
        flight; the per-K-block scales (sa[m, kb] HALF sb[n / 128, kb], as _block_gemm_kernel) are read into
        shared memory once, [KBP, 64], before the first MMA. Why: the split-K kernel's last program of each
        output tile waits for the others' partials (an L2 round trip for the counter, one for the partials)."""
        BN: gl.constexpr = w_desc.block_type.shape[0]
        gl.static_assert(a_desc.block_type.shape[0] == 64)
        gl.static_assert(128 % BN == 0)
        gl.static_assert((UNROLL == 1) or (UNROLL == 2) or (UNROLL == 4))
        gl.static_assert(UNROLL <= STAGES)
        mma: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                      instr_shape=[16, BN, 32])
        rl: gl.constexpr = gl.SliceLayout(1, mma)
        cl: gl.constexpr = gl.SliceLayout(0, mma)
        pid = gl.program_id(0)
        n0 = pid * BN
        KB = K // 128
        w_bufs, a_bufs, bars = _alloc_stages(w_desc, a_desc, STAGES, 1)
        for i in gl.static_range(STAGES):
            _load_stage(i, i < KB, n0, 0, i * 128, w_desc, a_desc, w_bufs, a_bufs, bars)
        s_rows = _stage_scales(sa, ssam, sb + (n0 // 128) * ssbn, 0, KB, M, KBP, 64, HALF, 4)
        zero = gl.zeros((64, BN), dtype=gl.float32, layout=mma)
        acc = zero
        nfull = KB - KB % UNROLL
        for j in range(0, nfull, UNROLL):  # as _small_m_wgmma_kernel: UNROLL blocks' wgmmas in flight at once
            d0, d1, d2, d3 = _mma_group(j, a_bufs, w_bufs, bars, zero, STAGES, UNROLL)
            for u in gl.static_range(UNROLL):
                nxt = j + u + STAGES
                _load_stage((j + u) % STAGES, nxt < KB, n0, 0, nxt * 128, w_desc, a_desc, w_bufs, a_bufs, bars)
            acc = acc + d0 * s_rows.index(j).load(rl)[:, None]
            if UNROLL >= 2:
                acc = acc + d1 * s_rows.index(j + 1).load(rl)[:, None]
            if UNROLL == 4:
                acc = acc + d2 * s_rows.index(j + 2).load(rl)[:, None]
                acc = acc + d3 * s_rows.index(j + 3).load(rl)[:, None]
        for j in range(nfull, KB):
            d = warpgroup_mma_wait(0, deps=[_mma_block(j, a_bufs, w_bufs, bars, zero, STAGES)])
            _load_stage(j % STAGES, j + STAGES < KB, n0, 0, (j + STAGES) * 128, w_desc, a_desc, w_bufs, a_bufs,
                        bars)
            acc = acc + d * s_rows.index(j).load(rl)[:, None]
        for i in gl.static_range(STAGES):
            mbarrier.invalidate(bars.index(i))
        offs_m = gl.arange(0, 64, layout=rl)
        offs_n = n0 + gl.arange(0, BN, layout=cl)
        gl.store(c + offs_m[:, None] * scm + offs_n[None, :], acc.to(c.dtype.element_ty),
                 mask=(offs_m < M)[:, None] & (offs_n < N)[None, :])


def _gl_dtype(dtype: torch.dtype):
    return {torch.bfloat16: gl.bfloat16, torch.float16: gl.float16, torch.float32: gl.float32,
            torch.float8_e4m3fn: gl.float8e4nv}[dtype]


@functools.lru_cache(maxsize=None)
def _layout(block: tuple[int, ...], dtype: torch.dtype):
    """The NVMMA shared layout of a TMA block of ``dtype`` (computed once per block shape and dtype)."""
    return gl.NVMMASharedLayout.get_default_for(list(block), _gl_dtype(dtype))


def _descriptor(t: torch.Tensor, block: list[int]):
    return TensorDescriptor.from_tensor(t, block, _layout(tuple(block), t.dtype))


def launch_wgmma(a8: torch.Tensor, sa: torch.Tensor, b8: torch.Tensor, sb: torch.Tensor, c: torch.Tensor,
                 half: float, cfg: dict, programs: int) -> None:
    """Launch the prefill kernel ``cfg["WS"]`` names into ``c`` (checked inputs: see kernels.fp8._gemm, which
    calls this): 2 :func:`_block_gemm_ws2_kernel` (BM 128; two 4-warp consumers and a producer warp whatever
    ``num_warps`` says), 1 :func:`_block_gemm_ws_kernel`, 0 :func:`_block_gemm_wgmma_kernel` (``MODE``).
    a8 ``[M, K]`` / b8 ``[N, K]`` viewed as e4m3fn, sa / sb fp32 row-major scales, c ``[M, N]`` 2-byte float,
    ``programs`` the persistent grid (one program an SM is what the config table assumes).

    Raises:
        ValueError: ``num_stages`` whose ring of A and B blocks and the C tile need more shared memory than the
            device grants a block (``shared_memory_per_block_optin``; 232,448 bytes on the H200)."""
    M, K = a8.shape
    N = b8.shape[0]
    BM, BN = cfg["BM"], cfg["BN"]
    stages = max(1, min(cfg["num_stages"], K // GROUP))  # the refill reaches at most one tile ahead
    ws = cfg.get("WS", 0)
    ring = (stages if ws == 0 else cfg["num_stages"]) * ((128 if ws == 2 else BM) + BN) * GROUP
    need = ring + (128 if ws == 2 else BM) * BN * c.element_size()
    limit = getattr(torch.cuda.get_device_properties(a8.device), "shared_memory_per_block_optin", 232448)
    if need > limit:
        raise ValueError(f"num_stages={cfg['num_stages']}: {need} bytes of shared memory (stages and the C tile), "
                         f"more than the device's {limit} a block")
    if cfg.get("WS") == 2:  # two consumer partitions of 64 rows (BM 128), one producer warp
        _block_gemm_ws2_kernel[(programs,)](
            _descriptor(a8, [128, GROUP]), _descriptor(b8, [BN, GROUP]), _descriptor(c, [64, BN]), sa, sb,
            M, N, K, sa.stride(0), sb.stride(0), HALF=half, GROUP_M=cfg["GROUP_M"], STAGES=cfg["num_stages"],
            CONSUMER_REGS=int(cfg.get("CONSUMER_REGS", 232)), num_warps=4, maxnreg=168)
        return
    if cfg.get("WS"):  # warp-specialised: 4 more warps (one producer, rounded to a warpgroup), registers moved
        _block_gemm_ws_kernel[(programs,)](  # to the consumers by setmaxnreg (maxnreg: the kernel's start)
            _descriptor(a8, [BM, GROUP]), _descriptor(b8, [BN, GROUP]), _descriptor(c, [BM, BN]), sa, sb,
            M, N, K, sa.stride(0), sb.stride(0), HALF=half, GROUP_M=cfg["GROUP_M"], STAGES=cfg["num_stages"],
            MODE=int(cfg.get("MODE", 0)), num_warps=cfg["num_warps"],
            maxnreg=65536 // (32 * (cfg["num_warps"] + 4)) // 8 * 8)
        return
    _block_gemm_wgmma_kernel[(programs,)](
        _descriptor(a8, [BM, GROUP]), _descriptor(b8, [BN, GROUP]), _descriptor(c, [BM, BN]), sa, sb,
        M, N, K, sa.stride(0), sb.stride(0), HALF=half, GROUP_M=cfg["GROUP_M"], STAGES=stages,
        MODE=int(cfg.get("MODE", 0)),
        num_warps=cfg["num_warps"])


def _unroll(cfg: dict, stages: int) -> int:
    # cfg["UNROLL"] (1, 2 or 4) halved until the ring holds that many K-blocks: a group's blocks are all in
    # their stages before its wait, and the refills go to the stages the group read
    u = cfg.get("UNROLL", 1)
    if type(u) is not int or u not in (1, 2, 4):
        raise ValueError(f"UNROLL={u!r} must be the int 1, 2 or 4")
    while u > stages:
        u //= 2
    return u


def launch_small_m_wgmma(a8: torch.Tensor, sa: torch.Tensor, b8: torch.Tensor, sb: torch.Tensor,
                         c: torch.Tensor, half: float, cfg: dict, split: int, lock: torch.Tensor) -> None:
    """Launch :func:`_small_m_wgmma_kernel` into ``c`` [M, N] (M <= cfg["BM"], the token tile: 16, 32 or 64;
    cfg["BN"] weight rows a program, 64 or 128, with BN / 16 warps) with ``split`` K-splits (1: no
    workspace) and ``lock`` at least cdiv(N, BN) zeroed int32 counters (see kernels.fp8._lock_buffer; read
    only where split > 1).
    ``cfg["num_stages"]`` K-blocks of a program are in flight (all of them where it allows; it is capped at the
    program's K-blocks and at :data:`SMALL_M_SMEM` bytes of stages)."""
    M, K = a8.shape
    N = b8.shape[0]
    BM, BN = cfg["BM"], cfg["BN"]
    kb = K // GROUP
    # the staged scales, [next_pow2(K-blocks a program), BM] fp32, stay within SCALES_MAX bytes (they pass
    # through registers on their way to shared memory): more splits where K is long
    split = max(split, triton.cdiv(kb, SCALES_MAX // (4 * BM)))
    kb_per = triton.cdiv(kb, split)
    split = triton.cdiv(kb, kb_per)  # no empty split
    kbp = triton.next_power_of_2(kb_per)
    ws = torch.empty(split, M, N, dtype=torch.float32, device=a8.device) if split > 1 else c
    # capped at the program's K-blocks and at SMALL_M_SMEM bytes of stages and scales
    stages = max(1, min(cfg["num_stages"], kb_per, (SMALL_M_SMEM - kbp * BM * 4) // ((BN + BM) * GROUP)))
    _small_m_wgmma_kernel[(triton.cdiv(N, BN), split)](
        _descriptor(b8, [BN, GROUP]), _descriptor(a8, [BM, GROUP]), sa, sb, c, ws,
        lock, M, N, K, kb_per, split, sa.stride(0), sb.stride(0), c.stride(0),
        HALF=half, KBP=kbp, STAGES=stages, ROTATE=bool(cfg.get("ROTATE", False)),
        num_warps=BN // 16, UNROLL=_unroll(cfg, stages))


def launch_rows_wgmma(a8: torch.Tensor, sa: torch.Tensor, b8: torch.Tensor, sb: torch.Tensor, c: torch.Tensor,
                      half: float, cfg: dict) -> None:
    """Launch :func:`_rows_wgmma_kernel` into ``c`` [M, N] (M <= 64; cfg["BN"] weight rows a program, 8..64
    dividing 128; one warpgroup): no split of K. ``cfg["num_stages"]`` K-blocks in flight, capped at K / 128
    and at :data:`SMALL_M_SMEM` bytes of stages and scales.

    Raises:
        ValueError: K over 16384 (its [next_pow2(K / 128), 64] fp32 scales would pass :data:`SCALES_MAX`)."""
    M, K = a8.shape
    N = b8.shape[0]
    BN = cfg["BN"]
    kb = K // GROUP
    kbp = triton.next_power_of_2(kb)
    if kbp * 64 * 4 > SCALES_MAX:
        raise ValueError(f"SWAP_AB=False stages all {kb} K-blocks' scales: K={K} is over "
                         f"{SCALES_MAX // 256 * GROUP} (use the split-K kernel, SWAP_AB=True)")
    stages = max(1, min(cfg["num_stages"], kb, (SMALL_M_SMEM - kbp * 64 * 4) // ((BN + 64) * GROUP)))
    _rows_wgmma_kernel[(triton.cdiv(N, BN),)](
        _descriptor(b8, [BN, GROUP]), _descriptor(a8, [64, GROUP]), sa, sb, c, M, N, K, sa.stride(0),
        sb.stride(0), c.stride(0), HALF=half, KBP=kbp, STAGES=stages, num_warps=4, UNROLL=_unroll(cfg, stages))

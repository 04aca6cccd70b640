"""The floor under a decode GEMM: how long the H200 takes to stream an fp8 weight [N, K] into shared memory by
TMA and do nothing else, on the grids the decode kernels use (kernels/fp8_wgmma.py: ``cdiv(N, BN)`` weight
tiles times SPLIT_K K-ranges, ``STAGES`` [BN, 128] blocks in flight a program). The stream's time moves with
the stage count as well as the grid (kernels/NOTES_II.md, "fp8 decode, session 7"): it is the floor of a
kernel on the same grid and stages; _scaled_mm's time at the same shape says how much of its own time is the
stream. Kernel time by the CUDA profiler after a written and after a read flush
(gdn_bench.bench_kernels, median of 20).

``--decompose``: the split kernel's pieces one at a time on the M <= 16 default's grid at 4096^2 (BN 64, 4
splits, 4 stages), M = 1 and 16: the weight stream alone, with the token blocks (A [BT, 128] a K-block, as the
kernel loads them), and with the split-K partials and their last-arriving reduce (zeros, the kernel's
protocol and layouts, no MMA); beside them the kernel itself. The differences say where its time over the
bare stream goes.

Usage (CUDA, Hopper, Triton 3.5-3.8 as kernels/fp8_wgmma.py; 3.6 on the H200):
    python -m kernels.bench.tma_stream_floor [--decompose] [--json OUT]
"""
from __future__ import annotations

import argparse
import json

import torch
import triton

from kernels.fp8.wgmma import HAVE_GLUON

if HAVE_GLUON:
    from kernels.fp8.wgmma import _split_k_epilogue
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.hopper import mbarrier, tma

    @gluon.jit
    def _stream_kernel(w_desc, KB, KB_PER, STAGES: gl.constexpr):
        """Program (pid_n, pid_k) loads the [BN, 128] blocks of rows pid_n BN.. of w, K-blocks
        [pid_k KB_PER, +KB_PER) (clipped at KB), STAGES in flight, each stage refilled as soon as it lands."""
        BN: gl.constexpr = w_desc.block_type.shape[0]
        n0 = gl.program_id(0) * BN
        kb_lo = gl.program_id(1) * KB_PER
        nkb = gl.minimum(kb_lo + KB_PER, KB) - kb_lo
        bufs = gl.allocate_shared_memory(w_desc.dtype, [STAGES] + w_desc.block_type.shape, w_desc.layout)
        bars = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        for i in gl.static_range(STAGES):
            mbarrier.init(bars.index(i), count=1)
        for i in gl.static_range(STAGES):
            mbarrier.expect(bars.index(i), w_desc.block_type.nbytes, pred=i < nkb)
            tma.async_copy_global_to_shared(w_desc, [n0, (kb_lo + i) * 128], bars.index(i), bufs.index(i),
                                            pred=i < nkb)
        for j in range(nkb):
            s = j % STAGES
            mbarrier.wait(bars.index(s), (j // STAGES) & 1)
            nxt = j + STAGES
            mbarrier.expect(bars.index(s), w_desc.block_type.nbytes, pred=nxt < nkb)
            tma.async_copy_global_to_shared(w_desc, [n0, (kb_lo + nxt) * 128], bars.index(s), bufs.index(s),
                                            pred=nxt < nkb)
        for i in gl.static_range(STAGES):
            mbarrier.invalidate(bars.index(i))

    @gluon.jit
    def _pieces_kernel(w_desc, a_desc, ws, lock, out, M, N, KB, KB_PER, SPLIT_K, STAGES: gl.constexpr,
                       WITH_A: gl.constexpr, REDUCE: gl.constexpr):
        """_stream_kernel's stream of weight blocks [BN, 128], plus (WITH_A) the token block [BT, 128] of each
        K-block into its own ring, as fp8_wgmma._small_m_wgmma_kernel loads them, plus (REDUCE) that kernel's
        split-K epilogue on a zero [BN, BT] fp32 partial: stored to ws [SPLIT_K, M, N], an acq_rel counter a
        tile in lock (reset by the last), the last program summing the partials (fp8_wgmma._split_k_epilogue) into
        out [M, N] fp32. No MMA, no scales."""
        BN: gl.constexpr = w_desc.block_type.shape[0]
        BT: gl.constexpr = a_desc.block_type.shape[0]
        pid_n = gl.program_id(0)
        pid_k = gl.program_id(1)
        n0 = pid_n * BN
        kb_lo = pid_k * KB_PER
        nkb = gl.minimum(kb_lo + KB_PER, KB) - kb_lo
        w_bufs = gl.allocate_shared_memory(w_desc.dtype, [STAGES] + w_desc.block_type.shape, w_desc.layout)
        a_bufs = gl.allocate_shared_memory(a_desc.dtype, [STAGES] + a_desc.block_type.shape, a_desc.layout)
        bars = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        nbytes: gl.constexpr = w_desc.block_type.nbytes + (a_desc.block_type.nbytes if WITH_A else 0)
        for i in gl.static_range(STAGES):
            mbarrier.init(bars.index(i), count=1)
        for i in gl.static_range(STAGES):
            mbarrier.expect(bars.index(i), nbytes, pred=i < nkb)
            tma.async_copy_global_to_shared(w_desc, [n0, (kb_lo + i) * 128], bars.index(i), w_bufs.index(i),
                                            pred=i < nkb)
            if WITH_A:
                tma.async_copy_global_to_shared(a_desc, [0, (kb_lo + i) * 128], bars.index(i), a_bufs.index(i),
                                                pred=i < nkb)
        for j in range(nkb):
            s = j % STAGES
            mbarrier.wait(bars.index(s), (j // STAGES) & 1)
            nxt = j + STAGES
            mbarrier.expect(bars.index(s), nbytes, pred=nxt < nkb)
            tma.async_copy_global_to_shared(w_desc, [n0, (kb_lo + nxt) * 128], bars.index(s), w_bufs.index(s),
                                            pred=nxt < nkb)
            if WITH_A:
                tma.async_copy_global_to_shared(a_desc, [0, (kb_lo + nxt) * 128], bars.index(s),
                                                a_bufs.index(s), pred=nxt < nkb)
        for i in gl.static_range(STAGES):
            mbarrier.invalidate(bars.index(i))
        if REDUCE:
            mma: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                          instr_shape=[16, BT, 32])
            offs_n = n0 + gl.arange(0, BN, layout=gl.SliceLayout(1, mma))
            offs_m = gl.arange(0, BT, layout=gl.SliceLayout(0, mma))
            omask = (offs_n < N)[:, None] & (offs_m < M)[None, :]
            tile = offs_m[None, :] * N + offs_n[:, None]
            _split_k_epilogue(gl.zeros((BN, BT), dtype=gl.float32, layout=mma), out + tile, ws, lock, tile, omask,
                              M * N, pid_n, pid_k, SPLIT_K)


def pieces(w8: torch.Tensor, a8: torch.Tensor, with_a: bool, reduce: bool, BN: int = 64, split: int = 4,
           stages: int = 4):
    """A zero-argument call of :func:`_pieces_kernel` on w8 [N, K] and a8 [M, K] (e4m3fn, M <= 16: a 16-row
    token tile) on the grid (cdiv(N, BN), split)."""
    from kernels.fp8.wgmma import _descriptor

    N, K = w8.shape
    M = a8.shape[0]
    kb = K // 128
    kb_per = triton.cdiv(kb, split)
    split = triton.cdiv(kb, kb_per)
    w_desc, a_desc = _descriptor(w8, [BN, 128]), _descriptor(a8, [16, 128])
    ws = torch.empty(split, M, N, dtype=torch.float32, device=w8.device)
    out = torch.empty(M, N, dtype=torch.float32, device=w8.device)
    lock = torch.zeros(triton.cdiv(N, BN), dtype=torch.int32, device=w8.device)
    grid = (triton.cdiv(N, BN), split)
    return lambda: _pieces_kernel[grid](w_desc, a_desc, ws, lock, out, M, N, kb, kb_per, split,
                                        STAGES=min(stages, kb_per), WITH_A=with_a, REDUCE=reduce, num_warps=4)


def decompose(res: dict) -> None:
    """``--decompose`` (module docstring): prints a line a piece, stores its kernel times in ``res``."""
    import kernels.fp8 as F
    from kernels.bench.fp8_wgmma_bench import kernel_times

    N = K = 4096
    for M in (1, 16):
        torch.manual_seed(0)
        x, w = torch.randn(M, K, device="cuda"), torch.randn(N, K, device="cuda")
        qa, sa = F.fp8_quant_group(x)
        qb, sb = F.fp8_quant_block_weight_ref(w)
        w8, a8 = qb.view(torch.float8_e4m3fn), qa.view(torch.float8_e4m3fn)
        fns = {"weights": pieces(w8, a8, False, False), "weights + tokens": pieces(w8, a8, True, False),
               "weights + reduce": pieces(w8, a8, False, True),
               "weights + tokens + reduce": pieces(w8, a8, True, True),
               "the kernel (default)": lambda: F.fp8_block_gemm(qa, sa, qb, sb)}
        for name, fn in fns.items():
            row = kernel_times(fn)[0]
            print(f"M={M:<3} {N}x{K} | {name:<26} | {row['us_flush_zero']:7.2f} us after a written flush, "
                  f"{row['us_flush_read']:7.2f} after a read one", flush=True)
            res[f"M={M} {name}"] = row


def stream(w8: torch.Tensor, BN: int, split: int, stages: int):
    """A zero-argument call that streams w8 [N, K] (e4m3fn, K a multiple of 128) on the grid (cdiv(N, BN),
    split) with ``stages`` [BN, 128] blocks in flight a program (capped at its K-blocks)."""
    from kernels.fp8.wgmma import _descriptor

    N, K = w8.shape
    kb = K // 128
    kb_per = triton.cdiv(kb, split)
    desc = _descriptor(w8, [BN, 128])
    grid = (triton.cdiv(N, BN), triton.cdiv(kb, kb_per))
    st = min(stages, kb_per)
    return lambda: _stream_kernel[grid](desc, kb, kb_per, STAGES=st, num_warps=4)


GRIDS = [(64, 1, 16), (64, 2, 16), (64, 4, 8), (64, 8, 4), (64, 16, 2), (32, 1, 16), (16, 1, 16), (128, 4, 8),
         (128, 8, 4), (128, 16, 2)]  # BN, SPLIT_K, STAGES


def floor(res: dict) -> None:
    """The default run (module docstring): _scaled_mm at M = 16 and the bare stream on each of :data:`GRIDS`
    at 4096^2 and 8192^2; prints a line a call, stores its kernel times in ``res``."""
    from kernels.bench.fp8_wgmma_bench import kernel_times, scaled_mm_call

    for N, K in [(4096, 4096), (8192, 8192)]:
        torch.manual_seed(0)
        w = torch.randn(N, K, device="cuda")
        w8 = w.to(torch.float8_e4m3fn)
        fns = {"scaled_mm M=16": scaled_mm_call(torch.randn(16, K, device="cuda"), w)}
        fns.update({f"stream bn{bn} split{sp} s{st}": stream(w8, bn, sp, st) for bn, sp, st in GRIDS})
        for name, fn in fns.items():
            row = kernel_times(fn)[0]
            tbs = N * K / row["us_flush_read"] / 1e6
            print(f"{N}x{K} | {name:<24} | {row['us_flush_zero']:7.2f} us after a written flush, "
                  f"{row['us_flush_read']:7.2f} after a read one ({tbs:.2f} TB/s of weights)", flush=True)
            res[f"{N}x{K} {name}"] = row


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0].replace("\n", " "))
    ap.add_argument("--decompose", action="store_true", help="only the split kernel's pieces (see above)")
    ap.add_argument("--json", help="write the figures here")
    args = ap.parse_args(argv)
    from kernels.bench.fp8_wgmma_bench import _need_hopper

    _need_hopper(ap)
    if args.json:
        open(args.json, "a").close()  # a bad path fails now, not after the measurements
    res: dict = {}
    (decompose if args.decompose else floor)(res)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

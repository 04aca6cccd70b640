"""The floor under a decode GEMM: how long the H200 takes to stream an fp8 weight [N, K] into shared memory by
TMA and do nothing else, on the grids the decode kernels use (kernels/fp8_wgmma.py: ``cdiv(N, BN)`` weight
tiles times SPLIT_K K-ranges, ``STAGES`` [BN, 128] blocks in flight a program). A kernel that multiplies
cannot be faster than this stream on its grid; _scaled_mm's time at the same shape says how much of its own
time is the stream. Kernel time by the CUDA profiler after a written and after a read flush
(gdn_bench.bench_kernels, median of 20).

Usage (CUDA, Hopper, Triton >= 3.5): python -m kernels.bench.tma_stream_floor [--json OUT]
"""
from __future__ import annotations

import argparse
import json

import torch
import triton

from kernels.fp8_wgmma import HAVE_GLUON

if HAVE_GLUON:
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


def stream(w8: torch.Tensor, BN: int, split: int, stages: int):
    """A zero-argument call that streams w8 [N, K] (e4m3fn, K a multiple of 128) on the grid (cdiv(N, BN),
    split) with ``stages`` [BN, 128] blocks in flight a program (capped at its K-blocks)."""
    from kernels.fp8_wgmma import _descriptor

    N, K = w8.shape
    kb = K // 128
    kb_per = triton.cdiv(kb, split)
    desc = _descriptor(w8, [BN, 128])
    grid = (triton.cdiv(N, BN), triton.cdiv(kb, kb_per))
    st = min(stages, kb_per)
    return lambda: _stream_kernel[grid](desc, kb, kb_per, STAGES=st, num_warps=4)


GRIDS = [(64, 1, 16), (64, 2, 16), (64, 4, 8), (64, 8, 4), (64, 16, 2), (32, 1, 16), (16, 1, 16), (128, 4, 8),
         (128, 8, 4), (128, 16, 2)]  # BN, SPLIT_K, STAGES


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0].replace("\n", " "))
    ap.add_argument("--json", help="write the figures here")
    args = ap.parse_args(argv)
    from kernels.bench.fp8_wgmma_bench import scaled_mm_call
    from kernels.bench.gdn_bench import bench_kernels

    res: dict = {}
    for N, K in [(4096, 4096), (8192, 8192)]:
        torch.manual_seed(0)
        w = torch.randn(N, K, device="cuda")
        w8 = w.to(torch.float8_e4m3fn)
        fns = {"scaled_mm M=16": scaled_mm_call(torch.randn(16, K, device="cuda"), w)}
        fns.update({f"stream bn{bn} split{sp} s{st}": stream(w8, bn, sp, st) for bn, sp, st in GRIDS})
        for name, fn in fns.items():
            row = {}
            for flush_by in ("zero", "read"):
                ms, _ = bench_kernels(fn, n=20, flush_by=flush_by)
                row[f"us_flush_{flush_by}"] = ms * 1e3
            tbs = N * K / row["us_flush_read"] / 1e6
            print(f"{N}x{K} | {name:<24} | {row['us_flush_zero']:7.2f} us after a written flush, "
                  f"{row['us_flush_read']:7.2f} after a read one ({tbs:.2f} TB/s of weights)", flush=True)
            res[f"{N}x{K} {name}"] = row
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

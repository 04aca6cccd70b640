"""The Gluon fp8 kernels (kernels/fp8_wgmma.py) against torch._scaled_mm (per-tensor fp8) and the repo's other
kernels on the H200.

* ``--prefill``: M = N = K = 4096 and 8192, 2048 x 7168 x 4096, 512 x 4096 x 4096 and 4096^3 again, median
  of do_bench (us; TFLOP/s = 2 M N K / t): _scaled_mm, the default, the TMA kernel, and kernel="wgmma"
  variants (PREFILL). Every variant's output is compared with the tile kernel's (``same``: bit-identical).
* ``--prefill-repeat R``: 4096^3 and 8192^3, R rounds of _scaled_mm, the default and the TMA kernel in
  turn: the spread of the ratio from call to call (single readings of the same config ranged 0.70-0.80 at
  8192^3 in one run).
* ``--prefill-kernel-time``: M = 128 .. 2048 x 4096 x 4096 by kernel time (there the launch path is longer
  than the kernel and do_bench times the host): _scaled_mm, the default, the TMA and the tile kernels.
* ``--decode``: M = 1, 16, 32, 64 x 4096 x 4096 and 16 x 8192 x 8192 by kernel time (CUDA profiler, L2
  flushed before each call, median of 20; gdn_bench.bench_kernels), twice: after a flush that writes
  (do_bench's: the call also pays for the write-back of the dirty lines it evicts) and after one that reads
  (clean L2): _scaled_mm, the default, session 5's default (the tile kernel), the best Triton split-K of
  session 4, and the kernel="wgmma_small_m" variants (DECODE and ROWS); each output's error against the
  float64 product (BAD at 4e-3). ``--decode-default``: without the variants; ``--decode-rows``: only ROWS;
  ``--decode-sweep``: only SWEEP, also at 32 and 64 x 8192^2; a config with UNROLL > 1 also compared bit for
  bit with UNROLL 1 in fp32 output (bf16 in runs 1-4 of session 7).

Usage (CUDA, Hopper): python -m kernels.bench.fp8_wgmma_bench [--prefill] [--prefill-repeat R]
    [--prefill-kernel-time] [--decode | --decode-default | --decode-rows | --decode-sweep] [--json OUT]
"""
from __future__ import annotations

import argparse
import json

import torch
import triton

import kernels.fp8 as F

PREFILL = {  # MODE 0: a K-block's fold overlaps the next block's wgmma (the default); 1: two K-blocks a turn, x
    # and y trading roles (no copies; spills at 255 registers under Triton 3.6); 2: no overlap.
    # ws: warp-specialised (one producer warp issues the TMA loads; _block_gemm_ws_kernel); ws2: its two
    # consumer warpgroups in two partitions, 64 rows each, never held in step (_block_gemm_ws2_kernel)
    "ws0 mode0 s4": dict(kernel="wgmma", WS=0),  # "wgmma s4 (default)" in runs 2-7's logs (WS=0 until run 6)
    "ws s4 mode2": dict(kernel="wgmma", WS=1, MODE=2),
    "ws2 s4": dict(kernel="wgmma", WS=2),
    "ws2 s5": dict(kernel="wgmma", WS=2, num_stages=5),
    "ws2 s4 r240": dict(kernel="wgmma", WS=2, CONSUMER_REGS=240),
    "ws2 s4 g16 r240": dict(kernel="wgmma", WS=2, GROUP_M=16, CONSUMER_REGS=240),
    "ws2 s5 g16 r240": dict(kernel="wgmma", WS=2, GROUP_M=16, num_stages=5, CONSUMER_REGS=240),
    "ws2 s4 bn64": dict(kernel="wgmma", WS=2, BN=64),
    "ws2 s4 (again)": dict(kernel="wgmma", WS=2),
}
DECODE = {  # BN 64 (4 warps) unless named; auto split: about two programs an SM; rot: ROTATE (see the kernel);
    # rows: SWAP_AB=False, the kernel without split-K (_rows_wgmma_kernel), stages capped by shared memory
    "wg bn64 s4": dict(kernel="wgmma_small_m", num_stages=4),
    "wg bn64 s4 rot": dict(kernel="wgmma_small_m", num_stages=4, ROTATE=True),
    "wg bn64 s3 rot": dict(kernel="wgmma_small_m", num_stages=3, ROTATE=True),
    "wg bn64 s6 rot": dict(kernel="wgmma_small_m", num_stages=6, ROTATE=True),
    "wg bn64 s8 rot": dict(kernel="wgmma_small_m", num_stages=8, ROTATE=True),
    "wg bn64 s4 rot p132": dict(kernel="wgmma_small_m", num_stages=4, ROTATE=True, PROGRAMS=132),
    "wg bn64 s4 rot p396": dict(kernel="wgmma_small_m", num_stages=4, ROTATE=True, PROGRAMS=396),
    "wg bn64 split1": dict(kernel="wgmma_small_m", SPLIT_K=1),
    "wg bn64 split2 rot": dict(kernel="wgmma_small_m", SPLIT_K=2, ROTATE=True),
}
ROWS = {
    "rows bn32 s16": dict(kernel="wgmma_small_m", SWAP_AB=False, BN=32, num_stages=16),
    "rows bn32 s8": dict(kernel="wgmma_small_m", SWAP_AB=False, BN=32, num_stages=8),
    "rows bn16 s16": dict(kernel="wgmma_small_m", SWAP_AB=False, BN=16, num_stages=16),
    "rows bn16 s32": dict(kernel="wgmma_small_m", SWAP_AB=False, BN=16, num_stages=32),
    "rows bn8 s32": dict(kernel="wgmma_small_m", SWAP_AB=False, BN=8, num_stages=32),
    "rows bn64 s16": dict(kernel="wgmma_small_m", SWAP_AB=False, BN=64, num_stages=16),
}
SWEEP = {  # session 7 (kernels/NOTES_II.md "fp8 decode, session 7"), run 4: the candidates for the defaults
    # after the four-at-a-time reduce; UNROLL K-blocks' wgmmas issued back to back (the same sums as UNROLL 1).
    # Runs 1-3 and 8 swept other tables (their logs name each config; run 8's REDUCE="spin" is gone, f23ad72)
    "wg s4 u2": dict(kernel="wgmma_small_m", num_stages=4, UNROLL=2),
    "wg s8 u2": dict(kernel="wgmma_small_m", num_stages=8, UNROLL=2),
    "wg bm32 s4": dict(kernel="wgmma_small_m", BM=32, num_stages=4),
    "wg bm32 s4 u2": dict(kernel="wgmma_small_m", BM=32, num_stages=4, UNROLL=2),
    "wg bm64 s4 u2": dict(kernel="wgmma_small_m", BM=64, num_stages=4, UNROLL=2),
    "wg bm64 split2 s8 u2": dict(kernel="wgmma_small_m", BM=64, SPLIT_K=2, num_stages=8, UNROLL=2),
    "rows bn64 s8 u4": dict(kernel="wgmma_small_m", SWAP_AB=False, BN=64, num_stages=8, UNROLL=4),
    "rows bn32 s8 u4": dict(kernel="wgmma_small_m", SWAP_AB=False, BN=32, num_stages=8, UNROLL=4),
}
SESSION4_BEST = dict(kernel="small_m", BM=16, BN=64, SPLIT_K="auto", REDUCE=2, num_warps=4, num_stages=3,
                     FAST_DIV=True)  # "s bn64 auto r2 s3" of kernels/NOTES_II.md, 10.8 us at M = 16
BOUND = 4e-3


def operands(M, N, K, dev="cuda"):
    """(x [M, K], w [N, K] fp32 standard normal, qa / sa its per-token-group quant, qb / sb the per-128x128-block
    quant of w) on ``dev``, from torch's current seed."""
    x = torch.randn(M, K, device=dev)
    w = torch.randn(N, K, device=dev)
    qa, sa = F.fp8_quant_group(x)
    qb, sb = F.fp8_quant_block_weight_ref(w)
    return x, w, qa, sa, qb, sb


def scaled_mm_call(x: torch.Tensor, w: torch.Tensor):
    """The baseline: a zero-argument call of per-tensor fp8 ``torch._scaled_mm`` on e4m3fn copies of x [M, K]
    and w [N, K] (fp32, CUDA; unit scales), bf16 [M', N] out. Rows of x are zero-padded to a multiple of 16
    (cuBLASLt wants them; the padded call a server would make: M' = 16 at M = 1)."""
    M, K = x.shape
    xa = torch.zeros(-(-M // 16) * 16, K, device=x.device, dtype=torch.float8_e4m3fn)
    xa[:M] = x.to(torch.float8_e4m3fn)
    wt = w.to(torch.float8_e4m3fn).t()
    one = torch.ones((), device=x.device)
    return lambda: torch._scaled_mm(xa, wt, scale_a=one, scale_b=one, out_dtype=torch.bfloat16)


def prefill(res: dict) -> None:
    """``--prefill`` (module docstring): prints a line a variant and stores its us and bit-identity in ``res``."""
    bench = lambda fn: triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median") * 1e3  # noqa: E731
    for M, N, K in [(4096, 4096, 4096), (8192, 8192, 8192), (2048, 7168, 4096), (512, 4096, 4096),
                    (4096, 4096, 4096)]:
        torch.manual_seed(0)
        x, w, qa, sa, qb, sb = operands(M, N, K)
        tile = F.fp8_block_gemm(qa, sa, qb, sb, config=dict(F.TILE_DEFAULT, KPI=2))
        tf = lambda us: 2 * M * N * K / us / 1e6  # noqa: E731
        shape = f"{M}x{N}x{K}" + (" (again)" if f"{M}x{N}x{K}" in res else "")
        t_mm = bench(scaled_mm_call(x, w))
        print(f"{shape}: _scaled_mm {t_mm:.1f} us {tf(t_mm):.0f} TFLOP/s", flush=True)
        res[shape] = {"scaled_mm": t_mm}
        variants = {"default": None, "tma": dict(kernel="tma")}
        variants.update(PREFILL)
        for name, cfg in variants.items():
            try:
                out = F.fp8_block_gemm(qa, sa, qb, sb, config=cfg)
                same = torch.equal(out, tile)
                t = bench(lambda cfg=cfg: F.fp8_block_gemm(qa, sa, qb, sb, config=cfg))
                print(f"{shape}: {name:28} {t:8.1f} us {tf(t):6.0f} TFLOP/s  / _scaled_mm {t_mm / t:.2f}  "
                      f"same as tile: {same}", flush=True)
                res[shape][name] = dict(us=t, same=same)
            except Exception as e:  # a config that does not build: report, go on
                print(f"{shape}: {name} FAILED {type(e).__name__}: {str(e)[:300]}", flush=True)


def kernel_times(fn, n: int = 20) -> tuple[dict, float]:
    """({"us_flush_zero": us, "us_flush_read": us}, kernels a call) of ``fn``'s GPU kernels by the CUDA profiler,
    median of ``n`` calls after a written and after a read flush of the L2 (gdn_bench.bench_kernels, whose
    errors it raises); the kernel count is the read-flush run's."""
    from kernels.bench.gdn_bench import bench_kernels

    times, nk = {}, 0.0
    for flush_by in ("zero", "read"):
        ms, nk = bench_kernels(fn, n=n, flush_by=flush_by)
        times[f"us_flush_{flush_by}"] = ms * 1e3
    return times, nk


def decode(res: dict, variants: str = "all") -> None:
    """``--decode`` (module docstring); ``variants``: "all" (DECODE and ROWS), "rows", "sweep" or "none". Prints a
    line a GEMM and stores its kernel times (us, both flushes), kernel count and error in ``res``."""
    shapes = [(1, 4096, 4096), (16, 4096, 4096), (32, 4096, 4096), (64, 4096, 4096), (16, 8192, 8192)]
    if variants == "sweep":
        shapes += [(32, 8192, 8192), (64, 8192, 8192)]
    for M, N, K in shapes:
        torch.manual_seed(0)
        x, w, qa, sa, qb, sb = operands(M, N, K)
        ref = F.fp8_block_gemm_ref(qa, sa, qb, sb, torch.float64).float()
        shape = f"{M}x{N}x{K}"
        res[shape] = {}
        fns = {"scaled_mm": scaled_mm_call(x, w),
               "default": lambda: F.fp8_block_gemm(qa, sa, qb, sb),
               "tile (session 5 default)": lambda: F.fp8_block_gemm(qa, sa, qb, sb, config=dict(
                   kernel="tile", BM=16, BN=32, GROUP_M=1, KPI=2 if M <= 16 else 1, num_warps=4, num_stages=4)),
               "small_m bn64 auto r2 s3": lambda: F.fp8_block_gemm(qa, sa, qb, sb, config=SESSION4_BEST)}
        chosen = {"all": dict(DECODE, **ROWS), "rows": ROWS, "sweep": SWEEP, "none": {}}[variants]
        fns.update({n: (lambda c=c: F.fp8_block_gemm(qa, sa, qb, sb, config=c)) for n, c in chosen.items()})
        for name, fn in fns.items():
            try:
                out = fn()
                err = None if name == "scaled_mm" else ((out.float() - ref).norm() / ref.norm()).item()
                row = dict(rel_err=err)
                if variants == "sweep" and SWEEP.get(name, {}).get("UNROLL", 1) > 1:  # the same fp32 bits as UNROLL
                    # 1? (fp32: a bf16 output hides a fold in another order; runs 1-4 compared bf16)
                    f32 = lambda u: F.fp8_block_gemm(qa, sa, qb, sb, out_dtype=torch.float32,  # noqa: E731
                                                     config=dict(SWEEP[name], UNROLL=u))
                    row["same_as_unroll1"] = bool(torch.equal(f32(SWEEP[name]["UNROLL"]), f32(1)))
                times, nk = kernel_times(fn)
                row.update(times, kernels=nk)
                e = "" if err is None else f" rel {err:.1e}" + ("" if err < BOUND else " BAD")
                if "same_as_unroll1" in row:
                    e += f" same as UNROLL 1: {row['same_as_unroll1']}"
                print(f"{shape:>16} | {name:<26} | {row['us_flush_zero']:7.2f} us after a written flush, "
                      f"{row['us_flush_read']:7.2f} after a read one ({nk:.0f} kernels){e}", flush=True)
                res[shape][name] = row
            except Exception as ex:  # keep the others
                print(f"{shape:>16} | {name:<26} | FAILED {type(ex).__name__}: {str(ex)[:300]}", flush=True)


def prefill_repeat(res: dict, rounds: int) -> None:
    """4096^3 and 8192^3, ``rounds`` rounds each timing _scaled_mm, the default and the TMA kernel in turn
    (do_bench medians): the ratio's spread from call to call, and its median."""
    import statistics

    bench = lambda fn: triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median") * 1e3  # noqa: E731
    for n in (4096, 8192):
        torch.manual_seed(0)
        x, w, qa, sa, qb, sb = operands(n, n, n)
        fns = {"scaled_mm": scaled_mm_call(x, w),
               "default": lambda: F.fp8_block_gemm(qa, sa, qb, sb),
               "tma": lambda: F.fp8_block_gemm(qa, sa, qb, sb, config=dict(kernel="tma"))}
        rows = {k: [] for k in fns}
        for r in range(rounds):
            for k, fn in fns.items():
                rows[k].append(bench(fn))
            print(f"{n}^3 round {r}: " + ", ".join(f"{k} {v[-1]:.1f} us" for k, v in rows.items())
                  + f"; default / _scaled_mm {rows['scaled_mm'][-1] / rows['default'][-1]:.3f}", flush=True)
        ratios = [m / d for m, d in zip(rows["scaled_mm"], rows["default"])]
        tma = [m / t for m, t in zip(rows["scaled_mm"], rows["tma"])]
        print(f"{n}^3: default / _scaled_mm median {statistics.median(ratios):.3f} (min {min(ratios):.3f}, "
              f"max {max(ratios):.3f}); TMA kernel median {statistics.median(tma):.3f}; _scaled_mm median "
              f"{2 * n ** 3 / statistics.median(rows['scaled_mm']) / 1e6:.0f} TFLOP/s", flush=True)
        res[f"{n}^3 repeat"] = rows


def prefill_kernel_time(res: dict) -> None:
    """Prefill shapes whose kernels are shorter than the host's launch path (do_bench would time the host):
    M = 128 .. 2048 x 4096 x 4096 by kernel time, after a written and after a read flush (see decode)."""
    for M, N, K in [(128, 4096, 4096), (256, 4096, 4096), (512, 4096, 4096), (1024, 4096, 4096),
                    (2048, 4096, 4096)]:
        torch.manual_seed(0)
        x, w, qa, sa, qb, sb = operands(M, N, K)
        tile = F.fp8_block_gemm(qa, sa, qb, sb, config=dict(F.TILE_DEFAULT, KPI=2))
        shape = f"{M}x{N}x{K} kernel time"
        res[shape] = {}
        fns = {"scaled_mm": scaled_mm_call(x, w),
               "default": lambda: F.fp8_block_gemm(qa, sa, qb, sb),
               "tma": lambda: F.fp8_block_gemm(qa, sa, qb, sb, config=dict(kernel="tma")),
               "tile kpi2": lambda: F.fp8_block_gemm(qa, sa, qb, sb, config=dict(F.TILE_DEFAULT, KPI=2))}
        for name, fn in fns.items():
            try:
                row = dict(same=None if name == "scaled_mm" else bool(torch.equal(fn(), tile)))
                row.update(kernel_times(fn)[0])
                tf = 2 * M * N * K / row["us_flush_zero"] / 1e6
                print(f"{shape:>26} | {name:<10} | {row['us_flush_zero']:8.2f} us after a written flush "
                      f"({tf:5.0f} TFLOP/s), {row['us_flush_read']:8.2f} after a read one; same as tile: "
                      f"{row['same']}", flush=True)
                res[shape][name] = row
            except Exception as ex:  # keep the others
                print(f"{shape:>26} | {name:<10} | FAILED {type(ex).__name__}: {str(ex)[:300]}", flush=True)


def _need_hopper(ap: argparse.ArgumentParser) -> None:
    # the Gluon kernels and the profiler's kernel times need a Hopper GPU and a Triton that builds them
    from kernels.fp8.wgmma import gluon_problem
    why = gluon_problem("cuda") if torch.cuda.is_available() else "no CUDA device"
    if why:
        ap.exit(2, f"{ap.prog}: error: this bench runs on a Hopper GPU: {why}\n")


def _positive_int(text: str) -> int:
    n = int(text)
    if n < 1:
        raise argparse.ArgumentTypeError(f"must be a positive int, got {text}")
    return n


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0].replace("\n", " "))
    ap.add_argument("--prefill", action="store_true")
    dec = ap.add_mutually_exclusive_group()  # one decode table a run
    dec.add_argument("--decode", action="store_true")
    ap.add_argument("--prefill-repeat", type=_positive_int, metavar="ROUNDS",
                    help="4096^3 and 8192^3: _scaled_mm, the default and the TMA kernel in turn, ROUNDS times")
    dec.add_argument("--decode-rows", action="store_true", help="--decode with only the ROWS variants")
    dec.add_argument("--decode-sweep", action="store_true",
                     help="--decode with only the SWEEP variants (those with UNROLL > 1 also checked bit for bit "
                          "against UNROLL 1, in fp32)")
    dec.add_argument("--decode-default", action="store_true",
                     help="--decode without the DECODE variants (_scaled_mm, the default and the older kernels)")
    ap.add_argument("--prefill-kernel-time", action="store_true",
                    help="M = 128 .. 2048 x 4096 x 4096 by kernel time (CUDA profiler)")
    ap.add_argument("--json", help="write the figures here")
    args = ap.parse_args(argv)
    if not (args.decode or args.decode_default or args.decode_rows or args.decode_sweep or args.prefill
            or args.prefill_repeat or args.prefill_kernel_time):
        ap.error("nothing to run: give --prefill, --prefill-repeat, --prefill-kernel-time or a --decode option")
    _need_hopper(ap)
    if args.json:
        open(args.json, "a").close()  # a bad path fails now, not after the measurements
    res: dict = {}
    if args.decode or args.decode_default or args.decode_rows or args.decode_sweep:
        decode(res, variants="all" if args.decode else "rows" if args.decode_rows
               else "sweep" if args.decode_sweep else "none")
    if args.prefill:
        prefill(res)
    if args.prefill_repeat:
        prefill_repeat(res, args.prefill_repeat)
    if args.prefill_kernel_time:
        prefill_kernel_time(res)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

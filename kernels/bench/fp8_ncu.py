"""A target for Nsight Compute: one fp8 GEMM, three calls, on fp8_wgmma_bench's inputs. The GEMM is
``scaled_mm`` (torch._scaled_mm, per-tensor) or a kernels.fp8 config as JSON (``'{"kernel": "tma"}'``).
Usage (device; ncu reads the counters on these machines with --clock-control none):

    ncu --clock-control none --section SpeedOfLight --section SchedulerStats --section WarpStateStats \\
        --section MemoryWorkloadAnalysis -k regex:gemm -s 2 -c 1 \\
        python3 -m kernels.bench.fp8_ncu 4096 4096 4096 '{"kernel": "tma"}'
"""
from __future__ import annotations

import argparse
import json

import torch

import kernels.fp8 as F
from kernels.bench.fp8_wgmma_bench import operands, scaled_mm_call


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0].replace("\n", " "))
    ap.add_argument("M", type=int)
    ap.add_argument("N", type=int)
    ap.add_argument("K", type=int)
    ap.add_argument("gemm", help="scaled_mm, or a kernels.fp8 config as JSON")
    a = ap.parse_args(argv)
    torch.manual_seed(0)
    x, w, qa, sa, qb, sb = operands(a.M, a.N, a.K)
    if a.gemm == "scaled_mm":
        fn = scaled_mm_call(x, w)
    else:
        cfg = json.loads(a.gemm)
        fn = lambda: F.fp8_block_gemm(qa, sa, qb, sb, config=cfg)  # noqa: E731
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

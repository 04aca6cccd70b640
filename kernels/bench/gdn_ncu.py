"""A target for Nsight Compute: gdn_seq at the bench shape (B=1, H=16, HV=32, K=V=128, bf16 q/k/v, fp32 state),
T tokens, three calls, on kernels/bench/gdn_bench.py's inputs. Usage (device; ncu reads the counters on
Firecracker machines, give it --clock-control none):

    ncu --clock-control none --section WarpStateStats --section SchedulerStats --section LaunchStats \\
        -k regex:_gdn_seq_kc -s 2 -c 1 python3 -m kernels.bench.gdn_ncu 16

(kernels/bench/results/2026-11-30_h200_ncu_gdn_seq_T16.log and _T1024.log were taken with an earlier, uncommitted
copy of this script, .devrun/ncu_gdn.py, whose second argument, 0, was the lookahead flag since removed, and whose
own inputs had g in [-0.1, 0] instead of the bench's [-0.51, -0.01]: every group stays on the scaled path with
either.)
"""
from __future__ import annotations

import argparse

import torch

from kernels.bench.gdn_bench import inputs
from kernels.gdn import gdn_seq


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("T", type=int, nargs="?", default=16, help="tokens (default 16)")
    T = ap.parse_args(argv).T
    gen = torch.Generator(device="cuda")
    gen.manual_seed(0)
    q, k, v, g, beta, st = inputs(T, gen)
    idx = torch.zeros(1, dtype=torch.int32, device="cuda")
    for _ in range(3):
        gdn_seq(q, k, v, g, beta, st, idx, KC=4)
    torch.cuda.synchronize()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

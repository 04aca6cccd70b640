"""A target for Nsight Compute: gdn_seq at the bench shape (B=1, H=16, HV=32, K=V=128, bf16 q/k/v, fp32 state),
T tokens, three calls. Usage (device; ncu reads the counters on Firecracker machines, give it
--clock-control none):

    ncu --clock-control none --section WarpStateStats --section SchedulerStats --section LaunchStats \\
        -k regex:_gdn_seq_kc -s 2 -c 1 python3 -m kernels.bench.gdn_ncu 16

(kernels/bench/results/2026-11-30_h200_ncu_gdn_seq_T16.log and _T1024.log were taken with this script, then at
.devrun/ncu_gdn.py, whose second argument, 0, was the lookahead flag since removed.)
"""
from __future__ import annotations

import argparse

import torch

from kernels.gdn import gdn_seq


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("T", type=int, nargs="?", default=16, help="tokens (default 16)")
    T = ap.parse_args(argv).T
    g0 = torch.Generator(device="cuda")
    g0.manual_seed(0)
    q = torch.randn(1, T, 16, 128, device="cuda", generator=g0).bfloat16()
    k = torch.nn.functional.normalize(torch.randn(1, T, 16, 128, device="cuda", generator=g0), dim=-1).bfloat16()
    v = torch.randn(1, T, 32, 128, device="cuda", generator=g0).bfloat16()
    g = -torch.rand(1, T, 32, device="cuda", generator=g0) * 0.1
    beta = torch.rand(1, T, 32, device="cuda", generator=g0)
    st = torch.randn(1, 32, 128, 128, device="cuda", generator=g0)
    idx = torch.zeros(1, dtype=torch.int32, device="cuda")
    for _ in range(3):
        gdn_seq(q, k, v, g, beta, st, idx, KC=4)
    torch.cuda.synchronize()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Host cost of one gdn_seq call without its launch: argument checks, views, strides and the cached-launch key
(kernels/_launch.py), with ``Launcher.__call__`` replaced by a stub that computes the key and launches nothing.
Runs anywhere (CPU tensors, no GPU, no kernel): the wrapper's Python time is what it measures.

Usage: python -m kernels.bench.host_cost [--calls 5000] [--profile]
"""
from __future__ import annotations

import argparse
import cProfile
import pstats
import time

import torch

import kernels._launch as L
import kernels.gdn as G


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--calls", type=int, default=5000)
    ap.add_argument("--profile", action="store_true", help="also print cProfile's top entries")
    args = ap.parse_args(argv)

    def stub(self, grid, a, **opts):  # the key is part of the cost being measured
        self.key(a, tuple(sorted(opts.items())))

    L.Launcher.__call__ = stub
    B, T, H, HV, K, V = 1, 16, 16, 32, 128, 128
    q = torch.randn(B, T, H, K).bfloat16()
    k = torch.randn(B, T, H, K).bfloat16()
    v = torch.randn(B, T, HV, V).bfloat16()
    g, beta = torch.randn(B, T, HV), torch.rand(B, T, HV)
    st, idx = torch.zeros(1, HV, V, K), torch.zeros(1, dtype=torch.int32)
    for _ in range(200):
        G.gdn_seq(q, k, v, g, beta, st, idx)
    t0 = time.perf_counter()
    for _ in range(args.calls):
        G.gdn_seq(q, k, v, g, beta, st, idx)
    us = (time.perf_counter() - t0) / args.calls * 1e6
    print(f"gdn_seq host cost without the launch: {us:.1f} us a call ({args.calls} calls, T={T})")
    if args.profile:
        pr = cProfile.Profile()
        pr.enable()
        for _ in range(2000):
            G.gdn_seq(q, k, v, g, beta, st, idx)
        pr.disable()
        pstats.Stats(pr).sort_stats("tottime").print_stats(10)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""One-GPU benchmark of the one-shot all-reduce kernel's protocol: W ranks simulated as W streams of one GPU
(simulate_ranks_cuda), calls per second and correctness for the fixed and size-following grids. Real
multi-GPU latency needs several GPUs of one host (not lent to this tree's runs so far).

Usage (device): python -m kernels.bench.allreduce_bench
"""
from __future__ import annotations

from kernels.allreduce import simulate_ranks_cuda


def main() -> None:
    for W in (2, 4):
        for grid in ("fixed", "size-following"):
            r = simulate_ranks_cuda(W, 1000, grid=grid)
            print(f"W={W} {grid}: {r.iterations} calls in {r.wall_s * 1e3:.1f} ms "
                  f"({r.wall_s / r.iterations * 1e6:.1f} us a call, all ranks), wrong {r.wrong_outputs}, "
                  f"mismatched {r.mismatched_ranks}", flush=True)


if __name__ == "__main__":
    main()

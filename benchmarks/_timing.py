"""Timing helpers of the benchmarks (CUDA): eager calls back to back, do_bench, CUDA-graph replay."""
from __future__ import annotations

import statistics
import sys
import time

import torch


def _cycle(fns):
    fns = list(fns) if isinstance(fns, (list, tuple)) else [fns]
    state = [0]

    def call():
        i = state[0]
        state[0] = (i + 1) % len(fns)
        return fns[i]()

    return call, len(fns)


def eager_loop(fns, min_ms: float = 40.0, reps: int = 5) -> float:
    """us per call of calls issued back to back with one sync at the end (no cache flush between them; ``fns``:
    one callable, or several on distinct operands taken in turn, so that the working set can exceed the L2):
    the rate a caller issuing layer after layer sees, host included (bound by the host's time per call when that
    exceeds the GPU's). Median of ``reps`` rounds of at least ``min_ms`` each."""
    fn, k = _cycle(fns)
    for _ in range(3 * k):
        fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    fn()
    torch.cuda.synchronize()
    one = max(time.perf_counter() - t0, 1e-6)
    n = max(5, min(2000, int(min_ms / 1e3 / one)))
    out = []
    for _ in range(reps):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        torch.cuda.synchronize()
        out.append((time.perf_counter() - t0) / n * 1e6)
    return statistics.median(out)


def host_us(fns, n: int = 200) -> float:
    """us of host time per call (the calls' issue time, the GPU left to run behind; one sync at the end not
    counted): what the launch path costs the host."""
    fn, k = _cycle(fns)
    for _ in range(3 * k):
        fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    t1 = time.perf_counter()
    torch.cuda.synchronize()
    return (t1 - t0) / n * 1e6


def do_bench_us(fn) -> float:
    """triton.testing.do_bench median in us (an L2 flush before each call; host included where it is slower
    than the flush and the call together)."""
    import triton.testing

    return triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median") * 1e3


def graph_us(fns, replays: int = 24) -> float:
    """us per call of ``replays`` calls (``fns`` taken in turn, as :func:`eager_loop`) captured into one CUDA
    graph, median of graph replays: the GPU's time without the host's. NaN when it cannot be captured."""
    fn, k = _cycle(fns)
    replays = max(replays // k, 1) * k
    try:
        for _ in range(k):
            fn()
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            for _ in range(k):
                fn()
        torch.cuda.current_stream().wait_stream(s)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            for _ in range(replays):
                fn()
        torch.cuda.synchronize()
        ts = []
        for _ in range(15):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            g.replay()
            b.record()
            b.synchronize()
            ts.append(a.elapsed_time(b) * 1e3 / replays)
        return statistics.median(ts[3:])
    except Exception as e:  # a host sync inside fn, say
        print(f"graph capture failed: {type(e).__name__}: {str(e)[:200]}", file=sys.stderr)
        return float("nan")

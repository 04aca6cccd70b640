"""Timing helpers of the benchmarks (CUDA): calls back to back, host time per call, do_bench, CUDA-graph replay, the
kernels' own durations from the CUDA profiler, and a warm-up that brings the SM clocks up first.

Every function takes zero-argument callables; those taking ``fns`` accept one callable or several on distinct
operands, called in turn (so that the working set can exceed the L2)."""
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


def do_bench_us(fn, warmup: int = 25, rep: int = 100) -> float:
    """triton.testing.do_bench median in us (an L2 flush before each call; host included where it is slower
    than the flush and the call together), after :func:`warm_clocks`."""
    import triton.testing

    fn()
    torch.cuda.synchronize()
    warm_clocks()
    return triton.testing.do_bench(fn, warmup=warmup, rep=rep, return_mode="median") * 1e3


def kernel_us(fn, n: int = 40, flush_by: str = "zero") -> tuple[float, float]:
    """(median us, kernels per call) of the GPU kernels one call of ``fn`` launches, from the CUDA profiler
    (CUPTI): per call the sum of its kernels' durations, the L2 flushed before each call. The kernels' own
    time: neither the host's launch cost nor the graph-launch and event gaps that :func:`graph_us` includes
    (a floor of ~8 us on the H200 for a single call: a few hundred ns of work read 9.8 us).

    ``flush_by``: "zero" writes a 256 MiB buffer as do_bench does, which leaves the L2 full of dirty lines, so
    a call that streams more than a few MiB from DRAM also pays for writing them back as it evicts them;
    "read" sums the buffer instead (clean lines: the call's DRAM traffic is its own, as for a decode step's
    weights after the previous layer's). A marker kernel on both sides of each call delimits its kernels (the
    read flush launches two kernels).

    Raises:
        ValueError: ``flush_by`` not "zero" / "read", or ``n`` not a positive int (before any CUDA call).
        RuntimeError: the profiler did not record two marker kernels a call."""
    if flush_by not in ("zero", "read"):
        raise ValueError(f"flush_by must be 'zero' or 'read', got {flush_by!r}")
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"n must be a positive int (calls to time), got {n!r}")
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize()
    flush = torch.empty(64 * 1024 * 1024, dtype=torch.int32, device="cuda")  # 256 MiB, > the 50 MB L2
    warm_clocks()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(n):
            if flush_by == "zero":
                flush.zero_()
            else:
                flush.sum()
            torch.cuda._sleep(20_000)  # marker kernels ("spin") around the call: its kernels are between them
            fn()
            torch.cuda._sleep(1_000)
        torch.cuda.synchronize()
    ev = sorted((e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA
                 and e.time_range.elapsed_us() >= 0 and "Memcpy" not in e.name and "Memset" not in e.name),
                key=lambda e: e.time_range.start)
    marks = [i for i, e in enumerate(ev) if "spin" in e.name]
    if len(marks) != 2 * n:
        raise RuntimeError(f"profiler: {len(marks)} marker kernels for {n} calls (expected {2 * n})")
    per_call, counts = [], []
    for i, end in zip(marks[0::2], marks[1::2]):
        ks = ev[i + 1:end]
        per_call.append(sum(e.time_range.elapsed_us() for e in ks))
        counts.append(len(ks))
    per_call.sort()
    return per_call[n // 2], sum(counts) / n


_SPIN: list = []


def warm_clocks(ms: float = 60.0) -> None:
    """Keep the SMs busy for ``ms`` so that the clocks are up before a measurement (a compile leaves the GPU
    idle, and an idle H200 drops its SM clock to ~345 MHz)."""
    from benchmarks._fma import fma_probe  # Triton is imported only where a kernel runs

    if not _SPIN:
        sms = torch.cuda.get_device_properties(torch.cuda.current_device()).multi_processor_count
        _SPIN.append(torch.randn(sms * 64 * 1024, device="cuda"))
        _SPIN.append(torch.empty_like(_SPIN[0]))
    x, y = _SPIN
    t0 = torch.cuda.Event(enable_timing=True)
    t1 = torch.cuda.Event(enable_timing=True)
    t0.record()
    done = 0.0
    while done < ms:
        for _ in range(8):
            fma_probe(x, y, 256)
        t1.record()
        t1.synchronize()
        done = t0.elapsed_time(t1)


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

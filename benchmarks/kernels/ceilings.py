"""The measured ceilings a benchmark's floor is taken against (CUDA): what the device does at best for bytes moved
and for arithmetic, measured on the device of the run, once per run.

* ``copy``: device-to-device copy bandwidth, bytes read + written a second (a 2 GiB ``copy_``);
* ``fp32_fma``: fp32 FMA rate of an elementwise-free FMA loop (:func:`benchmarks._fma.fma_probe`, 4 chains a
  thread), flop/s (an FMA counts 2);
* ``fp8_mma``: fp8 tensor-core rate, flop/s of per-tensor ``torch._scaled_mm`` at 8192^3 (cuBLASLt);
* ``h2d_pinned``: pinned host-to-device copy bandwidth of the message's own size (20 copies back to back,
  median of 3), bytes a second: it depends on the size, so the floor names the size;
* ``peer_copy``: GPU 1 -> GPU 0 copy bandwidth of 256 MiB (two GPUs of one host), bytes a second.
"""
from __future__ import annotations

import statistics
import time

import torch

from benchmarks._fma import fma_probe
from benchmarks._timing import do_bench_us


def _do_bench_ms(fn) -> float:
    return do_bench_us(fn, warmup=50, rep=300) / 1e3


def copy() -> float:
    n = 1 << 29  # 2 GiB of fp32
    a = torch.randn(n, device="cuda")
    b = torch.empty_like(a)
    ms = _do_bench_ms(lambda: b.copy_(a))
    del a, b
    torch.cuda.empty_cache()
    return 2 * n * 4 / (ms * 1e-3)


def fp32_fma() -> float:
    sms = torch.cuda.get_device_properties(torch.cuda.current_device()).multi_processor_count
    x = torch.randn(sms * 64 * 1024, device="cuda")
    y = torch.empty_like(x)
    it = 4096
    ms = _do_bench_ms(lambda: fma_probe(x, y, it))
    return x.numel() * it * 4 * 2 / (ms * 1e-3)


def fp8_mma() -> float:
    n = 8192
    a = torch.randn(n, n, device="cuda").to(torch.float8_e4m3fn)
    b = torch.randn(n, n, device="cuda").to(torch.float8_e4m3fn).t()
    one = torch.ones((), device="cuda")
    ms = _do_bench_ms(lambda: torch._scaled_mm(a, b, scale_a=one, scale_b=one, out_dtype=torch.bfloat16))
    return 2 * n ** 3 / (ms * 1e-3)


def h2d_pinned(nbytes: int, reps: int = 20, runs: int = 3) -> float:
    src = torch.empty(nbytes, dtype=torch.uint8).pin_memory()
    dst = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    dst.copy_(src, non_blocking=True)
    torch.cuda.synchronize()
    rates = []
    for _ in range(runs):
        t0 = time.perf_counter()
        for _ in range(reps):
            dst.copy_(src, non_blocking=True)
        torch.cuda.synchronize()
        rates.append(nbytes * reps / (time.perf_counter() - t0))
    return statistics.median(rates)


def peer_copy() -> float:
    if torch.cuda.device_count() < 2:
        return float("nan")
    n = 1 << 26  # 256 MiB of fp32
    src = torch.randn(n, device="cuda:1")
    dst = torch.empty(n, device="cuda:0")
    ms = _do_bench_ms(lambda: dst.copy_(src))
    return n * 4 / (ms * 1e-3)


CEILINGS = {"copy": copy, "fp32_fma": fp32_fma, "fp8_mma": fp8_mma, "h2d_pinned": h2d_pinned,
            "peer_copy": peer_copy}
UNITS = {"copy": "B/s", "fp32_fma": "flop/s", "fp8_mma": "flop/s", "h2d_pinned": "B/s", "peer_copy": "B/s"}


class Ceilings:
    """The ceilings of one run, each measured on first use (``h2d_pinned`` once per size)."""

    def __init__(self):
        self.values: dict[str, float] = {}

    def get(self, name: str, size: int | None = None) -> float:
        key = name if size is None else f"{name}@{size}"
        if key not in self.values:
            fn = CEILINGS[name]
            self.values[key] = fn(size) if size is not None else fn()
        return self.values[key]

"""The reference of the one-shot all-reduce: a CPU model of its protocol (:func:`race_test`), one process per rank
over ``multiprocessing.shared_memory``, every output checked bitwise against the exact fixed-order sum (the
package docstring, kernels/allreduce/__init__.py, gives the protocol)."""
from __future__ import annotations

import os
import time
import zlib

import numpy as np

from kernels._util import cdiv
from kernels.allreduce.common import (DEFAULT_BLOCKS, DEFAULT_CAP, DEFAULT_CHUNK, GRIDS, RaceResult, _blocks,
                                      message_sizes)


class _Shm:
    """The shared segment: data [W, 2, cap] f32, flags [W, G, 2] i64, counters [W, G] i64, hashes [W, iters]
    u32, wrong [W] i64, done [W] i64."""

    def __init__(self, W: int, G: int, cap: int, iters: int):
        from multiprocessing import shared_memory

        self.shapes = [("data", (W, 2, cap), np.float32), ("flags", (W, G, 2), np.int64),
                       ("counters", (W, G), np.int64), ("hashes", (W, iters), np.uint32),
                       ("wrong", (W,), np.int64), ("done", (W,), np.int64)]
        size = sum(int(np.prod(s)) * np.dtype(d).itemsize + 64 for _, s, d in self.shapes)
        self.shm = shared_memory.SharedMemory(create=True, size=size)
        off = 0
        for name, shape, dt in self.shapes:
            a = np.ndarray(shape, dtype=dt, buffer=self.shm.buf, offset=off)
            a[...] = 0
            setattr(self, name, a)
            off += int(np.prod(shape)) * np.dtype(dt).itemsize
            off = (off + 63) // 64 * 64

    def close(self) -> None:
        for name, _, _ in self.shapes:
            setattr(self, name, None)
        self.shm.close()
        self.shm.unlink()


def _sleep_us(us: float) -> None:
    if us > 0:
        time.sleep(us * 1e-6)


def _rank_main(rank, W, G, chunk, cap, grid, sizes, pools, offsets, seed, max_skew_us, shm, barrier,
               timeout_s):
    rng = np.random.default_rng([seed, rank, 0xA11])
    data, flags, counters = shm.data, shm.flags, shm.counters
    out = np.empty(cap, dtype=np.float32)
    barrier.wait()
    deadline = time.monotonic() + timeout_s
    wrong = 0
    p_skew = 0.25  # each place a rank may be delayed, with this probability, by up to max_skew_us
    for i, n in enumerate(sizes):
        n = int(n)
        x = pools[rank][offsets[i]: offsets[i] + n]
        nb = _blocks(n, grid, G, chunk)
        sl = cdiv(n, nb)
        order = rng.permutation(nb) if rng.random() < 0.5 else range(nb)
        if rng.random() < p_skew:
            _sleep_us(rng.uniform(0, max_skew_us))
        # phase 1: every block advances its counter, copies its slice into its half, signals
        act = []
        for b in order:
            c = counters[rank, b] + 1
            counters[rank, b] = c
            h = c % 2
            lo, hi = b * sl, min(n, (b + 1) * sl)
            if lo >= hi:
                continue  # no data: only the counter moves
            data[rank, h, lo:hi] = x[lo:hi]
            flags[rank, b, h] = c
            act.append((b, c, h, lo, hi))
        if rng.random() < p_skew:
            _sleep_us(rng.uniform(0, max_skew_us))
        # phase 2: each block waits for its peers' flags, then sums in rank order
        for b, c, h, lo, hi in act:
            for p in range(W):
                spins = 0
                while flags[p, b, h] < c:
                    spins += 1
                    if spins % 64 == 0:
                        if time.monotonic() > deadline:
                            raise TimeoutError(f"rank {rank} waited for rank {p} block {b} at iteration {i}")
                        time.sleep(0)
                    os.sched_yield()
            acc = data[0, h, lo:hi].copy()
            for p in range(1, W):
                if rng.random() < p_skew / W:
                    _sleep_us(rng.uniform(0, max_skew_us))
                acc += data[p, h, lo:hi]
            out[lo:hi] = acc
        exp = pools[0][offsets[i]: offsets[i] + n].copy()
        for p in range(1, W):
            exp += pools[p][offsets[i]: offsets[i] + n]
        if not np.array_equal(out[:n].view(np.uint32), exp.view(np.uint32)):
            wrong += 1
        shm.hashes[rank, i] = zlib.crc32(out[:n].tobytes())
    shm.wrong[rank] = wrong
    shm.done[rank] = 1


def race_test(world_size: int, iterations: int, grid: str = "fixed", seed: int = 0, max_skew_us: int = 200,
              blocks: int = DEFAULT_BLOCKS, chunk: int = DEFAULT_CHUNK, cap: int = DEFAULT_CAP,
              timeout_s: float = 300.0) -> RaceResult:
    """Run the CPU model of the one-shot all-reduce with ``world_size`` processes for ``iterations`` calls,
    ranks out of step, message sizes alternating small / large; count outputs that differ from the exact
    fixed-order sum. ``grid="size-following"`` reproduces the seeds' race; ``"fixed"`` is the fix.

    Raises:
        ValueError: bad arguments. TimeoutError / RuntimeError: a rank hung or died.
    """
    import multiprocessing as mp

    if world_size < 1:
        raise ValueError("world_size must be >= 1")
    if grid not in GRIDS:
        raise ValueError(f"grid must be one of {GRIDS}, got {grid!r}")
    sizes = message_sizes(iterations, cap, seed)
    prng = np.random.default_rng([seed, 0xF00D])
    pool_len = 8 * cap
    pools = [prng.standard_normal(pool_len, dtype=np.float32) for _ in range(world_size)]
    offsets = prng.integers(0, pool_len - cap, size=iterations)
    shm = _Shm(world_size, blocks, cap, iterations)
    ctx = mp.get_context("fork")
    barrier = ctx.Barrier(world_size)
    procs = [ctx.Process(target=_rank_main, args=(r, world_size, blocks, chunk, cap, grid, sizes, pools, offsets,
                                                 seed, max_skew_us, shm, barrier, timeout_s), daemon=True)
             for r in range(world_size)]
    t0 = time.perf_counter()
    try:
        for p in procs:
            p.start()
        for p in procs:
            p.join(timeout_s + 30)
        wall = time.perf_counter() - t0
        if any(p.is_alive() for p in procs):
            raise TimeoutError(f"race_test: a rank did not finish in {timeout_s + 30:.0f} s")
        if not all(shm.done) or any(p.exitcode for p in procs):
            raise RuntimeError(f"race_test: a rank failed (exit codes {[p.exitcode for p in procs]})")
        wrong = int(shm.wrong.sum())
        mism = int((shm.hashes != shm.hashes[0:1]).any(axis=0).sum())
        return RaceResult(world_size, iterations, grid, wrong, mism, wall)
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
                p.join(5)
        shm.close()

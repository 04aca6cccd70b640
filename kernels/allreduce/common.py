"""What the all-reduce's CPU model and its CUDA kernel share: the grids, the defaults, the number of blocks a
message runs on, the test's message sizes and its result."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from kernels._util import cdiv

GRIDS = ("fixed", "size-following")
DEFAULT_BLOCKS = 8          # G: the fixed grid (and the size-following grid's cap)
DEFAULT_CHUNK = 64          # size-following: elements per block
DEFAULT_CAP = 1024          # elements per half


def _blocks(n: int, grid: str, G: int, chunk: int) -> int:
    if grid == "fixed":
        return G
    if grid == "size-following":
        return max(1, min(G, cdiv(n, chunk)))
    raise ValueError(f"grid must be one of {GRIDS}, got {grid!r}")


def message_sizes(iterations: int, cap: int, seed: int) -> np.ndarray:
    """Alternating small (1..cap/2) and large (cap/2+1..cap) message sizes, reproducible from the seed."""
    rng = np.random.default_rng([seed, 0x5153])
    small = rng.integers(1, cap // 2 + 1, size=iterations)
    large = rng.integers(cap // 2 + 1, cap + 1, size=iterations)
    return np.where(np.arange(iterations) % 2 == 0, small, large).astype(np.int64)


@dataclass
class RaceResult:
    """What :func:`race_test` saw. ``wrong_outputs``: (rank, iteration) outputs that differ from the exact
    fixed-order sum; ``mismatched_ranks``: iterations in which the ranks' outputs were not all identical."""

    world_size: int
    iterations: int
    grid: str
    wrong_outputs: int
    mismatched_ranks: int
    wall_s: float

"""One-shot all-reduce over peer buffers, any world size, and a CPU model of the same protocol.

The protocol (one call = one message of ``n`` elements, ``n <= cap``), per rank ``r``:

* every rank owns a scratch of two halves of ``cap`` elements, readable by every peer, and per block ``b`` and
  half ``h`` a flag (peer-visible) and a counter (private);
* the launch grid is a FIXED number ``G`` of blocks whatever ``n``. Block ``b`` handles the slice
  ``[b * ceil(n/G), min(n, (b+1) * ceil(n/G)))``. EVERY block advances its counter on EVERY call
  (``c = counter[b] + 1``) and uses half ``h = c % 2``, so all blocks of all ranks agree on the half;
  a block without data does nothing else;
* a block with data copies its input slice into its half, then sets ``flag[r][b][h] = c`` (release), waits
  until ``flag[p][b][h] >= c`` for every peer ``p`` (acquire), and writes
  ``out = buf[0][h] + buf[1][h] + ... + buf[W-1][h]`` over its slice: a fixed rank order, so every rank
  gets identical bits (the exact fixed-order sum of the inputs).

Why two halves are enough: rank r writes half h again at call c+2 only after finishing call c+1, which needed
every peer's flag of call c+1 for block 0 (a message has at least one element, so block 0 always has data);
a peer sets that only after finishing call c, i.e. after reading half h of call c.

The bug of the seeds (``grid="size-following"``, a test-only switch): the number of blocks followed the
message size (``min(G, ceil(n / chunk))``) and only the blocks that ran advanced their counters. After a
message of few blocks, the next larger message's extra blocks have lagging counters and pick the half the
previous message used, and their slices (sized for the new ``n``) overlap the previous message's rows: a fast
rank overwrites data a slow rank has not read yet. Garbage appears only when ranks are out of step (overload).

Two implementations:

* :func:`race_test` runs the CPU model: one process per rank over ``multiprocessing.shared_memory``, the grid
  modelled as ``G`` blocks that each copy their slice and signal (all blocks' copies first, as concurrent GPU
  blocks may), then each wait and sum; ranks deliberately out of step (random sleeps, random block order),
  message sizes alternating small / large, every output checked bitwise against the exact fixed-order sum.
* :class:`OneShotAllReduce` (CUDA, Triton): the same protocol over peer pointers from torch's symmetric memory
  (``torch.distributed._symmetric_memory``; CUDA IPC handles as the fallback; plain peer loads and flag
  atomics, never multicast / multimem). Its GPU gate is the race test on 2+ GPUs, one process per GPU
  (tests/kernels/allreduce/test_race.py::test_cuda_race_on_several_gpus, which runs
  tests/kernels/allreduce/multigpu_race.py). Its latency against NCCL: the ``allreduce`` entry of the kernel
  benchmarks (benchmarks/kernels).
  :func:`simulate_ranks_cuda` runs W "ranks" as W streams of ONE GPU; the GPU does not run the streams'
  spinning kernels concurrently, so its flag waits time out (kept as an xfail record, not a gate).

Modules: :mod:`kernels.allreduce.one_shot` (the Triton kernel and OneShotAllReduce), :mod:`kernels.allreduce.reference`
(the CPU model), :mod:`kernels.allreduce.common` (what both share). The design and the H200 figures:
docs/kernels/allreduce.md.
"""
from kernels.allreduce.common import (DEFAULT_BLOCKS, DEFAULT_CAP, DEFAULT_CHUNK, GRIDS, RaceResult,
                                      message_sizes)
from kernels.allreduce.one_shot import OneShotAllReduce, simulate_ranks_cuda
from kernels.allreduce.reference import race_test

__all__ = ["OneShotAllReduce", "race_test", "simulate_ranks_cuda", "RaceResult", "message_sizes", "GRIDS",
           "DEFAULT_BLOCKS", "DEFAULT_CHUNK", "DEFAULT_CAP"]

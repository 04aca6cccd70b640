"""The one-shot all-reduce's race test on several GPUs of one host (the harness of
tests/kernels/allreduce/test_race.py::test_cuda_race_on_several_gpus; its latency against NCCL is the
``allreduce`` entry of the kernel benchmarks, ``python -m benchmarks.kernels --op allreduce``).

One process per GPU (torch.multiprocessing), an NCCL process group, :class:`kernels.allreduce.OneShotAllReduce`
over peer memory (torch symmetric memory, CUDA IPC as the fallback). NVLink multicast stays off: this
script sets NCCL_NVLS_ENABLE=0, TORCH_SYMM_MEM_DISABLE_MULTICAST=1 and NVSHMEM_DISABLE_NVLS=1 before any
CUDA or NCCL initialisation, and the kernel uses plain peer loads/stores and flag atomics only.

Race test (per grid: the fixed grid, and the seeds' size-following grid behind the test-only switch):
blocks of K calls with message sizes alternating small (1..cap/2) and large (cap/2+1..cap)
(:func:`kernels.allreduce.message_sizes`), inputs drawn from per-rank pools at offsets every rank can
recompute, and ranks deliberately out of step: each rank, on each call with probability ``p_delay``, holds
for a random 0..``max_delay_us`` between its flag waits and its reads (a device-side wait on %globaltimer,
the window in which a racing peer can overwrite a half still being read). Every output is checked bitwise
against the exact fixed-order sum (0 + x_0 + x_1 + ... in float32), and the ranks' outputs are compared
with each other (a 64-bit checksum per call, gathered). Run eagerly, and as CUDA graphs: one graph of K calls
captured once and replayed with fresh inputs and delays written into its static buffers.

Usage (2+ GPUs): python -m tests.kernels.allreduce.multigpu_race [--world-size W] [--iters-blocks 80]
    [--graph-replays 60] [--json OUT.json]
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

for _k, _v in (("NCCL_NVLS_ENABLE", "0"), ("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1"), ("NVSHMEM_DISABLE_NVLS", "1")):
    os.environ[_k] = _v  # forced, not defaulted: multicast can take a shared host's GPUs out of service

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

from kernels.allreduce import OneShotAllReduce, message_sizes  # noqa: E402

def _log(rank, *a):
    if rank == 0:
        print(*a, flush=True)


class _Race:
    """Static buffers for blocks of K calls: own inputs [K, cap], outputs [K, cap], delays [K] (ns)."""

    def __init__(self, ar: OneShotAllReduce, K: int, cap: int, seed: int, dev):
        self.ar, self.K, self.cap, self.dev = ar, K, cap, dev
        self.W, self.rank = ar.W, ar.rank
        self.pool_len = 8 * cap
        self.pools = []
        for p in range(self.W):
            g = torch.Generator(device=dev).manual_seed(seed * 1000 + p)
            self.pools.append(torch.randn(self.pool_len, generator=g, device=dev))
        self.ins = torch.zeros(K, cap, device=dev)
        self.outs = torch.zeros(K, cap, device=dev)
        self.delays = torch.zeros(K, dtype=torch.int64, device=dev)
        self.ar_idx = torch.arange(cap, device=dev)

    def fill(self, block: int, seed: int, sizes: np.ndarray, p_delay: float, max_delay_us: float):
        """Write block ``block``'s inputs (offsets shared by all ranks) and this rank's delays."""
        rng = np.random.default_rng([seed, block, 0xB10C])
        offs = torch.tensor(rng.integers(0, self.pool_len - self.cap, size=self.K), device=self.dev)
        self.idx = offs[:, None] + self.ar_idx[None, :]
        self.ins.copy_(self.pools[self.rank][self.idx])
        self.outs.fill_(float("nan"))
        mine = np.random.default_rng([seed, block, self.rank, 0xDE1A])
        d = np.where(mine.random(self.K) < p_delay, mine.uniform(0, max_delay_us * 1e3, self.K), 0)
        self.delays.copy_(torch.tensor(d.astype(np.int64)))
        self.sizes = sizes

    def calls(self, grid: str):
        for j in range(self.K):
            n = int(self.sizes[j])
            self.ar.allreduce(self.ins[j, :n], out=self.outs[j, :n], grid=grid, delay=self.delays[j:j + 1])

    def check(self) -> tuple[int, torch.Tensor]:
        """(wrong outputs of this rank in the block, per-call checksums [K] int64)."""
        exp = torch.zeros(self.K, self.cap, device=self.dev)
        for p in range(self.W):
            exp += self.pools[p][self.idx]
        n = torch.tensor(self.sizes[: self.K].astype(np.int64), device=self.dev)
        mask = self.ar_idx[None, :] < n[:, None]
        bits_o = self.outs.view(torch.int32)
        bad = ((bits_o != exp.view(torch.int32)) & mask).any(dim=1)
        w = (self.ar_idx.to(torch.int64) * 2654435761 + 1)[None, :]
        csum = torch.where(mask, bits_o.to(torch.int64) * w, 0).sum(dim=1)
        return int(bad.sum()), csum


def race(ar, grid: str, blocks: int, K: int, cap: int, seed: int, graph: bool, p_delay: float,
         max_delay_us: float, dev) -> dict:
    """Run ``blocks`` blocks of K calls (eager, or one captured graph replayed ``blocks`` times)."""
    r = _Race(ar, K, cap, seed, dev)
    sizes = message_sizes(K, cap, seed)  # the same alternating pattern in every block
    wrong = mism = 0
    t0 = time.perf_counter()
    g = None
    if graph:
        r.fill(blocks + 1000, seed, sizes, 0.0, 0.0)
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            r.calls(grid)  # warm-up: compiles; also a real block, checked below
        torch.cuda.current_stream().wait_stream(s)
        torch.cuda.synchronize()
        w0, _ = r.check()
        wrong += w0
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            r.calls(grid)
    before = ar.timeouts
    for b in range(blocks):
        r.fill(b, seed, sizes, p_delay, max_delay_us)
        if graph:
            g.replay()
        else:
            r.calls(grid)
        torch.cuda.synchronize()
        w, csum = r.check()
        wrong += w
        allc = [torch.empty_like(csum) for _ in range(ar.W)]
        dist.all_gather(allc, csum, group=ar.group)
        mism += int(torch.stack(allc).ne(allc[0][None]).any(dim=0).sum())
    calls = blocks * K + (K if graph else 0)
    wrong_t = torch.tensor([wrong], device=dev)
    dist.all_reduce(wrong_t, group=ar.group)
    return dict(grid=grid, graph=graph, calls_per_rank=calls, checked_calls=calls, wrong_outputs_all_ranks=int(wrong_t),
                wrong_outputs_rank0=wrong, mismatched_calls=mism, flag_wait_timeouts=ar.timeouts - before,
                wall_s=round(time.perf_counter() - t0, 2))


def worker(rank: int, W: int, args, port: int) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.cuda.set_device(rank)
    dev = torch.device("cuda", rank)
    dist.init_process_group("nccl", rank=rank, world_size=W, device_id=dev)
    group = dist.group.WORLD
    res = dict(world_size=W, devices=[torch.cuda.get_device_name(i) for i in range(W)],
               peer_access={f"{i}->{j}": torch.cuda.can_device_access_peer(i, j)
                            for i in range(W) for j in range(W) if i != j},
               env={k: os.environ.get(k) for k in ("NCCL_NVLS_ENABLE", "TORCH_SYMM_MEM_DISABLE_MULTICAST",
                                                   "NVSHMEM_DISABLE_NVLS")},
               torch=torch.__version__)
    cap = args.cap
    ar = OneShotAllReduce(group, cap=cap, blocks=args.blocks, peer_memory=args.peer_memory)
    res["peer_memory"] = ar.peer_memory
    res["peer_memory_errors"] = ar.setup_errors
    res["blocks"], res["cap_elements"] = ar.G, cap
    _log(rank, json.dumps(res))
    res["race"] = []
    for graph in (False, True):
        for grid in ("fixed", "size-following"):
            blocks = args.graph_replays if graph else args.iters_blocks
            rr = race(ar, grid, blocks, args.K, cap, seed=args.seed, graph=graph, p_delay=args.p_delay,
                      max_delay_us=args.max_delay_us, dev=dev)
            res["race"].append(rr)
            _log(rank, json.dumps(rr))
    if rank == 0 and args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=1)
    dist.barrier(group)
    dist.destroy_process_group()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--world-size", type=int, default=0, help="default: every visible GPU")
    ap.add_argument("--cap", type=int, default=1 << 16, help="race test: elements per half (float32)")
    ap.add_argument("--blocks", type=int, default=32, help="the fixed grid G")
    ap.add_argument("--K", type=int, default=64, help="calls per block / per captured graph")
    ap.add_argument("--iters-blocks", type=int, default=80, help="eager race: blocks of K calls")
    ap.add_argument("--graph-replays", type=int, default=60, help="graph race: replays of the K-call graph")
    ap.add_argument("--p-delay", type=float, default=0.25)
    ap.add_argument("--max-delay-us", type=float, default=20.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--peer-memory", default="auto", choices=("auto", "symm_mem", "ipc"))
    ap.add_argument("--json")
    args = ap.parse_args(argv)
    n_gpu = torch.cuda.device_count()
    W = args.world_size or n_gpu
    if n_gpu < 2:
        print(f"needs 2+ GPUs of one host, {n_gpu} visible", file=sys.stderr)
        return 2
    if not 2 <= W <= n_gpu:
        print(f"--world-size must be 2..{n_gpu} (the visible GPUs), got {W}", file=sys.stderr)
        return 2
    for name in ("cap", "blocks", "K", "iters_blocks", "graph_replays"):
        if getattr(args, name) < 1:
            print(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}", file=sys.stderr)
            return 2
    if args.cap < 2:
        print("--cap must be >= 2 (small and large messages alternate)", file=sys.stderr)
        return 2
    if not 0.0 <= args.p_delay <= 1.0 or args.max_delay_us < 0:
        print("--p-delay must be in [0, 1] and --max-delay-us >= 0", file=sys.stderr)
        return 2
    import torch.multiprocessing as mp

    port = 29500 + os.getpid() % 1000
    mp.spawn(worker, args=(W, args, port), nprocs=W, join=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The one-shot all-reduce on several GPUs of one host (docs/kernels/allreduce.md): latency per message size
against NCCL's all-reduce and torch's symmetric-memory ``one_shot_all_reduce``.

The runner starts one process per GPU (``world_size`` of the shape, default 2) with an NCCL process group and
times on rank 0: ``loop`` = ``calls`` back-to-back calls between CUDA events after a barrier, median of
``repeats`` (every rank makes the same calls: collectives must match); ``graph`` = the same calls captured in
one CUDA graph and replayed. fp32 messages of ``kib`` KiB. r9k's result is checked against NCCL's sum of the
same inputs (max abs difference). NVLink multicast stays off: the runner sets :data:`MULTICAST_OFF`
(NCCL_NVLS_ENABLE=0, TORCH_SYMM_MEM_DISABLE_MULTICAST=1, NVSHMEM_DISABLE_NVLS=1) before it starts the ranks
(multicast can take a shared host's GPUs out of service); the kernel uses plain peer loads/stores and flag
atomics only. The race test on several GPUs is a test, not a benchmark:
tests/kernels/allreduce/multigpu_race.py.
"""
from __future__ import annotations

import statistics
from types import SimpleNamespace

import torch

from benchmarks.kernels.registry import Floor, Op, Unavailable, register

MULTICAST_OFF = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}
SIZES_KIB = (16, 32, 64, 128, 256, 512)
CALLS, REPEATS = 100, 7
_AR: dict = {}


def _group():
    import torch.distributed as dist

    return dist.group.WORLD if dist.is_available() and dist.is_initialized() else None


def ar_inputs(shape: dict, device: str):
    """x (fp32, ``kib`` KiB) and out on this rank's device; the communicator when a process group is up (the
    runner's ranks), none otherwise (the CPU test builds the tensors only)."""
    n = shape["kib"] * 1024 // 4
    rank = 0
    g = _group()
    if g is not None:
        import torch.distributed as dist

        rank = dist.get_rank(g)
    gen = torch.Generator(device="cpu").manual_seed(1000 + rank)
    x = torch.randn(n, generator=gen).to(device)
    return SimpleNamespace(x=x, out=torch.empty_like(x), y=x.clone(), group=g, shape=shape)


def _one_shot(a):
    from kernels.allreduce import OneShotAllReduce

    if a.group is None:
        raise Unavailable("the all-reduce needs the runner's process group (one process per GPU)")
    cap = max(max(SIZES_KIB) * 256, a.x.numel())
    if cap not in _AR:
        _AR[cap] = OneShotAllReduce(a.group, cap=cap, blocks=32)
    ar = _AR[cap]
    return lambda: ar.allreduce(a.x, out=a.out)


def _nccl(a):
    import torch.distributed as dist

    if a.group is None:
        raise Unavailable("NCCL needs the runner's process group")
    return lambda: dist.all_reduce(a.y, group=a.group)


def _symm_mem(a):
    if a.group is None:
        raise Unavailable("symmetric memory needs the runner's process group")
    try:
        import torch.distributed._symmetric_memory as symm_mem

        buf = symm_mem.empty(a.x.numel(), dtype=torch.float32, device=a.x.device)
        symm_mem.rendezvous(buf, a.group.group_name)
        op = torch.ops.symm_mem.one_shot_all_reduce
    except Exception as e:  # noqa: BLE001
        raise Unavailable(f"torch symm_mem one_shot_all_reduce unavailable: {type(e).__name__}: {e}") from None
    buf.copy_(a.x)
    return lambda: op(buf, "sum", a.group.group_name)


def ar_check(a, result) -> float:
    """Max abs difference of r9k's sum from NCCL's sum of the same inputs (0.0 at W = 2: both in rank order)."""
    import torch.distributed as dist

    ref = a.x.clone()
    dist.all_reduce(ref, group=a.group)
    return float((result - ref).abs().max())


def _barrier_loop(fns, calls: int = CALLS, repeats: int = REPEATS) -> float:
    """us per call of ``calls`` back-to-back calls between CUDA events, median of ``repeats``; a barrier before
    each timing so that the ranks start together."""
    import torch.distributed as dist

    fn = fns[0] if isinstance(fns, (list, tuple)) else fns
    for _ in range(5):
        fn()
    torch.cuda.synchronize()
    ts = []
    for _ in range(repeats):
        dist.barrier()
        torch.cuda.synchronize()
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        for _ in range(calls):
            fn()
        b.record()
        b.synchronize()
        ts.append(a.elapsed_time(b) * 1e3 / calls)
    return statistics.median(ts)


def _barrier_graph(fns, calls: int = CALLS, repeats: int = REPEATS) -> float:
    """us per call of ``calls`` calls captured in one CUDA graph, the graph replayed ``repeats`` times."""
    import torch.distributed as dist

    fn = fns[0] if isinstance(fns, (list, tuple)) else fns
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    dist.barrier()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(calls):
            fn()
    torch.cuda.synchronize()
    dist.barrier()
    return _barrier_loop([g.replay], calls=1, repeats=repeats) / calls


def ar_floor(s: dict) -> Floor:
    """Each rank reads every peer's message once over the link."""
    return Floor(bytes=(s["world_size"] - 1) * s["kib"] * 1024, bytes_ceiling="peer_copy")


register(Op(
    name="allreduce", family="allreduce",
    doc="the one-shot all-reduce over peer memory (kernels.allreduce.OneShotAllReduce), one process per GPU, "
        "against NCCL's all-reduce and torch's symmetric-memory one_shot_all_reduce",
    shapes=tuple(dict(world_size=2, kib=k) for k in SIZES_KIB),
    build=ar_inputs, r9k=_one_shot, floor=ar_floor,
    peers={"nccl": _nccl, "symm_mem": _symm_mem},
    check=ar_check, unchecked=("nccl", "symm_mem"), tiny=dict(kib=1), cpu=False, world_size=2,
    modes=("loop", "graph"), default_mode="graph",
    timers={"loop": _barrier_loop, "graph": _barrier_graph},
))

"""``OneShotAllReduce``: the one-shot all-reduce in Triton over peer pointers (torch symmetric memory, CUDA IPC as
the fallback), and :func:`simulate_ranks_cuda` (W ranks as W streams of one GPU); the package docstring,
kernels/allreduce/__init__.py, gives the protocol."""
from __future__ import annotations

import os
import time

import numpy as np

from kernels._launch import launch
from kernels.allreduce.common import DEFAULT_BLOCKS, DEFAULT_CHUNK, RaceResult, _blocks, message_sizes

try:
    import torch
except ImportError:  # pragma: no cover
    torch = None

try:
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover
    triton = None
    tl = None


# ============================================================================================================
# CUDA: the same protocol in Triton over peer pointers
# ============================================================================================================
if triton is not None:

    @triton.jit
    def _oneshot_ar_kernel(inp, out, data_ptrs, flag_ptrs, counters, err, delay, n, cap, rank,
                           W: tl.constexpr, G: tl.constexpr, BLOCK: tl.constexpr, FOLLOW: tl.constexpr,
                           CHUNK: tl.constexpr, MAX_SPIN: tl.constexpr, DELAY: tl.constexpr):
        # grid: (G,) fixed; with FOLLOW (test only) the host launches min(G, cdiv(n, CHUNK)) programs.
        b = tl.program_id(0)
        if FOLLOW:
            nb = tl.minimum(G, tl.cdiv(n, CHUNK))
        else:
            nb = G
        c = tl.load(counters + b) + 1
        tl.store(counters + b, c)
        h = c % 2
        sl = tl.cdiv(n, nb)
        lo = b * sl
        hi = tl.minimum(n, lo + sl)
        if lo < hi:
            own = tl.load(data_ptrs + rank).to(tl.pointer_type(tl.float32)) + h * cap
            for off in range(lo, hi, BLOCK):
                o = off + tl.arange(0, BLOCK)
                m = o < hi
                tl.store(own + o, tl.load(inp + o, mask=m), mask=m)
            # every thread's stores happen-before thread 0's release (bar.sync, then a cumulative release)
            tl.debug_barrier()
            my_flag = tl.load(flag_ptrs + rank).to(tl.pointer_type(tl.int64)) + b * 2 + h
            tl.atomic_xchg(my_flag, c, sem="release", scope="sys")
            for p in tl.static_range(W):
                pf = tl.load(flag_ptrs + p).to(tl.pointer_type(tl.int64)) + b * 2 + h
                spins = 0
                while (tl.atomic_add(pf, 0, sem="acquire", scope="sys") < c) & (spins < MAX_SPIN):
                    spins += 1
                if spins >= MAX_SPIN:
                    tl.atomic_add(err, 1)
            if DELAY:  # test only: hold this rank between the flag waits and the reads (ranks out of step)
                d = tl.load(delay)
                t0 = tl.inline_asm_elementwise("mov.u64 $0, %globaltimer;", "=l", [], dtype=tl.int64,
                                               is_pure=False, pack=1)
                t1 = t0
                while t1 - t0 < d:
                    t1 = tl.inline_asm_elementwise("mov.u64 $0, %globaltimer;", "=l", [], dtype=tl.int64,
                                                   is_pure=False, pack=1)
            tl.debug_barrier()
            for off in range(lo, hi, BLOCK):
                o = off + tl.arange(0, BLOCK)
                m = o < hi
                acc = tl.zeros((BLOCK,), dtype=tl.float32)
                for p in tl.static_range(W):
                    src = tl.load(data_ptrs + p).to(tl.pointer_type(tl.float32)) + h * cap
                    # volatile: never an L1 line cached from the previous use of this half
                    acc += tl.load(src + o, mask=m, other=0.0, volatile=True)
                tl.store(out + o, acc, mask=m)


class _RankState:
    """One rank's view for the CUDA kernel: peer data/flag pointer tables (int64 [W] on the device), its block
    counters (int64 [G]: 64 bits never wrap, where int32 would after 2^31 calls and break the halves and the
    waits) and its count of flag waits that gave up (int32 [1])."""

    def __init__(self, rank, data_ptrs, flag_ptrs, G, device):
        self.rank = rank
        self.data_ptrs = data_ptrs
        self.flag_ptrs = flag_ptrs
        self.counters = torch.zeros(G, dtype=torch.int64, device=device)
        self.err = torch.zeros(1, dtype=torch.int32, device=device)


def _launch(st: _RankState, inp, out, W, G, cap, grid="fixed", chunk=DEFAULT_CHUNK, BLOCK=1024,
            max_spin=1 << 22, delay=None, num_warps=4):
    n = inp.numel()
    if n > cap:
        raise ValueError(f"message of {n} elements over the one-shot capacity {cap}")
    if n == 0:
        return
    follow = grid == "size-following"
    nprog = _blocks(n, grid, G, chunk)
    launch(_oneshot_ar_kernel, (nprog,), (inp, out, st.data_ptrs, st.flag_ptrs, st.counters, st.err,
                                          delay if delay is not None else st.err, n, cap, st.rank,
                                          W, G, BLOCK, follow, chunk, max_spin, delay is not None),
           num_warps=num_warps)


def _peer_buffers_symm_mem(nelem: int, group, device):
    """``nelem`` float32 words per rank in torch symmetric memory; returns (local tensor, peer base pointers,
    handle). Only plain peer pointers are used (no multicast object is asked for or touched)."""
    import torch.distributed as dist
    import torch.distributed._symmetric_memory as symm_mem

    name = group.group_name
    try:  # needed before torch 2.9, deprecated after
        symm_mem.enable_symm_mem_for_group(name)
    except Exception:  # noqa: BLE001
        pass
    buf = symm_mem.empty(nelem, dtype=torch.float32, device=device)
    buf.zero_()
    torch.cuda.synchronize(device)
    hdl = symm_mem.rendezvous(buf, name)
    ptrs = [int(p) for p in hdl.buffer_ptrs]
    dist.barrier(group)
    return buf, ptrs, hdl


def _peer_buffers_ipc(nelem: int, group, device):
    """The same over CUDA IPC handles (torch's tensor sharing), exchanged with ``all_gather_object``."""
    import torch.distributed as dist
    from torch.multiprocessing.reductions import reduce_tensor

    buf = torch.zeros(nelem, dtype=torch.float32, device=device)
    torch.cuda.synchronize(device)
    fn, args = reduce_tensor(buf)
    allargs = [None] * dist.get_world_size(group)
    dist.all_gather_object(allargs, (fn, args), group=group)
    me = dist.get_rank(group)
    peers = [buf if p == me else f(*a) for p, (f, a) in enumerate(allargs)]
    dist.barrier(group)
    return buf, [t.data_ptr() for t in peers], peers


class OneShotAllReduce:
    """The one-shot all-reduce on CUDA over peer buffers (one process per GPU, an initialised process group).

    ``allreduce(x)`` sums a contiguous float32 tensor of at most ``cap`` elements over the group; every rank
    gets the fixed-rank-order sum (identical bits on every rank). Peer buffers: torch symmetric memory
    (``torch.distributed._symmetric_memory``: ``empty`` + ``rendezvous``, peer base pointers from the handle),
    or CUDA IPC handles when symmetric memory is unavailable (``peer_memory="ipc"``, or ``"auto"`` falls back).
    Only peer loads/stores and flag atomics are used: never multicast or multimem, so the kernel is safe with
    NVLink multicast disabled (NCCL_NVLS_ENABLE=0, TORCH_SYMM_MEM_DISABLE_MULTICAST=1).

    Layout per rank: ``2 * cap`` float32 data words (two halves), then ``2 * blocks`` int64 flags (8-byte aligned:
    they start ``8 * cap`` bytes in).
    ``blocks`` is the fixed launch grid G. Works under CUDA graph capture (the counters live on the device).

    Raises:
        ValueError: a message over ``cap`` or not float32. RuntimeError: no peer memory could be set up.
    """

    def __init__(self, group=None, cap: int = 1 << 17, blocks: int = 32, device=None, peer_memory: str = "auto",
                 chunk: int | None = None):
        import torch.distributed as dist

        os.environ.setdefault("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")
        group = group or dist.group.WORLD
        if peer_memory not in ("auto", "symm_mem", "ipc"):
            raise ValueError(f"peer_memory must be auto, symm_mem or ipc, got {peer_memory!r}")
        if cap < 1 or blocks < 1:
            raise ValueError(f"cap and blocks must be >= 1, got cap={cap}, blocks={blocks}")
        self.group = group
        self.W = dist.get_world_size(group)
        self.rank = dist.get_rank(group)
        self.G, self.cap = blocks, cap
        self.chunk = chunk or max(1, cap // blocks)  # size-following (test only): elements per block
        device = device or torch.device("cuda", torch.cuda.current_device())
        nelem = 2 * cap + 4 * blocks
        errors = []
        self.peer_memory = None
        for how in (("symm_mem", "ipc") if peer_memory == "auto" else (peer_memory,)):
            try:
                fn = _peer_buffers_symm_mem if how == "symm_mem" else _peer_buffers_ipc
                self._buf, ptrs, self._keep = fn(nelem, group, device)
                self.peer_memory = how
                break
            except Exception as e:  # noqa: BLE001 -- try the next way, report all if none works
                errors.append(f"{how}: {type(e).__name__}: {e}")
        if self.peer_memory is None:
            raise RuntimeError("no peer memory for the one-shot all-reduce: " + "; ".join(errors))
        self.setup_errors = errors
        data = torch.tensor(ptrs, dtype=torch.int64, device=device)
        flags = torch.tensor([p + 2 * cap * 4 for p in ptrs], dtype=torch.int64, device=device)
        self._st = _RankState(self.rank, data, flags, blocks, device)

    @property
    def timeouts(self) -> int:
        """Flag waits that gave up (syncs): nonzero means a peer never arrived or a protocol defect."""
        return int(self._st.err.item())

    def allreduce(self, x, out=None, grid: str = "fixed", delay=None, **kw):
        """Sum ``x`` (float32, contiguous, ``numel <= cap``) over the group into ``out`` (new if None).
        ``grid="size-following"`` is the seeds' racy grid (tests only); ``delay`` (int64 [1] device tensor,
        nanoseconds, tests only) holds this rank between its flag waits and its reads."""
        if x.dtype != torch.float32:
            raise ValueError(f"the one-shot all-reduce takes float32, got {x.dtype}")
        if out is None:
            out = torch.empty_like(x, memory_format=torch.contiguous_format)
        elif (out.shape != x.shape or out.dtype != x.dtype or out.device != x.device
              or not out.is_contiguous()):
            raise ValueError(f"out must be a contiguous {x.dtype} tensor of shape {tuple(x.shape)} on {x.device}, "
                             f"got {out.dtype} {tuple(out.shape)} on {out.device}")
        _launch(self._st, x.contiguous().view(-1), out.view(-1), self.W, self.G, self.cap, grid=grid,
                chunk=self.chunk, delay=delay, **kw)
        return out


def simulate_ranks_cuda(world_size: int, iterations: int, grid: str = "fixed", cap: int = 4096,
                        blocks: int = DEFAULT_BLOCKS, seed: int = 0, skew: bool = True) -> RaceResult:
    """W ranks as W CUDA streams on one GPU over W buffers: the kernel's protocol (halves, counters, flags,
    fixed-order sum) on hardware. With ``skew`` a random rank gets a busy kernel queued before its call now
    and then, so ranks run out of step. Counts outputs that differ from the exact fixed-order sum.

    Caveat: the W streams' kernels must run concurrently; when the GPU serialises two of them (e.g. streams
    aliased onto one hardware queue, CUDA_DEVICE_MAX_CONNECTIONS), flag waits give up and RuntimeError is
    raised. The multi-GPU test (tests/kernels/allreduce/multigpu_race.py) has no such caveat."""
    dev = torch.device("cuda")
    W, G = world_size, blocks
    data = [torch.zeros(2 * cap, dtype=torch.float32, device=dev) for _ in range(W)]
    flags = [torch.zeros(2 * G, dtype=torch.int64, device=dev) for _ in range(W)]
    dp = torch.tensor([d.data_ptr() for d in data], dtype=torch.int64, device=dev)
    fp = torch.tensor([f.data_ptr() for f in flags], dtype=torch.int64, device=dev)
    sts = [_RankState(r, dp, fp, G, dev) for r in range(W)]
    streams = [torch.cuda.Stream() for _ in range(W)]
    sizes = message_sizes(iterations, cap, seed)
    g = torch.Generator(device="cpu").manual_seed(seed)
    rng = np.random.default_rng(seed)
    ins = [[torch.randn(int(n), generator=g).to(dev) for n in sizes] for _ in range(W)]
    outs = [[torch.empty(int(n), device=dev) for n in sizes] for _ in range(W)]
    busy = torch.randn(1 << 20, device=dev)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for i in range(iterations):
        for r in range(W):
            with torch.cuda.stream(streams[r]):
                if skew and rng.random() < 0.2:
                    for _ in range(int(rng.integers(1, 4))):
                        busy.mul_(1.0000001)
                _launch(sts[r], ins[r][i], outs[r][i], W, G, cap, grid=grid, max_spin=1 << 16)
    torch.cuda.synchronize()
    wall = time.perf_counter() - t0
    wrong = mism = 0
    for i in range(iterations):
        exp = ins[0][i].clone()
        for r in range(1, W):
            exp += ins[r][i]
        bad = [not torch.equal(outs[r][i], exp) for r in range(W)]
        wrong += sum(bad)
        mism += any(not torch.equal(outs[r][i], outs[0][i]) for r in range(1, W))
    errs = sum(int(s.err.item()) for s in sts)
    if errs:
        raise RuntimeError(f"simulate_ranks_cuda: {errs} flag waits timed out (ranks did not run concurrently)")
    return RaceResult(W, iterations, grid, wrong, mism, wall)

"""``ExpertCache``: a bounded number of experts per MoE layer in device memory over a host backing store (the
package docstring, kernels/moe/__init__.py, gives the policy and its two implementations)."""
from __future__ import annotations

import math
import warnings
from dataclasses import dataclass, field, fields

import torch

from kernels._launch import launcher
from kernels._util import _interpreting

try:
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover
    triton = None
    tl = None

DEFAULT_INSERT_THRESH = 0.99  # the seeds' R9K_LRU_THRESH after v0.2.x (was 0.5); docs/kernels/moe.md

COPY_BLOCK_BYTES = 16384  # bytes per gather-copy program (per thread at 4 warps: 128 B = 8 x 16-B loads)
_MAX_STEP = 2**31 - 2     # the device LRU key packs (stamp + 1) into bits 32..62
_MAX_IDS = 2**16 - 1      # ... and the slot and (expert + 1) into 16 bits each
_PLAN_TILE_MAX = {"E": 1024, "T": 2048}  # the plan kernel's widest tiles over experts / (token, choice) pairs


@dataclass
class CacheStats:
    """Counters since construction (or :meth:`ExpertCache.reset_stats`). Experts are counted once per step
    (distinct), ``routed`` counts (token, choice) pairs. ``invalid_ids``: (token, choice) pairs whose id was
    outside ``0..E-1`` on the device path (given slot -1; the host path raises instead)."""

    steps: int = 0
    routed: int = 0
    distinct: int = 0
    hits: int = 0
    misses: int = 0
    inserts: int = 0
    evictions: int = 0
    read_through: int = 0
    steps_over_thresh: int = 0
    chunks: int = 0
    invalid_ids: int = 0

    @property
    def hit_rate(self) -> float:
        return self.hits / self.distinct if self.distinct else 0.0


_NCOUNT = len(fields(CacheStats))  # the device counter vector holds the fields in this order
_NCOUNT_P2 = 16
assert _NCOUNT <= _NCOUNT_P2


@dataclass
class StepPlan:
    """One step's mapping: ``chunks`` is a list of (token start, token end); ``slot_ids`` ``[T, k]`` int32 (a
    view of the cache's one slot-id buffer) is valid for every chunk after :meth:`ExpertCache.stage` for that
    chunk (a one-chunk plan is ready when :meth:`ExpertCache.prepare` returns). ``device``: planned by the
    device path (always one chunk; the copies and ``slot_ids`` are ordered on the current stream)."""

    slot_ids: torch.Tensor
    chunks: list[tuple[int, int]] = field(default_factory=list)
    stage_of_chunk: list[list[int]] = field(default_factory=list)
    device: bool = False


# ============================================================================================================
# device path kernels
# ============================================================================================================
if triton is not None:

    @triton.jit
    def _expert_tile(smap, slot_of, e0, E: tl.constexpr, BE: tl.constexpr):
        """Experts e0 .. e0 + BE - 1 of the plan: (ids, in range, present this step (smap == 1), resident slot
        or -1)."""
        e = e0 + tl.arange(0, BE)
        me = e < E
        p = tl.load(smap + e, mask=me, other=0) == 1
        so = tl.load(slot_of + e, mask=me, other=-1)
        return e, me, p, so

    @triton.jit
    def _ids_tile(ids, s0, s1, TK, i0, t_one, ids_one, K: tl.constexpr, E: tl.constexpr, ONE_TILE: tl.constexpr):
        """Routed (token, choice) pairs i0 .. i0 + BT - 1 of the step's [T, k] ids (flattened row-major, strides
        s0, s1): (flat index, in range, expert id (0 past the end), valid id in 0..E-1). With ONE_TILE every
        pair fits one tile, loaded once by the caller as ids_one."""
        i = i0 + t_one
        m = i < TK
        if ONE_TILE:
            ex = ids_one
        else:
            ex = tl.load(ids + (i // K) * s0 + (i % K) * s1, mask=m, other=0)
        ok = m & (ex >= 0) & (ex < E)
        return i, m, ex, ok

    @triton.jit(do_not_specialize=["s0", "s1", "TK", "lim"])
    def _plan_kernel(ids, s0, s1, TK, step, lim,
                     slot_of, expert_of, last_used, smap, rank_slot, rank_old, copy, counters, slot_ids, tab, addr,
                     E: tl.constexpr, NS: tl.constexpr, K: tl.constexpr, NC: tl.constexpr,
                     BE: tl.constexpr, NSP: tl.constexpr, BT: tl.constexpr, NCP: tl.constexpr,
                     ONE_TILE: tl.constexpr, THROUGH: tl.constexpr, NT: tl.constexpr):
        # One program. State (device, fixed shapes): slot_of [E] int32 (-1: not resident), expert_of [NS]
        # int32 (-1: empty), last_used [NS] int64 (-1: empty), counters [NCP] int64 (CacheStats order).
        # step [1] int64: this step's index (its LRU stamp), advanced here at the end, so that the launch's
        # arguments are the same every step and a captured CUDA graph of it replays correctly.
        # Scratch: smap [E] int32 (presence, then the step's expert -> slot map), rank_slot / rank_old [NSP]
        # int32 (free slots in LRU order and the expert each held), copy [1 + 2 NC] int32 (count, experts,
        # destination slots). Out: slot_ids [TK] int32.
        # THROUGH (read-through without staging room): only inserts are copied; tab [NT, E] int64 receives each
        # expert's place per weight tensor as an element offset from that tensor's slot buffer (its slot if
        # resident after this step's inserts, else its place in the host store), from addr [3 NT] int64 (slot
        # base 0, host base, elements an expert, per tensor).
        # Threads of the program may hold replicas of one element and warps run unsynchronised, so every
        # buffer read and later written in this kernel has a barrier between the read and the write.
        step64 = tl.load(step)
        cidx = tl.arange(0, NCP)
        cnt = tl.load(counters + cidx)                      # read early; stored at the end
        s = tl.arange(0, NSP)
        ms = s < NS
        eo = tl.load(expert_of + s, mask=ms, other=-1)
        lu = tl.load(last_used + s, mask=ms, other=0)
        t_one = tl.arange(0, BT)
        if ONE_TILE:  # every step's ids fit one tile: load them once, reuse for the slot ids
            ids_one = tl.load(ids + (t_one // K) * s0 + (t_one % K) * s1, mask=t_one < TK, other=0)
        else:
            ids_one = t_one  # unused: _ids_tile loads each tile
        # A: presence := 0
        for e0 in range(0, E, BE):
            e = e0 + tl.arange(0, BE)
            tl.store(smap + e, tl.zeros([BE], dtype=tl.int32), mask=e < E)
        tl.debug_barrier()
        # B: presence[ids] := 1 (duplicates store the same value); invalid ids counted, never stored
        nbad = tl.sum(tl.zeros([BT], dtype=tl.int32), 0)
        for i0 in range(0, TK, BT):
            i, m, ex, ok = _ids_tile(ids, s0, s1, TK, i0, t_one, ids_one, K, E, ONE_TILE)
            nbad += tl.sum((m & (ok == 0)).to(tl.int32), 0)
            tl.store(smap + ex, tl.full([BT], 1, tl.int32), mask=ok)
        tl.debug_barrier()
        # C: distinct, hits
        ndist = tl.sum(tl.zeros([BE], dtype=tl.int32), 0)
        nhit = ndist
        for e0 in range(0, E, BE):
            e, me, p, so = _expert_tile(smap, slot_of, e0, E, BE)
            ndist += tl.sum(p.to(tl.int32), 0)
            nhit += tl.sum((p & (so >= 0)).to(tl.int32), 0)
        nmiss = ndist - nhit
        ins = ((nmiss > 0) & (ndist <= lim)).to(tl.int32)   # the insert threshold, on the device (0 / 1)
        # D: slots used this step (their expert is present) are stamped; the others ranked LRU-first by one
        # sort of (stamp + 1, slot, expert + 1) packed in an int64 (empty slots have stamp -1: first)
        used = (tl.load(smap + eo, mask=ms & (eo >= 0), other=0) == 1) & ms
        key = ((lu + 1) << 32) | (s.to(tl.int64) << 16) | (eo + 1).to(tl.int64)
        key = tl.where(ms & (used == 0), key, 0x7FFFFFFFFFFFFFFF)
        srt = tl.sort(key, 0)
        tl.store(rank_slot + s, ((srt >> 16) & 0xFFFF).to(tl.int32))
        tl.store(rank_old + s, ((srt & 0xFFFF) - 1).to(tl.int32))
        tl.store(last_used + s, tl.zeros([NSP], dtype=tl.int64) + step64, mask=used)  # lu was read at the top
        tl.debug_barrier()
        # E: misses in ascending expert id; the r-th takes the r-th free slot (insert) or staging slot NS + r
        carry = tl.sum(tl.zeros([BE], dtype=tl.int32), 0)
        nev = carry
        for e0 in range(0, E, BE):
            e, me, p, so = _expert_tile(smap, slot_of, e0, E, BE)
            miss = p & (so < 0)
            mi = miss.to(tl.int32)
            r = carry + tl.cumsum(mi, 0) - mi
            carry += tl.sum(mi, 0)
            im = miss & ((tl.zeros_like(mi) + ins) != 0)  # (a scalar bool in a block mask trips the interpreter)
            sl = tl.load(rank_slot + r, mask=im, other=0)
            old = tl.load(rank_old + r, mask=im, other=-1)
            ev = im & (old >= 0)
            nev += tl.sum(ev.to(tl.int32), 0)
            if THROUGH:
                dst = tl.where(im, sl, -1)                  # read through the table: no staging slot
            else:
                dst = tl.where(im, sl, NS + r)
            newmap = tl.where(miss, dst, tl.where(p, so, -1))
            tl.debug_barrier()  # this chunk's smap / slot_of reads done everywhere before the writes
            # an evicted expert is absent this step (its slot was free), so later chunks ignore its slot_of
            tl.store(slot_of + old, tl.full([BE], -1, tl.int32), mask=ev)
            tl.store(slot_of + e, sl, mask=im)
            tl.store(expert_of + sl, e, mask=im)
            tl.store(last_used + sl, tl.zeros([BE], dtype=tl.int64) + step64, mask=im)
            tl.store(copy + 1 + r, e, mask=miss)
            tl.store(copy + 1 + NC + r, dst, mask=miss)
            tl.store(smap + e, newmap, mask=me)
            tl.debug_barrier()
        if THROUGH:
            tl.store(copy, nmiss * ins)                      # the copy kernel's count: inserts only
            # H: the pointer table (slot_of is final: the last chunk of E ended with a barrier)
            for e0 in range(0, E, BE):
                e = e0 + tl.arange(0, BE)
                me = e < E
                so = tl.load(slot_of + e, mask=me, other=-1).to(tl.int64)
                for j in tl.static_range(NT):
                    nb = tl.load(addr + 2 * NT + j)
                    v = tl.where(so >= 0, tl.load(addr + j) + so * nb, tl.load(addr + NT + j) + e.to(tl.int64) * nb)
                    tl.store(tab + j * E + e, v, mask=me)
        else:
            tl.store(copy, nmiss)                            # the copy kernel's count: every miss is copied
        # F: slot ids (smap is now the step's expert -> slot map)
        for i0 in range(0, TK, BT):
            i, m, ex, ok = _ids_tile(ids, s0, s1, TK, i0, t_one, ids_one, K, E, ONE_TILE)
            tl.store(slot_ids + i, tl.load(smap + ex, mask=ok, other=-1), mask=m)
        # G: counters, CacheStats field order
        ninsert = nmiss * ins
        over = ((nmiss > 0) & (ins == 0)).to(tl.int32)
        d = tl.where(cidx == 0, 1, 0).to(tl.int64)
        d += tl.where(cidx == 1, TK, 0).to(tl.int64)
        d += tl.where(cidx == 2, ndist, 0).to(tl.int64)
        d += tl.where(cidx == 3, nhit, 0).to(tl.int64)
        d += tl.where(cidx == 4, nmiss, 0).to(tl.int64)
        d += tl.where(cidx == 5, ninsert, 0).to(tl.int64)
        d += tl.where(cidx == 6, nev, 0).to(tl.int64)
        d += tl.where(cidx == 7, nmiss - ninsert, 0).to(tl.int64)
        d += tl.where(cidx == 8, over, 0).to(tl.int64)
        d += tl.where(cidx == 9, 1, 0).to(tl.int64)
        d += tl.where(cidx == 10, nbad, 0).to(tl.int64)
        tl.store(counters + cidx, cnt + d)
        tl.store(step, step64 + 1)  # read at the top; barriers (D, E) separate every thread's read from this

    @triton.jit
    def _copy_chunk(src, dst, e, s, c, W: tl.constexpr, B: tl.constexpr):
        # chunk c of expert e's W words -> slot s; B words per program
        offs = c * B + tl.arange(0, B)
        if W % B == 0:
            v = tl.load(src + e * W + offs)
            tl.store(dst + s * W + offs, v)
        else:
            m = offs < W
            v = tl.load(src + e * W + offs, mask=m)
            tl.store(dst + s * W + offs, v, mask=m)

    @triton.jit
    def _gather_copy_kernel(copy, src0, dst0, src1, dst1, src2, dst2, src3, dst3,
                            NC: tl.constexpr, NT: tl.constexpr,
                            W0: tl.constexpr, B0: tl.constexpr, C0: tl.constexpr,
                            W1: tl.constexpr, B1: tl.constexpr, C1: tl.constexpr,
                            W2: tl.constexpr, B2: tl.constexpr, C2: tl.constexpr,
                            W3: tl.constexpr, B3: tl.constexpr, C3: tl.constexpr):
        # grid (max misses this step, C0 + .. + C{NT-1}): program (r, c) copies chunk c of the r-th listed
        # expert (copy[1 + r] -> slot copy[1 + NC + r]) if r < copy[0]. Chunks 0..C0-1 are tensor 0's, then
        # tensor 1's, ... src*: the host store as flat words (a pinned CPU tensor: read over PCIe), dst*: the
        # device slots as flat words.
        r = tl.program_id(0)
        c = tl.program_id(1)
        n = tl.load(copy)
        if r < n:
            e = tl.load(copy + 1 + r).to(tl.int64)
            s = tl.load(copy + 1 + NC + r).to(tl.int64)
            if c < C0:
                _copy_chunk(src0, dst0, e, s, c, W0, B0)
            if NT > 1:
                c1 = c - C0
                if (c1 >= 0) & (c1 < C1):
                    _copy_chunk(src1, dst1, e, s, c1, W1, B1)
            if NT > 2:
                c2 = c - C0 - C1
                if (c2 >= 0) & (c2 < C2):
                    _copy_chunk(src2, dst2, e, s, c2, W2, B2)
            if NT > 3:
                c3 = c - C0 - C1 - C2
                if (c3 >= 0) & (c3 < C3):
                    _copy_chunk(src3, dst3, e, s, c3, W3, B3)


def device_bytes(E: int, n_slots: int, tensor_bytes: list[int], max_tokens: int, top_k: int,
                 stage_slots: int | None = None, read: str = "stage", device_plan: bool = True) -> int:
    """Bytes of device memory an :class:`ExpertCache` of these arguments allocates, exactly (every buffer of its
    one set: :meth:`ExpertCache.buffers`): the slots (``n_slots`` plus the staging slots; none with
    ``read="through"``) of every weight tensor, the slot-id buffer and the step's expert -> slot map, with
    ``read="through"`` the per-expert address tables and their sources, and on the device path its plan state.
    All experts resident take ``E * sum(tensor_bytes)``.

    Args:
        tensor_bytes: one expert's bytes of each weight tensor (e.g. ``[w13, w2]``, plus block scales).
        stage_slots: as the constructor's (default ``n_slots``; 0 / None with ``read="through"``).
        device_plan: whether the device path's state is allocated (the constructor's outcome).
    Raises:
        ValueError: arguments the constructor refuses (read, staging).
    """
    if read not in ("stage", "through"):
        raise ValueError(f"read must be 'stage' or 'through', got {read!r}")
    if read == "through":
        if stage_slots not in (None, 0):
            raise ValueError(f"read='through' has no staging slots, got stage_slots={stage_slots}")
        stage, NT = 0, len(tensor_bytes)
    else:
        stage, NT = (n_slots if stage_slots is None else stage_slots), 0
    b = (n_slots + stage) * sum(tensor_bytes)   # the slots
    b += max_tokens * top_k * 4 + E * 4         # slot ids, the step's expert -> slot map (int32)
    b += NT * E * 8 + 3 * NT * 8                # read-through address tables [NT, E], their sources [3 NT] (int64)
    if device_plan:
        NSP = max(16, 1 << max(0, (n_slots - 1).bit_length()))
        b += E * 4 + n_slots * 4 + n_slots * 8  # slot_of, expert_of (int32), last_used (int64)
        b += 2 * NSP * 4 + (1 + 2 * E) * 4      # LRU ranks, the copy list (int32)
        b += _NCOUNT_P2 * 8 + 8                 # counters, the step index (int64)
    return b


ALLOC_BLOCK = 512        # PyTorch's CUDA caching allocator: kMinBlockSize, the rounding of every request
ALLOC_SMALL = 1 << 20    # kSmallSize: the small pool's largest request, the large pool's unsplit remainder at most


def allocator_bytes(nbytes: list[int]) -> tuple[int, int]:
    """The least and the most bytes PyTorch's CUDA caching allocator counts (``torch.cuda.memory_allocated``) for
    live allocations of ``nbytes`` bytes each, in its default configuration (PYTORCH_CUDA_ALLOC_CONF without
    ``max_split_size_mb``, ``expandable_segments`` or ``roundup_power2_divisions``).

    Source: c10/cuda/CUDACachingAllocator.cpp (``round_size``, ``get_pool``, ``should_split``,
    ``get_allocation_size``): a request is rounded up to a multiple of 512 B (kMinBlockSize; an empty tensor takes
    no block); one of at most 1 MiB (kSmallSize) is served by the small pool, whose blocks are split whenever
    512 B or more remain, so it counts exactly the rounded size; a larger one by the large pool, whose block is
    split only where more than 1 MiB remains, so the block it counts may be up to 1 MiB over the rounded size
    (a fresh segment for a request of 10 MiB or more is rounded to 2 MiB, kRoundLarge: 67.5 MiB takes 68 MiB,
    135 MiB takes 136 MiB; a cached free block is taken whole the same way).

    Returns:
        (sum of the rounded sizes, that plus 1 MiB for every allocation of more than 1 MiB).
    """
    rounded = [-(-int(n) // ALLOC_BLOCK) * ALLOC_BLOCK for n in nbytes if int(n) > 0]
    return sum(rounded), sum(rounded) + ALLOC_SMALL * sum(1 for r in rounded if r > ALLOC_SMALL)


_WORD = {8: torch.int64, 4: torch.int32, 2: torch.int16, 1: torch.uint8}


def _flat_words(t: torch.Tensor, word: int) -> torch.Tensor:
    """A contiguous tensor's bytes as a 1-D tensor of ``word``-byte integers (a view: same memory)."""
    return t.reshape(-1).view(torch.uint8).view(_WORD[word])


class ExpertCache:
    """A per-layer LRU cache of experts in device memory over a host backing store (see the module doc).

    Args:
        host: the layer's expert weights, each ``[E, ...]`` (e.g. ``[w13, w2]``); copied to (pinned) host
            memory unless already there.
        n_slots: experts resident on the device.
        max_tokens: tokens per step at most (the slot-id buffer holds ``max_tokens * top_k``).
        top_k: choices per token.
        device: where the slots live.
        insert_thresh: a step whose distinct experts exceed ``insert_thresh * n_slots`` inserts nothing.
        stage_slots: read-through slots (default ``n_slots``); at least ``top_k``.
        pin: pin the host store (default: when CUDA is available).
        device_plan: plan and copy on the device without syncs (see the module doc). None (default): when
            Triton is there and either the slots are on CUDA with a pinned host store (not interpreting), or
            the slots are on the CPU under TRITON_INTERPRET=1; the first launch is probed in the constructor
            and a refused one falls back to the host path with a warning. True: required (ValueError if
            impossible). False: the host path (the reference).

    Raises:
        ValueError: bad shapes or arguments; device_plan=True where the device path cannot run.
    """

    def __init__(self, host: list[torch.Tensor], n_slots: int, max_tokens: int, top_k: int,
                 device: str | torch.device = "cpu", insert_thresh: float = DEFAULT_INSERT_THRESH,
                 stage_slots: int | None = None, pin: bool | None = None, device_plan: bool | None = None,
                 read: str = "stage"):
        if not host:
            raise ValueError("host needs at least one weight tensor [E, ...]")
        E = host[0].shape[0]
        if any(h.shape[0] != E for h in host):
            raise ValueError("every host tensor must have the same expert count in dim 0")
        if not 0 < n_slots <= E:
            raise ValueError(f"n_slots must be in 1..{E}, got {n_slots}")
        if not 0.0 <= insert_thresh <= 1.0:
            raise ValueError(f"insert_thresh must be in [0, 1], got {insert_thresh}")
        if read not in ("stage", "through"):
            raise ValueError(f"read must be 'stage' or 'through', got {read!r}")
        self.read = read
        if read == "through":
            if stage_slots not in (None, 0):
                raise ValueError(f"read='through' has no staging slots, got stage_slots={stage_slots}")
            stage_slots = 0
        else:
            stage_slots = n_slots if stage_slots is None else stage_slots
            if stage_slots < top_k:
                raise ValueError(f"stage_slots ({stage_slots}) must be at least top_k ({top_k})")
        self.device = torch.device(device)
        if self.device.type == "cuda" and self.device.index is None:
            self.device = torch.device("cuda", torch.cuda.current_device())
        pin = torch.cuda.is_available() if pin is None else pin
        self.host = [h.contiguous().pin_memory() if pin and not h.is_pinned() else h.contiguous() for h in host]
        self.E, self.n_slots, self.stage_slots, self.top_k = E, n_slots, stage_slots, top_k
        self.max_tokens, self.insert_thresh = max_tokens, insert_thresh
        S = n_slots + stage_slots
        # --- the one buffer set of this layer ---
        self.weights = [torch.empty((S,) + tuple(h.shape[1:]), dtype=h.dtype, device=self.device)
                        for h in self.host]
        self._slot_ids = torch.empty(max_tokens * top_k, dtype=torch.int32, device=self.device)
        self._map_dev = torch.empty(E, dtype=torch.int32, device=self.device)  # expert -> slot for this step
        # read="through": each weight tensor's per-expert table [NT, E] int64 (written every step): element offsets
        # from that tensor's slot buffer, so that weights[j].data_ptr() + offset * element size is the expert's
        # slot or its place in the host store; and their sources [3 NT] int64: slot base (0), host base, elements
        # an expert. The host addresses are the pinned store's, which under UVA are the device-visible addresses
        # of the same bytes (as the copy kernel reads them).
        NT = len(self.host) if read == "through" else 0
        for w, h in zip(self.weights[:NT], self.host):
            if (h.data_ptr() - w.data_ptr()) % h.element_size():
                raise ValueError("read='through': a host tensor and its slots are not aligned to their element size")
        self.tables = torch.zeros((NT, E), dtype=torch.int64, device=self.device)
        self._addr = torch.tensor([0] * NT + [(h.data_ptr() - w.data_ptr()) // h.element_size()
                                              for w, h in zip(self.weights, self.host)]
                                  + [h[0].numel() for h in self.host] if NT else [],
                                  dtype=torch.int64).to(self.device)
        #: every table entry is a multiple of 16 elements (bases and per-expert sizes are): a hint for the GEMM
        self.aligned16 = bool(NT) and all((h.data_ptr() - w.data_ptr()) % (16 * h.element_size()) == 0
                                          and h[0].numel() % 16 == 0 for w, h in zip(self.weights, self.host))
        # host-side bookkeeping (small, fixed size): the host path's state; on the device path a copy read
        # back only for the steps that take the host path
        self._slot_of = [-1] * E                # resident slot of each expert
        self._expert_of = [-1] * n_slots        # expert held by each resident slot
        self._last_used = [-1] * n_slots        # LRU stamp (step index)
        self._map_host = torch.full((E,), -1, dtype=torch.int32, pin_memory=pin)
        self._hstats = CacheStats()             # the host path's counters
        self._step = 0
        self.path_steps = {"device": 0, "host": 0}  # steps planned by each path (host ints, for the gates)
        self._views: dict[int, torch.Tensor] = {}   # T -> slot_ids[:T*k].view(T, k) (views, no memory)
        self._dev: list[torch.Tensor] = []
        self.filled = False  # every slot holds an expert (fill()): a step then misses at most E - n_slots
        self.device_plan = self._setup_device_path(device_plan)

    # -- device path setup ----------------------------------------------------------------------------
    def _device_path_possible(self) -> str | None:
        """None if the device path can run here, else why not."""
        if triton is None:
            return "Triton is not installed"
        if max(self.E, self.n_slots) > _MAX_IDS:
            return f"E and n_slots must be at most {_MAX_IDS}"
        if self.device.type == "cuda":
            if _interpreting():
                return "TRITON_INTERPRET=1 with CUDA slots"
            if not all(h.is_pinned() for h in self.host):
                return "the host store is not pinned"
            return None
        if self.device.type == "cpu":
            return None if _interpreting() else "CPU slots need TRITON_INTERPRET=1"
        return f"device type {self.device.type}"

    def _setup_device_path(self, want: bool | None) -> bool:
        if want is False:
            return False
        why = self._device_path_possible()
        if why is not None:
            if want:
                raise ValueError(f"device_plan=True but the device path cannot run: {why}")
            return False
        E, NS, dev = self.E, self.n_slots, self.device
        i32 = dict(dtype=torch.int32, device=dev)
        self._slot_of_d = torch.full((E,), -1, **i32)
        self._expert_of_d = torch.full((NS,), -1, **i32)
        self._last_used_d = torch.full((NS,), -1, dtype=torch.int64, device=dev)
        NSP = max(16, triton.next_power_of_2(NS))
        self._rank_slot = torch.empty(NSP, **i32)
        self._rank_old = torch.empty(NSP, **i32)
        self._copy = torch.zeros(1 + 2 * E, **i32)  # [count, experts..., slots...]
        self._counters = torch.zeros(_NCOUNT_P2, dtype=torch.int64, device=dev)
        self._step_d = torch.zeros(1, dtype=torch.int64, device=dev)  # the step index, advanced by the plan kernel
        self._dev = [self._slot_of_d, self._expert_of_d, self._last_used_d, self._rank_slot, self._rank_old,
                     self._copy, self._counters, self._step_d]
        TKmax = self.max_tokens * self.top_k
        BT = max(16, min(_PLAN_TILE_MAX["T"], triton.next_power_of_2(max(TKmax, 1))))
        BE = max(16, min(_PLAN_TILE_MAX["E"], triton.next_power_of_2(E)))
        self._plan_meta = dict(E=E, NS=NS, K=self.top_k, NC=E, BE=BE,
                               NSP=NSP, BT=BT, NCP=_NCOUNT_P2, ONE_TILE=TKmax <= BT, THROUGH=self.read == "through",
                               NT=max(1, self.tables.shape[0]), num_warps=4)
        # the copy: per weight tensor, flat words of the widest integer type that divides its per-expert bytes
        # and both base addresses; groups of at most 4 tensors per launch
        block = COPY_BLOCK_BYTES if not _interpreting() else 1024
        groups, cur = [], []
        for h, w in zip(self.host, self.weights):
            nb = h[0].numel() * h.element_size() if E else 0
            if nb == 0:
                continue
            word = next(b for b in (8, 4, 2, 1)
                        if nb % b == 0 and h.data_ptr() % b == 0 and w.data_ptr() % b == 0)
            W, B = nb // word, block // word
            cur.append((_flat_words(h, word), _flat_words(w, word), W, B, triton.cdiv(W, B)))
            if len(cur) == 4:
                groups.append(cur)
                cur = []
        if cur:
            groups.append(cur)
        self._copy_launches = []
        self._copy_full = None
        self._plan_tail = None
        for g in groups:
            args, meta = [self._copy], dict(NC=E, NT=len(g), num_warps=4)
            for j in range(4):
                src, dst, W, B, C = g[j] if j < len(g) else (None, None, 1, 1, 0)
                args += [src, dst]
                meta.update({f"W{j}": W, f"B{j}": B, f"C{j}": C})
            nchunks = sum(x[4] for x in g)
            if nchunks > 65535:
                raise ValueError(f"an expert needs {nchunks} copy programs (grid dim 1 max 65535)")
            self._copy_launches.append((nchunks, args, meta))
        try:  # probe: count 0, so every program exits; compiles the copy kernel and checks the host pointers
            if self.device.type == "cuda":
                with torch.cuda.device(self.device):
                    self._launch_copies(1)
            else:
                self._launch_copies(1)
        except ValueError as exc:  # Triton's launcher refused a pointer (e.g. a host store it cannot map)
            if want:
                raise ValueError(f"device_plan=True but the copy kernel was refused: {exc}") from exc
            warnings.warn(f"ExpertCache: device path unavailable ({exc}); using the host path", RuntimeWarning)
            self._dev = []
            return False
        return True

    def _launch_copies(self, nmax: int) -> None:
        if self._copy_full is None:  # every argument positional, for the cached launch path (kernels/_launch.py)
            self._copy_full = [(nchunks,) + launcher(_gather_copy_kernel).positional(args, meta)
                               for nchunks, args, meta in self._copy_launches]
        for nchunks, full, opts in self._copy_full:
            launcher(_gather_copy_kernel)((nmax, nchunks), full, **opts)

    # -- introspection for the gates ------------------------------------------------------------------
    def buffers(self) -> list[torch.Tensor]:
        """Every device tensor the cache owns (its one buffer set)."""
        return [*self.weights, self._slot_ids, self._map_dev, self.tables, self._addr, *self._dev]

    def buffer_bytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.buffers())

    def resident(self) -> dict[int, int]:
        """expert -> slot for the resident experts (device path: reads the device state, syncs)."""
        slot_of = self._slot_of_d.tolist() if self.device_plan else self._slot_of
        return {e: s for e, s in enumerate(slot_of) if s >= 0}

    @property
    def stats(self) -> CacheStats:
        """The counters (device path: adds the device counters, a sync)."""
        st = CacheStats(**vars(self._hstats))
        if self.device_plan:
            for f, v in zip(fields(CacheStats), self._counters.tolist()):
                setattr(st, f.name, getattr(st, f.name) + v)
        return st

    def reset_stats(self) -> None:
        self._hstats = CacheStats()
        if self.device_plan:
            self._counters.zero_()

    # -- the step ------------------------------------------------------------------------------------
    def fill(self, experts: list[int] | None = None) -> None:
        """Make every slot resident before the first step: slot s holds ``experts[s]`` (default expert s),
        copied from the host store (blocking). From then on no slot is ever empty (an eviction replaces its
        expert in the same step), so a step misses at most ``E - n_slots`` experts and
        :meth:`read_through_bound` uses that bound: with ``stage_slots >= E - n_slots`` every step takes the
        device path, whatever its T. The counters are not touched (a fill is not a step).

        Raises:
            ValueError: called after a step, or ``experts`` is not ``n_slots`` distinct ids in ``0..E-1``.
        """
        if self._step or any(self.path_steps.values()):
            raise ValueError("fill() is for a cache that has served no step yet")
        experts = list(range(self.n_slots)) if experts is None else [int(e) for e in experts]
        if len(experts) != self.n_slots or len(set(experts)) != self.n_slots or \
                any(not 0 <= e < self.E for e in experts):
            raise ValueError(f"fill() needs {self.n_slots} distinct expert ids in 0..{self.E - 1}")
        idx = torch.tensor(experts, dtype=torch.long)
        for w, h in zip(self.weights, self.host):
            w[: self.n_slots].copy_(h.index_select(0, idx))
        for s, e in enumerate(experts):
            self._slot_of[e] = s
            self._expert_of[s] = e
        if self.device_plan:
            self._push()
        self.filled = True

    def table(self, i: int) -> torch.Tensor:
        """Weight tensor ``i``'s table ``[E]`` int64 (``read="through"``): after a step's :meth:`prepare`,
        entry e is the offset, in elements from ``weights[i].data_ptr()``, of expert e's ``host[i][0].shape``
        block: its slot in ``weights[i]`` if resident, else its place in the (pinned) host store (a flat 64-bit
        address space: CUDA's UVA). The step's consumer reads each expert through it (kernels/moe/ptr_gemm.py),
        in order on the current stream after the step's copies.

        Raises:
            ValueError: the cache reads through staging slots (``read="stage"``).
        """
        if self.read != "through":
            raise ValueError("table() is for read='through'; this cache stages its read-through misses")
        return self.tables[i]

    def table_ref(self) -> torch.Tensor:
        """The tables ``[NT, E]`` int64 that the host state gives (the reference for the device's; CPU)."""
        addr = self._addr.cpu()
        NT = self.tables.shape[0]
        so = torch.tensor(self._slot_of if not self.device_plan else self._slot_of_d.tolist(), dtype=torch.int64)
        e = torch.arange(self.E, dtype=torch.int64)
        return torch.stack([torch.where(so >= 0, addr[j] + so * addr[2 * NT + j], addr[NT + j] + e * addr[2 * NT + j])
                            for j in range(NT)]) if NT else torch.zeros((0, self.E), dtype=torch.int64)

    def read_through_bound(self, T: int) -> int:
        """The most read-through misses a step of ``T`` tokens can have: ``min(E, T * top_k)``, and at most
        ``E - n_slots`` once the cache is :meth:`fill`-ed (every non-resident expert missed)."""
        b = min(self.E, T * self.top_k)
        return min(b, self.E - self.n_slots) if self.filled else b

    def device_step(self, T: int) -> bool:
        """Whether a step of ``T`` tokens plans on the device (no sync; capturable in a CUDA graph): the device
        path is on and, unless ``read="through"`` (any miss count), :meth:`read_through_bound` fits the staging
        slots."""
        if self.read == "through":
            return bool(self.device_plan)
        return bool(self.device_plan) and self.read_through_bound(T) <= self.stage_slots

    def _copy_in(self, expert: int, slot: int) -> None:
        nb = self.host[0].is_pinned() and self.device.type == "cuda"
        for w, h in zip(self.weights, self.host):
            w[slot].copy_(h[expert], non_blocking=nb)

    def prepare(self, topk_ids: torch.Tensor) -> StepPlan:
        """LRU bookkeeping, inserts and read-through plan for one step; returns the plan (see the module doc).

        A device-path step (``plan.device``) can be captured in a CUDA graph and replayed as new steps: run one
        eager step at the same T first, capture on a static ids buffer (module doc, "the device path").

        Args:
            topk_ids: ``[T, k]`` integer expert ids (any integer dtype and strides), ``T <= max_tokens``.
        Returns:
            the step's plan; ``plan.slot_ids`` ``[T, k]`` int32. A plan with one chunk is ready (its copies are
            issued on the current stream); otherwise call :meth:`stage` before each chunk.
        Raises:
            ValueError: wrong k, too many tokens; on the host path also ids outside ``0..E-1``.
        """
        if topk_ids.dim() != 2:
            raise ValueError(f"topk_ids must be [T, k], got {tuple(topk_ids.shape)}")
        if topk_ids.dtype.is_floating_point or topk_ids.dtype.is_complex or topk_ids.dtype == torch.bool:
            raise ValueError(f"topk_ids must hold integer expert ids, got {topk_ids.dtype}")
        T, k = topk_ids.shape
        if k != self.top_k:
            raise ValueError(f"topk_ids has {k} choices per token, the cache was built for {self.top_k}")
        if T > self.max_tokens:
            raise ValueError(f"{T} tokens in one step; the cache was built for max_tokens={self.max_tokens}")
        if self.device_step(T):
            if self._step >= _MAX_STEP:
                raise OverflowError("the device LRU stamps hold 2**31 - 2 steps")
            if self.device.type == "cuda" and torch.cuda.current_device() != self.device.index:
                with torch.cuda.device(self.device):  # Triton launches on the current device
                    return self._prepare_device(topk_ids)
            return self._prepare_device(topk_ids)
        if self.device_plan:  # a step that may need chunks: the host path on a copy of the device state
            self._pull()
            try:
                return self._prepare_host(topk_ids)
            finally:
                self._push()
        return self._prepare_host(topk_ids)

    def _prepare_device(self, topk_ids: torch.Tensor) -> StepPlan:
        """The device path: two launches, no sync (the caller checked shapes and the staging bound)."""
        T, k = topk_ids.shape
        if topk_ids.device != self.device:
            topk_ids = topk_ids.to(self.device)
        TK = T * k
        self._step += 1  # the host's count (bound check); the stamp itself is the device's _step_d
        self.path_steps["device"] += 1
        lim = math.floor(self.insert_thresh * self.n_slots)  # distinct <= thresh * n  <=>  distinct <= floor
        if self._plan_tail is None:
            self._plan_tail = launcher(_plan_kernel).positional([None] * 17, self._plan_meta)
        tail, opts = self._plan_tail
        launcher(_plan_kernel)((1,), (topk_ids, topk_ids.stride(0), topk_ids.stride(1), TK, self._step_d, lim,
                                self._slot_of_d, self._expert_of_d, self._last_used_d, self._map_dev,
                                self._rank_slot, self._rank_old, self._copy, self._counters, self._slot_ids,
                                *((self.tables, self._addr) if self.read == "through"  # else unused: stand-ins
                                  else (self._counters, self._counters)))
                         + tail[17:], **opts)
        if TK:
            self._launch_copies(min(self.E, TK))
        view = self._views.get(T)
        if view is None:
            view = self._views[T] = self._slot_ids[:TK].view(T, k)
        return StepPlan(slot_ids=view, chunks=[(0, T)], stage_of_chunk=[[]], device=True)

    def _pull(self) -> None:
        """Device state -> the host lists (syncs). The step index too: graph replays advance only the device's."""
        self._step = int(self._step_d.item())
        self._slot_of = self._slot_of_d.tolist()
        self._expert_of = self._expert_of_d.tolist()
        self._last_used = self._last_used_d.tolist()

    def _push(self) -> None:
        """The host lists -> device state (blocking copies from pageable memory)."""
        self._slot_of_d.copy_(torch.tensor(self._slot_of, dtype=torch.int32))
        self._expert_of_d.copy_(torch.tensor(self._expert_of, dtype=torch.int32))
        self._last_used_d.copy_(torch.tensor(self._last_used, dtype=torch.int64))
        self._step_d.fill_(self._step)

    def _prepare_host(self, topk_ids: torch.Tensor) -> StepPlan:
        """The host path (the reference): syncs on the ids, Python bookkeeping, one copy per tensor and expert."""
        T, k = topk_ids.shape
        ids = topk_ids.to("cpu", torch.int64)
        if T and (int(ids.min()) < 0 or int(ids.max()) >= self.E):
            raise ValueError(f"expert ids must be in 0..{self.E - 1}")
        step = self._step
        self._step += 1
        self.path_steps["host"] += 1
        st = self._hstats
        st.steps += 1
        st.routed += T * k
        distinct = torch.unique(ids).tolist()
        st.distinct += len(distinct)
        hits = [e for e in distinct if self._slot_of[e] >= 0]
        misses = [e for e in distinct if self._slot_of[e] < 0]
        st.hits += len(hits)
        st.misses += len(misses)
        for e in hits:
            self._last_used[self._slot_of[e]] = step
        if misses and len(distinct) <= self.insert_thresh * self.n_slots:
            # LRU among the slots this step does not use (empty slots have stamp -1, so they go first)
            free = sorted((s for s in range(self.n_slots) if self._last_used[s] != step),
                          key=lambda s: (self._last_used[s], s))
            for e, s in zip(misses, free):  # len(free) >= len(misses) since distinct <= n_slots
                old = self._expert_of[s]
                if old >= 0:
                    self._slot_of[old] = -1
                    st.evictions += 1
                self._expert_of[s] = e
                self._slot_of[e] = s
                self._last_used[s] = step
                self._copy_in(e, s)
                st.inserts += 1
            misses = []
        elif misses:
            st.steps_over_thresh += 1
        st.read_through += len(misses)
        plan = StepPlan(slot_ids=self._slot_ids[: T * k].view(T, k))
        miss_set = set(misses)
        if self.read == "through":  # no staging: the table points the read-through experts at the host store
            st.chunks += 1
            plan.chunks, plan.stage_of_chunk = [(0, T)], [[]]
            self._map_dev.copy_(torch.tensor(self._slot_of, dtype=torch.int32))
            self.tables.copy_(self.table_ref())
            ids_d = topk_ids.reshape(-1).to(device=self.device, dtype=torch.int64)
            torch.index_select(self._map_dev, 0, ids_d, out=plan.slot_ids.view(-1))
            return plan
        if len(misses) <= self.stage_slots:
            plan.chunks = [(0, T)]
            plan.stage_of_chunk = [misses]
        else:  # greedy token chunks whose read-through experts fit the staging slots
            start, cur = 0, set()
            rows = ids.tolist()
            for t, row in enumerate(rows):
                need = cur | (set(row) & miss_set)
                if len(need) > self.stage_slots:
                    plan.chunks.append((start, t))
                    plan.stage_of_chunk.append(sorted(cur))
                    start, cur = t, set(row) & miss_set
                else:
                    cur = need
            plan.chunks.append((start, T))
            plan.stage_of_chunk.append(sorted(cur))
        st.chunks += len(plan.chunks)
        self._topk = topk_ids
        if len(plan.chunks) == 1:
            self._stage(plan, 0)
        return plan

    def stage(self, plan: StepPlan, chunk: int) -> torch.Tensor:
        """Copy chunk ``chunk``'s read-through experts into the staging slots and write its tokens' slot ids
        into ``plan.slot_ids``; returns the chunk's ``[t1 - t0, k]`` slot ids. A device plan is ready already:
        returns its slot ids, as does a host plan of one chunk (its slot ids were written by prepare())."""
        if plan.device or len(plan.chunks) == 1:
            return plan.slot_ids
        return self._stage(plan, chunk)

    def _stage(self, plan: StepPlan, chunk: int) -> torch.Tensor:
        """stage()'s work on the host path; prepare() runs it for a one-chunk plan."""
        t0, t1 = plan.chunks[chunk]
        m = self._map_host
        m.copy_(torch.tensor(self._slot_of, dtype=torch.int32))
        for i, e in enumerate(plan.stage_of_chunk[chunk]):
            s = self.n_slots + i
            self._copy_in(e, s)
            m[e] = s
        self._map_dev.copy_(m)  # blocking: m is rewritten by the next stage
        ids = self._topk[t0:t1].reshape(-1).to(device=self.device, dtype=torch.int64)
        out = plan.slot_ids[t0:t1].view(-1)
        torch.index_select(self._map_dev, 0, ids, out=out)
        if chunk == len(plan.chunks) - 1:
            self._topk = None  # hold nothing of the step's shape past its last chunk
        return plan.slot_ids[t0:t1]

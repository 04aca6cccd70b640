"""MoE expert cache (a bounded number of experts per layer in device memory, all of them in a host backing
store) and the fused top-k weighted sum with the shared expert.

``ExpertCache`` (one per MoE layer)
    Device memory holds ``n_slots`` experts (every weight tensor of an expert, e.g. w13 and w2) plus
    ``stage_slots`` read-through slots; the host backing store holds all ``E`` experts (pinned when CUDA is
    there, so the copies are DMA). Each step, :meth:`ExpertCache.prepare` takes the router's ``topk_ids``
    ``[T, k]`` and:

    1. counts the step's distinct experts; resident ones are hits (their LRU stamp moves to this step);
    2. if the distinct count is at most ``insert_thresh * n_slots``, every miss is inserted: copied from the
       host store into the least recently used slots not touched this step (empty slots first); above that,
       nothing is inserted this step (``steps_over_thresh``), as in the seeds' R9K_LRU_THRESH;
    3. misses not inserted are read through: copied into the staging slots for this step only;
    4. writes the slot of every (token, j) into one preallocated ``slot_ids`` buffer and returns a view.

    When a step's read-through misses exceed ``stage_slots``, the step is split into token chunks whose
    misses fit (:meth:`plan`; a token has at most k experts, so ``stage_slots >= k`` always progresses).
    Every buffer -- the slots, the staging slots, the slot map, the slot-id buffer for up to ``max_tokens``
    tokens -- is allocated once in the constructor and reused by every step whatever its batch shape (the
    seeds' leak was one buffer set per batch shape). The slots hold exact copies of the host bytes, so any
    computation reading ``cache.weights[i][slot_ids]`` is bit-identical to the same computation reading
    ``host[i][topk_ids]``.

``moe_topk_sum`` / ``moe_topk_sum_ref``
    ``out[t] = sum_{j=0}^{k-1} w[t, j] * y[t, j] + sigmoid(g[t]) * shared[t]`` in fp32, the top-k terms
    added in j order, then the shared expert's gated output, rounded once to the output dtype.
    y ``[T, k, H]`` (the experts' outputs per token and choice), w ``[T, k]`` (router weights), shared
    ``[T, H]`` (the shared expert's output), g ``[T]`` (the shared-expert gate logit; None: no shared expert).
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field

import torch

try:
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover
    triton = None
    tl = None

DEFAULT_INSERT_THRESH = 0.99  # the seeds' R9K_LRU_THRESH after v0.2.x (was 0.5); see NOTES_II.md (knob)


def _interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


@dataclass
class CacheStats:
    """Counters since construction (or :meth:`ExpertCache.reset_stats`). Experts are counted once per step
    (distinct), ``routed`` counts (token, choice) pairs."""

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

    @property
    def hit_rate(self) -> float:
        return self.hits / self.distinct if self.distinct else 0.0


@dataclass
class StepPlan:
    """One step's mapping: ``chunks`` is a list of (token start, token end); ``slot_ids`` ``[T, k]`` (a view of
    the cache's one slot-id buffer) is valid for every chunk after :meth:`ExpertCache.stage` for that chunk."""

    slot_ids: torch.Tensor
    chunks: list[tuple[int, int]] = field(default_factory=list)
    stage_of_chunk: list[list[int]] = field(default_factory=list)


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
    """

    def __init__(self, host: list[torch.Tensor], n_slots: int, max_tokens: int, top_k: int,
                 device: str | torch.device = "cpu", insert_thresh: float = DEFAULT_INSERT_THRESH,
                 stage_slots: int | None = None, pin: bool | None = None):
        if not host:
            raise ValueError("host needs at least one weight tensor [E, ...]")
        E = host[0].shape[0]
        if any(h.shape[0] != E for h in host):
            raise ValueError("every host tensor must have the same expert count in dim 0")
        if not 0 < n_slots <= E:
            raise ValueError(f"n_slots must be in 1..{E}, got {n_slots}")
        if not 0.0 <= insert_thresh <= 1.0:
            raise ValueError(f"insert_thresh must be in [0, 1], got {insert_thresh}")
        stage_slots = n_slots if stage_slots is None else stage_slots
        if stage_slots < top_k:
            raise ValueError(f"stage_slots ({stage_slots}) must be at least top_k ({top_k})")
        self.device = torch.device(device)
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
        # host-side bookkeeping (small, fixed size)
        self._slot_of = [-1] * E                # resident slot of each expert
        self._expert_of = [-1] * n_slots        # expert held by each resident slot
        self._last_used = [-1] * n_slots        # LRU stamp (step index)
        self._map_host = torch.full((E,), -1, dtype=torch.int32, pin_memory=pin)
        self.stats = CacheStats()
        self._step = 0

    # -- introspection for the gates ------------------------------------------------------------------
    def buffers(self) -> list[torch.Tensor]:
        """Every device tensor the cache owns (its one buffer set)."""
        return [*self.weights, self._slot_ids, self._map_dev]

    def buffer_bytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.buffers())

    def resident(self) -> dict[int, int]:
        """expert -> slot for the resident experts."""
        return {e: s for e, s in enumerate(self._slot_of) if s >= 0}

    def reset_stats(self) -> None:
        self.stats = CacheStats()

    # -- the step ------------------------------------------------------------------------------------
    def _copy_in(self, expert: int, slot: int) -> None:
        nb = self.host[0].is_pinned() and self.device.type == "cuda"
        for w, h in zip(self.weights, self.host):
            w[slot].copy_(h[expert], non_blocking=nb)

    def prepare(self, topk_ids: torch.Tensor) -> StepPlan:
        """LRU bookkeeping, inserts and read-through plan for one step; returns the plan (see the module doc).
        For a plan with one chunk the staging copies are done here and ``slot_ids`` is ready; otherwise call
        :meth:`stage` before each chunk."""
        T, k = topk_ids.shape
        if k != self.top_k:
            raise ValueError(f"topk_ids has {k} choices per token, the cache was built for {self.top_k}")
        if T > self.max_tokens:
            raise ValueError(f"{T} tokens in one step; the cache was built for max_tokens={self.max_tokens}")
        ids = topk_ids.to("cpu", torch.int64)
        if T and (int(ids.min()) < 0 or int(ids.max()) >= self.E):
            raise ValueError(f"expert ids must be in 0..{self.E - 1}")
        step = self._step
        self._step += 1
        st = self.stats
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
            self.stage(plan, 0)
        return plan

    def stage(self, plan: StepPlan, chunk: int) -> torch.Tensor:
        """Copy chunk ``chunk``'s read-through experts into the staging slots and write its tokens' slot ids
        into ``plan.slot_ids``; returns the chunk's ``[t1 - t0, k]`` slot ids."""
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


# ============================================================================================================
# the fused top-k weighted sum with the shared expert
# ============================================================================================================
def moe_topk_sum_ref(y: torch.Tensor, w: torch.Tensor, shared: torch.Tensor | None = None,
                     gate: torch.Tensor | None = None, out_dtype: torch.dtype | None = None) -> torch.Tensor:
    """fp32 reference of :func:`moe_topk_sum`, in the kernel's order (pass float64 inputs for the exact sum)."""
    acc_t = torch.float64 if y.dtype == torch.float64 else torch.float32
    T, k, H = y.shape
    acc = torch.zeros(T, H, dtype=acc_t, device=y.device)
    for j in range(k):
        acc = acc + w[:, j, None].to(acc_t) * y[:, j].to(acc_t)
    if shared is not None:
        g = gate.to(acc_t) if gate is not None else torch.zeros(T, dtype=acc_t, device=y.device)
        acc = acc + shared.to(acc_t) * (1.0 / (1.0 + torch.exp(-g)))[:, None]  # the kernel's sigmoid
    return acc.to(out_dtype or y.dtype)


if triton is not None:

    @triton.jit
    def _topk_sum_kernel(y, w, shared, gate, out, H, syt, syk, swt, sst, sot,
                         K: tl.constexpr, BH: tl.constexpr, HAS_SHARED: tl.constexpr, HAS_GATE: tl.constexpr,
                         RNE_FIX: tl.constexpr):
        # grid: (T, cdiv(H, BH))
        t = tl.program_id(0).to(tl.int64)
        offs = tl.program_id(1) * BH + tl.arange(0, BH)
        hm = offs < H
        acc = tl.zeros((BH,), dtype=tl.float32)
        for j in tl.static_range(K):
            wj = tl.load(w + t * swt + j).to(tl.float32)
            yj = tl.load(y + t * syt + j * syk + offs, mask=hm, other=0.0).to(tl.float32)
            acc += wj * yj
        if HAS_SHARED:
            sv = tl.load(shared + t * sst + offs, mask=hm, other=0.0).to(tl.float32)
            if HAS_GATE:
                g = tl.load(gate + t).to(tl.float32)
                sv = sv * (1.0 / (1.0 + tl.exp(-g)))
            else:
                sv = sv * 0.5
            acc += sv
        if RNE_FIX:  # Triton 3.9's interpreter truncates fp32 -> bf16: round to nearest even on the bits
            if out.dtype.element_ty == tl.bfloat16:
                bits = acc.to(tl.uint32, bitcast=True)
                acc = ((bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000).to(tl.float32, bitcast=True)
        tl.store(out + t * sot + offs, acc.to(out.dtype.element_ty), mask=hm)


def moe_topk_sum(y: torch.Tensor, w: torch.Tensor, shared: torch.Tensor | None = None,
                 gate: torch.Tensor | None = None, out: torch.Tensor | None = None, BH: int | None = None):
    """The fused top-k weighted sum plus the sigmoid-gated shared expert, one launch (see the module doc).

    Args:
        y: ``[T, k, H]`` experts' outputs (bf16/fp16/fp32), last dim contiguous.
        w: ``[T, k]`` router weights (any float dtype).
        shared: optional ``[T, H]`` shared expert output; gate: optional ``[T]`` or ``[T, 1]`` gate logits
            (sigmoid applied here; without a gate the shared term is weighted sigmoid(0) = 0.5).
        out: optional ``[T, H]``; default a new tensor in y's dtype.
    """
    T, k, H = y.shape
    if w.shape != (T, k):
        raise ValueError(f"w must be [{T}, {k}], got {tuple(w.shape)}")
    if y.stride(-1) != 1:
        raise ValueError("y must have a contiguous last dim")
    w = w.contiguous()
    if shared is not None and (shared.shape != (T, H) or shared.stride(-1) != 1):
        raise ValueError(f"shared must be [{T}, {H}] with a contiguous last dim")
    if gate is not None:
        gate = gate.reshape(T).contiguous()
    if out is None:
        out = torch.empty(T, H, dtype=y.dtype, device=y.device)
    if T == 0:
        return out
    BH = BH or min(1024 if not _interpreting() else 128, triton.next_power_of_2(H))
    _topk_sum_kernel[(T, triton.cdiv(H, BH))](
        y, w, shared if shared is not None else y, gate if gate is not None else w, out, H,
        y.stride(0), y.stride(1), w.stride(0), shared.stride(0) if shared is not None else 0, out.stride(0),
        K=k, BH=BH, HAS_SHARED=shared is not None, HAS_GATE=gate is not None, RNE_FIX=_interpreting(), num_warps=4,
    )
    return out

"""MoE expert cache (a bounded number of experts per layer in device memory, all of them in a host backing
store) and the fused top-k weighted sum with the shared expert.

``ExpertCache`` (one per MoE layer)
    Device memory holds ``n_slots`` experts (every weight tensor of an expert, e.g. w13 and w2) plus
    ``stage_slots`` read-through slots; the host backing store holds all ``E`` experts (pinned when CUDA is
    there, so the device can read it). Each step, :meth:`ExpertCache.prepare` takes the router's ``topk_ids``
    ``[T, k]`` and:

    1. counts the step's distinct experts; resident ones are hits (their LRU stamp moves to this step);
    2. if the distinct count is at most ``insert_thresh * n_slots``, every miss is inserted: copied from the
       host store into the least recently used slots not touched this step (empty slots first, ties by slot
       index; misses in ascending expert id take those slots in that order); above that, nothing is inserted
       this step (``steps_over_thresh``), as in the seeds' R9K_LRU_THRESH;
    3. misses not inserted are read through: with ``read="stage"`` the i-th (ascending id) is copied into
       staging slot ``n_slots + i`` for this step only; with ``read="through"`` there are no staging slots: the
       step's per-expert address tables (:meth:`ExpertCache.table`, one ``[E]`` int64 row per weight tensor)
       point each expert at its slot if resident, else at its place in the pinned host store, which the
       step's GEMM reads zero-copy (:func:`invoke_ptr_moe`, kernels/moe/ptr_gemm.py); such an expert's slot id
       is -1. Every step of any miss count then plans on the device;
    4. writes the slot of every (token, j) into one preallocated ``slot_ids`` buffer and returns a view.

    Two implementations of that one policy (identical slot assignments, counters and slot contents):

    * the device path (``device_plan=True``, the default where it can run): two Triton launches per step
      (one more per further 4 weight tensors) and no host <-> device synchronisation. ``_plan_kernel`` (one
      program) does the bookkeeping on device-resident state of fixed shapes (``slot_of [E]``,
      ``expert_of / last_used [n_slots]``, counters): presence of the step's experts by a scatter, hits
      stamped, free slots ranked by a sort of (stamp, slot), misses ranked by a cumsum, the threshold as a
      device-side predicate, evictions, the copy list and the slot ids.
      ``_gather_copy_kernel`` then copies every listed expert, all weight tensors, in one launch of grid
      ``(min(E, T*k), chunks per expert)``; programs beyond the device-side miss count exit at once. It reads
      the pinned host store directly (zero-copy over PCIe): Triton's CUDA launcher turns every pointer argument
      into ``cuPointerGetAttribute(CU_POINTER_ATTRIBUTE_DEVICE_POINTER)`` of its ``data_ptr()``, which for
      pinned (cudaHostAlloc, hence mapped under UVA) memory is the device-visible address of the same bytes --
      so the pinned CPU tensor is passed as is; a pageable one is refused there ("cannot be accessed from
      Triton"), which the constructor probes once and then keeps the host path. Each weight tensor is copied
      as flat words (int64 / int32 / int16 / uint8: the widest that divides its per-expert bytes and both base
      addresses), 16 KiB per program, so experts whose byte size is a multiple of 128 move as aligned 16-byte
      vector loads. Counters live in a device tensor and become :class:`CacheStats` when :attr:`stats` is
      read (that read syncs, as does :meth:`resident`). Everything is ordered on the current stream: the
      consumer of step s must be enqueued there before step s + 1's prepare() (which rewrites the slot ids,
      the staging slots and may evict). The step index (the LRU stamp) lives on the device and the plan kernel
      advances it, so a device-path prepare() captured in a CUDA graph (``torch.cuda.graph``) replays as a
      new step each time: run one eager step at that T first (it compiles the kernels and builds the slot-id
      view), then capture it on the tensor that the router writes (a static ``[T, k]`` buffer) and replay
      with the same T; every launch argument is fixed for a given T. Host-side counts see only eager calls
      and the capture, not replays: ``path_steps`` and the bound check on the step count (2**31 - 2);
      :attr:`stats` reads the device's counters and includes them.

      A step takes the device path when its read-through misses are sure to fit the staging slots:
      ``min(E, T*k) <= stage_slots``, or, once :meth:`ExpertCache.fill` made every slot resident (no slot is
      empty again, so a step misses at most ``E - n_slots``), ``min(E - n_slots, T*k) <= stage_slots``
      (:meth:`ExpertCache.device_step`). Any other step (a large prefill with a small staging area) takes the host
      path below and SYNCS: the device state is read back, the step is planned on the host, the state written
      back. The device path does not check expert ids on the host: an id outside ``0..E-1`` gets slot ``-1``
      and is counted in ``CacheStats.invalid_ids`` (the host path raises ValueError).
    * the host path (``device_plan=False``; the reference): the ids are copied to the host (sync), the
      bookkeeping runs in Python lists, one ``copy_`` per weight tensor per expert, a blocking copy of the
      expert -> slot map. When a step's read-through misses exceed ``stage_slots``, it splits the step into
      token chunks whose misses fit (a token has at most k experts, so ``stage_slots >= k``
      always progresses) and :meth:`stage` is called before each chunk.

    Every buffer -- the slots, the staging slots, the slot map, the bookkeeping state, the copy list, the
    slot-id buffer for up to ``max_tokens`` tokens -- is allocated once in the constructor and reused by every
    step whatever its batch shape (the seeds' leak was one buffer set per batch shape). The slots hold exact
    copies of the host bytes, so any computation reading ``cache.weights[i][slot_ids]`` is bit-identical to
    the same computation reading ``host[i][topk_ids]``.

``moe_topk_sum`` / ``moe_topk_sum_ref``
    ``out[t] = sum_{j=0}^{k-1} w[t, j] * y[t, j] + sigmoid(g[t]) * shared[t]`` in fp32, the top-k terms
    added in j order, then the shared expert's gated output, rounded once to the output dtype.
    y ``[T, k, H]`` (the experts' outputs per token and choice), w ``[T, k]`` (router weights), shared
    ``[T, H]`` (the shared expert's output), g ``[T]`` (the shared-expert gate logit; None: no shared expert).

Modules: :mod:`kernels.moe.cache` (ExpertCache, its plan and gather-copy kernels), :mod:`kernels.moe.ptr_gemm`
(the MoE GEMM over a per-expert pointer table), :mod:`kernels.moe.topk_sum`
(moe_topk_sum), :mod:`kernels.moe.reference` (the top-k sum's reference). The design and the H200 figures:
docs/kernels/moe.md.
"""
from kernels.moe.cache import (DEFAULT_INSERT_THRESH, CacheStats, ExpertCache, StepPlan, allocator_bytes,
                               device_bytes)
from kernels.moe.ptr_gemm import invoke_ptr_moe
from kernels.moe.reference import moe_topk_sum_ref
from kernels.moe.topk_sum import moe_topk_sum

__all__ = ["ExpertCache", "CacheStats", "StepPlan", "DEFAULT_INSERT_THRESH", "device_bytes", "allocator_bytes",
           "invoke_ptr_moe", "moe_topk_sum", "moe_topk_sum_ref"]

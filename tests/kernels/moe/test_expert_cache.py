"""ExpertCache (kernels/moe/cache.py) under random routing traces whose batch shape changes every step: bit-identical
to reading every expert from the host backing store (the same compute on the slots' copies), one buffer set
whatever the batch shape, the LRU order and the insert threshold; the device path (plan kernel + gather-copy
kernel, the step index on the device) against the host path after every step (slot ids, chunks, slot bytes,
stamps, counters) at edge settings, with host steps on the device state in between, mixed-dtype weight tensors,
strided and invalid ids, the step index near its bound; on a GPU without a host sync and replayed from a CUDA
graph."""
from __future__ import annotations

import pytest
import torch

import kernels.moe.cache as moe
from kernels.moe import ExpertCache


def expert_ffn(x, w13, w2):
    """A SwiGLU expert on the rows routed to it: x [R, H], w13 [R, 2I, H], w2 [R, H, I] (one matrix per row,
    gathered per (token, choice)); batch-invariant per row, fp32."""
    gu = torch.einsum("rh,rih->ri", x.float(), w13.float())
    g, u = gu.chunk(2, dim=-1)
    return torch.einsum("ri,rhi->rh", torch.nn.functional.silu(g) * u, w2.float())


def trace(gen, steps, E, k, max_tokens, hot=12):
    """A routing trace: batch sizes change every step (1..max_tokens), routing skewed to a drifting hot set.
    Every fifth step is a single-token (decode) step, so a low insert threshold still sees steps under it and
    the hit/insert assertions cannot depend on the draw."""
    out = []
    for s in range(steps):
        T = 1 if s % 5 == 0 else int(torch.randint(1, max_tokens + 1, (1,), generator=gen))
        logits = torch.randn(T, E, generator=gen)
        hot_set = (torch.arange(hot) + s // 3) % E
        logits[:, hot_set] += 2.5
        out.append(torch.topk(logits, k, dim=-1).indices)
    return out


@pytest.mark.parametrize("thresh", [0.99, 0.5], ids=["thresh0.99", "thresh0.5"])
def test_cache_bit_identical_and_one_buffer_set(mode, device, gen, thresh):
    E, H, I, k = (32, 16, 8, 4) if mode == "interp" else (128, 256, 128, 8)
    n_slots, max_tokens, steps = (12, 24, 60) if mode == "interp" else (48, 256, 200)
    w13 = (torch.randn(E, 2 * I, H, generator=gen) * 0.1).to(torch.bfloat16)
    w2 = (torch.randn(E, H, I, generator=gen) * 0.1).to(torch.bfloat16)
    cache = ExpertCache([w13, w2], n_slots=n_slots, max_tokens=max_tokens, top_k=k, device=device,
                        insert_thresh=thresh, stage_slots=k + 2)
    host13, host2 = cache.host
    ptrs0 = [t.data_ptr() for t in cache.buffers()]
    bytes0 = cache.buffer_bytes()
    mem = []
    for step, ids in enumerate(trace(gen, steps, E, k, max_tokens)):
        T = ids.shape[0]
        x = torch.randn(T, H, generator=gen).to(device=device, dtype=torch.bfloat16)
        ids_d = ids.to(device)
        plan = cache.prepare(ids_d)
        for c, (t0, t1) in enumerate(plan.chunks):
            slots = cache.stage(plan, c) if len(plan.chunks) > 1 else plan.slot_ids
            sl = slots.reshape(-1).long()
            ex = ids[t0:t1].reshape(-1)
            xr = x[t0:t1].repeat_interleave(k, dim=0)
            w13c, w2c = cache.weights[0][sl], cache.weights[1][sl]
            w13h, w2h = host13[ex].to(device), host2[ex].to(device)
            assert torch.equal(w13c, w13h) and torch.equal(w2c, w2h)
            assert torch.equal(expert_ffn(xr, w13c, w2c), expert_ffn(xr, w13h, w2h))
        assert [t.data_ptr() for t in cache.buffers()] == ptrs0 and cache.buffer_bytes() == bytes0
        if device == "cuda":
            del plan, slots, sl, w13c, w2c, w13h, w2h, xr, x, ids_d
            torch.cuda.synchronize()
            mem.append(torch.cuda.memory_allocated())
    st = cache.stats
    assert st.steps == steps and st.hits + st.misses == st.distinct
    assert st.inserts + st.read_through == st.misses
    assert st.hits > 0 and st.inserts > 0
    assert len(cache.resident()) <= n_slots
    if thresh == 0.5:
        assert st.steps_over_thresh > 0 and st.read_through > 0
    assert st.chunks >= steps
    if mem:
        assert max(mem[10:]) <= mem[10], f"device memory grew after warm-up: {mem[10]} -> {max(mem[10:])}"


def test_cache_lru_order_and_threshold(mode, device):
    E, k = 8, 2
    w = torch.arange(E * 4, dtype=torch.float32).reshape(E, 4)
    cache = ExpertCache([w], n_slots=3, max_tokens=4, top_k=k, device=device, insert_thresh=1.0)
    cache.prepare(torch.tensor([[0, 1]], device=device))
    cache.prepare(torch.tensor([[2, 0]], device=device))
    assert set(cache.resident()) == {0, 1, 2}
    plan = cache.prepare(torch.tensor([[3, 0]], device=device))  # evicts 1, the least recently used
    assert set(cache.resident()) == {0, 2, 3}
    assert torch.equal(cache.weights[0][plan.slot_ids.long()].cpu(), w[torch.tensor([[3, 0]])])
    cache.insert_thresh = 0.5  # 3 distinct > 1.5: nothing inserted, all misses read through
    before = dict(cache.resident())
    plan = cache.prepare(torch.tensor([[5, 6], [7, 0]], device=device))
    assert cache.resident() == before and cache.stats.steps_over_thresh == 1
    assert torch.equal(cache.weights[0][plan.slot_ids.long()].cpu(), w[torch.tensor([[5, 6], [7, 0]])])
    with pytest.raises(ValueError):
        cache.prepare(torch.zeros(5, k, dtype=torch.int64, device=device))


@pytest.mark.parametrize("stage", ["device", "tiles", "mixed"])
@pytest.mark.parametrize("thresh", [0.99, 0.5], ids=["thresh0.99", "thresh0.5"])
def test_cache_device_path_matches_host_path(mode, device, gen, thresh, stage, monkeypatch):
    """The sync-free device path against the host path (the reference) over the same routing trace: the same
    slot of every (token, choice), the same resident set, the same counters after every step, slots holding
    the host bytes (so the expert FFN is bit-identical to one reading the host store), and one buffer set.
    stage="device": stage_slots = E, every step takes the device path; "tiles": the same with the plan
    kernel's tiles shrunk to 16 (several expert tiles, the miss rank carried across them; several token
    tiles); "mixed": stage_slots = k + 2, only single-token steps do, the others take the host path on the
    device state (read back and written back)."""
    E, H, I, k = (32, 16, 8, 4) if mode == "interp" else (128, 256, 128, 8)
    n_slots, max_tokens, steps = (12, 24, 60) if mode == "interp" else (48, 256, 200)
    w13 = (torch.randn(E, 2 * I, H, generator=gen) * 0.1).to(torch.bfloat16)
    w2 = (torch.randn(E, H, I, generator=gen) * 0.1).to(torch.bfloat16)
    stage_slots = k + 2 if stage == "mixed" else E
    if stage == "tiles":
        monkeypatch.setattr(moe, "_PLAN_TILE_MAX", {"E": 16, "T": 16})
    kw = dict(n_slots=n_slots, max_tokens=max_tokens, top_k=k, device=device, insert_thresh=thresh,
              stage_slots=stage_slots)
    dev = ExpertCache([w13, w2], device_plan=True, **kw)
    ref = ExpertCache(dev.host, device_plan=False, **kw)  # the same (pinned) host store
    if stage == "tiles":
        assert dev._plan_meta["BE"] == 16 and not dev._plan_meta["ONE_TILE"]
    host13, host2 = dev.host
    ptrs0, bytes0 = [t.data_ptr() for t in dev.buffers()], dev.buffer_bytes()
    mem = []
    for step, ids in enumerate(trace(gen, steps, E, k, max_tokens)):
        T = ids.shape[0]
        x = torch.randn(T, H, generator=gen).to(device=device, dtype=torch.bfloat16)
        ids_d = ids.to(device)
        pd, pr = dev.prepare(ids_d), ref.prepare(ids_d)
        assert pd.device == (min(E, T * k) <= stage_slots)
        assert pd.chunks == pr.chunks
        for c, (t0, t1) in enumerate(pd.chunks):
            sd = dev.stage(pd, c) if len(pd.chunks) > 1 else pd.slot_ids
            sr = ref.stage(pr, c) if len(pr.chunks) > 1 else pr.slot_ids
            assert torch.equal(sd, sr), (step, c)
            sl = sd.reshape(-1).long()
            ex = ids[t0:t1].reshape(-1)
            xr = x[t0:t1].repeat_interleave(k, dim=0)
            w13d, w2d = dev.weights[0][sl], dev.weights[1][sl]
            w13r, w2r = ref.weights[0][sr.reshape(-1).long()], ref.weights[1][sr.reshape(-1).long()]
            w13h, w2h = host13[ex].to(device), host2[ex].to(device)
            assert torch.equal(w13d, w13h) and torch.equal(w2d, w2h), (step, c)
            yd, yr, yh = expert_ffn(xr, w13d, w2d), expert_ffn(xr, w13r, w2r), expert_ffn(xr, w13h, w2h)
            assert torch.equal(yd, yr) and torch.equal(yd, yh), (step, c)
        assert dev.resident() == ref.resident(), step
        assert dev.stats == ref.stats, step
        assert [t.data_ptr() for t in dev.buffers()] == ptrs0 and dev.buffer_bytes() == bytes0
        if device == "cuda":
            del pd, pr, sd, sr, sl, w13d, w2d, w13r, w2r, w13h, w2h, xr, x, ids_d, yd, yr, yh
            torch.cuda.synchronize()
            mem.append(torch.cuda.memory_allocated())
    st = dev.stats
    assert st.steps == steps and st.inserts > 0 and st.hits > 0 and st.invalid_ids == 0
    assert st.inserts + st.read_through == st.misses
    if thresh == 0.5:
        assert st.steps_over_thresh > 0 and st.read_through > 0
    if stage != "mixed":
        assert dev.path_steps == {"device": steps, "host": 0}
    else:
        assert dev.path_steps["device"] >= steps // 5 and dev.path_steps["host"] > 0
    if mem:
        assert max(mem[10:]) <= mem[10], f"device memory grew after warm-up: {mem[10]} -> {max(mem[10:])}"


def test_cache_device_path_layouts(mode, device, gen):
    """Five weight tensors of mixed dtypes and odd per-expert byte counts (word sizes 8, 4, 2 and 1; two copy
    launches of at most four tensors), int32 ids given as a strided view, and out-of-range ids: slot -1,
    counted in invalid_ids, the valid pairs unaffected."""
    E, k = 20, 3
    host = [torch.randn(E, 3, generator=gen),                                   # 12 B: int32 words
            torch.randn(E, 5, generator=gen).to(torch.bfloat16),                # 10 B: int16
            torch.randint(0, 255, (E, 7), generator=gen, dtype=torch.uint8),     # 7 B: uint8
            torch.randint(-2**40, 2**40, (E, 2, 2), generator=gen),             # 32 B: int64
            torch.randn(E, 4, 33, generator=gen).to(torch.float16)]             # 264 B: int64
    kw = dict(n_slots=6, max_tokens=8, top_k=k, device=device, insert_thresh=1.0, stage_slots=E)
    dev = ExpertCache(host, device_plan=True, **kw)
    ref = ExpertCache(dev.host, device_plan=False, **kw)
    assert len(dev._copy_launches) == 2
    for step in range(12):
        T = 1 + step % 4
        ids = torch.randint(0, E, (k, T), generator=gen, dtype=torch.int32)
        ids_t = ids.to(device).t()  # [T, k], strides (1, T)
        pd, pr = dev.prepare(ids_t), ref.prepare(ids_t)
        assert torch.equal(pd.slot_ids, pr.slot_ids) and dev.resident() == ref.resident() and dev.stats == ref.stats
        sl = pd.slot_ids.reshape(-1).long()
        for w, h in zip(dev.weights, dev.host):
            assert torch.equal(w[sl].cpu(), h[ids.t().reshape(-1).long()])
    bad = torch.tensor([[E, 1, -1], [2, 3, 2]], device=device)
    before = dev.stats.invalid_ids
    plan = dev.prepare(bad)
    sid = plan.slot_ids.cpu()
    assert sid[0, 0] == -1 and sid[0, 2] == -1 and (sid[0, 1] >= 0) and (sid[1] >= 0).all()
    assert dev.stats.invalid_ids == before + 2
    for w, h in zip(dev.weights, dev.host):
        assert torch.equal(w[sid[1].long()].cpu(), h[torch.tensor([2, 3, 2])])
    with pytest.raises(ValueError):
        ref.prepare(bad)


def _steps(gen, E, k, max_tokens, n):
    """A trace with empty steps, single tokens, full batches, repeated experts and a hot set."""
    out = []
    for s in range(n):
        T = [0, 1, max_tokens, 2][s % 4] if s % 3 else int(torch.randint(0, max_tokens + 1, (1,), generator=gen))
        logits = torch.randn(T, E, generator=gen)
        logits[:, (torch.arange(3) + s // 4) % E] += 3.0
        out.append(torch.topk(logits, k, dim=-1).indices)
    return out


@pytest.mark.parametrize("E,n_slots,k,thresh,stage", [
    (8, 8, 2, 1.0, 8),      # n_slots == E, every step inserts
    (8, 8, 2, 0.99, 8),     # n_slots == E, a step with all E distinct goes over the threshold
    (10, 4, 2, 0.0, 10),    # thresh 0: nothing is ever inserted, everything reads through
    (10, 4, 3, 1.0, 3),     # stage_slots == k: most steps take the host path on the device state
    (12, 1, 1, 1.0, 12),    # one slot, top-1
], ids=["ns_eq_E_1.0", "ns_eq_E_0.99", "thresh0", "stage_eq_k", "one_slot"])
def test_device_path_equals_host_path_at_edges(mode, device, gen, E, n_slots, k, thresh, stage):
    max_tokens = 4
    w = torch.randn(E, 3, 8, generator=gen)
    kw = dict(n_slots=n_slots, max_tokens=max_tokens, top_k=k, device=device, insert_thresh=thresh,
              stage_slots=stage)
    dev = ExpertCache([w], device_plan=True, **kw)
    ref = ExpertCache(dev.host, device_plan=False, **kw)
    for step, ids in enumerate(_steps(gen, E, k, max_tokens, 24)):
        # int32 ids given as a non-contiguous view every other step
        ids_in = ids.to(torch.int32).t().contiguous().t() if step % 2 else ids
        ids_in = ids_in.to(device)
        pd, pr = dev.prepare(ids_in), ref.prepare(ids_in)
        assert pd.chunks == pr.chunks, step
        for c, (t0, t1) in enumerate(pd.chunks):
            sd = dev.stage(pd, c) if len(pd.chunks) > 1 else pd.slot_ids
            sr = ref.stage(pr, c) if len(pr.chunks) > 1 else pr.slot_ids
            assert torch.equal(sd.cpu(), sr.cpu()), (step, c)
            assert torch.equal(dev.weights[0][sd.reshape(-1).long()].cpu(), w[ids[t0:t1].reshape(-1)]), (step, c)
        if step % 3 == 0:  # stats and resident() read between steps must not disturb the state
            assert dev.stats == ref.stats, step
            assert dev.resident() == ref.resident(), step
    assert dev.stats == ref.stats and dev.resident() == ref.resident()
    if thresh == 0.0:
        assert dev.stats.inserts == 0 and dev.resident() == {}
    dev.reset_stats()
    ref.reset_stats()
    assert dev.stats == ref.stats == moe.CacheStats()


def _mixed_trace(gen, steps, E, k, sizes):
    out = []
    for s in range(steps):
        T = sizes[s % len(sizes)]
        hi = 4 if s % 7 == 3 else E                      # some steps all hits on a small hot set
        out.append(torch.randint(0, hi, (T, k), generator=gen))
    return out


def test_device_and_host_caches_agree_step_by_step_incl_stamps(mode, device, gen):
    """device_plan=True (device steps for T*k <= stage_slots, host steps on the pulled state otherwise, T = 0
    steps included) against device_plan=False fed the same trace: after every step the same slot ids, chunks,
    slot bytes, step index and LRU stamps; resident() and stats read in between (every 3rd step); reset_stats()
    on both mid-trace."""
    E, k = 16, 2
    w = torch.randn(E, 8, generator=gen)
    kw = dict(n_slots=5, max_tokens=6, top_k=k, device=device, insert_thresh=0.8, stage_slots=3)
    dev = ExpertCache([w], device_plan=True, **kw)
    ref = ExpertCache(dev.host, device_plan=False, **kw)
    host = dev.host[0]
    for s, ids in enumerate(_mixed_trace(gen, 48, E, k, [1, 0, 3, 1, 6, 2])):
        ids_d = ids.to(device)
        pd, pr = dev.prepare(ids_d), ref.prepare(ids_d)
        assert pd.device == (ids.shape[0] * k <= 3) and pd.chunks == pr.chunks, s
        for c, (t0, t1) in enumerate(pd.chunks):
            sd = dev.stage(pd, c) if len(pd.chunks) > 1 else pd.slot_ids
            sr = ref.stage(pr, c) if len(pr.chunks) > 1 else pr.slot_ids
            assert torch.equal(sd, sr), (s, c)
            assert torch.equal(dev.weights[0][sd.reshape(-1).long()].cpu(), host[ids[t0:t1].reshape(-1)]), (s, c)
        assert int(dev._step_d.item()) == ref._step == s + 1, s
        assert dev._last_used_d.cpu().tolist() == ref._last_used, s
        if s % 3 == 0:
            assert dev.resident() == ref.resident() and dev.stats == ref.stats, s
        if s == 24:
            dev.reset_stats()
            ref.reset_stats()
            assert dev.stats == ref.stats == moe.CacheStats()
    assert dev.path_steps["device"] > 0 and dev.path_steps["host"] > 0
    st = dev.stats
    assert st == ref.stats and st.steps == 23 and st.inserts > 0 and st.hits > 0


@pytest.mark.parametrize("thresh", [0.99, 0.3], ids=["thresh0.99", "thresh0.3"])
def test_filled_cache_plans_every_step_on_the_device(mode, device, gen, thresh):
    """fill() makes every slot resident; then staging of E - n_slots bounds every step's read-through misses, so
    steps of any T (T*k far above the staging) take the device path, and agree step by step with a filled
    host-path cache (slot ids, slot bytes, stamps, counters). Refusals: after a step, a wrong expert list."""
    E, k, n = 16, 3, 6
    w = torch.randn(E, 8, generator=gen)
    kw = dict(n_slots=n, max_tokens=12, top_k=k, device=device, insert_thresh=thresh, stage_slots=E - n)
    dev = ExpertCache([w], device_plan=True, **kw)
    ref = ExpertCache(dev.host, device_plan=False, **kw)
    with pytest.raises(ValueError, match="distinct"):
        dev.fill([0] * n)
    assert not dev.device_step(12)  # min(E, 36) = 16 > 10 staging before the fill
    order = torch.randperm(E, generator=gen)[:n].tolist()
    dev.fill(order)
    ref.fill(order)
    assert dev.device_step(12) and dev.read_through_bound(12) == E - n
    assert dev.resident() == ref.resident() == {e: s for s, e in enumerate(order)}
    host = dev.host[0]
    for s, ids in enumerate(_mixed_trace(gen, 30, E, k, [12, 1, 7, 12, 4])):
        ids_d = ids.to(device)
        pd, pr = dev.prepare(ids_d), ref.prepare(ids_d)
        assert pd.device and len(pr.chunks) == 1, s
        assert torch.equal(pd.slot_ids.cpu(), pr.slot_ids.cpu()), s
        assert torch.equal(dev.weights[0][pd.slot_ids.reshape(-1).long()].cpu(), host[ids.reshape(-1)]), s
        assert dev._last_used_d.cpu().tolist() == ref._last_used, s
    assert dev.stats == ref.stats and dev.path_steps["host"] == 0
    assert len(dev.resident()) == n
    with pytest.raises(ValueError, match="no step"):
        dev.fill()


def test_invalid_ids_on_a_host_step_of_a_device_cache_leave_the_state(mode, device):
    """A device-plan cache whose step takes the host path (misses over the staging slots) with an invalid id
    raises, and the device state (read back before, written back after) is unchanged."""
    w = torch.randn(10, 4)
    c = ExpertCache([w], n_slots=4, max_tokens=4, top_k=2, device=device, insert_thresh=1.0, stage_slots=2,
                    device_plan=True)
    c.prepare(torch.tensor([[1, 2]], device=device))
    before, st = c.resident(), c.stats
    with pytest.raises(ValueError):
        c.prepare(torch.tensor([[0, 1], [2, 10]], device=device))
    assert c.resident() == before and c.stats == st


@pytest.mark.parametrize("device_plan", [True, False], ids=["device", "host"])
def test_non_integer_ids_are_refused(mode, device, device_plan):
    c = ExpertCache([torch.randn(8, 4)], n_slots=4, max_tokens=2, top_k=2, device=device, device_plan=device_plan)
    with pytest.raises(ValueError):
        c.prepare(torch.tensor([[1.7, 2.2]], device=device))
    with pytest.raises(ValueError):
        c.prepare(torch.tensor([[True, False]], device=device))


def test_stage_on_a_ready_one_chunk_host_plan(mode, device):
    """stage(plan, 0) on a one-chunk plan: a device plan returned its slot ids ("A device plan is ready
    already"), but a host plan raised TypeError ('NoneType' object is not subscriptable: prepare() had staged
    it and dropped _topk), so a caller that stages every chunk of every plan crashed on the host path."""
    E, k = 8, 2
    w = torch.randn(E, 4)
    cache = ExpertCache([w], n_slots=4, max_tokens=4, top_k=k, device=device, device_plan=False)
    ids = torch.tensor([[0, 1], [2, 3]], device=device)
    plan = cache.prepare(ids)
    assert len(plan.chunks) == 1
    got = cache.stage(plan, 0)
    assert torch.equal(got, plan.slot_ids)


def test_cache_step_index_on_device(mode, device, gen):
    """The LRU stamp is the device's step counter, advanced by the plan kernel (what makes a captured prepare()
    replay as a new step): after n device steps it holds n, the stamps of the slots used by the last step equal
    n - 1, and a host-path step in between reads and writes it back (the stamps stay one sequence)."""
    E, k = 16, 2
    cache = ExpertCache([torch.randn(E, 4, generator=gen)], n_slots=4, max_tokens=8, top_k=k, device=device,
                        insert_thresh=1.0, stage_slots=k + 1)
    assert cache.device_plan
    for n in range(1, 6):
        ids = torch.randint(0, E, (1, k), generator=gen)
        cache.prepare(ids.to(device))
        assert int(cache._step_d.item()) == n
    used = {cache.resident()[int(e)] for e in ids[0]}
    lu = cache._last_used_d.cpu().tolist()
    assert all(lu[s] == 4 for s in used)
    cache.prepare(torch.randint(0, E, (4, k), generator=gen).to(device))  # 8 ids > stage_slots: host path
    assert cache.path_steps == {"device": 5, "host": 1} and int(cache._step_d.item()) == 6
    cache.prepare(torch.tensor([[0, 1]], device=device))
    assert int(cache._step_d.item()) == 7 and max(cache._last_used_d.cpu().tolist()) == 6


def test_step_index_bound_near_2_31(mode, device):
    """The eager bound on the device LRU stamp: with the step index moved to 2**31 - 5 (both caches, stamps
    shifted alike) the device path keeps agreeing with the host path up to the last allowed stamp
    (2**31 - 3), then raises OverflowError with the state untouched; a host-path step still runs after it."""
    E, k = 16, 2
    w = torch.arange(E * 4, dtype=torch.float32).reshape(E, 4)
    kw = dict(n_slots=4, max_tokens=4, top_k=k, device=device, insert_thresh=1.0, stage_slots=4)
    dev = ExpertCache([w], device_plan=True, **kw)
    ref = ExpertCache(dev.host, device_plan=False, **kw)
    for ids in ([[0, 1]], [[2, 3]], [[4, 0]]):
        dev.prepare(torch.tensor(ids, device=device))
        ref.prepare(torch.tensor(ids))
    base = moe._MAX_STEP - 3
    off = base - ref._step
    ref._step = base
    ref._last_used = [x + off if x >= 0 else x for x in ref._last_used]
    dev._step = base
    dev._step_d.fill_(base)
    dev._last_used_d.copy_(torch.tensor(ref._last_used))
    for ids in ([[5, 6]], [[1, 7]], [[8, 9]]):
        pd, pr = dev.prepare(torch.tensor(ids, device=device)), ref.prepare(torch.tensor(ids))
        assert torch.equal(pd.slot_ids.cpu(), pr.slot_ids.cpu()) and dev.resident() == ref.resident()
        assert dev._last_used_d.cpu().tolist() == ref._last_used
    assert int(dev._step_d.item()) == moe._MAX_STEP and max(ref._last_used) == moe._MAX_STEP - 1
    res0, lu0, step0, st0 = dev.resident(), dev._last_used_d.clone(), int(dev._step_d.item()), dev.stats
    with pytest.raises(OverflowError):
        dev.prepare(torch.tensor([[2, 10]], device=device))
    assert (res0, step0, st0) == (dev.resident(), int(dev._step_d.item()), dev.stats)
    assert torch.equal(lu0, dev._last_used_d)
    big = torch.tensor([[11, 12], [13, 14], [15, 0]])             # 6 ids > stage_slots: the host path
    pd, pr = dev.prepare(big.to(device)), ref.prepare(big)
    assert not pd.device and dev.resident() == ref.resident()


@pytest.mark.gpu
def test_cache_device_path_does_not_sync(mode, device, gen):
    """On CUDA the device path issues no synchronising torch call (sync debug mode 'error' raises on one)."""
    if mode != "gpu":
        pytest.skip("CUDA only")
    E, k = 64, 8
    cache = ExpertCache([torch.randn(E, 1024, generator=gen)], n_slots=16, max_tokens=16, top_k=k,
                        device="cuda", stage_slots=E)
    assert cache.device_plan
    steps = [torch.randint(0, E, (T, k), generator=gen).cuda() for T in (1, 2, 16, 1, 5)]
    cache.prepare(steps[0])  # compiles the plan kernel
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        for ids in steps:
            cache.prepare(ids)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert cache.stats.steps == 1 + len(steps)


@pytest.mark.gpu
def test_cache_device_path_in_a_cuda_graph(mode, device, gen):
    """prepare() captured once in a CUDA graph on a static ids buffer, then replayed for a routing trace (new ids
    copied into the buffer before each replay): after every replay the same slot ids, resident set and counters
    as the host path fed the same steps eagerly, and the slots hold the host bytes."""
    if mode != "gpu":
        pytest.skip("CUDA only")
    E, k, T, n_slots = 64, 8, 4, 16
    host = torch.randn(E, 2048, generator=gen)
    kw = dict(n_slots=n_slots, max_tokens=T, top_k=k, device="cuda", insert_thresh=0.99, stage_slots=E)
    dev = ExpertCache([host], device_plan=True, **kw)
    ref = ExpertCache(dev.host, device_plan=False, **kw)
    steps = trace(gen, 41, E, k, T)
    steps = [torch.cat([s, s[:1].expand(T - s.shape[0], k)]) for s in steps]  # every step T tokens (a graph's T)
    buf = steps[0].cuda()
    pd, pr = dev.prepare(buf), ref.prepare(buf)  # eager warm-up step (compiles)
    torch.cuda.synchronize()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=s):
        pd = dev.prepare(buf)                   # the captured step: not run now
    torch.cuda.synchronize()
    assert dev.stats == ref.stats
    for i, ids in enumerate(steps[1:]):
        buf.copy_(ids)
        graph.replay()
        pr = ref.prepare(buf)
        assert torch.equal(pd.slot_ids, pr.slot_ids), i
        assert dev.resident() == ref.resident(), i
        assert torch.equal(dev.weights[0][pd.slot_ids.reshape(-1).long()].cpu(), host[ids.reshape(-1)]), i
    st = dev.stats
    assert st == ref.stats and st.steps == len(steps) and st.inserts > 0 and st.hits > 0

"""Unit gates for kernels/moe.py: the expert cache under a random routing trace whose batch shape changes every
step, and the fused top-k weighted sum with the sigmoid-gated shared expert.

The cache must be bit-identical to reading every expert from the host backing store (the same compute on the
same token chunks, weights gathered by slot vs by expert id), keep its counters consistent, and own one buffer
set per layer: after warm-up the set of device tensors (count, bytes, data pointers) never changes, and on CUDA
the allocated memory returns to the same level after every step.

moe_topk_sum: the interpreter runs the reference's fp32 operations in the same order (bit-identical to
moe_topk_sum_ref in fp32; bf16 output: the same rounding); against float64, fp32 accumulation of k + 1 terms
bounds the error at ~(k + 1) 2^-24 relative (1e-6), plus the output rounding: 2^-9 per element for bf16.
With a gate the exp of numpy (interpreter) and torch may differ by an ulp;
on the GPU the compiler may fuse multiply-adds and exp differs by an ulp, so the bound, not identity, is checked.
"""
from __future__ import annotations

import pytest
import torch

import kernels.moe.cache as moe
from kernels.moe import ExpertCache, moe_topk_sum, moe_topk_sum_ref


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


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("shared", ["gated", "none"])
def test_topk_sum(mode, device, gen, dtype, shared):
    shapes = [(5, 4, 48), (1, 1, 16), (0, 2, 8)] if mode == "interp" else [(4096, 8, 2048), (3, 10, 7168)]
    for T, k, H in shapes:
        y = torch.randn(T, k, H, generator=gen).to(device=device, dtype=dtype)
        w = torch.rand(T, k, generator=gen).to(device)
        sh = torch.randn(T, H, generator=gen).to(device=device, dtype=dtype) if shared == "gated" else None
        g = torch.randn(T, 1, generator=gen).to(device) * 3 if shared == "gated" else None
        out = torch.full((T, H), float("nan"), device=device, dtype=dtype)
        moe_topk_sum(y, w, sh, g, out=out)
        if T == 0:
            continue
        assert not torch.isnan(out).any()
        ref64 = moe_topk_sum_ref(y.double(), w.double(), None if sh is None else sh.double(),
                                 None if g is None else g.double().view(-1), torch.float64)
        e = ((out.double() - ref64).norm() / ref64.norm()).item()
        assert e < (1e-6 if dtype == torch.float32 else 4e-3), e
        if mode == "interp" and g is None:  # with a gate, numpy's and torch's fp32 exp may differ by an ulp
            assert torch.equal(out, moe_topk_sum_ref(y, w, sh, None if g is None else g.view(-1)))

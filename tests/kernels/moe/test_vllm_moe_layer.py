"""r9k's expert cache inside vLLM's Triton fused-MoE layer (r9k/ops/moe.py, the "triton" binding): vLLM's own
``FusedMoEKernel`` over ``TritonExperts`` (tests/kernels/moe/vllm_moe_case.py), stock (every expert resident)
against the same layer taken by the cache at several slot counts, fed the same steps of routing drawn like the
seeds' traffic: the outputs are bit-identical (torch.equal) at every step, in bf16 and in block fp8 (w8a8,
128x128; MXFP4 is not served by TritonExperts on Hopper: vLLM runs it through its gpt-oss Triton kernels or
Marlin, which the cache passes through).

Both ways of reading a step's misses (R9K_MOE_CACHE_READ): ``through`` (r9k's pointer-table GEMM reads them from
pinned host memory: no staging slots, every step planned on the device at any miss count) and ``stage`` (copied
into staging slots first).

On a GPU (marker ``gpu``): E = 512, top-k 10, 32 tokens a step (8 requests x 4), hidden 1024, intermediate 256
(1.5 MiB an expert in bf16); read-through at 270, 135 and 64 slots (at 64 a step misses ~90 experts, more than
fn-tp2's 64 staging slots took), the layer's device memory measured with the allocator around the cache's set-up
(at most 0.56 / 0.3 of all experts resident at 270 / 135 slots), and a CUDA graph of the read-through step replayed
on new routing; staging at 64 slots with 40 staging slots (steps whose misses exceed them plan on the host and run
in chunks). On the CPU under TRITON_INTERPRET=1: the same
code paths at E = 16, top-k 4, hidden 128, intermediate 128 (fp16 for the 16-bit format: see vllm_moe_case).
vLLM's compiled ops that path calls are stood in by torch (vllm_moe_stand_ins.py), for stock and cache alike.
"""
from __future__ import annotations

import gc
import os

import pytest
import torch

from kernels.moe import allocator_bytes, device_bytes
from tests.kernels.moe import vllm_moe_case as case

INTERP = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")
ON_GPU = torch.cuda.is_available() and not INTERP
PROBLEM = case.setup()

GPU = dict(E=512, k=10, H=1024, I=256, requests=8, steps=6,
           slots=[(270, -1, "through"), (135, -1, "through"), (64, -1, "through"), (64, 40, "stage")])
CPU = dict(E=16, k=4, H=128, I=128, requests=2, steps=3,
           slots=[(8, -1, "through"), (4, -1, "through"), (8, -1, "stage"), (4, 4, "stage")])
MEMORY_BOUND = {270: 0.56, 135: 0.3}  # read-through device memory over all experts resident (E = 512)
SIZE = GPU if ON_GPU else CPU
pytestmark = [pytest.mark.skipif(PROBLEM is not None, reason=str(PROBLEM))] + ([pytest.mark.gpu] if ON_GPU else [])


@pytest.fixture
def moe_state(monkeypatch):
    """r9k's MoE dispatch state, cleared before and after (layers, pass-through reasons)."""
    from r9k.ops import moe

    def clear():
        moe.uninstall()
        moe.STATE.layers.clear()
        moe.STATE.passed.clear()

    clear()
    monkeypatch.setenv("R9K_MOE_CACHE_STATS", "0")
    yield moe
    clear()


def _install(moe, monkeypatch, slots: int, staging: int, read: str = "auto"):
    import importlib

    tm = importlib.import_module(case.TRITON_MODULE)
    monkeypatch.setenv("R9K_MOE_CACHE_SLOTS", str(slots))
    monkeypatch.setenv("R9K_MOE_CACHE_STAGING", str(staging))
    monkeypatch.setenv("R9K_MOE_CACHE_READ", read)
    return moe.install(experts_cls=tm.TritonExperts, backend="triton", triton_module=tm)


@pytest.mark.parametrize("fmt", ["bf16", "fp8"])
@pytest.mark.parametrize("slots,staging,read", SIZE["slots"],
                         ids=[f"slots{s}-stage{g}-{r}" for s, g, r in SIZE["slots"]])
def test_cache_is_bit_identical_to_stock(moe_state, monkeypatch, fmt, slots, staging, read):
    """Stock against the cache over the same steps: torch.equal at every step; the stock layer near the fp32
    reference (it computes the MoE at all); the cache's counters show hits and misses; read-through layers have
    no staging slots, plan every step on the device and (GPU) take at most MEMORY_BOUND of all-resident device
    memory, measured by the allocator."""
    moe = moe_state
    E, k, H, I = SIZE["E"], SIZE["k"], SIZE["H"], SIZE["I"]
    device = "cuda" if ON_GPU else "cpu"
    act = torch.bfloat16 if ON_GPU else torch.float16
    gen = torch.Generator().manual_seed(26)
    weights = case.make_weights(E, H, I, fmt, gen, dtype=act)
    stock = case.make_layer(weights, k, device, act)
    _install(moe, monkeypatch, slots, staging, read)
    if ON_GPU:
        gc.collect()  # earlier tests' caches (held by reference cycles) freed before the count, not inside it
        torch.cuda.synchronize()
        m0 = torch.cuda.memory_allocated()
    taken = case.make_layer(weights, k, device, act)
    if ON_GPU:
        resident = torch.cuda.memory_allocated() - m0
    holder = torch.nn.Module()
    holder.experts = taken
    assert moe.take_model(holder) == 1, moe.STATE.passed
    entry = moe.STATE.layers[0]
    cache = entry.cache
    assert cache.read == read
    ptr_calls = _count_ptr_gemm(monkeypatch)
    # the cache's buffers are its formula's bytes, from the shapes alone (slots of w13, w2 and in fp8 their block
    # scales, tables, plan state); the experts all resident, the same per expert
    tb = case.expert_bytes(H, I, fmt, act)
    assert cache.buffer_bytes() == device_bytes(E, slots, tb, cache.max_tokens, k, read=read, device_plan=True,
                                                stage_slots=cache.stage_slots if read == "stage" else None)
    assert entry.resident_bytes == E * sum(tb)
    if not ON_GPU:
        assert entry.device_bytes == cache.buffer_bytes()
    if ON_GPU:
        torch.cuda.synchronize()
        used = torch.cuda.memory_allocated() - m0
        # vLLM's resident tensors are freed (allocated and freed inside the count): the layer holds the cache's
        # buffers and nothing else, the blocks the allocator gave them, which are their bytes rounded up to 512 B
        # and, above 1 MiB, up to 1 MiB more (kernels.moe.allocator_bytes); the stats line's figure the same
        blocks = case.allocator_blocks(cache.buffers())
        lo, hi = allocator_bytes([t.numel() * t.element_size() for t in cache.buffers()])
        assert used == blocks == entry.device_bytes, (used, blocks, entry.device_bytes, cache.buffer_bytes())
        assert lo <= blocks <= hi, (blocks, lo, hi, cache.buffer_bytes())
        if read == "through" and slots in MEMORY_BOUND:
            assert used / resident <= MEMORY_BOUND[slots], (used, resident)
        print(f"device memory: {used} B of {resident} B all-resident ({used / resident:.3f}), {slots} slots, {read}")
    if read == "through":
        assert cache.stage_slots == 0 and cache.device_plan
    assert taken.w13_weight.data_ptr() == cache.weights[0].data_ptr()
    assert taken.w13_weight.shape[0] == cache.n_slots + cache.stage_slots
    if fmt == "fp8":
        qc = taken.quant_method.moe_kernel.fused_experts.quant_config
        assert qc.w1_scale.data_ptr() == cache.weights[2].data_ptr() == taken.w13_weight_scale_inv.data_ptr()
        assert qc.w2_scale.data_ptr() == cache.weights[3].data_ptr()
    traffic = case.SeedTraffic(E=E, k=k, requests=SIZE["requests"], seed=7)
    for step in range(SIZE["steps"]):
        ids, w = traffic.step()
        x = (torch.randn(ids.shape[0], H, generator=gen)).to(device=device, dtype=act)
        ids_d, w_d = ids.to(device), w.to(device)
        want = case.forward(stock, x, w_d, ids_d)
        got = case.forward(taken, x, w_d, ids_d)
        assert torch.equal(got, want), (step, (got.float() - want.float()).abs().max().item())
        if step == 0:
            ref = case.reference(weights, x, w, ids)
            err = ((want.float().cpu() - ref).norm() / ref.norm()).item()
            assert err < (0.05 if fmt == "bf16" else 0.15), err  # the stock layer computes the MoE at all
    st = cache.stats
    assert st.steps == SIZE["steps"] and st.misses > 0 and st.hits > 0
    assert len(ptr_calls) == (2 * SIZE["steps"] if read == "through" else 0)  # both GEMMs a step, through the tables
    if read == "through":  # a step over the insert threshold reads its misses through, any other inserts them
        assert cache.path_steps["host"] == 0
        assert (st.read_through > 0) == (st.steps_over_thresh > 0) and st.inserts + st.read_through == st.misses
        if slots < 270:  # the seeds' traffic passes 0.99 x 135 and x 64 distinct experts (at 270 it stays under)
            assert st.read_through > 0, st
    elif staging != -1:
        assert st.chunks > st.steps  # misses beyond the staging slots: steps served in chunks
    else:
        assert cache.path_steps["host"] == 0  # filled slots + staging E - slots: every step on the device
    moe.uninstall()


def _count_ptr_gemm(monkeypatch) -> list:
    """Calls of r9k's pointer-table GEMM from here on (the dispatch imports it from kernels.moe at each launch)."""
    import kernels.moe

    calls, orig = [], kernels.moe.invoke_ptr_moe

    def spy(*args, **kwargs):
        calls.append(1)
        return orig(*args, **kwargs)

    monkeypatch.setattr(kernels.moe, "invoke_ptr_moe", spy)
    return calls


@pytest.mark.skipif(not ON_GPU, reason="CUDA graphs need a GPU")
@pytest.mark.parametrize("fmt", ["bf16", "fp8"])
def test_read_through_step_replays_from_a_cuda_graph(moe_state, monkeypatch, fmt):
    """The layer on the cache at 64 read-through slots of 512 (~90 misses a step, more than fn-tp2's 64 staging
    slots held), one step captured in a CUDA graph on static inputs and replayed on new routing: every replay
    equals the stock layer's eager step bit for bit, and the cache counted the replays' steps on the device."""
    moe = moe_state
    E, k, H, I = SIZE["E"], SIZE["k"], SIZE["H"], SIZE["I"]
    gen = torch.Generator().manual_seed(27)
    weights = case.make_weights(E, H, I, fmt, gen, dtype=torch.bfloat16)
    stock = case.make_layer(weights, k, "cuda")
    taken = case.make_layer(weights, k, "cuda")
    _install(moe, monkeypatch, 64, -1, "through")
    holder = torch.nn.Module()
    holder.experts = taken
    assert moe.take_model(holder) == 1, moe.STATE.passed
    cache = moe.STATE.layers[0].cache
    traffic = case.SeedTraffic(E=E, k=k, requests=SIZE["requests"], seed=8)
    steps = [traffic.step() for _ in range(6)]
    T = steps[0][0].shape[0]
    x_s = torch.empty(T, H, dtype=torch.bfloat16, device="cuda")
    w_s = torch.empty(T, k, dtype=torch.float32, device="cuda")
    ids_s = torch.empty(T, k, dtype=torch.int32, device="cuda")

    def load(i):
        ids, w = steps[i]
        ids_s.copy_(ids)
        w_s.copy_(w)
        x_s.copy_(torch.randn(T, H, generator=gen).to(torch.bfloat16))

    load(0)
    out = case.forward(taken, x_s, w_s, ids_s)  # eager: compiles, builds the views and vLLM's workspaces
    assert torch.equal(out, case.forward(stock, x_s, w_s, ids_s))
    torch.cuda.synchronize()
    s0 = cache.stats.steps
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out_g = case.forward(taken, x_s, w_s, ids_s)
    for i in range(1, len(steps)):
        load(i)
        g.replay()
        want = case.forward(stock, x_s, w_s, ids_s)
        assert torch.equal(out_g, want), (i, (out_g.float() - want.float()).abs().max().item())
    st = cache.stats
    assert st.steps - s0 == len(steps) - 1 and cache.path_steps["host"] == 0
    assert st.misses / st.steps > 64 and st.read_through > 0


def test_signatures_come_from_vllms_module():
    """The binding's functions are vLLM's: TritonExperts.apply has every parameter the dispatch reads, and the
    two module functions it wraps have the leading parameters it passes."""
    import importlib

    from r9k.ops import moe

    tm = importlib.import_module(case.TRITON_MODULE)
    sig = moe.signature(tm.TritonExperts)
    for n in moe.APPLY_PARAMS:
        assert n in sig.parameters
    assert set(moe.triton_signatures(tm)) == set(moe.TRITON_FUNCS)
    assert moe.triton_gemm_signature(tm) is not None  # the GEMM launcher a read-through step replaces

"""r9k's expert cache inside vLLM's Triton fused-MoE layer (r9k/ops/moe.py, the "triton" binding): vLLM's own
``FusedMoEKernel`` over ``TritonExperts`` (tests/kernels/moe/vllm_moe_case.py), stock (every expert resident)
against the same layer taken by the cache at several slot counts, fed the same steps of routing drawn like the
seeds' traffic: the outputs are bit-identical (torch.equal) at every step, in bf16 and in block fp8 (w8a8,
128x128; MXFP4 is not served by TritonExperts on Hopper: vLLM runs it through its gpt-oss Triton kernels or
Marlin, which the cache passes through).

On a GPU (marker ``gpu``): E = 512, top-k 10, 32 tokens a step (8 requests x 4), hidden 1024, intermediate 256,
slots 270 and 135 (default staging: every step plans on the device) and 64 with 40 staging slots (steps whose
misses exceed them plan on the host and run in chunks). On the CPU under TRITON_INTERPRET=1: the same code path at
E = 16, top-k 4, hidden 128, intermediate 128 (fp16 for the 16-bit format: see vllm_moe_case). vLLM's compiled
ops that path calls are stood in by torch (vllm_moe_stand_ins.py), for stock and cache alike.
"""
from __future__ import annotations

import os

import pytest
import torch

from tests.kernels.moe import vllm_moe_case as case

INTERP = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")
ON_GPU = torch.cuda.is_available() and not INTERP
PROBLEM = case.setup()

GPU = dict(E=512, k=10, H=1024, I=256, requests=8, steps=6, slots=[(270, -1), (135, -1), (64, 40)])
CPU = dict(E=16, k=4, H=128, I=128, requests=2, steps=3, slots=[(8, -1), (4, 4)])
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


def _install(moe, monkeypatch, slots: int, staging: int):
    import importlib

    tm = importlib.import_module(case.TRITON_MODULE)
    monkeypatch.setenv("R9K_MOE_CACHE_SLOTS", str(slots))
    monkeypatch.setenv("R9K_MOE_CACHE_STAGING", str(staging))
    return moe.install(experts_cls=tm.TritonExperts, backend="triton", triton_module=tm)


@pytest.mark.parametrize("fmt", ["bf16", "fp8"])
@pytest.mark.parametrize("slots,staging", SIZE["slots"], ids=[f"slots{s}-stage{g}" for s, g in SIZE["slots"]])
def test_cache_is_bit_identical_to_stock(moe_state, monkeypatch, fmt, slots, staging):
    """Stock against the cache over the same steps: torch.equal at every step; the stock layer near the fp32
    reference (it computes the MoE at all); the cache's counters show hits and misses."""
    moe = moe_state
    E, k, H, I = SIZE["E"], SIZE["k"], SIZE["H"], SIZE["I"]
    device = "cuda" if ON_GPU else "cpu"
    act = torch.bfloat16 if ON_GPU else torch.float16
    gen = torch.Generator().manual_seed(26)
    weights = case.make_weights(E, H, I, fmt, gen, dtype=act)
    stock = case.make_layer(weights, k, device, act)
    taken = case.make_layer(weights, k, device, act)
    _install(moe, monkeypatch, slots, staging)
    holder = torch.nn.Module()
    holder.experts = taken
    assert moe.take_model(holder) == 1, moe.STATE.passed
    entry = moe.STATE.layers[0]
    cache = entry.cache
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
    if staging != -1:
        assert st.chunks > st.steps  # misses beyond the staging slots: steps served in chunks
    else:
        assert cache.path_steps["host"] == 0  # filled slots + staging E - slots: every step on the device
    moe.uninstall()


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

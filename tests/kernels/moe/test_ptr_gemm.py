"""The pointer-table MoE GEMM (kernels/moe/ptr_gemm.py) against vLLM's own ``fused_moe_kernel``
(``invoke_fused_moe_triton_kernel``) on all-resident weights: torch.equal, for both GEMMs of a layer (w13 without,
w2 with the routed weights), the experts read through an ExpertCache's tables (``read="through"``) after steps
whose misses are read from the host store (no staging slots: every miss count), in 16-bit and block fp8 (w8a8,
128x128), vLLM's aligned and naive block assignments, and (fp8) its SWAP_AB layout.

On the CPU under TRITON_INTERPRET=1 (fp16: the interpreter gets bf16 wrong in vLLM's kernel, see
vllm_moe_case) at E = 16, top-4; on a GPU (marker ``gpu``) at E = 512, top-10, hidden 2048, intermediate 128
(bf16), with the host store pinned and read over the bus, and a CUDA graph of a step (plan, copies, both GEMMs)
replayed on new routing with misses above any staging room.
"""
from __future__ import annotations

import importlib
import os

import pytest
import torch

from tests.kernels.moe import vllm_moe_case as case

INTERP = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")
ON_GPU = torch.cuda.is_available() and not INTERP
PROBLEM = case.setup()
GPU = dict(E=512, k=10, H=2048, I=128, slots=135, tokens=(1, 4, 32), steps=2)
CPU = dict(E=16, k=4, H=256, I=128, slots=6, tokens=(1, 3), steps=2)
SIZE = GPU if ON_GPU else CPU
DEVICE = "cuda" if ON_GPU else "cpu"
ACT = torch.bfloat16 if ON_GPU else torch.float16
pytestmark = [pytest.mark.skipif(PROBLEM is not None, reason=str(PROBLEM)), pytest.mark.timeout(600)] + (
    [pytest.mark.gpu] if ON_GPU else [])


def _fm():
    return importlib.import_module("vllm.model_executor.layers.fused_moe.fused_moe")


def _gemm_pair(fm, A, A_scale, w_all, s_all, cache, idx, topk_ids, topk_weights, mul, top_k, config, fp8):
    """(vLLM's kernel on the all-resident tensors, the pointer-table kernel on the cache's table idx) -> C."""
    from kernels.moe import invoke_ptr_moe

    M = A.shape[0]
    E = w_all.shape[0]
    N = w_all.shape[1]
    cdt = torch.bfloat16 if fp8 else A.dtype  # vLLM's apply computes fp8 layers in bf16
    ctype = _tl(cdt)
    sorted_ids, expert_ids, ntp = fm._prepare_expert_assignment(topk_ids, config, M, top_k, E, None)
    want = torch.empty(M, top_k, N, dtype=cdt, device=DEVICE)
    got = torch.full_like(want, float("nan"))
    block = case.FP8_BLOCK if fp8 else None
    fm.invoke_fused_moe_triton_kernel(A, w_all, want, A_scale, s_all, topk_weights, sorted_ids, expert_ids, ntp,
                                      mul, top_k, config, compute_type=ctype, use_fp8_w8a8=fp8,
                                      use_int8_w8a8=False, use_int8_w8a16=False, use_int4_w4a16=False,
                                      per_channel_quant=False, block_shape=block)
    swap = bool(fm.enable_swap_ab(config["BLOCK_SIZE_M"], config["BLOCK_SIZE_N"])) if fp8 else False
    invoke_ptr_moe(A, cache.weights[idx], cache.table(idx), got, A_scale, cache.weights[idx + 2] if fp8 else None,
                   cache.table(idx + 2) if fp8 else None, topk_weights, sorted_ids, expert_ids, ntp, mul, top_k,
                   config, ctype, fp8, block, swap, aligned16=cache.aligned16)
    return want, got, sorted_ids is None


def _tl(dtype):
    import triton.language as tl

    return {torch.bfloat16: tl.bfloat16, torch.float16: tl.float16, torch.float32: tl.float32}[dtype]


def _quant_rows(x: torch.Tensor):
    """x [M, K] -> fp8 e4m3 with one fp32 scale per 128-wide group [M, K / 128] (the activations' block quant)."""
    M, K = x.shape
    g = x.float().view(M, K // 128, 128)
    s = g.abs().amax(-1).clamp_min(1e-10) / torch.finfo(torch.float8_e4m3fn).max
    return (g / s[..., None]).to(torch.float8_e4m3fn).view(M, K), s.contiguous()


@pytest.mark.parametrize("swap", [False, True], ids=["noswap", "swap"])
@pytest.mark.parametrize("fmt", ["bf16", "fp8"])
@pytest.mark.parametrize("thresh", [0.0, 0.99], ids=["all-read-through", "inserts"])
def test_ptr_gemm_bit_identical_to_vllm(monkeypatch, fmt, thresh, swap):
    """Both GEMMs of a layer: the pointer-table kernel over the cache's tables equals vLLM's kernel on all experts
    resident, bit for bit, step after step; the steps read experts from the host store (more than the slots
    leave room for: no staging), and with the threshold at 0.99 also insert some."""
    from kernels.moe import ExpertCache

    fm = _fm()
    if swap and fmt != "fp8":
        pytest.skip("SWAP_AB is vLLM's fp8 layout only")
    if swap:
        monkeypatch.setattr(fm, "enable_swap_ab", lambda m, n: True)
    E, k, H, I = SIZE["E"], SIZE["k"], SIZE["H"], SIZE["I"]
    gen = torch.Generator().manual_seed(3)
    w = case.make_weights(E, H, I, fmt, gen, dtype=ACT)
    fp8 = fmt == "fp8"
    names = ["w13", "w2"] + (["s13", "s2"] if fp8 else [])
    res = {n: w[n].to(DEVICE) for n in names}
    cache = ExpertCache([w[n] for n in names], SIZE["slots"], max(SIZE["tokens"]), k, device=DEVICE,
                        insert_thresh=thresh, read="through", pin=ON_GPU)
    assert cache.device_plan and cache.stage_slots == 0
    assert cache.aligned16 == (not fp8 or ON_GPU)  # CPU fp8: w2's scales are 8 B an expert
    cache.fill()
    traffic = {T: case.SeedTraffic(E=E, k=k, requests=T, tokens_per_request=1, seed=5 + T) for T in SIZE["tokens"]}
    read_host, naive_seen = 0, set()
    for step in range(SIZE["steps"]):
        for T in SIZE["tokens"]:
            ids, tw = traffic[T].step()
            ids, tw = ids.to(DEVICE), tw.to(DEVICE)
            before = cache.stats.read_through
            cache.prepare(ids)
            read_host += cache.stats.read_through - before
            x = torch.randn(T, H, generator=gen).to(DEVICE, ACT)
            dtype = "fp8_w8a8" if fp8 else None
            config = fm.try_get_optimal_moe_config(res["w13"].shape, res["w2"].shape, k, dtype, T,
                                                   block_shape=case.FP8_BLOCK if fp8 else None)
            A, As = _quant_rows(x) if fp8 else (x, None)
            want1, got1, naive = _gemm_pair(fm, A, As, res["w13"], res.get("s13"), cache, 0, ids, None, False, k,
                                            config, fp8)
            naive_seen.add(naive)
            assert torch.equal(got1, want1), (step, T, "w13", (got1.float() - want1.float()).abs().max().item())
            h = torch.randn(T * k, I, generator=gen).to(DEVICE, ACT)
            A2, As2 = _quant_rows(h) if fp8 else (h, None)
            want2, got2, _ = _gemm_pair(fm, A2, As2, res["w2"], res.get("s2"), cache, 1, ids, tw, True, 1, config,
                                        fp8)
            assert torch.equal(got2, want2), (step, T, "w2", (got2.float() - want2.float()).abs().max().item())
            assert want1.abs().sum() > 0 and want2.abs().sum() > 0
    assert read_host > 0 and naive_seen == {True, False}  # vLLM's naive and aligned block assignments
    st = cache.stats
    assert (st.inserts > 0) == (thresh > 0) and st.misses > 0


@pytest.mark.skipif(not ON_GPU, reason="CUDA graphs need a GPU")
def test_ptr_gemm_step_replays_from_a_cuda_graph():
    """A step (prepare: the plan, the inserts' copies, the tables; then both GEMMs on the tables) captured once at
    32 tokens and replayed on new routing, 64 slots of 512 (more misses a step than 64 staging slots could take):
    every replay equals vLLM's kernels on all experts resident, and the host path (device_plan=False) on the
    same routing agrees on the counters."""
    from kernels.moe import ExpertCache, invoke_ptr_moe

    fm = _fm()
    E, k, H, I, T = SIZE["E"], SIZE["k"], SIZE["H"], SIZE["I"], 32
    gen = torch.Generator().manual_seed(4)
    w = case.make_weights(E, H, I, "bf16", gen, dtype=ACT)
    res = {n: w[n].cuda() for n in ("w13", "w2")}
    cache = ExpertCache([w["w13"], w["w2"]], 64, T, k, device="cuda", read="through")
    ref = ExpertCache([w["w13"], w["w2"]], 64, T, k, device="cuda", read="through", device_plan=False)
    cache.fill()
    ref.fill()
    traffic = case.SeedTraffic(E=E, k=k, requests=8, seed=9)
    steps = [traffic.step() for _ in range(6)]
    ids_s = torch.empty(T, k, dtype=torch.int32, device="cuda")
    x_s = torch.empty(T, H, dtype=ACT, device="cuda")
    tw_s = torch.empty(T, k, dtype=torch.float32, device="cuda")
    config = fm.try_get_optimal_moe_config(res["w13"].shape, res["w2"].shape, k, None, T)
    out1 = torch.empty(T, k, 2 * I, dtype=ACT, device="cuda")
    h_s = torch.empty(T * k, I, dtype=ACT, device="cuda")
    out2 = torch.empty(T, k, H, dtype=ACT, device="cuda")

    def step():
        cache.prepare(ids_s)
        sid, eid, ntp = fm._prepare_expert_assignment(ids_s, config, T, k, E, None)
        invoke_ptr_moe(x_s, cache.weights[0], cache.table(0), out1, None, None, None, None, sid, eid, ntp, False,
                       k, config, _tl(ACT), False, None, False, aligned16=cache.aligned16)
        invoke_ptr_moe(h_s, cache.weights[1], cache.table(1), out2, None, None, None, tw_s, sid, eid, ntp, True,
                       1, config, _tl(ACT), False, None, False, aligned16=cache.aligned16)

    def load(i):
        ids, tw = steps[i]
        ids_s.copy_(ids)
        tw_s.copy_(tw)
        x_s.copy_(torch.randn(T, H, generator=gen).to(ACT))
        h_s.copy_(torch.randn(T * k, I, generator=gen).to(ACT))
        ref.prepare(ids_s)

    load(0)
    step()  # eager: compiles, builds the views
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        step()
    for i in range(1, len(steps)):
        load(i)
        g.replay()
        want1, _, _ = _gemm_pair(fm, x_s, None, res["w13"], None, cache, 0, ids_s, None, False, k, config, False)
        want2, _, _ = _gemm_pair(fm, h_s, None, res["w2"], None, cache, 1, ids_s, tw_s, True, 1, config, False)
        torch.cuda.synchronize()
        # the down GEMM's rows are (token, k) pairs: the step writes them as [T, k, H], the pair as [T * k, 1, H]
        assert torch.equal(out1, want1) and torch.equal(out2.view_as(want2), want2), i
    st, sr = cache.stats, ref.stats
    assert (st.hits, st.misses, st.inserts, st.read_through) == (sr.hits, sr.misses, sr.inserts, sr.read_through)
    assert st.misses / st.steps > 64 and st.read_through > 0 and cache.path_steps["host"] == 0

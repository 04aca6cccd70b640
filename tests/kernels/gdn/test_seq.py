"""gdn_seq (kernels/gdn/seq.py) against its float64 reference: every kernel variant (the [BV, K] kernel, the
lookahead, the [KC, BV, K/KC] kernel's plain step and scaled state, the chunked kernel) in fp32 and bf16, varlen
batches with pad slots and sequences without an initial state, one call against token-by-token calls, a fault
in one sequence kept out of the others, the GPU's default tile, and the cached launch path against Triton's JIT.

Every test draws fresh random inputs (the seed is printed) or seeded ones, poisons the outputs with NaN before
the run where it checks that every element was written, and never runs on zeros.
"""
from __future__ import annotations

import os

import pytest
import torch

import kernels.gdn.seq as G
from kernels._util import pow2
from kernels.gdn import gdn_seq, gdn_seq_ref
from tests.kernels.cases import gdn_fixed_inputs, gdn_gen_inputs, rel


BOUND = {torch.float32: 1e-5, torch.bfloat16: 3e-3}


def seq_shapes(mode: str) -> list[dict]:
    """(H, HV, K, V, lengths) cases: odd head counts, non-power-of-2 dims and odd lengths, empty sequences."""
    if mode == "interp":
        return [
            dict(H=1, HV=1, K=16, V=16, lens=[7]),
            dict(H=2, HV=6, K=16, V=32, lens=[5, 1, 9, 0, 3]),
            dict(H=3, HV=3, K=20, V=24, lens=[4, 11]),
        ]
    return [
        dict(H=16, HV=32, K=128, V=128, lens=[256]),
        dict(H=16, HV=32, K=128, V=128, lens=[1, 45, 3, 128, 0, 17, 2]),
        dict(H=5, HV=15, K=128, V=128, lens=[33, 1, 77]),
        dict(H=3, HV=9, K=96, V=80, lens=[19, 5]),
    ]


def randn(gen, shape, device, dtype=torch.float32, scale=1.0):
    return (torch.randn(shape, generator=gen, dtype=torch.float64) * scale).to(device=device, dtype=dtype)


def rand(gen, shape, device, dtype=torch.float32):
    return torch.rand(shape, generator=gen, dtype=torch.float64).to(device=device, dtype=dtype)


def make_seq_inputs(gen, device, c, dtype, state_dtype=torch.float32, l2norm_in_kernel=True, slots=None):
    H, HV, K, V, lens = c["H"], c["HV"], c["K"], c["V"], c["lens"]
    T = sum(lens)
    N = len(lens)
    q = randn(gen, (1, T, H, K), device)
    k = randn(gen, (1, T, H, K), device)
    if not l2norm_in_kernel:  # keep the delta rule contracting: unit keys
        k = k / k.norm(dim=-1, keepdim=True)
        q = q / q.norm(dim=-1, keepdim=True)
    v = randn(gen, (1, T, HV, V), device)
    g = -(rand(gen, (1, T, HV), device) * 0.5 + 0.01)  # log decay in (-0.51, -0.01)
    beta = rand(gen, (1, T, HV), device) * 0.98 + 0.01
    n_slots = slots or N + 3
    state = randn(gen, (n_slots, HV, V, K), device, scale=0.5).to(state_dtype)
    perm = torch.randperm(n_slots, generator=gen)[:N]
    idx = perm.to(device=device, dtype=torch.int32)
    cu = torch.tensor([0] + torch.tensor(lens).cumsum(0).tolist(), dtype=torch.int32, device=device)
    q, k, v = (x.to(dtype) for x in (q, k, v))
    return q, k, v, g.to(dtype), beta.to(dtype), state, idx, cu


# the kernel variants of gdn_seq: the [BV, K] state block, with the one-token lookahead, the [KC, BV, K/KC] block
# (on the scaled state with deferred decays, and with the plain step) and the [KC, BV, K/KC] block at the fastest configuration of the H200 sweep (BV=16, 4 warps, U=4); the chunked
# kernel (16 or 32 tokens a step as matrix products), with its inputs pipelined by Triton or prefetched in registers
LOOKAHEAD = pytest.mark.parametrize("variant", [dict(lookahead=False, KC=0), dict(lookahead=True, KC=0),
                                                dict(lookahead=False, KC=4),
                                                dict(lookahead=False, KC=4, defer_decay=False),
                                                dict(lookahead=False, KC=4, BV=16, num_warps=4, U=4),
                                                dict(chunk=16, BV=16, num_warps=8),
                                                dict(chunk=16, BV=16, num_warps=8, num_stages=0),
                                                dict(chunk=32, BV=32, num_warps=8)],
                                    ids=["serial", "lookahead", "kc4", "kc4_plain", "kc4_bv16_w4", "chunk16", "chunk16_regpf",
                                         "chunk32_bv32"])


@LOOKAHEAD
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("l2norm", [True, False], ids=["l2norm", "prenorm"])
def test_seq_matches_float64_reference(mode, device, gen, dtype, l2norm, variant):
    for c in seq_shapes(mode):
        q, k, v, g, beta, state, idx, cu = make_seq_inputs(gen, device, c, dtype, l2norm_in_kernel=l2norm)
        o_ref, s_ref = gdn_seq_ref(q, k, v, g, beta, state, idx, cu, use_qk_l2norm=l2norm)
        before = state.clone()
        out = torch.full_like(v, float("nan"))
        gdn_seq(q, k, v, g, beta, state, idx, cu_seqlens=cu, use_qk_l2norm=l2norm, out=out, **variant)
        assert torch.isfinite(out).all(), "an output element was not written"
        e_o, e_s = rel(out, o_ref), rel(state[idx.long()], s_ref[idx.long()])
        print(f"{c} {dtype} l2norm={l2norm}: rel err o {e_o:.2e} state {e_s:.2e}")
        assert e_o <= BOUND[dtype], (c, e_o)
        assert e_s <= 1e-5, (c, e_s)  # the state stays fp32 whatever the inputs
        others = torch.ones(state.shape[0], dtype=torch.bool)
        others[idx.long().cpu()] = False
        assert torch.equal(state[others.to(device)], before[others.to(device)]), "a slot not in state_idx changed"


def test_seq_bf16_state_and_fixed_length_batch(mode, device, gen):
    c = seq_shapes(mode)[1]
    H, HV, K, V = c["H"], c["HV"], c["K"], c["V"]
    B, T = 3, 9 if mode == "interp" else 64
    q = randn(gen, (B, T, H, K), device, torch.bfloat16)
    k = randn(gen, (B, T, H, K), device, torch.bfloat16)
    v = randn(gen, (B, T, HV, V), device, torch.bfloat16)
    g = -(rand(gen, (B, T, HV), device) * 0.3 + 0.01)
    beta = rand(gen, (B, T, HV), device)
    state = randn(gen, (B + 1, HV, V, K), device, torch.bfloat16, scale=0.5)
    idx = torch.tensor([2, 0, 3], dtype=torch.int32, device=device)
    o_ref, s_ref = gdn_seq_ref(q, k, v, g, beta, state, idx, use_qk_l2norm=True)
    out = torch.full_like(v, float("nan"))
    gdn_seq(q, k, v, g, beta, state, idx, use_qk_l2norm=True, out=out)
    assert torch.isfinite(out).all()
    e_o, e_s = rel(out, o_ref), rel(state[idx.long()], s_ref[idx.long()])
    print(f"bf16 state, B={B}: rel err o {e_o:.2e} state {e_s:.2e}")
    assert e_o <= 3e-3 and e_s <= 3e-3
    assert torch.equal(state[1], s_ref[1].to(torch.bfloat16))  # slot 1 untouched


@LOOKAHEAD
def test_seq_one_call_equals_token_by_token(mode, device, gen, variant):
    """One call over T tokens equals T calls of one token each, the state carried in the state tensor."""
    c = dict(seq_shapes(mode)[1])
    c["lens"] = [13] if mode == "interp" else [64]
    q, k, v, g, beta, state, idx, cu = make_seq_inputs(gen, device, c, torch.float32)
    s_one, s_many = state.clone(), state.clone()
    o_one = gdn_seq(q, k, v, g, beta, s_one, idx, cu_seqlens=cu, use_qk_l2norm=True, **variant)
    o_many = torch.full_like(v, float("nan"))
    for t in range(q.shape[1]):
        sl = slice(t, t + 1)
        o_many[:, sl] = gdn_seq(q[:, sl], k[:, sl], v[:, sl], g[:, sl], beta[:, sl], s_many, idx,
                                use_qk_l2norm=True, **variant)
    e_o, e_s = rel(o_many, o_one), rel(s_many, s_one)
    print(f"one call vs token by token: o {e_o:.2e} state {e_s:.2e}")
    assert e_o <= 1e-6 and e_s <= 1e-6


@LOOKAHEAD
def test_seq_null_slots_and_initial_state(mode, device, gen, variant):
    c = seq_shapes(mode)[1]
    q, k, v, g, beta, state, idx, cu = make_seq_inputs(gen, device, c, torch.float32)
    idx[1] = -1                                  # PAD_SLOT_ID: skipped
    has_init = torch.tensor([i % 2 == 0 for i in range(idx.numel())], device=device)
    before = state.clone()
    o_ref, s_ref = gdn_seq_ref(q, k, v, g, beta, state, idx, cu, use_qk_l2norm=True, has_initial_state=has_init)
    out = torch.full_like(v, float("nan"))
    # BV=8: several V-blocks per head also under the interpreter (whose default takes V whole)
    gdn_seq(q, k, v, g, beta, state, idx, cu_seqlens=cu, use_qk_l2norm=True, has_initial_state=has_init, out=out,
            **{"BV": 8, **variant})
    assert torch.isfinite(out).all()
    bos, eos = int(cu[1]), int(cu[2])
    assert (out[:, bos:eos] == 0).all(), "a skipped sequence's outputs must be zero"
    live = idx[idx >= 0].long()
    assert rel(out, o_ref) <= 1e-5 and rel(state[live], s_ref[live]) <= 1e-5
    untouched = torch.ones(state.shape[0], dtype=torch.bool, device=device)
    untouched[live] = False
    assert torch.equal(state[untouched], before[untouched])


VARIANT_CASES = [
    ("kc4_K12", dict(KC=4), dict(K=12)),
    ("kc16_K12", dict(KC=16), dict(K=12)),          # KC = padded K: one K element per chunk
    ("kc1", dict(KC=1), dict()),
    ("kc2_V3_BV8", dict(KC=2, BV=8), dict(V=3)),
    ("kc2_V5_BV4", dict(KC=2, BV=4), dict(V=5)),
    ("kc2_U3", dict(KC=2, U=3), dict(lens=(5, 7))),
    ("kc2_groups", dict(KC=2), dict(H=2, HV=4)),
    ("kc2_empty", dict(KC=2), dict(lens=(0, 0, 4))),
    ("la_K12", dict(lookahead=True), dict(K=12)),
    ("la_V5_BV4", dict(lookahead=True, BV=4), dict(V=5)),
    ("la_U1", dict(lookahead=True, U=1), dict(lens=(5,))),
    ("la_U3", dict(lookahead=True, U=3), dict(lens=(5, 1))),
    ("la_empty", dict(lookahead=True), dict(lens=(0, 4, 0))),
]


@pytest.mark.parametrize("name,kw,shape", VARIANT_CASES, ids=[c[0] for c in VARIANT_CASES])
def test_variant_edges_match_reference(mode, device, gen, name, kw, shape):
    q, k, v, g, b, state, idx, cu = gdn_gen_inputs(gen, device, **shape)
    idx_pad = idx.clone()
    has_init = torch.ones(len(idx), dtype=torch.bool, device=device)
    if len(idx) > 1:
        idx_pad[-1] = -1                      # a pad slot: untouched, zero outputs
        has_init[0] = False                   # a sequence (maybe empty) starting from zero
    o_ref, s_ref = gdn_seq_ref(q, k, v, g, b, state, idx_pad, cu, use_qk_l2norm=True, has_initial_state=has_init)
    st = state.clone()
    out = torch.full_like(v, float("nan"))
    gdn_seq(q, k, v, g, b, st, idx_pad, cu_seqlens=cu, use_qk_l2norm=True, has_initial_state=has_init, out=out,
            **kw)
    assert torch.isfinite(out).all(), "an output element was not written"
    assert (out.double() - o_ref).abs().max() < 1e-5
    assert (st.double() - s_ref).abs().max() < 1e-5


CHUNKS = pytest.mark.parametrize("chunk", [0, 16, 32], ids=["token", "chunk16", "chunk32"])


@CHUNKS
def test_non_finite_input_does_not_leak_into_other_sequences_or_slots(mode, device, chunk):
    """A NaN in one sequence's key: that sequence's later outputs and its own slot go NaN (as in the reference);
    every other sequence's outputs and every other slot are bit-identical to the clean run."""
    q, k, v, g, beta, st = gdn_fixed_inputs(seed=5, T=40, slots=5, device=device)
    cu = torch.tensor([0, 12, 30, 40], dtype=torch.int32, device=device)
    idx = torch.tensor([3, 0, 1], dtype=torch.int32, device=device)
    s_clean, s_bad = st.clone(), st.clone()
    o_clean = gdn_seq(q, k, v, g, beta, s_clean, idx, cu_seqlens=cu, use_qk_l2norm=True, chunk=chunk)
    kb = k.clone()
    kb[0, 20, 0, 3] = float("nan")                          # sequence 1 (slot 0), token 8 of 18
    o_bad = gdn_seq(q, kb, v, g, beta, s_bad, idx, cu_seqlens=cu, use_qk_l2norm=True, chunk=chunk)
    assert torch.equal(o_bad[:, :12], o_clean[:, :12]) and torch.equal(o_bad[:, 30:], o_clean[:, 30:])
    assert torch.isnan(o_bad[:, 20:30]).all(-1).all(-1).all()
    assert torch.isnan(s_bad[0]).any()
    for slot in (1, 2, 3, 4):
        assert torch.equal(s_bad[slot], s_clean[slot]), slot


FP32_BOUND = 1e-5  # the project's fp32 bound against float64 (tests/kernels/gdn/test_seq.py)


@pytest.mark.parametrize("case", ["g=-3000", "g=-inf", "nan_k"])
def test_token_path_handles_what_the_chunked_kernel_does_not(mode, device, case):
    """The controls of the three chunked cases above: the token-by-token path (chunk=0) on the same inputs stays
    at the fp32 bound for a large gate, finite for g = -inf, and causal for a NaN key."""
    q, k, v, g, beta, st = gdn_fixed_inputs(seed=0, T=32, device=device)
    if case == "g=-3000":
        g[:, 2] = -3000.0
    elif case == "g=-inf":
        g[:, 3] = float("-inf")
    else:
        k[0, 12, 0, 0] = float("nan")
    idx = torch.tensor([1], dtype=torch.int32, device=device)
    o_ref, s_ref = gdn_seq_ref(q, k, v, g, beta, st, idx, use_qk_l2norm=True)
    out = gdn_seq(q, k, v, g, beta, st, idx, use_qk_l2norm=True, chunk=0)
    n = 12 if case == "nan_k" else 32
    assert torch.isfinite(out[:, :n]).all() and rel(out[:, :n], o_ref[:, :n]) <= FP32_BOUND
    if case != "nan_k":
        assert rel(st, s_ref) <= FP32_BOUND


def test_gpu_default_config_is_exact_on_small_heads(mode, device, monkeypatch):
    """The GPU default ([KC, BV, K/KC] kernel at G.GPU_SEQ_CONFIG, KC capped at the padded K) run under the
    interpreter on K < KC, odd K and V, T not a multiple of U."""
    bv, w, u, kc = G.GPU_SEQ_CONFIG
    monkeypatch.setattr(G, "_default_seq_config", lambda V: (min(bv, pow2(V)), w, u, kc))
    for K, V, T in ((1, 1, 5), (3, 5, 9), (24, 40, 3)):
        q, k, v, g, beta, st = gdn_fixed_inputs(seed=6, T=T, K=K, V=V, device=device)
        idx = torch.tensor([2], dtype=torch.int32, device=device)
        o_ref, s_ref = gdn_seq_ref(q, k, v, g, beta, st, idx, use_qk_l2norm=True)
        out = gdn_seq(q, k, v, g, beta, st, idx, use_qk_l2norm=True)
        assert rel(out, o_ref) <= FP32_BOUND and rel(st, s_ref) <= FP32_BOUND, (K, V, T)


def test_reference_on_an_empty_fixed_length_batch():
    """gdn_seq handles B sequences of T = 0 tokens (returns an empty o; a sequence without an initial state gets
    a zero state); gdn_seq_ref raised RuntimeError("step must be nonzero") from torch.arange(0, (B+1)*T, T)
    in _cu_seqlens."""
    q, k, v, g, beta, st = gdn_fixed_inputs(T=0, B=2)
    idx = torch.tensor([0, 1], dtype=torch.int32)
    hi = torch.tensor([True, False])
    o_ref, s_ref = gdn_seq_ref(q, k, v, g, beta, st, idx, has_initial_state=hi)
    s = st.clone()
    out = gdn_seq(q, k, v, g, beta, s, idx, has_initial_state=hi)
    assert o_ref.shape == out.shape and torch.equal(s_ref.float(), s)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"),
                    reason="the cached launch path exists only for compiled kernels")
def test_cached_launch_equals_jit_launch(gen):
    """kernels._launch: the second and later calls launch the cached CompiledKernel directly; its outputs must be
    bit-identical to launches through Triton's JIT dispatcher (same kernel, same arguments)."""
    import kernels._launch as L

    c = dict(H=16, HV=32, K=128, V=128, lens=[45, 3, 128])
    q, k, v, g, beta, state, idx, cu = make_seq_inputs(gen, "cuda", c, torch.bfloat16)
    runs = []
    for fast in (False, True, True, True):
        L.FAST = fast
        try:
            st = state.clone()
            for kw in (dict(), dict(KC=4), dict(lookahead=True)):
                o = gdn_seq(q, k, v, g, beta, st, idx, cu_seqlens=cu, use_qk_l2norm=True, **kw)
                runs.append((fast, str(kw), o.clone(), st.clone()))
        finally:
            L.FAST = True
    ref = {kw: (o, s) for fast, kw, o, s in runs if not fast}
    for fast, kw, o, s in runs:
        assert torch.equal(o, ref[kw][0]) and torch.equal(s, ref[kw][1]), (fast, kw)

"""Unit gates for kernels/gdn.py: gdn_seq and gdn_conv against their float64 references.

Every test draws fresh random inputs (the seed is printed), poisons the outputs with NaN before the run and
checks that every element was written, and never runs on zeros.

Error bounds, ||out - ref|| / ||ref|| against float64:
* fp32 inputs and state: 1e-5. The kernel's arithmetic is fp32 (unit roundoff 6e-8); a few hundred dependent
  steps of a contracting recurrence stay well under 1e-6, seen ~1e-7.
* bf16 inputs: the reference reads the same bf16 values, so the only extra error is the final rounding of o to
  bf16, at most 2^-9 = 1.95e-3 of each element under round-to-nearest: bound 3e-3 for o; the fp32 state keeps
  1e-5. A bf16 state is rounded once when stored: 3e-3.
gdn_conv in fp32 must equal ``gdn_conv_ref(dtype=float32)`` bit for bit (same operations in the same order),
and in bf16 its fp32 result rounded once to bf16.
"""
from __future__ import annotations

import os

import pytest
import torch

from kernels.gdn import gdn_conv, gdn_conv_ref, gdn_seq, gdn_seq_ref

BOUND = {torch.float32: 1e-5, torch.bfloat16: 3e-3}


def rel(out: torch.Tensor, ref: torch.Tensor) -> float:
    out, ref = out.double().cpu(), ref.double().cpu()
    return ((out - ref).norm() / ref.norm()).item()


def randn(gen, shape, device, dtype=torch.float32, scale=1.0):
    return (torch.randn(shape, generator=gen, dtype=torch.float64) * scale).to(device=device, dtype=dtype)


def rand(gen, shape, device, dtype=torch.float32):
    return torch.rand(shape, generator=gen, dtype=torch.float64).to(device=device, dtype=dtype)


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


@pytest.mark.parametrize("chunk", [16, 32])
def test_seq_chunked_repeated_keys(mode, device, gen, chunk):
    """The chunked kernel's triangular inverse on the worst case for it: one key repeated at every token, beta
    ~ 1 and no decay, so L's entries are all ~1. A Neumann-series inverse (I - L)(I + L^2)(I + L^4)... fails
    this gate (its terms grow as binomial coefficients and cancel); the block-doubling inverse keeps the fp32
    bound."""
    H, HV, K, V, T = 1, 2, 32, 32, 2 * chunk
    base = randn(gen, (1, 1, H, K), device)
    k = base.expand(1, T, H, K).clone()
    q = randn(gen, (1, T, H, K), device)
    v = randn(gen, (1, T, HV, V), device)
    g = torch.full((1, T, HV), -1e-4, device=device)
    beta = torch.full((1, T, HV), 0.999, device=device)
    state = randn(gen, (1, HV, V, K), device)
    idx = torch.zeros(1, dtype=torch.int32, device=device)
    o_ref, s_ref = gdn_seq_ref(q, k, v, g, beta, state, idx, use_qk_l2norm=True)
    out = gdn_seq(q, k, v, g, beta, state, idx, use_qk_l2norm=True, chunk=chunk, BV=16, num_warps=8)
    e_o, e_s = rel(out, o_ref), rel(state, s_ref)
    print(f"repeated key, chunk {chunk}: rel err o {e_o:.2e} state {e_s:.2e}")
    assert e_o <= 1e-5 and e_s <= 1e-5


def test_seq_chunk_arguments(device):
    """Bad chunked-kernel arguments are refused with a message naming the argument (on the CPU and the GPU)."""
    q = torch.zeros(1, 4, 1, 16, device=device)
    v = torch.zeros(1, 4, 1, 16, device=device)
    g = torch.zeros(1, 4, 1, device=device)
    st = torch.zeros(1, 1, 16, 16, device=device)
    idx = torch.zeros(1, dtype=torch.int32, device=device)
    for kw, msg in ((dict(chunk=8), "must be 16 or 32"), (dict(chunk=24), "must be 16 or 32"),
                    (dict(chunk=64), "must be 16 or 32"),
                    (dict(chunk=True), "non-negative int"), (dict(chunk=16, BV=8), "BV >= 16"),
                    (dict(chunk=16, KC=4), "not combined"), (dict(chunk=16, lookahead=True), "not combined"),
                    (dict(chunk=16, chunk_precision="tf32"), "chunk_precision"),
                    (dict(chunk=16, num_stages=-1), "num_stages")):
        with pytest.raises(ValueError, match=msg):
            gdn_seq(q, q, v, g, g, st, idx, **kw)


# ---- gdn_conv ----------------------------------------------------------------------------------------------
def conv_case(mode):
    if mode == "interp":
        return dict(dim=160, lens=[1, 2, 9, 0, 40, 3, 0], BD=128)  # index 6: empty, live slot
    return dict(dim=8192, lens=[1, 2, 45, 128, 0, 256, 3, 77], BD=128)  # index 4: empty, live slot


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("act", ["silu", None], ids=["silu", "noact"])
@pytest.mark.parametrize("layout", ["channel_last", "contiguous"])
@pytest.mark.parametrize("state_len", [3, 5], ids=["state3", "state5"])
def test_conv_exact(mode, device, gen, dtype, act, layout, state_len):
    c = conv_case(mode)
    dim, lens, W = c["dim"], c["lens"], 4
    T, N = sum(lens), len(lens)
    if layout == "channel_last":  # vLLM: the transpose of a [tokens, dim] tensor
        x = randn(gen, (T, dim), device, dtype).t()
    else:
        x = randn(gen, (dim, T), device, dtype)
    w = randn(gen, (dim, W), device, dtype, scale=0.5)
    b = randn(gen, (dim,), device, dtype, scale=0.1)
    slots = N + 4
    cs = randn(gen, (slots, dim, state_len), device, dtype)
    idx = torch.randperm(slots - 1, generator=gen)[:N].add(1).to(device=device, dtype=torch.int32)
    idx[3] = -1                                       # pad slot (also an empty sequence)
    idx[0] = 0                                        # vLLM's null block 0
    has_init = (torch.rand(N, generator=gen) < 0.7).to(device)
    cu = torch.tensor([0] + torch.tensor(lens).cumsum(0).tolist(), dtype=torch.int32, device=device)
    ref32, ref_states = gdn_conv_ref(x, w, b, cs, cu, idx, has_init, act, null_block_id=0, dtype=torch.float32)
    ref64, _ = gdn_conv_ref(x, w, b, cs, cu, idx, has_init, act, null_block_id=0)
    states = cs.clone()
    out = torch.full_like(x, float("nan"))
    gdn_conv(x, w, b, states, cu, idx, has_init, act, null_block_id=0, out=out, BD=c["BD"])
    assert torch.isfinite(out).all(), "an output element was not written"
    assert torch.equal(out, ref32.to(dtype)), f"max diff {(out.float() - ref32).abs().max().item()}"
    assert torch.equal(states, ref_states), "conv state differs (new columns, extra columns or other slots)"
    live = torch.ones(T, dtype=torch.bool)
    assert rel(out[:, live], ref64[:, live]) <= BOUND[dtype]
    bos = int(cu[0])
    assert (out[:, bos:bos + lens[0]] == 0).all()  # the null-block sequence


def test_conv_split_calls_equal_one_call(mode, device, gen):
    """Prefill in two pieces (state carried through conv_states) equals one call: the carried state is right."""
    dim, W = (64, 4) if mode == "interp" else (8192, 4)
    L1, L2 = (2, 11) if mode == "interp" else (2, 200)
    x = randn(gen, (L1 + L2, dim), device).t()
    w, b = randn(gen, (dim, W), device), randn(gen, (dim,), device)
    cs0 = randn(gen, (2, dim, W - 1), device)
    one, two = cs0.clone(), cs0.clone()
    idx = torch.tensor([1], dtype=torch.int32, device=device)
    init = torch.tensor([True], device=device)
    y1 = gdn_conv(x, w, b, one, torch.tensor([0, L1 + L2], dtype=torch.int32, device=device), idx, init)
    ya = gdn_conv(x[:, :L1], w, b, two, torch.tensor([0, L1], dtype=torch.int32, device=device), idx, init)
    yb = gdn_conv(x[:, L1:], w, b, two, torch.tensor([0, L2], dtype=torch.int32, device=device), idx, init)
    assert torch.equal(torch.cat([ya, yb], 1), y1)
    assert torch.equal(one, two)


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

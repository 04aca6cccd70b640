"""Edge inputs of gdn_seq's [KC, BV, K/KC] kernel, on the plain step and on the scaled state: steps past a
sequence's end (the clamped loads) are exact no-ops even where S k overflows or v is infinite, a non-finite input
stays in its sequence and head, empty sequences, all-empty batches, pad slots with NaN inputs, group sizes U and
odd head dims, strided views and outputs, and one call against single-token calls."""
from __future__ import annotations

import pytest
import torch

from kernels.gdn import PAD_SLOT_ID, gdn_seq, gdn_seq_ref
from tests.kernels.cases import check_gdn_seq, gdn_small_varlen, rel


BOUND = 1e-5  # fp32 against float64, as tests/kernels/gdn/test_seq.py


DEFER = pytest.mark.parametrize("defer", [True, False], ids=["scaled", "plain"])


@pytest.mark.parametrize("U", [2, 3])
@DEFER
def test_steps_past_the_end_keep_a_finite_state_finite(mode, device, U, defer):
    """_seq_load_clamped re-reads the sequence's last row for the steps of the last group past T and relies on
    beta = 0 to make them no-ops: u = 0 * (v - S k). When S_T k overflows fp32 although S_T itself is finite,
    that is 0 * inf = NaN, and the whole stored state goes NaN. The reference (and the [BV, K] kernel, KC=0,
    whose masked loads give k = 0 there) keep S_T = 1e29 finite. Here T = 3 with U = 2 or 3 (the last group
    has a step past T; it is a clamped load only from the second group on): tokens 0, 1 are no-ops (beta = 0),
    token 2 writes S = 1e29 with k = 1e10, so S k = 4e39 > fp32 max."""
    H = HV = 1
    K = V = 4
    T = 3 if U == 2 else 4
    q = torch.full((1, T, H, K), 1e-10, device=device)
    k = torch.full((1, T, H, K), 1e10, device=device)
    v = torch.full((1, T, HV, V), 1e19, device=device)
    g = torch.zeros(1, T, HV, device=device)
    beta = torch.zeros(1, T, HV, device=device)
    beta[0, -1] = 1.0
    st = torch.zeros(1, HV, V, K, device=device)
    idx = torch.zeros(1, dtype=torch.int32, device=device)
    o_ref, s_ref = gdn_seq_ref(q, k, v, g, beta, st, idx, scale=1.0)
    assert torch.isfinite(s_ref.float()).all() and float(s_ref[0, 0, 0, 0]) == pytest.approx(1e29)
    s0 = st.clone()
    gdn_seq(q, k, v, g, beta, s0, idx, scale=1.0, KC=0, U=U)         # the [BV, K] kernel: finite
    assert torch.isfinite(s0).all()
    s = st.clone()
    out = gdn_seq(q, k, v, g, beta, s, idx, scale=1.0, KC=4, U=U, defer_decay=defer)
    assert rel(out, o_ref) <= BOUND
    assert torch.isfinite(s).all(), s.flatten()                     # before the fix: all NaN
    assert rel(s, s_ref) <= BOUND


@DEFER
def test_steps_past_the_end_keep_an_inf_state_row_inf(mode, device, defer):
    """Same cause, non-finite input: v = +inf in one element of the last token. The reference's (and KC=0's)
    state row is +inf (u = beta (inf - a) = inf, k > 0); the clamped past-end step then computes
    u = 0 * (inf - ...) = NaN, so the KC kernel stores NaN there instead of inf."""
    H = HV = 1
    K, V, T, U = 4, 4, 3, 2
    q = torch.full((1, T, H, K), 0.5, device=device)
    k = torch.full((1, T, H, K), 0.5, device=device)
    v = torch.ones(1, T, HV, V, device=device)
    v[0, -1, 0, 1] = float("inf")
    g = torch.full((1, T, HV), -0.1, device=device)
    beta = torch.full((1, T, HV), 0.5, device=device)
    st = torch.zeros(1, HV, V, K, device=device)
    idx = torch.zeros(1, dtype=torch.int32, device=device)
    _, s_ref = gdn_seq_ref(q, k, v, g, beta, st, idx)
    assert torch.isposinf(s_ref[0, 0, 1]).all()
    s0 = st.clone()
    gdn_seq(q, k, v, g, beta, s0, idx, KC=0, U=U)
    assert torch.isposinf(s0[0, 0, 1]).all()
    s = st.clone()
    gdn_seq(q, k, v, g, beta, s, idx, KC=4, U=U, defer_decay=defer)
    assert torch.isposinf(s[0, 0, 1]).all(), s[0, 0, 1]              # before the fix: NaN


@pytest.mark.parametrize("what", ["q", "k", "v", "g", "beta", "g=+inf"])
@pytest.mark.parametrize("pos", [0, 4, 8], ids=["first", "mid", "last"])
@DEFER
def test_non_finite_input_stays_in_its_sequence(mode, device, what, pos, defer):
    """NaN (or g = +inf) at token pos of sequence 1 (9 tokens, U = 4: the last group has 3 steps past T),
    value head 1 (q, k: key head 0 shared by both value heads, so both heads). Sequences 0 and 2, their slots
    and the untouched slots are bit-identical to the clean run; sequence 1's outputs before pos are too; its
    non-finite outputs and NaN state elements are where the reference's are."""
    lens = [5, 9, 6]
    q, k, v, g, beta, st, idx, cu = gdn_small_varlen(3, lens, HV=2, device=device)
    s_clean, s_bad = st.clone(), st.clone()
    o_clean = gdn_seq(q, k, v, g, beta, s_clean, idx, cu_seqlens=cu, KC=4, U=4, defer_decay=defer)
    t = 5 + pos
    x = {"q": q, "k": k, "v": v, "g": g, "beta": beta, "g=+inf": g}[what].clone()
    if what in ("q", "k"):
        x[0, t, 0, 3] = float("nan")
    elif what == "v":
        x[0, t, 1, 2] = float("nan")
    else:
        x[0, t, 1] = float("inf") if what == "g=+inf" else float("nan")
    args = dict(q=q, k=k, v=v, g=g, beta=beta)
    args["g" if what == "g=+inf" else what] = x
    o_bad = gdn_seq(**args, state=s_bad, state_idx=idx, cu_seqlens=cu, KC=4, U=4, defer_decay=defer)
    o_ref, s_ref = gdn_seq_ref(**args, state=st, state_idx=idx, cu_seqlens=cu)
    assert torch.equal(o_bad[:, :5], o_clean[:, :5]) and torch.equal(o_bad[:, 14:], o_clean[:, 14:])
    assert torch.equal(o_bad[:, 5:t], o_clean[:, 5:t])
    # where the reference is non-finite the kernel is too (at a g = +inf token the plain step's
    # o = e b + u kq gives +-inf where the reference's S_t q_t is NaN, as the KC=0 kernel: not compared)
    assert torch.equal(torch.isfinite(o_bad), torch.isfinite(o_ref))
    slot1 = int(idx[1])
    for s in range(st.shape[0]):
        if s != slot1:
            assert torch.equal(s_bad[s], s_clean[s]), s
    if what == "g=+inf":
        # S e with e = inf: the plain steps (and KC=0) form e (S k) before S e, so some elements are +-inf
        # where the reference's are NaN; non-finite where the reference is
        assert torch.equal(torch.isfinite(s_bad), torch.isfinite(s_ref))
    else:
        assert torch.equal(torch.isnan(s_bad), torch.isnan(s_ref))
    fin = torch.isfinite(o_ref)
    assert rel(o_bad[fin], o_ref[fin]) <= BOUND


@pytest.mark.parametrize("lens", [[0, 5, 7], [5, 0, 7], [5, 7, 0], [0, 0, 3], [0, 9, 0, 0]],
                         ids=["start", "middle", "end", "two-first", "mixed"])
@pytest.mark.parametrize("U", [3, 4])
@DEFER
def test_empty_sequences(mode, device, lens, U, defer):
    q, k, v, g, beta, st, idx, cu = gdn_small_varlen(4, lens, device=device)
    hi = torch.tensor([i % 2 == 0 for i in range(len(lens))], device=device)
    check_gdn_seq(q, k, v, g, beta, st, idx, cu, KC=4, U=U, defer_decay=defer)
    check_gdn_seq(q, k, v, g, beta, st, idx, cu, KC=4, U=U, defer_decay=defer, has_initial_state=hi)


@DEFER
def test_zero_token_batch(mode, device, defer):
    """Three empty sequences (varlen) and B = 2 of T = 0: out is empty, the used slots are zeroed only where
    has_initial_state is False, the others untouched (as the reference)."""
    q, k, v, g, beta, st, idx, cu = gdn_small_varlen(4, [0, 0, 0], device=device)
    hi = torch.tensor([True, False, True], device=device)
    o_ref, s_ref = gdn_seq_ref(q, k, v, g, beta, st, idx, cu, has_initial_state=hi)
    s = st.clone()
    out = gdn_seq(q, k, v, g, beta, s, idx, cu_seqlens=cu, has_initial_state=hi, KC=4, defer_decay=defer)
    assert out.shape == (1, 0, 2, 8) and torch.equal(s.double(), s_ref)
    assert torch.equal(s[int(idx[1])], torch.zeros_like(s[0]))
    qb, kb, vb = q.expand(2, 0, -1, -1), k.expand(2, 0, -1, -1), v.expand(2, 0, -1, -1)
    gb, bb = g.expand(2, 0, -1), beta.expand(2, 0, -1)
    s = st.clone()
    out = gdn_seq(qb, kb, vb, gb, bb, s, idx[:2], KC=4, defer_decay=defer)
    assert out.shape == (2, 0, 2, 8) and torch.equal(s, st)


@pytest.mark.parametrize("with_init", [False, True])
@DEFER
def test_pad_slots(mode, device, with_init, defer):
    """PAD_SLOT_ID sequences (first, middle, last) get zero outputs and leave every slot alone, even with a
    NaN in their own inputs; has_initial_state False for the others starts from zero."""
    lens = [4, 6, 5, 3]
    q, k, v, g, beta, st, idx, cu = gdn_small_varlen(6, lens, slots=4, device=device)
    idx = torch.tensor([PAD_SLOT_ID, 2, PAD_SLOT_ID, 0], dtype=torch.int32, device=device)
    v = v.clone()
    v[0, 0:4] = float("nan")
    g = g.clone()
    g[0, 10:15] = float("nan")
    hi = torch.tensor([True, False, True, True], device=device) if with_init else None
    o_ref, s_ref = gdn_seq_ref(q, k, v, g, beta, st, idx, cu, has_initial_state=hi)
    s = st.clone()
    out = gdn_seq(q, k, v, g, beta, s, idx, cu_seqlens=cu, has_initial_state=hi, KC=4, U=3, defer_decay=defer)
    assert torch.equal(out[0, 0:4], torch.zeros_like(out[0, 0:4]))
    assert torch.equal(out[0, 10:15], torch.zeros_like(out[0, 10:15]))
    assert torch.equal(s[1], st[1]) and torch.equal(s[3], st[3])
    assert rel(out, o_ref) <= BOUND and rel(s, s_ref) <= BOUND


@pytest.mark.parametrize("U", [1, 2, 3, 5, 7, 8])
@pytest.mark.parametrize("shape", [dict(K=12, V=5, BV=4), dict(K=32, V=24, BV=16), dict(K=5, V=3, BV=2),
                                   dict(K=16, V=8, BV=8)], ids=["K12V5", "K32V24", "K5V3", "K16V8"])
@DEFER
def test_group_sizes_and_odd_shapes(mode, device, U, shape, defer):
    sh = dict(shape)
    BV = sh.pop("BV")
    q, k, v, g, beta, st, idx, cu = gdn_small_varlen(8, [1, 11, 6], H=2, HV=4, **sh, device=device)
    g = g.clone()
    g[0, 9, 2] = -60.0                                                # one plain group in the middle
    check_gdn_seq(q, k, v, g, beta, st, idx, cu, KC=4, U=U, BV=BV, defer_decay=defer)
    check_gdn_seq(q, k, v, g, beta, st, idx, cu, KC=2, U=U, BV=BV, defer_decay=defer, use_qk_l2norm=True)


@DEFER
def test_non_contiguous_inputs_state_and_odd_out(mode, device, defer):
    """q/k/v slices of bigger tensors, g/beta strided, state every other slot of a bigger tensor, out a
    strided slice; B = 2 fixed length with a transposed out (reshape copies, then copies back)."""
    q, k, v, g, beta, st, idx, cu = gdn_small_varlen(10, [6, 9], H=2, HV=4, K=12, V=5, device=device)
    T = q.shape[1]
    qb = torch.zeros(1, T, 3, 20, device=device)
    qb[:, :, :2, 3:15] = q
    kb = torch.zeros(1, T, 2, 40, device=device)
    kb[..., 7:19] = k
    vb = torch.zeros(1, T, 8, 9, device=device)
    vb[:, :, ::2, 2:7] = v
    gb = torch.zeros(1, T, 4, 3, device=device)
    gb[..., 1] = g
    bb = torch.zeros(1, T, 8, device=device)
    bb[..., 1::2] = beta
    qs, ks, vs, gs, bs = qb[:, :, :2, 3:15], kb[..., 7:19], vb[:, :, ::2, 2:7], gb[..., 1], bb[..., 1::2]
    assert not any(x.is_contiguous() for x in (qs, ks, vs, gs, bs))
    o_ref, s_ref = gdn_seq_ref(q, k, v, g, beta, st, idx, cu)
    big = torch.zeros(st.shape[0] * 2, *st.shape[1:], device=device)
    big[::2] = st
    ob = torch.full((1, T, 4, 11), 7.0, device=device)
    out = gdn_seq(qs, ks, vs, gs, bs, big[::2], idx, cu_seqlens=cu, out=ob[..., 3:8], KC=4, U=3,
                  defer_decay=defer)
    assert rel(out, o_ref) <= BOUND and rel(big[::2], s_ref) <= BOUND
    assert torch.equal(big[1::2], torch.zeros_like(big[1::2]))
    assert (ob[..., :3] == 7).all() and (ob[..., 8:] == 7).all()
    # fixed length B = 2, out transposed in (B, T)
    q2, k2, v2, g2, b2 = (x.reshape(2, 5, *x.shape[2:])[:, :5] for x in (q[:, :10], k[:, :10], v[:, :10],
                                                                             g[:, :10], beta[:, :10]))
    idx2 = idx[:2]
    o_ref, s_ref = gdn_seq_ref(q2, k2, v2, g2, b2, st, idx2)
    outT = torch.zeros(5, 2, 4, 5, device=device).transpose(0, 1)
    s = st.clone()
    out = gdn_seq(q2, k2, v2, g2, b2, s, idx2, out=outT, KC=4, U=3, defer_decay=defer)
    assert out is outT and rel(outT, o_ref) <= BOUND and rel(s, s_ref) <= BOUND


@pytest.mark.parametrize("U", [1, 3, 5, 7])
@DEFER
def test_one_call_equals_single_token_calls(mode, device, U, defer):
    """29 tokens in one call against 29 one-token calls (fixed length B = 2), with a plain group in the
    middle (g = -50) and a -inf gate."""
    q, k, v, g, beta, st, idx, cu = gdn_small_varlen(11, [29, 29], device=device)
    q, k, v, g, beta = (x.reshape(2, 29, *x.shape[2:]) for x in (q, k, v, g, beta))
    g = g.clone()
    g[0, 6] = -50.0
    g[1, 17] = float("-inf")
    s_one, s_split = st.clone(), st.clone()
    o_ref, s_ref = gdn_seq_ref(q, k, v, g, beta, st, idx)
    out = gdn_seq(q, k, v, g, beta, s_one, idx, KC=4, U=U, defer_decay=defer)
    assert rel(out, o_ref) <= BOUND and rel(s_one, s_ref) <= BOUND
    outs = [gdn_seq(q[:, t:t + 1], k[:, t:t + 1], v[:, t:t + 1], g[:, t:t + 1], beta[:, t:t + 1], s_split, idx,
                    KC=4, U=U, defer_decay=defer) for t in range(29)]
    assert rel(torch.cat(outs, 1), out) <= BOUND and rel(s_split, s_one) <= BOUND

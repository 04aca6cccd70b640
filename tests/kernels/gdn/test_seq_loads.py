"""How gdn_seq's [KC, BV, K/KC] kernel reads its token inputs and stays inside its tensors: q and k converted to
fp32 as they are prefetched (inline PTX on NVIDIA, kernels/gdn/seq.py _to_f32), 32-bit row offsets in the token
loop unless a sequence's rows times a row stride can reach 2^31 (_row_offsets_64), the clamped loads of a
sequence's last partial group and the plain-step fallback that reloads its inputs, a state index outside
[0, slots) skipped like a pad slot and cu_seqlens past the rows clamped, both in the kernel (no host sync). The
conversions and offsets are speed changes only: these gates hold the results bit-identical to the other form."""
from __future__ import annotations

import pytest
import torch

import kernels.gdn.seq as G
from kernels.gdn import gdn_seq, gdn_seq_ref
from tests.kernels.cases import gdn_varlen_inputs, interp_only, rel


def test_row_offsets_64_threshold():
    """True exactly when (rows - 1) * the largest stride reaches 2^31: the largest 32-bit offset the loop forms
    is (a sequence's last row) x (its row stride)."""
    assert G._row_offsets_64(1025, (2 ** 21, 8)) is True          # 1024 * 2^21 = 2^31
    assert G._row_offsets_64(1025, (2 ** 21 - 1, 8)) is False
    assert G._row_offsets_64(1024, (2 ** 21, 8)) is False
    assert G._row_offsets_64(0, (2 ** 40,)) is False
    assert G._row_offsets_64(1, (2 ** 40,)) is False               # one row: offset 0 only
    assert G._row_offsets_64(3, (1, 2 ** 30)) is True


def test_row_offsets_64_boundaries():
    """_row_offsets_64 is True exactly when (rows - 1) * max stride >= 2^31 (the largest 32-bit
    product the token loop forms), on both sides of the boundary, for any stride position, rows 0/1 and a
    stride that alone exceeds int32."""
    f = G._row_offsets_64
    assert f(2, (2 ** 31 - 1,)) is False and f(2, (2 ** 31,)) is True
    assert f(3, (1, 2 ** 30, 8)) is True and f(3, (1, 2 ** 30 - 1, 8)) is False
    assert f(2 ** 31, (1,)) is False and f(2 ** 31 + 1, (1,)) is True
    assert f(1, (2 ** 40,)) is False and f(0, (2 ** 40,)) is False
    assert f(2, (0, 0)) is False


BOUND = 1e-5  # fp32 against float64, as tests/kernels/gdn/test_seq.py


def loads_inputs(device, dtype, lens=(7, 1, 19), H=2, HV=4, K=32, V=16, slots=4, seed=5):
    gen = torch.Generator().manual_seed(seed)
    T = sum(lens)
    q = torch.randn(1, T, H, K, generator=gen).to(dtype)
    k = torch.randn(1, T, H, K, generator=gen).to(dtype)
    v = torch.randn(1, T, HV, V, generator=gen).to(dtype)
    g = -(torch.rand(1, T, HV, generator=gen) * 0.5 + 0.01)
    beta = torch.rand(1, T, HV, generator=gen)
    state = torch.randn(slots, HV, V, K, generator=gen) * 0.5
    cu = torch.tensor([0] + torch.tensor(lens).cumsum(0).tolist(), dtype=torch.int32)
    idx = torch.tensor([2, 0, 3], dtype=torch.int32)
    return [x.to(device) for x in (q, k, v, g, beta, state, idx, cu)]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
@pytest.mark.parametrize("defer", [True, False], ids=["scaled", "plain"])
def test_64bit_row_offsets_bit_identical(mode, device, monkeypatch, dtype, defer):
    """The kernel built with 64-bit row offsets (forced) gives the same bits as the 32-bit build the host picks
    for these shapes, and both match the float64 reference."""
    q, k, v, g, beta, st, idx, cu = loads_inputs(device, dtype)
    s32, s64 = st.clone(), st.clone()
    o32 = gdn_seq(q, k, v, g, beta, s32, idx, cu_seqlens=cu, use_qk_l2norm=True, KC=4, defer_decay=defer)
    monkeypatch.setattr(G, "_row_offsets_64", lambda rows, strides: True)
    o64 = gdn_seq(q, k, v, g, beta, s64, idx, cu_seqlens=cu, use_qk_l2norm=True, KC=4, defer_decay=defer)
    assert torch.equal(o32, o64) and torch.equal(s32, s64)
    o_ref, s_ref = gdn_seq_ref(q, k, v, g, beta, st, idx, cu, use_qk_l2norm=True)
    bound = BOUND if dtype == torch.float32 else 3e-3  # bf16 o: rounded once, <= 2^-9 an element (gdn/test_seq.py)
    assert rel(o32, o_ref) <= bound and rel(s32, s_ref) <= BOUND


GDN_BOUND = 1e-5      # fp32 against float64, as tests/kernels/gdn/test_seq.py


DEFER = pytest.mark.parametrize("defer", [True, False], ids=["scaled", "plain"])


def gdn_inputs(seed, lens, H=1, HV=2, K=8, V=4, slots=None, device="cpu"):
    """Varlen inputs [1, sum(lens), ...] (tests/kernels/cases.py); unit-norm q and k (well conditioned without
    l2norm); two spare slots by default."""
    return gdn_varlen_inputs(seed, lens, H, HV, K, V, slots or len(lens) + 2, device)


@pytest.mark.parametrize("U", [1, 2, 3, 4])
@DEFER
def test_strided_views_bit_identical_with_forced_offset_width(mode, device, monkeypatch, U, defer):
    """Q every third row of a bigger tensor, k head-major (transposed), v with padded heads,
    g / beta strided: the kernel built with 32-bit and with 64-bit row offsets (_row_offsets_64 forced) gives
    the same bits as the host's own choice, and matches the reference; also B = 2 fixed length with a strided q."""
    q, k, v, g, beta, st, idx, cu = gdn_inputs(3, [5, 2, 7], H=2, HV=4, K=8, V=4, device=device)
    T = q.shape[1]
    qb = torch.randn(1, 3 * T, 2, 8, device=device)
    qb[:, ::3] = q
    kb = k.transpose(1, 2).contiguous()
    vb = torch.randn(1, T, 4, 12, device=device)
    vb[..., 2:6] = v
    gb = torch.randn(1, T, 4, 2, device=device)
    gb[..., 0] = g
    bb = torch.empty(1, 4, T, device=device).transpose(1, 2)
    bb.copy_(beta)
    views = (qb[:, ::3], kb.transpose(1, 2), vb[..., 2:6], gb[..., 0], bb)
    o_ref, s_ref = gdn_seq_ref(q, k, v, g, beta, st, idx, cu)
    res = []
    for force in (None, True, False):
        with monkeypatch.context() as m:
            if force is not None:
                m.setattr(G, "_row_offsets_64", lambda rows, strides, f=force: f)
            s = st.clone()
            o = gdn_seq(*views, s, idx, cu_seqlens=cu, KC=4, U=U, defer_decay=defer)
        res.append((o, s))
    assert rel(res[0][0], o_ref) <= GDN_BOUND and rel(res[0][1], s_ref) <= GDN_BOUND
    for o, s in res[1:]:
        assert torch.equal(o, res[0][0]) and torch.equal(s, res[0][1])
    q2, k2, v2, g2, b2 = (x[:, :10].reshape(2, 5, *x.shape[2:]) for x in (q, k, v, g, beta))
    q2s = torch.randn(2, 5, 3, 8, device=device)[:, :, :2]
    q2s.copy_(q2)
    o_ref, s_ref = gdn_seq_ref(q2, k2, v2, g2, b2, st, idx[:2])
    outs = []
    for force in (True, False):
        with monkeypatch.context() as m:
            m.setattr(G, "_row_offsets_64", lambda rows, strides, f=force: f)
            s = st.clone()
            outs.append((gdn_seq(q2s, k2, v2, g2, b2, s, idx[:2], KC=4, U=U, defer_decay=defer), s))
    assert torch.equal(outs[0][0], outs[1][0]) and torch.equal(outs[0][1], outs[1][1])
    assert rel(outs[0][0], o_ref) <= GDN_BOUND and rel(outs[0][1], s_ref) <= GDN_BOUND


@pytest.mark.gpu
@pytest.mark.skipif(not (torch.cuda.is_available() and not G._interpreting()), reason="needs a CUDA GPU")
@pytest.mark.parametrize("defer", [True, False], ids=["scaled", "plain"])
def test_ptx_conversion_matches_triton_conversion_gpu(monkeypatch, defer):
    """bf16 q, k converted by inline PTX (the GPU default) against Triton's own conversion: both within the
    bf16 bound of the float64 reference, o within the bf16 bound and the state within the fp32 bound of each
    other. q and k are L2-normalised (without the norm these inputs grow the state to ~4e7). Not asserted
    bit-identical: the scaled kernel's two builds were seen to differ in the last bits (their fp32 code is
    scheduled differently)."""
    q, k, v, g, beta, st, idx, cu = loads_inputs("cuda", torch.bfloat16, lens=(45, 3, 16), H=4, HV=8, K=128, V=128)
    s_ptx, s_tri = st.clone(), st.clone()
    assert G._use_ptx(q)
    o_ptx = gdn_seq(q, k, v, g, beta, s_ptx, idx, cu_seqlens=cu, use_qk_l2norm=True, KC=4, defer_decay=defer)
    monkeypatch.setattr(G, "_use_ptx", lambda x: False)
    o_tri = gdn_seq(q, k, v, g, beta, s_tri, idx, cu_seqlens=cu, use_qk_l2norm=True, KC=4, defer_decay=defer)
    o_ref, s_ref = gdn_seq_ref(q, k, v, g, beta, st, idx, cu, use_qk_l2norm=True)
    for o, s in ((o_ptx, s_ptx), (o_tri, s_tri)):
        assert rel(o, o_ref) <= 3e-3 and rel(s, s_ref) <= BOUND
    assert rel(o_ptx, o_tri) <= 3e-3 and rel(s_ptx, s_tri) <= BOUND


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("KC", [1, 4, 16])
@DEFER
def test_half_inputs_through_to_f32_and_fallback(mode, device, dtype, KC, defer):
    """Bf16/fp16 q, k, v through _to_f32 (the interpreter's .to(fp32) path), l2norm, KC from 1
    to K (KK = 1), a fallback group at a sequence's end (g = -70), U = 1..4: within bf16 rounding of the
    reference on the same half inputs, state within 1e-5."""
    for U in (1, 2, 3, 4):
        q, k, v, g, beta, st, idx, cu = gdn_inputs(4, [1, 3, 2, 6], K=16, device=device)
        g = g.clone()
        g[0, 9, 0] = -70.0
        q, k, v = (x.to(dtype) for x in (q, k, v))
        o_ref, s_ref = gdn_seq_ref(q, k, v, g, beta, st, idx, cu, use_qk_l2norm=True)
        s = st.clone()
        o = gdn_seq(q, k, v, g, beta, s, idx, cu_seqlens=cu, KC=KC, U=U, defer_decay=defer, use_qk_l2norm=True)
        assert rel(o, o_ref) <= 3e-3 and rel(s, s_ref) <= GDN_BOUND, U


@pytest.mark.gpu
@pytest.mark.skipif(not (torch.cuda.is_available() and not G._interpreting()), reason="needs a CUDA GPU")
def test_rows_past_2_31_elements_gpu():
    """q's row stride 2^30 elements (a 4 GiB strided view), three tokens: the last row's offset is 2^31, which
    the host sees (_row_offsets_64) and the kernel then forms in 64 bits; equals the reference."""
    H, HV, K, V, T = 1, 2, 128, 128, 3
    stride = 2 ** 30
    base = torch.zeros(stride * (T - 1) + H * K, dtype=torch.bfloat16, device="cuda")
    q = base.as_strided((1, T, H, K), (T * stride, stride, K, 1))
    gen = torch.Generator(device="cuda").manual_seed(1)
    q.copy_(torch.randn(1, T, H, K, generator=gen, device="cuda"))
    k = torch.randn(1, T, H, K, generator=gen, device="cuda").bfloat16()
    v = torch.randn(1, T, HV, V, generator=gen, device="cuda").bfloat16()
    g = -torch.rand(1, T, HV, generator=gen, device="cuda") * 0.5
    beta = torch.rand(1, T, HV, generator=gen, device="cuda")
    st = torch.randn(1, HV, V, K, generator=gen, device="cuda")
    idx = torch.zeros(1, dtype=torch.int32, device="cuda")
    assert G._row_offsets_64(T, (q.stride(1),))
    o_ref, s_ref = gdn_seq_ref(q, k, v, g, beta, st, idx, use_qk_l2norm=True)
    out = gdn_seq(q, k, v, g, beta, st, idx, use_qk_l2norm=True, KC=4)
    assert rel(out, o_ref) <= 3e-3 and rel(st, s_ref) <= BOUND


@pytest.mark.parametrize("lens", [[1], [2], [3], [1, 2, 3], [3, 0, 1], [0, 2, 0, 3], [2, 5, 1]],
                         ids=lambda l: "-".join(map(str, l)))
@pytest.mark.parametrize("U", [1, 2, 3, 4])
@DEFER
def test_short_empty_pad_and_no_init_sequences(mode, device, lens, U, defer):
    """Sequences shorter than U (T = 1..3), empty ones (repeated cu offsets), a pad slot (-1)
    among real ones, has_initial_state False rows; outputs and state within 1e-5 of the float64 reference, pad
    outputs zero, slots no sequence uses bit-identical."""
    q, k, v, g, beta, st, idx, cu = gdn_inputs(7, lens, device=device)
    if len(lens) > 2:
        idx = idx.clone()
        idx[1] = G.PAD_SLOT_ID
    hi = torch.tensor([i % 2 == 1 for i in range(len(lens))], device=device)
    for has in (None, hi):
        o_ref, s_ref = gdn_seq_ref(q, k, v, g, beta, st, idx, cu, has_initial_state=has)
        s = st.clone()
        o = gdn_seq(q, k, v, g, beta, s, idx, cu_seqlens=cu, KC=4, U=U, defer_decay=defer, has_initial_state=has)
        # o is a sum of K terms of ~0.2 that cancel to ~1e-4 on some rows (seed 7, one token): there the fp32
        # rounding of the terms (~1e-8 absolute) sets o's relative error (1.35e-5 on the H200, 2026-12-01), so
        # o passes on either bound
        o_abs = (o.double().cpu() - o_ref.double().cpu()).abs().max().item()
        assert (rel(o, o_ref) <= GDN_BOUND or o_abs <= 1e-7) and rel(s, s_ref) <= GDN_BOUND, (rel(o, o_ref), o_abs)
        used = {int(i) for i in idx}
        for j in range(st.shape[0]):
            if j not in used:
                assert torch.equal(s[j], st[j]), j
        if len(lens) > 2:
            assert torch.equal(o[0, cu[1]:cu[2]], torch.zeros_like(o[0, cu[1]:cu[2]]))


FAULTS = ["v=nan", "v=inf", "g=nan", "g=-inf", "g=+inf", "g=-80", "g=+30"]


@pytest.mark.parametrize("fault", FAULTS)
@pytest.mark.parametrize("U", [2, 3, 4])
@DEFER
def test_non_finite_and_huge_gates_stay_in_their_sequence(mode, device, fault, U, defer):
    """A fault in sequence 3 (5 tokens: with U = 2..4 its last group is partial, so the new
    reloading fallback runs) at its first, a middle and its last token: the other sequences' outputs and every
    other slot are bit-identical to the clean run; where the reference is finite the kernel matches it, and
    non-finite exactly where the reference is (state compared by finiteness: g = +inf gives +-inf vs NaN)."""
    lens = [3, 2, 0, 5, 1]
    q, k, v, g, beta, st, _, cu = gdn_inputs(11, lens, slots=7, device=device)
    idx = torch.tensor([5, G.PAD_SLOT_ID, 2, 0, 6], dtype=torch.int32, device=device)
    s_clean = st.clone()
    o_clean = gdn_seq(q, k, v, g, beta, s_clean, idx, cu_seqlens=cu, KC=4, U=U, defer_decay=defer)
    lo, hi = int(cu[3]), int(cu[4])
    for t in (lo, lo + 2, hi - 1):
        args = dict(q=q, k=k, v=v.clone(), g=g.clone(), beta=beta)
        what, val = fault.split("=")
        if what == "v":
            args["v"][0, t, 1, 2] = float(val)
        else:
            args["g"][0, t, 1 if val in ("nan", "-inf", "+inf") else slice(None)] = float(val)
        s = st.clone()
        o = gdn_seq(**args, state=s, state_idx=idx, cu_seqlens=cu, KC=4, U=U, defer_decay=defer)
        o_ref, s_ref = gdn_seq_ref(**args, state=st, state_idx=idx, cu_seqlens=cu)
        assert torch.equal(o[:, :lo], o_clean[:, :lo]) and torch.equal(o[:, hi:], o_clean[:, hi:])
        for j in range(st.shape[0]):
            if j != 0:
                assert torch.equal(s[j], s_clean[j]), (t, j)
        assert torch.equal(torch.isfinite(o), torch.isfinite(o_ref))
        assert torch.equal(torch.isfinite(s), torch.isfinite(s_ref))
        fo, fs = torch.isfinite(o_ref), torch.isfinite(s_ref)
        assert rel(o[fo], o_ref[fo]) <= GDN_BOUND and rel(s[fs], s_ref[fs]) <= GDN_BOUND


@pytest.mark.parametrize("U", [1, 2, 3, 4])
@DEFER
def test_fixed_length_short_batch_with_pad_and_fallback(mode, device, U, defer):
    """B = 3 fixed-length sequences of T = 1..3 (K = 12, V = 5, BV = 4: padded K and a partial
    V-block), a pad in the middle, has_initial_state False for the first, g = -90 on a last token and -inf on a
    first token."""
    for T in (1, 2, 3):
        q, k, v, g, beta, st, _, _ = gdn_inputs(5, [T] * 3, K=12, V=5, slots=5, device=device)
        q, k, v, g, beta = (x.reshape(3, T, *x.shape[2:]) for x in (q, k, v, g, beta))
        g = g.clone()
        g[1, -1, :] = -90.0
        g[2, 0, 1] = float("-inf")
        idx = torch.tensor([4, G.PAD_SLOT_ID, 1], dtype=torch.int32, device=device)
        hi = torch.tensor([False, True, True], device=device)
        o_ref, s_ref = gdn_seq_ref(q, k, v, g, beta, st, idx, has_initial_state=hi)
        s = st.clone()
        o = gdn_seq(q, k, v, g, beta, s, idx, KC=4, U=U, BV=4, defer_decay=defer, has_initial_state=hi)
        assert rel(o, o_ref) <= GDN_BOUND and rel(s, s_ref) <= GDN_BOUND, T
        assert torch.equal(o[1], torch.zeros_like(o[1]))
        for j in (0, 2, 3):
            assert torch.equal(s[j], st[j])


@DEFER
def test_out_aliasing_v(mode, device, defer):
    """Out=v (in place) gives the same bits as a separate out, although the fallback now re-reads
    v from memory after earlier outputs of the group were stored (each row's v is read before its o is
    written, and only the same V-block's columns)."""
    for U in (2, 3, 4):
        q, k, v, g, beta, st, idx, cu = gdn_inputs(4, [5, 3, 7], device=device)
        g = g.clone()
        g[0, 12, :] = -70.0
        s1 = st.clone()
        o1 = gdn_seq(q, k, v, g, beta, s1, idx, cu_seqlens=cu, KC=4, U=U, defer_decay=defer)
        v2, s2 = v.clone(), st.clone()
        gdn_seq(q, k, v2, g, beta, s2, idx, cu_seqlens=cu, KC=4, U=U, defer_decay=defer, out=v2)
        assert torch.equal(o1, v2) and torch.equal(s1, s2)


@pytest.mark.parametrize("bad_slot", [-2, 3], ids=["negative", "past-end"])
@DEFER
def test_out_of_range_state_idx_is_skipped_like_a_pad(mode, device, bad_slot, defer):
    """Memory safety, before the fix: a state index outside [0, slots) other than
    pad_slot_id (here -2 with the default pad -1, or == slots) is neither refused nor skipped: the kernel reads
    and writes state + slot * stride(0), i.e. outside the state tensor (with a bare tensor the interpreter run
    aborted with 'munmap_chunk(): invalid pointer'). gdn_seq_ref silently treats -2 as the second-last slot
    (Python indexing). Here state is a view into a padded buffer, so the stray write lands in the padding.
    Expected: ValueError (or the sequence skipped like a pad), and never a write outside ``state``."""
    interp_only(mode)
    q, k, v, g, beta, st, idx, cu = gdn_inputs(3, [3, 4], HV=2, K=8, V=4, slots=3, device=device)
    big = torch.zeros(9, *st.shape[1:], device=device)
    big[3:6] = st
    i = torch.tensor([0, bad_slot], dtype=torch.int32, device=device)
    try:
        gdn_seq(q, k, v, g, beta, big[3:6], i, cu_seqlens=cu, KC=4, U=2, defer_decay=defer)
    except ValueError:
        return
    assert torch.equal(big[:3], torch.zeros_like(big[:3])) and torch.equal(big[6:], torch.zeros_like(big[6:]))


@DEFER
def test_cu_seqlens_past_the_token_count_stay_inside_out(mode, device, defer):
    """Memory safety, before the fix: cu_seqlens whose last offset exceeds the token
    count (here [0, 3, 9] with 7 tokens) is not checked: the kernel reads q/k/v/g/beta and writes o past the
    end of the given tensors (gdn_seq_ref raises IndexError). Inputs and out are views into buffers of twice
    the length, so the stray accesses stay inside an allocation. Expected: ValueError, never a write outside
    ``out``."""
    interp_only(mode)
    q, k, v, g, beta, st, idx, cu = gdn_inputs(4, [3, 4], device=device)
    T = q.shape[1]

    def pad(x):
        b = torch.zeros(1, 2 * T, *x.shape[2:], device=device)
        b[:, :T] = x
        return b[:, :T]

    qv, kv, vv, gv, bv = map(pad, (q, k, v, g, beta))
    ob = torch.full((1, 2 * T, v.shape[2], v.shape[3]), 7.0, device=device)
    bad = torch.tensor([0, 3, 9], dtype=torch.int32, device=device)
    try:
        gdn_seq(qv, kv, vv, gv, bv, st.clone(), idx, cu_seqlens=bad, out=ob[:, :T], KC=4, U=2, defer_decay=defer)
    except ValueError:
        return
    assert (ob[:, T:] == 7.0).all(), "rows past out were written"

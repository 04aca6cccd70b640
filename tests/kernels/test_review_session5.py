"""Fault-injection review of session 5's change (git diff 9e63f49..HEAD):

* gdn_seq's [KC, BV, K/KC] kernel (_gdn_seq_kc_kernel): q/k converted to fp32 as prefetched (_to_f32), 32-bit row
  offsets unless _row_offsets_64, the scaled state's fallback as one plain step a trip of a tl.range loop
  reloading its inputs (_seq_load_clamped, also for a sequence's last partial group), the plain step as the GPU
  default;
* fp8_block_gemm's TMA kernel (_block_gemm_tma_kernel, config kernel="tma"), its host checks and the default's
  fallback.

Tests named ``test_defect_*`` failed on the code as reviewed (24 of them); each docstring says what was wrong and
what is expected, and they pass since the fixes: fp8 config values checked before any launch (_check_config:
GROUP_M, PROGRAMS, BM, ...), float32 scales required, a config without "kernel" tunes the tile kernel where the
default is the TMA one; gdn_seq skips a state index outside [0, slots) like a pad slot and clamps cu_seqlens to
the rows, in the kernel. All other tests are marked "CHECKED, HELD": behaviour that was fault-injected and held.
Small shapes, so the file runs on the CPU under TRITON_INTERPRET=1 (tests/kernels/conftest.py).
"""
from __future__ import annotations

import pytest
import torch

import kernels.fp8.gemm as F
import kernels.gdn.seq as G
from kernels.fp8 import fp8_block_gemm, fp8_block_gemm_ref
from kernels.gdn import gdn_seq, gdn_seq_ref
from tests.kernels.cases import fp8_operands as operands
from tests.kernels.cases import gdn_varlen_inputs

GDN_BOUND = 1e-5      # fp32 against float64, as tests/kernels/test_gdn.py
FP8_BOUND = 6e-3      # bf16 output against float64 under the interpreter, as tests/kernels/test_fp8_tma.py
DEFER = pytest.mark.parametrize("defer", [True, False], ids=["scaled", "plain"])


def rel(out, ref) -> float:
    out, ref = out.double().cpu(), ref.double().cpu()
    den = ref.norm().item()
    return ((out - ref).norm() / den).item() if den else (out - ref).norm().item()


def interp_only(mode):
    if mode != "interp":
        pytest.skip("monkeypatches or memory-unsafe inputs: interpreter only")


# ------------------------------------------------------------------------------------------------------------
# inputs
# ------------------------------------------------------------------------------------------------------------
def gdn_inputs(seed, lens, H=1, HV=2, K=8, V=4, slots=None, device="cpu"):
    """Varlen inputs [1, sum(lens), ...] (tests/kernels/cases.py); unit-norm q and k (well conditioned without
    l2norm); two spare slots by default."""
    return gdn_varlen_inputs(seed, lens, H, HV, K, V, slots or len(lens) + 2, device)


def fp8_operands(seed, M, N, K, device, fmt="e4m3fn"):
    return operands(seed, M, N, K, device, fmt)[1:]


SMALL = dict(BM=16, BN=32, GROUP_M=2, KPI=1, num_warps=4, num_stages=1)


class _NoLaunch:
    """Stands in for a Triton kernel: any launch fails the test (used where the unvalidated launch would write
    out of bounds and could abort the whole pytest process)."""

    def __getitem__(self, grid):
        def launch(*a, **kw):
            raise AssertionError(f"kernel launched (grid {grid}) with GROUP_M={kw.get('GROUP_M')}: "
                                 "expected a ValueError before the launch")
        return launch


# ============================================================================================================
# Defects
# ============================================================================================================
@pytest.mark.parametrize("kernel", ["tile", "tma"])
@pytest.mark.parametrize("group_m", [0, -1])
def test_defect_gemm_group_m_not_positive_refused(mode, device, monkeypatch, kernel, group_m):
    """DEFECT: GROUP_M is never validated. With GROUP_M=0 the swizzle divides by zero (tile // group with
    group = 0): nothing sensible is stored and fp8_block_gemm returns the uninitialised torch.empty output (seen:
    NaN / 1e30-sized garbage, no error) for both the tile and the new TMA kernel. With GROUP_M=-1 the tile kernel
    stores out of bounds: under the interpreter the process aborts ('free(): invalid next size') and the TMA
    kernel returns wrong values. Expected: ValueError naming GROUP_M (a positive int) before any launch, as for
    BN and KPI. The launches are stubbed here so that the current code fails the test instead of corrupting the
    heap."""
    interp_only(mode)
    qa, sa, qb, sb = fp8_operands(3, 33, 64, 256, device)
    monkeypatch.setattr(F, "_block_gemm_kernel", _NoLaunch())
    monkeypatch.setattr(F, "_block_gemm_tma_kernel", _NoLaunch())
    with pytest.raises(ValueError, match="GROUP_M"):
        fp8_block_gemm(qa, sa, qb, sb, config=dict(SMALL, kernel=kernel, GROUP_M=group_m, PROGRAMS=2))


def test_defect_tma_group_m_zero_returns_garbage_silently(mode, device):
    """DEFECT (same cause, a real launch, memory-safe because TMA stores are clipped): kernel='tma' with
    GROUP_M=0 returns without error and the output is not the product (rel error ~1e30 or NaN: the returned
    tensor is mostly torch.empty garbage). Expected: ValueError, or the correct product."""
    interp_only(mode)
    qa, sa, qb, sb = fp8_operands(3, 33, 64, 256, device)
    ref = fp8_block_gemm_ref(qa, sa, qb, sb, torch.float64)
    try:
        c = fp8_block_gemm(qa, sa, qb, sb, config=dict(SMALL, kernel="tma", GROUP_M=0, PROGRAMS=2))
    except ValueError:
        return
    assert torch.isfinite(c).all() and rel(c, ref) < FP8_BOUND, rel(c, ref)


def test_defect_default_tma_breaks_kernel_less_override(mode, device, monkeypatch):
    """DEFECT: on a TMA GPU the default for a pre-quantised prefill is now kernel='tma', and a ``config`` without
    a "kernel" key is merged into it. An override that is valid for the tile kernel (BN=256: the tile kernel
    takes BN a multiple of 128, and session 4's default honoured it) now raises "kernel='tma' needs BN dividing
    128" although the caller never asked for TMA; the commit's contract is that only an *explicit* TMA request
    raises and the default falls back to the tile kernel. Expected: the default falls back to the tile kernel
    (result equal to an explicit kernel='tile' call with the same keys). The GPU's choice is emulated under
    the interpreter (_interpreting -> False for the config choice, tma_supported -> True)."""
    interp_only(mode)
    qa, sa, qb, sb = fp8_operands(4, 128, 256, 256, device)
    monkeypatch.setattr(F, "_interpreting", lambda: False)
    monkeypatch.setattr(F, "tma_supported", lambda dev: True)
    assert F.default_gemm_config(128, 256, 256, tma=True)["kernel"] == "tma"     # what _gemm picks here (CPU
    # tensors: no Gluon kernel)
    expect = fp8_block_gemm(qa, sa, qb, sb, config=dict(F.TILE_DEFAULT, KPI=2, BN=256))
    got = fp8_block_gemm(qa, sa, qb, sb, config=dict(BN=256))                # observed: ValueError
    assert torch.equal(got, expect)


@pytest.mark.parametrize("kernel", ["tile", "tma"])
@pytest.mark.parametrize("which, dtype", [("sa", torch.float64), ("sa", torch.bfloat16), ("sb", torch.float64)],
                         ids=["sa-fp64", "sa-bf16", "sb-fp64"])
def test_defect_gemm_scale_dtype_unchecked(mode, device, kernel, which, dtype):
    """DEFECT (also in the tile kernel, inherited by the TMA kernel): the scale tensors' dtype is never checked
    although fp8_block_gemm documents "fp32" scales and "Raises ValueError for mismatched shapes/dtypes".
    Under the interpreter float64 sa or sb gives a NaN/garbage output and bf16 sa gives inf/1e17-sized values,
    silently (the small_m kernel gets fp64 sa right); on a GPU not run here (fp64 would likely fail to compile
    with a loop-carried fp32/fp64 type error, not a ValueError). Expected: ValueError naming the scale, or the
    right product."""
    interp_only(mode)
    qa, sa, qb, sb = fp8_operands(1, 17, 64, 256, device)
    sa2, sb2 = (sa.to(dtype), sb) if which == "sa" else (sa, sb.to(dtype))
    ref = fp8_block_gemm_ref(qa, sa2, qb, sb2, torch.float64)
    try:
        c = fp8_block_gemm(qa, sa2, qb, sb2, config=dict(SMALL, kernel=kernel, PROGRAMS=3))
    except ValueError:
        return
    assert torch.isfinite(c).all() and rel(c, ref) < FP8_BOUND, rel(c, ref)


@pytest.mark.parametrize("M, cfg, key", [
    (17, dict(SMALL, kernel="tma", PROGRAMS=-2), "PROGRAMS"),      # silently clamped to 1 program
    (17, dict(SMALL, kernel="tma", PROGRAMS=2.5), "PROGRAMS"),     # silently int()-ed to 2
    (17, dict(SMALL, kernel="tma", BM=0), "BM"),                   # ZeroDivisionError from triton.cdiv
    (17, dict(SMALL, kernel="tma", BM=24), "BM"),                  # "Shape element 0 must be a power of 2"
    (0, dict(kernel="bogus"), "kernel"),                           # M = 0: returns an empty tensor
    (0, dict(SMALL, kernel="tma", GROUP_M=0), "GROUP_M"),          # M = 0: returns an empty tensor
], ids=["programs-neg", "programs-float", "bm0", "bm24", "bogus-kernel-m0", "group0-m0"])
def test_defect_tma_bad_tuning_values_refused_naming_the_key(mode, device, M, cfg, key):
    """DEFECT (low): invalid TMA tuning values are accepted silently or fail with an error that does not name
    the key: PROGRAMS <= 0 or non-int is clamped/truncated, BM=0 raises ZeroDivisionError, a BM that is not a
    power of two fails inside TensorDescriptor ('Shape element 0 ...'), and with M = 0 an unknown kernel name or
    GROUP_M=0 is not checked at all (the early return comes before the kernel dispatch). Expected: ValueError
    naming the offending key, whatever M, as BN and KPI already do."""
    interp_only(mode)
    qa, sa, qb, sb = fp8_operands(2, max(M, 1), 64, 256, device)
    qa, sa = qa[:M], sa[:M]
    with pytest.raises(ValueError, match=key):
        fp8_block_gemm(qa, sa, qb, sb, config=cfg)


@pytest.mark.parametrize("bad_slot", [-2, 3], ids=["negative", "past-end"])
@DEFER
def test_defect_gdn_out_of_range_state_idx_writes_outside_state(mode, device, bad_slot, defer):
    """DEFECT (pre-existing, not from this diff; memory safety): a state index outside [0, slots) other than
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
def test_defect_gdn_cu_seqlens_past_token_count_writes_outside_out(mode, device, defer):
    """DEFECT (pre-existing, not from this diff; memory safety): cu_seqlens whose last offset exceeds the token
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


# ============================================================================================================
# CHECKED, HELD: gdn_seq (these pass)
# ============================================================================================================
@pytest.mark.parametrize("lens", [[1], [2], [3], [1, 2, 3], [3, 0, 1], [0, 2, 0, 3], [2, 5, 1]],
                         ids=lambda l: "-".join(map(str, l)))
@pytest.mark.parametrize("U", [1, 2, 3, 4])
@DEFER
def test_held_short_empty_pad_and_no_init_sequences(mode, device, lens, U, defer):
    """CHECKED, HELD: sequences shorter than U (T = 1..3), empty ones (repeated cu offsets), a pad slot (-1)
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
def test_held_non_finite_and_huge_gates_stay_in_their_sequence(mode, device, fault, U, defer):
    """CHECKED, HELD: a fault in sequence 3 (5 tokens: with U = 2..4 its last group is partial, so the new
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
def test_held_fixed_length_short_batch_with_pad_and_fallback(mode, device, U, defer):
    """CHECKED, HELD: B = 3 fixed-length sequences of T = 1..3 (K = 12, V = 5, BV = 4: padded K and a partial
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


def test_held_row_offsets_64_boundaries():
    """CHECKED, HELD: _row_offsets_64 is True exactly when (rows - 1) * max stride >= 2^31 (the largest 32-bit
    product the token loop forms), on both sides of the boundary, for any stride position, rows 0/1 and a
    stride that alone exceeds int32."""
    f = G._row_offsets_64
    assert f(2, (2 ** 31 - 1,)) is False and f(2, (2 ** 31,)) is True
    assert f(3, (1, 2 ** 30, 8)) is True and f(3, (1, 2 ** 30 - 1, 8)) is False
    assert f(2 ** 31, (1,)) is False and f(2 ** 31 + 1, (1,)) is True
    assert f(1, (2 ** 40,)) is False and f(0, (2 ** 40,)) is False
    assert f(2, (0, 0)) is False


@pytest.mark.parametrize("U", [1, 2, 3, 4])
@DEFER
def test_held_strided_views_bit_identical_with_forced_offset_width(mode, device, monkeypatch, U, defer):
    """CHECKED, HELD: q every third row of a bigger tensor, k head-major (transposed), v with padded heads,
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


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("KC", [1, 4, 16])
@DEFER
def test_held_half_inputs_through_to_f32_and_fallback(mode, device, dtype, KC, defer):
    """CHECKED, HELD: bf16/fp16 q, k, v through _to_f32 (the interpreter's .to(fp32) path), l2norm, KC from 1
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


@DEFER
def test_held_out_aliasing_v(mode, device, defer):
    """CHECKED, HELD: out=v (in place) gives the same bits as a separate out, although the fallback now re-reads
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


# ============================================================================================================
# CHECKED, HELD: fp8 TMA kernel (these pass)
# ============================================================================================================
TMA_CASES = {
    "programs=1": (17, 64, 256, dict(SMALL, PROGRAMS=1)),
    "programs>tiles": (17, 64, 256, dict(SMALL, PROGRAMS=1000)),
    "M=1": (1, 64, 256, dict(SMALL, PROGRAMS=3)),
    "M=1 N=16": (1, 16, 256, dict(SMALL, KPI=2, PROGRAMS=2)),
    "N=40": (17, 40, 256, dict(SMALL, PROGRAMS=3)),
    "N=72": (17, 72, 256, dict(SMALL, PROGRAMS=3)),
    "N=8 K=128 kpi2": (17, 8, 128, dict(SMALL, KPI=2, PROGRAMS=2)),
    "K=128 kpi2": (17, 64, 128, dict(SMALL, KPI=2, PROGRAMS=3)),
    "K=384 kpi2": (17, 64, 384, dict(SMALL, KPI=2, PROGRAMS=3)),
    "N=200 BN64 G8": (40, 200, 384, dict(SMALL, BN=64, GROUP_M=8, KPI=2, PROGRAMS=5)),
    "BM32 BN128 G1": (40, 136, 256, dict(SMALL, BM=32, BN=128, GROUP_M=1, PROGRAMS=2)),
    "TMA_DEFAULT tile": (17, 64, 256, dict(F.TMA_DEFAULT)),
}


@pytest.mark.parametrize("case", list(TMA_CASES), ids=list(TMA_CASES))
def test_held_tma_bit_identical_to_tile_on_edge_shapes(mode, device, case):
    """CHECKED, HELD: PROGRAMS 1 and above the tile count, odd M (1, 17), N not a multiple of BN, a single
    K-block with KPI=2, odd K-blocks with KPI=2, the default 128 x 128 tile on a small problem: the TMA kernel
    equals the tile kernel bit for bit and the reference within the bf16 bound."""
    interp_only(mode)
    M, N, K, cfg = TMA_CASES[case]
    qa, sa, qb, sb = fp8_operands(3, M, N, K, device)
    tile_cfg = {k: v for k, v in cfg.items() if k != "PROGRAMS"}
    c_tile = fp8_block_gemm(qa, sa, qb, sb, config=dict(tile_cfg, kernel="tile"))
    c_tma = fp8_block_gemm(qa, sa, qb, sb, config=dict(cfg, kernel="tma"))
    assert torch.equal(c_tma, c_tile)
    assert rel(c_tma, fp8_block_gemm_ref(qa, sa, qb, sb, torch.float64)) < FP8_BOUND


@pytest.mark.parametrize("variant", ["fnuz", "fnuz-b", "colmajor-scales", "strided-sa", "padded-A-rows",
                                     "expanded-A", "fp16", "fp32", "fp64", "M=0"])
def test_held_tma_operand_variants(mode, device, variant):
    """CHECKED, HELD: fnuz operands (both, or B only), column-major sa/sb, a strided sa, A with 16-byte-aligned
    padded rows, an expanded A (row stride 0), fp16/fp32/fp64 outputs, and M = 0: TMA equals tile bit for bit
    (and the reference where it is not empty)."""
    interp_only(mode)
    M, N, K = 17, 64, 256
    fa, fb = {"fnuz": ("e4m3fnuz", "e4m3fnuz"), "fnuz-b": ("e4m3fn", "e4m3fnuz")}.get(variant, ("e4m3fn", "e4m3fn"))
    qa, sa, _, _ = fp8_operands(1, M, N, K, device, fa)
    _, _, qb, sb = fp8_operands(2, M, N, K, device, fb)
    out = {"fp16": torch.float16, "fp32": torch.float32, "fp64": torch.float64}.get(variant, torch.bfloat16)
    if variant == "colmajor-scales":
        sa, sb = sa.t().contiguous().t(), sb.t().contiguous().t()
    elif variant == "strided-sa":
        s2 = torch.zeros(M, 2 * sa.shape[1], device=device)[:, ::2]
        s2.copy_(sa)
        sa = s2
    elif variant == "padded-A-rows":
        big = torch.zeros(M, K + 16, dtype=torch.uint8, device=device)
        big[:, :K] = qa.view(torch.uint8)
        qa = big[:, :K].view(qa.dtype)
    elif variant == "expanded-A":
        qa, sa = qa[:1].expand(M, K), sa[:1].expand(M, -1)
    elif variant == "M=0":
        qa, sa = qa[:0], sa[:0]
    cfg = dict(SMALL, KPI=2, PROGRAMS=3)
    c_tile = fp8_block_gemm(qa, sa, qb, sb, out, config=dict(cfg, kernel="tile"))
    c_tma = fp8_block_gemm(qa, sa, qb, sb, out, config=dict(cfg, kernel="tma"))
    assert c_tma.dtype == out and torch.equal(c_tma, c_tile)
    if qa.shape[0]:
        bound = FP8_BOUND if out == torch.bfloat16 else 1e-3
        assert rel(c_tma, fp8_block_gemm_ref(qa, sa, qb, sb, torch.float64)) < bound


def test_held_tma_layout_refusals_and_unknown_kernel(mode, device):
    """CHECKED, HELD: an explicit kernel='tma' on A with a non-16-byte row stride, A or B at a misaligned base
    raises ValueError naming the operand (the tile kernel still computes them); BN not dividing 128 is refused;
    an unknown kernel name (M > 0) raises ValueError listing the kernels."""
    interp_only(mode)
    M, N, K = 17, 64, 256
    qa, sa, qb, sb = fp8_operands(1, M, N, K, device)
    big = torch.zeros(M, K + 8, dtype=torch.uint8, device=device)
    big[:, :K] = qa.view(torch.uint8)
    qa_rows = big[:, :K].view(qa.dtype)
    flat = torch.zeros(M * K + 8, dtype=torch.uint8, device=device)
    qa_base = flat[8:].view(M, K)
    qa_base.copy_(qa.view(torch.uint8))
    qa_base = qa_base.view(qa.dtype)
    flat_b = torch.zeros(N * K + 8, dtype=torch.uint8, device=device)
    qb_base = flat_b[8:].view(N, K)
    qb_base.copy_(qb.view(torch.uint8))
    qb_base = qb_base.view(qb.dtype)
    ref = fp8_block_gemm_ref(qa, sa, qb, sb, torch.float64)
    for a_, b_, name in ((qa_rows, qb, "a"), (qa_base, qb, "a"), (qa, qb_base, "b")):
        with pytest.raises(ValueError, match=f"{name} needs a 16-byte aligned"):
            fp8_block_gemm(a_, sa, b_, sb, config=dict(SMALL, kernel="tma"))
        assert rel(fp8_block_gemm(a_, sa, b_, sb, config=dict(SMALL, kernel="tile")), ref) < FP8_BOUND
    with pytest.raises(ValueError, match="BN"):
        fp8_block_gemm(qa, sa, qb, sb, config=dict(SMALL, kernel="tma", BN=48))
    for bad in ("bogus", "TMA", None):
        with pytest.raises(ValueError, match="unknown kernel"):
            fp8_block_gemm(qa, sa, qb, sb, config=dict(kernel=bad))

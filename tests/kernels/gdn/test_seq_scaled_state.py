"""gdn_seq's [KC, BV, K/KC] kernel on the scaled state (``defer_decay=True``, an option; the plain step is the
default): the state held as c * X with each token's exp(g) multiplied into the scalar c; a group of U tokens whose
running scale leaves [2^-24, 2^24] (or a sequence's last, partial group) runs plain steps instead, and c is
folded into X at a group's start when it is outside [2^-12, 2^12] (kernels/gdn/seq.py, _seq_step_kc_fast,
_seq_step_kc_plain). These gates drive both paths and the switch between them, the thresholds on both sides,
long sequences, large values under strong decay, bf16, and the bool-only ``defer_decay``."""
from __future__ import annotations

import math

import pytest
import torch

from kernels.gdn import gdn_seq, gdn_seq_ref
from tests.kernels.cases import check_gdn_seq, gdn_small_varlen, rel


BOUND = 1e-5  # fp32 against float64, as tests/kernels/gdn/test_seq.py


def inputs(seed, lens, H=2, HV=4, K=32, V=16, slots=5, device="cpu"):
    gen = torch.Generator().manual_seed(seed)
    T = sum(lens)
    q = torch.randn(1, T, H, K, generator=gen)
    k = torch.randn(1, T, H, K, generator=gen)
    v = torch.randn(1, T, HV, V, generator=gen)
    g = -(torch.rand(1, T, HV, generator=gen) * 0.5 + 0.01)
    beta = torch.rand(1, T, HV, generator=gen) * 0.98 + 0.01
    state = torch.randn(slots, HV, V, K, generator=gen) * 0.5
    cu = torch.tensor([0] + torch.tensor(lens).cumsum(0).tolist(), dtype=torch.int32)
    idx = torch.randperm(slots, generator=gen)[:len(lens)].to(torch.int32)
    return [x.to(device) for x in (q, k, v, g, beta, state, idx, cu)]


# Each rewrites g [1, T, HV]; the comment says which path the scaled-state kernel takes.
GATES = {
    "mild": lambda g: g,                                             # every group on the scaled state
    "g=-30": lambda g: torch.full_like(g, -30.0),                    # exp(-30) < 2^-24: every group plain
    "g=+1.5": lambda g: torch.full_like(g, 1.5),                     # c passes 2^12: folded every 2nd group
    "every 7th g=-50": lambda g: g.index_fill(1, torch.arange(0, g.shape[1], 7, device=g.device), -50.0),
    "every 9th g=-inf": lambda g: g.index_fill(1, torch.arange(3, g.shape[1], 9, device=g.device), float("-inf")),
    "g=-4": lambda g: torch.full_like(g, -4.0),                      # a group's scale leaves 2^-24: plain
    "alternating +-20": lambda g: torch.where(torch.arange(g.shape[1], device=g.device)[None, :, None] % 2 == 0,
                                              20.0, -20.0).expand_as(g).contiguous(),
}


@pytest.mark.parametrize("gate", list(GATES), ids=list(GATES))
@pytest.mark.parametrize("defer", [dict(defer_decay=True), dict(defer_decay=False)], ids=["scaled", "plain"])
@pytest.mark.parametrize("l2norm", [True, False], ids=["l2norm", "prenorm"])
def test_kc_kernel_matches_reference_whatever_the_gates(mode, device, gate, defer, l2norm):
    lens = [1, 5, 23, 4, 30]
    q, k, v, g, beta, st, idx, cu = inputs(7, lens, device=device)
    g = GATES[gate](g)
    if not l2norm:
        q = q / q.norm(dim=-1, keepdim=True)
        k = k / k.norm(dim=-1, keepdim=True)
    o_ref, s_ref = gdn_seq_ref(q, k, v, g, beta, st, idx, cu, use_qk_l2norm=l2norm)
    out = gdn_seq(q, k, v, g, beta, st, idx, cu_seqlens=cu, use_qk_l2norm=l2norm, KC=4, **defer)
    assert torch.isfinite(out).all()
    assert rel(out, o_ref) <= BOUND, rel(out, o_ref)
    assert rel(st, s_ref) <= BOUND, rel(st, s_ref)


@pytest.mark.parametrize("U", [1, 2, 3, 4, 8])  # 3: the output block is padded to 4 (GPU arange)
def test_kc_scaled_state_any_group_size_and_split_calls(mode, device, U):
    """One call over 29 tokens equals the reference and, within the fp32 bound, 29 one-token calls (each call
    restarts the scale at 1), with plain groups in the middle (g = -50 at tokens 6 and 17)."""
    q, k, v, g, beta, st, idx, cu = inputs(11, [29], device=device)
    g[0, [6, 17]] = -50.0
    s_one, s_split = st.clone(), st.clone()
    o_ref, s_ref = gdn_seq_ref(q, k, v, g, beta, st, idx, cu)
    out = gdn_seq(q, k, v, g, beta, s_one, idx, cu_seqlens=cu, KC=4, U=U, defer_decay=True)
    assert rel(out, o_ref) <= BOUND and rel(s_one, s_ref) <= BOUND
    outs = [gdn_seq(q[:, t:t + 1], k[:, t:t + 1], v[:, t:t + 1], g[:, t:t + 1], beta[:, t:t + 1], s_split, idx,
                    KC=4, U=U, defer_decay=True) for t in range(29)]
    assert rel(torch.cat(outs, 1), out) <= BOUND and rel(s_split, s_one) <= BOUND


def test_kc_scaled_state_nan_gate_stays_in_its_sequence(mode, device):
    """A NaN decay in one sequence: that sequence's outputs from there on and its slot go NaN (as in the
    reference); the other sequences and slots are bit-identical to the clean run."""
    lens = [9, 14, 6]
    q, k, v, g, beta, st, idx, cu = inputs(3, lens, device=device)
    s_clean, s_bad = st.clone(), st.clone()
    o_clean = gdn_seq(q, k, v, g, beta, s_clean, idx, cu_seqlens=cu, KC=4, defer_decay=True)
    gb = g.clone()
    gb[0, 9 + 5, 1] = float("nan")                                  # sequence 1, token 5, value head 1
    o_bad = gdn_seq(q, k, v, gb, beta, s_bad, idx, cu_seqlens=cu, KC=4, defer_decay=True)
    assert torch.equal(o_bad[:, :9], o_clean[:, :9]) and torch.equal(o_bad[:, 23:], o_clean[:, 23:])
    assert torch.isnan(o_bad[0, 14:23, 1]).all()
    assert torch.equal(o_bad[0, 9:23, [0, 2, 3]], o_clean[0, 9:23, [0, 2, 3]])
    slot1 = int(idx[1])
    for s in range(st.shape[0]):
        if s != slot1:
            assert torch.equal(s_bad[s], s_clean[s]), s
    assert torch.isnan(s_bad[slot1, 1]).any()


DEFER = pytest.mark.parametrize("defer", [True, False], ids=["scaled", "plain"])


THRESHOLD_GATES = {
    "g=-inf at 0,5,13": lambda g: g.index_fill(1, torch.tensor([0, 5, 13], device=g.device), float("-inf")),
    "g=-inf everywhere": lambda g: torch.full_like(g, float("-inf")),
    "g=-100": lambda g: torch.full_like(g, -100.0),
    "g=+20 once": lambda g: g.index_fill(1, torch.tensor([6], device=g.device), 20.0),
    "g=0": lambda g: torch.zeros_like(g),
    "c at 2^-40 (g=-10ln2)": lambda g: torch.full_like(g, -10 * math.log(2)),
    "c at 2^-40 (g=-20ln2)": lambda g: torch.full_like(g, -20 * math.log(2)),
    "growth past 2^40 (g=+2.5ln2)": lambda g: torch.full_like(g, 2.5 * math.log(2)),
    "just past 2^-40": lambda g: torch.full_like(g, -10 * math.log(2) - 1e-3),
    "just within 2^-40": lambda g: torch.full_like(g, -10 * math.log(2) + 1e-3),
    # the fixed thresholds: a group starts folded outside [2^-12, 2^12], runs scaled within [2^-24, 2^24]
    "fold at 2^-12 (g=-3ln2)": lambda g: torch.full_like(g, -3 * math.log(2)),
    "group edge 2^-24 (g=-6ln2)": lambda g: torch.full_like(g, -6 * math.log(2)),
    "just past 2^-24 (g=-6ln2-1e-3)": lambda g: torch.full_like(g, -6 * math.log(2) - 1e-3),
    "fold at 2^12 (g=+3ln2)": lambda g: torch.full_like(g, 3 * math.log(2)),
}


@pytest.mark.parametrize("gate", list(THRESHOLD_GATES), ids=list(THRESHOLD_GATES))
@pytest.mark.parametrize("U", [1, 3, 4, 5])
@DEFER
def test_gates_and_scale_thresholds_match_reference(mode, device, gate, U, defer):
    q, k, v, g, beta, st, idx, cu = gdn_small_varlen(1, [1, 17], device=device)
    g = THRESHOLD_GATES[gate](g)
    check_gdn_seq(q, k, v, g, beta, st, idx, cu, KC=4, U=U, defer_decay=defer)


@pytest.mark.parametrize("U", [4, 8])
def test_long_sequence_scale_drift(mode, device, U):
    """1200 tokens with g = -0.02 (c stays on the scaled path for ~1380 tokens: no restart) and with
    g = -2e-3, one head, K = V = 4: the products in c do not drift past the fp32 bound."""
    for gv in (-0.02, -2e-3):
        q, k, v, g, beta, st, idx, cu = gdn_small_varlen(2, [1200], H=1, HV=1, K=4, V=4, device=device)
        g = torch.full_like(g, gv)
        check_gdn_seq(q, k, v, g, beta, st, idx, cu, KC=4, U=U, defer_decay=True)


def test_scaled_state_keeps_large_values_finite_under_decay(mode, device):
    """_seq_step_kc_fast keeps X = S / c, so with c near its 2^-40 floor X ~ |S| * 2^40: any |v| above
    ~3e26 (fp32 max / 2^40) at c = 2^-40, representable and handled by the plain step (defer_decay=False) and by the
    reference, overflows X to inf and the outputs/state to inf/NaN. Here g = -0.68 per token (c falls to
    e^-27.2 = 1.5e-12 over 40 tokens, within [2^-40, 2^40], so every group stays on the scaled state) and v, S0 ~ 1e28."""
    q, k, v, g, beta, st, idx, cu = gdn_small_varlen(5, [40], H=1, HV=1, K=8, V=4, device=device)
    g = torch.full_like(g, -0.68)
    v = v * 1e28
    st = st * 1e28
    check_gdn_seq(q, k, v, g, beta, st, idx, cu, KC=4, defer_decay=False)   # the plain step: exact
    check_gdn_seq(q, k, v, g, beta, st, idx, cu, KC=4, defer_decay=True)    # before the fix: non-finite


@pytest.mark.parametrize("state_dtype", [torch.float32, torch.bfloat16])
def test_bf16_inputs_and_state_on_both_steps(mode, device, state_dtype):
    """bf16 q/k/v/g/beta (and state): both KC paths within bf16 rounding of the reference run on the same
    bf16 values, and of each other."""
    q, k, v, g, beta, st, idx, cu = gdn_small_varlen(9, [7, 13], device=device)
    q, k, v, g, beta = (x.bfloat16() for x in (q, k, v, g, beta))
    st = st.to(state_dtype)
    o_ref, s_ref = gdn_seq_ref(q, k, v, g, beta, st, idx, cu)
    res = []
    for defer in (True, False):
        s = st.clone()
        out = gdn_seq(q, k, v, g, beta, s, idx, cu_seqlens=cu, KC=4, U=3, defer_decay=defer)
        assert out.dtype == torch.bfloat16 and s.dtype == state_dtype
        assert rel(out, o_ref) <= 1e-2 and rel(s, s_ref) <= 1e-2
        res.append((out, s))
    assert rel(res[0][0], res[1][0]) <= 1e-2 and rel(res[0][1], res[1][1]) <= 1e-2


@pytest.mark.parametrize("defer", [True, False, None])
def test_defer_decay_bools_accepted_and_agree(mode, device, defer):
    q, k, v, g, beta, st, idx, cu = gdn_small_varlen(12, [5, 8], device=device)
    check_gdn_seq(q, k, v, g, beta, st, idx, cu, KC=4, defer_decay=defer)

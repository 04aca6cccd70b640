"""gdn_seq's [KC, BV, K/KC] kernel on the scaled state (defer_decay=True; the GPU default in session 4, an
option since session 5): the state is held as c * X with each token's exp(g) multiplied into the scalar c, and
a group of U tokens whose running scale leaves [2^-24, 2^24] (or a sequence's last, partial group) runs plain
steps instead, and c is folded into X at a group's start when it is outside [2^-12, 2^12] (kernels/gdn.py,
_gdn_seq_kc_kernel). These gates drive both
paths and the switch between them with gates that push c out of range (large |g|, g = -inf, growth g > 0),
against the float64 reference, on the CPU through Triton's interpreter and at the same shapes on a GPU.
"""
from __future__ import annotations

import pytest
import torch

from kernels.gdn import gdn_seq, gdn_seq_ref

BOUND = 1e-5  # fp32 against float64, as tests/kernels/test_gdn.py


def rel(out, ref) -> float:
    out, ref = out.double().cpu(), ref.double().cpu()
    return ((out - ref).norm() / ref.norm()).item()


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

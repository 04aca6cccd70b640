"""Review of kernels/gdn.py gdn_seq's variants ([KC, BV, K/KC] state block, one-token lookahead) at edge
shapes: K not a power of two, KC = 1 and KC = padded K, V smaller than / not a multiple of BV, empty sequences
(with and without initial state), pad slots, U not dividing T, grouped heads; and KC validation."""
from __future__ import annotations

import pytest
import torch

from kernels.gdn import gdn_seq, gdn_seq_ref


def _inputs(gen, device, H=1, HV=2, K=8, V=4, lens=(3, 0, 5)):
    T, N = sum(lens), len(lens)
    q = torch.randn(1, T, H, K, generator=gen)
    k = torch.randn(1, T, H, K, generator=gen)
    v = torch.randn(1, T, HV, V, generator=gen)
    g = -(torch.rand(1, T, HV, generator=gen) * 0.5 + 0.01)
    beta = torch.rand(1, T, HV, generator=gen) * 0.98 + 0.01
    state = torch.randn(N + 2, HV, V, K, generator=gen) * 0.5
    idx = torch.arange(N, dtype=torch.int32) + 1
    cu = torch.tensor([0] + torch.tensor(lens).cumsum(0).tolist(), dtype=torch.int32)
    return [t.to(device) for t in (q, k, v, g, beta, state, idx, cu)]


CASES = [
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


@pytest.mark.parametrize("name,kw,shape", CASES, ids=[c[0] for c in CASES])
def test_variant_edges_match_reference(mode, device, gen, name, kw, shape):
    q, k, v, g, b, state, idx, cu = _inputs(gen, device, **shape)
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


@pytest.mark.parametrize("KC", [3, -4, 6, 32])
def test_invalid_kc_is_refused(mode, device, gen, KC):
    q, k, v, g, b, state, idx, cu = _inputs(gen, device)   # K = 8
    with pytest.raises(ValueError):
        gdn_seq(q, k, v, g, b, state, idx, cu_seqlens=cu, KC=KC)


def test_kc_with_lookahead_is_refused(mode, device, gen):
    q, k, v, g, b, state, idx, cu = _inputs(gen, device)
    before = state.clone()
    with pytest.raises(ValueError):
        gdn_seq(q, k, v, g, b, state, idx, cu_seqlens=cu, KC=2, lookahead=True)
    assert torch.equal(state, before)

"""How gdn_seq's [KC, BV, K/KC] kernel reads its token inputs (session 5): q and k converted to fp32 as they are
prefetched, by inline PTX on NVIDIA (kernels/gdn.py, _to_f32), and 32-bit row offsets in the token loop unless
a sequence's rows times a row stride can reach 2^31 (_row_offsets_64). Both are speed changes only: these
gates hold the results bit-identical to the other form, and the 64-bit form correct past 2^31 elements.
"""
from __future__ import annotations

import pytest
import torch

import kernels.gdn.seq as G
from kernels.gdn import gdn_seq, gdn_seq_ref

BOUND = 1e-5  # fp32 against float64, as tests/kernels/test_gdn.py


def rel(out, ref) -> float:
    out, ref = out.double().cpu(), ref.double().cpu()
    return ((out - ref).norm() / ref.norm()).item()


def test_row_offsets_64_threshold():
    """True exactly when (rows - 1) * the largest stride reaches 2^31: the largest 32-bit offset the loop forms
    is (a sequence's last row) x (its row stride)."""
    assert G._row_offsets_64(1025, (2 ** 21, 8)) is True          # 1024 * 2^21 = 2^31
    assert G._row_offsets_64(1025, (2 ** 21 - 1, 8)) is False
    assert G._row_offsets_64(1024, (2 ** 21, 8)) is False
    assert G._row_offsets_64(0, (2 ** 40,)) is False
    assert G._row_offsets_64(1, (2 ** 40,)) is False               # one row: offset 0 only
    assert G._row_offsets_64(3, (1, 2 ** 30)) is True


def _inputs(device, dtype, lens=(7, 1, 19), H=2, HV=4, K=32, V=16, slots=4, seed=5):
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
    q, k, v, g, beta, st, idx, cu = _inputs(device, dtype)
    s32, s64 = st.clone(), st.clone()
    o32 = gdn_seq(q, k, v, g, beta, s32, idx, cu_seqlens=cu, use_qk_l2norm=True, KC=4, defer_decay=defer)
    monkeypatch.setattr(G, "_row_offsets_64", lambda rows, strides: True)
    o64 = gdn_seq(q, k, v, g, beta, s64, idx, cu_seqlens=cu, use_qk_l2norm=True, KC=4, defer_decay=defer)
    assert torch.equal(o32, o64) and torch.equal(s32, s64)
    o_ref, s_ref = gdn_seq_ref(q, k, v, g, beta, st, idx, cu, use_qk_l2norm=True)
    bound = BOUND if dtype == torch.float32 else 3e-3  # bf16 o: rounded once, <= 2^-9 an element (test_gdn)
    assert rel(o32, o_ref) <= bound and rel(s32, s_ref) <= BOUND


@pytest.mark.gpu
@pytest.mark.skipif(not (torch.cuda.is_available() and not G._interpreting()), reason="needs a CUDA GPU")
@pytest.mark.parametrize("defer", [True, False], ids=["scaled", "plain"])
def test_ptx_conversion_matches_triton_conversion_gpu(monkeypatch, defer):
    """bf16 q, k converted by inline PTX (the GPU default) against Triton's own conversion: both within the
    bf16 bound of the float64 reference, o within the bf16 bound and the state within the fp32 bound of each
    other. q and k are L2-normalised (without the norm these inputs grow the state to ~4e7). Not asserted
    bit-identical: the scaled kernel's two builds were seen to differ in the last bits (their fp32 code is
    scheduled differently)."""
    q, k, v, g, beta, st, idx, cu = _inputs("cuda", torch.bfloat16, lens=(45, 3, 16), H=4, HV=8, K=128, V=128)
    s_ptx, s_tri = st.clone(), st.clone()
    assert G._use_ptx(q)
    o_ptx = gdn_seq(q, k, v, g, beta, s_ptx, idx, cu_seqlens=cu, use_qk_l2norm=True, KC=4, defer_decay=defer)
    monkeypatch.setattr(G, "_use_ptx", lambda x: False)
    o_tri = gdn_seq(q, k, v, g, beta, s_tri, idx, cu_seqlens=cu, use_qk_l2norm=True, KC=4, defer_decay=defer)
    o_ref, s_ref = gdn_seq_ref(q, k, v, g, beta, st, idx, cu, use_qk_l2norm=True)
    for o, s in ((o_ptx, s_ptx), (o_tri, s_tri)):
        assert rel(o, o_ref) <= 3e-3 and rel(s, s_ref) <= BOUND
    assert rel(o_ptx, o_tri) <= 3e-3 and rel(s_ptx, s_tri) <= BOUND


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

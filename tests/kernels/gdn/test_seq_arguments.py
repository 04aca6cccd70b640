"""gdn_seq's argument checks: every tuning value (BV, U, num_warps, KC, chunk, lookahead, defer_decay,
num_stages, chunk_precision) and every index tensor is checked before any launch and before the early return of
an empty batch, so that a bad one raises ValueError naming itself whatever the data, never a silently wrong or
uninitialised result."""
from __future__ import annotations

import pytest
import torch

from kernels.gdn import gdn_seq
from tests.kernels.cases import gdn_fixed_inputs, gdn_gen_inputs, gdn_small_varlen


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


@pytest.mark.parametrize("bad", [8, 24, True, False, -16, 16.0, "16"])
def test_chunk_bad_values_are_refused_naming_chunk(device, bad):
    q, k, v, g, beta, st = gdn_fixed_inputs(T=4, device=device)
    idx = torch.zeros(1, dtype=torch.int32, device=device)
    with pytest.raises(ValueError, match="chunk"):
        gdn_seq(q, k, v, g, beta, st, idx, chunk=bad)


@pytest.mark.parametrize("kw, msg", [(dict(chunk=16, BV=8), "BV >= 16"), (dict(chunk=16, BV=0), "BV"),
                                     (dict(chunk=16, num_stages=-1), "num_stages"),
                                     (dict(chunk=16, num_stages=2.0), "num_stages"),
                                     (dict(chunk=16, chunk_precision="IEEE"), "chunk_precision"),
                                     (dict(chunk=16, KC=4), "not combined"),
                                     (dict(chunk=16, lookahead=True), "not combined")])
def test_chunk_bad_tuning_is_refused(device, kw, msg):
    q, k, v, g, beta, st = gdn_fixed_inputs(T=4, device=device)
    idx = torch.zeros(1, dtype=torch.int32, device=device)
    with pytest.raises(ValueError, match=msg):
        gdn_seq(q, k, v, g, beta, st, idx, **kw)


@pytest.mark.parametrize("chunk", [64, 128])
def test_chunk_larger_than_32_refused(mode, device, chunk):
    """chunk=64 / 128 were accepted and are exact under the interpreter, but the sm_90 build spills (~26k
    local loads/stores at 64) or does not finish compiling (128): gdn_seq now takes 16 or 32 only."""
    q, k, v, g, beta, st = gdn_fixed_inputs(T=chunk + 9, device=device)
    idx = torch.tensor([2], dtype=torch.int32, device=device)
    with pytest.raises(ValueError, match="16 or 32"):
        gdn_seq(q, k, v, g, beta, st, idx, use_qk_l2norm=True, chunk=chunk)


@pytest.mark.parametrize("kw", [dict(chunk=8), dict(chunk=-1), dict(KC=3), dict(chunk=16, BV=4)],
                         ids=["chunk8", "chunk-1", "KC3", "chunk16_BV4"])
def test_tuning_arguments_checked_for_an_empty_batch(device, kw):
    """gdn_seq returned before validating chunk / KC / BV when the batch had no sequence (N == 0), so the same
    bad argument raised or not depending on the data (a batch that happens to be empty)."""
    q, k, v, g, beta, st = gdn_fixed_inputs(T=0, device=device)
    cu = torch.zeros(1, dtype=torch.int32, device=device)
    idx = torch.empty(0, dtype=torch.int32, device=device)
    with pytest.raises(ValueError):
        gdn_seq(q, k, v, g, beta, st, idx, cu_seqlens=cu, **kw)


@pytest.mark.parametrize("kw, V, arg", [(dict(chunk=0, BV=24), 64, "BV"), (dict(chunk=16, BV=24), 64, "BV"),
                                        (dict(chunk=0, KC=0, BV=-4), 16, "BV"), (dict(chunk=0, U=-1), 16, "U")],
                         ids=["token_BV24", "chunk_BV24", "BV-4", "U-1"])
def test_bad_bv_or_u_refused(mode, device, kw, V, arg):
    """BV must be a power of two (tl.arange) and positive, U positive. Before: BV=24 failed inside Triton with
    "arange's range must be a power of 2" (no argument named); BV=-4 and U=-1 raised nothing and returned
    uninitialised outputs with the state not advanced."""
    q, k, v, g, beta, st = gdn_fixed_inputs(T=8, V=V, device=device)
    idx = torch.zeros(1, dtype=torch.int32, device=device)
    with pytest.raises(ValueError, match=arg):
        gdn_seq(q, k, v, g, beta, st, idx, **kw)


@pytest.mark.parametrize("chunk", [0, 16])
def test_has_initial_state_shape_checked(mode, device, chunk):
    """has_initial_state must be [N]; a shorter one was read past its end (here a view into a longer tensor,
    so the read stays in memory: its hidden True made the kernel load slot 1's state)."""
    q, k, v, g, beta, st = gdn_fixed_inputs(T=20, device=device)
    cu = torch.tensor([0, 10, 20], dtype=torch.int32, device=device)
    idx = torch.tensor([0, 1], dtype=torch.int32, device=device)
    hi = torch.tensor([False, True], device=device)[:1]
    with pytest.raises(ValueError, match="has_initial_state"):
        gdn_seq(q, k, v, g, beta, st, idx, cu_seqlens=cu, has_initial_state=hi, chunk=chunk)


@pytest.mark.parametrize("which", ["state_idx", "cu_seqlens"])
def test_index_tensors_of_float_dtype_refused(mode, device, which):
    """state_idx and cu_seqlens are integer tensors; float ones were silently truncated by the kernel's
    .to(int) (state_idx = [0.9] ran on slot 0). A dtype check is free (no sync)."""
    q, k, v, g, beta, st = gdn_fixed_inputs(T=20, device=device)
    cu = torch.tensor([0, 10, 20], dtype=torch.int32, device=device)
    idx = torch.tensor([0, 1], dtype=torch.int32, device=device)
    if which == "state_idx":
        idx = idx.float() + 0.9
    else:
        cu = cu.float()
    with pytest.raises(ValueError, match=which):
        gdn_seq(q, k, v, g, beta, st, idx, cu_seqlens=cu)


@pytest.mark.parametrize("KC", [3, -4, 6, 32])
def test_invalid_kc_is_refused(mode, device, gen, KC):
    q, k, v, g, b, state, idx, cu = gdn_gen_inputs(gen, device)   # K = 8
    with pytest.raises(ValueError):
        gdn_seq(q, k, v, g, b, state, idx, cu_seqlens=cu, KC=KC)


def test_kc_with_lookahead_is_refused(mode, device, gen):
    q, k, v, g, b, state, idx, cu = gdn_gen_inputs(gen, device)
    before = state.clone()
    with pytest.raises(ValueError):
        gdn_seq(q, k, v, g, b, state, idx, cu_seqlens=cu, KC=2, lookahead=True)
    assert torch.equal(state, before)


@pytest.mark.parametrize("kw, msg", [
    (dict(KC=4, lookahead=True), "lookahead"),
    (dict(KC=3), "KC"),
    (dict(KC=32), "KC"),            # BK = 16
    (dict(KC=-4), "KC"),
    (dict(KC=4.0), "KC"),
    (dict(KC=True), "KC"),
    (dict(KC=4, U=0), "U"),
    (dict(KC=4, U=2.0), "U"),
    (dict(KC=4, BV=3), "BV"),
    (dict(KC=4, chunk=16), "chunk"),
])
def test_kc_bad_arguments_refused(mode, device, kw, msg):
    q, k, v, g, beta, st, idx, cu = gdn_small_varlen(0, [3], device=device)
    with pytest.raises(ValueError, match=msg):
        gdn_seq(q, k, v, g, beta, st, idx, cu_seqlens=cu, **kw)


@pytest.mark.parametrize("bad", ["no", "False", 2, 0.0, "yes"])
def test_defer_decay_non_bool_refused(mode, device, bad):
    """defer_decay is taken through bool() unchecked: defer_decay="False" or "no" silently runs the scaled
    state (bool of a non-empty string is True), 2 or 0.0 are accepted; every other flag-like tuning value
    (KC, chunk, BV, U) raises ValueError naming itself."""
    q, k, v, g, beta, st, idx, cu = gdn_small_varlen(0, [3], device=device)
    with pytest.raises(ValueError, match="defer_decay"):
        gdn_seq(q, k, v, g, beta, st, idx, cu_seqlens=cu, KC=4, defer_decay=bad)


@pytest.mark.parametrize("kw", [dict(KC=0, defer_decay=True), dict(chunk=16, defer_decay=False)],
                         ids=["KC0", "chunk"])
def test_defer_decay_without_the_kc_kernel_refused(mode, device, kw):
    """defer_decay is documented as an option of the KC kernel; with KC=0 or chunk given explicitly it is
    silently ignored, whereas lookahead/chunk/KC combinations that cannot apply raise ValueError."""
    q, k, v, g, beta, st, idx, cu = gdn_small_varlen(0, [3], device=device)
    with pytest.raises(ValueError, match="defer_decay"):
        gdn_seq(q, k, v, g, beta, st, idx, cu_seqlens=cu, **kw)

"""Inputs and checks shared by the kernel gates (CPU tensors built from a seeded generator, then moved to the device,
so a seed gives the same values on the CPU and a GPU)."""
from __future__ import annotations

import torch

import kernels.fp8 as F


def gdn_varlen_inputs(seed: int, lens, H: int, HV: int, K: int, V: int, slots: int, device):
    """gdn_seq inputs for a varlen batch of sequences of ``lens`` tokens: q, k ``[1, T, H, K]`` fp32 unit-norm
    (well conditioned without use_qk_l2norm), v ``[1, T, HV, V]``, g ``[1, T, HV]`` in [-0.51, -0.01], beta in
    [0.01, 0.99], state ``[slots, HV, V, K]`` (N(0, 0.25)), state_idx ``[N]`` int32 (distinct random slots,
    slots >= N), cu_seqlens ``[N+1]`` int32. Returns [q, k, v, g, beta, state, state_idx, cu_seqlens]."""
    gen = torch.Generator().manual_seed(seed)
    T = sum(lens)
    q = torch.randn(1, T, H, K, generator=gen)
    k = torch.randn(1, T, H, K, generator=gen)
    q = q / q.norm(dim=-1, keepdim=True)
    k = k / k.norm(dim=-1, keepdim=True)
    v = torch.randn(1, T, HV, V, generator=gen)
    g = -(torch.rand(1, T, HV, generator=gen) * 0.5 + 0.01)
    beta = torch.rand(1, T, HV, generator=gen) * 0.98 + 0.01
    state = torch.randn(slots, HV, V, K, generator=gen) * 0.5
    cu = torch.tensor([0] + torch.tensor(lens, dtype=torch.int64).cumsum(0).tolist(), dtype=torch.int32)
    idx = torch.randperm(slots, generator=gen)[:len(lens)].to(torch.int32)
    return [x.to(device) for x in (q, k, v, g, beta, state, idx, cu)]


def fp8_operands(seed: int, M: int, N: int, K: int, device, fmt: str = "e4m3fn"):
    """A block-scaled GEMM's operands: x ``[M, K]`` fp32 with row magnitudes over 4 decades, quantised per token
    and group of 128 (qa ``[M, K]`` fp8, sa ``[M, K/128]`` fp32), and a weight ``[N, K]`` (N(0, 0.05^2))
    quantised per 128x128 block (qb, sb ``[ceil(N/128), K/128]``), by the references of kernels/fp8/reference.py in
    ``fmt``. Returns (x, qa, sa, qb, sb) on ``device``."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(M, K, generator=gen) * 10.0 ** (torch.rand(M, 1, generator=gen) * 4 - 2)
    w = torch.randn(N, K, generator=gen) * 0.05
    qa, sa = F.fp8_quant_group_ref(x.to(device), fmt)
    qb, sb = F.fp8_quant_block_weight_ref(w.to(device), fmt)
    return x.to(device), qa, sa, qb, sb


def rel(out: torch.Tensor, ref: torch.Tensor) -> float:
    """Relative Frobenius error of ``out`` against ``ref``, in float64 on the CPU (the absolute error where ref is
    all zeros)."""
    out, ref = out.double().cpu(), ref.double().cpu()
    den = ref.norm().item()
    return ((out - ref).norm() / den).item() if den else (out - ref).norm().item()


def interp_only(mode: str) -> None:
    """Skip a test that monkeypatches kernel internals or feeds memory-unsafe inputs: interpreter only."""
    import pytest

    if mode != "interp":
        pytest.skip("monkeypatches or memory-unsafe inputs: interpreter only")


def gdn_fixed_inputs(seed=0, T=32, H=1, HV=2, K=16, V=16, B=1, slots=3, device="cpu", dtype=torch.float32):
    """gdn_seq inputs for B sequences of T tokens (no cu_seqlens): q, k, v standard normal (not normalised), g in
    [-0.51, -0.01], beta in [0.01, 0.99], state ``[slots, HV, V, K]`` N(0, 0.25) fp32. Returns
    (q, k, v, g, beta, state)."""
    g0 = torch.Generator().manual_seed(seed)
    q = torch.randn(B, T, H, K, generator=g0)
    k = torch.randn(B, T, H, K, generator=g0)
    v = torch.randn(B, T, HV, V, generator=g0)
    g = -(torch.rand(B, T, HV, generator=g0) * 0.5 + 0.01)
    beta = torch.rand(B, T, HV, generator=g0) * 0.98 + 0.01
    state = torch.randn(slots, HV, V, K, generator=g0) * 0.5
    q, k, v, g, beta = (x.to(device=device, dtype=dtype) for x in (q, k, v, g, beta))
    return q, k, v, g, beta, state.to(device)


def gdn_small_varlen(seed, lens, H=1, HV=2, K=16, V=8, slots=None, device="cpu"):
    """:func:`gdn_varlen_inputs` at small heads: keys and queries unit-norm (so use_qk_l2norm is not needed), one
    spare slot by default."""
    return gdn_varlen_inputs(seed, lens, H, HV, K, V, slots or len(lens) + 1, device)


def check_gdn_seq(q, k, v, g, beta, st, idx, cu=None, bound=1e-5, **kw):
    """gdn_seq (on a copy of st) against gdn_seq_ref within ``bound`` (fp32 against float64), outputs and state
    finite; returns (out, new state)."""
    from kernels.gdn import gdn_seq, gdn_seq_ref

    ref_kw = {n: kw[n] for n in ("scale", "use_qk_l2norm", "has_initial_state") if n in kw}
    o_ref, s_ref = gdn_seq_ref(q, k, v, g, beta, st, idx, cu, **ref_kw)
    s = st.clone()
    out = gdn_seq(q, k, v, g, beta, s, idx, cu_seqlens=cu, **kw)
    assert torch.isfinite(out).all() and torch.isfinite(s).all()
    assert rel(out, o_ref) <= bound, rel(out, o_ref)
    assert rel(s, s_ref) <= bound, rel(s, s_ref)
    return out, s


def gdn_gen_inputs(gen, device, H=1, HV=2, K=8, V=4, lens=(3, 0, 5)):
    """Varlen gdn_seq inputs from the test's generator: q, k, v standard normal, N + 2 slots, sequence n on slot
    n + 1. Returns [q, k, v, g, beta, state, state_idx, cu_seqlens]."""
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

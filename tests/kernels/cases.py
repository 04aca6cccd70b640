"""Random inputs shared by the kernel gates (CPU tensors built from a seeded generator, then moved to the device,
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
    quantised per 128x128 block (qb, sb ``[ceil(N/128), K/128]``), by the references of kernels/fp8.py in
    ``fmt``. Returns (x, qa, sa, qb, sb) on ``device``."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(M, K, generator=gen) * 10.0 ** (torch.rand(M, 1, generator=gen) * 4 - 2)
    w = torch.randn(N, K, generator=gen) * 0.05
    qa, sa = F.fp8_quant_group_ref(x.to(device), fmt)
    qb, sb = F.fp8_quant_block_weight_ref(w.to(device), fmt)
    return x.to(device), qa, sa, qb, sb

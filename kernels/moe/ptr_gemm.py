"""The MoE grouped GEMM over a per-expert pointer table: vLLM's ``fused_moe_kernel`` arithmetic (the same program
to tile mapping, K-loop order, fp32 accumulation, block-fp8 scaling, routed-weight product and one final rounding)
with each expert's weights (and block scales) found through ``table[e]``, an int64 element offset from the slot
buffer: a slot in device memory or the expert in pinned host memory, which the GPU reads zero-copy over the bus
(UVA). Offsets from a pointer argument, rather than addresses cast to pointers, keep the weights' loads as wide as
vLLM's (the argument's alignment is known to the compiler; a cast address's is not). The expert cache's plan
writes the table every step (kernels/moe/cache.py, ``read="through"``), so a missed expert needs no device room.

Formula and tiling follow vllm/model_executor/layers/fused_moe/fused_moe.py (``fused_moe_kernel``, vLLM 0.32) for
the formats the cache serves: 16-bit / fp32 weights and fp8 w8a8 with block scales (``group_n``, ``group_k`` > 0),
with and without vLLM's ``SWAP_AB`` layout, aligned or naive block assignment. Given the same config (block
sizes, ``GROUP_SIZE_M``, warps, stages) the result is bit-identical to vLLM's kernel on all-resident weights
(tests/kernels/moe/test_ptr_gemm.py). Not covered (the caller keeps vLLM's kernel there): int8, int4, per-channel
or per-tensor fp8, expert biases, vLLM's tensor-descriptor path.
"""
from __future__ import annotations

from typing import Any

import torch

try:
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover
    triton = None
    tl = None

#: the weight dtypes the kernel serves (torch -> Triton)
_TL = {}
if tl is not None:
    _TL = {torch.float16: tl.float16, torch.bfloat16: tl.bfloat16, torch.float32: tl.float32,
           torch.float8_e4m3fn: tl.float8e4nv}

if triton is not None:

    @triton.jit
    def _zeros_out(c_ptr, stride_cm, stride_cn, pid_n, N, offs_token, token_mask,
                   BLOCK_SIZE_M: tl.constexpr, BLOCK_SIZE_N: tl.constexpr, compute_type: tl.constexpr):
        # a block of an expert with id -1 (not on this rank) writes zeros, as vLLM's kernel does
        acc = tl.zeros((BLOCK_SIZE_M, BLOCK_SIZE_N), dtype=compute_type)
        offs_cn = pid_n * BLOCK_SIZE_N + tl.arange(0, BLOCK_SIZE_N)
        c_ptrs = c_ptr + stride_cm * offs_token[:, None] + stride_cn * offs_cn[None, :]
        tl.store(c_ptrs, acc, mask=token_mask[:, None] & (offs_cn[None, :] < N))

    @triton.jit
    def _ptr_moe_kernel(a_ptr, b_ptr, b_tab, c_ptr, a_scale_ptr, bs_ptr, bs_tab, topk_weights_ptr, sorted_token_ids_ptr,
                        expert_ids_ptr, num_tokens_post_padded_ptr,
                        N, K, EM, num_valid_tokens,
                        stride_am, stride_ak, stride_bk, stride_bn, stride_cm, stride_cn, stride_asm, stride_ask,
                        stride_bsk, stride_bsn,
                        group_n: tl.constexpr, group_k: tl.constexpr, naive_block_assignment: tl.constexpr,
                        BLOCK_SIZE_M: tl.constexpr, BLOCK_SIZE_N: tl.constexpr, BLOCK_SIZE_K: tl.constexpr,
                        GROUP_SIZE_M: tl.constexpr, SPLIT_K: tl.constexpr, MUL_ROUTED_WEIGHT: tl.constexpr,
                        top_k: tl.constexpr, compute_type: tl.constexpr,
                        FP8_BLOCK: tl.constexpr, SWAP_AB: tl.constexpr, ALIGN16: tl.constexpr):
        # A [M, K] (row = token), C [M, top_k, N] (strides cm over (token, choice) rows, cn), B of expert e at
        # b_ptr + b_tab[e] (elements): [N, K] with strides bn, bk; its block scales at bs_ptr + bs_tab[e]:
        # [N / group_n, K / group_k]
        pid = tl.program_id(axis=0)
        num_pid_m = tl.cdiv(EM, BLOCK_SIZE_M)
        num_pid_n = tl.cdiv(N, BLOCK_SIZE_N)
        num_pid_in_group = GROUP_SIZE_M * num_pid_n
        group_id = pid // num_pid_in_group
        first_pid_m = group_id * GROUP_SIZE_M
        group_size_m = min(num_pid_m - first_pid_m, GROUP_SIZE_M)
        pid_m = first_pid_m + ((pid % num_pid_in_group) % group_size_m)
        pid_n = (pid % num_pid_in_group) // group_size_m
        offs = tl.arange(0, BLOCK_SIZE_M).to(tl.int64)
        ntp = tl.load(num_tokens_post_padded_ptr)
        if pid_m * BLOCK_SIZE_M >= ntp:
            return
        if naive_block_assignment:
            offs_token = tl.where(offs == 0, pid_m, num_valid_tokens)
        else:
            offs_token = tl.load(sorted_token_ids_ptr + pid_m * BLOCK_SIZE_M + offs)
        offs_token = offs_token.to(tl.int64)
        token_mask = offs_token < num_valid_tokens
        expert = tl.load(expert_ids_ptr + pid_m).to(tl.int64)
        if expert == -1:
            _zeros_out(c_ptr, stride_cm, stride_cn, pid_n, N, offs_token, token_mask, BLOCK_SIZE_M, BLOCK_SIZE_N,
                       compute_type)
            return
        b_off = tl.load(b_tab + expert)  # a slot, or the host store (UVA)
        if ALIGN16:  # every table entry a multiple of 16 elements (the caller's word): vector loads, as vLLM's
            b_off = tl.multiple_of(b_off, 16)
        b_base = b_ptr + b_off
        offs_bn = (pid_n * BLOCK_SIZE_N + tl.arange(0, BLOCK_SIZE_N).to(tl.int64)) % N
        offs_k = tl.arange(0, BLOCK_SIZE_K)
        if SWAP_AB:
            a_ptrs = a_ptr + (offs_k[:, None] * stride_ak + offs_token[None, :] // top_k * stride_am)
            b_ptrs = b_base + (offs_bn[:, None] * stride_bn + offs_k[None, :] * stride_bk)
        else:
            a_ptrs = a_ptr + (offs_token[:, None] // top_k * stride_am + offs_k[None, :] * stride_ak)
            b_ptrs = b_base + (offs_k[:, None] * stride_bk + offs_bn[None, :] * stride_bn)
        if FP8_BLOCK:
            bs_off = tl.load(bs_tab + expert)
            if ALIGN16:
                bs_off = tl.multiple_of(bs_off, 16)
            bs_base = bs_ptr + bs_off
            a_scale_ptrs = a_scale_ptr + (offs_token // top_k) * stride_asm
            b_scale_ptrs = bs_base + (offs_bn // group_n) * stride_bsn
        if SWAP_AB:
            acc = tl.zeros((BLOCK_SIZE_N, BLOCK_SIZE_M), dtype=tl.float32)
        else:
            acc = tl.zeros((BLOCK_SIZE_M, BLOCK_SIZE_N), dtype=tl.float32)
        for k in range(0, tl.cdiv(K, BLOCK_SIZE_K)):
            if SWAP_AB:
                a = tl.load(a_ptrs, mask=(offs_k[:, None] < K - k * BLOCK_SIZE_K) & token_mask[None, :], other=0.0)
                b = tl.load(b_ptrs, mask=offs_k[None, :] < K - k * BLOCK_SIZE_K, other=0.0)
            else:
                a = tl.load(a_ptrs, mask=token_mask[:, None] & (offs_k[None, :] < K - k * BLOCK_SIZE_K), other=0.0)
                b = tl.load(b_ptrs, mask=offs_k[:, None] < K - k * BLOCK_SIZE_K, other=0.0)
            if FP8_BLOCK:
                ks = (k * BLOCK_SIZE_K) // group_k
                a_scale = tl.load(a_scale_ptrs + ks * stride_ask, mask=token_mask, other=0.0)
                b_scale = tl.load(b_scale_ptrs + ks * stride_bsk)
                if SWAP_AB:
                    acc += tl.dot(b, a) * b_scale[:, None] * a_scale[None, :]
                else:
                    acc += tl.dot(a, b) * a_scale[:, None] * b_scale[None, :]
            else:
                acc += tl.dot(a, b)
            a_ptrs += BLOCK_SIZE_K * stride_ak
            b_ptrs += BLOCK_SIZE_K * stride_bk
        if SWAP_AB:
            acc = tl.trans(acc, (1, 0))
        if MUL_ROUTED_WEIGHT:
            w = tl.load(topk_weights_ptr + offs_token, mask=token_mask, other=0)
            acc *= w[:, None]
        out = acc.to(compute_type)
        offs_cn = pid_n * BLOCK_SIZE_N + tl.arange(0, BLOCK_SIZE_N)
        c_ptrs = c_ptr + stride_cm * offs_token[:, None] + stride_cn * offs_cn[None, :]
        tl.store(c_ptrs, out, mask=token_mask[:, None] & (offs_cn[None, :] < N))


def supports(use_fp8_w8a8: bool, use_int8_w8a8: bool, use_int8_w8a16: bool, use_int4_w4a16: bool,
             per_channel_quant: bool, block_shape: list[int] | None, has_bias: bool) -> str | None:
    """None when :func:`invoke_ptr_moe` computes this configuration of vLLM's kernel, else why not."""
    if use_int8_w8a8 or use_int8_w8a16 or use_int4_w4a16:
        return "int8 / int4 weights"
    if use_fp8_w8a8 and (per_channel_quant or not block_shape or not (block_shape[0] > 0 and block_shape[1] > 0)):
        return "fp8 scales per channel or per tensor (the pointer table carries block scales)"
    if has_bias:
        return "expert biases"
    return None


def invoke_ptr_moe(A: torch.Tensor, B: torch.Tensor, b_table: torch.Tensor, C: torch.Tensor,
                   A_scale: torch.Tensor | None, B_scale: torch.Tensor | None, bs_table: torch.Tensor | None,
                   topk_weights: torch.Tensor | None, sorted_token_ids: torch.Tensor | None,
                   expert_ids: torch.Tensor, num_tokens_post_padded: torch.Tensor, mul_routed_weight: bool,
                   top_k: int, config: dict[str, Any], compute_type: Any, use_fp8_w8a8: bool,
                   block_shape: list[int] | None, swap_ab: bool, aligned16: bool = False) -> None:
    """One MoE GEMM: ``C[t, j] = A[t // top_k-row] @ W[e].T`` (times ``topk_weights`` when ``mul_routed_weight``)
    for the (token, choice) rows that ``sorted_token_ids`` / ``expert_ids`` (vLLM's ``moe_align_block_size``, or
    None for its naive assignment) give each expert ``e``, reading ``W[e]`` at ``b_table[e]``.

    Args:
        A: ``[M, K]`` activations (fp8 with ``A_scale [M, K / group_k]`` fp32 for block fp8).
        B: the tensor the table's offsets are from, whose per-expert layout the experts share (``[*, N, K]``,
            last dim contiguous; the cache's slot buffer ``weights[i]``): its address, dtype, N, K and strides.
        b_table: ``[E]`` int64: expert e's ``[N, K]`` weights at ``B.data_ptr() + b_table[e] * element size``.
        C: ``[M, top_k, N]`` output (``compute_type``).
        B_scale / bs_table: for block fp8: the scales' slot buffer ``[*, N / gn, K / gk]`` fp32 and ``[E]``
            int64 element offsets of each expert's scales from it; else None.
        config: vLLM's tile config (``BLOCK_SIZE_M/N/K``, ``GROUP_SIZE_M``, ``num_warps``, ``num_stages``, ...),
            as vLLM's ``invoke_fused_moe_triton_kernel`` receives it; ``compute_type``: a Triton dtype.
        swap_ab: vLLM's ``enable_swap_ab(BLOCK_SIZE_M, BLOCK_SIZE_N)`` for fp8 (the caller decides, as vLLM).
        aligned16: every offset in both tables is a multiple of 16 elements (``ExpertCache.aligned16``): the
            compiler may then vectorise the weights' loads as it does for vLLM's.
    Raises:
        ValueError: a table that is not int64 on A's device, or a B dtype without a Triton type here.
    """
    if b_table.dtype != torch.int64 or b_table.device != A.device:
        raise ValueError(f"b_table must be int64 on {A.device}, got {b_table.dtype} on {b_table.device}")
    if B.dtype not in _TL:
        raise ValueError(f"weights of dtype {B.dtype}: the pointer table serves {sorted(map(str, _TL))}")
    fp8_block = bool(use_fp8_w8a8)
    if fp8_block and (bs_table is None or B_scale is None or A_scale is None or not block_shape):
        raise ValueError("block fp8 needs A_scale, B_scale, bs_table and block_shape")
    M = A.size(0)
    num_tokens = M * top_k
    if sorted_token_ids is not None:
        EM = sorted_token_ids.size(0)
        if M < config["BLOCK_SIZE_M"]:
            EM = min(EM, M * top_k * config["BLOCK_SIZE_M"])  # vLLM's small-batch bound on the blocks
    else:
        EM = num_tokens * config["BLOCK_SIZE_M"]
    N = B.size(-2)
    cfg = dict(config)
    cfg["SPLIT_K"] = 1
    BK = cfg.pop("BLOCK_SIZE_K")
    if block_shape is not None:
        BK = min(BK, min(block_shape[0], block_shape[1]))
    grid = (triton.cdiv(EM, cfg["BLOCK_SIZE_M"]) * triton.cdiv(N, cfg["BLOCK_SIZE_N"]),)
    two = A_scale is not None and A_scale.dim() == 2
    _ptr_moe_kernel[grid](
        A, B, b_table, C, A_scale if fp8_block else None, B_scale if fp8_block else None,
        bs_table if fp8_block else None, topk_weights,
        sorted_token_ids, expert_ids, num_tokens_post_padded,
        N, B.size(-1), EM, num_tokens,
        A.stride(0), A.stride(1), B.stride(-1), B.stride(-2), C.stride(1), C.stride(2),
        A_scale.stride(0) if fp8_block and two else 0, A_scale.stride(1) if fp8_block and two else 0,
        B_scale.stride(-1) if fp8_block else 0, B_scale.stride(-2) if fp8_block else 0,
        group_n=block_shape[0] if fp8_block else 0, group_k=block_shape[1] if fp8_block else 0,
        naive_block_assignment=sorted_token_ids is None, BLOCK_SIZE_K=BK, MUL_ROUTED_WEIGHT=mul_routed_weight,
        top_k=top_k, compute_type=compute_type, FP8_BLOCK=fp8_block,
        SWAP_AB=bool(swap_ab) and fp8_block, ALIGN16=bool(aligned16), **cfg)

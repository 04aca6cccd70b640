"""The expert-cache dispatch (r9k/ops/moe.py) on vLLM's CPU experts kernel: bit-identical to vLLM's own path, the
chunk and staging boundaries, the knobs' errors, the load summary.

The experts object is a stand-in whose ``apply`` *is* vLLM's ``CPUUnquantizedExperts.apply`` (the function, with
its real signature, calling the real ``cpu_fused_moe``) and whose ``process_weights_after_loading`` repacks with
vLLM's ``cpu_prepack_moe_weight`` as vLLM's does; building vLLM's own class needs a whole FusedMoEConfig, and the
server test (tests/validate/test_cpu_moe.py) runs the real one.
"""
from __future__ import annotations

import logging

import pytest
import torch

cpu_moe = pytest.importorskip("vllm.model_executor.layers.fused_moe.experts.cpu_moe")
from vllm._custom_ops import cpu_prepack_moe_weight  # noqa: E402
from vllm.model_executor.layers.fused_moe.activation import MoEActivation  # noqa: E402
from vllm.model_executor.utils import replace_parameter  # noqa: E402

from r9k import counters  # noqa: E402
from r9k.ops import moe  # noqa: E402

pytestmark = pytest.mark.timeout(240)

E, H, I, K = 16, 256, 128, 4


def _isas():
    out = [(torch.float32, "vec"), (torch.bfloat16, "vec")]
    if torch.cpu._is_amx_tile_supported() and torch._C._cpu._init_amx():
        out.append((torch.bfloat16, "amx"))
    return out


ISAS = _isas()


class Experts:
    """vLLM's CPU unquantized experts without their FusedMoEConfig: the real apply, the real repack."""

    isa = "vec"

    def __init__(self, isa: str):
        self.isa = isa
        self._use_zentorch = False
        self.w1_bias = None
        self.w2_bias = None

    def process_weights_after_loading(self, layer):
        replace_parameter(layer, "w13_weight", cpu_prepack_moe_weight(layer.w13_weight, self.isa))
        replace_parameter(layer, "w2_weight", cpu_prepack_moe_weight(layer.w2_weight, self.isa))

    apply = cpu_moe.CPUUnquantizedExperts.apply


def _layer(dtype, seed=0, name="model.layers.0.mlp.experts"):
    g = torch.Generator().manual_seed(seed)
    layer = torch.nn.Module()
    layer.w13_weight = torch.nn.Parameter((torch.randn(E, 2 * I, H, generator=g) * 0.05).to(dtype), requires_grad=False)
    layer.w2_weight = torch.nn.Parameter((torch.randn(E, H, I, generator=g) * 0.05).to(dtype), requires_grad=False)
    layer.layer_name, layer.top_k, layer.expert_map = name, K, None
    layer.quant_method = object()
    return layer


def _steps(dtype, n_steps, seed=1, sizes=(1, 3, 8, 1, 1, 24, 2, 1)):
    g = torch.Generator().manual_seed(seed)
    out = []
    for i in range(n_steps):
        T = sizes[i % len(sizes)]
        x = torch.randn(T, H, generator=g).to(dtype)
        logits = torch.randn(T, E, generator=g)
        tw, ti = torch.topk(torch.softmax(logits, -1), K)
        out.append((x, tw.float(), ti.to(torch.int32)))
    return out


def _run(experts, layer, x, tw, ti):
    out = torch.empty_like(x)
    experts.apply(out, x, layer.w13_weight, layer.w2_weight, tw, ti, MoEActivation.SILU, E, None, None, None,
                  None, None, None, False)
    return out


@pytest.fixture
def install(monkeypatch):
    """install(**knobs) -> the stand-in experts class with the dispatch on it; uninstalled afterwards."""
    classes = []

    def go(**env):
        for k, v in env.items():
            monkeypatch.setenv(k, str(v))
        cls = type("Experts", (Experts,), {})
        installed = moe.install(experts_cls=cls)
        classes.append(cls)
        return cls, installed

    n0 = len(moe.STATE.layers)
    yield go
    moe.uninstall()
    del moe.STATE.layers[n0:]
    moe.STATE.passed.clear()


def _stock(dtype, isa, steps):
    ref = Experts(isa)
    layer = _layer(dtype)
    ref.process_weights_after_loading(layer)
    return [_run(ref, layer, *s) for s in steps]


@pytest.mark.parametrize("dtype,isa", ISAS, ids=[f"{d}-{i}".replace("torch.", "") for d, i in ISAS])
@pytest.mark.parametrize("slots,staging", [(4, -1), (4, 4), (8, -1), (16, -1), (16, 4)])
def test_bit_identical_to_vllm_experts(install, dtype, isa, slots, staging):
    steps = _steps(dtype, 24)
    want = _stock(dtype, isa, steps)
    cls, installed = install(R9K_MOE_CACHE_SLOTS=slots, R9K_MOE_CACHE_STAGING=staging, R9K_MOE_CACHE_STATS=0)
    assert installed == [f"moe_cache <- {cls.__module__}.{cls.__qualname__}.apply"]
    experts, layer = cls(isa), _layer(dtype)
    experts.process_weights_after_loading(layer)
    entry = experts._r9k_moe
    stage = max(K, E - slots) if staging == -1 else staging
    # the layer's expert tensors are the cache's slot buffers; the host store holds the packed experts
    assert layer.w13_weight.shape[0] == slots + stage and layer.w13_weight.data_ptr() == entry.cache.weights[0].data_ptr()
    assert entry.cache.host[0].shape[0] == E
    for s, w in zip(steps, want):
        got = _run(experts, layer, *s)
        assert torch.equal(got, w)
    c = entry.counters()
    assert c["steps"] == len(steps) and c["routed"] == sum(s[2].numel() for s in steps)
    assert c["hits"] + c["misses"] == c["distinct"] and c["inserts"] + c["read_through"] <= c["misses"]
    assert c["bytes"] >= (c["inserts"] + c["read_through"]) * entry.expert_bytes > 0
    if slots == K:  # every step routes >= k distinct experts > 0.99 * k: nothing is ever inserted
        assert c["inserts"] == 0 and c["read_through"] == c["misses"] == c["distinct"]
        assert c["over_thresh"] == c["steps"]
    elif slots < E:
        assert c["misses"] > c["inserts"] > 0 and c["evictions"] > 0 and c["read_through"] > 0
    else:  # all experts fit: misses only until each was inserted once, or on steps over the threshold
        assert 0 < c["inserts"] <= E and c["evictions"] == 0
    # a step whose read-through misses exceed the staging slots is served in chunks (test_chunk_boundary_at_staging
    # pins the boundary): at 4 slots nothing is resident, so 24-token steps (up to 16 distinct) need them
    assert c["chunks"] >= c["steps"]
    if slots == K:
        assert c["chunks"] > c["steps"]


def test_chunk_boundary_at_staging(install):
    """A step whose read-through misses are exactly the staging slots is one chunk; one more makes two."""
    cls, _ = install(R9K_MOE_CACHE_SLOTS=4, R9K_MOE_CACHE_STAGING=8, R9K_MOE_CACHE_THRESH=0.0, R9K_MOE_CACHE_STATS=0)
    dtype, isa = torch.float32, "vec"
    experts, layer = cls(isa), _layer(dtype)
    experts.process_weights_after_loading(layer)
    ref = Experts(isa)
    rl = _layer(dtype)
    ref.process_weights_after_loading(rl)
    cache = experts._r9k_moe.cache
    x = torch.randn(4, H).to(dtype)
    tw = torch.full((4, K), 0.25)
    for ids, chunks in (([[0, 1, 2, 3], [4, 5, 6, 7]], 1), ([[0, 1, 2, 3], [4, 5, 6, 7], [8, 1, 2, 3]], 2),
                        ([[8, 9, 10, 11], [12, 13, 14, 15], [0, 1, 2, 3], [4, 5, 6, 7]], 2)):
        ti = torch.tensor(ids, dtype=torch.int32)
        before = cache.stats.chunks
        got = _run(experts, layer, x[: len(ids)], tw[: len(ids)], ti)
        assert cache.stats.chunks - before == chunks
        assert torch.equal(got, _run(ref, rl, x[: len(ids)], tw[: len(ids)], ti))
    # threshold 0: nothing ever inserted, every miss read through
    assert cache.stats.inserts == 0 and cache.stats.read_through == 8 + 9 + 16


def test_token_bound_blocks(install, monkeypatch):
    """A step of more tokens than the cache's bound is served in blocks of the bound, bit-identically."""
    monkeypatch.setattr(moe, "_max_tokens", lambda: 5)
    cls, _ = install(R9K_MOE_CACHE_SLOTS=4, R9K_MOE_CACHE_STATS=0)
    experts, layer = cls("vec"), _layer(torch.float32)
    experts.process_weights_after_loading(layer)
    steps = _steps(torch.float32, 4, sizes=(12, 5, 6, 1))
    want = _stock(torch.float32, "vec", steps)
    for s, w in zip(steps, want):
        assert torch.equal(_run(experts, layer, *s), w)
    assert experts._r9k_moe.cache.stats.steps == 3 + 1 + 2 + 1


def test_compiled_call_is_the_custom_op(install):
    """Under torch.compile the dispatch is torch.ops.r9k.moe_cache_experts: same outputs as eager and stock."""
    cls, _ = install(R9K_MOE_CACHE_SLOTS=4, R9K_MOE_CACHE_STATS=0)
    experts, layer = cls("vec"), _layer(torch.float32)
    experts.process_weights_after_loading(layer)
    steps = _steps(torch.float32, 3, sizes=(3,))
    want = _stock(torch.float32, "vec", steps)

    def step(x, tw, ti):
        return _run(experts, layer, x * 1.0, tw, ti)

    fn = torch.compile(step, backend="eager", fullgraph=True)
    for s, w in zip(steps, want):
        assert torch.equal(fn(*s), w)
    assert experts._r9k_moe.cache.stats.steps == 3


def test_stock_installs_nothing(install):
    cls, installed = install(R9K_MOE_CACHE_SLOTS=0)
    assert installed == [] and cls.apply is Experts.apply
    experts, layer = cls("vec"), _layer(torch.float32)
    experts.process_weights_after_loading(layer)
    assert not hasattr(experts, "_r9k_moe") and layer.w13_weight.shape[0] == E


@pytest.mark.parametrize("env,msg", [
    ({"R9K_MOE_CACHE_SLOTS": 17}, "R9K_MOE_CACHE_SLOTS=17: MoE layer model.layers.0.mlp.experts has 16 experts"),
    ({"R9K_MOE_CACHE_SLOTS": 3}, "R9K_MOE_CACHE_SLOTS=3: MoE layer model.layers.0.mlp.experts routes each token to 4"),
    ({"R9K_MOE_CACHE_SLOTS": 8, "R9K_MOE_CACHE_STAGING": 2}, "R9K_MOE_CACHE_STAGING=2: MoE layer"),
])
def test_knob_values_the_layer_refuses(install, env, msg):
    cls, _ = install(**env)
    experts = cls("vec")
    with pytest.raises(ValueError) as e:
        experts.process_weights_after_loading(_layer(torch.float32))
    assert str(e.value).startswith(msg)


@pytest.mark.parametrize("env,msg", [
    ({"R9K_MOE_CACHE_STAGING": "0"}, "R9K_MOE_CACHE_STAGING='0': must be -1"),
    ({"R9K_MOE_CACHE_STAGING": "-2"}, "R9K_MOE_CACHE_STAGING='-2': must be -1"),
    ({"R9K_MOE_CACHE_SLOTS": "-1"}, "R9K_MOE_CACHE_SLOTS='-1': must be 0"),
    ({"R9K_MOE_CACHE_THRESH": "1.5"}, "R9K_MOE_CACHE_THRESH='1.5': must be in [0, 1]"),
    ({"R9K_MOE_CACHE_STATS_SEC": "-1"}, "R9K_MOE_CACHE_STATS_SEC='-1': must be >= 0"),
    ({"R9K_MOE_CACHE_SLOTS": "four"}, "R9K_MOE_CACHE_SLOTS='four': not a valid int"),
])
def test_knob_values_the_registry_refuses(env, msg):
    from r9k.knobs import check_env

    problems = check_env(env)
    assert list(problems) == list(env) and problems[next(iter(env))].startswith(msg)


def test_model_without_moe_layer_fails_naming_the_knob(install):
    install(R9K_MOE_CACHE_SLOTS=4)
    dense = torch.nn.Sequential(torch.nn.Linear(4, 4))
    with pytest.raises(ValueError, match=r"^R9K_MOE_CACHE_SLOTS=4 asks for r9k's expert cache, but the model has no MoE"):
        moe.summary(dense)


def test_summary_line_counts_taken_and_passed_layers(install, caplog):
    cls, _ = install(R9K_MOE_CACHE_SLOTS=8)
    model = torch.nn.Module()
    model.a, model.b = _layer(torch.float32, name="l.0"), _layer(torch.float32, name="l.1")
    model.b.w13_bias = torch.nn.Parameter(torch.zeros(E, 2 * I), requires_grad=False)
    n0 = len(moe.STATE.layers)
    for lay in (model.a, model.b):
        cls("vec").process_weights_after_loading(lay)
    with caplog.at_level(logging.INFO, logger="r9k"):
        text = moe.summary(model, n0)
    s = counters.parse(text).summaries
    assert len(s) == 1 and (s[0].layers, s[0].moe_layers, s[0].slots) == (1, 2, 8)
    assert model.b.w13_weight.shape[0] == E  # the biased layer kept vLLM's experts
    assert moe.STATE.passed == {"expert biases (indexed by expert id inside the kernel; the cache moves weights only)": 1}


def test_real_vllm_signature_binds():
    sig = moe.signature(cpu_moe.CPUUnquantizedExperts)
    assert list(sig.parameters)[:7] == ["self", "output", "hidden_states", "w1", "w2", "topk_weights", "topk_ids"]

    class NoIds:
        def apply(self, output, hidden_states, w1, w2, topk_weights, activation, apply_router_weight_on_input):
            pass

    with pytest.raises(moe.SignatureMismatch, match="topk_ids"):
        moe.signature(NoIds)


def test_vllm_repack_is_per_expert():
    """The host store may hold vLLM's packed tensor: expert e of the packed [E, ...] is the packed expert e."""
    for dtype, isa in ISAS:
        w = (torch.randn(E, 2 * I, H) * 0.05).to(dtype)
        packed = cpu_prepack_moe_weight(w, isa)
        assert not torch.equal(packed, w) or isa == "vec"
        for e in (0, 7, 15):
            assert torch.equal(packed[e], cpu_prepack_moe_weight(w[e:e + 1].contiguous(), isa)[0])

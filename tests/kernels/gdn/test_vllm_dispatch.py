"""Routing of r9k.ops.gdn on the CPU, against stand-in vLLM modules (no model, no server) whose functions carry the
signatures of vLLM's real ones (read from the installed vLLM with inspect.signature; skipped without vLLM).

Under TRITON_INTERPRET=1 (set by conftest.py where there is no GPU) the dispatch routes CPU tensors, so the
routed calls really run gdn_seq / gdn_conv through the interpreter and are checked against the references.
vLLM's own layer code runs in test_vllm_layer.py.
"""
from __future__ import annotations

import importlib
import importlib.util
import inspect
import logging
import types

import pytest
import torch

from kernels._util import _interpreting
from kernels.gdn import gdn_conv_ref, gdn_seq_ref
from r9k.ops import gdn as dispatch

pytestmark = [
    pytest.mark.skipif(not _interpreting(),
                       reason="routes CPU tensors through the kernels: needs TRITON_INTERPRET=1"),
    pytest.mark.skipif(importlib.util.find_spec("vllm") is None,
                       reason="the stand-ins take their signatures from vLLM's module: vLLM is not installed"),
]


@pytest.fixture
def gen() -> torch.Generator:
    g = torch.Generator()
    seed = g.seed()
    print(f"seed={seed}")
    return g


def _real():
    return importlib.import_module(dispatch.QWEN_MODULE)


class _CustomOp:  # vLLM's CustomOp: forward() calls the backend method chosen at construction
    def __call__(self, *args, **kwargs):
        return self.forward(*args, **kwargs)

    def forward(self, *args, **kwargs):
        return self._forward_method(*args, **kwargs)


def _with_signature(fn, real):
    fn.__signature__ = inspect.signature(real)
    return fn


def make_fake_qwen():
    """A module with ChunkGatedDeltaRule (forward_native), causal_conv1d_fn and a layer class whose warm-up calls
    the op, each with the real vLLM function's signature; the stock bodies only count their calls."""
    real = _real()
    mod = types.ModuleType("fake_vllm_qwen_gdn")
    calls = {"core": 0, "conv": 0, "warm": 0}

    class ChunkGatedDeltaRule(_CustomOp):
        def __init__(self):
            self._forward_method = self.forward_native

        def forward_native(self, *args, **kwargs):
            calls["core"] += 1
            return "stock-core", None

    _with_signature(ChunkGatedDeltaRule.forward_native, real.ChunkGatedDeltaRule.forward_native)

    def causal_conv1d_fn(*args, **kwargs):
        calls["conv"] += 1
        return "stock-conv"

    class QwenGatedDeltaNetAttention:
        def __init__(self, op):
            self.chunk_gated_delta_rule = op

        def _warmup_prefill_kernels(self, core_args):
            calls["warm"] += 1
            return self.chunk_gated_delta_rule(**core_args)

    mod.ChunkGatedDeltaRule = ChunkGatedDeltaRule
    mod.causal_conv1d_fn = _with_signature(causal_conv1d_fn, real.causal_conv1d_fn)
    mod.QwenGatedDeltaNetAttention = QwenGatedDeltaNetAttention
    return mod, calls


@pytest.fixture
def fake(monkeypatch):
    mod, calls = make_fake_qwen()
    yield mod, calls
    dispatch.uninstall()


@pytest.fixture
def counted(monkeypatch) -> list:
    """The (dispatch, route) of each call the dispatch counts (r9k.calls.count_args), in order."""
    out: list = []
    monkeypatch.setattr(dispatch.calls, "count_args", lambda d, r, a, k: out.append((d, r)))
    return out


def core_args(gen, T, N=2, H=2, HV=4, K=16, V=16, device="cpu"):
    lens = [T // 2, T - T // 2][:N]
    q = torch.nn.functional.normalize(torch.randn(1, T, H, K, generator=gen), dim=-1).to(device)
    k = torch.nn.functional.normalize(torch.randn(1, T, H, K, generator=gen), dim=-1).to(device)
    v = torch.randn(1, T, HV, V, generator=gen).to(device)
    g = -torch.rand(1, T, HV, generator=gen).to(device) * 0.4
    beta = torch.rand(1, T, HV, generator=gen).to(device)
    h0 = torch.randn(N, HV, V, K, generator=gen).to(device)
    cu = torch.tensor([0, lens[0], T], dtype=torch.int32, device=device)
    return dict(q=q, k=k, v=v, g=g, beta=beta, initial_state=h0, output_final_state=True, cu_seqlens=cu,
                chunk_indices=None, chunk_offsets=None, use_qk_l2norm_in_kernel=False)


def conv_args(gen, T, dim=24, device="cpu"):
    x = torch.randn(T, dim, generator=gen).to(device).t()
    return dict(x=x, weight=torch.randn(dim, 4, generator=gen).to(device),
                bias=torch.randn(dim, generator=gen).to(device),
                conv_states=torch.randn(4, dim, 3, generator=gen).to(device),
                query_start_loc=torch.tensor([0, 1, T], dtype=torch.int32, device=device),
                cache_indices=torch.tensor([2, 3], dtype=torch.int32, device=device),
                has_initial_state=torch.tensor([True, False], device=device))


def test_zero_is_stock(fake, monkeypatch, caplog):
    mod, calls = fake
    orig_conv = mod.causal_conv1d_fn
    monkeypatch.setenv("R9K_GDN_PREFILL_MAX", "0")
    with caplog.at_level(logging.INFO, logger="r9k"):
        assert dispatch.install({"qwen": mod}) == []
    assert "forward" not in vars(mod.ChunkGatedDeltaRule) and mod.causal_conv1d_fn is orig_conv
    assert "left as is" in caplog.text


def test_short_prefill_routed_long_to_stock(fake, counted, monkeypatch, gen):
    """The per-step rule: a step of more than R9K_GDN_PREFILL_MAX tokens goes to vLLM whole, counted ``rule``; a
    prefix-caching conv call goes to vLLM whatever its length, counted ``vllm``."""
    mod, calls = fake
    monkeypatch.setenv("R9K_GDN_PREFILL_MAX", "8")
    monkeypatch.setenv("R9K_GDN_PREFILL_SPLIT", "step")
    names = dispatch.install({"qwen": mod})
    assert len(names) == 2 and "ChunkGatedDeltaRule.forward" in names[0] and "causal_conv1d_fn" in names[1]
    op = mod.ChunkGatedDeltaRule()
    a = core_args(gen, T=7)
    o_ref, s_ref = gdn_seq_ref(a["q"], a["k"], a["v"], a["g"], a["beta"], a["initial_state"],
                               torch.arange(2), a["cu_seqlens"])
    h0 = a["initial_state"]
    o, ht = op(**a)
    assert calls["core"] == 0 and ht is h0  # the gathered state, updated in place, is the final state
    assert ((o.double() - o_ref).norm() / o_ref.norm()) < 1e-5
    assert ((ht.double() - s_ref).norm() / s_ref.norm()) < 1e-5
    assert op(**core_args(gen, T=9)) == ("stock-core", None) and calls["core"] == 1
    # the conv: routed at <= 8 tokens, stock above, stock for prefix-caching block arguments
    c = conv_args(gen, T=6)
    ref, ref_states = gdn_conv_ref(**{k: v for k, v in c.items()}, null_block_id=0, dtype=torch.float32)
    y = mod.causal_conv1d_fn(**c)
    assert torch.equal(y, ref) and torch.equal(c["conv_states"], ref_states) and calls["conv"] == 0
    assert mod.causal_conv1d_fn(**conv_args(gen, T=9)) == "stock-conv"
    c = conv_args(gen, T=6)
    c["block_idx_last_scheduled_token"] = torch.zeros(2, dtype=torch.int32)
    assert mod.causal_conv1d_fn(**c) == "stock-conv" and calls["conv"] == 2
    assert counted == [("gdn_seq", "r9k"), ("gdn_seq", "rule"), ("gdn_conv", "r9k"), ("gdn_conv", "rule"),
                       ("gdn_conv", "vllm")]


def test_conv_stock_knob_and_reinstall_zero_restores(fake, monkeypatch):
    mod, calls = fake
    orig_conv = mod.causal_conv1d_fn
    monkeypatch.setenv("R9K_GDN_PREFILL_MAX", "256")
    monkeypatch.setenv("R9K_GDN_PREFILL_CONV", "stock")
    names = dispatch.install({"qwen": mod})
    assert len(names) == 1 and mod.causal_conv1d_fn is orig_conv
    monkeypatch.setenv("R9K_GDN_PREFILL_CONV", "r9k")
    assert len(dispatch.install({"qwen": mod})) == 2  # a second install replaces, never double-wraps
    assert mod.causal_conv1d_fn.__r9k_original__ is orig_conv
    monkeypatch.setenv("R9K_GDN_PREFILL_MAX", "0")
    assert dispatch.install({"qwen": mod}) == []
    assert "forward" not in vars(mod.ChunkGatedDeltaRule) and mod.causal_conv1d_fn is orig_conv
    assert mod.ChunkGatedDeltaRule.forward is _CustomOp.forward


def test_no_gdn_layer_is_noop(monkeypatch, caplog):
    monkeypatch.setenv("R9K_GDN_PREFILL_MAX", "256")
    with caplog.at_level(logging.INFO, logger="r9k"):
        assert dispatch.install({"qwen": None, "olmo": types.ModuleType("empty")}) == []
    assert "nothing installed" in caplog.text


def test_olmo_module_function(monkeypatch, gen):
    mod = types.ModuleType("fake_olmo")
    seen = []
    real = importlib.import_module(dispatch.OLMO_MODULE)
    mod.chunk_gated_delta_rule = _with_signature(lambda *a, **k: seen.append(1) or ("stock", None),
                                                 real.chunk_gated_delta_rule)
    monkeypatch.setenv("R9K_GDN_PREFILL_MAX", "4")
    monkeypatch.setenv("R9K_GDN_PREFILL_SPLIT", "step")
    try:
        assert len(dispatch.install({"olmo": mod})) == 1
        a = core_args(gen, T=4)
        o, ht = mod.chunk_gated_delta_rule(**a)
        assert not seen and o.shape == a["v"].shape
        assert mod.chunk_gated_delta_rule(**core_args(gen, T=5)) == ("stock", None) and seen == [1]
    finally:
        dispatch.uninstall()
    assert not hasattr(mod.chunk_gated_delta_rule, "__r9k_original__")


@pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vLLM not installed")
def test_real_vllm_module_patch_and_restore(monkeypatch):
    """Where vLLM is installed: the hook lands on its GDN module and 0 takes it off again."""
    mod = dispatch._import(dispatch.QWEN_MODULE)
    if mod is None:
        pytest.skip("this vLLM has no importable qwen GDN module")
    orig_conv = mod.causal_conv1d_fn
    monkeypatch.setenv("R9K_GDN_PREFILL_MAX", "256")
    try:
        names = dispatch.install()
        assert any("ChunkGatedDeltaRule.forward" in n for n in names)
        assert mod.causal_conv1d_fn is not orig_conv
    finally:
        monkeypatch.setenv("R9K_GDN_PREFILL_MAX", "0")
        dispatch.install()
    assert mod.causal_conv1d_fn is orig_conv and "forward" not in vars(mod.ChunkGatedDeltaRule)


def test_warmup_calls_pass_through(fake, counted, monkeypatch, gen):
    """vLLM's profile-run warm-up (``_warmup_prefill_kernels``) reaches vLLM's own core, whatever its size: a call
    the rule would take, counted ``vllm``."""
    mod, calls = fake
    monkeypatch.setenv("R9K_GDN_PREFILL_MAX", "256")
    dispatch.install({"qwen": mod})
    layer = mod.QwenGatedDeltaNetAttention(mod.ChunkGatedDeltaRule())
    assert layer._warmup_prefill_kernels(core_args(gen, T=8)) == ("stock-core", None)
    assert calls == {"core": 1, "conv": 0, "warm": 1} and not dispatch._in_warmup()
    o, ht = layer.chunk_gated_delta_rule(**core_args(gen, T=8))  # outside the warm-up: r9k
    assert calls["core"] == 1 and isinstance(o, torch.Tensor)
    assert counted == [("gdn_seq", "vllm"), ("gdn_seq", "r9k")]
    dispatch.uninstall()
    assert "_warmup_prefill_kernels" in vars(mod.QwenGatedDeltaNetAttention)
    assert not hasattr(mod.QwenGatedDeltaNetAttention._warmup_prefill_kernels, "__r9k_original__")


def test_a_kernel_value_error_goes_to_stock_and_is_logged_once(fake, counted, monkeypatch, gen, caplog):
    mod, calls = fake
    monkeypatch.setenv("R9K_GDN_PREFILL_MAX", "256")
    dispatch.install({"qwen": mod})
    kg = dispatch._kernels()

    def refuse(*a, **k):
        raise ValueError("not a layout gdn_* covers")

    monkeypatch.setattr(kg, "gdn_seq", refuse)
    monkeypatch.setattr(kg, "gdn_conv", refuse)
    dispatch.STATE.refused_logged.clear()
    op = mod.ChunkGatedDeltaRule()
    with caplog.at_level(logging.WARNING, logger="r9k"):
        for _ in range(3):
            assert op(**core_args(gen, T=6)) == ("stock-core", None)
            assert mod.causal_conv1d_fn(**conv_args(gen, T=6)) == "stock-conv"
    assert calls["core"] == 3 and calls["conv"] == 3
    assert counted == [("gdn_seq", "vllm"), ("gdn_conv", "vllm")] * 3  # refused: never the rule's
    assert caplog.text.count("gdn_seq refused a call") == 1 and caplog.text.count("gdn_conv refused a call") == 1


def test_a_changed_vllm_signature_refuses_the_install(monkeypatch):
    mod, _ = make_fake_qwen()
    sig = inspect.signature(mod.causal_conv1d_fn)
    mod.causal_conv1d_fn.__signature__ = sig.replace(
        parameters=[p.replace(name="states") if p.name == "conv_states" else p for p in sig.parameters.values()])
    monkeypatch.setenv("R9K_GDN_PREFILL_MAX", "256")
    with pytest.raises(dispatch.SignatureMismatch, match="conv_states"):
        dispatch.install({"qwen": mod})
    assert "forward" not in vars(mod.ChunkGatedDeltaRule)


def test_take_follows_the_crossover_table(monkeypatch):
    monkeypatch.setattr(dispatch.STATE, "max_tokens", 4096)
    monkeypatch.setattr(dispatch, "CROSSOVER", ((64, 512), (512, 64)))
    assert dispatch.take(1, 512, 32) and not dispatch.take(1, 513, 32)      # 32 sequence-heads: row 1
    assert dispatch.take(8, 512, 32) and not dispatch.take(8, 1024, 32)     # 256 sequence-heads, 64 a seq: row 2
    assert not dispatch.take(32, 2048, 32)                                  # 1024 sequence-heads: no row
    assert not dispatch.take(4, 5000, 8) and not dispatch.take(0, 0, 8)     # over R9K_GDN_PREFILL_MAX; empty

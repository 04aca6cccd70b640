"""The vLLM binding contract (r9k/contract.py): every binding holds on the installed vLLM (0.32's CPU build) and, read
statically, on vLLM 0.33.0's sources (tests/r9k/vllm_0_33_0.json, a record of signatures, not vLLM code); a binding
that does not hold installs nothing of its family and is named on the provenance line; the expert cache keeps the
storage it planned under both releases' ``replace_parameter``."""
from __future__ import annotations

import functools
import json
import re
import types
from pathlib import Path

import pytest
import torch

import r9k
from r9k import contract, ops, provenance
from r9k.ops import gdn, moe
from validate.config import ServeConfig
from validate.provenance_checks import check_dispatch

pytestmark = pytest.mark.timeout(120)

FIXTURE = Path(__file__).with_name("vllm_0_33_0.json")


@pytest.fixture(autouse=True)
def _fresh(monkeypatch):
    monkeypatch.setattr(contract, "_REFUSED", [])
    monkeypatch.setattr(contract, "_LISTENERS", [])
    yield
    gdn.uninstall()
    moe.uninstall()


def _cfg(**env) -> ServeConfig:
    return ServeConfig(name="c", model={"path": "m", "served_name": "m"},
                       server={"max_num_seqs": 4, "max_model_len": 4096}, env=env)


# ---- the installed vLLM ------------------------------------------------------------------------------------
def test_every_binding_holds_on_the_installed_vllm():
    assert contract.vllm_version().startswith("0.32")
    assert contract.check() == []
    facts = contract.LiveFacts()
    # 0.32 has no checkpointed GDN prefill: the optional binding is absent, the refusal hook is never installed
    assert facts.lookup(contract.QWEN_GDN, "QwenGatedDeltaNetAttention.get_prefill_checkpoint_alignment")[0] == \
        "no-symbol"
    assert contract.replace_parameter_copies() is False  # 0.32 adopts the tensor given


def test_report_lists_every_binding(capsys):
    text = contract.report()
    assert text.splitlines()[0] == f"r9k binding contract against vLLM {contract.vllm_version()}"
    assert sum(" ok" in ln or "absent" in ln for ln in text.splitlines()) == len(contract.BINDINGS)
    assert "FAILED" not in text and "adopts the tensor given" in text
    assert capsys.readouterr().out.strip() == text


# ---- vLLM 0.33.0, statically ---------------------------------------------------------------------------------
def _recorded(tmp_path, edit=None) -> contract.RecordedFacts:
    data = json.loads(FIXTURE.read_text())
    if edit:
        edit(data)
    p = tmp_path / "facts.json"
    p.write_text(json.dumps(data))
    return contract.RecordedFacts(p)


def test_the_033_record_is_facts_not_code():
    data = json.loads(FIXTURE.read_text())
    assert data["vllm"] == "0.33.0" and "ast" in data["_derived"] and "No vLLM code is copied" in data["_derived"]
    assert all(v in ("class", "value") or (isinstance(v, list) and all(isinstance(x, str) and x.isidentifier()
                                                                       for x in v)) for v in data["symbols"].values())
    assert data["facts"] == {"replace_parameter_copies_same_shape": True, "gdn_layer_calls_flashinfer_directly": True}


def test_every_binding_holds_statically_on_033(tmp_path):
    facts = _recorded(tmp_path)
    assert facts.version == "0.33.0"
    assert contract.check(facts=facts) == []
    # what 0.33 changed where r9k binds: the checkpointed FlashInfer prefill exists (the refusal hook goes in),
    # replace_parameter lost prefer_copy
    assert facts.lookup(contract.QWEN_GDN, "QwenGatedDeltaNetAttention.get_prefill_checkpoint_alignment") == \
        (None, ["self"])
    assert facts.lookup("vllm.model_executor.utils", "replace_parameter")[1] == ["layer", "param_name", "new_tensor"]


@pytest.mark.parametrize("edit,failure", [
    (lambda d: d["symbols"][f"{contract.CPU_MOE}:CPUUnquantizedExperts.apply"].remove("topk_ids"),
     ("moe.cpu.apply", "signature", "has no parameter(s) topk_ids")),
    (lambda d: d["symbols"].pop(f"{contract.FP8_KERNEL}:TritonFp8BlockScaledMMKernel.apply_weights"),
     ("fp8.apply", "no-symbol", "missing")),
    (lambda d: d["modules"].remove(contract.CPU_MOE), ("moe.cpu.apply", "no-module", "does not import")),
    (lambda d: d["symbols"][f"{contract.TRITON_MOE}:_prepare_expert_assignment"].reverse(),
     ("moe.triton._prepare_expert_assignment", "signature", "r9k passes (topk_ids, config")),
])
def test_a_release_that_moved_a_binding_fails_it(tmp_path, edit, failure):
    got = contract.check(facts=_recorded(tmp_path, edit))
    bid, code, why = failure
    hit = [f for f in got if f.binding == bid]
    assert hit and hit[0].code == code and why in hit[0].why, got
    assert hit[0].token() == f"{bid.split('.')[0]}:{bid}:{code}"


def test_an_optional_binding_absent_is_no_failure(tmp_path):
    gemm = f"{contract.TRITON_MOE}:{contract.MOE_TRITON_GEMM[0]}"
    assert contract.check(facts=_recorded(tmp_path, lambda d: d["symbols"].pop(gemm))) == []


def test_a_record_that_is_not_one_is_refused_naming_the_field(tmp_path):
    p = tmp_path / "bad.json"
    p.write_text(json.dumps({"vllm": "0.33.0", "modules": {}, "symbols": {}}))
    with pytest.raises(ValueError, match=r"bad.json: field 'modules' must be a list"):
        contract.RecordedFacts(p)


# ---- the storage the expert cache planned, under both releases' replace_parameter ----------------------------
def _replace_parameter_033(layer, name, new):
    """vLLM 0.33's documented replace_parameter, restated: the old parameter object is kept; a tensor of its shape,
    stride, dtype and device is copied into its storage, any other becomes its data."""
    old = getattr(layer, name)
    if (old.shape, old.stride(), old.dtype, old.device) == (new.shape, new.stride(), new.dtype, new.device):
        old.data.copy_(new)
    else:
        old.data = new


def _replace_parameter_032(layer, name, new):
    from vllm.model_executor.utils import replace_parameter

    replace_parameter(layer, name, new)


def _repacked_layer(replace):
    """A layer whose experts vLLM repacked with ``replace`` (a same-shape tensor, as cpu_prepack_moe_weight's), its
    loader attribute set; the host store the cache keeps is that parameter's storage."""
    layer = torch.nn.Module()
    layer.w13_weight = torch.nn.Parameter(torch.zeros(4, 3), requires_grad=False)
    layer.w13_weight.weight_loader = len
    replace(layer, "w13_weight", torch.arange(12.0).view(4, 3))
    return layer


@pytest.mark.parametrize("replace", [_replace_parameter_032, _replace_parameter_033], ids=["0.32", "0.33"])
def test_r9ks_setter_keeps_the_planned_storage(replace):
    layer = _repacked_layer(replace)
    host = layer.w13_weight.data  # the host store: the layer's storage after vLLM's repack
    slots = torch.full((4, 3), -1.0)  # slots + staging == experts: the shape of the host store
    contract.adopt_parameter(layer, "w13_weight", slots)
    assert layer.w13_weight.data_ptr() == slots.data_ptr() and layer.w13_weight.data_ptr() != host.data_ptr()
    assert torch.equal(host, torch.arange(12.0).view(4, 3))  # the host store is untouched
    assert layer.w13_weight.weight_loader is len and not layer.w13_weight.requires_grad


def test_vllm_033s_helper_would_copy_the_slots_into_the_host_store():
    layer = _repacked_layer(_replace_parameter_033)
    host = layer.w13_weight.data
    slots = torch.full((4, 3), -1.0)
    _replace_parameter_033(layer, "w13_weight", slots)  # what handing the slots to vLLM's helper does on 0.33
    assert layer.w13_weight.data_ptr() == host.data_ptr() != slots.data_ptr()
    assert torch.equal(host, slots)  # the host store overwritten: why r9k sets its parameters itself


def test_r9ks_setter_matches_vllm_032s_helper():
    ours, theirs = _repacked_layer(_replace_parameter_032), _repacked_layer(_replace_parameter_032)
    buf = torch.ones(4, 3)
    buf.is_shuffled = True
    contract.adopt_parameter(ours, "w13_weight", buf)
    _replace_parameter_032(theirs, "w13_weight", buf)
    for layer in (ours, theirs):
        p = layer.w13_weight
        assert p.data_ptr() == buf.data_ptr() and p.is_shuffled and p.weight_loader is len and not p.requires_grad
        assert type(p) is torch.nn.Parameter and layer._parameters["w13_weight"] is p


# ---- a binding that does not hold: nothing installed, named on the line, plugin-inactive ---------------------
def _copying_setter(layer, name, tensor):
    getattr(layer, name).data.copy_(tensor)


def test_a_failed_binding_installs_nothing_and_is_named(monkeypatch):
    monkeypatch.setenv("R9K_MOE_CACHE_SLOTS", "4")
    monkeypatch.setattr(contract, "adopt_parameter", _copying_setter)  # a setter that copies: moe.adopt fails
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    cpu_cls = moe._original(__import__(contract.CPU_MOE, fromlist=["x"]), "CPUUnquantizedExperts")
    apply_before = cpu_cls.apply
    got = ops.install()
    assert got.names == [] and got.failed == ["moe:moe.adopt:behaviour"]
    assert moe.STATE.patches == [] and cpu_cls.apply is apply_before
    text = provenance.line(got.names, got.failed, contract.vllm_version())
    (p,) = provenance.parse(text)
    assert p.failed == ("moe:moe.adopt:behaviour",) and p.failed_families() == ("moe",)
    assert p.vllm == contract.vllm_version() and text.endswith(" dispatch=- failed=moe:moe.adopt:behaviour")
    lines = [re.sub(r" pid=\d+", f" pid={i}", text) for i in (1, 2)]  # an API server and an engine core
    why = check_dispatch(_cfg(R9K_MOE_CACHE_SLOTS="4"), lines)
    assert why.startswith("op dispatch failed to install in the server: moe:moe.adopt:behaviour (1); "
                          "moe:moe.adopt:behaviour (2)")
    assert f"on vLLM {contract.vllm_version()}; binding moe.adopt (behaviour): torch.nn:Module" in why


def test_the_line_parses_with_and_without_the_new_fields():
    text = provenance.line(["fp8_block_gemm"], ["gdn:gdn.qwen.checkpoint:bypassed", "moe"], "0.33.0+cu130")
    (p,) = provenance.parse(text)
    assert " vllm=0.33.0+cu130 dispatch=fp8_block_gemm failed=gdn:gdn.qwen.checkpoint:bypassed,moe" in text
    assert p.vllm == "0.33.0+cu130" and p.failed_families() == ("gdn", "moe")
    assert provenance.parse(provenance.line())[0].vllm is None
    # a failed= entry with characters outside the grammar makes no line (never half a line)
    assert provenance.parse(text.replace("bypassed", "by passed")) == []
    assert contract.describe("moe") == "moe (install raised)"


# ---- vLLM 0.33's checkpointed FlashInfer GDN prefill: refused once a layer is built ------------------------------
def _qwen_module(align):
    """A stand-in of 0.33's qwen_gdn_linear_attn: the op, its core's signature, the conv, a layer whose
    get_prefill_checkpoint_alignment() is ``align`` (None: no checkpoint; 64: FlashInfer writes checkpoints)."""
    mod = types.ModuleType("qwen_stand_in")

    class ChunkGatedDeltaRule:
        def forward(self, *args, **kwargs):
            return "vllm"

        def forward_native(self, q, k, v, g, beta, initial_state, output_final_state, cu_seqlens=None,
                           use_qk_l2norm_in_kernel=True, core_attn_out=None):
            return "vllm"

    class QwenGatedDeltaNetAttention:
        def __init__(self, align):
            self.gdn_prefill_backend = "flashinfer"
            self._align = align

        def get_prefill_checkpoint_alignment(self):
            return self._align

    def causal_conv1d_fn(x, weight, bias, conv_states, query_start_loc, cache_indices=None, metadata=None):
        return "vllm"

    mod.ChunkGatedDeltaRule, mod.QwenGatedDeltaNetAttention, mod.causal_conv1d_fn = (
        ChunkGatedDeltaRule, QwenGatedDeltaNetAttention, causal_conv1d_fn)
    return mod


def _register(monkeypatch, mod):
    monkeypatch.setattr(r9k, "_registered", False)
    monkeypatch.setattr(ops, "kernels_can_run", lambda: (True, ""))
    monkeypatch.setattr(gdn, "install", functools.partial(gdn.install, modules={"qwen": mod}))
    from r9k.ops import fp8

    monkeypatch.setattr(fp8, "install", lambda: [])
    monkeypatch.setattr(ops, "_set_fast_launch", lambda: None)
    lines = []
    monkeypatch.setattr(provenance, "log_once", lambda d=(), f=(), v=None: lines.append(provenance.line(d, f, v)))
    r9k.register()
    return lines


def test_a_checkpointing_gdn_layer_takes_the_dispatch_out_and_says_so(monkeypatch):
    mod = _qwen_module(64)
    op_forward = mod.ChunkGatedDeltaRule.forward
    lines = _register(monkeypatch, mod)
    assert len(lines) == 1 and " dispatch=gdn_conv,gdn_seq failed=-" in lines[0]
    assert mod.ChunkGatedDeltaRule.forward is not op_forward  # installed at load
    mod.QwenGatedDeltaNetAttention(None)  # a layer without checkpoints: nothing changes
    assert len(lines) == 1 and contract.refused() == []
    mod.QwenGatedDeltaNetAttention(64)  # FlashInfer + align mode: vLLM calls FlashInfer without the op
    assert mod.ChunkGatedDeltaRule.forward is op_forward and gdn.STATE.patches == []
    assert len(lines) == 2 and lines[1].endswith(" dispatch=- failed=gdn:gdn.qwen.checkpoint:bypassed")
    (f,) = contract.refused()
    assert f.code == "bypassed" and "--gdn-prefill-backend triton" in f.why
    mod.QwenGatedDeltaNetAttention(64)  # the next layer: said once
    assert len(lines) == 2
    two = [re.sub(r" pid=\d+", f" pid={i}", ln) for i in (1, 2) for ln in lines]
    why = check_dispatch(_cfg(R9K_GDN_PREFILL_MAX="256"), two)
    assert "gdn:gdn.qwen.checkpoint:bypassed (1)" in why and "binding gdn.qwen.checkpoint (bypassed)" in why


def test_without_checkpoints_the_gdn_dispatch_stays(monkeypatch):
    mod = _qwen_module(None)
    lines = _register(monkeypatch, mod)
    mod.QwenGatedDeltaNetAttention(None)
    assert len(lines) == 1 and contract.refused() == [] and gdn.STATE.patches

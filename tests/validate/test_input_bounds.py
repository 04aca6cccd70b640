"""Suite, configuration and command-line values that would load without a word and then make a gate or a check say
nothing: each is refused where it is given, naming it."""
from __future__ import annotations

import pytest
import yaml

from tests.validate.test_hostile_server import cli
from validate.errors import InputError


@pytest.mark.timeout(60)
def test_a_nan_gate_bound_is_refused_at_load(tmp_path):
    # gate: {max: {bad: .nan}}: every comparison with NaN is false, so the gate holds whatever the metric says
    from validate.suite import load_suite

    (tmp_path / "sanity.yaml").write_text("name: sanity\nkind: strict-sanity\ngate:\n  max: {bad: .nan}\n")
    try:
        s = load_suite(tmp_path / "sanity.yaml")
    except InputError as e:
        assert "gate" in str(e) and "sanity.yaml" in str(e)
        return
    assert s.spec.gate.check({"bad": 1000}) != [], "a gate with a NaN bound passes 1000 bad answers"


@pytest.mark.timeout(60)
def test_a_nan_perf_threshold_is_refused_at_load(tmp_path):
    # perf_gate.thresholds_pct: {decode_step_ms: .nan} makes worse_pct > threshold false for every figure
    from validate.perfgate import judge
    from validate.suite import load_suite

    (tmp_path / "betterbench.yaml").write_text(
        "name: betterbench\nkind: betterbench\nperf_gate:\n  thresholds_pct: {decode_step_ms: .nan}\n")
    try:
        s = load_suite(tmp_path / "betterbench.yaml")
    except InputError as e:
        assert "thresholds_pct" in str(e)
        return
    t = s.spec.perf_gate.threshold("decode_step_ms")
    f = judge("c", "decode_step_ms", [10.0, 10.1, 10.2, 10.05, 10.15, 10.12], [20.0, 20.1, 20.2, 20.3, 20.4, 20.5], t)
    assert f.regression, "decode step twice as slow, six passes each side: not a regression with a NaN threshold"


@pytest.mark.timeout(60)
@pytest.mark.parametrize("args", [["--tensor-parallel-size", "4"], ["-tp", "4"], ["--tensor-parallel-size=4"]])
def test_tensor_parallel_in_extra_args_is_refused(args):
    # extra_args come last on vLLM's command line: tp 4 would run while the rank count read the field's 1, and two
    # provenance lines would pass for a 4-rank server
    from pydantic import ValidationError

    from validate.config import ServeConfig

    with pytest.raises(ValidationError, match="set by the engine from the field tensor_parallel_size"):
        ServeConfig(name="c", model={"path": "m", "served_name": "m"},
                    server={"max_num_seqs": 4, "max_model_len": 4096, "extra_args": args})


@pytest.mark.timeout(60)
@pytest.mark.parametrize("flag", ["--max-num-seqs", "--max-model-len", "--dtype"])
def test_extra_args_cannot_silently_override_the_fields_the_checks_read(tmp_path, flag):
    # max_num_seqs is what sanity overloads and what the perf gate pairs on; extra_args' later flag wins in vLLM,
    # so the server runs 256 seqs while the overload, the record and the pairing all read 4
    from validate.config import load_config

    val = {"--max-num-seqs": "256", "--max-model-len": "131072", "--dtype": "float16"}[flag]
    (tmp_path / "c.yaml").write_text(yaml.safe_dump({
        "name": "c", "model": {"path": "m", "served_name": "m"},
        "server": {"max_num_seqs": 4, "max_model_len": 4096, "extra_args": [flag, val]}}))
    with pytest.raises(InputError, match="extra_args"):
        load_config(tmp_path / "c.yaml")


@pytest.mark.timeout(60)
@pytest.mark.parametrize("overload", [[0.0], [-1.0], [0.25]])
def test_a_sanity_overload_that_sends_nothing_beyond_max_num_seqs_is_refused(tmp_path, overload):
    # overload: list[float] has no bound: 0 or -1 sends no request under load (n = ceil(m * max_num_seqs) <= 0) and
    # 0.25 stays below max_num_seqs: "bad 0 of 0", the suite passes having overloaded nothing
    from validate.suite import load_suite

    (tmp_path / "sanity.yaml").write_text(yaml.safe_dump({"name": "sanity", "kind": "strict-sanity",
                                                          "params": {"overload": overload}, "gate": {"max": {"bad": 0}}}))
    with pytest.raises(InputError, match="overload"):
        load_suite(tmp_path / "sanity.yaml")


@pytest.mark.timeout(120)
@pytest.mark.parametrize("extra", [["--max-num-seqs", "-3", "--max-model-len", "4096"],
                                   ["--max-num-seqs", "4", "--max-model-len", "8"]])
def test_odd_url_sizes_are_an_input_error_naming_the_option(scratch, extra):
    # once a pydantic traceback and exit 1 (the code of a finding); now argparse names the option, exit 2
    rc, out = cli(["suite", "fake-sanity", "--url", "http://127.0.0.1:9", "--model", "m", "--release", "cv1", *extra], 60)
    assert rc == 2 and "Traceback" not in out, out[-1200:]
    assert extra[0] in out or extra[2] in out, out[-1200:]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("path", ["/etc/prompts.yaml", "../prompts.yaml", "data/../../prompts.yaml"])
def test_a_sanity_prompts_file_outside_suites_is_refused_at_load(tmp_path, path):
    # outside suites/ the engine hash never sees it: --resume would keep a pass made on other prompts
    from validate.suite import load_suite

    (tmp_path / "sanity.yaml").write_text(yaml.safe_dump({"name": "sanity", "kind": "strict-sanity",
                                                          "params": {"prompts_file": path}}))
    with pytest.raises(InputError, match="prompts_file"):
        load_suite(tmp_path / "sanity.yaml")

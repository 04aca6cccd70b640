"""The serving-timing comparison against `vllm bench serve`: its arguments and the command it builds."""
from __future__ import annotations

import pytest


def test_vs_vllm_bench_arguments():
    from benchmarks.serving.vs_vllm_bench import parse_args, vllm_command

    a = parse_args(["--url", "http://127.0.0.1:8000/v1/", "--model", "smol", "--tokenizer", "/m/tok"])
    assert a.url == "http://127.0.0.1:8000" and a.concurrency == 8 and a.requests_per_client == 2
    assert (a.input_len, a.output_len) == (256, 128)
    cmd = vllm_command(a, "/tmp/d", "r.json")
    assert cmd[3:5] == ["bench", "serve"]
    flag = lambda f: cmd[cmd.index(f) + 1]  # noqa: E731
    assert flag("--max-concurrency") == "8" and flag("--num-prompts") == "16" and flag("--served-model-name") == "smol"
    assert flag("--random-input-len") == "256" and flag("--random-output-len") == "128" and "--ignore-eos" in cmd
    assert flag("--tokenizer") == "/m/tok" and flag("--base-url") == "http://127.0.0.1:8000"
    assert parse_args(["--url", "u", "--model", "m"]).tokenizer == "m"
    with pytest.raises(SystemExit):
        parse_args(["--url", "u", "--model", "m", "--concurrency", "0"])


def test_vs_vllm_bench_rate_mode_builds_vllms_open_loop():
    from benchmarks.serving.vs_vllm_bench import parse_args, vllm_command

    a = parse_args(["--url", "u", "--model", "smol", "--request-rate", "1.5", "--burstiness", "0.5",
                    "--num-prompts", "60", "--goodput-ttft-ms", "2000", "--goodput-tpot-ms", "100"])
    cmd = vllm_command(a, "/tmp/d", "r.json")
    flag = lambda f: cmd[cmd.index(f) + 1]  # noqa: E731
    assert flag("--request-rate") == "1.5" and flag("--burstiness") == "0.5" and flag("--num-prompts") == "60"
    assert cmd[cmd.index("--goodput") + 1:cmd.index("--goodput") + 3] == ["ttft:2000", "tpot:100"]
    assert "--max-concurrency" not in cmd  # an open loop: the rate, not a client count, sets the load
    with pytest.raises(SystemExit):
        parse_args(["--url", "u", "--model", "m", "--request-rate", "0"])


def test_quick_budget_table_flags_a_suite_over_its_budget_and_reports_the_soaks_end(tmp_path, capsys):
    from benchmarks.serving.quick_budget import main
    from validate.record import Record, ServerInfo, Verdict, record_path, write_record

    def rec(suite, kind, wall, budget, metrics=None, params=None, started="2026-01-01T00:00:00+00:00",
            ended="2026-01-01T00:01:00+00:00"):
        return Record(release="v1", config="cpu-smol", config_hash="c", suite=suite, suite_kind=kind,
                      params=params or {}, params_hash="p", profile="quick", started_at=started, ended_at=ended,
                      wall_s=wall, budget_s=budget, server=ServerInfo(startup_s=80.5), verdict=Verdict(status="pass"),
                      metrics=metrics or {})

    soak = rec("soak", "soak", 47.2, 50.0, {"duration_s": 45.1, "served": 30, "errors": 0, "cut_at_deadline": 8,
                                            "prompt_tokens_range": [200, 1687]}, {"duration_s": 45.0},
               ended="2026-01-01T00:04:00+00:00")
    for r in (rec("probe", "probe", 25.5, 20.0), soak):
        write_record(record_path(tmp_path, "v1", r.config, r.suite), r)
    assert main(["v1", "--reports", str(tmp_path)]) == 1  # the probe is over its 20 s
    out = capsys.readouterr().out.splitlines()
    assert out[1].split() == ["cpu-smol", "probe", "quick", "25.5", "20", "OVER"]
    assert out[2].split() == ["cpu-smol", "soak", "quick", "47.2", "50"]
    assert out[3].split() == ["cpu-smol", "all", "suites", "72.7", "70", "OVER"]
    assert out[4] == ("cpu-smol: server start 80.5 s; first suite's start to last one's end 240 s (server start "
                      "included)")
    assert out[5] == ("cpu-smol/soak: asked 45.0 s, clients ran 45.1 s, wall 47.2 s; 30 served, 0 errors, 8 cut at "
                      "the deadline; prompts [200, 1687] tokens")
    assert main(["v2", "--reports", str(tmp_path)]) == 2

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

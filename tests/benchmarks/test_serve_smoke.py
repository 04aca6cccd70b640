"""benchmarks/serve_smoke.py against the synthetic server (tests/fake_vllm.py): one configuration launched through
the engine's launcher, one request served, the server's whole process tree stopped; and a server that dies at
start-up, which is not served."""
from __future__ import annotations

import json

import pytest

from benchmarks import serve_smoke
from tests.conftest import fake_procs

pytestmark = pytest.mark.timeout(120)


def test_a_served_request_is_timed_and_counted(scratch, tmp_path, capsys):
    tag = scratch.config("fake-ok", FAKE_VLLM_TOKENS=5)
    out = tmp_path / "smoke"
    assert serve_smoke.main(["--config", "fake-ok", "--out", str(out)]) == 0
    res = json.loads((out / serve_smoke.RESULT).read_text())
    assert res["served"] and res["error"] is None and res["config"] == "fake-ok" and res["knobs"] == "configured"
    assert res["output_tokens"] == 5 and res["model"] == "fake-model"
    assert 0 < res["startup_s"] < 60 and 0 < res["request_s"] < 30 and res["ttft_s"] <= res["request_s"]
    assert len(res["provenance"]) == 2 and res["kv_cache_tokens"] is not None
    printed = capsys.readouterr().out
    assert "serve_smoke: fake-ok: model ready in" in printed and "; launching vLLM (log: " in printed
    assert "serve_smoke: served: first request" in printed and "answer 5 tokens in" in printed
    assert res["text"] == "The answer is unknown."
    assert (out / "server.log").is_file() and fake_procs(tag) == []


def test_a_server_that_dies_at_start_up_is_not_served(scratch, tmp_path, capsys):
    tag = scratch.config("fake-crash", mode="crash")
    out = tmp_path / "smoke"
    assert serve_smoke.main(["--config", "fake-crash", "--out", str(out)]) == 1
    res = json.loads((out / serve_smoke.RESULT).read_text())
    assert not res["served"] and res["output_tokens"] is None
    assert res["error"].startswith("launch: server exited with status 3 during start-up")
    assert "NOT served: launch: server exited with status 3" in capsys.readouterr().out
    assert fake_procs(tag) == []


def test_an_unknown_configuration_is_bad_input(scratch, tmp_path, capsys):
    assert serve_smoke.main(["--config", "no-such", "--out", str(tmp_path / "smoke")]) == 2
    assert "no configuration 'no-such'" in capsys.readouterr().err
    assert not (tmp_path / "smoke").exists()

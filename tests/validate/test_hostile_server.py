"""Servers that misbehave where a client seldom looks: endpoints that trickle a byte at a time, requests failed under
load, stray files beside the records. Each ends in a verdict, on time (tests.hostile_vllm, no vLLM)."""
from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import time

import pytest
import yaml

from tests.conftest import REPO, fake_procs
from validate.cli import main


def hostile(scratch, name: str, mode: str, **env) -> str:
    return scratch.config(name, entrypoint="tests.hostile_vllm", HOSTILE_MODE=mode, **env)


def record(scratch, release: str, cfg: str, suite: str = "fake-sanity") -> dict:
    return json.loads((scratch.root / "reports" / release / cfg / f"{suite}.json").read_text())


def cli(args: list[str], wait_s: float) -> tuple[int | None, str]:
    """``r9k-validate args`` in a subprocess: (exit status, or None when it was still running after ``wait_s``
    and had to be stopped; output)."""
    p = subprocess.Popen([sys.executable, "-m", "validate.cli", *args], stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, text=True)
    try:
        rc = p.wait(timeout=wait_s)
    except subprocess.TimeoutExpired:
        rc = None
        p.terminate()
        try:
            p.wait(timeout=40)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
    return rc, p.stdout.read()


@contextlib.contextmanager
def standalone(mode: str):
    """tests.hostile_vllm in ``mode``, started by hand on a free port (a --url run's server); yields the port."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    env = {**os.environ, "HOSTILE_MODE": mode, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen([sys.executable, "-m", "tests.hostile_vllm", "--port", str(port), "--served-model-name",
                             "m"], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        time.sleep(2)
        yield port
    finally:
        proc.kill()
        proc.wait()


@pytest.mark.timeout(200)
def test_a_trickling_metrics_endpoint_ends_the_suite_on_time(scratch):
    # GET /metrics sends a byte every 2 s: httpx's read timeout never fires; the whole scrape is bounded (20 s)
    tag = hostile(scratch, "fake-tm", "trickle-metrics")
    rc, out = cli(["suite", "fake-sanity", "--config", "fake-tm", "--release", "h1"], 90)
    assert rc is not None, out[-1500:]
    assert "GET /metrics gave no whole answer within 20 s" in json.dumps(record(scratch, "h1", "fake-tm"))
    assert fake_procs(tag) == []


@pytest.mark.timeout(200)
def test_a_trickling_health_ends_a_url_run_on_time(scratch):
    scratch.config("fake-ok")
    with standalone("trickle-health") as port:
        rc, out = cli(["suite", "fake-sanity", "--config", "fake-ok", "--url", f"http://127.0.0.1:{port}",
                       "--model", "m", "--release", "h2"], 60)
    assert rc == 2, out[-1500:]  # a server that never answers /health is not serving: nothing was checked


@pytest.mark.timeout(200)
def test_a_trickling_tokenize_ends_the_probe_on_time(scratch):
    tag = hostile(scratch, "fake-tt", "trickle-tokenize")
    (scratch.root / "suites" / "tiny-probe.yaml").write_text(yaml.safe_dump({
        "name": "tiny-probe", "kind": "probe", "params": {"decode_tokens": 8, "repeats": 1, "requests_per_client": 1,
                                                          "agg_tokens": 8, "prefill_depth": 64}}))
    rc, out = cli(["suite", "tiny-probe", "--config", "fake-tt", "--release", "h3"], 90)
    assert rc == 2, out[-1500:]
    assert "/tokenize: no whole answer within 60 s" in record(scratch, "h3", "fake-tt", "tiny-probe")["verdict"]["cause"]
    assert fake_procs(tag) == []


def test_requests_the_living_server_fails_under_load_fail_the_soak(scratch):
    # every 7th generation answers HTTP 500 while the server lives: the soak's errors gate is what finds it
    tag = hostile(scratch, "fake-500", "five-hundred-some", HOSTILE_AFTER=1)
    (scratch.root / "suites" / "tiny-soak.yaml").write_text(yaml.safe_dump({
        "name": "tiny-soak", "kind": "soak", "params": {"clients": 2, "duration_s": 4, "prompt_tokens_min": 20,
        "prompt_tokens_max": 60, "max_tokens": 4, "max_slope_mib_per_min": 100000, "sample_interval_s": 0.25}, "gate": {"max": {"errors": 0}}}))
    assert main(["suite", "tiny-soak", "--config", "fake-500", "--release", "v1"]) == 1
    rec = record(scratch, "v1", "fake-500", "tiny-soak")
    assert fake_procs(tag) == []
    assert rec["metrics"]["errors"] > 0 and rec["verdict"]["status"] == "fail"
    assert "requests failed while the server lived; first: HTTP 500" in rec["verdict"]["cause"]


def _forge_better_baseline(scratch, cand_rel: str, base_rel: str, cfg: str = "fake-ok", suite: str = "gsm8k"):
    """The baseline: the candidate's own record with every question right (a release the candidate regressed from),
    its outputs giving the expected answers and its counts recounted, as the audit re-derives them on read."""
    rec = json.loads((scratch.root / "reports" / cand_rel / cfg / f"{suite}.json").read_text())
    rec["release"] = base_rel
    for it in rec["items"]:
        it["correct"] = True
        if suite == "gsm8k":
            it["output"] = f"#### {it['expected']}"
            for k in ("answer", "answer_strict", "answer_flexible"):
                it[k] = it["expected"]
            it["correct_strict"] = it["correct_flexible"] = True
    if suite == "gsm8k":
        n = len(rec["items"])
        rec["metrics"].update(correct=n, correct_strict=n, correct_flexible=n, accuracy=1.0, accuracy_strict=1.0,
                              accuracy_flexible=1.0)
    dst = scratch.root / "reports" / base_rel / cfg / f"{suite}.json"
    dst.parent.mkdir(parents=True, exist_ok=True)
    dst.write_text(json.dumps(rec))


def test_a_stray_json_in_the_baseline_folder_never_hides_a_regression(scratch, capsys):
    scratch.config("fake-ok")
    (scratch.root / "suites" / "release.yaml").write_text(yaml.safe_dump(
        {"configs": ["fake-ok"], "suites": [{"suite": "gsm8k"}]}))
    assert main(["release", "v0.2", "--baseline", "none"]) == 0
    _forge_better_baseline(scratch, "v0.2", "v0.1")
    assert main(["release", "v0.2"]) == 1
    (scratch.root / "reports" / "v0.1" / "fake-ok" / "notes.json").write_text('{"comment": "not a record"}')
    capsys.readouterr()
    assert main(["release", "v0.2"]) == 1  # the readable record is still compared, and regresses
    out = capsys.readouterr().out
    assert "a file of the baseline v0.1 was not compared:" in out and "notes.json" in out


def test_a_stray_json_in_the_release_folder_keeps_the_suites_verdict(scratch, tmp_path, capsys):
    tag = scratch.config("fake-g", mode="garbage")
    stray = scratch.root / "reports" / "dev" / "old-copy"
    stray.mkdir(parents=True)
    (stray / "notes.json").write_text('{"comment": "not a record"}')
    junit = tmp_path / "junit.xml"
    assert main(["suite", "fake-sanity", "--config", "fake-g", "--junit-xml", str(junit)]) == 1
    assert record(scratch, "dev", "fake-g")["verdict"]["status"] == "fail" and junit.exists()
    assert "the release folder holds a file that is not its record" in capsys.readouterr().out
    assert fake_procs(tag) == []


@pytest.mark.timeout(200)
def test_a_tokenize_that_gives_no_ids_ends_the_probe_at_once(scratch):
    # quick, well-formed answers with no ids: the text pool would ask forever
    tag = hostile(scratch, "fake-te", "tokenize-empty")
    (scratch.root / "suites" / "tiny-probe.yaml").write_text(yaml.safe_dump({
        "name": "tiny-probe", "kind": "probe", "params": {"decode_tokens": 8, "repeats": 1, "requests_per_client": 1,
                                                          "agg_tokens": 8, "prefill_depth": 64}}))
    rc, out = cli(["suite", "tiny-probe", "--config", "fake-te", "--release", "h4"], 90)
    assert rc == 2, out[-1500:]
    cause = record(scratch, "h4", "fake-te", "tiny-probe")["verdict"]["cause"]
    assert "/tokenize gave 0 token ids for" in cause and "not a tokenizer" in cause
    assert fake_procs(tag) == []


@pytest.mark.timeout(200)
def test_a_trickling_v1_models_ends_a_url_run_on_time(scratch):
    # --url without --config and --max-model-len reads max_model_len from GET /v1/models: bounded as a whole
    with standalone("trickle-models") as port:
        t0 = time.monotonic()
        rc, out = cli(["suite", "fake-sanity", "--url", f"http://127.0.0.1:{port}", "--model", "m",
                       "--max-num-seqs", "4", "--release", "h5"], 75)
    assert rc == 2 and time.monotonic() - t0 < 60, out[-1500:]
    assert "--max-model-len" in out


def test_a_soak_too_short_to_fit_a_memory_slope_is_refused_and_an_unfitted_slope_is_never_flat(scratch, monkeypatch):
    # 4 s at a sample a second leaves 2 samples after the skipped half: no slope could be fitted, and "flat" by
    # default passed the memory check without making it
    from validate.runners import soak as soak_mod

    short = {"clients": 2, "duration_s": 4, "prompt_tokens_min": 10, "prompt_tokens_max": 100, "max_tokens": 4,
             "sample_interval_s": 1.0}
    (scratch.root / "suites" / "mini-soak.yaml").write_text(yaml.safe_dump(
        {"name": "mini-soak", "kind": "soak", "params": short, "gate": {"max": {"errors": 0}}}))
    tag = scratch.config("fake-soak")
    assert main(["suite", "mini-soak", "--config", "fake-soak", "--release", "s1"]) == 2  # refused at load
    assert not (scratch.root / "reports" / "s1" / "fake-soak" / "mini-soak.json").exists()
    # a sampler too slow to give the samples the params promised: an error, never a pass
    monkeypatch.setattr(soak_mod, "slope_mib_per_min", lambda *a, **k: None)
    short["sample_interval_s"] = 0.25
    (scratch.root / "suites" / "mini-soak.yaml").write_text(yaml.safe_dump(
        {"name": "mini-soak", "kind": "soak", "params": short, "gate": {"max": {"errors": 0}}}))
    assert main(["suite", "mini-soak", "--config", "fake-soak", "--release", "s2"]) == 2
    rec = record(scratch, "s2", "fake-soak", "mini-soak")
    assert rec["verdict"]["status"] == "error" and "memory slope of" in rec["verdict"]["cause"]
    assert all(m["flat"] is None for m in rec["metrics"]["memory"].values())
    assert fake_procs(tag) == []

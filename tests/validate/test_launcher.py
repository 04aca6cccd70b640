"""The launcher and the engine against the synthetic server: start-up failures, teardown, provenance, faults."""
from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import time

import pytest

from tests.conftest import REPO, fake_procs
from validate.cli import main


def record(scratch, release, cfg, suite="fake-sanity"):
    return json.loads((scratch.root / "reports" / release / cfg / f"{suite}.json").read_text())


def test_ok_run_writes_record_with_provenance(scratch, capsys):
    tag = scratch.config("fake-ok")
    assert main(["suite", "fake-sanity", "--config", "fake-ok", "--release", "t1"]) == 0
    rec = record(scratch, "t1", "fake-ok")
    assert rec["verdict"]["status"] == "pass"
    # 5 prompts solo + ceil(2.0 * 4) = 8 requests per round, 2 rounds
    assert rec["metrics"]["n"] == 16 and rec["metrics"]["bad"] == 0 and rec["metrics"]["solo_right"] == 5
    assert len(rec["items"]) == 5 + 16
    assert rec["server"]["provenance_ok"] is True and rec["server"]["kv_cache_tokens"] == 12345
    assert rec["server"]["provenance"][0].startswith("R9K-PROVENANCE version=")
    assert (scratch.root / "reports" / "t1" / "fake-ok" / "server.log").exists()
    assert fake_procs(tag) == []


def test_server_dies_at_start(scratch, capsys):
    tag = scratch.config("fake-crash", mode="crash")
    assert main(["suite", "fake-sanity", "--config", "fake-crash", "--release", "t2"]) == 2
    out = capsys.readouterr().out
    assert "exited with status 3" in out and "fake engine core failed to start" in out
    rec = record(scratch, "t2", "fake-crash")
    assert rec["verdict"]["status"] == "error" and "launch failed" in rec["verdict"]["cause"]
    assert fake_procs(tag) == []


def test_port_already_in_use(scratch, capsys):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(1)
        port = s.getsockname()[1]
        tag = scratch.config("fake-port", port=port)
        assert main(["suite", "fake-sanity", "--config", "fake-port", "--release", "t3"]) == 2
    assert f"port {port} on 127.0.0.1 is already in use" in capsys.readouterr().out
    assert fake_procs(tag) == []


def test_launch_timeout_stops_server(scratch, capsys):
    tag = scratch.config("fake-hang", mode="hang", timeout=3)
    assert main(["suite", "fake-sanity", "--config", "fake-hang", "--release", "t4"]) == 2
    assert "not ready after 3 s" in capsys.readouterr().out
    assert fake_procs(tag) == []


@pytest.mark.parametrize("mode,why", [("wrong-tree", "server runs plugin source 0123456789abcdef"),
                                      ("no-plugin", "no R9K-PROVENANCE line")])
def test_wrong_tree_is_refused(scratch, mode, why):
    scratch.config("fake-" + mode, mode=mode)
    assert main(["suite", "fake-sanity", "--config", "fake-" + mode, "--release", "t5"]) == 1
    rec = record(scratch, "t5", "fake-" + mode)
    assert rec["verdict"]["status"] == "wrong-tree" and why in rec["verdict"]["cause"]
    assert rec["items"] == [] and rec["metrics"] == {}


def test_server_dies_mid_suite(scratch):
    tag = scratch.config("fake-die", mode="die-after", FAKE_VLLM_DIE_AFTER=4)  # readiness uses 1, solo runs 5
    assert main(["suite", "fake-sanity", "--config", "fake-die", "--release", "t6"]) == 2
    rec = record(scratch, "t6", "fake-die")
    assert rec["verdict"]["status"] == "error" and "server died" in rec["verdict"]["cause"]
    assert fake_procs(tag) == []


def test_stream_cut_mid_answer_is_an_error(scratch):
    scratch.config("fake-cut", mode="cut")
    # readiness asks for 4 tokens and the fake cuts after 2: the launch itself must refuse the server
    assert main(["suite", "fake-sanity", "--config", "fake-cut", "--release", "t7"]) == 2
    rec = record(scratch, "t7", "fake-cut")
    assert "cut mid-answer" in rec["verdict"]["cause"]


def test_unknown_key_in_suite_file_launches_nothing(scratch, capsys):
    tag = scratch.config("fake-ok2")
    path = scratch.root / "suites" / "fake-sanity.yaml"
    path.write_text(path.read_text() + "rounds_typo: 3\n")
    assert main(["suite", "fake-sanity", "--config", "fake-ok2", "--release", "t8"]) == 2
    out = capsys.readouterr().out.replace("\n", "")
    assert "fake-sanity.yaml" in out and "rounds_typo: unknown key" in out
    assert fake_procs(tag) == []
    assert not (scratch.root / "reports" / "t8").exists()


def test_ctrl_c_tears_down_server(scratch, tmp_path):
    tag = scratch.config("fake-slow", FAKE_VLLM_ITL_MS=400, FAKE_VLLM_TOKENS=6)
    env = {"R9K_ROOT": str(scratch.root), "PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"}
    proc = subprocess.Popen([sys.executable, "-m", "validate.cli", "suite", "fake-sanity", "--config", "fake-slow",
                             "--release", "t9"], env=env, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    log = scratch.root / "reports" / "t9" / "fake-slow" / "server.log"
    deadline = time.time() + 30
    while time.time() < deadline and not (log.exists() and "Starting fake vLLM" in log.read_text()):
        time.sleep(0.2)
    time.sleep(3)  # inside the suite now (readiness took ~2.4 s)
    assert fake_procs(tag), "the fake server should be running"
    proc.send_signal(signal.SIGINT)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 130, out.decode()
    assert fake_procs(tag) == []


def test_server_from_another_copy_of_the_sources_is_refused(scratch, tmp_path):
    """A server importing r9k from a copy whose kernel source differs by one comment is refused."""
    import shutil

    other = tmp_path / "production-copy"
    for pkg in ("r9k", "kernels"):
        shutil.copytree(REPO / pkg, other / pkg, ignore=shutil.ignore_patterns("__pycache__"))
    with open(other / "kernels" / "__init__.py", "a") as fh:
        fh.write("# an older tree\n")
    tag = scratch.config("fake-copy")
    cfg_path = scratch.root / "serve" / "fake-copy.yaml"
    cfg_path.write_text(cfg_path.read_text().replace(f"PYTHONPATH: {REPO}", f"PYTHONPATH: {other}:{REPO}"))
    assert main(["suite", "fake-sanity", "--config", "fake-copy", "--release", "t10"]) == 1
    rec = record(scratch, "t10", "fake-copy")
    assert rec["verdict"]["status"] == "wrong-tree"
    from r9k.provenance import source_hash

    theirs, _ = source_hash(other)
    ours, _ = source_hash(REPO)
    assert theirs != ours and f"server runs plugin source {theirs}, the tree under validation is {ours}" == rec["verdict"]["cause"]
    assert fake_procs(tag) == []


@pytest.mark.parametrize("mode", ["die-after", "crash"])
def test_setsid_worker_of_a_dead_server_is_stopped(scratch, mode):
    tag = scratch.config("fake-orphan", mode=mode, FAKE_VLLM_SETSID_CHILD=1, FAKE_VLLM_DIE_AFTER=4)
    assert main(["suite", "fake-sanity", "--config", "fake-orphan", "--release", "t11"]) == 2
    assert fake_procs(tag) == []  # the worker's command line carries the tag too


def test_resume_keeps_the_verdict_and_notices_gate_changes(scratch, capsys):
    scratch.config("fake-res")
    path = scratch.root / "suites" / "fake-sanity.yaml"
    failing = path.read_text().replace("max:\n    bad: 0", "max:\n    bad: 0\n  min:\n    n: 1000")
    assert failing != path.read_text()
    path.write_text(failing)
    assert main(["release", "r1", "--config", "fake-res", "--baseline", "none"]) == 1
    assert main(["release", "r1", "--config", "fake-res", "--resume", "--baseline", "none"]) == 1  # skipped, still failed
    assert "complete record found (fail), not run again" in capsys.readouterr().out
    path.write_text(failing.replace("n: 1000", "n: 1"))  # another gate: the record is not reused
    assert main(["release", "r1", "--config", "fake-res", "--resume", "--baseline", "none"]) == 0
    assert "not run again" not in capsys.readouterr().out


def test_missing_data_fails_before_launch(scratch, capsys, monkeypatch, tmp_path):
    tag = scratch.config("fake-nodata")
    monkeypatch.setenv("R9K_DATA_DIR", str(tmp_path / "nowhere"))
    assert main(["suite", "gsm8k", "--config", "fake-nodata", "--release", "t12"]) == 2
    out = capsys.readouterr().out.replace("\n", "")
    assert "nowhere/gsm8k/test.jsonl not found" in out and "--data-dir" in out and "R9K_DATA_DIR" in out
    assert fake_procs(tag) == [] and not (scratch.root / "reports" / "t12").exists()


def test_malformed_sse_chunk_is_a_launch_failure_not_a_traceback(scratch, capsys):
    import httpx

    from validate.client import OpenAIClient

    async def go():
        t = httpx.MockTransport(lambda r: httpx.Response(200, content=b'data: "oops"\n\ndata: {"choices": [null]}\n\n'))
        async with OpenAIClient("http://x", "m", transport=t) as c:
            return await c.chat([{"role": "user", "content": "hi"}], max_tokens=2)

    import asyncio

    r = asyncio.run(go())
    assert not r.ok and r.error.startswith("malformed stream chunk: ValueError: expected a JSON object")


def test_a_knob_exported_in_the_shell_never_reaches_a_launched_server(scratch, tmp_path, monkeypatch, capsys):
    """R9K_GDN_PREFILL_MAX=0 left in the operator's shell would turn r9k's GDN off on a server whose configuration
    sets no GDN knob, while the record and the dispatch check read the configuration: it is not passed on."""
    import psutil

    from validate.config import find_config
    from validate.server import TAG_ENV, launch, server_environ

    monkeypatch.setenv("R9K_GDN_PREFILL_MAX", "0")
    monkeypatch.setenv("R9K_NOT_A_KNOB", "1")
    monkeypatch.setenv("TRITON_INTERPRET", "1")  # the kernel tests' conftest exports it: never a server's
    assert server_environ({"R9K_GDN_PREFILL_MAX": "0", "R9K_ROOT": "/r", "PATH": "/bin"}) == {"R9K_ROOT": "/r",
                                                                                               "PATH": "/bin"}
    tag = scratch.config("fake-ok", R9K_FP8_BLOCK_GEMM="r9k", FAKE_VLLM_DISPATCH="fp8_block_gemm")
    srv = launch(find_config(scratch.root, "fake-ok"), "m", tmp_path / "server.log")
    try:
        [env] = [p.environ() for p in psutil.process_iter() if p.pid == srv.proc.pid]
        assert TAG_ENV in env and env["R9K_FP8_BLOCK_GEMM"] == "r9k"
        assert "R9K_GDN_PREFILL_MAX" not in env and "R9K_NOT_A_KNOB" not in env and "TRITON_INTERPRET" not in env
    finally:
        srv.stop()
    assert main(["suite", "fake-sanity", "--config", "fake-ok", "--release", "k1"]) == 0
    rec = json.loads((scratch.root / "reports" / "k1" / "fake-ok" / "fake-sanity.json").read_text())
    assert rec["knobs"]["R9K_GDN_PREFILL_MAX"] == 1024 and "?R9K_NOT_A_KNOB" not in rec["knobs"]
    assert ("fake-ok: not passed to the server from this shell: R9K_GDN_PREFILL_MAX, R9K_NOT_A_KNOB"
            in capsys.readouterr().out.replace("\n", " "))
    assert fake_procs(tag) == []

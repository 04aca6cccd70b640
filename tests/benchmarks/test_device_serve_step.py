"""benchmarks/device_run.sh's serving steps on the CPU: serve_stock, serve_r9k and serve_gate run r9k-validate's
own launcher and gates from the archive's environment (a tiny archive here) against the synthetic server, and bring
the records back in one tarball; a gate that cannot decide (no BetterBench records for --perf) fails its step."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from benchmarks.device_env.build import pack

ROOT = Path(__file__).resolve().parents[2]


def _fake_host(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    """A tiny environment archive and the environment device_run.sh runs in against the synthetic server: the
    archive's path, and os.environ with the archive, a site root, the fake-ok configuration and a `python3` on
    PATH that is this interpreter (the host's python3, torch's)."""
    site = tmp_path / "site"
    (site / "placeholder").mkdir(parents=True)
    (site / "placeholder" / "README").write_text("the GPU host's wheels would be here\n")
    archive = tmp_path / "env.tar.xz"
    pack(site, archive, {"vllm": "0.32.0"})
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "python3").write_text(f'#!/bin/sh\nexec "{sys.executable}" "$@"\n')
    (bindir / "python3").chmod(0o755)
    return archive, {**os.environ, "R9K_DEVICE_ENV": str(archive), "R9K_SITE_ROOT": str(tmp_path / "sites"),
                     "R9K_SERVE_CONFIG": "fake-ok", "R9K_SERVE_SUITES": "fake-sanity",
                     "PATH": f"{bindir}:{os.environ['PATH']}"}


@pytest.mark.timeout(420)
def test_serve_steps_run_the_pair_and_the_gates(scratch, tmp_path):
    scratch.config("fake-ok")
    archive, env = _fake_host(tmp_path)
    out = tmp_path / "out"
    r = subprocess.run(["bash", "benchmarks/device_run.sh", str(out), "serve_stock", "serve_r9k", "serve_gate"],
                       cwd=ROOT, env=env, capture_output=True, text=True, timeout=400)
    steps = {s["step"]: s["rc"] for s in map(json.loads, (out / "steps.jsonl").read_text().splitlines())}
    # the eval gate pairs nothing (no eval suite) and exits 2; --perf has no BetterBench records: exit 2, never 0
    assert steps == {"serve_stock": 0, "serve_r9k": 0, "serve_gate": 2, "serve_gate_perf": 2}, r.stdout[-3000:]
    assert r.returncode == 1
    with tarfile.open(out / "reports.tgz") as t:
        names = set(t.getnames())
    for release in ("stock", "r9k"):
        assert f"reports/{release}/fake-ok/fake-sanity.json" in names
        assert f"reports/{release}/RELEASE.md" in names
    log = (out / "serve_r9k.log").read_text()
    assert "baseline: stock (named with --baseline)" in log, log[-2000:]
    stock = json.loads(subprocess.run(["tar", "-xzOf", str(out / "reports.tgz"), "reports/stock/fake-ok/fake-sanity.json"],
                                      capture_output=True, text=True, timeout=30).stdout)
    assert stock["knobs"]["R9K_GDN_PREFILL_CONV"] == "stock" and stock["knobs"]["R9K_FP8_BLOCK_GEMM"] == "stock"


@pytest.mark.timeout(480)
def test_the_detached_pipeline_runs_release_steps_and_watch_brings_them_back(scratch, tmp_path):
    """device_serve.sh start runs device_run.sh in its own session from a copy of the checkout; release:NAME:KNOBS
    steps make the releases `stock` and `stock-again` (gated against `stock`); watch waits for the end and copies
    the pipeline's log, its step lines and the records into OUT, at most 8 files."""
    scratch.config("fake-ok")
    archive, env = _fake_host(tmp_path)
    # start copies the checkout, which needs the archive at .device_env there: a copy of the tree with it beside
    tree = tmp_path / "tree"
    subprocess.run(["git", "worktree", "list"], cwd=ROOT, capture_output=True, timeout=30)
    subprocess.run(f"tar cf - --exclude=./.git --exclude=./.venv --exclude=./.device_env --exclude=./reports . "
                   f"| (mkdir -p {tree} && tar xf - -C {tree})", shell=True, cwd=ROOT, check=True, timeout=120)
    (tree / ".device_env").mkdir()
    (tree / ".device_env" / "gpu-env.tar.xz").write_bytes(archive.read_bytes())
    work, out = tmp_path / "work", tmp_path / "back"
    # started as the device tool starts a command, with job control on (`set -m`): a background job is then its
    # own process group's leader, so setsid forks and the pipeline outlives the process that started it
    r = subprocess.run(["bash", "-mc", 'bash benchmarks/device_serve.sh start "$0" release:stock:stock '
                        'release:stock-again:stock', str(work)], cwd=tree, env=env, capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0 and "started" in r.stdout, r.stderr
    w = subprocess.run(["bash", "benchmarks/device_serve.sh", "watch", str(work), str(out), "400"], cwd=tree,
                       env=env, capture_output=True, text=True, timeout=420)
    assert "== pipeline ended" in w.stdout, w.stdout[-2000:]
    steps = {s["step"]: s["rc"] for s in map(json.loads, (out / "steps.jsonl").read_text().splitlines())}
    assert steps == {"release_stock_fake-ok": 0, "release_stock-again_fake-ok": 0}, w.stdout[-3000:]
    assert len(list(out.iterdir())) <= 8
    with tarfile.open(out / "reports.tgz") as t:
        names = set(t.getnames())
    assert {"reports/stock/fake-ok/fake-sanity.json", "reports/stock-again/fake-ok/fake-sanity.json"} <= names
    log = (out / "pipeline.log").read_text()
    assert "baseline: stock (named with --baseline)" in log or "stock" in log
    again = json.loads(subprocess.run(["tar", "-xzOf", str(out / "reports.tgz"),
                                       "reports/stock-again/fake-ok/fake-sanity.json"],
                                      capture_output=True, text=True, timeout=30).stdout)
    assert again["knobs"]["R9K_FP8_BLOCK_GEMM"] == "stock"
    # one pipeline at a time in a work folder: a live pid there refuses a second start
    (work / "pid").write_text(f"{os.getpid()}\n")
    twice = subprocess.run(["bash", "benchmarks/device_serve.sh", "start", str(work), "env"], cwd=tree, env=env,
                           capture_output=True, text=True, timeout=60)
    assert twice.returncode == 2 and "already running" in twice.stderr

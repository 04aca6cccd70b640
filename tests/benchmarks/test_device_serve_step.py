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


@pytest.mark.timeout(420)
def test_serve_steps_run_the_pair_and_the_gates(scratch, tmp_path):
    scratch.config("fake-ok")
    site = tmp_path / "site"
    (site / "placeholder").mkdir(parents=True)
    (site / "placeholder" / "README").write_text("the GPU host's wheels would be here\n")
    archive = tmp_path / "env.tar.xz"
    pack(site, archive, {"vllm": "0.32.0"})
    out = tmp_path / "out"
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "python3").write_text(f'#!/bin/sh\nexec "{sys.executable}" "$@"\n')  # the host's python3 (torch's)
    (bindir / "python3").chmod(0o755)
    env = {**os.environ, "R9K_DEVICE_ENV": str(archive), "R9K_SITE_ROOT": str(tmp_path / "sites"),
           "R9K_SERVE_CONFIG": "fake-ok", "R9K_SERVE_SUITES": "fake-sanity", "PATH": f"{bindir}:{os.environ['PATH']}"}
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

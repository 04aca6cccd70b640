"""Releases on a real two-node Ray cluster on this machine (`ray start --head` plus a second node with other
custom resources), with synthetic-server configurations that each fit only one node.

Run by tests/validate/test_ray_executor.py inside a network namespace that has only loopback: Ray binds its nodes to
the machine's primary address and ignores --node-ip-address=127.0.0.1, and this project's tests send traffic
to loopback only. Not collected on its own (the file name has no test_ prefix)."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from pathlib import Path

import psutil
import pytest
import yaml

from tests.conftest import REPO, fake_procs
from validate.cli import main

RAY = shutil.which("ray", path=str(Path(os.sys.executable).parent)) or shutil.which("ray")
pytestmark = pytest.mark.skipif(RAY is None, reason="ray is not installed")


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("ray")
    port = _free_port()
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0", "PYTHONPATH": str(REPO)}
    common = ["--num-cpus=2", "--object-store-memory=100000000", "--disable-usage-stats"]
    subprocess.run([RAY, "start", "--head", f"--port={port}", "--node-ip-address=127.0.0.1", "--include-dashboard=false",
                    f"--temp-dir={tmp}", '--resources={"box_a": 1}', *common], check=True, env=env, capture_output=True)
    address = f"127.0.0.1:{port}"
    try:
        subprocess.run([RAY, "start", f"--address={address}", "--node-ip-address=127.0.0.1",
                        '--resources={"box_b": 1}', *common], check=True, env=env, capture_output=True)
        yield address
    finally:
        subprocess.run([RAY, "stop", "--force"], env=env, capture_output=True)


def two_configs(scratch):
    tag_a = scratch.config("fake-a")
    tag_b = scratch.config("fake-b", FAKE_VLLM_ITL_MS=300)
    for name, box in (("fake-a", "box_a"), ("fake-b", "box_b")):
        p = scratch.root / "serve" / f"{name}.yaml"
        cfg = yaml.safe_load(p.read_text())
        cfg["hardware"] = {"resources": {box: 1}}
        p.write_text(yaml.safe_dump(cfg))
    return tag_a, tag_b


def rec(scratch, release, cfg):
    return json.loads((scratch.root / "reports" / release / cfg / "fake-sanity.json").read_text())


def test_release_on_two_nodes(cluster, scratch):
    two_configs(scratch)
    assert main(["release", "ray1", "--executor", "ray", "--address", cluster]) == 0
    a, b = rec(scratch, "ray1", "fake-a"), rec(scratch, "ray1", "fake-b")
    assert a["verdict"]["status"] == b["verdict"]["status"] == "pass"
    assert a["metrics"]["n"] == b["metrics"]["n"] == 16
    # identical in shape to a local run's record
    assert main(["release", "local1", "--config", "fake-a"]) == 0
    assert set(rec(scratch, "local1", "fake-a")) == set(a)
    assert (scratch.root / "reports" / "ray1" / "fake-b" / "server.log").exists()
    assert (scratch.root / "reports" / "ray1" / "RELEASE.md").exists()


def test_unplaceable_config_fails_at_once(cluster, scratch):
    scratch.config("fake-big")
    p = scratch.root / "serve" / "fake-big.yaml"
    cfg = yaml.safe_load(p.read_text())
    cfg["hardware"] = {"gpus": 4, "kind": "r9700"}
    p.write_text(yaml.safe_dump(cfg))
    t0 = time.monotonic()
    assert main(["release", "ray2", "--executor", "ray", "--address", cluster, "--config", "fake-big"]) == 2
    r = rec(scratch, "ray2", "fake-big")
    assert r["verdict"]["cause"] == "not placed: no node of the Ray cluster has resource 'r9700': 4 (the most any node has is 0)"
    assert time.monotonic() - t0 < 60


def test_lost_task_fails_its_config_only_and_resume_reruns_it(cluster, scratch):
    tag_a, tag_b = two_configs(scratch)
    import threading

    def kill_b_worker():
        deadline = time.time() + 60
        while time.time() < deadline:
            procs = fake_procs(tag_b)
            if procs:
                time.sleep(2.0)  # inside the suite (readiness is one short request)
                try:
                    procs[0].parent().kill()  # the Ray worker running fake-b's task
                except psutil.Error:
                    pass
                return
            time.sleep(0.2)

    killer = threading.Thread(target=kill_b_worker)
    killer.start()
    code = main(["release", "ray3", "--executor", "ray", "--address", cluster])
    killer.join()
    assert code == 2
    a, b = rec(scratch, "ray3", "fake-a"), rec(scratch, "ray3", "fake-b")
    assert a["verdict"]["status"] == "pass" and len(a["items"]) == 5 + 16
    assert b["verdict"]["status"] == "error" and "lost mid-task" in b["verdict"]["cause"]
    deadline = time.time() + 10
    while fake_procs(tag_b) and time.time() < deadline:  # the orphaned server follows its worker
        time.sleep(0.2)
    assert fake_procs(tag_b) == []
    # --resume runs only what is missing: fake-b
    p = scratch.root / "serve" / "fake-b.yaml"
    p.write_text(p.read_text().replace("FAKE_VLLM_ITL_MS: '300'", "FAKE_VLLM_ITL_MS: '2'"))
    assert main(["release", "ray3", "--executor", "ray", "--address", cluster, "--resume"]) == 0
    assert rec(scratch, "ray3", "fake-a")["started_at"] == a["started_at"]  # not run again
    assert rec(scratch, "ray3", "fake-b")["verdict"]["status"] == "pass"

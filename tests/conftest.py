"""Shared fixtures: a scratch checkout with synthetic-server configurations, and process-leak checks."""
from __future__ import annotations

import json
import shutil
import uuid
from pathlib import Path

import psutil
import pytest
import yaml

REPO = Path(__file__).resolve().parent.parent


def fake_procs(tag: str) -> list[psutil.Process]:
    """Live processes whose command line carries ``tag`` (a served model name unique to one test)."""
    out = []
    for p in psutil.process_iter(["cmdline"]):
        try:
            if p.info["cmdline"] and tag in " ".join(p.info["cmdline"]) and p.status() != psutil.STATUS_ZOMBIE:
                out.append(p)
        except psutil.Error:
            pass
    return out


class Scratch:
    """A checkout-like folder: the real suites/ and templates/, plus serve/ configurations of the fake server."""

    def __init__(self, root: Path):
        self.root = root
        shutil.copytree(REPO / "suites", root / "suites")
        shutil.copytree(REPO / "templates", root / "templates")
        (root / "serve").mkdir()
        (root / "reports").mkdir()
        # numeric prompts the fake server answers right (it repeats the prompt's last number)
        (root / "suites" / "data" / "fake_prompts.yaml").write_text(yaml.safe_dump(
            [{"id": f"n{i}", "prompt": f"Repeat the number {i * 7}", "expect": str(i * 7)} for i in range(1, 6)]))
        (root / "suites" / "fake-sanity.yaml").write_text(yaml.safe_dump({
            "name": "fake-sanity", "kind": "strict-sanity", "params": {"prompts_file": "data/fake_prompts.yaml",
            "overload": [2.0], "rounds": 2, "max_tokens": 6}, "gate": {"max": {"bad": 0}}}))
        (root / "suites" / "release.yaml").write_text(yaml.safe_dump({"configs": [], "suites": [{"suite": "fake-sanity"}]}))

    def config(self, name: str, mode: str = "ok", timeout: float = 30, port: int | None = None,
               entrypoint: str = "tests.fake_vllm", **env) -> str:
        """Write serve/<name>.yaml for the fake server in ``mode`` (``entrypoint``: tests.hostile_vllm for one that
        misbehaves by ``HOSTILE_MODE``); returns the unique served name (a tag)."""
        tag = f"fake-{uuid.uuid4().hex[:10]}"
        server = {"max_num_seqs": 4, "max_model_len": 4096, "entrypoint": entrypoint}
        if port:
            server["port"] = port
        cfg = {
            "name": name, "model": {"path": "fake-model", "served_name": tag}, "server": server,
            "env": {"FAKE_VLLM_MODE": mode, "PYTHONPATH": str(REPO), **{k: str(v) for k, v in env.items()}},
            "launch_timeout_s": timeout,
        }
        (self.root / "serve" / f"{name}.yaml").write_text(yaml.safe_dump(cfg))
        cl = yaml.safe_load((self.root / "suites" / "release.yaml").read_text())
        cl["configs"] = sorted(set(cl["configs"]) | {name})
        (self.root / "suites" / "release.yaml").write_text(yaml.safe_dump(cl))
        return tag


def tiny_gsm8k(folder: Path, n_test: int = 10) -> Path:
    """A made-up GSM8K-shaped data folder (``n_test`` test, 30 train problems) for tests that need data but not
    the real set: the synthetic server answers whatever it is asked."""
    d = folder / "gsm8k"
    d.mkdir(parents=True, exist_ok=True)
    for split, n in (("test", n_test), ("train", 30)):
        rows = [{"question": f"A farmer has {i} cows and buys {i + 3} more. How many cows does the farmer have now?",
                 "answer": f"The farmer has {i} + {i + 3} = {2 * i + 3} cows.\n#### {2 * i + 3}"} for i in range(n)]
        (d / f"{split}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return folder


@pytest.fixture
def scratch(tmp_path, monkeypatch) -> Scratch:
    s = Scratch(tmp_path / "checkout")
    monkeypatch.setenv("R9K_ROOT", str(s.root))
    monkeypatch.setenv("R9K_DATA_DIR", str(tiny_gsm8k(tmp_path / "data")))
    return s


@pytest.fixture(scope="session")
def smol_server(tmp_path_factory):
    """The real cpu-smol vLLM server, launched once per test session and stopped at its end.

    Yields (server, log_path). Slow: the first start on a machine compiles for ~2 minutes.
    """
    from validate.config import find_config
    from validate.models import resolve_model
    from validate.server import launch

    cfg = find_config(REPO, "cpu-smol")
    model = resolve_model(cfg.model)
    log = tmp_path_factory.mktemp("smol") / "server.log"
    srv = launch(cfg, model, log)
    try:
        yield srv, log
    finally:
        srv.stop()

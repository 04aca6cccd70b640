"""validate/sandbox/isolation.py: the sandbox program on its own (backend "none": no judge, the test speaks the
wire format), and its pieces in this process or a child of their own."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import threading

from pathlib import Path

import pytest

from validate.sandbox import isolation, program, wire

REPO = Path(isolation.__file__).resolve().parents[2]

pytestmark = pytest.mark.timeout(60)


def start(tmp_path, source: str, entry: str = "f", **over):
    """The sandbox process on ``source``; returns (process, call pipe's write end, result pipe's read end)."""
    call_r, call_w = os.pipe()
    res_r, res_w = os.pipe()
    cfg = {"call_fd": call_r, "result_fd": res_w, "work": str(tmp_path), "uid": 65534, "backend": "none",
           "program": source, "entry_point": entry, "cpu_s": 5, "memory": 512 << 20, "fsize": 1 << 20, "hide": [],
           "fail_mount": None, **over}
    proc = subprocess.Popen([sys.executable, "-I", "-c", program("isolation")], stdin=subprocess.PIPE,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, pass_fds=(call_r, res_w),
                            cwd=tmp_path)
    os.close(call_r)
    os.close(res_w)
    proc.stdin.write(json.dumps(cfg).encode())
    proc.stdin.close()
    return proc, call_w, res_r


def finish(proc, call_w, res_r):
    os.close(call_w)
    assert proc.wait(timeout=30) == 0
    os.close(res_r)


def test_setup_ready_then_calls_with_results_and_exceptions(tmp_path):
    proc, call_w, res_r = start(tmp_path, "def f(x, k=1):\n    return {'got': [x, k]} if x else 1 // x\n")
    setup = wire.read_frame(res_r)
    assert setup["event"] == "setup" and setup["ok"] is True
    assert any(c.startswith("rlimits: AS 512 MiB") for c in setup["contained"])
    assert any(c.startswith("guard:") for c in setup["contained"])
    assert wire.read_frame(res_r) == {"event": "ready"}
    wire.write_frame(call_w, {"seq": 1, "args": wire.encode([(2, 3)]), "kwargs": wire.encode({"k": "z"})})
    reply = wire.read_frame(res_r)
    assert reply["seq"] == 1 and wire.decode(reply["value"]) == {"got": [(2, 3), "z"]}
    wire.write_frame(call_w, {"seq": 2, "args": wire.encode([0]), "kwargs": wire.encode({})})
    assert wire.read_frame(res_r) == {"seq": 2, "raised": ["ZeroDivisionError", "integer division or modulo by zero"]}
    finish(proc, call_w, res_r)


@pytest.mark.parametrize("source, raised", [("f = 3\n", "TypeError"), ("g = 1\n", "NameError"),
                                            ("def f(:\n", "SyntaxError"), ("raise KeyError('k')\n", "KeyError")])
def test_a_program_that_does_not_load_says_why(tmp_path, source, raised):
    proc, call_w, res_r = start(tmp_path, source)
    assert wire.read_frame(res_r)["ok"] is True
    load = wire.read_frame(res_r)
    assert load["event"] == "load" and load["raised"][0] == raised
    finish(proc, call_w, res_r)


def test_a_setup_step_that_fails_is_reported_and_the_program_never_runs(tmp_path):
    marker = tmp_path / "ran"
    proc, call_w, res_r = start(tmp_path, f"open({str(marker)!r}, 'w')\ndef f(): pass\n",
                                work=str(tmp_path / "missing"))
    setup = wire.read_frame(res_r)
    assert setup["event"] == "setup" and setup["ok"] is False and "FileNotFoundError" in setup["detail"]
    finish(proc, call_w, res_r)
    assert not marker.exists()


def test_the_guard_blocks_writes_outside_and_spawning(tmp_path):
    code = ("import os, sys; from validate.sandbox import isolation; isolation.install_guard(sys.argv[1])\n"
            "open(os.path.join(sys.argv[1], 'in'), 'w').write('ok')\n"
            "out = []\n"
            "for f in (lambda: open(sys.argv[2], 'w'), lambda: os.system('true'), lambda: os.kill(1, 0),\n"
            "          lambda: os.unlink(sys.argv[2]), lambda: __import__('ctypes')):\n"
            "    try:\n        f()\n    except (PermissionError, ImportError) as e:\n        out.append(type(e).__name__)\n"
            "print(out)\n")
    outside = tmp_path.parent / f"{tmp_path.name}-outside"
    r = subprocess.run([sys.executable, "-c", code, str(tmp_path), str(outside)], capture_output=True, text=True,
                       timeout=30, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == str(["PermissionError"] * 4 + ["ModuleNotFoundError"])
    assert (tmp_path / "in").read_text() == "ok" and not outside.exists()


def test_serve_answers_until_the_call_pipe_closes():
    call_r, call_w = os.pipe()
    res_r, res_w = os.pipe()
    t = threading.Thread(target=isolation.serve, args=(lambda *a: iter(a), call_r, res_w))
    t.start()
    wire.write_frame(call_w, {"seq": 7, "args": wire.encode([1]), "kwargs": wire.encode({})})
    reply = wire.read_frame(res_r)
    assert reply["seq"] == 7 and isinstance(wire.decode(reply["value"]), wire.Opaque)
    os.close(call_w)
    t.join(10)
    assert not t.is_alive()
    for fd in (call_r, res_r, res_w):
        os.close(fd)


def test_raised_never_raises():
    class Bad(Exception):
        def __str__(self):
            raise RuntimeError("no")
    assert isolation.raised(Bad()) == ["BaseException", "(unprintable)"]
    assert isolation.raised(ValueError("x" * 1000))[1] == "x" * 300

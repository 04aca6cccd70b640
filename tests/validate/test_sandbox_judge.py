"""validate/sandbox/judge.py: the judge program against a sandbox the test plays (the wire format by hand), and
its proxy and messages in this process."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from validate.sandbox import judge, program, wire

pytestmark = pytest.mark.timeout(60)
PROMPT = "def f(x):\n    pass\n"
TEST = "def check(candidate):\n    assert candidate(1) == 2\n"
NONCE = "n0nce"


def run_judge(play, test: str = TEST) -> list[dict]:
    """Run the judge; ``play(call_r, res_w)`` is the sandbox. Returns the nonce-prefixed events it wrote."""
    call_r, call_w = os.pipe()
    res_r, res_w = os.pipe()
    ver_r, ver_w = os.pipe()
    cfg = {"verdict_fd": ver_w, "call_fd": call_w, "result_fd": res_r, "nonce": NONCE, "prompt": PROMPT,
           "test": test, "entry_point": "f", "memory": 2048 << 20, "cpu_s": 10, "wall_s": 10}
    proc = subprocess.Popen([sys.executable, "-I", "-c", program("judge")], stdin=subprocess.PIPE,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, pass_fds=(call_w, res_r, ver_w))
    for fd in (call_w, res_r, ver_w):
        os.close(fd)
    proc.stdin.write(json.dumps(cfg).encode())
    proc.stdin.close()
    try:
        play(call_r, res_w)
    finally:
        os.close(res_w)
        assert proc.wait(timeout=30) == 0
    with os.fdopen(ver_r) as f:
        lines = f.read().splitlines()
    os.close(call_r)
    assert all(ln.startswith(NONCE) for ln in lines)
    return [json.loads(ln[len(NONCE):]) for ln in lines]


def ready(res_w):
    wire.write_frame(res_w, {"event": "setup", "ok": True, "contained": ["c"], "not_contained": []})
    wire.write_frame(res_w, {"event": "ready"})


def answer(value, seq=None):
    def play(call_r, res_w):
        ready(res_w)
        call = wire.read_frame(call_r)
        assert wire.decode(call["args"]) == [1] and wire.decode(call["kwargs"]) == {}
        wire.write_frame(res_w, {"seq": call["seq"] if seq is None else seq, "value": wire.encode(value)})
    return play


def test_a_right_answer_passes_and_the_setup_is_reported():
    setup, done = run_judge(answer(2))
    assert setup == {"event": "setup", "contained": ["c"], "not_contained": []}
    assert (done["event"], done["status"], done["phase"]) == ("done", "passed", "check")


def test_a_wrong_answer_fails_naming_the_test_line():
    (_, done) = run_judge(answer(3))
    assert done["status"] == "failed" and "test line 2: assert candidate(1) == 2" in done["detail"]


def test_a_reply_to_a_call_not_made_is_an_error_even_when_the_test_swallows_it():
    test = "def check(candidate):\n    try:\n        candidate(1)\n    except BaseException:\n        pass\n"
    (_, done) = run_judge(answer(2, seq=5), test)
    assert (done["status"], done["fault"]) == ("error", "malformed")


def test_a_sandbox_that_ends_before_its_setup_is_infra():
    (done,) = run_judge(lambda call_r, res_w: None)
    assert (done["status"], done["phase"], done["fault"]) == ("infra", "setup", "ended")


def test_a_program_that_did_not_load_is_an_error():
    def play(call_r, res_w):
        wire.write_frame(res_w, {"event": "setup", "ok": True, "contained": [], "not_contained": []})
        wire.write_frame(res_w, {"event": "load", "raised": ["SyntaxError", "bad"]})
    (_, done) = run_judge(play)
    assert (done["status"], done["phase"], done["detail"]) == ("error", "program", "SyntaxError: bad")


def test_rebuild_gives_builtin_exceptions_only():
    assert type(judge.rebuild("ValueError", "m")) is ValueError
    for name in ("SystemExit", "Nope", "os.system", "KeyboardInterrupt"):
        e = judge.rebuild(name, "m")
        assert type(e) is judge.CandidateError and str(e) == f"{name}: m"


@pytest.fixture
def proxy(monkeypatch):
    """The judge's proxy wired to pipes in this process: (the sandbox's call reader, its result writer)."""
    call_r, call_w = os.pipe()
    res_r, res_w = os.pipe()
    monkeypatch.setattr(judge, "CALLS", call_w)
    monkeypatch.setattr(judge, "RESULTS", res_r)
    monkeypatch.setattr(judge, "fault", None)
    monkeypatch.setattr(judge, "calls", 0)
    yield call_r, res_w
    for fd in (call_r, call_w, res_r, res_w):
        os.close(fd)


def test_the_proxy_decodes_values_and_raises_the_candidates_exceptions(proxy):
    call_r, res_w = proxy
    wire.write_frame(res_w, {"seq": 1, "value": wire.encode({1: (2,)})})
    assert judge.candidate(1, k=[2]) == {1: (2,)}
    assert wire.read_frame(call_r) == {"seq": 1, "args": wire.encode([1]), "kwargs": wire.encode({"k": [2]})}
    wire.write_frame(res_w, {"seq": 2, "raised": ["IndexError", "i"]})
    with pytest.raises(IndexError, match="^i$"):
        judge.candidate()


def test_the_proxy_refuses_what_it_cannot_send_and_remembers_a_fault(proxy):
    call_r, res_w = proxy
    with pytest.raises(judge.JudgeFault):
        judge.candidate(object())
    wire.write_frame(res_w, {"seq": 1, "value": ["zz"]})
    with pytest.raises(judge.SandboxFault) as first:
        judge.candidate(1)
    with pytest.raises(judge.SandboxFault) as again:  # later calls raise the same fault, sending nothing
        judge.candidate(1)
    assert first.value is again.value and first.value.kind == "malformed"


def test_describe_names_the_test_line(monkeypatch):
    monkeypatch.setattr(judge, "TEST_LINES", ["def check(c):", "    assert c(1) == 2"])
    g: dict = {}
    exec(compile("def check(c):\n    assert c(1) == 2\n", "<test>", "exec"), g)
    with pytest.raises(AssertionError) as e:
        g["check"](lambda x: 3)
    assert judge.describe(e.value) == "AssertionError (test line 2: assert c(1) == 2)"

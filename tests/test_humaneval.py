"""validate/evals/humaneval.py: loading, extraction, and the sandbox (each run is a real subprocess, ~0.15 s)."""
from __future__ import annotations

import gzip
import json
import sys

import psutil
import pytest

from validate.errors import InputError
from validate.evals import humaneval as he
from validate.evals.humaneval import extract_code, load_problems, run_all, run_problem


@pytest.fixture(scope="module")
def problems():
    return {p.task_id: p for p in load_problems()}


def canonical(p) -> str:
    return p.prompt + p.canonical_solution


# ---------------------------------------------------------------------------------------------------- data


def test_loads_164_unique_problems():
    ps = load_problems()
    assert len(ps) == 164
    assert len({p.task_id for p in ps}) == 164
    assert ps[0].task_id == "HumanEval/0" and ps[0].entry_point == "has_close_elements"
    assert ps[0]["test"] == ps[0].test
    assert len(ps.sha256) == 64 and ps.sha256 == load_problems().sha256
    assert len({p.prompt_sha256 for p in ps}) == 164


def test_load_override_and_errors(tmp_path):
    ps = load_problems()
    rows = [{k: getattr(p, k) for k in ("task_id", "prompt", "canonical_solution", "test", "entry_point")}
            for p in ps[:3]]
    plain = tmp_path / "sub.jsonl"
    plain.write_text("".join(json.dumps(r) + "\n" for r in rows))
    gz = tmp_path / "sub.jsonl.gz"
    gz.write_bytes(gzip.compress(plain.read_bytes()))
    a, b = load_problems(plain), load_problems(gz)
    assert [p.task_id for p in a] == ["HumanEval/0", "HumanEval/1", "HumanEval/2"]
    assert a.sha256 == b.sha256 != ps.sha256
    (tmp_path / "dup.jsonl").write_text(json.dumps(rows[0]) + "\n" + json.dumps(rows[0]) + "\n")
    with pytest.raises(InputError, match="repeats"):
        load_problems(tmp_path / "dup.jsonl")
    (tmp_path / "bad.jsonl").write_text('{"task_id": "x"}\n')
    with pytest.raises(InputError, match="bad.jsonl:1"):
        load_problems(tmp_path / "bad.jsonl")
    with pytest.raises(InputError, match="cannot read"):
        load_problems(tmp_path / "missing.jsonl")


# ---------------------------------------------------------------------------------------------------- sandbox

SAMPLE = [0, 10, 32, 38, 50, 53, 100, 129, 150, 162]


def test_canonical_solutions_pass(problems):
    pairs = [(problems[f"HumanEval/{i}"], canonical(problems[f"HumanEval/{i}"])) for i in SAMPLE]
    seen = []
    results = run_all(pairs, workers=2, progress=lambda done, total, r: seen.append((done, total)))
    assert [r.task_id for r in results] == [p.task_id for p, _ in pairs]
    assert all(r.status == "passed" for r in results), [(r.task_id, r.status, r.detail) for r in results]
    assert sorted(seen) == [(i, len(pairs)) for i in range(1, len(pairs) + 1)]
    assert results[0].contained  # what was applied is recorded


def test_wrong_answer_fails(problems):
    p = problems["HumanEval/2"]  # truncate_number
    r = run_problem(p.prompt + "    return None\n", p)
    assert r.status == "failed" and "AssertionError" in r.detail


def test_syntax_error_and_exception_are_errors(problems):
    p = problems["HumanEval/2"]
    r = run_problem(p.prompt + "    return (\n", p)
    assert r.status == "error" and "SyntaxError" in r.detail
    r = run_problem(p.prompt + "    raise ValueError('boom')\n", p)
    assert r.status == "error" and "ValueError: boom" in r.detail


def test_infinite_loop_times_out_and_is_killed(problems):
    p = problems["HumanEval/2"]
    r = run_problem(p.prompt + "    while True:\n        pass\n", p, timeout_s=2)
    assert r.status == "timeout"
    assert 1.9 < r.duration_s < 10
    assert r.pid is not None and not psutil.pid_exists(r.pid)


def test_cpu_limit_is_a_timeout(problems):
    p = problems["HumanEval/2"]
    r = run_problem(p.prompt + "    while True:\n        pass\n", p, timeout_s=20, cpu_s=1)
    assert r.status == "timeout" and "CPU" in r.detail
    assert r.duration_s < 15


@pytest.mark.parametrize("hog", [
    "x = []\nwhile True:\n    x.append(' ' * 10**6)\n",
    "x = bytearray(10**11)\n",
])
def test_unbounded_allocation_is_contained(problems, hog):
    p = problems["HumanEval/2"]
    r = run_problem(canonical(p) + hog, p, timeout_s=20, memory_mb=256)
    assert r.status in ("error", "failed") and "MemoryError" in r.detail, (r.status, r.detail)


def test_write_outside_directory_is_blocked(problems, tmp_path):
    p = problems["HumanEval/2"]
    target = tmp_path / "escaped.txt"
    r = run_problem(canonical(p) + f"open({str(target)!r}, 'w').write('x')\n", p)
    assert r.status != "passed" and not target.exists()
    r = run_problem(canonical(p) + f"import pathlib\npathlib.Path({str(target)!r}).write_text('x')\n", p)
    assert r.status != "passed" and not target.exists()


def test_write_bypassing_the_guard_hits_a_read_only_mount(problems, tmp_path):
    p = problems["HumanEval/2"]
    target = tmp_path / "escaped_raw.txt"
    r = run_problem(canonical(p) + f"import _io\n_io.FileIO({str(target)!r}, 'w').write(b'x')\n", p)
    if not any(c.startswith("file system: private mount namespace") for c in r.contained):
        pytest.skip(f"no read-only mounts on this platform: {r.not_contained}")
    assert r.status == "error" and "Read-only file system" in r.detail
    assert not target.exists()


def test_writing_inside_own_directory_works(problems):
    p = problems["HumanEval/2"]
    code = "open('scratch.txt', 'w').write('ok')\nassert open('scratch.txt').read() == 'ok'\n"
    r = run_problem(canonical(p) + code, p)
    assert r.status == "passed", r.detail


@pytest.mark.parametrize("exit_code", ["import sys\nsys.exit(0)\n", "import os\nos._exit(0)\n",
                                       "raise SystemExit\n"])
def test_early_exit_is_not_a_pass(problems, exit_code):
    p = problems["HumanEval/2"]
    r = run_problem(canonical(p) + exit_code, p)
    assert r.status == "error", (r.status, r.detail)
    # the same exit inside the function under test, i.e. during check()
    body = "    " + exit_code.replace("\n", "\n    ").rstrip() + "\n"
    r = run_problem(p.prompt + body, p)
    assert r.status == "error", (r.status, r.detail)


def test_spawning_and_network_are_blocked(problems):
    p = problems["HumanEval/2"]
    for code in ["import os\nos.system('true')\n", "import subprocess\nsubprocess.run(['true'])\n",
                 "import os\nos.fork()\n", "import ctypes\n"]:
        r = run_problem(canonical(p) + code, p)
        assert r.status == "error", (code, r.status, r.detail)
    r = run_problem(canonical(p) + "import socket\nsocket.create_connection(('192.0.2.1', 80), timeout=1)\n", p)
    assert r.status == "error"
    if any(c.startswith("network:") for c in r.contained):
        assert "unreachable" in r.detail or "Errno" in r.detail


def test_output_flood_is_cut(problems):
    p = problems["HumanEval/2"]
    r = run_problem(canonical(p) + "while True:\n    print('x' * 1000)\n", p, fsize_mb=1)
    assert r.status == "error" and ("File too large" in r.detail or "file-size" in r.detail), r.detail


def test_main_guard_does_not_run(problems):
    p = problems["HumanEval/2"]
    r = run_problem(canonical(p) + "if __name__ == '__main__':\n    raise SystemExit(1)\n", p)
    assert r.status == "passed"


def test_spawn_failure_is_infra(problems, monkeypatch):
    p = problems["HumanEval/2"]
    monkeypatch.setattr(sys, "executable", "/nonexistent/python3")
    r = run_problem(canonical(p), p)
    assert r.status == "infra" and "spawn" in r.detail


def test_bad_limits():
    with pytest.raises(ValueError):
        run_problem("", he.Problem("t", "", "", "", "f"), timeout_s=0)
    with pytest.raises(ValueError):
        run_all([], workers=0)


# ---------------------------------------------------------------------------------------------------- extraction


def test_fenced_block_with_prose(problems):
    p = problems["HumanEval/0"]
    reply = ("Sure! Here is an O(n^2) solution:\n\n```python\nfrom typing import List\n\n"
             "def has_close_elements(numbers: List[float], threshold: float) -> bool:\n"
             "    for i, a in enumerate(numbers):\n        for b in numbers[i + 1:]:\n"
             "            if abs(a - b) < threshold:\n                return True\n    return False\n```\n\n"
             "It compares every pair. Example:\n```\n>>> has_close_elements([1.0, 2.0], 0.5)\nFalse\n```\n")
    prog = extract_code(reply, p)
    assert prog.startswith(p.prompt) and "Sure!" not in prog and ">>>" not in prog.split(p.prompt, 1)[1]
    assert run_problem(prog, p).status == "passed"


def test_python_block_preferred_over_other_languages(problems):
    p = problems["HumanEval/2"]
    reply = "Run it with:\n```bash\npython sol.py\n```\nCode:\n```py\ndef truncate_number(number):\n" \
            "    return number % 1.0\n```"
    prog = extract_code(reply, p)
    assert "python sol.py" not in prog
    assert run_problem(prog, p).status == "passed"


def test_full_redefinition_uses_prompt_helpers(problems):
    p = problems["HumanEval/10"]  # make_palindrome; the prompt defines is_palindrome
    reply = ("def make_palindrome(string: str) -> str:\n    if not string:\n        return ''\n"
             "    beginning_of_suffix = 0\n    while not is_palindrome(string[beginning_of_suffix:]):\n"
             "        beginning_of_suffix += 1\n    return string + string[:beginning_of_suffix][::-1]\n")
    prog = extract_code(reply, p)
    assert prog.count("def make_palindrome") == 2
    assert run_problem(prog, p).status == "passed"


def test_body_only_continuation(problems):
    p = problems["HumanEval/2"]
    unindented = "```python\nresult = number % 1.0\nreturn result\n```"
    prog = extract_code(unindented, p)
    assert prog == p.prompt + "    result = number % 1.0\n    return result\n"
    assert run_problem(prog, p).status == "passed"
    indented = "    return number % 1.0"
    assert extract_code(indented, p) == p.prompt + "    return number % 1.0\n"


def test_unclosed_fence(problems):
    p = problems["HumanEval/2"]
    prog = extract_code("Here:\n```python\ndef truncate_number(number: float) -> float:\n    return number % 1.0\n", p)
    assert "Here:" not in prog and prog.endswith("return number % 1.0\n")


def test_completion_mode_stops(problems):
    p = problems["HumanEval/2"]
    for stop in he.STOP_SEQUENCES:
        completion = "    return number % 1.0\n" + stop.lstrip("\n") + "junk()\n"
        prog = extract_code(completion, p, mode="completion")
        assert prog == p.prompt + "    return number % 1.0", stop
    assert extract_code("    return number % 1.0\n", p, mode="completion").endswith("% 1.0\n")
    with pytest.raises(ValueError, match="mode"):
        extract_code("x", p, mode="fim")  # type: ignore[arg-type]

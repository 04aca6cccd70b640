"""validate/evals/humaneval.py: loading, extraction, and the sandbox (each run is a real subprocess, ~0.15 s)."""
from __future__ import annotations

import gzip
import json
import math
import sys
import time

import psutil
import pytest

from validate.errors import InputError
from validate.evals import humaneval as he
from validate.evals.humaneval import extract_code, load_problems, run_all, run_problem

pytestmark = pytest.mark.timeout(60)


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


@pytest.mark.parametrize("backend", ["native", "bwrap"])
def test_write_bypassing_the_guard_does_not_reach_the_host(problems, tmp_path, backend):
    ok, why = he._probe(backend)
    if not ok:
        pytest.skip(f"backend {backend} cannot run here: {why}")
    p = problems["HumanEval/2"]
    target = tmp_path / "escaped_raw.txt"
    r = run_problem(canonical(p) + f"import _io\n_io.FileIO({str(target)!r}, 'w').write(b'x')\n", p, backend=backend)
    # native: uid 65534 cannot pass pytest's 0700 directory, and every mount is read-only; bwrap: the host's
    # directory is not in the sandbox's root at all
    expect = ("Permission denied", "Read-only file system") if backend == "native" else ("No such file",)
    assert r.status == "error" and any(e in r.detail for e in expect), r.detail
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


# ---------------------------------------------------------------------------------------------------- wire format


def wire(value, strict=False):
    """value as the judge receives it: encoded, through JSON, decoded."""
    return he.decode_value(json.loads(json.dumps(he.encode_value(value, strict))))


def same(a, b) -> bool:
    """Equal and of the same types all the way down (nan equals nan; -0.0 is not 0.0)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, float):
        return (math.isnan(a) and math.isnan(b)) or (a == b and math.copysign(1, a) == math.copysign(1, b))
    if isinstance(a, complex):
        return same(a.real, b.real) and same(a.imag, b.imag)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    return a == b


@pytest.mark.parametrize("value", [
    None, True, False, 0, -1, 2 ** 200, -(10 ** 5000), 1.5, -0.0, float("inf"), float("-inf"), float("nan"),
    complex(1, -0.0), "", "é\udc80\n", b"\x00\xff", bytearray(b"ab"), [], (), set(), frozenset(), {},
    [[(1, "a")], {1: {2.5}, "k": frozenset({3, (4,)})}, [None, [True, [b""]]]],
], ids=lambda v: type(v).__name__)
def test_plain_values_round_trip_exactly(value):
    assert same(wire(value), value)
    assert same(wire(value, strict=True), value)


def test_subclasses_travel_as_their_base_type():
    import collections
    import enum

    class Color(enum.IntEnum):
        RED = 1

    Point = collections.namedtuple("Point", "x y")
    for value, expect in [(Color.RED, 1), (Point(1, 2), (1, 2)), (collections.Counter("aab"), {"a": 2, "b": 1}),
                          (collections.OrderedDict(a=1), {"a": 1}), (collections.defaultdict(int, a=1), {"a": 1})]:
        assert same(wire(value), expect), value
        with pytest.raises(TypeError):
            he.encode_value(value, strict=True)  # the judge sends exact builtin types only


@pytest.mark.parametrize("value", [iter([1]), (i for i in "x"), object(), lambda: 1, range(3), complex],
                         ids=lambda v: type(v).__name__)
def test_other_objects_become_opaque_markers(value):
    got = wire(value)
    assert got != got and got != value and not (got == 0) and got not in [value, None, 0, "", []]
    with pytest.raises(TypeError):
        bool(got)
    with pytest.raises(TypeError):
        he.encode_value(value, strict=True)


def test_self_referential_and_huge_results_become_opaque():
    loop: list = []
    loop.append(loop)
    wide: list = []
    wide.extend([wide] * 50)  # exponential if walked naively
    for value in (loop, wide, [[0] * 1000] * 1100):
        got = wire(value)
        assert got != value and "too large" in repr(got)


@pytest.mark.parametrize("data", [
    [], "s", ["zz"], ["i", "0x10"], ["i", "12g"], ["i", 5], ["f", "junk"], ["f", 1.0], ["B", 1], ["s", 1],
    ["b", "abc"], ["l", "x"], ["l", [["n"], "x"]], ["d", [[["l", []], ["n"]]]], ["d", [["n"]]], ["c", "1"],
    ["n", "extra"], ["o", 3], ["l", [["l", []]] * 2] + ["extra"],
])
def test_malformed_wire_data_is_refused(data):
    with pytest.raises(ValueError):
        he.decode_value(data)


def test_deep_nesting_is_refused():
    data = ["n"]
    for _ in range(200):
        data = ["l", [data]]
    with pytest.raises(ValueError):
        he.decode_value(data)


def test_every_test_call_round_trips_the_wire_format(problems):
    """In-process, the judge's view of every HumanEval test: each call's arguments and each canonical result
    survive encoding, JSON and decoding with their exact types and values, and every check passes that way
    (a solution that changes its arguments, e.g. HumanEval/70's, changes only the sandbox's copy: no test
    depends on seeing that)."""
    calls = 0
    for p in problems.values():
        ns = {"__name__": "__sandbox__"}
        exec(compile(p.prompt + p.canonical_solution, p.task_id, "exec"), ns)
        fn = ns[p.entry_point]

        def proxy(*args, **kwargs):
            nonlocal calls
            sent = wire([list(args), kwargs], strict=True)
            assert same(sent, [list(args), kwargs]), (p.task_id, args, kwargs)
            value = fn(*sent[0], **sent[1])
            back = wire(value)
            assert same(back, value), (p.task_id, value)
            calls += 1
            return back

        g = {"__name__": "__judge__"}
        exec(compile(p.prompt, p.task_id, "exec"), g)
        g[p.entry_point] = proxy
        exec(compile(p.test, p.task_id, "exec"), g)
        g["check"](proxy)
    assert calls > 1000


# ---------------------------------------------------------------------------------------------------- the dataset


@pytest.mark.timeout(120)
def test_every_canonical_solution_passes(problems):
    pairs = [(p, canonical(p)) for p in problems.values()]
    t = time.monotonic()
    results = run_all(pairs, workers=2)
    elapsed = time.monotonic() - t
    bad = [(r.task_id, r.status, r.detail) for r in results if r.status != "passed"]
    assert not bad, bad
    assert len(results) == 164 and len({r.backend for r in results}) == 1
    print(f"164 canonical solutions passed in {elapsed:.1f} s on backend {results[0].backend}")


WRONG = {
    "HumanEval/0": "    return False\n",
    "HumanEval/2": "    return number // 1.0\n",
    "HumanEval/10": "    return string\n",
    "HumanEval/32": "    return 0.0\n",
    "HumanEval/38": "    return s\n",
    "HumanEval/53": "    return x - y\n",
    "HumanEval/150": "    return x\n",
    "HumanEval/162": "    return None\n",
}


@pytest.mark.timeout(60)
def test_known_wrong_programs_fail(problems):
    pairs = [(problems[t], problems[t].prompt + body) for t, body in WRONG.items()]
    results = run_all(pairs, workers=2)
    assert [(r.task_id, r.status) for r in results] == [(t, "failed") for t in WRONG], [r.detail for r in results]
    assert all("AssertionError" in r.detail for r in results)


# ---------------------------------------------------------------------------------------------------- no sandbox


@pytest.mark.timeout(60)
def test_without_a_sandbox_runs_are_refused_unless_allowed(problems, monkeypatch):
    from validate.runners import humaneval as runner

    monkeypatch.setattr(he, "_probe", lambda backend: (False, f"{backend} made unusable by the test"))
    backend, reason = he.sandbox_available()
    assert backend == "none" and "bwrap made unusable" in reason and "native made unusable" in reason
    p = problems["HumanEval/2"]
    for call in (lambda: run_problem(canonical(p), p), lambda: run_all([(p, canonical(p))]),
                 lambda: run_problem(canonical(p), p, backend="none"),
                 lambda: runner.preflight(runner.HumanEvalParams(), None, None)):
        with pytest.raises(InputError, match="allow_unsandboxed") as e:
            call()
        assert "bubblewrap" in str(e.value) or "backend 'none'" in str(e.value)
    runner.preflight(runner.HumanEvalParams(allow_unsandboxed=True), None, None)
    r = run_problem(canonical(p), p, allow_unsandboxed=True)
    assert r.status == "passed" and r.backend == "none"
    assert any(c.startswith("sandbox: none") for c in r.not_contained)


class _CanonicalClient:
    """Answers each HumanEval chat prompt with the canonical solution in a fenced block."""

    def __init__(self, problems):
        self.problems = list(problems.values())

    async def chat(self, messages, *, max_tokens, **kw):
        from validate.client import RequestResult

        p = next(q for q in self.problems if q.prompt in messages[0]["content"])
        return RequestResult(ok=True, text=f"```python\n{p.prompt}{p.canonical_solution}```")


@pytest.mark.timeout(60)
@pytest.mark.parametrize("unsandboxed", [False, True])
def test_runner_metrics_name_the_sandbox(problems, tmp_path, monkeypatch, unsandboxed):
    import asyncio

    from validate.runners import humaneval as runner
    from validate.runners.base import RunContext

    if unsandboxed:
        monkeypatch.setattr(he, "_probe", lambda backend: (False, f"{backend} made unusable by the test"))
    logged: list[str] = []
    ctx = RunContext(root=tmp_path, config=None, profile="quick", client=_CanonicalClient(problems), data_dir=None,
                     record_dir=tmp_path, log=logged.append)
    params = runner.HumanEvalParams(limit=3, allow_unsandboxed=unsandboxed)
    assert "allow_unsandboxed" not in params.model_dump(mode="json")  # not in the params' hash
    out = asyncio.run(runner.run(ctx, params))
    m = out.metrics
    assert m["passed"] == 3 and not out.errors
    backend, reason = he.sandbox_available()
    assert (m["sandbox"], m["sandbox_detail"]) == (backend, reason)
    if unsandboxed:
        assert m["sandbox"] == "none" and "made unusable" in m["sandbox_detail"]
        assert any("WITHOUT a sandbox" in line for line in logged)
    else:
        assert m["sandbox"] in ("bwrap", "native") and not logged

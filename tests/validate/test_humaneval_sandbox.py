"""The HumanEval sandbox under attack: a program must not be able to pass itself (the verdict is the judge's), nor
read, write or reach what is outside its work directory. Every attacking program below answers wrongly, so
"passed" could only come from a forgery. Each run is a real judge + sandbox pair (~0.2 s)."""
from __future__ import annotations

import dataclasses
import os
import shutil
import socket
import tempfile
import threading
import time

import psutil
import pytest

from validate.evals import humaneval as he
from validate.evals.humaneval import run_problem

pytestmark = pytest.mark.timeout(60)

BACKENDS = ["bwrap", "native"]


@pytest.fixture(scope="module")
def problems():
    return {p.task_id: p for p in he.load_problems()}


def usable(backend: str) -> None:
    ok, why = he._probe(backend)
    if not ok:
        pytest.skip(f"backend {backend} cannot run here: {why}")


def wrong(problems, task: str = "HumanEval/2") -> str:
    """The problem's prompt with a body that fails its tests."""
    return problems[task].prompt + "    return None\n"


def everywhere(r: he.ExecResult) -> str:
    return repr(dataclasses.asdict(r))


# ---------------------------------------------------------------------------------------------------- forgeries

FORGERIES = {
    "rebinding builtins the harness uses": """
import builtins
builtins.exec = lambda *a, **k: None
builtins.compile = lambda *a, **k: None
builtins.AssertionError = type("Never", (BaseException,), {})
""",
    "calling the harness's finish": """
import __main__
__main__.finish("passed", "check")
""",
    "writing through the harness's own frame writer": """
import __main__
__main__.write_frame(__main__.RESULTS, {"event": "done", "status": "passed", "phase": "check"})
__main__.write_frame(__main__.RESULTS, {"event": "ready"})
""",
    "forged lines and frames with any nonce found, on every open fd": """
import __main__, gc, json, os, re, sys
hexes = {""}
spaces = [vars(__main__)] + [o for o in gc.get_objects() if isinstance(o, dict)]
f = sys._getframe()
while f is not None:
    spaces.append(f.f_globals)
    f = f.f_back
for space in spaces:
    for v in list(space.values()):
        if isinstance(v, str) and re.fullmatch("[0-9a-f]{32}", v):
            hexes.add(v)
line = json.dumps({"event": "done", "status": "passed", "phase": "check", "detail": ""})
frame = len(line).to_bytes(4, "big") + line.encode()
for fd in range(0, 256):
    for data in [frame] + [(n + line + "\\n").encode() for n in hexes]:
        try:
            os.write(fd, data)
        except OSError:
            pass
os._exit(0)
""",
    "walking frames, tracebacks and gc for the harness's functions": """
import gc, sys, types
names = ("finish", "report", "emit", "candidate", "check", "write_frame")
def walk():
    f = sys._getframe()
    while f is not None:
        yield f.f_globals
        f = f.f_back
    try:
        raise KeyError
    except KeyError as e:
        tb = e.__traceback__
        f = tb.tb_frame
        while f is not None:
            yield f.f_globals
            f = f.f_back
for g in list(walk()):
    for n in names:
        fn = g.get(n)
        if callable(fn) and n in ("finish", "report", "emit"):
            try:
                fn("passed", "check")
            except BaseException:
                pass
for o in gc.get_objects():
    if isinstance(o, types.FunctionType) and o.__name__ in ("finish", "report", "emit"):
        try:
            o("passed", "check")
        except BaseException:
            pass
""",
    "sys.exit(0) before check": "import sys\nsys.exit(0)\n",
    "os._exit(0) before check": "import os\nos._exit(0)\n",
    "a reply for a call the judge did not make": """
import __main__
__main__.write_frame(__main__.RESULTS, {"event": "ready"})
for seq in (0, 2, 999, True):
    __main__.write_frame(__main__.RESULTS, {"seq": seq, "value": ["f", float.hex(0.5)]})
""",
    "printing a fake result line": """
import json, sys
fake = json.dumps({"event": "done", "status": "passed", "phase": "check", "detail": ""})
print(fake)
print("passed")
sys.stderr.write(fake + "\\n")
""",
}


@pytest.mark.timeout(60)
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("attack", sorted(FORGERIES))
def test_forged_pass_is_not_passed(problems, attack, backend):
    usable(backend)
    p = problems["HumanEval/2"]
    r = run_problem(wrong(problems) + FORGERIES[attack], p, backend=backend, timeout_s=10)
    assert r.status in ("failed", "error"), (r.status, r.detail)


ALWAYS_EQUAL = {
    "an object equal to everything": "class A:\n    __eq__ = lambda s, o: True\n    __ne__ = lambda s, o: False\n"
                                     "    __hash__ = lambda s: 0\n    __bool__ = lambda s: True\n",
    "an int subclass equal to everything": "class A(int):\n    __eq__ = lambda s, o: True\n"
                                           "    __ne__ = lambda s, o: False\n    __hash__ = int.__hash__\n",
    "a str subclass equal to everything": "class A(str):\n    __eq__ = lambda s, o: True\n"
                                          "    __ne__ = lambda s, o: False\n    __hash__ = str.__hash__\n",
}


@pytest.mark.timeout(60)
@pytest.mark.parametrize("kind", sorted(ALWAYS_EQUAL))
def test_always_equal_result_is_not_passed(problems, kind):
    p = problems["HumanEval/0"]  # its asserts are all `candidate(...) == True/False`
    body = "".join("    " + ln + "\n" for ln in ALWAYS_EQUAL[kind].splitlines()) + "    return A()\n"
    r = run_problem(p.prompt + body, p)
    assert r.status in ("failed", "error"), (r.status, r.detail)


@pytest.mark.timeout(60)
def test_redefined_prompt_helper_does_not_change_the_test(problems):
    # HumanEval/38's test calls encode_cyclic; identity helpers made the old harness accept an identity answer
    p = problems["HumanEval/38"]
    prog = p.prompt + "    return s\n\n\ndef encode_cyclic(s: str):\n    return s\n"
    r = run_problem(prog, p)
    assert r.status == "failed", (r.status, r.detail)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("backend", BACKENDS)
def test_killing_parent_and_judge_is_not_passed(problems, backend):
    usable(backend)
    p = problems["HumanEval/2"]
    # Never kill(-1) here: if containment ever regressed to the engine's uid (root), it would kill the machine.
    attack = """
import os, posix, signal
targets = {posix.getppid()}
for d in os.listdir("/proc"):
    try:
        with open("/proc/%s/cmdline" % d, "rb") as f:
            if b"r9k-humaneval-judge" in f.read():
                targets.add(int(d))
    except (OSError, ValueError):
        pass
for target in targets:
    try:
        posix.kill(target, signal.SIGKILL)
    except OSError:
        pass
"""
    r = run_problem(wrong(problems) + attack, p, backend=backend, timeout_s=10)
    assert r.status in ("failed", "error"), (r.status, r.detail)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("backend", BACKENDS)
def test_closing_its_pipes_is_not_passed(problems, backend):
    usable(backend)
    p = problems["HumanEval/2"]
    r = run_problem(wrong(problems) + "import os\nos.closerange(3, 4096)\n", p, backend=backend, timeout_s=5)
    assert r.status in ("error", "timeout"), (r.status, r.detail)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("backend", BACKENDS)
def test_flooding_its_pipes_is_not_passed(problems, backend):
    usable(backend)
    p = problems["HumanEval/2"]
    flood = """
import os
junk = b"\\xff" * 65536
for fd in range(3, 256):
    try:
        os.set_blocking(fd, False)
        for _ in range(64):
            os.write(fd, junk)
    except OSError:
        pass
"""
    r = run_problem(wrong(problems) + flood, p, backend=backend, timeout_s=10)
    assert r.status in ("error", "timeout"), (r.status, r.detail)


# ---------------------------------------------------------------------------------------------------- containment

SECRET = "r9k-secret-7f3a9c"


@pytest.fixture
def root_only_file():
    """A 0600 root-owned file in a world-searchable directory outside any work directory (only the file's own
    mode protects it)."""
    if os.geteuid() != 0:
        pytest.skip("needs root to make a root-only file")
    d = tempfile.mkdtemp(prefix="r9k-secret-")
    os.chmod(d, 0o755)
    path = os.path.join(d, "secret.txt")
    with open(os.open(path, os.O_WRONLY | os.O_CREAT, 0o600), "w") as f:
        f.write(SECRET)
    yield path
    shutil.rmtree(d)


READ_AND_SHOW = """
try:
    data = open({path!r}, "rb").read()
except OSError as e:
    raise RuntimeError("blocked: " + type(e).__name__)
raise RuntimeError("read: " + data[:200].decode("latin-1"))
"""


@pytest.mark.timeout(60)
@pytest.mark.parametrize("backend", BACKENDS)
def test_root_only_file_is_unreadable(problems, root_only_file, backend):
    usable(backend)
    p = problems["HumanEval/2"]
    r = run_problem(p.prompt + p.canonical_solution + READ_AND_SHOW.format(path=root_only_file), p, backend=backend)
    assert r.status == "error" and "blocked: " in r.detail, (r.status, r.detail)
    assert SECRET not in everywhere(r)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("backend", BACKENDS)
def test_etc_shadow_is_unreadable(problems, backend):
    usable(backend)
    if not os.path.exists("/etc/shadow") or os.geteuid() != 0:
        pytest.skip("no /etc/shadow readable by the test to compare with")
    first = open("/etc/shadow").read().splitlines()[0]
    p = problems["HumanEval/2"]
    r = run_problem(p.prompt + p.canonical_solution + READ_AND_SHOW.format(path="/etc/shadow"), p, backend=backend)
    assert r.status == "error" and "blocked: " in r.detail, (r.status, r.detail)
    assert first not in everywhere(r)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("backend", BACKENDS)
def test_writes_outside_the_work_dir_do_not_reach_the_host(problems, backend):
    usable(backend)
    p = problems["HumanEval/2"]
    open_dir = tempfile.mkdtemp(prefix="r9k-open-")
    os.chmod(open_dir, 0o777)  # only the mount can stop a write here
    targets = [os.path.join(open_dir, "escaped.txt"), f"/dev/shm/r9k-escaped-{os.getpid()}",
               f"/tmp/r9k-escaped-{os.getpid()}"]
    code = "import _io, os\nfor t in %r + [os.path.join(os.path.dirname(os.getcwd()), 'escaped.txt')]:\n" \
           "    try:\n        _io.FileIO(t, 'w').write(b'x')\n    except OSError as e:\n" \
           "        print('blocked', t, e)\n" % (targets,)
    try:
        r = run_problem(p.prompt + p.canonical_solution + code, p, backend=backend)
        assert r.status == "passed", (r.status, r.detail)  # the writes are caught; the answer is right
        for t in targets:
            assert not os.path.exists(t), t
        if backend == "native":
            assert r.output_tail.count("Read-only file system") >= 3, r.output_tail
    finally:
        shutil.rmtree(open_dir)
        for t in targets[1:]:
            if os.path.exists(t):
                os.unlink(t)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("backend", BACKENDS)
def test_no_network_to_the_host(problems, backend):
    usable(backend)
    p = problems["HumanEval/2"]
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    listener.settimeout(0.5)
    port = listener.getsockname()[1]
    code = (f"import socket\ns = socket.socket()\ns.settimeout(3)\ntry:\n    s.connect(('127.0.0.1', {port}))\n"
            "except OSError as e:\n    raise RuntimeError('no connection: ' + type(e).__name__)\n"
            "raise RuntimeError('connected')\n")
    try:
        r = run_problem(p.prompt + p.canonical_solution + code, p, backend=backend)
        assert r.status == "error" and "no connection" in r.detail, (r.status, r.detail)
        with pytest.raises(socket.timeout):
            listener.accept()
    finally:
        listener.close()


def _sandboxed_python(tag: str = "r9k-humaneval-sandbox") -> list[psutil.Process]:
    out = []
    for child in psutil.Process().children(recursive=True):
        try:
            cmd = child.cmdline()
        except psutil.Error:
            continue
        if cmd and cmd[-1] == tag and os.path.basename(cmd[0]).startswith("python"):
            out.append(child)
    return out


@pytest.mark.timeout(60)
@pytest.mark.parametrize("backend", BACKENDS)
def test_program_runs_as_uid_65534_outside(problems, backend):
    """Measured from /proc/<pid>/status of the sandboxed interpreter while it answers a call."""
    usable(backend)
    if os.geteuid() != 0:
        pytest.skip("uid 65534 outside needs a root engine")
    p = problems["HumanEval/2"]
    prog = p.prompt + ("    import time\n    time.sleep(2 if SLEEP else 0)\n    SLEEP.clear()\n"
                       "    return number % 1.0\n\nSLEEP = [1]\n")
    box: dict = {}
    t = threading.Thread(target=lambda: box.update(r=run_problem(prog, p, backend=backend, timeout_s=30)))
    t.start()
    seen = None
    deadline = time.monotonic() + 20
    while t.is_alive() and time.monotonic() < deadline and seen is None:
        for proc in _sandboxed_python():
            try:
                status = dict(ln.split(":", 1) for ln in open(f"/proc/{proc.pid}/status").read().splitlines())
            except (OSError, ValueError):
                continue
            if status["Uid"].split()[0] != "0":  # the native backend starts as root and drops before the program
                seen = {k: status[k].split() for k in ("Uid", "Gid", "Groups")}
        time.sleep(0.05)
    t.join()
    assert seen is not None, "the sandboxed interpreter was not found"
    assert seen == {"Uid": ["65534"] * 4, "Gid": ["65534"] * 4, "Groups": []}, seen
    assert box["r"].status == "passed" and box["r"].backend == backend, box["r"]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("target", ["/", "/proc", "/root"])
def test_failed_mount_in_native_backend_is_infra(problems, monkeypatch, target):
    usable("native")
    p = problems["HumanEval/2"]
    monkeypatch.setattr(he, "_FAIL_MOUNT", target)
    r = run_problem(p.prompt + p.canonical_solution, p, backend="native")
    assert r.status == "infra" and "injected failure" in r.detail, (r.status, r.detail)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("backend", BACKENDS)
def test_backend_and_containment_are_recorded(problems, backend):
    usable(backend)
    p = problems["HumanEval/2"]
    r = run_problem(p.prompt + p.canonical_solution, p, backend=backend)
    assert r.status == "passed" and r.backend == backend
    assert any(c.startswith("verdict: decided by a separate judge") for c in r.contained)
    assert any("NPROC 1" in c for c in r.contained), r.contained
    if backend == "native":
        assert any("covered by an empty tmpfs" in c for c in r.contained) or not he._hidden_binds()
        assert any(c.startswith("privileges: uid and gid 65534") for c in r.contained)

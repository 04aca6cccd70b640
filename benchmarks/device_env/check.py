"""The checks that the archive's contents resolve on the GPU host: the import closure of vLLM's roots against the
pins, the host and the stand-ins (statically, from any tree of vLLM 0.32.0's Python sources), and each downloaded
wheel's declared requirements against the pins and the host."""
from __future__ import annotations

import ast
import sys
from pathlib import Path

from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

from benchmarks.device_env.closure import Closure, closure
from benchmarks.device_env.pins import STAND_INS, Pins


def stand_in_modules() -> set[str]:
    """Module names the tracked stand-ins provide (``vllm._C_stable_libtorch``, ``vllm.vllm_flash_attn``, ...)."""
    out = set()
    for p in (STAND_INS / "vllm").rglob("*.py"):
        parts = p.relative_to(STAND_INS).with_suffix("").parts
        out.add(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return out


def closures(tree: Path, pins: Pins) -> tuple[Closure, Closure]:
    """(every import, only unconditional imports) closures of ``pins.vllm.roots`` over the stand-ins laid over
    ``tree`` (a directory holding ``vllm/``), as the archive lays them."""
    trees = [STAND_INS, tree]
    return (closure(trees, list(pins.vllm.roots), "vllm"),
            closure(trees, list(pins.vllm.roots), "vllm", conditional=False))


def closure_problems(full: Closure, hard: Closure, pins: Pins) -> list[str]:
    """What the closure (``full``, ``hard``: :func:`closures`) imports that the host would lack: each problem a line
    naming the import and the module and line that make it. An empty list means every module-level import
    resolves to vLLM's tree, a stand-in, the standard library, ``[host].provided``, a pinned wheel, an
    ``[absent]`` name reached only inside module-level ``if`` arms, or a module ``[vllm].unreached`` names. Also a problem: an ``[absent]`` entry the
    closure reaches unconditionally or not at all (a stale entry), and a name a ``from vllm... import`` takes from a
    stand-in that the stand-in does not define."""
    stand_ins = stand_in_modules()
    problems = []
    for name, e in sorted(full.missing.items()):
        if name not in stand_ins and name not in pins.vllm.unreached:
            problems.append(f"{name}: imported by {e.source} line {e.line}; no source in vLLM's tree and no stand-in")
    for name, e in sorted(full.external.items()):
        if name in sys.stdlib_module_names or name in pins.host.provided or pins.provider(name) is not None:
            continue
        if name in pins.absent and name not in hard.external:
            continue
        why = "reached unconditionally, so it cannot be [absent]" if name in pins.absent else "not pinned"
        problems.append(f"{name}: imported by {e.source} line {e.line}; {why}")
    for name in sorted(pins.absent):
        if name not in full.external:
            problems.append(f"[absent] {name}: the closure never imports it (a stale entry)")
    for e in full.edges:
        path = full.modules.get(e.target)
        if path is None or not path.is_relative_to(STAND_INS):
            continue
        defined = top_level_names(path)
        for n in e.names:
            if n != "*" and n not in defined and f"{e.target}.{n}" not in full.modules:
                problems.append(f"{e.target}.{n}: imported by {e.source} line {e.line}; the stand-in lacks it")
    return problems


def top_level_names(path: Path) -> set[str]:
    """Names a module binds at its top level (defs, classes, assignments, imports), read with ``ast``."""
    out: set[str] = set()
    for s in ast.parse(path.read_text(encoding="utf-8")).body:
        if isinstance(s, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            out.add(s.name)
        elif isinstance(s, (ast.Assign, ast.AnnAssign)):
            for t in (s.targets if isinstance(s, ast.Assign) else [s.target]):
                out |= {n.id for n in ast.walk(t) if isinstance(n, ast.Name)}
        elif isinstance(s, (ast.Import, ast.ImportFrom)):
            out |= {(a.asname or a.name).split(".")[0] for a in s.names}
    return out


def target_environment(pins: Pins) -> dict[str, str]:
    """PEP 508 marker values of the GPU host (CPython ``[host].python`` on x86-64 Linux), no extra."""
    env = dict(default_environment())
    env.update(python_version=pins.host.python, python_full_version=f"{pins.host.python}.0",
               implementation_name="cpython", platform_python_implementation="CPython", os_name="posix",
               sys_platform="linux", platform_system="Linux", platform_machine="x86_64")
    return env


def requirement_problems(requires: dict[str, list[str]], pins: Pins) -> list[str]:
    """Each wheel's Requires-Dist (``requires``: pinned wheel name -> its requirement strings) that no pin and no
    ``[host].provided`` entry meets at the host's markers, and no ``[host].image`` distribution names (the image's
    versions are not recorded, so any is taken): one line each, naming the wheel and the requirement."""
    env = target_environment(pins)
    pinned = {canonicalize_name(w.name): w.version for w in pins.wheels}
    provided = {canonicalize_name(k): v for k, v in pins.host.provided.items()}
    image = {canonicalize_name(n) for n in pins.host.image}
    problems = []
    for wheel, reqs in sorted(requires.items()):
        for text in reqs:
            r = Requirement(text)
            if r.marker is not None and not r.marker.evaluate({**env, "extra": ""}):
                continue
            name = canonicalize_name(r.name)
            have = pinned.get(name) or provided.get(name)
            if have is None and name in image:
                continue
            if have is None:
                problems.append(f"{wheel} requires {text}: not pinned and not on the host")
            elif not r.specifier.contains(Version(have), prereleases=True):
                problems.append(f"{wheel} requires {text}: {r.name} is {have}")
    return problems

"""Unit-gate suites: run pytest and record one item per test case from its junit XML (never from grepping
its output). A failed or erroring test fails the suite with its name; a run that collects no test is an error.
"""
from __future__ import annotations

import asyncio
import os
import re
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from validate.errors import InputError
from validate.record import Dataset, Item
from validate.runners.base import RunContext, SuiteResult, misjudged, recount
from validate.server import server_environ
from validate.suite import register_runner
from validate.util import sha256_text, within


class PytestParams(BaseModel):
    model_config = ConfigDict(extra="forbid")
    paths: list[str] = Field(min_length=1, description="test files or folders, relative to the checkout")
    markers: str | None = Field(None, description="pytest -m expression")
    gpu_markers: str | None = Field(None, description="pytest -m expression on a configuration with GPUs "
                                    "(hardware.gpus > 0), instead of markers: the gates at full shapes on its card")
    world_size_env: str | None = Field(None, description="a variable set to the configuration's tensor-parallel size "
                                       "where it is above 1 (the tests' world sizes); else env's value stands")
    keyword: str | None = Field(None, description="pytest -k expression")
    workers: int = Field(0, ge=0, description="pytest-xdist workers (0 = no xdist)")
    env: dict[str, str] = Field(default_factory=dict)
    timeout_s: float = Field(3600, gt=0)


def preflight(p: PytestParams, root: Path, data_dir) -> None:
    for rel in p.paths:
        if not (root / rel).exists():
            raise InputError(f"params.paths: {rel} does not exist under {root}")


#: Files beside the tests that change what pytest collects or how it runs them.
_PYTEST_CONFIG = ("pyproject.toml", "pytest.ini", "setup.cfg", "tox.ini", "conftest.py")


def test_files(p: PytestParams, root: Path) -> list[Path]:
    """What a run of ``p`` depends on besides the engine and plugin: every file under the top folder of each of
    its paths (``tests/`` for ``tests/kernels/gdn``: their helpers and conftests sit above them) and pytest's
    configuration files at the checkout's root; sorted, files only."""
    files: set[Path] = set()
    for rel in p.paths:
        top = root / Path(rel).parts[0]
        if top.is_dir():
            files.update(f for f in top.rglob("*") if f.is_file() and "__pycache__" not in f.parts)
        elif top.is_file():
            files.add(top)
    files.update(root / n for n in _PYTEST_CONFIG if (root / n).is_file())
    return sorted(files)


def tests_hash(p: PytestParams, root: Path, data_dir=None) -> str:
    """sha256 over :func:`test_files` (names and contents): --resume keeps a unit-gate record only while it
    matches, so a pass is never kept for tests that changed since."""
    import hashlib

    h = hashlib.sha256()
    for f in test_files(p, root):
        h.update(str(f.relative_to(root)).encode() + b"\0" + f.read_bytes() + b"\0")
    return h.hexdigest()


def test_environ(environ: dict[str, str], extra: dict[str, str]) -> dict[str, str]:
    """The environment of the pytest run: the engine's, less the operator's ``PYTEST_*`` options (PYTEST_ADDOPTS
    could deselect a failing test) and r9k's knobs, plus the suite's own ``env``."""
    keep = {k: v for k, v in environ.items() if not k.startswith("PYTEST_")}
    return {**server_environ(keep), **extra}


def parse_junit(path: Path) -> list[dict]:
    """Test cases of a junit XML file: [{id, outcome (passed|failed|error|skipped), time_s, message}].

    Raises:
        InputError: the file is missing or not junit XML.
    """
    try:
        root = ET.parse(path).getroot()
    except (FileNotFoundError, ET.ParseError) as e:
        raise InputError(f"{path}: no junit XML from pytest ({e})") from None
    out = []
    for tc in root.iter("testcase"):
        outcome, message = "passed", ""
        for tag in ("failure", "error", "skipped"):
            el = tc.find(tag)
            if el is not None:
                outcome = {"failure": "failed"}.get(tag, tag)
                message = (el.get("message") or el.text or "")[:500]
                break
        cls, name = tc.get("classname", ""), tc.get("name", "")
        out.append({"id": f"{cls}::{name}" if cls else name, "outcome": outcome, "time_s": float(tc.get("time") or 0),
                    "message": message})
    return out


class PytestMetrics(BaseModel):
    """What a pytest-suite record's ``metrics`` hold (test counts from the junit XML)."""

    model_config = ConfigDict(extra="forbid")
    tests: int
    passed: int
    failed: int
    error: int
    skipped: int
    exit_status: int | None = None
    paths: list[str]


def summary(rec) -> str:
    m = rec.metrics
    return f"{m['passed']} of {m['tests']} tests passed, {m['failed']} failed"


def run_settings(p: PytestParams, config) -> tuple[str | None, dict[str, str]]:
    """(the -m expression, the suite's environment) for a run on ``config``: ``gpu_markers`` where the
    configuration has GPUs, and ``world_size_env`` set to its tensor-parallel size where that is above 1."""
    gpus = getattr(getattr(config, "hardware", None), "gpus", 0) or 0
    markers = p.gpu_markers if gpus > 0 and p.gpu_markers else p.markers
    env = dict(p.env)
    tp = getattr(getattr(config, "server", None), "tensor_parallel_size", 1) or 1
    if p.world_size_env and tp > 1:
        env[p.world_size_env] = str(tp)
    return markers, env


def audit(rec, folder) -> list[str]:
    """Why a pytest record does not stand on its items (empty when it does): the counts in ``metrics`` are
    recounted from the items' outcomes (one item a test case of the JUnit XML), each item's ``correct`` is what its
    outcome gives, and a record that says pass while a test failed or errored, none ran, or pytest's own exit status
    was not 0 is named (pytest exits 0 only when every collected test passed or was skipped: a failed test left out
    of the items still shows there). ``folder`` is not read."""
    counts = dict.fromkeys(("passed", "failed", "error", "skipped"), 0)
    wrong = []
    for i in rec.items:
        outcome = getattr(i, "outcome", None)
        if outcome not in counts:
            wrong.append(f"{i.id} holds no outcome ({outcome!r})")
            continue
        counts[outcome] += 1
        want = outcome == "passed" if outcome in ("passed", "failed") else None
        if i.correct != want:
            wrong.append(f"{i.id} says {i.correct!r} with the outcome {outcome!r}")
    out = misjudged(wrong, len(rec.items), "outcomes")
    out += recount(rec.metrics, {"tests": len(rec.items), **counts})
    if rec.verdict.status == "pass":
        status = (rec.metrics if isinstance(rec.metrics, dict) else {}).get("exit_status")
        ran = counts["passed"] + counts["failed"] + counts["error"]
        if counts["failed"] or counts["error"] or not ran or status != 0:
            out.append(f"the record says pass, but {counts['failed']} of its tests failed, {counts['error']} "
                       f"errored, {ran} ran, and pytest exited with status {status!r}")
    return out


@register_runner("pytest", PytestParams, preflight=preflight, metrics_model=PytestMetrics, summary=summary, order=70,
                 dataset_hash=tests_hash, audit=audit, audit_hashes=False)
async def run(ctx: RunContext, p: PytestParams) -> SuiteResult:
    folder = ctx.record_dir
    folder.mkdir(parents=True, exist_ok=True)
    junit = folder / f"junit-{os.getpid()}-{time.time_ns()}.xml"
    cmd = [sys.executable, "-m", "pytest", *p.paths, "-q", "-p", "no:cacheprovider", f"--junitxml={junit}", "-rN"]
    markers, env = run_settings(p, ctx.config)
    if markers:
        cmd += ["-m", markers]
    if p.keyword:
        cmd += ["-k", p.keyword]
    if p.workers:
        cmd += ["-n", str(p.workers)]
    ctx.progress(0, total=100, description="pytest")
    digest = tests_hash(p, ctx.root)
    proc = await asyncio.create_subprocess_exec(*cmd, cwd=ctx.root, env=test_environ(dict(os.environ), env),
                                                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
                                                start_new_session=True)
    tail: list[str] = []
    done_pct = 0

    async def read():
        nonlocal done_pct
        async for raw in proc.stdout:
            line = raw.decode(errors="replace").rstrip()
            tail.append(line)
            del tail[:-40]
            m = re.search(r"\[\s*(\d+)%\]\s*$", line)
            if m and int(m.group(1)) > done_pct:
                ctx.progress(int(m.group(1)) - done_pct)
                done_pct = int(m.group(1))

    out = SuiteResult()
    try:
        await within(asyncio.gather(read(), proc.wait()), p.timeout_s)
    except asyncio.TimeoutError:
        os.killpg(proc.pid, 9)
        await proc.wait()
        out.errors.append(f"pytest did not finish within {p.timeout_s:.0f} s")
    try:
        cases = parse_junit(junit)
    except InputError as e:
        out.errors.append(f"{e}; pytest exit status {proc.returncode}; output tail: {' | '.join(tail[-5:])}")
        return out
    finally:
        junit.unlink(missing_ok=True)
    counts = {k: sum(1 for c in cases if c["outcome"] == k) for k in ("passed", "failed", "error", "skipped")}
    for c in cases:
        item = Item(id=c["id"], prompt_hash=sha256_text(c["id"]), outcome=c["outcome"], time_s=c["time_s"])
        if c["outcome"] in ("passed", "failed"):
            item.correct = c["outcome"] == "passed"
        if c["outcome"] == "failed":
            out.findings.append(f"gate failed: {c['id']}: {c['message'][:200]}")
        elif c["outcome"] == "error":
            item.error = c["message"]
            out.findings.append(f"gate errored: {c['id']}: {c['message'][:200]}")
        elif c["outcome"] == "skipped":
            item.skip_reason = c["message"]
        out.items.append(item)
    out.metrics = {"tests": len(cases), **counts, "exit_status": proc.returncode, "paths": p.paths}
    out.dataset = Dataset(name="tests", sha256=digest, n_total=len(cases), n_used=len(cases), subset=False)
    ran = counts["passed"] + counts["failed"] + counts["error"]
    if ran == 0:
        out.errors.append(f"no test ran (collected {len(cases)}, pytest exit status {proc.returncode})")
    elif proc.returncode != 0 and not out.findings:  # 1 without a failed case in the XML is not a pass either
        out.errors.append(f"pytest exit status {proc.returncode}: {' | '.join(tail[-3:])}")
    return out

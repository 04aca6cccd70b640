"""Records: the plain-JSON contract between runners, compare, gate and render (pydantic models).

One record per (release, configuration, suite): ``reports/<release>/<config>/<suite>.json``, written
atomically the moment the suite ends, so nothing already measured is lost when later work dies.
"""
from __future__ import annotations

import json
import math
import os
import re
import tempfile
from datetime import datetime, timezone
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, PlainSerializer, ValidationError

from validate.errors import InputError

SCHEMA_VERSION = 2
#: Record schema versions this engine reads: 1 (no gate stored) and the current one (the suite's gate and
#: performance-gate thresholds stored with the run). Anything else is refused, naming the file.
READABLE_SCHEMA_VERSIONS = (1, 2)
# Formula versions: bump when a metric's definition changes, so records of different formulas never compare.
METRICS_FORMULA_VERSION = 2

Status = Literal["pass", "fail", "error", "wrong-tree", "plugin-inactive", "skipped"]
#: Verdicts that are findings about the release (exit status 1): a gate failed, or the server did not run what
#: was to be validated. ``error`` and ``skipped`` say that something could not be checked (exit status 2).
FINDING_STATUSES = frozenset({"fail", "wrong-tree", "plugin-inactive"})


class Verdict(BaseModel):
    """Outcome of one suite on one configuration.

    ``pass``: every gate held. ``fail``: a gate failed (a real finding). ``error``: the suite could not run
    or finish (launch failed, server died, bad data): attributed by ``cause``. ``wrong-tree``: the server did not
    run the tree under validation; nothing from it counts. ``plugin-inactive``: the server ran the tree, but an op
    dispatch its configuration's knobs ask for is not installed in every server process (or an install failed);
    nothing from it counts. ``skipped``: not run (``cause`` says why).
    """

    status: Status
    reasons: list[str] = Field(default_factory=list)
    cause: str | None = None


class StoredGate(BaseModel):
    """A suite's gate as a record stores it: metric -> bound, each a number (a malformed one names the record)."""

    model_config = ConfigDict(extra="forbid")
    max: dict[str, float] = Field(default_factory=dict)
    min: dict[str, float] = Field(default_factory=dict)


def _top2_in(v: Any) -> Any:
    """A stored ``top2`` is compact JSON text (:data:`Top2`); in memory it is the list."""
    if isinstance(v, str):
        try:
            return json.loads(v)
        except json.JSONDecodeError as e:
            raise ValueError(f"top2 is not the compact JSON of a list of steps: {e.msg} at character {e.pos}") from None
    return v


def _top2_out(v: list | None) -> str | None:
    return None if v is None else json.dumps(v, separators=(",", ":"), ensure_ascii=False)


#: The top two of each output token (validate.margins steps, ``[token, value, token, value]``: token id or text,
#: value rounded): a list in memory, written as one line of compact JSON text (a list would take a line per
#: number in an indented record: a GSM8K record of 1,319 answers holds some 400,000 tokens).
Top2 = Annotated[list[list[int | float | str | None]] | None, BeforeValidator(_top2_in),
                 PlainSerializer(_top2_out, when_used="json")]


class Item(BaseModel):
    """One question / prompt of an eval or sanity suite: what pairing and audits need.

    ``top2`` / ``logprobs_mode``: where the runner asked for them (greedy answers of strict sanity, long answers,
    GSM8K and HumanEval) and the server sent them, the top two of each output token, one step per token id
    (validate.margins), and what their values are (vLLM's ``--logprobs-mode``; None where the server was not
    launched by this engine, so its flags are unknown). Absent where the server sent none."""

    model_config = ConfigDict(extra="allow")
    id: str
    prompt_hash: str
    condition: str | None = None  # e.g. "solo", "overload x2.0"
    gen: dict[str, Any] = Field(default_factory=dict)  # generation parameters
    output: str | None = None
    token_ids: list[int] | None = None
    expected: str | None = None
    answer: str | None = None
    correct: bool | None = None
    error: str | None = None
    # written only where set: the items of every other kind, and answers without them, stay as they were
    top2: Top2 = Field(None, exclude_if=lambda v: v is None)
    logprobs_mode: str | None = Field(None, exclude_if=lambda v: v is None)


class Tree(BaseModel):
    """The source tree under validation."""

    commit: str | None = None
    dirty: bool | None = None
    source_hash: str | None = None  # plugin + kernels (what the server runs)
    engine_hash: str | None = None  # validate/ code, suites/ and serve/ files (what measured it)


class ServerInfo(BaseModel):
    """What the server said about itself."""

    url: str | None = None
    launched: bool = False
    provenance: list[str] = Field(default_factory=list)
    provenance_ok: bool | None = None
    log: str | None = None  # log file name, relative to the record folder
    startup_s: float | None = None
    kv_cache_tokens: int | None = None
    dispatch: dict[str, list[str]] | None = None  # pid -> r9k op dispatch installed there (from provenance)


class Dataset(BaseModel):
    """Identity of an eval's data: pairing requires equal ``sha256`` and ``subset`` flags."""

    name: str
    sha256: str
    n_total: int
    n_used: int
    subset: bool
    seed: int | None = None


class Record(BaseModel):
    """One suite's result on one configuration for one release (docs/records.md says what each field means)."""

    schema_version: int = SCHEMA_VERSION
    release: str
    config: str
    config_hash: str
    suite: str
    suite_kind: str
    params: dict[str, Any]
    params_hash: str
    suite_hash: str | None = None  # kind, params and gate as resolved for the profile
    profile: str
    started_at: str
    ended_at: str
    wall_s: float
    # the suite's time budget on its profile (seconds; the suite file's profiles.<profile>.budget_s), None if unstated
    budget_s: float | None = None
    tree: Tree = Field(default_factory=Tree)
    server: ServerInfo = Field(default_factory=ServerInfo)
    versions: dict[str, str | None] = Field(default_factory=dict)
    knobs: dict[str, Any] = Field(default_factory=dict)
    # the knobs the server ran under (`--knobs`): "config" (the configuration's env), "stock" (every knob stock) or
    # the name of one of the configuration's knob_sets; None in records written before it was stored
    knob_set: str | None = None
    env: dict[str, str] = Field(default_factory=dict)
    hardware: dict[str, Any] = Field(default_factory=dict)
    config_snapshot: dict[str, Any] = Field(default_factory=dict)  # the serving configuration as run
    model: str | None = None
    # the weights the model serves (validate.config.ModelSpec.weights_kind): "random" weights' answers are noise, so
    # right answers and garbage are not judged; None in records from before it. The judges read it from
    # config_snapshot (validate.config.record_weights): a value here the snapshot does not give is refused
    weights: Literal["random", "trained"] | None = None
    verdict: Verdict
    metrics: dict[str, Any] = Field(default_factory=dict)
    metrics_formula_version: int = METRICS_FORMULA_VERSION
    dataset: Dataset | None = None
    items: list[Item] = Field(default_factory=list)
    # the server's Prometheus metrics over the suite (validate.server_metrics): {"available", "why", "delta", "series"}
    server_metrics: dict[str, Any] | None = None
    # r9k's expert-cache counters over the suite, parsed from the server log's R9K-MOE-CACHE-STATS lines
    # (validate.engine.moe_counters, r9k.counters.delta): {"layers": [...], "total": {...}, "malformed": n}
    moe_cache: dict[str, Any] | None = None
    # r9k's dispatched calls over the suite by route and step kind, parsed from the server log's R9K-CALLS lines
    # (validate.engine.r9k_calls, r9k.calls.delta): {"steps", "calls", "per_step", "processes", "malformed"}
    r9k_calls: dict[str, Any] | None = None
    client: dict[str, Any] | None = None  # the same requests as the client saw them (validate.client.Tally.summary)
    # files written beside the record: name -> {"file": name in the record's folder, "sha256", "bytes", "lines"}
    attachments: dict[str, dict[str, Any]] | None = None
    # the suite's gate as it ran ({"max": {metric: bound}, "min": {...}}) and, for BetterBench, its performance
    # gate ({"thresholds_pct": {...}, "alpha": a}): a reader judges by these, never by the checkout's suite files.
    # None in schema 1 records.
    gate: StoredGate | None = None
    perf_gate: dict[str, Any] | None = None
    # the share gates' thresholds ({"slo_share_drop_pts", "acceptance_drop_pts", "alpha"}: validate.loadgate)
    share_gate: dict[str, Any] | None = None
    #: set by :func:`read_record` (never stored): why the verdict read was not the one stored
    rechecked: str | None = Field(None, exclude=True)
    #: set by the verdict (never stored): the stored gate differs from the suite file's of the same tree
    gate_mismatch: str | None = Field(None, exclude=True)
    #: set by the verdict (never stored): why the record does not stand on its items and attachments (Runner.audit)
    audit_failed: str | None = Field(None, exclude=True)

    @property
    def passed(self) -> bool:
        return self.verdict.status == "pass"


def now_iso() -> str:
    """UTC time, ISO 8601, seconds."""
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+-]*")


def check_name(what: str, name: str, example: str) -> str:
    """A release, configuration or suite name becomes a folder or a file name: letters, digits, '.', '_', '+',
    '-', not starting with a dot, no '..'.

    Raises:
        InputError: anything else (empty, '..', a path separator), naming ``what``.
    """
    if not isinstance(name, str) or not _NAME_RE.fullmatch(name) or ".." in name:
        raise InputError(f"{what} {name!r}: use letters, digits, '.', '_', '+' and '-' (e.g. {example})")
    return name


def check_release_name(release: str) -> str:
    """See :func:`check_name`; ``none`` is refused too (``--baseline none`` means no baseline, so a release of
    that name could never be one). Raises InputError."""
    if release == "none":
        raise InputError("release name 'none': reserved (--baseline none means no baseline; e.g. v0.3.3)")
    return check_name("release name", release, "v0.3.3")


#: Folders of a release that are not configurations.
RESERVED_CONFIG_NAMES = ("figures",)


def record_path(reports: Path, release: str, config: str, suite: str) -> Path:
    """``reports/<release>/<config>/<suite>.json``; every part checked (:func:`check_name`). Raises InputError."""
    check_name("configuration name", config, "cpu-smol")
    if config in RESERVED_CONFIG_NAMES:
        raise InputError(f"configuration name {config!r}: reserved for the release's {config} folder")
    return reports / check_release_name(release) / config / f"{check_name('suite name', suite, 'soak')}.json"


HISTORY = "history"


RECORD_MODE = 0o644  # records are read by the group (CI, other users of the box), written by the engine


def _history_index(hist: Path, stem: str) -> int:
    """One past the highest ``<stem>.<n>.json`` in ``hist``: a gap left by a deleted file never makes the next
    move overwrite a kept one."""
    taken = [int(m.group(1)) for p in hist.glob(f"{stem}.*.json")
             if (m := re.fullmatch(re.escape(stem) + r"\.(\d+)\.json", p.name))]
    return max(taken, default=-1) + 1


def _fsync_dir(folder: Path) -> None:
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def write_record(path: Path, record: Record) -> Path:
    """Write ``record`` as JSON at ``path`` atomically: a temp file in the same folder, written, flushed and
    fsynced, mode 0644, renamed over ``path``, and the folder fsynced, so a crash or a full disk leaves either
    the old record or the new one, never a torn file.

    A record already at ``path`` (an earlier run of the same suite) moves to ``history/<suite>.<n>.json`` beside
    it, with n one past the highest kept (repeated runs make the run-to-run band; nothing measured is lost),
    but only once the new record is safely written.

    Raises:
        OSError: the folder cannot be written (e.g. ENOSPC); the earlier record is then left where it was.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=path.name + ".", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as fh:
            fh.write(record.model_dump_json(indent=1))
            fh.write("\n")
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, RECORD_MODE)
        if path.exists():
            hist = path.parent / HISTORY
            hist.mkdir(exist_ok=True)
            os.replace(path, hist / f"{path.stem}.{_history_index(hist, path.stem)}.json")
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    _fsync_dir(path.parent)
    return path


def gate_reasons(gate: "dict[str, Any] | StoredGate", metrics: dict[str, Any]) -> list[str]:
    """Reasons the bounds ``gate`` (``{"max": {metric: bound}, "min": {...}}``) fail on ``metrics``; empty when
    it holds. A gated metric that is missing, not a number, or not finite (NaN compares false with every bound; a
    record stores it as null) is a failure."""
    if isinstance(gate, StoredGate):
        gate = gate.model_dump()
    metrics = metrics if isinstance(metrics, dict) else {}
    reasons = []
    for side, worse, sign in (("max", lambda v, b: v > b, ">"), ("min", lambda v, b: v < b, "<")):
        for name, bound in (gate.get(side) or {}).items():
            v = metrics.get(name)
            if v is None:
                reasons.append(f"gate: metric {name} missing")
            elif isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
                reasons.append(f"gate: metric {name} = {v!r} is not a finite number")
            elif worse(v, bound):
                reasons.append(f"gate: {name} = {v} {sign} {bound:g}")
    return reasons


def item_reasons(rec: Record) -> list[str]:
    """Why a record's items contradict a "pass" (for records whose items carry a test ``outcome``, the pytest
    suites'): a test item that failed or errored, or test counts in ``metrics`` that are not its items' counts. []
    for records whose items carry no outcome."""
    outs = [(i.model_extra or {}).get("outcome") for i in rec.items]
    if not any(isinstance(o, str) for o in outs):
        return []
    counts = {k: sum(1 for o in outs if o == k) for k in ("passed", "failed", "error", "skipped")}
    reasons = []
    bad = [i.id for i, o in zip(rec.items, outs) if o in ("failed", "error")]
    if bad:
        reasons.append(f"{len(bad)} of its test items failed or errored: {', '.join(bad[:5])}"
                       + (" ..." if len(bad) > 5 else ""))
    m = rec.metrics if isinstance(rec.metrics, dict) else {}
    said = [f"{k} = {m[k]!r}, its items hold {n}" for k, n in (*counts.items(), ("tests", len(outs)))
            if k in m and m[k] != n]
    if said:
        reasons.append("its test counts are not its items': " + "; ".join(said))
    return reasons


def recheck(rec: Record, gate: "dict[str, Any] | StoredGate | None", whose: str) -> Record:
    """Re-apply ``gate`` to a record's metrics, and its items to its test counts (:func:`item_reasons`): a record
    that says "pass" while its metrics fail the gate or its items fail (edited by hand, or written by a runner
    that did not gate) reads as "fail", with the reasons and ``rec.rechecked`` saying so. ``whose``: where the
    gate comes from ("its own", "the checkout's suite file"). Other verdicts are left as they are."""
    if rec.verdict.status != "pass":
        return rec
    reasons = gate_reasons(gate, rec.metrics) if gate is not None else []
    if reasons:
        why = f"the record says pass, but its metrics fail {whose} gate"
    else:
        reasons = item_reasons(rec)
        why = "the record says pass, but its items do not"
    if reasons:
        rec.verdict = Verdict(status="fail", cause=f"{why}: {reasons[0]}", reasons=reasons)
        rec.rechecked = why
    return rec


def same_run(a: Record, b: Record) -> bool:
    """Whether two records are one run of a suite copied under another release name or folder (and perhaps edited
    a little): the same configuration, suite, tree and start time, and the same outputs, item by item, or the same
    metrics where it has no items. A record is never the baseline of its own copy."""
    def ident(r: Record):
        return (r.config, r.suite, r.started_at, r.tree.source_hash, r.tree.engine_hash)

    def outputs(r: Record):
        return [(i.id, i.output, i.correct) for i in r.items] if r.items else r.metrics

    return ident(a) == ident(b) and outputs(a) == outputs(b)


def read_record(path: Path) -> Record:
    """Load a record, refusing a schema version this engine does not read (:data:`READABLE_SCHEMA_VERSIONS`),
    and re-apply the gate it stores to its metrics (:func:`recheck`).

    Raises:
        InputError: naming the file and field when it is malformed, or its schema version.
    """
    try:
        data = json.loads(path.read_text())
        if isinstance(data, dict):
            ver = data.get("schema_version", 1)
            if isinstance(ver, bool) or ver not in READABLE_SCHEMA_VERSIONS:
                raise InputError(f"{path}: schema_version: {ver!r} is not a record schema this engine reads "
                                 f"({', '.join(map(str, READABLE_SCHEMA_VERSIONS))}): written by a newer engine, or "
                                 "edited")
        rec = Record.model_validate(data)
        return recheck(rec, rec.gate, "its own")
    except FileNotFoundError:
        raise InputError(f"{path}: record not found") from None
    except UnicodeDecodeError as e:
        raise InputError(f"{path}: not UTF-8 text (byte {e.start})") from None
    except IsADirectoryError:
        raise InputError(f"{path}: a folder, not a record file") from None
    except OSError as e:
        raise InputError(f"{path}: cannot be read: {e.strerror or e}") from None
    except json.JSONDecodeError as e:
        raise InputError(f"{path}:{e.lineno}: malformed JSON: {e.msg}") from None
    except RecursionError:
        raise InputError(f"{path}: nested too deeply to be a record") from None
    except ValidationError as e:
        first = e.errors()[0]
        raise InputError(f"{path}: {'.'.join(map(str, first['loc']))}: {first['msg']}") from None


def record_history(reports: Path, release: str, config: str, suite: str) -> list[Record]:
    """The current record of (release, config, suite) and every earlier run of it kept in ``history/``."""
    cur = record_path(reports, release, config, suite)
    kept = [(int(m.group(1)), p) for p in (cur.parent / HISTORY).glob(f"{suite}.*.json")
            if (m := re.fullmatch(re.escape(suite) + r"\.(\d+)\.json", p.name))]
    paths = ([cur] if cur.exists() else []) + [p for _, p in sorted(kept)]
    out = [read_record(p) for p in paths]
    for p, r in zip(paths, out):
        if (r.release, r.config, r.suite) != (release, config, suite):
            raise InputError(f"{p}: the record says {r.release}/{r.config}/{r.suite}, not {release}/{config}/{suite}")
    return out


def check_place(path: Path, rec: Record, release: str) -> None:
    """A record must lie where it says it belongs: ``<release>/<config>/<suite>.json``.

    Raises:
        InputError: it names another release, configuration or suite than its path (a copied or planted file would
            otherwise stand in for, or collide with, the real record of that configuration and suite).
    """
    want = (release, path.parent.name, path.stem)
    have = (rec.release, rec.config, rec.suite)
    if want != have:
        raise InputError(f"{path}: the record says release {rec.release!r}, configuration {rec.config!r}, suite "
                         f"{rec.suite!r}, but lies at {release}/{path.parent.name}/{path.name}: it is not this "
                         "release's record of that suite (moved or copied by hand?)")


def release_records(reports: Path, release: str, skipped: list[str] | None = None) -> list[Record]:
    """Every record of ``release`` under ``reports``, sorted by configuration then suite.

    ``skipped``: where given, a file that is not a readable record in its place is left out and its error
    appended here instead of raised (a gate then compares what it can and says what it could not).
    Raises:
        InputError: a file is not a record, or a record lies elsewhere than it says (:func:`check_place`).
    """
    base = reports / release
    if not base.is_dir():
        return []
    out = []
    for p in sorted(base.glob("*/*.json")):
        try:
            rec = read_record(p)
            check_place(p, rec, release)
        except InputError as e:
            if skipped is None:
                raise
            skipped.append(str(e))
            continue
        out.append(rec)
    return out

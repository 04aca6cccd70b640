"""The figures release notes compare, read out of records, with their run-to-run band.

A figure is one number of one suite (e.g. BetterBench's combined decode). Its *band* for a release and a
configuration is the min-max over every run of that suite on identical code (same plugin source, engine,
suite and configuration hashes: the current record plus ``history/``); for BetterBench each run's passes
count too. The bands are shown, not judged: a figure the performance gate judges carries the gate's mark
(validate.perfgate), the one rule for "slower"; other figures show their change alone.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Callable

from validate.record import Record


@dataclass(frozen=True)
class FigureSpec:
    """How to read one figure of a suite kind's records: ``get(record) -> value`` and, optionally,
    ``band(record) -> (lo, hi)``. ``kind`` is the suite kind whose records hold it (``*``: any record of the
    launch, e.g. the KV cache read at start)."""

    key: str
    label: str
    kind: str
    unit: str
    digits: int
    higher_is_better: bool
    get: Callable[[Record], float | None]
    band: Callable[[Record], tuple[float, float] | None] | None = None
    per_pass: str | None = None  # the per-pass figure the performance gate judges (BetterBench), if any


def metric(*path: str) -> Callable[[Record], float | None]:
    """A getter of ``record.metrics[path[0]][path[1]]...`` as a float, None where a step is missing."""
    def get(r: Record):
        v: Any = r.metrics
        for p in path:
            if not isinstance(v, dict) or v.get(p) is None:
                return None
            v = v[p]
        return float(v) if isinstance(v, (int, float)) else None
    return get


def banded(key: str):
    """(getter, band getter, ``key``) of a figure a record keeps as ``metrics.summary[key] = {median, min, max}``
    and per pass as ``metrics.per_pass[i][key]``."""
    def get(r: Record):
        return metric("summary", key, "median")(r)

    def band(r: Record):
        lo, hi = metric("summary", key, "min")(r), metric("summary", key, "max")(r)
        return None if lo is None or hi is None else (lo, hi)
    return get, band, key


KV_CACHE = FigureSpec("kv", "KV cache", "*", "tokens", 0, True,
                      lambda r: float(r.server.kv_cache_tokens) if r.server.kv_cache_tokens else None)


def figure_specs(records: list[Record]) -> list[FigureSpec]:
    """The figures these records can give, in the order notes show them: each registered suite kind's own (in
    the registry's order), then the KV cache."""
    from validate.suite import ordered_kinds

    specs: list[FigureSpec] = []
    for runner in ordered_kinds():
        mine = [r for r in records if r.suite_kind == runner.kind]
        if mine and runner.figures is not None:
            # a figure of a kind is read from that kind's records, whatever its spec says
            specs += [dataclasses.replace(f, kind=runner.kind) for f in runner.figures(mine)]
    return specs + [KV_CACHE]


@dataclass
class FigureRow:
    """One figure of one configuration, baseline against candidate."""

    label: str
    unit: str
    digits: int
    baseline: float | None
    candidate: float | None
    band: tuple[float, float] | None  # the candidate's run-to-run band
    baseline_band: tuple[float, float] | None
    runs: int
    mark: str | None = None  # the performance gate's mark, for a figure it judged

    @property
    def change_pct(self) -> float | None:
        if self.baseline in (None, 0) or self.candidate is None:
            return None
        return 100.0 * (self.candidate - self.baseline) / self.baseline



def _same_code(runs: list[Record]) -> list[Record]:
    """Runs of the newest record's code (plugin, engine, suite, configuration): the band's population."""
    if not runs:
        return []
    r0 = runs[0]
    return [r for r in runs if r.verdict.status in ("pass", "fail") and r.tree.source_hash == r0.tree.source_hash
            and r.tree.engine_hash == r0.tree.engine_hash and r.suite_hash == r0.suite_hash and r.config_hash == r0.config_hash]


def _value_and_band(spec: FigureSpec, runs: list[Record]) -> tuple[float | None, tuple[float, float] | None, int]:
    runs = [r for r in _same_code(runs) if spec.get(r) is not None]
    if not runs:
        return None, None, 0
    vals = [spec.get(r) for r in runs]
    lows, highs = list(vals), list(vals)
    if spec.band:
        for r in runs:
            b = spec.band(r)
            if b:
                lows.append(b[0])
                highs.append(b[1])
    band = (min(lows), max(highs)) if (len(runs) > 1 or spec.band) and min(lows) != max(highs) else None
    return vals[0], band, len(runs)


def compare_figures(base: dict[str, list[Record]], cand: dict[str, list[Record]],
                    marks: dict[str, str] | None = None) -> list[FigureRow]:
    """Rows for every figure either side has. ``base``/``cand``: suite -> runs (newest first); a figure of a suite
    is compared with the baseline's runs of the same suite only (the caller leaves out suites whose records do
    not measure the same thing). ``marks``: (suite, per-pass figure name) -> the performance gate's mark."""
    every = [r for runs in list(base.values()) + list(cand.values()) for r in runs]
    rows = []
    marks = marks or {}
    for spec in figure_specs(every):
        def pick(side: dict[str, list[Record]], suite: str | None = None):
            for name, runs in side.items():  # the first suite of the figure's kind (any, for '*') that has it
                if suite is not None and name != suite:
                    continue
                if runs and (spec.kind == "*" or runs[0].suite_kind == spec.kind):
                    v = _value_and_band(spec, runs)
                    if v[0] is not None:
                        return (name, *v)
            return None, None, None, 0
        suite, cv, cband, n = pick(cand)
        _, bv, bband, _ = pick(base, suite) if suite is not None else pick(base)
        if bv is None and cv is None:
            continue
        mark = marks.get((suite, spec.per_pass)) if spec.per_pass and bv is not None and cv is not None else None
        rows.append(FigureRow(spec.label, spec.unit, spec.digits, bv, cv, cband, bband, n, mark))
    return rows


def flat(d: Any, prefix: str = "") -> dict[str, Any]:
    """{'server.max_num_seqs': 8, ...} from nested dicts (lists stay values)."""
    out = {}
    if isinstance(d, dict):
        for k, v in d.items():
            out.update(flat(v, f"{prefix}{k}."))
    else:
        out[prefix[:-1]] = d
    return out


def setting_changes(base: Record, cand: Record) -> list[str]:
    """What a user running the configuration sees change: configuration values, knobs, versions."""
    out = []
    skip = {"name", "description"}
    fb, fc = flat(base.config_snapshot), flat(cand.config_snapshot)
    for k in sorted(set(fb) | set(fc)):
        if k.split(".")[0] in skip or k.startswith("env."):
            continue
        if fb.get(k) != fc.get(k):
            out.append(f"{k}: {fb.get(k)!r} -> {fc.get(k)!r}")
    for k in sorted(set(base.knobs) | set(cand.knobs)):
        if base.knobs.get(k) != cand.knobs.get(k):
            out.append(f"{k}: {base.knobs.get(k)!r} -> {cand.knobs.get(k)!r}")
    envb, envc = base.env, cand.env
    for k in sorted(set(envb) | set(envc)):
        if not k.startswith("R9K_") and envb.get(k) != envc.get(k):
            out.append(f"env {k}: {envb.get(k)!r} -> {envc.get(k)!r}")
    for k in ("vllm", "torch", "driver", "r9k"):
        if base.versions.get(k) != cand.versions.get(k):
            out.append(f"{k} {base.versions.get(k) or '?'} -> {cand.versions.get(k) or '?'}")
    return out

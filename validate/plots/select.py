"""Which records feed the pictures, and the plain data each picture takes from them: a BetterBench record's
concurrency bands and latency samples, a soak record's memory series, and the history view's releases and panels.

Statuses drawn: an error record keeps what it measured before it stopped (:data:`DRAWN`); the history takes
suites that ran to the end (:data:`HISTORY_STATUSES`).
"""
from __future__ import annotations

import math
import re
from pathlib import Path

import numpy as np

from validate.errors import InputError
from validate.plots.draw import Band, HistoryLine, HistoryPanel, MemorySeries, RateCurve, Samples
from validate.record import Record, read_record

# Statuses whose figures are drawn: an error record keeps what it measured before it stopped (a soak whose
# server died keeps its samples); wrong-tree and plugin-inactive records do not count, skipped ones hold nothing.
DRAWN = ("pass", "fail", "error")
HISTORY_STATUSES = ("pass", "fail")  # history points: suites that ran to the end


def num_or_none(v) -> float | None:
    """``v`` as a float when it is a finite number (never a bool), else None."""
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) else None



def rate_curve(rec: Record, label: str) -> RateCurve | None:
    """The valid probes of an arrivals record in rate order (the last probe of a rate where several were run), or
    None when it holds none."""
    by_rate: dict[float, dict] = {}
    for p in rec.metrics.get("probes") or []:
        if isinstance(p, dict) and p.get("valid") and num_or_none(p.get("rate_per_s")):
            by_rate[float(p["rate_per_s"])] = p
    if not by_rate:
        return None
    rates = sorted(by_rate)
    return RateCurve(label, rates, [num_or_none(by_rate[r].get("ttft_ms_pslo")) for r in rates],
                     [num_or_none(by_rate[r].get("tpot_ms_pslo")) for r in rates],
                     [by_rate[r].get("meets") is True for r in rates], num_or_none(rec.metrics.get("slo_rate_per_s")))


def concurrency_bands(rec: Record, label: str) -> tuple[Band | None, Band | None]:
    """(aggregate tok/s, per-stream decode tok/s) against streams from a BetterBench record: the summary's
    median / min / max of ``c<N>_tok_s``; per-stream 1000 / ``c<N>_tpot_ms_p50`` per pass (median and min-max
    over the passes), or from the summary when the record keeps no passes. None where no level has the figure."""
    m = rec.metrics
    levels = [c for c in m.get("concurrency") or [] if isinstance(c, int)]
    summ = m.get("summary") or {}
    passes = m.get("per_pass") or []
    agg = Band(label, [], [], [], [])
    per = Band(label, [], [], [], [])
    for c in levels:
        b = summ.get(f"c{c}_tok_s") or {}
        med, lo, hi = (num_or_none(b.get(k)) for k in ("median", "min", "max"))
        if med is not None:
            agg.x.append(c)
            agg.median.append(med)
            agg.lo.append(lo if lo is not None else med)
            agg.hi.append(hi if hi is not None else med)
        key = f"c{c}_tpot_ms_p50"
        rates = [1e3 / t for row in passes if (t := num_or_none(row.get(key))) and t > 0]
        if rates:
            per.x.append(c)
            per.median.append(float(np.median(rates)))
            per.lo.append(min(rates))
            per.hi.append(max(rates))
        else:
            b = summ.get(key) or {}
            med, lo, hi = (num_or_none(b.get(k)) for k in ("median", "min", "max"))
            if med:
                per.x.append(c)
                per.median.append(1e3 / med)
                per.lo.append(1e3 / hi if hi else 1e3 / med)
                per.hi.append(1e3 / lo if lo else 1e3 / med)
    return (agg if agg.x else None), (per if per.x else None)


def latency_series(rec: Record) -> tuple[list[Samples], list[Samples]]:
    """(TTFT, ITL) :class:`Samples` per concurrency level from a BetterBench record's ``latency_samples``
    (empty lists for a record that has none)."""
    ttft, itl = [], []
    for key, v in (rec.metrics.get("latency_samples") or {}).items():
        m = re.fullmatch(r"c(\d+)", key)
        if not m or not isinstance(v, dict):
            continue
        c = int(m.group(1))
        for out, name in ((ttft, "ttft"), (itl, "itl")):
            vals = [x for x in v.get(f"{name}_ms") or [] if num_or_none(x) is not None]
            if vals:
                out.append(Samples(rec.release, c, vals, v.get(f"{name}_count")))
    return ttft, itl


def memory_series(rec: Record) -> list[MemorySeries]:
    """Memory series of a soak record: its ``samples``, ``memory_samples_in_life`` and per series the part the
    soak fitted (the last ``1 - slope_skip_fraction`` of the series' samples within the server's life, as
    :func:`validate.telemetry.slope_mib_per_min` drops them) with the recorded slope, total and verdict."""
    from validate.runners.soak import SoakParams

    m = rec.metrics
    samples = [s for s in m.get("samples") or [] if isinstance(s, (list, tuple)) and len(s) == 2 and isinstance(s[1], dict)]
    life_n = m.get("memory_samples_in_life")
    life_n = len(samples) if not isinstance(life_n, int) else min(life_n, len(samples))
    skip = rec.params.get("slope_skip_fraction", SoakParams.model_fields["slope_skip_fraction"].default)
    memory = m.get("memory") or {}
    names = list(memory) + sorted({k for _, row in samples for k in row} - set(memory))
    out = []
    for name in names:
        pts = [(i, float(t), float(row[name])) for i, (t, row) in enumerate(samples) if num_or_none(row.get(name)) is not None]
        if not pts:
            continue
        in_life = sum(1 for i, _, _ in pts if i < life_n)
        info = memory.get(name) or {}
        out.append(MemorySeries(name, [t for _, t, _ in pts], [y for _, _, y in pts], in_life, int(in_life * skip),
                                num_or_none(info.get("slope_mib_per_min")), num_or_none(info.get("total")),
                                info.get("flat")))
    return out


def _version(name: str):
    from validate.compare import _version as version

    return version(name)


def history_releases(reports: Path, release: str) -> list[str]:
    """Releases under ``reports`` up to ``release`` in version order (``validate.compare.previous_release``'s
    rule: the name without a leading 'v' as a packaging version; v0.3.10 after v0.3.9). Folders whose names are
    not versions are left out, except ``release`` itself, which comes last."""
    cur = _version(release)
    found = []
    if reports.is_dir():
        for d in reports.iterdir():
            k = _version(d.name)
            if d.is_dir() and k is not None and d.name != release and (cur is None or k <= cur):
                found.append((k, d.name))
    names = [n for _, n in sorted(found)]
    if (reports / release).is_dir():
        names.append(release)
    return names


def _pick(records: list[Record], kind: str, statuses) -> dict[str, Record]:
    """config -> the record of suite kind ``kind`` (the suite named like its kind first), among ``statuses``."""
    out: dict[str, Record] = {}
    for r in sorted(records, key=lambda r: (r.suite != kind, r.suite)):
        if r.suite_kind == kind and r.verdict.status in statuses:
            out.setdefault(r.config, r)
    return out


def readable_records(reports: Path, release: str) -> list[Record]:
    """Every record of an older release that reads; one that does not is left out of the history."""
    out = []
    for p in sorted((reports / release).glob("*/*.json")):
        try:
            out.append(read_record(p))
        except InputError:
            continue
    return out


HISTORY_NAMES = ("decode step", "combined decode", "GSM8K accuracy")  # history_panels' panels, in order


def history_panels(by_release: dict[str, list[Record]]) -> list[HistoryPanel]:
    """The history view's panels from each release's records (releases in order): decode step (BetterBench
    ``decode_step_ms`` median, else the probe's), combined decode (BetterBench median with its min-max band),
    GSM8K accuracy (subset runs hollow)."""
    releases = list(by_release)
    picks = {rel: {k: _pick(recs, k, HISTORY_STATUSES) for k in ("betterbench", "probe", "gsm8k")}
             for rel, recs in by_release.items()}
    configs = sorted({c for p in picks.values() for d in p.values() for c in d})
    step, combined, gsm = [], [], []
    for cfg in configs:
        s_vals, s_lo, s_hi, s_probe, c_vals, c_lo, c_hi, g_vals, g_sub = ([] for _ in range(9))
        for rel in releases:
            bb, pr, gs = (picks[rel][k].get(cfg) for k in ("betterbench", "probe", "gsm8k"))
            summ = (bb.metrics.get("summary") or {}) if bb else {}
            sb = summ.get("decode_step_ms") or {}
            v = num_or_none(sb.get("median"))
            if v is None and bb:
                v = num_or_none(bb.metrics.get("decode_step_ms"))
            from_probe = v is None and pr is not None and num_or_none(pr.metrics.get("decode_step_ms")) is not None
            if from_probe:
                v = num_or_none(pr.metrics.get("decode_step_ms"))
            s_vals.append(v)
            s_lo.append(None if from_probe or v is None else num_or_none(sb.get("min")))
            s_hi.append(None if from_probe or v is None else num_or_none(sb.get("max")))
            s_probe.append(from_probe)
            cb = summ.get("combined_decode_tok_s") or {}
            cv = num_or_none(cb.get("median"))
            if cv is None and bb:
                cv = num_or_none(bb.metrics.get("combined_decode_tok_s"))
            c_vals.append(cv)
            c_lo.append(num_or_none(cb.get("min")) if cv is not None else None)
            c_hi.append(num_or_none(cb.get("max")) if cv is not None else None)
            acc = num_or_none(gs.metrics.get("accuracy")) if gs else None
            g_vals.append(None if acc is None else 100 * acc)
            g_sub.append(bool(gs and gs.dataset and gs.dataset.subset))
        step.append(HistoryLine(cfg, s_vals, s_lo, s_hi, hollow=s_probe))
        combined.append(HistoryLine(cfg, c_vals, c_lo, c_hi))
        gsm.append(HistoryLine(cfg, g_vals, hollow=g_sub))
    return [
        HistoryPanel("decode step p50 (ms, lower is better; bars: min-max across passes)", "ms", step,
                     "BetterBench", "probe (no BetterBench record)"),
        HistoryPanel("BetterBench combined decode (tok/s, higher is better; bars: min-max across passes)", "tok/s",
                     combined),
        HistoryPanel("GSM8K accuracy (%, primary extraction)", "%", gsm, "full test set", "subset", y_max=100.0),
    ]

"""Where the release notes' pictures go: PNG files under ``reports/<release>/figures/``, drawn from records alone.

Per configuration, ``<config>/<suite>-<kind>.png`` (a folder per configuration, so no two names collide), and
``history.png``; :func:`render_figures` picks the records (validate.plots.select), draws each picture
(validate.plots.draw), and removes the pictures of an earlier call that this one no longer draws.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from validate.plots.draw import plot_concurrency, plot_history, plot_latency, plot_memory, plot_rate_latency
from validate.plots.select import (DRAWN, HISTORY_NAMES, concurrency_bands, history_panels, history_releases,
                                   latency_series, memory_series, num_or_none, rate_curve, readable_records)
from validate.record import Record, check_release_name, release_records

FIGURES = "figures"
PlotKind = Literal["concurrency", "latency", "rate", "memory", "history"]


@dataclass(frozen=True)
class PlotFile:
    """One picture written beside RELEASE.md.

    ``path``: relative to ``reports/<release>/`` (``figures/<config>/<suite>-<kind>.png``, ``figures/history.png``);
    ``config``: the configuration it shows, None for the history view; ``kind``: what it shows.
    """

    path: str
    title: str
    config: str | None
    kind: PlotKind


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9._+-]", "_", name)



def render_figures(reports: Path, release: str, baseline: str | None = None,
                   notes: list[str] | None = None) -> list[PlotFile]:
    """Draw the release's pictures from its records (and the baseline's, and every earlier release's for the
    history view) into ``reports/<release>/figures/``.

    Per configuration with an arrivals record: ``<config>/<suite>-rate.png`` (the SLO percentile's TTFT and TPOT
    against the arrival rate, the baseline's probes beside the candidate's). Per configuration with a BetterBench
    record: ``<config>/<suite>-concurrency.png`` and, where the record
    holds ``latency_samples``, ``<config>/<suite>-latency.png`` (the baseline's record of the same
    configuration and suite drawn beside the candidate's where it exists); per configuration with a soak record
    holding memory samples: ``<config>/<suite>-memory.png``; and ``history.png`` when at least two releases up to
    ``release`` hold a decode step, combined decode or GSM8K figure. Records that did not run the tree under
    validation (wrong-tree, plugin-inactive), were skipped, or do not stand on what they hold (validate.audit, either
    side) are not drawn; an error record is drawn with
    what it measured; the history takes suites that ran to the end (pass or fail). A figure whose data is
    missing is not written, and a PNG of these kinds left in ``figures/`` by an earlier call that this call
    did not write is removed. Files are written atomically, mode 0644, ``SIZE_PX`` (history
    ``HISTORY_SIZE_PX``) at ``DPI``.

    Args:
        reports: the reports folder (``reports/<release>/<config>/<suite>.json``).
        release: the candidate release.
        baseline: the release to draw beside it, or None for none (pass the notes' baseline, e.g.
            ``validate.compare.resolve_baseline(reports, release, None)``). Its record of a suite is drawn only
            where the performance gate would compare it (:func:`validate.perfgate.refusal`, the gate's rule).
        notes: where given, a line per figure that could not be drawn (a record holding values no figure can
            show) or per baseline left out, and why; the figure is then not written, and nothing raises.

    Returns:
        What was written, per configuration in name order (concurrency, latency, memory), then the history.

    Raises:
        InputError: a bad release name, or a record of ``release`` or ``baseline`` that does not read (records of
            other releases that do not read are left out of the history).
        OSError: the figures folder cannot be written.
    """
    from validate.perfgate import refusal

    check_release_name(release)
    if baseline == release:
        baseline = None
    if baseline:
        check_release_name(baseline)
    rel_dir = reports / release
    out_dir = rel_dir / FIGURES
    from validate.audit import audit_records

    cand = release_records(reports, release)
    base = release_records(reports, baseline, skipped=[]) if baseline else []
    audit_records(cand + base, reports)  # the one audit, both sides: what does not stand is drawn nowhere
    for r in cand:
        if r.audit_failed and notes is not None:
            notes.append(f"{r.config}/{r.suite}: not drawn: the record does not stand on what it holds")
    cand = [r for r in cand if not r.audit_failed]
    base_by = {(r.config, r.suite): r for r in base if r.verdict.status in DRAWN}
    written: list[PlotFile] = []

    def emit(name: str, title: str, config: str | None, kind: PlotKind, plot, *args) -> None:
        try:
            plot(out_dir / name, title, *args)
        except (TypeError, ValueError, OverflowError, KeyError) as e:
            if notes is None:
                raise
            notes.append(f"{name}: not drawn: the records hold values it cannot show ({type(e).__name__}: {e})")
            return
        written.append(PlotFile(f"{FIGURES}/{name}", title, config, kind))

    def status_note(rec: Record) -> str:
        return "" if rec.verdict.status == "pass" else f" [{rec.release} verdict: {rec.verdict.status}]"

    def draw_config(cfg: str) -> None:
        recs = [r for r in cand if r.config == cfg and r.verdict.status in DRAWN]
        for rec in sorted((r for r in recs if r.suite_kind == "betterbench"), key=lambda r: r.suite):
            b = base_by.get((cfg, rec.suite))
            why = refusal(b, rec) if b is not None else []
            if why:
                if notes is not None:
                    notes.append(f"{cfg}/{rec.suite}: {b.release}'s record is not drawn beside it: " + "; ".join(why))
                b = None
            stem = f"{_safe(cfg)}/{_safe(rec.suite)}"
            who = f"{b.release} vs {release}" if b else release
            verdicts = (status_note(b) if b else "") + status_note(rec)
            sides = ([b] if b else []) + [rec]
            # a figure is drawn when the candidate has its data; the baseline joins it where it has them too
            bands = [concurrency_bands(r, r.release) for r in sides]
            agg = [a for a, _ in bands if a] if bands[-1][0] else []
            per = [p for _, p in bands if p] if bands[-1][1] else []
            if agg or per:
                mns = (rec.config_snapshot.get("server") or {}).get("max_num_seqs")
                emit(f"{stem}-concurrency.png", f"{cfg}: BetterBench throughput against concurrency, {who} (tok/s){verdicts}",
                     cfg, "concurrency", plot_concurrency, agg, per, mns if isinstance(mns, int) else None)
            lat = [latency_series(r) for r in sides]
            ttft = [s for t, _ in lat for s in t] if lat[-1][0] else []
            itl = [s for _, i in lat for s in i] if lat[-1][1] else []
            if ttft or itl:
                emit(f"{stem}-latency.png", f"{cfg}: BetterBench TTFT and ITL distributions, {who} (ms){verdicts}",
                     cfg, "latency", plot_latency, ttft, itl, release)
        for rec in sorted((r for r in recs if r.suite_kind == "arrivals"), key=lambda r: r.suite):
            cur = rate_curve(rec, release)
            if cur is None:
                continue
            b = base_by.get((cfg, rec.suite))
            bc = rate_curve(b, b.release) if b is not None and not refusal(b, rec) else None
            slo = rec.metrics.get("slo") if isinstance(rec.metrics.get("slo"), dict) else {}
            who = f"{b.release} vs {release}" if bc else release
            emit(f"{_safe(cfg)}/{_safe(rec.suite)}-rate.png",
                 f"{cfg}: latency against arrival rate, {who}{status_note(rec)}", cfg, "rate", plot_rate_latency,
                 ([bc] if bc else []) + [cur], num_or_none(slo.get("ttft_ms")), num_or_none(slo.get("tpot_ms")),
                 num_or_none(slo.get("percentile")) or 99.0)
        for rec in sorted((r for r in recs if r.suite_kind == "soak"), key=lambda r: r.suite):
            series = memory_series(rec)
            if not series:
                continue
            m = rec.metrics
            died = num_or_none(m.get("server_died_at_s"))
            dur = num_or_none(m.get("duration_s"))
            span = ""
            if dur and isinstance(m.get("clients"), int):
                span = f", {m['clients']} clients, " + (f"{dur / 60:.1f} min" if dur >= 300 else f"{dur:.0f} s")
            emit(f"{_safe(cfg)}/{_safe(rec.suite)}-memory.png",
                 f"{cfg}: soak memory over time, {release}{span} (MiB){status_note(rec)}", cfg, "memory",
                 plot_memory, series, num_or_none(m.get("max_slope_mib_per_min")), died)

    for cfg in sorted({r.config for r in cand}):
        try:  # a record holding values no figure can show (edited by hand) costs its figures, never the notes
            draw_config(cfg)
        except (TypeError, ValueError, OverflowError, KeyError, AttributeError) as e:
            if notes is None:
                raise
            notes.append(f"{cfg}: figures not drawn: the records hold values they cannot show ({type(e).__name__}: {e})")

    names = history_releases(reports, release)
    by_release = {rel: (cand if rel == release else base if rel == baseline else readable_records(reports, rel))
                  for rel in names}
    for rel, recs in by_release.items():  # the history draws only records that stand on what they hold
        if rel not in (release, baseline):
            audit_records(recs, reports)
        by_release[rel] = [r for r in recs if not r.audit_failed]
    try:
        panels = history_panels(by_release)
    except (TypeError, ValueError, OverflowError, KeyError, AttributeError) as e:
        if notes is None:
            raise
        notes.append(f"history.png: not drawn: the records hold values it cannot show ({type(e).__name__}: {e})")
        panels, names = [], []
    with_data = [i for i, rel in enumerate(names)
                 if any(ln.values[i] is not None for p in panels for ln in p.lines)]
    if len(with_data) >= 2:
        keep = names[with_data[0]:]  # from the first release that holds a figure
        off = with_data[0]
        for p in panels:
            for ln in p.lines:
                ln.values = ln.values[off:]
                ln.lo = ln.lo[off:] if ln.lo else None
                ln.hi = ln.hi[off:] if ln.hi else None
                ln.hollow = ln.hollow[off:]
        shown = [name for name, p in zip(HISTORY_NAMES, panels) if any(v is not None for ln in p.lines for v in ln.values)]
        emit("history.png", f"Release history up to {release}: {', '.join(shown)}", None, "history",
             plot_history, keep, panels)

    keep = {out_dir / Path(f.path).relative_to(FIGURES) for f in written}
    if out_dir.is_dir():  # figures of an earlier render that this one no longer draws
        for p in [out_dir / "history.png", *out_dir.glob("*/*.png")]:
            ours = p.name == "history.png" or p.name.endswith(("-concurrency.png", "-latency.png", "-memory.png"))
            if ours and p.is_file() and p not in keep:
                p.unlink(missing_ok=True)
        for d in out_dir.iterdir():
            if d.is_dir() and not any(d.iterdir()):
                d.rmdir()
    return written

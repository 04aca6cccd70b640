"""Release notes from records alone: ``reports/<release>/RELEASE.md`` through ``templates/release.md.j2``.

This module builds the view (what was checked, what was not and why, the figures per configuration);
the template only lays it out.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jinja2

from validate.errors import InputError
from validate.record import Record, release_records
from validate.suite import Checklist


class _Dash(jinja2.ChainableUndefined):
    """A metric a record lacks (an older or partial record) renders as '–' instead of failing the notes."""

    def __str__(self) -> str:
        return "–"


def _missing(value: Any) -> bool:
    """None, or a key the record does not have (a jinja2 Undefined): shown as '–', never an error."""
    return value is None or isinstance(value, jinja2.Undefined)


def fmt_num(value: Any, digits: int = 0) -> str:
    """Thousands separators and fixed decimals: 93184 -> '93,184', (26.137, 1) -> '26.1'. None -> '–'."""
    if _missing(value):
        return "–"
    if isinstance(value, (int, float)):
        return f"{value:,.{digits}f}"
    return str(value)


def fmt_pct(value: float | None, digits: int = 2) -> str:
    """0.0215 -> '2.15%'. None -> '–'."""
    return "–" if _missing(value) else f"{100 * value:.{digits}f}%"


@dataclass
class Gap:
    config: str
    suite: str  # one suite, or several joined with ", " when they share the reason
    reason: str


def group_gaps(gaps: list[Gap]) -> list[Gap]:
    """Join the suites of one configuration that share a reason ("sanity, gsm8k, probe: did not run")."""
    out: dict[tuple[str, str], list[str]] = {}
    for g in gaps:
        out.setdefault((g.config, g.reason), []).append(g.suite)
    return [Gap(c, ", ".join(s), r) for (c, r), s in out.items()]


@dataclass
class ReleaseView:
    release: str
    records: list[Record]
    by_config: dict[str, dict[str, Record]]
    by_kind: dict[str, dict[str, Record]] = field(default_factory=dict)  # config -> suite kind -> its first record
    checked: list[Record] = field(default_factory=list)
    not_checked: list[Gap] = field(default_factory=list)
    failures: list[Record] = field(default_factory=list)
    tree_hash: str | None = None
    headline: str = ""
    paired: Any = None  # validate.compare.Comparison against the baseline, when there is one
    paired_note: str = ""  # why there is no paired table
    perf: Any = None  # validate.perfgate.PerfComparison against the baseline, when both have BetterBench records
    perf_note: str = ""  # why there is no performance gate
    baseline_note: str = ""  # why the baseline named or found is not compared with
    plots: list = field(default_factory=list)  # validate.plots.PlotFile, written beside RELEASE.md
    baseline: str | None = None
    first_started: str = "–"
    last_ended: str = "–"
    numbers: dict[str, list] = field(default_factory=dict)  # config -> [FigureRow]
    settings: dict[str, list[str]] = field(default_factory=dict)  # config -> changed settings vs the baseline
    server: dict[str, "ServerRow"] = field(default_factory=dict)  # config -> the server's own counters
    changes_md: str = ""  # reports/<release>/changes.md, written by people
    upgrading_md: str = ""  # reports/<release>/upgrading.md, written by people
    thinking: list = field(default_factory=list)  # validate.reasoning.ThinkingRow per eval record


# (name in the title, figure labels in order of preference)
HEADLINE_FIGURES = (
    ("decode step", ("decode step p50 (probe)", "decode step p50 (BetterBench)")),
    ("BetterBench combined decode", ("BetterBench combined decode",)),
    ("single-stream decode", ("single-stream decode (probe)", "single-stream decode (BetterBench)")),
    ("KV cache", ("KV cache",)),
)


def fmt_change(row) -> str:
    """'+6.3%', '-4.7% (within the band)', '=' for no change, '–' without a baseline."""
    c = row.change_pct
    if c is None:
        return "–"
    text = "=" if abs(c) < 0.05 else f"{c:+.1f}%"
    return text + (" (within the band)" if row.within_band else "")


def fmt_fig(value, digits: int, unit: str, band=None) -> str:
    """A figure with its unit and, when there is one, its band: '188.0 tok/s (186.2–189.1)'."""
    if _missing(value):
        return "–"
    u = "%" if unit == "%" else (f" {unit}" if unit else "")
    text = f"{fmt_num(value, digits)}{u}"
    if band:
        text += f" ({fmt_num(band[0], digits)}–{fmt_num(band[1], digits)})"
    return text


def gap_reason(rec: Record, tree_hash: str | None) -> str | None:
    """Why a record does not count as a full check, or None when it does."""
    st = rec.verdict.status
    if st == "error":
        return f"did not complete: {rec.verdict.cause}"
    if st == "wrong-tree":
        return f"ran on another tree: {rec.verdict.cause}"
    if st == "plugin-inactive":
        return f"the plugin was not active: {rec.verdict.cause}"
    if st == "skipped":
        return f"skipped: {rec.verdict.cause}"
    reasons = []
    if rec.profile != "full":
        reasons.append(f"{rec.profile} profile")
    if rec.dataset is not None and rec.dataset.subset:
        reasons.append(f"a subset: {rec.dataset.n_used:,} of {rec.dataset.n_total:,} items (seed {rec.dataset.seed})")
    if tree_hash and rec.tree.source_hash != tree_hash:
        reasons.append(f"plugin source {rec.tree.source_hash}, not the release's {tree_hash}")
    if rec.server.launched is False and rec.server.provenance_ok is None and rec.server.url:
        reasons.append("provenance not verified (external server)")
    return "; ".join(reasons) or None


def build_view(reports: Path, release: str, checklist: Checklist | None, baseline: str | None = None,
               perf_specs: dict | None = None) -> ReleaseView:
    """Collect the records of ``release``, classify them against the checklist, pair evals with ``baseline``
    (default: the previous release under ``reports``)."""
    records = release_records(reports, release)
    by_config: dict[str, dict[str, Record]] = {}
    for r in records:
        by_config.setdefault(r.config, {})[r.suite] = r
    hashes = Counter(r.tree.source_hash for r in records if r.tree.source_hash)
    planned = checklist.plan() if checklist else [(c, list(s)) for c, s in by_config.items()]
    order = [c for c, _ in planned]
    by_config = dict(sorted(by_config.items(), key=lambda kv: (order.index(kv[0]) if kv[0] in order else len(order), kv[0])))
    view = ReleaseView(release, records, by_config, tree_hash=hashes.most_common(1)[0][0] if hashes else None)
    for cfg, suites in by_config.items():
        for r in suites.values():
            view.by_kind.setdefault(cfg, {}).setdefault(r.suite_kind, r)
    if records:
        view.first_started = min(r.started_at for r in records).replace("T", " ").replace("+00:00", "")
        view.last_ended = max(r.ended_at for r in records).replace("T", " ").replace("+00:00", "")
    seen = set()
    for cfg, suites in planned:
        for s in suites:
            seen.add((cfg, s))
            rec = by_config.get(cfg, {}).get(s)
            if rec is None:
                view.not_checked.append(Gap(cfg, s, "did not run (no record)"))
                continue
            why = gap_reason(rec, view.tree_hash)
            if why:
                view.not_checked.append(Gap(cfg, s, why))
            else:
                view.checked.append(rec)
    for r in records:  # records outside the checklist still count for what they are
        if (r.config, r.suite) not in seen:
            why = gap_reason(r, view.tree_hash)
            (view.not_checked.append(Gap(r.config, r.suite, why)) if why else view.checked.append(r))
    view.not_checked = group_gaps(view.not_checked)
    view.failures = [r for r in records if r.verdict.status != "pass"]
    from validate.compare import resolve_baseline

    view.baseline = resolve_baseline(reports, release, baseline)
    if view.baseline:
        try:  # the baseline's records must read before anything is compared with them
            release_records(reports, view.baseline)
        except InputError as e:
            view.baseline_note = f"the baseline {view.baseline}'s records cannot be read: {e}"
            view.baseline = None
    attach_numbers(view, reports)
    view.server = {cfg: server_row(suites) for cfg, suites in view.by_config.items()}
    view.headline = headline(view)
    from validate.reasoning import thinking_rows

    view.thinking = thinking_rows(view.by_kind)
    attach_paired(view, reports, view.baseline)
    attach_perf(view, reports, view.baseline, perf_specs)
    for name in ("changes", "upgrading"):
        f = reports / release / f"{name}.md"
        if f.is_file():
            setattr(view, f"{name}_md", f.read_text().strip())
    return view


@dataclass
class ServerRow:
    """The server's view of one configuration beside the client's: from the record of ``suite`` (probe first,
    then BetterBench, soak, any), TTFT as the server measured it (arrival to first token: queue + prefill) and
    as the client did (send to first chunk), means over the same requests; the difference is the client's own
    share (HTTP, the API server's tokenizer and detokenizer, SSE, the client). Counters summed over every suite
    of the configuration. ``why`` says why there is none (the server exposes no metrics)."""

    suite: str | None = None
    requests: int | None = None
    client_ttft_ms: float | None = None
    server_ttft_ms: float | None = None
    queue_ms: float | None = None
    prefill_ms: float | None = None
    decode_ms: float | None = None
    itl_ms: float | None = None
    preemptions: float | None = None
    prefix_hit_rate: float | None = None
    kv_usage_peak: float | None = None
    finish_reasons: dict[str, int] = field(default_factory=dict)
    spec_acceptance: float | None = None
    why: str | None = None

    @property
    def client_share_ms(self) -> float | None:
        if self.client_ttft_ms is None or self.server_ttft_ms is None:
            return None
        return self.client_ttft_ms - self.server_ttft_ms


SERVER_ROW_SUITES = ("probe", "betterbench", "soak")  # suite kinds, in order of preference


def server_row(records: dict[str, Record]) -> ServerRow:
    """:class:`ServerRow` of one configuration's records (suite name -> record)."""
    with_metrics = [r for r in records.values() if r.server_metrics and r.server_metrics.get("available")]
    if not with_metrics:
        whys = sorted({(r.server_metrics or {}).get("why") or "not recorded" for r in records.values()})
        return ServerRow(why="; ".join(whys))
    rank = {k: i for i, k in enumerate(SERVER_ROW_SUITES)}
    best = min(with_metrics, key=lambda r: rank.get(r.suite_kind, len(rank)))
    d = best.server_metrics["delta"]
    h = d.get("histograms", {})
    mean = lambda k: (h.get(k) or {}).get("mean_ms")  # noqa: E731
    row = ServerRow(suite=best.suite, requests=(h.get("ttft") or {}).get("count"),
                    client_ttft_ms=(best.client or {}).get("ttft_mean_ms"), server_ttft_ms=mean("ttft"),
                    queue_ms=mean("queue"), prefill_ms=mean("prefill"), decode_ms=mean("decode"), itl_ms=mean("itl"),
                    prefix_hit_rate=d.get("prefix_cache_hit_rate"), spec_acceptance=d.get("spec_acceptance_rate"))
    row.preemptions = sum(r.server_metrics["delta"].get("counters", {}).get("preemptions", 0.0) for r in with_metrics)
    for r in with_metrics:
        for reason, n in r.server_metrics["delta"].get("requests_by_finish_reason", {}).items():
            row.finish_reasons[reason] = row.finish_reasons.get(reason, 0) + n
        for _, sample in r.server_metrics.get("series", []):
            if "kv_cache_usage" in sample:
                row.kv_usage_peak = max(row.kv_usage_peak or 0.0, sample["kv_cache_usage"])
    return row


def attach_numbers(view: ReleaseView, reports: Path) -> None:
    """Baseline against candidate, figure by figure, per configuration, with run-to-run bands."""
    from validate.figures import compare_figures, setting_changes
    from validate.record import record_history, release_records

    base_by: dict[str, dict[str, Record]] = {}
    if view.baseline:
        for r in release_records(reports, view.baseline):
            base_by.setdefault(r.config, {})[r.suite] = r
    for cfg, suites in view.by_config.items():
        cand = {s: record_history(reports, view.release, cfg, s) for s in suites}
        base = {s: record_history(reports, view.baseline, cfg, s) for s in base_by.get(cfg, {})} if view.baseline else {}
        view.numbers[cfg] = compare_figures(base, cand)
        if cfg in base_by:
            b0, c0 = next(iter(base_by[cfg].values())), next(iter(suites.values()))
            view.settings[cfg] = setting_changes(b0, c0)


def attach_paired(view: ReleaseView, reports: Path, baseline: str | None) -> None:
    """Pair the release's eval records with the baseline's; an unpairable task is listed under Not checked."""
    from validate.compare import compare_releases, resolve_baseline
    from validate.errors import InputError

    base = resolve_baseline(reports, view.release, baseline)
    if base is None:
        view.paired_note = "no baseline release under reports/ to pair with"
        return
    try:
        view.paired = compare_releases(reports, view.release, base)
    except InputError as e:
        view.paired_note = f"no paired comparison against {base}: {e}"
        return
    for u in view.paired.unpaired:
        cfg_task, _, why = u.partition(": ")
        view.not_checked.append(Gap(cfg_task.split("/")[0], "paired eval", u))


def attach_perf(view: ReleaseView, reports: Path, baseline: str | None, specs: dict | None) -> None:
    """The performance gate against the baseline (validate.perfgate); a configuration it cannot compare is listed
    under Not checked."""
    from validate.errors import InputError
    from validate.perfgate import compare_perf

    if baseline is None:
        view.perf_note = "no baseline release under reports/ to compare with"
        return
    try:
        view.perf = compare_perf(reports, view.release, baseline, specs)
    except InputError as e:
        view.perf_note = str(e)
        return
    for u in view.perf.unpaired:
        view.not_checked.append(Gap(u.split("/")[0], "performance gate", u))


def headline(view: ReleaseView) -> str:
    """Title-line figures. With a baseline: the largest moves of the first configuration's headline figures
    (decode step, combined decode, single-stream decode, KV cache); without: per configuration, sanity,
    GSM8K and single-stream decode."""
    if view.baseline and view.numbers:
        cfg, rows = next(iter(view.numbers.items()))
        by_label = {r.label: r for r in rows if r.change_pct is not None}
        bits = []
        for name, labels in HEADLINE_FIGURES:
            r = next((by_label[x] for x in labels if x in by_label), None)
            if r is not None and abs(r.change_pct) >= 0.05:
                unit = f" {r.unit}" if r.unit and r.unit != "%" else ""
                bits.append(f"{name} {fmt_num(r.baseline, r.digits)} -> {fmt_num(r.candidate, r.digits)}{unit}")
        if bits:
            return f"{cfg}: " + ", ".join(bits[:2])
    from validate.suite import ordered_kinds

    parts = []
    for cfg, kinds in view.by_kind.items():
        bits = [phrase for runner in ordered_kinds() if runner.headline and runner.kind in kinds
                if (phrase := runner.headline(kinds[runner.kind]))]
        if bits:
            parts.append(f"{cfg}: " + ", ".join(bits))
    return "; ".join(parts) or "no measurements"


def render_release(root: Path, reports: Path, release: str, checklist: Checklist | None,
                   baseline: str | None = None) -> Path:
    """Render ``reports/<release>/RELEASE.md`` and return its path."""
    from validate.perfgate import specs_of

    from validate.plots import render_figures

    view = build_view(reports, release, checklist, baseline, perf_specs=specs_of(root))
    view.plots = render_figures(reports, release, view.baseline)
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(root / "templates"), undefined=_Dash,
                             trim_blocks=True, lstrip_blocks=True, keep_trailing_newline=True)
    env.filters["num"] = fmt_num
    env.filters["pct"] = fmt_pct
    env.filters["change"] = fmt_change
    env.globals["fig"] = fmt_fig
    text = env.get_template("release.md.j2").render(v=view)
    out = reports / release / "RELEASE.md"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text)
    return out

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
import markupsafe

from validate.record import Record
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
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return str(value)
    if not _finite(value):
        return f"not a number ({value!r})"
    return f"{value:,.{digits}f}"


def fmt_pct(value: float | None, digits: int = 2) -> str:
    """0.0215 -> '2.15%'. None -> '–'."""
    if _missing(value):
        return "–"
    if not _finite(value):
        return f"not a number ({value!r})"
    return f"{100 * value:.{digits}f}%"


def by_number(items: Any, attribute: str) -> list:
    """The dicts of ``items`` sorted by their numeric ``attribute``; those without a finite number there after the
    others, in their order (an edited record must not stop the notes from rendering). Not a list: []."""
    if not isinstance(items, list):
        return []
    rows = [x for x in items if isinstance(x, dict)]

    def key(x: dict):
        v = x.get(attribute)
        ok = isinstance(v, (int, float)) and not isinstance(v, bool) and _finite(v)
        return (0, v) if ok else (1, 0)
    return sorted(rows, key=key)


def as_list(value: Any) -> list:
    """``value`` if it is a list, else [] (a record's list field edited into something else)."""
    return value if isinstance(value, list) else []


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
    """What the template lays out. Everything that says whether the release passed comes from ``verdict``
    (:class:`validate.verdict.ReleaseVerdict`): the opening line, Checked, Not checked, Failures."""

    release: str
    records: list[Record]
    by_config: dict[str, dict[str, Record]]
    verdict: Any = None
    by_kind: dict[str, dict[str, Record]] = field(default_factory=dict)  # config -> suite kind -> its first record
    checked: list = field(default_factory=list)  # validate.verdict.Check, full checks
    not_checked: list[Gap] = field(default_factory=list)
    failures: list = field(default_factory=list)  # validate.verdict.Check, findings and what could not be made
    tree_hash: str | None = None
    word: dict[str, str] = field(default_factory=dict)  # "<config>/<suite>" -> the verdict's word for that record
    headline: str = ""
    paired: Any = None  # validate.compare.Comparison against the baseline, when there is one
    paired_note: str = ""  # why there is no paired table
    perf: Any = None  # validate.perfgate.PerfComparison against the baseline, when both have BetterBench records
    perf_note: str = ""  # why there is no performance gate
    plots: list = field(default_factory=list)  # validate.plots.PlotFile, written beside RELEASE.md
    plot_notes: list[str] = field(default_factory=list)  # figures that could not be drawn, and why
    baseline: str | None = None
    baseline_why: str = ""
    first_started: str = "–"
    last_ended: str = "–"
    numbers: dict[str, list] = field(default_factory=dict)  # config -> [FigureRow]
    numbers_notes: dict[str, list[str]] = field(default_factory=dict)  # config -> what was not compared, why
    settings: dict[str, list[str]] = field(default_factory=dict)  # config -> changed settings vs the baseline
    server: dict[str, "ServerRow"] = field(default_factory=dict)  # config -> the server's own counters
    moe: list = field(default_factory=list)  # MoeRow per record with expert-cache counters
    calls: list = field(default_factory=list)  # CallsRow per record with r9k's dispatched calls
    changes_md: str = ""  # reports/<release>/changes.md, written by people
    upgrading_md: str = ""  # reports/<release>/upgrading.md, written by people
    thinking: list = field(default_factory=list)  # validate.reasoning.ThinkingRow per eval record
    # validate.identity.SoloIdentity per record with answers under load: each against its own solo answer
    batch_identity: list = field(default_factory=list)
    random_weights: set[str] = field(default_factory=set)  # configurations of random weights (answers not judged)


# (name in the title, figure labels in order of preference)
HEADLINE_FIGURES = (
    ("decode step", ("decode step p50 (probe)", "decode step p50 (BetterBench)")),
    ("BetterBench combined decode", ("BetterBench combined decode",)),
    ("single-stream decode", ("single-stream decode (probe)", "single-stream decode (BetterBench)")),
    ("KV cache", ("KV cache",)),
)


def fmt_change(row) -> str:
    """'+6.3%', '-4.7% (slower: regression)', '=' for no change, '–' without a baseline; the performance gate's
    mark beside a figure it gates."""
    c = row.change_pct
    if c is None:
        return "–"
    text = "=" if abs(c) < 0.05 else f"{c:+.1f}%"
    if row.mark:
        text += f" ({'slower: regression' if row.mark == 'slower' else row.mark})"
    return text


def fmt_fig(value, digits: int, unit: str, band=None) -> str:
    """A figure with its unit and, when there is one, its band: '188.0 tok/s (186.2–189.1)'. A value that is
    not a finite number (a record edited by hand) is shown as what it is, never an error."""
    if _missing(value):
        return "–"
    if not _finite(value):
        return f"not a number ({value!r})"
    u = "%" if unit == "%" else (f" {unit}" if unit else "")
    text = f"{fmt_num(value, digits)}{u}"
    if band and all(_finite(x) for x in band):
        text += f" ({fmt_num(band[0], digits)}–{fmt_num(band[1], digits)})"
    return text


def _finite(x: Any) -> bool:
    import math

    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


#: How the notes' "Not checked" introduces a suite record of each status that did not pass.
GAP_PREFIX = {"error": "did not complete", "skipped": "skipped", "wrong-tree": "ran on another tree",
              "plugin-inactive": "the plugin was not active"}


def build_view(reports: Path, release: str, checklist: Checklist | None, verdict) -> ReleaseView:
    """The notes' view of ``release``: its records by configuration, and ``verdict``'s checks sorted into
    Checked, Not checked and Failures (the template decides nothing)."""
    records = verdict.records
    by_config: dict[str, dict[str, Record]] = {}
    for r in records:
        by_config.setdefault(r.config, {})[r.suite] = r
    hashes = Counter(r.tree.source_hash for r in records if r.tree.source_hash)
    planned = checklist.plan() if checklist else [(c, list(s)) for c, s in by_config.items()]
    order = [c for c, _ in planned]
    by_config = dict(sorted(by_config.items(), key=lambda kv: (order.index(kv[0]) if kv[0] in order else len(order), kv[0])))
    view = ReleaseView(release, records, by_config, verdict=verdict,
                       tree_hash=hashes.most_common(1)[0][0] if hashes else None)
    from validate.loadgate import random_weights

    for cfg, suites in by_config.items():
        for r in suites.values():
            if r.audit_failed:  # figures its own data do not give are shown in no table and no title
                continue
            view.by_kind.setdefault(cfg, {}).setdefault(r.suite_kind, r)
            if random_weights(r):
                view.random_weights.add(cfg)
    if records:
        view.first_started = min(r.started_at for r in records).replace("T", " ").replace("+00:00", "")
        view.last_ended = max(r.ended_at for r in records).replace("T", " ").replace("+00:00", "")
    view.checked = [c for c in verdict.checks if c.full_check and c.area == "suite"]
    # the Numbers table names each record by what the verdict made of it, never by its own status alone (a
    # "pass" of another tree, or of a restarted server, is not a pass)
    view.word = {f"{c.config}/{c.name}": ("pass" if c.full_check else "pass, limited" if c.outcome == "pass"
                                           else c.status or c.outcome)
                 for c in verdict.checks if c.area == "suite"}
    gaps = []
    for c in verdict.not_checked:
        why = c.message if c.outcome != "pass" else c.limits
        if c.area == "suite" and c.status in GAP_PREFIX:
            why = f"{GAP_PREFIX[c.status]}: {why}"
        if c.outcome != "pass" and c.limits:
            why += f" ({c.limits})"
        gaps.append(Gap(c.config, c.name, why))
    view.not_checked = group_gaps(gaps)
    view.failures = verdict.findings + [c for c in verdict.of("not-checked") if c.area == "suite"]
    view.baseline, view.baseline_why = verdict.baseline, verdict.baseline_why
    view.paired, view.perf = verdict.comparison, verdict.perf
    if view.paired is None:
        view.paired_note = (f"no baseline: {view.baseline_why}" if view.baseline is None else
                            f"no eval record of {release} could be paired with {view.baseline}")
    if view.perf is None:
        view.perf_note = (f"no baseline: {view.baseline_why}" if view.baseline is None else
                          "no BetterBench record of both releases")
    attach_numbers(view, reports)
    view.server = {cfg: server_row(suites) for cfg, suites in view.by_config.items()}
    view.moe = moe_rows(view.by_config)
    view.calls = calls_rows(view.by_config)
    view.headline = headline(view)
    from validate.reasoning import thinking_rows

    view.thinking = thinking_rows(view.by_kind)
    view.batch_identity = batch_identity_rows(view.by_config)
    for name in ("changes", "upgrading"):
        f = reports / release / f"{name}.md"
        if f.is_file():
            setattr(view, f"{name}_md", markupsafe.Markup(f.read_text().strip()))
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
    oddities: list[str] = field(default_factory=list)  # counters left out, reset (a restart) or impossible

    @property
    def client_share_ms(self) -> float | None:
        if self.client_ttft_ms is None or self.server_ttft_ms is None:
            return None
        return self.client_ttft_ms - self.server_ttft_ms


@dataclass
class MoeRow:
    """r9k's expert cache over one suite of one configuration (the record's ``moe_cache``, summed over layers and
    ranks): layers, their slots / staging / experts, and the counters (r9k/counters.py)."""

    config: str
    suite: str
    layers: int
    shape: str          # "slots + staging of experts", or "varies" across layers
    total: dict
    malformed: int = 0

    @property
    def mib(self) -> float | None:
        """Bytes copied from the host store, MiB (None where the record holds no count)."""
        b = _count(self.total.get("bytes"))
        return b / 2**20 if b is not None else None

    @property
    def held_mib(self) -> float | None:
        """What the layers' caches hold on their devices, MiB (None where a counter line did not say)."""
        b = _count(self.total.get("device_bytes"))
        return b / 2**20 if b is not None else None

    @property
    def share(self) -> float | None:
        """``device_share`` where it is a finite number >= 0, else None."""
        x = self.total.get("device_share")
        return float(x) if _finite(x) and not isinstance(x, bool) and x >= 0 else None


def _count(x: Any) -> int | None:
    """``x`` where it is a count (an int >= 0, not a bool), else None: an edited record shows a dash, not its text."""
    return x if isinstance(x, int) and not isinstance(x, bool) and x >= 0 else None


def moe_rows(by_config: dict[str, dict[str, Record]]) -> list[MoeRow]:
    """One :class:`MoeRow` per record whose ``moe_cache`` holds counters; a record whose counters cannot be read
    (not a dict, an ``error``, no total) gives none (nothing is shown that the log did not say)."""
    out = []
    for cfg, suites in by_config.items():
        for name, r in suites.items():
            mc = r.moe_cache
            if not isinstance(mc, dict) or not isinstance(mc.get("total"), dict) or not isinstance(mc.get("layers"), list):
                continue
            shapes = {(x.get("slots"), x.get("staging"), x.get("experts")) for x in mc["layers"] if isinstance(x, dict)}
            shape = "varies" if len(shapes) != 1 else "{} + {} of {}".format(*next(iter(shapes)))
            out.append(MoeRow(cfg, name, len(mc["layers"]), shape, mc["total"], _count(mc.get("malformed")) or 0))
    return out


@dataclass
class CallsRow:
    """r9k's dispatched calls over one suite of one configuration (the record's ``r9k_calls``): the steps by kind,
    and per dispatch and route its calls by kind with the calls a step of that kind."""

    config: str
    suite: str
    steps: dict
    calls: list  # (dispatch, route as shown (ROUTE_LABELS), {kind: (calls, per step or None)})
    processes: int = 0
    malformed: int = 0


#: a route of r9k.calls.ROUTES as the notes' table shows it
ROUTE_LABELS = {"r9k": "r9k", "rule": "vllm, beyond its rule", "vllm": "vllm"}


def calls_rows(by_config: dict[str, dict[str, Record]]) -> list[CallsRow]:
    """One :class:`CallsRow` per record whose ``r9k_calls`` can be read (else none: nothing is shown that the log did
    not say)."""
    from r9k.calls import KINDS, NAME_RE, ROUTES

    out = []
    for cfg, suites in by_config.items():
        for name, r in suites.items():
            c = r.r9k_calls
            if not (isinstance(c, dict) and isinstance(c.get("steps"), dict) and isinstance(c.get("calls"), list)):
                continue
            steps = {k: _count(c["steps"].get(k)) for k in KINDS}
            by: dict[tuple[str, str], dict] = {}
            for x in c["calls"]:
                if not (isinstance(x, dict) and x.get("kind") in KINDS and x.get("route") in ROUTES
                        and isinstance(x.get("dispatch"), str) and NAME_RE.fullmatch(x["dispatch"])
                        and _count(x.get("calls")) is not None):
                    continue  # what the log could not have said is not shown
                n, st = x["calls"], steps[x["kind"]]
                by.setdefault((x["dispatch"], x["route"]), {})[x["kind"]] = (n, n / st if st else None)
            order = {rt: i for i, rt in enumerate(ROUTES)}
            out.append(CallsRow(cfg, name, steps, [(d, ROUTE_LABELS[rt], v) for (d, rt), v
                                                   in sorted(by.items(), key=lambda x: (x[0][0], order[x[0][1]]))],
                                _count(c.get("processes")) or 0, _count(c.get("malformed")) or 0))
    return out


SERVER_ROW_SUITES = ("probe", "betterbench", "soak")  # suite kinds, in order of preference


def batch_identity_rows(by_config: dict[str, dict[str, Record]]) -> list:
    """Each greedy-answer record with answers under load (validate.identity.IDENTITY_KINDS) that stands on its
    items, its answers under load against its own solo answers (validate.identity.compare_with_solo)."""
    from validate.identity import IDENTITY_KINDS, compare_with_solo

    return [x for suites in by_config.values() for r in suites.values()
            if r.suite_kind in IDENTITY_KINDS and not r.audit_failed and (x := compare_with_solo(r)) is not None]


def server_row(records: dict[str, Record]) -> ServerRow:
    """:class:`ServerRow` of one configuration's records (suite name -> record). Values that are missing stay
    missing (a server without ``num_preemptions`` shows no preemption count, not 0); counters a suite could not
    use (not finite, reset by a restart, impossible) are named in ``oddities``."""
    def num(x):
        return float(x) if _finite(x) else None

    with_metrics = [r for r in records.values() if isinstance(r.server_metrics, dict) and r.server_metrics.get("available")
                    and isinstance(r.server_metrics.get("delta"), dict)]
    if not with_metrics:
        whys = sorted({str((r.server_metrics or {}).get("why") or "not recorded") if isinstance(r.server_metrics, dict)
                       else "not recorded" for r in records.values()})
        return ServerRow(why="; ".join(whys))
    rank = {k: i for i, k in enumerate(SERVER_ROW_SUITES)}
    best = min(with_metrics, key=lambda r: rank.get(r.suite_kind, len(rank)))
    d = best.server_metrics["delta"]
    h = d.get("histograms") if isinstance(d.get("histograms"), dict) else {}
    mean = lambda k: num((h.get(k) or {}).get("mean_ms")) if isinstance(h.get(k), dict) else None  # noqa: E731
    row = ServerRow(suite=best.suite, requests=num((h.get("ttft") or {}).get("count")) if isinstance(h.get("ttft"), dict) else None,
                    client_ttft_ms=num((best.client or {}).get("ttft_mean_ms")), server_ttft_ms=mean("ttft"),
                    queue_ms=mean("queue"), prefill_ms=mean("prefill"), decode_ms=mean("decode"), itl_ms=mean("itl"),
                    prefix_hit_rate=num(d.get("prefix_cache_hit_rate")), spec_acceptance=num(d.get("spec_acceptance_rate")))
    pre = [num((r.server_metrics["delta"].get("counters") or {}).get("preemptions")) for r in with_metrics]
    row.preemptions = sum(x for x in pre if x is not None) if any(x is not None for x in pre) else None
    for r in with_metrics:
        dd = r.server_metrics["delta"]
        for reason, n in (dd.get("requests_by_finish_reason") or {}).items():
            if _finite(n):
                row.finish_reasons[reason] = row.finish_reasons.get(reason, 0) + n
        for item in r.server_metrics.get("series") or []:
            sample = item[1] if isinstance(item, (list, tuple)) and len(item) == 2 and isinstance(item[1], dict) else {}
            u = num(sample.get("kv_cache_usage"))
            if u is not None:
                row.kv_usage_peak = max(row.kv_usage_peak or 0.0, u)
        for key, why in (dd.get("invalid") or {}).items():
            row.oddities.append(f"{r.suite}: {key} left out, the server reported {why}")
        for key in dd.get("resets") or []:
            row.oddities.append(f"{r.suite}: {key} went backwards: the server restarted during the suite")
        for what in dd.get("impossible") or []:
            row.oddities.append(f"{r.suite}: impossible value {what}")
    if row.kv_usage_peak is not None and row.kv_usage_peak > 1.0:
        row.oddities.append(f"KV-cache usage peaked at {row.kv_usage_peak:g}, above 1: an impossible value")
    if row.requests is not None:
        row.requests = int(row.requests)
    return row


def attach_numbers(view: ReleaseView, reports: Path) -> None:
    """Baseline against candidate, figure by figure, per configuration, pairing only records that measured the
    same thing and that the performance gate would compare (:func:`validate.perfgate.refusal`, the rule the gate
    pairs by): the baseline's record of the same suite. A suite whose baseline record is refused shows the
    candidate alone and says why in ``view.numbers_notes``. Figures the performance gate judged carry its mark."""
    from validate.figures import compare_figures, setting_changes
    from validate.perfgate import refusal
    from validate.record import record_history
    from validate.audit import read_release

    base_by: dict[str, dict[str, Record]] = {}
    if view.baseline:
        base_all = read_release(reports, view.baseline, skipped=[])  # audited as the candidate's are
        for r in base_all:
            base_by.setdefault(r.config, {})[r.suite] = r
    marks = {(f.config, f.suite, f.figure): f.mark for f in (view.perf.figures if view.perf else [])}
    for cfg, suites in view.by_config.items():
        cand = {s: record_history(reports, view.release, cfg, s) for s in suites}
        base: dict[str, list[Record]] = {}
        notes = []
        for s, c in list(suites.items()):
            if c.audit_failed:  # figures its own data do not give are shown nowhere (re-derived on read)
                notes.append(f"{s}: not shown: the record does not stand on what it holds: {c.audit_failed}")
                cand.pop(s, None)
                continue
            b = base_by.get(cfg, {}).get(s)
            if b is None:
                continue
            why = refusal(b, c)  # the gate's one rule: an audit either side failed included
            if why:
                notes.append(f"{s}: not compared with {view.baseline}'s record: {'; '.join(why)}")
            else:
                base[s] = record_history(reports, view.baseline, cfg, s)
        view.numbers[cfg] = compare_figures(base, cand, {(k[1], k[2]): m for k, m in marks.items() if k[0] == cfg})
        view.numbers_notes[cfg] = notes
        if cfg in base_by:
            b0, c0 = next(iter(base_by[cfg].values())), next(iter(suites.values()))
            view.settings[cfg] = setting_changes(b0, c0)


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
            if r is not None and _finite(r.change_pct) and abs(r.change_pct) >= 0.05:
                unit = f" {r.unit}" if r.unit and r.unit != "%" else ""
                mark = f" ({r.mark})" if r.mark else ""
                bits.append(f"{name} {fmt_num(r.baseline, r.digits)} -> {fmt_num(r.candidate, r.digits)}{unit}{mark}")
        if bits:
            return f"{cfg}: " + ", ".join(bits[:2])
    from validate.suite import ordered_kinds

    def phrase(runner, rec) -> str | None:
        if rec.audit_failed:  # its own data do not give its figures: the title never shows them
            return None
        try:
            return runner.headline(rec)
        except (TypeError, ValueError, KeyError, AttributeError):  # a record edited by hand: no phrase, no crash
            return None

    parts = []
    for cfg, kinds in view.by_kind.items():
        bits = [p for runner in ordered_kinds() if runner.headline and runner.kind in kinds
                if (p := phrase(runner, kinds[runner.kind]))]
        if bits:
            parts.append(f"{cfg}: " + ", ".join(bits))
    return "; ".join(parts) or "no measurements"


def one_line(value: Any) -> Any:
    """What a ``{{ }}`` of the notes prints: text from records on one line, with the characters that would end a
    table cell or open an HTML comment escaped (a record's text must never forge a line of the notes, such as their
    opening, nor hide the lines after it);
    markdown written by people (``changes.md``, ``upgrading.md``) is passed as Markup and left as it is."""
    if isinstance(value, markupsafe.Markup) or not isinstance(value, str):
        return value
    return " ".join(value.split("\n")).replace("\r", " ").replace("|", "\\|").replace("<!--", "&lt;!--")


def fallback_notes(verdict) -> str:
    """The notes when the full template cannot be rendered: the verdict's opening line and every check that did
    not pass, so the release's state is still written beside its records."""
    lines = [f"# {verdict.release}", "", one_line(verdict.opening()), "", "## Not checked", ""]
    lines += [f"- {one_line(c.config)} / {one_line(c.name)}: {one_line(c.message or c.limits or c.status)}."
              for c in verdict.not_checked] or ["- Nothing."]
    lines += ["", "## Failures", ""]
    lines += [f"- **{one_line(c.config)} / {one_line(c.name)}: {one_line(c.status)}**: {one_line(c.message)}"
              for c in verdict.findings] or ["- None."]
    return "\n".join(lines) + "\n"


def render_release(root: Path, reports: Path, release: str, checklist: Checklist | None, verdict=None,
                   baseline: str | None = None) -> Path:
    """Render ``reports/<release>/RELEASE.md`` from ``verdict`` (default: :func:`validate.verdict.assess_release`
    of the records with ``baseline``) and return its path. A figure that cannot be drawn is named in the notes,
    never an error.

    Raises:
        OSError: the notes cannot be written.
    """
    from validate.plots import render_figures
    from validate.verdict import assess_release

    if verdict is None:
        verdict = assess_release(reports, release, root=root, baseline=baseline,
                                 planned=checklist.plan() if checklist else None)
    try:
        view = build_view(reports, release, checklist, verdict)
        view.plots = render_figures(reports, release, view.baseline, notes=view.plot_notes)
        env = jinja2.Environment(loader=jinja2.FileSystemLoader(root / "templates"), undefined=_Dash,
                                 trim_blocks=True, lstrip_blocks=True, keep_trailing_newline=True, finalize=one_line)
        env.filters["num"] = fmt_num
        env.filters["pct"] = fmt_pct
        env.filters["change"] = fmt_change
        env.filters["by_number"] = by_number
        env.filters["as_list"] = as_list
        env.globals["fig"] = fmt_fig
        text = env.get_template("release.md.j2").render(v=view)
    except Exception as e:  # a record no part of the notes foresaw (a template's arithmetic on a metric a record
        # lacks included): the verdict is still written, and why
        from validate.verdict import release_check

        why = f"the release notes could not be rendered in full: {type(e).__name__}: {e}"
        verdict.checks.append(release_check("notes", why))
        text = fallback_notes(verdict)
    out = reports / release / "RELEASE.md"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text)
    return out

"""The attribution table: what each knob set (one r9k dispatch at a time) moves against a baseline release on one
configuration, figure by figure.

For each candidate release (a ``release --knobs SET`` run) against the baseline (``--knobs stock``, or another
configuration's records with ``base_config``): every gated BetterBench figure as the performance gate judges it
(validate.perfgate.compare_perf: its rows, thresholds and marks), the probe's decode step, TTFT p50 and prefill,
and the soak's requests served. Every mark is perfgate's (:func:`validate.perfgate.judge`): the probe's and the
soak's figures are judged at the threshold of the BetterBench figure that measures the same thing
(:data:`PROXY_THRESHOLD`) over their repeats (one value a side where the record keeps one: "cannot tell").
A record that does not stand on what it holds (its kind's audit) or a pair the gates would refuse is never
compared: it is named in ``refused``.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from validate.errors import InputError
from validate.pairing import apart, match_records
from validate.perfgate import (ACROSS_CONFIG_MAY_DIFFER, BENCH_KIND, PerfGateSpec, compare_perf, judge)
from validate.record import Record, release_records
from validate.audit import audit_records

PROBE_KIND, SOAK_KIND = "probe", "soak"
#: The BetterBench figure whose threshold judges each probe and soak figure (the same quantity measured there):
#: the probe's decode step is BetterBench's decode step, its prefill a prefill depth, its TTFT p50 of single
#: streams the concurrency-1 TTFT p50, the soak's requests served in its fixed time an aggregate rate under load.
PROXY_THRESHOLD = {"decode_step_ms": "decode_step_ms", "prefill_tok_s": "prefill_2048_tok_s",
                   "ttft_ms_p50": "c1_ttft_ms_p50", "requests_served_per_s": "c16_tok_s"}


@dataclass
class Row:
    """One figure of one candidate release against the baseline. ``base`` / ``cand``: the medians of the values
    judged (ms, tok/s, or requests for the soak); ``change_pct``: the candidate's median against the baseline's,
    signed; ``mark``: perfgate's; ``n_base`` / ``n_cand``: the values a side (passes, repeats, or 1)."""

    release: str
    suite: str
    figure: str
    unit: str
    base: float
    cand: float
    change_pct: float
    mark: str
    n_base: int
    n_cand: int
    message: str = ""


@dataclass
class Attribution:
    """The table: ``rows`` in the order of ``releases``; ``refused``: what was not compared and why (a record
    that fails its audit, a pair the gates refuse, a release without records); ``notes``: what the gate notes
    (thresholds, configurations compared on purpose); ``knob_sets``: {release, the baseline included: the knob
    sets its records ran}."""

    config: str
    base_config: str
    baseline: str
    releases: list[str]
    rows: list[Row] = field(default_factory=list)
    refused: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    knob_sets: dict[str, list[str]] = field(default_factory=dict)


def _kinds(records: list[Record], config: str) -> list[Record]:
    return [r for r in records if r.config == config and r.suite_kind in (BENCH_KIND, PROBE_KIND, SOAK_KIND)]


def _values(r: Record, figure: str) -> list[float]:
    """The values of a probe or soak figure the record keeps: per repeat where it keeps them, else its one figure."""
    m = r.metrics if isinstance(r.metrics, dict) else {}

    def nums(xs) -> list[float]:
        return [float(x) for x in xs if isinstance(x, (int, float)) and not isinstance(x, bool)] if isinstance(
            xs, list) else []

    if figure == "decode_step_ms":  # a repeat's decode step is 1 / its decode rate (the probe's TPOT p50)
        runs = [1000.0 / x for x in nums(m.get("decode_tok_s_runs")) if x > 0]
        return runs or nums([m.get("decode_step_ms")])
    if figure == "prefill_tok_s":
        return nums(m.get("prefill_tok_s_runs")) or nums([m.get("prefill_tok_s")])
    if figure == "requests_served_per_s":  # the count over the soak's fixed duration (its params match)
        return nums([m.get("served")])
    return nums([m.get(figure)])


def _judge_other(release: str, b: Record, c: Record, spec: PerfGateSpec, out: Attribution) -> None:
    """The probe's or the soak's figures of ``c`` against ``b``, into ``out``."""
    figures = ("decode_step_ms", "ttft_ms_p50", "prefill_tok_s") if c.suite_kind == PROBE_KIND else (
        "requests_served_per_s",)
    for name in figures:
        bv, cv = _values(b, name), _values(c, name)
        if not bv or not cv:
            out.refused.append(f"{release}: {c.config}/{c.suite}: {name} is not measured by the "
                               f"{'baseline' if not bv else 'candidate'}")
            continue
        t = spec.threshold(PROXY_THRESHOLD[name])
        try:
            f = judge(c.config, name, bv, cv, 5.0 if t is None else t, spec.alpha, c.suite)
        except ValueError as e:
            out.refused.append(f"{release}: {c.config}/{c.suite}: {name}: cannot judge: {e}")
            continue
        soak = name == "requests_served_per_s"
        out.rows.append(Row(release, c.suite, "requests served" if soak else name, "requests" if soak else f.unit,
                            f.base_median, f.cand_median, f.change_pct, f.mark, len(bv), len(cv), f.message))


def attribute(reports: Path, config: str, baseline: str, releases: list[str], specs: dict[str, PerfGateSpec],
              base_config: str | None = None, reports_baseline: Path | None = None) -> Attribution:
    """Each of ``releases`` against ``baseline`` on ``config`` (the baseline's records of ``base_config``, default
    ``config``), as the module docstring says.

    Args:
        reports: the folder of the candidates' records (and the baseline's, unless ``reports_baseline``).
        specs: the checkout's BetterBench thresholds by suite name (validate.suite.perf_gate_specs).
    Raises:
        InputError: no release named, a release that is the baseline itself, or a record file that is not one.
    """
    if not releases:
        raise InputError("name at least one release to attribute (--releases)")
    bcfg = base_config or config
    breports = reports_baseline or reports
    out = Attribution(config, bcfg, baseline, list(releases))
    base = _kinds(release_records(breports, baseline), bcfg)
    if not base:
        raise InputError(f"the baseline {baseline} holds no BetterBench, probe or soak record of {bcfg} under "
                         f"{breports}")
    audit_records(base, breports)
    out.knob_sets[baseline] = sorted({r.knob_set or "?" for r in base})  # shown in the title: what it ran
    bench_spec = specs.get(BENCH_KIND) or next(iter(specs.values()), None) or PerfGateSpec()
    for rel in releases:
        if rel == baseline and bcfg == config and breports.resolve() == reports.resolve():
            raise InputError(f"{rel} against itself: a release is never its own baseline")
        cand = _kinds(release_records(reports, rel), config)
        out.knob_sets[rel] = sorted({r.knob_set or "?" for r in cand})
        if not cand:
            out.refused.append(f"{rel}: no BetterBench, probe or soak record of {config} under {reports}")
            continue
        audit_records(cand, reports)
        matching = match_records(cand, base, base_config=base_config, configs=[config])
        for m in matching.pairs:
            c, b = m.cand, m.base
            where = f"{rel}: {c.config}/{c.suite}"
            if m.refused or b is None:
                out.refused.append(f"{rel}: {m.refused}" if m.refused else
                                   f"{where}: the baseline {baseline} has no such record of {bcfg}")
                continue
            failed = [f"the {label}'s record does not stand on what it holds: {r.audit_failed}"
                      for label, r in (("baseline", b), ("candidate", c)) if r.audit_failed]
            if failed:
                out.refused.append(f"{where}: refused: " + "; ".join(failed))
                continue
            if c.suite_kind == BENCH_KIND:
                perf = compare_perf(reports, rel, baseline, specs, configs=[config], reports_baseline=breports,
                                    records=[c], base_config=base_config)
                out.rows += [Row(rel, f.suite, f.figure, f.unit, f.base_median, f.cand_median, f.change_pct, f.mark,
                                 len(f.base), len(f.cand), f.message) for f in perf.figures]
                out.refused += [f"{rel}: {x}" for x in perf.unpaired]
                out.notes += [f"{rel}: {x}" for x in perf.limited + perf.notes]
                continue
            params = tuple(sorted(set(b.params) | set(c.params)))
            why = apart(b, c, params=params, may_differ=ACROSS_CONFIG_MAY_DIFFER if b.config != c.config else ())
            if why:
                out.refused.append(f"{where}: cannot compare: " + "; ".join(why))
                continue
            _judge_other(rel, b, c, bench_spec, out)
        for b, _ in matching.lacking:
            if b.suite_kind == BENCH_KIND:  # as the gate: what the baseline measured and the release lost blocks
                out.refused.append(f"{rel}: the baseline {baseline} holds {b.config}/{b.suite} and {rel} no "
                                   "BetterBench record to pair with it")
            else:
                out.notes.append(f"{rel}: no record to pair with the baseline's {b.config}/{b.suite}")
    return out


def _num(v: float, unit: str) -> str:
    return f"{v:,.{2 if unit == 'ms' else 0 if unit == 'requests' else 1}f}"


def table_rows(a: Attribution) -> list[list[str]]:
    """The table's cells, one list a row: release (its knob sets), suite, figure, baseline -> candidate (unit),
    move, mark, values a side (baseline / candidate)."""
    return [[f"{r.release} ({', '.join(a.knob_sets.get(r.release, []))})", r.suite, r.figure,
             f"{_num(r.base, r.unit)} -> {_num(r.cand, r.unit)} {r.unit}", f"{r.change_pct:+.1f}%", r.mark,
             f"{r.n_base} / {r.n_cand}"] for r in a.rows]


HEADERS = ["release (knobs)", "suite", "figure", "baseline -> candidate", "move", "mark", "passes a side"]


def markdown(a: Attribution) -> str:
    """The table as GitHub Markdown (docs/serving.md), followed by what was refused and the gate's notes."""
    head = (f"{', '.join(a.releases)} against {a.baseline} ({', '.join(a.knob_sets.get(a.baseline, []))}) on "
            f"{a.config}"
            + (f" (the baseline's records of {a.base_config})" if a.base_config != a.config else ""))
    lines = [f"**{head}**", "", "| " + " | ".join(HEADERS) + " |", "|" + "---|" * len(HEADERS)]
    lines += ["| " + " | ".join(c.replace("|", "\\|") for c in row) + " |" for row in table_rows(a)]
    if a.refused:
        lines += ["", "Not compared:", ""] + [f"- {x}" for x in a.refused]
    if a.notes:
        lines += ["", "Notes:", ""] + [f"- {x}" for x in a.notes]
    return "\n".join(lines) + "\n"

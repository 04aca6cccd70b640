"""CI formats of a run's outcome: JUnit XML for test-report tools, GitHub-flavoured markdown for the job summary.

Pure functions over the engine's typed records (:class:`validate.record.Record`), the paired comparison
(:class:`validate.compare.Comparison`) and, optionally, performance-gate results; they read no files and run
nothing. Verdicts map onto JUnit results as follows:

==================================  ==========================================================================
verdict / gate result               JUnit testcase
==================================  ==========================================================================
pass                                passed (no result element)
fail, wrong-tree, plugin-inactive   ``<failure type="<status>" message="<cause>">`` cause and reasons, a line each
error                               ``<error type="error" message="<cause>">``: the suite could not run or finish
skipped                             ``<skipped type="skipped" message="<cause>">``
paired task, regression             ``<failure type="regression">`` b, c, p values, interval, sensitivity
paired task, no regression          passed; the same figures in ``<system-out>``
task that could not be paired       ``<error type="unpaired">`` naming why
performance gate, regression        ``<failure type="perf-regression" message="<message>">``
performance gate, no regression     passed; the message in ``<system-out>``
==================================  ==========================================================================
"""
from __future__ import annotations

import math
import os
import re
import tempfile
import xml.etree.ElementTree as ET
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, Protocol

from validate.compare import Comparison, PairedTask
from validate.record import FINDING_STATUSES, Record

# Text caps: a reason can be a server log tail; test-report tools and GitHub truncate or reject huge reports.
MESSAGE_MAX_CHARS = 500
DETAIL_MAX_CHARS = 16_000
DETAIL_MAX_LINES = 200
SUMMARY_REASONS = 3  # reasons shown per failure in the GitHub summary
SUMMARY_MAX_FAILURES = 50
SUMMARY_MAX_BYTES = 1_000_000  # GitHub refuses a step summary over 1 MiB
LOST_IDS_SHOWN = 40

_RESULT_TAG = {"fail": "failure", "wrong-tree": "failure", "plugin-inactive": "failure",
               "error": "error", "skipped": "skipped"}
_MARKER = {"pass": "pass", "fail": "**FAIL**", "wrong-tree": "**WRONG-TREE**",
           "plugin-inactive": "**PLUGIN-INACTIVE**", "error": "**ERROR**", "skipped": "*skipped*"}
_EXIT_MEANING = {0: ("PASS", "every verdict passed"), 1: ("FAIL", "a finding"),
                 2: ("NOT CHECKED", "not everything could be checked"), 130: ("INTERRUPTED", "interrupted")}

# Characters XML 1.0 cannot carry (control characters from server logs, lone surrogates from undecodable bytes).
_XML_INVALID = re.compile("[^\t\n\r\x20-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")
# Markdown punctuation that would start emphasis, code, links, HTML or end a table cell.
_MD_SPECIAL = re.compile(r"([\\`*_\[\]<>|~&#])")
# Task of an unpaired reason: "<config>/<suite>: ..." or "<config>/<suite> (<release>) against ...".
_UNPAIRED_TASK = re.compile(r"^([^/\s:]+)/([^\s:(]+)")


class PerfResult(Protocol):
    """What a performance-gate result must offer (any object with these attributes)."""

    config: str
    figure: str
    regression: bool
    message: str


# --- JUnit XML --------------------------------------------------------------------------------------------


def _xml_safe(text: Any) -> str:
    """``text`` as a string XML 1.0 can hold: a disallowed character becomes a visible ``\\xNN`` escape."""
    return _XML_INVALID.sub(lambda m: f"\\x{ord(m.group()):02x}" if ord(m.group()) < 0x100
                            else f"\\u{ord(m.group()):04x}", str(text))


def _one_line(text: str, limit: int = MESSAGE_MAX_CHARS) -> str:
    line = " ".join(str(text).split())
    return line if len(line) <= limit else line[: limit - 4].rstrip() + " ..."


def _capped_lines(lines: Iterable[str], max_lines: int = DETAIL_MAX_LINES, max_chars: int = DETAIL_MAX_CHARS) -> str:
    """Lines joined by newlines, at most ``max_lines`` lines and about ``max_chars`` characters; a note says how
    many lines were left out."""
    lines = [ln for text in lines for ln in _xml_safe(text).splitlines() or [""]]
    kept, size = [], 0
    for ln in lines:
        if len(kept) == max_lines or size + len(ln) > max_chars:
            if not kept:  # one enormous line: keep its start
                kept.append(ln[:max_chars] + " ...")
            break
        kept.append(ln)
        size += len(ln) + 1
    left = len(lines) - len(kept)
    return "\n".join(kept) + (f"\n... ({left} more line(s) not shown)" if left > 0 else "")


def _seconds(seconds: float | None) -> float:
    return seconds if seconds is not None and math.isfinite(seconds) and seconds > 0 else 0.0


def _time(seconds: float | None) -> str:
    """Seconds in the form JUnit schemas accept (at most three decimals, no exponent)."""
    return f"{_seconds(seconds):.3f}"


def _set(elem: ET.Element, **attrs: Any) -> ET.Element:
    for k, v in attrs.items():
        elem.set(k, _xml_safe(v))
    return elem


def _properties(case: ET.Element, props: Mapping[str, Any]) -> None:
    """A ``<properties>`` block as the testcase's first child (pytest's layout); None values are left out."""
    kept = [(k, v) for k, v in props.items() if v is not None]
    if not kept:
        return
    block = ET.SubElement(case, "properties")
    for k, v in kept:
        _set(ET.SubElement(block, "property"), name=k, value=str(v).lower() if isinstance(v, bool) else v)


def _record_properties(r: Record, with_profile: bool = True) -> dict[str, Any]:
    props = {"release": r.release, "config_hash": r.config_hash, "tree.commit": r.tree.commit,
             "tree.dirty": r.tree.dirty, "tree.source_hash": r.tree.source_hash}
    if with_profile:
        props["profile"] = r.profile
    return props


def _result(case: ET.Element, tag: str, kind: str, message: str, detail: str = "") -> None:
    el = _set(ET.SubElement(case, tag), message=_one_line(_xml_safe(message)), type=kind)
    if detail:
        el.text = _xml_safe(detail)


def _system_out(case: ET.Element, text: str) -> None:
    ET.SubElement(case, "system-out").text = _xml_safe(text)


def _record_case(r: Record) -> ET.Element:
    case = _set(ET.Element("testcase"), classname=r.config, name=r.suite, time=_time(r.wall_s))
    _properties(case, _record_properties(r))
    v = r.verdict
    tag = _RESULT_TAG.get(v.status)
    if tag is not None:
        message = v.cause or (v.reasons[0] if v.reasons else ("not run" if v.status == "skipped" else v.status))
        detail = _capped_lines(([v.cause] if v.cause else []) + list(v.reasons))
        _result(case, tag, v.status, message, detail)
    return case


def _pct(x: float) -> str:
    return f"{100 * x:+.1f}"


def _paired_lines(x: PairedTask, cmp: Comparison) -> list[str]:
    lines = [f"{x.b} lost vs {x.c} gained of {x.n:,} (b = right only in {cmp.baseline}, c = right only in "
             f"{cmp.candidate}); one-sided p = {x.p_one_sided:.3g}, Holm-adjusted {x.p_holm:.3g}, alpha {cmp.alpha}; "
             f"two-sided p = {x.p_two_sided:.3g}",
             f"accuracy {100 * x.acc_baseline:.2f}% -> {100 * x.acc_candidate:.2f}%"
             + (" (subset)" if x.subset else "")]
    if x.diff_ci:
        lines.append(f"difference {_pct(x.acc_candidate - x.acc_baseline)} points, "
                     f"95% interval {_pct(x.diff_ci[0])} to {_pct(x.diff_ci[1])}")
    lines.append(f"verdict: {x.verdict_text}" + (f"; {x.sensitivity}" if x.sensitivity else ""))
    if x.lost:
        lines.append(f"right only in {cmp.baseline}: " + ", ".join(x.lost[:LOST_IDS_SHOWN])
                     + (" ..." if len(x.lost) > LOST_IDS_SHOWN else ""))
    return lines


def _paired_name(task: str, cmp: Comparison, baseline_config: str | None = None, config: str | None = None) -> str:
    name = f"paired {task} vs {cmp.baseline}"
    return name + (f" ({baseline_config})" if baseline_config and baseline_config != config else "")


def _paired_case(x: PairedTask, cmp: Comparison, rec: Record | None) -> ET.Element:
    case = _set(ET.Element("testcase"), classname=x.config,
                name=_paired_name(x.task, cmp, x.baseline_config, x.config), time=_time(0))
    props: dict[str, Any] = _record_properties(rec) if rec else {"release": cmp.candidate}
    props.update({"baseline": cmp.baseline, "baseline_config": x.baseline_config, "n": x.n, "b": x.b, "c": x.c,
                  "p_one_sided": f"{x.p_one_sided:.6g}", "p_holm": f"{x.p_holm:.6g}",
                  "p_two_sided": f"{x.p_two_sided:.6g}", "alpha": cmp.alpha})
    if x.diff_ci:
        props.update({"diff_ci_low": f"{x.diff_ci[0]:.6g}", "diff_ci_high": f"{x.diff_ci[1]:.6g}"})
    _properties(case, props)
    lines = _paired_lines(x, cmp)
    if x.regression:
        _result(case, "failure", "regression",
                f"{x.config}/{x.task} regressed: {x.b} lost vs {x.c} gained, one-sided p = {x.p_one_sided:.3g}, "
                f"Holm-adjusted {x.p_holm:.3g} < alpha {cmp.alpha}", _capped_lines(lines))
    else:
        _system_out(case, _capped_lines(lines))
    return case


def _unpaired_task(reason: str) -> tuple[str, str]:
    """(configuration, task) named at the start of an unpaired reason; ("unpaired", "?") when it names none."""
    m = _UNPAIRED_TASK.match(reason)
    return (m.group(1), m.group(2)) if m else ("unpaired", "?")


def _unpaired_case(reason: str, cmp: Comparison) -> ET.Element:
    config, task = _unpaired_task(reason)
    case = _set(ET.Element("testcase"), classname=config, name=_paired_name(task, cmp), time=_time(0))
    _properties(case, {"release": cmp.candidate, "baseline": cmp.baseline})
    _result(case, "error", "unpaired", reason, _capped_lines([reason]))
    return case


def _perf_case(p: PerfResult, rec: Record | None) -> ET.Element:
    case = _set(ET.Element("testcase"), classname=p.config, name=f"perf {p.figure}", time=_time(0))
    _properties(case, (_record_properties(rec, with_profile=False) if rec else {}) | {"figure": p.figure})
    if p.regression:
        _result(case, "failure", "perf-regression", p.message, _capped_lines([p.message]))
    elif p.message:
        _system_out(case, _capped_lines([p.message]))
    return case


def _perf_unpaired_case(reason: str) -> ET.Element:
    config, suite = _unpaired_task(reason)
    case = _set(ET.Element("testcase"), classname=config, name=f"perf {suite}", time=_time(0))
    _result(case, "error", "perf-unpaired", reason, _capped_lines([reason]))
    return case


def _count(suite: ET.Element) -> dict[str, int]:
    cases = suite.findall("testcase")
    return {"tests": len(cases),
            **{attr: sum(1 for c in cases if c.find(tag) is not None)
               for attr, tag in (("failures", "failure"), ("errors", "error"), ("skipped", "skipped"))}}


def junit_element(records: list[Record], comparison: Comparison | None = None,
                  perf: list[PerfResult] | None = None, name: str = "r9k-validate",
                  perf_unpaired: list[str] | None = None) -> ET.Element:
    """The ``<testsuites>`` element that :func:`junit_xml` serialises (same arguments, same content, same
    errors), for a caller that adds to it before writing."""
    suites: dict[str, ET.Element] = {}
    first: dict[str, Record] = {}
    times: dict[str, float] = {}
    started: dict[str, str] = {}

    def suite(config: str) -> ET.Element:
        if config not in suites:
            suites[config] = ET.Element("testsuite")
            times[config] = 0.0
        return suites[config]

    for r in records:
        suite(r.config).append(_record_case(r))
        first.setdefault(r.config, r)
        times[r.config] += _seconds(r.wall_s)
        started[r.config] = min(started.get(r.config, r.started_at), r.started_at)
    if comparison is not None:
        by_task = {(r.config, r.suite): r for r in records}
        for x in comparison.tasks:
            suite(x.config).append(_paired_case(x, comparison, by_task.get((x.config, x.task))))
        for reason in comparison.unpaired:
            suite(_unpaired_task(reason)[0]).append(_unpaired_case(reason, comparison))
    for p in perf or []:
        suite(p.config).append(_perf_case(p, first.get(p.config)))
    for reason in perf_unpaired or []:
        suite(_unpaired_task(reason)[0]).append(_perf_unpaired_case(reason))

    root = _set(ET.Element("testsuites"), name=name)
    total = {"tests": 0, "failures": 0, "errors": 0, "skipped": 0}
    for config, el in suites.items():
        counts = _count(el)
        _set(el, name=config, **counts, time=_time(times[config]))
        if config in started:
            _set(el, timestamp=started[config])
        for k in total:
            total[k] += counts[k]
        root.append(el)
    _set(root, **total, time=_time(sum(times.values())))
    return root


def junit_xml(records: list[Record], comparison: Comparison | None = None, perf: list[PerfResult] | None = None,
              name: str = "r9k-validate", perf_unpaired: list[str] | None = None) -> str:
    """A JUnit XML report of one run, as text.

    Args:
        records: the run's records; each becomes ``<testcase classname="<configuration>" name="<suite>"
            time="<wall_s>">`` inside ``<testsuite name="<configuration>">``, one testsuite per configuration in
            the order the records first name it. Its result follows the module table (``failure`` for findings,
            ``error`` for a suite that could not run or finish, ``skipped``); the result's ``message`` is the
            verdict's cause (else its first reason) on one line, its text the cause and every reason, one a line,
            capped at :data:`DETAIL_MAX_LINES` lines and about :data:`DETAIL_MAX_CHARS` characters.
        comparison: the paired evals; one testcase per paired task (``classname`` = configuration, ``name`` =
            ``paired <task> vs <baseline release>``, with `` (<baseline configuration>)`` when it differs), a
            failure when it regressed; one ``error`` testcase per task that could not be paired.
        perf: performance-gate results (objects with ``config``, ``figure``, ``regression``, ``message``); one
            testcase ``perf <figure>`` each, a failure when ``regression``.
        name: the ``name`` of the root ``<testsuites>``.
        perf_unpaired: reasons ("<config>/<suite>: ...") the performance gate could not compare something; one
            ``error`` testcase ``perf <suite>`` each (``gate --perf`` exits 2 on them: the report must not be green).

    Every testcase carries ``<properties>`` (release, config_hash, tree.commit, tree.dirty, tree.source_hash,
    profile; paired ones also n, b, c, the p values, alpha and the interval) as its first child, as pytest writes
    them. Each testsuite and the root carry ``tests``, ``failures``, ``errors``, ``skipped`` and ``time``.
    Characters XML 1.0 cannot hold (terminal escapes in log lines) appear as ``\\xNN``. The text starts with an
    XML declaration without an encoding pseudo-attribute (UTF-8, XML's default), so it parses as a ``str`` with
    either ElementTree or lxml.

    Raises nothing for well-formed inputs; an object in ``perf`` without the attributes raises AttributeError.
    """
    root = junit_element(records, comparison, perf, name, perf_unpaired)
    ET.indent(root)
    return '<?xml version="1.0"?>\n' + ET.tostring(root, encoding="unicode") + "\n"


def _atomic_write(path: Path, data: bytes) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=path.name + ".", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def write_junit(path: str | os.PathLike, records: list[Record], comparison: Comparison | None = None,
                perf: list[PerfResult] | None = None, name: str = "r9k-validate",
                perf_unpaired: list[str] | None = None) -> Path:
    """Write :func:`junit_xml` of the arguments to ``path`` atomically (a temp file in the same folder, fsynced,
    mode 0644, renamed over ``path``; missing folders are made), so a reader never sees a torn report.

    Returns the path written.

    Raises:
        OSError: the folder cannot be made or written; a report already at ``path`` is then left as it was.
    """
    return _atomic_write(Path(path), junit_xml(records, comparison, perf, name, perf_unpaired).encode("utf-8"))


# --- GitHub step summary ----------------------------------------------------------------------------------


def _md(text: Any, limit: int = MESSAGE_MAX_CHARS) -> str:
    """``text`` on one line, capped, with markdown punctuation escaped (safe in a table cell or a list item)."""
    return _MD_SPECIAL.sub(r"\\\1", _one_line(_xml_safe(text), limit))


def _row(*cells: Any) -> str:
    return "| " + " | ".join(str(c) for c in cells) + " |"


def _verdict_table(records: list[Record]) -> list[str]:
    configs = list(dict.fromkeys(r.config for r in records))
    suites = list(dict.fromkeys(r.suite for r in records))
    cell = {(r.config, r.suite): _MARKER.get(r.verdict.status, _md(r.verdict.status)) for r in records}
    out = [_row("configuration", *map(_md, suites)), _row(*[":--"] * (len(suites) + 1))]
    out += [_row(_md(c), *(cell.get((c, s), "–") for s in suites)) for c in configs]
    return out


def _paired_table(cmp: Comparison) -> list[str]:
    out = [f"### Paired evals: {_md(cmp.candidate)} against {_md(cmp.baseline)} "
           f"(McNemar, Holm across {len(cmp.tasks)} task(s), alpha {cmp.alpha})", ""]
    if cmp.tasks:
        out += [_row("configuration", "task", "n", "b / c", "one-sided p (Holm)", "verdict", "95% interval"),
                _row(":--", ":--", "--:", "--:", "--:", ":--", ":--")]
        for x in cmp.tasks:
            cfg = x.config if x.config == x.baseline_config else f"{x.config} vs {x.baseline_config}"
            ci = (f"{_pct(x.diff_ci[0])} to {_pct(x.diff_ci[1])} points" if x.diff_ci else "–")
            out.append(_row(_md(cfg), _md(x.task) + (" (subset)" if x.subset else ""), f"{x.n:,}", f"{x.b} / {x.c}",
                            f"{x.p_one_sided:.3g} ({x.p_holm:.3g})",
                            "**REGRESSION**" if x.regression else _md(x.verdict_text), ci))
        out.append("")
        out += [f"- {_md(x.config)} / {_md(x.task)}: {_md(x.sensitivity)}" for x in cmp.tasks if x.sensitivity]
    for reason in cmp.unpaired:
        out.append(f"- **NOT PAIRED** {_md(reason)}")
    return out


def _perf_table(perf: list[PerfResult]) -> list[str]:
    out = ["### Performance gates", "", _row("configuration", "figure", "verdict", "detail"),
           _row(":--", ":--", ":--", ":--")]
    out += [_row(_md(p.config), _md(p.figure), "**REGRESSION**" if p.regression else "pass", _md(p.message))
            for p in perf]
    return out


def _failures(records: list[Record]) -> list[str]:
    bad = [r for r in records if r.verdict.status != "pass"]
    bad.sort(key=lambda r: r.verdict.status not in FINDING_STATUSES)  # findings first, in record order
    out = [f"### Not passed ({len(bad)})", ""]
    for r in bad[:SUMMARY_MAX_FAILURES]:
        v = r.verdict
        reasons = list(v.reasons)
        head = v.cause or (reasons.pop(0) if reasons else "no cause recorded")
        out.append(f"- {_MARKER.get(v.status, _md(v.status))} {_md(r.config)} / {_md(r.suite)}: {_md(head)}")
        out += [f"  - {_md(x)}" for x in reasons[:SUMMARY_REASONS]]
        if len(reasons) > SUMMARY_REASONS:
            out.append(f"  - ... {len(reasons) - SUMMARY_REASONS} more reason(s) in the record")
    if len(bad) > SUMMARY_MAX_FAILURES:
        out.append(f"- ... {len(bad) - SUMMARY_MAX_FAILURES} more; see the records")
    return out


def github_summary(records: list[Record], comparison: Comparison | None = None,
                   perf: list[PerfResult] | None = None, *, exit_code: int, why: str) -> str:
    """GitHub-flavoured markdown for ``$GITHUB_STEP_SUMMARY``.

    Args:
        records: the run's records (any order; the table follows their first appearance).
        comparison: the paired evals, if any.
        perf: performance-gate results (``config``, ``figure``, ``regression``, ``message``), if any.
        exit_code: the run's exit status (see :func:`validate.errors.combine_exit`).
        why: the one line that says what decided it (e.g. :meth:`validate.engine.Outcome.explain`).

    Returns a title naming the release(s) and the exit status, the ``why`` line after a marker (``**PASS**``,
    ``**FAIL**``, ``**NOT CHECKED**``, ``**INTERRUPTED**``), a verdict table (a row per
    configuration, a column per suite, markers ``pass``, ``**FAIL**``, ``**WRONG-TREE**``,
    ``**PLUGIN-INACTIVE**``, ``**ERROR**``, ``*skipped*``, ``–`` for no record), the paired-eval table (task, n,
    b / c, one-sided p with the Holm-adjusted one in brackets, verdict, 95% interval of the accuracy difference)
    with each task's sensitivity and the tasks that could not be paired, the performance gates, and every
    verdict that did not pass with its cause and first reasons. Text from records is escaped for markdown; the
    whole stays under GitHub's 1 MiB limit. Raises nothing for well-formed inputs.
    """
    releases = list(dict.fromkeys(r.release for r in records)) or ([comparison.candidate] if comparison else [])
    title = "r9k-validate" + (" " + ", ".join(releases) if releases else "")
    marker, meaning = _EXIT_MEANING.get(exit_code, ("FAIL", "unknown status"))
    out = [f"## {_md(title)}: exit status {exit_code}, {meaning}", "", f"**{marker}**: {_md(why, 2000)}", ""]
    if records:
        out += ["### Verdicts", "", *_verdict_table(records), ""]
    if comparison is not None:
        out += [*_paired_table(comparison), ""]
    if perf:
        out += [*_perf_table(perf), ""]
    if any(r.verdict.status != "pass" for r in records):
        out += [*_failures(records), ""]
    text = "\n".join(out)
    if len(text.encode("utf-8")) > SUMMARY_MAX_BYTES:
        cut = text.encode("utf-8")[: SUMMARY_MAX_BYTES - 200].decode("utf-8", "ignore")
        text = cut[: cut.rfind("\n")] + "\n\n*(summary cut at GitHub's size limit; see the records)*\n"
    return text


def append_github_summary(text: str, environ: Mapping[str, str] = os.environ) -> bool | None:
    """Append ``text`` (a newline added if it lacks one) to the file named by ``GITHUB_STEP_SUMMARY``.

    Returns None when the variable is unset or empty (nothing to do), True once appended, False when the file
    cannot be written (a missing folder, no permission, a directory, an invalid name): the caller warns. Never
    raises.
    """
    target = environ.get("GITHUB_STEP_SUMMARY")
    if not target:
        return None
    try:
        with open(target, "a", encoding="utf-8", errors="replace") as fh:
            fh.write(text if text.endswith("\n") else text + "\n")
    except (OSError, ValueError):
        return False
    return True

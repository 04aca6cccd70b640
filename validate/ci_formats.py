"""CI formats of a run's verdict: JUnit XML for test-report tools, GitHub-flavoured markdown for the job summary.

Pure functions over one :class:`validate.verdict.ReleaseVerdict` (the verdict decided once from the records, the
paired gate and the performance gate); they read no files, run nothing and decide nothing: every "pass" they
write is a check whose outcome is pass. Outcomes map onto JUnit results as follows:

==================================  ==========================================================================
check outcome                       JUnit testcase
==================================  ==========================================================================
pass                                passed (no result element); its figures in ``<system-out>``
pass with limits                    ``<skipped type="limited" message="not a full check: <limits>">``: a
                                    quick profile, a subset, too few questions to detect a regression (the
                                    console and the summary call it limited: never a passed testcase)
finding                             ``<failure type="<status>" message="<message>">``: fail, wrong-tree,
                                    plugin-inactive, regression (a paired eval), perf-regression (a figure)
not-checked                         ``<error type="<status>">``: a suite that did not complete, evals or
                                    figures that cannot be paired, records of another tree, notes not rendered
limited                             ``<skipped type="<status>">``: not checked by the run's choice (a quick
                                    subset against a full baseline, a performance gate on too few passes)
==================================  ==========================================================================
"""
from __future__ import annotations

import math
import os
import re
import xml.etree.ElementTree as ET
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from validate.record import Record
from validate.util import atomic_write
from validate.verdict import Check, ReleaseVerdict, paired_name

# Text caps: a reason can be a server log tail; test-report tools and GitHub truncate or reject huge reports.
MESSAGE_MAX_CHARS = 500
DETAIL_MAX_CHARS = 16_000
DETAIL_MAX_LINES = 200
SUMMARY_REASONS = 3  # reasons shown per failure in the GitHub summary
SUMMARY_MAX_FAILURES = 50
SUMMARY_MAX_BYTES = 1_000_000  # GitHub refuses a step summary over 1 MiB

_MARKER = {"pass": "pass", "fail": "**FAIL**", "wrong-tree": "**WRONG-TREE**",
           "plugin-inactive": "**PLUGIN-INACTIVE**", "error": "**ERROR**", "skipped": "*skipped*"}
_EXIT_MEANING = {0: ("PASS", "every verdict passed"), 1: ("FAIL", "a finding"),
                 2: ("NOT CHECKED", "not everything could be checked"), 130: ("INTERRUPTED", "interrupted")}

# Characters XML 1.0 cannot carry (control characters from server logs, lone surrogates from undecodable bytes).
_XML_INVALID = re.compile("[^\t\n\r\x20-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")
# Markdown punctuation that would start emphasis, code, links, HTML or end a table cell.
_MD_SPECIAL = re.compile(r"([\\`*_\[\]<>|~&#])")


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


_TAG = {"finding": "failure", "not-checked": "error", "limited": "skipped"}


def _check_case(c: Check, release: str) -> ET.Element:
    case = _set(ET.Element("testcase"), classname=c.config, name=c.name, time=_time(c.time_s))
    props = _record_properties(c.record, with_profile=c.area == "suite") if c.record else {"release": release}
    _properties(case, props | c.properties)
    tag = _TAG.get(c.outcome)
    if c.outcome == "pass" and c.limits:  # limited, as the console and the summary call it: not a pass
        _result(case, "skipped", "limited", f"not a full check: {c.limits}", _capped_lines(list(c.detail)))
    elif tag is not None:
        kind = "perf-regression" if c.area == "perf" and c.outcome == "finding" else c.status
        lines = ([c.message] if c.message and c.message not in c.detail else []) + list(c.detail)
        _result(case, tag, kind, c.message or c.status, _capped_lines(lines))
    else:
        lines = list(c.detail)
        if lines:
            _system_out(case, _capped_lines(lines))
    return case


def _count(suite: ET.Element) -> dict[str, int]:
    cases = suite.findall("testcase")
    return {"tests": len(cases),
            **{attr: sum(1 for c in cases if c.find(tag) is not None)
               for attr, tag in (("failures", "failure"), ("errors", "error"), ("skipped", "skipped"))}}


def junit_element(verdict: ReleaseVerdict, name: str = "r9k-validate") -> ET.Element:
    """The ``<testsuites>`` element that :func:`junit_xml` serialises (same arguments, same content)."""
    suites: dict[str, ET.Element] = {}
    times: dict[str, float] = {}
    started: dict[str, str] = {}
    seen: dict[tuple[str, str], int] = {}
    for c in verdict.checks:
        if c.config not in suites:
            suites[c.config] = ET.Element("testsuite")
            times[c.config] = 0.0
        case = _check_case(c, verdict.release)
        k = (c.config, case.get("name", ""))
        seen[k] = seen.get(k, 0) + 1
        if seen[k] > 1:  # CI tools key a testcase by class and name: two lines of one name stay two
            case.set("name", f"{k[1]} ({seen[k]})")
        suites[c.config].append(case)
        times[c.config] += _seconds(c.time_s)
        if c.record is not None and c.area == "suite":
            started[c.config] = min(started.get(c.config, c.record.started_at), c.record.started_at)
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


def junit_xml(verdict: ReleaseVerdict, name: str = "r9k-validate") -> str:
    """A JUnit XML report of one verdict, as text.

    One ``<testsuite name="<configuration>">`` per configuration in the order the checks first name it (the
    release-level lines under ``release``); one ``<testcase classname="<configuration>" name="<check>">`` per
    check: the suite's name, ``paired <task> vs <baseline>``, ``perf <figure>``, or the release-level line's
    name (a name a configuration already holds gets `` (2)``, `` (3)``, ...); its result follows the module table, its ``message`` the check's message on one line, its text the
    message and detail lines, capped at :data:`DETAIL_MAX_LINES` lines and about :data:`DETAIL_MAX_CHARS`
    characters. Every testcase carries ``<properties>`` (release, config_hash, tree.commit, tree.dirty,
    tree.source_hash, profile where a record stands behind it; the gate's figures: n, b, c, p values, alpha,
    interval, medians, passes) as its first child, as pytest writes them. Each testsuite and the root carry
    ``tests``, ``failures``, ``errors``, ``skipped`` and ``time``. Characters XML 1.0 cannot hold (terminal escapes
    in log lines) appear as ``\\xNN``. The text starts with an XML declaration without an encoding pseudo-attribute
    (UTF-8, XML's default), so it parses as a ``str`` with either ElementTree or lxml. Raises nothing.
    """
    root = junit_element(verdict, name)
    ET.indent(root)
    return '<?xml version="1.0"?>\n' + ET.tostring(root, encoding="unicode") + "\n"


def write_junit(path: str | os.PathLike, verdict: ReleaseVerdict, name: str = "r9k-validate") -> Path:
    """Write :func:`junit_xml` of the verdict to ``path`` atomically (a temp file in the same folder, fsynced,
    mode 0644, renamed over ``path``; missing folders are made), so a reader never sees a torn report.

    Returns the path written.

    Raises:
        OSError: the folder cannot be made or written; a report already at ``path`` is then left as it was.
    """
    return atomic_write(Path(path), junit_xml(verdict, name).encode("utf-8"))


# --- GitHub step summary ----------------------------------------------------------------------------------


def _md(text: Any, limit: int = MESSAGE_MAX_CHARS) -> str:
    """``text`` on one line, capped, with markdown punctuation escaped (safe in a table cell or a list item)."""
    return _MD_SPECIAL.sub(r"\\\1", _one_line(_xml_safe(text), limit))


def _row(*cells: Any) -> str:
    return "| " + " | ".join(str(c) for c in cells) + " |"


def _pct(x: float) -> str:
    return f"{100 * x:+.1f}"


_CELL = {"pass": "pass", "finding": "**FAIL**", "not-checked": "**NOT CHECKED**", "limited": "*not checked*"}


def _cell(c: Check) -> str:
    if c.area == "suite" and c.outcome != "pass" and c.status in _MARKER:
        return _MARKER[c.status]
    return _CELL[c.outcome] + (" *(limited)*" if c.outcome == "pass" and c.limits else "")


def _verdict_table(checks: list[Check]) -> list[str]:
    configs = list(dict.fromkeys(c.config for c in checks))
    suites = list(dict.fromkeys(c.name for c in checks))
    cell = {(c.config, c.name): _cell(c) for c in checks}
    out = [_row("configuration", *map(_md, suites)), _row(*[":--"] * (len(suites) + 1))]
    out += [_row(_md(c), *(cell.get((c, s), "–") for s in suites)) for c in configs]
    return out


def _paired_table(verdict: ReleaseVerdict) -> list[str]:
    cmp = verdict.comparison
    checks = {(c.config, c.name): c for c in verdict.checks if c.area == "paired"}
    out = [f"### Paired evals: {_md(cmp.candidate)} against {_md(cmp.baseline)} "
           f"(McNemar, Holm across {len(cmp.tasks)} task(s), alpha {cmp.alpha})", ""]
    if cmp.tasks:
        out += [_row("configuration", "task", "n", "b / c", "one-sided p (Holm)", "verdict", "95% interval"),
                _row(":--", ":--", "--:", "--:", "--:", ":--", ":--")]
        for x in cmp.tasks:
            cfg = x.config if x.config == x.baseline_config else f"{x.config} vs {x.baseline_config}"
            ci = (f"{_pct(x.diff_ci[0])} to {_pct(x.diff_ci[1])} points" if x.diff_ci else "–")
            chk = checks.get((x.config, paired_name(x.task, cmp.baseline, x.baseline_config, x.config)))
            word = "**REGRESSION**" if chk is not None and chk.outcome == "finding" else _md(x.verdict_text)
            out.append(_row(_md(cfg), _md(x.task) + (" (subset)" if x.subset else ""), f"{x.n:,}", f"{x.b} / {x.c}",
                            f"{x.p_one_sided:.3g} ({x.p_holm:.3g})", word, ci))
        out.append("")
        out += [f"- {_md(x.config)} / {_md(x.task)}: {_md(x.sensitivity)}" for x in cmp.tasks if x.sensitivity]
    for c in verdict.checks:
        if c.area == "paired" and c.status == "not paired":
            out.append(f"- **NOT PAIRED** {_md(c.message)}")
    return out


def _perf_table(checks: list[Check]) -> list[str]:
    out = ["### Performance gate", "", _row("configuration", "figure", "verdict", "detail"),
           _row(":--", ":--", ":--", ":--")]
    word = {"finding": "**REGRESSION**", "not-checked": "**NOT CHECKED**", "limited": "*cannot tell*"}
    out += [_row(_md(c.config), _md(c.name.removeprefix("perf ")),
                 word.get(c.outcome, "pass") if c.status != "not compared" else "**NOT COMPARED**", _md(c.message))
            for c in checks]
    return out


def _listed(title: str, checks: list[Check]) -> list[str]:
    out = [f"### {title} ({len(checks)})", ""]
    for c in checks[:SUMMARY_MAX_FAILURES]:
        reasons = [x for x in c.detail if x != c.message]
        head = c.message or c.limits or c.status or "no cause recorded"
        if c.outcome == "pass" and c.limits:
            head = f"passed, not a full check: {c.limits}"
        out.append(f"- {_cell(c)} {_md(c.config)} / {_md(c.name)}: {_md(head)}")
        if c.outcome in ("finding", "not-checked"):
            out += [f"  - {_md(x)}" for x in reasons[:SUMMARY_REASONS]]
            if len(reasons) > SUMMARY_REASONS:
                out.append(f"  - ... {len(reasons) - SUMMARY_REASONS} more reason(s) in the record")
    if len(checks) > SUMMARY_MAX_FAILURES:
        out.append(f"- ... {len(checks) - SUMMARY_MAX_FAILURES} more; see the records")
    return out


def github_summary(verdict: ReleaseVerdict) -> str:
    """GitHub-flavoured markdown for ``$GITHUB_STEP_SUMMARY``, from one verdict.

    Returns a title naming the release and the exit status, the verdict's one line after a marker (``**PASS**``
    only when every check passed in full; ``**NO FINDING, NOT FULLY CHECKED**`` at exit 0 with limited checks;
    ``**FAIL**``, ``**NOT CHECKED**``, ``**INTERRUPTED**``), the baseline and why, a grid of the suite checks
    (a row per configuration, a column per suite), the paired-eval table with each task's sensitivity and the
    tasks that could not be paired, the performance gate (a row per figure and per record it could not compare),
    the findings with their first reasons, and every check not made, by name and reason. Text from records is
    escaped for markdown; the whole stays under GitHub's 1 MiB limit. Raises nothing.
    """
    code = verdict.exit_code()
    marker, meaning = _EXIT_MEANING.get(code, ("FAIL", "unknown status"))
    if code == 0 and verdict.not_checked:
        marker, meaning = "NO FINDING, NOT FULLY CHECKED", "no finding in what was checked; not a full check"
    title = f"r9k-validate {verdict.what} {verdict.release}"
    out = [f"## {_md(title)}: exit status {code}, {meaning}", "", f"**{marker}**: {_md(verdict.why(), 2000)}", ""]
    if verdict.baseline or verdict.baseline_why:
        out += [f"Baseline: {_md(verdict.baseline or 'none')} ({_md(verdict.baseline_why)})", ""]
    out += [f"- {_md(n)}" for n in verdict.notes] + ([""] if verdict.notes else [])
    suites = [c for c in verdict.checks if c.area == "suite"]
    if suites:
        out += ["### Verdicts", "", *_verdict_table(suites), ""]
    if verdict.comparison is not None:
        out += [*_paired_table(verdict), ""]
    perf = [c for c in verdict.checks if c.area == "perf"]
    if perf:
        out += [*_perf_table(perf), ""]
    if verdict.findings:
        out += [*_listed("Findings", verdict.findings), ""]
    if verdict.not_checked:
        out += [*_listed("Not checked", verdict.not_checked), ""]
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

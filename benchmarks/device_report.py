"""What a device run reports (benchmarks/device_run.sh): a line of counts per test file of a pytest step's JUnit
XML, and one summary of every step of the run (its exit status, time, test counts, benchmark rows and rows
without a figure) as JSON and as a table. Standard library only: it runs on the GPU host.

    python3 -m benchmarks.device_report counts OUT/gates.xml      # one line per test file
    python3 -m benchmarks.device_report summary OUT               # OUT/summary.json and the table; exit 1 if a
                                                                  # step failed

``device_run.sh`` appends one JSON line per step to ``OUT/steps.jsonl``: ``{"step", "kind", "rc", "seconds"}``
(kind ``pytest`` or ``bench``); a step's JUnit is ``OUT/<step>.xml`` and its benchmark JSON ``OUT/<step>.json``.
"""
from __future__ import annotations

import argparse
import json
import sys
import xml.etree.ElementTree as ET
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path

TIMED_OUT = (124, 137)  # timeout(1)'s status, and a kill after its grace


@dataclass
class FileCounts:
    """The outcome counts of one test file's cases in a JUnit report; ``skip_reasons``: message -> count."""

    file: str
    passed: int = 0
    failed: int = 0
    errors: int = 0
    skipped: int = 0
    skip_reasons: dict[str, int] = field(default_factory=dict)

    def line(self) -> str:
        why = "; ".join(f"{n} x {r}" for r, n in sorted(self.skip_reasons.items(), key=lambda kv: (-kv[1], kv[0])))
        return (f"{self.file}: {self.passed} passed, {self.failed} failed, {self.errors} errors, "
                f"{self.skipped} skipped" + (f" ({why})" if why else ""))


def _file_of(case: ET.Element) -> str:
    """The test file of a ``<testcase>``: its ``file`` attribute (pytest's xunit1), else its classname's module
    path (``tests.kernels.test_x.TestY`` -> ``tests/kernels/test_x.py``; a class part is capitalised)."""
    if case.get("file"):
        return case.get("file")
    parts = (case.get("classname") or "?").split(".")
    while len(parts) > 1 and parts[-1][:1].isupper():
        parts.pop()
    return "/".join(parts) + ".py"


def junit_counts(path: Path) -> list[FileCounts]:
    """Per test file, in file order: passed / failed / errors / skipped counts and skip reasons of the JUnit XML
    at ``path``. Raises ValueError naming the file when it is not JUnit XML."""
    try:
        root = ET.parse(path).getroot()
    except (ET.ParseError, OSError) as e:
        raise ValueError(f"{path}: not a readable JUnit XML file ({e})") from e
    if root.tag not in ("testsuites", "testsuite"):
        raise ValueError(f"{path}: root element <{root.tag}>, expected <testsuites> or <testsuite>")
    out: dict[str, FileCounts] = {}
    for case in root.iter("testcase"):
        c = out.setdefault(_file_of(case), FileCounts(_file_of(case)))
        tags = {child.tag: child for child in case}
        if "failure" in tags:
            c.failed += 1
        elif "error" in tags:
            c.errors += 1
        elif "skipped" in tags:
            c.skipped += 1
            reason = tags["skipped"].get("message") or "no reason given"
            c.skip_reasons[reason] = c.skip_reasons.get(reason, 0) + 1
        else:
            c.passed += 1
    return list(out.values())


@dataclass
class Step:
    """One step of a run: its exit status and wall time (s); for a pytest step its counts (summed over files),
    for a benchmark step its rows and rows without a figure (``problems``)."""

    step: str
    rc: int
    seconds: float
    kind: str = ""  # pytest, bench
    status: str = ""  # ok, failed, timed out
    tests: dict[str, int] | None = None
    rows: int | None = None
    problems: list[str] | None = None
    note: str = ""


def read_steps(out: Path) -> list[Step]:
    """The steps ``device_run.sh`` recorded in ``out/steps.jsonl``, with their JUnit and benchmark JSON read.
    Raises ValueError naming the file and line of a malformed record."""
    records = out / "steps.jsonl"
    steps = []
    for i, line in enumerate(records.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
            step = Step(str(rec["step"]), int(rec["rc"]), float(rec["seconds"]), str(rec.get("kind", "")))
        except (ValueError, KeyError, TypeError) as e:
            raise ValueError(f"{records}:{i}: not a step record ({e}): {line[:200]}") from e
        step.status = "ok" if step.rc == 0 else "timed out" if step.rc in TIMED_OUT else "failed"
        xml = out / f"{step.step}.xml"
        if xml.is_file():
            try:
                files = junit_counts(xml)
            except ValueError as e:
                step.note = str(e)
            else:
                tot = Counter()
                for f in files:
                    tot.update(passed=f.passed, failed=f.failed, errors=f.errors, skipped=f.skipped)
                step.tests = {k: tot[k] for k in ("passed", "failed", "errors", "skipped")}
        elif step.kind == "pytest":
            step.note = f"no JUnit: {xml.name} was not written (pytest ended before its report)"
        bench = out / f"{step.step}.json"
        if step.kind == "bench" and not bench.is_file():
            step.note = f"no benchmark JSON: {bench.name} was not written"
        elif bench.is_file():
            try:
                doc = json.loads(bench.read_text())
                step.rows, step.problems = len(doc["rows"]), list(doc.get("problems", []))
            except (ValueError, KeyError, TypeError) as e:
                step.note = f"{bench}: not a benchmark JSON ({e})"
        steps.append(step)
    return steps


def table(steps: list[Step]) -> str:
    """The summary as a fixed-width table, one row per step and a total."""
    head = f"{'step':<22} {'status':<9} {'rc':>4} {'s':>7} {'passed':>7} {'failed':>7} {'errors':>7} " \
           f"{'skipped':>8} {'rows':>6} {'no figure':>10}"
    lines = [head, "-" * len(head)]

    def cell(v) -> str:
        return "-" if v is None else str(v)
    for s in steps:
        t = s.tests or {}
        lines.append(f"{s.step:<22} {s.status:<9} {s.rc:>4} {s.seconds:>7.1f} {cell(t.get('passed')):>7} "
                     f"{cell(t.get('failed')):>7} {cell(t.get('errors')):>7} {cell(t.get('skipped')):>8} "
                     f"{cell(s.rows):>6} {cell(None if s.problems is None else len(s.problems)):>10}"
                     + (f"  {s.note}" if s.note else ""))
    bad = [s.step for s in steps if s.status != "ok"]
    lines.append(f"{len(steps)} steps, {len(steps) - len(bad)} ok" + (f"; not ok: {', '.join(bad)}" if bad else ""))
    return "\n".join(lines)


def summary(out: Path) -> tuple[dict, list[Step]]:
    """The run's summary, written to ``out/summary.json`` (every step; ``ok``: there were steps and each exited
    0; ``not_ok``: the others), and its steps."""
    steps = read_steps(out)
    doc = {"ok": all(s.status == "ok" for s in steps) and bool(steps),
           "steps": [asdict(s) for s in steps],
           "not_ok": [s.step for s in steps if s.status != "ok"]}
    (out / "summary.json").write_text(json.dumps(doc, indent=1))
    return doc, steps


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python3 -m benchmarks.device_report", description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    sub.add_parser("counts", help="one line of counts per test file of a JUnit XML").add_argument("xml", type=Path)
    sub.add_parser("summary", help="OUT/summary.json and a table of every step").add_argument("out", type=Path)
    args = ap.parse_args(argv)
    try:
        if args.cmd == "counts":
            for f in junit_counts(args.xml):
                print(f.line())
            return 0
        doc, steps = summary(args.out)
    except (ValueError, OSError) as e:
        print(f"device_report: {e}", file=sys.stderr)
        return 2
    print(table(steps))
    print(f"summary: {args.out / 'summary.json'}")
    return 0 if doc["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())

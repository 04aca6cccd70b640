"""CI formats: JUnit XML read back by junitparser and checked against the layout pytest writes; the GitHub
step summary and its append to ``$GITHUB_STEP_SUMMARY``."""
from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
import xml.etree.ElementTree as ET
from types import SimpleNamespace

import pytest
from junitparser import Error, Failure, JUnitXml, Skipped

from validate import ci_formats
from validate.ci_formats import append_github_summary, github_summary, junit_xml, write_junit
from validate.compare import Comparison, PairedTask, apply_holm, attach_sensitivity
from validate.perfgate import PerfComparison, judge
from validate.record import Record, ServerInfo, Tree, Verdict
from validate.verdict import assess
from validate.stats import mcnemar


def rec(config, suite, status="pass", cause=None, reasons=(), release="v9", profile="quick", wall_s=12.5):
    return Record(release=release, config=config, config_hash=f"h-{config}", suite=suite, suite_kind=suite,
                  params={}, params_hash="p", profile=profile, started_at="2025-01-02T03:04:05+00:00",
                  ended_at="2025-01-02T03:05:05+00:00", wall_s=wall_s,
                  tree=Tree(commit="0123456789abcdef", dirty=False, source_hash="aaaa"),
                  server=ServerInfo(launched=True), model="smol.gguf",
                  verdict=Verdict(status=status, cause=cause, reasons=list(reasons)))


def release_records() -> list[Record]:
    """A release with one failing suite, one erroring, one wrong-tree, one passing and one skipped."""
    return [
        rec("cpu-smol", "sanity", "fail", reasons=["bad 3 > 0", "p1: garbage under overload x2.0 | 'xx'"]),
        rec("cpu-smol", "gsm8k", "error", cause="server died during the suite",
            reasons=["engine core exited: \x1b[31mSIGKILL\x1b[0m"], wall_s=3.25),
        rec("cpu-smol", "probe", "pass"),
        rec("gpu-box", "sanity", "wrong-tree", cause="plugin source bbbb, not the tree's aaaa"),
        rec("gpu-box", "probe", "skipped", cause="not run: the server died in an earlier suite"),
    ]


def parse(text: str) -> JUnitXml:
    return JUnitXml.fromstring(text)


def cases(xml: JUnitXml) -> dict[tuple[str, str], object]:
    return {(c.classname, c.name): c for s in xml for c in s}


def recount(text: str) -> JUnitXml:
    """The same report with every count recomputed by junitparser from the testcases themselves."""
    xml = parse(text)
    xml.update_statistics()
    return xml


# --- a checker of the JUnit layout: Jenkins' junit-10.xsd (the schema pytest's own tests validate against),
# with the two points where pytest's output differs from it: ``<error>`` (the xsd spells it "errors") and
# ``<properties>`` as a testcase's first child (pytest's record_property).
SUREFIRE_TIME = re.compile(r"(([0-9]{0,3},)*[0-9]{3}|[0-9]{0,3})*(\.[0-9]{0,3})?")
ATTRS = {
    "testsuites": ({"name", "time", "tests", "failures", "errors", "skipped"}, set()),
    "testsuite": ({"name", "tests", "failures", "errors", "group", "time", "skipped", "timestamp", "hostname", "id",
                   "package", "file", "log", "url", "version"}, {"name", "tests", "failures", "errors"}),
    "testcase": ({"name", "time", "classname", "group", "file", "line"}, {"name"}),
    "failure": ({"type", "message"}, set()), "error": ({"type", "message"}, set()),
    "skipped": ({"type", "message"}, set()),
    "properties": (set(), set()), "property": ({"name", "value"}, {"name", "value"}),
    "system-out": (set(), set()), "system-err": (set(), set()),
}
CHILDREN = {
    "testsuites": {"testsuite"}, "testsuite": {"testsuite", "properties", "testcase", "system-out", "system-err"},
    "testcase": {"properties", "skipped", "error", "failure", "system-out", "system-err"},
    "properties": {"property"},
}


def check_layout(root: ET.Element) -> None:
    assert root.tag == "testsuites"
    for el in root.iter():
        allowed, required = ATTRS[el.tag]
        assert set(el.attrib) <= allowed, (el.tag, set(el.attrib) - allowed)
        assert required <= set(el.attrib), (el.tag, required - set(el.attrib))
        kids = [k.tag for k in el]
        assert set(kids) <= CHILDREN.get(el.tag, set()), (el.tag, kids)
        if el.tag == "testcase" and "properties" in kids:
            assert kids.index("properties") == 0 and kids.count("properties") == 1
        if el.tag in ("testsuites", "testsuite") and "time" in el.attrib:
            assert SUREFIRE_TIME.fullmatch(el.get("time")), el.get("time")
        if el.tag == "testcase":
            assert float(el.get("time", "0")) >= 0
            assert sum(k in ("failure", "error", "skipped") for k in kids) <= 1


@pytest.mark.timeout(60)
def test_layout_checker_accepts_what_pytest_itself_writes(tmp_path):
    """The checker above is pytest's own expectation: a report pytest writes (passed, failed, errored, skipped,
    with a testcase property) passes it."""
    (tmp_path / "test_ref.py").write_text(textwrap.dedent("""
        import pytest

        @pytest.fixture
        def broken():
            raise RuntimeError("setup broke")

        def test_pass(record_property):
            record_property("release", "v9")

        def test_fail():
            assert 1 == 2, "a cause"

        def test_error(broken):
            pass

        def test_skip():
            pytest.skip("not here")
    """))
    (tmp_path / "pytest.ini").write_text("[pytest]\njunit_family = xunit1\n")
    out = tmp_path / "ref.xml"
    p = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist",
                        "-c", str(tmp_path / "pytest.ini"), f"--junitxml={out}", "test_ref.py"],
                       cwd=tmp_path, capture_output=True, text=True, timeout=50)
    assert p.returncode == 1, p.stdout + p.stderr
    ref = ET.parse(out).getroot()
    check_layout(ref)
    suite = ref.find("testsuite")
    assert {k: suite.get(k) for k in ("tests", "failures", "errors", "skipped")} == \
        {"tests": "4", "failures": "1", "errors": "1", "skipped": "1"}
    assert ref.find("testsuite/testcase/properties/property").attrib == {"name": "release", "value": "v9"}


@pytest.mark.timeout(60)
def test_junit_counts_per_configuration_and_in_total():
    text = junit_xml(assess("v9", release_records()))
    xml = parse(text)
    got = {s.name: (s.tests, s.failures, s.errors, s.skipped) for s in xml}
    # a skipped suite is an error: the release exits 2 on it, so the report must not read green
    # a quick-profile pass is limited: skipped with its reason, as the console and the summary say it
    assert got == {"cpu-smol": (3, 1, 1, 1), "gpu-box": (2, 1, 1, 0)}
    assert (xml.tests, xml.failures, xml.errors, xml.skipped) == (5, 2, 2, 1)
    # the written counts agree with junitparser's own count of the testcases
    again = recount(text)
    assert {s.name: (s.tests, s.failures, s.errors, s.skipped) for s in again} == got
    assert (again.tests, again.failures, again.errors, again.skipped) == (5, 2, 2, 1)
    c = cases(xml)
    assert list(c) == [("cpu-smol", "sanity"), ("cpu-smol", "gsm8k"), ("cpu-smol", "probe"),
                       ("gpu-box", "sanity"), ("gpu-box", "probe")]
    [lim] = c["cpu-smol", "probe"].result
    assert isinstance(lim, Skipped) and lim.type == "limited" and lim.message == "not a full check: quick profile"
    full = cases(parse(junit_xml(assess("v9", [rec("cpu-smol", "probe", profile="full")]))))
    assert full["cpu-smol", "probe"].is_passed
    assert c["cpu-smol", "gsm8k"].time == 3.25 and c["cpu-smol", "sanity"].time == 12.5
    s = {x.name: x for x in xml}
    assert s["cpu-smol"].time == pytest.approx(28.25) and xml.time == pytest.approx(53.25)
    assert s["cpu-smol"].timestamp == "2025-01-02T03:04:05+00:00"


@pytest.mark.timeout(60)
def test_junit_results_carry_causes_and_reasons():
    c = cases(parse(junit_xml(assess("v9", release_records()))))
    [fail] = c["cpu-smol", "sanity"].result
    assert isinstance(fail, Failure) and fail.type == "fail"
    assert fail.message == "bad 3 > 0"  # no cause: the first reason
    assert fail.text.splitlines() == ["bad 3 > 0", "p1: garbage under overload x2.0 | 'xx'"]
    [err] = c["cpu-smol", "gsm8k"].result
    assert isinstance(err, Error) and err.type == "error" and err.message == "server died during the suite"
    # a terminal escape from a server log is not valid XML 1.0: it is shown, never written raw
    assert err.text.splitlines() == ["server died during the suite", "engine core exited: \\x1b[31mSIGKILL\\x1b[0m"]
    [wrong] = c["gpu-box", "sanity"].result
    assert isinstance(wrong, Failure) and wrong.type == "wrong-tree"
    assert wrong.message == "plugin source bbbb, not the tree's aaaa"
    [skip] = c["gpu-box", "probe"].result
    assert isinstance(skip, Error) and skip.type == "skipped" and skip.message == "not run: the server died in an earlier suite"
    inactive = cases(parse(junit_xml(assess("v9", [rec("c", "s", "plugin-inactive", cause="pid 7 lacks gdn")]))))
    [r] = inactive["c", "s"].result
    assert isinstance(r, Failure) and r.type == "plugin-inactive" and r.message == "pid 7 lacks gdn"


@pytest.mark.timeout(60)
def test_junit_matches_pytest_layout_and_carries_properties():
    root = ET.fromstring(junit_xml(assess("v9", release_records()), name="ci"))
    check_layout(root)
    assert root.get("name") == "ci"
    for case in root.iter("testcase"):
        props = {p.get("name"): p.get("value") for p in case.findall("properties/property")}
        assert props == {"release": "v9", "config_hash": f"h-{case.get('classname')}",
                         "tree.commit": "0123456789abcdef", "tree.dirty": "false", "tree.source_hash": "aaaa",
                         "profile": "quick"}
    assert [s.get("name") for s in root] == ["cpu-smol", "gpu-box"]
    assert all(c.get("classname") == s.get("name") for s in root for c in s)


@pytest.mark.timeout(60)
def test_junit_caps_long_reasons_and_survives_odd_text():
    reasons = [f"log line {i}: " + "x" * 100 for i in range(5000)]
    text = junit_xml(assess("v9", [rec("c", "soak", "error", cause="boom\x00" + "y" * 5000, reasons=reasons)]))
    [err] = cases(parse(text))["c", "soak"].result
    assert len(err.message) <= ci_formats.MESSAGE_MAX_CHARS and "\n" not in err.message
    assert err.message.startswith("boom\\x00yyy") and err.message.endswith(" ...")
    lines = err.text.splitlines()
    assert len(lines) <= ci_formats.DETAIL_MAX_LINES + 1 and len(err.text) < ci_formats.DETAIL_MAX_CHARS + 200
    assert re.fullmatch(r"\.\.\. \(\d+ more line\(s\) not shown\)", lines[-1])
    assert "\udcff" not in junit_xml(assess("v9", [rec("c", "s", "fail", cause="bytes \udcff")]))  # a lone surrogate
    empty = parse(junit_xml(assess("v9", [])))
    assert (empty.tests, empty.failures, empty.errors, empty.skipped, len(empty)) == (0, 0, 0, 0, 0)


def paired(config, task, n, b, c, correct_baseline) -> PairedTask:
    m = mcnemar(b, c)
    return PairedTask(config=config, baseline_config=config, task=task, n=n, correct_baseline=correct_baseline,
                      correct_candidate=correct_baseline - b + c, b=b, c=c, identical=n - b - c,
                      lost=[f"q{i}" for i in range(b)], gained=[f"g{i}" for i in range(c)],
                      p_two_sided=m.p_two_sided, p_one_sided=m.p_one_sided, subset=True)


def comparison() -> Comparison:
    tasks = [paired("cpu-smol", "gsm8k", 400, 30, 4, 200), paired("cpu-smol", "humaneval", 164, 3, 2, 40)]
    apply_holm(tasks, 0.05)
    attach_sensitivity(tasks, 0.05)
    assert [t.regression for t in tasks] == [True, False]
    unpaired = ["gpu-box/gsm8k: the baseline v8 has no record of gpu-box/gsm8k"]
    return Comparison(candidate="v9", baseline="v8", tasks=tasks, unpaired=unpaired, alpha=0.05)


@pytest.mark.timeout(60)
def test_a_paired_regression_is_one_failure_and_an_unpaired_task_an_error():
    cmp = comparison()
    gsm = cmp.tasks[0]
    records = [rec("cpu-smol", "gsm8k"), rec("cpu-smol", "humaneval")]
    text = junit_xml(assess("v9", records, comparison=cmp))
    check_layout(ET.fromstring(text))
    xml = parse(text)
    # in a release a task only the candidate has is limited (a skip); a gate on its own (strict) cannot pass it
    assert {s.name: (s.tests, s.failures, s.errors, s.skipped) for s in xml} == \
        {"cpu-smol": (4, 1, 0, 3), "gpu-box": (1, 0, 0, 1)}  # quick records and a subset pair: limited
    assert (xml.tests, xml.failures, xml.errors) == (5, 1, 0)
    strict = parse(junit_xml(assess("v9", records, comparison=cmp, strict=True)))
    assert {s.name: (s.tests, s.failures, s.errors, s.skipped) for s in strict}["gpu-box"] == (1, 0, 1, 0)
    c = cases(xml)
    [f] = c["cpu-smol", "paired gsm8k vs v8"].result
    assert isinstance(f, Failure) and f.type == "regression"
    assert f.message == (f"cpu-smol/gsm8k regressed: 30 lost vs 4 gained, one-sided p = {gsm.p_one_sided:.3g}, "
                         f"Holm-adjusted {gsm.p_holm:.3g} < alpha 0.05")
    assert "b = right only in v8, c = right only in v9" in f.text and gsm.sensitivity in f.text
    assert f"verdict: regression; {gsm.sensitivity}" in f.text and "95% interval" in f.text
    [ok] = c["cpu-smol", "paired humaneval vs v8"].result  # a subset pair, too few questions: limited, never passed
    assert isinstance(ok, Skipped) and ok.type == "limited"
    assert ok.message == "not a full check: a subset; too few questions to detect a regression"
    assert cmp.tasks[1].sensitivity in ok.text and cmp.tasks[1].verdict_text in ok.text
    [u] = c["gpu-box", "paired gsm8k vs v8"].result
    assert isinstance(u, Skipped) and u.type == "not paired" and u.message == cmp.unpaired[0]
    root = ET.fromstring(text)
    props = {p.get("name"): p.get("value") for p in
             root.find("testsuite/testcase[@name='paired gsm8k vs v8']/properties")}
    assert (props["b"], props["c"], props["n"], props["baseline"], props["release"]) == ("30", "4", "400", "v8", "v9")
    assert float(props["p_holm"]) == pytest.approx(gsm.p_holm, rel=1e-5)
    assert float(props["diff_ci_low"]) == pytest.approx(gsm.diff_ci[0], rel=1e-5)
    assert props["config_hash"] == "h-cpu-smol"  # from the candidate's record of the task


@pytest.mark.timeout(60)
def test_performance_gate_results():
    """A regression is a failure, a figure within its threshold a pass, one the pass counts cannot decide a skip
    in a release (never a pass) and an error in ``gate --perf``; a record the gate could not compare an error."""
    slow = judge("cpu-smol", "combined_decode_tok_s", [100.0 + i for i in range(8)], [80.0 + i for i in range(8)], 3.0)
    same = judge("cpu-smol", "decode_step_ms", [38.0 + 0.1 * i for i in range(8)], [38.05 + 0.1 * i for i in range(8)], 3.0)
    few = judge("cpu-smol", "prefill_2048_tok_s", [5000.0, 5010.0], [2500.0, 2510.0], 5.0)
    perf = PerfComparison("v9", "v8", figures=[slow, same, few],
                          unpaired=["gpu-box/betterbench: cannot compare: suite parameters differ (decode_tokens: 128 vs 512)"])
    xml = parse(junit_xml(assess("v9", [rec("cpu-smol", "betterbench")], perf=perf)))
    assert {s.name: (s.tests, s.failures, s.errors, s.skipped) for s in xml} == \
        {"cpu-smol": (4, 1, 0, 2), "gpu-box": (1, 0, 1, 0)}  # the quick record: limited
    c = cases(xml)
    [f] = c["cpu-smol", "perf combined_decode_tok_s"].result
    assert isinstance(f, Failure) and f.type == "perf-regression" and f.message == slow.message
    assert c["cpu-smol", "perf decode_step_ms"].is_passed and same.message in c["cpu-smol", "perf decode_step_ms"].system_out
    [k] = c["cpu-smol", "perf prefill_2048_tok_s"].result
    assert isinstance(k, Skipped) and k.type == "cannot tell" and k.message.startswith("cannot tell: 2 and 2 passes")
    [e] = c["gpu-box", "perf betterbench"].result
    assert isinstance(e, Error) and "decode_tokens: 128 vs 512" in e.message
    strict = cases(parse(junit_xml(assess("v9", [], perf=perf, strict=True))))
    [k] = strict["cpu-smol", "perf prefill_2048_tok_s"].result
    assert isinstance(k, Error)
    md = github_summary(assess("v9", [], perf=perf))
    assert f"| cpu-smol | combined\\_decode\\_tok\\_s | **REGRESSION** | {ci_formats._md(slow.message)} |" in md
    assert "| cpu-smol | prefill\\_2048\\_tok\\_s | *cannot tell* |" in md
    assert "| gpu-box | betterbench | **NOT COMPARED** |" in md


@pytest.mark.timeout(60)
def test_write_junit_is_atomic(tmp_path, monkeypatch):
    path = tmp_path / "out" / "junit.xml"
    assert write_junit(path, assess("v9", release_records())) == path
    assert JUnitXml.fromfile(str(path)).tests == 5
    assert oct(path.stat().st_mode & 0o777) == "0o644" and os.listdir(path.parent) == ["junit.xml"]
    before = path.read_bytes()

    def refuse(*a):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(ci_formats.os, "replace", refuse)
    with pytest.raises(OSError, match="No space left"):
        write_junit(path, assess("v9", [rec("c", "s")]))
    assert path.read_bytes() == before and os.listdir(path.parent) == ["junit.xml"]
    monkeypatch.undo()
    (tmp_path / "file").write_text("")
    with pytest.raises(OSError):
        write_junit(tmp_path / "file" / "junit.xml", assess("v9", []))


@pytest.mark.timeout(60)
def test_github_summary_tables():
    md = github_summary(assess("v9", release_records(), comparison=comparison(), baseline="v8",
                               baseline_why="named with --baseline"))
    lines = md.splitlines()
    assert lines[0] == "## r9k-validate release v9: exit status 1, a finding"
    assert lines[2].startswith("**FAIL**: 3 finding(s): cpu-smol/sanity fail, gpu-box/sanity wrong-tree, "
                               "cpu-smol/paired gsm8k vs v8 regression; 2 check(s) could not be made:")
    assert "Baseline: v8 (named with --baseline)" in lines
    assert "| configuration | sanity | gsm8k | probe |" in lines
    assert "| cpu-smol | **FAIL** | **ERROR** | pass *(limited)* |" in lines
    assert "| gpu-box | **WRONG-TREE** | – | *skipped* |" in lines
    gsm, he = comparison().tasks
    assert "| configuration | task | n | b / c | one-sided p (Holm) | verdict | 95% interval |" in lines
    assert (f"| cpu-smol | gsm8k (subset) | 400 | 30 / 4 | {gsm.p_one_sided:.3g} ({gsm.p_holm:.3g}) | **REGRESSION** | "
            f"{100 * gsm.diff_ci[0]:+.1f} to {100 * gsm.diff_ci[1]:+.1f} points |") in lines
    assert (f"| cpu-smol | humaneval (subset) | 164 | 3 / 2 | {he.p_one_sided:.3g} ({he.p_holm:.3g}) | "
            f"{he.verdict_text} |") in md
    assert "- **NOT PAIRED** gpu-box/gsm8k: the baseline v8 has no record of gpu-box/gsm8k" in lines
    # findings with their first reasons; what could not be checked named, each with why; markdown escaped
    fails = md.split("### Findings (3)")[1].splitlines()
    assert fails[2] == "- **FAIL** cpu-smol / sanity: bad 3 \\> 0"
    assert fails[3] == "  - p1: garbage under overload x2.0 \\| 'xx'"
    assert fails[4] == "- **WRONG-TREE** gpu-box / sanity: plugin source bbbb, not the tree's aaaa"
    nc = md.split("### Not checked (")[1]
    assert "- **ERROR** cpu-smol / gsm8k: server died during the suite" in nc
    assert "*skipped* gpu-box / probe: not run: the server died in an earlier suite" in nc
    ok = github_summary(assess("v9", [rec("cpu-smol", "probe", profile="full")]))
    assert ok.splitlines()[0] == "## r9k-validate release v9: exit status 0, every verdict passed"
    assert "**PASS**" in ok and "Not checked" not in ok and "Findings" not in ok
    quick = github_summary(assess("v9", [rec("cpu-smol", "probe")]))  # a quick profile: no finding, not a full check
    assert "exit status 0" in quick.splitlines()[0] and "**PASS**" not in quick
    assert "**NO FINDING, NOT FULLY CHECKED**" in quick and "passed, not a full check: quick profile" in quick


@pytest.mark.timeout(60)
def test_github_summary_stays_bounded():
    many = [rec(f"cfg{i}", "soak", "error", cause="x" * 5000, reasons=[f"r{j}" for j in range(10)]) for i in range(80)]
    md = github_summary(assess("v9", many))
    assert md.splitlines()[0] == "## r9k-validate release v9: exit status 2, not everything could be checked"
    assert "**NOT CHECKED**: 80 check(s) could not be made" in md
    assert "- ... 30 more; see the records" in md and "  - ... 7 more reason(s) in the record" in md
    assert len(md.encode()) < ci_formats.SUMMARY_MAX_BYTES
    assert all(len(line) < 2 * ci_formats.MESSAGE_MAX_CHARS for line in md.splitlines())


@pytest.mark.timeout(60)
def test_github_summary_appends_only_when_the_variable_is_set(tmp_path):
    target = tmp_path / "summary.md"
    assert append_github_summary("# one", environ={}) is None
    assert append_github_summary("# one", environ={"GITHUB_STEP_SUMMARY": ""}) is None
    assert not target.exists()
    target.write_text("earlier step\n")
    env = {"GITHUB_STEP_SUMMARY": str(target)}
    assert append_github_summary("# one", environ=env) is True
    assert append_github_summary("# two\n", environ=env) is True
    assert target.read_text() == "earlier step\n# one\n# two\n"


@pytest.mark.timeout(60)
def test_an_unwritable_summary_path_returns_false(tmp_path):
    for bad in (tmp_path / "missing" / "summary.md", tmp_path, "bad\0name"):
        assert append_github_summary("# x", environ={"GITHUB_STEP_SUMMARY": str(bad)}) is False


def test_gate_perf_writes_what_it_could_not_compare_as_errors(tmp_path):
    """A gated figure missing from the candidate makes `gate --perf` exit 2; its JUnit report must not be green."""
    import xml.etree.ElementTree as ET

    from tests.validate.test_perfgate import _bench
    from validate.cli import main
    from validate.record import record_path, write_record

    b, c = _bench("v1", 38.0, 1), _bench("v2", 38.0, 2)
    for row in c.metrics["per_pass"]:
        del row["prefill_1024_tok_s"]
    for r in (b, c):
        write_record(record_path(tmp_path, r.release, r.config, r.suite), r)
    junit = tmp_path / "j.xml"
    assert main(["gate", "--accept-other-tree", "v2", "--against", "v1", "--perf", "--reports", str(tmp_path), "--junit-xml", str(junit)]) == 2
    root = ET.parse(junit).getroot()
    assert root.get("errors") == "1" and root.get("failures") == "0"
    [err] = [case for case in root.iter("testcase") if case.find("error") is not None]
    assert err.get("classname") == "cpu-smol" and err.get("name") == "perf betterbench"
    assert "prefill_1024_tok_s is gated and measured in the baseline but missing" in err.find("error").get("message")

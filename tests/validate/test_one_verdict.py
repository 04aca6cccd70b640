"""One verdict for the release: releases built with each outcome (records made with the project's own record
helpers), and the five outputs (the notes' opening line, the console table, JUnit, the step summary and the exit
status) checked to say the same thing; then the holes each output once had on its own."""
from __future__ import annotations

import io
import json

import pytest
from junitparser import JUnitXml
from rich.console import Console

from tests.conftest import REPO
from tests.validate.test_compare import N, eval_record, save
from tests.validate.test_perfgate import _bench
from validate import cli
from validate.ci_formats import github_summary, junit_xml
from validate.cli import main
from validate.errors import InputError
from validate.record import Tree, read_record, record_path, write_record
from validate.render import render_release
from validate.verdict import assess_release

BASE = set(range(150))  # 150 of 200 right
LOST_50 = set(range(50, 150))  # loses 50, gains none: one-sided p = 0.5 ** 50


def outputs(reports, release, baseline=None, **kw) -> dict:
    """The five outputs of one verdict."""
    v = assess_release(reports, release, baseline=baseline, **kw)
    notes = render_release(REPO, reports, release, None, v).read_text()
    buf = io.StringIO()
    old = cli.console
    cli.console = Console(file=buf, width=200, highlight=False)
    try:
        cli.print_verdict(v)
    finally:
        cli.console = old
    xml = JUnitXml.fromstring(junit_xml(v))
    return {"verdict": v, "code": v.exit_code(), "notes": notes, "opening": notes.split("\n")[2], "console": buf.getvalue(),
            "junit": (xml.tests, xml.failures, xml.errors, xml.skipped), "summary": github_summary(v)}


def agree(out: dict) -> None:
    """The five outputs say the same thing as the exit status."""
    code, opening, (tests, failures, errors, skipped), md = out["code"], out["opening"], out["junit"], out["summary"]
    head = md.splitlines()[2]
    if code == 1:
        assert opening.startswith("**Not ready to ship:**") and failures > 0
        assert head.startswith("**FAIL**") and "FAIL" in out["console"]
    elif code == 2:
        assert opening.startswith("**Not ready to ship: not everything could be checked:**")
        assert failures == 0 and errors > 0 and head.startswith("**NOT CHECKED**") and "NOT CHECKED" in out["console"]
    else:
        assert failures == errors == 0 and "Not ready" not in opening
        full = not out["verdict"].not_checked
        assert head.startswith("**PASS**" if full else "**NO FINDING, NOT FULLY CHECKED**")
        assert opening.startswith("Every check passed" if full else "No finding in what was checked")
    assert "Every suite that ran passed" not in out["notes"]


def bench(release, step, seed, n=20, **params):
    from validate.metrics import band

    r = _bench(release, step, seed, n)
    r.params.update(params)
    steps = [row["decode_step_ms"] for row in r.metrics["per_pass"]]
    r.metrics["summary"] = {"decode_step_ms": band(steps)}  # as the runner writes it (the audit recomputes it)
    r.perf_gate = {"thresholds_pct": {"decode_step_ms": 3.0, "combined_decode_tok_s": 3.0, "prefill_*": 5.0}, "alpha": 0.05}
    return r


def test_a_significant_regression_never_reads_as_every_suite_passed(tmp_path):
    """GSM8K loses 50 of 200 paired questions and BetterBench's decode step is 18.7% slower: every suite's own
    verdict is pass, and the release fails in all five outputs, naming both."""
    save(tmp_path, eval_record("v0.1.0", BASE), bench("v0.1.0", 38.0, 1))
    save(tmp_path, eval_record("v0.2.0", LOST_50), bench("v0.2.0", 38.0 * 1.187, 2))
    out = outputs(tmp_path, "v0.2.0")
    agree(out)
    assert out["code"] == 1
    names = {(c.config, c.name) for c in out["verdict"].findings}
    assert ("cpu-smol", "paired gsm8k vs v0.1.0") in names and ("cpu-smol", "perf decode_step_ms") in names
    ck = out["notes"].split("## Checked")[1].split("##")[0]
    assert "cpu-smol / gsm8k: pass" in ck  # the suite ran and passed; the release did not
    assert "cpu-smol / paired gsm8k vs v0.1.0" in out["opening"] and "perf decode_step_ms" in out["opening"]
    # the Numbers table carries the gate's mark, from the one rule
    row = next(line for line in out["notes"].splitlines() if line.startswith("| decode step p50 (BetterBench) |"))
    assert row.endswith("(slower: regression) |")


def test_quick_passes_cannot_tell_and_never_pass(tmp_path, capsys):
    """2 BetterBench passes a side and a +50% decode step: the rank test can never be significant. The release
    lists it under Not checked (exit 0, never "PASS"); gate --perf exits 2 and says how many passes would decide."""
    save(tmp_path, bench("v0.1.0", 38.0, 1, n=2), bench("v0.2.0", 57.0, 2, n=2))
    out = outputs(tmp_path, "v0.2.0")
    agree(out)
    assert out["code"] == 0
    step = next(c for c in out["verdict"].checks if c.name == "perf decode_step_ms")
    assert step.outcome == "limited" and step.status == "cannot tell" and "+51.4% in the bad direction" in step.message
    assert "beyond the baseline's band" in step.message and "4 a side" in step.message
    assert "| cpu-smol | decode\\_step\\_ms | *cannot tell* |" in out["summary"]
    nc = out["notes"].split("## Not checked")[1].split("##")[0]
    assert "cpu-smol / perf decode_step_ms: cannot tell: 2 and 2 passes cannot be significant" in nc
    assert main(["gate", "--accept-other-tree", "v0.2.0", "--against", "v0.1.0", "--perf", "--reports", str(tmp_path)]) == 2
    assert "would let the gate decide" in capsys.readouterr().out.replace("\n", " ")


@pytest.mark.parametrize("change", ["concurrency", "baseline-error", "max_num_seqs", "lost-figure"])
def test_a_perf_gate_that_compared_nothing_is_never_exit_0(tmp_path, change):
    b, c = bench("v0.1.0", 38.0, 1), bench("v0.2.0", 38.0, 2)
    if change == "concurrency":
        c.params["concurrency"] = [1, 2, 4]
    elif change == "baseline-error":
        b.verdict.status, b.verdict.cause = "error", "server died during the suite"
    elif change == "max_num_seqs":
        b.config_snapshot, c.config_snapshot = {"server": {"max_num_seqs": 8}}, {"server": {"max_num_seqs": 16}}
    else:
        for row in c.metrics["per_pass"]:
            del row["decode_step_ms"]
    save(tmp_path, b, c)
    out = outputs(tmp_path, "v0.2.0")
    agree(out)
    assert out["code"] == 2
    assert any(c.area == "perf" and c.outcome == "not-checked" for c in out["verdict"].checks)


def test_unpairable_full_set_evals_make_junit_red(tmp_path):
    """Full sets on both sides, but another scoring parameter: exit 2, and JUnit and the summary name it."""
    c = eval_record("v0.2.0", LOST_50)
    c.params = {**c.params, "concurrency": 4}
    save(tmp_path, eval_record("v0.1.0", BASE), c)
    out = outputs(tmp_path, "v0.2.0")
    agree(out)
    assert out["code"] == 2 and out["junit"][2] == 1
    assert "**NOT CHECKED** cpu-smol / paired gsm8k vs v0.1.0: cpu-smol/gsm8k (v0.2.0) against" in out["summary"]


def test_notes_that_do_not_render_make_junit_red(scratch, tmp_path, monkeypatch):
    """A release whose notes cannot be written exits 2 and its JUnit says why (it was all green)."""
    import validate.render

    scratch.config("fake-ok")

    def boom(*a, **k):
        raise InputError("templates/release.md.j2: unreadable")

    monkeypatch.setattr(validate.render, "render_release", boom)
    junit = tmp_path / "r9k.xml"
    assert main(["release", "vn", "--baseline", "none", "--junit-xml", str(junit)]) == 2
    xml = JUnitXml.fromfile(str(junit))
    cases = {(c.classname, c.name): c for s in xml for c in s}
    assert "release notes could not be rendered" in cases[("release", "notes")].result[0].message


def test_title_and_numbers_pair_only_what_the_gate_pairs(tmp_path):
    """Other decode_tokens: the gate refuses to compare, so the Numbers table and the title do not either."""
    b, c = bench("v0.1.0", 38.0, 1), bench("v0.2.0", 30.0, 2, decode_tokens=512)
    save(tmp_path, b, c)
    out = outputs(tmp_path, "v0.2.0")
    bs, cs = (r.metrics["summary"]["decode_step_ms"] for r in (b, c))
    assert f"{bs['median']:.2f} -> {cs['median']:.2f}" not in out["notes"].split("\n")[0]
    assert (f"| decode step p50 (BetterBench) | – | {cs['median']:.2f} ms ({cs['min']:.2f}–{cs['max']:.2f}) | – |"
            in out["notes"]), out["notes"]
    assert "betterbench: not compared with v0.1.0's record: suite parameters differ (decode_tokens: 128 vs 512)" in out["notes"]


def test_the_automatic_baseline_is_said_and_a_non_version_name_gets_one(tmp_path):
    save(tmp_path, eval_record("v0.1.0", BASE))
    c = eval_record("candidate", LOST_50)
    save(tmp_path, c)
    out = outputs(tmp_path, "candidate")
    assert out["verdict"].baseline == "v0.1.0" and "'candidate' is not a version" in out["verdict"].baseline_why
    assert out["code"] == 1
    assert "Compared with v0.1.0 ('candidate' is not a version: the newest released version under reports/" in out["notes"]


def test_a_full_candidate_against_a_subset_baseline_cannot_pass(tmp_path, capsys):
    """A 25-point GSM8K drop on the full set against a quick-subset baseline gated 0."""
    save(tmp_path, eval_record("v0.1.0", BASE, subset=True), eval_record("v0.2.0", set(range(100))))
    out = outputs(tmp_path, "v0.2.0")
    agree(out)
    assert out["code"] == 2
    assert main(["gate", "--accept-other-tree", "v0.2.0", "--against", "v0.1.0", "--reports", str(tmp_path)]) == 2
    said = capsys.readouterr().out.replace("\n", " ")
    assert "the baseline is a subset (200 questions) and the candidate the full set" in said


def test_thresholds_are_the_records_and_the_baselines_win(tmp_path):
    """A candidate that loosened its own gate to 50% is still judged by the baseline's 3%, and the notes say so;
    a baseline recorded before thresholds were stored is judged by the checkout's, said too."""
    b, c = bench("v0.1.0", 38.0, 1), bench("v0.2.0", 38.0 * 1.2, 2)
    c.perf_gate = {"thresholds_pct": {"decode_step_ms": 50.0, "combined_decode_tok_s": 50.0, "prefill_*": 50.0},
                   "alpha": 0.05}
    save(tmp_path, b, c)
    out = outputs(tmp_path, "v0.2.0")
    assert out["code"] == 1
    assert any("the candidate was recorded under other thresholds" in n and "are used" in n
               for n in out["verdict"].notes)
    assert "recorded under other thresholds" in out["notes"]
    b.perf_gate = None
    save(tmp_path, b)
    out = outputs(tmp_path, "v0.2.0")
    assert out["code"] == 1 and any("recorded before thresholds were stored" in n for n in out["verdict"].notes)


def test_an_edited_record_is_judged_by_its_own_gate(tmp_path):
    """`bad = 7` under a gate of max 0, verdict left "pass": read back as a fail; schema_version 99 is refused."""
    r = eval_record("v0.2.0", BASE, suite="sanity")
    r.suite_kind = "strict-sanity"
    r.gate = {"max": {"bad": 0}, "min": {}}
    r.metrics = {"bad": 0, "n": 16}
    path = write_record(record_path(tmp_path, "v0.2.0", "cpu-smol", "sanity"), r)
    d = json.loads(path.read_text())
    d["metrics"]["bad"] = 7
    path.write_text(json.dumps(d))
    back = read_record(path)
    assert back.verdict.status == "fail" and "gate: bad = 7 > 0" in back.verdict.reasons
    assert back.rechecked == "the record says pass, but its metrics fail its own gate"
    out = outputs(tmp_path, "v0.2.0", baseline="none")
    agree(out)
    assert out["code"] == 1
    d["schema_version"] = 99
    path.write_text(json.dumps(d))
    with pytest.raises(InputError, match=r"sanity.json: schema_version: 99 is not a record schema this engine reads"):
        read_record(path)


def test_a_schema_1_record_is_judged_by_the_checkouts_gate(tmp_path):
    r = eval_record("v0.2.0", BASE, suite="sanity")
    r.suite_kind, r.schema_version, r.metrics = "strict-sanity", 1, {"bad": 7, "n": 16}
    save(tmp_path, r)
    v = assess_release(tmp_path, "v0.2.0", root=REPO, baseline="none")
    (c,) = [c for c in v.checks if c.area == "suite"]
    assert c.outcome == "finding" and "the checkout's suite file's gate" in c.message


def test_the_gate_refuses_records_of_another_tree(tmp_path, capsys):
    """A `suite` that failed at preflight leaves the last run's record: the gate asks whose it is."""
    save(tmp_path, eval_record("v0.1.0", BASE), eval_record("v0.2.0", BASE))
    assert main(["gate", "v0.2.0", "--against", "v0.1.0", "--reports", str(tmp_path)]) == 2
    assert "would judge a record made by another tree (plugin source aaaa" in capsys.readouterr().out.replace("\n", " ")
    assert main(["gate", "--accept-other-tree", "v0.2.0", "--against", "v0.1.0", "--reports", str(tmp_path)]) == 0


def test_records_of_another_tree_in_a_release_are_named(tmp_path):
    save(tmp_path, eval_record("v0.2.0", BASE))
    tree = Tree(source_hash="bbbb", engine_hash="eeee")
    out = outputs(tmp_path, "v0.2.0", baseline="none", tree=tree)
    agree(out)
    assert out["code"] == 2 and "made by another tree (plugin source aaaa, this tree's is bbbb" in out["notes"]
    out = outputs(tmp_path, "v0.2.0", baseline="none", tree=tree, accept_other_tree=True)
    agree(out)
    assert out["code"] == 0 and "accepted with --accept-other-tree" in out["notes"]


def test_odd_server_counters_cost_the_counter_never_the_notes(tmp_path):
    """Nulls, strings and infinities where counters belong (a NaN scrape stored as null, a record edited by
    hand), counters gone backwards and impossible shares: the notes render and say what each is."""
    r = eval_record("v0.2.0", BASE, suite="probe")
    r.suite_kind, r.dataset, r.items = "probe", None, []
    r.metrics = {"decode_tok_s": "fast", "decode_step_ms": float("inf"), "ttft_ms_p50": None}
    r.server_metrics = {"available": True, "why": None, "series": [[1.0, {"kv_cache_usage": 1.7}], [2.0, {"kv_cache_usage": None}]],
                        "delta": {"histograms": {"ttft": {"count": None, "mean_ms": "x"}}, "counters": {},
                                  "resets": ["preemptions"], "impossible": ["kv_cache_usage = 1.7 (a share: 0 to 1)"],
                                  "invalid": {"itl": "vllm:inter_token_latency_seconds_count = nan"},
                                  "requests_by_finish_reason": {"stop": None}}}
    save(tmp_path, r)
    out = outputs(tmp_path, "v0.2.0", baseline="none")
    notes = out["notes"]
    assert "preemptions went backwards: the server restarted during the suite" in notes
    assert "impossible value kv_cache_usage = 1.7" in notes and "itl left out" in notes
    srv = next(line for line in notes.splitlines() if line.startswith("| cpu-smol | probe |"))
    assert "| – | 170.0% |" in srv  # preemptions missing, not 0; the impossible peak shown as it is


def test_the_checklist_runs_the_kernel_gates_and_the_race_test():
    from validate.config import find_config
    from validate.runners.pytest_suite import run_settings
    from validate.suite import find_suite, load_checklist

    plan = dict(load_checklist(REPO).plan())
    assert all(plan[c][:2] == ["unit-gates", "allreduce"] for c in plan)
    ar = find_suite(REPO, "allreduce", "quick").params
    assert run_settings(ar, find_config(REPO, "cpu-smol")) == (None, {"R9K_AR_WORLD_SIZES": "2,4"})
    assert run_settings(ar, find_config(REPO, "fn-tp4"))[1] == {"R9K_AR_WORLD_SIZES": "4"}
    ug = find_suite(REPO, "unit-gates", "quick").params
    assert run_settings(ug, find_config(REPO, "cpu-smol"))[0] is None
    assert run_settings(ug, find_config(REPO, "fn-tp4"))[0] == "gpu or not gpu"
    assert len(ug.paths) == 3 and all(p.startswith("tests/kernels/") for p in ug.paths)


def test_sizes_of_the_two_sides():
    assert N == 200 and len(BASE) == 150 and len(BASE - LOST_50) == 50


def test_a_move_within_the_measured_drift_between_runs_cannot_be_told(tmp_path, capsys):
    """Identical trees 24% apart between runs (every pass of the slow run above the fast one: p = 2e-10) are a
    regression on the suite's 3% alone; with the configuration's perf_noise_pct of 30 in the baseline's record the
    gate cannot tell (never a pass): gate --perf exits 2, a release lists it under Not checked. A move beyond the
    drift is still a regression. History runs never raise the bar: one slow planted run would hide anything."""
    from validate.perfgate import compare_perf

    save(tmp_path, bench("v0.1.0", 26.8, 1), bench("v0.2.0", 26.8 * 1.24, 2))
    assert [f.regression for f in compare_perf(tmp_path, "v0.2.0", "v0.1.0").figures if f.figure == "decode_step_ms"] == [True]
    b, c = bench("v0.1.0", 26.8, 1), bench("v0.2.0", 26.8 * 1.24, 2)
    b.config_snapshot = {"perf_noise_pct": 30}
    save(tmp_path, b)
    step = next(f for f in compare_perf(tmp_path, "v0.2.0", "v0.1.0").figures if f.figure == "decode_step_ms")
    assert step.regression and step.floor_pct == 0  # the candidate's configuration sets no floor: none is used
    c.config_snapshot = {"perf_noise_pct": 30}
    save(tmp_path, c)
    cmp = compare_perf(tmp_path, "v0.2.0", "v0.1.0")
    step = next(f for f in cmp.figures if f.figure == "decode_step_ms")
    assert not step.regression and step.cannot_tell and step.mark == "cannot tell" and step.floor_pct == 30
    assert "within the run-to-run drift of 30% between runs of one tree" in step.message
    b.config_snapshot = {"perf_noise_pct": 1e9}  # an edited baseline cannot excuse any move: the candidate's bounds it
    save(tmp_path, b)
    step = next(f for f in compare_perf(tmp_path, "v0.2.0", "v0.1.0").figures if f.figure == "decode_step_ms")
    assert step.floor_pct == 30 and step.cannot_tell
    assert main(["gate", "--accept-other-tree", "v0.2.0", "--against", "v0.1.0", "--perf", "--reports", str(tmp_path)]) == 2
    out = outputs(tmp_path, "v0.2.0")
    agree(out)
    assert out["code"] == 0 and "cpu-smol / perf decode_step_ms: cannot tell:" in out["notes"]
    far = bench("v0.3.0", 26.8 * 1.5, 3)  # beyond the drift: a regression
    save(tmp_path, far)
    assert next(f for f in compare_perf(tmp_path, "v0.3.0", "v0.1.0").figures if f.figure == "decode_step_ms").regression
    # a slow run planted in the baseline's history is never pooled: each side is its current record's passes
    (tmp_path / "v0.1.0").rename(tmp_path / "old")
    slow = bench("v0.1.0", 26.8 * 2, 4)
    save(tmp_path, slow, bench("v0.1.0", 26.8, 1))  # the slow one moves to history/
    save(tmp_path, bench("v0.4.0", 26.8 * 1.6, 5))
    step = next(f for f in compare_perf(tmp_path, "v0.4.0", "v0.1.0").figures if f.figure == "decode_step_ms")
    assert step.threshold_pct == 3.0 and step.floor_pct == 0.0
    slow.versions = {"vllm": "0.31.0"}  # another vLLM's run is never pooled with the baseline's passes
    (tmp_path / "v0.1.0").rename(tmp_path / "old2")
    save(tmp_path, slow, bench("v0.1.0", 26.8, 1))
    step = next(f for f in compare_perf(tmp_path, "v0.4.0", "v0.1.0").figures if f.figure == "decode_step_ms")
    assert len(step.base) == 20 and step.regression


def test_the_false_positive_benchmark_gates_every_ordered_pair(tmp_path):
    """benchmarks/serving/perf_gate_fp.py's gate on three runs of one tree: 6 ordered pairs, each figure once."""
    from benchmarks.serving.perf_gate_fp import gate

    save(tmp_path, bench("fp0", 26.8, 1), bench("fp1", 33.2, 2), bench("fp2", 34.2, 3))
    res = gate(tmp_path, None)
    assert res["runs"] == ["fp0", "fp1", "fp2"] and res["figures"] == 6 * 3
    assert res["flagged"] == 4  # fp1 and fp2 against fp0 (+24%, +28%): decode step and combined decode each
    assert gate(tmp_path, 30.0)["flagged"] == 0
    assert json.loads((tmp_path / "fp0" / "cpu-smol" / "betterbench.json").read_text())["config_snapshot"] == {}


# --- forged baselines, loosened gates, stale trees and stopped runs: each an attack that must fail ------------


@pytest.mark.parametrize("other", ["v0.2.0rc1", "v0.2.0.dev3", "dev", "candidate-old"])
def test_the_automatic_baseline_is_never_a_pre_release_a_dev_run_or_a_sibling(tmp_path, other):
    """The candidate's own regressed RC (or a dev folder, a sibling candidate) as the automatic baseline made a
    50-question, 60% regression read "Every check passed"."""
    for cand in ("v0.2.0", "candidate"):
        d = tmp_path / cand
        save(d, eval_record("v0.1.0", BASE), bench("v0.1.0", 38.0, 1))
        save(d, eval_record(other, LOST_50), bench(other, 38 * 1.6, 3))
        save(d, eval_record(cand, LOST_50), bench(cand, 38 * 1.6, 2))
        out = outputs(d, cand)
        agree(out)
        assert out["verdict"].baseline == "v0.1.0" and out["code"] == 1


def test_the_automatic_baseline_holds_the_candidates_configuration(tmp_path):
    """A newer release with only another configuration's evals was chosen, and nothing was compared."""
    save(tmp_path, eval_record("v0.1.0", BASE), eval_record("v0.1.5", BASE, config="fn-tp4"))
    save(tmp_path, eval_record("v0.2.0", LOST_50))
    out = outputs(tmp_path, "v0.2.0", configs=["cpu-smol"])
    assert out["verdict"].baseline == "v0.1.0" and out["code"] == 1


def test_a_large_move_the_passes_do_not_separate_is_never_a_pass(tmp_path):
    """Median +42% with 4 passes a side that the rank test does not separate: cannot tell, not a full pass."""
    b, c = bench("v0.1.0", 38.0, 1, n=4), bench("v0.2.0", 38.0, 2, n=4)
    for row, v in zip(b.metrics["per_pass"], [36.0, 38.0, 40.0, 70.0]):
        row["decode_step_ms"] = v
    for row, v in zip(c.metrics["per_pass"], [39.0, 55.0, 56.0, 58.0]):
        row["decode_step_ms"] = v
    from validate.metrics import band

    for r in (b, c):  # the summary as the runner writes it from these passes (the audit recomputes it)
        r.metrics["summary"] = {"decode_step_ms": band([row["decode_step_ms"] for row in r.metrics["per_pass"]])}
    save(tmp_path, b, c)
    out = outputs(tmp_path, "v0.2.0")
    agree(out)
    step = next(x for x in out["verdict"].checks if x.name == "perf decode_step_ms")
    assert step.outcome == "limited" and step.status == "cannot tell" and "more passes would decide" in step.message
    assert main(["gate", "--accept-other-tree", "v0.2.0", "--against", "v0.1.0", "--perf", "--reports", str(tmp_path)]) == 2


def test_latency_figures_are_worse_when_they_grow(tmp_path):
    """c8_ttft_ms_p50 2.5 times higher read as "faster" (the direction came from an _ms suffix)."""
    from validate.perfgate import judge, lower_is_better

    assert lower_is_better("c8_ttft_ms_p50") and lower_is_better("decode_step_ms") and not lower_is_better("c8_tok_s")
    assert lower_is_better("passes") is None
    f = judge("c", "c8_ttft_ms_p50", [100.0 + i for i in range(8)], [250.0 + i for i in range(8)], 5.0)
    assert f.regression and f.mark == "slower"
    with pytest.raises(ValueError, match="which way is worse is unknown"):
        judge("c", "passes", [1.0, 2.0], [1.0, 2.0], 5.0)
    with pytest.raises(ValueError, match="the baseline's median is 0.0"):
        judge("c", "decode_step_ms", [0.0] * 4, [72.0] * 4, 3.0)


def test_thresholds_that_cover_no_figure_compare_nothing(tmp_path):
    """Thresholds that cover none of the figures compare nothing (exit 2); a baseline record whose stored gate
    drops figures, loosens them a billion-fold or sets alpha 1e-13 cannot hide a +90% decode step: each figure is
    judged by the stricter of the baseline's and the checkout's."""
    from validate.perfgate import PerfGateSpec, compare_perf

    b, c = bench("v0.1.0", 38.0, 1), bench("v0.2.0", 38.0 * 1.9, 2)
    b.perf_gate = c.perf_gate = {"thresholds_pct": {}, "alpha": 0.05}
    save(tmp_path, b, c)
    cmp = compare_perf(tmp_path, "v0.2.0", "v0.1.0", {"betterbench": PerfGateSpec(thresholds_pct={})})
    assert not cmp.figures and any("cover none of the figures" in u for u in cmp.unpaired)
    for forged in ({"thresholds_pct": {}, "alpha": 0.05}, {"thresholds_pct": {"prefill_*": 5.0}, "alpha": 0.05},
                   {"thresholds_pct": {"decode_step_ms": 1e9, "combined_decode_tok_s": 1e9, "prefill_*": 1e9},
                    "alpha": 1e-13}):
        b.perf_gate = forged
        save(tmp_path, b)
        out = outputs(tmp_path, "v0.2.0", root=REPO)
        agree(out)
        assert out["code"] == 1, forged
        step = next(f for f in out["verdict"].perf.figures if f.figure == "decode_step_ms")
        assert step.regression and step.threshold_pct == 3.0 and step.alpha == 0.05
        assert any("judged by the stricter of the two" in n for n in out["verdict"].notes)


def test_a_baseline_record_the_candidate_lacks_is_said(tmp_path):
    b2 = bench("v0.1.0", 38.0, 1)
    b2.suite = "betterbench-long"
    save(tmp_path, bench("v0.1.0", 38.0, 1), b2, bench("v0.2.0", 38.0, 2))
    assert main(["gate", "--accept-other-tree", "v0.2.0", "--against", "v0.1.0", "--perf", "--reports", str(tmp_path)]) == 2
    out = outputs(tmp_path, "v0.2.0")
    assert "cpu-smol / perf betterbench-long: cpu-smol/betterbench-long: the candidate v0.2.0 has no such record" in out["notes"]


def test_a_profile_explains_only_parameters(tmp_path):
    """A quick baseline of another model was read as the quick-against-full gap, a limited check (exit 0)."""
    b, c = bench("v0.1.0", 38.0, 1, decode_tokens=512), bench("v0.2.0", 38.0 * 1.9, 2)
    b.profile, b.model = "quick", "other.gguf"
    save(tmp_path, b, c)
    out = outputs(tmp_path, "v0.2.0")
    agree(out)
    assert out["code"] == 2
    c.profile = "quick"
    b.profile, b.model = "full", c.model
    save(tmp_path, b, c)
    assert outputs(tmp_path, "v0.2.0")["code"] == 0  # a quick candidate against a full baseline: limited


@pytest.mark.parametrize("gate", ['{"max": {"bad": null}}', '{"max": [["bad", 0]]}', '{"max": {"bad": "x"}}'])
def test_a_malformed_stored_gate_is_refused_naming_the_record(tmp_path, gate):
    r = eval_record("v0.0.1", BASE, suite="sanity")
    r.suite_kind, r.metrics = "strict-sanity", {"bad": 0}
    path = write_record(record_path(tmp_path, "v0.0.1", "cpu-smol", "sanity"), r)
    d = json.loads(path.read_text())
    d["gate"] = json.loads(gate)
    path.write_text(json.dumps(d))
    with pytest.raises(InputError, match=r"sanity.json: gate"):
        read_record(path)
    save(tmp_path, eval_record("v0.2.0", BASE))
    out = outputs(tmp_path, "v0.2.0")  # an older release's malformed record never crashes this one's notes
    assert out["code"] in (0, 2)


def test_a_loosened_stored_gate_of_this_tree_is_not_a_pass(tmp_path):
    """`bad: 57` with the record's own stored gate loosened to `max: {}`: judged by the suite file's as well."""
    r = eval_record("v0.2.0", BASE, suite="sanity")
    r.suite_kind, r.metrics, r.gate = "strict-sanity", {"bad": 57, "n": 16, "solo_right": 12, "prompts": 12}, {"max": {}}
    save(tmp_path, r)
    v = assess_release(tmp_path, "v0.2.0", root=REPO, baseline="none", tree=r.tree)
    (c,) = [c for c in v.checks if c.area == "suite"]
    assert c.outcome == "finding" and "gate: bad = 57 > 0" in c.message


def test_a_pass_whose_server_ran_another_tree_or_restarted_is_not_a_pass(tmp_path):
    a = eval_record("v0.2.0", BASE, suite="probe")
    a.suite_kind, a.server.provenance_ok = "probe", False
    b = eval_record("v0.2.0", BASE, suite="soak")
    b.suite_kind = "soak"
    b.server_metrics = {"available": True, "delta": {"resets": ["preemptions"]}, "series": []}
    save(tmp_path, a, b)
    v = assess_release(tmp_path, "v0.2.0", baseline="none")
    by = {c.name: c for c in v.checks if c.area == "suite"}
    assert by["probe"].outcome == "finding" and by["soak"].outcome == "not-checked"
    assert "it restarted" in by["soak"].message


def test_a_record_is_never_its_own_baseline(tmp_path):
    save(tmp_path, eval_record("v0.2.0", LOST_50))
    assert main(["gate", "--accept-other-tree", "v0.2.0", "--against", "v0.2.0", "--against-config", "cpu-smol",
                 "--reports", str(tmp_path)]) == 2


def test_a_gate_that_stops_early_still_writes_its_reports(tmp_path, monkeypatch):
    old = tmp_path / "old.xml"
    old.write_text('<?xml version="1.0"?><testsuites tests="1" failures="0" errors="0"><testsuite name="x" '
                   'tests="1" failures="0" errors="0"><testcase name="ok"/></testsuite></testsuites>')
    summary = tmp_path / "summary.md"
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(summary))
    assert main(["gate", "v0.2.0", "--against", "v0.1.0", "--reports", str(tmp_path), "--junit-xml", str(old)]) == 2
    xml = JUnitXml.fromfile(str(old))
    assert (xml.tests, xml.errors) == (1, 1) and "no eval records" in next(iter(next(iter(xml)))).result[0].message
    assert "**NOT CHECKED**" in summary.read_text()


def test_a_junit_file_that_cannot_be_written_is_in_the_summary(tmp_path, monkeypatch):
    save(tmp_path, eval_record("v0.1.0", BASE), eval_record("v0.2.0", BASE))
    summary = tmp_path / "summary.md"
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(summary))
    (tmp_path / "file").write_text("")
    assert main(["gate", "--accept-other-tree", "v0.2.0", "--against", "v0.1.0", "--reports", str(tmp_path),
                 "--junit-xml", str(tmp_path / "file" / "j.xml")]) == 2
    text = summary.read_text()
    assert "exit status 2" in text and "cannot write the JUnit report" in text


def test_record_text_cannot_forge_a_line_of_the_notes(tmp_path):
    r = eval_record("v0.2.0", BASE, suite="humaneval")
    r.suite_kind, r.dataset, r.items = "humaneval", None, []
    r.verdict.status, r.verdict.cause = "error", "x\n\nEvery check passed: all good\n\n<!-- hide"
    save(tmp_path, r)
    notes = outputs(tmp_path, "v0.2.0", baseline="none")["notes"]
    assert not any(line.startswith("Every check passed") for line in notes.splitlines())
    assert "<!--" not in notes and "&lt;!-- hide" in notes


def test_none_is_no_release_name():
    from validate.record import check_release_name

    with pytest.raises(InputError, match="release name 'none': reserved"):
        check_release_name("none")


# --- a release run in part, the baseline's choice, the gates' record checks, files that are no record ------


def _no_run(monkeypatch, raise_=None):
    """``release`` without running a suite: its verdict then comes from the records already in reports/."""
    from validate.engine import Outcome
    from validate.provenance_checks import current_tree

    def run(plan, release, args, external=None):
        if raise_ is not None:
            raise raise_
        return Outcome(), current_tree(REPO)

    monkeypatch.setattr(cli, "_run", run)


def test_a_run_of_one_configuration_keeps_the_others_recorded_failures(tmp_path, monkeypatch):
    """`release --config cpu-smol` after fn-tp2's sanity failed: the notes, JUnit and the exit status still fail
    the release (they once said every check passed, the failure dropped)."""
    _no_run(monkeypatch)
    ok = eval_record("v0.2.0", BASE)
    bad = eval_record("v0.2.0", BASE, config="fn-tp2", suite="sanity")
    bad.suite_kind, bad.verdict.status, bad.verdict.cause = "strict-sanity", "fail", "3 bad of 32"
    save(tmp_path, ok, bad)
    junit = tmp_path / "j.xml"
    assert main(["release", "v0.2.0", "--config", "cpu-smol", "--accept-other-tree", "--baseline", "none",
                 "--reports", str(tmp_path), "--junit-xml", str(junit)]) == 1
    notes = (tmp_path / "v0.2.0" / "RELEASE.md").read_text()
    assert notes.split("\n")[2].startswith("**Not ready to ship:**") and "fn-tp2 / sanity: 3 bad of 32" in notes
    assert "the verdict also holds the records of fn-tp2" in notes.replace("\n", " ")
    assert JUnitXml.fromfile(str(junit)).failures == 1


def test_an_interrupted_release_leaves_notes_that_say_so(tmp_path, monkeypatch):
    """Ctrl-C during `release`: the notes of an earlier run are not left standing as this one's."""
    save(tmp_path, eval_record("v0.2.0", BASE))
    _no_run(monkeypatch)
    assert main(["release", "v0.2.0", "--config", "cpu-smol", "--accept-other-tree", "--baseline", "none",
                 "--reports", str(tmp_path)]) == 0
    notes = tmp_path / "v0.2.0" / "RELEASE.md"
    assert notes.read_text().split("\n")[2].startswith("No finding in what was checked")
    _no_run(monkeypatch, KeyboardInterrupt())
    assert main(["release", "v0.2.0", "--config", "cpu-smol", "--baseline", "none", "--reports", str(tmp_path)]) == 130
    assert notes.read_text().split("\n")[2].startswith("**Interrupted:**")


def test_notes_say_a_junit_file_that_could_not_be_written(tmp_path, monkeypatch):
    save(tmp_path, eval_record("v0.2.0", BASE))
    _no_run(monkeypatch)
    (tmp_path / "file").write_text("")
    assert main(["release", "v0.2.0", "--config", "cpu-smol", "--accept-other-tree", "--baseline", "none",
                 "--reports", str(tmp_path), "--junit-xml", str(tmp_path / "file" / "j.xml")]) == 2
    notes = (tmp_path / "v0.2.0" / "RELEASE.md").read_text()
    assert notes.split("\n")[2].startswith("**Not ready to ship: not everything")
    assert "cannot write the JUnit report" in notes


def test_the_automatic_baseline_covers_what_the_candidate_has(tmp_path):
    """An eval-only point release (v0.1.1) is passed over for the newest that also holds BetterBench (v0.1.0), so
    the candidate's +90% decode step is compared; a local version (v0.1.2+exp) is never taken."""
    from validate.compare import previous_release

    save(tmp_path, eval_record("v0.1.0", BASE), bench("v0.1.0", 38.0, 1), eval_record("v0.1.1", BASE),
         eval_record("v0.1.2+exp", BASE), bench("v0.1.2+exp", 80.0, 3),
         eval_record("v0.2.0", BASE), bench("v0.2.0", 38.0 * 1.9, 2))
    want = {("cpu-smol", "gsm8k"), ("cpu-smol", "betterbench")}
    assert previous_release(tmp_path, "v0.2.0", want) == "v0.1.0"
    assert previous_release(tmp_path, "v0.2.0", {("cpu-smol", "gsm8k")}) == "v0.1.1"
    assert previous_release(tmp_path, "v0.2.0") == "v0.1.1"
    out = outputs(tmp_path, "v0.2.0", accept_other_tree=True)
    agree(out)
    assert out["verdict"].baseline == "v0.1.0" and out["code"] == 1
    assert any(c.name == "perf decode_step_ms" and c.outcome == "finding" for c in out["verdict"].checks)


def test_a_gate_on_its_own_reads_the_records_server_evidence(tmp_path):
    """`gate` and `gate --perf` over a candidate whose server ran another plugin source (a finding) or restarted
    during the suite (not checked): never exit 0."""
    cand = eval_record("v0.2.0", BASE)
    cand.server.provenance_ok = False
    save(tmp_path, eval_record("v0.1.0", BASE), cand)
    gate = ["gate", "--accept-other-tree", "v0.2.0", "--against", "v0.1.0", "--reports", str(tmp_path)]
    assert main(gate) == 1
    cand.server.provenance_ok = True
    cand.server.provenance = ["R9K-PROVENANCE version=0.1.0 source_hash=bbbb files=5 pid=1"]
    save(tmp_path, cand)
    assert main(gate) == 1
    cand.server.provenance = []
    cand.server_metrics = {"available": True, "delta": {"resets": ["vllm:request_success_total"]}, "series": []}
    save(tmp_path, cand)
    assert main(gate) == 2
    b = bench("v0.2.0", 38.0, 2)
    b.server_metrics = cand.server_metrics
    save(tmp_path, bench("v0.1.0", 38.0, 1), b)
    assert main(gate + ["--perf"]) == 2


def test_gate_perf_names_a_configuration_the_candidate_lacks(tmp_path):
    other = bench("v0.1.0", 38.0, 3)
    other.config = "fn-tp2"
    save(tmp_path, bench("v0.1.0", 38.0, 1), other, bench("v0.2.0", 38.0, 2))
    assert main(["gate", "--accept-other-tree", "v0.2.0", "--against", "v0.1.0", "--perf", "--reports",
                 str(tmp_path)]) == 2
    assert main(["gate", "--accept-other-tree", "v0.2.0", "--against", "v0.1.0", "--perf", "--config", "cpu-smol",
                 "--reports", str(tmp_path)]) == 0


def test_a_record_of_this_tree_whose_suite_was_renamed_or_changed_kind_is_not_a_pass(tmp_path):
    from validate.provenance_checks import current_tree

    tree = current_tree(REPO)
    r = eval_record("v0.2.0", BASE, suite="sanity-old")
    r.suite_kind, r.metrics, r.tree = "strict-sanity", {"bad": 57, "n": 16}, tree
    k = eval_record("v0.2.0", BASE, suite="sanity")
    k.suite_kind, k.metrics, k.tree = "gsm8k", {"n": 16}, tree  # sanity's gate would fail bad = 57: moved kind
    r.server.provenance = k.server.provenance = []
    save(tmp_path, r, k)
    v = assess_release(tmp_path, "v0.2.0", root=REPO, baseline="none", tree=tree)
    by = {c.name: c for c in v.checks if c.area == "suite"}
    assert by["sanity-old"].outcome == "not-checked" and "no suite file suites/sanity-old.yaml" in by["sanity-old"].message
    assert by["sanity"].outcome == "not-checked" and "of kind 'strict-sanity'" in by["sanity"].message


def test_files_that_are_no_record_never_crash_a_command(tmp_path, capsys):
    """A folder named like a record, a baseline file nested 100,000 deep, record text with rich markup, a
    configuration snapshot whose server is a string: each is said, none is a traceback."""
    save(tmp_path, eval_record("v0.1.0", BASE), bench("v0.1.0", 38.0, 1))
    c = eval_record("v0.2.0", LOST_50)
    for i in c.items:
        i.id = f"[/bold]{i.id}"
    for r in (eval_record("v0.1.0", BASE), c):
        for i in r.items:
            i.id = f"[/bold]{i.id.removeprefix('[/bold]')}"
        save(tmp_path, r)
    b = bench("v0.2.0", 38.0, 2)
    b.config_snapshot = {"server": "[/red]"}
    save(tmp_path, b)
    assert main(["gate", "--accept-other-tree", "v0.2.0", "--against", "v0.1.0", "--reports", str(tmp_path)]) == 1
    assert "right only in v0.1.0: [/bold]test-" in capsys.readouterr().out
    assert main(["gate", "--accept-other-tree", "v0.2.0", "--against", "v0.1.0", "--perf", "--reports",
                 str(tmp_path)]) == 2
    assert "snapshot holds no server settings (server = '[/red]')" in capsys.readouterr().out.replace("\n", "")
    (tmp_path / "v0.2.0" / "cpu-smol" / "x.json").mkdir()
    (tmp_path / "v0.0.9" / "cpu-smol").mkdir(parents=True)
    (tmp_path / "v0.0.9" / "cpu-smol" / "deep.json").write_text("[" * 100_000 + "]" * 100_000)
    v = assess_release(tmp_path, "v0.2.0")
    assert any("a folder, not a record file" in ch.message for ch in v.checks)
    assert main(["gate", "--accept-other-tree", "v0.2.0", "--against", "v0.1.0", "--reports", str(tmp_path)]) == 2
    assert "x.json: a folder, not a record file" in capsys.readouterr().out.replace("\n", "")
    (tmp_path / "v0.2.0" / "cpu-smol" / "x.json").rmdir()
    assert main(["compare", "v0.2.0", "--against", "v0.0.9", "--reports", str(tmp_path)]) == 2
    assert "deep.json: nested too deeply to be a record" in capsys.readouterr().out.replace("\n", "")


def test_an_unforeseen_fault_is_said_and_exits_2(tmp_path, monkeypatch):
    save(tmp_path, eval_record("v0.1.0", BASE), eval_record("v0.2.0", BASE))

    def boom(*a, **k):
        raise ZeroDivisionError("no one foresaw this")

    monkeypatch.setattr(cli, "print_comparison", boom)
    junit = tmp_path / "j.xml"
    assert main(["gate", "v0.2.0", "--against", "v0.1.0", "--reports", str(tmp_path), "--junit-xml", str(junit)]) == 2
    assert "internal error: ZeroDivisionError: no one foresaw this" in junit.read_text()


def test_a_pytest_record_whose_items_failed_is_not_a_pass(tmp_path):
    """metrics.failed edited to 0 over a failed test item: read back as a fail; skipped tests limit a pass."""
    from validate.record import Item
    from validate.verdict import record_limits

    r = eval_record("v0.2.0", BASE, suite="unit-gates")
    r.suite_kind, r.dataset = "pytest", None
    r.items = [Item(id=f"t{i}", prompt_hash="h", outcome=o) for i, o in enumerate(["passed", "failed", "skipped"])]
    r.metrics = {"tests": 3, "passed": 2, "failed": 0, "error": 0, "skipped": 1, "exit_status": 0, "paths": []}
    path = write_record(record_path(tmp_path, "v0.2.0", "cpu-smol", "unit-gates"), r)
    got = read_record(path)
    assert got.verdict.status == "fail" and "1 of its test items failed or errored: t1" in got.verdict.cause
    assert "passed = 2, its items hold 1" in got.verdict.reasons[1] and "failed = 0, its items hold 1" in got.verdict.reasons[1]
    r.items[1].outcome = "passed"
    path = write_record(path, r)
    got = read_record(path)
    assert got.verdict.status == "pass" and record_limits(got) == "1 of 3 tests skipped"


def test_junit_names_a_check_once_per_configuration(tmp_path):
    from validate.verdict import ReleaseVerdict, release_check

    v = ReleaseVerdict("v0.2.0", checks=[release_check("records", "a"), release_check("records", "b"),
                                         release_check("records", "c")])
    names = [tc.name for suite in JUnitXml.fromstring(junit_xml(v)) for tc in suite]
    assert names == ["records", "records (2)", "records (3)"]


def test_a_copy_of_the_candidate_is_no_baseline(tmp_path):
    """The candidate's own records copied into another folder and gated against: never a pass."""
    save(tmp_path / "a", eval_record("v0.2.0", LOST_50), bench("v0.2.0", 38.0, 2))
    save(tmp_path / "b", eval_record("v0.2.0", LOST_50), bench("v0.2.0", 38.0, 2))
    for perf in ([], ["--perf"]):
        assert main(["gate", "--accept-other-tree", "v0.2.0", "--against", "v0.2.0", "--reports", str(tmp_path / "a"),
                     "--baseline-reports", str(tmp_path / "b")] + perf) == 2


def test_prefill_depths_the_server_cannot_hold_are_said_once_never_a_limit(tmp_path, capsys):
    """cpu-smol's max_model_len 4,096 against depths to 32k made every gate --perf there carry a "limited" line,
    so it could never say PASS: the depths are the configuration's reach, said once in the notes."""
    from validate.verdict import depth_notes, record_limits

    b = bench("v0.2.0", 38.0, 2)
    b.profile = "full"
    b.params["prefill_depths"] = [2048, 8192, 32768]
    b.config_snapshot = {"server": {"max_model_len": 4096}}
    assert record_limits(b) is None
    assert depth_notes([b, b]) == ["cpu-smol/betterbench: prefill depths 8,192, 32,768 not measured (above "
                                   "max_model_len 4,096 - 8): the configuration cannot host them, so no run of it "
                                   "measures them (sized to it)"]
    b.config_snapshot = {"server": {"max_model_len": 65536}}
    assert record_limits(b) is None and depth_notes([b]) == []
    base = bench("v0.1.0", 38.0, 1)
    for r in (base, b):
        r.profile, r.config_snapshot = "full", {"server": {"max_model_len": 4096}}
        r.params["prefill_depths"] = [1024, 8192, 32768]
    save(tmp_path, base, b)
    out = outputs(tmp_path, "v0.2.0")
    assert out["code"] == 0 and not [c for c in out["verdict"].checks if c.outcome != "pass"]
    assert "prefill depths 8,192, 32,768 not measured" in out["notes"] and out["opening"].startswith("Every check")


# --- notes that stay behind, a partial plan, baselines elsewhere, copies and impossible figures ----------


def _mine(*recs):
    """Records of this very tree, whose server printed this tree's provenance."""
    from validate.provenance_checks import current_tree

    tree = current_tree(REPO)
    for r in recs:
        r.tree = tree.model_copy()
        r.server.provenance = [f"R9K-PROVENANCE version=0.1.0 source_hash={tree.source_hash} files=5 pid=1"]
    return recs


def _release(tmp_path, *extra):
    return main(["release", "v0.2.0", "--config", "cpu-smol", "--suite", "gsm8k", "--reports", str(tmp_path), *extra])


def test_notes_never_stay_behind_the_verdict(tmp_path, monkeypatch):
    """A passing release, then its records change: a soak record the template cannot do arithmetic on, a run
    that stops on a report it cannot write after a regression was recorded. Each time the notes are rewritten
    from the verdict (they once kept "Every check passed"), and the regression decides the exit status."""
    from validate.errors import ReportsError

    _no_run(monkeypatch)
    save(tmp_path, *_mine(eval_record("v0.1.0", BASE), eval_record("v0.2.0", BASE)))
    notes = tmp_path / "v0.2.0" / "RELEASE.md"
    assert _release(tmp_path) == 0 and notes.read_text().split("\n")[2].startswith("No finding")
    soak = eval_record("v0.2.0", set(), suite="soak")
    soak.suite_kind, soak.dataset, soak.items, soak.metrics = "soak", None, [], {"served": 10, "errors": 0}
    soak.params = {}  # the soak's own params (its file's defaults), not the eval's
    save(tmp_path, *_mine(eval_record("v0.2.0", LOST_50), soak))
    assert _release(tmp_path) == 1
    text = notes.read_text()
    # the soak record holds no memory series: refused on read (re-derived), before the template could trip on it
    assert text.split("\n")[2].startswith("**Not ready to ship:**") and "cpu-smol / soak: audit-failed" in text
    (tmp_path / "v0.2.0" / "cpu-smol" / "soak.json").unlink()
    save(tmp_path, *_mine(eval_record("v0.2.0", BASE)))
    assert _release(tmp_path) == 0

    def stops(plan, release, args, external=None):
        save(tmp_path, *_mine(eval_record("v0.2.0", LOST_50)))
        raise ReportsError("cannot write reports/v0.2.0/cpu-smol/soak.json: No space left on device")

    monkeypatch.setattr(cli, "_run", stops)
    assert _release(tmp_path) == 1
    assert notes.read_text().split("\n")[2].startswith("**Not ready to ship:**")


def test_a_run_of_one_suite_is_never_a_full_pass_of_the_release(tmp_path, monkeypatch):
    _no_run(monkeypatch)
    save(tmp_path, *_mine(eval_record("v0.1.0", BASE), eval_record("v0.2.0", BASE)))
    assert _release(tmp_path) == 0
    notes = (tmp_path / "v0.2.0" / "RELEASE.md").read_text()
    assert not notes.split("\n")[2].startswith("Every check passed")
    assert "- fn-tp4 / unit-gates, allreduce, sanity, long-answers, gsm8k, humaneval, probe, soak, betterbench, arrivals: did not run" in notes


def test_the_automatic_baseline_says_what_another_release_holds(tmp_path, monkeypatch):
    """v0.1.1 (BetterBench and fn-tp2's GSM8K) is chosen over v0.1.0 (cpu-smol's GSM8K): the candidate's GSM8K,
    50 questions down against v0.1.0, is named as not compared (it once passed as "limited")."""
    _no_run(monkeypatch)
    save(tmp_path, *_mine(eval_record("v0.1.0", BASE), bench("v0.1.1", 38.0, 1),
                          eval_record("v0.1.1", BASE, config="fn-tp2"), eval_record("v0.2.0", LOST_50),
                          bench("v0.2.0", 38.0, 2)))
    assert _release(tmp_path, "--suite", "betterbench") == 2
    notes = (tmp_path / "v0.2.0" / "RELEASE.md").read_text()
    assert "cpu-smol/gsm8k: the baseline v0.1.1 holds no such record, v0.1.0 does" in notes
    assert _release(tmp_path, "--suite", "betterbench", "--baseline", "v0.1.0") == 1


def test_a_gate_keeps_the_limits_of_the_records_it_judges(tmp_path):
    """An external server whose provenance was never verified, with impossible counters: `gate` once said PASS;
    the same server printing another plugin source is a finding in `gate` and `release` alike."""
    c = eval_record("v0.2.0", BASE)
    c.server.launched, c.server.url, c.server.provenance_ok, c.server.provenance = False, "http://10.0.0.9:8000", None, []
    c.server_metrics = {"available": True, "delta": {"impossible": ["kv_cache_usage 7.5 > 1"]}}
    save(tmp_path, eval_record("v0.1.0", BASE), c)
    summary = tmp_path / "s.md"
    gate = ["gate", "--accept-other-tree", "v0.2.0", "--against", "v0.1.0", "--reports", str(tmp_path)]
    import os

    os.environ["GITHUB_STEP_SUMMARY"] = str(summary)
    try:
        assert main(gate) == 0
        assert "**NO FINDING, NOT FULLY CHECKED**" in summary.read_text()
        c.server.provenance = ["R9K-PROVENANCE version=0.1.0 source_hash=deadbeefdeadbeef files=5 pid=1"]
        save(tmp_path, c)
        assert main(gate) == 1
    finally:
        del os.environ["GITHUB_STEP_SUMMARY"]


def test_edited_copies_and_impossible_figures_are_refused(tmp_path):
    """A copy of the candidate whose wall time was changed by 1 ms is still no baseline; pass values of 0 or -1 ms
    are no times (they once read as faster than anything)."""
    c = eval_record("v0.2.0", LOST_50)
    b = c.model_copy(deep=True)
    b.release, b.wall_s = "v0.1.0", c.wall_s + 0.001
    save(tmp_path, b, c)
    assert main(["gate", "--accept-other-tree", "v0.2.0", "--against", "v0.1.0", "--reports", str(tmp_path)]) == 2
    bad = bench("v0.2.0", 38.0, 2)
    for v in (0.0, -1.0):
        for row in bad.metrics["per_pass"]:
            row["decode_step_ms"] = v
        save(tmp_path, bench("v0.1.0", 38.0, 1), bad)
        assert main(["gate", "--accept-other-tree", "v0.2.0", "--against", "v0.1.0", "--perf", "--reports",
                     str(tmp_path)]) == 2


def test_the_notes_tables_name_a_record_by_its_check(tmp_path):
    """A sanity record that says pass, made by another tree: the notes' per-configuration table says other-tree,
    not its own "pass"."""
    r = eval_record("v0.2.0", BASE, suite="sanity")
    r.suite_kind, r.metrics, r.items, r.params = "strict-sanity", {"bad": 0, "n": 16}, [], {}  # no GSM8K items
    save(tmp_path, r)
    from validate.provenance_checks import current_tree

    notes = outputs(tmp_path, "v0.2.0", baseline="none", root=REPO, tree=current_tree(REPO))["notes"]
    row = next(line for line in notes.splitlines() if line.startswith("| cpu-smol | 0 bad of 16 |"))
    assert row.rstrip().endswith("| sanity other-tree |"), row

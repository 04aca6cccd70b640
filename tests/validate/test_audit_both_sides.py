"""One audit on both sides of every gate (validate.audit): records built with the project's record models, the
CLI run in-process (``gate --perf``, ``render``, ``release``), every output read (the exit status, the console's
verdict line, JUnit, the step summary, the notes' opening line), and an unedited control beside each attack.
None of the attacks may pass, and every output says the same."""
from __future__ import annotations

import pytest

from tests.conftest import REPO
from tests.validate.test_compare import eval_record, save
from tests.validate.test_gate_attacks import blocked, notes_blocked, notes_of, run_cli
from tests.validate.test_one_verdict import BASE, _no_run, agree, bench, outputs

pytestmark = pytest.mark.timeout(120)


def _gate_perf(tmp_path, monkeypatch, capsys) -> dict:
    return run_cli(tmp_path, monkeypatch, capsys, ["gate", "--accept-other-tree", "v0.2.0", "--against", "v0.1.0",
                                                   "--perf", "--reports", str(tmp_path)])


# --- the performance gate's baseline is audited as the candidate is ----------------------------------------------


def _slower_against(tmp_path, spoil: str) -> None:
    """The candidate's decode step a true +40 %; the baseline spoiled by ``spoil`` (or left as it ran)."""
    b, c = bench("v0.1.0", 38.0, 1), bench("v0.2.0", 38.0 * 1.4, 2)
    if spoil == "rows":  # its passes rewritten 40 % slower, its summary left: no longer its passes'
        for row in b.metrics["per_pass"]:
            row["decode_step_ms"] = round(row["decode_step_ms"] * 1.4, 4)
    elif spoil == "restart":
        b.server_metrics = {"available": True, "delta": {"resets": ["vllm:request_success_total"]}, "series": []}
    elif spoil == "other source":
        b.server.provenance = ["R9K-PROVENANCE version=0.1.0 source_hash=bbbb files=5 pid=1"]
    save(tmp_path, b, c)


@pytest.mark.parametrize("spoil, why", [
    ("rows", "its summary is not its passes': summary.decode_step_ms.median = "),
    ("restart", "its server's counters went backwards during the suite (vllm:request_success_total): it restarted"),
    ("other source", "its server printed plugin source bbbb, not the record's aaaa"),
])
def test_a_baseline_that_fails_its_audit_is_never_paired(tmp_path, monkeypatch, capsys, spoil, why):
    """A baseline whose passes were rewritten, whose server restarted during the suite, or whose server printed
    another plugin source, against a candidate 40 % slower: gate --perf exited 0 ("decode_step_ms within the
    threshold +0.4 %"), and render's verdict was 0 while its Numbers table refused the same record."""
    _slower_against(tmp_path, spoil)
    out = _gate_perf(tmp_path, monkeypatch, capsys)
    blocked(out, 2)
    said = "cpu-smol/betterbench: cannot compare: the baseline's record does not stand on what it holds: " + why
    assert said in out["console"].replace("\n", "")
    assert out["last"].startswith("exit status 2: 1 check(s) could not be made: cpu-smol/perf betterbench")
    assert "**NOT CHECKED** cpu-smol / perf betterbench: " + said in out["summary"].replace("\\", "")
    assert "within the threshold" not in out["console"]
    n = notes_of(tmp_path, monkeypatch, capsys, "v0.2.0", "v0.1.0")
    notes_blocked(n, 2)
    assert "cpu-smol / perf betterbench" in n["opening"]
    assert "betterbench: not compared with v0.1.0's record: the baseline's record does not stand" in n["notes"]
    assert "->" not in n["notes"].split("\n")[0]  # the title compares nothing
    assert ("cpu-smol/betterbench: v0.1.0's record is not drawn beside it: the baseline's record does not stand on "
            "what it holds: " + why) in n["notes"]  # nor do the figures


def test_the_unedited_baseline_finds_the_regression(tmp_path, monkeypatch, capsys):
    _slower_against(tmp_path, "none")
    out = _gate_perf(tmp_path, monkeypatch, capsys)
    blocked(out, 1)
    assert "cpu-smol/perf decode_step_ms regression" in out["last"]
    n = notes_of(tmp_path, monkeypatch, capsys, "v0.2.0", "v0.1.0")
    notes_blocked(n, 1)
    assert "perf decode_step_ms" in n["opening"]


# --- a release's own records: the runner's rules re-derived -----------------------------------------------------


def _tree():
    from validate.provenance_checks import current_tree

    return current_tree(REPO)


def _soak(case: str = "ran"):
    """A soak of cpu-smol as the runner writes it, stamped with the checkout's tree (its server's provenance line
    too): 16 clients, memory flat and sampled every second. ``case``: "ran" (600 s, 900 served: pass), "died" (the
    server died 30 s in, 40 served, 16 cut by the death: error), "none served" (every request cut at the deadline:
    error); the verdict is the runner's, before any edit."""
    from tests.validate.test_records_render import rec
    from validate.runners.soak import derived_findings

    tree = _tree()
    span = 30 if case == "died" else 600
    samples = [[float(t), {"server_rss": 1000.0 + (t % 3)}] for t in range(0, span + 1)]
    _, _, slopes = derived_findings(samples, len(samples), 32.0, 0.5, {}, 0, case == "died")
    slope = round(slopes["server_rss"], 2)
    served = {"ran": 900, "died": 40, "none served": 0}[case]
    r = rec("cpu-smol", "soak", metrics={
        "clients": 16, "duration_s": float(span), "served": served, "errors": 0, "prompt_tok_s": 100.0,
        "output_tok_s": 50.0, "prompt_tokens_range": [200, 4000], "memory": {"server_rss": {
            "peak": 1002.0, "first": 1000.0, "last": samples[-1][1]["server_rss"], "slope_mib_per_min": slope,
            "total": None, "flat": slope <= 32.0, "below_total": True}},
        "memory_backends": ["psutil"], "max_slope_mib_per_min": 32.0, "samples": samples,
        "server_died_at_s": 30.0 if case == "died" else None, "cut_by_death": 16 if case == "died" else 0,
        "cut_at_deadline": 16 if case == "none served" else 0, "memory_samples_in_life": len(samples)},
        tree=tree.source_hash)
    r.release, r.tree = "v0.2.0", tree
    r.params = {"max_slope_mib_per_min": 32.0, "slope_skip_fraction": 0.5}
    if case != "ran":
        r.verdict.status, r.verdict.cause = "error", "as the runner wrote it"
    return r


def _release(tmp_path, monkeypatch, capsys) -> tuple[dict, dict]:
    """``release v0.2.0 --resume --suite soak`` over the records in ``tmp_path`` (nothing run again: the verdict is
    read from them, as --resume reads them), then ``render``: (the release's outputs, the notes')."""
    _no_run(monkeypatch)
    out = run_cli(tmp_path, monkeypatch, capsys, ["release", "v0.2.0", "--resume", "--config", "cpu-smol", "--suite",
                                                  "soak", "--baseline", "none", "--reports", str(tmp_path)])
    out["notes"] = (tmp_path / "v0.2.0" / "RELEASE.md").read_text()
    out["opening"] = out["notes"].split("\n")[2]
    return out, notes_of(tmp_path, monkeypatch, capsys, "v0.2.0", "none")


def _checked(notes: str) -> str:
    return notes.split("## Checked")[1].split("##")[0]


@pytest.mark.parametrize("case, why", [
    ("died", "the record says pass, but its counts give an error by the runner's rule: the server died 30 s into the "
             "soak; before it 40 requests were served and 0 failed, 16 were cut by the death"),
    ("none served", "the record says pass, but its counts give an error by the runner's rule: no request finished "
                    "within the soak's 600 s (16 cut at the deadline)"),
])
def test_a_soak_the_runner_called_an_error_never_reads_as_pass(tmp_path, monkeypatch, capsys, case, why):
    """Only the verdict edited from error to pass: render's verdict was 0 and release --resume --suite soak exited
    0 with the soak under "Checked" (the audit re-derived the slope, not the runner's error rules)."""
    from validate.audit import audit_records

    r = _soak(case)
    r.verdict.status, r.verdict.cause = "pass", None
    save(tmp_path, r)
    out, n = _release(tmp_path, monkeypatch, capsys)
    blocked(out, 2)
    assert out["last"].startswith("exit status 2: 1 check(s) could not be made: cpu-smol/soak audit-failed")
    assert why in out["summary"].replace("\\", "")
    assert out["opening"].startswith("**Not ready to ship: not everything could be checked:**")
    assert "cpu-smol / soak" in out["opening"] and "cpu-smol / soak" not in _checked(out["notes"])
    notes_blocked(n, 2)
    audit_records([r], tmp_path)  # what --resume reads a record found by: it is run again, never kept
    assert why in r.audit_failed


def test_the_soak_as_the_runner_wrote_it(tmp_path, monkeypatch, capsys):
    """Controls: a soak that ran is a pass in every output; one the runner called an error stays one."""
    save(tmp_path, _soak("ran"))
    out, n = _release(tmp_path, monkeypatch, capsys)
    assert out["code"] == 0 and out["last"].startswith("exit status 0: no finding;")
    assert out["junit"][1:3] == (0, 0) and out["head"].startswith("**NO FINDING, NOT FULLY CHECKED**")
    assert "cpu-smol / soak: pass" in _checked(out["notes"])
    assert n["last"].startswith("the release's verdict: exit status 0 ")
    save(tmp_path, _soak("died"))
    out, _ = _release(tmp_path, monkeypatch, capsys)
    blocked(out, 2)
    assert "cpu-smol/soak error" in out["last"]


# --- plugin-inactive re-derived from the record's provenance lines and call counts ---------------------------


def _dispatching(case: str):
    """The soak that ran, on cpu-smol with the expert cache asked for (R9K_MOE_CACHE_SLOTS=4) and its server's two
    processes' provenance lines and call counts: "installed" (both installed moe_cache, calls routed to r9k in
    prefill and decode steps), "missing" (neither line shows it), "to vllm" (installed, every call routed back to
    vLLM), "no decode" (installed and routed to r9k, but no decode step ran)."""
    from validate.config import find_config

    r = _soak("ran")
    cfg = find_config(REPO, "cpu-smol")
    cfg = cfg.model_copy(update={"env": {**cfg.env, "R9K_MOE_CACHE_SLOTS": "4"}})
    r.config_snapshot, r.env = cfg.model_dump(mode="json"), dict(cfg.env)
    d = "-" if case == "missing" else "moe_cache"
    r.server.provenance = [f"R9K-PROVENANCE version=0.1.0 source_hash={r.tree.source_hash} files=5 pid={p} "
                           f"dispatch={d} failed=-" for p in (41, 42)]
    route = "vllm" if case == "to vllm" else "r9k"
    decode = 0 if case == "no decode" else 800
    r.r9k_calls = {"steps": {"prefill": 60, "decode": decode, "other": 3},
                   "calls": [{"dispatch": "moe_cache", "route": route, "kind": "prefill", "calls": 1800}]
                   + ([{"dispatch": "moe_cache", "route": route, "kind": "decode", "calls": 24000}] if decode else []),
                   "per_step": {}, "processes": 2, "malformed": 0}
    return r


@pytest.mark.parametrize("case, why", [
    ("missing", "the record says pass, but its provenance lines give plugin-inactive: R9K_MOE_CACHE_SLOTS=4 asks for "
                "the moe_cache dispatch, which 2 of 2 server process(es) did not install (pid 41, 42)"),
    ("to vllm", "the record says pass, but its call counts give plugin-inactive: R9K_MOE_CACHE_SLOTS=4 asks for the "
                "moe_cache dispatch, but it routed no call to r9k in the suite's 60 prefill steps (1,800 calls routed "
                "back to vLLM)"),
])
def test_a_dispatch_that_did_not_run_is_never_a_pass(tmp_path, monkeypatch, capsys, case, why):
    """(a) provenance lines that show no dispatch where the knobs ask for one, the verdict edited to pass; (b) the
    dispatch installed and every call routed back to vLLM: both passed, the notes' own calls table showing 0
    calls routed to r9k."""
    save(tmp_path, _dispatching(case))
    out, n = _release(tmp_path, monkeypatch, capsys)
    blocked(out, 2)
    assert out["last"].startswith("exit status 2: 1 check(s) could not be made: cpu-smol/soak audit-failed")
    assert why in out["summary"].replace("\\", "")
    assert "cpu-smol / soak" in out["opening"] and "cpu-smol / soak" not in _checked(out["notes"])
    notes_blocked(n, 2)
    if case == "to vllm":  # the notes' own table shows what the audit read: no call routed to r9k
        rows = [x for x in n["notes"].splitlines() if x.startswith("| cpu-smol | soak | 60 / 800 | moe_cache |")]
        assert rows == ["| cpu-smol | soak | 60 / 800 | moe_cache | vllm | 1,800 (30.0) | 24,000 (30.0) |"]


def test_the_engine_judges_the_calls_by_the_same_rule():
    """The rule is one function: the engine makes such a suite plugin-inactive when it writes the record."""
    from validate.config import find_config
    from validate.engine import routed
    from validate.record import Verdict
    from validate.runners.base import SuiteResult

    cfg = find_config(REPO, "cpu-smol")
    cfg = cfg.model_copy(update={"env": {**cfg.env, "R9K_MOE_CACHE_SLOTS": "4"}})
    res = SuiteResult(r9k_calls=_dispatching("to vllm").r9k_calls)
    v = routed(cfg, object(), res, Verdict(status="pass"))
    assert v.status == "plugin-inactive" and v.cause.startswith("R9K_MOE_CACHE_SLOTS=4 asks for the moe_cache "
                                                                "dispatch, but it routed no call to r9k")
    res.r9k_calls = _dispatching("installed").r9k_calls
    assert routed(cfg, object(), res, Verdict(status="pass")).status == "pass"
    assert routed(cfg, None, res, Verdict(status="pass")).status == "pass"  # no server: nothing dispatched


def test_a_dispatch_that_ran_passes_and_one_never_exercised_is_said(tmp_path, monkeypatch, capsys):
    """Controls: installed and routed to r9k, a pass; with no decode step in the suite, still a pass (nothing was
    routed either way), and the notes say the dispatch was never exercised in one."""
    save(tmp_path, _dispatching("installed"))
    out, _ = _release(tmp_path, monkeypatch, capsys)
    assert out["code"] == 0 and "cpu-smol / soak: pass" in _checked(out["notes"])
    save(tmp_path, _dispatching("no decode"))
    out, _ = _release(tmp_path, monkeypatch, capsys)
    assert out["code"] == 0
    assert ("cpu-smol/soak: R9K_MOE_CACHE_SLOTS=4 asks for the moe_cache dispatch, and no decode step ran during the "
            "suite: it was never exercised in one") in out["notes"].replace("\\_", "_")


GDN_KNOB = "R9K_GDN_PREFILL_MAX=256"
#: each case's gdn_seq and gdn_conv rows in the suite's 60 prefill steps (route: calls), and whether the share says
#: its processes counted the rule's declines apart (``routes``; absent: a record from before the rule was counted)
GDN_CASES = {
    "beyond its rule": ({"rule": 1440}, True),     # every prompt longer than the bound, as GSM8K's at 256
    "refused": ({"vllm": 1440}, True),             # calls the rule takes, every one sent back to vLLM
    "refused and beyond": ({"vllm": 40, "rule": 1400}, True),
    "old format": ({"vllm": 1440}, False),         # declines and fallbacks counted alike
    "ran": ({"r9k": 40, "rule": 1400}, True),
}


def _gdn(case: str):
    """The soak of cpu-smol (prompts of 200 to 4,000 tokens) with the GDN prefill dispatch asked for
    (R9K_GDN_PREFILL_MAX=256: gdn_seq, and gdn_conv at its default), both processes installing it, and the suite's
    GDN calls as :data:`GDN_CASES` says."""
    from validate.config import find_config

    rows, counted = GDN_CASES[case]
    r = _soak("ran")
    cfg = find_config(REPO, "cpu-smol")
    cfg = cfg.model_copy(update={"env": {**cfg.env, "R9K_GDN_PREFILL_MAX": "256"}})
    r.config_snapshot, r.env = cfg.model_dump(mode="json"), dict(cfg.env)
    r.server.provenance = [f"R9K-PROVENANCE version=0.1.0 source_hash={r.tree.source_hash} files=5 pid={p} "
                           f"dispatch=gdn_seq,gdn_conv failed=-" for p in (41, 42)]
    r.r9k_calls = {"steps": {"prefill": 60, "decode": 800, "other": 3},
                   "calls": [{"dispatch": d, "route": route, "kind": "prefill", "calls": n}
                             for d in ("gdn_conv", "gdn_seq") for route, n in rows.items()],
                   "per_step": {}, "processes": 2, "malformed": 0}
    if counted:
        r.r9k_calls["routes"] = ["r9k", "rule", "vllm"]
    return r


def test_a_gdn_dispatch_whose_every_call_was_beyond_its_rule_is_not_inactive(tmp_path, monkeypatch, capsys):
    """Long prompts only: the GDN dispatch's rule sent every prefill call to vLLM by design. The release passes, and
    its notes say the dispatch was never exercised in a step it takes and show the calls beyond its rule."""
    from validate.audit import dispatch_reasons

    r = _gdn("beyond its rule")
    assert dispatch_reasons(r) == []
    save(tmp_path, r)
    out, n = _release(tmp_path, monkeypatch, capsys)
    assert out["code"] == 0 and "cpu-smol / soak: pass" in _checked(out["notes"])
    notes = out["notes"].replace("\\_", "_")
    for d, knob in (("gdn_seq", GDN_KNOB), ("gdn_conv", "R9K_GDN_PREFILL_CONV=r9k (its default)")):
        assert (f"cpu-smol/soak: {knob} asks for the {d} dispatch, and every call of it in the suite's 60 prefill "
                "steps was beyond R9K_GDN_PREFILL_MAX (1,440 calls sent to vLLM by its rule): it was never exercised "
                "in a step it takes") in notes
        assert f"| cpu-smol | soak | 60 / 800 | {d} | vllm, beyond its rule | 1,440 (24.0) | – |" in notes


@pytest.mark.parametrize("case, back, rule", [("refused", 1440, 0), ("refused and beyond", 40, 1400)])
def test_a_gdn_dispatch_that_sent_calls_its_rule_takes_to_vllm_is_inactive(tmp_path, monkeypatch, capsys, case,
                                                                           back, rule):
    """The attack beside the control above: no call to r9k, and calls its rule would take sent back to vLLM (the
    kernel refused them, a layout it does not cover): plugin-inactive, however many were beyond the rule."""
    from validate.audit import dispatch_reasons

    why = (f"the record says pass, but its call counts give plugin-inactive: {GDN_KNOB} asks for the gdn_seq "
           f"dispatch, but it routed no call to r9k in the suite's 60 prefill steps ({back:,} calls routed back to "
           f"vLLM, {rule:,} beyond R9K_GDN_PREFILL_MAX)")
    [got] = dispatch_reasons(_gdn(case))
    assert got.startswith(why + "; R9K_GDN_PREFILL_CONV=r9k (its default) asks for the gdn_conv dispatch, but")
    save(tmp_path, _gdn(case))
    out, _ = _release(tmp_path, monkeypatch, capsys)
    blocked(out, 2)
    assert out["last"].startswith("exit status 2: 1 check(s) could not be made: cpu-smol/soak audit-failed")
    assert why in out["summary"].replace("\\", "")


def test_an_old_gdn_record_says_the_counts_cannot_tell(tmp_path, monkeypatch, capsys):
    """Counts from a plugin that did not count the rule apart: every GDN call under ``vllm``, none under ``rule``.
    Neither a finding nor a claim that the dispatch ran: the notes say the counts cannot tell. A ``rule`` row
    anywhere in such a share shows its processes counted the rule: its ``vllm`` calls are fallbacks again."""
    from validate.audit import dispatch_reasons
    from validate.provenance_checks import check_calls

    r = _gdn("old format")
    assert dispatch_reasons(r) == []
    save(tmp_path, r)
    out, _ = _release(tmp_path, monkeypatch, capsys)
    assert out["code"] == 0
    assert (f"cpu-smol/soak: {GDN_KNOB} asks for the gdn_seq dispatch, which routed no call to r9k in the suite's 60 "
            "prefill steps: whether it was exercised cannot tell from the counts (every call went to vLLM: beyond "
            "R9K_GDN_PREFILL_MAX, or refused; 1,440 calls)") in out["notes"].replace("\\_", "_")
    env = {"R9K_GDN_PREFILL_MAX": "256"}
    share = dict(r.r9k_calls, calls=[{"dispatch": "gdn_seq", "route": "vllm", "kind": "prefill", "calls": 1440},
                                     {"dispatch": "gdn_conv", "route": "rule", "kind": "prefill", "calls": 1440}])
    findings, never = check_calls(env, share)
    assert [f.split(" asks")[0] for f in findings] == [GDN_KNOB] and len(never) == 1
    with pytest.raises(ValueError, match="routes the log could not have given"):
        check_calls(env, dict(r.r9k_calls, routes=["r9k", "gpu"]))


def test_the_engine_judges_gdn_calls_by_the_same_rule():
    from validate.config import find_config
    from validate.engine import routed
    from validate.record import Verdict
    from validate.runners.base import SuiteResult

    cfg = find_config(REPO, "cpu-smol")
    cfg = cfg.model_copy(update={"env": {**cfg.env, "R9K_GDN_PREFILL_MAX": "256"}})
    status = {case: routed(cfg, object(), SuiteResult(r9k_calls=_gdn(case).r9k_calls), Verdict(status="pass")).status
              for case in GDN_CASES}
    assert status == {"beyond its rule": "pass", "refused": "plugin-inactive", "refused and beyond": "plugin-inactive",
                      "old format": "pass", "ran": "pass"}


def test_a_record_without_the_counts_its_dispatch_rests_on_is_refused():
    from validate.audit import dispatch_reasons

    r = _dispatching("installed")
    assert dispatch_reasons(r) == []
    r.r9k_calls = None
    [why] = dispatch_reasons(r)
    assert why == ("the record says pass, but whether the dispatch its knobs ask for (moe_cache "
                   "(R9K_MOE_CACHE_SLOTS=4)) routed any call to r9k cannot be seen: r9k's call counts cannot be read "
                   "(no R9K-CALLS line fell in the suite)")
    r = _dispatching("installed")
    r.server.provenance = []
    assert dispatch_reasons(r)[0].endswith("its server printed no provenance line: the dispatch its knobs ask for "
                                           "(moe_cache (R9K_MOE_CACHE_SLOTS=4)) cannot be seen installed")


# --- what the reviewer also noticed ------------------------------------------------------------------------------


def test_a_search_probe_never_stands_in_for_the_reference_probe():
    """The candidate's reference probe ran at 1.0 req/s; a search probe of it sits at the baseline's SLO rate
    2.0 req/s and met the SLO: it was judged in the reference's place."""
    from tests.validate.test_loadgate import arrivals
    from validate.loadgate import compare_shares

    base = arrivals("v1", 2.0, 78, 80)
    search = {"index": 1, "rate_per_s": 2.0, "requests": 80, "good": 80, "valid": True, "meets": True}
    c = arrivals("v2", 1.0, 30, 80, ref={"release": "v1", "rate_per_s": 2.0, "probe": 0}, extra_probes=[search])
    cmp = compare_shares("v2", [c], "v1", [base])
    assert not cmp.figures
    assert cmp.unpaired == ["cpu-smol/arrivals: the candidate's reference probe ran at 1.0 req/s, not at the "
                            "baseline's SLO rate 2 req/s: it is not the sample the share is judged on"]
    ok = arrivals("v2", 2.0, 30, 80, ref={"release": "v1", "rate_per_s": 2.0, "probe": 0})  # control: judged
    [f] = compare_shares("v2", [ok], "v1", [base]).figures
    assert f.regression and (f.x_cand, f.n_cand) == (30, 80)


def test_a_full_set_relabelled_subset_is_refused(tmp_path, monkeypatch, capsys):
    """200 of 200 questions labelled a subset, 50 lost against the full baseline: release and render listed the
    pair as the run's own choice (limited), never blocking."""
    from tests.validate.test_one_verdict import LOST_50

    def full(release, right):
        r = eval_record(release, right)
        r.dataset.n_total = r.dataset.n_used = 200
        return r

    c = full("v0.2.0", LOST_50)
    c.dataset.subset, c.dataset.seed = True, 1
    save(tmp_path, full("v0.1.0", BASE), c)
    out = outputs(tmp_path, "v0.2.0")
    agree(out)
    assert out["code"] == 2
    chk = next(x for x in out["verdict"].checks if x.name == "gsm8k")
    assert chk.status == "audit-failed" and "it is labelled a subset, but it used 200 of 200 items" in chk.message
    n = notes_of(tmp_path, monkeypatch, capsys, "v0.2.0", "v0.1.0")
    notes_blocked(n, 2)
    save(tmp_path, full("v0.2.0", LOST_50))  # control: the full set as run is paired, and its loss found
    assert outputs(tmp_path, "v0.2.0")["code"] == 1


def test_the_gsm8k_audit_takes_the_marker_of_the_configuration_as_run():
    """The metrics' end-of-thinking marker was read before the configuration's: a record could choose the marker
    its items are judged by."""
    from validate.runners.gsm8k import audit

    r = eval_record("v0.2.0", BASE)
    assert audit(r, None) == []
    r.metrics["think_end"] = "</reasoning>"
    assert audit(r, None) == ["its metrics say the end-of-thinking marker is '</reasoning>', its configuration "
                              "'</think>'"]
    r.config_snapshot = {"think_end": "</reasoning>"}
    assert audit(r, None) == []


def test_a_snapshot_edited_to_hide_the_dispatch_is_refused():
    """The dispatch is judged from the configuration snapshot: a snapshot edited to expect no plugin, or whose env
    drops the knob the record's own env sets, is refused, never read as a configuration that asked for nothing.
    The unedited record (every call routed to vLLM) is the finding it was."""
    from validate.audit import audit_record, snapshot_reasons

    r = _dispatching("to vllm")
    assert snapshot_reasons(r) == [] and any("plugin-inactive" in w for w in audit_record(r, REPO))
    off = _dispatching("to vllm")
    off.config_snapshot["expects_plugin"] = False
    assert snapshot_reasons(off) == ["its config_snapshot expects no plugin, but its knobs ask for moe_cache (a "
                                     "configuration the loader refuses: edited)"]
    dropped = _dispatching("to vllm")
    dropped.config_snapshot["env"] = {k: v for k, v in dropped.config_snapshot["env"].items()
                                      if not k.startswith("R9K_MOE")}
    assert snapshot_reasons(dropped) == ["its env and its config_snapshot's env set the knobs R9K_MOE_CACHE_SLOTS "
                                         "apart (edited)"]
    assert snapshot_reasons(dropped)[0] in audit_record(dropped, REPO)

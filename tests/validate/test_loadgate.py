"""The share gates: the SLO share at the baseline's SLO rate and draft acceptance, each failing a drop, with known
two-proportion p-values, and refusing what cannot be compared."""
from __future__ import annotations

import pytest

from tests.validate.test_records_render import rec
from validate.loadgate import ShareGateSpec, compare_shares, rule
from validate.stats import two_proportion_drop
from validate.verdict import assess


def arrivals(release, rate, good, n, status="found", ref=None, slo=None, extra_probes=()):
    r = rec("cpu-smol", "arrivals", metrics={
        "slo": slo or {"ttft_ms": 2000, "tpot_ms": 100, "percentile": 99, "from": "serve/cpu-smol.yaml"},
        "probes": [{"index": 0, "rate_per_s": rate, "requests": n, "good": good, "valid": True, "meets": good == n},
                   *extra_probes],
        "search": {"status": status}, "slo_rate_per_s": rate if status == "found" else None, "reference": ref})
    r.release, r.suite_kind = release, "arrivals"
    for pr in r.metrics["probes"]:  # the probe a reference names is the one run as it
        if ref and pr["index"] == ref["probe"]:
            pr["reference"] = True
    return r


def with_spec(release, accepted, drafted, suite="gsm8k"):
    r = rec("cpu-smol", suite)
    r.release = release
    r.server_metrics = {"available": True, "delta": {"spec_decode": {
        "drafts": drafted // 3, "draft_tokens": drafted, "accepted_tokens": accepted}}}
    return r


def test_two_proportion_p_matches_the_formula():
    # z = (0.8 - 0.9) / sqrt(0.85 * 0.15 * (1/100 + 1/100)) = -1.98030, one-sided p = Phi(z)
    t = two_proportion_drop(90, 100, 80, 100)
    assert t.z == pytest.approx(-1.980295, abs=1e-6) and t.p_one_sided == pytest.approx(0.0238352, abs=1e-6)
    assert t.drop_pts == pytest.approx(10.0)
    assert two_proportion_drop(100, 100, 100, 100).p_one_sided == 1.0
    with pytest.raises(ValueError, match="more successes than trials"):
        two_proportion_drop(5, 4, 1, 4)


def test_the_slo_share_at_the_baselines_rate_fails_a_drop():
    base = arrivals("v1", 2.0, 78, 80)
    same = arrivals("v2", 2.0, 76, 80, ref={"release": "v1", "rate_per_s": 2.0, "probe": 0})
    drop = arrivals("v2", 2.0, 60, 80, ref={"release": "v1", "rate_per_s": 2.0, "probe": 0})
    ok = compare_shares("v2", [same], "v1", [base])
    assert [f.regression for f in ok.figures] == [False] and not ok.unpaired
    bad = compare_shares("v2", [drop], "v1", [base]).figures[0]
    want = two_proportion_drop(78, 80, 60, 80)
    assert bad.regression and bad.p_value == pytest.approx(want.p_one_sided) and bad.drop_pts == pytest.approx(22.5)
    v = assess("v2", [drop], shares=compare_shares("v2", [drop], "v1", [base]))
    chk = next(c for c in v.checks if c.name.startswith("slo "))
    assert chk.outcome == "finding" and v.exit_code() == 1 and "97.5% -> 75.0%" in chk.message


def test_a_drop_within_the_threshold_is_not_a_regression_however_significant():
    base = arrivals("v1", 2.0, 9_900, 10_000)
    cand = arrivals("v2", 2.0, 9_600, 10_000, ref={"release": "v1", "rate_per_s": 2.0, "probe": 0})
    f = compare_shares("v2", [cand], "v1", [base]).figures[0]
    assert f.p_value < 1e-10 and f.drop_pts == pytest.approx(3.0) and not f.regression


def test_no_rate_meeting_the_slo_against_a_baseline_that_had_one_is_a_regression():
    base = arrivals("v1", 2.0, 80, 80)
    cand = arrivals("v2", 0.25, 10, 40, status="none meets")
    f = compare_shares("v2", [cand], "v1", [base]).figures[0]
    assert f.regression and "no rate met the SLO" in f.message


def test_the_slo_share_is_not_compared_without_a_probe_at_the_rate_or_under_another_slo():
    base = arrivals("v1", 2.0, 80, 80)
    elsewhere = arrivals("v2", 1.0, 40, 40)  # ran without the baseline's rate
    cmp = compare_shares("v2", [elsewhere], "v1", [base])
    assert not cmp.figures and "no reference probe at the baseline's SLO rate 2 req/s" in cmp.unpaired[0]
    # a search probe at the rate does not stand in for the reference probe (the record would choose its sample)
    near = arrivals("v2", 2.0, 80, 80)
    assert "it ran no reference probe" in compare_shares("v2", [near], "v1", [base]).unpaired[0]
    other = arrivals("v2", 2.0, 80, 80, slo={"ttft_ms": 5000, "tpot_ms": 100, "percentile": 99})
    assert "the SLOs differ" in compare_shares("v2", [other], "v1", [base]).unpaired[0]
    v = assess("v2", [elsewhere], shares=cmp)
    assert v.exit_code() == 2  # should have been compared and was not: never a pass


def test_the_reference_probe_is_judged_and_counts_must_be_whole_numbers():
    base = arrivals("v1", 2.0, 78, 80)
    # a search probe at the same rate that met the SLO, then the reference probe run for this baseline, which did not
    ref_probe = {"index": 1, "rate_per_s": 2.0, "requests": 80, "good": 60, "valid": True, "meets": False,
                 "reference": True}
    cand = arrivals("v2", 2.0, 80, 80, ref={"release": "v1", "rate_per_s": 2.0, "probe": 1}, extra_probes=[ref_probe])
    f = compare_shares("v2", [cand], "v1", [base]).figures[0]
    assert (f.x_cand, f.n_cand) == (60, 80) and f.regression
    # the reference probe first, a search probe at the rate after it: the reference is judged against its baseline,
    # and against another baseline nothing is (the search probe does not stand in)
    later = {"index": 1, "rate_per_s": 2.0, "requests": 80, "good": 80, "valid": True, "meets": True}
    cand2 = arrivals("v2", 2.0, 60, 80, ref={"release": "v1", "rate_per_s": 2.0, "probe": 0}, extra_probes=[later])
    cand2.metrics["probes"][0]["reference"] = True
    assert compare_shares("v2", [cand2], "v1", [base]).figures[0].x_cand == 60
    other = compare_shares("v2", [cand2], "v0", [arrivals("v0", 2.0, 78, 80)])
    assert not other.figures and "its reference probe was at 2.0 req/s of v1" in other.unpaired[0]
    for forged in ("78", 78.0, True):
        b = arrivals("v1", 2.0, forged, 80)
        cmp = compare_shares("v2", [cand], "v1", [b])
        assert not cmp.figures and f"cannot be counted ({forged!r} is not a count)" in cmp.unpaired[0], forged


def test_draft_acceptance_fails_a_drop_and_a_lost_counter():
    base = with_spec("v1", 7_000, 10_000)
    same = with_spec("v2", 6_950, 10_000)
    drop = with_spec("v2", 5_000, 10_000)
    assert not compare_shares("v2", [same], "v1", [base]).figures[0].regression
    f = compare_shares("v2", [drop], "v1", [base]).figures[0]
    assert f.what == "acceptance" and f.regression and f.drop_pts == pytest.approx(20.0) and f.p_value < 1e-50
    lost = rec("cpu-smol", "gsm8k")
    lost.release = "v2"
    cmp = compare_shares("v2", [lost], "v1", [base])
    assert not cmp.figures and "holds no speculative-decoding counts" in cmp.unpaired[0]
    neither = compare_shares("v2", [rec("cpu-smol", "gsm8k")], "v1", [rec("cpu-smol", "gsm8k")])
    assert not neither.figures and not neither.unpaired  # no speculation on either side: nothing to gate


def test_an_impossible_counter_gives_no_share():
    base = with_spec("v1", 7_000, 10_000)
    cand = with_spec("v2", 5_000, 10_000)
    cand.server_metrics["delta"]["impossible"] = ["spec_accepted_tokens 12 > spec_draft_tokens 10"]
    cmp = compare_shares("v2", [cand], "v1", [base])
    assert not cmp.figures and cmp.unpaired


def test_the_stricter_threshold_of_baseline_and_checkout_is_used():
    base = arrivals("v1", 2.0, 80, 80)
    base.share_gate = {"slo_share_drop_pts": 10, "acceptance_drop_pts": 2, "alpha": 0.01}
    r = rule(base, ShareGateSpec(slo_share_drop_pts=5, acceptance_drop_pts=5, alpha=0.05))
    assert (r.slo_share_drop_pts, r.acceptance_drop_pts, r.alpha) == (5, 2, 0.05)
    base.share_gate = {"slo_share_drop_pts": "lots"}  # malformed: the checkout's alone
    assert rule(base, ShareGateSpec(slo_share_drop_pts=7)).slo_share_drop_pts == 7


def test_an_invalid_reference_probe_is_not_replaced_by_another():
    base = arrivals("v1", 2.0, 78, 80)
    ref_probe = {"index": 1, "rate_per_s": 2.0, "requests": 80, "good": 40, "valid": False, "meets": False,
                 "reference": True, "why_invalid": "the client sent late"}
    cand = arrivals("v2", 2.0, 21, 21, ref={"release": "v1", "rate_per_s": 2.0, "probe": 1}, extra_probes=[ref_probe])
    cmp = compare_shares("v2", [cand], "v1", [base])
    assert not cmp.figures and cmp.unpaired == [
        "cpu-smol/arrivals: the candidate's reference probe at the baseline's SLO rate 2 req/s is not valid (the "
        "client sent late)"]

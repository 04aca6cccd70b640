"""BetterBench's pass count sized to the suite's time budget: exact counts for given pass times and budgets on a
fake clock against the synthetic server, the floor and the cap, the record's fields, a budget read through the
engine from the suite file, and the performance gate on 5 passes a side (exact Mann-Whitney p-values)."""
from __future__ import annotations

import itertools
import math

import pytest
from pydantic import ValidationError

from tests.synth_server import Script
from tests.validate.test_betterbench_rows import PARAMS, run_against_synth
from validate.perfgate import judge, passes_a_side
from validate.runners import betterbench
from validate.runners.betterbench import BUDGET_RESERVE_S, BetterBenchParams, pass_stop, passes_planned

pytestmark = pytest.mark.timeout(120)

#: The rows at their smallest against the synthetic server: a pass is about 12 requests.
SMALL = {**PARAMS, "concurrency": [1], "requests_per_client": 1, "shared_copies": 1, "prefix_concurrency": 1}


@pytest.fixture
def clocked(monkeypatch):
    """``go(budget_s, setup_s, pass_times, **params)``: BetterBench on the synthetic server with a fake clock, on
    which the text pool's build takes ``setup_s`` seconds and pass ``n`` takes ``pass_times[n]`` (the last
    repeats). Returns (metrics, the progress calls as (args, kwargs))."""
    def go(budget_s, setup_s, pass_times, **params):
        now = [0.0]
        monkeypatch.setattr(betterbench, "clock", lambda: now[0])
        measure = betterbench.measure_pass

        async def timed(b, n):
            row = await measure(b, n)
            now[0] += pass_times[min(n, len(pass_times) - 1)]
            return row

        monkeypatch.setattr(betterbench, "measure_pass", timed)
        calls: list[tuple] = []
        res, _ = run_against_synth(monkeypatch, Script(), {**SMALL, **params}, budget_s=budget_s,
                                   progress=lambda *a, **k: calls.append((a, k)),
                                   on_pool=lambda: now.__setitem__(0, now[0] + setup_s))
        assert not res.errors, res.errors
        return res.metrics, calls
    return go


def test_a_slow_box_runs_the_passes_that_fit_and_says_the_floor_did_not(clocked):
    """cpu-smol's quick figures: a 4 s pool build and 14 s passes in a 35 s budget. After pass 1 (18 s) one more
    ends at 32 s + 1 s reserve <= 35; after pass 2 (32 s) a third would end at 46 s: 2 passes, below the floor."""
    m, calls = clocked(35.0, 4.0, [14.0], min_passes=5, max_passes=20)
    assert (m["passes"], m["passes_planned"], m["passes_stop"]) == (2, 2, "budget")
    assert m["pass_s"] == [14.0, 14.0] and len(m["per_pass"]) == 2
    assert m["passes_why"] == ("the budget: one more pass would end at 46.0 s, past the 35 s budget less 1 s for the "
                               "record (passes took 14.0 to 14.0 s); 2 passes measured, fewer than min_passes 5: the "
                               "performance gate may not decide on them")
    descriptions = [k["description"] for _, k in calls if "description" in k]
    assert descriptions == ["pass 1 of ? (35 s budget)", "pass 2 of 2 (35 s budget)"]


def test_a_fast_box_runs_as_many_as_fit_the_budget(clocked):
    """A 1 s build and 2.5 s passes in 35 s: pass k ends at 1 + 2.5 k; another runs while 1 + 2.5 (k + 1) + 1 <= 35,
    i.e. k <= 12: 13 passes, as planned after the first (1 + floor((35 - 1 - 3.5) / 2.5) = 13)."""
    m, calls = clocked(35.0, 1.0, [2.5])
    assert (m["passes"], m["passes_planned"], m["passes_stop"]) == (13, 13, "budget")
    assert m["passes"] >= 5 and "min_passes" not in m["passes_why"]
    assert m["summary"]["decode_step_ms"]["median"] is not None and len(m["pass_s"]) == 13
    totals = {k["total"] for _, k in calls if k.get("total")}
    assert totals == {13 * (1 + 1 + 1 + 2 + 1)}  # decode, one depth, c1, two shared copies, one prefix request


def test_the_cap_stops_a_box_that_would_fit_more(clocked):
    m, _ = clocked(35.0, 0.5, [0.2], max_passes=7)
    assert (m["passes"], m["passes_planned"], m["passes_stop"]) == (7, 7, "max_passes")
    assert m["passes_why"] == ("max_passes 7 ran within the 35 s budget (passes took 0.2 to 0.2 s, 1.9 s in all)")


def test_a_slower_later_pass_counts_and_the_first_pass_always_runs(clocked):
    # 3 s then 9 s passes in 20 s after a 1 s build: after pass 1 (4 s) 4 + 3 + 1 <= 20 runs pass 2 (13 s); then the
    # slowest, 9 s, would end at 22 + 1 > 20: 2 passes, though 1 + floor((20 - 1 - 4) / 3) = 6 were planned
    m, _ = clocked(20.0, 1.0, [3.0, 9.0])
    assert (m["passes"], m["passes_planned"], m["passes_stop"]) == (2, 6, "budget")
    # a budget the pool's build already spent: one pass still measures the figures
    m, _ = clocked(5.0, 6.0, [2.0])
    assert (m["passes"], m["passes_planned"], m["passes_stop"]) == (1, 1, "budget")
    assert m["passes_why"].endswith("1 passes measured, fewer than min_passes 5: the performance gate may not "
                                    "decide on them")


def test_without_a_budget_the_fixed_count_runs(clocked):
    m, calls = clocked(None, 100.0, [50.0], passes=3, max_passes=2, min_passes=1)
    assert (m["passes"], m["passes_planned"], m["passes_stop"]) == (3, 3, "count")
    assert m["passes_why"] == "3 passes: the profile states no time budget"
    assert [k["description"] for _, k in calls if "description" in k] == ["pass 1 of 3", "pass 2 of 3", "pass 3 of 3"]


def test_the_sizing_rule_on_its_own():
    p = BetterBenchParams(min_passes=5, max_passes=10)
    assert pass_stop(p, 30.0, 50.0, []) is None  # the first pass runs whatever the clock says
    assert pass_stop(p, 30.0, 24.0, [5.0]) is None and pass_stop(p, 30.0, 24.01, [5.0]) == "budget"
    assert pass_stop(p, 1e9, 0.0, [1.0] * 10) == "max_passes" and pass_stop(p, None, 0.0, [1.0] * 19) is None
    assert passes_planned(p, 30.0, 9.0, [4.0]) == 1 + math.floor((30 - BUDGET_RESERVE_S - 9) / 4) == 6
    assert passes_planned(p, 30.0, 40.0, [4.0]) == 1 and passes_planned(p, 1e9, 1.0, [1.0]) == 10
    with pytest.raises(ValueError, match="planned from a measured pass"):
        passes_planned(p, 30.0, 0.0, [])
    with pytest.raises(ValidationError, match="min_passes 6 is above max_passes 5"):
        BetterBenchParams(min_passes=6, max_passes=5)
    with pytest.raises(ValidationError, match="min_passes"):
        BetterBenchParams(min_passes=0)


def enumerated_p(cand: list[float], base: list[float]) -> float:
    """The exact one-sided Mann-Whitney p that ``cand`` lies above ``base`` (no ties), by enumeration rather than
    scipy: the share of the C(n + m, n) splits of the pooled values whose candidate side has at least as many pairs
    above the other side as ``cand`` has above ``base``."""
    pooled = sorted(cand + base)
    u = lambda c, b: sum(x > y for x in c for y in b)  # noqa: E731
    seen = u(cand, base)
    splits = list(itertools.combinations(range(len(pooled)), len(cand)))
    hits = sum(u([pooled[i] for i in s], [pooled[i] for i in range(len(pooled)) if i not in s]) >= seen
               for s in splits)
    return hits / len(splits)


def test_the_floor_is_the_fewest_passes_the_gate_decides_on_with_noise():
    """Exact one-sided Mann-Whitney p of n passes a side with k pairs swapped (enumerated): 3 a side never give
    p < 0.05, 4 a side only with at most one pair swapped, 5 a side up to four."""
    def p_of(n: int, swapped: int) -> float:
        base = [float(i) for i in range(n)]
        cand = [n - 1 - swapped + 0.5] + [float(n + i) for i in range(1, n)]  # its lowest below `swapped` of base
        return enumerated_p(cand, base)

    assert passes_a_side(0.05) == 4 and p_of(3, 0) == pytest.approx(1 / 20)
    assert [p_of(4, k) for k in range(3)] == pytest.approx([1 / 70, 2 / 70, 4 / 70])
    assert [p_of(5, k) for k in range(6)] == pytest.approx([1 / 252, 2 / 252, 4 / 252, 7 / 252, 12 / 252, 19 / 252])
    assert BetterBenchParams().min_passes == 5 and p_of(5, 4) < 0.05 < p_of(4, 2)


def test_five_passes_a_side_decide_a_forty_percent_slower_decode_step():
    base = [30.0, 30.3, 29.8, 30.1, 29.9]
    slow = [42.0, 42.4, 41.7, 42.2, 41.9]  # +40%
    f = judge("h100", "decode_step_ms", base, slow, 3.0)
    assert f.regression and f.mark == "slower" and not f.cannot_tell
    assert f.p_value == pytest.approx(1 / 252) == enumerated_p(slow, base) and f.min_p == pytest.approx(1 / 252)
    assert "a regression: +40.0% in the bad direction (threshold 3%)" in f.message
    assert f.worse_pct == pytest.approx(40.0, abs=0.01)


def test_five_passes_a_side_of_one_distribution_pass_or_are_not_significant():
    base = [30.0, 30.2, 30.4, 30.6, 30.8]
    same = [30.1, 30.3, 30.5, 30.7, 30.9]  # interleaved: U = 15 of 25 pairs candidate-above
    f = judge("h100", "decode_step_ms", base, same, 3.0)
    assert f.mark == "within the threshold" and not f.regression and not f.cannot_tell
    # P(U >= 15) for 5 and 5: the splits of U = 15..25 number 18, 16, 14, 11, 9, 7, 5, 3, 2, 1, 1 (87 of 252)
    assert f.p_value == pytest.approx(87 / 252) == enumerated_p(same, base)
    # the other way round (the candidate the faster of the two): P(U >= 10) = 1 - P(U <= 9) = 1 - 69/252
    g = judge("h100", "decode_step_ms", same, base, 3.0)
    assert g.mark == "within the threshold" and g.p_value == pytest.approx(183 / 252) == enumerated_p(base, same)


def test_other_pass_counts_and_floors_compare(tmp_path):
    """The count run is a metric: records that ran 13 and 2 passes under other pass params pair and are judged."""
    from tests.validate.test_perfgate import _bench
    from validate.perfgate import compare_perf
    from validate.record import record_path, write_record

    a, b = _bench("v1", 30.0, 1, n=13), _bench("v2", 42.0, 2, n=5)
    a.params.update(passes=20, min_passes=5, max_passes=20)
    b.params.update(passes=2, min_passes=4, max_passes=5)
    for r in (a, b):
        write_record(record_path(tmp_path, r.release, r.config, r.suite), r)
    cmp = compare_perf(tmp_path, "v2", "v1")
    assert not cmp.unpaired
    step = {f.figure: f for f in cmp.figures}["decode_step_ms"]
    assert (len(step.base), len(step.cand)) == (13, 5) and step.regression
    assert step.p_value == pytest.approx(1 / math.comb(18, 5))


def test_gate_perf_exit_status_on_five_passes_a_side(tmp_path):
    """``gate --perf`` on 5 passes a side: a 40% slower decode step exits 1; one of the baseline's distribution 0."""
    from tests.validate.test_perfgate import _bench
    from validate.cli import main
    from validate.record import record_path, write_record

    for r in (_bench("v1", 38.0, 1, n=5), _bench("v2", 38.0, 2, n=5), _bench("v3", 38.0 * 1.4, 3, n=5)):
        write_record(record_path(tmp_path, r.release, r.config, r.suite), r)
    gate = ["gate", "--accept-other-tree", "--perf", "--reports", str(tmp_path), "--against", "v1"]
    assert main(gate + ["v2"]) == 0
    assert main(gate + ["v3"]) == 1


def test_the_budget_reaches_the_runner_from_the_suite_file(scratch):
    """Through the engine and the fake vLLM: the quick profile's budget_s sizes the passes; a budget of 0.5 s holds
    the first pass only (the first always runs), and the record keeps the budget, the counts and why."""
    import yaml

    from tests.validate.test_soak_betterbench import record
    from validate.cli import main

    body = {"name": "mini-bb", "kind": "betterbench",
            "params": {"decode_tokens": 8, "prefill_depths": [64], "concurrency": [1], "requests_per_client": 1,
                       "prompt_tokens": 16, "agg_tokens": 4, "shared_copies": 1, "prefix_tokens": 48,
                       "prefix_suffix_tokens": 4, "prefix_concurrency": 1},
            "profiles": {"quick": {"min_passes": 5, "max_passes": 9, "budget_s": 0.5}}}
    (scratch.root / "suites" / "mini-bb.yaml").write_text(yaml.safe_dump(body))
    scratch.config("fake-bb", FAKE_VLLM_TOKENS=8)
    assert main(["suite", "mini-bb", "--config", "fake-bb", "--release", "b1", "--profile", "quick"]) == 0
    rec = record(scratch, "b1", "fake-bb", "mini-bb")
    m = rec["metrics"]
    assert rec["budget_s"] == 0.5 and rec["params"]["max_passes"] == 9 and rec["params"]["min_passes"] == 5
    assert (m["passes"], m["passes_planned"], m["passes_stop"], len(m["pass_s"])) == (1, 1, "budget", 1)
    assert m["passes_why"].endswith("1 passes measured, fewer than min_passes 5: the performance gate may not "
                                    "decide on them")

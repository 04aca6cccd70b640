"""validate/stats.py against statsmodels / scipy, the values published in past release notes, and hand checks."""
from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.stats import binom, binomtest
from statsmodels.stats.contingency_tables import mcnemar as sm_mcnemar
from statsmodels.stats.multitest import multipletests
from statsmodels.stats.proportion import proportion_confint

from validate.stats import holm, mcnemar, min_detectable_regression, paired_diff_ci, wilson_interval

GRID = [(b, c) for b in range(61) for c in range(61)]
LARGE = [(500, 560), (1000, 1100), (560, 500), (1100, 1000), (2000, 2000), (3, 900)]


def test_two_sided_matches_statsmodels_exact():
    for b, c in GRID + LARGE:
        want = sm_mcnemar(np.array([[100, b], [c, 100]]), exact=True).pvalue
        got = mcnemar(b, c).p_two_sided
        assert got == pytest.approx(want, rel=1e-9, abs=1e-300), (b, c)


def test_no_discordant_pairs():
    r = mcnemar(0, 0)
    assert (r.p_two_sided, r.p_one_sided, r.n_discordant) == (1.0, 1.0, 0)
    assert mcnemar(0, 0, mid_p=True).p_two_sided == 1.0
    assert sm_mcnemar(np.array([[5, 0], [0, 5]]), exact=True).pvalue == 1.0


@pytest.mark.parametrize("b,c,p", [(14, 16, 0.86), (11, 10, 1.00), (7, 8, 1.00), (5, 8, 0.58), (5, 7, 0.77),
                                   (0, 2, 0.50), (7, 12, 0.36), (5, 11, 0.21), (5, 1, 0.22)])
def test_published_release_note_values(b, c, p):
    assert round(mcnemar(b, c).p_two_sided, 2) == p


def test_one_sided_matches_binomtest():
    for b, c in [(b, c) for b in range(0, 61, 3) for c in range(0, 61, 4) if b + c] + LARGE:
        want = binomtest(b, b + c, 0.5, alternative="greater").pvalue
        assert mcnemar(b, c).p_one_sided == pytest.approx(want, rel=1e-9), (b, c)


def test_one_sided_direction():
    assert mcnemar(20, 3).p_one_sided < 0.001   # candidate lost 20, gained 3: a regression
    assert mcnemar(3, 20).p_one_sided > 0.99    # an improvement is no evidence of regression


def test_mid_p_formula():
    for b, c in [(5, 11), (11, 5), (7, 7), (0, 3), (40, 25)]:
        n, k = b + c, min(b, c)
        exact = mcnemar(b, c)
        mid = mcnemar(b, c, mid_p=True)
        assert mid.mid_p and not exact.mid_p
        assert mid.p_two_sided == pytest.approx(min(1.0, 2 * (binom.cdf(k, n, 0.5) - 0.5 * binom.pmf(k, n, 0.5))))
        if b != c:
            assert mid.p_two_sided == pytest.approx(exact.p_two_sided - binom.pmf(k, n, 0.5))
        assert mid.p_one_sided == pytest.approx(exact.p_one_sided - 0.5 * binom.pmf(b, n, 0.5))
        assert mid.p_two_sided <= exact.p_two_sided
    assert mcnemar(7, 7, mid_p=True).p_two_sided == pytest.approx(1.0)


@pytest.mark.parametrize("args,name", [((-1, 2), "b"), ((2, -1), "c"), ((1.5, 2), "b"), ((1, "2"), "c"),
                                       ((True, 2), "b"), ((1, None), "c")])
def test_mcnemar_rejects_bad_counts(args, name):
    with pytest.raises(ValueError, match=rf"^{name} "):
        mcnemar(*args)


def test_mcnemar_accepts_numpy_ints():
    assert mcnemar(np.int64(5), np.int32(11)).p_two_sided == mcnemar(5, 11).p_two_sided


def test_result_is_frozen():
    r = mcnemar(1, 2)
    with pytest.raises(Exception):
        r.b = 3  # type: ignore[misc]


@pytest.mark.parametrize("ps", [
    [0.01, 0.04, 0.03, 0.005],
    [0.5, 0.5, 0.01, 0.2, 0.049, 0.9],
    [0.02, 0.02, 0.02],
    [1.0, 0.0, 0.3],
    [0.04],
    list(np.random.default_rng(3).uniform(0, 0.2, 25)),
])
def test_holm_matches_statsmodels(ps):
    keys = [f"task{i}" for i in range(len(ps))]
    got = holm(dict(zip(keys, ps)), alpha=0.05)
    reject, adj, _, _ = multipletests(ps, alpha=0.05, method="holm")
    assert list(got) == keys
    for k, p, r, a in zip(keys, ps, reject, adj):
        assert got[k].p == p
        assert got[k].p_adjusted == pytest.approx(a, rel=1e-12)
        assert got[k].reject == bool(r)
        assert got[k].p_adjusted <= 1.0


def test_holm_edge_cases():
    assert holm({}) == {}
    with pytest.raises(ValueError, match="pvalues"):
        holm({"a": 1.2})
    with pytest.raises(ValueError, match="pvalues"):
        holm({"a": float("nan")})
    with pytest.raises(ValueError, match="alpha"):
        holm({"a": 0.1}, alpha=0)


def test_paired_diff_ci_by_hand():
    # (a, b, c, d) = (36, 2, 12, 6), n = 56. Candidate right on 48 (0.857143), baseline on 38 (0.678571).
    # Wilson 95%: candidate 0.742641 .. 0.925792, baseline 0.548226 .. 0.785990.
    # phi = (36*6 - 2*12) / sqrt(38*18*48*8) = 192 / 512.50 = 0.374634.
    # lower = 0.178571 - sqrt(0.114502^2 - 2*0.374634*0.114502*0.107419 + 0.107419^2) = 0.178571 - 0.124233
    # upper = 0.178571 + sqrt(0.068649^2 - 2*0.374634*0.068649*0.130345 + 0.130345^2) = 0.178571 + 0.122467
    ci = paired_diff_ci(36, 2, 12, 6)
    assert ci.diff == pytest.approx(10 / 56)
    assert ci.lower == pytest.approx(0.054339, abs=2e-6)
    assert ci.upper == pytest.approx(0.301038, abs=2e-6)
    assert ci.level == 0.95 and ci.method == "newcombe-10"
    # orientation: swapping b and c mirrors the interval
    m = paired_diff_ci(36, 12, 2, 6)
    assert (m.diff, m.lower, m.upper) == pytest.approx((-ci.diff, -ci.upper, -ci.lower))


def test_wilson_matches_statsmodels():
    for x, n in [(0, 10), (10, 10), (48, 56), (1263, 1319), (3, 40)]:
        assert wilson_interval(x, n) == pytest.approx(proportion_confint(x, n, method="wilson"), abs=1e-12)


def test_paired_diff_ci_properties():
    ci0 = paired_diff_ci(1250, 0, 0, 69)  # no discordant questions: the interval still has width
    assert ci0.diff == 0 and ci0.lower < 0 < ci0.upper
    seed = paired_diff_ci(1249, 14, 16, 40)  # the 14 vs 16 release-note eval: covers 0
    assert seed.lower < 0 < seed.upper
    wide, narrow = paired_diff_ci(36, 2, 12, 6, level=0.99), paired_diff_ci(36, 2, 12, 6, level=0.8)
    assert wide.lower < narrow.lower < narrow.upper < wide.upper
    for t in [(0, 5, 0, 0), (0, 0, 5, 0), (3, 0, 0, 0)]:
        ci = paired_diff_ci(*t)
        assert -1 <= ci.lower <= ci.diff <= ci.upper <= 1
    with pytest.raises(ValueError, match="empty"):
        paired_diff_ci(0, 0, 0, 0)
    with pytest.raises(ValueError, match="^d "):
        paired_diff_ci(1, 2, 3, -4)


def test_mde_monotone_in_n():
    for rate in (21 / 1319, 0.05, 0.2):
        ns = [200, 400, 800, 1319, 2000, 4000, 8000]
        mdes = [min_detectable_regression(n, rate) for n in ns]
        finite = [m for m in mdes if math.isfinite(m)]
        assert finite, rate
        assert all(x > y for x, y in zip(mdes, mdes[1:]) if math.isfinite(y)), (rate, mdes)
        assert all(0 < m <= rate for m in finite)


def test_mde_meaning():
    n, rate = 1319, 30 / 1319
    mde = min_detectable_regression(n, rate)
    # a drop of that size, spread as an expected split of the 30 discordant questions, is what the test just
    # catches 80% of the time; simulate the one-sided exact test at that effect
    pi = (1 + mde / rate) / 2
    rng = np.random.default_rng(0)
    m = rng.binomial(n, rate, 4000)
    b = rng.binomial(m, pi)
    rejected = [binomtest(int(bi), int(mi), 0.5, alternative="greater").pvalue <= 0.05 if mi else False
                for bi, mi in zip(b, m)]
    assert np.mean(rejected) == pytest.approx(0.8, abs=0.03)
    # more power or a smaller alpha needs a bigger drop
    assert min_detectable_regression(n, rate, power=0.9) > mde
    assert min_detectable_regression(n, rate, alpha=0.01) > mde


def test_mde_too_small_and_bad_input():
    assert min_detectable_regression(40, 0.02) == math.inf
    with pytest.raises(ValueError, match="^n "):
        min_detectable_regression(-5, 0.1)
    with pytest.raises(ValueError, match="discordant_rate"):
        min_detectable_regression(100, 0.0)
    with pytest.raises(ValueError, match="power"):
        min_detectable_regression(100, 0.1, power=1.0)

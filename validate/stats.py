"""Statistics of paired evals: exact McNemar, Holm across tasks, the CI of a paired accuracy difference, and
the smallest regression a paired eval of a given size could detect.

Conventions (docs/metrics.md, "Statistics"): two records are compared question by question. With the 2x2 table

=================  =====================  ======================
                   candidate right        candidate wrong
=================  =====================  ======================
baseline right     ``a`` (both right)     ``b`` (baseline only)
baseline wrong     ``c`` (candidate only) ``d`` (both wrong)
=================  =====================  ======================

``n = a + b + c + d`` questions, the accuracy difference candidate - baseline is ``(c - b) / n``, and only the
discordant counts ``b`` and ``c`` carry evidence about it (McNemar 1947). Under the null hypothesis of equal
accuracy each discordant question is equally likely to fall either way: ``b ~ Binom(b + c, 1/2)``.

Sources:

- Q. McNemar (1947), "Note on the sampling error of the difference between correlated proportions or
  percentages", Psychometrika 12(2):153-157.
- M. W. Fagerland, S. Lydersen, P. Laake (2013), "The McNemar test for binary matched-pairs data: mid-p and
  asymptotic are better than exact conditional", BMC Medical Research Methodology 13:91.
- S. Holm (1979), "A simple sequentially rejective multiple test procedure", Scand. J. Statist. 6(2):65-70.
- R. G. Newcombe (1998), "Improved confidence intervals for the difference between binomial proportions based
  on paired data", Statistics in Medicine 17(22):2635-2650 (method 10).
- E. B. Wilson (1927), "Probable inference, the law of succession, and statistical inference", JASA 22:209-212.
"""
from __future__ import annotations

import math
import numbers
from dataclasses import dataclass

import numpy as np
from scipy.stats import binom, norm

__all__ = [
    "McNemarResult", "mcnemar", "HolmResult", "holm", "DiffCI", "paired_diff_ci", "wilson_interval",
    "min_detectable_regression",
]


def _count(name: str, value) -> int:
    """``value`` as a non-negative int; ValueError naming ``name`` otherwise (bools and floats are refused)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise ValueError(f"{name} must be a non-negative integer count, got {value!r}")
    if value < 0:
        raise ValueError(f"{name} must be a non-negative integer count, got {value!r}")
    return int(value)


def _unit(name: str, value, *, open_interval: bool = True) -> float:
    """``value`` as a float strictly inside (0, 1) (or inside [0, 1]); ValueError naming ``name`` otherwise."""
    try:
        v = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a number, got {value!r}") from None
    ok = (0.0 < v < 1.0) if open_interval else (0.0 <= v <= 1.0)
    if not ok:  # also catches NaN
        raise ValueError(f"{name} must be in {'(0, 1)' if open_interval else '[0, 1]'}, got {value!r}")
    return v


# --------------------------------------------------------------------------------------------------------------
# McNemar


@dataclass(frozen=True)
class McNemarResult:
    """Exact (or mid-p) McNemar test of one paired eval.

    Attributes:
        b: questions right only in the baseline.
        c: questions right only in the candidate.
        n_discordant: ``b + c``.
        p_two_sided: two-sided p of "the accuracies differ", in [0, 1].
        p_one_sided: one-sided p of "the candidate regressed" (lost more questions than it gained), in [0, 1].
        mid_p: True when both p are mid-p values (Fagerland et al. 2013), False for the exact conditional test.
    """

    b: int
    c: int
    n_discordant: int
    p_two_sided: float
    p_one_sided: float
    mid_p: bool


def mcnemar(b: int, c: int, *, mid_p: bool = False) -> McNemarResult:
    """McNemar's test from the discordant counts of a paired eval, exact conditional binomial form.

    With ``n = b + c``, ``k = min(b, c)`` and ``X ~ Binom(n, 1/2)`` (McNemar 1947; the exact form as in
    Fagerland et al. 2013, eq. 2):

    - exact two-sided: ``p = min(1, 2 * P[X <= k])``; 1.0 when ``n == 0``.
    - exact one-sided for a regression (H1: a baseline-only question is more likely than a candidate-only one):
      ``p = P[X >= b]``; 1.0 when ``n == 0``.
    - mid-p (Fagerland et al. 2013, eq. 3; Lancaster 1961): subtract half the probability of the observed
      outcome from each tail before doubling: two-sided ``min(1, 2 * (P[X <= k] - P[X = k] / 2))``
      (= exact p - P[X = k] when b != c), one-sided ``P[X >= b] - P[X = b] / 2``. When ``b == c`` the two-sided mid-p is
      exactly 1. Fagerland et al. recommend mid-p because the exact test is conservative; the exact test is
      the default here because it is what the published release notes quote.

    Args:
        b: questions right only in the baseline (int >= 0).
        c: questions right only in the candidate (int >= 0).
        mid_p: return mid-p values instead of exact ones.
    Returns:
        McNemarResult.
    Raises:
        ValueError: ``b`` or ``c`` negative or not an integer (the message names the argument).
    """
    b = _count("b", b)
    c = _count("c", c)
    n = b + c
    if n == 0:
        return McNemarResult(b, c, 0, 1.0, 1.0, bool(mid_p))
    k = min(b, c)
    lower = float(binom.cdf(k, n, 0.5))
    upper_b = float(binom.sf(b - 1, n, 0.5))  # P[X >= b]
    if mid_p:
        lower -= 0.5 * float(binom.pmf(k, n, 0.5))
        upper_b -= 0.5 * float(binom.pmf(b, n, 0.5))
    return McNemarResult(b, c, n, min(1.0, 2.0 * lower), min(1.0, max(0.0, upper_b)), bool(mid_p))


# --------------------------------------------------------------------------------------------------------------
# Holm


@dataclass(frozen=True)
class HolmResult:
    """Holm's step-down adjustment of one hypothesis in a family.

    Attributes:
        p: the raw p-value.
        p_adjusted: the Holm-adjusted p-value, in [0, 1].
        reject: ``p_adjusted <= alpha``.
    """

    p: float
    p_adjusted: float
    reject: bool


def holm(pvalues: dict[str, float], alpha: float = 0.05) -> dict[str, HolmResult]:
    """Holm's (1979) step-down multiple-test procedure, as adjusted p-values.

    Sort the m p-values ascending, ``p_(1) <= ... <= p_(m)``. The adjusted value of the i-th (1-based) is
    ``max_{j <= i} min(1, (m - j + 1) * p_(j))`` (monotone in rank, capped at 1); a hypothesis is rejected at
    family-wise level ``alpha`` when its adjusted p is ``<= alpha``. Equal p-values get equal adjusted values.
    Matches ``statsmodels.stats.multitest.multipletests(method="holm")``.

    Args:
        pvalues: task name -> raw p-value in [0, 1]. May be empty.
        alpha: family-wise error rate in (0, 1).
    Returns:
        task name -> HolmResult, in the input's order.
    Raises:
        ValueError: a p-value outside [0, 1] or NaN, or alpha outside (0, 1).
    """
    alpha = _unit("alpha", alpha)
    ps = {k: _unit(f"pvalues[{k!r}]", v, open_interval=False) for k, v in pvalues.items()}
    m = len(ps)
    order = sorted(ps, key=lambda k: ps[k])
    adjusted: dict[str, float] = {}
    running = 0.0
    for i, key in enumerate(order):
        running = max(running, min(1.0, (m - i) * ps[key]))
        adjusted[key] = running
    return {k: HolmResult(ps[k], adjusted[k], adjusted[k] <= alpha) for k in pvalues}


# --------------------------------------------------------------------------------------------------------------
# Confidence interval of the paired difference


@dataclass(frozen=True)
class DiffCI:
    """Confidence interval of a paired accuracy difference, candidate - baseline, as fractions of n.

    Attributes:
        diff: the point estimate ``(c - b) / n``, in [-1, 1].
        lower, upper: the interval's bounds, ``-1 <= lower <= diff <= upper <= 1``.
        level: the confidence level, e.g. 0.95.
        method: the method's name (``"newcombe-10"``).
    """

    diff: float
    lower: float
    upper: float
    level: float
    method: str = "newcombe-10"


def wilson_interval(x: int, n: int, level: float = 0.95) -> tuple[float, float]:
    """Wilson's (1927) score interval of a single binomial proportion ``x / n`` (no continuity correction).

    ``(2x + z^2 -+ z * sqrt(z^2 + 4 x (n - x) / n)) / (2 (n + z^2))`` with ``z`` the ``(1 + level) / 2``
    normal quantile.

    Raises:
        ValueError: x or n not a non-negative integer, x > n, n == 0, or level outside (0, 1).
    """
    x, n = _count("x", x), _count("n", n)
    level = _unit("level", level)
    if n == 0 or x > n:
        raise ValueError(f"need 0 <= x <= n and n > 0, got x={x}, n={n}")
    z = float(norm.ppf(0.5 + level / 2))
    centre = 2 * x + z * z
    half = z * math.sqrt(z * z + 4.0 * x * (n - x) / n)
    denom = 2.0 * (n + z * z)
    return max(0.0, (centre - half) / denom), min(1.0, (centre + half) / denom)


def paired_diff_ci(a: int, b: int, c: int, d: int, *, level: float = 0.95) -> DiffCI:
    """Confidence interval of the accuracy difference candidate - baseline of a paired eval.

    Newcombe's (1998) method 10: a hybrid score interval built from the Wilson intervals of the two marginal
    accuracies, corrected for their correlation. With ``n = a + b + c + d``, candidate accuracy
    ``p1 = (a + c) / n`` with Wilson interval ``(l1, u1)``, baseline accuracy ``p2 = (a + b) / n`` with
    ``(l2, u2)``, ``D = p1 - p2 = (c - b) / n`` and the phi coefficient of the 2x2 table
    ``phi = (a d - b c) / sqrt((a + b)(c + d)(a + c)(b + d))`` (0 when the denominator is 0):

    ``lower = D - sqrt((p1 - l1)^2 - 2 phi (p1 - l1)(u2 - p2) + (u2 - p2)^2)``
    ``upper = D + sqrt((u1 - p1)^2 - 2 phi (u1 - p1)(p2 - l2) + (p2 - l2)^2)``

    Worked by hand (tests/validate/test_stats.py): (a, b, c, d) = (36, 2, 12, 6), D = 10/56 = 0.1786, phi = 0.3746,
    95% interval 0.0543 to 0.3010.

    Args:
        a: questions both got right; b: right only in the baseline; c: right only in the candidate;
        d: both got wrong. Non-negative ints, not all zero.
        level: confidence level in (0, 1).
    Returns:
        DiffCI with the bounds as fractions of n (multiply by 100 for percentage points).
    Raises:
        ValueError: a count negative or not an integer, all counts zero, or level outside (0, 1).
    """
    a, b, c, d = _count("a", a), _count("b", b), _count("c", c), _count("d", d)
    level = _unit("level", level)
    n = a + b + c + d
    if n == 0:
        raise ValueError("the table is empty (a + b + c + d == 0)")
    p1, p2 = (a + c) / n, (a + b) / n
    l1, u1 = wilson_interval(a + c, n, level)
    l2, u2 = wilson_interval(a + b, n, level)
    denom = (a + b) * (c + d) * (a + c) * (b + d)
    phi = (a * d - b * c) / math.sqrt(denom) if denom > 0 else 0.0
    diff = (c - b) / n
    lo = diff - math.sqrt(max(0.0, (p1 - l1) ** 2 - 2 * phi * (p1 - l1) * (u2 - p2) + (u2 - p2) ** 2))
    hi = diff + math.sqrt(max(0.0, (u1 - p1) ** 2 - 2 * phi * (u1 - p1) * (p2 - l2) + (p2 - l2) ** 2))
    return DiffCI(diff, max(-1.0, lo), min(1.0, hi), level)


# --------------------------------------------------------------------------------------------------------------
# Minimum detectable regression


def _critical_b(m: np.ndarray, alpha: float) -> np.ndarray:
    """Smallest b with ``P[Binom(m, 1/2) >= b] <= alpha`` for each m; ``m + 1`` where none exists."""
    k = binom.ppf(1.0 - alpha, m, 0.5).astype(np.int64) + 1  # first guess, then fix float boundary cases
    for _ in range(3):
        too_low = binom.sf(k - 1, m, 0.5) > alpha
        k = np.where(too_low, k + 1, k)
        ok_lower = (k - 1 >= 0) & (binom.sf(k - 2, m, 0.5) <= alpha)
        k = np.where(ok_lower, k - 1, k)
    return np.minimum(k, m + 1)


def min_detectable_regression(n: int, discordant_rate: float, alpha: float = 0.05, power: float = 0.8) -> float:
    """The smallest accuracy drop (a fraction of n) that the one-sided exact McNemar test detects with the
    given power, for a paired eval of ``n`` questions of which a share ``discordant_rate`` is discordant.

    Model: each question is discordant independently with probability ``r = discordant_rate``, so the number
    of discordant questions is ``M ~ Binom(n, r)``; a discordant question is baseline-only with probability
    ``pi``, so ``b | M = m ~ Binom(m, pi)``, and the expected accuracy drop (baseline - candidate) is
    ``delta = r (2 pi - 1)``. For each possible m the test rejects when ``b >= k(m)``, the smallest b with
    ``P[Binom(m, 1/2) >= b] <= alpha`` (the one-sided exact McNemar test of :func:`mcnemar`). Its power is
    ``sum_m P[M = m] * P[Binom(m, pi) >= k(m)]``, computed exactly over all m (no normal approximation),
    and increasing in pi; the split ``pi`` reaching ``power`` is found by bisection and returned as delta.
    Averaging over M (instead of fixing m = r n) smooths the saw-tooth of the exact test's power in m.
    The power calculation follows the conditional-on-discordants approach of Connor (1987, Biometrics
    43:207-211) with the exact test in place of the normal approximation.

    Args:
        n: questions in the eval (int >= 1).
        discordant_rate: share of discordant questions observed, in (0, 1] (e.g. 21 / 1319).
        alpha: one-sided significance level, in (0, 1).
        power: required power, in (0, 1).
    Returns:
        The minimum detectable drop as a fraction of n, in (0, discordant_rate]; ``math.inf`` when even a
        drop in every discordant question (pi = 1) does not reach the power (too few questions).
    Raises:
        ValueError: n not a positive integer, or a rate, alpha or power out of range.
    """
    n = _count("n", n)
    if n == 0:
        raise ValueError("n must be a positive integer, got 0")
    r = _unit("discordant_rate", discordant_rate, open_interval=False)
    if r == 0.0:
        raise ValueError("discordant_rate must be > 0 (no discordant questions: nothing is detectable)")
    alpha = _unit("alpha", alpha)
    power = _unit("power", power)
    m = np.arange(n + 1)
    w = binom.pmf(m, n, r)
    keep = w > 1e-15
    m, w = m[keep], w[keep]
    k = _critical_b(m, alpha)

    def power_at(pi: float) -> float:
        return float(np.sum(w * binom.sf(k - 1, m, pi)))

    if power_at(1.0) < power:
        return math.inf
    lo, hi = 0.5, 1.0
    for _ in range(60):
        mid = 0.5 * (lo + hi)
        if power_at(mid) >= power:
            hi = mid
        else:
            lo = mid
    return r * (2.0 * hi - 1.0)


@dataclass(frozen=True)
class TwoProportionResult:
    """One-sided two-proportion z-test that the candidate's share is below the baseline's.

    ``share_base`` / ``share_cand``: successes / trials of each side; ``drop_pts``: their difference in
    percentage points (positive = the candidate lower); ``z`` and ``p_one_sided`` from the pooled-variance test
    (statsmodels.stats.proportion.proportions_ztest, alternative "smaller"). Where the pooled share is 0 or 1
    both sides are equal and p is 1.
    """

    x_base: int
    n_base: int
    x_cand: int
    n_cand: int
    share_base: float
    share_cand: float
    drop_pts: float
    z: float
    p_one_sided: float


def two_proportion_drop(x_base: int, n_base: int, x_cand: int, n_cand: int) -> TwoProportionResult:
    """Test whether the candidate's share ``x_cand / n_cand`` is below the baseline's ``x_base / n_base``
    (:class:`TwoProportionResult`).

    Raises:
        ValueError: a count that is not a whole number >= 0, no trials on a side, or more successes than trials.
    """
    from statsmodels.stats.proportion import proportions_ztest

    xb, nb, xc, nc = (_count(k, v) for k, v in (("x_base", x_base), ("n_base", n_base), ("x_cand", x_cand),
                                                 ("n_cand", n_cand)))
    if nb < 1 or nc < 1:
        raise ValueError(f"no trials on a side (n_base {nb}, n_cand {nc})")
    if xb > nb or xc > nc:
        raise ValueError(f"more successes than trials (x_base {xb} / {nb}, x_cand {xc} / {nc})")
    sb, sc = xb / nb, xc / nc
    pooled = (xb + xc) / (nb + nc)
    if pooled in (0.0, 1.0):
        z, p = 0.0, 1.0
    else:
        z, p = proportions_ztest([xc, xb], [nc, nb], alternative="smaller")
        z, p = float(z), float(p)
    return TwoProportionResult(xb, nb, xc, nc, sb, sc, 100.0 * (sb - sc), z, p)

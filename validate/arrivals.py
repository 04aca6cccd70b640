"""Arrival schedules for open-loop load: when each request of a probe is due, seeded and reproducible.

Inter-arrival gaps are drawn from a gamma distribution with shape ``burstiness`` and mean ``1 / rate``
(scale ``1 / (rate * burstiness)``): shape 1 is the exponential, so arrivals are a Poisson process; a shape
below 1 is burstier (the same mean rate, more short gaps and a few long ones), above 1 more even. This is
``vllm bench serve``'s ``--request-rate R --burstiness B`` (vllm/benchmarks/serve.py draws
``np.random.gamma(shape=B, scale=1 / (R * B))``) and MLPerf LoadGen's Server scenario at B = 1.

The first request is due after the first gap, not at 0 (a Poisson process has no arrival at its start), so
``n`` gaps give ``n`` arrivals and the schedule's last time is the sum of the gaps.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Schedule:
    """A probe's arrivals: ``times_s[i]`` is when request i is due, seconds after the probe's start (sorted,
    positive). ``rate_per_s``, ``burstiness`` and ``seed`` are what drew it."""

    rate_per_s: float
    burstiness: float
    seed: int
    times_s: tuple[float, ...]

    @property
    def span_s(self) -> float:
        """When the last request is due (0 for an empty schedule)."""
        return self.times_s[-1] if self.times_s else 0.0


def _check(rate_per_s: float, burstiness: float) -> None:
    for name, v in (("rate_per_s", rate_per_s), ("burstiness", burstiness)):
        if isinstance(v, bool) or not (isinstance(v, (int, float)) and math.isfinite(v) and v > 0):
            raise ValueError(f"{name} must be a positive finite number, not {v!r}")


def gaps(rate_per_s: float, burstiness: float, n: int, seed: int) -> np.ndarray:
    """``n`` inter-arrival gaps (seconds, float64): gamma with shape ``burstiness`` and mean ``1 / rate_per_s``,
    from ``numpy.random.default_rng(seed)``.

    Raises:
        ValueError: the rate or the burstiness is not a positive finite number, or ``n`` is negative.
    """
    _check(rate_per_s, burstiness)
    if n < 0:
        raise ValueError(f"n must be >= 0, not {n}")
    rng = np.random.default_rng(seed)
    return rng.gamma(shape=burstiness, scale=1.0 / (rate_per_s * burstiness), size=n)


def schedule(rate_per_s: float, burstiness: float, *, min_duration_s: float, min_queries: int,
             seed: int) -> Schedule:
    """The arrivals of one probe: at least ``min_queries`` requests and at least ``min_duration_s`` seconds of
    schedule, whichever is longer (LoadGen's rule: a run is valid only when it meets both minimums), drawn at
    ``rate_per_s`` with gamma shape ``burstiness`` (:func:`gaps`). The same arguments give the same schedule.

    Raises:
        ValueError: a bad rate or burstiness (:func:`gaps`), or a negative minimum.
    """
    _check(rate_per_s, burstiness)
    if not (math.isfinite(min_duration_s) and min_duration_s >= 0) or min_queries < 0:
        raise ValueError(f"minimums must be >= 0 (min_duration_s {min_duration_s}, min_queries {min_queries})")
    # enough gaps for the duration with a wide margin (the sum of k gaps has sd sqrt(k / B) / rate), then cut
    k = max(min_queries, int(math.ceil(min_duration_s * rate_per_s * 1.5 + 10 * math.sqrt(
        max(1.0, min_duration_s * rate_per_s) / burstiness) + 10)))
    t = np.cumsum(gaps(rate_per_s, burstiness, k, seed))
    while t[-1] < min_duration_s:  # extremely unlikely: draw more from a seed of its own
        more = np.cumsum(gaps(rate_per_s, burstiness, k, seed + len(t))) + t[-1]
        t = np.concatenate([t, more])
    n = max(min_queries, int(np.searchsorted(t, min_duration_s, side="left")) + 1)
    return Schedule(float(rate_per_s), float(burstiness), int(seed), tuple(float(x) for x in t[:n]))

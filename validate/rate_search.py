"""The search for the highest arrival rate whose probe meets the SLO: bracketing, then bisection.

Bracketing starts at ``start``: while a probe meets the SLO the rate doubles, while one does not it halves,
until a rate that meets and one that does not are known (``lo`` < ``hi``). Bisection then probes their
geometric mean (rates are searched on a log scale: a factor of two matters as much at 0.5 req/s as at 50) and
keeps the half the answer lies in, until ``hi / lo <= 1 + rel_tolerance``. The SLO rate is ``lo``: the highest
rate probed that met the SLO. Every probe is counted against ``max_probes``; the search stops there and says so.

A probe that is not valid (the client could not send on schedule, or too few requests) tells nothing about the
server at that rate: it is treated as not meeting the SLO (the search does not go above it) and the result says
that its upper bound is the client's, not the server's.

Outcomes (``SearchResult.status``):

- ``found``: bracketed and narrowed to the tolerance (or to the probe budget, ``narrowed`` False);
- ``none meets``: no rate down to ``min_rate`` met the SLO (the result keeps the lowest probe);
- ``above range``: every rate up to ``max_rate`` met it (the SLO rate is at least the highest probed).

The search is monotone by assumption (a server that meets the SLO at a rate meets it at any lower one); the
probes are all kept, so a non-monotone curve is visible in the record.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Awaitable, Callable, Literal

Status = Literal["found", "none meets", "above range"]


@dataclass
class ProbeOutcome:
    """What the search needs of one probe: whether it met the SLO and whether it was a valid measurement."""

    rate_per_s: float
    meets: bool
    valid: bool = True
    why: str = ""


@dataclass
class SearchResult:
    """``slo_rate_per_s``: the highest rate probed that met the SLO (None when none did). ``lo`` / ``hi``: the
    final bracket (either None when one side was never found). ``probes``: every probe in the order run."""

    status: Status
    slo_rate_per_s: float | None
    lo: float | None
    hi: float | None
    probes: list[ProbeOutcome] = field(default_factory=list)
    narrowed: bool = False  # hi / lo reached 1 + rel_tolerance
    client_bound: bool = False  # the upper bound is a probe the client could not send on schedule
    budget_spent: bool = False  # max_probes ended the search


async def search(probe: Callable[[float], Awaitable[ProbeOutcome]], *, start: float, rel_tolerance: float = 0.1,
                 max_probes: int = 8, min_rate: float = 1e-3, max_rate: float = 1e4) -> SearchResult:
    """Search for the highest rate ``probe(rate)`` meets the SLO at (module docstring).

    Args:
        probe: runs one probe at a rate (requests/s) and says whether it met the SLO.
        start: the first rate probed; min_rate / max_rate: the bracketing stops past them.
        rel_tolerance: stop once ``hi / lo <= 1 + rel_tolerance``.
        max_probes: the most probes in all (bracketing and bisection).
    Raises:
        ValueError: a rate bound or the tolerance is not a positive finite number, ``start`` lies outside
            ``[min_rate, max_rate]``, or ``max_probes < 1``.
    """
    for name, v in (("start", start), ("rel_tolerance", rel_tolerance), ("min_rate", min_rate), ("max_rate", max_rate)):
        if not (math.isfinite(v) and v > 0):
            raise ValueError(f"{name} must be a positive finite number, not {v!r}")
    if not min_rate <= start <= max_rate:
        raise ValueError(f"start {start:g} lies outside [{min_rate:g}, {max_rate:g}]")
    if max_probes < 1:
        raise ValueError(f"max_probes must be >= 1, not {max_probes}")
    probes: list[ProbeOutcome] = []

    async def run(rate: float) -> bool:
        o = await probe(rate)
        probes.append(o)
        return o.meets and o.valid

    lo = hi = None
    rate = start
    at_bound = False  # bracketing stopped at min_rate or max_rate, not for want of probes
    while len(probes) < max_probes:
        if await run(rate):
            lo = rate
            if hi is not None:
                break
            if rate * 2 > max_rate:
                at_bound = True
                break
            rate *= 2
        else:
            hi = rate
            if lo is not None:
                break
            if rate / 2 < min_rate:
                at_bound = True
                break
            rate /= 2
    while lo is not None and hi is not None and hi / lo > 1 + rel_tolerance and len(probes) < max_probes:
        mid = math.sqrt(lo * hi)
        if await run(mid):
            lo = mid
        else:
            hi = mid
    res = SearchResult("found", lo, lo, hi, probes)
    if lo is None:
        res.status = "none meets"
    elif hi is None:
        res.status = "above range"
    res.narrowed = lo is not None and hi is not None and hi / lo <= 1 + rel_tolerance
    res.budget_spent = len(probes) >= max_probes and not res.narrowed and not at_bound
    if hi is not None:
        top = next((p for p in probes if p.rate_per_s == hi), None)
        res.client_bound = top is not None and not top.valid
    return res


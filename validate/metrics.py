"""Load metrics from raw per-request timings, in one pure function (tested without a server).

Definitions (formula version :data:`validate.record.METRICS_FORMULA_VERSION`; docs/metrics.md).
A *token-bearing chunk* carries non-empty text (content or reasoning) or non-empty ``token_ids``
(:mod:`validate.client`); role-only and empty chunks are not tokens. For one request, with

- ``t_1``: time from the request's send to the first token-bearing chunk, ``t_k`` to the last one;
- ``N``: output tokens, from the server's ``usage`` (never re-tokenized);
- ``n_1``: tokens the first token-bearing chunk carried (``len(token_ids)``; 1 when the server sends no ids),

the figures are:

- TTFT = ``t_1``: the time to the first chunk, however many tokens it carried (speculative decoding or a
  buffering server can send several at once). None when no token-bearing chunk arrived.
- ITL per chunk: gap between consecutive token-bearing chunks; ITL per token: that gap / tokens the later
  chunk carried.
- TPOT = ``(t_k - t_1) / (N - n_1)``: the time after the first chunk over the tokens that came after it (the
  first chunk's tokens belong to the prefill's time). None when the request failed, when ``N - n_1 < 1``, or
  when ``t_k - t_1 <= 0`` (every token in one chunk, or all chunks in one read): the decode rate is undefined
  there, and 0 would read as an infinite rate.
- Decode tok/s of a request: 1 / TPOT (the other common form, tokens / (E2EL - TTFT), counts the first
  chunk's tokens again and reads ~1/n high for an n-token answer).
- Aggregate output tok/s: total output tokens of successful requests / wall time of the run.
- Failed requests count as errors; they never contribute a latency or a token.
Percentiles are numpy's linear interpolation (the same as vLLM's benchmark client).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

from validate.client import RequestResult


def pct(values: list[float], q: float) -> float | None:
    """The ``q``-th percentile (0-100) of ``values``, or None when empty."""
    return float(np.percentile(np.asarray(values, dtype=float), q)) if values else None


def tpot_s(r: RequestResult) -> float | None:
    """Time per output token after the first chunk, seconds: ``(t_k - t_1) / (N - n_1)`` (module docstring).

    None for a failed request, one without a token-bearing chunk or usage, one whose tokens all came in the
    first chunk, or one whose later tokens span no time (the rate is undefined there, never 0 or infinite).
    """
    n = r.output_tokens
    if not r.ok or n is None or not r.chunk_times:
        return None
    # measured to the last token-bearing chunk, not to [DONE] or the usage chunk, which follow it
    later = n - (r.chunk_tokens[0] if r.chunk_tokens else 1)
    span = r.chunk_times[-1] - r.chunk_times[0]
    if later < 1 or span <= 0:
        return None
    return span / later


@dataclass
class LoadMetrics:
    """Summary of a batch of requests. Times in ms, rates in tokens/s."""

    requests: int
    ok: int
    errors: int
    wall_s: float
    output_tokens: int
    prompt_tokens: int
    output_tok_s: float
    prompt_tok_s: float
    ttft_ms_p50: float | None
    ttft_ms_p99: float | None
    tpot_ms_p50: float | None
    itl_ms_p50: float | None
    itl_ms_p99: float | None
    itl_token_ms_p50: float | None
    e2el_ms_p50: float | None
    decode_tok_s_p50: float | None

    def as_dict(self) -> dict:
        return asdict(self)


def summarize(results: list[RequestResult], wall_s: float) -> LoadMetrics:
    """Metrics of ``results`` measured over ``wall_s`` seconds of wall time. Raises ValueError if wall_s <= 0."""
    if wall_s <= 0:
        raise ValueError(f"wall_s must be positive, got {wall_s}")
    good = [r for r in results if r.ok]
    ttft = [r.ttft_s * 1e3 for r in good if r.ttft_s is not None]
    tpots = [t * 1e3 for r in good if (t := tpot_s(r)) is not None]
    itl, itl_tok = [], []
    for r in good:
        for i in range(1, len(r.chunk_times)):
            gap = (r.chunk_times[i] - r.chunk_times[i - 1]) * 1e3
            itl.append(gap)
            itl_tok.append(gap / max(1, r.chunk_tokens[i]))
    out_tok = sum(r.output_tokens or 0 for r in good)
    in_tok = sum(r.prompt_tokens or 0 for r in good)
    s = lambda v, q: None if (x := pct(v, q)) is None else round(x, 3)  # noqa: E731
    return LoadMetrics(
        requests=len(results), ok=len(good), errors=len(results) - len(good), wall_s=round(wall_s, 3),
        output_tokens=out_tok, prompt_tokens=in_tok,
        output_tok_s=round(out_tok / wall_s, 3), prompt_tok_s=round(in_tok / wall_s, 3),
        ttft_ms_p50=s(ttft, 50), ttft_ms_p99=s(ttft, 99), tpot_ms_p50=s(tpots, 50),
        itl_ms_p50=s(itl, 50), itl_ms_p99=s(itl, 99), itl_token_ms_p50=s(itl_tok, 50),
        e2el_ms_p50=s([r.e2el_s * 1e3 for r in good], 50),
        decode_tok_s_p50=None if not tpots else round(1e3 / float(np.median(tpots)), 3),
    )


# ---- suite-level formulas ---------------------------------------------------------------------------------
def median(values: list[float | None]) -> float | None:
    """The median of the values that are not None (statistics.median: the mean of the middle two for an even
    count), or None when there are none. Probe and BetterBench report their per-run figures this way."""
    import statistics

    v = [x for x in values if x is not None]
    return statistics.median(v) if v else None


def band(values: list[float | None]) -> dict:
    """{median, min, max} of the values that are not None, rounded to 0.001 (all None when there are none): a
    figure's run-to-run band across BetterBench's passes."""
    v = [x for x in values if x is not None]
    if not v:
        return {"median": None, "min": None, "max": None}
    return {"median": round(median(v), 3), "min": round(min(v), 3), "max": round(max(v), 3)}


def prefill_rate(depth: int, ttft_s: float | None) -> float | None:
    """Prefill tok/s of a D-token prompt sent alone with max_tokens 1: D / TTFT; None when TTFT is undefined."""
    return depth / ttft_s if ttft_s else None


def combined_decode(tpot_p50_ms: dict[int, float | None], max_num_seqs: int) -> float | None:
    """BetterBench's combined decode (tok/s): the geometric mean, over the concurrency levels up to
    ``max_num_seqs``, of the per-stream decode rate 1 / TPOT-p50 at that level (``tpot_p50_ms``: level -> ms);
    levels without a TPOT are left out; None when none is left."""
    import math

    rates = [1e3 / t for c, t in sorted(tpot_p50_ms.items()) if c <= max_num_seqs and t]
    return math.exp(sum(map(math.log, rates)) / len(rates)) if rates else None


# ---- open-loop load: the SLO, goodput -------------------------------------------------------------------
def meets_slo(r: RequestResult, ttft_ms: float | None, tpot_ms: float | None) -> bool:
    """Whether one request met the service-level objectives: it succeeded, its TTFT is at most ``ttft_ms`` and
    its TPOT (:func:`tpot_s`) at most ``tpot_ms`` (a limit of None is not checked). A request without a TPOT
    (every token in its first chunk) is judged on its TTFT alone: that chunk's time already holds the whole
    answer. This is ``vllm bench serve --goodput``'s per-request rule (vllm/benchmarks/serve.py: a request is
    good when each of its measured figures is within its SLO)."""
    if not r.ok or r.ttft_s is None:
        return False
    if ttft_ms is not None and r.ttft_s * 1e3 > ttft_ms:
        return False
    t = tpot_s(r)
    return not (tpot_ms is not None and t is not None and t * 1e3 > tpot_ms)


@dataclass
class ProbeMetrics:
    """One open-loop probe at a scheduled rate (times in ms, rates per second).

    ``good``: requests meeting the SLO per request (:func:`meets_slo`); ``goodput_per_s``: good / the probe's
    duration (first scheduled arrival's probe start to the last request's end); ``good_share``: good / requests.
    ``meets``: the probe meets the SLO the way MLPerf LoadGen's Server scenario judges a run: the ``percentile``-th
    TTFT and TPOT of all requests within their limits, and every request answered (a failed request has no
    latency, and leaving it out would flatter the percentile). ``lag_ms_*``: how late the client
    sent each request against its schedule.
    """

    rate_per_s: float
    requests: int
    ok: int
    errors: int
    good: int
    good_share: float | None
    duration_s: float
    achieved_rate_per_s: float
    goodput_per_s: float
    output_tok_s: float
    ttft_ms_p50: float | None
    ttft_ms_p99: float | None
    ttft_ms_pslo: float | None
    tpot_ms_p50: float | None
    tpot_ms_p99: float | None
    tpot_ms_pslo: float | None
    itl_ms_p99: float | None
    e2el_ms_p50: float | None
    lag_ms_p99: float | None
    lag_ms_max: float | None
    meets: bool

    def as_dict(self) -> dict:
        return asdict(self)


def probe_metrics(rate_per_s: float, results: list[RequestResult], lags_s: list[float], duration_s: float,
                  ttft_ms: float | None, tpot_ms: float | None, percentile: float = 99.0) -> ProbeMetrics:
    """The :class:`ProbeMetrics` of one probe.

    Args:
        results: every request of the probe, failed ones included.
        lags_s: per request, its send time minus its scheduled time (seconds).
        duration_s: the probe's wall time (seconds, > 0).
        ttft_ms, tpot_ms, percentile: the SLO (limits in ms; None leaves that figure unchecked).
    Raises:
        ValueError: ``duration_s`` is not positive or ``percentile`` lies outside (0, 100].
    """
    if not duration_s > 0:
        raise ValueError(f"duration_s must be positive, got {duration_s}")
    if not 0 < percentile <= 100:
        raise ValueError(f"percentile must lie in (0, 100], got {percentile}")
    good = [r for r in results if r.ok]
    n_good = sum(meets_slo(r, ttft_ms, tpot_ms) for r in results)
    ttft = [r.ttft_s * 1e3 for r in good if r.ttft_s is not None]
    tpot = [t * 1e3 for r in good if (t := tpot_s(r)) is not None]
    # the percentile the SLO is judged at counts a request without a TPOT as 0 (its TTFT holds its whole time)
    tpot_or_0 = [(t * 1e3 if (t := tpot_s(r)) is not None else 0.0) for r in good if r.ttft_s is not None]
    itl = [(r.chunk_times[i] - r.chunk_times[i - 1]) * 1e3 / max(1, r.chunk_tokens[i])
           for r in good for i in range(1, len(r.chunk_times))]
    r3 = lambda v, q: None if (x := pct(v, q)) is None else round(x, 3)  # noqa: E731
    ttft_p, tpot_p = r3(ttft, percentile), r3(tpot_or_0, percentile)
    # every request answered: a failed one has no latency, and leaving it out would flatter the percentile
    meets = bool(results) and len(good) == len(results) and ttft_p is not None and tpot_p is not None and (
        ttft_ms is None or ttft_p <= ttft_ms) and (tpot_ms is None or tpot_p <= tpot_ms)
    lag_ms = [x * 1e3 for x in lags_s]
    return ProbeMetrics(
        rate_per_s=rate_per_s, requests=len(results), ok=len(good), errors=len(results) - len(good), good=n_good,
        good_share=round(n_good / len(results), 6) if results else None, duration_s=round(duration_s, 3),
        achieved_rate_per_s=round(len(results) / duration_s, 4), goodput_per_s=round(n_good / duration_s, 4),
        output_tok_s=round(sum(r.output_tokens or 0 for r in good) / duration_s, 3),
        ttft_ms_p50=r3(ttft, 50), ttft_ms_p99=r3(ttft, 99), ttft_ms_pslo=ttft_p,
        tpot_ms_p50=r3(tpot, 50), tpot_ms_p99=r3(tpot, 99), tpot_ms_pslo=tpot_p, itl_ms_p99=r3(itl, 99),
        e2el_ms_p50=r3([r.e2el_s * 1e3 for r in good], 50), lag_ms_p99=r3(lag_ms, 99),
        lag_ms_max=round(max(lag_ms), 3) if lag_ms else None, meets=meets,
    )

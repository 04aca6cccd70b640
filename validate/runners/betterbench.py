"""BetterBench: the throughput record every release is compared on, measured in passes.

Each pass measures, on one launch:

- single-stream decode: a 512-token essay answer (ignore_eos), decode tok/s = 1 / TPOT, decode step = TPOT,
  TTFT of that request;
- prefill tok/s at depths 2k / 8k / 16k / 32k (depths above max_model_len - 8 are dropped; if none is left,
  max_model_len - 8 is used): a unique real-text prompt of exactly D tokens, max_tokens 1: D / TTFT;
- aggregate output tok/s at concurrency 1 / 2 / 4 / 8 / 16: N clients in a closed loop, each sending
  ``requests_per_client`` requests of a random 256-token real-text prompt and ``agg_tokens`` output tokens
  (ignore_eos); TTFT p50 / p99 and TPOT p50 at each level;
- a shared-prompt row per prompt type (:data:`SHARED_PROMPTS`: a code prompt and a JSON prompt):
  ``shared_copies`` copies of ONE chat prompt sent at once (not capped by max_num_seqs), each answering
  ``shared_tokens`` tokens (default ``agg_tokens``; ignore_eos): aggregate output tok/s, TTFT p50, TPOT p50
  (``shared_<type>_tok_s``, ``shared_<type>_ttft_ms_p50``, ``shared_<type>_tpot_ms_p50``). Near-identical requests
  are the serving best case: they share their prefix and, on a mixture-of-experts model, their routed experts;
- a prefix-repetition row: ``prefix_concurrency`` clients in a closed loop, ``requests_per_client`` requests each,
  every prompt one common real-text prefix of ``prefix_tokens`` tokens (a fresh window each pass, capped so that
  prefix + suffix + answer fit max_model_len) followed by a distinct real-text suffix of ``prefix_suffix_tokens``
  tokens, each answering ``prefix_output_tokens`` tokens (default ``agg_tokens``; ignore_eos): aggregate output
  tok/s, TTFT p50, TPOT p50 (``prefix_tok_s``, ``prefix_ttft_ms_p50``, ``prefix_tpot_ms_p50``) and, beside them,
  the server's prefix-cache hit rate over the row (``server_prefix_cache_hit_rate``: the increase of vLLM's
  ``vllm:prefix_cache_hits`` over that of ``vllm:prefix_cache_queries``, both in tokens, between a scrape of
  ``/metrics`` just before the row and one just after it). Where it cannot be read (no ``/metrics``, no such
  counters, counters that did not move because prefix caching is off, or that lie) the rate is None and
  ``metrics["server_prefix_cache_hit_rate_why"]`` says why, never 0. With a cold prefix each pass, ``n`` requests
  of ``P + S`` tokens and a cache that keeps whole blocks, the best rate is ``(n - 1) * P / (n * (P + S))`` for a
  block-aligned ``P`` (vLLM counts every prompt token as queried and the cached full blocks as hits). The hit rate
  is a share, neither a time nor a rate: the performance gate records it and never judges it.

**How many passes.** Where the suite's profile states no time budget, ``passes`` passes run. Where it states one
(``profiles.<profile>.budget_s``, :attr:`validate.runners.base.RunContext.budget_s`), the passes are sized to it
on the hardware they run on (:func:`pass_stop`): the first pass always runs, and another runs while the time since
the suite started (the text pool's build included) plus the slowest pass so far plus :data:`BUDGET_RESERVE_S` (the
engine's work after the runner) stays within the budget, up to ``max_passes``. ``min_passes`` (5) is the fewest a
side on which the performance gate decides with some noise between the sides (the one-sided exact Mann-Whitney p
of two sides of n passes is ``k / C(2n, n)`` where ``k`` counts the orderings at least as extreme: 4 a side give
1/70 = 0.014 only when every pass of one side lies beyond every pass of the other, and 2/70 = 0.029 with one pair
swapped, 4/70 = 0.057 with two; 5 a side keep p < 0.05 up to 4 swapped pairs of 25, 12/252 = 0.048; 3 a side
give at least 1/20 = 0.05, never below 0.05). Where the budget holds fewer, the passes that fit run and the record
says so (``passes_why``); the gate then says it cannot tell and how many passes would let it decide. The record
keeps the count run (``passes``), the count planned after the first pass (``passes_planned``), why the passes
stopped (``passes_stop``: ``count``, ``max_passes`` or ``budget``; ``passes_why`` in words) and each pass's wall
time (``pass_s``). The count run is a metric, never a measuring parameter: records of other counts compare
(validate.perfgate.MEASURING_PARAMS leaves the counts out).

**Combined decode** (tok/s) is the geometric mean, over the concurrency levels up to max_num_seqs, of the
per-stream decode rate 1 / TPOT-p50 at that level: the decode speed one user sees, averaged from a lone
stream to a full batch. One figure that moves with the decode step and with batching efficiency alike.

A figure that is undefined in a pass (no TPOT: the decode tokens after the first chunk span no time; no TTFT:
no token-bearing chunk) is an error of that step and left out of the pass, never a crash, a zero or an
infinite rate. Across passes the record keeps every pass, and for each figure the median and the min-max band.
The KV cache size in tokens is read from the server's log at start.

Per concurrency level the record also keeps latency samples of the successful requests of every pass, in ms
rounded to 0.01: ``metrics["latency_samples"]["c<N>"] = {"ttft_ms": [...], "itl_ms": [...], "ttft_count": n,
"itl_count": m}``, one TTFT per request and one per-token ITL per gap between consecutive token-bearing chunks
(the gap / tokens of the later chunk: :mod:`validate.metrics`). A list longer than
:data:`LATENCY_SAMPLES_MAX` is a seeded subsample of that many values in measurement order; the counts are
those measured before subsampling.
"""
from __future__ import annotations

import asyncio
import math
import random
import time
from dataclasses import dataclass, field
from typing import Any

import httpx
from pydantic import BaseModel, ConfigDict, Field, model_validator

from validate.client import OpenAIClient, RequestResult, gather_limited
from validate.metrics import LoadMetrics, band, combined_decode, prefill_rate, summarize, tpot_s
from validate.runners.base import RunContext, SuiteResult, recount
from validate.runners.text import ESSAY
from validate.runners.text import TextPool
from validate.data import needs_train_text
from validate.server_metrics import Snapshot, scrape
from validate.suite import register_runner

#: Most latency samples kept per concurrency level and kind (TTFT, ITL): at most 11 KB of record per 1,000 kept
#: (indented JSON); the full profile keeps about 11,000 (+125 KB), the quick one about 5,900 (+64 KB).
LATENCY_SAMPLES_MAX = 2000

#: Seconds of the budget kept for what the engine does after the runner within the suite's wall time (a /metrics
#: scrape, the server log's counters, the record's write): the passes are sized to the budget less this.
BUDGET_RESERVE_S = 1.0

#: The clock the passes are sized by (seconds, monotonic); a module name so that a test can give a fake one.
clock = time.monotonic

#: The shared-prompt rows' prompts, one per prompt type: fixed text here rather than a file under suites/data,
#: as :data:`validate.runners.text.ESSAY` is, because each defines what its figure measures and is sent as is (no
#: file to load, validate or hash into the record: the engine hash over validate/ already names the text), and
#: the record keeps them (``metrics["shared_prompts"]``). Short user messages, as a chat user sends them.
SHARED_PROMPTS: dict[str, str] = {
    "code": ("Write a Python function that reads a CSV file of orders with the columns id, customer, amount and "
             "date, and returns the total amount per customer per month. Use type hints, write a docstring, and "
             "add unit tests with pytest."),
    "json": ("Return a JSON object with the fields name, age, email, an address with street, city and postcode, "
             "and a list of three orders, each with an id, an item and a price, for a fictional customer. Answer "
             "with the JSON object only."),
}


class BetterBenchParams(BaseModel):
    model_config = ConfigDict(extra="forbid")
    passes: int = Field(20, ge=1, description="passes run where the suite's profile states no time budget (budget_s)")
    min_passes: int = Field(5, ge=1, description=(
        "with a time budget: the fewest passes a side on which the performance gate decides (a one-sided exact "
        "Mann-Whitney p < 0.05 with up to 4 of 25 pairs swapped); where the budget holds fewer, those that fit run "
        "and the record says so"))
    max_passes: int = Field(20, ge=1, description="with a time budget: the most passes run, however many would fit")
    decode_tokens: int = Field(512, ge=8)
    prefill_depths: list[int] = Field([2048, 8192, 16384, 32768], min_length=1)
    concurrency: list[int] = Field([1, 2, 4, 8, 16], min_length=1)
    requests_per_client: int = Field(2, ge=1)
    prompt_tokens: int = Field(256, ge=1)
    agg_tokens: int = Field(128, ge=2)
    shared_copies: int = Field(8, ge=1, description="copies of one prompt sent at once per shared-prompt row")
    shared_tokens: int | None = Field(None, ge=2, description="output tokens per copy; None: agg_tokens")
    prefix_tokens: int = Field(1024, ge=1, description="the prefix-repetition row's common prefix, tokens")
    prefix_suffix_tokens: int = Field(32, ge=1, description="each request's distinct suffix, tokens")
    prefix_concurrency: int = Field(8, ge=1, description="clients of the prefix-repetition row")
    prefix_output_tokens: int | None = Field(None, ge=2, description="output tokens per request; None: agg_tokens")
    seed: int = 0

    @model_validator(mode="after")
    def _counts(self):
        if self.min_passes > self.max_passes:
            raise ValueError(f"min_passes {self.min_passes} is above max_passes {self.max_passes}")
        return self


def pass_stop(p: BetterBenchParams, budget_s: float | None, elapsed_s: float, pass_s: list[float]) -> str | None:
    """Why no further pass runs, or None when one more does (the module docstring's rule).

    Args:
        p: the suite's params (``passes``, ``max_passes``).
        budget_s: the suite's time budget on its profile (seconds), None where it states none.
        elapsed_s: seconds since the suite started (the text pool's build and every pass so far).
        pass_s: each pass run so far, its wall time in seconds.
    Returns:
        None, ``"count"`` (no budget: ``passes`` ran), ``"max_passes"`` or ``"budget"`` (the slowest pass so far
        would end past ``budget_s`` less :data:`BUDGET_RESERVE_S`).
    """
    if budget_s is None:
        return "count" if len(pass_s) >= p.passes else None
    if len(pass_s) >= p.max_passes:
        return "max_passes"
    if pass_s and elapsed_s + max(pass_s) + BUDGET_RESERVE_S > budget_s:
        return "budget"
    return None


def passes_planned(p: BetterBenchParams, budget_s: float | None, elapsed_s: float, pass_s: list[float]) -> int:
    """How many passes :func:`pass_stop` would run if every later pass took as long as the slowest so far:
    ``passes`` without a budget, else ``len(pass_s) + floor((budget_s - BUDGET_RESERVE_S - elapsed_s) / slowest)``
    within [``len(pass_s)``, ``max_passes``]. Raises ValueError with a budget and no pass measured yet."""
    if budget_s is None:
        return p.passes
    if not pass_s:
        raise ValueError("the passes a budget holds are planned from a measured pass")
    slowest = max(max(pass_s), 1e-9)
    more = math.floor((budget_s - BUDGET_RESERVE_S - elapsed_s) / slowest)
    return min(p.max_passes, len(pass_s) + max(0, more))


def stop_sentence(p: BetterBenchParams, budget_s: float | None, stop: str, elapsed_s: float, pass_s: list[float],
                  run: int) -> str:
    """``metrics["passes_why"]``: why the passes stopped where they did, in words, and where the ``run`` passes
    that measured figures are fewer than ``min_passes`` under a budget, that the gate cannot decide on them."""
    if stop == "count":
        return f"{p.passes} passes: the profile states no time budget"
    took = f"passes took {min(pass_s):.1f} to {max(pass_s):.1f} s"
    if stop == "max_passes":
        out = f"max_passes {p.max_passes} ran within the {budget_s:g} s budget ({took}, {elapsed_s:.1f} s in all)"
    else:
        out = (f"the budget: one more pass would end at {elapsed_s + max(pass_s):.1f} s, past the {budget_s:g} s "
               f"budget less {BUDGET_RESERVE_S:g} s for the record ({took})")
    if run < p.min_passes:
        out += (f"; {run} passes measured, fewer than min_passes {p.min_passes}: the performance gate may not "
                "decide on them")
    return out


async def concurrency_step(client: OpenAIClient, streams: int, requests_per_client: int, prompts, max_tokens: int
                           ) -> tuple[LoadMetrics, list[RequestResult]]:
    """``streams`` clients in a closed loop, each sending ``requests_per_client`` completions of the token-id
    prompts ``prompts(k, j)`` with ``max_tokens`` output tokens (ignore_eos). Returns the metrics over the
    step's wall time and the raw results."""
    async def loop(k: int):
        res = []
        for j in range(requests_per_client):
            res.append(await client.completion(prompts(k, j), max_tokens=max_tokens, ignore_eos=True))
        return res

    t0 = time.perf_counter()
    lists = await gather_limited([loop(k) for k in range(streams)], limit=streams)
    wall = time.perf_counter() - t0
    results = [r for lst in lists for r in lst]
    return summarize(results, wall), results


async def shared_prompt_step(client: OpenAIClient, prompt: str, copies: int, max_tokens: int
                             ) -> tuple[LoadMetrics, list[RequestResult]]:
    """``copies`` chat completions of the one user message ``prompt``, all sent at once (none waits for another,
    however many the server batches), each answering ``max_tokens`` tokens (ignore_eos). Returns the metrics over
    the step's wall time (first send to last end) and the raw results, in send order."""
    t0 = time.perf_counter()
    res = list(await asyncio.gather(*(client.chat([{"role": "user", "content": prompt}], max_tokens=max_tokens,
                                                  ignore_eos=True) for _ in range(copies))))
    return summarize(res, time.perf_counter() - t0), res


async def scrape_url(url: str | None) -> tuple[Snapshot | None, str | None]:
    """:func:`validate.server_metrics.scrape` of ``url``/metrics on a client of its own (one per scrape: two a
    pass); (None, why) without a URL."""
    if not url:
        return None, "no server URL"
    async with httpx.AsyncClient() as http:
        return await scrape(http, url)


def prefix_hit_rate(before: tuple[Snapshot | None, str | None], after: tuple[Snapshot | None, str | None]
                    ) -> tuple[float | None, str | None]:
    """The server's prefix-cache hit rate between two scrapes (each ``(snapshot, why)`` as
    :func:`validate.server_metrics.scrape` returns it): the increase of ``vllm:prefix_cache_hits`` over that of
    ``vllm:prefix_cache_queries`` (tokens, to 1e-6), as ``(rate, None)``; or ``(None, why)`` where a scrape failed,
    a counter is not finite in either scrape, is missing from either (both counters are needed in both scrapes), is
    negative, went backwards, no query was counted (prefix caching off), or hits rose more than queries. Never 0 for
    a rate that could not be read."""
    (s0, w0), (s1, w1) = before, after
    if s0 is None:
        return None, f"before the row: {w0}"
    if s1 is None:
        return None, f"after the row: {w1}"
    keys = ("prefix_cache_queries", "prefix_cache_hits")
    bad = {k: v for k, v in {**s0.invalid, **s1.invalid}.items() if k in keys}
    if bad:
        return None, "counters that are not numbers: " + "; ".join(bad.values())
    for k in keys:
        if k not in s1.counters:
            return None, f"the server's /metrics has no vllm:{k} counter"
        if k not in s0.counters:
            return None, f"vllm:{k} appeared between the scrapes (no count before the row)"
    q0, h0, q1, h1 = (snap.counters[k] for snap in (s0, s1) for k in keys)
    if min(q0, h0, q1, h1) < 0:
        return None, f"impossible counters: a negative count (queries {q0} -> {q1}, hits {h0} -> {h1})"
    for k, a, b in (("prefix_cache_queries", q0, q1), ("prefix_cache_hits", h0, h1)):
        if b < a:
            return None, f"vllm:{k} went backwards between the scrapes (the server restarted during the row)"
    dq, dh = q1 - q0, h1 - h0
    if dq == 0:
        return None, "vllm:prefix_cache_queries did not move during the row (prefix caching is off)"
    if dh > dq:
        return None, f"impossible counters: prefix_cache_hits {dh:g} > prefix_cache_queries {dq:g}"
    return round(dh / dq, 6), None


async def shared_row(client: OpenAIClient, kind: str, copies: int, max_tokens: int
                     ) -> tuple[dict[str, float | None], list[RequestResult]]:
    """The shared-prompt row of prompt type ``kind`` (a key of :data:`SHARED_PROMPTS`): its figures
    ``shared_<kind>_tok_s`` (None when no copy succeeded, never 0), ``shared_<kind>_ttft_ms_p50`` and
    ``shared_<kind>_tpot_ms_p50`` (None where undefined), and the raw results."""
    m, res = await shared_prompt_step(client, SHARED_PROMPTS[kind], copies, max_tokens)
    return {f"shared_{kind}_tok_s": m.output_tok_s if m.ok else None, f"shared_{kind}_ttft_ms_p50": m.ttft_ms_p50,
            f"shared_{kind}_tpot_ms_p50": m.tpot_ms_p50}, res


async def prefix_row(client: OpenAIClient, pool: TextPool, rng: random.Random, prefix_tokens: int, suffix_tokens: int,
                     streams: int, requests_per_client: int, max_tokens: int, metrics_url: str | None
                     ) -> tuple[dict[str, float | None], str | None, list[RequestResult]]:
    """The prefix-repetition row: one ``prefix_tokens``-token window of ``pool`` drawn with ``rng`` as the common
    prefix, ``streams`` x ``requests_per_client`` suffixes of ``suffix_tokens`` tokens from distinct offsets of the
    pool, sent by :func:`concurrency_step`, ``/metrics`` of ``metrics_url`` scraped just before and just after.
    Returns the figures (``prefix_tok_s``: None when no request succeeded; ``prefix_ttft_ms_p50``,
    ``prefix_tpot_ms_p50``, ``server_prefix_cache_hit_rate``), why the hit rate is None (else None) and the raw
    results. Raises ValueError when the pool is shorter than the prefix or holds fewer offsets than requests."""
    prefix = pool.window(prefix_tokens, rng)
    n = streams * requests_per_client
    offsets = rng.sample(range(len(pool.ids)), n)
    suffixes = {(k, j): pool.window_at(suffix_tokens, offsets[k * requests_per_client + j])
                for k in range(streams) for j in range(requests_per_client)}
    before = await scrape_url(metrics_url)
    m, res = await concurrency_step(client, streams, requests_per_client, lambda k, j: prefix + suffixes[(k, j)],
                                    max_tokens)
    rate, why = prefix_hit_rate(before, await scrape_url(metrics_url))
    return {"prefix_tok_s": m.output_tok_s if m.ok else None, "prefix_ttft_ms_p50": m.ttft_ms_p50,
            "prefix_tpot_ms_p50": m.tpot_ms_p50, "server_prefix_cache_hit_rate": rate}, why, res


def latency_values(results: list[RequestResult]) -> tuple[list[float], list[float]]:
    """(TTFT ms, per-token ITL ms) of the successful ``results``: one TTFT per request with a token-bearing
    chunk, one ITL per gap between consecutive token-bearing chunks, divided by the tokens of the later chunk."""
    ttft, itl = [], []
    for r in results:
        if not r.ok or not r.chunk_times:
            continue
        ttft.append(r.chunk_times[0] * 1e3)
        for i in range(1, len(r.chunk_times)):
            itl.append((r.chunk_times[i] - r.chunk_times[i - 1]) * 1e3 / max(1, r.chunk_tokens[i]))
    return ttft, itl


def cap_samples(values: list[float], cap: int, rng: random.Random) -> list[float]:
    """``values`` rounded to 0.01; when longer than ``cap``, a subsample of ``cap`` of them drawn with ``rng``,
    kept in their original order."""
    if len(values) > cap:
        values = [values[i] for i in sorted(rng.sample(range(len(values)), cap))]
    return [round(v, 2) for v in values]


def latency_samples(latency: dict[int, tuple[list[float], list[float]]], seed: int) -> dict:
    """The record's ``latency_samples``: per level ``c<N>``, the TTFT and ITL values (ms) capped at
    :data:`LATENCY_SAMPLES_MAX` each (seeded per level and kind, so a rerun keeps the same positions)."""
    out = {}
    for c, (ttft, itl) in latency.items():
        out[f"c{c}"] = {"ttft_ms": cap_samples(ttft, LATENCY_SAMPLES_MAX, random.Random(f"{seed}/c{c}/ttft")),
                        "itl_ms": cap_samples(itl, LATENCY_SAMPLES_MAX, random.Random(f"{seed}/c{c}/itl")),
                        "ttft_count": len(ttft), "itl_count": len(itl)}
    return out


class Band(BaseModel):
    model_config = ConfigDict(extra="forbid")
    median: float | None = None
    min: float | None = None
    max: float | None = None


class BetterBenchMetrics(BaseModel):
    """What a BetterBench record's ``metrics`` hold (times in ms, rates in tok/s)."""

    model_config = ConfigDict(extra="forbid")
    passes: int
    prefill_depths: list[int]
    concurrency: list[int]
    summary: dict[str, Band] = Field(description="every per-pass figure's median and min-max band")
    per_pass: list[dict[str, float | int | None]]
    passes_planned: int | None = Field(None, description="passes planned after the first (passes without a budget)")
    passes_stop: str | None = Field(None, description="why the passes stopped: count, max_passes or budget")
    passes_why: str | None = Field(None, description="passes_stop in words, and a count below min_passes")
    pass_s: list[float] = Field(default_factory=list, description="each pass's wall time (s), failed ones included")
    latency_samples: dict[str, dict[str, Any]] = Field(default_factory=dict)
    formula: str
    combined_decode_tok_s: float | None = None
    decode_tok_s: float | None = None
    decode_step_ms: float | None = None
    shared_prompts: dict[str, str] = Field(default_factory=dict, description="the shared-prompt rows' prompts")
    prefix_tokens: int | None = Field(None, description="the prefix row's common prefix as sent (tokens)")
    server_prefix_cache_hit_rate_why: str | None = Field(
        None, description="why the server's prefix-cache hit rate is None in a pass (the first such pass)")


def figures(records: list) -> list:
    """The notes' BetterBench figures: decode step, single-stream decode, combined decode, aggregate tok/s at each
    concurrency level, prefill tok/s at each depth, the shared-prompt rows' aggregate tok/s and TTFT p50 per prompt
    type, the prefix row's aggregate tok/s and TTFT p50, each with its band across passes, and the server's
    prefix-cache hit rate over the prefix row (percent, its band; no per-pass figure: the gate never judges it)."""
    from validate.figures import FigureSpec, banded, metric

    depths = sorted({d for r in records for d in r.metrics.get("prefill_depths", [])})
    levels = sorted({c for r in records for c in r.metrics.get("concurrency", [])})
    out = [FigureSpec("bb_step", "decode step p50 (BetterBench)", "betterbench", "ms", 2, False, *banded("decode_step_ms")),
           FigureSpec("bb_decode", "single-stream decode (BetterBench)", "betterbench", "tok/s", 1, True, *banded("decode_tok_s")),
           FigureSpec("bb_combined", "BetterBench combined decode", "betterbench", "tok/s", 1, True,
                      *banded("combined_decode_tok_s"))]
    out += [FigureSpec(f"bb_c{c}", f"concurrency {c} (aggregate)", "betterbench", "tok/s", 1, True, *banded(f"c{c}_tok_s"))
            for c in levels]
    out += [FigureSpec(f"bb_prefill_{d}", f"prefill {d:,} tokens", "betterbench", "tok/s", 0, True,
                       *banded(f"prefill_{d}_tok_s")) for d in depths]
    for kind in SHARED_PROMPTS:
        out += [FigureSpec(f"bb_shared_{kind}", f"copies of one prompt, {kind} (aggregate)", "betterbench", "tok/s", 1,
                           True, *banded(f"shared_{kind}_tok_s")),
                FigureSpec(f"bb_shared_{kind}_ttft", f"copies of one prompt, {kind}: TTFT p50", "betterbench", "ms", 0,
                           False, *banded(f"shared_{kind}_ttft_ms_p50"))]
    out += [FigureSpec("bb_prefix", "shared prefix (aggregate)", "betterbench", "tok/s", 1, True,
                       *banded("prefix_tok_s")),
            FigureSpec("bb_prefix_ttft", "shared prefix: TTFT p50", "betterbench", "ms", 0, False,
                       *banded("prefix_ttft_ms_p50"))]

    def pct(*path: str):  # a share in the record, percent in the notes
        return lambda r: None if (v := metric(*path)(r)) is None else 100.0 * v

    def pct_band(r):
        lo, hi = (pct("summary", "server_prefix_cache_hit_rate", k)(r) for k in ("min", "max"))
        return None if lo is None or hi is None else (lo, hi)
    out.append(FigureSpec("bb_prefix_hit", "shared prefix: server prefix-cache hit rate", "betterbench", "%", 1, True,
                          pct("summary", "server_prefix_cache_hit_rate", "median"), pct_band))
    return out


def headline(rec) -> str | None:
    v = rec.metrics.get("combined_decode_tok_s")
    return f"BetterBench combined {v:.1f} tok/s" if v else None


def summary(rec) -> str:
    m = rec.metrics
    return f"combined {m['combined_decode_tok_s']} tok/s, {m['passes']} passes"


def audit(rec, folder) -> list[str]:
    """Why a BetterBench record does not stand on its passes (empty when it does): the notes' figures and title
    read ``metrics.summary`` and the performance gate reads ``metrics.per_pass``, so the summary is recomputed from
    the passes (each figure's median, min and max, :func:`validate.metrics.band`), the headline figures from the
    summary, the pass count from the rows, and each pass's combined decode from its TPOT p50s at the levels up to
    the configuration's ``max_num_seqs`` (:func:`validate.metrics.combined_decode`, within 0.1 %: the rows keep
    three decimals). A record without passes has nothing to recompute. ``folder`` is not read."""
    m = rec.metrics if isinstance(rec.metrics, dict) else {}
    rows = m.get("per_pass")
    if not isinstance(rows, list) or not rows:
        return []
    if not all(isinstance(r, dict) for r in rows):
        return ["its per-pass rows are not all rows of figures"]
    keys = list(dict.fromkeys(k for r in rows for k in r if k != "pass"))
    want: dict = {"passes": len(rows)}
    sm = m.get("summary") if isinstance(m.get("summary"), dict) else {}
    for k in keys:
        vals = [r.get(k) for r in rows]
        if any(v is not None and (isinstance(v, bool) or not isinstance(v, (int, float))) for v in vals):
            return [f"its per-pass {k} holds a value that is no number"]
        for stat, v in band(vals).items():
            want[f"summary.{k}.{stat}"] = v
    flat = {"passes": m.get("passes")}
    flat.update({f"summary.{k}.{stat}": (b or {}).get(stat) if isinstance(b, dict) else b
                 for k, b in sm.items() for stat in ("median", "min", "max")})
    extra = sorted(set(sm) - set(keys))
    # what it holds must be its passes'; a figure it leaves out of the summary is shown nowhere (not a false one)
    out = recount(flat, {k: v for k, v in want.items() if k in flat and flat[k] is not None or k == "passes"},
                  "its summary is not its passes'")
    if extra:
        out.append(f"its summary holds {', '.join(extra[:4])}, which no pass measured")
    heads = {k: want.get(f"summary.{k}.median") for k in ("combined_decode_tok_s", "decode_tok_s", "decode_step_ms")
             if m.get(k) is not None}
    out += recount({k: m.get(k) for k in heads}, heads, "its headline figures are not its summary's medians")
    snap = rec.config_snapshot if isinstance(rec.config_snapshot, dict) else {}
    mns = (snap.get("server") or {}).get("max_num_seqs") if isinstance(snap.get("server"), dict) else None
    levels = m.get("concurrency") if isinstance(m.get("concurrency"), list) else []
    if isinstance(mns, int) and levels:
        off = []
        for i, r in enumerate(rows):
            said = r.get("combined_decode_tok_s")
            tpots = {c: r.get(f"c{c}_tpot_ms_p50") for c in levels if isinstance(c, int)}
            if said is None or any(t is None for c, t in tpots.items() if c <= mns):
                continue
            got = combined_decode(tpots, mns)
            if got is None or abs(said - got) > 1e-3 * got:
                off.append(f"pass {r.get('pass', i)}: {said!r}, its TPOTs give {got if got is None else round(got, 3)}")
        if off:
            out.append("its combined decode is not its TPOTs': " + "; ".join(off[:3]) + (" ..." if len(off) > 3 else ""))
    return out


@dataclass
class Bench:
    """What every pass of one run shares: the context, the params, the sizes as run (prefill ``depths``, concurrency
    ``levels``, the rows' answer lengths, the prefix length), the text pool and its seeded draw, and what the passes
    add to: per level the (TTFT ms, ITL ms) samples, the failed steps' lines, per pass without a hit rate why."""

    ctx: RunContext
    p: BetterBenchParams
    pool: TextPool
    depths: list[int]
    levels: list[int]
    shared_out: int
    prefix_out: int
    prefix_len: int
    rng: random.Random
    latency: dict[int, tuple[list[float], list[float]]] = field(default_factory=dict)
    failed: list[str] = field(default_factory=list)
    no_hit_rate: list[str] = field(default_factory=list)


async def measure_pass(b: Bench, n: int) -> dict | None:
    """Pass ``n``: every row once, as the module docstring lists them. Returns the pass's figures (floats to 3
    decimals), or None when its decode request failed (the pass is left out; the line is in ``b.failed``)."""
    ctx, p, s = b.ctx, b.p, b.ctx.config.server
    row: dict = {"pass": n}
    r = await ctx.client.chat([{"role": "user", "content": ESSAY}], max_tokens=p.decode_tokens, ignore_eos=True)
    ctx.progress(1)
    if not r.ok:
        b.failed.append(f"pass {n} decode: {r.error}")
        return None
    t = tpot_s(r)
    if t is None:  # the decode rate is undefined: an error of this step, never 1 / 0
        b.failed.append(f"pass {n} decode: no TPOT (the tokens after the first chunk span no time)")
    else:
        row.update(decode_tok_s=1 / t, decode_step_ms=t * 1e3)
    if r.ttft_s is not None:
        row["ttft_ms"] = r.ttft_s * 1e3
    for d in b.depths:
        r = await ctx.client.completion(b.pool.window(d, b.rng), max_tokens=1)
        ctx.progress(1)
        if not r.ok:
            b.failed.append(f"pass {n} prefill {d}: {r.error}")
            continue
        if not r.ttft_s:
            b.failed.append(f"pass {n} prefill {d}: no token-bearing chunk, TTFT undefined")
            continue
        row[f"prefill_{d}_tok_s"] = prefill_rate(d, r.ttft_s)
    for c in b.levels:
        windows = {(k, j): b.pool.window(p.prompt_tokens, b.rng) for k in range(c) for j in range(p.requests_per_client)}
        m, res = await concurrency_step(ctx.client, c, p.requests_per_client, lambda k, j: windows[(k, j)], p.agg_tokens)
        ctx.progress(len(res))
        if m.errors:
            b.failed.append(f"pass {n} concurrency {c}: {m.errors} errors; first: {next(x.error for x in res if not x.ok)}")
        ttft, itl = latency_values(res)
        b.latency[c][0].extend(ttft)
        b.latency[c][1].extend(itl)
        row[f"c{c}_tok_s"] = m.output_tok_s
        row[f"c{c}_ttft_ms_p50"] = m.ttft_ms_p50
        row[f"c{c}_ttft_ms_p99"] = m.ttft_ms_p99
        row[f"c{c}_tpot_ms_p50"] = m.tpot_ms_p50
    for kind in SHARED_PROMPTS:  # after the levels: the figures above are measured as they were without these rows
        figs, res = await shared_row(ctx.client, kind, p.shared_copies, b.shared_out)
        ctx.progress(len(res))
        if bad := [x for x in res if not x.ok]:
            b.failed.append(f"pass {n} shared prompt {kind}: {len(bad)} errors; first: {bad[0].error}")
        row.update(figs)
    if b.prefix_len >= 1:
        figs, why, res = await prefix_row(ctx.client, b.pool, b.rng, b.prefix_len, p.prefix_suffix_tokens,
                                          p.prefix_concurrency, p.requests_per_client, b.prefix_out,
                                          ctx.client.base_url)
        ctx.progress(len(res))
        if bad := [x for x in res if not x.ok]:
            b.failed.append(f"pass {n} prefix row: {len(bad)} errors; first: {bad[0].error}")
        if why:
            b.no_hit_rate.append(f"pass {n}: {why}")
        row.update(figs)
    undefined = [c for c in b.levels if c <= s.max_num_seqs and row.get(f"c{c}_tpot_ms_p50") is None]
    if undefined:  # leaving a level out would make combined decode read as another figure (and faster)
        b.failed.append(f"pass {n}: no TPOT at concurrency {', '.join(map(str, undefined))} (every token of an answer "
                        "in one chunk, or no request succeeded): combined decode undefined")
        row["combined_decode_tok_s"] = None
    else:
        row["combined_decode_tok_s"] = combined_decode({c: row.get(f"c{c}_tpot_ms_p50") for c in b.levels},
                                                       s.max_num_seqs)
    return {k: (round(v, 3) if isinstance(v, float) else v) for k, v in row.items()}


@register_runner("betterbench", BetterBenchParams, preflight=needs_train_text, sample_server_s=5.0,
                 metrics_model=BetterBenchMetrics, figures=figures, headline=headline, summary=summary, order=20,
                 audit=audit, audit_hashes=False)
async def run(ctx: RunContext, p: BetterBenchParams) -> SuiteResult:
    t0 = clock()  # the budget covers the text pool's build too
    s = ctx.config.server
    limit = s.max_model_len - 8
    depths = [d for d in p.prefill_depths if d <= limit] or [limit]
    levels = list(p.concurrency)
    prefix_out = p.prefix_output_tokens or p.agg_tokens
    # the prefix row's prompt and answer fit the context, as the prefill depths do
    prefix_len = min(p.prefix_tokens, s.max_model_len - 8 - p.prefix_suffix_tokens - prefix_out)
    pool = await TextPool.build(ctx.client, ctx.data_dir,
                                min_tokens=max(max(depths) * 2, 8192, 2 * max(prefix_len, 0)))
    b = Bench(ctx, p, pool, depths, levels, p.shared_tokens or p.agg_tokens, prefix_out, prefix_len,
              random.Random(p.seed), latency={c: ([], []) for c in levels})
    prefix_n = p.prefix_concurrency * p.requests_per_client
    per_pass_requests = (1 + len(depths) + sum(c * p.requests_per_client for c in levels)
                         + len(SHARED_PROMPTS) * p.shared_copies + prefix_n * (prefix_len >= 1))
    budget = ctx.budget_s
    planned = passes_planned(p, None, 0.0, []) if budget is None else None
    if prefix_len < 1:
        b.failed.append(f"prefix row: max_model_len {s.max_model_len} leaves no room for a prefix before "
                        f"{p.prefix_suffix_tokens} suffix and {prefix_out} answer tokens")
    passes: list[dict] = []
    pass_s: list[float] = []
    while (stop := pass_stop(p, budget, clock() - t0, pass_s)) is None:
        n = len(pass_s)
        plan = max(planned, n + 1) if planned is not None else None
        ctx.progress(0, total=plan * per_pass_requests if plan else None,
                     description=f"pass {n + 1} of {plan or '?'}" + (f" ({budget:g} s budget)" if budget else ""))
        start = clock()
        row = await measure_pass(b, n)
        pass_s.append(clock() - start)
        if row is not None:
            passes.append(row)
        if planned is None:  # the first pass says what a pass takes here
            planned = passes_planned(p, budget, clock() - t0, pass_s)
    why = stop_sentence(p, budget, stop, clock() - t0, pass_s, len(passes))
    ctx.log(f"betterbench: {len(passes)} passes ({why})")
    out = SuiteResult()
    if b.failed:
        out.errors.append(f"{len(b.failed)} BetterBench steps failed; first: {b.failed[0]}")
    keys = list(dict.fromkeys(k for row in passes for k in row if k != "pass"))  # a figure may miss in some passes
    out.metrics = {
        "passes": len(passes), "passes_planned": planned, "passes_stop": stop, "passes_why": why,
        "pass_s": [round(t, 2) for t in pass_s], "prefill_depths": depths, "concurrency": levels,
        "summary": {k: band([row.get(k) for row in passes]) for k in keys},
        "per_pass": passes,
        "latency_samples": latency_samples(b.latency, p.seed),
        "formula": "combined_decode = geometric mean over concurrency <= max_num_seqs of 1/TPOT-p50",
        "shared_prompts": dict(SHARED_PROMPTS),
        "prefix_tokens": prefix_len if prefix_len >= 1 else None,
        "server_prefix_cache_hit_rate_why": (f"no hit rate in {len(b.no_hit_rate)} of {len(pass_s)} passes; first: "
                                             f"{b.no_hit_rate[0]}") if b.no_hit_rate else None,
    }
    if passes:
        sm = out.metrics["summary"]
        out.metrics.update({k: sm[k]["median"] if k in sm else None
                            for k in ("combined_decode_tok_s", "decode_tok_s", "decode_step_ms")})
    return out

"""BetterBench: the throughput record every release is compared on, measured in passes.

Each pass measures, on one launch:

- single-stream decode: a 512-token essay answer (ignore_eos), decode tok/s = 1 / TPOT, decode step = TPOT,
  TTFT of that request;
- prefill tok/s at depths 2k / 8k / 16k / 32k (depths above max_model_len - 8 are dropped; if none is left,
  max_model_len - 8 is used): a unique real-text prompt of exactly D tokens, max_tokens 1: D / TTFT;
- aggregate output tok/s at concurrency 1 / 2 / 4 / 8 / 16: N clients in a closed loop, each sending
  ``requests_per_client`` requests of a random 256-token real-text prompt and ``agg_tokens`` output tokens
  (ignore_eos); TTFT p50 / p99 and TPOT p50 at each level.

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

import random
import time

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from validate.client import OpenAIClient, RequestResult, gather_limited
from validate.metrics import LoadMetrics, band, combined_decode, prefill_rate, summarize, tpot_s
from validate.runners.base import RunContext, SuiteResult
from validate.runners.text import ESSAY
from validate.runners.text import TextPool
from validate.data import needs_train_text
from validate.suite import register_runner

#: Most latency samples kept per concurrency level and kind (TTFT, ITL): at most 11 KB of record per 1,000 kept
#: (indented JSON); the full profile keeps about 11,000 (+125 KB), the quick one about 5,900 (+64 KB).
LATENCY_SAMPLES_MAX = 2000


class BetterBenchParams(BaseModel):
    model_config = ConfigDict(extra="forbid")
    passes: int = Field(20, ge=1)
    decode_tokens: int = Field(512, ge=8)
    prefill_depths: list[int] = Field([2048, 8192, 16384, 32768], min_length=1)
    concurrency: list[int] = Field([1, 2, 4, 8, 16], min_length=1)
    requests_per_client: int = Field(2, ge=1)
    prompt_tokens: int = Field(256, ge=1)
    agg_tokens: int = Field(128, ge=2)
    seed: int = 0


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
    latency_samples: dict[str, dict[str, Any]] = Field(default_factory=dict)
    formula: str
    combined_decode_tok_s: float | None = None
    decode_tok_s: float | None = None
    decode_step_ms: float | None = None


def figures(records: list) -> list:
    """The notes' BetterBench figures: decode step, single-stream decode, combined decode, aggregate tok/s at each
    concurrency level, prefill tok/s at each depth, each with its band across passes."""
    from validate.figures import FigureSpec, banded

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
    return out


def headline(rec) -> str | None:
    v = rec.metrics.get("combined_decode_tok_s")
    return f"BetterBench combined {v:.1f} tok/s" if v else None


def summary(rec) -> str:
    m = rec.metrics
    return f"combined {m['combined_decode_tok_s']} tok/s, {m['passes']} passes"


@register_runner("betterbench", BetterBenchParams, preflight=needs_train_text, sample_server_s=5.0,
                 metrics_model=BetterBenchMetrics, figures=figures, headline=headline, summary=summary, order=20)
async def run(ctx: RunContext, p: BetterBenchParams) -> SuiteResult:
    s = ctx.config.server
    limit = s.max_model_len - 8
    depths = [d for d in p.prefill_depths if d <= limit] or [limit]
    levels = list(p.concurrency)
    pool = await TextPool.build(ctx.client, ctx.data_dir, min_tokens=max(max(depths) * 2, 8192))
    per_pass_requests = 1 + len(depths) + sum(c * p.requests_per_client for c in levels)
    ctx.progress(0, total=p.passes * per_pass_requests, description="betterbench")
    rng = random.Random(p.seed)
    passes, failed = [], []
    latency: dict[int, tuple[list[float], list[float]]] = {c: ([], []) for c in levels}
    for n in range(p.passes):
        row: dict = {"pass": n}
        r = await ctx.client.chat([{"role": "user", "content": ESSAY}], max_tokens=p.decode_tokens, ignore_eos=True)
        ctx.progress(1)
        if not r.ok:
            failed.append(f"pass {n} decode: {r.error}")
            continue
        t = tpot_s(r)
        if t is None:  # the decode rate is undefined: an error of this step, never 1 / 0
            failed.append(f"pass {n} decode: no TPOT (the tokens after the first chunk span no time)")
        else:
            row.update(decode_tok_s=1 / t, decode_step_ms=t * 1e3)
        if r.ttft_s is not None:
            row["ttft_ms"] = r.ttft_s * 1e3
        for d in depths:
            r = await ctx.client.completion(pool.window(d, rng), max_tokens=1)
            ctx.progress(1)
            if not r.ok:
                failed.append(f"pass {n} prefill {d}: {r.error}")
                continue
            if not r.ttft_s:
                failed.append(f"pass {n} prefill {d}: no token-bearing chunk, TTFT undefined")
                continue
            row[f"prefill_{d}_tok_s"] = prefill_rate(d, r.ttft_s)
        for c in levels:
            windows = {(k, j): pool.window(p.prompt_tokens, rng) for k in range(c) for j in range(p.requests_per_client)}
            m, res = await concurrency_step(ctx.client, c, p.requests_per_client, lambda k, j: windows[(k, j)], p.agg_tokens)
            ctx.progress(len(res))
            if m.errors:
                failed.append(f"pass {n} concurrency {c}: {m.errors} errors; first: {next(x.error for x in res if not x.ok)}")
            ttft, itl = latency_values(res)
            latency[c][0].extend(ttft)
            latency[c][1].extend(itl)
            row[f"c{c}_tok_s"] = m.output_tok_s
            row[f"c{c}_ttft_ms_p50"] = m.ttft_ms_p50
            row[f"c{c}_ttft_ms_p99"] = m.ttft_ms_p99
            row[f"c{c}_tpot_ms_p50"] = m.tpot_ms_p50
        undefined = [c for c in levels if c <= s.max_num_seqs and row.get(f"c{c}_tpot_ms_p50") is None]
        if undefined:  # leaving a level out would make combined decode read as another figure (and faster)
            failed.append(f"pass {n}: no TPOT at concurrency {', '.join(map(str, undefined))} (every token of an answer "
                          "in one chunk, or no request succeeded): combined decode undefined")
            row["combined_decode_tok_s"] = None
        else:
            row["combined_decode_tok_s"] = combined_decode({c: row.get(f"c{c}_tpot_ms_p50") for c in levels},
                                                           s.max_num_seqs)
        passes.append({k: (round(v, 3) if isinstance(v, float) else v) for k, v in row.items()})
    out = SuiteResult()
    if failed:
        out.errors.append(f"{len(failed)} BetterBench steps failed; first: {failed[0]}")
    keys = list(dict.fromkeys(k for row in passes for k in row if k != "pass"))  # a figure may miss in some passes
    out.metrics = {
        "passes": len(passes), "prefill_depths": depths, "concurrency": levels,
        "summary": {k: band([row.get(k) for row in passes]) for k in keys},
        "per_pass": passes,
        "latency_samples": latency_samples(latency, p.seed),
        "formula": "combined_decode = geometric mean over concurrency <= max_num_seqs of 1/TPOT-p50",
    }
    if passes:
        sm = out.metrics["summary"]
        out.metrics.update({k: sm[k]["median"] if k in sm else None
                            for k in ("combined_decode_tok_s", "decode_tok_s", "decode_step_ms")})
    return out

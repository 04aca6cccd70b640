"""Probe: the quick throughput figures of one launch.

- single-stream decode: an essay prompt, ``decode_tokens`` tokens with ignore_eos, concurrency 1, ``repeats``
  times; decode tok/s = 1 / TPOT (median over repeats), decode step = TPOT p50, TTFT p50 of those requests.
- aggregate: ``concurrency`` clients (default max_num_seqs) in a closed loop, each sending
  ``requests_per_client`` requests of ``agg_tokens`` tokens; total output tokens / wall time.
- prefill at one depth: a unique real-text prompt of exactly ``prefill_depth`` tokens (capped at
  max_model_len - 8) sent as token ids with max_tokens 1, concurrency 1; prefill tok/s = depth / TTFT.
  Real text: GSM8K train problems and solutions from the data directory, each repeat from another offset so
  that prefix caching cannot serve it.

Where TPOT is undefined (the tokens after the first chunk span no time) or TTFT is (no token-bearing chunk),
that figure is None and the step an error, never a crash, a zero or an infinite rate.
"""
from __future__ import annotations

import time

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from validate.client import gather_limited
from validate.metrics import median, prefill_rate, summarize, tpot_s
from validate.runners.base import RunContext, SuiteResult
from validate.runners.text import ESSAY, TextPool
from validate.data import needs_train_text
from validate.suite import register_runner

class ProbeParams(BaseModel):
    model_config = ConfigDict(extra="forbid")
    decode_tokens: int = Field(512, ge=8)
    repeats: int = Field(3, ge=1)
    concurrency: int | None = Field(None, ge=1, description="aggregate streams; default max_num_seqs")
    requests_per_client: int = Field(2, ge=1)
    agg_tokens: int = Field(256, ge=8)
    prefill_depth: int = Field(2048, ge=16)


class ProbeMetrics(BaseModel):
    """What a probe record's ``metrics`` hold (times in ms, rates in tok/s)."""

    model_config = ConfigDict(extra="forbid")
    decode_tok_s: float | None = None
    decode_step_ms: float | None = None
    ttft_ms_p50: float | None = None
    concurrency: int
    aggregate_tok_s: float
    aggregate_ttft_ms_p50: float | None = None
    prefill_depth: int
    prefill_tok_s: float | None = None
    prefill_prompt_tokens: int | None = None
    decode_tokens: int
    repeats: int
    decode_tok_s_runs: list[float | None]
    prefill_tok_s_runs: list[float | None]
    aggregate: dict[str, Any]


def figures(records: list) -> list:
    """The notes' probe figures: decode step, single-stream decode, aggregate at max_num_seqs, prefill, TTFT."""
    from validate.figures import FigureSpec, metric

    return [FigureSpec("probe_step", "decode step p50 (probe)", "probe", "ms", 2, False, metric("decode_step_ms")),
            FigureSpec("probe_decode", "single-stream decode (probe)", "probe", "tok/s", 1, True, metric("decode_tok_s")),
            FigureSpec("probe_agg", "aggregate at max_num_seqs streams (probe)", "probe", "tok/s", 1, True,
                       metric("aggregate_tok_s")),
            FigureSpec("probe_prefill", "prefill (probe depth)", "probe", "tok/s", 0, True, metric("prefill_tok_s")),
            FigureSpec("probe_ttft", "time to first token p50 (probe)", "probe", "ms", 1, False, metric("ttft_ms_p50"))]


def headline(rec) -> str | None:
    v = rec.metrics.get("decode_tok_s")
    return None if v is None else f"decode {v:.1f} tok/s"


def summary(rec) -> str:
    m = rec.metrics
    return f"{m['decode_tok_s']} tok/s decode, {m['aggregate_tok_s']} tok/s at {m['concurrency']}"


@register_runner("probe", ProbeParams, preflight=needs_train_text, metrics_model=ProbeMetrics, figures=figures,
                 headline=headline, summary=summary, order=50)
async def run(ctx: RunContext, p: ProbeParams) -> SuiteResult:
    out = SuiteResult()
    s = ctx.config.server
    conc = p.concurrency or s.max_num_seqs
    depth = min(p.prefill_depth, s.max_model_len - 8)
    ctx.progress(0, total=p.repeats * 2 + conc * p.requests_per_client, description="probe")
    essay = [{"role": "user", "content": ESSAY}]

    decode = []
    for _ in range(p.repeats):
        decode.append(await ctx.client.chat(essay, max_tokens=p.decode_tokens, ignore_eos=True))
        ctx.progress(1)
    prefill = []
    pool = await TextPool.build(ctx.client, ctx.data_dir, min_tokens=depth * 2)
    for rep in range(p.repeats):
        # evenly spaced offsets: every repeat starts on other text, so prefix caching cannot serve it
        ids = pool.window_at(depth, rep * len(pool.ids) // p.repeats)
        prefill.append(await ctx.client.completion(ids, max_tokens=1))
        ctx.progress(1)

    async def client_loop(k: int):
        res = []
        for j in range(p.requests_per_client):
            msgs = [{"role": "user", "content": f"({k}.{j}) {ESSAY}"}]
            res.append(await ctx.client.chat(msgs, max_tokens=p.agg_tokens, ignore_eos=True))
            ctx.progress(1)
        return res

    t0 = time.perf_counter()
    agg_lists = await gather_limited([client_loop(k) for k in range(conc)], limit=conc)
    agg_wall = time.perf_counter() - t0
    agg = [r for lst in agg_lists for r in lst]

    failed = [r.error for r in decode + prefill + agg if not r.ok]
    if failed:
        out.errors.append(f"{len(failed)} probe requests failed; first: {failed[0]}")
        return out
    # TPOT is None where the decode rate is undefined (every token after the first chunk in one read) and
    # TTFT where no token-bearing chunk came: errors of that step, never a crash, a zero or an infinite rate
    tpots = [tpot_s(r) for r in decode]
    prefill_rates = [prefill_rate(depth, r.ttft_s) for r in prefill]
    if None in tpots:
        out.errors.append(f"{tpots.count(None)} of {len(decode)} decode requests have no TPOT (the tokens after "
                          "the first chunk span no time): the decode rate is undefined")
    if None in prefill_rates:
        out.errors.append(f"{prefill_rates.count(None)} of {len(prefill)} prefill requests brought no "
                          "token-bearing chunk: TTFT and the prefill rate are undefined")
    step = median(tpots)
    ttft = median([r.ttft_s for r in decode])
    prefill_med = median(prefill_rates)
    agg_m = summarize(agg, agg_wall)
    out.metrics = {
        "decode_tok_s": None if step is None else round(1.0 / step, 2),
        "decode_step_ms": None if step is None else round(step * 1e3, 2),
        "ttft_ms_p50": None if ttft is None else round(ttft * 1e3, 1),
        "concurrency": conc,
        "aggregate_tok_s": round(agg_m.output_tok_s, 2),
        "aggregate_ttft_ms_p50": agg_m.ttft_ms_p50,
        "prefill_depth": depth,
        "prefill_tok_s": None if prefill_med is None else round(prefill_med, 1),
        "prefill_prompt_tokens": prefill[0].prompt_tokens,
        "decode_tokens": p.decode_tokens,
        "repeats": p.repeats,
        "decode_tok_s_runs": [None if t is None else round(1.0 / t, 2) for t in tpots],
        "prefill_tok_s_runs": [None if x is None else round(x, 1) for x in prefill_rates],
        "aggregate": agg_m.as_dict(),
    }
    return out

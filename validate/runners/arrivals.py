"""Arrivals at a rate: open-loop load with seeded Poisson (or gamma-bursty) arrivals, goodput under the SLO, and
the search for the highest rate that meets it.

Every closed-loop load hides queueing: a client waits for its answer before it sends again, so a slower server
is sent less. Here requests are sent when the schedule says (validate.arrivals), whatever is in flight, and a
slower prefill shows as TTFT. Each *probe* runs one schedule at one rate: at least ``probe_min_duration_s`` of
arrivals and at least ``probe_min_queries`` requests (MLPerf LoadGen's rule for a valid run, scaled down), each
request a real-text prompt of ``prompt_tokens`` tokens answered with ``output_tokens`` tokens (ignore_eos).
A probe's schedule and prompts are drawn from the suite's seed and the rate alone, so two runs of the suite probe
any rate with the same arrivals and the same prompts.

A probe is *valid* when the client sent on schedule (the p99 of send time minus scheduled time within
``max_lag_ms``: beyond it the client, not the server, set the rate) and it met both minimums. It *meets the
SLO* when every request was answered and the p-th TTFT and TPOT are within the limits
(validate.metrics.probe_metrics); its goodput counts the requests that met the limits one by one.

The SLO is the configuration's (``slo:`` in serve/*.yaml), or the suite's ``slo`` param where set.

Profiles: ``rates_per_s`` probes those rates (the quick profile: one short probe); ``search`` runs the
bracketing and bisection of validate.rate_search from ``start_rate_per_s``. Where the engine hands the runner
the baseline's SLO rate (a release with a baseline), a *reference probe* at exactly that rate is run as well,
with ``reference_queries`` requests at least: the gate compares the share of requests meeting the SLO there
(validate.loadgate).

Every request is kept in a JSON-lines attachment beside the record (``requests``: probe, index, scheduled,
sent, first token, each token-bearing chunk's time and tokens, end, tokens, status; seconds from the probe's
start), hashed into the record; :func:`audit` recounts the probes from it when the record is read.
"""
from __future__ import annotations

import asyncio
import hashlib
import json
import math
import random
import time
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

from validate.arrivals import schedule
from validate.client import RequestResult
from validate.config import SloSpec
from validate.data import needs_train_text
from validate.metrics import meets_slo, probe_metrics, tpot_s
from validate.rate_search import ProbeOutcome, search
from validate.runners.base import RunContext, SuiteResult
from validate.runners.text import TextPool
from validate.suite import register_runner

#: The attachment that holds every request of the suite.
REQUESTS = "requests"


class ArrivalsParams(BaseModel):
    model_config = ConfigDict(extra="forbid")
    prompt_tokens: int = Field(256, ge=1)
    output_tokens: int = Field(64, ge=2)
    burstiness: float = Field(1.0, gt=0, le=100, description="gamma shape of the gaps: 1 Poisson, < 1 burstier")
    search: bool = Field(True, description="search the highest rate meeting the SLO")
    rates_per_s: list[float] = Field(default_factory=list, description="rates probed besides (or without) the search")
    start_rate_per_s: float = Field(1.0, gt=0)
    min_rate_per_s: float = Field(0.05, gt=0)
    max_rate_per_s: float = Field(64.0, gt=0)
    rel_tolerance: float = Field(0.15, gt=0, le=1, description="bisection stops at hi / lo <= 1 + this")
    max_probes: int = Field(7, ge=1, le=30)
    probe_min_duration_s: float = Field(40.0, gt=0, le=3600)
    probe_min_queries: int = Field(40, ge=1)
    probe_grace_s: float = Field(60.0, gt=0, description="after the last arrival, how long requests in flight may "
                                 "take before they are cut (counted as failed)")
    max_lag_ms: float = Field(100.0, gt=0, description="a probe whose p99 send lag exceeds this is not valid")
    reference_queries: int = Field(80, ge=1, description="least requests of the reference probe at the baseline's rate")
    max_in_flight: int = Field(256, ge=1)
    slo: SloSpec | None = None
    seed: int = 0

    @model_validator(mode="after")
    def _rates(self):
        bad = [r for r in self.rates_per_s if not (math.isfinite(r) and r > 0)]
        if bad:
            raise ValueError(f"rates_per_s: every rate must be a positive finite number, not {bad[0]!r}")
        if not self.search and not self.rates_per_s:
            raise ValueError("with search false, rates_per_s must name at least one rate (else nothing is probed)")
        if not self.min_rate_per_s <= self.start_rate_per_s <= self.max_rate_per_s:
            raise ValueError(f"start_rate_per_s {self.start_rate_per_s:g} lies outside [min_rate_per_s "
                             f"{self.min_rate_per_s:g}, max_rate_per_s {self.max_rate_per_s:g}]")
        return self


class ArrivalsMetrics(BaseModel):
    """What an arrivals record's ``metrics`` hold (times in ms, rates per second)."""

    model_config = ConfigDict(extra="forbid")
    slo: dict[str, Any]
    burstiness: float
    probes: list[dict[str, Any]]
    search: dict[str, Any] | None = None
    slo_rate_per_s: float | None = None
    goodput_at_slo_rate_per_s: float | None = None
    reference: dict[str, Any] | None = None
    requests_logged: int
    invalid_probes: int


def probe_seed(seed: int, rate_per_s: float) -> int:
    """The seed of a probe's schedule and prompts: the suite's seed and the rate (to 1e-6 req/s), so any two runs
    probe a rate with the same arrivals and prompts."""
    h = hashlib.sha256(f"{seed}/{round(rate_per_s, 6):.6f}".encode()).digest()
    return int.from_bytes(h[:8], "little") >> 1


def request_row(probe: int, rate: float, k: int, due_s: float, r: RequestResult, t0: float,
                slo: SloSpec) -> dict:
    """One JSON line of the requests attachment: times in seconds from the probe's start ``t0`` (perf_counter)."""
    sent = r.t_sent - t0 if r.t_sent else None
    t = tpot_s(r)
    return {
        "probe": probe, "rate_per_s": rate, "i": k, "scheduled_s": round(due_s, 6),
        "sent_s": None if sent is None else round(sent, 6),
        "first_token_s": None if sent is None or r.ttft_s is None else round(sent + r.ttft_s, 6),
        "chunk_s": [] if sent is None else [round(sent + c, 6) for c in r.chunk_times],
        "chunk_tokens": list(r.chunk_tokens),
        "end_s": round(r.t_done - t0, 6) if r.t_done else None,
        "prompt_tokens": r.prompt_tokens, "output_tokens": r.output_tokens,
        "status": "ok" if r.ok else (r.error or "failed"),
        "ttft_ms": None if r.ttft_s is None else round(r.ttft_s * 1e3, 3),
        "tpot_ms": None if t is None else round(t * 1e3, 3),
        "good": meets_slo(r, slo.ttft_ms, slo.tpot_ms),
    }


async def send_on_schedule(client, times_s, prompts, max_tokens: int, *, max_in_flight: int, grace_s: float
                           ) -> tuple[list[RequestResult], list[float], float, float]:
    """Send ``prompts[i]`` (token ids or text) at ``times_s[i]`` seconds after the start, whatever is in flight
    (open loop; at most ``max_in_flight`` at once, past which a request waits and its send lags), each with
    ``max_tokens`` output tokens (ignore_eos); wait for the answers at most ``grace_s`` after the last send,
    then cut what is left (a failed request).

    Returns:
        (results in schedule order, per sent request its send time minus its scheduled time in seconds, the
        duration in seconds from the start to the last answer's end, the start on ``time.perf_counter``).
    """
    sem = asyncio.Semaphore(max_in_flight)
    tasks: list[asyncio.Task] = []
    started: dict[int, float] = {}  # when each request left the bound (a cut request keeps its send time)
    t0 = time.perf_counter()

    async def one(i, ids):
        async with sem:  # past the bound the request waits here: its send lags, and the probe is invalid
            started[i] = time.perf_counter()
            return await client.completion(ids, max_tokens=max_tokens, ignore_eos=True)

    for i, (due, ids) in enumerate(zip(times_s, prompts)):
        wait = t0 + due - time.perf_counter()
        if wait > 0:
            await asyncio.sleep(wait)
        tasks.append(asyncio.create_task(one(i, ids)))
    done, pending = await asyncio.wait(tasks, timeout=grace_s) if tasks else (set(), set())
    for t in pending:
        t.cancel()
    if pending:
        await asyncio.wait(pending, timeout=5.0)
    results: list[RequestResult] = []
    for i, t in enumerate(tasks):
        if t in done and t.exception() is None:
            results.append(t.result())
        else:
            why = (f"cut: not answered within {grace_s:g} s of the last arrival" if t in pending
                   else f"raised: {t.exception()!r}")
            results.append(RequestResult(error=why, t_sent=started.get(i, 0.0)))
    end = max([r.t_done for r in results if r.t_done] + [time.perf_counter() if pending else t0 + (times_s[-1] if times_s else 0)])
    lags = [r.t_sent - (t0 + due) for r, due in zip(results, times_s) if r.t_sent]
    return results, lags, max(end - t0, 1e-6), t0


async def run_probe(ctx: RunContext, p: ArrivalsParams, pool: TextPool, rate: float, index: int, slo: SloSpec,
                    min_queries: int, rows: list[dict]) -> dict:
    """One probe at ``rate`` (requests/s): send on the seeded schedule (:func:`send_on_schedule`), append each
    request's row to ``rows`` and return the probe's record entry (validate.metrics.ProbeMetrics and validity)."""
    seed = probe_seed(p.seed, rate)
    sch = schedule(rate, p.burstiness, min_duration_s=p.probe_min_duration_s, min_queries=min_queries, seed=seed)
    rng = random.Random(seed)
    prompts = [pool.window(p.prompt_tokens, rng) for _ in sch.times_s]
    results, lags, duration, t0 = await send_on_schedule(ctx.client, sch.times_s, prompts, p.output_tokens,
                                                         max_in_flight=p.max_in_flight, grace_s=p.probe_grace_s)
    m = probe_metrics(rate, results, lags, duration, slo.ttft_ms, slo.tpot_ms, slo.percentile)
    why = []
    if m.lag_ms_p99 is not None and m.lag_ms_p99 > p.max_lag_ms:
        why.append(f"the client sent late (p99 lag {m.lag_ms_p99:.0f} ms > max_lag_ms {p.max_lag_ms:g}): the rate "
                   "was the client's, not the schedule's")
    if m.requests < min_queries:
        why.append(f"{m.requests} requests < {min_queries}")
    unsent = sum(1 for r in results if not r.t_sent)
    if unsent:
        why.append(f"{unsent} requests were never sent")
    for k, (r, due) in enumerate(zip(results, sch.times_s)):
        rows.append(request_row(index, rate, k, due, r, t0, slo))
    entry = {"index": index, "seed": seed, **m.as_dict(), "schedule_span_s": round(sch.span_s, 3),
             "valid": not why, "why_invalid": "; ".join(why) or None}
    ctx.log(f"arrivals probe {index}: {rate:.3g} req/s, {m.requests} requests, good {m.good}, p{slo.percentile:g} "
            f"TTFT {m.ttft_ms_pslo} ms, TPOT {m.tpot_ms_pslo} ms: "
            + ("meets the SLO" if m.meets and not why else "invalid" if why else "misses the SLO"))
    return entry


def slo_of(ctx: RunContext, p: ArrivalsParams) -> tuple[SloSpec, str]:
    """The SLO the suite runs under and where it comes from. Raises InputError when neither sets one."""
    from validate.errors import InputError

    if p.slo is not None:
        return p.slo, "the suite's params"
    if ctx.config is not None and ctx.config.slo is not None:
        return ctx.config.slo, f"serve/{ctx.config.name}.yaml"
    raise InputError(f"no SLO: set slo: (ttft_ms, tpot_ms, percentile) in serve/"
                     f"{ctx.config.name if ctx.config else '<config>'}.yaml or the suite's slo param")


def reference_rate(rec) -> float | None:
    """The SLO rate a baseline's arrivals record found (None when it found none): what the reference probe of a
    candidate runs at."""
    m = rec.metrics if isinstance(rec.metrics, dict) else {}
    v = m.get("slo_rate_per_s")
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v > 0 else None


def figures(records: list) -> list:
    from validate.figures import FigureSpec, metric

    return [FigureSpec("arr_slo_rate", "highest rate meeting the SLO (arrivals)", "arrivals", "req/s", 3, True,
                       metric("slo_rate_per_s")),
            FigureSpec("arr_goodput", "goodput at that rate (arrivals)", "arrivals", "req/s", 3, True,
                       metric("goodput_at_slo_rate_per_s"))]


def headline(rec) -> str | None:
    v = rec.metrics.get("slo_rate_per_s")
    return f"{v:.2f} req/s within the SLO" if v else None


def summary(rec) -> str:
    m = rec.metrics
    rate = m.get("slo_rate_per_s")
    n = len(m["probes"])
    return (f"SLO rate {rate:.3g} req/s" if rate else "no rate met the SLO") + f", {n} probe{'' if n == 1 else 's'}"


def _pct(values: list[float], q: float) -> float | None:
    import numpy as np

    return round(float(np.percentile(np.asarray(values, dtype=float), q)), 3) if values else None


def _close(a: float | None, b: float | None, tol: float) -> bool:
    return (a is None) == (b is None) and (a is None or abs(a - b) <= tol)


def _row_times_reason(row: dict, max_tokens: int | None = None) -> str | None:
    """Why a request row's times, tokens, TTFT or TPOT do not hold together (None when they do): an answered row's
    times run forward (sent, first token = first chunk, each chunk, end), each chunk carries a whole number of
    tokens, its output tokens (usage: what TPOT divides by) are at most ``max_tokens``, and its TTFT and TPOT are what its send and chunk times give (the times are
    kept to 1 us, the latencies to 1 us, so they agree within 0.01 ms)."""
    if row["status"] != "ok" or row["sent_s"] is None:
        return None
    chunks, toks, n = row["chunk_s"], row["chunk_tokens"], row["output_tokens"]
    if not chunks:
        return None if row["ttft_ms"] is None else f"TTFT {row['ttft_ms']} ms without a token-bearing chunk"
    times = [row["sent_s"], *chunks, row["end_s"]]
    if any(b < a for a, b in zip(times, times[1:])) or row["first_token_s"] != chunks[0]:
        return "its times do not run forward from its send through its first token and chunks to its end"
    if len(toks) != len(chunks) or any(type(t) is not int or t < 1 for t in toks):
        return "its chunks' token counts are not one whole number >= 1 per chunk"
    if type(n) is not int or n < 1 or (max_tokens is not None and n > max_tokens):
        return f"its {n!r} output tokens are not a count of at most the {max_tokens} each request asks for"
    # the chunks carry the usage's tokens, one off at most (the fake server's last chunk repeats one); else the
    # first chunk, or a single chunk, could claim them all and leave the TPOT undefined: a row never judged on it
    # (vLLM streams the first token alone)
    if not n - 1 <= sum(toks) <= n + 1 or (len(toks) > 1 and toks[0] >= n) or (n > 1 and len(toks) < 2):
        return f"its chunks carry {toks[0]} then {sum(toks) - toks[0]} tokens, its usage says {n}"
    ttft = (chunks[0] - row["sent_s"]) * 1e3
    later = (n - (toks[0] if toks else 1)) if n is not None else 0
    span = chunks[-1] - chunks[0]
    tpot = span / later * 1e3 if later >= 1 and span > 0 else None
    if not _close(row["ttft_ms"], ttft, 0.01):
        return f"TTFT {row['ttft_ms']} ms, but its send and first-token times give {ttft:.3f} ms"
    if not _close(row["tpot_ms"], tpot, 0.01 + (2e-3 / later if later >= 1 else 0)):
        return f"TPOT {row['tpot_ms']} ms, but its chunk times and tokens give {tpot}"
    return None


def _schedule_reason(pr: dict, rows: list[dict], params: dict) -> str | None:
    """Why a probe's rows are not its seeded schedule (None when they are): its seed is not the suite's for its
    rate (:func:`probe_seed`), a row of another rate, rows out of order, scheduled times that the seed does not
    give (:func:`validate.arrivals.schedule` again, with the record's params), or a ``valid`` that its rows do not
    give (valid: p99 send lag, its rows' send minus scheduled times, within ``max_lag_ms``, every request sent,
    and at least the requests the probe needs), either way."""
    rate = pr.get("rate_per_s")
    if isinstance(rate, bool) or not isinstance(rate, (int, float)) or not math.isfinite(rate) or rate <= 0:
        return f"its rate {rate!r} is not a positive number"
    defaults = {k: f.default for k, f in ArrivalsParams.model_fields.items()}
    get = lambda k: params.get(k, defaults[k])  # noqa: E731
    if pr.get("seed") != probe_seed(get("seed"), rate):
        return f"its seed {pr.get('seed')!r} is not the suite's seed for {rate:g} req/s"
    if [r["i"] for r in rows] != list(range(len(rows))) or any(r["rate_per_s"] != rate for r in rows):
        return "its rows are not one request each of its schedule at its rate, in order"
    min_q = max(get("reference_queries"), get("probe_min_queries")) if pr.get("reference") else get(
        "probe_min_queries")
    if rows:
        sch = schedule(rate, get("burstiness"), min_duration_s=get("probe_min_duration_s"), min_queries=min_q,
                       seed=pr["seed"])
        if len(sch.times_s) != len(rows) or any(abs(r["scheduled_s"] - t) > 2e-6 for r, t in zip(rows, sch.times_s)):
            return "its rows' scheduled times are not the schedule its seed gives"
    lags = [(r["sent_s"] - r["scheduled_s"]) * 1e3 for r in rows if r["sent_s"] is not None]
    lag = _pct(lags, 99)
    valid = (lag is None or lag <= get("max_lag_ms")) and len(lags) == len(rows) and len(rows) >= min_q
    if bool(pr.get("valid")) != valid:
        return (f"it is marked valid = {pr.get('valid')!r}, but its rows say {valid} (p99 send lag {lag} ms against "
                f"max_lag_ms {get('max_lag_ms'):g}, {len(rows) - len(lags)} never sent, {len(rows)} requests of "
                f"the {min_q} it needs)")
    return None


def _duration_reason(pr: dict, rows: list[dict]) -> str | None:
    """Why a probe's span, duration or per-second figures are not what its rows give (None when they are): the
    schedule's span is its last row's scheduled time; the duration (probe start to the last answer, or to the cut
    of requests still pending) is the last row's end when every row ended, and never before any row's end or
    scheduled time; goodput and the achieved rate are its good and all requests over that duration (the record
    rounds them to 4 decimals)."""
    if not rows:
        return None
    span, dur = pr.get("schedule_span_s"), pr.get("duration_s")
    num = lambda x: not isinstance(x, bool) and isinstance(x, (int, float)) and math.isfinite(x)  # noqa: E731
    if span is not None and not (num(span) and abs(span - rows[-1]["scheduled_s"]) <= 1e-3):
        return f"its schedule span {span!r} s is not its last row's scheduled time {rows[-1]['scheduled_s']} s"
    if not (num(dur) and dur > 0):
        return f"its duration {dur!r} s is not a positive number"
    ends = [r["end_s"] for r in rows if r["end_s"] is not None]
    latest = max(ends + [rows[-1]["scheduled_s"]])
    if dur < latest - 1e-3 or (len(ends) == len(rows) and abs(dur - max(ends)) > 1e-3):
        return f"its duration {dur} s is not what its rows' end times give (last end {max(ends, default=None)} s)"
    for key, count in (("goodput_per_s", sum(bool(r["good"]) for r in rows)), ("achieved_rate_per_s", len(rows))):
        # the record divides by the unrounded duration: allow its rounding (0.5 ms) and the figure's (1e-4)
        if not (num(pr.get(key)) and abs(pr[key] - count / dur) <= 1e-4 + count / dur * 6e-4 / dur):
            return f"its {key} {pr.get(key)!r} is not {count} over its duration {dur} s ({count / dur:.4f})"
    return None


def audit(rec, folder) -> list[str]:
    """Why the record's probes do not stand on its requests attachment (empty when they do): the file is
    missing or its hash differs from the record's; a row's ``good`` does not follow from its status, TTFT and TPOT
    under the record's SLO; a probe's request, answered or good count, its SLO-percentile TTFT or TPOT, or its
    ``meets`` differs from what the rows give; a row's TTFT or TPOT is not what its own times give
    (:func:`_row_times_reason`); a probe's rows are not its seeded schedule or its validity is not what their send
    lag says (:func:`_schedule_reason`); probe indices repeat, or rows belong to no probe of the record; the SLO
    rate is not the rate of a valid probe that met the SLO. ``folder``: where the record lies."""
    from pathlib import Path

    att = (rec.attachments or {}).get(REQUESTS)
    m = rec.metrics if isinstance(rec.metrics, dict) else {}
    if att is None:
        return ["the record holds no requests attachment"] if m.get("probes") else []
    name = str(att.get("file", ""))
    if Path(name).name != name or not name:
        return [f"its requests attachment names {name!r}, not a file beside the record"]
    path = Path(folder) / name
    try:
        blob = path.read_bytes()
    except OSError as e:
        return [f"its requests attachment {path.name} cannot be read ({e.strerror or e})"]
    if hashlib.sha256(blob).hexdigest() != att.get("sha256"):
        return [f"its requests attachment {path.name} does not match the hash the record holds (edited)"]
    params = rec.params if isinstance(rec.params, dict) else {}
    slo = m.get("slo") if isinstance(m.get("slo"), dict) else {}
    lim_ttft, lim_tpot, q = slo.get("ttft_ms"), slo.get("tpot_ms"), slo.get("percentile", 99.0)
    by: dict[int, list[dict]] = {}
    out = []
    try:
        for n, line in enumerate(blob.decode().splitlines(), 1):
            row = json.loads(line, parse_constant=_no_constant)
            why = _row_types_reason(row)
            if why:
                return [f"line {n} of {path.name}: {why}"]
            ok = row["status"] == "ok"
            ttft, tpot = row["ttft_ms"], row["tpot_ms"]
            good = ok and ttft is not None and (lim_ttft is None or ttft <= lim_ttft) and (
                lim_tpot is None or tpot is None or tpot <= lim_tpot)
            if bool(row["good"]) != good and len(out) < 3:
                out.append(f"line {n} of {path.name}: good is {row['good']}, but its status, TTFT and TPOT say {good}")
            why = _row_times_reason(row, params.get("output_tokens", ArrivalsParams.model_fields["output_tokens"].default))
            if why and len(out) < 3:
                out.append(f"line {n} of {path.name}: {why}")
            by.setdefault(int(row["probe"]), []).append(row)
    except (ValueError, KeyError, TypeError, IndexError) as e:
        return [f"its requests attachment {path.name} is not what the runner writes ({type(e).__name__}: {e})"]
    probes = [pr for pr in m.get("probes") or [] if isinstance(pr, dict)]
    indices = [pr.get("index") for pr in probes]
    if len(set(map(repr, indices))) != len(indices):
        out.append(f"its probes' indices {indices} repeat")
    orphans = sorted(set(by) - {i for i in indices if isinstance(i, int)})
    if orphans:
        out.append(f"its requests attachment holds rows of probes {orphans} that the record does not list")
    for pr in probes:
        rows = by.get(pr.get("index"), [])
        why = _schedule_reason(pr, rows, params)
        if why:
            out.append(f"probe {pr.get('index')}: {why}")
            continue
        ok = [r for r in rows if r["status"] == "ok"]
        got = [len(rows), len(ok), sum(bool(r["good"]) for r in rows)]
        want = [pr.get("requests"), pr.get("ok"), pr.get("good")]
        if got != want:
            out.append(f"probe {pr.get('index')}: the record says {want[0]} requests, {want[1]} answered, {want[2]} "
                       f"good; its attachment holds {got[0]}, {got[1]}, {got[2]}")
            continue
        ttft_p = _pct([r["ttft_ms"] for r in ok if r["ttft_ms"] is not None], q)
        tpot_p = _pct([r["tpot_ms"] or 0.0 for r in ok if r["ttft_ms"] is not None], q)
        # the rows keep 0.001 ms; the record's percentile came from unrounded times
        close = lambda a, b: (a is None) == (b is None) and (a is None or abs(a - b) <= 0.01 + 1e-6 * abs(b))  # noqa: E731
        if not (close(ttft_p, pr.get("ttft_ms_pslo")) and close(tpot_p, pr.get("tpot_ms_pslo"))):
            out.append(f"probe {pr.get('index')}: the record's p{q:g} TTFT / TPOT {pr.get('ttft_ms_pslo')} / "
                       f"{pr.get('tpot_ms_pslo')} ms differ from its rows' {ttft_p} / {tpot_p} ms")
        why = _duration_reason(pr, rows) or _shown_reason(pr, rows, ok)
        if why:
            out.append(f"probe {pr.get('index')}: {why}")
        meets = bool(rows) and len(ok) == len(rows) and ttft_p is not None and (
            lim_ttft is None or ttft_p <= lim_ttft) and (lim_tpot is None or tpot_p <= lim_tpot)
        if bool(pr.get("meets")) != meets:
            out.append(f"probe {pr.get('index')}: the record says meets = {pr.get('meets')}, its rows say {meets}")
    rate = m.get("slo_rate_per_s")
    if rate is not None and not any(pr.get("rate_per_s") == rate and pr.get("meets") and pr.get("valid")
                                    and not pr.get("reference") for pr in m.get("probes") or []):
        out.append(f"its SLO rate {rate} req/s is not the rate of a valid probe that met the SLO")
    return out + _outcome_reasons(rec, probes, params)


def _no_constant(name: str):
    raise ValueError(f"{name} is not a number the runner writes")


def _row_types_reason(row) -> str | None:
    """Why a row's keys that the audit counts by are not of the runner's types (None when they are)."""
    if not isinstance(row, dict):
        return f"a row is a {type(row).__name__}, not an object"
    for key, types in (("probe", (int,)), ("i", (int,)), ("good", (bool,)), ("status", (str,))):
        if type(row.get(key)) not in types:
            return f"its {key} {row.get(key)!r} is not a {types[0].__name__}"
    return None


def _shown_reason(pr: dict, rows: list[dict], ok: list[dict]) -> str | None:
    """Why a figure the notes show of a probe is not what its rows give (None when they all are): its share of
    good requests, p99 send lag, TTFT p50 and TPOT p50 (validate.metrics.probe_metrics over the rows' times)."""
    lags = [(r["sent_s"] - r["scheduled_s"]) * 1e3 for r in rows if r["sent_s"] is not None]
    want = {"good_share": round(sum(r["good"] for r in rows) / len(rows), 6) if rows else None,
            "lag_ms_p99": _pct(lags, 99),
            "ttft_ms_p50": _pct([r["ttft_ms"] for r in ok if r["ttft_ms"] is not None], 50),
            "tpot_ms_p50": _pct([r["tpot_ms"] for r in ok if r["tpot_ms"] is not None], 50)}
    for key, v in want.items():  # rows keep 1 us and 1 us of each time: 0.01 ms covers their rounding
        got = pr.get(key)
        if (v is None) != (got is None) or (v is not None and not (
                isinstance(got, (int, float)) and not isinstance(got, bool) and abs(got - v) <= 0.01 + 1e-6 * abs(v))):
            return f"its {key} {got!r} is not its rows' {v}"
    return None


def _outcome_reasons(rec, probes: list[dict], params: dict) -> list[str]:
    """Why the record's outcome is not what its probes give, in the order they ran: the probes are indexed 0, 1,
    ... in order; the fixed rates come first, then the search, replayed over the recorded outcomes
    (validate.rate_search.search: each rate it asks for must be the next probe's, and its status, bracket, SLO
    rate, narrowing, client bound and budget are the record's), then at most the one reference probe that
    ``metrics.reference`` names; the SLO rate's goodput is its probe's; the burstiness is the params' and the SLO
    the params' or the configuration's."""
    m = rec.metrics
    try:
        p = ArrivalsParams.model_validate(params)
    except Exception as e:  # noqa: BLE001 - any malformed params say so
        return [f"its params are not the suite's ({type(e).__name__}: {e})"]
    out = []
    if [pr.get("index") for pr in probes] != list(range(len(probes))):
        return [f"its probes are not indexed 0 to {len(probes) - 1} in the order they ran"]
    if m.get("burstiness") != p.burstiness:
        out.append(f"its burstiness {m.get('burstiness')!r} is not its params' {p.burstiness:g}")
    slo = m.get("slo") if isinstance(m.get("slo"), dict) else {}
    src = p.slo if p.slo is not None else (rec.config_snapshot or {}).get("slo")
    frm = "the suite's params" if p.slo is not None else f"serve/{rec.config}.yaml"
    try:
        same = SloSpec.model_validate(src) == SloSpec.model_validate({k: v for k, v in slo.items() if k != "from"})
    except Exception:  # noqa: BLE001 - a malformed SLO on either side is not the same SLO
        same = False
    if not same or slo.get("from") != frm:
        out.append(f"its SLO {slo} is not the one its {frm} sets ({src})")
    fixed = len(p.rates_per_s)
    if [pr.get("rate_per_s") for pr in probes[:fixed]] != list(p.rates_per_s) or any(
            pr.get("reference") for pr in probes[:fixed]):
        return out + [f"its first probes are not its fixed rates {list(p.rates_per_s)}"]
    rest = probes[fixed:]
    s = m.get("search")
    if p.search:
        asked: list[float] = []

        async def replay(rate: float) -> ProbeOutcome:
            if len(asked) >= len(rest) or rest[len(asked)].get("reference"):
                raise LookupError(rate)
            pr = rest[len(asked)]
            asked.append(rate)
            if pr.get("rate_per_s") != rate:
                raise LookupError(rate)
            return ProbeOutcome(rate, bool(pr.get("meets")), bool(pr.get("valid")))

        coro = search(replay, start=p.start_rate_per_s, rel_tolerance=p.rel_tolerance, max_probes=p.max_probes,
                      min_rate=p.min_rate_per_s, max_rate=p.max_rate_per_s)
        try:  # replay awaits nothing: the coroutine ends on its first step (no event loop, also inside one)
            coro.send(None)
            coro.close()
            return out + ["its search could not be replayed"]
        except StopIteration as done:
            res = done.value
        except LookupError as e:
            at = fixed + len(asked)
            return out + [f"its probe {at} is not the search's next probe at {e.args[0]:.6g} req/s"]
        want = {"status": res.status, "slo_rate_per_s": res.slo_rate_per_s, "lo": res.lo, "hi": res.hi,
                "narrowed": res.narrowed, "client_bound": res.client_bound, "budget_spent": res.budget_spent,
                "probes": len(res.probes)}
        got = {k: s.get(k) for k in want} if isinstance(s, dict) else None
        if got != want:
            return out + [f"its search {got} is not what its probes give ({want})"]
        if res.status == "none meets" and s.get("lowest_probe") != min(
                probes, key=lambda e: e["rate_per_s"])["index"]:
            out.append(f"its lowest probe {s.get('lowest_probe')!r} is not its lowest rate's")
        rate, tail = res.slo_rate_per_s, rest[len(res.probes):]
        # the runner's choice: the last probe run at the SLO rate
        at = next((e for e in reversed(probes) if rate is not None and e["rate_per_s"] == rate), None)
    else:
        if s is not None:
            return out + ["it holds a search its params did not run"]
        at = max((e for e in probes[:fixed] if e.get("meets") and e.get("valid")), key=lambda e: e["rate_per_s"],
                 default=None)
        rate, tail = (at["rate_per_s"] if at else None), rest
    ref = m.get("reference")
    if len(tail) > 1 or any(pr.get("reference") for pr in probes if pr not in tail) or (
            [bool(pr.get("reference")) for pr in tail] != [True] * len(tail)):
        return out + ["its probes after the search are not one reference probe"]
    if tail and not (isinstance(ref, dict) and ref.get("probe") == tail[0]["index"]
                     and ref.get("rate_per_s") == tail[0]["rate_per_s"] and isinstance(ref.get("release"), str)):
        return out + [f"its reference {ref!r} does not name its reference probe {tail[0]['index']}"]
    if not tail and ref is not None:
        return out + [f"its reference {ref!r} names no probe it ran"]
    if m.get("slo_rate_per_s") != rate:
        return out + [f"its SLO rate {m.get('slo_rate_per_s')!r} is not what its probes give ({rate})"]
    g = at["goodput_per_s"] if at else None
    if m.get("goodput_at_slo_rate_per_s") != g:
        out.append(f"its goodput at the SLO rate {m.get('goodput_at_slo_rate_per_s')!r} is not its probe's ({g})")
    return out


@register_runner("arrivals", ArrivalsParams, preflight=needs_train_text, sample_server_s=5.0,
                 metrics_model=ArrivalsMetrics, figures=figures, headline=headline, summary=summary, order=25,
                 baseline_hint=reference_rate, audit=audit)
async def run(ctx: RunContext, p: ArrivalsParams) -> SuiteResult:
    slo, slo_from = slo_of(ctx, p)
    pool = await TextPool.build(ctx.client, ctx.data_dir, min_tokens=max(p.prompt_tokens * 4, 8192))
    out = SuiteResult()
    rows: list[dict] = []
    probes: list[dict] = []
    ctx.progress(0, total=None, description="arrivals")

    class ServerGone(Exception):
        pass

    async def probe(rate: float, min_queries: int = p.probe_min_queries) -> dict:
        entry = await run_probe(ctx, p, pool, rate, len(probes), slo, min_queries, rows)
        probes.append(entry)
        ctx.progress(1)
        if entry["errors"]:  # failed requests: a dead server is no measurement of a rate (the search would read
            gone = await ctx.server_gone()  # it as "no rate meets" and the gate as a regression)
            if gone:
                raise ServerGone(f"{gone}, during probe {entry['index']} at {rate:.3g} req/s")
        return entry

    async def searched(rate: float) -> ProbeOutcome:
        e = await probe(rate)
        return ProbeOutcome(rate, e["meets"], e["valid"], e["why_invalid"] or "")

    res = ref = None
    try:
        for rate in p.rates_per_s:
            await probe(rate)
        if p.search:
            res = await search(searched, start=p.start_rate_per_s, rel_tolerance=p.rel_tolerance,
                               max_probes=p.max_probes, min_rate=p.min_rate_per_s, max_rate=p.max_rate_per_s)
        hint = getattr(ctx, "baseline_hint", None)
        if hint and hint.get("value") and not p.min_rate_per_s <= float(hint["value"]) <= p.max_rate_per_s:
            ctx.log(f"arrivals: the baseline's SLO rate {hint['value']} req/s lies outside [{p.min_rate_per_s:g}, "
                    f"{p.max_rate_per_s:g}]: no reference probe")
        elif hint and hint.get("value"):
            rate = float(hint["value"])
            e = await probe(rate, max(p.reference_queries, p.probe_min_queries))
            e["reference"] = True
            ref = {"release": hint.get("release"), "rate_per_s": rate, "probe": e["index"]}
    except ServerGone as e:
        out.server_died = str(e)
        out.errors.append(f"the server died: {e}; {len(probes)} probes kept")
    meeting = [e for e in probes if e["meets"] and e["valid"] and not e.get("reference")]
    if res is not None:
        rate = res.slo_rate_per_s
        at = next((e for e in reversed(probes) if rate is not None and e["rate_per_s"] == rate), None)
        search_rec = {"status": res.status, "slo_rate_per_s": rate, "lo": res.lo, "hi": res.hi,
                      "narrowed": res.narrowed, "client_bound": res.client_bound, "budget_spent": res.budget_spent,
                      "rel_tolerance": p.rel_tolerance, "probes": len(res.probes)}
    else:  # fixed rates only: the highest that met the SLO (no search: a lower bound, said in the notes)
        at = max(meeting, key=lambda e: e["rate_per_s"], default=None)
        rate = at["rate_per_s"] if at else None
        search_rec = None
    blob = "".join(json.dumps(r, separators=(",", ":")) + "\n" for r in rows).encode()
    out.attachments[REQUESTS] = (blob, "jsonl")
    out.metrics = {
        "slo": {**slo.model_dump(), "from": slo_from}, "burstiness": p.burstiness, "probes": probes,
        "search": search_rec, "slo_rate_per_s": rate,
        "goodput_at_slo_rate_per_s": at["goodput_per_s"] if at else None, "reference": ref,
        "requests_logged": len(rows), "invalid_probes": sum(1 for e in probes if not e["valid"]),
    }
    if res is not None and res.status == "none meets":
        lowest = min(probes, key=lambda e: e["rate_per_s"])
        search_rec["lowest_probe"] = lowest["index"]
        ctx.log(f"arrivals: no rate down to {lowest['rate_per_s']:.3g} req/s met the SLO (p{slo.percentile:g} TTFT "
                f"{lowest['ttft_ms_pslo']} ms, TPOT {lowest['tpot_ms_pslo']} ms there)")
    return out

"""The server's own counters: vLLM's Prometheus metrics at ``GET /metrics``, scraped at the start and the end of
every suite (and every few seconds during soak and BetterBench), parsed with prometheus_client's text parser.

What a record keeps (``Record.server_metrics``), all as deltas over the suite unless said otherwise:

- histograms (seconds): the server's time to first token, inter-token latency, time per output token, queue
  time, prefill time, decode time, end-to-end latency: for each the request count, the mean (sum / count, exact)
  and p50 / p99 estimated from the bucket deltas by linear interpolation inside the bucket (Prometheus'
  ``histogram_quantile``; an estimate, bounded by the bucket edges);
- counters: preemptions, prefix-cache queries and hits, prompt and generation tokens, finished requests by
  finish reason, speculative-decoding drafts, draft and accepted tokens (where the server has them);
- speculative decoding (MTP, EAGLE, n-gram drafts), where drafts moved: ``delta["spec_decode"]`` holds the drafts,
  draft tokens and accepted tokens over the suite, the accepted tokens at each draft position
  (``accepted_per_position``, position 0 first, from vLLM's ``vllm:spec_decode_num_accepted_tokens_per_pos``,
  label ``position``, summed over engines) and ``num_speculative_tokens`` (the positions seen), and the shares
  derived from them with vLLM's own definitions (``SpecDecodingLogging`` / ``SpecDecodingProm`` in
  ``vllm/v1/spec_decode/metrics.py``): ``acceptance_rate`` = accepted / draft tokens, ``mean_accepted_length`` =
  1 + accepted / drafts (the bonus token counted, as vLLM does), ``per_position`` = accepted at a position /
  drafts. A kernel that breaks the draft's numerics leaves accuracy as it was and lowers throughput through these
  figures alone. ``spec_acceptance_rate`` (the same figure as ``acceptance_rate``) stays at the top of the delta;
- gauges at the end: KV-cache usage, requests running and waiting; their series when sampled.

A server without ``/metrics`` (or one that answers something else) is recorded as ``available: false`` with the
reason, never as zeros. A lying counter costs that counter, never the suite: a histogram or counter that is NaN
or infinite, or a bucket without ``le``, is left out and named under ``invalid``; a counter that went backwards
(a server restarted mid-suite) is named under ``resets`` (evidence of a restart) and has no delta; values that
cannot be (KV-cache usage above 1, prefix-cache hits above queries; accepted above drafted tokens, drafted tokens
above drafts x positions, a position's accepted above the drafts, a later position accepting more than an earlier
one, the positions' sum other than the accepted tokens) are named under ``impossible`` and no share is derived
from them (none of the speculative-decoding shares where any of those counters lies); a counter the server does
not have is missing, never 0.
Metric names are vLLM 0.32's (``vllm/v1/metrics/loggers.py``).

The text is parsed in a worker process (:func:`parse_elsewhere`), never on the event loop that stamps the
client's streams: prometheus_client's parser is pure Python (a thread would still hold the GIL), and a few
hundred KB of ``/metrics`` cost tens of milliseconds. The text is bounded (:data:`MAX_METRICS_BYTES`) and so is
the parse (:data:`PARSE_TIMEOUT_S`).
"""
from __future__ import annotations

import asyncio
import math
import time
from dataclasses import dataclass, field
from typing import Any

import httpx
from validate.util import within

HISTOGRAMS = {
    "ttft": "vllm:time_to_first_token_seconds",
    "itl": "vllm:inter_token_latency_seconds",
    "tpot": "vllm:request_time_per_output_token_seconds",
    "queue": "vllm:request_queue_time_seconds",
    "prefill": "vllm:request_prefill_time_seconds",
    "decode": "vllm:request_decode_time_seconds",
    "e2e": "vllm:e2e_request_latency_seconds",
}
COUNTERS = {
    "preemptions": "vllm:num_preemptions",
    "prefix_cache_queries": "vllm:prefix_cache_queries",
    "prefix_cache_hits": "vllm:prefix_cache_hits",
    "prompt_tokens": "vllm:prompt_tokens",
    "generation_tokens": "vllm:generation_tokens",
    "requests": "vllm:request_success",
    "spec_drafts": "vllm:spec_decode_num_drafts",
    "spec_draft_tokens": "vllm:spec_decode_num_draft_tokens",
    "spec_accepted_tokens": "vllm:spec_decode_num_accepted_tokens",
}
#: Counters with one series per draft position (label ``position``: "0", "1", ...), kept by position.
PER_POSITION = {
    "spec_accepted_per_pos": "vllm:spec_decode_num_accepted_tokens_per_pos",
}
GAUGES = {
    "kv_cache_usage": "vllm:kv_cache_usage_perc",
    "running": "vllm:num_requests_running",
    "waiting": "vllm:num_requests_waiting",
}


@dataclass
class Histogram:
    """One histogram summed over its label sets: cumulative bucket counts by upper bound (seconds)."""

    buckets: dict[float, float] = field(default_factory=dict)
    sum: float = 0.0
    count: float = 0.0


@dataclass
class Snapshot:
    """One scrape: histograms and counters summed over label sets (requests by finish reason kept apart)."""

    t: float  # time.monotonic() of the scrape
    histograms: dict[str, Histogram] = field(default_factory=dict)
    counters: dict[str, float] = field(default_factory=dict)
    by_reason: dict[str, float] = field(default_factory=dict)
    gauges: dict[str, float] = field(default_factory=dict)
    # per-position counter key -> {draft position (0 first): value summed over engines}
    per_position: dict[str, dict[int, float]] = field(default_factory=dict)
    invalid: dict[str, str] = field(default_factory=dict)  # metric key -> why it was left out


def parse(text: str, t: float | None = None) -> Snapshot:
    """A :class:`Snapshot` of the Prometheus text exposition ``text`` (only the metrics named in this module). A
    metric whose samples are not finite, or a histogram bucket without ``le``, is left out and named in
    ``Snapshot.invalid``; the others are kept. A per-position counter (:data:`PER_POSITION`) with a sample whose
    ``position`` label is missing or not a whole number >= 0, or whose positions are not 0 .. k - 1, is left out
    the same way.

    Raises:
        ValueError: ``text`` is not in the exposition format (prometheus_client's parser raises it).
    """
    from prometheus_client.parser import text_string_to_metric_families

    snap = Snapshot(t=time.monotonic() if t is None else t)
    hist_names = {v: k for k, v in HISTOGRAMS.items()}
    counter_names = {v: k for k, v in COUNTERS.items()}
    gauge_names = {v: k for k, v in GAUGES.items()}
    pos_names = {v: k for k, v in PER_POSITION.items()}
    for fam in text_string_to_metric_families(text):
        name = fam.name
        key = hist_names.get(name) or counter_names.get(name) or gauge_names.get(name) or pos_names.get(name)
        if key is None:
            continue
        samples = [x for x in fam.samples if not x.name.endswith("_created")]
        bad = next((x for x in samples if not math.isfinite(x.value)), None)
        if bad is not None:
            snap.invalid[key] = f"{bad.name} = {bad.value!r}"
            continue
        if name in hist_names:
            if any(x.name.endswith("_bucket") and "le" not in x.labels for x in samples):
                snap.invalid[key] = f"{name}: a bucket without le"
                continue
            try:
                edges = [float(x.labels["le"]) for x in samples if x.name.endswith("_bucket")]
            except ValueError:
                snap.invalid[key] = f"{name}: a bucket whose le is not a number"
                continue
            h = Histogram()
            for x, le in zip([x for x in samples if x.name.endswith("_bucket")], edges):
                h.buckets[le] = h.buckets.get(le, 0.0) + x.value
            for x in samples:
                if x.name.endswith("_sum"):
                    h.sum += x.value
                elif x.name.endswith("_count"):
                    h.count += x.value
            snap.histograms[key] = h
        elif name in pos_names:
            pos = [x.labels.get("position", "") for x in samples]
            if not all(p.isdigit() for p in pos):
                snap.invalid[key] = f"{name}: a sample whose position is {next(p for p in pos if not p.isdigit())!r}"
                continue
            by_pos: dict[int, float] = {}
            for p, x in zip(pos, samples):  # one series per engine and position: summed over engines
                by_pos[int(p)] = by_pos.get(int(p), 0.0) + x.value
            if sorted(by_pos) != list(range(len(by_pos))):  # vLLM makes positions 0 .. k - 1, every one at start
                snap.invalid[key] = f"{name}: positions {sorted(by_pos)} are not 0 .. {len(by_pos) - 1}"
                continue
            snap.per_position[key] = by_pos
        elif name in counter_names:
            for x in samples:
                snap.counters[key] = snap.counters.get(key, 0.0) + x.value
                if key == "requests" and "finished_reason" in x.labels:
                    r = x.labels["finished_reason"]
                    snap.by_reason[r] = snap.by_reason.get(r, 0.0) + x.value
        else:
            snap.gauges[key] = sum(x.value for x in samples)
    return snap


def quantile(q: float, buckets: list[tuple[float, float]]) -> float | None:
    """The q-quantile (0 < q < 1) of a histogram given as (upper bound, cumulative count) pairs sorted by bound,
    the last bound +inf: linear interpolation inside the bucket holding rank ``q * total`` (Prometheus'
    ``histogram_quantile``); the lower edge of the first bucket is 0. None when the histogram is empty; the
    highest finite bound when the rank falls in the +inf bucket."""
    if not buckets or buckets[-1][1] <= 0:
        return None
    total = buckets[-1][1]
    rank = q * total
    prev_le, prev_c = 0.0, 0.0
    for le, c in buckets:
        if c >= rank:
            if math.isinf(le):
                return prev_le
            if c == prev_c:
                return le
            return prev_le + (le - prev_le) * (rank - prev_c) / (c - prev_c)
        prev_le, prev_c = le, c
    return prev_le


def delta(start: Snapshot, end: Snapshot) -> dict[str, Any]:
    """What the server did between two scrapes: per histogram {count, mean_ms, p50_ms, p99_ms}; per counter the
    increase; requests by finish reason; the gauges at ``end``; derived shares (prefix-cache hit rate,
    speculative-decoding acceptance rate) where their counters moved and are possible; ``spec_decode`` where
    speculative-decoding drafts moved (:func:`_spec_decode`); and ``invalid``, ``resets`` and ``impossible`` (see
    the module docstring). Values in milliseconds are rounded to 0.001.
    """
    out: dict[str, Any] = {"interval_s": round(end.t - start.t, 3), "histograms": {}, "counters": {}}
    invalid = {**start.invalid, **end.invalid}
    resets: list[str] = []
    impossible: list[str] = []
    for key, h1 in end.histograms.items():
        h0 = start.histograms.get(key, Histogram())
        n = h1.count - h0.count
        if n < 0 or any(c < h0.buckets.get(le, 0.0) for le, c in h1.buckets.items()):
            resets.append(key)
            continue
        if n == 0:
            continue
        cum = sorted((le, c - h0.buckets.get(le, 0.0)) for le, c in h1.buckets.items())
        ms = lambda x: None if x is None else round(1e3 * x, 3)  # noqa: E731
        out["histograms"][key] = {"count": int(round(n)), "mean_ms": ms((h1.sum - h0.sum) / n),
                                  "p50_ms": ms(quantile(0.5, cum)), "p99_ms": ms(quantile(0.99, cum))}
    for key, v in end.counters.items():
        if key not in start.counters and start.counters:
            continue  # appeared mid-suite: no start to count from
        d = v - start.counters.get(key, 0.0)
        if d < 0:
            resets.append(key)
            continue
        out["counters"][key] = round(d, 3)
    out["requests_by_finish_reason"] = {r: int(round(v - start.by_reason.get(r, 0.0)))
                                        for r, v in end.by_reason.items() if v - start.by_reason.get(r, 0.0) > 0}
    out["gauges_at_end"] = dict(end.gauges)
    u = end.gauges.get("kv_cache_usage")
    if u is not None and not 0.0 <= u <= 1.0:
        impossible.append(f"kv_cache_usage = {u:g} (a share: 0 to 1)")
    c = out["counters"]
    if c.get("prefix_cache_hits", 0.0) > c.get("prefix_cache_queries", 0.0):
        impossible.append(f"prefix_cache_hits {c['prefix_cache_hits']:g} > prefix_cache_queries "
                          f"{c.get('prefix_cache_queries', 0.0):g}")
    elif c.get("prefix_cache_queries"):
        out["prefix_cache_hit_rate"] = round(c.get("prefix_cache_hits", 0.0) / c["prefix_cache_queries"], 6)
    per_pos, why_not = _position_deltas(start, end, "spec_accepted_per_pos")
    if why_not == "reset":
        resets.append("spec_accepted_per_pos")
    spec_lies = _spec_impossible(c, per_pos)
    impossible += spec_lies
    if c.get("spec_drafts"):
        out["spec_decode"] = _spec_decode(c, per_pos, derive=not spec_lies)
    if not spec_lies and c.get("spec_draft_tokens") and "spec_accepted_tokens" in c:
        out["spec_acceptance_rate"] = round(c["spec_accepted_tokens"] / c["spec_draft_tokens"], 6)
    if invalid:
        out["invalid"] = invalid
    if resets:
        out["resets"] = sorted(set(resets))
    if impossible:
        out["impossible"] = impossible
    return out


def _position_deltas(start: Snapshot, end: Snapshot, key: str) -> tuple[list[float] | None, str | None]:
    """The increase of the per-position counter ``key`` between two scrapes, position 0 first: (deltas, None), or
    (None, why): "absent" (the server has no such counter, or it was invalid in either scrape), "reset" (a
    position went backwards), "appeared" (a position the start scrape lacked while it held other counters: no
    start to count from)."""
    e = end.per_position.get(key)
    if e is None or key in start.invalid:
        return None, "absent"
    s = start.per_position.get(key, {})
    if any(p not in s for p in e) and (start.counters or start.per_position):
        return None, "appeared"
    d = [e[p] - s.get(p, 0.0) for p in range(len(e))]
    if any(x < 0 for x in d):
        return None, "reset"
    return d, None


def _spec_impossible(c: dict[str, float], per_pos: list[float] | None) -> list[str]:
    """What cannot be among the speculative-decoding deltas ``c`` (counters) and ``per_pos`` (accepted tokens by
    draft position). vLLM counts a draft of d tokens with a accepted as one draft, d draft tokens, a accepted tokens
    and one accepted token at each of positions 0 .. a - 1 (``SpecDecodingStats.observe_draft``), with d and a at
    most ``num_speculative_tokens``: so accepted <= drafted <= drafts x positions, each position <= drafts, the
    positions never increase, and they sum to the accepted tokens."""
    out: list[str] = []
    drafts, drafted, accepted = c.get("spec_drafts"), c.get("spec_draft_tokens"), c.get("spec_accepted_tokens")
    if accepted is not None and accepted > (drafted or 0.0):
        out.append(f"spec_accepted_tokens {accepted:g} > spec_draft_tokens {drafted or 0.0:g}")
    if per_pos is None:
        return out
    k = len(per_pos)
    if drafted is not None and drafts is not None and drafted > drafts * k:
        out.append(f"spec_draft_tokens {drafted:g} > spec_drafts {drafts:g} x {k} positions")
    for p, a in enumerate(per_pos):
        if a > (drafts or 0.0):
            out.append(f"spec_accepted_per_pos position {p}: {a:g} > spec_drafts {drafts or 0.0:g}")
        if p and a > per_pos[p - 1]:
            out.append(f"spec_accepted_per_pos position {p}: {a:g} > position {p - 1}: {per_pos[p - 1]:g}")
    if accepted is not None and abs(sum(per_pos) - accepted) > 1e-6:
        out.append(f"spec_accepted_per_pos sum {sum(per_pos):g} != spec_accepted_tokens {accepted:g}")
    return out


def _spec_decode(c: dict[str, float], per_pos: list[float] | None, derive: bool) -> dict[str, Any]:
    """``delta["spec_decode"]`` (the module docstring): the counts over the suite (tokens; a counter the server
    lacks or that reset is left out) and, where ``derive`` (nothing impossible) and their counters are there, the
    shares. Rates rounded to 1e-6."""
    out: dict[str, Any] = {}
    for k, name in (("drafts", "spec_drafts"), ("draft_tokens", "spec_draft_tokens"),
                    ("accepted_tokens", "spec_accepted_tokens")):
        if name in c:
            out[k] = int(round(c[name]))
    if per_pos is not None:
        out["num_speculative_tokens"] = len(per_pos)
        out["accepted_per_position"] = [int(round(a)) for a in per_pos]
    if not derive:
        return out
    drafts, accepted = c["spec_drafts"], c.get("spec_accepted_tokens")
    if accepted is not None and c.get("spec_draft_tokens"):
        out["acceptance_rate"] = round(accepted / c["spec_draft_tokens"], 6)
    if accepted is not None:
        out["mean_accepted_length"] = round(1.0 + accepted / drafts, 6)  # vLLM's: the bonus token counted
    if per_pos is not None:
        out["per_position"] = [round(a / drafts, 6) for a in per_pos]
    return out


#: The most of ``/metrics`` a scrape reads (a real vLLM's is a few hundred KB).
MAX_METRICS_BYTES = 8 * 1024 * 1024
#: The longest a parse may take in the worker process.
PARSE_TIMEOUT_S = 10.0
_POOL = None


def _pool():
    """The one worker process that parses ``/metrics`` (spawned: no state of the engine is forked into it)."""
    global _POOL
    if _POOL is None:
        import atexit
        import multiprocessing
        from concurrent.futures import ProcessPoolExecutor

        _POOL = ProcessPoolExecutor(max_workers=1, mp_context=multiprocessing.get_context("spawn"))
        atexit.register(_POOL.shutdown, wait=False, cancel_futures=True)
    return _POOL


def _drop_pool() -> None:
    global _POOL
    if _POOL is not None:
        for proc in list(getattr(_POOL, "_processes", {}).values()):
            proc.kill()  # a parse that overran: its worker is ended, not waited for
        _POOL.shutdown(wait=False, cancel_futures=True)
        _POOL = None


def _parse_at(text: str, t: float) -> Snapshot:
    return parse(text, t)


async def parse_elsewhere(text: str, t: float) -> Snapshot:
    """:func:`parse` of ``text`` in the worker process, at most :data:`PARSE_TIMEOUT_S`; the event loop only
    waits. Raises ValueError (not Prometheus text) or asyncio.TimeoutError (the parse overran; the worker is
    ended)."""
    from concurrent.futures.process import BrokenProcessPool

    loop = asyncio.get_running_loop()
    try:
        return await within(loop.run_in_executor(_pool(), _parse_at, text, t), PARSE_TIMEOUT_S)
    except asyncio.TimeoutError:
        _drop_pool()
        raise
    except BrokenProcessPool as e:
        _drop_pool()
        raise ValueError(f"the parser process died ({e})") from None


async def scrape(http: httpx.AsyncClient, url: str) -> tuple[Snapshot | None, str | None]:
    """(snapshot, None), or (None, why) when ``url``/metrics cannot be read as Prometheus text."""
    async def read() -> tuple[int, bytes | None]:
        async with http.stream("GET", url.rstrip("/") + "/metrics", timeout=10.0) as r:
            if r.status_code != 200:
                return r.status_code, None
            body = bytearray()
            async for chunk in r.aiter_bytes():
                body += chunk
                if len(body) > MAX_METRICS_BYTES:
                    return r.status_code, b""
            return r.status_code, bytes(body)

    try:  # bounded whole: a server trickling one byte at a time must not hold the suite
        status, body = await within(read(), 20.0)
    except asyncio.TimeoutError:
        return None, "GET /metrics gave no whole answer within 20 s"
    except httpx.HTTPError as e:
        return None, f"GET /metrics failed: {type(e).__name__}: {e}"
    if body is None:
        return None, f"GET /metrics answered HTTP {status}"
    if body == b"":
        return None, f"GET /metrics is larger than {MAX_METRICS_BYTES // 2**20} MiB"
    t = time.monotonic()
    try:
        snap = await parse_elsewhere(body.decode("utf-8", "replace"), t)
    except asyncio.TimeoutError:
        return None, f"GET /metrics took more than {PARSE_TIMEOUT_S:g} s to parse"
    except ValueError as e:
        return None, f"GET /metrics is not Prometheus text: {e}"
    if not (snap.histograms or snap.counters or snap.gauges):
        return None, "GET /metrics holds none of vLLM's metrics"
    return snap, None


class ServerMetrics:
    """Scrapes one server for one suite: :meth:`begin`, optionally :meth:`sample_every` during it, :meth:`end`.

    ``result()`` is what the record keeps: ``{"available": bool, "why": str | None, "delta": {...},
    "series": [[t_s, {gauge or counter: value}], ...]}``; never raises for a server that has no metrics.
    """

    def __init__(self, url: str | None, transport: httpx.AsyncBaseTransport | None = None):
        self.url = url
        self.transport = transport  # tests: an httpx mock transport
        self.start: Snapshot | None = None
        self.why: str | None = None if url else "no server"
        self.series: list[list] = []
        self._last: Snapshot | None = None
        self._http: httpx.AsyncClient | None = None

    async def begin(self) -> None:
        if not self.url:
            return
        self._http = httpx.AsyncClient(transport=self.transport)
        self.start, self.why = await scrape(self._http, self.url)

    async def sample_every(self, interval_s: float, stop: asyncio.Event) -> None:
        """Append a sample of the gauges and the running counters every ``interval_s`` until ``stop`` is set."""
        if self.start is None or self._http is None:
            return
        while not stop.is_set():
            try:
                await within(stop.wait(), interval_s)
                break
            except asyncio.TimeoutError:
                pass
            snap, _ = await scrape(self._http, self.url)
            if snap is not None:
                row = {**snap.gauges, "preemptions": snap.counters.get("preemptions", 0.0) - self.start.counters.get("preemptions", 0.0),
                       "generation_tokens": snap.counters.get("generation_tokens", 0.0) - self.start.counters.get("generation_tokens", 0.0)}
                self.series.append([round(snap.t - self.start.t, 2), {k: round(v, 4) for k, v in row.items()}])

    async def end(self) -> dict[str, Any]:
        """Scrape once more and return what the record keeps (see the class docstring)."""
        try:
            if self.start is None or self._http is None:
                return {"available": False, "why": self.why}
            snap, why = await scrape(self._http, self.url)
            if snap is None:
                return {"available": False, "why": f"at the end of the suite: {why}"}
            return {"available": True, "why": None, "delta": delta(self.start, snap), "series": self.series}
        finally:
            await self.aclose()

    async def aclose(self) -> None:
        """Close the HTTP client (idempotent; :meth:`end` does it)."""
        if self._http is not None:
            await self._http.aclose()
            self._http = None

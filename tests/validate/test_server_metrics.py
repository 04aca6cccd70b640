"""The server's own counters: Prometheus text parsed with prometheus_client, deltas over a suite, quantiles
from bucket deltas, and a server without /metrics recorded as unavailable, never as zeros."""
from __future__ import annotations

import asyncio

import httpx
import pytest

from validate.server_metrics import ServerMetrics, delta, parse, quantile

pytestmark = pytest.mark.timeout(60)


def exposition(n_ttft: list[int], ttft_sum: float, preempt: int, stop: int, length: int, kv: float) -> str:
    """vLLM-shaped text: a TTFT histogram with buckets 0.01 / 0.1 / 1 / +Inf (cumulative counts ``n_ttft``),
    counters with _total and _created samples, requests by finish reason, a gauge."""
    c1, c2, c3, c4 = n_ttft
    return f"""# HELP vllm:time_to_first_token_seconds Histogram of time to first token in seconds.
# TYPE vllm:time_to_first_token_seconds histogram
vllm:time_to_first_token_seconds_bucket{{engine="0",le="0.01",model_name="smol"}} {c1}
vllm:time_to_first_token_seconds_bucket{{engine="0",le="0.1",model_name="smol"}} {c2}
vllm:time_to_first_token_seconds_bucket{{engine="0",le="1.0",model_name="smol"}} {c3}
vllm:time_to_first_token_seconds_bucket{{engine="0",le="+Inf",model_name="smol"}} {c4}
vllm:time_to_first_token_seconds_count{{engine="0",model_name="smol"}} {c4}
vllm:time_to_first_token_seconds_sum{{engine="0",model_name="smol"}} {ttft_sum}
# HELP vllm:num_preemptions_total Cumulative number of preemption from the engine.
# TYPE vllm:num_preemptions_total counter
vllm:num_preemptions_total{{engine="0",model_name="smol"}} {preempt}
vllm:num_preemptions_created{{engine="0",model_name="smol"}} 1.7e9
# HELP vllm:request_success_total Count of successfully processed requests.
# TYPE vllm:request_success_total counter
vllm:request_success_total{{engine="0",finished_reason="stop",model_name="smol"}} {stop}
vllm:request_success_total{{engine="0",finished_reason="length",model_name="smol"}} {length}
vllm:request_success_total{{engine="0",finished_reason="abort",model_name="smol"}} 0
# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{{engine="0",model_name="smol"}} {kv}
"""


def test_delta_counts_means_quantiles_and_reasons():
    a = parse(exposition([0, 2, 4, 4], 0.3, 1, 3, 1, 0.0), t=10.0)
    b = parse(exposition([0, 2, 12, 14], 5.3, 4, 10, 4, 0.25), t=40.0)
    d = delta(a, b)
    assert d["interval_s"] == 30.0
    h = d["histograms"]["ttft"]
    # 10 new requests: 0 in (0, 0.1], 8 in (0.1, 1], 2 above 1 s; mean = (5.3 - 0.3) / 10 s
    assert h["count"] == 10 and h["mean_ms"] == 500.0
    # p50: rank 5 of 10 falls in (0.1, 1] holding ranks 1-8: 0.1 + 0.9 * 5 / 8 s
    assert h["p50_ms"] == pytest.approx(1e3 * (0.1 + 0.9 * 5 / 8))
    assert h["p99_ms"] == 1000.0  # in the +Inf bucket: the highest finite bound
    assert d["counters"]["preemptions"] == 3 and d["counters"]["requests"] == 10
    assert d["requests_by_finish_reason"] == {"stop": 7, "length": 3}
    assert d["gauges_at_end"] == {"kv_cache_usage": 0.25}


def test_quantile_edges():
    assert quantile(0.5, []) is None and quantile(0.5, [(1.0, 0), (float("inf"), 0)]) is None
    assert quantile(0.5, [(1.0, 4), (float("inf"), 4)]) == 0.5  # first bucket from 0
    assert quantile(0.25, [(1.0, 0), (2.0, 4), (float("inf"), 4)]) == 1.25


@pytest.mark.parametrize("answer,why", [
    (httpx.Response(404, text="not found"), "GET /metrics answered HTTP 404"),
    (httpx.Response(200, text="# nothing of vLLM\nother_metric 1\n"), "GET /metrics holds none of vLLM's metrics"),
])
def test_a_server_without_metrics_is_unavailable_not_zero(answer, why):
    sm = ServerMetrics("http://x", transport=httpx.MockTransport(lambda r: answer))

    async def go():
        await sm.begin()
        return await sm.end()

    assert asyncio.run(go()) == {"available": False, "why": why}


def test_begin_and_end_around_a_suite():
    texts = iter([exposition([0, 1, 1, 1], 0.05, 0, 1, 0, 0.0), exposition([0, 3, 3, 3], 0.15, 0, 3, 0, 0.1)])
    sm = ServerMetrics("http://x", transport=httpx.MockTransport(lambda r: httpx.Response(200, text=next(texts))))

    async def go():
        await sm.begin()
        return await sm.end()

    out = asyncio.run(go())
    assert out["available"] is True and out["delta"]["histograms"]["ttft"] == {
        "count": 2, "mean_ms": 50.0, "p50_ms": pytest.approx(55.0), "p99_ms": pytest.approx(99.1)}  # 10 + 90 * rank / 2 ms


def test_notes_put_the_server_ttft_beside_the_clients(tmp_path):
    from tests.conftest import REPO
    from tests.validate.test_records_render import rec
    from validate.record import record_path, write_record
    from validate.render import render_release

    a = parse(exposition([0, 2, 4, 4], 0.3, 1, 3, 1, 0.0), t=10.0)
    b = parse(exposition([0, 2, 12, 14], 5.3, 4, 10, 4, 0.25), t=40.0)
    probe = rec("cpu-smol", "probe", metrics={"decode_tok_s": 26.0})
    probe.server_metrics = {"available": True, "why": None, "delta": delta(a, b),
                            "series": [[5.0, {"kv_cache_usage": 0.125}], [10.0, {"kv_cache_usage": 0.375}]]}
    probe.client = {"requests": 10, "ok": 10, "ttft_count": 10, "ttft_mean_ms": 512.5}
    other = rec("ext", "probe", metrics={"decode_tok_s": 26.0})
    other.server_metrics = {"available": False, "why": "GET /metrics answered HTTP 404"}
    for r in (probe, other):
        write_record(record_path(tmp_path, "v9", r.config, r.suite), r)
    md = render_release(REPO, tmp_path, "v9", None).read_text()
    # server TTFT mean 500 ms, client 512.5: the client's share 12.5 ms; queue/prefill not in this exposition
    assert "| cpu-smol | probe | 10 | 512.5 ms | 500.0 ms | – + – ms | 12.5 ms | – ms | 3 | – | 37.5% | length 3, stop 7 |" in md
    assert "| ext | – | – | – | – | – | – | – | – | – | – | the server exposes no metrics (GET /metrics answered HTTP 404) |" in md


def test_a_lying_counter_costs_that_counter_only():
    """A histogram count of NaN or +Inf, a bucket without le, a counter gone backwards (a restart), an impossible
    KV usage or prefix-hit count: each is named, the rest of the scrape is kept, and the suite goes on."""
    good = exposition([0, 2, 4, 4], 0.3, 1, 3, 1, 0.0)
    nan = good.replace('time_to_first_token_seconds_count{engine="0",model_name="smol"} 4',
                       'time_to_first_token_seconds_count{engine="0",model_name="smol"} NaN')
    snap = parse(nan)
    assert "ttft" not in snap.histograms and snap.invalid["ttft"].endswith("= nan")
    assert snap.counters["preemptions"] == 1  # the rest of the scrape is kept
    inf = good.replace('le="0.1",model_name="smol"}} 2'.replace("}}", "}"), 'le="0.1",model_name="smol"} +Inf')
    assert "ttft" in parse(inf).invalid
    no_le = good.replace('vllm:time_to_first_token_seconds_bucket{engine="0",le="0.01",model_name="smol"} 0',
                         'vllm:time_to_first_token_seconds_bucket{engine="0",model_name="smol"} 0')
    assert parse(no_le).invalid == {"ttft": "vllm:time_to_first_token_seconds: a bucket without le"}
    a = parse(exposition([0, 2, 4, 4], 0.3, 100, 3, 1, 0.2), t=0.0)
    b = parse(exposition([0, 1, 2, 2], 0.1, 5, 1, 0, 1.7), t=10.0)  # the server restarted mid-suite
    d = delta(a, b)
    assert d["resets"] == ["preemptions", "requests", "ttft"] and "preemptions" not in d["counters"]
    assert d["impossible"] == ["kv_cache_usage = 1.7 (a share: 0 to 1)"]
    def hits(q, h):
        return exposition([0, 0, 0, 0], 0, 0, 0, 0, 0.1) + (
            f"# TYPE vllm:prefix_cache_queries_total counter\nvllm:prefix_cache_queries_total {q}\n"
            f"# TYPE vllm:prefix_cache_hits_total counter\nvllm:prefix_cache_hits_total {h}\n")
    d = delta(parse(hits(0, 0)), parse(hits(10, 30)))
    assert "prefix_cache_hit_rate" not in d and d["impossible"] == ["prefix_cache_hits 30 > prefix_cache_queries 10"]


def test_the_scrape_parses_off_the_timing_loop(monkeypatch):
    """The parse runs in the worker process: a parse() that would raise in the engine's own process is never
    called, and a 2 MB /metrics leaves the event loop free (a ticker beside it keeps its pace)."""
    import time

    import validate.server_metrics as sm

    def not_here(*a, **k):
        raise AssertionError("parse ran on the event loop's process")

    monkeypatch.setattr(sm, "parse", not_here)
    pad = "".join(f'vllm:other_metric_total{{i="{i}"}} {i}\n' for i in range(40_000))  # about 1 MB more
    body = "# TYPE vllm:other_metric_total counter\n" + pad + exposition([0, 2, 4, 4], 0.3, 1, 3, 1, 0.1)
    transport = httpx.MockTransport(lambda req: httpx.Response(200, text=body))

    async def go():
        gaps, stop = [], False

        async def ticker():
            last = time.perf_counter()
            while not stop:
                await asyncio.sleep(0.005)
                now = time.perf_counter()
                gaps.append(now - last)
                last = now

        t = asyncio.create_task(ticker())
        async with httpx.AsyncClient(transport=transport) as http:
            await sm.scrape(http, "http://x")  # the worker's start, outside the measurement
            gaps.clear()
            snap, why = await sm.scrape(http, "http://x")
        stop = True
        await t
        return snap, why, gaps

    snap, why, gaps = asyncio.run(go())
    assert why is None and snap.counters["preemptions"] == 1 and snap.gauges["kv_cache_usage"] == 0.1
    assert len(body) > 1_000_000 and max(gaps) < 0.25  # the same parse on the loop: about 0.33 s on the 2-core box


class VllmSpecCounters:
    """vLLM's own speculative-decoding counters (``SpecDecodingProm`` of ``vllm/v1/spec_decode/metrics.py``, the
    class the Prometheus stat logger uses) in a registry of their own, fed ``SpecDecodingStats`` of known drafts,
    so that the /metrics text, names and labels are vLLM's. ``engines`` data-parallel engines, ``k`` positions."""

    def __init__(self, k: int = 3, engines: int = 1):
        import functools

        pytest.importorskip("vllm.v1.spec_decode.metrics")
        import prometheus_client
        from vllm.config import SpeculativeConfig
        from vllm.v1.spec_decode.metrics import SpecDecodingLogging, SpecDecodingProm

        self.k, self.registry = k, prometheus_client.CollectorRegistry()
        registry = self.registry

        class Prom(SpecDecodingProm):
            _counter_cls = functools.partial(prometheus_client.Counter, registry=registry)

        cfg = SpeculativeConfig(method="ngram", num_speculative_tokens=k, prompt_lookup_max=4, prompt_lookup_min=2)
        self.prom = Prom(cfg, ["model_name", "engine"], {i: ["smol", str(i)] for i in range(engines)})
        self.logging = SpecDecodingLogging()  # what vLLM's log line says of the same drafts

    def observe(self, drafts: list[tuple[int, int]], engine: int = 0, log: bool = True) -> None:
        """One scheduler step's drafts on ``engine``: (draft tokens, accepted tokens) per draft."""
        from vllm.v1.spec_decode.metrics import SpecDecodingStats

        stats = SpecDecodingStats.new(self.k)
        for d, a in drafts:
            stats.observe_draft(d, a)
        self.prom.observe(stats, engine)
        if log:
            self.logging.observe(stats)

    def text(self) -> str:
        import prometheus_client

        return prometheus_client.generate_latest(self.registry).decode()

    def log_line(self) -> str:
        lines: list[str] = []
        self.logging.log(log_fn=lambda fmt, *args: lines.append(fmt % args))
        return lines[0]


def with_spec(text: str) -> str:
    """vLLM's spec-decode counters beside the rest of an exposition (a scrape holds both)."""
    return exposition([0, 0, 0, 0], 0, 0, 0, 0, 0.1) + text


def test_spec_decode_counters_of_real_vllm_text():
    """Two engines' counters as vLLM writes them: 2 drafts before the suite, 5 on engine 0 and 2 on engine 1 during
    it. Over the suite: 7 drafts, 19 draft tokens, 12 accepted (engine 0: 3+2+0+1+3, engine 1: 3+0); accepted at
    position 0 by 5 drafts (a >= 1), 1 by 4 (a >= 2), 2 by 3 (a = 3)."""
    v = VllmSpecCounters(k=3, engines=2)
    v.observe([(3, 3), (3, 1)], log=False)
    a = parse(with_spec(v.text()), t=0.0)
    assert a.per_position == {"spec_accepted_per_pos": {0: 2.0, 1: 1.0, 2: 1.0}} and a.counters["spec_drafts"] == 2
    v.observe([(3, 3), (3, 2), (3, 0), (2, 1), (3, 3)], engine=0)
    v.observe([(3, 3), (2, 0)], engine=1)
    d = delta(a, parse(with_spec(v.text()), t=5.0))
    assert d["spec_decode"] == {
        "drafts": 7, "draft_tokens": 19, "accepted_tokens": 12, "num_speculative_tokens": 3,
        "accepted_per_position": [5, 4, 3], "acceptance_rate": round(12 / 19, 6),
        "mean_accepted_length": round(1 + 12 / 7, 6), "per_position": [round(5 / 7, 6), round(4 / 7, 6), round(3 / 7, 6)]}
    assert d["spec_acceptance_rate"] == round(12 / 19, 6) and "impossible" not in d and "resets" not in d
    # vLLM's own log line of the same 7 drafts gives the same mean length and per-position rates
    line = v.log_line()
    assert "Mean acceptance length: 2.71," in line and "Per-position acceptance rate: 0.714, 0.571, 0.429," in line
    assert "Accepted: 12 tokens, Drafted: 19 tokens" in line


def test_a_server_without_speculation_has_no_spec_decode():
    d = delta(parse(exposition([0, 2, 4, 4], 0.3, 1, 3, 1, 0.0)), parse(exposition([0, 2, 6, 6], 0.5, 1, 5, 1, 0.0)))
    assert "spec_decode" not in d and "spec_acceptance_rate" not in d
    v = VllmSpecCounters(k=2)
    same = parse(with_spec(v.text()))
    assert "spec_decode" not in delta(same, same)  # the counters are there, but no draft moved


def test_a_restart_refuses_the_spec_decode_shares():
    """A server restarted mid-suite: its counters start again from 0, below the start scrape's; no delta, no share.
    A per-position counter alone gone backwards costs the per-position figures only."""
    before = VllmSpecCounters(k=3)
    before.observe([(3, 3)] * 6)
    after = VllmSpecCounters(k=3)  # the restarted server's
    after.observe([(3, 1)] * 2)
    d = delta(parse(with_spec(before.text())), parse(with_spec(after.text())))
    assert {"spec_drafts", "spec_draft_tokens", "spec_accepted_tokens", "spec_accepted_per_pos"} <= set(d["resets"])
    assert "spec_decode" not in d and "spec_acceptance_rate" not in d
    v = VllmSpecCounters(k=3)
    v.observe([(3, 2)] * 4)
    start = v.text()
    v.observe([(3, 2)] * 4)
    end = v.text().replace('position="1"} 8.0', 'position="1"} 3.0')  # went back from 4
    d = delta(parse(with_spec(start)), parse(with_spec(end)))
    assert d["resets"] == ["spec_accepted_per_pos"]
    assert d["spec_decode"] == {"drafts": 4, "draft_tokens": 12, "accepted_tokens": 8, "acceptance_rate": round(8 / 12, 6),
                                "mean_accepted_length": 3.0}


@pytest.mark.parametrize("edit,lie", [
    # a position accepting more tokens than there were drafts (4 drafts during the suite)
    (('position="0"} 8.0', 'position="0"} 9.0'), "spec_accepted_per_pos position 0: 5 > spec_drafts 4"),
    # the positions' sum (4 + 4 + 1) other than the accepted tokens (8)
    (('position="2"} 0.0', 'position="2"} 1.0'), "spec_accepted_per_pos sum 9 != spec_accepted_tokens 8"),
    # a later position accepting more than an earlier one (per position 2, 4, 2: the sum still 8)
    ([('position="0"} 8.0', 'position="0"} 6.0'), ('position="2"} 0.0', 'position="2"} 2.0')],
     "spec_accepted_per_pos position 1: 4 > position 0: 2"),
    # accepted above drafted tokens
    (('num_draft_tokens_total{engine="0",model_name="smol"} 24.0', 'num_draft_tokens_total{engine="0",model_name="smol"} 19.0'),
     "spec_accepted_tokens 8 > spec_draft_tokens 7"),
    # more draft tokens than drafts x positions (4 x 3)
    (('num_draft_tokens_total{engine="0",model_name="smol"} 24.0', 'num_draft_tokens_total{engine="0",model_name="smol"} 25.0'),
     "spec_draft_tokens 13 > spec_drafts 4 x 3 positions"),
])
def test_an_impossible_spec_counter_refuses_the_shares(edit, lie):
    """vLLM's text of 4 drafts of 3 tokens with 2 accepted each (per position 4, 4, 0), one counter then edited to
    a value no vLLM writes: the lie is named, the counts are kept, no share is derived from them."""
    v = VllmSpecCounters(k=3)
    v.observe([(3, 2)] * 4)
    start = v.text()
    v.observe([(3, 2)] * 4)
    end = v.text()
    for old, new in [edit] if isinstance(edit, tuple) else edit:
        assert old in end
        end = end.replace(old, new)
    d = delta(parse(with_spec(start)), parse(with_spec(end)))
    assert any(x.startswith(lie) for x in d["impossible"]), d["impossible"]
    sd = d["spec_decode"]
    assert sd["drafts"] == 4 and "accepted_per_position" in sd
    assert not {"acceptance_rate", "mean_accepted_length", "per_position"} & set(sd) and "spec_acceptance_rate" not in d


def test_a_position_label_that_is_not_a_position_is_invalid():
    v = VllmSpecCounters(k=2)
    v.observe([(2, 1)])
    snap = parse(with_spec(v.text().replace('position="1"', 'position="one"')))
    assert snap.invalid == {"spec_accepted_per_pos": "vllm:spec_decode_num_accepted_tokens_per_pos: a sample whose "
                                                     "position is 'one'"}
    assert "spec_accepted_per_pos" not in snap.per_position and snap.counters["spec_drafts"] == 1

"""BetterBench's shared-prompt and prefix-repetition rows against the synthetic server: what the server received
(exact counts, identical prompts, one common prefix with distinct suffixes), the server's prefix-cache hit rate
read from its counters, a hit rate that cannot be read, and the performance gate over the rows' figures."""
from __future__ import annotations

import asyncio
import json
from fractions import Fraction

import pytest
import yaml

from tests.conftest import REPO
from tests.synth_server import Script, SynthServer, prefix_cache_text
from validate.perfgate import PerfGateSpec, compare_perf, lower_is_better
from validate.record import record_path, write_record
from validate.runners import betterbench
from validate.runners.betterbench import SHARED_PROMPTS, prefix_hit_rate
from validate.runners.text import ESSAY, TextPool
from validate.server_metrics import parse

pytestmark = pytest.mark.timeout(60)

BLOCK = 16  # the synthetic server's prefix-cache block (tokens)
PARAMS = {"passes": 2, "decode_tokens": 8, "prefill_depths": [64], "concurrency": [1, 2], "requests_per_client": 2,
          "prompt_tokens": 16, "agg_tokens": 4, "shared_copies": 5, "shared_tokens": 6, "prefix_tokens": 64,
          "prefix_suffix_tokens": 8, "prefix_concurrency": 3, "prefix_output_tokens": 5}
POOL = list(range(1000, 1000 + 8192))  # distinct ids: no two windows from other offsets share a block


def run_against_synth(monkeypatch, script: Script, params: dict = PARAMS, budget_s: float | None = None,
                      progress=None, on_pool=None):
    """BetterBench's run on the synthetic server (which has no /tokenize: the text pool is :data:`POOL`), under
    the time budget ``budget_s``, with ``progress`` as the context's, calling ``on_pool()`` when the pool is built.
    Returns (SuiteResult, every request body the server received in arrival order as (path, body))."""
    from validate.client import OpenAIClient
    from validate.config import ModelSpec, ServeConfig, ServerSpec
    from validate.runners.base import RunContext

    async def pool(cls, client, data_dir, min_tokens, start=0):
        assert min_tokens <= len(POOL)
        if on_pool:
            on_pool()
        return TextPool(list(POOL))

    monkeypatch.setattr(betterbench.TextPool, "build", classmethod(pool))
    cfg = ServeConfig(name="synth", model=ModelSpec(path="m", served_name="synth"),
                      server=ServerSpec(max_num_seqs=4, max_model_len=4096))
    received: list[tuple[str, dict]] = []

    async def go():
        async with SynthServer(script) as srv:
            handle = srv._handle

            def spy(conn, method, target, headers, body, t_ns):  # what the server received, in arrival order
                if method == "POST":
                    received.append((target, json.loads(body)))
                return handle(conn, method, target, headers, body, t_ns)

            srv._handle = spy
            async with OpenAIClient(srv.url, "synth") as c:
                ctx = RunContext(root=REPO, config=cfg, profile="quick", client=c, data_dir=None, record_dir=REPO,
                                 budget_s=budget_s, **({"progress": progress} if progress else {}))
                return await betterbench.run(ctx, betterbench.BetterBenchParams(**params))

    return asyncio.run(asyncio.wait_for(go(), 50)), received


def expected_hits(prompts: list[list[int]], earlier: list[list[int]]) -> int:
    """vLLM's prefix-cache hits (tokens) of ``prompts`` in arrival order after ``earlier``: per prompt of L tokens,
    its longest common prefix with any prompt before it, capped at L - 1 and cut to whole blocks."""
    seen, hits = list(earlier), 0
    for p in prompts:
        lcp = max((next((i for i, (a, b) in enumerate(zip(p, q)) if a != b), min(len(p), len(q))) for q in seen),
                  default=0)
        hits += min(lcp, len(p) - 1) // BLOCK * BLOCK
        seen.append(p)
    return hits


def test_rows_send_what_they_say_and_read_the_hit_rate_from_the_counters(monkeypatch):
    out, received = run_against_synth(monkeypatch, Script(ttft_ms=2, itl_ms=1, prefix_cache_block=BLOCK))
    assert not out.errors, out.errors
    n_pass, copies = PARAMS["passes"], PARAMS["shared_copies"]
    chats = [b for path, b in received if path == "/v1/chat/completions"]
    for kind, prompt in SHARED_PROMPTS.items():
        mine = [b for b in chats if b["messages"] == [{"role": "user", "content": prompt}]]
        assert len(mine) == n_pass * copies, kind  # exactly N copies a pass
        assert all(b == mine[0] for b in mine)  # one prompt: every body the same, answer length and all
        assert mine[0]["max_tokens"] == PARAMS["shared_tokens"] and mine[0]["ignore_eos"] is True
    assert len(chats) == n_pass * (1 + 2 * copies)  # the decode essay and the two shared rows, nothing else
    assert sum(b["messages"][0]["content"] == ESSAY for b in chats) == n_pass

    p_len, s_len = PARAMS["prefix_tokens"], PARAMS["prefix_suffix_tokens"]
    completions = [b["prompt"] for path, b in received if path == "/v1/completions"]
    rows = [p for p in completions if len(p) == p_len + s_len]
    per_row = PARAMS["prefix_concurrency"] * PARAMS["requests_per_client"]
    assert len(rows) == n_pass * per_row
    prefixes = list(dict.fromkeys(tuple(p[:p_len]) for p in rows))
    assert len(prefixes) == n_pass  # one common prefix a pass, a fresh one each pass
    groups = [[p for p in rows if tuple(p[:p_len]) == pre] for pre in prefixes]
    for g in groups:
        assert len(g) == per_row and len({tuple(p[p_len:]) for p in g}) == per_row  # distinct suffixes
        start = POOL.index(g[0][0])
        assert g[0][:p_len] == POOL[start:start + p_len]  # a window of real text from the pool
    assert out.metrics["prefix_tokens"] == p_len

    # the hit rate of each pass: the counters' increase over the row, as the block model counts it
    for n, g in enumerate(groups):
        hits = expected_hits(g, completions[:completions.index(g[0])])  # every token-id prompt before the row
        queries = per_row * (p_len + s_len)
        # a cold prefix: the first request misses, every later one hits the prefix's 4 whole blocks
        assert hits == (per_row - 1) * p_len
        rate = out.metrics["per_pass"][n]["server_prefix_cache_hit_rate"]
        # per-pass figures are kept to 0.001 (the rows' rounding), the rate of 320 / 432 hit tokens too
        assert rate == round(hits / queries, 3) == round(float(Fraction(5 * 64, 6 * 72)), 3) == 0.741
    assert out.metrics["server_prefix_cache_hit_rate_why"] is None
    s = out.metrics["summary"]
    for key in ("shared_code_tok_s", "shared_json_tok_s", "shared_code_ttft_ms_p50", "shared_json_tpot_ms_p50",
                "prefix_tok_s", "prefix_ttft_ms_p50", "prefix_tpot_ms_p50"):
        assert all(row[key] > 0 for row in out.metrics["per_pass"]), key
        assert s[key]["min"] <= s[key]["median"] <= s[key]["max"], key
    assert s["server_prefix_cache_hit_rate"] == {"median": 0.741, "min": 0.741, "max": 0.741}
    # no first token before the scripted 2 ms; the tokens after it come 1 ms apart as the client sees them
    for key in ("shared_code_ttft_ms_p50", "shared_json_ttft_ms_p50", "prefix_ttft_ms_p50"):
        assert s[key]["min"] >= 2.0, key
    assert 0.5 < s["shared_code_tpot_ms_p50"]["median"] < 5.0
    assert set(out.metrics["shared_prompts"]) == {"code", "json"}


def test_a_server_without_metrics_gives_no_hit_rate_and_says_why(monkeypatch):
    params = {**PARAMS, "shared_copies": 2, "prefix_concurrency": 2, "requests_per_client": 1}
    out, received = run_against_synth(monkeypatch, Script(ttft_ms=1, itl_ms=1), params)  # no /metrics: 404
    assert not out.errors, out.errors  # the server's counters are not the suite's figures: no error, and no 0
    for row in out.metrics["per_pass"]:
        assert "server_prefix_cache_hit_rate" in row and row["server_prefix_cache_hit_rate"] is None
        assert row["prefix_tok_s"] > 0
    assert out.metrics["server_prefix_cache_hit_rate_why"] == (
        "no hit rate in 2 of 2 passes; first: pass 0: before the row: GET /metrics answered HTTP 404")
    assert out.metrics["summary"]["server_prefix_cache_hit_rate"] == {"median": None, "min": None, "max": None}
    posts = [b for _, b in received]
    assert sum(len(b.get("prompt", [])) == 72 for b in posts) == 2 * 2  # 2 passes x 2 clients x 1 request
    assert sum(b.get("messages") == [{"role": "user", "content": SHARED_PROMPTS["json"]}] for b in posts) == 2 * 2


def snap(queries: float | None, hits: float | None):
    text = ""
    if queries is not None:
        text += f"# TYPE vllm:prefix_cache_queries_total counter\nvllm:prefix_cache_queries_total {queries}\n"
    if hits is not None:
        text += f"# TYPE vllm:prefix_cache_hits_total counter\nvllm:prefix_cache_hits_total {hits}\n"
    text += "# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running 0\n"
    return parse(text, 0.0), None


def test_hit_rate_from_counters_and_every_reason_it_cannot_be_read():
    assert prefix_hit_rate(snap(100, 40), snap(1156, 936)) == (0.848485, None)  # (936-40) / (1156-100)
    assert prefix_hit_rate((parse(prefix_cache_text(0, 0).decode(), 0.0), None),
                           (parse(prefix_cache_text(8448, 7168).decode(), 1.0), None)) == (0.848485, None)
    assert prefix_hit_rate(snap(100, 40), snap(100, 40)) == (
        None, "vllm:prefix_cache_queries did not move during the row (prefix caching is off)")
    assert prefix_hit_rate(snap(None, None), snap(None, None)) == (
        None, "the server's /metrics has no vllm:prefix_cache_queries counter")
    rate, why = prefix_hit_rate(snap(100, 40), snap(110, 90))
    assert rate is None and why == "impossible counters: prefix_cache_hits 50 > prefix_cache_queries 10"
    rate, why = prefix_hit_rate(snap(500, 40), snap(100, 90))
    assert rate is None and why.startswith("vllm:prefix_cache_queries went backwards")
    assert prefix_hit_rate((None, "GET /metrics answered HTTP 404"), snap(1, 1)) == (
        None, "before the row: GET /metrics answered HTTP 404")
    assert prefix_hit_rate(snap(1, 1), (None, "GET /metrics failed: ConnectError")) == (
        None, "after the row: GET /metrics failed: ConnectError")
    rate, why = prefix_hit_rate(snap(100, 40), snap(float("nan"), 90))
    assert rate is None and why.startswith("counters that are not numbers: ")
    # the hits counter alone lies, is lost or appears: never a rate of 0 or one from absolute values
    assert prefix_hit_rate(snap(100, 40), snap(200, 30)) == (
        None, "vllm:prefix_cache_hits went backwards between the scrapes (the server restarted during the row)")
    assert prefix_hit_rate(snap(100, 40), snap(200, None)) == (
        None, "the server's /metrics has no vllm:prefix_cache_hits counter")
    assert prefix_hit_rate(snap(100, None), snap(200, 90)) == (
        None, "vllm:prefix_cache_hits appeared between the scrapes (no count before the row)")
    rate, why = prefix_hit_rate(snap(float("nan"), float("nan")), snap(1100, 900))
    assert rate is None and why.startswith("counters that are not numbers: ")
    rate, why = prefix_hit_rate(snap(-100, -90), snap(100, 90))
    assert rate is None and why.startswith("impossible counters: a negative count")


def suite_gate() -> PerfGateSpec:
    return PerfGateSpec.model_validate(yaml.safe_load((REPO / "suites" / "betterbench.yaml").read_text())["perf_gate"])


def test_the_suite_gates_every_row_rate_and_time_and_never_the_hit_rate():
    spec = suite_gate()
    for key in ("shared_code_tok_s", "shared_json_tok_s", "shared_code_ttft_ms_p50", "shared_json_tpot_ms_p50",
                "prefix_tok_s", "prefix_ttft_ms_p50", "prefix_tpot_ms_p50"):
        assert spec.threshold(key) == 5.0 and lower_is_better(key) is not None, key
    assert spec.threshold("server_prefix_cache_hit_rate") is None  # a share: neither a time nor a rate
    assert lower_is_better("server_prefix_cache_hit_rate") is None
    assert spec.threshold("decode_step_ms") == 3.0 and spec.threshold("prefill_2048_tok_s") == 5.0


def _bench(release: str, scale: float, seed: int, n: int = 8, drop: str | None = None):
    """A BetterBench record with the rows' figures per pass (``scale`` multiplies shared_json_tok_s)."""
    from tests.validate.test_compare import stamp
    from tests.validate.test_perfgate import passes
    from tests.validate.test_records_render import rec

    r = rec("cpu-smol", "betterbench", metrics={})
    r.release, r.suite_kind, r.started_at = release, "betterbench", stamp(release)
    r.params = {**PARAMS, "passes": n}
    r.perf_gate = suite_gate().model_dump()
    code, json_ = passes(n, 400.0, 0.01, seed), passes(n, 550.0 * scale, 0.01, seed + 1)
    ttft = passes(n, 90.0, 0.01, seed + 2)
    rows = [{"pass": i, "decode_step_ms": 38.0 + 0.01 * i, "shared_code_tok_s": code[i], "shared_json_tok_s": json_[i],
             "prefix_ttft_ms_p50": ttft[i], "server_prefix_cache_hit_rate": 0.5 + 0.01 * i} for i in range(n)]
    for row in rows:
        row.pop(drop, None)
    r.metrics = {"passes": n, "per_pass": rows}
    return r


def test_the_gate_catches_a_lost_row_figure_and_a_slower_row_and_ignores_the_hit_rate(tmp_path):
    specs = {"betterbench": suite_gate()}
    write_record(record_path(tmp_path, "v1", "cpu-smol", "betterbench"), _bench("v1", 1.0, 1))
    lost = _bench("v2", 1.0, 11, drop="shared_code_tok_s")  # every pass lost the code row's rate
    write_record(record_path(tmp_path, "v2", "cpu-smol", "betterbench"), lost)
    cmp = compare_perf(tmp_path, "v2", "v1", specs)
    assert cmp.unpaired == ["cpu-smol/betterbench: shared_code_tok_s is gated and measured in the baseline but "
                            "missing from the candidate (every pass failed it, or it was not measured)"]
    judged = {f.figure: f for f in cmp.figures}
    assert set(judged) == {"decode_step_ms", "shared_json_tok_s", "prefix_ttft_ms_p50"}  # the hit rate never
    assert not any(f.regression for f in judged.values())

    write_record(record_path(tmp_path, "v3", "cpu-smol", "betterbench"), _bench("v3", 0.9, 21))
    cmp = compare_perf(tmp_path, "v3", "v1", specs)
    assert not cmp.unpaired
    slow = next(f for f in cmp.figures if f.figure == "shared_json_tok_s")
    assert slow.regression and slow.mark == "slower" and 8.0 < slow.worse_pct < 12.0
    assert slow.threshold_pct == 5.0
    assert {f.figure for f in cmp.figures if f.regression} == {"shared_json_tok_s"}

    other = _bench("v4", 1.0, 31)
    other.params["shared_copies"] = 4  # four copies measure another thing than five
    write_record(record_path(tmp_path, "v4", "cpu-smol", "betterbench"), other)
    (u,) = compare_perf(tmp_path, "v4", "v1", specs).unpaired
    assert "shared_copies: 5 vs 4" in u


def test_figures_for_the_notes():
    from tests.validate.test_records_render import rec

    r = rec("cpu-smol", "betterbench", metrics={})
    r.metrics = {"concurrency": [1], "prefill_depths": [64], "summary": {
        "shared_code_tok_s": {"median": 434.0, "min": 430.0, "max": 440.0},
        "server_prefix_cache_hit_rate": {"median": 0.8485, "min": 0.8, "max": 0.85}}}
    specs = {f.key: f for f in betterbench.figures([r])}
    assert specs["bb_shared_code"].get(r) == 434.0 and specs["bb_shared_code"].band(r) == (430.0, 440.0)
    assert specs["bb_shared_code"].per_pass == "shared_code_tok_s" and specs["bb_shared_json"].get(r) is None
    assert specs["bb_prefix"].per_pass == "prefix_tok_s" and specs["bb_prefix_ttft"].per_pass == "prefix_ttft_ms_p50"
    assert not specs["bb_prefix_ttft"].higher_is_better and specs["bb_shared_json_ttft"].unit == "ms"
    hit = specs["bb_prefix_hit"]
    assert hit.per_pass is None and hit.unit == "%" and hit.get(r) == pytest.approx(84.85)
    assert hit.band(r) == pytest.approx((80.0, 85.0))


def test_the_quick_profile_shortens_the_rows_and_keeps_the_seeds_copies():
    from validate.suite import load_suite

    quick = load_suite(REPO / "suites" / "betterbench.yaml", "quick").params
    full = load_suite(REPO / "suites" / "betterbench.yaml", "full").params
    assert full.shared_copies == quick.shared_copies == 8 and full.prefix_tokens == quick.prefix_tokens == 1024
    assert full.shared_tokens is None and full.prefix_output_tokens is None  # agg_tokens: 128
    assert (quick.shared_tokens, quick.prefix_output_tokens) == (16, 16)


def test_the_rows_reach_the_record_through_the_engine(scratch):
    """The whole path (launch of the fake vLLM, run, record): the rows' figures in every pass and the summary, the
    prompts and the prefix as sent, and the fake's GET /metrics (404 without speculative counters) as the reason."""
    from tests.validate.test_soak_betterbench import add_suite, record
    from validate.cli import main

    add_suite(scratch, "mini-bb", "betterbench", {"passes": 2, "decode_tokens": 8, "prefill_depths": [64],
                                                  "concurrency": [1], "requests_per_client": 1, "prompt_tokens": 16,
                                                  "agg_tokens": 4, "shared_copies": 3, "prefix_tokens": 48,
                                                  "prefix_suffix_tokens": 4, "prefix_concurrency": 2})
    scratch.config("fake-bb", FAKE_VLLM_TOKENS=8)
    assert main(["suite", "mini-bb", "--config", "fake-bb", "--release", "b1"]) == 0
    m = record(scratch, "b1", "fake-bb", "mini-bb")["metrics"]
    for key in ("shared_code_tok_s", "shared_json_tok_s", "shared_code_ttft_ms_p50", "shared_json_tpot_ms_p50",
                "prefix_tok_s", "prefix_ttft_ms_p50"):
        assert all(row[key] > 0 for row in m["per_pass"]), key
        assert m["summary"][key]["min"] <= m["summary"][key]["median"] <= m["summary"][key]["max"], key
    assert m["shared_prompts"] == SHARED_PROMPTS and m["prefix_tokens"] == 48
    assert [row["server_prefix_cache_hit_rate"] for row in m["per_pass"]] == [None, None]
    assert m["server_prefix_cache_hit_rate_why"] == (
        "no hit rate in 2 of 2 passes; first: pass 0: before the row: GET /metrics answered HTTP 404")


def test_a_baseline_from_before_the_rows_still_gates_the_other_figures(tmp_path):
    from validate.perfgate import ROW_PARAMS, comparable

    specs = {"betterbench": suite_gate()}
    old = _bench("v1", 1.0, 1)
    old.params = {k: v for k, v in old.params.items() if k not in ROW_PARAMS}
    for row in old.metrics["per_pass"]:
        for key in ("shared_code_tok_s", "shared_json_tok_s", "prefix_ttft_ms_p50"):
            row.pop(key)
    write_record(record_path(tmp_path, "v1", "cpu-smol", "betterbench"), old)
    slow = _bench("v2", 1.0, 11)
    for i, row in enumerate(slow.metrics["per_pass"]):
        row["decode_step_ms"] = 57.0 + 0.01 * i  # 50 % slower than the baseline's 38 ms
    write_record(record_path(tmp_path, "v2", "cpu-smol", "betterbench"), slow)
    cmp = compare_perf(tmp_path, "v2", "v1", specs)
    assert not cmp.unpaired and [(f.figure, f.regression) for f in cmp.figures] == [("decode_step_ms", True)]
    assert sorted(cmp.limited) == [f"cpu-smol/betterbench: {k} is gated but the baseline v1 did not measure it"
                                   for k in ("prefix_ttft_ms_p50", "shared_code_tok_s", "shared_json_tok_s")]
    # a row's answer length left to agg_tokens is the same as agg_tokens named
    a, b = _bench("v1", 1.0, 1), _bench("v2", 1.0, 2)
    a.params["shared_tokens"], b.params["shared_tokens"] = None, b.params["agg_tokens"]
    assert comparable(a, b) == []
    b.params["shared_tokens"] = b.params["agg_tokens"] + 1
    assert comparable(a, b) == ["suite parameters differ (shared_tokens: 4 vs 5)"]

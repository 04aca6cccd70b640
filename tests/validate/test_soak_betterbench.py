"""Soak and BetterBench against the synthetic server: records, memory samples, a server dying mid-soak."""
from __future__ import annotations

import json

import pytest
import yaml

from tests.conftest import REPO, fake_procs
from validate.cli import main


def add_suite(scratch, name, kind, params, gate=None):
    body = {"name": name, "kind": kind, "params": params}
    if gate:
        body["gate"] = gate
    (scratch.root / "suites" / f"{name}.yaml").write_text(yaml.safe_dump(body))


def record(scratch, release, cfg, suite):
    return json.loads((scratch.root / "reports" / release / cfg / f"{suite}.json").read_text())


SOAK = {"clients": 3, "duration_s": 4, "prompt_tokens_min": 10, "prompt_tokens_max": 200, "max_tokens": 4,
        "sample_interval_s": 0.2}


def test_soak_passes_with_memory_samples(scratch):
    add_suite(scratch, "mini-soak", "soak", SOAK, gate={"max": {"errors": 0}})
    scratch.config("fake-soak")
    assert main(["suite", "mini-soak", "--config", "fake-soak", "--release", "s1"]) == 0
    m = record(scratch, "s1", "fake-soak", "mini-soak")["metrics"]
    assert m["errors"] == 0 and m["served"] > 10 and m["prompt_tok_s"] > 0
    assert m["memory_backends"][0] == "process-tree" and len(m["samples"]) >= 10
    host = m["memory"]["host_rss_mib"]
    assert host["flat"] and host["below_total"] and 5 < host["peak"] < host["total"]
    assert 10 <= m["prompt_tokens_range"][0] and m["prompt_tokens_range"][1] == 200


def test_server_dying_mid_soak_fails_with_cause_and_keeps_samples(scratch):
    # 90 s configured, the server dies after 25 requests (~1 s): stopping well inside the 90 s is the point;
    # the bound leaves room for a loaded 2-core CI box (a 30 s / 20 s version flaked there)
    add_suite(scratch, "mini-soak", "soak", {**SOAK, "duration_s": 90}, gate={"max": {"errors": 0}})
    tag = scratch.config("fake-soak-die", mode="die-after", FAKE_VLLM_DIE_AFTER=25)
    assert main(["suite", "mini-soak", "--config", "fake-soak-die", "--release", "s2"]) == 2
    rec = record(scratch, "s2", "fake-soak-die", "mini-soak")
    assert rec["verdict"]["status"] == "error"
    assert rec["verdict"]["cause"].startswith("server died during the suite: the server process exited with status 9: the "
                                              "server died ")
    m = rec["metrics"]
    assert m["served"] == 24 and m["duration_s"] < 60  # stopped early, not after 90 s
    # what failed because the server died is cut by the death, not the server's failures
    assert m["errors"] == 0 and m["cut_by_death"] >= 1 and m["server_died_at_s"] is not None
    assert len(m["samples"]) >= 1 and m["memory_samples_in_life"] <= len(m["samples"])
    assert fake_procs(tag) == []


def test_betterbench_passes_and_bands(scratch):
    add_suite(scratch, "mini-bb", "betterbench", {"passes": 2, "decode_tokens": 8, "prefill_depths": [64, 100000],
                                                  "concurrency": [1, 2, 8], "requests_per_client": 1,
                                                  "prompt_tokens": 16, "agg_tokens": 8})
    # 8 tokens 15 ms apart: an answer spans about 100 ms, so a client stalled on a loaded 2-core box still
    # stamps its chunks apart (at 4 tokens 2 ms apart all came in one read there, and TPOT was undefined)
    scratch.config("fake-bb", FAKE_VLLM_TOKENS=8, FAKE_VLLM_ITL_MS=15)
    assert main(["suite", "mini-bb", "--config", "fake-bb", "--release", "b1"]) == 0
    m = record(scratch, "b1", "fake-bb", "mini-bb")["metrics"]
    assert m["passes"] == 2 and m["prefill_depths"] == [64]  # 100000 > max_model_len is dropped
    s = m["summary"]
    for key in ("decode_tok_s", "decode_step_ms", "prefill_64_tok_s", "c1_tok_s", "c2_tok_s", "c8_tok_s", "combined_decode_tok_s"):
        assert s[key]["min"] <= s[key]["median"] <= s[key]["max"], key
    # max_num_seqs is 4 in the fake configuration: concurrency 8 is measured but not in the combined figure
    assert len(m["per_pass"]) == 2 and m["combined_decode_tok_s"] == s["combined_decode_tok_s"]["median"]


def test_a_dead_engine_behind_a_live_api_server_stops_the_soak(scratch):
    """vLLM's API server outlives its engine core and answers every request at once with an error; the soak must
    stop at the first sign, count only what happened before, and name the death from the log (before, a dead
    engine read as thousands of failed requests)."""
    add_suite(scratch, "mini-soak", "soak", {**SOAK, "clients": 6, "duration_s": 90}, gate={"max": {"errors": 0}})
    tag = scratch.config("fake-engine-dead", mode="engine-dead-after", FAKE_VLLM_DIE_AFTER=20)
    assert main(["suite", "mini-soak", "--config", "fake-engine-dead", "--release", "s3"]) == 2
    rec = record(scratch, "s3", "fake-engine-dead", "mini-soak")
    v, m = rec["verdict"], rec["metrics"]
    assert v["cause"].startswith("server died during the suite: the server no longer answers GET /health with 200")
    # 20 generations before the death, one of them the launch's readiness check; requests already streaming
    # when the 20th ended still finish (up to the other 5 clients')
    assert 19 <= m["served"] <= 24
    assert m["errors"] == 0 and 1 <= m["cut_by_death"] <= 6 and m["duration_s"] < 30
    assert v["reasons"][0] == "ERROR [core_client.py] Engine core proc EngineCore_DP0 died unexpectedly, shutting down client."
    assert fake_procs(tag) == []


@pytest.mark.timeout(120)
def test_soak_ends_at_its_duration_and_counts_the_requests_it_cut(scratch):
    """Answers of 40 tokens 25 ms apart take about a second: in 4 s each of the 3 clients serves some and has one
    in flight at the deadline, which is cancelled and counted apart (neither served nor an error); the suite
    ends within a few seconds of its duration and its memory series ends at the deadline."""
    add_suite(scratch, "mini-soak", "soak", {**SOAK, "max_tokens": 40}, gate={"max": {"errors": 0}})
    scratch.config("fake-soak-slow", FAKE_VLLM_TOKENS=40, FAKE_VLLM_ITL_MS=25)
    assert main(["suite", "mini-soak", "--config", "fake-soak-slow", "--release", "s4"]) == 0
    rec = record(scratch, "s4", "fake-soak-slow", "mini-soak")
    m = rec["metrics"]
    assert rec["verdict"]["status"] == "pass"
    assert m["cut_at_deadline"] == 3 and m["errors"] == 0 and m["cut_by_death"] == 0
    assert 3 <= m["served"] <= 12  # at most 4 s / 1 s for each client
    assert 4.0 <= m["duration_s"] <= 5.0
    assert m["samples"] and max(t for t, _ in m["samples"]) <= 4.0 + 0.2  # the sampler starts a moment before
    assert rec["wall_s"] < 4 + 10  # the text pool's build and the record's write around the 4 s


@pytest.mark.timeout(120)
def test_a_soak_whose_requests_all_outlast_it_is_an_error_not_a_pass(scratch):
    """Answers of 2,000 tokens 5 ms apart (10 s each) in a 4 s soak: every request is cut at the deadline, none
    served and none failed; "zero errors" was never checked, so the verdict is an error naming the sizes."""
    add_suite(scratch, "mini-soak", "soak", {**SOAK, "max_tokens": 2000}, gate={"max": {"errors": 0}})
    scratch.config("fake-soak-slower", FAKE_VLLM_TOKENS=2000, FAKE_VLLM_ITL_MS=5)
    assert main(["suite", "mini-soak", "--config", "fake-soak-slower", "--release", "s5"]) == 2
    rec = record(scratch, "s5", "fake-soak-slower", "mini-soak")
    m, v = rec["metrics"], rec["verdict"]
    assert (m["served"], m["errors"], m["cut_at_deadline"]) == (0, 0, 3) and 4.0 <= m["duration_s"] <= 5.0
    assert v["status"] == "error"
    assert v["cause"] == ("no request finished within the soak's 4 s (3 cut at the deadline): prompts of up to 200 "
                          "tokens with 2000-token answers at 3 clients are too long for the duration on this configuration")


def test_soak_prompts_fit_the_duration_at_the_probes_measured_prefill_rate(tmp_path):
    from validate.config import find_config
    from validate.runners.base import RunContext
    from validate.runners.soak import SoakParams, measured_prefill_tok_s, prompt_cap

    p = SoakParams(clients=8, duration_s=45, max_tokens=32, max_slope_mib_per_min=256)
    # 3,000 tok/s shared by 8 clients, a tenth of 45 s: 1,687 tokens; max_model_len 4,096 alone: 4,056
    assert prompt_cap(p, 4096, 3000.0) == {"tokens": 1687, "max_model_len": 4096, "prefill_tok_s": 3000.0, "by_rate": 1687}
    assert prompt_cap(p, 4096, None)["tokens"] == 4056 and prompt_cap(p, 4096, 1e6)["tokens"] == 4056
    assert prompt_cap(p.model_copy(update={"prompt_tokens_max": 500}), 4096, 3000.0)["tokens"] == 500
    cfg = find_config(REPO, "cpu-smol")
    ctx = RunContext(root=REPO, config=cfg, profile="quick", client=None, data_dir=None, record_dir=tmp_path, release="v1")
    assert measured_prefill_tok_s(ctx) is None  # no probe record yet
    folder = tmp_path / "v1" / "cpu-smol"
    folder.mkdir(parents=True)
    probe = {"suite_kind": "probe", "config_hash": cfg.digest(), "metrics": {"prefill_tok_s": 2500.5}}
    (folder / "probe.json").write_text(json.dumps({**probe, "config_hash": "other"}))
    (folder / "gsm8k.json").write_text("{ not json")
    assert measured_prefill_tok_s(ctx) is None  # another configuration's probe is not this one's rate
    (folder / "probe.json").write_text(json.dumps(probe))
    assert measured_prefill_tok_s(ctx) == 2500.5

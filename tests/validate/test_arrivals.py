"""Open-loop arrivals: the schedule's distribution, the SLO-rate search, goodput, and the arrivals runner against
the synthetic server with a known latency model (the rate it must find is computable)."""
from __future__ import annotations

import asyncio
import math
from pathlib import Path

import numpy as np
import pytest
from scipy import optimize, stats

from tests.synth_server import Script, SynthServer
from validate.arrivals import gaps, schedule
from validate.client import OpenAIClient, RequestResult
from validate.config import SloSpec
from validate.metrics import meets_slo, probe_metrics
from validate.rate_search import ProbeOutcome, search


# ---- the schedule ---------------------------------------------------------------------------------------
def test_poisson_gaps_fit_the_exponential_and_bursty_ones_do_not():
    rate = 4.0
    g = gaps(rate, 1.0, 2000, seed=7)
    ks = stats.kstest(g, "expon", args=(0, 1 / rate))
    assert ks.pvalue > 0.05  # seeded: the same draw every time (p = 0.47)
    assert abs(g.mean() - 1 / rate) < 0.02
    bursty = gaps(rate, 0.25, 2000, seed=7)
    assert stats.kstest(bursty, "expon", args=(0, 1 / rate)).pvalue < 1e-6  # not Poisson
    # gamma with shape B and mean 1 / R (vllm bench serve's --burstiness): its coefficient of variation is 1/sqrt(B)
    assert stats.kstest(bursty, "gamma", args=(0.25, 0, 1 / (rate * 0.25))).pvalue > 0.05
    assert abs(bursty.std() / bursty.mean() - 2.0) < 0.2


def test_arrival_counts_in_windows_are_poisson():
    sch = schedule(10.0, 1.0, min_duration_s=400, min_queries=1, seed=3)
    counts = np.histogram(sch.times_s, bins=np.arange(0, 400.001, 1.0))[0]
    # chi-square goodness of fit of the per-second counts against Poisson(10), tails pooled
    ks = np.arange(4, 17)
    expected = [stats.poisson.cdf(3, 10)] + [stats.poisson.pmf(k, 10) for k in ks] + [stats.poisson.sf(16, 10)]
    observed = [np.sum(counts <= 3)] + [np.sum(counts == k) for k in ks] + [np.sum(counts >= 17)]
    chi = stats.chisquare(observed, np.array(expected) * len(counts))
    assert chi.pvalue > 0.05


def test_schedule_meets_both_minimums_and_is_reproducible():
    a = schedule(2.0, 1.0, min_duration_s=30, min_queries=10, seed=1)
    assert a.span_s >= 30 and len(a.times_s) >= 10 and list(a.times_s) == sorted(a.times_s)
    assert a == schedule(2.0, 1.0, min_duration_s=30, min_queries=10, seed=1)
    assert a.times_s != schedule(2.0, 1.0, min_duration_s=30, min_queries=10, seed=2).times_s
    few = schedule(100.0, 1.0, min_duration_s=0.1, min_queries=50, seed=1)
    assert len(few.times_s) == 50  # the query minimum outlasts the duration
    # the duration's cut: the first arrival at or past the minimum duration is the last one
    assert a.times_s[-2] < 30 <= a.times_s[-1]


@pytest.mark.parametrize("bad", [0, -1.0, float("nan"), float("inf")])
def test_schedule_refuses_a_bad_rate(bad):
    with pytest.raises(ValueError, match="rate_per_s must be a positive finite number"):
        schedule(bad, 1.0, min_duration_s=1, min_queries=1, seed=0)


# ---- the search -----------------------------------------------------------------------------------------
def threshold_probe(limit: float, invalid_above: float | None = None):
    seen = []

    async def probe(rate):
        seen.append(rate)
        valid = invalid_above is None or rate <= invalid_above
        return ProbeOutcome(rate, rate <= limit, valid)
    return probe, seen


def test_search_brackets_then_bisects_to_the_tolerance():
    probe, seen = threshold_probe(3.7)
    res = asyncio.run(search(probe, start=1.0, rel_tolerance=0.1, max_probes=10))
    assert seen[:3] == [1.0, 2.0, 4.0]  # doubling until a probe misses
    assert math.isclose(seen[3], math.sqrt(8)) and math.isclose(seen[4], math.sqrt(math.sqrt(8) * 4))
    assert res.status == "found" and res.narrowed and not res.budget_spent
    assert res.slo_rate_per_s <= 3.7 < res.hi and res.hi / res.slo_rate_per_s <= 1.1
    assert len(res.probes) == len(seen) == 6


def test_search_halves_down_and_says_when_no_rate_meets():
    probe, seen = threshold_probe(0.3)
    res = asyncio.run(search(probe, start=2.0, rel_tolerance=0.2))
    assert seen[:4] == [2.0, 1.0, 0.5, 0.25] and res.status == "found" and res.slo_rate_per_s <= 0.3
    probe, seen = threshold_probe(0.0)
    res = asyncio.run(search(probe, start=1.0, min_rate=0.1, max_probes=20))
    assert res.status == "none meets" and res.slo_rate_per_s is None and seen == [1.0, 0.5, 0.25, 0.125]
    assert not res.budget_spent  # it stopped at min_rate, not for want of probes


def test_search_above_range_and_budget():
    probe, seen = threshold_probe(1e9)
    res = asyncio.run(search(probe, start=1.0, max_rate=8.0))
    assert res.status == "above range" and res.slo_rate_per_s == 8.0 and seen == [1, 2, 4, 8]
    probe, seen = threshold_probe(3.7)
    res = asyncio.run(search(probe, start=1.0, rel_tolerance=0.01, max_probes=4))
    assert res.budget_spent and not res.narrowed and len(seen) == 4 and res.slo_rate_per_s == math.sqrt(8)


def test_an_invalid_probe_bounds_the_search_as_the_clients():
    probe, _ = threshold_probe(100.0, invalid_above=5.0)  # the server would go on; the client cannot send faster
    res = asyncio.run(search(probe, start=1.0, rel_tolerance=0.1, max_probes=12))
    assert res.slo_rate_per_s <= 5.0 and res.client_bound


# ---- goodput --------------------------------------------------------------------------------------------
def req(ttft_ms: float, gap_ms: float, n: int = 5, ok: bool = True) -> RequestResult:
    r = RequestResult(ok=ok, output_tokens=n, prompt_tokens=10, t_sent=1.0)
    r.chunk_times = [ttft_ms / 1e3 + i * gap_ms / 1e3 for i in range(n)]
    r.chunk_tokens = [1] * n
    r.t_done = r.t_sent + r.chunk_times[-1]
    if not ok:
        r.error = "HTTP 500"
    return r


def test_goodput_counts_the_requests_within_both_limits():
    rs = [req(100, 10), req(100, 60), req(900, 10), req(300, 40), req(100, 10, ok=False)]
    assert [meets_slo(r, 500, 50) for r in rs] == [True, False, False, True, False]
    assert meets_slo(rs[1], 500, None) and not meets_slo(rs[2], None, 50) is False
    m = probe_metrics(2.0, rs, [0.001] * 5, 4.0, 500, 50, percentile=90)
    assert (m.requests, m.ok, m.errors, m.good) == (5, 4, 1, 2)
    assert m.goodput_per_s == 0.5 and m.good_share == 0.4 and m.achieved_rate_per_s == 1.25
    assert not m.meets  # a failed request: the probe cannot meet the SLO
    m = probe_metrics(2.0, rs[:4], [0.001] * 4, 4.0, 1000, 100, percentile=99)
    assert m.meets and m.good == 4 and m.ttft_ms_pslo == pytest.approx(np.percentile([100, 100, 900, 300], 99))
    assert not probe_metrics(2.0, rs[:4], [0.0] * 4, 4.0, 1000, 50, percentile=99).meets  # p99 TPOT is 60 ms
    assert probe_metrics(2.0, rs[:4], [0.0] * 4, 4.0, 1000, 50, percentile=50).meets


def test_slo_needs_a_limit():
    with pytest.raises(ValueError, match="needs ttft_ms, tpot_ms or both"):
        SloSpec(percentile=99)


# ---- the runner against a server with a known latency model ----------------------------------------------
def expected_rate(ttft_ms, step_ms, itl_ms, tokens, limit_ms, percentile) -> float:
    """The rate at which the percentile-th TTFT crosses ``limit_ms``: TTFT = ttft + step * n with n the answers in
    flight at arrival, Poisson with mean R * E (M/D/inf, E the fixed service time)."""
    e = (ttft_ms + (tokens - 1) * itl_ms) / 1e3
    m = math.floor((limit_ms - ttft_ms) / step_ms)  # the most answers in flight a TTFT within the limit allows
    mu = optimize.brentq(lambda mu: stats.poisson.cdf(m, mu) - percentile / 100, 1e-6, 50)
    return mu / e


class _Ctx:
    def __init__(self, client, slo):
        from validate.config import ServeConfig

        self.client = client
        self.config = ServeConfig.model_validate({"name": "synth", "model": {"path": "x", "served_name": "synth"},
                                                  "server": {"max_num_seqs": 8, "max_model_len": 4096}, "slo": slo})
        self.data_dir = Path("/nonexistent")
        self.baseline_hint = None
        self.lines = []
        self.progress = lambda *a, **k: None
        self.log = self.lines.append


@pytest.mark.timeout(120)
def test_the_search_finds_the_computable_slo_rate(monkeypatch, tmp_path):
    from validate.runners import arrivals as arr
    from validate.runners.text import TextPool

    async def pool(*a, **k):
        return TextPool(list(range(4000)))

    monkeypatch.setattr(TextPool, "build", pool)
    # TTFT 2, 10, 18, 26 ... ms with 0, 1, 2, 3 ... answers in flight; the limit lies between 2 and 3 of them, and
    # every answer takes E = 52 ms (far above the TTFTs near the limit)
    ttft, step, itl, tokens, limit, q = 2.0, 8.0, 2.5, 21, 22.0, 90.0
    want = expected_rate(ttft, step, itl, tokens, limit, q)  # 21.2 req/s
    p = arr.ArrivalsParams(prompt_tokens=8, output_tokens=tokens, start_rate_per_s=5.0, rel_tolerance=0.15,
                           max_probes=8, probe_min_duration_s=5, probe_min_queries=40, probe_grace_s=10, max_lag_ms=1000)

    async def go():
        async with SynthServer(Script(ttft_ms=ttft, itl_ms=itl, load_step_ms=step)) as srv:
            async with OpenAIClient(srv.url, "synth") as c:
                ctx = _Ctx(c, {"ttft_ms": limit, "percentile": q})
                return await arr.run(ctx, p), srv

    out, srv = asyncio.run(go())
    m = out.metrics
    assert m["search"]["status"] == "found" and m["invalid_probes"] == 0
    # the final bracket holds the computable rate (10 % for the probes' sampling of the percentile)
    lo, hi = m["search"]["lo"], m["search"]["hi"]
    assert m["slo_rate_per_s"] == lo and lo <= 1.1 * want and hi >= want / 1.1 and hi / lo <= 1.15, m["probes"]
    assert [pr["rate_per_s"] for pr in m["probes"]][:2] == [5.0, 10.0]
    # the per-request rows: every request, with its schedule, send, tokens and status; the good count agrees
    import json

    blob, ext = out.attachments["requests"]
    rows = [json.loads(x) for x in blob.decode().splitlines()]
    assert ext == "jsonl" and len(rows) == m["requests_logged"] == sum(pr["requests"] for pr in m["probes"])
    assert len(rows) == len(srv.records)  # what the server received
    for pr in m["probes"]:
        mine = [r for r in rows if r["probe"] == pr["index"]]
        assert sum(r["good"] for r in mine) == pr["good"] and all(r["status"] == "ok" for r in mine)
        assert all(len(r["chunk_s"]) == tokens and r["sent_s"] >= r["scheduled_s"] for r in mine)
        assert pr["goodput_per_s"] == pytest.approx(pr["good"] / pr["duration_s"], rel=1e-3)
    # the record's outcome stands on its probes: the search replayed over their outcomes gives it back, and
    # the edits that would move the rate a baseline is judged at (or what the notes show) do not stand
    import copy
    import hashlib
    from types import SimpleNamespace

    (tmp_path / "requests.jsonl").write_bytes(blob)
    rec = SimpleNamespace(metrics=m, params=p.model_dump(), config="synth", config_snapshot={"slo": {"ttft_ms": limit, "percentile": q}},
                          attachments={"requests": {"file": "requests.jsonl", "sha256": hashlib.sha256(blob).hexdigest()}})
    assert arr.audit(rec, tmp_path) == []

    def forged(edit) -> str:
        r = SimpleNamespace(**{**vars(rec), "metrics": copy.deepcopy(m)})
        edit(r.metrics)
        return " ".join(arr.audit(r, tmp_path))

    lower = next(pr["rate_per_s"] for pr in m["probes"] if pr["meets"] and pr["rate_per_s"] < lo)
    assert "its SLO rate" in forged(lambda x: x.update(slo_rate_per_s=lower))  # a lower met probe's rate
    assert "its SLO rate None is not what its probes give" in forged(lambda x: x.update(slo_rate_per_s=None))
    assert "its search" in forged(lambda x: x["search"].update(hi=x["search"]["hi"] * 2))
    assert "not indexed 0 to" in forged(lambda x: x["probes"].reverse())
    assert "goodput at the SLO rate" in forged(lambda x: x.update(goodput_at_slo_rate_per_s=99.0))
    assert "burstiness" in forged(lambda x: x.update(burstiness=0.25))
    assert "its SLO" in forged(lambda x: x["slo"].update(ttft_ms=limit * 10))
    assert "is not the search's next probe" in forged(lambda x: x["probes"][1].update(meets=not x["probes"][1]["meets"]))
    assert "its lag_ms_p99" in forged(lambda x: x["probes"][0].update(lag_ms_p99=0.0))
    assert "its good_share" in forged(lambda x: x["probes"][0].update(good_share=0.5))


# ---- through the engine: the record, its attachment, the SLO share gate ----------------------------------
def arrivals_checkout(scratch, name: str, slo: dict, **env) -> str:
    import yaml

    body = {"name": "arr", "kind": "arrivals",
            "params": {"prompt_tokens": 8, "output_tokens": 6, "search": False, "rates_per_s": [4.0],
                       "probe_min_duration_s": 2, "probe_min_queries": 8, "reference_queries": 12,
                       "max_lag_ms": 200}}
    (scratch.root / "suites" / "arr.yaml").write_text(yaml.safe_dump(body))
    tag = scratch.config(name, FAKE_VLLM_TOKENS=6, **env)
    path = scratch.root / "serve" / f"{name}.yaml"
    cfg = yaml.safe_load(path.read_text())
    cfg["slo"] = slo
    path.write_text(yaml.safe_dump(cfg))
    (scratch.root / "suites" / "release.yaml").write_text(yaml.safe_dump({"configs": [name], "suites": [{"suite": "arr"}]}))
    return tag


def read(scratch, release, cfg="fake-arr"):
    import json

    return json.loads((scratch.root / "reports" / release / cfg / "arr.json").read_text())


@pytest.mark.timeout(120)
def test_the_record_keeps_every_request_and_a_forged_one_is_not_checked(scratch):
    import json

    from validate.cli import main
    from validate.verdict import assess_release

    arrivals_checkout(scratch, "fake-arr", {"ttft_ms": 2000, "tpot_ms": 50, "percentile": 99}, FAKE_VLLM_ITL_MS=2)
    assert main(["suite", "arr", "--config", "fake-arr", "--release", "v1.0.0"]) == 0
    rec = read(scratch, "v1.0.0")
    m, att = rec["metrics"], rec["attachments"]["requests"]
    assert m["slo_rate_per_s"] == 4.0 and m["search"] is None and m["reference"] is None
    assert m["slo"] == {"ttft_ms": 2000, "tpot_ms": 50, "percentile": 99, "from": "serve/fake-arr.yaml"}
    folder = scratch.root / "reports" / "v1.0.0" / "fake-arr"
    f = folder / att["file"]
    rows = [json.loads(x) for x in f.read_text().splitlines()]
    assert att["lines"] == len(rows) == m["probes"][0]["requests"] >= 8 and all(r["good"] for r in rows)
    assert rec["share_gate"] == {"slo_share_drop_pts": 5.0, "acceptance_drop_pts": 5.0,
                                 "divergence_rise_pts": 5.0, "alpha": 0.05}
    v = assess_release(scratch.root / "reports", "v1.0.0", root=scratch.root)
    assert [c.outcome for c in v.checks if c.area == "suite"] == ["pass"], [c.message for c in v.checks]
    # the params the audit recounts by, loosened by hand (the lag a probe may have): the record does not stand
    recf = folder / "arr.json"
    kept = recf.read_text()
    d = json.loads(kept)
    d["params"]["max_lag_ms"] = 1000.0
    recf.write_text(json.dumps(d))
    chk = next(c for c in assess_release(scratch.root / "reports", "v1.0.0", root=scratch.root).checks
               if c.area == "suite")
    # a record of this tree: its params are its suite file's (said first), and the audit's hash check says why too
    assert chk.status == "gate-mismatch" and "max_lag_ms: 1000.0 vs" in chk.message
    rec = next(c.record for c in assess_release(scratch.root / "reports", "v1.0.0").checks if c.area == "suite")
    assert "its params do not match the params_hash" in rec.audit_failed
    d = json.loads(kept)  # the configuration's SLO loosened where the record keeps it, and the record's with it
    d["config_snapshot"]["slo"]["tpot_ms"] = d["metrics"]["slo"]["tpot_ms"] = 1000.0
    recf.write_text(json.dumps(d))
    chk = next(c for c in assess_release(scratch.root / "reports", "v1.0.0", root=scratch.root).checks
               if c.area == "suite")
    assert chk.status == "audit-failed" and "its config_snapshot does not match the config_hash" in chk.message
    recf.write_text(kept)
    # a request turned bad in the attachment: the record no longer stands on it
    rows[0]["good"] = False
    f.write_text("".join(json.dumps(r) + "\n" for r in rows))
    v = assess_release(scratch.root / "reports", "v1.0.0", root=scratch.root)
    chk = next(c for c in v.checks if c.area == "suite")
    assert chk.outcome == "not-checked" and chk.status == "audit-failed" and "edited" in chk.message
    f.unlink()
    chk = next(c for c in assess_release(scratch.root / "reports", "v1.0.0", root=scratch.root).checks
               if c.area == "suite")
    assert chk.status == "audit-failed" and "cannot be read" in chk.message


@pytest.mark.timeout(180)
def test_the_slo_share_at_the_baselines_rate_gates_the_release(scratch, monkeypatch):
    from validate.cli import main

    # the server's speed comes from outside its configuration, as a slower plugin's would: a configuration whose
    # env differs is another configuration, never compared (validate.pairing.apart)
    monkeypatch.setenv("FAKE_VLLM_ITL_MS", "2")
    arrivals_checkout(scratch, "fake-arr", {"ttft_ms": 2000, "tpot_ms": 50, "percentile": 99})
    assert main(["suite", "arr", "--config", "fake-arr", "--release", "v1.0.0"]) == 0
    # the candidate's release probes the baseline's SLO rate again, with the same schedule and prompts
    assert main(["release", "v1.1.0", "--baseline", "v1.0.0"]) == 0
    m = read(scratch, "v1.1.0")["metrics"]
    ref = m["probes"][m["reference"]["probe"]]
    assert m["reference"] == {"release": "v1.0.0", "rate_per_s": 4.0, "probe": 1} and ref["reference"] is True
    assert ref["requests"] >= 12 and ref["seed"] == read(scratch, "v1.0.0")["metrics"]["probes"][0]["seed"]
    assert main(["gate", "v1.1.0", "--against", "v1.0.0", "--perf"]) == 0
    # the candidate cannot choose the probe it is judged on: the reference probe is the one after its rates
    from validate.record import read_record, record_path
    from validate.runners.arrivals import audit

    path = record_path(scratch.root / "reports", "v1.1.0", "fake-arr", "arr")
    assert audit(read_record(path), path.parent) == []
    r = read_record(path)
    r.metrics["reference"], r.metrics["probes"][1]["reference"] = None, False  # the reference probe disowned
    assert "its probes after the search are not one reference probe" in audit(r, path.parent)
    r = read_record(path)
    r.metrics["reference"]["probe"] = 0  # the fixed-rate probe named instead
    assert audit(r, path.parent) == ["its reference {'release': 'v1.0.0', 'rate_per_s': 4.0, 'probe': 0} does not "
                                     "name its reference probe 1"]
    # the candidate's requests edited (a line dropped): the gate on its own does not judge it, never a pass
    folder = scratch.root / "reports" / "v1.1.0" / "fake-arr"
    att = folder / read(scratch, "v1.1.0")["attachments"]["requests"]["file"]
    kept = att.read_bytes()
    att.write_bytes(b"".join(kept.splitlines(keepends=True)[1:]))
    assert main(["gate", "v1.1.0", "--against", "v1.0.0", "--perf"]) == 2
    att.write_bytes(kept)
    # a slower decode (TPOT 80 ms against the 50 ms limit): no request meets the SLO at the baseline's rate
    monkeypatch.setenv("FAKE_VLLM_ITL_MS", "80")
    arrivals_checkout(scratch, "fake-arr", {"ttft_ms": 2000, "tpot_ms": 50, "percentile": 99})
    assert main(["release", "v1.2.0", "--baseline", "v1.0.0"]) == 1
    notes = (scratch.root / "reports" / "v1.2.0" / "RELEASE.md").read_text()
    assert "slo arr at 4 req/s" in notes and "100.0% -> 0.0% of requests met the SLO at 4 req/s" in notes
    # the gate on its own judges the same share
    assert main(["gate", "v1.2.0", "--against", "v1.0.0", "--perf"]) == 1


@pytest.mark.timeout(120)
def test_a_forged_slo_rate_or_meets_in_the_record_does_not_stand(scratch):
    import json

    from validate.record import record_path
    from validate.runners.arrivals import audit
    from validate.cli import main
    from validate.record import read_record

    arrivals_checkout(scratch, "fake-arr", {"ttft_ms": 2000, "tpot_ms": 50, "percentile": 99}, FAKE_VLLM_ITL_MS=2)
    assert main(["suite", "arr", "--config", "fake-arr", "--release", "v1.0.0"]) == 0
    path = record_path(scratch.root / "reports", "v1.0.0", "fake-arr", "arr")
    rec = read_record(path)
    assert audit(rec, path.parent) == []
    rec.metrics["slo_rate_per_s"] = 8.0  # a baseline's rate raised by hand, the attachment untouched
    assert audit(rec, path.parent) == ["its SLO rate 8.0 req/s is not the rate of a valid probe that met the SLO",
                                       "its SLO rate 8.0 is not what its probes give (4.0)"]
    rec = read_record(path)
    rec.metrics["probes"][0]["meets"] = False
    assert "the record says meets = False, its rows say True" in audit(rec, path.parent)[0]
    rec = read_record(path)
    rec.attachments["requests"]["file"] = "../../elsewhere.jsonl"
    assert "not a file beside the record" in audit(rec, path.parent)[0]
    # rows rewritten with a consistent hash but a TTFT past the limit still marked good
    rec = read_record(path)
    f = path.parent / rec.attachments["requests"]["file"]
    blob_ok = f.read_bytes()
    rows = [json.loads(x) for x in f.read_text().splitlines()]
    rows[0]["ttft_ms"] = 9000.0
    blob = "".join(json.dumps(r) + "\n" for r in rows).encode()
    f.write_bytes(blob)
    import hashlib

    rec.attachments["requests"]["sha256"] = hashlib.sha256(blob).hexdigest()
    why = audit(rec, path.parent)
    assert why[0].startswith("line 1 of") and "good is True, but its status, TTFT and TPOT say False" in why[0]
    assert "TTFT 9000.0 ms, but its send and first-token times give" in why[1]

    def rewritten(edit) -> list[str]:
        """The audit of the record with its rows edited by ``edit`` and the hash made to match."""
        r = read_record(path)
        rows = [json.loads(x) for x in orig.splitlines()]
        edit(rows)
        blob = "".join(json.dumps(x) + "\n" for x in rows).encode()
        f.write_bytes(blob)
        r.attachments["requests"]["sha256"] = hashlib.sha256(blob).hexdigest()
        return audit(r, path.parent)

    orig = blob_ok.decode()

    def late(rows):  # every time of the first request a second later, its latencies unchanged: a client that lagged
        r = rows[0]
        r["sent_s"], r["first_token_s"] = r["sent_s"] + 1.0, r["first_token_s"] + 1.0
        r["end_s"], r["chunk_s"] = r["end_s"] + 1.0, [t + 1.0 for t in r["chunk_s"]]

    assert any("it is marked valid = True, but its rows say False (p99 send lag" in w for w in rewritten(late))

    r = read_record(path)  # rows untouched; the probe said invalid (the gate would judge another in its place)
    f.write_bytes(blob_ok)
    r.metrics["probes"][0]["valid"] = False
    assert any("it is marked valid = False, but its rows say True" in w for w in audit(r, path.parent))

    def backwards(rows):  # a chunk before the first token: the TPOT would be undefined and the row judged on TTFT
        rows[0]["chunk_s"] = rows[0]["chunk_s"][::-1]
    assert "its times do not run forward" in " ".join(rewritten(backwards))

    def more_tokens(rows):  # output tokens inflated past what was asked for: a smaller TPOT
        rows[0]["output_tokens"] = 7
    assert "its 7 output tokens are not a count of at most the 6 each request asks for" in " ".join(rewritten(more_tokens))

    def moved(rows):  # an arrival moved in the schedule
        rows[2]["scheduled_s"] += 0.5
    assert rewritten(moved) == ["probe 0: its rows' scheduled times are not the schedule its seed gives"]

    def orphan(rows):  # a request of a probe the record does not list
        rows.append({**rows[0], "probe": 7})
    assert "rows of probes [7] that the record does not list" in " ".join(rewritten(orphan))

    f.write_bytes(blob_ok)
    for key, says in (("goodput_per_s", "its goodput_per_s"), ("schedule_span_s", "its schedule span"),
                      ("duration_s", "its duration")):
        r = read_record(path)  # the figures the notes show, raised by hand over untouched rows
        pr = r.metrics["probes"][0]
        pr[key] = pr[key] * 0.5 if key == "duration_s" else pr[key] * 2
        why = " ".join(audit(r, path.parent))
        assert f"probe 0: {says}" in why, (key, why)

    def cut_short(rows):  # the last answer ended earlier than the record's duration says
        rows[-1]["end_s"] -= 0.5
        rows[-1]["chunk_s"][-1] -= 0.5
    assert "its duration" in " ".join(rewritten(cut_short))

    def nan_end(rows):  # JSON's NaN: every comparison with it is false, so no check could fail on it
        rows[0]["end_s"] = float("nan")
    assert "NaN is not a number the runner writes" in " ".join(rewritten(nan_end))

    def all_in_the_first_chunk(rows):  # the first chunk claims every token: no TPOT, a row judged on TTFT alone
        rows[0]["chunk_tokens"][0] = rows[0]["output_tokens"]
        rows[0]["tpot_ms"] = None
    assert "its chunks carry 6 then 6 tokens, its usage says 6" in " ".join(rewritten(all_in_the_first_chunk))

    def text_good(rows):
        rows[0]["good"] = "no"
    assert "its good 'no' is not a bool" in " ".join(rewritten(text_good))

    r = read_record(path)
    f.write_bytes(blob_ok)
    r.metrics["probes"].append(dict(r.metrics["probes"][0]))  # a probe listed twice
    assert "its probes' indices [0, 0] repeat" in audit(r, path.parent)


@pytest.mark.timeout(120)
def test_a_server_dying_mid_probe_is_an_error_not_a_rate(scratch):
    from validate.cli import main

    arrivals_checkout(scratch, "fake-arr", {"ttft_ms": 2000, "tpot_ms": 50, "percentile": 99}, FAKE_VLLM_ITL_MS=2,
                      FAKE_VLLM_MODE="die-after", FAKE_VLLM_DIE_AFTER=5)
    assert main(["suite", "arr", "--config", "fake-arr", "--release", "v1.0.0"]) == 2
    rec = read(scratch, "v1.0.0")
    assert rec["verdict"]["status"] == "error" and rec["verdict"]["cause"].startswith("server died during the suite")
    assert rec["metrics"]["probes"][0]["errors"] > 0  # what was measured before the death is kept


def test_the_notes_sort_probes_around_edited_rates():
    from validate.render import as_list, by_number

    probes = [{"index": 0, "rate_per_s": 2.0}, {"index": 1, "rate_per_s": "fast"}, "not a probe",
              {"index": 2, "rate_per_s": 0.5}, {"index": 3, "rate_per_s": float("nan")}, {"index": 4, "rate_per_s": True}]
    assert [p["index"] for p in by_number(probes, "rate_per_s")] == [2, 0, 1, 3, 4]
    assert by_number("probes", "rate_per_s") == [] and as_list(3) == [] and as_list([0.9, 0.8]) == [0.9, 0.8]


def test_the_quick_plan_fits_its_budget_with_the_reference_probe():
    """The quick profile's arrivals, read from the suite file: one probe at 0.5 req/s and, against a quick
    baseline (whose SLO rate is that probe's), a reference probe at the same rate; both seeded schedules hold 4
    arrivals, the last at 12.75 s, so the plan's arrivals span 25.5 s of the 35 s budget. 6 requests spanned
    19.5 s a probe: 39 s with the reference probe."""
    from tests.conftest import REPO
    from validate.runners.arrivals import probe_seed
    from validate.suite import load_suite

    s = load_suite(REPO / "suites" / "arrivals.yaml", "quick")
    p = s.params
    plan = [(rate, p.probe_min_queries) for rate in p.rates_per_s]
    plan.append((p.rates_per_s[-1], max(p.reference_queries, p.probe_min_queries)))  # the reference probe
    spans = [schedule(r, p.burstiness, min_duration_s=p.probe_min_duration_s, min_queries=q,
                      seed=probe_seed(p.seed, r)) for r, q in plan]
    assert [len(x.times_s) for x in spans] == [4, 4] and [round(x.span_s, 2) for x in spans] == [12.75, 12.75]
    assert sum(x.span_s for x in spans) < s.budget_s == 35
    before = schedule(0.5, 1.0, min_duration_s=10, min_queries=6, seed=probe_seed(0, 0.5))
    assert round(2 * before.span_s, 1) == 39.0 > s.budget_s


@pytest.mark.timeout(120)
def test_the_quick_profile_runs_its_probe_and_the_reference_probe_on_the_fake_server(monkeypatch):
    """The quick params against the synthetic server with a baseline's SLO rate of 0.5 req/s: two probes of 4
    requests each, the second the reference probe on the same seeded schedule, and nothing else."""
    from tests.conftest import REPO
    from validate.runners import arrivals as arr
    from validate.runners.text import TextPool
    from validate.suite import load_suite

    async def pool(*a, **k):
        return TextPool(list(range(4000)))

    monkeypatch.setattr(TextPool, "build", pool)
    p = load_suite(REPO / "suites" / "arrivals.yaml", "quick").params

    async def go():
        async with SynthServer(Script(ttft_ms=2.0, itl_ms=1.0)) as srv:
            async with OpenAIClient(srv.url, "synth") as c:
                ctx = _Ctx(c, {"ttft_ms": 2000, "tpot_ms": 50, "percentile": 99})
                ctx.baseline_hint = {"release": "v1", "value": 0.5}
                return await arr.run(ctx, p), len(srv.records)

    out, received = asyncio.run(go())
    m = out.metrics
    assert not out.errors and received == 8 and m["requests_logged"] == 8
    assert [(pr["rate_per_s"], pr["requests"], pr.get("reference", False)) for pr in m["probes"]] == [
        (0.5, 4, False), (0.5, 4, True)]
    assert m["reference"] == {"release": "v1", "rate_per_s": 0.5, "probe": 1}
    assert [pr["schedule_span_s"] for pr in m["probes"]] == [12.747, 12.747] and m["slo_rate_per_s"] == 0.5

"""Release-note pictures (validate/plots/) from records alone, and the latency samples BetterBench keeps.

The records are hand-made with the shapes and magnitudes of the seeds' r9700 configurations (fn-tp4: decode step
~14 ms with multi-token chunks, combined decode ~188 tok/s; a 25-minute soak on four 32 GiB GPUs); the
latency samples come from the synthetic server (tests/synth_server.py) through the real runner.
"""
from __future__ import annotations

import asyncio
import math
import random
from pathlib import Path

import numpy as np
import pytest
from matplotlib.image import imread

from tests.conftest import REPO, tiny_gsm8k
from validate.record import Dataset, Record, ServerInfo, Tree, Verdict, record_path, write_record
from validate.metrics import band
from validate.telemetry import slope_mib_per_min
from validate import plots

LEVELS = (1, 2, 4, 8, 16)
# per-stream decode (1 / TPOT p50) relative to a lone stream, and TTFT p50 (ms), per concurrency level
PER_STREAM = {1: 1.0, 2: 0.91, 4: 0.80, 8: 0.67, 16: 0.49}
TTFT_MS = {1: 45.0, 2: 52.0, 4: 68.0, 8: 101.0, 16: 163.0}


def base_record(release: str, cfg: str, suite: str, metrics: dict, status: str = "pass", params=None,
                dataset: Dataset | None = None, max_num_seqs: int = 16) -> Record:
    return Record(
        release=release, config=cfg, config_hash=f"cfg-{cfg}", suite=suite, suite_kind=suite, params=params or {},
        params_hash="p", suite_hash="s", profile="full", started_at="2026-10-13T00:00:00+00:00",
        ended_at="2026-10-13T01:00:00+00:00", wall_s=3600.0,
        tree=Tree(commit="a" * 40, dirty=False, source_hash=f"src-{release}", engine_hash="e"),
        server=ServerInfo(launched=True, provenance_ok=True, kv_cache_tokens=513_088),
        hardware={"gpus": 4, "kind": "r9700"}, config_snapshot={"server": {"max_num_seqs": max_num_seqs}},
        verdict=Verdict(status=status, cause=None if status == "pass" else "server died during the suite"),
        metrics=metrics, dataset=dataset)


def bb_metrics(rate: float = 225.0, step_ms: float = 14.3, passes: int = 20, levels=LEVELS, max_num_seqs: int = 16,
               latency: bool = True, seed: int = 0) -> dict:
    """BetterBench metrics shaped like the runner's: per pass, summary bands, latency samples capped at 2,000."""
    rng = random.Random(seed)
    rows = []
    for n in range(passes):
        row: dict = {"pass": n, "decode_tok_s": rate * rng.gauss(1, 0.01), "decode_step_ms": step_ms * rng.gauss(1, 0.01)}
        for c in levels:
            tpot = 1e3 / (rate * PER_STREAM[c]) * rng.gauss(1, 0.015)
            ttft = TTFT_MS[c] * rng.gauss(1, 0.04)
            row[f"c{c}_tok_s"] = min(c, max_num_seqs) * 128 / ((ttft + 127 * tpot) / 1e3) * rng.gauss(1, 0.01)
            row[f"c{c}_ttft_ms_p50"], row[f"c{c}_ttft_ms_p99"] = ttft, ttft * 2.8
            row[f"c{c}_tpot_ms_p50"] = tpot
        rates = [1e3 / row[f"c{c}_tpot_ms_p50"] for c in levels if c <= max_num_seqs]
        row["combined_decode_tok_s"] = math.exp(sum(map(math.log, rates)) / len(rates))
        rows.append({k: round(v, 3) if isinstance(v, float) else v for k, v in row.items()})
    keys = [k for k in rows[0] if k != "pass"]
    m = {"passes": passes, "prefill_depths": [8192], "concurrency": list(levels),
         "summary": {k: band([r[k] for r in rows]) for k in keys}, "per_pass": rows}
    m.update({k: m["summary"][k]["median"] for k in ("combined_decode_tok_s", "decode_tok_s", "decode_step_ms")})
    if latency:
        m["latency_samples"] = {}
        for c in levels:
            tpot = 1e3 / (rate * PER_STREAM[c])
            n_req = passes * c * 2
            ttft = [TTFT_MS[c] * math.exp(rng.gauss(0, 0.25)) * (1 + (rng.random() < 0.05) * rng.uniform(1, 4))
                    for _ in range(n_req)]
            itl = []
            for _ in range(2000):  # multi-token chunks: a step's gap over the 1-4 tokens it carried
                k = rng.choice((1, 2, 3, 4, 4, 4))
                gap = step_ms * (1 + 0.12 * (c - 1) ** 0.8) * math.exp(rng.gauss(0, 0.08))
                if rng.random() < 0.02:
                    gap *= rng.uniform(3, 9)  # another stream's prefill in the batch
                itl.append(gap / k)
            m["latency_samples"][f"c{c}"] = {"ttft_ms": [round(x, 2) for x in ttft], "itl_ms": [round(x, 2) for x in itl],
                                             "ttft_count": n_req, "itl_count": n_req * 39}
    return m


def soak_metrics(minutes: float = 25, gpus: int = 4, gpu_leak: float = 0.0, host_leak: float = 0.0,
                 died_at_s: float | None = None, bound: float = 32.0, seed: int = 1) -> tuple[dict, dict]:
    """(metrics, params) of a soak: 1 s samples of GPU memory (warm-up, then a plateau) and host RSS, the slope
    fitted as the soak fits it (last half of the samples within the server's life)."""
    rng = random.Random(seed)
    end = minutes * 60 if died_at_s is None else died_at_s + 8
    samples = []
    for t in range(0, int(end) + 1):
        row = {}
        dead = died_at_s is not None and t > died_at_s
        for g in range(gpus):
            v = 30_010 + 40 * g + 1290 * (1 - math.exp(-t / 90)) + gpu_leak * t / 60 + rng.gauss(0, 1.5)
            row[f"gpu{g}_mib"] = round(v if not dead else v * max(0.05, 1 - 0.2 * (t - died_at_s)), 1)
        h = 9_800 + 420 * (1 - math.exp(-t / 60)) + host_leak * t / 60 + rng.gauss(0, 4)
        row["host_rss_mib"] = round(h if not dead else h * max(0.02, 1 - 0.15 * (t - died_at_s)), 1)
        samples.append([float(t), row])
    life = [s for s in samples if died_at_s is None or s[0] <= died_at_s]
    totals = {**{f"gpu{g}_mib": 32_624.0 for g in range(gpus)}, "host_rss_mib": 128_540.0}
    memory = {}
    for name in samples[0][1]:
        vals = [row[name] for _, row in life]
        slope = slope_mib_per_min(life, name, 0.5)
        memory[name] = {"peak": max(vals), "first": vals[0], "last": vals[-1], "slope_mib_per_min": round(slope, 2),
                        "total": totals[name], "flat": slope <= bound, "below_total": max(vals) < totals[name]}
    m = {"clients": 16, "duration_s": float(end), "served": 690, "errors": 0, "prompt_tok_s": 6666.0,
         "output_tok_s": 120.0, "memory": memory, "memory_backends": ["process-tree", "amd-smi"],
         "max_slope_mib_per_min": bound, "samples": samples,
         "server_died_at_s": died_at_s, "cut_by_death": 3 if died_at_s else 0, "memory_samples_in_life": len(life)}
    return m, {"slope_skip_fraction": 0.5, "max_slope_mib_per_min": bound}


def gsm8k_record(release: str, cfg: str, right: int, n: int = 1319) -> Record:
    ds = Dataset(name="gsm8k-test", sha256="g" * 64, n_total=1319, n_used=n, subset=n < 1319, seed=1234 if n < 1319 else None)
    return base_record(release, cfg, "gsm8k", {"n": n, "correct": right, "accuracy": right / n}, dataset=ds)


def write(reports: Path, rec: Record) -> None:
    write_record(record_path(reports, rec.release, rec.config, rec.suite), rec)


def decoded(path: Path, size=plots.SIZE_PX) -> np.ndarray:
    """The PNG as an RGBA array, checked for size (pixels) and for not being blank."""
    img = imread(path)
    assert img.shape[:2] == (size[1], size[0]), img.shape
    colors = np.unique((img[..., :3] * 255).astype(np.uint8).reshape(-1, 3), axis=0)
    assert len(colors) > 50, f"{path.name}: {len(colors)} distinct colours"
    return img


def seed_reports(reports: Path) -> None:
    """v0.3.2 and v0.3.3 of fn-tp4 (BetterBench, soak, GSM8K) and 27b-tp2 (probe, a soak whose server dies)."""
    for release, rate, step, seed in (("v0.3.2", 218.0, 15.0, 2), ("v0.3.3", 225.0, 14.3, 3)):
        write(reports, base_record(release, "fn-tp4", "betterbench", bb_metrics(rate, step, seed=seed)))
        m, params = soak_metrics(seed=seed)
        write(reports, base_record(release, "fn-tp4", "soak", m, params=params))
        write(reports, gsm8k_record(release, "fn-tp4", 1263 if release == "v0.3.3" else 1259))
        write(reports, base_record(release, "27b-tp2", "probe", {"decode_step_ms": 4.7, "decode_tok_s": 212.8}))
    m, params = soak_metrics(minutes=25, gpus=2, host_leak=60.0, died_at_s=1130.0)
    write(reports, base_record("v0.3.3", "27b-tp2", "soak", m, status="error", params=params))


@pytest.fixture(scope="module")
def rendered(tmp_path_factory):
    reports = tmp_path_factory.mktemp("reports")
    seed_reports(reports)
    return reports, plots.render_figures(reports, "v0.3.3", "v0.3.2")


@pytest.mark.timeout(120)
def test_every_figure_is_written_and_listed(rendered):
    reports, files = rendered
    assert [(f.path, f.config, f.kind) for f in files] == [
        ("figures/27b-tp2/soak-memory.png", "27b-tp2", "memory"),
        ("figures/fn-tp4/betterbench-concurrency.png", "fn-tp4", "concurrency"),
        ("figures/fn-tp4/betterbench-latency.png", "fn-tp4", "latency"),
        ("figures/fn-tp4/soak-memory.png", "fn-tp4", "memory"),
        ("figures/history.png", None, "history"),
    ]
    fig_dir = reports / "v0.3.3" / "figures"
    assert sorted(str(p.relative_to(fig_dir.parent)) for p in fig_dir.rglob("*.png")) == sorted(f.path for f in files)
    for f in files:
        decoded(reports / "v0.3.3" / f.path, plots.HISTORY_SIZE_PX if f.kind == "history" else plots.SIZE_PX)
        assert (f.config or "Release history") in f.title


@pytest.mark.timeout(120)
def test_titles_name_configuration_releases_and_unit(rendered):
    _, files = rendered
    by = {f.path: f.title for f in files}
    assert by["figures/fn-tp4/betterbench-concurrency.png"] == \
        "fn-tp4: BetterBench throughput against concurrency, v0.3.2 vs v0.3.3 (tok/s)"
    assert by["figures/fn-tp4/betterbench-latency.png"] == "fn-tp4: BetterBench TTFT and ITL distributions, v0.3.2 vs v0.3.3 (ms)"
    assert by["figures/fn-tp4/soak-memory.png"] == "fn-tp4: soak memory over time, v0.3.3, 16 clients, 25.0 min (MiB)"
    assert by["figures/history.png"] == "Release history up to v0.3.3: decode step, combined decode, GSM8K accuracy"
    # the soak whose server died is an error record: drawn, and its title says so
    assert by["figures/27b-tp2/soak-memory.png"].endswith("(MiB) [v0.3.3 verdict: error]")


@pytest.mark.timeout(120)
def test_concurrency_bands_come_from_the_records():
    m = bb_metrics(seed=5)
    agg, per = plots.concurrency_bands(base_record("v0.3.3", "fn-tp4", "betterbench", m), "v0.3.3")
    assert agg.x == per.x == list(LEVELS)
    assert agg.median == [m["summary"][f"c{c}_tok_s"]["median"] for c in LEVELS]
    assert agg.lo == [m["summary"][f"c{c}_tok_s"]["min"] for c in LEVELS]
    rates = [1e3 / row["c16_tpot_ms_p50"] for row in m["per_pass"]]
    assert per.lo[-1] == pytest.approx(min(rates)) and per.hi[-1] == pytest.approx(max(rates))
    assert per.median[-1] == pytest.approx(float(np.median(rates)))
    # without passes (a hand-made or trimmed record) the summary's TPOT band is inverted
    m.pop("per_pass")
    _, per2 = plots.concurrency_bands(base_record("v0.3.3", "fn-tp4", "betterbench", m), "v0.3.3")
    s = m["summary"]["c1_tpot_ms_p50"]
    assert per2.median[0] == pytest.approx(1e3 / s["median"]) and per2.lo[0] == pytest.approx(1e3 / s["max"])


@pytest.mark.timeout(120)
def test_memory_series_follow_the_soaks_fit_and_death():
    m, params = soak_metrics(minutes=25, gpus=2, host_leak=60.0, died_at_s=1130.0)
    series = {s.name: s for s in plots.memory_series(base_record("v0.3.3", "27b-tp2", "soak", m, params=params))}
    host = series["host_rss_mib"]
    assert len(host.t_s) == len(m["samples"]) and host.in_life == m["memory_samples_in_life"] == 1131
    assert host.fit_from == 565 and host.slope_mib_per_min == m["memory"]["host_rss_mib"]["slope_mib_per_min"]
    assert not host.flat and host.total_mib == 128_540.0
    # the slope over the fitted part, as the soak computes it, is what the record holds
    pts = [(t, {"x": y}) for t, y in zip(host.t_s[host.fit_from:host.in_life], host.mib[host.fit_from:host.in_life])]
    assert slope_mib_per_min(pts, "x", 0.0) == pytest.approx(host.slope_mib_per_min, abs=0.01)


@pytest.mark.timeout(120)
def test_a_missing_suite_gives_no_file(tmp_path):
    # only GSM8K: no BetterBench, no soak, and one release (no history)
    write(tmp_path, gsm8k_record("v0.3.3", "fn-tp4", 1263))
    assert plots.render_figures(tmp_path, "v0.3.3", None) == []
    assert not (tmp_path / "v0.3.3" / "figures").exists() or not list((tmp_path / "v0.3.3" / "figures").iterdir())
    # a BetterBench record without latency samples (written before they were kept) draws its curve only;
    # a soak that ran on another tree is not drawn; a soak without samples has nothing to draw
    write(tmp_path, base_record("v0.3.3", "fn-tp4", "betterbench", bb_metrics(latency=False)))
    m, params = soak_metrics(minutes=2)
    write(tmp_path, base_record("v0.3.3", "fn-tp4", "soak", m, status="wrong-tree", params=params))
    write(tmp_path, base_record("v0.3.3", "fn-tp2", "soak", {**m, "samples": [], "memory": {}}, params=params))
    files = plots.render_figures(tmp_path, "v0.3.3", None)
    assert [f.path for f in files] == ["figures/fn-tp4/betterbench-concurrency.png"]
    decoded(tmp_path / "v0.3.3" / files[0].path)


@pytest.mark.timeout(120)
def test_a_figure_no_longer_drawn_is_removed(tmp_path):
    m, params = soak_metrics(minutes=2)  # two minutes of warm-up grow past the bound: the runner says fail
    write(tmp_path, base_record("v0.3.3", "fn-tp4", "soak", m, status="fail", params=params))
    (fig_dir := tmp_path / "v0.3.3" / "figures").mkdir(parents=True)
    (fig_dir / "diagram.png").write_bytes(b"not ours")
    assert [f.kind for f in plots.render_figures(tmp_path, "v0.3.3", None)] == ["memory"]
    write(tmp_path, base_record("v0.3.3", "fn-tp4", "soak", m, status="plugin-inactive", params=params))
    assert plots.render_figures(tmp_path, "v0.3.3", None) == []
    assert [p.name for p in fig_dir.iterdir()] == ["diagram.png"]  # a picture someone else put there stays


@pytest.mark.timeout(120)
def test_history_orders_releases_by_version(tmp_path):
    for rel, step, right, n in (("v0.3.10", 13.9, 38, 40), ("v0.3.9", 14.1, 1266, 1319), ("v0.3.2", 15.0, 1259, 1319),
                                ("v0.4.0", 12.0, 1270, 1319)):
        write(tmp_path, base_record(rel, "fn-tp4", "probe", {"decode_step_ms": step}))
        write(tmp_path, gsm8k_record(rel, "fn-tp4", right, n))
    write(tmp_path, base_record("v0.3.9", "fn-tp4", "betterbench", bb_metrics(step_ms=14.0, latency=False)))
    (tmp_path / "dev" / "fn-tp4").mkdir(parents=True)  # not a version: not in the history
    names = plots.history_releases(tmp_path, "v0.3.10")
    assert names == ["v0.3.2", "v0.3.9", "v0.3.10"]  # v0.4.0 is newer than the notes' release
    panels = plots.history_panels({r: plots.readable_records(tmp_path, r) for r in names})
    step, combined, gsm = panels
    assert step.lines[0].values[0] == 15.0 and step.lines[0].values[2] == 13.9
    assert step.lines[0].hollow == [True, False, True]  # v0.3.9 from BetterBench, the others from the probe
    assert step.lines[0].values[1] == bb_metrics(step_ms=14.0, latency=False)["summary"]["decode_step_ms"]["median"]
    assert combined.lines[0].values[0] is None and combined.lines[0].values[1] is not None
    assert gsm.lines[0].values == pytest.approx([100 * 1259 / 1319, 100 * 1266 / 1319, 100 * 38 / 40])
    assert gsm.lines[0].hollow == [False, False, True]  # the 40-question subset is marked apart
    files = plots.render_figures(tmp_path, "v0.3.10", "v0.3.9")
    hist = next(f for f in files if f.kind == "history")
    assert hist.path == "figures/history.png" and hist.config is None
    decoded(tmp_path / "v0.3.10" / hist.path, plots.HISTORY_SIZE_PX)


@pytest.mark.timeout(120)
def test_plot_functions_take_plain_data(tmp_path):
    bands = [plots.Band("v0.3.2", [1, 2, 4], [170, 260, 400], [168, 255, 396], [173, 266, 405]),
             plots.Band("v0.3.3", [1, 2, 4], [175, 277, 410], [171, 270, 404], [178, 281, 415])]
    decoded(plots.plot_concurrency(tmp_path / "c.png", "x: concurrency (tok/s)", bands, [], max_num_seqs=2))
    s = [plots.Samples("v0.3.3", 1, [4.0, 4.5, 5.0, 30.0]), plots.Samples("v0.3.3", 4, [0.0, 6.0, 7.5, 9.0, 50.0])]
    decoded(plots.plot_latency(tmp_path / "l.png", "x: latency (ms)", s, s, "v0.3.3"))
    ms = plots.MemorySeries("gpu0_mib", [0, 1, 2, 3, 4, 5, 6, 7], [10, 12, 13, 13, 13, 14, 13, 9], 7, 3, 0.5, 16.0, True)
    decoded(plots.plot_memory(tmp_path / "m.png", "x: memory (MiB)", [ms], 32.0, died_at_s=6.5))
    line = plots.HistoryLine("fn-tp4", [15.0, None, 14.3])
    decoded(plots.plot_history(tmp_path / "h.png", "history", ["v0.3.2", "v0.3.3", "v0.3.4"],
                               [plots.HistoryPanel("decode step (ms)", "ms", [line])]), plots.HISTORY_SIZE_PX)
    with pytest.raises(ValueError):
        plots.plot_concurrency(tmp_path / "e.png", "empty", [], [])
    with pytest.raises(ValueError):
        plots.plot_latency(tmp_path / "e.png", "empty", [plots.Samples("v", 1, [])], [], "v")
    assert not (tmp_path / "e.png").exists()


# ---- BetterBench keeps per-request latency samples ----------------------------------------------------

BB_PARAMS = {"passes": 2, "decode_tokens": 8, "prefill_depths": [64], "concurrency": [1, 3], "requests_per_client": 2,
             "prompt_tokens": 16, "agg_tokens": 5}


def run_betterbench(tmp_path, script, params=BB_PARAMS):
    from tests.synth_server import SynthServer
    from validate.client import OpenAIClient
    from validate.config import ModelSpec, ServeConfig, ServerSpec
    from validate.runners import betterbench
    from validate.runners.base import RunContext

    cfg = ServeConfig(name="synth", model=ModelSpec(path="m", served_name="synth"),
                      server=ServerSpec(max_num_seqs=4, max_model_len=4096))

    async def tokenize(text: str) -> list[int]:  # the synthetic server has no /tokenize: one id per word
        return [len(w) for w in text.split()]

    async def go():
        async with SynthServer(script) as srv:
            async with OpenAIClient(srv.url, "synth") as c:
                c.tokenize = tokenize
                ctx = RunContext(root=REPO, config=cfg, profile="quick", client=c, data_dir=tiny_gsm8k(tmp_path / "data"),
                                 record_dir=tmp_path)
                return await betterbench.run(ctx, betterbench.BetterBenchParams(**params))

    return asyncio.run(asyncio.wait_for(go(), 60))


@pytest.mark.timeout(120)
@pytest.mark.parametrize("tokens_per_chunk", [1, 2])
def test_betterbench_keeps_latency_samples_per_level(tmp_path, tokens_per_chunk):
    from tests.synth_server import Script

    out = run_betterbench(tmp_path, Script(ttft_ms=3.0, itl_ms=1.0, tokens_per_chunk=tokens_per_chunk))
    assert not out.errors, out.errors
    ls = out.metrics["latency_samples"]
    assert set(ls) == {"c1", "c3"}
    chunks = math.ceil(BB_PARAMS["agg_tokens"] / tokens_per_chunk)  # token-bearing chunks per answer
    for c in (1, 3):
        requests = BB_PARAMS["passes"] * c * BB_PARAMS["requests_per_client"]
        s = ls[f"c{c}"]
        assert s["ttft_count"] == len(s["ttft_ms"]) == requests
        assert s["itl_count"] == len(s["itl_ms"]) == requests * (chunks - 1)
        assert all(x >= 3.0 for x in s["ttft_ms"])  # never before the scripted TTFT
        assert all(x > 0 and round(x, 2) == x for x in s["ttft_ms"] + s["itl_ms"])
    # per token: a gap over the tokens of the later chunk (the last chunk of 5 tokens in pairs carries one)
    assert np.median(ls["c1"]["itl_ms"]) < 1.0 * 3 / tokens_per_chunk


@pytest.mark.timeout(120)
def test_betterbench_latency_samples_are_capped_with_a_seeded_subsample(tmp_path, monkeypatch):
    from tests.synth_server import Script
    from validate.runners import betterbench

    values = [i / 3 for i in range(50)]
    a = betterbench.cap_samples(values, 10, random.Random("0/c1/itl"))
    assert a == betterbench.cap_samples(values, 10, random.Random("0/c1/itl")) and len(a) == 10
    assert a == sorted(a) and set(a) <= {round(v, 2) for v in values}  # measurement order kept, rounded
    assert betterbench.cap_samples(values[:5], 10, random.Random(0)) == [round(v, 2) for v in values[:5]]
    monkeypatch.setattr(betterbench, "LATENCY_SAMPLES_MAX", 10)
    s = run_betterbench(tmp_path, Script(ttft_ms=2.0, itl_ms=0.5)).metrics["latency_samples"]["c3"]
    assert s["ttft_count"] == 12 and len(s["ttft_ms"]) == 10 and s["itl_count"] == 48 and len(s["itl_ms"]) == 10


def test_two_configurations_never_share_a_figure_file(tmp_path):
    """Configuration fn-tp4 with suite betterbench and configuration fn with suite tp4-betterbench: one folder per
    configuration keeps their pictures apart (a flat name joined them into one file)."""
    from tests.validate.test_records_render import rec as make_rec
    from validate.record import record_path, write_record

    for config, suite, tok in (("fn-tp4", "betterbench", 100.0), ("fn", "tp4-betterbench", 5.0)):
        r = make_rec(config, suite, metrics={})
        r.release, r.suite_kind = "v1", "betterbench"
        r.metrics = {"concurrency": [1, 2], "summary": {f"c{c}_tok_s": {"median": tok * c, "min": tok * c,
                                                                       "max": tok * c} for c in (1, 2)}}
        write_record(record_path(tmp_path, "v1", config, suite), r)
    written = plots.render_figures(tmp_path, "v1")
    assert sorted((w.config, w.path) for w in written) == [
        ("fn", "figures/fn/tp4-betterbench-concurrency.png"), ("fn-tp4", "figures/fn-tp4/betterbench-concurrency.png")]
    assert all((tmp_path / "v1" / w.path).is_file() for w in written)

"""Release notes rendered from records that carry the figures of the seeds' v0.3.2 and v0.3.3 notes
(../shared/seeds/003_*: r9700-stack). Figures a note does not restate for a configuration are carried over
from the previous release (the notes call them unchanged)."""
from __future__ import annotations

from validate.metrics import band

import pytest

from tests.conftest import REPO
from validate.record import Dataset, Item, Record, ServerInfo, Tree, Verdict, record_path, write_record
from validate.render import render_release
from validate.suite import Checklist, ChecklistEntry

CONFIGS = ("fn-tp4", "27b-tp2", "fn-tp2")
SUITES = ("sanity", "gsm8k", "humaneval", "probe", "soak", "betterbench")

# (v0.3.2, v0.3.3) per configuration
SEEDS = {
    "fn-tp4": dict(step=(15.0, 14.3), decode=(219, 225), combined=(176.8, 188.0),
                   conc={1: (172, 175), 2: (261, 277), 4: (403, 410), 8: (514, 530)},
                   prefill8k=((6729, 6741, 6753), (6723, 6751, 6780)), kv=(515_577, 513_088), c16=(841, 868),
                   soak=(792, 690), max_num_seqs=16),
    "27b-tp2": dict(step=(4.7, 4.7), decode=(212.8, 212.8), combined=None, conc=None, prefill8k=None,
                    kv=(367_494, 367_494), c16=(672, 672), soak=(292, 290), max_num_seqs=16),
    "fn-tp2": dict(step=(8.2, 8.2), decode=(122.5, 122.5), combined=None, conc=None, prefill8k=None,
                   kv=(221_184, 221_184), c16=(163, 163), soak=(244, 244), max_num_seqs=8),
}
VLLM = ("0.31.0rc2.dev118", "0.31.1rc1.dev296")
GSM_RIGHT, HE_PASSED, SANITY_N = 1263, 162, 1040


# suite file name -> its runner kind, where they differ
KIND = {"sanity": "strict-sanity"}

def make(release: str, cfg: str, suite: str, side: int) -> Record:
    f = SEEDS[cfg]
    m: dict = {}
    dataset, items = None, []
    if suite == "sanity":
        m = {"n": SANITY_N, "bad": 0, "divergent": 0, "errors": 0}
    elif suite == "gsm8k":
        m = {"n": 1319, "correct": GSM_RIGHT, "accuracy": GSM_RIGHT / 1319, "accuracy_strict": GSM_RIGHT / 1319,
             "accuracy_flexible": GSM_RIGHT / 1319, "errors": 0}
        dataset = Dataset(name="gsm8k-test", sha256="g" * 64, n_total=1319, n_used=1319, subset=False)
        # the same answers on both sides but for 10 questions lost and 10 gained (McNemar p = 1.00), and
        # byte-identical outputs on 1,019 of 1,319 questions; each output gives its answer as the runner reads it
        right = set(range(GSM_RIGHT + 10)) - set(range(290, 300) if side == 0 else range(10))
        items = [Item(id=f"test-{i}", prompt_hash=f"p{i}", gen={"max_tokens": 1024}, expected=str(1000 + i),
                      answer=str(1000 + i) if i in right else "-1",
                      output=f"o{i}-{side if i < 300 else 0}\n#### {1000 + i if i in right else -1}",
                      correct=i in right) for i in range(1319)]
    elif suite == "humaneval":
        m = {"n": 164, "passed": HE_PASSED, "correct": HE_PASSED, "accuracy": round(HE_PASSED / 164, 6), "timeout": 0,
             "failed": 164 - HE_PASSED, "error": 0, "infra": 0, "request_errors": 0}
        dataset = Dataset(name="humaneval", sha256="h" * 64, n_total=164, n_used=164, subset=False)
        items = [Item(id=f"HumanEval/{i}", prompt_hash=f"q{i}", gen={"max_tokens": 512}, output=f"c{i}",
                      correct=i < HE_PASSED, status="passed" if i < HE_PASSED else "failed") for i in range(164)]
    elif suite == "probe":
        m = {"decode_step_ms": f["step"][side], "decode_tok_s": f["decode"][side], "concurrency": f["max_num_seqs"],
             "aggregate_tok_s": f["c16"][side], "prefill_depth": 8192, "prefill_tok_s": 6740.0, "ttft_ms_p50": 44.0,
             "decode_tokens": 512, "repeats": 3}
    elif suite == "soak":
        # a warm-up over the first half, then 0.4 MiB/min: the slope the verdict fits over the second half
        samples = [[10.0 * k, {"gpu0_mib": 30000.0 + (1280.0 * k / 75 if k < 75 else 1280.0 + 0.4 * (k - 75) / 6)}]
                   for k in range(150)]
        m = {"served": f["soak"][side], "errors": 0, "clients": 16, "duration_s": 1500.0, "prompt_tok_s": 6666.0,
             "memory": {"gpu0_mib": {"peak": 31301.0, "total": 32624.0, "slope_mib_per_min": 0.4, "flat": True,
                                     "below_total": True, "first": 30000.0, "last": 31300.0}},
             "max_slope_mib_per_min": 32.0, "samples": samples, "memory_samples_in_life": len(samples)}
    elif suite == "betterbench":
        if f["combined"] is None:
            return None
        lo, med, hi = f["prefill8k"][side]
        summ = {"combined_decode_tok_s": f["combined"][side], "decode_tok_s": f["decode"][side],
                "decode_step_ms": f["step"][side], "prefill_8192_tok_s": {"median": med, "min": lo, "max": hi}}
        summ.update({f"c{c}_tok_s": v[side] for c, v in f["conc"].items()})
        summ = {k: (v if isinstance(v, dict) else {"median": v, "min": v, "max": v}) for k, v in summ.items()}
        # 20 passes spread symmetrically around the seeds' medians (so the medians are the seeds' figures)
        off = [(i - 9.5) / 9.5 for i in range(20)]
        per_pass = [{"pass": i, "decode_step_ms": f["step"][side] * (1 + 0.004 * o),
                     "combined_decode_tok_s": f["combined"][side] * (1 - 0.004 * o),
                     "prefill_8192_tok_s": med + (hi - med if o > 0 else med - lo) * o} for i, o in enumerate(off)]
        # the figures the seeds publish without their passes: the same value in every pass
        for row in per_pass:
            row.update({k: b["median"] for k, b in summ.items() if k not in row})
        # the summary as the runner writes it: each figure's band over the passes (the audit recomputes it)
        summ = {k: band([row[k] for row in per_pass]) for k in summ}
        m = {"passes": 20, "prefill_depths": [8192], "concurrency": [1, 2, 4, 8], "summary": summ,
             "combined_decode_tok_s": f["combined"][side], "per_pass": per_pass}
    return Record(
        release=release, config=cfg, config_hash=f"cfg-{cfg}", suite=suite, suite_kind=KIND.get(suite, suite), params={"primary": "strict"},
        params_hash="p", suite_hash="s", profile="full", started_at="2026-10-13T00:00:00+00:00",
        ended_at="2026-10-13T01:00:00+00:00", wall_s=3600.0,
        tree=Tree(commit=("a" if side == 0 else "b") * 40, dirty=False, source_hash=f"src{side}", engine_hash="e"),
        server=ServerInfo(launched=True, provenance=[f"R9K-PROVENANCE version=0.3.{2 + side} source_hash=src{side} files=40 pid=1"],
                          provenance_ok=True, kv_cache_tokens=f["kv"][side]),
        versions={"vllm": VLLM[side], "torch": "2.12.0+rocm10.0", "driver": None, "r9k": f"0.3.{2 + side}"},
        knobs={"R9K_GDN_PREFILL_MAX": 256}, env={}, hardware={"gpus": 4 if cfg == "fn-tp4" else 2, "kind": "r9700", "power": "210 W, -42 mV"},
        config_snapshot={"server": {"max_num_seqs": f["max_num_seqs"]}}, model="/models/x",
        verdict=Verdict(status="pass"), metrics=m, dataset=dataset, items=items)


@pytest.fixture
def notes(tmp_path):
    for side, rel in enumerate(("v0.3.2", "v0.3.3")):
        for cfg in CONFIGS:
            for suite in SUITES:
                r = make(rel, cfg, suite, side)
                if r is not None:
                    write_record(record_path(tmp_path, rel, cfg, suite), r)
    (tmp_path / "v0.3.3" / "changes.md").write_text("- The image pin moves to the 2026-10-12 vLLM nightly.")
    cl = Checklist(configs=list(CONFIGS), suites=[ChecklistEntry(suite=s) for s in SUITES])
    return render_release(REPO, tmp_path, "v0.3.3", cl).read_text()


def row(md: str, cfg: str, label: str) -> str:
    section = md.split("## Numbers")[1].split("## Quality gate")[0]
    table = section.split(f"| {cfg} | v0.3.2 | v0.3.3 | change |")[1].split("\n\n")[0]
    return next(line for line in table.splitlines() if line.startswith(f"| {label} |"))


def test_numbers_carry_the_seeds_figures_and_changes(notes):
    assert notes.startswith("# v0.3.3: fn-tp4: decode step 15.00 -> 14.30 ms, BetterBench combined decode 176.8 -> 188.0 tok/s")
    assert row(notes, "fn-tp4", "decode step p50 (probe)") == "| decode step p50 (probe) | 15.00 ms | 14.30 ms | -4.7% |"
    assert row(notes, "fn-tp4", "single-stream decode (probe)") == "| single-stream decode (probe) | 219.0 tok/s | 225.0 tok/s | +2.7% |"
    assert row(notes, "fn-tp4", "BetterBench combined decode") == ("| BetterBench combined decode | 176.8 tok/s (176.1–177.5) | 188.0 tok/s (187.2–188.8) | "
                                                                     "+6.3% (faster) |")
    for c, pct in ((1, "+1.7%"), (2, "+6.1%"), (4, "+1.7%"), (8, "+3.1%")):
        b, a = SEEDS["fn-tp4"]["conc"][c]
        # gated (c*_tok_s): the gate's mark follows the change
        assert row(notes, "fn-tp4", f"concurrency {c} (aggregate)").startswith(
            f"| concurrency {c} (aggregate) | {b:.1f} tok/s | {a:.1f} tok/s | {pct} (")
    assert row(notes, "fn-tp4", "prefill 8,192 tokens") == \
        "| prefill 8,192 tokens | 6,741 tok/s (6,729–6,753) | 6,751 tok/s (6,723–6,780) | +0.1% (within the threshold) |"
    assert row(notes, "fn-tp4", "KV cache") == "| KV cache | 515,577 tokens | 513,088 tokens | -0.5% |"
    assert row(notes, "fn-tp4", "aggregate at max_num_seqs streams (probe)") == \
        "| aggregate at max_num_seqs streams (probe) | 841.0 tok/s | 868.0 tok/s | +3.2% |"
    assert row(notes, "fn-tp4", "soak requests served") == "| soak requests served | 792 | 690 | -12.9% |"
    assert row(notes, "27b-tp2", "KV cache") == "| KV cache | 367,494 tokens | 367,494 tokens | = |"
    assert row(notes, "fn-tp2", "single-stream decode (probe)") == "| single-stream decode (probe) | 122.5 tok/s | 122.5 tok/s | = |"


def test_quality_gate_and_validation_record(notes):
    assert ("| fn-tp4 | 1,263 of 1,319 (95.75%) | 95.75% / 95.75% | 162 / 164 passed, 0 timeouts, sandbox not recorded "
            "| 0 bad of 1,040") in notes
    assert ("| fn-tp4 | gsm8k | 1,319 | 95.75% (1,263) | 95.75% (1,263) | 10 / 10 | 1.00 | 1.00 | +0.0 points (-0.7 to +0.7) "
            "| 77.3% | no significant regression |") in notes
    # what the test could have seen: Holm over 6 tasks needs p <= 0.05 / 6, so 0.5^k <= 0.00833 gives k = 7
    assert ("- fn-tp4 / gsm8k (1,319 questions): detects a drop of 1.1 points with 80% power at the observed discordant "
            "rate (20 of 1,319); a loss of at least 7 questions (0.5 points) with none gained is the least it can flag.") in notes
    assert "- fn-tp4 / humaneval (164 questions): no discordant questions, so no power estimate; a loss of at least 7" in notes
    assert "| fn-tp4 | 0 bad of 1,040 | 690 served, 0 errors, 16 clients, 25.0 min, 6,666 prompt tok/s | gpu0: peak 31,301 of 32,624 MiB, 0.4 MiB/min (flat) |" in notes
    assert "- The image pin moves to the 2026-10-12 vLLM nightly." in notes
    assert "- fn-tp4, derived from the records against v0.3.2: vllm 0.31.0rc2.dev118 -> 0.31.1rc1.dev296; r9k 0.3.2 -> 0.3.3." in notes
    assert "| fn-tp4 | bbbbbbbbbbbb | no | `R9K-PROVENANCE version=0.3.3 source_hash=src1 files=40` (matches the tree) |" in notes
    assert "r9700 x4, 210 W, -42 mV" in notes
    nc = notes.split("## Not checked")[1].split("##")[0]
    assert "27b-tp2 / betterbench: did not run (no record)." in nc and "fn-tp4" not in nc


def test_the_performance_gate_marks_each_figure(notes):
    # decode step 15.0 -> 14.3 ms and combined decode 176.8 -> 188.0 tok/s: beyond each other's bands, faster;
    # prefill at 8k: +0.1%, the median just past the baseline's narrow band: within the threshold
    assert "| fn-tp4 | decode_step_ms | 15.00 ms (14.95–15.05, 20) | 14.30 ms (14.25–14.35, 20) | -4.7% | 3.0% |" in notes
    gate = notes.split("Performance gate against v0.3.2")[1].split("## Quality gate")[0]
    rows = {line.split(" | ")[1]: line for line in gate.splitlines() if line.startswith("| fn-tp4 |")}
    assert rows["decode_step_ms"].endswith("| faster |") and rows["combined_decode_tok_s"].endswith("| faster |")
    assert rows["prefill_8192_tok_s"].endswith("| within the threshold |")
    assert "regression" not in gate


def test_quick_and_skipped_are_not_checked(tmp_path):
    for cfg in ("fn-tp4", "fn-tp2"):
        for suite in ("sanity", "soak"):
            r = make("v0.3.3", cfg, suite, 1)
            if cfg == "fn-tp2" and suite == "soak":
                r.profile = "quick"
            if cfg == "fn-tp4" and suite == "soak":
                continue  # skipped on this configuration
            write_record(record_path(tmp_path, "v0.3.3", cfg, suite), r)
    cl = Checklist(configs=["fn-tp4", "fn-tp2"], suites=[ChecklistEntry(suite=s) for s in ("sanity", "soak")])
    md = render_release(REPO, tmp_path, "v0.3.3", cl).read_text()
    nc = md.split("## Not checked")[1].split("##")[0]
    assert "- fn-tp4 / soak: did not run (no record)." in nc
    assert "- fn-tp2 / soak: quick profile." in nc
    ck = md.split("## Checked")[1].split("##")[0]
    assert "fn-tp4 / sanity: pass" in ck and "fn-tp2 / sanity: pass" in ck and "soak" not in ck


def test_notes_link_the_figures_they_wrote(notes, tmp_path):
    import re

    links = re.findall(r"!\[([^\]]+)\]\((figures/[^)]+\.png)\)", notes)
    assert links and all((tmp_path / "v0.3.3" / path).is_file() for _, path in links)
    assert any("fn-tp4" in title and path.endswith("concurrency.png") for title, path in links)
    assert any(path == "figures/history.png" for _, path in links)

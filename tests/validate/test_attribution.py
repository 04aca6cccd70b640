"""The attribution table (validate.attribution, ``r9k-validate attribution``) from records built with the project's
record models: exact moves and perfgate's marks for a known shift, the probe's figures, a refusal when a record
does not stand on what it holds; and the performance gate across configurations (the memory pair)."""
from __future__ import annotations

import pytest

from tests.conftest import REPO
from tests.validate.test_compare import save, stamp
from tests.validate.test_records_render import rec
from validate.attribution import attribute, markdown
from validate.cli import main
from validate.metrics import band
from validate.perfgate import compare_perf
from validate.suite import perf_gate_specs

pytestmark = pytest.mark.timeout(120)

STEPS = [38.0, 38.2, 38.4, 38.6, 38.8]  # 5 passes, median 38.4 ms
GATE = {"thresholds_pct": {"decode_step_ms": 3.0, "combined_decode_tok_s": 3.0, "prefill_*": 5.0}, "alpha": 0.05}


def bench(release: str, scale: float, knob_set: str, config: str = "h200-next"):
    """A BetterBench record of 5 passes whose decode step is ``STEPS`` x ``scale``, as the runner writes it."""
    r = rec(config, "betterbench", metrics={})
    r.release, r.suite_kind, r.started_at, r.knob_set = release, "betterbench", stamp(release), knob_set
    r.params = {"decode_tokens": 128, "prefill_depths": [1024], "concurrency": [1, 2], "passes": 5}
    rows = [{"pass": i, "decode_step_ms": round(s * scale, 4), "combined_decode_tok_s": round(1e3 / (s * scale), 4),
             "prefill_1024_tok_s": 5000.0 + i} for i, s in enumerate(STEPS)]
    r.metrics = {"passes": 5, "per_pass": rows,
                 "summary": {k: band([row[k] for row in rows]) for k in rows[0] if k != "pass"}}
    r.perf_gate = GATE
    return r


def probe(release: str, scale: float, knob_set: str):
    r = rec("h200-next", "probe", metrics={
        "decode_tok_s_runs": [round(1e3 / (s * scale), 3) for s in (38.0, 38.4, 38.8)], "decode_step_ms": 38.4 * scale,
        "ttft_ms_p50": 61.2, "prefill_tok_s_runs": [4300.0, 4320.0, 4340.0], "prefill_tok_s": 4320.0})
    r.release, r.started_at, r.knob_set = release, stamp(release), knob_set
    return r


def releases(tmp_path):
    save(tmp_path, bench("stock", 1.0, "stock"), bench("gdn", 1.4, "gdn"), bench("moe", 1.0, "moe"),
         probe("stock", 1.0, "stock"), probe("gdn", 1.4, "gdn"), probe("moe", 1.0, "moe"))


def test_a_forty_percent_slower_decode_step_is_attributed_to_its_set(tmp_path):
    releases(tmp_path)
    a = attribute(tmp_path, "h200-next", "stock", ["gdn", "moe"], perf_gate_specs(REPO))
    assert a.refused == [] and a.knob_sets == {"stock": ["stock"], "gdn": ["gdn"], "moe": ["moe"]}
    by = {(r.release, r.suite, r.figure): r for r in a.rows}
    step = by["gdn", "betterbench", "decode_step_ms"]
    assert (step.base, step.cand, step.n_base, step.n_cand, step.mark) == (38.4, 53.76, 5, 5, "slower")
    assert step.change_pct == pytest.approx(40.0, abs=1e-9)
    assert "rank-test p = 0.00397 < 0.05" in step.message  # every candidate pass above every baseline one: 1 / C(10, 5)
    comb = by["gdn", "betterbench", "combined_decode_tok_s"]
    assert comb.mark == "slower" and comb.change_pct == pytest.approx(100 * (1 / 1.4 - 1), abs=1e-3)
    assert by["gdn", "betterbench", "prefill_1024_tok_s"].mark == "within the threshold"
    assert {by["moe", "betterbench", f].mark for f in ("decode_step_ms", "combined_decode_tok_s")} == {
        "within the threshold"}
    # the probe's repeats: 3 a side can never give p < 0.05 (1 / C(6, 3) = 0.05): perfgate's "cannot tell"
    ps = by["gdn", "probe", "decode_step_ms"]
    assert (ps.n_base, ps.n_cand, ps.mark) == (3, 3, "cannot tell") and ps.change_pct == pytest.approx(40.0, abs=0.01)
    tt = by["gdn", "probe", "ttft_ms_p50"]
    assert (tt.n_base, tt.n_cand, tt.change_pct, tt.mark) == (1, 1, 0.0, "cannot tell")
    assert len(a.rows) == 12  # 3 BetterBench and 3 probe figures a release


def test_the_command_prints_the_table_and_writes_markdown(tmp_path, capsys):
    releases(tmp_path)
    md = tmp_path / "table.md"
    code = main(["attribution", "--config", "h200-next", "--baseline", "stock", "--releases", "gdn", "moe",
                 "--reports", str(tmp_path), "--markdown", str(md)])
    assert code == 0
    assert capsys.readouterr().out.splitlines()[-1].startswith("exit status 0: 12 figure(s) of 2 release(s)")
    text = md.read_text()
    assert "| gdn (gdn) | betterbench | decode_step_ms | 38.40 -> 53.76 ms | +40.0% | slower | 5 / 5 |" in text
    assert "| moe (moe) | betterbench | decode_step_ms | 38.40 -> 38.40 ms | +0.0% | within the threshold | 5 / 5 |" in text
    assert "| gdn (gdn) | probe | ttft_ms_p50 | 61.20 -> 61.20 ms | +0.0% | cannot tell | 1 / 1 |" in text
    assert text == markdown(attribute(tmp_path, "h200-next", "stock", ["gdn", "moe"], perf_gate_specs(REPO)))


def test_a_record_that_fails_its_audit_is_refused_never_tabled(tmp_path, capsys):
    releases(tmp_path)
    forged = bench("gdn", 1.4, "gdn")
    forged.metrics["summary"]["decode_step_ms"]["median"] = 38.4  # says the stock figure over 40% slower passes
    save(tmp_path, forged)
    a = attribute(tmp_path, "h200-next", "stock", ["gdn", "moe"], perf_gate_specs(REPO))
    [why] = a.refused
    assert why.startswith("gdn: h200-next/betterbench: refused: the candidate's record does not stand on what it "
                          "holds: its summary is not its passes'")
    assert not [r for r in a.rows if r.release == "gdn" and r.suite == "betterbench"]
    assert {r.release for r in a.rows if r.suite == "betterbench"} == {"moe"}
    assert main(["attribution", "--config", "h200-next", "--baseline", "stock", "--releases", "gdn",
                 "--reports", str(tmp_path)]) == 2
    assert "exit status 2: 1 comparison(s) refused" in capsys.readouterr().out


def test_a_release_is_never_its_own_baseline(tmp_path):
    from validate.errors import InputError

    releases(tmp_path)
    with pytest.raises(InputError, match="stock against itself"):
        attribute(tmp_path, "h200-next", "stock", ["stock"], perf_gate_specs(REPO))


def test_the_cache_pairs_with_vllms_offload_across_configurations(tmp_path, capsys):
    """The memory pair: h200-next under --knobs moe against h200-next-offload's stock run. The perf gate pairs
    them with --against-config (the servers' extra flags may differ and are named); without it, or with another
    server setting moved, it refuses."""
    from validate.config import find_config, with_knob_set

    cand, base = bench("moe", 1.0, "moe"), bench("stock", 1.0, "stock", config="h200-next-offload")
    for rec, cfg in ((cand, with_knob_set(find_config(REPO, "h200-next"), "moe")),
                     (base, find_config(REPO, "h200-next-offload"))):
        # a random-weight snapshot stands only with its own hash (validate.config.record_weights)
        rec.config_snapshot, rec.config_hash = cfg.model_dump(mode="json"), cfg.digest()
        rec.model = cfg.model.source_name()
    # the moe set's server installed the cache in both its processes and routed calls to it (validate.audit)
    cand.server.provenance = [f"R9K-PROVENANCE version=0.1.0 source_hash={cand.tree.source_hash} files=5 pid={p} "
                              "dispatch=moe_cache failed=-" for p in (41, 42)]
    cand.r9k_calls = {"steps": {"prefill": 60, "decode": 800, "other": 3},
                      "calls": [{"dispatch": "moe_cache", "route": "r9k", "kind": k, "calls": n}
                                for k, n in (("prefill", 240), ("decode", 3200))],
                      "per_step": {}, "processes": 2, "malformed": 0}
    save(tmp_path, cand, base)
    argv = ["gate", "--perf", "moe", "--against", "stock", "--accept-other-tree", "--reports", str(tmp_path)]
    assert main(argv + ["--config", "h200-next", "--against-config", "h200-next-offload"]) == 0
    perf = compare_perf(tmp_path, "moe", "stock", configs=["h200-next"], base_config="h200-next-offload")
    assert perf.unpaired == [] and len(perf.figures) == 3
    assert ("h200-next/betterbench against h200-next-offload/betterbench: two configurations compared on purpose; "
            "their servers' extra flags differ (baseline --offload-backend uva --cpu-offload-gb 2.8359375 "
            "--cpu-offload-params w13_weight w2_weight)") in perf.notes
    [why] = compare_perf(tmp_path, "moe", "stock", configs=["h200-next"]).limited  # no --against-config: no pair
    assert why == "h200-next/betterbench: the baseline stock has no such record"
    a = attribute(tmp_path, "h200-next", "stock", ["moe"], perf_gate_specs(REPO), base_config="h200-next-offload")
    assert a.refused == [] and {r.mark for r in a.rows} == {"within the threshold"}
    base.config_snapshot["server"]["max_num_seqs"] = 16
    save(tmp_path, base)
    assert main(argv + ["--config", "h200-next", "--against-config", "h200-next-offload"]) == 2
    assert "server.max_num_seqs: 16 vs 8" in " ".join(capsys.readouterr().out.split())


def test_a_release_without_the_baselines_betterbench_is_refused_and_the_baselines_knobs_shown(tmp_path, capsys):
    """A release that lost the BetterBench record its baseline holds is refused (exit 2), as the performance gate
    refuses it; its probe still compares. The title names the knob sets the baseline's records ran, so a
    baseline made under a knob set reads as one."""
    from validate.record import record_path

    releases(tmp_path)
    record_path(tmp_path, "gdn", "h200-next", "betterbench").unlink()
    a = attribute(tmp_path, "h200-next", "stock", ["gdn"], perf_gate_specs(REPO))
    assert a.refused == ["gdn: the baseline stock holds h200-next/betterbench and gdn no BetterBench record to pair "
                         "with it"]
    assert {r.suite for r in a.rows} == {"probe"} and a.knob_sets["stock"] == ["stock"]
    assert markdown(a).startswith("**gdn against stock (stock) on h200-next**")
    assert main(["attribution", "--config", "h200-next", "--baseline", "stock", "--releases", "gdn",
                 "--reports", str(tmp_path)]) == 2
    save(tmp_path, bench("stock", 1.4, "gdn"))  # a "stock" baseline that ran the gdn knob set
    assert attribute(tmp_path, "h200-next", "stock", ["moe"], perf_gate_specs(REPO)).knob_sets["stock"] == ["gdn",
                                                                                                           "stock"]

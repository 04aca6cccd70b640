"""The performance gate on seeded per-pass values: a known 10% decode-step regression fails, no shift passes,
a shift inside the threshold or the band passes, and too few passes say they cannot be significant."""
from __future__ import annotations

import random

import pytest

from tests.validate.test_records_render import rec
from validate.cli import main
from validate.perfgate import PerfGateSpec, compare_perf, judge
from validate.record import record_path, write_record

pytestmark = pytest.mark.timeout(60)


def passes(n: int, centre: float, spread: float, seed: int) -> list[float]:
    rng = random.Random(seed)
    return [round(centre * (1 + rng.uniform(-spread, spread)), 4) for _ in range(n)]


def test_a_ten_percent_slower_decode_step_is_a_regression():
    base = passes(10, 38.0, 0.01, seed=1)
    cand = passes(10, 38.0 * 1.10, 0.01, seed=2)
    f = judge("cpu-smol", "decode_step_ms", base, cand, 3.0)
    assert f.regression and f.mark == "slower" and f.outside_band
    assert 9.0 < f.worse_pct < 11.0 and f.p_value < 1e-4  # every candidate pass above every baseline pass
    assert f.p_value == pytest.approx(1 / 184756)  # exact: 1 / C(20, 10)
    assert f.message.startswith("a regression: +")


def test_no_shift_passes_and_is_within_the_threshold():
    base, cand = passes(10, 38.0, 0.01, seed=3), passes(10, 38.0, 0.01, seed=4)
    f = judge("cpu-smol", "decode_step_ms", base, cand, 3.0)
    assert not f.regression and not f.cannot_tell and f.mark == "within the threshold"


def test_a_rate_that_rises_is_faster_and_one_that_falls_inside_the_threshold_is_within_it():
    base = passes(10, 100.0, 0.005, seed=5)
    up = judge("cpu-smol", "combined_decode_tok_s", base, passes(10, 110.0, 0.005, seed=6), 3.0)
    assert up.mark == "faster" and not up.regression and up.change_pct > 9
    down = judge("cpu-smol", "combined_decode_tok_s", base, passes(10, 98.0, 0.005, seed=7), 3.0)
    assert down.outside_band and down.mark == "within the threshold" and not down.regression  # 2% < 3%
    assert "within the 3% threshold" in down.message


def test_two_passes_cannot_tell_and_say_what_would():
    """2 passes a side: the least rank-test p is 1/6, so a +18% decode step is "cannot tell", never a pass; 5
    candidate passes against 2 (1/C(7, 5) = 1/21) or 4 a side (1/70) would let the gate decide."""
    f = judge("cpu-smol", "decode_step_ms", [38.0, 38.2], [45.0, 45.3], 3.0)
    assert not f.regression and f.cannot_tell and f.mark == "cannot tell" and f.min_p == pytest.approx(1 / 6)
    assert "cannot be significant" in f.message and "+18.5% in the bad direction" in f.message
    assert "beyond the baseline's band" in f.message
    assert "at least 5 candidate passes against these 2 (or 4 a side)" in f.message
    one = judge("cpu-smol", "decode_step_ms", [38.0], [57.0, 57.1, 57.2], 3.0)  # a 1-pass baseline: +50%
    assert one.cannot_tell and one.min_p == pytest.approx(1 / 4) and not one.regression


def test_a_significant_shift_beyond_the_threshold_is_a_regression_whatever_the_band():
    """Three slow baseline passes of twenty widen its band over the candidate; a candidate 31.6% slower with
    every pass above the baseline's median passes is still a regression."""
    base = [38.0 + 0.01 * i for i in range(17)] + [60.0, 61.0, 62.0]
    cand = [50.0 + 0.01 * i for i in range(20)]
    f = judge("cpu-smol", "decode_step_ms", base, cand, 3.0)
    assert f.base_band[1] >= 50.0 and not f.outside_band  # the candidate's median lies inside the band
    assert f.regression and f.mark == "slower" and f.p_value < 1e-4
    assert "inside the baseline's band" in f.message


def test_thresholds_by_prefix():
    spec = PerfGateSpec()
    assert spec.threshold("prefill_2048_tok_s") == 5.0 and spec.threshold("decode_step_ms") == 3.0
    assert spec.threshold("c4_tok_s") is None


def _bench(release: str, step: float, seed: int, n: int = 8):
    from tests.validate.test_compare import stamp

    r = rec("cpu-smol", "betterbench", metrics={})
    r.release, r.suite_kind = release, "betterbench"
    r.started_at = stamp(release)
    r.params = {"decode_tokens": 128, "prefill_depths": [1024], "concurrency": [1, 2], "passes": n}
    steps = passes(n, step, 0.01, seed)
    r.metrics = {"passes": n, "per_pass": [{"pass": i, "decode_step_ms": s, "combined_decode_tok_s": 1e3 / s,
                                            "prefill_1024_tok_s": 5000.0 + i} for i, s in enumerate(steps)]}
    return r


def test_gate_perf_exit_status_follows_the_eval_gate(tmp_path, capsys):
    for r in (_bench("v1", 38.0, 1), _bench("v2", 38.0, 2), _bench("v3", 41.8, 3)):
        write_record(record_path(tmp_path, r.release, r.config, r.suite), r)
    assert main(["gate", "--accept-other-tree", "v2", "--against", "v1", "--perf", "--reports", str(tmp_path)]) == 0
    assert main(["gate", "--accept-other-tree", "v3", "--against", "v1", "--perf", "--reports", str(tmp_path)]) == 1
    out = capsys.readouterr().out.replace("\n", " ")
    assert "cpu-smol/decode_step_ms" in out and "a regression" in out
    cmp = compare_perf(tmp_path, "v3", "v1")
    by = {f.figure: f for f in cmp.figures}
    assert by["decode_step_ms"].regression and by["combined_decode_tok_s"].regression
    assert not by["prefill_1024_tok_s"].regression and by["prefill_1024_tok_s"].mark == "within the threshold"
    other = _bench("v4", 38.0, 4)
    other.params["decode_tokens"] = 512
    write_record(record_path(tmp_path, "v4", "cpu-smol", "betterbench"), other)
    assert main(["gate", "--accept-other-tree", "v4", "--against", "v1", "--perf", "--reports", str(tmp_path)]) == 2  # cannot compare
    assert "decode_tokens: 128 vs 512" in capsys.readouterr().out.replace("\n", " ")


def test_history_of_another_configuration_or_engine_never_widens_a_band(tmp_path):
    """Runs kept in history that measured something else (another configuration, engine or formula) made a 10%
    slower decode step read as within the band."""
    base = _bench("v1", 38.0, 1)
    wide = _bench("v1", 45.0, 9)
    wide.config_hash = "another-configuration"
    write_record(record_path(tmp_path, "v1", "cpu-smol", "betterbench"), wide)
    write_record(record_path(tmp_path, "v1", "cpu-smol", "betterbench"), base)  # wide moves to history
    write_record(record_path(tmp_path, "v3", "cpu-smol", "betterbench"), _bench("v3", 41.8, 3))
    step = next(f for f in compare_perf(tmp_path, "v3", "v1").figures if f.figure == "decode_step_ms")
    assert len(step.base) == 8 and step.regression


def test_a_lost_figure_a_nan_or_other_server_settings_are_never_a_pass(tmp_path):
    write_record(record_path(tmp_path, "v1", "cpu-smol", "betterbench"), _bench("v1", 38.0, 1))
    lost = _bench("v2", 38.0, 2)
    for row in lost.metrics["per_pass"]:
        row["decode_step_ms"] = float("nan")
    write_record(record_path(tmp_path, "v2", "cpu-smol", "betterbench"), lost)
    cmp = compare_perf(tmp_path, "v2", "v1")
    assert "decode_step_ms" not in {f.figure for f in cmp.figures}
    # written as null: every pass holds a value that is no number, named
    assert any("decode_step_ms: cannot judge: pass 0 of the candidate holds None, not a positive finite number" in u
               for u in cmp.unpaired)
    moved = _bench("v4", 38.0, 4)
    moved.config_snapshot = {"server": {"max_num_seqs": 4}}
    write_record(record_path(tmp_path, "v4", "cpu-smol", "betterbench"), moved)
    (u,) = compare_perf(tmp_path, "v4", "v1").unpaired
    assert "the configuration's settings as run differ (server.max_num_seqs: None vs 4)" in u


def test_a_candidate_serving_another_model_dtype_or_hardware_is_not_compared(tmp_path):
    """A faster, smaller model (or another dtype, or other GPUs) must not hide a slower plugin."""
    b = _bench("v1", 38.0, 1)
    write_record(record_path(tmp_path, "v1", "cpu-smol", "betterbench"), b)
    cases = {"model": lambda r: setattr(r, "model", "/models/qwen-0.5b"),
             "dtype": lambda r: r.config_snapshot.setdefault("server", {}).update(dtype="float16"),
             "hardware": lambda r: setattr(r, "hardware", {"kind": "h200", "gpus": 1})}
    for i, (what, change) in enumerate(cases.items()):
        c = _bench(f"v{i + 2}", 38.0 * 0.8, 2)
        change(c)
        write_record(record_path(tmp_path, c.release, "cpu-smol", "betterbench"), c)
        cmp = compare_perf(tmp_path, c.release, "v1")
        assert not cmp.figures and len(cmp.unpaired) == 1, (what, cmp.unpaired)
        assert f"the {what}" in cmp.unpaired[0] or f"{what}:" in cmp.unpaired[0], cmp.unpaired

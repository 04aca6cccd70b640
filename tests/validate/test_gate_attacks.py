"""Gates attacked with records built by the project's own record models: each way an output could say pass over
a regression, run through the CLI in-process (``gate``, ``gate --perf``, ``render``) with ``--junit-xml`` and
``GITHUB_STEP_SUMMARY`` set, and every output read: the exit status, the console's last line, JUnit, the step
summary and the notes' opening line. None may be a pass, and all must say the same."""
from __future__ import annotations

from pathlib import Path

import pytest
from junitparser import JUnitXml

from tests.validate.test_compare import eval_record, save
from tests.validate.test_one_verdict import BASE, LOST_50, agree, bench, outputs
from validate.cli import main

pytestmark = pytest.mark.timeout(120)


def run_cli(tmp_path: Path, monkeypatch, capsys, argv: list[str]) -> dict:
    """Run ``r9k-validate argv`` in-process with --junit-xml and $GITHUB_STEP_SUMMARY set; return the exit status,
    the console's last line, JUnit's (tests, failures, errors, skipped) and the summary's verdict line."""
    summary, junit = tmp_path / "summary.md", tmp_path / "junit.xml"
    summary.unlink(missing_ok=True)
    junit.unlink(missing_ok=True)
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(summary))
    capsys.readouterr()
    code = main(argv + ["--junit-xml", str(junit)])
    lines = [x for x in capsys.readouterr().out.splitlines() if x.strip()]
    xml = JUnitXml.fromfile(str(junit))
    md = summary.read_text()
    return {"code": code, "last": lines[-1], "console": "\n".join(lines), "junit": (xml.tests, xml.failures,
            xml.errors, xml.skipped), "summary": md, "head": md.splitlines()[2]}


def notes_of(reports: Path, monkeypatch, capsys, release: str, baseline: str | None = None) -> dict:
    """``render release [--baseline B]``: the notes' opening line and the console's line of the release's verdict."""
    capsys.readouterr()
    argv = ["render", release, "--reports", str(reports)] + (["--baseline", baseline] if baseline else [])
    assert main(argv) == 0  # render itself exits 0; it says the verdict's
    text = capsys.readouterr().out
    last = " ".join(text[text.rfind("the release's verdict:"):].split())  # the console wraps it
    notes = (reports / release / "RELEASE.md").read_text()
    return {"opening": notes.split("\n")[2], "last": last, "notes": notes}


def blocked(out: dict, code: int) -> None:
    """The gate's outputs all say ``code`` (1: a finding, 2: not checked): none a pass."""
    assert out["code"] == code
    assert out["last"].startswith(f"exit status {code}:")
    tests, failures, errors, skipped = out["junit"]
    if code == 1:
        assert failures > 0 and out["head"].startswith("**FAIL**")
    else:
        assert failures == 0 and errors > 0 and out["head"].startswith("**NOT CHECKED**")


def notes_blocked(n: dict, code: int) -> None:
    assert n["last"].startswith(f"the release's verdict: exit status {code} ")
    assert n["opening"].startswith("**Not ready to ship:" + ("** " if code == 1 else " not everything could be checked:**"))


# --- the automatic baseline --------------------------------------------------------------------------------


@pytest.mark.parametrize("folder", ["1234", "v1234", "0.3.2-1", "v0.3.3a1", "v0.3.3+pr7"])
def test_a_folder_that_is_no_released_version_is_never_the_automatic_baseline(tmp_path, monkeypatch, capsys, folder):
    """A pull request's earlier run in ``1234/`` (as regressed as the candidate) was taken as a released version:
    ``candidate`` passed against it. The baseline is v0.3.2, and the 50-question loss is a finding everywhere."""
    from validate.compare import previous_release, released_version

    save(tmp_path, eval_record("v0.3.2", BASE), bench("v0.3.2", 38.0, 1))
    save(tmp_path, eval_record(folder, LOST_50), bench(folder, 38.0 * 1.6, 3))
    save(tmp_path, eval_record("candidate", LOST_50), bench("candidate", 38.0 * 1.6, 2))
    assert released_version(folder) is None
    assert previous_release(tmp_path, "candidate") == "v0.3.2"
    out = outputs(tmp_path, "candidate")
    agree(out)
    assert out["code"] == 1 and out["verdict"].baseline == "v0.3.2"
    assert "never a pre-release" in out["verdict"].baseline_why and "1234" in out["verdict"].baseline_why
    n = notes_of(tmp_path, monkeypatch, capsys, "candidate")
    notes_blocked(n, 1)
    assert "paired gsm8k vs v0.3.2" in n["opening"]


def test_released_versions_by_one_rule():
    from validate.compare import released_version

    assert [str(released_version(x)) for x in ("v0.3.2", "0.3.2", "v1.0", "v0.3.2.post1", "v0.3.10")] == [
        "0.3.2", "0.3.2", "1.0", "0.3.2.post1", "0.3.10"]
    for x in ("1234", "v7", "v0.3.2rc1", "v0.3.2.dev3", "v0.3.2+exp", "01.2", "v0.3.2-1", "1!1.0", "vv0.3.2", "dev"):
        assert released_version(x) is None, x


# --- the performance gate's pass values ------------------------------------------------------------------------


def _edit(reports: Path, release: str, suite: str, fn, config: str = "cpu-smol") -> None:
    """Edit a written record's JSON as a hand (or a script) would: ``fn(data)``; NaN and Infinity written as
    Python's json writes them."""
    import json

    from validate.record import record_path

    p = record_path(reports, release, config, suite)
    data = json.loads(p.read_text())
    fn(data)
    p.write_text(json.dumps(data))


@pytest.mark.parametrize("value", [float("nan"), float("inf"), None, "fast", 0])
def test_a_pass_value_that_is_no_finite_number_is_exit_2_naming_the_pass(tmp_path, monkeypatch, capsys, value):
    """12 of the candidate's 20 passes (its slow ones, +40 %) hold NaN, Infinity, null, a string or 0: dropping
    them left 8 unchanged passes, and the gate passed."""
    save(tmp_path, bench("v0.1.0", 38.0, 1), bench("v0.2.0", 38.0, 2))

    def spoil(d):
        for row in d["metrics"]["per_pass"][:12]:
            row["decode_step_ms"] = value

    _edit(tmp_path, "v0.2.0", "betterbench", spoil)
    out = run_cli(tmp_path, monkeypatch, capsys, ["gate", "--accept-other-tree", "v0.2.0", "--against", "v0.1.0",
                                                  "--perf", "--reports", str(tmp_path)])
    blocked(out, 2)
    # the audit finds the record's summary is not its passes' first: the pair is refused, naming it
    refused = "cpu-smol/betterbench: cannot compare: the candidate's record does not stand on what it holds: "
    assert refused in out["console"].replace("\n", "")
    assert "cpu-smol / perf betterbench: " + refused in out["summary"].replace("\\", "")
    from validate.perfgate import compare_perf

    # and the gate on its own, over such passes, judges none of the figure's passes left
    [why] = [u for u in compare_perf(tmp_path, "v0.2.0", "v0.1.0").unpaired if "decode_step_ms" in u]
    assert f"decode_step_ms: cannot judge: pass 0 of the candidate holds {value!r}, not a positive finite number" in why
    n = notes_of(tmp_path, monkeypatch, capsys, "v0.2.0", "v0.1.0")
    notes_blocked(n, 2)
    assert "cpu-smol / perf betterbench" in n["opening"]


def test_a_figure_missing_from_some_passes_is_not_judged_on_the_rest(tmp_path, monkeypatch, capsys):
    save(tmp_path, bench("v0.1.0", 38.0, 1), bench("v0.2.0", 38.0, 2))

    def drop(d):
        for row in d["metrics"]["per_pass"][:12]:
            del row["decode_step_ms"]

    _edit(tmp_path, "v0.2.0", "betterbench", drop)
    out = run_cli(tmp_path, monkeypatch, capsys, ["gate", "--accept-other-tree", "v0.2.0", "--against", "v0.1.0",
                                                  "--perf", "--reports", str(tmp_path)])
    blocked(out, 2)
    assert "cannot compare: the candidate's record does not stand on what it holds: its summary is not its passes'" \
        in out["console"].replace("\n", "")
    from validate.perfgate import compare_perf

    [why] = [u for u in compare_perf(tmp_path, "v0.2.0", "v0.1.0").unpaired if "decode_step_ms" in u]
    assert "the candidate measured it in 8 of 20 passes (missing from pass 0, 1, 2, 3, 4 ...)" in why


def _steps(r, steps: list[float]):
    """Set a BetterBench record's per-pass decode steps (and the combined decode they imply)."""
    import statistics

    r.metrics["per_pass"] = [{"pass": i, "decode_step_ms": s, "combined_decode_tok_s": 1e3 / s,
                              "prefill_1024_tok_s": 5000.0 + i} for i, s in enumerate(steps)]
    r.metrics["summary"] = {"decode_step_ms": {"median": statistics.median(steps), "min": min(steps), "max": max(steps)}}
    r.metrics["passes"] = len(steps)
    return r


def test_a_shift_the_median_hides_is_a_regression(tmp_path, monkeypatch, capsys):
    """9 of 20 candidate passes twice as slow, 11 unchanged: the median did not move (+0.3 %), the figure passed
    "within the 3 % threshold". The rank test separates them and the mean (+45 %) and p90 (+100 %) say by how
    much: a finding in every output."""
    base = [38.0 + 0.02 * i for i in range(20)]
    cand = [38.01 + 0.02 * i for i in range(5, 16)] + [2 * (38.0 + 0.02 * i) for i in range(9)]
    save(tmp_path, _steps(bench("v0.1.0", 38.0, 1), base), _steps(bench("v0.2.0", 38.0, 2), cand))
    from validate.perfgate import compare_perf

    f = next(x for x in compare_perf(tmp_path, "v0.2.0", "v0.1.0").figures if x.figure == "decode_step_ms")
    assert f.worse_pct == pytest.approx(100 * (38.30 - 38.19) / 38.19)
    assert f.p_value == pytest.approx(0.0028088834612991884, rel=1e-9) and f.regression and f.mark == "slower"
    assert ("a regression the median hides: the median +0.3%, the mean +44.8% and the 90th percentile +98.9% in the "
            "bad direction (threshold 3%), rank-test p = 0.00281 < 0.05") == f.message
    out = run_cli(tmp_path, monkeypatch, capsys, ["gate", "--accept-other-tree", "v0.2.0", "--against", "v0.1.0",
                                                  "--perf", "--reports", str(tmp_path)])
    blocked(out, 1)
    assert "cpu-smol/perf decode_step_ms" in out["last"]
    n = notes_of(tmp_path, monkeypatch, capsys, "v0.2.0", "v0.1.0")
    notes_blocked(n, 1)
    assert "perf decode_step_ms" in n["opening"]




def test_a_minority_of_far_slower_passes_the_rank_test_misses_is_never_within_the_threshold(tmp_path, monkeypatch,
                                                                                          capsys):
    """8 of 20 candidate passes 40 % slower amid ~1.6 % noise: the median barely moves and the rank test does not
    reach 0.05, yet the mean and p90 are far past the threshold; the figure read "within the threshold" and every
    output PASS. It cannot be told from these passes: exit 2 in every output, never 0."""
    import random

    rng = random.Random(7)
    base = [38.0 * (1 + rng.gauss(0, 0.016)) for _ in range(20)]
    cand = [38.0 * (1 + rng.gauss(0, 0.016)) for _ in range(20)]
    cand = sorted(cand)[:12] + [1.4 * x for x in sorted(cand)[12:]]
    save(tmp_path, _steps(bench("v0.1.0", 38.0, 1), base), _steps(bench("v0.2.0", 38.0, 2), cand))
    from validate.perfgate import compare_perf

    f = next(x for x in compare_perf(tmp_path, "v0.2.0", "v0.1.0").figures if x.figure == "decode_step_ms")
    assert f.worse_pct < 3.0 and f.mean_worse_pct > 3.0 and f.p_value >= 0.05
    assert f.mark == "cannot tell" and f.cannot_tell and not f.regression
    assert f.message.startswith("cannot tell: the median") and "some passes are far slower" in f.message
    out = run_cli(tmp_path, monkeypatch, capsys, ["gate", "--accept-other-tree", "v0.2.0", "--against", "v0.1.0",
                                                  "--perf", "--reports", str(tmp_path)])
    blocked(out, 2)

# --- every output says the same ------------------------------------------------------------------------------


def test_a_limited_check_is_a_skipped_testcase_with_its_reason(tmp_path, monkeypatch, capsys):
    """A subset pair whose baseline got 3 of 200 right cannot detect a regression: the console and the summary
    called it limited, JUnit a passed testcase (tests=1, failures=0, skipped=0)."""
    save(tmp_path, eval_record("v0.1.0", {0, 1, 2}, subset=True), eval_record("v0.2.0", {0, 1, 2}, subset=True))
    out = run_cli(tmp_path, monkeypatch, capsys, ["gate", "--accept-other-tree", "v0.2.0", "--against", "v0.1.0",
                                                  "--reports", str(tmp_path)])
    assert out["code"] == 0
    assert out["last"] == ("exit status 0: no finding; 2 check(s) limited or not run: cpu-smol/gsm8k (tree) other-tree, "
                           "cpu-smol/paired gsm8k vs v0.1.0 not significant; too few questions to detect a regression")
    assert out["junit"] == (2, 0, 0, 2)  # the pair and the record another tree made (--accept-other-tree)
    case = next(c for s in JUnitXml.fromfile(str(tmp_path / "junit.xml")) for c in s if c.name.startswith("paired"))
    [skip] = case.result
    assert skip.type == "limited" and skip.message == ("not a full check: a subset; too few questions to detect a "
                                                        "regression")
    assert out["head"].startswith("**NO FINDING, NOT FULLY CHECKED**")
    n = notes_of(tmp_path, monkeypatch, capsys, "v0.2.0", "v0.1.0")
    assert n["opening"].startswith("No finding in what was checked") and "exit status 0 " in n["last"]


# --- what the baseline has and the candidate lacks ----------------------------------------------------------------


@pytest.mark.parametrize("share", ["the SLO share", "the draft acceptance"])
def test_a_gated_share_the_candidate_lacks_blocks(tmp_path, monkeypatch, capsys, share):
    """The baseline holds an arrivals record (the SLO share is gated) or a suite whose server speculated (draft
    acceptance), the candidate none: gate --perf exited 0 and nothing named the share not compared."""
    from tests.validate.test_loadgate import arrivals, with_spec

    gated = arrivals("v0.1.0", 1.0, 40, 40) if share == "the SLO share" else with_spec("v0.1.0", 600, 900, "sanity")
    save(tmp_path, bench("v0.1.0", 38.0, 1), gated, bench("v0.2.0", 38.0, 2))
    out = run_cli(tmp_path, monkeypatch, capsys, ["gate", "--accept-other-tree", "v0.2.0", "--against", "v0.1.0",
                                                  "--perf", "--reports", str(tmp_path)])
    blocked(out, 2)
    line = (f"cpu-smol/{gated.suite}: {share} is gated and the candidate v0.2.0 has no such record (the baseline "
            "v0.1.0 has)")
    assert line in out["console"].replace("\n", "") and f"cpu-smol/share gate {gated.suite}" in out["last"]
    n = notes_of(tmp_path, monkeypatch, capsys, "v0.2.0", "v0.1.0")
    notes_blocked(n, 2)
    assert f"cpu-smol / share gate {gated.suite}" in n["opening"]


def test_a_kind_the_candidate_lacks_entirely_blocks(tmp_path, monkeypatch, capsys):
    """The baseline holds BetterBench and arrivals records, the candidate arrivals only: the performance gate
    did not run and nothing named the figures it did not compare."""
    from tests.validate.test_loadgate import arrivals

    save(tmp_path, bench("v0.1.0", 38.0, 1), arrivals("v0.1.0", 1.0, 40, 40), arrivals("v0.2.0", 1.0, 40, 40))
    out = run_cli(tmp_path, monkeypatch, capsys, ["gate", "--accept-other-tree", "v0.2.0", "--against", "v0.1.0",
                                                  "--perf", "--reports", str(tmp_path)])
    blocked(out, 2)
    assert ("cpu-smol/betterbench: the baseline holds a record of suite kind 'betterbench' and the candidate none: "
            "the perf compared nothing") in out["console"].replace("\n", "")
    n = notes_of(tmp_path, monkeypatch, capsys, "v0.2.0", "v0.1.0")
    notes_blocked(n, 2)
    assert "cpu-smol / perf betterbench" in n["opening"]


def test_a_configuration_left_out_of_the_run_stays_not_run(tmp_path):
    """The baseline ran cpu-smol and gpu-box, the candidate (release --config cpu-smol) only cpu-smol: gpu-box's
    BetterBench record is named, limited in the release (not a finding, not a block)."""
    other = bench("v0.1.0", 38.0, 3)
    other.config = "gpu-box"
    save(tmp_path, bench("v0.1.0", 38.0, 1), other, bench("v0.2.0", 38.0, 2))
    out = outputs(tmp_path, "v0.2.0")
    lim = [c for c in out["verdict"].checks if c.config == "gpu-box"]
    assert [(c.name, c.outcome) for c in lim] == [("perf betterbench", "limited")]
    assert "the candidate ran no BetterBench on gpu-box" in lim[0].message


def _renamed(tmp_path, base_evals=("gsm8k-cot",)):
    """The baseline's suites named gsm8k-cot and bb (kinds gsm8k, betterbench), the candidate's gsm8k and
    betterbench, 25 points lower and 40 % slower."""
    for suite in base_evals:
        e = eval_record("v0.1.0", BASE, suite=suite)
        e.suite_kind = "gsm8k"
        save(tmp_path, e)
    b = bench("v0.1.0", 38.0, 1)
    b.suite = "bb"
    save(tmp_path, b, eval_record("v0.2.0", LOST_50), bench("v0.2.0", 38.0 * 1.4, 2))


def test_a_renamed_suite_is_paired_by_kind(tmp_path, monkeypatch, capsys):
    """Every line was "limited" and the release exited 0."""
    _renamed(tmp_path)
    out = run_cli(tmp_path, monkeypatch, capsys, ["gate", "--accept-other-tree", "v0.2.0", "--against", "v0.1.0",
                                                  "--reports", str(tmp_path)])
    blocked(out, 1)
    assert "cpu-smol/paired gsm8k vs v0.1.0 regression" in out["last"]
    [fail] = next(c for s in JUnitXml.fromfile(str(tmp_path / "junit.xml")) for c in s if c.name.startswith("paired")).result
    assert "paired with the baseline's cpu-smol/gsm8k-cot (the same suite kind; renamed)" in fail.text
    assert ("cpu-smol/gsm8k: paired with the baseline's cpu-smol/gsm8k-cot (the same suite kind 'gsm8k' and "
            "configuration; the suite was renamed)") in out["summary"].replace("\\", "")
    out = run_cli(tmp_path, monkeypatch, capsys, ["gate", "--accept-other-tree", "v0.2.0", "--against", "v0.1.0",
                                                  "--perf", "--reports", str(tmp_path)])
    blocked(out, 1)
    assert "cpu-smol/perf decode_step_ms regression" in out["last"]
    assert "paired with the baseline's cpu-smol/bb" in out["summary"]
    n = notes_of(tmp_path, monkeypatch, capsys, "v0.2.0")  # the automatic baseline
    notes_blocked(n, 1)
    assert "paired gsm8k vs v0.1.0" in n["opening"] and "perf decode_step_ms" in n["opening"]


def test_a_rename_that_cannot_be_told_is_refused_with_both_names(tmp_path, monkeypatch, capsys):
    _renamed(tmp_path, ("gsm8k-cot", "gsm8k-8shot"))
    out = run_cli(tmp_path, monkeypatch, capsys, ["gate", "--accept-other-tree", "v0.2.0", "--against", "v0.1.0",
                                                  "--reports", str(tmp_path)])
    blocked(out, 2)
    assert ("cpu-smol/gsm8k: the baseline has no record of this name, and which of its suites of kind 'gsm8k' on "
            "cpu-smol (gsm8k-8shot, gsm8k-cot) the candidate's (gsm8k) were renamed from cannot be told") in \
        out["console"].replace("\n", "")
    n = notes_of(tmp_path, monkeypatch, capsys, "v0.2.0", "v0.1.0")
    notes_blocked(n, 1)  # the performance gate's finding (bb -> betterbench) and the refused pair, named
    assert "could not be made" not in n["opening"] and "perf decode_step_ms" in n["opening"]


# --- one comparability rule ---------------------------------------------------------------------------------


def _slower_elsewhere(tmp_path, change):
    """The candidate's decode step 40 % slower, its record changed by ``change(base, cand)``."""
    b, c = bench("v0.1.0", 38.0, 1), bench("v0.2.0", 38.0 * 1.4, 2)
    for r in (b, c):
        r.config_snapshot = {"server": {"max_num_seqs": 8, "max_model_len": 4096, "dtype": "bfloat16",
                                        "extra_args": []}, "env": {"VLLM_CPU_KVCACHE_SPACE": "2"}}
    change(b, c)
    save(tmp_path, b, c)


def _machines(b, c):
    b.versions["cpu"], b.hardware["power"] = "AMD EPYC 7B13, 2 cores", "210 W"
    c.versions["cpu"], c.hardware["power"] = "AMD EPYC 9654, 96 cores", None


def _fp8(b, c):
    c.config_snapshot["server"]["extra_args"] = ["--kv-cache-dtype", "fp8"]


def _env(b, c):
    c.config_snapshot["env"]["VLLM_CPU_KVCACHE_SPACE"] = "8"


def _seed(b, c):
    b.params["seed"], c.params["seed"] = 0, 1


@pytest.mark.parametrize("change, why", [
    (_machines, "the hardware differs (power: '210 W' vs None); the machine differs (cpu: 'AMD EPYC 7B13, 2 "
                "cores' vs 'AMD EPYC 9654, 96 cores')"),
    (_fp8, "the configuration's settings as run differ (server.extra_args: [] vs ['--kv-cache-dtype', 'fp8'])"),
    (_env, "the configuration's settings as run differ (env.VLLM_CPU_KVCACHE_SPACE: '2' vs '8')"),
    (_seed, "suite parameters differ (seed: 0 vs 1)"),
])
def test_a_pair_of_other_machines_or_settings_is_refused_and_drawn_nowhere(tmp_path, monkeypatch, capsys, change, why):
    """A 2-core EPYC capped at 210 W against a 96-core one, uncapped; --kv-cache-dtype fp8 in the candidate's
    extra args; another KV cache size: gate --perf exited 0 over a 40 % slower step (only hardware kind, GPU
    count and four server settings were compared)."""
    _slower_elsewhere(tmp_path, change)
    out = run_cli(tmp_path, monkeypatch, capsys, ["gate", "--accept-other-tree", "v0.2.0", "--against", "v0.1.0",
                                                  "--perf", "--reports", str(tmp_path)])
    blocked(out, 2)
    assert f"cpu-smol/betterbench: cannot compare: {why}" in out["console"].replace("\n", "")
    n = notes_of(tmp_path, monkeypatch, capsys, "v0.2.0", "v0.1.0")
    notes_blocked(n, 2)
    assert f"betterbench: not compared with v0.1.0's record: {why}" in n["notes"].replace("\\", "")
    assert "->" not in n["notes"].split("\n")[0]  # the title compares nothing


def test_another_model_or_dtype_never_pairs_in_the_eval_gate(tmp_path, monkeypatch, capsys):
    """SmolLM2-360M in float32 against 135M in bf16: the paired gate said PASS everywhere."""
    b, c = eval_record("v0.1.0", BASE), eval_record("v0.2.0", BASE)
    for r, model, dtype in ((b, "SmolLM2-135M-Instruct.Q4_1.gguf", "bfloat16"),
                            (c, "SmolLM2-360M-Instruct.Q4_1.gguf", "float32")):
        r.model = model
        r.config_snapshot = {"server": {"max_num_seqs": 8, "dtype": dtype}, "model": {"path": model}}
    save(tmp_path, b, c)
    out = run_cli(tmp_path, monkeypatch, capsys, ["gate", "--accept-other-tree", "v0.2.0", "--against", "v0.1.0",
                                                  "--reports", str(tmp_path)])
    blocked(out, 2)
    con = out["console"].replace("\n", "")
    assert "the model differs ('SmolLM2-135M-Instruct.Q4_1.gguf' vs 'SmolLM2-360M-Instruct.Q4_1.gguf')" in con
    assert "server.dtype: 'bfloat16' vs 'float32'" in con
    n = notes_of(tmp_path, monkeypatch, capsys, "v0.2.0", "v0.1.0")
    notes_blocked(n, 2)
    assert "paired gsm8k vs v0.1.0" in n["opening"]


@pytest.mark.parametrize("spoil", ["gate", "rows"])
def test_a_baseline_the_gate_refused_is_compared_and_drawn_nowhere(tmp_path, monkeypatch, capsys, spoil):
    """A malformed stored perf_gate, or no per-pass rows: the gate refused the baseline, and the title and the
    Numbers table compared it all the same."""
    b, c = bench("v0.1.0", 38.0, 1), bench("v0.2.0", 30.0, 2)
    if spoil == "gate":
        b.perf_gate = {"thresholds_pct": {"decode_step_ms": -3}}
    else:
        b.metrics["per_pass"] = []
    save(tmp_path, b, c)
    out = run_cli(tmp_path, monkeypatch, capsys, ["gate", "--accept-other-tree", "v0.2.0", "--against", "v0.1.0",
                                                  "--perf", "--reports", str(tmp_path)])
    blocked(out, 2)
    n = notes_of(tmp_path, monkeypatch, capsys, "v0.2.0", "v0.1.0")
    notes_blocked(n, 2)
    assert "->" not in n["notes"].split("\n")[0]
    row = next(x for x in n["notes"].splitlines() if x.startswith("| decode step p50 (BetterBench) |"))
    assert row.startswith("| decode step p50 (BetterBench) | – |"), row
    assert "betterbench: not compared with v0.1.0's record:" in n["notes"]


# --- records re-derived on read ---------------------------------------------------------------------------------


def test_items_flagged_right_against_their_output_are_never_passed(tmp_path, monkeypatch, capsys):
    """The 50 questions the candidate lost, flagged correct: true while their answer is "-1" for an expected
    "10" (and so on): every output passed."""
    c = eval_record("v0.2.0", LOST_50)
    for i in range(50):
        c.items[i].correct = True
    save(tmp_path, eval_record("v0.1.0", BASE), c)
    out = run_cli(tmp_path, monkeypatch, capsys, ["gate", "--accept-other-tree", "v0.2.0", "--against", "v0.1.0",
                                                  "--reports", str(tmp_path)])
    blocked(out, 2)
    assert ("50 of its 200 items are not judged as their outputs give: test-0 says right with answer '-1'; its "
            "output gives '-1' for the expected '10'") in out["console"].replace("\n", "")
    n = notes_of(tmp_path, monkeypatch, capsys, "v0.2.0", "v0.1.0")
    notes_blocked(n, 2)
    assert "cpu-smol / gsm8k" in n["opening"]
    assert "cpu-smol / gsm8k: pass" not in n["notes"].split("## Checked")[1].split("##")[0]


def test_metrics_that_are_not_the_items_counts_are_never_passed(tmp_path, monkeypatch, capsys):
    """Items say 150 of 200, metrics 100 (50 %): the gate passed while the notes' title read 50 %."""
    b, c = eval_record("v0.1.0", BASE), eval_record("v0.2.0", BASE)
    for r, k in ((b, 150), (c, 100)):
        r.metrics = {"n": 200, "errors": 0, "primary": "strict", "correct": k, "accuracy": k / 200}
    save(tmp_path, b, c)
    out = run_cli(tmp_path, monkeypatch, capsys, ["gate", "--accept-other-tree", "v0.2.0", "--against", "v0.1.0",
                                                  "--reports", str(tmp_path)])
    blocked(out, 2)
    assert "its metrics are not its items' counts: correct = 100, its items give 150; accuracy = 0.5, its items give " \
           "0.75" in out["console"].replace("\n", "")
    n = notes_of(tmp_path, monkeypatch, capsys, "v0.2.0", "v0.1.0")
    notes_blocked(n, 2)
    assert "50.0" not in n["notes"].split("\n")[0] and "50.00%" not in n["notes"]  # shown nowhere, title included
    assert "share gate gsm8k" not in n["notes"]  # said once per gate that would judge it, not by the share gates


def _soak(release, slope_mib_min=40.0, said_slope=None, status="pass"):
    """A soak record of 10 minutes sampled every 10 s, the server's memory growing ``slope_mib_min`` MiB/min,
    its stored slope ``said_slope`` (default: the true one) and verdict ``status``."""
    from tests.validate.test_records_render import rec

    samples = [[float(t), {"server_rss": 1000.0 + slope_mib_min * t / 60}] for t in range(0, 600, 10)]
    said = slope_mib_min if said_slope is None else said_slope
    r = rec("cpu-smol", "soak", status=status, metrics={
        "clients": 4, "duration_s": 600.0, "served": 900, "errors": 0, "prompt_tok_s": 100.0, "output_tok_s": 50.0,
        "prompt_tokens_range": [100, 400], "memory": {"server_rss": {
            "peak": samples[-1][1]["server_rss"], "first": 1000.0, "last": samples[-1][1]["server_rss"],
            "slope_mib_per_min": said, "total": None, "flat": said <= 32.0, "below_total": True}},
        "memory_backends": ["psutil"], "max_slope_mib_per_min": 32.0, "samples": samples,
        "memory_samples_in_life": len(samples)})
    r.release, r.params = release, {"max_slope_mib_per_min": 32.0, "slope_skip_fraction": 0.5}
    return r


@pytest.mark.parametrize("edit", ["verdict", "verdict and slope"])
def test_a_soak_whose_verdict_was_edited_to_pass_is_never_checked(tmp_path, monkeypatch, capsys, edit):
    """A soak that leaked 40 MiB/min, its verdict edited from fail to pass (and its slope to 2 MiB/min): render
    listed it under "Checked" and release --resume reused it (the release's verdict reads its records through
    the same audit)."""
    from validate.runners.soak import audit

    r = _soak("v0.2.0", said_slope=None if edit == "verdict" else 2.0)
    assert audit(_soak("v0.2.0", 1.0), None) == []  # a flat soak stands on its samples
    save(tmp_path, r)
    out = outputs(tmp_path, "v0.2.0")
    agree(out)
    assert out["code"] == 2
    chk = next(c for c in out["verdict"].checks if c.name == "soak")
    assert chk.outcome == "not-checked" and chk.status == "audit-failed"
    assert "the record says pass, but its memory series and counts give: memory not flat: server_rss grows 40.0 " \
           "MiB/min > 32.0" in chk.message
    if edit != "verdict":
        assert "memory.server_rss.slope_mib_per_min = 2.0, its samples give 40.0" in chk.message
    n = notes_of(tmp_path, monkeypatch, capsys, "v0.2.0", "none")
    notes_blocked(n, 2)
    assert "cpu-smol / soak" in n["opening"]
    assert "cpu-smol / soak" not in n["notes"].split("## Checked")[1].split("##")[0]


@pytest.mark.timeout(240)
def test_resume_runs_again_a_record_that_does_not_stand_on_its_items(scratch, tmp_path, monkeypatch, capsys):
    """A GSM8K record whose count was edited after the run: release --resume kept it and its verdict; it is said,
    not kept, and run again."""
    import json

    from tests.conftest import tiny_gsm8k
    from validate.record import record_path

    scratch.config("fake-ok")
    cl = scratch.root / "suites" / "release.yaml"
    cl.write_text(cl.read_text().replace("- suite: fake-sanity", "- suite: fake-sanity\n- suite: gsm8k"))
    monkeypatch.setenv("R9K_DATA_DIR", str(tiny_gsm8k(tmp_path / "data")))
    args = ["release", "ra", "--config", "fake-ok", "--suite", "gsm8k", "--profile", "quick", "--baseline", "none"]
    main(args)
    p = record_path(scratch.root / "reports", "ra", "fake-ok", "gsm8k")
    data = json.loads(p.read_text())
    data["metrics"]["correct"] += 1
    p.write_text(json.dumps(data))
    capsys.readouterr()
    main(args + ["--resume"])
    out = " ".join(capsys.readouterr().out.split())
    assert "fake-ok/gsm8k: the record found is not kept (--resume): it does not stand on what it holds: its metrics " \
           "are not its items' counts: correct =" in out
    assert "gsm8k: complete record found" not in out
    assert json.loads(p.read_text())["metrics"]["correct"] == data["metrics"]["correct"] - 1  # run again


def test_a_soak_cut_short_on_paper_or_items_failed_under_a_pass_do_not_stand():
    """Attacks on the audits themselves: memory_samples_in_life set to 0 (no series left to fit), a series left
    out of the samples, and a GSM8K pass whose items failed to run (the runner makes that an error)."""
    from validate.runners.gsm8k import audit as gsm_audit
    from validate.runners.soak import audit as soak_audit

    r = _soak("v0.2.0", said_slope=2.0)
    r.metrics["memory_samples_in_life"] = 0
    got = soak_audit(r, None)
    assert got[0] == "memory_samples_in_life = 0 of 60 samples, and the server did not die"
    assert any("memory not flat: server_rss grows 40.0 MiB/min > 32.0" in x for x in got)
    r = _soak("v0.2.0", 1.0)
    for _, row in r.metrics["samples"]:
        row["gpu0"] = row.pop("server_rss")
    assert "its memory holds server_rss, which its samples of the server's life do not" in soak_audit(r, None)
    e = eval_record("v0.2.0", BASE, errors=range(150, 200))
    e.metrics = {"n": 200, "errors": 50, "correct": 150, "accuracy": 0.75}
    assert gsm_audit(e, None) == ["the record says pass, but 50 of its items failed to run"]


def test_r9k_against_stock_on_one_configuration_pairs_and_other_env_does_not():
    """The plugin's knobs (env.R9K_*) may differ between the records compared (``--knobs stock`` against the
    configuration's knobs is the pair the GPU serve gates); any other environment entry must match."""
    from validate.config import find_config, with_stock_knobs
    from validate.pairing import apart

    cfg = find_config(Path(__file__).resolve().parents[2], "h200-next")
    base, cand = bench("stock", 38.0, 1), bench("r9k", 38.0, 2)
    base.config_snapshot = with_stock_knobs(cfg).model_dump(mode="json")
    cand.config_snapshot = cfg.model_dump(mode="json")
    assert base.config_snapshot["env"] != cand.config_snapshot["env"]
    assert apart(base, cand) == []
    cand.config_snapshot["env"]["VLLM_ATTENTION_BACKEND"] = "FLASH_ATTN"
    [why] = apart(base, cand)
    assert why.startswith("the configuration's settings as run differ (env.VLLM_ATTENTION_BACKEND: None vs")


def test_a_gate_stopped_by_bad_input_ends_with_its_exit_line(tmp_path, monkeypatch, capsys):
    """A configuration the candidate does not hold stops the gate on bad input: JUnit and the summary said NOT
    CHECKED, and the console's last line was the error, not the exit status that every other end prints."""
    save(tmp_path, bench("v0.1.0", 38.0, 1), bench("v0.2.0", 38.0, 2))
    out = run_cli(tmp_path, monkeypatch, capsys, ["gate", "--accept-other-tree", "v0.2.0", "--against", "v0.1.0",
                                                  "--perf", "--config", "nope", "--reports", str(tmp_path)])
    assert out["code"] == 2 and out["last"].startswith("exit status 2: bad input: ")
    assert out["head"].startswith("**NOT CHECKED**")


# --- every kind re-derived on read; the rules' bounds are the suite file's ------------------------------------


def _sanity(release, right_alone=12, flagged_bad=0, said_bad=0):
    """A strict-sanity record of 12 prompts as the runner writes it (solo, then 16 answers under load: twice
    max_num_seqs 8, the default overload), the server
    right alone on ``right_alone`` of them, ``flagged_bad`` loaded answers wrong and flagged, metrics saying
    ``said_bad`` bad, verdict pass."""
    from tests.validate.test_records_render import rec
    from validate.record import Item

    r = rec("cpu-smol", "sanity", metrics={})
    r.release, r.suite_kind, r.params = release, "strict-sanity", {}
    gen = {"max_tokens": 48, "temperature": 0.0}
    for i in range(12):
        r.items.append(Item(id=f"q{i}/solo", prompt_hash=f"h{i}", condition="solo", gen=gen, expected=str(i + 10),
                            output=f"The answer is {i + 10 if i < right_alone else 99}.", correct=i < right_alone))
    for k in range(16):
        i, wrong = k % 12, k < flagged_bad
        it = Item(id=f"q{i}/x2/r0/{k}", prompt_hash=f"h{i}", condition="overload x2 (16 requests, max_num_seqs 8)",
                  gen=gen, expected=str(i + 10), output=f"The answer is {i + 10 if i < right_alone and not wrong else 99}.",
                  correct=i < right_alone and not wrong, identical_to_solo=not wrong)
        if wrong:
            it.bad = "right solo, wrong under load"
        r.items.append(it)
    r.metrics = {"n": 16, "bad": said_bad, "divergent": flagged_bad, "errors": 0, "solo_right": right_alone,
                 "prompts": 12, "solo_wrong": [f"q{i}" for i in range(right_alone, 12)], "solo_bad": 0,
                 "solo_right_share": round(right_alone / 12, 6), "min_solo_right_share": 1.0, "conditions": {},
                 "max_num_seqs": 8}
    return r


def test_a_sanity_record_edited_to_pass_is_never_checked(tmp_path):
    """3 of 12 prompts right alone (the runner wrote fail), only the verdict edited to pass; and 6 answers under
    load flagged bad while the metrics say 0: render listed both under Checked and --resume reused them."""
    from validate.runners.sanity import audit

    assert audit(_sanity("v0.2.0"), None) == []  # a clean record stands on its answers
    assert audit(_sanity("v0.2.0", right_alone=3), None) == [
        "the record says pass, but its items give 0 bad answers, 0 failed requests and 3 of 12 prompts right alone "
        "(min_solo_right_share 1 asks 12)"]
    assert audit(_sanity("v0.2.0", flagged_bad=6), None) == [
        "its metrics are not its items' counts: bad = 0, its items give 6",
        "the record says pass, but its items give 6 bad answers, 0 failed requests and 12 of 12 prompts right alone "
        "(min_solo_right_share 1 asks 12)"]
    save(tmp_path, _sanity("v0.2.0", flagged_bad=6))
    out = outputs(tmp_path, "v0.2.0", baseline="none")
    agree(out)
    chk = next(c for c in out["verdict"].checks if c.name == "sanity")
    assert out["code"] == 2 and chk.status == "audit-failed"
    assert "cpu-smol / sanity: pass" not in out["notes"].split("## Checked")[1].split("##")[0]


def test_humaneval_and_pytest_records_stand_on_their_items():
    """HumanEval items whose judge said failed, flagged correct; a pytest record whose 3 failed tests were dropped
    (57 of 57 passed, pytest's exit status still 1): both passed every output."""
    from tests.validate.test_records_render import rec
    from validate.record import Item
    from validate.runners.humaneval import audit as he_audit
    from validate.runners.pytest_suite import audit as py_audit

    he = rec("cpu-smol", "humaneval", metrics={})
    he.items = [Item(id=f"HumanEval/{i}", prompt_hash=f"q{i}", output="x", status="failed", correct=i < 50)
                for i in range(100)]
    he.metrics = {"n": 100, "correct": 50, "accuracy": 0.5, "passed": 50, "failed": 50, "timeout": 0, "error": 0,
                  "infra": 0, "request_errors": 0}
    got = he_audit(he, None)
    assert got[0].startswith("50 of its 100 items are not judged as their outcomes give: HumanEval/0 says True with "
                             "the outcome 'failed'")
    assert got[1] == ("its metrics are not its items' counts: correct = 50, its items give 0; accuracy = 0.5, its "
                      "items give 0.0; passed = 50, its items give 0; failed = 50, its items give 100")
    py = rec("cpu-smol", "unit-gates", metrics={})
    py.items = [Item(id=f"t{i}", prompt_hash=f"t{i}", outcome="passed", correct=True) for i in range(57)]
    py.metrics = {"tests": 57, "passed": 57, "failed": 0, "error": 0, "skipped": 0, "exit_status": 1, "paths": []}
    assert py_audit(py, None) == ["the record says pass, but 0 of its tests failed, 0 errored, 57 ran, and pytest "
                                  "exited with status 1"]
    py.metrics["exit_status"] = 0
    assert py_audit(py, None) == []


def test_gsm8k_sides_judged_by_other_answers_never_pair():
    """The candidate's expected answers for the 50 questions it lost rewritten to its own answers: each side stood
    on its own items and the gate passed. The extraction is the params' (the metrics only repeat it)."""
    from validate.compare import PairingError, pair
    from validate.runners.gsm8k import audit

    c = eval_record("v0.2.0", LOST_50)
    for i in range(50):
        c.items[i].expected, c.items[i].correct = "-1", True
    c.metrics = {"n": 200, "errors": 0, "correct": 150, "accuracy": 0.75}
    assert audit(c, None) == []  # it stands on its own items ...
    with pytest.raises(PairingError, match=r"expected answers differ on 50 of 200 questions \(first: test-0, '10' vs "
                                           r"'-1'\)"):
        pair(eval_record("v0.1.0", BASE), c)  # ... and is judged by other answers than the baseline
    c = eval_record("v0.2.0", BASE)
    c.metrics = {"primary": "flexible"}
    assert audit(c, None) == ["its metrics say the primary extraction is 'flexible', its params 'strict'"]


def test_a_betterbench_summary_that_is_not_its_passes_is_shown_nowhere(tmp_path):
    """The candidate's passes 40 % slower, its summary a copy of the baseline's: the gate found the regression, the
    Numbers table and the title showed the baseline's figure for both. A record that does not stand is refused
    by every gate (exit 2, naming why) and drawn nowhere."""
    from validate.runners.betterbench import audit

    b, c = bench("v0.1.0", 38.0, 1), bench("v0.2.0", 38.0 * 1.4, 2)
    assert audit(b, None) == []
    c.metrics["summary"] = b.metrics["summary"]
    [why] = audit(c, None)
    assert why.startswith(f"its summary is not its passes': summary.decode_step_ms.median = "
                          f"{b.metrics['summary']['decode_step_ms']['median']}, its items give")
    save(tmp_path, b, c)
    out = outputs(tmp_path, "v0.2.0")
    agree(out)
    assert out["code"] == 2  # refused, never paired: the one audit decides for every reader
    perf = next(c for c in out["verdict"].checks if c.name == "perf betterbench")
    assert perf.outcome == "not-checked" and "the candidate's record does not stand on what it holds: its summary " \
        "is not its passes'" in perf.message
    assert "| decode step p50 (BetterBench) |" not in out["notes"]  # and the forged summary drawn nowhere


def test_aggregate_throughput_under_load_is_gated(tmp_path):
    """A scheduler that serialises requests: aggregate tok/s at concurrency 8 down 82 %, each stream faster (so
    combined decode rises). No threshold covered c<N>_tok_s, and gate --perf passed."""
    from tests.conftest import REPO
    from tests.validate.test_perfgate import passes
    from validate.perfgate import compare_perf
    from validate.suite import perf_gate_specs

    spec = perf_gate_specs(REPO)["betterbench"]
    assert (spec.threshold("c8_tok_s"), spec.threshold("c16_ttft_ms_p50"), spec.threshold("combined_decode_tok_s"),
            spec.threshold("prefill_2048_tok_s")) == (5, 10, 3, 5)
    b, c = bench("v0.1.0", 38.0, 1), bench("v0.2.0", 38.0, 2)
    for r, rate, seed in ((b, 145.3, 3), (c, 26.0, 4)):
        for row, v in zip(r.metrics["per_pass"], passes(20, rate, 0.01, seed)):
            row["c8_tok_s"] = v
    save(tmp_path, b, c)
    cmp = compare_perf(tmp_path, "v0.2.0", "v0.1.0", perf_gate_specs(REPO))
    f = next(x for x in cmp.figures if x.figure == "c8_tok_s")
    assert f.regression and f.mark.startswith("slower")


def test_the_automatic_baseline_names_a_newer_record_it_skipped(tmp_path):
    """v0.3.3 (the newest) holds GSM8K only; v0.3.2 holds GSM8K and BetterBench, so it was chosen, and the
    candidate's GSM8K, 25 points below v0.3.3's, was compared with v0.3.2's (as low): exit 0."""
    from validate.compare import held_elsewhere, previous_release

    save(tmp_path, eval_record("v0.3.2", LOST_50), bench("v0.3.2", 38.0, 1), eval_record("v0.3.3", BASE))
    save(tmp_path, eval_record("v0.3.4", LOST_50), bench("v0.3.4", 38.0, 2))
    want = {("cpu-smol", "gsm8k"), ("cpu-smol", "betterbench")}
    assert previous_release(tmp_path, "v0.3.4", want) == "v0.3.2"
    assert held_elsewhere(tmp_path, "v0.3.4", "v0.3.2", want) == {("cpu-smol", "gsm8k"): ("v0.3.3", True)}
    out = outputs(tmp_path, "v0.3.4")
    agree(out)
    chk = next(c for c in out["verdict"].checks if c.name == "baseline of gsm8k")
    assert out["code"] == 2 and chk.outcome == "not-checked"
    assert "the baseline v0.3.2 holds an older record of it than v0.3.3" in chk.message


def test_a_record_of_this_engine_with_other_params_than_its_suite_file_is_not_checked():
    """A soak that leaked 40 MiB/min with its own slope bound edited to 4096 (and the verdict re-derived at that
    bound): the audit judged it by the bound it held."""
    from tests.conftest import REPO
    from validate.provenance_checks import current_tree
    from validate.verdict import reapply_gates

    r = _soak("v0.2.0", said_slope=40.0)
    r.tree = current_tree(REPO)
    r.params = {"max_slope_mib_per_min": 4096.0}
    [r] = reapply_gates([r], REPO)
    assert r.gate_mismatch.startswith("its params differ from the checkout's suite file's for its profile "
                                      "(max_slope_mib_per_min: 4096.0 vs ")
    r.tree.engine_hash = "another"  # another engine's record: its suite files were its own (it is other-tree)
    r.gate_mismatch = None
    assert reapply_gates([r], REPO)[0].gate_mismatch is None


def test_what_was_left_out_of_a_record_or_a_release_is_not_passed_over(tmp_path):
    """A soak whose slope bound was deleted from its params (and raised in its metrics); a sanity record with one
    bad answer under load deleted and its counts recounted; a newer release whose record cannot be read, passed over
    for an older baseline as low as the candidate. Each passed."""
    from validate.runners.sanity import audit as sanity_audit
    from validate.runners.soak import audit as soak_audit

    r = _soak("v0.2.0")
    r.params, r.metrics["max_slope_mib_per_min"] = {}, 4096.0
    r.metrics["memory"]["server_rss"]["flat"] = True
    got = soak_audit(r, None)
    assert got[0] == "its metrics' bound 4096.0 MiB/min is not its params' 32.0"
    assert any("memory not flat: server_rss grows 40.0 MiB/min > 32.0" in x for x in got)
    s = _sanity("v0.2.0", flagged_bad=1)
    s.config_snapshot = {"server": {"max_num_seqs": 8, "max_model_len": 4096}}
    assert sanity_audit(s, None)[0] == "its metrics are not its items' counts: bad = 0, its items give 1"
    del s.items[12]  # the bad answer, and the counts with it
    s.metrics.update(n=15, bad=0, divergent=0)
    assert sanity_audit(s, None) == ["its answers under load are not the runner's batches: 16 planned for 12 prompts "
                                     "at these params, it holds 15 (first apart: q0/x2/r0/0)"]
    save(tmp_path, eval_record("v0.3.2", LOST_50), eval_record("v0.3.3", BASE), eval_record("v0.3.4", LOST_50))
    (tmp_path / "v0.3.3" / "cpu-smol" / "gsm8k.json").write_text("{ truncated")
    out = outputs(tmp_path, "v0.3.4")
    agree(out)
    assert out["code"] == 2 and out["verdict"].baseline == "v0.3.2"
    assert any("v0.3.3, newer than the baseline v0.3.2, holds a file that is no readable record" in c.message
               for c in out["verdict"].checks)


def test_two_folders_of_one_version_are_named_not_chosen_between(tmp_path):
    """v0.3.2 (as low as the candidate) and v0.3.2.0 (the same version, 25 points higher): the automatic choice
    among equals took one of them by folder name, so the candidate's drop against the other passed unseen."""
    from validate.compare import previous_release, same_version

    save(tmp_path, eval_record("v0.3.2", BASE), eval_record("v0.3.2.0", LOST_50), eval_record("v0.3.4", LOST_50))
    want = {("cpu-smol", "gsm8k")}
    assert previous_release(tmp_path, "v0.3.4", want) == "v0.3.2.0"
    assert same_version(tmp_path, "v0.3.4", "v0.3.2.0", want) == ["v0.3.2"]
    assert same_version(tmp_path, "v0.3.4", "v0.3.2", want) == ["v0.3.2.0"]
    out = outputs(tmp_path, "v0.3.4")
    agree(out)
    assert out["code"] == 2 and out["verdict"].baseline == "v0.3.2.0"
    assert any("v0.3.2 and the baseline v0.3.2.0 name one version" in c.message for c in out["verdict"].checks)
    named = outputs(tmp_path, "v0.3.4", baseline="v0.3.2")
    assert named["code"] == 1  # named with --baseline: the drop is gated, and nothing is ambiguous
    (tmp_path / "v0.3.2.0" / "cpu-smol" / "gsm8k.json").unlink()  # a twin that holds nothing raises no doubt
    assert same_version(tmp_path, "v0.3.4", "v0.3.2", want) == []
    assert outputs(tmp_path, "v0.3.4")["code"] == 1
    (tmp_path / "v0.3.2.0" / "cpu-smol").rmdir()
    (tmp_path / "v0.3.2.0").rmdir()
    (tmp_path / "0.3.2").symlink_to("v0.3.2")  # another name of the very same folder: no doubt either
    assert same_version(tmp_path, "v0.3.4", previous_release(tmp_path, "v0.3.4", want), want) == []
    assert outputs(tmp_path, "v0.3.4")["code"] == 1

"""Pairing, the paired table and the gate's exit codes, on records built from known outcomes."""
from __future__ import annotations

import pytest
from scipy.stats import binomtest

from tests.validate.test_records_render import rec
from validate.cli import main
from validate.compare import PairingError, compare_releases, pair, previous_release, resolve_baseline
from validate.record import Dataset, Item, record_path, write_record

N = 200


def eval_record(release, right: set[int], *, config="cpu-smol", suite="gsm8k", subset=False, prompt_salt="",
                max_tokens=384, outputs=None, errors=()):
    r = rec(config, suite, metrics={"n": N})
    r.release, r.suite_kind = release, suite
    r.started_at = stamp(release)  # each release its own run: a record equal in every field but the name is a copy
    r.params = {"primary": "strict"}
    r.dataset = Dataset(name="gsm8k-test", sha256="d" * 64, n_total=1319, n_used=N, subset=subset, seed=1 if subset else None)
    r.items = [Item(id=f"test-{i}", prompt_hash=f"h{i}{prompt_salt if i == 7 else ''}", gen={"max_tokens": max_tokens},
                    output=(outputs or {}).get(i, f"answer {i}"), correct=i in right, error="HTTP 500" if i in errors else None)
               for i in range(N)]
    if "gsm8k" in suite and outputs is None:  # as the runner writes them: the audit judges each item again
        for i, item in enumerate(r.items):
            item.expected = str(i + 10)
            if item.error is None:
                item.answer = item.expected if item.correct else "-1"
                item.output = f"So the answer is 7 + {i + 3}.\n#### {item.answer}"
    return r


def stamp(release: str) -> str:
    """A start time of its own for each release's run (an ISO time from the name's CRC-32)."""
    import zlib

    t = zlib.crc32(release.encode()) % 86400
    return f"2026-01-01T{t // 3600:02d}:{t // 60 % 60:02d}:{t % 60:02d}+00:00"


def save(tmp_path, *records):
    for r in records:
        write_record(record_path(tmp_path, r.release, r.config, r.suite), r)


def test_pair_counts_and_exact_p():
    base_right = set(range(0, 120))                      # 120 right
    cand_right = (base_right - set(range(0, 14))) | set(range(120, 136))  # loses 14, gains 16
    t = pair(eval_record("v1", base_right, outputs={}), eval_record("v2", cand_right, outputs={i: f"other {i}" for i in range(50)}))
    assert (t.n, t.b, t.c, t.correct_baseline, t.correct_candidate) == (N, 14, 16, 120, 122)
    assert t.lost == [f"test-{i}" for i in sorted(range(14), key=lambda i: f"test-{i}")]
    assert round(t.p_two_sided, 2) == 0.86  # the seeds' v0.3.0 table: 14 vs 16, p = 0.86
    assert t.p_one_sided == pytest.approx(binomtest(14, 30, 0.5, alternative="greater").pvalue)
    assert t.identical == N - 50 and t.identical_share == pytest.approx(0.75)


def test_unpairable_prompts_and_params():
    with pytest.raises(PairingError) as e:
        pair(eval_record("v1", set()), eval_record("v2", set(), prompt_salt="x", max_tokens=256))
    msg = str(e.value)
    assert "prompts differ on 1 of 200 questions (first: test-7)" in msg
    assert "generation parameters differ (max_tokens: 384 vs 256)" in msg


def test_subset_never_pairs_with_full():
    with pytest.raises(PairingError, match="the candidate is a subset .* a subset never pairs with a full-set record"):
        pair(eval_record("v1", set()), eval_record("v2", set(), subset=True))


def test_errors_are_never_wrong_answers():
    with pytest.raises(PairingError, match="1 questions failed to run"):
        pair(eval_record("v1", set()), eval_record("v2", set(), errors=(3,)))


def test_gate_exit_codes_follow_p(tmp_path, capsys):
    base = set(range(100))
    save(tmp_path, eval_record("v0.1.0", base))
    save(tmp_path, eval_record("v0.2.0", base - set(range(3)) | {150}))          # 3 lost, 1 gained: p > 0.05
    save(tmp_path, eval_record("v0.3.0", base - set(range(30)) | {150, 151}))    # 30 lost, 2 gained
    assert main(["gate", "--accept-other-tree", "v0.2.0", "--against", "v0.1.0", "--reports", str(tmp_path)]) == 0
    assert main(["gate", "--accept-other-tree", "v0.3.0", "--against", "v0.1.0", "--reports", str(tmp_path)]) == 1
    out = capsys.readouterr().out
    assert "gate: cpu-smol/gsm8k regressed: 30 lost vs 2 gained" in out
    assert "right only in v0.1.0: test-0, test-1," in out


def test_gate_refuses_unpairable(tmp_path, capsys):
    save(tmp_path, eval_record("v1", set()), eval_record("v2", set(), subset=True))
    assert main(["gate", "--accept-other-tree", "v2", "--against", "v1", "--reports", str(tmp_path)]) == 2
    assert "a subset never pairs with a full-set record" in capsys.readouterr().out.replace("\n", "")


def test_against_config_and_holm(tmp_path):
    base = set(range(100))
    save(tmp_path, eval_record("exp", base, config="cpu-smol"),
         eval_record("exp", base - set(range(10)), config="cpu-smol-fp32"))
    cmp = compare_releases(tmp_path, "exp", "exp", configs=["cpu-smol-fp32"], against_config="cpu-smol")
    [t] = cmp.tasks
    assert (t.config, t.baseline_config, t.b, t.c) == ("cpu-smol-fp32", "cpu-smol", 10, 0)
    assert t.p_holm == pytest.approx(t.p_one_sided)  # one task: Holm leaves it as is
    assert t.regression and t.p_one_sided == pytest.approx(0.5 ** 10)


def test_previous_release(tmp_path):
    for d in ("v0.2.9", "v0.3.2", "v0.3.10", "dev"):
        save(tmp_path, eval_record(d, set()))
    assert previous_release(tmp_path, "v0.3.3") == "v0.3.2"
    assert previous_release(tmp_path, "v0.3.11") == "v0.3.10"
    assert previous_release(tmp_path, "v0.1.0") is None
    # an aborted run in between (a sanity record only) is no baseline; a file that is no record may be one
    s = rec("cpu-smol", "sanity")
    s.release = "v0.3.2.post1"
    save(tmp_path, s)
    assert previous_release(tmp_path, "v0.3.3") == "v0.3.2"
    (tmp_path / "v0.3.2.post1" / "cpu-smol" / "gsm8k.json").write_text('{"truncated')
    assert previous_release(tmp_path, "v0.3.3") == "v0.3.2.post1"
    assert resolve_baseline(tmp_path, "v0.3.3", "none") is None
    assert resolve_baseline(tmp_path, "v0.3.3", "v0.2.9") == "v0.2.9"


def test_scoring_parameters_must_match_and_ids_be_unique():
    b, c = eval_record("v1", set()), eval_record("v2", set())
    c.params = {"primary": "strict", "concurrency": 64, "workers": 8}
    b.params = {"primary": "strict", "concurrency": 1, "workers": 2}
    with pytest.raises(PairingError, match=r"suite parameters differ \(concurrency: 1 vs 64\)"):
        pair(b, c)
    c = eval_record("v2", set())
    c.items.append(c.items[0])
    with pytest.raises(PairingError, match="the candidate lists question test-0 more than once"):
        pair(eval_record("v1", set()), c)


def test_a_task_missing_from_the_candidate_is_not_a_pass(tmp_path, capsys):
    save(tmp_path, eval_record("v1", set(range(50))), eval_record("v1", set(range(50)), suite="humaneval"),
         eval_record("v2", set(range(50))))
    assert main(["gate", "--accept-other-tree", "v2", "--against", "v1", "--reports", str(tmp_path)]) == 2
    assert "cpu-smol/humaneval: the candidate v2 has no record of it" in capsys.readouterr().out.replace("\n", "")


def test_regression_is_named_even_beside_an_unpairable_task(tmp_path, capsys):
    save(tmp_path, eval_record("v1", set(range(100))), eval_record("v1", set(), suite="humaneval"),
         eval_record("v2", set(range(30, 100))), eval_record("v2", set(), suite="humaneval", subset=True))
    assert main(["gate", "--accept-other-tree", "v2", "--against", "v1", "--reports", str(tmp_path)]) == 1
    out = capsys.readouterr().out.replace("\n", "")
    assert "gate: cpu-smol/gsm8k regressed: 30 lost vs 0 gained" in out and "1 task(s) cannot be paired" in out


def test_alpha_must_be_a_probability(tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        main(["gate", "--accept-other-tree", "v2", "--against", "v1", "--alpha", "5", "--reports", str(tmp_path)])
    assert e.value.code == 2 and "5 is not in (0, 1)" in capsys.readouterr().err


def test_a_small_eval_says_it_could_not_have_detected_a_regression(tmp_path):
    """40 questions (the quick profile's GSM8K subset) with 2 lost and 1 gained: not significant, and the notes
    must say that no regression could have been detected with 80% power, not "no difference"."""
    from validate.compare import attach_sensitivity
    from validate.stats import paired_diff_ci

    n = 40
    base = eval_record("v1", set(range(10)), subset=True)
    cand = eval_record("v2", set(range(2, 11)), subset=True)
    base.items, cand.items = base.items[:n], cand.items[:n]
    t = pair(base, cand)
    attach_sensitivity([t], 0.05)
    assert (t.b, t.c, t.n) == (2, 1, n) and not t.regression
    assert t.min_flaggable_drop == 5  # 0.5^5 = 0.031 <= 0.05 < 0.5^4
    assert t.mdr == float("inf")      # 3 discordant of 40: even all of them lost would not reach 80% power
    ci = paired_diff_ci(8, 2, 1, 29)
    assert t.diff_ci == (ci.lower, ci.upper) and ci.lower < -0.1 < 0.05 < ci.upper
    assert t.verdict_text == "not significant; too few questions to detect a regression"
    assert t.sensitivity == ("could not have detected a regression with 80% power at the observed discordant rate "
                             "(3 of 40); a loss of at least 5 questions (12.5 points) with none gained is the least it can flag")


def test_a_large_eval_states_its_minimum_detectable_regression():
    from validate.compare import attach_sensitivity
    from validate.stats import min_detectable_regression

    base_right = set(range(0, 120))
    cand_right = (base_right - set(range(0, 14))) | set(range(120, 136))
    t = pair(eval_record("v1", base_right), eval_record("v2", cand_right))
    attach_sensitivity([t, t], 0.05)  # two tasks: Holm's first step is alpha / 2
    assert t.min_flaggable_drop == 6
    assert t.mdr == pytest.approx(min_detectable_regression(N, 30 / N, 0.025, 0.8))
    assert 0 < t.mdr < 30 / N and t.verdict_text == "no significant regression"
    assert t.sensitivity.startswith(f"detects a drop of {100 * t.mdr:.1f} points with 80% power")


def test_a_copied_record_cannot_stand_in_for_another(tmp_path, capsys):
    """A copy of a record in another configuration's folder collided with the real one in Holm and hid a
    regression; a copy of the baseline's folder passed as the candidate. Records must lie where they say."""
    import shutil

    base, cand = eval_record("v1", set(range(100))), eval_record("v2", set(range(70)))  # 30 lost, none gained
    save(tmp_path, base, cand)
    assert main(["gate", "--accept-other-tree", "v2", "--against", "v1", "--reports", str(tmp_path)]) == 1
    planted = tmp_path / "v2" / "backup" / "gsm8k.json"
    planted.parent.mkdir()
    shutil.copy(record_path(tmp_path, "v1", "cpu-smol", "gsm8k"), planted)
    assert main(["gate", "--accept-other-tree", "v2", "--against", "v1", "--reports", str(tmp_path)]) == 2
    assert "lies at v2/backup/gsm8k.json: it is not this release's record" in capsys.readouterr().out.replace("\n", " ")
    shutil.rmtree(planted.parent)
    shutil.copytree(tmp_path / "v1", tmp_path / "v3")
    assert main(["gate", "--accept-other-tree", "v3", "--against", "v1", "--reports", str(tmp_path)]) == 2
    assert main(["gate", "--accept-other-tree", "v1", "--against", "v1", "--reports", str(tmp_path)]) == 2
    assert "a release is never its own baseline" in capsys.readouterr().out.replace("\n", " ")


def test_a_baseline_with_fewer_right_answers_than_a_flaggable_loss_detects_nothing():
    """make demo's case: HumanEval 3 of 20 right on both sides, no discordant question, and at least 5 must be
    lost to be flagged: no regression could ever have been flagged, and the verdict must say so."""
    from validate.compare import attach_sensitivity

    base, cand = eval_record("v1", {0, 1, 2}, subset=True), eval_record("v2", {0, 1, 2}, subset=True)
    base.items, cand.items = base.items[:20], cand.items[:20]
    t = pair(base, cand)
    attach_sensitivity([t], 0.05)
    assert (t.b, t.c, t.min_flaggable_drop, t.mdr) == (0, 0, 5, None)
    assert t.verdict_text == "not significant; too few questions to detect a regression"
    assert t.sensitivity == ("no regression could have been flagged: the baseline got 3 of 20 right, fewer than "
                             "the 5 a loss must reach to be flagged")

"""A configuration of random weights is judged by what random weights can show: its answers are noise (garbage,
never right) on both sides of any pair, so right answers and garbage are not judged; batch invariance and identity
with the baseline are, each against the noise floor the baseline's own record shows. A real-weight configuration
keeps every check, and a record edited to claim random weights is refused."""
from __future__ import annotations

import json
import math

import pytest
import yaml
from scipy.stats import norm

from tests.conftest import REPO
from tests.validate.test_compare import eval_record, save, stamp
from tests.validate.test_gate_attacks import notes_of
from tests.validate.test_one_verdict import BASE, LOST_50, agree, outputs
from tests.validate.test_records_render import rec
from validate.cli import main
from tests.validate.served import with_dispatch
from validate.config import ServeConfig, find_config, load_config, record_weights
from validate.errors import InputError
from validate.record import Item, StoredGate, Verdict, record_path

pytestmark = pytest.mark.timeout(180)

NEXT = find_config(REPO, "h200-next")
SMOL = find_config(REPO, "cpu-smol")
GARBAGE = "replacement character in answer"
LOAD = "overload x2 (16 requests, max_num_seqs 8)"


def as_config(r, cfg: ServeConfig):
    """``r`` as the engine writes it for ``cfg``: its snapshot, hash, model and weights."""
    r.config = cfg.name
    r.config_snapshot = cfg.model_dump(mode="json")
    r.config_hash = cfg.digest()
    r.model = cfg.model.source_name()
    r.weights = cfg.model.weights_kind
    return with_dispatch(r, cfg.env)


def sanity(release: str, cfg: ServeConfig, parted=()):
    """A strict-sanity record of ``cfg`` as the runner writes it: 12 prompts answered garbage alone (a replacement
    character: what random weights' byte-fallback tokens read as), then 32 answers under load (overload 2.0 of
    max_num_seqs 8, 2 rounds), those at the indices ``parted`` apart from their solo answer at token 1, each the same
    way in every release. Random weights: garbage recorded, nothing bad, verdict
    pass; trained weights: every answer bad, verdict fail."""
    random = cfg.model.random_weights
    r = as_config(rec(cfg.name, "sanity", metrics={}), cfg)
    r.release, r.suite_kind, r.started_at = release, "strict-sanity", stamp(release)
    r.params = {"overload": [2.0], "rounds": 2}
    r.gate = StoredGate(max={"bad": 0})
    gen = {"max_tokens": 48, "temperature": 0.0}
    flag = "garbage" if random else "bad"
    for i in range(12):
        it = Item(id=f"q{i}/solo", prompt_hash=f"h{i}", condition="solo", gen=gen, expected=str(i + 10),
                  output="\ufffd" + "abcdefghijkl"[i], token_ids=[100 + i, 7], correct=False)
        setattr(it, flag, GARBAGE)
        r.items.append(it)
    for k in range(32):
        rnd, kk = divmod(k, 16)
        i = kk % 12
        last = 8 if k in parted else 7
        it = Item(id=f"q{i}/x2/r{rnd}/{kk}", prompt_hash=f"h{i}", condition=LOAD, gen=gen, expected=str(i + 10),
                  output="\ufffd" + "abcdefghijkl"[i] + ("!" * (last - 7)), token_ids=[100 + i, last], correct=False,
                  identical_to_solo=k not in parted)
        if k in parted:
            it.first_divergent_token = 1
        setattr(it, flag, GARBAGE)
        r.items.append(it)
    r.metrics = {"n": 32, "bad": 0 if random else 44, "divergent": len(parted), "errors": 0, "solo_right": 0,
                 "prompts": 12, "solo_wrong": [f"q{i}" for i in range(12)], "solo_bad": 0 if random else 12,
                 "solo_right_share": 0.0, "min_solo_right_share": 1.0, "conditions": {}, "max_num_seqs": 8}
    if random:
        r.metrics["garbage"] = 44
    else:
        r.verdict = Verdict(status="fail", cause=f"bad answer q0/solo (solo): {GARBAGE}")
    return r


def check(out: dict, config: str, name: str):
    return next(c for c in out["verdict"].checks if c.config == config and c.name == name)


# --- the configuration says what its weights are ------------------------------------------------------------


def test_the_weights_come_from_the_model_source():
    assert NEXT.model.random_weights and find_config(REPO, "h200-next-fp8").model.random_weights
    assert find_config(REPO, "cpu-moe").model.weights_kind == "random"  # random-moe: a random kind too
    assert not SMOL.model.random_weights and SMOL.model.weights_kind == "trained"
    # an unset weights field leaves a configuration's hash as it was before the field existed (cpu-smol's, whose
    # file has not changed since), and stating the kind its source already gives moves it
    assert SMOL.digest() == "67fec437a0eb5377"
    assert NEXT.model_copy(update={"model": NEXT.model.model_copy(update={"weights": "random"})}).digest() != NEXT.digest()


def test_weights_that_contradict_the_source_are_refused_naming_file_line_and_key(tmp_path):
    text = (REPO / "serve" / "h200-next.yaml").read_text().replace("  served_name: next\n",
                                                                    "  served_name: next\n  weights: trained\n")
    path = tmp_path / "h200-next.yaml"
    path.write_text(text)
    line = text.splitlines().index("  weights: trained") + 1
    with pytest.raises(InputError) as e:
        load_config(path)
    assert str(e.value) == (f"{path}:{line}: model.weights: Value error, 'trained', but model.prepare kind "
                            "'random-next' makes random weights (leave weights out, or say what the source makes)")
    path.write_text(text.replace("weights: trained", "weights: noise"))
    with pytest.raises(InputError, match=rf"{path}:{line}: model.weights: Input should be 'random' or 'trained'"):
        load_config(path)
    # a directory of random weights saved elsewhere says so
    cfg = ServeConfig.model_validate({**SMOL.model_dump(mode="json"), "model": {"path": "/m", "served_name": "m",
                                                                                "weights": "random"}})
    assert cfg.model.random_weights and cfg.digest() != SMOL.digest()


# --- strict sanity of random weights ------------------------------------------------------------------------


def test_the_runner_judges_no_garbage_of_random_weights_and_all_of_trained_ones(scratch):
    """The fake server answers garbage to every prompt, alone and under load: of a configuration that says its
    weights are random the suite passes, recording the garbage; of the same server otherwise it fails (as before)."""
    from tests.validate.test_sanity import _rec, _suite

    _suite(scratch, "garbage-sanity", [{"id": f"g{i}", "prompt": f"Repeat the number {i}", "expect": str(i)}
                                       for i in range(1, 4)])
    scratch.config("fake-random", mode="garbage")
    path = scratch.root / "serve" / "fake-random.yaml"
    cfg = yaml.safe_load(path.read_text())
    cfg["model"]["weights"] = "random"
    path.write_text(yaml.safe_dump(cfg))
    assert main(["suite", "garbage-sanity", "--config", "fake-random", "--release", "sg"]) == 0
    r = _rec(scratch, "sg", "fake-random", "garbage-sanity")
    assert r["verdict"] == {"status": "pass", "reasons": [], "cause": None} and r["weights"] == "random"
    m = r["metrics"]
    assert (m["bad"], m["solo_bad"], m["solo_right"], m["garbage"], m["divergent"], m["n"]) == (0, 0, 0, 3 + 8, 0, 8)
    assert [i["garbage"] for i in r["items"]] == [GARBAGE] * 11 and not any("bad" in i for i in r["items"])
    scratch.config("fake-trained", mode="garbage")
    assert main(["suite", "garbage-sanity", "--config", "fake-trained", "--release", "sg"]) == 1
    r = _rec(scratch, "sg", "fake-trained", "garbage-sanity")
    assert r["weights"] == "trained" and r["metrics"]["bad"] == 11 and "garbage" not in r["metrics"]


def test_random_weight_sanity_with_garbage_answers_passes_and_says_what_is_not_judged(tmp_path, monkeypatch, capsys):
    from validate.runners.sanity import audit

    r = sanity("v0.2.0", NEXT, parted={5, 20})
    assert record_weights(r) == ("random", None) and audit(r, None) == []
    save(tmp_path, r)
    out = outputs(tmp_path, "v0.2.0", baseline="none")
    agree(out)
    assert out["code"] == 0
    chk = check(out, "h200-next", "sanity")
    assert chk.outcome == "pass" and chk.limits.startswith("random weights: right answers and garbage not judged")
    floor = check(out, "h200-next", "share gate sanity")
    assert (floor.outcome, floor.status) == ("limited", "no noise floor")
    assert floor.message == ("h200-next/sanity: the divergent share under load is not checked (no noise floor): 2 of "
                             "32 answers under load apart from solo, and no baseline record gives the stack's own share")
    assert any(n.startswith("h200-next serves random weights: its answers are noise") for n in out["verdict"].notes)
    n = notes_of(tmp_path, monkeypatch, capsys, "v0.2.0")
    assert n["last"].startswith("the release's verdict: exit status 0 ")
    assert "| h200-next | answers not judged (random weights): 2 of 32 apart from solo |" in n["notes"]


def test_real_weight_sanity_with_garbage_still_fails(tmp_path):
    from validate.runners.sanity import audit

    r = sanity("v0.2.0", SMOL, parted={5, 20})
    assert record_weights(r) == ("trained", None) and audit(r, None) == []
    save(tmp_path, r)
    out = outputs(tmp_path, "v0.2.0", baseline="none")
    agree(out)
    chk = check(out, "cpu-smol", "sanity")
    assert out["code"] == 1 and (chk.outcome, chk.status) == ("finding", "fail")
    assert chk.message == f"bad answer q0/solo (solo): {GARBAGE}"
    assert not [c for c in out["verdict"].checks if c.name.startswith("share gate")]
    assert not [n for n in out["verdict"].notes if "random weights" in n]


# --- batch invariance against the baseline's noise floor ---------------------------------------------------


def _z_p(x_base_apart: int, x_cand_apart: int, n: int = 32) -> float:
    """One-sided pooled two-proportion z-test of the identical shares (candidate below baseline), by hand."""
    sb, sc = (n - x_base_apart) / n, (n - x_cand_apart) / n
    pooled = (2 * n - x_base_apart - x_cand_apart) / (2 * n)
    z = (sc - sb) / math.sqrt(pooled * (1 - pooled) * (2 / n))
    return float(norm.cdf(z))


def test_a_divergent_share_far_above_the_baseline_noise_floor_is_a_finding(tmp_path):
    """Baseline: 2 of 32 answers under load apart from solo; candidate: 28 of 32."""
    save(tmp_path, sanity("v0.1.0", NEXT, parted={0, 1}), sanity("v0.2.0", NEXT, parted=set(range(28))))
    out = outputs(tmp_path, "v0.2.0")
    agree(out)
    assert out["code"] == 1
    chk = check(out, "h200-next", "divergence sanity")
    p = _z_p(2, 28)
    assert p == pytest.approx(3.68979e-11, rel=1e-5)  # z = -0.8125 / sqrt(0.53125 * 0.46875 * 2 / 32) = -6.51
    assert (chk.outcome, chk.status, chk.properties["p_value"]) == ("finding", "regression", f"{p:.6g}")
    assert chk.message == ("a regression: 28/32 answers under load apart from their solo answers (87.5%), against the "
                           "noise floor of the baseline v0.1.0: 2/32 of its answers under load apart from its solo "
                           f"answers (6.2%); a rise of 81.2 points (threshold 5), one-sided p = {p:.3g} (alpha 0.05)")
    # the candidate's answers under load are apart from the baseline's as much: identity regresses too
    ident = check(out, "h200-next", "identity sanity (under load)")
    assert ident.outcome == "finding" and ident.message.startswith("a regression: 26/32 answers apart from the baseline's")
    assert check(out, "h200-next", "identity sanity (solo)").outcome == "pass"
    assert check(out, "h200-next", "sanity").outcome == "pass"  # the suite itself: no answer is bad


def test_a_divergent_share_within_the_noise_floor_passes(tmp_path):
    """Baseline 2 of 32 apart, candidate 3 of 32 (the same two, one more): within the 5-point threshold."""
    save(tmp_path, sanity("v0.1.0", NEXT, parted={0, 1}), sanity("v0.2.0", NEXT, parted={0, 1, 2}))
    out = outputs(tmp_path, "v0.2.0")
    agree(out)
    assert out["code"] == 0 and not out["verdict"].findings
    chk = check(out, "h200-next", "divergence sanity")
    assert (chk.outcome, chk.status) == ("pass", "within the threshold")
    assert chk.message == ("3/32 answers under load apart from their solo answers (9.4%), against the noise floor of "
                           "the baseline v0.1.0: 2/32 of its answers under load apart from its solo answers (6.2%); a "
                           f"rise of 3.1 points (threshold 5), one-sided p = {_z_p(2, 3):.3g} (alpha 0.05)")
    ident = check(out, "h200-next", "identity sanity (under load)")
    assert ident.outcome == "pass" and ident.message.startswith("1/32 answers apart from the baseline's (3.1%)")


def test_the_same_records_of_a_real_weight_configuration_get_no_noise_floor_gate(tmp_path):
    save(tmp_path, sanity("v0.1.0", SMOL, parted={0, 1}), sanity("v0.2.0", SMOL, parted=set(range(28))))
    out = outputs(tmp_path, "v0.2.0")
    names = [c.name for c in out["verdict"].checks]
    assert not [x for x in names if x.startswith(("divergence", "identity"))]
    assert out["code"] == 1 and check(out, "cpu-smol", "sanity").status == "fail"


# --- paired evals of random weights -------------------------------------------------------------------------


def test_a_paired_eval_of_random_weights_is_not_judged(tmp_path):
    """150 of 200 right, then 100 (50 lost, none gained): a regression of cpu-smol, not judged of h200-next."""
    save(tmp_path, as_config(eval_record("v0.1.0", BASE), NEXT), as_config(eval_record("v0.2.0", LOST_50), NEXT))
    out = outputs(tmp_path, "v0.2.0")
    agree(out)
    chk = check(out, "h200-next", "paired gsm8k vs v0.1.0")
    assert out["code"] == 0 and (chk.outcome, chk.status) == ("limited", "not judged")
    assert chk.message == ("not judged: random weights (accuracy 75.0% -> 50.0%, 50 lost vs 0 gained, one-sided p = "
                           f"{0.5 ** 50:.3g})")
    assert out["verdict"].comparison.tasks[0].regression is False
    smol = tmp_path / "smol"
    save(smol, as_config(eval_record("v0.1.0", BASE), SMOL), as_config(eval_record("v0.2.0", LOST_50), SMOL))
    out = outputs(smol, "v0.2.0")
    assert out["code"] == 1 and check(out, "cpu-smol", "paired gsm8k vs v0.1.0").status == "regression"


# --- a record edited to claim random weights ---------------------------------------------------------------


def _edit(reports, release: str, fn) -> None:
    p = record_path(reports, release, "cpu-smol", "sanity")
    d = json.loads(p.read_text())
    fn(d)
    p.write_text(json.dumps(d))


def _as_random(d: dict) -> None:
    """What a hand does to make cpu-smol's failed garbage record read as one of random weights."""
    for it in d["items"]:
        it["garbage"] = it.pop("bad")
    d["metrics"].update(bad=0, solo_bad=0, garbage=44)
    d["verdict"] = {"status": "pass", "reasons": [], "cause": None}


@pytest.mark.parametrize("claim", ["weights", "snapshot", "snapshot-and-hash"])
def test_cpu_smol_edited_to_say_random_does_not_escape_the_garbage_check(tmp_path, claim):
    from validate.provenance_checks import engine_hash

    save(tmp_path, sanity("v0.2.0", SMOL))

    def edit(d):
        _as_random(d)
        d["weights"] = "random"
        if claim != "weights":
            d["config_snapshot"]["model"] = {**NEXT.model.model_dump(mode="json"), "served_name": "smol"}
        if claim == "snapshot-and-hash":  # a consistent forgery of this very engine's record
            cfg = ServeConfig.model_validate(d["config_snapshot"])
            d["config_hash"], d["model"] = cfg.digest(), cfg.model.source_name()
            d["tree"]["engine_hash"] = engine_hash(REPO, REPO)

    _edit(tmp_path, "v0.2.0", edit)
    out = outputs(tmp_path, "v0.2.0", baseline="none", root=REPO)
    agree(out)
    chk = check(out, "cpu-smol", "sanity")
    assert out["code"] == 2 and chk.outcome == "not-checked"
    if claim == "weights":
        assert chk.status == "audit-failed"
        assert chk.message.startswith("the record does not stand on what it holds: it says weights: random, its "
                                      "configuration as run serves trained weights; ")
        assert "the record says pass, but its items give 44 bad answers" in chk.message  # judged as trained
    elif claim == "snapshot":
        assert chk.status == "audit-failed" and "its config_snapshot says random weights but does not give its " \
            "config_hash '67fec437a0eb5377' (edited): judged as trained weights" in chk.message
    else:
        assert chk.status == "gate-mismatch" and chk.message.endswith(
            "its configuration snapshot serves random weights, the checkout's serve/cpu-smol.yaml of this engine "
            "serves trained ones")
    assert "cpu-smol / sanity: pass" not in out["notes"]


def test_long_answers_of_random_weights_judge_no_garbage_and_stand_on_read(scratch):
    """The fake server answers garbage to every long prompt, alone and under load: of random weights the suite
    passes with nothing bad and its audit stands; the record edited to say trained weights is judged by the
    trained rule and does not stand."""
    from tests.validate.test_long_answers import PARAMS
    from tests.validate.test_soak_betterbench import add_suite, record
    from validate.record import read_record
    from validate.runners.long_answers import audit

    add_suite(scratch, "la", "long-answers", PARAMS, gate={"max": {"bad": 0}})
    scratch.config("fake-la", mode="garbage", FAKE_VLLM_ITL_MS=20, FAKE_VLLM_TOKENS=40)
    path = scratch.root / "serve" / "fake-la.yaml"
    cfg = yaml.safe_load(path.read_text())
    cfg["model"]["weights"] = "random"
    path.write_text(yaml.safe_dump(cfg))
    assert main(["suite", "la", "--config", "fake-la", "--release", "la1"]) == 0
    r = record(scratch, "la1", "fake-la", "la")
    m = r["metrics"]
    assert (m["bad"], m["solo_garbage"], m["solo_right"], m["n"], m["errors"]) == (0, 3, 0, 6, 0)
    assert {i["garbage"] for i in r["items"]} == {GARBAGE} and not any("bad" in i for i in r["items"])
    p = record_path(scratch.root / "reports", "la1", "fake-la", "la")
    rec_ = read_record(p)
    assert audit(rec_, p.parent) == []
    rec_.config_snapshot["model"].pop("weights")  # the same record of a trained-weight configuration
    assert audit(rec_, p.parent)[0].startswith("item long0/solo is not bad, its answers say bad")


def test_answers_under_load_renamed_to_another_prompt_are_refused_not_dropped(tmp_path):
    """Moving the diverging answers under load to a prompt hash their solo answers do not have would take them out
    of the noise-floor pairing (by prompt hash): the sanity audit refuses the record instead, and the unedited
    control is the regression it was."""
    from validate.runners.sanity import audit

    cand = sanity("v0.2.0", NEXT, parted=range(28))
    assert audit(cand, None) == []
    for it in cand.items:
        if it.condition != "solo" and not it.identical_to_solo:
            it.prompt_hash = "elsewhere"
    why = audit(cand, None)
    assert why and "names another prompt ('elsewhere') than its solo answer" in why[0]
    flipped = sanity("v0.2.0", NEXT, parted=range(28))
    next(i for i in flipped.items if i.condition != "solo" and not i.identical_to_solo).identical_to_solo = True
    assert any("says identical_to_solo=True, but its tokens say False" in w for w in audit(flipped, None))


def test_gate_perf_judges_identity_with_the_baseline_as_render_does(tmp_path, monkeypatch, capsys):
    """`gate --perf` judges a random-weight configuration's identity with the baseline against the noise floor, as
    `release` and `render` do: the same findings, whichever command reads the records (the one verdict)."""
    from tests.validate.test_attribution import bench
    from tests.validate.test_gate_attacks import run_cli

    speed = [bench(rel, 1.0, "stock") for rel in ("v0.1.0", "v0.2.0")]  # the same speed: no perf finding
    save(tmp_path, sanity("v0.1.0", NEXT, parted={0, 1}), sanity("v0.2.0", NEXT, parted=set(range(28))), *speed)
    out = run_cli(tmp_path, monkeypatch, capsys, ["gate", "v0.2.0", "--against", "v0.1.0", "--perf",
                                                  "--reports", str(tmp_path), "--accept-other-tree"])
    assert out["code"] == 1, out["console"][-3000:]
    assert "h200-next/identity sanity (under load): a regression: 26/32 answers apart from the baseline's" in out["console"]
    assert "h200-next/divergence sanity: a regression: 28/32" in out["console"]
    rendered = outputs(tmp_path, "v0.2.0")
    assert {c.name for c in rendered["verdict"].findings} >= {"divergence sanity", "identity sanity (under load)"}

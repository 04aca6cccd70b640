"""Strict sanity gates the solo answers too: a server that is wrong on every answer, the same way alone and
under load, must fail (it passed when only answers that changed under load were counted)."""
from __future__ import annotations

import json

import pytest
import yaml

from validate.cli import main


def _suite(scratch, name: str, prompts: list[dict], **params) -> None:
    (scratch.root / "suites" / "data" / f"{name}.yaml").write_text(yaml.safe_dump(prompts))
    (scratch.root / "suites" / f"{name}.yaml").write_text(yaml.safe_dump({
        "name": name, "kind": "strict-sanity", "gate": {"max": {"bad": 0}},
        "params": {"prompts_file": f"data/{name}.yaml", "overload": [2.0], "rounds": 1, "max_tokens": 6, **params}}))


def _rec(scratch, release, cfg, suite):
    return json.loads((scratch.root / "reports" / release / cfg / f"{suite}.json").read_text())


def test_a_server_wrong_on_every_answer_fails_naming_the_prompts(scratch):
    # the synthetic server answers the prompt's last number: every expectation below is off by one, so each
    # answer is wrong solo and identically wrong under load
    _suite(scratch, "wrong-sanity", [{"id": f"w{i}", "prompt": f"Repeat the number {i}", "expect": str(i + 1)}
                                     for i in range(1, 5)])
    scratch.config("fake-wrong")
    assert main(["suite", "wrong-sanity", "--config", "fake-wrong", "--release", "sg"]) == 1
    rec = _rec(scratch, "sg", "fake-wrong", "wrong-sanity")
    assert rec["verdict"]["status"] == "fail"
    assert rec["metrics"]["solo_right"] == 0 and rec["metrics"]["solo_wrong"] == ["w1", "w2", "w3", "w4"]
    assert rec["metrics"]["bad"] == 0  # nothing changed under load: the old gate alone would have passed
    assert any("0 of 4 right alone" in r and "wrong solo: w1, w2, w3, w4" in r for r in rec["verdict"]["reasons"])


def test_the_configured_share_lets_a_known_miss_through_and_no_more(scratch):
    prompts = [{"id": f"r{i}", "prompt": f"Repeat the number {i}", "expect": str(i)} for i in range(1, 4)]
    prompts.append({"id": "miss", "prompt": "Repeat the number 5", "expect": "6"})
    _suite(scratch, "share-sanity", prompts, min_solo_right_share=0.75)
    scratch.config("fake-share")
    assert main(["suite", "share-sanity", "--config", "fake-share", "--release", "sg"]) == 0
    rec = _rec(scratch, "sg", "fake-share", "share-sanity")
    assert rec["metrics"]["solo_right"] == 3 and rec["metrics"]["solo_wrong"] == ["miss"]
    _suite(scratch, "share-sanity", prompts, min_solo_right_share=0.76)  # 3 of 4 < ceil(0.76 * 4) = 4
    assert main(["suite", "share-sanity", "--config", "fake-share", "--release", "sg"]) == 1


def test_garbage_alone_is_bad(scratch):
    """A server that answers garbage to every prompt, alone and under load alike."""
    _suite(scratch, "garbage-sanity", [{"id": f"g{i}", "prompt": f"Repeat the number {i}", "expect": str(i)}
                                       for i in range(1, 4)], min_solo_right_share=0.0)
    scratch.config("fake-garbage", mode="garbage")
    assert main(["suite", "garbage-sanity", "--config", "fake-garbage", "--release", "sg"]) == 1
    rec = _rec(scratch, "sg", "fake-garbage", "garbage-sanity")
    solo = [i for i in rec["items"] if i["condition"] == "solo"]
    assert [i["bad"] for i in solo] == ["replacement character in answer"] * 3
    assert rec["metrics"]["solo_bad"] == 3 and rec["metrics"]["bad"] == 3 + 8  # and every answer under load


def test_an_answer_listing_every_answer_is_not_right():
    """A server answering every prompt with every expected answer ("Paris Tokyo ... Mars.") said each right word,
    and passed strict sanity; an answer must not also say the other prompts' answers."""
    from tests.conftest import REPO
    from validate.runners.sanity import distractors, is_right, load_prompts

    prompts = load_prompts(REPO / "suites" / "data" / "sanity_prompts.yaml")
    others = distractors(prompts)
    shotgun = "Paris Tokyo Pacific 8 7 cold Rome 4 12 Mars."
    assert not any(is_right(shotgun, q["expect"], others[q["id"]]) for q in prompts)
    # SmolLM2-135M's real solo answers (cpu-smol) stay right: 11 of 12 (it says 10 minus 3 is 2)
    real = {"capital-france": "The capital of France is Paris.", "legs-spider": "The answer to this question is 8. "
            "A spider has 8 legs.", "add-3-5": "Tom has 3 apples and 5 more apples, so he has 3 + 5 = 8 apples.",
            "months-year": "There are 12 months in a year.", "sub-10-3": "10 minus 3 is 2."}
    by_id = {q["id"]: q for q in prompts}
    assert [is_right(t, by_id[i]["expect"], others[i]) for i, t in real.items()] == [True, True, True, True, False]
    assert others["legs-spider"] == others["add-3-5"]  # both expect 8: neither is the other's distractor
    assert "8" not in others["legs-spider"] and "Paris" in others["legs-spider"]


def test_a_looping_answer_is_garbage():
    from validate.client import RequestResult
    from validate.runners.sanity import garbage_reason

    def why(text):
        return garbage_reason(RequestResult(ok=True, text=text, token_ids=[1, 2]), 12)

    assert why("Paris. Paris. Paris. Paris.") == "the phrase 'Paris' repeated 4 or more times in a row"
    assert why("the cat the cat the cat the cat") == "the phrase 'the cat' repeated 4 or more times in a row"
    assert why("Paris. Paris. Paris.") is None and why("Tom has 3 apples and 5 more, so 3 + 5 = 8.") is None


def test_a_looping_sentence_and_a_punctuation_flood_are_garbage():
    # a 7-word sentence said five times (a corrupted KV cache's way), and 'Paris' then 40 '!' in alternating token
    # ids ('!', '!!', '!!!', so no id repeats): both once read as right answers
    from validate.client import RequestResult
    from validate.runners.sanity import garbage_reason

    loop = RequestResult(text="Paris is the capital city of France. " * 5, token_ids=list(range(45)))
    assert garbage_reason(loop, 12) == "the phrase 'Paris is the capital city of France' repeated 4 or more times in a row"
    flood = RequestResult(text="Paris" + "!" * 40, token_ids=[1] + [7, 8, 9] * 14)
    assert garbage_reason(flood, 12) == "'!' repeated 40 times in a row"
    fine = RequestResult(text="Paris! It is the capital of France... and its largest city.", token_ids=list(range(14)))
    assert garbage_reason(fine, 12) is None


@pytest.mark.timeout(120)
def test_answers_beside_a_long_prefill_have_ids_of_their_own_and_carry_their_top_two(scratch):
    """The runner's own batches, plain and beside a long prefill, on the fake server (busy-diverge: an answer
    under load says "indeed" at token 3); the old records' ids (each long-prefill id the plain batch's again)
    still audit and still compare, by condition."""
    from tests.validate.test_one_verdict import outputs
    from validate.identity import compare_outputs, compare_with_solo
    from validate.margins import NEAR_TIE, classify
    from validate.record import read_record, record_path
    from validate.runners.sanity import audit

    prompts = [{"id": f"n{i}", "prompt": f"Repeat the number {i * 7}", "expect": str(i * 7)} for i in range(1, 4)]
    _suite(scratch, "long-sanity", prompts, after_long_prompt_tokens=40)
    scratch.config("fake-long", mode="busy-diverge", FAKE_VLLM_ITL_MS=20)
    cfg = yaml.safe_load((scratch.root / "serve" / "fake-long.yaml").read_text())
    cfg["server"]["extra_args"] = ["--logprobs-mode", "processed_logits"]
    (scratch.root / "serve" / "fake-long.yaml").write_text(yaml.safe_dump(cfg))
    assert main(["suite", "long-sanity", "--config", "fake-long", "--release", "ids"]) == 0
    path = record_path(scratch.root / "reports", "ids", "fake-long", "long-sanity")
    rec = read_record(path)
    load = [i for i in rec.items if i.condition != "solo"]
    ids = [i.id for i in load]
    # max_num_seqs 4, overload 2: 8 answers a batch, once plain and once beside the prefill
    assert len(ids) == 16 == len(set(ids))
    assert ids[:2] == ["n1/x2/r0/0", "n2/x2/r0/1"] and ids[8:10] == ["n1/x2/long/r0/0", "n2/x2/long/r0/1"]
    assert all("after a 40-token prefill" in i.condition for i in load[8:])
    assert audit(rec, path.parent) == []
    x = compare_outputs(rec, rec, "under load")
    assert (x.n, x.identical, x.left_out) == (16, 16, {})
    # every answer carries a step per token id, in the configured mode
    solo = {i.id.split("/")[0]: i for i in rec.items if i.condition == "solo"}
    assert all(len(i.top2) == len(i.token_ids) and i.logprobs_mode == "processed_logits" for i in rec.items)
    assert solo["n1"].top2[0] == [100, 20.0, 7, 19.0]
    # an answer under load that parts from its solo answer: a near-tie at token 3 (the fake's margin 0.0625)
    parted = [i for i in load if i.identical_to_solo is False]
    assert parted and {i.first_divergent_token for i in parted} == {3}
    p = classify(3, parted[0].model_dump(), solo[parted[0].id.split("/")[0]].model_dump())
    assert p.kind == NEAR_TIE and p.margins == (0.0625, 0.0625)
    # the notes' batch-invariance row: every parting a near-tie (how many part depends on the box's timing)
    x = compare_with_solo(rec)
    assert (x.n, x.clear, x.near_ties, x.left_out) == (16, [], len(parted), {})
    notes = outputs(scratch.root / "reports", "ids")["notes"]
    assert (f"| fake-long | long-sanity | 16 | {16 - len(parted)} ({(16 - len(parted)) / 16:.1%}) | {len(parted)} | "
            f"3 / 3.0 / 3 | {len(parted)} / 0 / 0 | 0.0625 | – |") in notes
    # the same record as written before long-prefill batches had ids of their own
    for i in load[8:]:
        i.id = i.id.replace("/long/", "/")
    assert len({i.id for i in load}) == 8
    assert audit(rec, path.parent) == []
    x = compare_outputs(rec, rec, "under load")
    assert (x.n, x.left_out) == (16, {})
    load[9].id = load[8].id  # an id twice within one condition stays a duplicate
    assert compare_outputs(rec, rec, "under load").left_out == {"a duplicate item id": 2}

"""Strict sanity gates the solo answers too: a server that is wrong on every answer, the same way alone and
under load, must fail (it passed when only answers that changed under load were counted)."""
from __future__ import annotations

import json

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

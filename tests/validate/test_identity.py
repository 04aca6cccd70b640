"""Greedy answers against the baseline, token by token (validate.identity): counts, the first token apart, what is
left out and why, and the notes' table."""
from __future__ import annotations

import pytest

from tests.validate.test_compare import eval_record, save
from tests.validate.test_one_verdict import BASE, outputs
from tests.validate.test_records_render import rec
from validate.identity import compare_outputs, compare_releases_outputs, first_apart
from validate.record import Item, Record

GREEDY = {"max_tokens": 8, "temperature": 0.0}


def test_first_apart():
    assert first_apart([1, 2, 3], [1, 2, 3]) is None
    assert first_apart([1, 2, 3], [1, 9, 3]) == 1
    assert first_apart([1, 2], [1, 2, 3]) == 2  # a prefix parts where it ends
    assert first_apart("", "x") == 0
    assert first_apart("abc", "abd") == 2


def _rec(release: str, items: list[Item], kind="strict-sanity") -> Record:
    r = rec("h200-next", "sanity")
    r.release, r.suite_kind, r.items = release, kind, items
    return r


def _item(i, toks, prompt="p", gen=GREEDY, error=None, output=None):
    return Item(id=f"q{i}/solo", prompt_hash=f"{prompt}{i}", gen=dict(gen), token_ids=toks,
                output=output if output is not None else " ".join(map(str, toks or [])), error=error)


def test_counts_first_token_apart_and_what_is_left_out():
    base = _rec("stock", [_item(0, [5, 6, 7]), _item(1, [5, 6, 7, 8]), _item(2, [1, 2]), _item(3, [1, 2]),
                          _item(4, [1, 2]), _item(5, [9, 9, 9, 9, 9]), _item(7, [3])])
    cand = _rec("r9k", [_item(0, [5, 6, 7]),                       # identical
                        _item(1, [5, 6, 4, 8]),                    # parts at token 2
                        _item(2, [1, 2], prompt="other"),          # another prompt
                        _item(3, [1, 2], gen={"max_tokens": 8, "temperature": 0.7}),
                        _item(4, None, error="HTTP 500"),          # an error on one side
                        _item(5, [9, 9, 9, 9]),                    # stopped a token short: parts at 4
                        _item(6, [3])])                            # no such item in the baseline
    x = compare_outputs(cand, base)
    assert (x.n, x.identical, x.first_apart, x.unit) == (3, 1, [2, 4], "token")
    assert x.left_out == {"another prompt": 1, "other generation parameters": 1,
                          "an error or no output on either side": 1, "no such item in the baseline": 1}
    assert x.share == pytest.approx(1 / 3) and x.median_apart == 3


def test_sampled_answers_are_not_compared_and_text_stands_in_for_missing_token_ids():
    sampled = {"max_tokens": 8, "temperature": 0.7}
    x = compare_outputs(_rec("b", [_item(0, [1], gen=sampled)]), _rec("a", [_item(0, [1], gen=sampled)]))
    assert (x.n, x.left_out) == (0, {"not greedy": 1})
    base = _rec("a", [_item(0, None, output="The answer is 42."), _item(1, [4], output="same")])
    cand = _rec("b", [_item(0, [7, 7], output="The answer is 41."), _item(1, [4], output="same")])
    x = compare_outputs(cand, base)
    assert (x.unit, x.n, x.identical, x.first_apart) == ("character", 2, 1, [15])


def test_records_of_another_configuration_or_kind_are_refused():
    a = _rec("a", [_item(0, [1])])
    b = _rec("b", [_item(0, [1])], kind="long-answers")
    with pytest.raises(ValueError, match="not one configuration and suite kind"):
        compare_outputs(b, a)
    assert compare_releases_outputs([b], [a]) == []  # no long-answers record in the baseline: nothing compared


def test_the_release_notes_show_the_table(tmp_path):
    """Two GSM8K releases whose greedy answers part on 40 of 200 questions, each at character 17 or later."""
    b, c = eval_record("v0.3.2", BASE), eval_record("v0.3.3", BASE)
    for r in (b, c):
        for it in r.items:
            it.gen["temperature"] = 0.0
    for i, it in enumerate(c.items[:40]):
        it.output = it.output.replace(" + ", " plus ", 1)  # "So the answer is 7" then apart
    save(tmp_path, b, c)
    out = outputs(tmp_path, "v0.3.3")
    [x] = out["verdict"].identity
    assert (x.config, x.suite, x.n, x.identical, x.unit) == ("cpu-smol", "gsm8k", 200, 160, "character")
    assert set(x.first_apart) == {len("So the answer is 7 ")}
    assert "| cpu-smol | gsm8k | 200 | 160 (80.0%) | 40 | character 19 / 19.0 / 19 | – |" in out["notes"]
    assert "greedy answers against v0.3.2: cpu-smol/gsm8k 160 of 200 identical" in out["console"]
    assert out["code"] == 0  # a figure, not a gate


def test_records_the_pairing_rule_refuses_are_said_not_compared():
    """Another model behind the same configuration name: its answers would part everywhere for no kernel's sake."""
    a, b = _rec("a", [_item(0, [1])]), _rec("b", [_item(0, [1])])
    b.model = "another.gguf"
    [x] = compare_releases_outputs([b], [a])
    assert x.n == 0 and "model" in x.refused


def test_empty_token_ids_are_none_and_text_must_match_too():
    """A server that ignores return_token_ids gives empty lists: the answers are then compared by text."""
    x = compare_outputs(_rec("b", [_item(0, [], output="The answer is 41.")]),
                        _rec("a", [_item(0, [], output="The answer is 42.")]))
    assert (x.unit, x.n, x.identical, x.first_apart) == ("character", 1, 0, [15])
    x = compare_outputs(_rec("b", [_item(0, [7], output="same")]), _rec("a", [_item(0, [], output="same")]))
    assert (x.unit, x.identical) == ("character", 1)
    x = compare_outputs(_rec("b", [_item(0, [7, 8], output="ab")]), _rec("a", [_item(0, [7, 8], output="ac")]))
    assert (x.unit, x.identical, x.first_apart) == ("token", 0, [2])


def test_duplicate_ids_and_other_suite_parameters_are_not_compared():
    x = compare_outputs(_rec("b", [_item(0, [1, 2])]), _rec("a", [_item(0, [1, 2]), _item(0, [9, 9])]))
    assert (x.n, x.left_out) == (0, {"a duplicate item id": 1}) and x.share is None
    a, b = _rec("a", [_item(0, [1])]), _rec("b", [_item(0, [1])])
    b.params = {"concurrency": 64}  # batching alone can move a greedy answer
    [x] = compare_releases_outputs([b], [a])
    assert x.n == 0 and "concurrency" in x.refused


def test_a_row_with_nothing_compared_shows_no_share(tmp_path):
    b, c = eval_record("v0.3.2", BASE), eval_record("v0.3.3", BASE)  # no temperature in gen: not greedy
    save(tmp_path, b, c)
    out = outputs(tmp_path, "v0.3.3")
    assert "| cpu-smol | gsm8k | 0 | – | 0 | – | 200: not greedy |" in out["notes"]
    assert "cpu-smol/gsm8k no answer compared: 200 not greedy" in out["console"]


def test_solo_answers_and_answers_under_load_are_rows_of_their_own():
    """A sanity record: two solo answers identical, one answer under load parted at token 1 (batching can do that
    between two runs of one tree; the solo row is the kernels' figure)."""
    def items(load_tok):
        out = [_item(0, [1, 2]), _item(1, [3, 4])]
        out[0].condition = out[1].condition = "solo"
        under = _item(2, [5, load_tok])
        under.id, under.condition = "q0/x2/r0/0", "overload x2 (16 requests, max_num_seqs 8)"
        return out + [under]
    rows = compare_releases_outputs([_rec("b", items(9))], [_rec("a", items(6))])
    assert [(x.part, x.n, x.identical, x.first_apart) for x in rows] == [("solo", 2, 2, []), ("under load", 1, 0, [1])]

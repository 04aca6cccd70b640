"""Greedy answers against the baseline, token by token (validate.identity): counts, the first token apart, what is
left out and why, and the notes' table."""
from __future__ import annotations

import pytest

from tests.validate.test_compare import eval_record, save
from tests.validate.test_one_verdict import BASE, outputs
from tests.validate.test_records_render import rec
from validate.identity import compare_outputs, compare_releases_outputs, compare_with_solo, first_apart
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
    assert x.left_out == {"another prompt or condition": 1, "other generation parameters": 1,
                          "an error on either side": 1, "no such item in the baseline": 1,
                          "only in the baseline": 1}  # item 7
    assert x.share == pytest.approx(1 / 3) and x.median_apart == 3


def test_sampled_answers_are_not_compared_and_a_pair_without_token_ids_is_left_out_of_a_token_row():
    sampled = {"max_tokens": 8, "temperature": 0.7}
    x = compare_outputs(_rec("b", [_item(0, [1], gen=sampled)]), _rec("a", [_item(0, [1], gen=sampled)]))
    assert (x.n, x.left_out) == (0, {"not greedy": 1})
    for flag in (False, "0"):  # a flag or a text is no temperature
        g = {"max_tokens": 8, "temperature": flag}
        assert compare_outputs(_rec("b", [_item(0, [1], gen=g)]), _rec("a", [_item(0, [1], gen=g)])).n == 0
    # one answer without token ids cannot turn a row whose answers part by token into one judged by text
    base = _rec("a", [_item(0, None, output="x")] + [_item(i, [5, 6], output="t") for i in range(1, 50)])
    cand = _rec("b", [_item(0, [7, 7], output="x")] + [_item(i, [5, 7], output="t") for i in range(1, 50)])
    x = compare_outputs(cand, base)
    assert (x.unit, x.n, x.identical, x.left_out) == ("token", 49, 0, {"no token ids on one side": 1})
    assert x.first_apart == [1] * 49


def test_records_of_another_configuration_or_kind_are_refused():
    a = _rec("a", [_item(0, [1])])
    b = _rec("b", [_item(0, [1])], kind="long-answers")
    with pytest.raises(ValueError, match="not one configuration and suite kind"):
        compare_outputs(b, a)
    [x] = compare_releases_outputs([b], [a])  # the gates' pairing by name: the kinds differ, so it is refused
    assert x.n == 0 and x.refused == "other suite kinds (strict-sanity vs long-answers)"


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
    assert "| cpu-smol | gsm8k | 200 | 160 (80.0%) | 40 | character 19 / 19.0 / 19 | – | – | – |" in out["notes"]
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
    assert "| cpu-smol | gsm8k | 0 | – | 0 | – | – | – | 200: not greedy |" in out["notes"]
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


def _greedy(*recs):
    for r in recs:
        for it in r.items:
            it.gen["temperature"] = 0.0
    return recs


def test_records_that_failed_their_audit_or_another_tree_made_are_not_compared(tmp_path):
    """A candidate whose answers were copied from the baseline (flags and counts left as they were) fails its
    audit: the table must not call it identical; a baseline whose answers were edited must not call every answer
    parted; records of another tree are not the release's answers."""
    from tests.validate.test_one_verdict import LOST_50
    from validate.record import Tree

    b, c = _greedy(eval_record("v0.3.2", BASE), eval_record("v0.3.3", LOST_50))
    for ci, bi in zip(c.items, b.items):
        ci.output = bi.output
    save(tmp_path, b, c)
    out = outputs(tmp_path, "v0.3.3")
    [x] = out["verdict"].identity
    assert x.n == 0 and x.refused.startswith("the record failed its audit: ")
    assert "identical" not in out["console"].split("greedy answers against")[1].splitlines()[0]

    b, c = _greedy(eval_record("v0.3.2", BASE), eval_record("v0.3.3", BASE))
    for i, it in enumerate(b.items):
        it.output = f"edited {i}"
    save(tmp_path, b, c)
    [x] = outputs(tmp_path, "v0.3.3")["verdict"].identity
    assert x.n == 0 and x.refused.startswith("the baseline's record failed its audit: ")

    b, c = _greedy(eval_record("v0.3.2", BASE), eval_record("v0.3.3", BASE))
    save(tmp_path, b, c)
    out = outputs(tmp_path, "v0.3.3", tree=Tree(source_hash="another-tree"))
    [x] = out["verdict"].identity
    assert x.n == 0 and x.refused.startswith("the record was made by another tree (plugin source ")
    assert out["code"] != 0


def test_what_is_left_out_is_said_on_both_sides_and_on_the_console(tmp_path):
    """One answer of 200 compared reads as 1 of 1 identical only with the 199 it left out beside it; answers the
    baseline holds and the candidate does not are counted too."""
    base = _rec("a", [_item(i, [1, 2, 3]) for i in range(200)])
    [x] = compare_releases_outputs([_rec("b", [_item(0, [1, 2, 3])])], [base])
    assert (x.n, x.identical, x.left_out) == (1, 1, {"only in the baseline": 199})
    b, c = _greedy(eval_record("v0.3.2", BASE), eval_record("v0.3.3", BASE))
    for it in c.items[1:]:
        it.gen["temperature"] = 0.7
    save(tmp_path, b, c)
    out = outputs(tmp_path, "v0.3.3")
    assert ("cpu-smol/gsm8k 1 of 1 identical (left out: 199 other generation parameters)"
            in " ".join(out["console"].split()))


def test_no_output_on_both_sides_is_left_out_and_the_thinking_counts():
    x = compare_outputs(_rec("b", [_item(i, [], output="") for i in range(10)]),
                        _rec("a", [_item(i, [], output="") for i in range(10)]))
    assert (x.n, x.left_out) == (0, {"no output on both sides": 10})
    x = compare_outputs(_rec("b", [_item(0, [], output="")]), _rec("a", [_item(0, [], output="x")]))
    assert (x.n, x.first_apart) == (1, [0])  # an answer gone empty parts at once

    def thought(reasoning=None, digest=None):
        it = _item(0, None, output="The answer is 42.")
        it.thinking = "answered"
        if reasoning is not None:
            it.reasoning = reasoning
        if digest is not None:
            it.reasoning_chars, it.reasoning_sha256 = 9999, digest
        return it
    x = compare_outputs(_rec("b", [thought("6 * 7 = 42")]), _rec("a", [thought("6 * 7 is 42")]))
    assert (x.unit, x.n, x.identical, x.first_apart) == ("character", 1, 0, [6])
    x = compare_outputs(_rec("b", [thought(digest="aa")]), _rec("a", [thought(digest="bb")]))
    assert (x.identical, x.first_apart) == (0, [0])  # kept as a hash: apart somewhere in the thinking
    x = compare_outputs(_rec("b", [thought(digest="aa")]), _rec("a", [thought(digest="aa")]))
    assert x.identical == 1


def test_the_baseline_answer_must_be_of_the_same_condition():
    bi, ci = _item(0, [1, 2]), _item(0, [1, 2])
    bi.condition, ci.condition = "overload x2 (16 requests, max_num_seqs 8)", "solo"
    rows = compare_releases_outputs([_rec("b", [ci])], [_rec("a", [bi])])
    assert [(x.part, x.n, x.left_out) for x in rows] == [
        ("solo", 0, {"another prompt or condition": 1}), ("under load", 0, {"only in the baseline": 1})]


def test_evals_at_a_concurrency_above_one_are_a_batched_row():
    a, b = _rec("a", [_item(0, [1, 2])], kind="gsm8k"), _rec("b", [_item(0, [1, 3])], kind="gsm8k")
    a.params = b.params = {"concurrency": 8}
    [x] = compare_releases_outputs([b], [a])
    assert (x.part, x.n, x.first_apart) == ("batched", 1, [1])
    a.params = b.params = {"concurrency": 1}
    [x] = compare_releases_outputs([b], [a])
    assert (x.part, x.n) == ("", 1)


def test_records_pair_by_the_gates_rule_and_sandbox_workers_do_not_refuse():
    """A copy of a suite under another name is compared with nothing (the gates' rule: its baseline record is
    claimed by the suite of that name); HumanEval's sandbox workers cannot move an answer."""
    b, c1, c2 = _rec("a", [_item(0, [1, 2])]), _rec("b", [_item(0, [1, 2])]), _rec("b", [_item(0, [1, 2])])
    c2.suite = "sanity-copy"
    rows = compare_releases_outputs([c1, c2], [b])
    assert [(x.suite, x.n, x.refused) for x in rows] == [
        ("sanity", 1, None), ("sanity-copy", 0, "the baseline has no record of this suite")]
    a, b = _rec("a", [_item(0, [1])], kind="humaneval"), _rec("b", [_item(0, [1])], kind="humaneval")
    a.params, b.params = {"workers": 4}, {"workers": 8}
    [x] = compare_releases_outputs([b], [a])
    assert (x.n, x.identical, x.refused) == (1, 1, None)


def _thought(output="The answer is 42.", reasoning=None, digest=None, chars=9999, state="answered"):
    it = _item(0, None, output=output)
    it.thinking = state
    if reasoning is not None:
        it.reasoning = reasoning
    if digest is not None:
        it.reasoning_chars, it.reasoning_sha256 = chars, digest
    return it


def test_the_end_of_the_thinking_and_a_digest_are_told_apart_from_text():
    """An answer moved into an unclosed thinking is not the same reply; a thinking that opens with '#' is text;
    text equal to '#' and a digest is not that digest; the same digest counts its characters before the answer."""
    def cmp(c, b):
        x = compare_outputs(_rec("b", [c]), _rec("a", [b]))
        return x.n, x.identical, x.first_apart
    assert cmp(_thought("", "6 * 7 = 42 The answer is 42.", state="unclosed"),
               _thought(" The answer is 42.", "6 * 7 = 42")) == (1, 0, [10])
    assert cmp(_thought(reasoning="6 * 7 = 42", state="unclosed"), _thought(reasoning="6 * 7 = 42")) == (1, 0, [10])
    assert cmp(_thought(reasoning="# Plan: add 6 and 7"), _thought(reasoning="# Plan: multiply")) == (1, 0, [8])
    assert cmp(_thought(reasoning="#aa"), _thought(digest="aa")) == (1, 0, [0])
    assert cmp(_thought("The answer is 41.", digest="aa", chars=65),
               _thought("The answer is 42.", digest="aa", chars=65)) == (1, 0, [65 + 15])
    odd = _thought(reasoning="x")
    odd.reasoning = ["x"]  # a runner writes text or a digest, never this: compared, it would hide a difference
    assert compare_outputs(_rec("b", [odd]), _rec("a", [_thought(reasoning="y")])).left_out == {
        "a thinking field of no kind": 1}


def test_parameters_that_move_no_answer_and_the_metrics_formula_do_not_refuse():
    for kind, key, values in (("gsm8k", "primary", ("strict", "flexible")), ("gsm8k", "limit", (200, 100)),
                              ("humaneval", "timeout_s", (10, 20)),
                              ("strict-sanity", "min_solo_right_share", (0.9, 0.8))):
        a, b = _rec("a", [_item(0, [1])], kind=kind), _rec("b", [_item(0, [1])], kind=kind)
        a.params, b.params = {key: values[0]}, {key: values[1]}
        [x] = compare_releases_outputs([b], [a])
        assert (x.n, x.identical, x.refused) == (1, 1, None), key
    a, b = _rec("a", [_item(0, [1])]), _rec("b", [_item(0, [1])])
    b.metrics_formula_version = a.metrics_formula_version + 1
    [x] = compare_releases_outputs([b], [a])
    assert (x.n, x.identical) == (1, 1)


def test_conditions_concurrency_and_empty_records_are_attributed():
    """Answers under another overload than the baseline's are not paired; a concurrency of no kind is not taken
    for one prompt at a time, nor is an eval item named solo; a rename two candidate records could claim is
    refused as the gates refuse it, though one of them holds no answers; a record without answers says so."""
    bi, ci = _item(0, [1, 2]), _item(0, [1, 3])
    bi.condition, ci.condition = "overload x2.0", "overload x1.0625"
    [x] = compare_releases_outputs([_rec("b", [ci])], [_rec("a", [bi])])
    assert (x.part, x.n, x.left_out) == ("under load", 0, {"another prompt or condition": 1})
    for conc in ("8", [8], None, True, 64):
        ci = _item(0, [1, 2])
        ci.condition = "solo"
        a, b = _rec("a", [_item(0, [1, 2])], kind="gsm8k"), _rec("b", [ci], kind="gsm8k")
        a.params = b.params = {"concurrency": conc}
        a.items[0].condition = "solo"
        assert [x.part for x in compare_releases_outputs([b], [a])] == ["batched"], conc
    base = _rec("a", [_item(0, [1, 2])])
    c1, c2 = _rec("b", [_item(0, [1, 2])]), _rec("b", [])
    c1.suite, c2.suite = "sanity-a", "sanity-b"
    [x] = compare_releases_outputs([c1, c2], [base])  # sanity-b, without answers and paired with none: no row
    assert (x.suite, x.n) == ("sanity-a", 0) and "cannot be told" in x.refused
    [x] = compare_releases_outputs([_rec("b", [])], [_rec("a", [_item(0, [1, 2])])])
    assert x.refused == "the record holds no answers"
    assert compare_releases_outputs([_rec("b", [])], [_rec("a", [])]) == []


def _steps(n, at=None, step=None):
    """Steps for a ``n``-token answer (ids 100 + i, a clear 1.0 margin each), ``step`` at token ``at``."""
    out = [[100 + i, 20.0, 7, 19.0] for i in range(n)]
    if at is not None:
        out[at] = step
    return out


def _greedy_gsm8k(release):
    r = eval_record(release, BASE)
    for it in r.items:
        it.gen["temperature"] = 0.0
        it.token_ids, it.top2, it.logprobs_mode = [100 + i for i in range(5)], _steps(5), "processed_logits"
    return r


def test_partings_are_told_near_tie_or_clear_in_the_table_and_a_clear_one_is_named(tmp_path):
    """Three answers part at token 2: two at a near-tie (margins 0 and 0.25 at 18.5, bf16 steps of 0.125), one
    where the baseline was sure (margin 4.5): the notes name that one, item and token."""
    b, c = _greedy_gsm8k("v0.3.2"), _greedy_gsm8k("v0.3.3")
    for k, (mc, mb) in enumerate([(0.0, 0.0), (0.25, 0.25), (0.0625, 4.5)]):
        c.items[k].token_ids[2] = 99
        c.items[k].output += " (other)"
        c.items[k].top2[2] = [99, 18.5, 102, 18.5 - mc]
        b.items[k].top2[2] = [102, 18.5, 99, 18.5 - mb]
    [x] = compare_releases_outputs([c], [b])
    assert (x.n, x.identical, x.first_apart, x.unit) == (200, 197, [2, 2, 2], "token")
    assert x.near_ties == 2 and [i for i, _ in x.clear] == ["test-2"] and x.largest_margin == 4.5
    save(tmp_path, b, c)
    out = outputs(tmp_path, "v0.3.3")
    assert ("| cpu-smol | gsm8k | 200 | 197 (98.5%) | 3 | token 2 / 2.0 / 2 | 2 / 1 / 0 | 4.5000 | – |"
            in out["notes"])
    assert ("- **clear parting** cpu-smol / gsm8k `test-2` token 2: the candidate: 99 18.5, 102 18.4375 (margin "
            "0.0625, bound 0.25); the baseline: 102 18.5, 99 14 (margin 4.5, bound 0.25); clear." in out["notes"])
    assert "partings 2 near-tie, 1 clear, 0 not classified; clear: test-2 token 2" in out["console"]
    assert out["code"] == 0  # a figure, not a gate


def test_logprob_values_show_margins_and_classify_nothing(tmp_path):
    b, c = _greedy_gsm8k("v0.3.2"), _greedy_gsm8k("v0.3.3")
    for r in (b, c):
        for it in r.items:
            it.logprobs_mode = "raw_logprobs"
    c.items[0].token_ids[1] = 99
    c.items[0].output += " (other)"
    [x] = compare_releases_outputs([c], [b])
    assert (x.near_ties, x.clear, x.largest_margin) == (0, [], 1.0)
    assert x.unclassified == {"the values are logprobs: the logits' magnitude, which sets the bf16 step, is not "
                              "kept": 1}
    save(tmp_path, b, c)
    notes = outputs(tmp_path, "v0.3.3")["notes"]
    assert "| 0 / 0 / 1 | 1.0000 |" in notes
    assert "- cpu-smol / gsm8k: not classified (1): the values are logprobs" in notes
    # records without top two (written before the runners asked for them): margins unknown, no classification
    for r in (b, c):
        for it in r.items:
            it.top2 = it.logprobs_mode = None
    [x] = compare_releases_outputs([c], [b])
    assert x.largest_margin is None and x.unclassified == {"no top two at that token on either side": 1}


def test_answers_under_load_against_their_own_solo_answers():
    solo = Item(id="q0/solo", prompt_hash="p0", condition="solo", gen=GREEDY, output="a b c d",
                token_ids=[1, 2, 3, 4], top2=_steps(4), logprobs_mode="processed_logits")
    solo.top2[1] = [2, 18.5, 9, 18.5]  # a tie at token 1

    def load(k, ids, step):
        return Item(id=f"q0/x2/r0/{k}", prompt_hash="p0", condition="overload x2", gen=GREEDY, output=str(ids),
                    token_ids=ids, top2=_steps(4, 1, step), logprobs_mode="processed_logits")

    r = _rec("r9k", [solo, load(0, [1, 2, 3, 4], [2, 20.0, 7, 19.0]), load(1, [1, 9, 3, 4], [9, 18.5, 2, 18.5]),
                     load(2, [1, 9, 3, 4], [9, 18.5, 2, 10.0]),
                     Item(id="q1/x2/r0/3", prompt_hash="p1", condition="overload x2", gen=GREEDY, token_ids=[1])])
    r.items[1].output = solo.output
    x = compare_with_solo(r)
    assert (x.n, x.identical, x.first_apart) == (3, 1, [1, 1])
    assert x.near_ties == 1 and [i for i, _ in x.clear] == ["q0/x2/r0/2"] and x.largest_margin == 8.5
    assert x.left_out == {"no solo answer to its prompt": 1}
    assert compare_with_solo(_rec("r9k", [solo])) is None  # nothing under load

"""Long answers after long prompts, under decode load, against the fake vLLM server: it repeats the prompt's last
number, so a code planted at the very end (needle_depth 1) is answered right and one planted earlier is not;
its busy modes answer differently while another generation streams (wrong, or other words with the same
number). Exact counts, strict sanity's rule (divergent but right is not bad), a server that dies, and records
whose counts or items were edited."""
from __future__ import annotations

import pytest

from validate.cli import main
from validate.record import read_record, record_path
from validate.runners.long_answers import CODE_DIGITS, QUESTION, _compose, _draw_code, audit
from validate.verdict import assess_release

from tests.validate.test_soak_betterbench import add_suite, record

pytestmark = pytest.mark.timeout(120)

#: 3 prompts of at most 120 fake tokens (words), 2 rounds under load: 3 solo answers, 6 under load.
PARAMS = {"prompts": 3, "prompt_tokens": 120, "max_tokens": 8, "needle_depth": 1.0, "rounds": 2, "load_clients": 3,
          "load_tokens": 40, "load_warmup_s": 0.3, "min_solo_right_share": 1.0}


def run(scratch, mode: str, release: str = "la1", **params) -> tuple[int, dict]:
    add_suite(scratch, "la", "long-answers", {**PARAMS, **params}, gate={"max": {"bad": 0}})
    # 40 tokens 20 ms apart: each load answer streams for 0.8 s, so (3 clients) one is streaming whenever a long
    # prompt is sent, even on a loaded box; a long answer is its first 8 tokens
    scratch.config("fake-la", mode=mode, FAKE_VLLM_ITL_MS=20, FAKE_VLLM_TOKENS=40)
    code = main(["suite", "la", "--config", "fake-la", "--release", release])
    return code, record(scratch, release, "fake-la", "la")


def test_right_alone_and_under_load_passes_with_exact_counts(scratch):
    code, rec = run(scratch, "ok")
    m = rec["metrics"]
    assert code == 0 and rec["verdict"]["status"] == "pass", rec["verdict"]
    assert (m["n"], m["bad"], m["divergent"], m["errors"], m["solo_right"], m["prompts"]) == (6, 0, 0, 0, 3, 3)
    solo = [i for i in rec["items"] if i["condition"] == "solo"]
    load = [i for i in rec["items"] if i["condition"] == "under load"]
    assert [i["id"] for i in solo] == ["long0/solo", "long1/solo", "long2/solo"]
    assert [i["id"] for i in load] == [f"long{k}/load/r{r}" for r in range(2) for k in range(3)]
    codes = [i["expected"] for i in solo]
    assert len(set(codes)) == 3 and all(len(c) == CODE_DIGITS and c.isdigit() for c in codes)
    assert all(i["identical_to_solo"] is True and i["load_in_flight_at_send"] >= 1 for i in load)
    assert m["load_in_flight_at_send_min"] >= 1 and m["load"]["errors"] == 0 and m["load"]["ok"] >= 3
    # the fake's tokenizer counts words: every prompt within its budget
    assert all(t is not None and t <= 120 + 1 for t in m["prompt_tokens"])
    path = record_path(scratch.root / "reports", "la1", "fake-la", "la")
    assert audit(read_record(path), path.parent) == []


def test_right_alone_and_wrong_under_load_is_bad_and_fails(scratch):
    code, rec = run(scratch, "busy-wrong")
    m = rec["metrics"]
    assert code == 1 and rec["verdict"]["status"] == "fail"
    assert (m["n"], m["bad"], m["divergent"], m["solo_right"]) == (6, 6, 6, 3)
    assert {i["bad"] for i in rec["items"] if i["condition"] == "under load"} == {"right solo, wrong under load"}
    assert any("bad answer long0/load/r0 under load: right solo, wrong under load" in r
               for r in rec["verdict"]["reasons"])


def test_other_words_with_the_same_code_are_divergent_not_bad(scratch):
    code, rec = run(scratch, "busy-diverge")
    m = rec["metrics"]
    assert code == 0, rec["verdict"]
    assert (m["n"], m["bad"], m["divergent"]) == (6, 0, 6)
    load = [i for i in rec["items"] if i["condition"] == "under load"]
    assert all(i["correct"] and i["identical_to_solo"] is False and " indeed " in i["output"] for i in load)


def test_a_code_the_server_cannot_find_alone_fails_naming_the_prompts(scratch):
    # planted before the text's last problem: the fake answers that problem's number, never the code
    code, rec = run(scratch, "ok", needle_depth=0.5)
    m = rec["metrics"]
    assert code == 1 and m["solo_right"] == 0 and m["bad"] == 0  # the same wrong answer under load: not "bad"
    assert m["solo_wrong"] == ["long0", "long1", "long2"]
    assert any("0 of 3 right alone" in r and "wrong solo: long0, long1, long2" in r for r in rec["verdict"]["reasons"])


def test_garbage_is_bad_alone_and_under_load(scratch):
    code, rec = run(scratch, "garbage", min_solo_right_share=0.0)
    m = rec["metrics"]
    assert code == 1 and m["bad"] == 3 + 6 and m["solo_garbage"] == 3 and m["solo_right"] == 0  # alone and under load
    assert {i["garbage"] for i in rec["items"]} == {"replacement character in answer"}


def test_a_server_that_dies_is_an_error_never_a_pass(scratch):
    add_suite(scratch, "la", "long-answers", PARAMS, gate={"max": {"bad": 0}})
    scratch.config("fake-la-die", mode="die-after", FAKE_VLLM_DIE_AFTER=5, FAKE_VLLM_ITL_MS=20, FAKE_VLLM_TOKENS=40)
    assert main(["suite", "la", "--config", "fake-la-die", "--release", "la1"]) == 2  # not checked
    rec = record(scratch, "la1", "fake-la-die", "la")
    assert rec["verdict"]["status"] == "error"
    assert "exited with status 9, during the long answers" in rec["verdict"]["cause"]


def test_edited_counts_or_items_do_not_stand(scratch):
    code, _ = run(scratch, "busy-wrong")
    assert code == 1
    path = record_path(scratch.root / "reports", "la1", "fake-la", "la")
    rec = read_record(path)
    assert audit(rec, path.parent) == []
    rec.metrics["bad"] = 0
    assert audit(rec, path.parent) == ["its counts are not its items': bad = 0, its items give 6"]
    rec = read_record(path)
    rec.metrics["bad"] = "0"  # a string is not a count
    assert audit(rec, path.parent) == ["its counts are not its items': bad = '0', its items give 6"]
    rec = read_record(path)
    for i in rec.items:  # every bad mark removed, and the count with it
        (i.model_extra or {}).pop("bad", None)
    rec.metrics["bad"] = 0
    why = audit(rec, path.parent)
    assert len(why) == 6 and why[0] == "item long0/load/r0 is not bad, its answers say bad"
    rec = read_record(path)
    load0 = next(i for i in rec.items if i.id == "long0/load/r0")
    load0.output = load0.output.replace(load0.output.split()[-1], "\ufffd")  # garbage not marked as such
    assert "item long0/load/r0 says garbage=None, its text and tokens say 'replacement character in answer'" in \
        audit(rec, path.parent)

    def forged(edit) -> list[str]:
        """The audit of the record edited by ``edit``, with its verdict turned to pass."""
        r = read_record(path)
        edit(r)
        r.verdict.status = "pass"
        return audit(r, path.parent)

    def hide_load(r):  # every answer under load removed, and its counts with it
        r.items = [i for i in r.items if i.condition == "solo"]
        r.metrics.update(n=0, bad=0, divergent=0)
    assert forged(hide_load)[0].startswith("its items are not its 3 solo answers and 6 answers under load")

    def as_errors(r):  # the bad answers turned into failed requests
        for i in r.items:
            if (i.model_extra or {}).pop("bad", None):
                i.error = "timeout"
        r.metrics.update(bad=0, errors=6)
    assert "it says pass with 6 failed long answers" in " ".join(forged(as_errors))

    def no_code(r):  # a bad answer that expects nothing
        next(i for i in r.items if i.id == "long0/load/r0").expected = None
    assert "item long0/load/r0 expects None, its solo answer" in " ".join(forged(no_code))

    def thought(r):  # a wrong answer said to be thinking, and right
        i = next(i for i in r.items if i.id == "long0/load/r0")
        i.thinking, i.correct = "answered", True
    assert "item long0/load/r0 says correct=True, its text says False" in forged(thought)

    def renamed(r):  # a condition or an id the counts do not see
        next(i for i in r.items if i.id == "long0/load/r0").condition = "under-load"
    assert "item long0/load/r0 says condition 'under-load', its id says 'under load'" in forged(renamed)

    def counts_gone(r):
        r.metrics = {"bad": 0}
    assert any(w.startswith("its counts are not its items': n = None") for w in forged(counts_gone))

    # through the verdict: the forged pass is not checked, never a pass
    rec = read_record(path)
    rec.metrics["bad"] = 0
    rec.verdict.status, rec.verdict.cause, rec.verdict.reasons = "pass", None, []
    path.write_text(rec.model_dump_json(indent=1))
    chk = next(c for c in assess_release(scratch.root / "reports", "la1", root=scratch.root).checks
               if c.area == "suite" and c.name == "la")
    assert chk.outcome == "not-checked" and chk.status == "audit-failed" and "bad = 0, its items give 6" in chk.message


def test_the_needle_sits_where_asked_and_no_code_is_in_the_text():
    import random

    parts = [f"Problem {i}: 3 apples and {i} pears." for i in range(10)]
    text, after = _compose(parts, "48213", 0.9)
    assert text.index("The secret code is 48213.") > text.index("Problem 8") and "Problem 9" in after
    assert text.endswith(QUESTION) and after.endswith(QUESTION) and not any(c.isdigit() for c in QUESTION)
    rng = random.Random(0)
    context = " ".join(str(n) for n in range(10000, 10400))
    codes = {_draw_code(rng, context, set()) for _ in range(50)}
    assert all(not (10000 <= int(c) < 10400) and len(c) == CODE_DIGITS for c in codes)


def test_a_pass_with_too_few_right_alone_does_not_stand(scratch):
    code, _ = run(scratch, "ok", needle_depth=0.5)  # 0 of 3 right alone: a failed suite
    assert code == 1
    path = record_path(scratch.root / "reports", "la1", "fake-la", "la")
    rec = read_record(path)
    rec.verdict.status = "pass"  # counts left consistent, only the verdict edited
    assert audit(rec, path.parent) == [
        "it says pass with 0 of 3 right alone, fewer than the 3 min_solo_right_share=1.0 asks"]

"""Reasoning models: the answer after the thinking is scored (GSM8K, HumanEval, strict sanity), the thinking is
kept in the record, pairing refuses thinking against none, and the release notes show the thinking figures."""
from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import os
import subprocess
import sys
import time
import uuid

import httpx
import pytest
import yaml

from tests.conftest import REPO, tiny_gsm8k
from tests.validate.test_compare import eval_record
from validate.cli import main
from validate.client import OpenAIClient
from validate.compare import PairingError, pair
from validate.reasoning import KEEP_REASONING_CHARS, item_fields, split_reply, think_start

pytestmark = pytest.mark.timeout(120)

THINK_MODES = ("think-separate", "think-inline", "think-recite")


@contextlib.contextmanager
def thinking_server(mode: str, **env):
    """tests.fake_vllm in a thinking ``mode``, started by hand (someone else's server); yields (url, model)."""
    from validate.server import free_port, port_in_use

    port, tag = free_port(), f"fake-{uuid.uuid4().hex[:10]}"
    proc = subprocess.Popen([sys.executable, "-m", "tests.fake_vllm", "--port", str(port), "--served-model-name", tag],
                            cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO), "FAKE_VLLM_MODE": mode,
                                           "FAKE_VLLM_ITL_MS": "0", **{k: str(v) for k, v in env.items()}},
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.time() + 20
        while not port_in_use("127.0.0.1", port) and time.time() < deadline:
            time.sleep(0.1)
        yield f"http://127.0.0.1:{port}", tag
    finally:
        proc.kill()
        proc.wait()


def record(scratch, release: str, cfg: str, suite: str) -> dict:
    return json.loads((scratch.root / "reports" / release / cfg / f"{suite}.json").read_text())


# ------------------------------------------------------------------------------------------------ splitting


@pytest.mark.parametrize("text,reasoning,answer,thinking,state", [
    ("#### 7", "", "#### 7", "", "none"),
    # inline: scored after the *last* marker; the recited example inside the thinking is not the answer
    ("<think> recall example: #### 72 </think> So #### 18", "", " So #### 18", "recall example: #### 72", "answered"),
    ("<think>a</think>b</think> #### 3", "", " #### 3", "a</think>b", "answered"),
    # a template that opened the thinking in the prompt: only the end marker is in the reply
    ("step one #### 5\n</think>\n#### 6", "", "\n#### 6", "step one #### 5", "answered"),
    # never closed: no answer, whatever the thinking says
    ("<think> so #### 72 and on and on", "", None, "so #### 72 and on and on", "unclosed"),
    # separated by the server's reasoning parser
    ("So #### 18", "recall example: #### 72", "So #### 18", "recall example: #### 72", "answered"),
    ("", "recall example: #### 72 and on", None, "recall example: #### 72 and on", "unclosed"),
])
def test_the_answer_is_what_follows_the_thinking(text, reasoning, answer, thinking, state):
    r = split_reply(text, reasoning)
    assert (r.answer, r.thinking, r.state) == (answer, thinking, state)


def test_the_marker_is_the_configurations():
    assert think_start("</think>") == "<think>" and think_start("</reasoning>") == "<reasoning>"
    assert think_start("[END THOUGHT]") is None
    r = split_reply("<reasoning>#### 1</reasoning>#### 2", think_end="</reasoning>")
    assert (r.answer, r.state) == ("#### 2", "answered")
    assert split_reply("<think>#### 1</think>#### 2", think_end="</reasoning>").state == "none"  # another marker
    r = split_reply("#### 1 [END THOUGHT] #### 2", think_end="[END THOUGHT]")
    assert (r.answer, r.thinking) == (" #### 2", "#### 1")
    with pytest.raises(ValueError):
        split_reply("x", think_end="")


def test_long_reasoning_is_kept_as_its_length_and_hash():
    from validate.client import RequestResult

    long = "hmm " * 2000
    res = RequestResult(ok=True, text="#### 3", reasoning=long, finish_reason="stop", output_tokens=2002,
                        reasoning_tokens=2000, chunk_tokens=[1] * 2002, chunk_chars=[0] * 2000 + [4, 2])
    f = item_fields(res, split_reply(res.text, res.reasoning))
    assert len(long.strip()) > KEEP_REASONING_CHARS and "reasoning" not in f
    assert f["reasoning_chars"] == len(long.strip())
    assert f["reasoning_sha256"] == hashlib.sha256(long.strip().encode()).hexdigest()
    assert (f["thinking"], f["thinking_tokens"], f["answer_tokens"], f["finish_reason"]) == ("answered", 2000, 2, "stop")


# ------------------------------------------------------------------------------------------------ the stream


def test_a_vllm_chat_stream_with_a_reasoning_parser():
    """vLLM's /v1/chat/completions stream with --reasoning-parser qwen3 and return_token_ids (serving_chat.py):
    the thinking in deltas carrying ``reasoning`` and ``reasoning_content`` alike, the <think> and </think>
    tokens as chunks of an empty delta (the parser holds them back; token ids are still sent), then content."""
    base = {"id": "chatcmpl-5f1d", "object": "chat.completion.chunk", "created": 1764763200, "model": "qwen3"}

    def chunk(delta, ids, finish=None):
        c = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
        if ids is not None:
            c["token_ids"] = ids
        return {**base, "choices": [c]}

    think = [("Okay", 32313), (",", 11), (" recall", 19091), (" #### 72", 39848), (".\n", 624)]
    answer = [("\n\nSo", 4416), (" ####", 26487), (" 18", 220)]
    events = [{**base, "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                                    "finish_reason": None}], "prompt_token_ids": None},
              chunk({}, [151667])]
    events += [chunk({"reasoning": t, "reasoning_content": t}, [i]) for t, i in think]
    events += [chunk({}, [151668])]
    events += [chunk({"content": t}, [i]) for t, i in answer]
    events += [chunk({"content": ""}, [151645], "stop"),
               {**base, "choices": [], "usage": {"prompt_tokens": 40, "total_tokens": 51, "completion_tokens": 11}}]
    body = "".join(f"data: {json.dumps(e)}\n\n" for e in events) + "data: [DONE]\n\n"

    async def go():
        t = httpx.MockTransport(lambda req: httpx.Response(200, content=body.encode()))
        async with OpenAIClient("http://vllm", "qwen3", transport=t) as c:
            return await c.chat([{"role": "user", "content": "q"}], max_tokens=64)

    r = asyncio.run(go())
    assert r.ok, r.error
    assert r.reasoning == "Okay, recall #### 72.\n" and r.text == "\n\nSo #### 18"
    assert r.reasoning_tokens == 7  # <think>, five thinking tokens, </think>
    reply = split_reply(r.text, r.reasoning)
    assert (reply.answer, reply.state) == ("\n\nSo #### 18", "answered")
    f = item_fields(r, reply)
    assert (f["thinking_tokens"], f["answer_tokens"], f["reasoning"]) == (7, 4, "Okay, recall #### 72.")


def test_the_synthetic_server_sends_thinking_apart():
    from tests.synth_server import Script, SynthServer

    async def go():
        async with SynthServer(Script(ttft_ms=1, itl_ms=1, reasoning=3, tokens_per_chunk=2)) as s:
            async with OpenAIClient(s.url, "synth") as c:
                return await c.chat([{"role": "user", "content": "q"}], max_tokens=8)

    r = asyncio.run(go())
    assert r.ok, r.error
    # chunks of two: tokens 100-101 and 102-103 start inside the first three, so they are thinking, whole
    assert r.reasoning == " t100 t101 t102 t103" and r.text == " t104 t105 t106 t107"
    assert r.reasoning_tokens == 4 and r.output_tokens == 8


def test_inline_thinking_tokens_are_counted_up_to_the_marker():
    from validate.client import RequestResult

    pieces = ["<think>", " a", " b", "</think>", "\n#### ", "4"]
    res = RequestResult(ok=True, text="".join(pieces), finish_reason="stop", output_tokens=6,
                        chunk_tokens=[1] * 6, chunk_chars=[len(p) for p in pieces])
    f = item_fields(res, split_reply(res.text))
    assert (f["thinking"], f["reasoning"], f["thinking_tokens"], f["answer_tokens"]) == ("answered", "a b", 4, 2)


# ------------------------------------------------------------------------------------------------ GSM8K


@pytest.mark.timeout(200)
@pytest.mark.parametrize("mode", THINK_MODES + ("think-unclosed",))
def test_a_thinking_server_is_scored_on_its_answer_on_the_quick_gsm8k(scratch, tmp_path, monkeypatch, mode):
    """The server thinks out loud (reciting an example's '#### 72' except in think-inline) and is right on every
    question: 20 of 20; one whose thinking never ends has no answer, 0 of 20, every item cut off while thinking."""
    data = tiny_gsm8k(tmp_path / "data60", n_test=60)
    monkeypatch.setenv("R9K_DATA_DIR", str(data))
    with thinking_server(mode, FAKE_VLLM_GSM8K=data / "gsm8k" / "test.jsonl") as (url, tag):
        rc = main(["suite", "gsm8k", "--url", url, "--model", tag, "--max-num-seqs", "4", "--max-model-len", "4096",
                   "--profile", "quick", "--release", "t1"])
    cfg = next(p.name for p in (scratch.root / "reports" / "t1").iterdir() if p.is_dir())
    rec = record(scratch, "t1", cfg, "gsm8k")
    m = rec["metrics"]
    assert rc == 0 and rec["verdict"]["status"] == "pass"
    assert m["n"] == 20 and rec["dataset"]["subset"] and m["think_end"] == "</think>"
    items = rec["items"]
    if mode == "think-unclosed":
        assert (m["correct"], m["correct_flexible"], m["after_thinking"], m["unclosed_thinking"]) == (0, 0, 0, 20)
        assert {(i["thinking"], i["answer"], i["finish_reason"]) for i in items} == {("unclosed", None, "length")}
        assert all(i["thinking_tokens"] == 384 and i["answer_tokens"] == 0 for i in items)
        return
    assert (m["correct"], m["correct_strict"], m["correct_flexible"]) == (20, 20, 20)
    assert (m["after_thinking"], m["unclosed_thinking"]) == (20, 0)
    assert {(i["thinking"], i["finish_reason"]) for i in items} == {("answered", "stop")}
    recites = mode != "think-inline"
    assert all(("#### 72" in i["reasoning"]) == recites for i in items)
    # the fake's words are tokens: "<think>", the thinking's words ("Add the amounts step by step." and the
    # recital's five), "</think>"; apart, the thinking's words alone
    spent = {"think-separate": 11, "think-recite": 13, "think-inline": 8}[mode]
    assert {i["thinking_tokens"] for i in items} == {spent}
    assert all(i["answer_tokens"] == len(f"So the total is {i['expected']}. #### {i['expected']}".split())
               for i in items)


# ------------------------------------------------------------------------------------------------ HumanEval


@pytest.mark.timeout(200)
@pytest.mark.parametrize("mode", ["think-recite", "think-separate", "think-unclosed"])
def test_humaneval_runs_the_code_after_the_thinking(tmp_path, mode):
    """The thinking drafts a function that raises in a python block (think-recite: inline, before the right one);
    the program run is the answer's; a thinking that never ends has no program."""
    from validate.runners import humaneval as runner
    from validate.runners.base import RunContext

    async def go(url, tag):
        async with OpenAIClient(url, tag) as client:
            ctx = RunContext(root=tmp_path, config=None, profile="quick", client=client, data_dir=None,
                             record_dir=tmp_path)
            return await runner.run(ctx, runner.HumanEvalParams(limit=3, max_tokens=2000))

    with thinking_server(mode) as (url, tag):
        out = asyncio.run(go(url, tag))
    m = out.metrics
    assert not out.errors
    if mode == "think-unclosed":
        assert (m["passed"], m["failed"], m["unclosed_thinking"]) == (0, 3, 3)
        assert {(i.status, i.detail, i.thinking) for i in out.items} == {
            ("failed", "no answer: the thinking never ended", "unclosed")}
        return
    assert (m["passed"], m["after_thinking"], m["think_end"]) == (3, 3, "</think>")
    assert all("NotImplementedError('draft')" in i.reasoning for i in out.items)
    assert not any("NotImplementedError('draft')" in i.program for i in out.items)


# ------------------------------------------------------------------------------------------------ sanity


@pytest.mark.timeout(200)
@pytest.mark.parametrize("mode", ["think-recite", "think-unclosed"])
def test_strict_sanity_judges_the_answer_after_the_thinking(scratch, mode):
    """The thinking recites '7', another prompt's answer: judged on the whole text every prompt but n1 would be
    wrong alone. A thinking that never ends is no answer: bad, and none right alone."""
    (scratch.root / "suites" / "think-sanity.yaml").write_text(yaml.safe_dump({
        "name": "think-sanity", "kind": "strict-sanity", "params": {"prompts_file": "data/fake_prompts.yaml",
        "overload": [2.0], "rounds": 1, "max_tokens": 40}, "gate": {"max": {"bad": 0}}}))
    scratch.config("fake-think", mode=mode, FAKE_VLLM_RECITE="7", FAKE_VLLM_ITL_MS=0)
    rc = main(["suite", "think-sanity", "--config", "fake-think", "--release", "s1"])
    rec = record(scratch, "s1", "fake-think", "think-sanity")
    m = rec["metrics"]
    solo = [i for i in rec["items"] if i["condition"] == "solo"]
    if mode == "think-unclosed":
        assert rc == 1 and (m["solo_right"], m["unclosed_thinking"], m["bad"]) == (0, 5, 5 + 8)  # 8 = 2 x max_num_seqs
        assert all(i["bad"] == "no answer: the thinking never ended (finish reason length)" for i in solo)
        return
    assert rc == 0, rec["verdict"]
    assert (m["solo_right"], m["bad"], m["after_thinking"], m["unclosed_thinking"]) == (5, 0, 5, 0)
    assert all(i["reasoning"].endswith("Recall the example: 7.") for i in solo)


def test_sanity_garbage_is_judged_on_the_answer_and_the_thinkings_characters():
    from validate.client import RequestResult
    from validate.runners.sanity import garbage_reason

    def why(text, reasoning=""):
        r = RequestResult(ok=True, text=text, reasoning=reasoning, token_ids=[1, 2], finish_reason="length")
        return garbage_reason(r, 12, split_reply(r.text, r.reasoning))

    assert why("<think>Wait. Wait. Wait. Wait. Paris?</think>Paris.") is None  # a thinking model may hesitate
    assert why("Paris.", "Wait. Wait. Wait. Wait.") is None
    assert why("<think>Paris\ufffd</think>Paris.") == "replacement character in the thinking"
    assert why("Paris.", "Paris\x07") == "control character in the thinking"
    assert why("<think>Paris</think>Paris. Paris. Paris. Paris.").startswith("the phrase 'Paris' repeated")
    assert why("<think>Paris</think>  ") == "empty answer"
    assert why("<think>The answer is Paris") == "no answer: the thinking never ended (finish reason length)"


# ------------------------------------------------------------------------------------------------ pairing


def thinking_record(release, right, think_end="</think>", thought=True):
    r = eval_record(release, right)
    r.metrics.update({"after_thinking": 150 if thought else 0, "unclosed_thinking": 0, "think_end": think_end})
    return r


def test_pairing_refuses_thinking_against_none_and_other_markers(tmp_path):
    from tests.validate.test_compare import save

    plain, thinking = eval_record("v1", set(range(100))), thinking_record("v2", set(range(100)))
    with pytest.raises(PairingError, match="the candidate thinks and the baseline does not"):
        pair(plain, thinking)
    with pytest.raises(PairingError, match="the baseline thinks and the candidate does not"):
        pair(thinking_record("v1", set()), thinking_record("v2", set(), thought=False))
    with pytest.raises(PairingError, match=r"end-of-thinking markers differ \('</think>' vs '</reasoning>'\)"):
        pair(thinking_record("v1", set()), thinking_record("v2", set(), think_end="</reasoning>"))
    t = pair(thinking_record("v1", set(range(100))), thinking_record("v2", set(range(100))))
    assert (t.b, t.c) == (0, 0)
    # the gate cannot check it: exit status 2, never a pass or a regression
    save(tmp_path, plain, thinking)
    assert main(["gate", "--accept-other-tree", "v2", "--against", "v1", "--reports", str(tmp_path)]) == 2
    # unless asked to: then the pair is made and judged (here it lost nothing)
    assert pair(plain, thinking, across_thinking=True).b == 0
    assert main(["gate", "--accept-other-tree", "--pair-across-thinking", "v2", "--against", "v1", "--reports",
                 str(tmp_path)]) == 0


# ------------------------------------------------------------------------------------------------ configuration


def test_the_marker_is_a_strict_configuration_field(tmp_path):
    from validate.config import load_config
    from validate.errors import InputError

    base = yaml.safe_load((REPO / "serve" / "cpu-smol.yaml").read_text())
    p = tmp_path / "serve" / "cpu-smol.yaml"
    p.parent.mkdir()
    p.write_text(yaml.safe_dump(base))
    default = load_config(p)
    assert default.think_end == "</think>"
    before = default.model_dump(mode="json", exclude={"description", "launch_timeout_s", "think_end", "knob_sets"})
    before["model"].pop("weights")  # unset: fields added since leave the hash as it was
    blob = json.dumps(before, sort_keys=True).encode()
    assert default.digest() == hashlib.sha256(blob).hexdigest()[:16]  # the hash it had before the field
    p.write_text(yaml.safe_dump({**base, "think_end": "</reasoning>"}))
    assert load_config(p).think_end == "</reasoning>" and load_config(p).digest() != default.digest()
    for bad in ("", " </think>", "</think>\n", "</th\tink>", 5):
        p.write_text(yaml.safe_dump({**base, "think_end": bad}))
        with pytest.raises(InputError, match="think_end"):
            load_config(p)


# ------------------------------------------------------------------------------------------------ notes


def test_release_notes_show_the_thinking_figures_and_flag_a_gap(tmp_path):
    from tests.validate.test_records_render import GSM, rec
    from validate.record import Dataset, record_path, write_record
    from validate.render import render_release

    sub = Dataset(name="gsm8k-test", sha256="x", n_total=1319, n_used=40, subset=True, seed=1234)
    think = {**GSM, "correct": 4, "accuracy": 0.1, "accuracy_strict": 0.1, "accuracy_flexible": 0.85,
             "after_thinking": 30, "unclosed_thinking": 10, "think_end": "</think>"}
    for r in (rec("qwen-think", "gsm8k", metrics=think, dataset=sub), rec("cpu-smol", "gsm8k", metrics=GSM, dataset=sub)):
        write_record(record_path(tmp_path, "v9", r.config, r.suite), r)
    notes = render_release(REPO, tmp_path, "v9", None).read_text()
    assert "| qwen-think | gsm8k | 30 of 40 (75.0%) | 10 (25.0%) | `</think>` | +75.0 points: **likely extraction problem** |" in notes
    assert "| cpu-smol | gsm8k | – of 40 (–) | – (–) | – | +2.5 points |" in notes  # a record from before the figures
    assert ("- qwen-think / gsm8k: the flexible and strict figures differ by 75.0 points, more than 5: a likely "
            "extraction problem") in notes
    assert notes.index("## Quality gate") < notes.index("Thinking: each answer") < notes.index("## Validation record")
    # nothing thinks and no gap: no block
    for cfg in ("qwen-think",):
        (tmp_path / "v9" / cfg / "gsm8k.json").unlink()
    assert "Thinking: each answer" not in render_release(REPO, tmp_path, "v9", None).read_text()

"""The top two of each greedy token (validate.margins): read from streamed chat and completions chunks, kept on the
item compactly, and a parting of two answers classified near-tie or clear at exact values."""
from __future__ import annotations

import asyncio
import json

import httpx
import pytest

from tests.validate.test_client_metrics import USAGE, delta, run_chat, sse
from validate.client import OpenAIClient
from validate.margins import CLEAR, NEAR_TIE, bound, classify, margin, mode_of, step_of, ulp_bf16
from validate.record import Item

pytestmark = pytest.mark.timeout(30)


def top(*pairs):
    """A chat chunk's logprobs for one token: its top entries, the first the chosen one."""
    return {"content": [{"token": pairs[0][0], "logprob": pairs[0][1],
                         "top_logprobs": [{"token": t, "logprob": v} for t, v in pairs]}]}


def with_lp(chunk, lp):
    chunk["choices"][0]["logprobs"] = lp
    return chunk


def test_streamed_chat_logprobs_become_one_step_per_token_id():
    seen = {}

    def answer(req: httpx.Request) -> httpx.Response:
        seen.update(json.loads(req.content))
        return httpx.Response(200, content=sse(
            delta(role="assistant", content=""),
            with_lp(delta("Hel", [11]), top(("token_id:11", 12.5), ("token_id:40", 12.4375))),
            # listed out of order and with the chosen token twice (vLLM's sampled entry first): sorted, top two kept
            with_lp(delta("lo", [12]), top(("token_id:12", -0.1234567), ("token_id:3", -3.0), ("token_id:12", -0.1234567))),
            with_lp(delta("", [2], finish="stop"), top(("<|end|>", 7.0), ("token_id:5", float("-inf")))), USAGE))

    async def go():
        async with OpenAIClient("http://x", "m", transport=httpx.MockTransport(answer)) as c:
            return await c.chat([{"role": "user", "content": "hi"}], max_tokens=8, top2=True)

    r = asyncio.run(go())
    assert (seen["logprobs"], seen["top_logprobs"], seen["return_tokens_as_token_ids"]) == (True, 2, True)
    assert r.ok and r.token_ids == [11, 12, 2]
    # ids where the server named them by id, text where it did not; 5 decimals; -inf kept as None
    assert r.top2 == [[11, 12.5, 40, 12.4375], [12, -0.12346, 12, -0.12346], ["<|end|>", 7.0, 5, None]]


def test_a_chunk_of_several_tokens_keeps_steps_at_their_tokens():
    lp = {"content": [{"token": "token_id:1", "logprob": 1.0, "top_logprobs": [{"token": "token_id:1", "logprob": 1.0}]}]}
    r = run_chat(sse(with_lp(delta("ab", [1, 2]), lp), delta("c", [3], finish="stop"), USAGE))
    assert r.ok and r.top2 == [[1, 1.0], []]  # a step short: padded, so token 1's is empty; token 3 sent none


def test_completions_logprobs_and_a_server_that_ignores_them():
    chunk = {"choices": [{"index": 0, "text": "x", "token_ids": [9], "finish_reason": "length",
                          "logprobs": {"tokens": ["token_id:9"], "token_logprobs": [-0.5],
                                       "top_logprobs": [{"token_id:9": -0.5, "token_id:4": -1.25}],
                                       "text_offset": [0]}}]}
    seen = {}

    def answer(req):
        seen.update(json.loads(req.content))
        return httpx.Response(200, content=sse(chunk, {"choices": [], "usage": {"prompt_tokens": 1,
                                                                                  "completion_tokens": 1}}))

    async def go():
        async with OpenAIClient("http://x", "m", transport=httpx.MockTransport(answer)) as c:
            return await c.completion("p", max_tokens=1, top2=True)

    r = asyncio.run(go())
    assert seen["logprobs"] == 2 and r.ok and r.top2 == [[9, -0.5, 4, -1.25]]
    # no logprobs in the stream: the answer stands, without steps
    r = run_chat(sse(delta("Hi", [1]), delta("", [2], finish="stop"), USAGE))
    assert r.ok and r.top2 is None


def test_malformed_logprobs_are_dropped_and_the_answer_stands():
    r = run_chat(sse(with_lp(delta("a", [1]), {"content": "nope"}), delta("", [2], finish="stop"), USAGE))
    assert r.ok and r.text == "a" and r.top2 is None and "malformed logprobs" in r.top2_error
    r = run_chat(sse(with_lp(delta("a", [1]), top(("token_id:1", "high"))), delta("", [2], finish="stop"), USAGE))
    assert r.ok and r.top2 is None


def test_an_item_stores_its_steps_as_one_line_and_reads_them_back():
    it = Item(id="q/solo", prompt_hash="h", token_ids=[11, 12], top2=[[11, 12.5, 40, 12.4375], [12, 1.0, "é", 0.5]],
              logprobs_mode="processed_logits")
    text = it.model_dump_json(indent=1)
    assert '"top2": "[[11,12.5,40,12.4375],[12,1.0,\\"é\\",0.5]]"' in text
    back = Item.model_validate_json(text)
    assert back.top2 == it.top2 and back.logprobs_mode == "processed_logits"
    assert "top2" not in Item(id="q", prompt_hash="h").model_dump_json()  # absent where none came
    with pytest.raises(ValueError, match="top2 is not the compact JSON"):
        Item.model_validate({"id": "q", "prompt_hash": "h", "top2": "[[1,"})


def test_the_bf16_step_and_the_mode_of_a_configuration():
    assert ulp_bf16(18.5) == 0.125 and ulp_bf16(-1.0) == 2 ** -7 and ulp_bf16(0.75) == 2 ** -8
    assert ulp_bf16(255.9) == 1.0 and ulp_bf16(256.0) == 2.0
    assert mode_of([], launched=True) == "raw_logprobs"  # vLLM's default
    assert mode_of(["--logprobs-mode", "processed_logits"], launched=True) == "processed_logits"
    assert mode_of(["--logprobs-mode=raw_logits"], launched=True) == "raw_logits"
    assert mode_of(["--logprobs-mode", "raw_logits"], launched=False) is None  # a --url server's flags are unknown
    with pytest.raises(ValueError, match="vLLM knows"):
        mode_of(["--logprobs-mode", "logits"], launched=True)


def _side(step, mode="processed_logits", gen=None, n=5, at=3):
    top2 = [[100 + i, 20.0, 7, 19.0] for i in range(n)]
    if step is not None:
        top2[at] = step
    return {"top2": top2, "token_ids": [100 + i for i in range(n)], "logprobs_mode": mode,
            "gen": gen or {"temperature": 0.0}}


@pytest.mark.parametrize("m, kind", [(0.0, NEAR_TIE),      # a tie: argmax takes either
                                     (0.25, NEAR_TIE),     # 2 steps of 0.125 at 18.5: just inside
                                     (0.25001, CLEAR),     # just outside, at the values' stored resolution
                                     (0.375, CLEAR)])      # the next bf16 gap: 3 steps
def test_a_parting_is_a_near_tie_within_two_bf16_steps_on_both_sides(m, kind):
    c, b = [103, 18.5, 99, 18.5 - m], [99, 18.5, 103, 18.5 - m]
    p = classify(3, _side(c), _side(b))
    assert p.margins == (m, m) and p.bounds == (0.25, 0.25) and p.kind == kind and p.why is None


def test_one_side_decisive_is_clear_and_a_margin_scales_with_the_logit():
    # the candidate hesitates, the baseline was sure: the logits moved by more than a rounding
    p = classify(3, _side([103, 18.5, 99, 18.5]), _side([99, 18.5, 103, 14.0]))
    assert p.kind == CLEAR and p.largest_margin == 4.5
    # at |z| ~ 300 a step is 2: a margin of 3.5 is still rounding there
    assert classify(3, _side([1, 300.0, 2, 296.5]), _side([2, 300.0, 1, 297.0])).kind == NEAR_TIE
    # the presence penalty's share of the magnitude: 255 + 1.5 is in the binade of 256, steps of 2
    step = [1, 255.0, 2, 251.5]
    assert bound(step) == 2.0 and bound(step, 1.5) == 4.0
    pen = {"temperature": 0.0, "presence_penalty": 1.5}
    assert classify(3, _side(step, gen=pen), _side(step, gen=pen)).kind == NEAR_TIE
    assert classify(3, _side(step), _side(step)).kind == CLEAR


@pytest.mark.parametrize("cmode, bmode, gen, why", [
    ("raw_logprobs", "raw_logprobs", None, "the values are logprobs"),
    (None, None, None, "mode is unknown"),
    ("raw_logits", "processed_logits", None, "other modes"),
    ("processed_logits", "processed_logits", {"temperature": 0.0, "frequency_penalty": 0.3}, "frequency_penalty"),
])
def test_values_that_cannot_classify_show_margins_and_say_why(cmode, bmode, gen, why):
    p = classify(3, _side([103, -0.01, 99, -0.02], cmode, gen), _side([99, -0.01, 103, -0.03], bmode, gen))
    assert p.kind is None and why in p.why and p.margins == (0.01, 0.02)


def test_no_steps_at_the_parting_are_said():
    p = classify(5, _side(None), _side(None))  # apart where one answer ended: no step past the shorter
    assert p.kind is None and p.why == "no top two at that token on either side"
    short = _side(None)
    short["top2"] = short["top2"][:4]  # steps not one per token id: not placed
    assert classify(3, short, _side(None)).why == "no top two at that token on the candidate's side"
    assert margin([1, 2.0]) is None and step_of([("token_id:3", 1.0)]) == [3, 1.0]

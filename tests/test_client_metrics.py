"""SSE parsing, timing and metrics against scripted streams (httpx.MockTransport)."""
from __future__ import annotations

import asyncio
import json

import httpx
import pytest

from validate.client import OpenAIClient, RequestResult
from validate.metrics import summarize, tpot_s


def sse(*chunks, done=True) -> bytes:
    body = "".join(f"data: {json.dumps(c)}\n\n" for c in chunks)
    return (body + ("data: [DONE]\n\n" if done else "")).encode()


def delta(content=None, ids=None, finish=None, role=None, reasoning=None):
    d = {}
    if role:
        d["role"] = role
    if content is not None:
        d["content"] = content
    if reasoning is not None:
        d["reasoning_content"] = reasoning
    c = {"index": 0, "delta": d, "finish_reason": finish}
    if ids is not None:
        c["token_ids"] = ids
    return {"choices": [c]}


USAGE = {"choices": [], "usage": {"prompt_tokens": 11, "completion_tokens": 4}}


def run_chat(body: bytes, status: int = 200) -> RequestResult:
    transport = httpx.MockTransport(lambda req: httpx.Response(status, content=body))

    async def go():
        async with OpenAIClient("http://x", "m", transport=transport) as c:
            return await c.chat([{"role": "user", "content": "hi"}], max_tokens=8)

    return asyncio.run(go())


def test_role_only_and_empty_chunks_are_not_tokens():
    r = run_chat(sse(delta(role="assistant", content=""), delta("", ids=[]), delta("Hel", [1]), delta("lo", [2, 3]),
                     delta(reasoning="think", ids=[4]), delta("", ids=[2], finish="stop"), USAGE))
    assert r.ok and r.error is None
    assert r.text == "Hello" and r.reasoning == "think"
    assert r.chunk_tokens == [1, 2, 1] and len(r.chunk_times) == 3
    assert r.output_tokens == 4 and r.prompt_tokens == 11 and r.token_ids == [1, 2, 3, 4, 2]
    assert r.finish_reason == "stop"


def test_stream_cut_mid_answer_is_an_error():
    r = run_chat(sse(delta("The", [1]), delta(" answer", [2]), done=False))
    assert not r.ok and "cut mid-answer" in r.error
    assert r.text == "The answer"  # what arrived is kept for the record


def test_error_object_mid_stream():
    r = run_chat(sse(delta("a", [1]), {"error": {"message": "engine dead"}}))
    assert not r.ok and r.error == "server error mid-stream: engine dead"


def test_http_error_status():
    r = run_chat(b'{"error": "bad model"}', status=404)
    assert not r.ok and r.error.startswith("HTTP 404")


def test_done_without_finish_reason():
    r = run_chat(sse(delta("a", [1]), USAGE))
    assert not r.ok and r.error == "stream ended without a finish reason"


def mk(chunks, tokens, ok=True, out=None, prompt=10):
    r = RequestResult(ok=ok, t_sent=0.0, t_done=chunks[-1] + 0.01 if chunks else 1.0, prompt_tokens=prompt)
    r.chunk_times = list(chunks)
    r.chunk_tokens = list(tokens)
    r.output_tokens = out if out is not None else sum(tokens)
    return r


def test_metrics_against_hand_computed_values():
    a = mk([0.100, 0.120, 0.140, 0.160], [1, 1, 1, 1])           # TTFT 100 ms, TPOT 20 ms
    b = mk([0.200, 0.260, 0.320], [1, 3, 3])                      # spec-decode chunks: 7 tokens
    failed = mk([0.05], [1], ok=False)
    m = summarize([a, b, failed], wall_s=2.0)
    assert (m.requests, m.ok, m.errors) == (3, 2, 1)
    assert m.output_tokens == 11 and m.output_tok_s == 5.5 and m.prompt_tok_s == 10.0
    assert m.ttft_ms_p50 == pytest.approx(150.0)
    assert tpot_s(a) == pytest.approx(0.020) and tpot_s(b) == pytest.approx(0.120 / 6)
    # ITL per chunk: 20, 20, 20, 60, 60 -> p50 20; per token: 20, 20, 20, 20, 20
    assert m.itl_ms_p50 == pytest.approx(20.0) and m.itl_token_ms_p50 == pytest.approx(20.0)
    assert m.itl_ms_p99 == pytest.approx(60.0)
    assert m.decode_tok_s_p50 == pytest.approx(50.0)


def test_single_token_request_has_no_tpot():
    assert tpot_s(mk([0.1], [1], out=1)) is None
    with pytest.raises(ValueError):
        summarize([], 0)

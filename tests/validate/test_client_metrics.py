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
    # the last chunk has empty text but a token id (an end-of-sequence token): it is token-bearing
    assert r.chunk_tokens == [1, 2, 1, 1] and len(r.chunk_times) == 4
    assert r.output_tokens == 4 and r.prompt_tokens == 11 and r.token_ids == [1, 2, 3, 4, 2]
    assert r.finish_reason == "stop"


def test_token_ids_with_empty_text_give_a_ttft():
    # a prefill request (max_tokens 1) whose one token has empty text
    one = {"choices": [], "usage": {"prompt_tokens": 11, "completion_tokens": 1}}
    r = run_chat(sse(delta(role="assistant", content=""), delta("", ids=[7], finish="length"), one))
    assert r.ok and r.ttft_s is not None and r.chunk_tokens == [1] and r.text == ""


def test_empty_text_without_token_ids_has_no_ttft():
    one = {"choices": [], "usage": {"prompt_tokens": 11, "completion_tokens": 1}}
    r = run_chat(sse(delta(role="assistant", content=""), delta("", finish="length"), one))
    assert r.ok and r.ttft_s is None and tpot_s(r) is None


def test_usage_beyond_the_chunks_of_a_stream_without_token_ids_is_an_error():
    # a server that ignores return_token_ids: usage may claim no more tokens than its token-bearing chunks
    forged = {"choices": [], "usage": {"prompt_tokens": 11, "completion_tokens": 8}}
    r = run_chat(sse(delta("a"), delta("b"), delta("c", finish="length"), forged))
    assert not r.ok and r.error == "usage says 8 output tokens, the stream carried 3 token-bearing chunks and no token ids"
    three = {"choices": [], "usage": {"prompt_tokens": 11, "completion_tokens": 3}}
    assert run_chat(sse(delta("a"), delta("b"), delta("c", finish="length"), three)).ok


def test_usage_beyond_the_streamed_token_ids_is_an_error():
    # 3 ids streamed, usage claims 8 = max_tokens: every rate would be 2.7 times too high
    forged = {"choices": [], "usage": {"prompt_tokens": 11, "completion_tokens": 8}}
    r = run_chat(sse(delta("a", [1]), delta("b", [2]), delta("c", [3], finish="length"), forged))
    assert not r.ok and r.error == "usage says 8 output tokens, the stream carried 3 token ids"
    held_back = {"choices": [], "usage": {"prompt_tokens": 11, "completion_tokens": 5}}  # 3 ids + 2 of slack
    assert run_chat(sse(delta("a", [1]), delta("b", [2]), delta("c", [3], finish="stop"), held_back)).ok


def test_stream_without_usage_is_an_error():
    # a server that ignores stream_options.include_usage: the answer's length is unknown, not 0 tokens
    r = run_chat(sse(delta("a", [1]), delta("b", [2], finish="length")))
    assert not r.ok and r.error == "stream ended without usage (the server ignored stream_options.include_usage)"
    assert r.text == "ab" and r.output_tokens is None
    assert summarize([r], wall_s=1.0).output_tokens == 0  # an error contributes no token


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


def test_whole_answer_in_one_chunk_has_no_tpot():
    # every token in one SSE event: the decode rate is undefined, never 0 s (an infinite rate)
    one = mk([0.100], [8], out=8)
    same_read = mk([0.100, 0.100, 0.100], [1, 1, 1], out=3)  # several chunks handed over in one read
    assert tpot_s(one) is None and tpot_s(same_read) is None
    m = summarize([one, same_read], wall_s=1.0)
    assert m.tpot_ms_p50 is None and m.decode_tok_s_p50 is None and m.ttft_ms_p50 == pytest.approx(100.0)


def test_first_chunk_with_several_tokens():
    # TPOT = (t_last - t_first) / (output tokens - tokens of the first chunk): 3 tokens came at TTFT
    r = mk([0.100, 0.140, 0.180], [3, 1, 1], out=5)
    assert r.ttft_s == pytest.approx(0.100)
    assert tpot_s(r) == pytest.approx(0.080 / 2)
    assert tpot_s(mk([0.100, 0.160], [4, 4], out=8)) == pytest.approx(0.060 / 4)
    assert tpot_s(mk([0.100], [3], out=3)) is None  # no token after the first chunk
    assert summarize([r], wall_s=1.0).decode_tok_s_p50 == pytest.approx(25.0)


# ---- the runners on scripted streams: undefined figures are step errors, never a crash -------------------
def completion_events(texts, ids=True, usage=True, gap_s=0.0):
    """SSE events of a completion answering ``texts`` (one chunk each), ``gap_s`` apart."""
    ev = []
    for i, t in enumerate(texts):
        c = {"index": 0, "text": t, "finish_reason": "length" if i == len(texts) - 1 else None}
        if ids:
            c["token_ids"] = [100 + i]
        ev.append({"choices": [c]})
    if usage:
        ev.append({"choices": [], "usage": {"prompt_tokens": 16, "completion_tokens": len(texts)}})
    return [(f"data: {json.dumps(e)}\n\n".encode(), gap_s) for e in ev] + [(b"data: [DONE]\n\n", 0.0)]


class Scripted:
    """An httpx transport answering /tokenize and the streaming endpoints: ``decode(body)`` and
    ``prefill(body)`` return the SSE events (bytes, delay before the next) of a max_tokens > 1 / = 1 request."""

    def __init__(self, decode, prefill):
        self.decode, self.prefill = decode, prefill

    def __call__(self, request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        if request.url.path == "/tokenize":
            return httpx.Response(200, json={"tokens": list(range(len(body["prompt"].split())))})
        events = self.prefill(body) if body["max_tokens"] == 1 else self.decode(body)

        async def stream():
            for data, gap in events:
                yield data
                if gap:
                    await asyncio.sleep(gap)

        return httpx.Response(200, headers={"content-type": "text/event-stream"}, content=stream())


def run_runner(kind, params, transport, tmp_path):
    from tests.conftest import REPO, tiny_gsm8k
    from validate.config import ModelSpec, ServeConfig, ServerSpec
    from validate.runners import betterbench, probe
    from validate.runners.base import RunContext

    runner = {"betterbench": betterbench, "probe": probe}[kind]
    cfg = ServeConfig(name="scripted", model=ModelSpec(path="m", served_name="m"),
                      server=ServerSpec(max_num_seqs=2, max_model_len=4096))

    async def go():
        async with OpenAIClient("http://scripted", "m", transport=httpx.MockTransport(transport)) as c:
            ctx = RunContext(root=REPO, config=cfg, profile="quick", client=c, data_dir=tiny_gsm8k(tmp_path / "data"),
                             record_dir=tmp_path)
            params_cls = betterbench.BetterBenchParams if kind == "betterbench" else probe.ProbeParams
            return await runner.run(ctx, params_cls(**params))

    return asyncio.run(go())


BB = {"passes": 1, "decode_tokens": 8, "prefill_depths": [64], "concurrency": [1], "requests_per_client": 1,
      "prompt_tokens": 16, "agg_tokens": 4}
PROBE = {"decode_tokens": 8, "repeats": 2, "concurrency": 1, "requests_per_client": 1, "agg_tokens": 8,
         "prefill_depth": 64}
TIMED = lambda body: completion_events(["w"] * body["max_tokens"], gap_s=0.002)  # noqa: E731
ONE_CHUNK = lambda body: [(b"".join(d for d, _ in completion_events(["w"] * body["max_tokens"])), 0.0)]  # noqa: E731
EMPTY_PREFILL = lambda body: completion_events([""], ids=False)  # noqa: E731
EMPTY_PREFILL_IDS = lambda body: completion_events([""], ids=True)  # noqa: E731


def test_betterbench_decode_in_one_chunk_is_a_step_error(tmp_path):
    out = run_runner("betterbench", BB, Scripted(decode=ONE_CHUNK, prefill=TIMED), tmp_path)
    assert out.errors and "pass 0 decode: no TPOT" in out.errors[0]
    row = out.metrics["per_pass"][0]
    assert "decode_tok_s" not in row and row["prefill_64_tok_s"] > 0
    assert out.metrics["decode_tok_s"] is None and out.metrics["decode_step_ms"] is None
    assert out.metrics["summary"]["c1_tpot_ms_p50"]["median"] is None  # every request of the level in one chunk


def test_betterbench_prefill_without_a_token_bearing_chunk_is_a_step_error(tmp_path):
    out = run_runner("betterbench", BB, Scripted(decode=TIMED, prefill=EMPTY_PREFILL), tmp_path)
    assert out.errors and "pass 0 prefill 64: no token-bearing chunk, TTFT undefined" in out.errors[0]
    row = out.metrics["per_pass"][0]
    assert "prefill_64_tok_s" not in row and row["decode_tok_s"] > 0


def test_betterbench_prefill_token_ids_with_empty_text_count(tmp_path):
    out = run_runner("betterbench", BB, Scripted(decode=TIMED, prefill=EMPTY_PREFILL_IDS), tmp_path)
    assert not out.errors, out.errors
    assert out.metrics["per_pass"][0]["prefill_64_tok_s"] > 0 and out.metrics["decode_tok_s"] > 0


def test_probe_decode_in_one_chunk_and_empty_prefill_are_errors(tmp_path):
    out = run_runner("probe", PROBE, Scripted(decode=ONE_CHUNK, prefill=EMPTY_PREFILL), tmp_path)
    assert len(out.errors) == 2
    assert out.errors[0].startswith("2 of 2 decode requests have no TPOT")
    assert out.errors[1].startswith("2 of 2 prefill requests brought no token-bearing chunk")
    m = out.metrics
    assert m["decode_tok_s"] is None and m["decode_step_ms"] is None and m["decode_tok_s_runs"] == [None, None]
    assert m["prefill_tok_s"] is None and m["prefill_tok_s_runs"] == [None, None] and m["ttft_ms_p50"] > 0


def test_probe_with_timed_chunks_has_every_figure(tmp_path):
    out = run_runner("probe", PROBE, Scripted(decode=TIMED, prefill=EMPTY_PREFILL_IDS), tmp_path)
    assert not out.errors, out.errors
    m = out.metrics
    assert m["decode_tok_s"] > 0 and m["prefill_tok_s"] > 0 and all(x > 0 for x in m["decode_tok_s_runs"])


def test_betterbench_a_level_without_tpot_leaves_combined_decode_undefined(tmp_path):
    """Decode timed alone but every answer under load in one chunk: the level's TPOT is undefined; leaving the
    level out made combined decode equal the single-stream rate (and read faster)."""
    def decode(body):
        return TIMED(body) if body["max_tokens"] == 8 else ONE_CHUNK(body)  # 8: the single-stream decode

    out = run_runner("betterbench", {**BB, "concurrency": [1, 2]}, Scripted(decode=decode, prefill=TIMED), tmp_path)
    assert any("no TPOT at concurrency 1, 2" in e for e in out.errors), out.errors
    assert out.metrics["per_pass"][0]["combined_decode_tok_s"] is None and out.metrics["combined_decode_tok_s"] is None


def test_a_second_choice_is_an_error_not_part_of_the_answer():
    from validate.client.stream import RequestResult, take_chunk

    r = RequestResult(token_ids=[])
    take_chunk(r, {"choices": [{"index": 0, "text": "4", "token_ids": [9]}]}, 0.1)
    take_chunk(r, {"choices": [{"index": 1, "text": " and 5", "token_ids": [7]}]}, 0.2)
    assert r.text == "4" and r.error == "the server sent choice index 1; one choice (index 0) was asked for"


def test_usage_beyond_max_tokens_is_not_believed():
    import httpx

    from validate.client import OpenAIClient

    body = (b'data: {"choices": [{"index": 0, "text": "w", "token_ids": [5], "finish_reason": "length"}]}\n\n'
            b'data: {"choices": [], "usage": {"prompt_tokens": 1, "completion_tokens": 300}}\n\ndata: [DONE]\n\n')

    async def go():
        t = httpx.MockTransport(lambda r: httpx.Response(200, content=body))
        async with OpenAIClient("http://x", "m", transport=t) as c:
            return await c.completion("hi", max_tokens=4)

    r = asyncio.run(go())
    assert not r.ok and r.error == "usage says 300 output tokens, more than max_tokens=4"

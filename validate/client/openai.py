"""The client of one OpenAI-compatible server (:class:`OpenAIClient`): plain endpoints and streamed completions.

Streaming requests over plain http go through :class:`~validate.client.pool.StreamPool`'s connections (the
stamps of validate/client/stream.py; benchmarks/serving/client_timing.py measures their error against a
server's ground truth). With an httpx ``transport`` (tests) or https the same events come through httpx.

Output token counts come from the server's ``usage`` (``stream_options.include_usage``), never from
re-tokenizing. A request whose stream ends without a finish reason, without usage, or with an error object is
an error, never a short answer; so is a connection the server closes or resets before the answer is whole, at
once, whatever state the connection is in (never a wait for the read timeout).
"""
from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any

import httpx
from validate.client.pool import StreamPool
from validate.client.stream import MAX_EVENT_BYTES, SSE, Events, RequestResult, closed_how, take_events
from validate.margins import TOP
from validate.util import within


@dataclass
class Tally:
    """Every streamed request of one client, as the client saw it: counts and the TTFT (ms) of each successful
    request that had one, so a suite's client-side TTFT can be put beside the server's own histogram."""

    requests: int = 0
    ok: int = 0
    ttft_ms: list[float] = field(default_factory=list)

    def add(self, r: RequestResult) -> None:
        self.requests += 1
        if r.ok:
            self.ok += 1
            if r.ttft_s is not None:
                self.ttft_ms.append(r.ttft_s * 1e3)

    def summary(self) -> dict[str, Any]:
        """{requests, ok, ttft_count, ttft_mean_ms, ttft_p50_ms, ttft_p99_ms} (None where there is no TTFT)."""
        import numpy as np

        v = np.asarray(self.ttft_ms, dtype=float)
        r = lambda x: round(float(x), 3)  # noqa: E731
        return {"requests": self.requests, "ok": self.ok, "ttft_count": int(v.size),
                "ttft_mean_ms": r(v.mean()) if v.size else None, "ttft_p50_ms": r(np.percentile(v, 50)) if v.size else None,
                "ttft_p99_ms": r(np.percentile(v, 99)) if v.size else None}


class ServerError(Exception):
    """The server answered a non-streaming request with an error."""


UTILITY_BOUND_S = 60.0  # the whole of one /tokenize or /detokenize call, seconds


def usage_bound(streamed_ids: int) -> int:
    """The most output tokens usage may claim for a stream that carried ``streamed_ids`` token ids (or, from a
    server that sends none, token-bearing chunks): 5 % and 2 tokens of slack for ids a server holds back (a stop
    string's tokens), never the many-fold of a forged count."""
    return int(streamed_ids * 1.05) + 2



class OpenAIClient:
    """Client of one OpenAI-compatible server.

    Args:
        base_url: e.g. ``http://127.0.0.1:8000`` (without ``/v1``).
        model: the served model name sent as ``model``.
        timeout_s: the most a streamed request may take, seconds, silent or not (its read timeout too). After
            :attr:`MAX_TIMEOUTS` requests in all end by it, later ones fail at once: a server that stalls every
            request (or every other one) would otherwise cost that much for each question of a suite.
        max_connections: connection pool size (set it >= the highest concurrency you will use).
        transport: an httpx transport to use instead of the network (tests).
    """

    MAX_TIMEOUTS = 3  # in the client's life, not in a row: answering every other request must not reset it

    def __init__(self, base_url: str, model: str, timeout_s: float = 600.0, max_connections: int = 256,
                 transport: httpx.AsyncBaseTransport | None = None):
        self.base_url = base_url.rstrip("/")
        self.model = model
        self.tally = Tally()
        self.timeout_s = timeout_s
        self._timeouts = 0
        self._http = httpx.AsyncClient(
            base_url=self.base_url, transport=transport,
            timeout=httpx.Timeout(timeout_s, connect=10.0),
            limits=httpx.Limits(max_connections=max_connections, max_keepalive_connections=max_connections),
        )
        url = httpx.URL(self.base_url)
        self._raw = None if transport is not None or url.scheme != "http" else StreamPool(
            url.host, url.port or 80, url.raw_path.decode().rstrip("/"), timeout_s, max_connections)

    async def aclose(self) -> None:
        if self._raw is not None:
            self._raw.close()
        await self._http.aclose()

    async def __aenter__(self) -> "OpenAIClient":
        return self

    async def __aexit__(self, *exc) -> None:
        await self.aclose()

    # ---- plain endpoints -------------------------------------------------------------------------------
    async def health(self) -> bool:
        """True when GET /health answers 200."""
        try:
            r = await within(self._http.get("/health", timeout=5.0), 10.0)  # bounded whole, not per byte
            return r.status_code == 200
        except (httpx.HTTPError, asyncio.TimeoutError):
            return False

    async def _bounded(self, call, what: str):
        """``call`` within UTILITY_BOUND_S in all (httpx's timeouts bound each silence only; /tokenize of a 128k-token
        text takes about a second). Raises ServerError."""
        bound = min(self.timeout_s, UTILITY_BOUND_S)
        try:
            return await within(call, bound)
        except asyncio.TimeoutError:
            raise ServerError(f"{what}: no whole answer within {bound:g} s") from None
        except httpx.HTTPError as e:
            raise ServerError(f"{what}: {type(e).__name__}: {e}") from None

    async def version(self) -> str | None:
        """vLLM's version from GET /version, or None when the server has no such endpoint."""
        try:
            r = await within(self._http.get("/version", timeout=5.0), 10.0)
            return r.json().get("version") if r.status_code == 200 else None
        except (httpx.HTTPError, ValueError, asyncio.TimeoutError, AttributeError):
            return None

    async def tokenize(self, text: str) -> list[int]:
        """Token ids of ``text`` (vLLM's POST /tokenize, no special tokens). Raises ServerError."""
        r = await self._bounded(self._http.post("/tokenize", json={"model": self.model, "prompt": text,
                                                                   "add_special_tokens": False}), "/tokenize")
        if r.status_code != 200:
            raise ServerError(f"/tokenize: HTTP {r.status_code}: {r.text[:200]}")
        return r.json()["tokens"]

    async def detokenize(self, tokens: list[int]) -> str:
        """Text of ``tokens`` (vLLM's POST /detokenize). Raises ServerError."""
        r = await self._bounded(self._http.post("/detokenize", json={"model": self.model, "tokens": tokens}),
                                "/detokenize")
        if r.status_code != 200:
            raise ServerError(f"/detokenize: HTTP {r.status_code}: {r.text[:200]}")
        return r.json()["prompt"]

    # ---- streaming generation --------------------------------------------------------------------------
    async def chat(self, messages: list[dict[str, str]], *, max_tokens: int, temperature: float = 0.0,
                   seed: int | None = None, ignore_eos: bool = False, extra: dict[str, Any] | None = None,
                   top2: bool = False) -> RequestResult:
        """Stream one chat completion. Never raises for server or transport faults: they are in ``error``.

        ``top2``: ask for the top two of each output token (``logprobs: true, top_logprobs: 2`` and
        ``return_tokens_as_token_ids``), parsed into ``RequestResult.top2`` (validate.margins)."""
        body: dict[str, Any] = {"model": self.model, "messages": messages}
        if top2:
            body.update({"logprobs": True, "top_logprobs": TOP, "return_tokens_as_token_ids": True})
        return await self._stream("/v1/chat/completions", body, max_tokens, temperature, seed, ignore_eos, extra)

    async def completion(self, prompt: str | list[int], *, max_tokens: int, temperature: float = 0.0,
                         seed: int | None = None, ignore_eos: bool = False, extra: dict[str, Any] | None = None,
                         top2: bool = False) -> RequestResult:
        """Stream one text completion (prompt as text or token ids). Faults are in ``error``. ``top2``: as
        :meth:`chat` (``logprobs: 2``)."""
        body: dict[str, Any] = {"model": self.model, "prompt": prompt}
        if top2:
            body.update({"logprobs": TOP, "return_tokens_as_token_ids": True})
        return await self._stream("/v1/completions", body, max_tokens, temperature, seed, ignore_eos, extra)

    async def _stream(self, path: str, body: dict[str, Any], max_tokens: int, temperature: float,
                      seed: int | None, ignore_eos: bool, extra: dict[str, Any] | None) -> RequestResult:
        body.update({
            "max_tokens": max_tokens, "temperature": temperature, "stream": True,
            "stream_options": {"include_usage": True}, "return_token_ids": True,
        })
        if seed is not None:
            body["seed"] = seed
        if ignore_eos:
            body["ignore_eos"] = True
        if extra:
            body.update(extra)
        res = RequestResult(token_ids=[])
        res.t_sent = time.perf_counter()
        if self._timeouts >= self.MAX_TIMEOUTS:
            res.error = (f"not sent: {self._timeouts} of the server's requests timed out "
                         f"({self.timeout_s:g} s each); it is not serving")
            res.t_done = res.t_sent
            self.tally.add(res)
            return res
        # a token per event, plus the role, finish, usage and [DONE] events and empty keep-alive chunks
        events = Events(limit=2 * max_tokens + 64)
        try:
            if self._raw is not None:
                send = self._raw.post_sse(path, body, res, events)
            else:
                send = self._httpx_sse(path, body, events)
            try:  # the whole request is bounded, not only its silences: a trickling server ends too
                status, detail, cut = await within(send, self.timeout_s)
            except asyncio.TimeoutError:
                raise asyncio.TimeoutError(f"the request took more than {self.timeout_s:g} s") from None
            if status != 200:
                res.error = f"HTTP {status}: {detail}"
                return res
            if events.overflow:
                res.error = f"the server streamed more than max_tokens={max_tokens} tokens"
                return res
            if events.oversized:
                res.error = f"one streamed event grew past {MAX_EVENT_BYTES:,} bytes without ending"
                return res
            await take_events(res, events, cut)
            if res.ok and res.output_tokens > max_tokens:
                # usage is the count of record, but never beyond what was asked for: such a count inflates rates
                res.ok = False
                res.error = f"usage says {res.output_tokens} output tokens, more than max_tokens={max_tokens}"
            elif res.ok and res.token_ids and res.output_tokens > usage_bound(len(res.token_ids)):
                # nor beyond the token ids the stream carried (return_token_ids), a little slack aside
                res.ok = False
                res.error = (f"usage says {res.output_tokens} output tokens, the stream carried "
                             f"{len(res.token_ids)} token ids")
            elif res.ok and not res.token_ids and res.output_tokens > usage_bound(len(res.chunk_times)):
                # without ids (return_token_ids ignored), a chunk is at least a token: nor beyond the chunks
                res.ok = False
                res.error = (f"usage says {res.output_tokens} output tokens, the stream carried "
                             f"{len(res.chunk_times)} token-bearing chunks and no token ids")
        except asyncio.TimeoutError as e:
            self._timeouts += 1
            res.error = f"TimeoutError: {e}" if str(e) else "TimeoutError"
        except (httpx.HTTPError, OSError) as e:
            if isinstance(e, httpx.TimeoutException):
                self._timeouts += 1
            res.error = f"{type(e).__name__}: {e}" if str(e) else type(e).__name__
        except (ValueError, KeyError, TypeError, AttributeError) as e:  # JSON and Unicode errors are ValueErrors
            res.error = f"malformed stream chunk: {type(e).__name__}: {e}"
        finally:
            if not res.t_done:
                res.t_done = time.perf_counter()
            self.tally.add(res)
        return res

    async def _httpx_sse(self, path: str, body: dict[str, Any], events: "Events") -> tuple[int, str, str | None]:
        """The stream through httpx (tests' mock transports, https): (status, error detail, cut), where ``cut``
        says how the server ended the connection before the body's end (None when the body ended by its
        framing or [DONE] came). Raises ConnectionError when the server closed before answering."""
        try:
            async with self._http.stream("POST", path, json=body) as resp:
                if resp.status_code != 200:
                    try:
                        detail = (await resp.aread()).decode(errors="replace")[:300]
                    except (httpx.RemoteProtocolError, httpx.ReadError) as e:
                        detail = closed_how(e, "mid-answer")
                    return resp.status_code, detail, None
                sse = SSE(events)
                try:
                    async for raw in resp.aiter_bytes():
                        if sse.feed(raw, time.perf_counter()):
                            return 200, "", None
                except (httpx.RemoteProtocolError, httpx.ReadError) as e:
                    return 200, "", closed_how(e, "mid-answer")
                # a body framed by neither length nor chunks ends when the server closes the connection
                framed = "content-length" in resp.headers or "chunked" in resp.headers.get("transfer-encoding", "")
                return 200, "", None if framed else closed_how(None, "mid-answer")
        except (httpx.RemoteProtocolError, httpx.ReadError) as e:  # before the status line
            raise ConnectionError(closed_how(e, "before answering")) from e

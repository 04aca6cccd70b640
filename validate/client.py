"""Async OpenAI-compatible client over httpx with SSE streaming and per-chunk timing.

Timing (docs/metrics.md): each request records ``time.perf_counter()`` when it is sent
and when every SSE event arrives. Streaming requests over plain http use a small HTTP/1.1 client on asyncio
protocols (:class:`_StreamConn`): the send stamp is taken just before the request bytes are written to the
socket, and each event's stamp when its bytes are handed over by the event loop (``data_received``), before
any HTTP or JSON parsing; JSON is parsed once the stream has ended, so the receive path costs a few
microseconds per chunk and no task switch (benchmarks/serving/client_timing.py measures the error against a server's
ground truth). With an httpx ``transport`` (tests) or https the same events come through httpx.

A chunk is *token-bearing* when its delta carries non-empty ``content`` or ``reasoning_content`` /
``reasoning`` (reasoning counts as generated content and is kept apart), or when its choice carries non-empty
``token_ids`` (``return_token_ids``), even with empty text: a token whose text is empty (a special token, the
single token of a prefill request) is still a token. A role-only or empty chunk is not. Output token counts
come from the server's ``usage`` (``stream_options.include_usage``), never from re-tokenizing. A request whose
stream ends without a finish reason, without usage, or with an error object is an error, never a short answer;
so is a connection the server closes or resets before the answer is whole, at once, whatever state the
connection is in (never a wait for the read timeout).
"""
from __future__ import annotations

import asyncio
import json
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import httpx
from validate.util import within


@dataclass
class RequestResult:
    """One request's outcome and raw timings.

    Times are seconds on ``time.perf_counter``'s clock; ``chunk_times`` are offsets from ``t_sent`` of each
    token-bearing chunk, with ``chunk_tokens`` the tokens each carried (from ``token_ids`` when the server
    returns them, else 1).
    """

    ok: bool = False
    error: str | None = None
    text: str = ""
    reasoning: str = ""  # the thinking, when the server's reasoning parser sent it apart from the text
    reasoning_tokens: int = 0  # tokens of the chunks before the first text (the thinking, when ``reasoning``)
    finish_reason: str | None = None
    prompt_tokens: int | None = None
    output_tokens: int | None = None
    token_ids: list[int] | None = None
    t_sent: float = 0.0
    t_done: float = 0.0
    chunk_times: list[float] = field(default_factory=list)
    chunk_tokens: list[int] = field(default_factory=list)
    chunk_chars: list[int] = field(default_factory=list)  # characters of ``text`` each token-bearing chunk added

    @property
    def ttft_s(self) -> float | None:
        """Request sent -> first token-bearing chunk, seconds (None if no token-bearing chunk arrived)."""
        return self.chunk_times[0] if self.chunk_times else None

    @property
    def e2el_s(self) -> float:
        """Request sent -> stream finished, seconds."""
        return self.t_done - self.t_sent


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
        self._raw = None if transport is not None or url.scheme != "http" else _StreamPool(
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
                   seed: int | None = None, ignore_eos: bool = False, extra: dict[str, Any] | None = None) -> RequestResult:
        """Stream one chat completion. Never raises for server or transport faults: they are in ``error``."""
        body: dict[str, Any] = {"model": self.model, "messages": messages}
        return await self._stream("/v1/chat/completions", body, max_tokens, temperature, seed, ignore_eos, extra)

    async def completion(self, prompt: str | list[int], *, max_tokens: int, temperature: float = 0.0,
                         seed: int | None = None, ignore_eos: bool = False, extra: dict[str, Any] | None = None) -> RequestResult:
        """Stream one text completion (prompt as text or token ids). Faults are in ``error``."""
        body: dict[str, Any] = {"model": self.model, "prompt": prompt}
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
        events = _Events(limit=2 * max_tokens + 64)
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
            await self._take_events(res, events, cut)
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

    async def _httpx_sse(self, path: str, body: dict[str, Any], events: "_Events") -> tuple[int, str, str | None]:
        """The stream through httpx (tests' mock transports, https): (status, error detail, cut), where ``cut``
        says how the server ended the connection before the body's end (None when the body ended by its
        framing or [DONE] came). Raises ConnectionError when the server closed before answering."""
        try:
            async with self._http.stream("POST", path, json=body) as resp:
                if resp.status_code != 200:
                    try:
                        detail = (await resp.aread()).decode(errors="replace")[:300]
                    except (httpx.RemoteProtocolError, httpx.ReadError) as e:
                        detail = _closed_how(e, "mid-answer")
                    return resp.status_code, detail, None
                sse = _SSE(events)
                try:
                    async for raw in resp.aiter_bytes():
                        if sse.feed(raw, time.perf_counter()):
                            return 200, "", None
                except (httpx.RemoteProtocolError, httpx.ReadError) as e:
                    return 200, "", _closed_how(e, "mid-answer")
                # a body framed by neither length nor chunks ends when the server closes the connection
                framed = "content-length" in resp.headers or "chunked" in resp.headers.get("transfer-encoding", "")
                return 200, "", None if framed else _closed_how(None, "mid-answer")
        except (httpx.RemoteProtocolError, httpx.ReadError) as e:  # before the status line
            raise ConnectionError(_closed_how(e, "before answering")) from e

    async def _take_events(self, res: RequestResult, events: "_Events", cut: str | None) -> None:
        """Parse the stamped events after the stream (parsing is kept off the receive path) through the
        loop's :class:`_Parser`, which parses for at most half a millisecond per loop iteration, so that
        the end of many answers at once never delays other streams' receive stamps."""
        job = _ParseJob(res, events, asyncio.get_running_loop().create_future())
        _Parser.of_loop().submit(job)
        await job.fut
        if job.exc is not None:
            raise job.exc
        if res.error:
            return
        if not job.done:
            res.error = (f"{cut}: " if cut else "") + "stream ended without [DONE] (cut mid-answer)"
        elif res.finish_reason in ("abort", "error"):
            res.error = f"stream finished with reason {res.finish_reason!r} (the server gave up on the request)"
        elif res.finish_reason is None:
            res.error = "stream ended without a finish reason"
        elif res.output_tokens is None:
            # output tokens come from usage only: without it the answer's length is unknown, not 0
            res.error = "stream ended without usage (the server ignored stream_options.include_usage)"
        else:
            res.ok = True

    @staticmethod
    def _take_chunk(res: RequestResult, chunk: dict[str, Any], t: float) -> None:
        if "error" in chunk:
            err = chunk["error"]
            res.error = "server error mid-stream: " + (err.get("message", str(err)) if isinstance(err, dict) else str(err))
            return
        usage = chunk.get("usage")
        if usage:
            res.prompt_tokens = usage.get("prompt_tokens")
            res.output_tokens = usage.get("completion_tokens")
        for choice in chunk.get("choices") or []:
            if choice.get("index", 0) != 0:  # one answer was asked for (n = 1): another is not this one's text
                res.error = f"the server sent choice index {choice.get('index')!r}; one choice (index 0) was asked for"
                return
            delta = choice.get("delta")
            content = delta.get("content") if delta is not None else choice.get("text")
            # vLLM's reasoning parser: `reasoning`, formerly `reasoning_content` (newer servers send both, equal)
            reasoning = (delta or {}).get("reasoning") or (delta or {}).get("reasoning_content")
            ids = choice.get("token_ids")
            if ids:
                res.token_ids.extend(ids)
            if content or reasoning or ids:  # token ids with empty text are tokens too
                n = len(ids) if ids else 1
                res.chunk_times.append(t - res.t_sent)
                res.chunk_tokens.append(n)
                res.chunk_chars.append(len(content) if content else 0)
                if not content and not res.text:
                    # before the answer's first text: thinking, if any came (with return_token_ids vLLM sends the
                    # <think> and </think> tokens as chunks of an empty delta)
                    res.reasoning_tokens += n
                res.text += content or ""
                res.reasoning += reasoning or ""
            if choice.get("finish_reason"):
                res.finish_reason = choice["finish_reason"]


class _ParseJob:
    __slots__ = ("res", "events", "fut", "i", "done", "exc")

    def __init__(self, res: RequestResult, events: "_Events", fut: asyncio.Future):
        self.res, self.events, self.fut = res, events, fut
        self.i, self.done, self.exc = 0, False, None

    def step(self, deadline: float) -> bool:
        """Parse events until ``deadline`` (perf_counter); True when this job is finished."""
        res, times, datas = self.res, self.events.times, self.events.datas
        n = len(datas)
        try:
            while self.i < n:
                t, data = times[self.i], datas[self.i]
                self.i += 1
                if data == b"[DONE]":
                    self.done = True
                    return True
                chunk = json.loads(data)
                if type(chunk) is not dict:
                    raise ValueError(f"expected a JSON object, got {type(chunk).__name__}")
                OpenAIClient._take_chunk(res, chunk, t)
                if res.error:
                    return True
                if time.perf_counter() > deadline:
                    return False
        except Exception as e:  # noqa: BLE001 - handed to the request's coroutine
            self.exc = e
        return True


class _Parser:
    """One per event loop: runs parse jobs for at most ``BUDGET_S`` per loop iteration, then lets the loop
    poll the sockets again (a per-task ``sleep(0)`` would let N finished answers take N slices per poll)."""

    BUDGET_S = 0.0005
    _by_loop: dict[int, "_Parser"] = {}

    def __init__(self, loop: asyncio.AbstractEventLoop):
        self.loop = loop
        self.jobs: deque[_ParseJob] = deque()
        self.scheduled = False

    @classmethod
    def of_loop(cls) -> "_Parser":
        loop = asyncio.get_running_loop()
        p = cls._by_loop.get(id(loop))
        if p is None or p.loop is not loop:
            if len(cls._by_loop) > 64:
                cls._by_loop = {k: v for k, v in cls._by_loop.items() if not v.loop.is_closed()}
            p = cls._by_loop[id(loop)] = cls(loop)
        return p

    def submit(self, job: _ParseJob) -> None:
        self.jobs.append(job)
        if not self.scheduled:
            self.scheduled = True
            self.loop.call_soon(self._run)

    def _run(self) -> None:
        self.scheduled = False
        deadline = time.perf_counter() + self.BUDGET_S
        while self.jobs:
            job = self.jobs[0]
            if job.fut.cancelled():
                self.jobs.popleft()
                continue
            if not job.step(deadline):
                break
            self.jobs.popleft()
            job.fut.set_result(None)
        if self.jobs:
            self.scheduled = True
            self.loop.call_soon(self._run)


class _Events:
    """Stamped SSE events as two parallel lists (floats and bytes are not tracked by the garbage collector,
    tuples are: a tuple per chunk would feed the collector's full passes, long pauses in a large heap)."""

    __slots__ = ("times", "datas", "limit", "overflow", "oversized")

    def __init__(self, limit: int | None = None):
        self.times: list[float] = []
        self.datas: list[bytes] = []
        self.limit = limit  # most events a request may bring (its max_tokens and the framing events); None: any
        self.overflow = False
        self.oversized = False  # one event grew past MAX_EVENT_BYTES without ending


#: The most bytes one SSE event may hold before it ends (a chunk of vLLM's carries a few tokens: well under 1 KiB).
MAX_EVENT_BYTES = 1 << 20


class _SSE:
    """Splits an SSE byte stream into events; appends each ``data:`` event and its stamp to ``events``."""

    __slots__ = ("events", "buf", "done")

    def __init__(self, events: _Events):
        self.events = events
        self.buf = b""
        self.done = False

    def feed(self, data: bytes, t: float) -> bool:
        """Take bytes that arrived at ``t``; True once ``data: [DONE]`` has been seen."""
        buf = self.buf + data if self.buf else data
        if b"\r" in buf:
            buf = buf.replace(b"\r\n", b"\n")
        *complete, self.buf = buf.split(b"\n\n")
        if len(self.buf) > MAX_EVENT_BYTES:  # an event that never ends: stop, never buffer (and re-copy) on
            self.events.oversized = True
            return True
        for ev in complete:
            if ev.startswith(b"data:") and b"\ndata:" not in ev:
                d = ev[5:].strip()
            else:  # comments, event names, multi-line data
                d = b"\n".join(ln[5:].strip() for ln in ev.split(b"\n") if ln.startswith(b"data:"))
                if not d:
                    continue
            self.events.times.append(t)
            self.events.datas.append(d)
            if d == b"[DONE]":
                self.done = True
                return True
            if self.events.limit is not None and len(self.events.datas) > self.events.limit:
                self.events.overflow = True  # a server streaming past max_tokens: stop reading, never buffer on
                return True
        return False


def _closed_how(exc: BaseException | None, when: str) -> str:
    """Error text for a connection the server ended ``when`` ("before answering", "mid-answer"): a FIN
    (``exc`` None) or a reset / write fault (``exc``)."""
    if exc is None:
        return f"server closed the connection {when}"
    return f"server closed the connection {when} ({type(exc).__name__}{': ' + str(exc) if str(exc) else ''})"


class _StreamConn(asyncio.Protocol):
    """One keep-alive HTTP/1.1 connection streaming SSE responses. The receive stamp is taken on entry to
    ``data_received``; HTTP framing (chunked, content-length or until close) and SSE splitting follow.

    The exchange in flight, if any, owns ``fut``; it is resolved with ``(how, status, got_any, body, exc)``:
    ``how`` is "done" ([DONE] seen), "end" (the body ended by its framing) or "lost" (the server closed or reset
    the connection before the body's end, ``exc`` the reset's error or None for a FIN). Every way a connection
    can end resolves it at once: a FIN (:meth:`eof_received`), a reset or write fault (:meth:`connection_lost`),
    and a connection already dead when the request is handed to it (:meth:`begin`)."""

    def __init__(self, pool: "_StreamPool"):
        self.pool = pool
        self.transport: asyncio.Transport | None = None
        self.lost = False
        self.fut: asyncio.Future | None = None
        self.sse: _SSE | None = None
        self.last_rx = 0.0
        self.status = 0
        self.mode = ""
        self.body = b""
        self.got_any = False
        self.complete = False
        self.end_exc: BaseException | None = None  # what connection_lost reported

    # ---- one exchange ---------------------------------------------------------------------------------
    def begin(self, request: bytes, events: _Events) -> tuple[float, asyncio.Future]:
        """Send ``request``; returns (send stamp, the future of its answer, see the class docstring)."""
        fut = self.fut = asyncio.get_running_loop().create_future()
        self.sse = _SSE(events)
        self.head = b""
        self.status = 0
        self.mode = ""          # "chunked", "length", "close"
        self.left = 0           # bytes left of the current chunk / of the body
        self.cbuf = b""         # chunked framing bytes not yet understood
        self.body = b""         # body of a non-200 answer
        self.keep = True
        self.got_any = False
        self.complete = False
        t = time.perf_counter()
        self.last_rx = t
        if self.lost or self.transport is None or self.transport.is_closing():
            # The server closed it between the connect and now (a dying server accepts, then closes): asyncio
            # would drop the write without a word and no callback would ever come, so answer "lost" here.
            self._resolve("lost", self.end_exc)
        else:
            self.transport.write(request)
        return t, fut

    def _resolve(self, how: str, exc: BaseException | None = None) -> None:
        # the answer's state travels with the result: once released, the connection may begin another exchange
        # before the waiting task runs
        if self.fut is not None and not self.fut.done():
            self.fut.set_result((how, self.status, self.got_any, self.body, exc))

    def _peer_closed(self, exc: BaseException | None) -> None:
        """The server ended the connection (a FIN when ``exc`` is None, else a reset or a write fault)."""
        if self.fut is None or self.complete:
            return
        if exc is None and self.mode == "close" and self.status:
            self.complete = True  # until-close framing: the FIN is the body's end
            self._resolve("end")
        else:
            self._resolve("lost", exc)

    def drop(self) -> None:
        """Close at once, discarding unsent bytes (``close()`` would wait for a drain that may never come)."""
        if self.transport is not None:
            self.transport.abort()

    def connection_made(self, transport) -> None:
        self.transport = transport

    def connection_lost(self, exc) -> None:
        self.lost, self.end_exc = True, exc
        self.pool.forget(self)
        self._peer_closed(exc)

    def eof_received(self) -> bool:
        # asyncio's default for a FIN is transport.close(), which stops reading and then waits for the write
        # buffer to drain: a server that half-closes without reading the rest of a large request never drains
        # it, and no callback would ever come. End the exchange now and drop what is unsent.
        self._peer_closed(None)
        self.drop()
        return False

    def data_received(self, data: bytes) -> None:
        t = time.perf_counter()
        self.last_rx = t
        if self.fut is None:
            # bytes on an idle (or not yet used) connection belong to no exchange: its framing is lost
            self.drop()
            return
        self.got_any = True
        if self.complete:
            return  # bytes after a finished answer on a connection being closed: ignore
        if not self.status:
            self.head = (self.head + data).lstrip(b"\r\n")
            i = self.head.find(b"\r\n\r\n")
            if i < 0:
                return
            lines = self.head[:i].decode("latin-1").split("\r\n")
            data, self.head = self.head[i + 4:], b""
            self.status = int(lines[0].split(" ", 2)[1])
            hdr = {}
            for ln in lines[1:]:
                k, _, v = ln.partition(":")
                hdr[k.strip().lower()] = v.strip().lower()
            self.keep = hdr.get("connection") != "close"
            if "chunked" in hdr.get("transfer-encoding", ""):
                self.mode, self.left = "chunked", -1
            elif "content-length" in hdr:
                self.mode, self.left = "length", int(hdr["content-length"])
            else:
                self.mode, self.keep = "close", False
            if self.status != 200 and self.mode == "length" and self.left == 0:
                return self._end()
        if self.mode == "chunked":
            self._chunked(data, t)
        elif self.mode == "length":
            take = data[:self.left]
            self.left -= len(take)
            self._payload(take, t)
            if self.left <= 0:
                self._end()
        else:
            self._payload(data, t)

    def _chunked(self, data: bytes, t: float) -> None:
        buf = self.cbuf + data if self.cbuf else data
        pos, n = 0, len(buf)
        while pos < n:
            if self.left > 0:  # inside a chunk's payload
                take = buf[pos:pos + self.left]
                self.left -= len(take)
                pos += len(take)
                self._payload(take, t)
                continue
            if self.left == 0:  # the CRLF after a payload
                if n - pos < 2:
                    break
                pos += 2
                self.left = -1
                continue
            j = buf.find(b"\r\n", pos)  # a size line
            if j < 0:
                break
            size = int(buf[pos:j].split(b";", 1)[0], 16)
            if size == 0:
                if buf.find(b"\r\n\r\n", j) < 0:
                    break  # the (empty) trailer has not arrived yet
                self.cbuf = b""
                return self._end()
            pos, self.left = j + 2, size
        self.cbuf = buf[pos:]

    def _payload(self, data: bytes, t: float) -> None:
        if self.status != 200:
            self.body += data
        elif self.sse.feed(data, t) and not self.complete:
            self._resolve("done")  # [DONE]: the answer is whole even if the body's end is late

    def _end(self) -> None:
        self.complete = True
        self._resolve("end")
        tr = self.transport
        # reusable only when the request went out whole: an answer may come before the server read it all
        if self.keep and not self.lost and tr is not None and not tr.is_closing() and not tr.get_write_buffer_size():
            self.pool.release(self)
        else:
            self.drop()


def _close_if_stuck(conn: "_StreamConn", fut: asyncio.Future) -> None:
    """The answer ended with [DONE] but its HTTP body never did: drop the connection (still that exchange)."""
    if conn.fut is fut and not conn.complete and not conn.lost:
        conn.drop()


class _StreamPool:
    """Keep-alive connections of the streaming path (at most ``limit`` requests in flight)."""

    def __init__(self, host: str, port: int, prefix: str, timeout_s: float, limit: int):
        self.host, self.port, self.prefix, self.timeout_s = host, port, prefix, timeout_s
        self.idle: deque[_StreamConn] = deque()
        self.busy: set[_StreamConn] = set()
        self.sem: asyncio.Semaphore | None = None
        self.limit = limit

    def forget(self, conn: _StreamConn) -> None:
        self.busy.discard(conn)
        try:
            self.idle.remove(conn)
        except ValueError:
            pass

    def release(self, conn: _StreamConn) -> None:
        conn.fut = None
        self.busy.discard(conn)
        self.idle.append(conn)

    def close(self) -> None:
        for c in list(self.idle) + list(self.busy):
            c.drop()
        self.idle.clear()
        self.busy.clear()

    async def _conn(self) -> tuple[_StreamConn, bool]:
        while self.idle:
            c = self.idle.pop()
            if not c.lost and c.transport is not None and not c.transport.is_closing():
                self.busy.add(c)
                return c, True
        loop = asyncio.get_running_loop()
        _, c = await within(loop.create_connection(lambda: _StreamConn(self), self.host, self.port), 10.0)
        self.busy.add(c)  # it may already be closed by the server: begin() answers "lost" then
        return c, False

    async def post_sse(self, path: str, body: dict[str, Any], res: RequestResult,
                       events: _Events) -> tuple[int, str, str | None]:
        """POST and collect stamped SSE events: (status, error detail, cut), where ``cut`` says how the server
        ended the connection before the body's end (None when the body ended by its framing or [DONE] came).
        Sets ``res.t_sent`` (just before the write) and ``res.t_done``.

        Raises:
            ConnectionError: the server closed or reset the connection before the status line.
            asyncio.TimeoutError: no byte for ``timeout_s`` seconds.
            OSError: the connect failed.
        """
        if self.sem is None:
            self.sem = asyncio.Semaphore(self.limit)
        payload = json.dumps(body).encode()
        request = (f"POST {self.prefix}{path} HTTP/1.1\r\nHost: {self.host}:{self.port}\r\n"
                   f"Content-Type: application/json\r\nAccept: text/event-stream\r\n"
                   f"Content-Length: {len(payload)}\r\n\r\n").encode() + payload
        async with self.sem:
            for attempt in (0, 1):
                conn, reused = await self._conn()
                try:
                    res.t_sent, fut = conn.begin(request, events)
                    how, status, got_any, detail, exc = await self._wait(conn, fut)
                except BaseException:
                    conn.drop()
                    self.forget(conn)
                    raise
                if how == "lost" and not got_any and reused and attempt == 0 and not events.datas:
                    continue  # the server had closed this idle keep-alive connection: once more, anew
                res.t_done = time.perf_counter()
                if how == "done" and not conn.complete:
                    # [DONE] came before the body's end: give the rest a moment, else drop the connection
                    asyncio.get_running_loop().call_later(5.0, _close_if_stuck, conn, fut)
                if status and status != 200:
                    return status, detail.decode(errors="replace")[:300], None
                if how == "lost" and not status:
                    raise ConnectionError(_closed_how(exc, "before answering"))
                if how == "lost" or (how == "end" and conn.mode == "close"):
                    return 200, "", _closed_how(exc, "mid-answer")
                return 200, "", None
        raise AssertionError("unreachable")

    async def _wait(self, conn: _StreamConn, fut: asyncio.Future) -> tuple:
        """The answer of ``fut``; raises asyncio.TimeoutError (and drops the connection) after ``timeout_s``
        seconds without a byte. Every end of the connection resolves ``fut``, so only silence waits."""
        while not fut.done():
            left = self.timeout_s - (time.perf_counter() - conn.last_rx)
            if left <= 0:
                conn.drop()
                raise asyncio.TimeoutError(f"ReadTimeout: no bytes for {self.timeout_s:g} s")
            await asyncio.wait((fut,), timeout=left)
        return fut.result()


async def gather_limited(coros, limit: int, on_done=None) -> list[Any]:
    """Run coroutines with at most ``limit`` in flight; results in input order. ``on_done()`` after each."""
    sem = asyncio.Semaphore(limit)

    async def one(c):
        async with sem:
            r = await c
        if on_done:
            on_done()
        return r

    return await asyncio.gather(*(one(c) for c in coros))

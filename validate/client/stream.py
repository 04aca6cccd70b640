"""One streamed completion: the keep-alive HTTP/1.1 connection that reads its SSE bytes and stamps them, the SSE
splitting, and the parse of the stamped events into a :class:`RequestResult`.

Timing (docs/metrics.md): the send stamp is taken just before the request bytes are written to the socket, and
each event's stamp when its bytes are handed over by the event loop (:meth:`StreamConn.data_received`), before
any HTTP or JSON parsing; JSON is parsed once the stream has ended (:func:`take_events`), so the receive path
costs a few microseconds per chunk and no task switch.

A chunk is *token-bearing* when its delta carries non-empty ``content`` or ``reasoning_content`` /
``reasoning`` (reasoning counts as generated content and is kept apart), or when its choice carries non-empty
``token_ids`` (``return_token_ids``), even with empty text: a token whose text is empty (a special token, the
single token of a prefill request) is still a token. A role-only or empty chunk is not (:func:`take_chunk`).

A chunk's ``logprobs`` (asked for with ``top2``: validate.margins) become one step per token of the chunk: as many
as its ``token_ids`` where it carries ids (a missing step is an empty one, an extra one dropped), so that step
``i`` stays token ``i``'s.
"""
from __future__ import annotations

import asyncio
import json
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Protocol

from validate.margins import chat_steps, completion_steps

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
    # the top two of each output token where they were asked for and the server sent them (validate.margins
    # steps: [token, value, token, value]), one per token id where the server sends ids; None where none came
    top2: list[list] | None = None
    top2_error: str | None = None  # why the top two sent were dropped (malformed): the answer stands without them

    @property
    def ttft_s(self) -> float | None:
        """Request sent -> first token-bearing chunk, seconds (None if no token-bearing chunk arrived)."""
        return self.chunk_times[0] if self.chunk_times else None

    @property
    def e2el_s(self) -> float:
        """Request sent -> stream finished, seconds."""
        return self.t_done - self.t_sent



class Events:
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


class SSE:
    """Splits an SSE byte stream into events; appends each ``data:`` event and its stamp to ``events``."""

    __slots__ = ("events", "buf", "done")

    def __init__(self, events: Events):
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



def closed_how(exc: BaseException | None, when: str) -> str:
    """Error text for a connection the server ended ``when`` ("before answering", "mid-answer"): a FIN
    (``exc`` None) or a reset / write fault (``exc``)."""
    if exc is None:
        return f"server closed the connection {when}"
    return f"server closed the connection {when} ({type(exc).__name__}{': ' + str(exc) if str(exc) else ''})"



class ConnOwner(Protocol):
    """What owns a :class:`StreamConn` (validate.client.pool.StreamPool): told when it may take another exchange
    and when it is gone."""

    def release(self, conn: StreamConn) -> None: ...

    def forget(self, conn: StreamConn) -> None: ...


class StreamConn(asyncio.Protocol):
    """One keep-alive HTTP/1.1 connection streaming SSE responses. The receive stamp is taken on entry to
    ``data_received``; HTTP framing (chunked, content-length or until close) and SSE splitting follow.

    The exchange in flight, if any, owns ``fut``; it is resolved with ``(how, status, got_any, body, exc)``:
    ``how`` is "done" ([DONE] seen), "end" (the body ended by its framing) or "lost" (the server closed or reset
    the connection before the body's end, ``exc`` the reset's error or None for a FIN). Every way a connection
    can end resolves it at once: a FIN (:meth:`eof_received`), a reset or write fault (:meth:`connection_lost`),
    and a connection already dead when the request is handed to it (:meth:`begin`)."""

    def __init__(self, pool: ConnOwner):
        self.pool = pool
        self.transport: asyncio.Transport | None = None
        self.lost = False
        self.fut: asyncio.Future | None = None
        self.sse: SSE | None = None
        self.last_rx = 0.0
        self.status = 0
        self.mode = ""
        self.body = b""
        self.got_any = False
        self.complete = False
        self.end_exc: BaseException | None = None  # what connection_lost reported

    # ---- one exchange ---------------------------------------------------------------------------------
    def begin(self, request: bytes, events: Events) -> tuple[float, asyncio.Future]:
        """Send ``request``; returns (send stamp, the future of its answer, see the class docstring)."""
        fut = self.fut = asyncio.get_running_loop().create_future()
        self.sse = SSE(events)
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



async def take_events(res: RequestResult, events: "Events", cut: str | None) -> None:
    """Parse the stamped events of one answer after its stream (parsing is kept off the receive path) into
    ``res``, setting ``res.ok`` or ``res.error`` (``cut``: how the server ended the connection early, if it
    did), through the loop's :class:`_Parser`, which parses for at most half a millisecond per loop iteration, so that
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



def take_chunk(res: RequestResult, chunk: dict[str, Any], t: float) -> None:
    """Take one parsed chunk (arrived at ``t``) into ``res``: an error object, usage, and choice 0's text,
    reasoning, token ids and finish reason; a token-bearing chunk adds its offset, tokens and characters."""
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
        lp = choice.get("logprobs")
        if lp is not None and res.top2_error is None:
            try:
                steps = chat_steps(lp) if delta is not None else completion_steps(lp)
            except (ValueError, AttributeError, TypeError) as e:
                # the answer stands without them; its top two are dropped whole (a gap would shift the rest)
                res.top2, res.top2_error = None, f"malformed logprobs: {e}"
            else:
                if ids:  # one step per token id, so that step i is token i's
                    steps = (steps + [[]] * len(ids))[: len(ids)]
                if res.top2 is None:
                    res.top2 = []
                res.top2.extend(steps)
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

    def __init__(self, res: RequestResult, events: "Events", fut: asyncio.Future):
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
                take_chunk(res, chunk, t)
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


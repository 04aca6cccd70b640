"""The keep-alive connections of the streaming path over plain http (:class:`StreamPool`), at most a given number
of requests in flight, and :func:`gather_limited`, which bounds the coroutines in flight the same way."""
from __future__ import annotations

import asyncio
import json
import time
from collections import deque
from typing import Any

from validate.client.stream import Events, RequestResult, StreamConn, closed_how
from validate.util import within

def _close_if_stuck(conn: "StreamConn", fut: asyncio.Future) -> None:
    """The answer ended with [DONE] but its HTTP body never did: drop the connection (still that exchange)."""
    if conn.fut is fut and not conn.complete and not conn.lost:
        conn.drop()



class StreamPool:
    """Keep-alive connections of the streaming path (at most ``limit`` requests in flight)."""

    def __init__(self, host: str, port: int, prefix: str, timeout_s: float, limit: int):
        self.host, self.port, self.prefix, self.timeout_s = host, port, prefix, timeout_s
        self.idle: deque[StreamConn] = deque()
        self.busy: set[StreamConn] = set()
        self.sem: asyncio.Semaphore | None = None
        self.limit = limit

    def forget(self, conn: StreamConn) -> None:
        self.busy.discard(conn)
        try:
            self.idle.remove(conn)
        except ValueError:
            pass

    def release(self, conn: StreamConn) -> None:
        conn.fut = None
        self.busy.discard(conn)
        self.idle.append(conn)

    def close(self) -> None:
        for c in list(self.idle) + list(self.busy):
            c.drop()
        self.idle.clear()
        self.busy.clear()

    async def _conn(self) -> tuple[StreamConn, bool]:
        while self.idle:
            c = self.idle.pop()
            if not c.lost and c.transport is not None and not c.transport.is_closing():
                self.busy.add(c)
                return c, True
        loop = asyncio.get_running_loop()
        _, c = await within(loop.create_connection(lambda: StreamConn(self), self.host, self.port), 10.0)
        self.busy.add(c)  # it may already be closed by the server: begin() answers "lost" then
        return c, False

    async def post_sse(self, path: str, body: dict[str, Any], res: RequestResult,
                       events: Events) -> tuple[int, str, str | None]:
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
                    raise ConnectionError(closed_how(exc, "before answering"))
                if how == "lost" or (how == "end" and conn.mode == "close"):
                    return 200, "", closed_how(exc, "mid-answer")
                return 200, "", None
        raise AssertionError("unreachable")

    async def _wait(self, conn: StreamConn, fut: asyncio.Future) -> tuple:
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

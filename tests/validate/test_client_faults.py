"""A server that closes or resets a connection ends its request at once, whatever state the connection is in.

Raw socket servers (one thread per connection) script each fault; the client's read timeout is 600 s, so a
client that waits for it instead of seeing the close fails here by the per-call bound (``BOUND_S``).
"""
from __future__ import annotations

import asyncio
import json
import socket
import struct
import threading
import time

import httpx
import pytest
import yaml

from tests.conftest import fake_procs
from validate.cli import main
from validate.client import OpenAIClient

pytestmark = pytest.mark.timeout(30)

BOUND_S = 8.0  # an error must come at once; far below the client's 600 s read timeout, far above a loaded box's jitter
READ_TIMEOUT_S = 600.0

CUT_BY_FIN = "server closed the connection mid-answer: stream ended without [DONE] (cut mid-answer)"
HEAD_CHUNKED = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
HEAD_CLOSE = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\nconnection: close\r\n\r\n"


def sse(obj) -> bytes:
    return b"data: " + (obj if isinstance(obj, bytes) else json.dumps(obj).encode()) + b"\n\n"


def chunk(payload: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(payload), payload)


def token(text: str, i: int, finish=None) -> bytes:
    return sse({"choices": [{"index": 0, "text": text, "token_ids": [i], "finish_reason": finish}]})


#: a whole two-token answer as SSE events, and as a keep-alive chunked HTTP body
EVENTS = [token("a", 1), token("b", 2, "length"),
          sse({"choices": [], "usage": {"prompt_tokens": 1, "completion_tokens": 2}}), sse(b"[DONE]")]
WHOLE_CHUNKED = HEAD_CHUNKED + b"".join(chunk(e) for e in EVENTS) + b"0\r\n\r\n"


def read_request(s: socket.socket) -> bytes:
    """Read one HTTP request (head and Content-Length body) from ``s``; returns the body."""
    buf = b""
    while b"\r\n\r\n" not in buf:
        data = s.recv(65536)
        if not data:
            raise ConnectionError("client closed")
        buf += data
    head, _, body = buf.partition(b"\r\n\r\n")
    n = next(int(ln.split(b":")[1]) for ln in head.split(b"\r\n") if ln.lower().startswith(b"content-length"))
    while len(body) < n:
        body += s.recv(65536)
    return body


def fin(s: socket.socket) -> None:
    """Send a FIN even if request bytes are still unread (a plain close() would send a reset then)."""
    s.shutdown(socket.SHUT_WR)
    s.settimeout(2)
    try:
        while s.recv(65536):
            pass
    except OSError:
        pass
    s.close()


def rst(s: socket.socket) -> None:
    """Reset the connection (SO_LINGER 0)."""
    s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    s.close()


class RawServer:
    """TCP server on 127.0.0.1 running ``handler(server, sock, n)`` for its n-th connection in a thread."""

    def __init__(self, handler, rcvbuf: int | None = None):
        self.handler = handler
        self.lsock = socket.socket()
        self.lsock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if rcvbuf:  # inherited by accepted sockets: a small window fills after a few KiB
            self.lsock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
        self.lsock.bind(("127.0.0.1", 0))
        self.lsock.listen(64)
        self.url = f"http://127.0.0.1:{self.lsock.getsockname()[1]}"
        self.connections = 0
        self.closed = threading.Event()  # set by handlers once they have closed their connection
        self.stop = threading.Event()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                s, _ = self.lsock.accept()
            except OSError:
                return
            n, self.connections = self.connections, self.connections + 1
            threading.Thread(target=self._serve, args=(s, n), daemon=True).start()

    def _serve(self, s: socket.socket, n: int) -> None:
        try:
            self.handler(self, s, n)
        except OSError:
            pass

    def close(self) -> None:
        self.stop.set()
        self.lsock.close()


@pytest.fixture
def serve():
    servers = []

    def make(handler, **kw) -> RawServer:
        servers.append(RawServer(handler, **kw))
        return servers[-1]

    yield make
    for s in servers:
        s.close()


def late_write_loop(server: RawServer):
    """An event loop whose connects return only after ``server`` has closed the new connection and the loop
    has read that close: the state a dying server leaves between the client's connect and its request."""
    class Loop(asyncio.SelectorEventLoop):
        async def create_connection(self, *a, **kw):
            made = await super().create_connection(*a, **kw)
            await self.run_in_executor(None, server.closed.wait, 5)
            await asyncio.sleep(0.1)
            return made
    return Loop


def ask(url: str, n: int = 1, *, prompt: str = "hi", gap_s: float = 0.0, via_httpx: bool = False,
        loop_factory=None) -> list[tuple]:
    """``n`` completions one after another on one client: [(result, seconds)]. Fails the test when one of
    them takes longer than ``BOUND_S`` (the client waited instead of seeing the close)."""
    async def go():
        transport = httpx.AsyncHTTPTransport() if via_httpx else None
        async with OpenAIClient(url, "m", timeout_s=READ_TIMEOUT_S, transport=transport) as c:
            out = []
            for i in range(n):
                if i and gap_s:
                    await asyncio.sleep(gap_s)
                t = time.perf_counter()
                try:
                    r = await asyncio.wait_for(c.completion(prompt, max_tokens=2), BOUND_S)
                except asyncio.TimeoutError:
                    pytest.fail(f"request {i} had no outcome after {BOUND_S:g} s: the client waited for its read "
                                "timeout")
                out.append((r, time.perf_counter() - t))
            return out

    with asyncio.Runner(loop_factory=loop_factory) as runner:
        return runner.run(go())


# ---- the server closes before the status line ------------------------------------------------------------
@pytest.mark.parametrize("close", [fin, rst], ids=["fin", "rst"])
def test_connection_closed_between_connect_and_request_is_an_error_at_once(serve, close):
    def handler(srv, s, n):
        time.sleep(0.05)  # after the client's connect has returned (a reset during it fails the connect)
        close(s)
        srv.closed.set()

    srv = serve(handler)
    [(r, _)] = ask(srv.url, loop_factory=late_write_loop(srv))
    assert not r.ok and r.error.startswith("ConnectionError: server closed the connection before answering")
    if close is rst:
        assert "ConnectionResetError" in r.error


@pytest.mark.parametrize("close", [fin, rst], ids=["fin", "rst"])
def test_connections_closed_as_soon_as_accepted_never_wait(serve, close):
    # no hook: the close races the client's write, as with a server going down; every request must end at once
    srv = serve(lambda srv, s, n: close(s))
    for r, took in ask(srv.url, 30):
        assert not r.ok and took < BOUND_S
        assert "server closed the connection" in r.error or "reset" in r.error.lower(), r.error


def test_close_after_reading_the_request_is_an_error_at_once(serve):
    def handler(srv, s, n):
        read_request(s)
        fin(s)

    [(r, _)] = ask(serve(handler).url)
    assert not r.ok and r.error == "ConnectionError: server closed the connection before answering"


def test_half_close_while_the_client_still_writes_is_an_error_at_once(serve):
    # the server reads the head only, sends its FIN and stops reading: the request body never drains
    def handler(srv, s, n):
        buf = b""
        while b"\r\n\r\n" not in buf:
            buf += s.recv(4096)
        s.shutdown(socket.SHUT_WR)
        srv.stop.wait(BOUND_S + 5)
        s.close()

    srv = serve(handler, rcvbuf=4096)
    [(r, _)] = ask(srv.url, prompt="x" * (8 << 20))
    assert not r.ok and r.error == "ConnectionError: server closed the connection before answering"


# ---- mid-answer --------------------------------------------------------------------------------------------
def test_close_after_the_headers_is_an_error_at_once(serve):
    def handler(srv, s, n):
        read_request(s)
        s.sendall(HEAD_CHUNKED)
        fin(s)

    [(r, _)] = ask(serve(handler).url)
    assert not r.ok and r.error == CUT_BY_FIN


@pytest.mark.parametrize("close", [fin, rst], ids=["fin", "rst"])
def test_close_mid_chunk_is_an_error_at_once(serve, close):
    def handler(srv, s, n):
        read_request(s)
        body = chunk(EVENTS[0]) + chunk(EVENTS[1])
        s.sendall(HEAD_CHUNKED + body[:len(body) - 9])  # the second chunk's end is missing
        time.sleep(0.05)
        close(s)

    [(r, _)] = ask(serve(handler).url)
    assert not r.ok and r.error.startswith("server closed the connection mid-answer")
    assert r.error.endswith("stream ended without [DONE] (cut mid-answer)")
    assert r.text == "a"  # what arrived is kept for the record
    if close is rst:
        assert "ConnectionResetError" in r.error


def test_close_mid_body_with_until_close_framing_is_an_error_at_once(serve):
    def handler(srv, s, n):
        read_request(s)
        s.sendall(HEAD_CLOSE + EVENTS[0])
        fin(s)

    [(r, _)] = ask(serve(handler).url)
    assert not r.ok and r.error == CUT_BY_FIN


def test_until_close_framing_whole_answer_is_ok(serve):
    def handler(srv, s, n):
        read_request(s)
        s.sendall(HEAD_CLOSE + b"".join(EVENTS))
        fin(s)

    [(r, _)] = ask(serve(handler).url)
    assert r.ok and r.text == "ab" and r.output_tokens == 2


def test_reader_behind_when_the_close_comes_still_ends_at_once(serve):
    # the whole partial answer and the FIN are queued while the client's loop is busy elsewhere
    def handler(srv, s, n):
        read_request(s)
        s.sendall(HEAD_CHUNKED + chunk(EVENTS[0]))
        fin(s)

    async def go():
        async with OpenAIClient(serve(handler).url, "m", timeout_s=READ_TIMEOUT_S) as c:
            async def busy():
                await asyncio.sleep(0.01)
                time.sleep(0.3)
            _, r = await asyncio.wait_for(asyncio.gather(busy(), c.completion("hi", max_tokens=2)), BOUND_S)
            return r

    r = asyncio.run(go())
    assert not r.ok and "server closed the connection mid-answer" in r.error and r.text == "a"


# ---- idle keep-alive connections ---------------------------------------------------------------------------
def test_idle_connection_closed_by_the_server_is_replaced(serve):
    def handler(srv, s, n):
        read_request(s)
        s.sendall(WHOLE_CHUNKED)
        if n == 0:
            fin(s)  # closed while idle in the client's pool
        else:
            s.close()

    srv = serve(handler)
    out = ask(srv.url, 2, gap_s=0.3)
    assert [r.ok for r, _ in out] == [True, True] and srv.connections == 2


def test_reused_connection_closed_as_the_request_arrives_is_retried_once(serve):
    def handler(srv, s, n):
        read_request(s)
        s.sendall(WHOLE_CHUNKED)
        if n == 0:
            read_request(s)  # the second request arrives on the kept connection: closed without a byte
            fin(s)
        else:
            s.close()

    srv = serve(handler)
    out = ask(srv.url, 2)
    assert [r.ok for r, _ in out] == [True, True] and srv.connections == 2


def test_reused_connection_that_sent_bytes_is_not_retried(serve):
    def handler(srv, s, n):
        read_request(s)
        s.sendall(WHOLE_CHUNKED)
        read_request(s)
        s.sendall(b"HTTP/1.1 200 OK\r\n")  # part of an answer: the request may have run, never send it twice
        fin(s)

    srv = serve(handler)
    (first, _), (second, _) = ask(srv.url, 2)
    assert first.ok and not second.ok and srv.connections == 1
    assert second.error == "ConnectionError: server closed the connection before answering"


def test_bytes_on_an_idle_connection_drop_it(serve):
    # a stale answer on a kept connection belongs to no request: it must never be read as the next one's
    def handler(srv, s, n):
        read_request(s)
        s.sendall(WHOLE_CHUNKED)
        if n == 0:
            time.sleep(0.05)
            s.sendall(b"HTTP/1.1 408 Request Timeout\r\ncontent-length: 0\r\n\r\n")
            srv.stop.wait(BOUND_S + 5)
        s.close()

    srv = serve(handler)
    out = ask(srv.url, 2, gap_s=0.3)
    assert [r.ok for r, _ in out] == [True, True] and srv.connections == 2


# ---- the httpx path (https, tests' transports) ---------------------------------------------------------------
@pytest.mark.parametrize("close", [fin, rst], ids=["fin", "rst"])
def test_httpx_path_cut_mid_chunk_is_an_error_at_once(serve, close):
    def handler(srv, s, n):
        read_request(s)
        body = chunk(EVENTS[0]) + chunk(EVENTS[1])
        s.sendall(HEAD_CHUNKED + body[:len(body) - 9])
        time.sleep(0.05)
        close(s)

    [(r, _)] = ask(serve(handler).url, via_httpx=True)
    assert not r.ok and r.error.startswith("server closed the connection mid-answer (")
    assert r.error.endswith("stream ended without [DONE] (cut mid-answer)") and r.text == "a"


def test_httpx_path_until_close_framing_cut_is_an_error_at_once(serve):
    def handler(srv, s, n):
        read_request(s)
        s.sendall(HEAD_CLOSE + EVENTS[0])
        fin(s)

    [(r, _)] = ask(serve(handler).url, via_httpx=True)
    assert not r.ok and r.error == CUT_BY_FIN


@pytest.mark.parametrize("close", [fin, rst], ids=["fin", "rst"])
def test_httpx_path_close_before_the_status_line_is_an_error_at_once(serve, close):
    def handler(srv, s, n):
        read_request(s)
        close(s)

    [(r, _)] = ask(serve(handler).url, via_httpx=True)
    assert not r.ok and r.error.startswith("ConnectionError: server closed the connection before answering (")


# ---- through the engine: a soak against a server that closes every new connection ------------------------
@pytest.mark.timeout(90)
def test_soak_against_a_server_closing_every_connection_ends_on_time(scratch):
    # after 4 generations (readiness takes 1) the fake closes each connection as it accepts it; its process
    # lives on, so the soak runs its 3 s: every request must fail at once, none may wait 600 s; a server that
    # lives and answers nothing fails the soak (the release's fault), it is no infrastructure error
    soak = {"clients": 3, "duration_s": 3, "prompt_tokens_min": 10, "prompt_tokens_max": 100, "max_tokens": 4,
            "sample_interval_s": 0.25}
    (scratch.root / "suites" / "mini-soak.yaml").write_text(yaml.safe_dump(
        {"name": "mini-soak", "kind": "soak", "params": soak, "gate": {"max": {"errors": 0}}}))
    tag = scratch.config("fake-closing", mode="close-after", FAKE_VLLM_DIE_AFTER=4)
    t = time.monotonic()
    assert main(["suite", "mini-soak", "--config", "fake-closing", "--release", "c1"]) == 1
    rec = json.loads((scratch.root / "reports" / "c1" / "fake-closing" / "mini-soak.json").read_text())
    m = rec["metrics"]
    assert "requests failed while the server lived; first: ConnectionError" in rec["verdict"]["cause"]
    # 3 generations of the soak's own before the fake closes (plus those of the other two clients in flight then)
    assert rec["verdict"]["status"] == "fail" and m["served"] <= 3 + 2 and m["duration_s"] < 3 + BOUND_S, m
    assert time.monotonic() - t < 60
    assert fake_procs(tag) == []


# ---- bounds on the whole request, however the server trickles -------------------------------------------
SSE_HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nConnection: close\r\n\r\n"


def _stream_until_stopped(server, s, payload: bytes, gap_s: float) -> None:
    s.recv(65536)
    s.sendall(SSE_HEAD)
    while not server.stop.is_set():
        s.sendall(payload)
        if gap_s:
            time.sleep(gap_s)


def _completions(url: str, n: int, timeout_s: float):
    async def go():
        async with OpenAIClient(url, "m", timeout_s=timeout_s) as c:
            return [await c.completion("x", max_tokens=4) for _ in range(n)]
    return asyncio.run(go())


@pytest.mark.timeout(30)
def test_a_trickling_stream_ends_at_the_request_bound(serve):
    """A server that sends an SSE comment every 0.1 s and never an answer: its silences are short, but the
    request must end at timeout_s all the same (it waited forever)."""
    srv = serve(lambda server, s, n: _stream_until_stopped(server, s, b":\n\n", 0.1))
    t = time.monotonic()
    (r,) = _completions(srv.url, 1, 2)
    assert not r.ok and "the request took more than 2 s" in r.error and time.monotonic() - t < 6


@pytest.mark.timeout(30)
def test_a_flooding_stream_is_cut_at_max_tokens(serve):
    chunk = b'data: {"choices": [{"index": 0, "text": "w", "token_ids": [5], "finish_reason": null}]}\n\n'
    srv = serve(lambda server, s, n: _stream_until_stopped(server, s, chunk * 50, 0.0))
    (r,) = _completions(srv.url, 1, 20)
    assert not r.ok and r.error == "the server streamed more than max_tokens=4 tokens"


@pytest.mark.timeout(60)
def test_a_server_that_stalls_every_request_is_given_up_after_three(serve):
    def stall(server, s, n):
        s.recv(65536)
        s.sendall(SSE_HEAD)
        server.stop.wait(60)

    srv = serve(stall)
    t = time.monotonic()
    res = _completions(srv.url, 5, 1)
    assert [r.error.startswith("TimeoutError") for r in res] == [True, True, True, False, False], [r.error for r in res]
    assert res[3].error.startswith("not sent: 3 of the server's requests timed out") and time.monotonic() - t < 10

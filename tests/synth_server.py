"""A synthetic OpenAI-compatible streaming server with scripted token timing and its own ground truth.

It answers POST /v1/chat/completions and /v1/completions (``stream: true``; ``stream_options.include_usage``
adds the usage chunk) the way vLLM does: for chat a role-only first chunk, then one chunk per decode step
carrying ``token_ids`` (several tokens per chunk when ``tokens_per_chunk`` > 1, as with speculative decoding),
an empty final chunk with the finish reason, the usage chunk (``choices: []``) and ``data: [DONE]``.
Every request answers ``max_tokens`` tokens (as with ``ignore_eos``).

Timing is scripted: the first content chunk is due ``ttft_ms`` after the request arrived, each next one
``itl_ms`` after the previous one was due (plus seeded jitter, ``*_jitter_ms``, exponential). The server records
what really happened, which is the ground truth for client timing:

- ``arrival_ns``: ``time.perf_counter_ns()`` when the complete request had been read;
- for every SSE event, ``t_ns`` just after ``transport.write()`` returned (asyncio writes to the socket at
  once when nothing is buffered, so this is when the bytes reached the kernel) and its kind
  (role / content / final / usage / done / error) and token count.

``time.perf_counter`` is ``clock_gettime(CLOCK_MONOTONIC)`` on Linux (``time.get_clock_info``), one clock for
every process of the machine, so a client's ``perf_counter()`` and these stamps compare directly.
GET /ground_truth returns ``{request_id: record}`` as JSON (``?id=X`` for one, ``?clear=1`` empties it after
reading). The request id is the body's ``user`` field, else the ``x-request-id`` header, else a counter.

With ``load_step_ms`` the server has a known latency model under load: a request's TTFT is ``ttft_ms`` plus
``load_step_ms`` per answer in flight when it arrived, and every answer ends ``ttft_ms + (max_tokens - 1) *
itl_ms`` after its arrival (a fixed service time E, the later gaps compressed). Answers never wait for one another,
so under Poisson arrivals at rate R the answers in flight at an arrival are Poisson with mean R * E (an M/D/inf
queue; arrivals see time averages): the rate at which a TTFT percentile crosses a limit is computable.

Failure modes (server-wide flags or per request in the body's ``synth`` object, which also overrides
``ttft_ms``, ``itl_ms``, ``tokens_per_chunk``): ``cut_after`` N closes the connection after N content chunks
(no final chunk, no [DONE], no terminating HTTP chunk); ``error_after`` N sends vLLM's error object
(``data: {"error": {...}}``) then ``data: [DONE]`` after N content chunks; ``usage`` false ignores
``stream_options.include_usage`` (no usage chunk); ``empty_text`` sends every token chunk with its token ids
and empty text. ``tokens_per_chunk`` >= ``max_tokens`` sends the whole answer in one chunk. ``reasoning`` N
sends a chat answer's first N tokens as thinking apart from the content (``reasoning`` and ``reasoning_content``
deltas, as vLLM's reasoning parser does).

With ``prefix_cache_block`` B > 0, GET /metrics answers vLLM's prefix-cache counters
(``vllm:prefix_cache_queries_total``, ``vllm:prefix_cache_hits_total``) from a model of vLLM's prefix cache over
the prompts received: a prompt's tokens are its token ids, or for a text prompt the consecutive 4-byte pieces of
its JSON (as many as its ``prompt_tokens``); every request adds its L tokens to the queries and, to the hits, B
times the number of its leading full blocks of B tokens, within its first L - 1 tokens (vLLM computes the last
prompt token again), whose whole prefix an earlier request already had; then its own full blocks are cached (no
eviction). ``prefix_cache_counts()`` gives the same (queries, hits) in the test's process.

The HTTP/1.1 server is raw asyncio (a Protocol, keep-alive, chunked transfer encoding): no framework sits
between the scheduled send and the socket. Run ``python -m tests.synth_server --port P [--ttft-ms X ...]``,
or in tests ``async with SynthServer(Script(...)) as s: s.url``.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import random
import time
from dataclasses import asdict, dataclass, field, replace
from urllib.parse import parse_qs, urlsplit


@dataclass
class Script:
    """The timing and behaviour of every answer (per-request overrides come in the body's ``synth``)."""

    ttft_ms: float = 20.0
    itl_ms: float = 10.0
    ttft_jitter_ms: float = 0.0  # mean of an exponential added to each TTFT
    itl_jitter_ms: float = 0.0   # mean of an exponential added to each gap
    tokens_per_chunk: int = 1    # k > 1: every chunk carries k tokens (the last one what is left)
    spec_max: int = 0            # > 0: tokens per chunk drawn uniformly from 1..spec_max instead
    final_empty: bool = True     # an empty final chunk carries the finish reason (else the last content chunk)
    cut_after: int = -1          # close the connection after this many content chunks
    error_after: int = -1        # send an error object after this many content chunks
    usage: bool = True           # honour stream_options.include_usage (False: a server that ignores it)
    empty_text: bool = False     # token chunks carry their token ids with empty text (special tokens)
    reasoning: int = 0           # chat: the first this many tokens come as thinking, apart (a reasoning parser)
    metrics_bytes: int = 0       # > 0: GET /metrics answers vLLM-shaped Prometheus text of about this size
    prefix_cache_block: int = 0  # > 0: GET /metrics answers prefix-cache counters of a cache of such blocks
    load_step_ms: float = 0.0    # > 0: TTFT grows this much per answer in flight at arrival; the answer still ends
                                 # ttft_ms + (max_tokens - 1) * itl_ms after arrival (a fixed service time)
    seed: int = 0


@dataclass
class Record:
    path: str
    arrival_ns: int
    max_tokens: int
    events: list[dict] = field(default_factory=list)  # {"t_ns", "kind", "tokens"}
    in_flight: int = 0  # answers in flight (being streamed) when the request arrived

    def summary(self) -> dict:
        d = asdict(self)
        content = [e for e in self.events if e["kind"] == "content"]
        d["ttft_ms"] = (content[0]["t_ns"] - self.arrival_ns) / 1e6 if content else None
        return d


def _sse(obj) -> bytes:
    data = obj if isinstance(obj, bytes) else json.dumps(obj, separators=(",", ":")).encode()
    return b"data: " + data + b"\n\n"


def _chunk(payload: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(payload), payload)


class _Conn(asyncio.Protocol):
    def __init__(self, server: "SynthServer"):
        self.srv = server
        self.buf = b""
        self.transport: asyncio.Transport | None = None
        self.busy = False  # one request at a time per connection (HTTP/1.1 without pipelining)

    def connection_made(self, transport):
        self.transport = transport
        self.srv._conns.add(self)

    def connection_lost(self, exc):
        self.srv._conns.discard(self)
        self.transport = None

    def data_received(self, data: bytes):
        t = time.perf_counter_ns()
        self.buf += data
        while not self.busy:
            head_end = self.buf.find(b"\r\n\r\n")
            if head_end < 0:
                return
            head = self.buf[:head_end].decode("latin-1").split("\r\n")
            method, target, _ = head[0].split(" ", 2)
            headers = {}
            for line in head[1:]:
                k, _, v = line.partition(":")
                headers[k.strip().lower()] = v.strip()
            n = int(headers.get("content-length", "0"))
            if len(self.buf) < head_end + 4 + n:
                return
            body = self.buf[head_end + 4:head_end + 4 + n]
            self.buf = self.buf[head_end + 4 + n:]
            self.srv._handle(self, method, target, headers, body, t)

    # ---- plain responses -------------------------------------------------------------------------------
    def reply(self, code: int, obj, content_type: str = "application/json") -> None:
        body = obj if isinstance(obj, bytes) else json.dumps(obj).encode()
        reason = {200: "OK", 400: "Bad Request", 404: "Not Found"}.get(code, "Error")
        self.transport.write(b"HTTP/1.1 %d %s\r\ncontent-type: %s\r\ncontent-length: %d\r\n\r\n%s"
                             % (code, reason.encode(), content_type.encode(), len(body), body))


class _Stream:
    """One streaming answer, driven by loop.call_at (no task, no sleep per chunk)."""

    def __init__(self, srv: "SynthServer", conn: _Conn, rec: Record, script: Script, chat: bool,
                 usage: bool, prompt_tokens: int, rid: str):
        self.srv, self.conn, self.rec, self.sc = srv, conn, rec, script
        self.chat, self.usage, self.prompt_tokens = chat, usage, prompt_tokens
        self.rng = random.Random(f"{script.seed}:{rid}")
        self.sent_tokens = 0
        self.sent_chunks = 0
        self.base = {"id": f"cmpl-{rid}", "object": "chat.completion.chunk" if chat else "text_completion",
                     "created": int(time.time()), "model": srv.model}
        self.due = rec.arrival_ns / 1e9 + (script.ttft_ms + self._jit(script.ttft_jitter_ms)) / 1e3
        self.gap_ms = None  # with load_step_ms: the compressed gap that keeps the service time fixed
        rec.in_flight = srv.in_flight
        if script.load_step_ms > 0:
            service_ms = script.ttft_ms + (rec.max_tokens - 1) * script.itl_ms
            ttft = min(script.ttft_ms + script.load_step_ms * rec.in_flight, service_ms - 1e-3 * rec.max_tokens)
            self.due = rec.arrival_ns / 1e9 + ttft / 1e3
            self.gap_ms = (service_ms - ttft) / max(1, rec.max_tokens - 1)
        srv.in_flight += 1
        self.open = True
        conn.busy = True
        conn.transport.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncache-control: no-cache\r\n"
                             b"transfer-encoding: chunked\r\n\r\n")
        srv.loop.call_at(self._loop_time(self.due), self._step)

    def _jit(self, mean_ms: float) -> float:
        return self.rng.expovariate(1.0 / mean_ms) if mean_ms > 0 else 0.0

    def _loop_time(self, perf_s: float) -> float:
        # loop.time() is time.monotonic(), the same clock as perf_counter on Linux; keep the mapping explicit
        return self.srv.loop.time() + (perf_s - time.perf_counter())

    def _choice(self, text: str | None, ids: list[int], finish: str | None, role: bool = False,
                thinking: bool = False) -> dict:
        if self.chat:
            delta = {"role": "assistant", "content": ""} if role else {"content": text}
            if thinking:  # as vLLM's reasoning parser sends it: both names of the field, equal, and no content
                delta = {"reasoning": text, "reasoning_content": text}
            c = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
        else:
            c = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish}
        c["token_ids"] = ids
        return {**self.base, "choices": [c]}

    def _send(self, events: list[tuple[str, int, bytes]], end: bool = False) -> None:
        tr = self.conn.transport
        if tr is None or tr.is_closing():
            return
        tr.write(b"".join(_chunk(p) for _, _, p in events) + (b"0\r\n\r\n" if end else b""))
        t = time.perf_counter_ns()
        self.rec.events.extend({"t_ns": t, "kind": k, "tokens": n} for k, n, _ in events)

    def _step(self) -> None:
        sc, conn = self.sc, self.conn
        if conn.transport is None or conn.transport.is_closing():
            self._close()
            return
        if sc.cut_after >= 0 and self.sent_chunks >= sc.cut_after:
            self.rec.events.append({"t_ns": time.perf_counter_ns(), "kind": "cut", "tokens": 0})
            conn.transport.close()
            self._close()
            return
        if sc.error_after >= 0 and self.sent_chunks >= sc.error_after:
            err = {"error": {"message": "synthetic engine failure", "type": "InternalServerError", "code": 500}}
            self._send([("error", 0, _sse(err)), ("done", 0, _sse(b"[DONE]"))], end=True)
            self._finish()
            return
        events = []
        if self.chat and self.sent_chunks == 0:
            events.append(("role", 0, _sse(self._choice(None, [], None, role=True))))
        left = self.rec.max_tokens - self.sent_tokens
        k = self.rng.randint(1, sc.spec_max) if sc.spec_max > 0 else sc.tokens_per_chunk
        k = max(1, min(k, left))
        ids = list(range(100 + self.sent_tokens, 100 + self.sent_tokens + k))
        self.sent_tokens += k
        self.sent_chunks += 1
        last = self.sent_tokens >= self.rec.max_tokens
        finish = "length" if last and not sc.final_empty else None
        text = "" if sc.empty_text else "".join(f" t{i}" for i in ids)
        thinking = self.sent_tokens - k < sc.reasoning  # a chunk that crosses the boundary is thinking, whole
        events.append(("content", k, _sse(self._choice(text, ids, finish, thinking=thinking))))
        if last:
            if sc.final_empty:
                events.append(("final", 0, _sse(self._choice("", [], "length"))))
            if self.usage and sc.usage:
                events.append(("usage", 0, _sse({**self.base, "choices": [], "usage": {
                    "prompt_tokens": self.prompt_tokens, "completion_tokens": self.sent_tokens,
                    "total_tokens": self.prompt_tokens + self.sent_tokens}})))
            events.append(("done", 0, _sse(b"[DONE]")))
            self._send(events, end=True)
            self._finish()
            return
        self._send(events)
        self.due += (self.gap_ms if self.gap_ms is not None else sc.itl_ms + self._jit(sc.itl_jitter_ms)) / 1e3
        self.srv.loop.call_at(self._loop_time(self.due), self._step)

    def _close(self) -> None:
        if self.open:
            self.open = False
            self.srv.in_flight -= 1

    def _finish(self) -> None:
        self._close()
        self.conn.busy = False
        if self.conn.buf:  # a request that arrived while we streamed (pipelining): serve it now
            self.conn.data_received(b"")


class SynthServer:
    """The server in this process's event loop: ``async with SynthServer(Script()) as s`` -> ``s.url``."""

    def __init__(self, script: Script | None = None, host: str = "127.0.0.1", port: int = 0,
                 model: str = "synth"):
        self.script = script or Script()
        self.host, self.port, self.model = host, port, model
        self.records: dict[str, Record] = {}
        self._conns: set[_Conn] = set()
        self._server: asyncio.base_events.Server | None = None
        self._counter = 0
        self.in_flight = 0  # answers being streamed now
        self._cached_blocks: set[int] = set()  # the prefix-cache model: chained hashes of the cached full blocks
        self._prefix_queries = 0
        self._prefix_hits = 0
        self.loop: asyncio.AbstractEventLoop | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    async def start(self) -> "SynthServer":
        self.loop = asyncio.get_running_loop()
        self._server = await self.loop.create_server(lambda: _Conn(self), self.host, self.port, backlog=2048)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def stop(self) -> None:
        self._server.close()
        for c in list(self._conns):
            if c.transport:
                c.transport.close()
        await self._server.wait_closed()

    async def __aenter__(self) -> "SynthServer":
        return await self.start()

    async def __aexit__(self, *exc) -> None:
        await self.stop()

    def ground_truth(self) -> dict[str, dict]:
        return {rid: r.summary() for rid, r in self.records.items()}

    def prefix_cache_counts(self) -> tuple[int, int]:
        """(queries, hits) of the prefix-cache model so far, in tokens (the module docstring)."""
        return self._prefix_queries, self._prefix_hits

    def _prefix_cache(self, tokens: list) -> None:
        """Count one prompt's ``tokens`` into the prefix-cache model and cache its full blocks."""
        b = self.script.prefix_cache_block
        chain, hashes = 0, []
        for k in range(len(tokens) // b):
            chain = hash((chain, tuple(tokens[k * b:(k + 1) * b])))  # a block's hash names its whole prefix
            hashes.append(chain)
        hit = 0
        for h in hashes[:(len(tokens) - 1) // b]:
            if h not in self._cached_blocks:
                break
            hit += 1
        self._prefix_queries += len(tokens)
        self._prefix_hits += hit * b
        self._cached_blocks.update(hashes)

    def _handle(self, conn: _Conn, method: str, target: str, headers: dict, body: bytes, t_ns: int) -> None:
        url = urlsplit(target)
        if method == "GET" and url.path == "/health":
            return conn.reply(200, {})
        if method == "GET" and url.path == "/metrics" and self.script.prefix_cache_block > 0:
            text = prefix_cache_text(*self.prefix_cache_counts())
            if self.script.metrics_bytes > 0:
                text += metrics_text(self.script.metrics_bytes, len(self.records))
            return conn.reply(200, text, "text/plain")
        if method == "GET" and url.path == "/metrics" and self.script.metrics_bytes > 0:
            return conn.reply(200, metrics_text(self.script.metrics_bytes, len(self.records)), "text/plain")
        if method == "GET" and url.path == "/v1/models":
            return conn.reply(200, {"object": "list", "data": [{"id": self.model, "object": "model"}]})
        if method == "GET" and url.path == "/ground_truth":
            q = parse_qs(url.query)
            if "id" in q:
                rec = self.records.get(q["id"][0])
                return conn.reply(200 if rec else 404, rec.summary() if rec else {"error": "unknown id"})
            out = self.ground_truth()
            if q.get("clear") == ["1"]:
                self.records.clear()
            return conn.reply(200, out)
        if method != "POST" or url.path not in ("/v1/chat/completions", "/v1/completions"):
            return conn.reply(404, {"error": {"message": f"no route {method} {url.path}", "code": 404}})
        try:
            req = json.loads(body)
        except ValueError:
            return conn.reply(400, {"error": {"message": "body is not JSON", "code": 400}})
        if not req.get("stream"):
            return conn.reply(400, {"error": {"message": "only stream=true is served", "code": 400}})
        chat = url.path.endswith("chat/completions")
        self._counter += 1
        rid = str(req.get("user") or headers.get("x-request-id") or f"r{self._counter}")
        overrides = {k: v for k, v in (req.get("synth") or {}).items() if k in Script.__dataclass_fields__}
        script = replace(self.script, **overrides)
        max_tokens = int(req.get("max_completion_tokens") or req.get("max_tokens") or 16)
        prompt = req.get("messages") if chat else req.get("prompt")
        prompt_tokens = len(prompt) if isinstance(prompt, list) and prompt and isinstance(prompt[0], int) \
            else max(1, len(json.dumps(prompt)) // 4)
        if self.script.prefix_cache_block > 0:
            text = json.dumps(prompt).encode()
            self._prefix_cache(prompt if isinstance(prompt, list) and prompt and isinstance(prompt[0], int)
                               else [text[i:i + 4] for i in range(0, 4 * prompt_tokens, 4)])
        rec = self.records[rid] = Record(path=url.path, arrival_ns=t_ns, max_tokens=max_tokens)
        usage = bool((req.get("stream_options") or {}).get("include_usage"))
        _Stream(self, conn, rec, script, chat, usage, prompt_tokens, rid)


def prefix_cache_text(queries: int, hits: int) -> bytes:
    """Prometheus text of vLLM 0.32's prefix-cache counters (tokens), one engine."""
    labels = 'engine="0",model_name="synth"'
    return (f"# TYPE vllm:prefix_cache_queries_total counter\nvllm:prefix_cache_queries_total{{{labels}}} {queries}\n"
            f"# TYPE vllm:prefix_cache_hits_total counter\nvllm:prefix_cache_hits_total{{{labels}}} {hits}\n").encode()


def metrics_text(size: int, requests: int) -> bytes:
    """Prometheus text of about ``size`` bytes: vLLM's request counter and KV gauge, padded with a labelled
    counter family (a real vLLM's /metrics is a few hundred KB: a histogram family per model and engine)."""
    head = (f"# TYPE vllm:request_success_total counter\nvllm:request_success_total{{finished_reason=\"stop\"}} "
            f"{requests}\n# TYPE vllm:kv_cache_usage_perc gauge\nvllm:kv_cache_usage_perc 0.1\n"
            "# TYPE vllm:synth_padding_total counter\n")
    line = 'vllm:synth_padding_total{engine="0",model_name="synth",i="%d"} %d\n'
    rows, n = [head], len(head)
    i = 0
    while n < size:
        row = line % (i, i)
        rows.append(row)
        n += len(row)
        i += 1
    return "".join(rows).encode()


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=8011)
    ap.add_argument("--model", default="synth")
    for f in Script.__dataclass_fields__.values():
        flag = "--" + f.name.replace("_", "-")
        if f.type in ("bool", bool):
            ap.add_argument(flag, type=lambda s: s.lower() in ("1", "true", "yes"), default=f.default)
        else:
            ap.add_argument(flag, type=float if "ms" in f.name else int, default=f.default)
    a = ap.parse_args(argv)
    script = Script(**{k: getattr(a, k) for k in Script.__dataclass_fields__})

    async def serve():
        srv = await SynthServer(script, a.host, a.port, a.model).start()
        print(f"synth server on {srv.url} {script}", flush=True)
        await asyncio.Event().wait()

    try:
        asyncio.run(serve())
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()

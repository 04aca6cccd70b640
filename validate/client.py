"""Async OpenAI-compatible client over httpx with SSE streaming and per-chunk timing.

Timing (see DESIGN.md, "Metric definitions"): each request records ``time.perf_counter()`` when it is sent
and when every SSE line arrives, taken before the line is parsed. A chunk is *content-bearing* when its delta
carries non-empty ``content`` or ``reasoning_content`` / ``reasoning`` (reasoning counts as generated content
and is kept apart); a role-only or empty chunk is not a token. Output token counts come from the server's
``usage`` (``stream_options.include_usage``), never from re-tokenizing. A request whose stream ends without
a finish reason, or with an error object, is an error, never a short answer.
"""
from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field
from typing import Any

import httpx


@dataclass
class RequestResult:
    """One request's outcome and raw timings.

    Times are seconds on ``time.perf_counter``'s clock; ``chunk_times`` are offsets from ``t_sent`` of each
    content-bearing chunk, with ``chunk_tokens`` the tokens each carried (from ``token_ids`` when the server
    returns them, else 1).
    """

    ok: bool = False
    error: str | None = None
    text: str = ""
    reasoning: str = ""
    finish_reason: str | None = None
    prompt_tokens: int | None = None
    output_tokens: int | None = None
    token_ids: list[int] | None = None
    t_sent: float = 0.0
    t_done: float = 0.0
    chunk_times: list[float] = field(default_factory=list)
    chunk_tokens: list[int] = field(default_factory=list)

    @property
    def ttft_s(self) -> float | None:
        """Request sent -> first content-bearing chunk, seconds (None if no content arrived)."""
        return self.chunk_times[0] if self.chunk_times else None

    @property
    def e2el_s(self) -> float:
        """Request sent -> stream finished, seconds."""
        return self.t_done - self.t_sent


class ServerError(Exception):
    """The server answered a non-streaming request with an error."""


class OpenAIClient:
    """Client of one OpenAI-compatible server.

    Args:
        base_url: e.g. ``http://127.0.0.1:8000`` (without ``/v1``).
        model: the served model name sent as ``model``.
        timeout_s: per-request read timeout, seconds.
        max_connections: connection pool size (set it >= the highest concurrency you will use).
        transport: an httpx transport to use instead of the network (tests).
    """

    def __init__(self, base_url: str, model: str, timeout_s: float = 600.0, max_connections: int = 256,
                 transport: httpx.AsyncBaseTransport | None = None):
        self.base_url = base_url.rstrip("/")
        self.model = model
        self._http = httpx.AsyncClient(
            base_url=self.base_url, transport=transport,
            timeout=httpx.Timeout(timeout_s, connect=10.0),
            limits=httpx.Limits(max_connections=max_connections, max_keepalive_connections=max_connections),
        )

    async def aclose(self) -> None:
        await self._http.aclose()

    async def __aenter__(self) -> "OpenAIClient":
        return self

    async def __aexit__(self, *exc) -> None:
        await self.aclose()

    # ---- plain endpoints -------------------------------------------------------------------------------
    async def health(self) -> bool:
        """True when GET /health answers 200."""
        try:
            r = await self._http.get("/health", timeout=5.0)
            return r.status_code == 200
        except httpx.HTTPError:
            return False

    async def version(self) -> str | None:
        """vLLM's version from GET /version, or None when the server has no such endpoint."""
        try:
            r = await self._http.get("/version", timeout=5.0)
            return r.json().get("version") if r.status_code == 200 else None
        except (httpx.HTTPError, ValueError):
            return None

    async def tokenize(self, text: str) -> list[int]:
        """Token ids of ``text`` (vLLM's POST /tokenize, no special tokens). Raises ServerError."""
        r = await self._http.post("/tokenize", json={"model": self.model, "prompt": text, "add_special_tokens": False})
        if r.status_code != 200:
            raise ServerError(f"/tokenize: HTTP {r.status_code}: {r.text[:200]}")
        return r.json()["tokens"]

    async def detokenize(self, tokens: list[int]) -> str:
        """Text of ``tokens`` (vLLM's POST /detokenize). Raises ServerError."""
        r = await self._http.post("/detokenize", json={"model": self.model, "tokens": tokens})
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
        try:
            async with self._http.stream("POST", path, json=body) as resp:
                if resp.status_code != 200:
                    detail = (await resp.aread()).decode(errors="replace")[:300]
                    res.error = f"HTTP {resp.status_code}: {detail}"
                    return res
                done = False
                async for line in resp.aiter_lines():
                    t = time.perf_counter()
                    if not line.startswith("data:"):
                        continue
                    data = line[5:].strip()
                    if data == "[DONE]":
                        done = True
                        break
                    self._take_chunk(res, json.loads(data), t)
                    if res.error:
                        return res
                if not done:
                    res.error = "stream ended without [DONE] (cut mid-answer)"
                elif res.finish_reason is None:
                    res.error = "stream ended without a finish reason"
                else:
                    res.ok = True
        except httpx.HTTPError as e:
            res.error = f"{type(e).__name__}: {e}" if str(e) else type(e).__name__
        except (json.JSONDecodeError, KeyError, TypeError) as e:
            res.error = f"malformed stream chunk: {e}"
        finally:
            res.t_done = time.perf_counter()
        return res

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
            delta = choice.get("delta")
            content = delta.get("content") if delta is not None else choice.get("text")
            reasoning = (delta or {}).get("reasoning_content") or (delta or {}).get("reasoning")
            ids = choice.get("token_ids")
            if ids:
                res.token_ids.extend(ids)
            if content or reasoning:
                res.chunk_times.append(t - res.t_sent)
                res.chunk_tokens.append(len(ids) if ids else 1)
                res.text += content or ""
                res.reasoning += reasoning or ""
            if choice.get("finish_reason"):
                res.finish_reason = choice["finish_reason"]


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

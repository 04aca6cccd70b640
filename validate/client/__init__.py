"""Async OpenAI-compatible client over httpx with SSE streaming and per-chunk timing (docs/metrics.md).

Three layers, each importing only from those below it:

- :mod:`validate.client.openai`: :class:`OpenAIClient`, the client of one server (plain endpoints, streamed
  chat and text completions, the checks of a finished answer) and its :class:`Tally`.
- :mod:`validate.client.pool`: the keep-alive connections of the streaming path and :func:`gather_limited`.
- :mod:`validate.client.stream`: one streamed completion: the connection that stamps each SSE event as its
  bytes arrive, the SSE splitting, and the parse of the events into a :class:`RequestResult`.
"""
from validate.client.openai import UTILITY_BOUND_S, OpenAIClient, ServerError, Tally, usage_bound
from validate.client.pool import gather_limited
from validate.client.stream import MAX_EVENT_BYTES, RequestResult

__all__ = ["MAX_EVENT_BYTES", "UTILITY_BOUND_S", "OpenAIClient", "RequestResult", "ServerError", "Tally",
           "gather_limited", "usage_bound"]

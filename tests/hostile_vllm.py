"""A hostile synthetic server (tests.fake_vllm with some endpoints made to misbehave). ``HOSTILE_MODE``:

- trickle-metrics: GET /metrics answers 200 with a large content-length and then one byte every 2 s, forever.
- trickle-health: GET /health answers 200 headers and then one byte every 2 s (a body that never ends).
- trickle-tokenize: POST /tokenize answers like /metrics above.
- tokenize-empty: POST /tokenize answers at once with no token ids (quick and well-formed: no per-call bound fires).
- trickle-models: GET /v1/models answers like /metrics above.
- alt-stall: every second generation (after HOSTILE_AFTER) sends its headers and then nothing, forever.
- usage-max: usage.completion_tokens is max_tokens, whatever was streamed.
- five-hundred-some: after HOSTILE_AFTER generations every 7th answers HTTP 500 (a server failing some requests).
"""
from __future__ import annotations

import json
import os
import threading
import time

import tests.fake_vllm as fv

MODE = os.environ.get("HOSTILE_MODE", "")
AFTER = int(os.environ.get("HOSTILE_AFTER", "1"))
n_gen = 0
lock = threading.Lock()
orig_post = fv.Handler.do_POST
orig_get = fv.Handler.do_GET


def trickle(self):
    self.send_response(200)
    self.send_header("content-type", "text/plain")
    self.send_header("content-length", "100000000")
    self.end_headers()
    while True:
        self.wfile.write(b"#")
        self.wfile.flush()
        time.sleep(2)


def do_GET(self):
    if MODE == "trickle-metrics" and self.path == "/metrics":
        return trickle(self)
    if MODE == "trickle-health" and self.path == "/health":
        return trickle(self)
    if MODE == "trickle-models" and self.path == "/v1/models":
        return trickle(self)
    return orig_get(self)


def do_POST(self):
    global n_gen
    if MODE == "trickle-tokenize" and self.path == "/tokenize":
        n = int(self.headers.get("content-length", 0))
        self.rfile.read(n)
        return trickle(self)
    if MODE == "tokenize-empty" and self.path == "/tokenize":
        self.rfile.read(int(self.headers.get("content-length", 0)))
        return self._json(200, {"tokens": [], "count": 0})
    if self.path not in ("/v1/chat/completions", "/v1/completions"):
        return orig_post(self)
    with lock:
        n_gen += 1
        k = n_gen
    if MODE == "alt-stall" and k > AFTER and k % 2 == 0:
        n = int(self.headers.get("content-length", 0))
        self.rfile.read(n)
        self.send_response(200)
        self.send_header("content-type", "text/event-stream")
        self.send_header("connection", "close")
        self.end_headers()
        self.wfile.flush()
        time.sleep(10_000)
    if MODE == "five-hundred-some" and k > AFTER and k % 7 == 0:
        n = int(self.headers.get("content-length", 0))
        self.rfile.read(n)
        return self._json(500, {"error": {"message": "boom under load"}})
    if MODE == "usage-max":
        n = int(self.headers.get("content-length", 0))
        body = self.rfile.read(n)
        want = json.loads(body).get("max_tokens")
        import io
        self.rfile = io.BufferedReader(io.BytesIO(body))
        real = self.wfile.write

        def write(b):
            if b.startswith(b"data: {") and b'"usage"' in b:
                d = json.loads(b[6:])
                d["usage"]["completion_tokens"] = want
                b = f"data: {json.dumps(d)}\n\n".encode()
            return real(b)
        self.wfile.write = write
    return orig_post(self)


fv.Handler.do_POST = do_POST
fv.Handler.do_GET = do_GET

if __name__ == "__main__":
    fv.main()

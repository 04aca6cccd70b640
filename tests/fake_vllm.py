"""A synthetic OpenAI-compatible streaming server that takes vLLM's API-server arguments, for launcher and
client tests. Behaviour is chosen with ``FAKE_VLLM_MODE``:

- ``ok``: prints the r9k provenance line (as the plugin would) and a KV cache line, serves /health,
  /version, /tokenize, /v1/chat/completions and /v1/completions, streaming ``FAKE_VLLM_TOKENS`` words
  (default 6) with ``FAKE_VLLM_ITL_MS`` (default 2) between them; the answer repeats the last number of the
  prompt ("The answer is N.").
- ``crash``: prints a traceback-like line and exits with status 3 during start-up.
- ``hang``: starts but never answers /health with 200.
- ``wrong-tree``: like ok, but announces another plugin source hash.
- ``no-plugin``: like ok, without the provenance line.
- ``cut``: like ok, but closes every stream after two content chunks without [DONE].
- ``die-after``: like ok, but the process exits after ``FAKE_VLLM_DIE_AFTER`` generations (default 3).
- ``close-after``: like ok, but once ``FAKE_VLLM_DIE_AFTER`` generations are done every new connection is
  closed as soon as it is accepted, before a byte is read or sent (a server going down whose listener still
  takes connections); the process stays alive.
- ``engine-dead-after``: like ok until ``FAKE_VLLM_DIE_AFTER`` generations are done, then the engine is dead
  and the API server lives on, as vLLM's does when its engine core dies: it logs the engine's death once, answers
  /health with 503 and every generation at once with HTTP 500 (EngineDeadError).
- ``garbage``: like ok, but every answer is replacement characters (U+FFFD), alone and under load.
- ``busy-wrong``: like ok, but a generation that starts while another one is streaming answers the prompt's last
  number plus one (right alone, wrong under load).
- ``busy-diverge``: like ok, but a generation that starts while another one is streaming says "The answer is
  indeed N." (other tokens than alone, the same number: divergent, still right; " indeed" is token 99, every
  other token ``i`` of an answer is 100 + i).
- ``think-separate``, ``think-inline``, ``think-recite``, ``think-unclosed``: a reasoning model that thinks out
  loud, then answers right: a GSM8K question (found in ``FAKE_VLLM_GSM8K``, a test.jsonl) with ``#### <gold>``,
  a HumanEval prompt with its canonical solution in a python block, anything else with "The answer is N."
  (N the prompt's last number). Its thinking recites an example's answer (``FAKE_VLLM_RECITE``, default
  ``#### 72``; for HumanEval a wrong draft of the function in a python block), except in ``think-inline``.
  ``think-separate`` sends the thinking apart, as vLLM's reasoning parser does (deltas carrying ``reasoning``
  and ``reasoning_content``); ``think-inline`` and ``think-recite`` inside the text, between ``<think>`` and
  ``</think>``; ``think-unclosed`` opens ``<think>`` and thinks until ``max_tokens`` runs out.

``FAKE_VLLM_DISPATCH`` / ``FAKE_VLLM_DISPATCH_FAILED`` (comma-separated names) fill the provenance line's
``dispatch=`` / ``failed=`` fields, as the plugin prints them; it prints one line for itself and one for a
notional engine core (``FAKE_VLLM_PROCESSES``, default 2, lines in all).

With ``FAKE_VLLM_SPEC="drafts,accepted_pos0,accepted_pos1,..."`` (any mode) it also serves GET /metrics as a
speculating vLLM 0.32 does (``SpecDecodingProm`` of ``vllm/v1/spec_decode/metrics.py``, written by
prometheus_client as vLLM's is): ``vllm:spec_decode_num_drafts``, ``_num_draft_tokens``, ``_num_accepted_tokens``
and ``_num_accepted_tokens_per_pos`` (label ``position``, one series per position), labels ``model_name`` (the
served name) and ``engine="0"``. Each finished generation adds ``drafts`` drafts of k tokens (k the positions
given), ``accepted_posI`` accepted tokens at position I and their sum to the accepted tokens, before its last
event is sent (a scrape after the stream ends sees them). The numbers are served as given, possible or not. Without
it GET /metrics answers 404, as before.

A request that asks for logprobs (chat ``logprobs: true``, completions ``logprobs: n``) gets the top two of each
token of each chunk, in vLLM's shapes (chat ``logprobs.content[*].top_logprobs``, completions
``logprobs.top_logprobs[*]`` as {token: value}), the token named ``token_id:<id>`` where the request says
``return_tokens_as_token_ids``, else by its text: token ``i`` (its id) at :func:`top_value` ``(i)``, and a
runner-up (id 7) :func:`runner_up_margin` ``(i)`` below it.

With ``FAKE_VLLM_SETSID_CHILD=1`` it also starts a worker process in a session of its own (as some engines'
workers do), which outlives the server unless the launcher finds it.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

MODE = os.environ.get("FAKE_VLLM_MODE", "ok")
TOKENS = int(os.environ.get("FAKE_VLLM_TOKENS", "6"))
ITL_S = float(os.environ.get("FAKE_VLLM_ITL_MS", "2")) / 1e3
DIE_AFTER = int(os.environ.get("FAKE_VLLM_DIE_AFTER", "3"))
_count = 0
_busy = 0  # generations streaming now
_lock = threading.Lock()


def spec_per_request() -> tuple[int, list[int]] | None:
    """(drafts, accepted tokens by position) each generation adds, from ``FAKE_VLLM_SPEC``; None when unset.

    Raises:
        SystemExit: the variable is not comma-separated whole numbers >= 0, a drafts count and at least one position.
    """
    raw = os.environ.get("FAKE_VLLM_SPEC")
    if raw is None:
        return None
    parts = [x.strip() for x in raw.split(",")]
    if len(parts) < 2 or not all(x.isdigit() for x in parts):
        raise SystemExit(f"FAKE_VLLM_SPEC={raw!r}: give drafts,accepted_pos0[,accepted_pos1,...] as whole numbers >= 0")
    return int(parts[0]), [int(x) for x in parts[1:]]


SPEC = spec_per_request()
_spec_registry = None
_spec_counters: dict = {}


def spec_counters(served_name: str) -> None:
    """Create vLLM's speculative-decoding counters (names, help texts and labels of ``SpecDecodingProm``) in a
    registry of the fake's own, every position's series at 0, as vLLM does at start-up."""
    global _spec_registry
    import prometheus_client

    _spec_registry = prometheus_client.CollectorRegistry()
    labels = {"model_name": served_name, "engine": "0"}
    for key, name, doc in (("drafts", "vllm:spec_decode_num_drafts", "Number of spec decoding drafts."),
                           ("draft_tokens", "vllm:spec_decode_num_draft_tokens", "Number of draft tokens."),
                           ("accepted", "vllm:spec_decode_num_accepted_tokens", "Number of accepted tokens.")):
        c = prometheus_client.Counter(name, doc, labelnames=["model_name", "engine"], registry=_spec_registry)
        _spec_counters[key] = c.labels(**labels)
    per_pos = prometheus_client.Counter("vllm:spec_decode_num_accepted_tokens_per_pos",
                                        "Accepted tokens per draft position.",
                                        labelnames=["model_name", "engine", "position"], registry=_spec_registry)
    _spec_counters["per_pos"] = [per_pos.labels(**labels, position=str(i)) for i in range(len(SPEC[1]))]


def spec_observe() -> None:
    """One generation's drafts (``FAKE_VLLM_SPEC``) added to the counters."""
    if SPEC is None or _spec_registry is None:
        return
    drafts, per_pos = SPEC
    with _lock:
        _spec_counters["drafts"].inc(drafts)
        _spec_counters["draft_tokens"].inc(drafts * len(per_pos))
        _spec_counters["accepted"].inc(sum(per_pos))
        for c, a in zip(_spec_counters["per_pos"], per_pos):
            c.inc(a)


def engine_dead() -> bool:
    return MODE == "engine-dead-after" and _count >= DIE_AFTER


_death_logged = False


THINK_MODES = ("think-separate", "think-inline", "think-recite", "think-unclosed")
RECITE = os.environ.get("FAKE_VLLM_RECITE", "#### 72")
_golds: dict[str, str] | None = None
_problems: list | None = None


def gsm8k_gold(question: str) -> str | None:
    global _golds
    if _golds is None:
        path = os.environ.get("FAKE_VLLM_GSM8K")
        rows = [json.loads(ln) for ln in open(path)] if path else []
        _golds = {r["question"]: r["answer"].split("####")[-1].strip() for r in rows}
    return _golds.get(question)


def humaneval_problem(prompt: str):
    global _problems
    if "Complete the following Python function" not in prompt:
        return None
    if _problems is None:
        from validate.evals.humaneval import load_problems

        _problems = list(load_problems())
    return next((p for p in _problems if p.prompt in prompt), None)


def thinking_pieces(prompt: str, max_tokens: int) -> list[tuple[str, str]]:
    """(field, text) per token of a thinking mode's reply: field "reasoning" (sent apart) or "content"."""
    gold, problem = gsm8k_gold(prompt), humaneval_problem(prompt)
    if gold is not None:
        thought, answer = "Add the amounts step by step.", f"So the total is {gold}.\n#### {gold}"
        recital = f" Recall the example: {RECITE}."
    elif problem is not None:
        thought, answer = "Read the docstring.", f"```python\n{problem.prompt}{problem.canonical_solution}```"
        recital = (f" A first draft:\n```python\ndef {problem.entry_point}(*args):\n    raise NotImplementedError('draft')"
                   "\n```\nNo.")
    else:
        nums = re.findall(r"\d+", prompt)
        thought, answer = "The user wants the number.", f"The answer is {nums[-1] if nums else 'unknown'}."
        recital = f" Recall the example: {RECITE}."
    if MODE != "think-inline":
        thought += recital
    split = lambda text: re.findall(r"\s*\S+", text)  # noqa: E731
    if MODE == "think-separate":
        return [("reasoning", w) for w in split(thought)] + [("content", w) for w in split(answer)]
    if MODE == "think-unclosed":
        words = split("<think>\n" + thought)
        while len(words) < max_tokens:
            words += split(" Let me check that again.")
        return [("content", w) for w in words[:max_tokens]]
    return [("content", w) for w in split(f"<think>\n{thought}\n</think>\n\n{answer}")]


def answer_words(prompt: str, busy: bool = False) -> list[str]:
    """The answer's words; ``busy``: another generation was streaming when this one started."""
    if MODE == "garbage":
        return ["\ufffd\ufffd"] * TOKENS
    nums = re.findall(r"\d+", prompt)
    said = nums[-1] if nums else "unknown"
    if busy and MODE == "busy-wrong" and nums:
        said = str(int(said) + 1)
    words = ["The", " answer", " is"] + ([" indeed"] if busy and MODE == "busy-diverge" else []) + [f" {said}", "."]
    while len(words) < TOKENS:
        words.append(" more")
    return words[:TOKENS]


def top_value(i: int) -> float:
    """The value of the ``i``-th output token (a logit's scale: 20, 19.5, ...; bf16 values, exact in JSON)."""
    return 20.0 - 0.5 * i


def runner_up_margin(i: int) -> float:
    """top1 - top2 at the ``i``-th output token: 0.0625 at token 3 (half a bf16 step at 18.5: inside the near-tie
    bound, so busy-diverge's parting there is a near-tie), 1.0 elsewhere."""
    return 0.0625 if i == 3 else 1.0


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *a):  # keep the log for what the tests read
        pass

    def _json(self, code: int, obj) -> None:
        body = json.dumps(obj).encode()
        self.send_response(code)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):
        if self.path == "/health":
            if MODE == "hang" or engine_dead():
                self._json(503, {"status": "starting"})
            else:
                self._json(200, {})
        elif self.path == "/version":
            self._json(200, {"version": "0.0.0-fake"})
        elif self.path == "/metrics" and _spec_registry is not None:
            import prometheus_client

            with _lock:
                body = prometheus_client.generate_latest(_spec_registry)
            self.send_response(200)
            self.send_header("content-type", prometheus_client.CONTENT_TYPE_LATEST)
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
        else:
            self._json(404, {"error": "not found"})

    def do_POST(self):
        global _busy, _death_logged
        n = int(self.headers.get("content-length", 0))
        req = json.loads(self.rfile.read(n) or b"{}")
        if self.path == "/tokenize":
            words = req.get("prompt", "").split()
            self._json(200, {"tokens": [len(w) for w in words], "count": len(words)})
            return
        if self.path not in ("/v1/chat/completions", "/v1/completions"):
            self._json(404, {"error": "not found"})
            return
        if engine_dead():
            with _lock:
                if not _death_logged:
                    _death_logged = True
                    print("ERROR [core_client.py] Engine core proc EngineCore_DP0 died unexpectedly, shutting down "
                          "client.", flush=True)
            print("ERROR [serving.py] EngineDeadError: EngineCore encountered an issue.", flush=True)
            self._json(500, {"error": {"message": "EngineCore encountered an issue.", "type": "EngineDeadError"}})
            return
        with _lock:
            busy = _busy > 0
            _busy += 1
        try:
            self._generate(req, busy)
        finally:
            with _lock:
                _busy -= 1

    def _generate(self, req: dict, busy: bool) -> None:
        global _count
        chat = self.path == "/v1/chat/completions"
        prompt = req["messages"][-1]["content"] if chat else str(req.get("prompt"))
        if MODE in THINK_MODES:
            pieces = thinking_pieces(prompt, req.get("max_tokens", TOKENS))[: req.get("max_tokens", TOKENS)]
        else:
            pieces = [("content", w) for w in answer_words(prompt, busy)[: req.get("max_tokens", TOKENS)]]
        words = [w for _, w in pieces]
        self.send_response(200)
        self.send_header("content-type", "text/event-stream")
        self.send_header("connection", "close")
        self.end_headers()

        def send(obj) -> None:
            self.wfile.write(f"data: {json.dumps(obj)}\n\n".encode())
            self.wfile.flush()

        def logprobs(i: int, tid: int, text: str):
            name = (lambda t, s: f"token_id:{t}") if req.get("return_tokens_as_token_ids") else (lambda t, s: s)
            top = [(name(tid, text), top_value(i)), (name(7, " alt"), top_value(i) - runner_up_margin(i))]
            if chat:
                return {"content": [{"token": top[0][0], "logprob": top[0][1],
                                     "top_logprobs": [{"token": t, "logprob": v} for t, v in top]}]}
            return {"tokens": [top[0][0]], "token_logprobs": [top[0][1]], "top_logprobs": [dict(top)],
                    "text_offset": [0]}

        def choice(text, ids, finish=None, field="content", i=0):
            c = {"index": 0, "finish_reason": finish, "token_ids": ids}
            if req.get("logprobs"):
                c["logprobs"] = logprobs(i, ids[0], text)
            if chat and field == "reasoning":  # vLLM sends both names of the field, equal
                c["delta"] = {"reasoning": text, "reasoning_content": text}
            elif chat:
                c["delta"] = {"content": text}
            else:
                c["text"] = text
            return {"choices": [c]}

        if chat:
            send({"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}]})
        for i, (field, w) in enumerate(pieces):
            time.sleep(ITL_S)
            if MODE == "cut" and i == 2:
                self.close_connection = True
                return
            send(choice(w, [99 if w == " indeed" else 100 + i], field=field if chat else "content", i=i))
        spec_observe()  # before the last events: a scrape once the client has [DONE] counts this generation
        # counted before [DONE] too: a client that has its answer may send the next request at once, and that
        # request must already see the death this generation brings (engine-dead-after, close-after)
        with _lock:
            _count += 1
            n = _count
        if MODE == "die-after" and n > DIE_AFTER:
            time.sleep(60)  # the DIE_AFTER-th generation is ending the process: no answer finishes after it
        send(choice("", [2], finish="length" if len(words) == req.get("max_tokens") else "stop", i=len(pieces)))
        send({"choices": [], "usage": {"prompt_tokens": len(prompt.split()), "completion_tokens": len(words),
                                       "total_tokens": len(prompt.split()) + len(words)}})
        self.wfile.write(b"data: [DONE]\n\n")
        self.wfile.flush()
        if MODE == "die-after" and n == DIE_AFTER:
            os._exit(9)


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def verify_request(self, request, client_address) -> bool:
        # False: socketserver shuts the connection down (FIN, or RST when the request had already arrived)
        return not (MODE == "close-after" and _count >= DIE_AFTER)


_CHILD = "import os, time\nppid = os.getppid()\nwhile os.getppid() == ppid:\n    time.sleep(0.5)\n"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=8000)
    ap.add_argument("--model")
    ap.add_argument("--served-model-name")
    args, _ = ap.parse_known_args()
    if os.environ.get("FAKE_VLLM_SETSID_CHILD") == "1":
        import subprocess

        subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)", f"worker-of-{args.served_model_name}"],
                         start_new_session=True)
    if MODE == "crash":
        print("Traceback (most recent call last):\nRuntimeError: fake engine core failed to start", flush=True)
        sys.exit(3)
    if MODE not in ("no-plugin",):
        from r9k import provenance

        names = lambda var: [x for x in os.environ.get(var, "").split(",") if x]  # noqa: E731
        line = provenance.line(names("FAKE_VLLM_DISPATCH"), names("FAKE_VLLM_DISPATCH_FAILED"))
        if MODE == "wrong-tree":
            line = re.sub(r"source_hash=\w+", "source_hash=0123456789abcdef", line)
        print(line, flush=True)
        # as vLLM's engine core would (a server has at least tp + 1 processes), from a real child process that
        # ends with this one; FAKE_VLLM_PROCESSES=1: only one
        import subprocess

        for _ in range(1, int(os.environ.get("FAKE_VLLM_PROCESSES", "2"))):
            child = subprocess.Popen([sys.executable, "-c", _CHILD])
            print(re.sub(r" pid=\d+", f" pid={child.pid}", line), flush=True)
    if SPEC is not None:
        spec_counters(args.served_model_name or args.model or "fake-model")
    print("INFO [kv_cache_utils.py] GPU KV cache size: 12,345 tokens", flush=True)
    srv = _Server((args.host, args.port), Handler)
    print(f"Starting fake vLLM server on http://{args.host}:{args.port}", flush=True)
    srv.serve_forever()


if __name__ == "__main__":
    main()

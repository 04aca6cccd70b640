"""One configuration served until its first answered request, then stopped: does vLLM start from this host's
environment (on the GPU host, the archive's) and answer?

    python -m benchmarks.serve_smoke --config h200-next --out DIR [--knobs stock] [--model-cache D] [--max-tokens N]

Prepares the configuration's model (validate/models.py; a random-weight model is made once into the model cache)
and launches the server through the engine's own launcher (validate/server.py ``launch``: the configuration's
command line and environment, ready once /health answers and one real generation returns, a provenance line of
another tree refused); then sends one chat completion and stops the server with its whole process tree. Prints
progress, the time from launch to the first served request and the answer's token count; writes
``DIR/serve_smoke.json`` (:class:`Smoke`) and the server's log ``DIR/server.log``.

Exit status: 0 when the request was served (HTTP 200 and at least one token), 1 when the model could not be
prepared, the server did not start or the request failed (the JSON and the printed log tail say why), 2 for bad
input (an unknown configuration).
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from validate import server as srvmod
from validate.client import OpenAIClient
from validate.config import find_config, with_stock_knobs
from validate.errors import InputError, LaunchError, WrongTreeError
from validate.models import resolve_model
from validate.provenance_checks import current_tree
from validate.util import repo_root

PROMPT = "Count from one to five."
RESULT = "serve_smoke.json"


@dataclass
class Smoke:
    """What ``DIR/serve_smoke.json`` holds. ``startup_s``: launch -> the server's first served request (the
    launcher's readiness generation), seconds; ``request_s``: the smoke's own chat completion, sent -> last
    chunk, seconds; ``output_tokens``: its completion tokens (the server's usage count); ``error``: why it was
    not served (None when it was)."""

    config: str
    knobs: str
    model: str | None = None
    served: bool = False
    prepare_s: float | None = None
    startup_s: float | None = None
    request_s: float | None = None
    ttft_s: float | None = None
    output_tokens: int | None = None
    text: str = ""
    vllm_version: str | None = None
    kv_cache_tokens: int | None = None
    provenance: list[str] = field(default_factory=list)
    error: str | None = None


async def ask(url: str, model: str, max_tokens: int, timeout_s: float = 120.0):
    """One streamed chat completion of :data:`PROMPT` at temperature 0; returns validate.client's
    RequestResult (faults in its ``error``, never raised)."""
    async with OpenAIClient(url, model, timeout_s=timeout_s) as client:
        return await client.chat([{"role": "user", "content": PROMPT}], max_tokens=max_tokens)


def run(config: str, out: Path, root: Path, stock: bool = False, cache: Path | None = None, max_tokens: int = 16,
        say=print) -> Smoke:
    """Prepare, launch, ask once, stop (module docstring); the server is stopped whatever happens, Ctrl-C
    included. Raises InputError for an unknown or invalid configuration; every other failure is in the result's
    ``error``."""
    cfg = find_config(root, config)
    if stock:
        cfg = with_stock_knobs(cfg)
    out.mkdir(parents=True, exist_ok=True)
    res = Smoke(config=cfg.name, knobs="stock" if stock else "configured")
    t0 = time.monotonic()
    say(f"{cfg.name}: preparing the model")
    try:
        res.model = resolve_model(cfg.model, cache, log=lambda m: say(f"{cfg.name}: {m}"))
    except Exception as e:  # noqa: BLE001 - a conversion that fails (transformers, a full disk) is the answer
        res.error = f"model preparation: {type(e).__name__}: {e}"
        return res
    res.prepare_s = round(time.monotonic() - t0, 1)
    say(f"{cfg.name}: model ready in {res.prepare_s} s ({res.model}); launching vLLM (log: {out / 'server.log'})")
    expected = current_tree(root).source_hash if cfg.expects_plugin else None
    srv = None
    try:
        srv = srvmod.launch(cfg, res.model, out / "server.log", progress=lambda m: say(f"{cfg.name}: {m}"),
                            expected_hash=expected)
        res.startup_s, res.vllm_version = srv.startup_s, srv.vllm_version
        res.kv_cache_tokens, res.provenance = srv.kv_cache_tokens, srv.provenance
        say(f"{cfg.name}: first request served {res.startup_s} s after launch (vLLM {res.vllm_version})")
        r = asyncio.run(ask(srv.url, srv.model, max_tokens))
        res.request_s = round(r.t_done - r.t_sent, 3) if r.t_done else None
        res.ttft_s = round(r.ttft_s, 3) if r.ttft_s is not None else None
        res.output_tokens, res.text = r.output_tokens, r.text
        res.served = bool(r.ok and r.output_tokens)
        if not res.served:
            res.error = f"the chat completion: {r.error or 'no tokens'}"
    except (LaunchError, WrongTreeError) as e:
        res.error = f"launch: {e.cause}"
        tail = getattr(e, "log_tail", "")
        if tail:
            say(f"{cfg.name}: the server log's tail:\n{tail}")
    finally:
        if srv is not None:
            say(f"{cfg.name}: stopping the server")
            srv.stop()
    return res


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.serve_smoke", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", required=True, help="serve/<NAME>.yaml")
    ap.add_argument("--out", type=Path, required=True, help=f"folder for {RESULT} and server.log")
    ap.add_argument("--knobs", choices=["configured", "stock"], default="configured",
                    help="stock: every r9k knob at its stock value (as r9k-validate --knobs stock)")
    ap.add_argument("--model-cache", type=Path, help="where prepared models live (default $R9K_MODEL_CACHE, else "
                    "the user's cache)")
    ap.add_argument("--max-tokens", type=int, default=16)
    args = ap.parse_args(argv)
    root = Path(os.environ["R9K_ROOT"]) if os.environ.get("R9K_ROOT") else repo_root()
    say = lambda m: print(f"serve_smoke: {m}", flush=True)  # noqa: E731
    try:
        res = run(args.config, args.out, root, stock=args.knobs == "stock", cache=args.model_cache,
                  max_tokens=args.max_tokens, say=say)
    except InputError as e:
        print(f"serve_smoke: {e}", file=sys.stderr)
        return 2
    (args.out / RESULT).write_text(json.dumps(asdict(res), indent=1) + "\n")
    if res.served:
        say(f"served: first request {res.startup_s} s after launch, answer {res.output_tokens} tokens in "
            f"{res.request_s} s: {res.text[:80]!r}")
        return 0
    say(f"NOT served: {res.error}")
    return 1


if __name__ == "__main__":
    sys.exit(main())

"""How wrong are the clients' clocks? Our client and vLLM's benchmark client against one synthetic server.

Starts ``tests.synth_server`` in a separate process (its own event loop and core time), then, for every
concurrency N, runs N closed-loop streams of ``--rounds`` requests each with OUR client
(``validate.client.OpenAIClient``) and with the request function ``vllm bench serve`` uses
(``vllm.benchmarks.lib.endpoint_request_func.async_request_openai_completions`` over the aiohttp session
settings of ``vllm/benchmarks/serve.py``), one after the other (alternating, ``--repeats`` times), each client
in its own long-lived worker process, and compares what each
client measured with the server's ground truth (GET /ground_truth). Definitions (benchmarks/README.md):

- send delay  = server arrival - client send stamp (request transit, client-side queueing included);
- receive lag = client receive stamp of a content chunk - server send stamp of that chunk, both
  ``time.perf_counter`` = CLOCK_MONOTONIC, one clock for both processes;
- TTFT error  = client TTFT - server TTFT (first content chunk sent - request arrival)
              = send delay + receive lag of the first content chunk;
- ITL error   = client gap - server gap between the same two consecutive content chunks
              = difference of the two chunks' receive lags (no clock offset involved); reported as |error|.

Before each measured phase, each client opens its N connections with N short requests (not measured).

    .venv/bin/python -m benchmarks.serving.client_timing --concurrency 64 256
"""
from __future__ import annotations

import argparse
import asyncio
import gc
import json
import resource
import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from validate.client import OpenAIClient  # noqa: E402


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def get_json(url: str):
    with urllib.request.urlopen(url, timeout=30) as r:
        return json.loads(r.read())


def start_server(args) -> tuple[subprocess.Popen, str]:
    port = free_port()
    cmd = [sys.executable, "-m", "tests.synth_server", "--port", str(port), "--ttft-ms", str(args.ttft_ms),
           "--itl-ms", str(args.itl_ms), "--itl-jitter-ms", str(args.itl_jitter_ms), "--seed", "1",
           "--metrics-bytes", str(getattr(args, "metrics_bytes", 0))]
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    url = f"http://127.0.0.1:{port}"
    for _ in range(200):
        try:
            get_json(url + "/health")
            return proc, url
        except OSError:
            if proc.poll() is not None:
                raise RuntimeError("synth server died: " + proc.stderr.read().decode()[-2000:])
            time.sleep(0.05)
    proc.kill()
    raise RuntimeError("synth server did not start")


# ---- the two clients: each returns {rid: (t_sent, [absolute receive stamps of chunks with choices])} ------
async def run_ours(url: str, n: int, rounds: int, tokens: int, tag: str) -> dict:
    out = {}
    async with OpenAIClient(url, "synth", max_connections=n) as c:
        await asyncio.gather(*(c.completion("warm", max_tokens=2, extra={"user": f"warm-{tag}-{i}"})
                               for i in range(n)))

        async def worker(w: int):
            for k in range(rounds):
                rid = f"{tag}-{w}-{k}"
                r = await c.completion("Hello there", max_tokens=tokens, ignore_eos=True, extra={"user": rid})
                if r.ok:
                    out[rid] = (r.t_sent, [r.t_sent + t for t in r.chunk_times], "content")

        await asyncio.gather(*(worker(w) for w in range(n)))
    return out


async def run_ours_scraping(url: str, n: int, rounds: int, tokens: int, tag: str) -> dict:
    """:func:`run_ours` with the server's /metrics scraped every second in the same event loop, as BetterBench
    and soak do (validate.server_metrics.ServerMetrics): the parse must not stretch the streams' stamps."""
    from validate.server_metrics import ServerMetrics

    sm = ServerMetrics(url)
    await sm.begin()
    stop = asyncio.Event()
    sampler = asyncio.create_task(sm.sample_every(1.0, stop))
    try:
        return await run_ours(url, n, rounds, tokens, tag)
    finally:
        stop.set()
        await sampler
        await sm.end()


async def run_vllm(url: str, n: int, rounds: int, tokens: int, tag: str) -> dict:
    import aiohttp
    from vllm.benchmarks.lib.endpoint_request_func import RequestFuncInput, async_request_openai_completions

    out = {}
    connector = aiohttp.TCPConnector(limit=n, limit_per_host=n, ttl_dns_cache=300, use_dns_cache=True,
                                     keepalive_timeout=60, enable_cleanup_closed=True, force_close=False, ssl=False)
    async with aiohttp.ClientSession(connector=connector, trust_env=True,
                                     timeout=aiohttp.ClientTimeout(total=6 * 60 * 60)) as session:
        def inp(rid: str, m: int) -> RequestFuncInput:
            return RequestFuncInput(prompt="Hello there", api_url=url + "/v1/completions", prompt_len=3,
                                    output_len=m, model="synth", ignore_eos=True, extra_body={"user": rid})

        await asyncio.gather(*(async_request_openai_completions(inp(f"warm-{tag}-{i}", 2), session)
                               for i in range(n)))

        async def worker(w: int):
            for k in range(rounds):
                rid = f"{tag}-{w}-{k}"
                o = await async_request_openai_completions(inp(rid, tokens), session)
                if o.success:
                    stamps = list(o.start_time + np.cumsum([o.ttft] + list(o.itl)))
                    out[rid] = (o.start_time, stamps, "choices")  # vLLM stamps every chunk with choices

        await asyncio.gather(*(worker(w) for w in range(n)))
    return out


def errors(measured: dict, truth: dict) -> dict:
    ttft, itl, lag, send = [], [], [], []
    for rid, (t_sent, stamps, which) in measured.items():
        gt = truth[rid]
        ev = [e for e in gt["events"] if e["kind"] in (("content",) if which == "content" else ("role", "content", "final"))]
        kinds = [e["kind"] for e in ev]
        assert len(ev) == len(stamps), (rid, len(ev), len(stamps))
        pairs = [(r, e["t_ns"] / 1e9) for r, e, k in zip(stamps, ev, kinds) if k == "content"]
        arrival = gt["arrival_ns"] / 1e9
        send.append(arrival - t_sent)
        ttft.append((pairs[0][0] - t_sent) - (pairs[0][1] - arrival))
        lags = [r - s for r, s in pairs]
        lag += lags
        itl += [abs(b - a) for a, b in zip(lags, lags[1:])]
    ms = lambda v, q: float(np.percentile(np.asarray(v) * 1e3, q))  # noqa: E731
    return {"requests": len(measured), "ttft_p50": ms(ttft, 50), "ttft_p99": ms(ttft, 99),
            "itl_p50": ms(itl, 50), "itl_p99": ms(itl, 99), "lag_p50": ms(lag, 50), "lag_p99": ms(lag, 99),
            "send_p50": ms(send, 50), "send_p99": ms(send, 99)}


CLIENTS = {"ours": run_ours, "vllm": run_vllm, "ours+scrape": run_ours_scraping}


class GcWatch:
    """Pauses of the garbage collector's full (generation 2) passes while a phase runs."""

    def __init__(self):
        self.pauses: list[float] = []
        self._t = 0.0

    def __call__(self, phase: str, info: dict) -> None:
        if info.get("generation") == 2:
            if phase == "start":
                self._t = time.perf_counter()
            else:
                self.pauses.append(time.perf_counter() - self._t)


def worker(name: str, url: str) -> None:
    """One client's process: runs the phases the parent asks for on stdin, one JSON line each way.
    Each client lives in the process it has in real use: ours without vLLM imported (as in r9k-validate),
    vLLM's with it imported (as in ``vllm bench serve``), where a full garbage-collector pass is long."""
    if name == "vllm":
        from vllm.benchmarks.lib import endpoint_request_func  # noqa: F401
    out = sys.stdout
    sys.stdout = sys.stderr  # keep the pipe for our answers
    out.write("ready\n")
    out.flush()
    for line in sys.stdin:
        job = json.loads(line)
        watch = GcWatch()
        gc.callbacks.append(watch)
        ru0 = resource.getrusage(resource.RUSAGE_SELF)
        t0 = time.perf_counter()
        measured = asyncio.run(CLIENTS[name](url, job["n"], job["rounds"], job["tokens"], job["tag"]))
        wall = time.perf_counter() - t0
        ru1 = resource.getrusage(resource.RUSAGE_SELF)
        gc.callbacks.remove(watch)
        out.write(json.dumps({"measured": measured, "wall": wall, "gc_full": len(watch.pauses),
                              "gc_max_ms": max(watch.pauses, default=0) * 1e3, "preempt": ru1.ru_nivcsw - ru0.ru_nivcsw,
                              "cpu_s": ru1.ru_utime + ru1.ru_stime - ru0.ru_utime - ru0.ru_stime}) + "\n")
        out.flush()


class Worker:
    def __init__(self, name: str, url: str):
        self.proc = subprocess.Popen([sys.executable, "-m", "benchmarks.serving.client_timing", "--worker", name, "--url", url],
                                     cwd=REPO, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        if self.proc.stdout.readline().strip() != "ready":
            raise RuntimeError(f"{name} worker failed to start")

    def run(self, **job) -> dict:
        self.proc.stdin.write(json.dumps(job) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError("worker died")
        return json.loads(line)

    def close(self) -> None:
        self.proc.stdin.close()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="client timing error vs a synthetic server's ground truth")
    ap.add_argument("--concurrency", type=int, nargs="+", default=[64, 256])
    ap.add_argument("--rounds", type=int, default=2, help="requests per stream (closed loop)")
    ap.add_argument("--tokens", type=int, default=64, help="output tokens per request (one per chunk)")
    ap.add_argument("--ttft-ms", type=float, default=30.0)
    ap.add_argument("--itl-ms", type=float, default=20.0)
    ap.add_argument("--itl-jitter-ms", type=float, default=0.0)
    ap.add_argument("--clients", nargs="+", choices=list(CLIENTS), default=["ours", "vllm"],
                    help="ours+scrape: ours with /metrics scraped every second (give --metrics-bytes)")
    ap.add_argument("--metrics-bytes", type=int, default=0, help="the synthetic server's /metrics size")
    ap.add_argument("--repeats", type=int, default=3,
                    help="phases per client and concurrency, alternating which client goes first (pooled)")
    ap.add_argument("--json", type=Path, help="also write the results here")
    ap.add_argument("--worker", choices=list(CLIENTS), help=argparse.SUPPRESS)
    ap.add_argument("--url", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.worker:
        worker(a.worker, a.url)
        return 0
    proc, url = start_server(a)
    rows, workers = [], {}
    try:
        clients = list(dict.fromkeys(a.clients))
        for name in clients:  # started once; one unmeasured short phase each
            workers[name] = Worker(name, url)
            workers[name].run(n=min(a.concurrency), rounds=1, tokens=8, tag=f"warmup-{name}")
        get_json(url + "/ground_truth?clear=1")
        for n in a.concurrency:
            pooled = {name: ({}, {}) for name in clients}
            for rep in range(a.repeats):
                for name in (clients if rep % 2 == 0 else clients[::-1]):
                    tag = f"{name}-{n}-{rep}"
                    got = workers[name].run(n=n, rounds=a.rounds, tokens=a.tokens, tag=tag)
                    measured = got["measured"]
                    truth = get_json(url + "/ground_truth?clear=1")
                    pooled[name][0].update(measured)
                    pooled[name][1].update(truth)
                    e = errors(measured, truth)
                    print(f"  {tag}: {len(measured)}/{n * a.rounds} ok in {got['wall']:.1f} s; TTFT err p50/p99 "
                          f"{e['ttft_p50']:.2f}/{e['ttft_p99']:.2f} ms, |ITL err| p50/p99 {e['itl_p50']:.2f}/"
                          f"{e['itl_p99']:.2f} ms; cpu {got['cpu_s']:.1f} s, {got['preempt']} preemptions, "
                          f"{got['gc_full']} full GCs (max {got['gc_max_ms']:.0f} ms)", file=sys.stderr)
            for name, (measured, truth) in pooled.items():
                rows.append({"client": name, "streams": n, **errors(measured, truth)})
    finally:
        for w in workers.values():
            w.close()
        proc.terminate()
        proc.wait(10)
    print(f"server: TTFT {a.ttft_ms} ms, ITL {a.itl_ms} ms (+exp {a.itl_jitter_ms} ms), {a.tokens} tokens, "
          f"{a.rounds} requests per stream, {a.repeats} phases per client pooled; errors in ms (client - server truth)")
    hdr = ("streams", "client", "TTFT p50", "TTFT p99", "|ITL| p50", "|ITL| p99", "lag p50", "lag p99",
           "send p50", "send p99")
    print("| " + " | ".join(hdr) + " |\n|" + "---|" * len(hdr))
    for r in rows:
        print(f"| {r['streams']} | {r['client']} | " + " | ".join(
            f"{r[k]:.3f}" for k in ("ttft_p50", "ttft_p99", "itl_p50", "itl_p99", "lag_p50", "lag_p99",
                                    "send_p50", "send_p99")) + " |")
    worse = []
    for n in a.concurrency:
        by = {r["client"]: r for r in rows if r["streams"] == n}
        if "ours" in by and "vllm" in by:
            for k in ("ttft_p50", "ttft_p99", "itl_p50", "itl_p99"):
                if abs(by["ours"][k]) >= abs(by["vllm"][k]):
                    worse.append(f"{n}:{k}")
        if "ours" in by and "ours+scrape" in by:
            print(f"{n} streams, /metrics of {a.metrics_bytes:,} bytes scraped every second: |ITL err| p99 "
                  f"{by['ours+scrape']['itl_p99']:.3f} ms against {by['ours']['itl_p99']:.3f} ms without")
    if "vllm" in clients:
        print("ours smaller at every point" if not worse else "ours NOT smaller at: " + ", ".join(worse))
    if a.json:
        a.json.write_text(json.dumps(rows, indent=1))
    return 0 if not worse else 1


if __name__ == "__main__":
    sys.exit(main())

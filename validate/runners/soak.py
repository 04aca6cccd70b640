"""Soak: N clients in a closed loop for M minutes with prompt lengths drawn over a range of real text, memory
sampled every second.

The soak ends at its duration: requests still in flight then are cancelled (their connections closed, which
aborts them in vLLM) and counted apart as ``cut_at_deadline``, neither served nor errors; the memory series ends
there too. Prompts are clipped to what the configuration serves: ``max_model_len - max_tokens - 8``, and, where
the probe ran on the configuration earlier in the same release, to what its measured prefill rate serves in time:
a prompt's prefill, sharing the rate with every other client, takes at most ``max_prefill_share`` of the duration
(``prefill_tok_s * duration_s * max_prefill_share / clients`` tokens), so a short soak is never a few long prompts.

Verdict: zero errors; memory flat (least-squares slope of every series over the last half of the run, bound
``max_slope_mib_per_min``, both recorded) and peak below total. A leak grows without end; first-touch of a
CPU KV cache and allocator warm-up grow early and plateau, which is why the first half is left out. Reported: requests served, prompt and
output tok/s, peak and slope per memory series. Samples are kept in the record even when the server dies.

A server that dies mid-soak (its process exits, or /health stops answering 200: vLLM's API server outlives its
engine core and answers every request with an error at once) is noticed at the first failed request: no
client sends another, the requests in flight are counted as cut by the death rather than as the server's
failures, and memory is fitted over the samples taken while it lived.
"""
from __future__ import annotations

import asyncio
import json
import math
import random
import time

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

from validate.runners.base import RunContext, SuiteResult
from validate.runners.text import TextPool
from validate.data import needs_train_text
from validate.suite import register_runner
from validate.telemetry import Sampler, slope_mib_per_min


class SoakParams(BaseModel):
    model_config = ConfigDict(extra="forbid")
    clients: int = Field(16, ge=1)
    duration_s: float = Field(1500, gt=0, description="25 minutes by default")
    prompt_tokens_min: int = Field(200, ge=1)
    prompt_tokens_max: int = Field(30000, ge=1, description="capped by max_model_len - max_tokens - 8 and by the "
                                   "probe's measured prefill rate (prompt_cap)")
    max_tokens: int = Field(256, ge=1)
    sample_interval_s: float = Field(1.0, gt=0)
    max_prefill_share: float = Field(0.1, gt=0, le=1, description="the longest prompt's prefill, at the probe's "
                                     "measured rate shared by every client, takes at most this share of the duration")
    max_slope_mib_per_min: float = Field(32.0, ge=0, description="memory-flat bound per series")
    slope_skip_fraction: float = Field(0.5, ge=0, lt=1, description="leading share of samples left out of the slope: "
                                       "first-touch of a CPU KV cache and allocator warm-up grow memory, then plateau")
    seed: int = 0

    @model_validator(mode="after")
    def _enough_samples(self):
        fitted = self.duration_s * (1 - self.slope_skip_fraction) / self.sample_interval_s
        if fitted < MIN_FIT_SAMPLES:  # else no slope is ever fitted and "memory flat" was never checked
            raise ValueError(f"duration_s {self.duration_s:g} at sample_interval_s {self.sample_interval_s:g} leaves "
                             f"{fitted:.1f} samples after the skipped {self.slope_skip_fraction:.0%} for the memory "
                             f"slope; it needs {MIN_FIT_SAMPLES}")
        return self


#: Samples a memory slope is fitted over at the least (validate.telemetry.slope_mib_per_min's bound).
MIN_FIT_SAMPLES = 5


class SoakMetrics(BaseModel):
    """What a soak record's ``metrics`` hold (memory in MiB, times in s, rates in tok/s)."""

    model_config = ConfigDict(extra="forbid")
    clients: int
    duration_s: float
    served: int
    errors: int
    prompt_tok_s: float
    output_tok_s: float
    prompt_tokens_range: list[int]
    prompt_tokens_mean: float | None = None
    memory: dict[str, dict[str, Any]]
    memory_backends: list[str]
    max_slope_mib_per_min: float
    samples: list[list[Any]]
    server_died_at_s: float | None = None
    cut_by_death: int = 0
    cut_at_deadline: int = 0
    memory_samples_in_life: int
    prompt_tokens_cap: dict[str, Any] | None = None


def measured_prefill_tok_s(ctx: RunContext) -> float | None:
    """The prefill rate (tok/s) the probe measured on this configuration earlier in the same release: the
    ``prefill_tok_s`` of a probe record under ``record_dir/release/config`` whose ``config_hash`` is this
    configuration's; None without one (no release, no probe record, no rate)."""
    if ctx.release is None or ctx.config is None:
        return None
    for path in sorted((ctx.record_dir / ctx.release / ctx.config.name).glob("*.json")):
        try:
            d = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if not (isinstance(d, dict) and d.get("suite_kind") == "probe" and d.get("config_hash") == ctx.config.digest()
                and isinstance(d.get("metrics"), dict)):
            continue
        rate = d["metrics"].get("prefill_tok_s")
        if isinstance(rate, (int, float)) and not isinstance(rate, bool) and math.isfinite(rate) and rate > 0:
            return float(rate)
    return None


def prompt_cap(p: SoakParams, max_model_len: int, prefill_tok_s: float | None) -> dict[str, Any]:
    """The longest prompt the soak sends (tokens): ``prompt_tokens_max``, capped by ``max_model_len - max_tokens -
    8`` and, given a measured prefill rate (tok/s), by ``prefill_tok_s * duration_s * max_prefill_share /
    clients``. Returns {"tokens", "max_model_len", "prefill_tok_s", "by_rate"} (by_rate None without a rate)."""
    by_len = max_model_len - p.max_tokens - 8
    by_rate = None if prefill_tok_s is None else int(prefill_tok_s * p.duration_s * p.max_prefill_share / p.clients)
    tokens = max(1, min(p.prompt_tokens_max, by_len, by_rate if by_rate is not None else by_len))
    return {"tokens": tokens, "max_model_len": max_model_len, "prefill_tok_s": prefill_tok_s, "by_rate": by_rate}


def figures(records: list) -> list:
    from validate.figures import FigureSpec, metric

    return [FigureSpec("soak_served", "soak requests served", "soak", "", 0, True, metric("served"))]


def summary(rec) -> str:
    m = rec.metrics
    return f"{m['served']} served, {m['errors']} errors"


def derived_findings(samples: list, life_n: int, max_slope: float, skip: float, totals: dict[str, Any],
                     errors: int, died: bool) -> tuple[list[str], list[str], dict[str, float | None]]:
    """The runner's rule over a soak's memory samples: (findings, errors, slope per series in MiB/min). ``samples``:
    [[t_s, {series: MiB}], ...]; ``life_n``: how many of them fall in the server's life (the rest show a process
    tree torn down); ``totals``: each series' total where known; ``errors``: requests the living server failed;
    ``died``: the server died during the soak (an unfitted slope is then no error of its own). The runner judges
    its run by it, and :func:`audit` the record again."""
    life = [(t, row) for t, row in samples[:life_n]]
    findings, errs, slopes = [], [], {}
    if errors:
        findings.append(f"{errors} requests failed while the server lived")
    for name in sorted({k for _, row in life for k in row}):
        vals = [row[name] for _, row in life if name in row]
        slope = slope_mib_per_min(life, name, skip)
        slopes[name] = slope
        total = totals.get(name)
        if slope is None and not died:
            errs.append(f"memory slope of {name} not fitted: {len(vals)} samples, fewer than {MIN_FIT_SAMPLES} after the "
                        f"skipped {skip:.0%}")
        elif slope is not None and slope > max_slope:
            findings.append(f"memory not flat: {name} grows {round(slope, 2)} MiB/min > {max_slope}")
        if total is not None and max(vals) >= total:
            findings.append(f"memory peak {max(vals)} MiB of {name} reaches the total {total} MiB")
    if not samples:
        findings.append("no memory samples (no local server process and no GPU tool)")
    return findings, errs, slopes


def outcome_errors(served: int, errors: int, died_at_s: float | None, cut_by_death: int, cut_at_deadline: int,
                   duration_s: float) -> list[str]:
    """The runner's error rules over a soak's request counts (the runner and :func:`audit` both call it): a server
    that died during the soak makes the run an error (what it measured before is kept, and a finding beside it
    still outranks it: validate.engine); a soak where no request finished and none failed is an error too ("zero
    errors" was never checked). ``died_at_s``: seconds into the soak, None while the server lived. [] when
    neither holds."""
    if died_at_s is not None:
        return [f"the server died {died_at_s:g} s into the soak; before it {served} requests were served and {errors} "
                f"failed, {cut_by_death} were cut by the death"]
    if not served and not errors:
        return [f"no request finished within the soak's {duration_s:g} s ({cut_at_deadline} cut at the deadline)"]
    return []


def derived_status(findings: list[str], errs: list[str]) -> str:
    """The verdict the runner's rules give (validate.engine: a finding outranks an error): "fail", "error" or
    "pass"."""
    return "fail" if findings else "error" if errs else "pass"


def audit(rec, folder) -> list[str]:
    """Why a soak record does not stand on its memory series (empty when it does): its verdict re-derived from its
    samples by the runner's rule (:func:`derived_findings`, at the params' bound, the kind's default where they
    leave it out, and skipped share), and
    each series' stored slope and flag against its samples'. ``folder`` is not read."""
    m = rec.metrics if isinstance(rec.metrics, dict) else {}
    params = rec.params if isinstance(rec.params, dict) else {}
    try:
        samples = [(float(t), {str(k): float(v) for k, v in row.items()}) for t, row in m.get("samples") or []]
        life_n = int(m.get("memory_samples_in_life", len(samples)))
        bound = float(m["max_slope_mib_per_min"])
        skip = float(params.get("slope_skip_fraction", SoakParams.model_fields["slope_skip_fraction"].default))
        memory = m.get("memory") or {}
        totals = {k: v.get("total") for k, v in memory.items() if isinstance(v, dict)}
        errors = int(m.get("errors") or 0)
        served = int(m["served"])
        died_at = m.get("server_died_at_s")
        died_at = None if died_at is None else float(died_at)
        counts = (int(m.get("cut_by_death") or 0), int(m.get("cut_at_deadline") or 0),
                  float(params.get("duration_s", m.get("duration_s"))))
    except (KeyError, TypeError, ValueError, AttributeError) as e:
        return [f"its memory series cannot be read back ({type(e).__name__}: {e})"]
    out = []
    # the rule's bound is the params' (the kind's default where they leave it out); the metrics only repeat it
    ruled = params.get("max_slope_mib_per_min", SoakParams.model_fields["max_slope_mib_per_min"].default)
    if ruled != bound:
        out.append(f"its metrics' bound {bound} MiB/min is not its params' {ruled!r}")
        if isinstance(ruled, (int, float)) and not isinstance(ruled, bool):
            bound = float(ruled)
    died = m.get("server_died_at_s") is not None
    if not died and life_n != len(samples) or not 0 <= life_n <= len(samples):  # the runner cuts only at a death
        out.append(f"memory_samples_in_life = {life_n} of {len(samples)} samples" + ("" if died else
                                                                                    ", and the server did not die"))
        life_n = len(samples) if not died else max(0, min(life_n, len(samples)))
    findings, errs, slopes = derived_findings(samples, life_n, bound, skip, totals, errors, died)
    lost = sorted(set(memory) - set(slopes))
    if lost:
        out.append(f"its memory holds {', '.join(lost)}, which its samples of the server's life do not")
    for name, slope in slopes.items():
        stored = memory.get(name) if isinstance(memory.get(name), dict) else {}
        s = stored.get("slope_mib_per_min")
        if (s is None) != (slope is None) or (slope is not None and not (isinstance(s, (int, float))
                                                                           and abs(s - slope) <= 0.01)):
            out.append(f"memory.{name}.slope_mib_per_min = {s!r}, its samples give "
                       f"{None if slope is None else round(slope, 2)!r}")
        flat = None if slope is None else slope <= bound
        if stored.get("flat") != flat:
            out.append(f"memory.{name}.flat = {stored.get('flat')!r}, its samples give {flat!r}")
    errs = errs + outcome_errors(served, errors, died_at, *counts)
    derived = derived_status(findings, errs)
    if rec.verdict.status == "pass" and derived == "fail":
        out.append("the record says pass, but its memory series and counts give: " + "; ".join((findings + errs)[:3]))
    elif rec.verdict.status in ("pass", "fail") and derived == "error":  # the runner's rules make it an error
        out.append(f"the record says {rec.verdict.status}, but its counts give an error by the runner's rule: "
                   + "; ".join(errs[:3]))
    return out


@register_runner("soak", SoakParams, preflight=needs_train_text, sample_server_s=5.0, metrics_model=SoakMetrics,
                 figures=figures, summary=summary, order=60, audit=audit, audit_hashes=False)
async def run(ctx: RunContext, p: SoakParams) -> SuiteResult:
    s = ctx.config.server
    cap = prompt_cap(p, s.max_model_len, measured_prefill_tok_s(ctx))
    hi = cap["tokens"]
    lo = min(p.prompt_tokens_min, hi)
    pool = await TextPool.build(ctx.client, ctx.data_dir, min_tokens=max(hi * 2, 4096))
    out = SuiteResult()
    sampler = Sampler(pid=ctx.server_pid, interval_s=p.sample_interval_s)
    stop = asyncio.Event()
    sampler_task = asyncio.create_task(sampler.run(stop))
    loop = asyncio.get_running_loop()
    deadline = loop.time() + p.duration_s  # loop.time() is time.monotonic(): one clock for both
    ctx.progress(0, total=int(p.duration_s), description="soak")
    served = errors = cut = cut_at_deadline = prompt_tok = out_tok = 0
    first_errors: list[str] = []
    lengths: list[int] = []
    death: dict = {}  # {"at": monotonic time, "cause": str} once the server is found dead
    # Log-uniform lengths: a 200-30k range drawn uniformly would almost never send a short prompt.
    draw = lambda rng: int(round(math.exp(rng.uniform(math.log(lo), math.log(hi)))))  # noqa: E731

    async def check_death() -> bool:
        """After a failure: is the server gone? Then stop every client at once (a dead engine answers each new
        request with an error in milliseconds, and thousands of those would read as the server's failures)."""
        if not death:
            cause = await ctx.server_gone()
            if cause and not death:
                death.update(at=time.monotonic(), cause=cause)
                stop.set()
        return bool(death)

    async def client(k: int):
        nonlocal served, errors, cut, cut_at_deadline, prompt_tok, out_tok
        rng = random.Random(p.seed * 1000 + k)
        while loop.time() < deadline and not stop.is_set():
            n = draw(rng)
            lengths.append(n)
            try:  # cancelled at the deadline: the duration is what the soak runs, whatever is in flight
                async with asyncio.timeout_at(deadline):
                    r = await ctx.client.completion(pool.window(n, rng), max_tokens=p.max_tokens)
            except TimeoutError:
                cut_at_deadline += 1
                return
            if r.ok:
                served += 1
                prompt_tok += r.prompt_tokens or 0
                out_tok += r.output_tokens or 0
            elif death or await check_death():
                cut += 1  # in flight when the server died, or the failure that revealed its death
            else:
                errors += 1
                if len(first_errors) < 5:
                    first_errors.append(r.error or "?")

    async def ticker():
        t0 = time.monotonic()
        last = 0
        while loop.time() < deadline and not stop.is_set():
            await asyncio.sleep(1.0)
            now = int(time.monotonic() - t0)
            ctx.progress(now - last)
            last = now

    t0 = time.monotonic()
    tick = asyncio.create_task(ticker())
    await asyncio.gather(*(client(k) for k in range(p.clients)))
    wall = time.monotonic() - t0
    stop.set()
    await sampler_task
    tick.cancel()
    # The series ends at the deadline (a sample taken while the clients were being cancelled is past it), and is
    # judged over the server's life only: samples after its death show a process tree being torn down.
    samples = [(t, row) for t, row in sampler.samples if t <= deadline - sampler.t0]
    life = samples if not death else [(t, row) for t, row in samples if t <= death["at"] - sampler.t0]
    series = sorted({k for _, row in life for k in row})
    memory = {}
    for name in series:
        vals = [row[name] for _, row in life if name in row]
        slope = slope_mib_per_min(life, name, p.slope_skip_fraction)
        total = sampler.totals.get(name)
        memory[name] = {"peak": max(vals), "first": vals[0], "last": vals[-1], "slope_mib_per_min": None if slope is None else round(slope, 2),
                        "total": total, "flat": None if slope is None else slope <= p.max_slope_mib_per_min,
                        "below_total": total is None or max(vals) < total}
    out.metrics = {
        "clients": p.clients, "duration_s": round(wall, 1), "served": served, "errors": errors,
        "prompt_tok_s": round(prompt_tok / wall, 1), "output_tok_s": round(out_tok / wall, 1),
        "prompt_tokens_range": [lo, hi], "prompt_tokens_mean": round(sum(lengths) / len(lengths), 1) if lengths else None,
        "memory": memory, "memory_backends": sampler.backends, "max_slope_mib_per_min": p.max_slope_mib_per_min,
        "samples": [[t, row] for t, row in samples],
        "server_died_at_s": round(death["at"] - t0, 1) if death else None,
        "cut_by_death": cut, "cut_at_deadline": cut_at_deadline, "memory_samples_in_life": len(life),
        "prompt_tokens_cap": cap,
    }
    rule = outcome_errors(served, errors, out.metrics["server_died_at_s"], cut, cut_at_deadline, p.duration_s)
    if death:
        out.server_died = f"{death['cause']}: {rule[0]}"
    elif rule:  # nothing finished: "zero errors" was never checked
        out.errors.append(f"{rule[0]}: prompts of up to {hi} tokens with {p.max_tokens}-token answers at "
                          f"{p.clients} clients are too long for the duration on this configuration")
    if errors:  # requests the living server failed under load are what a soak exists to find: a finding
        out.findings.append(f"{errors} of {served + errors} requests failed while the server lived; first: "
                            f"{first_errors[0]}")
    for name, m in memory.items():
        if m["flat"] is None and not death:  # never "flat" by default: the check was not made
            out.errors.append(f"memory slope of {name} not fitted: {len([1 for _, r in life if name in r])} samples, "
                              f"fewer than {MIN_FIT_SAMPLES} after the skipped {p.slope_skip_fraction:.0%}")
        elif m["flat"] is False:
            out.findings.append(f"memory not flat: {name} grows {m['slope_mib_per_min']} MiB/min > {p.max_slope_mib_per_min}")
        if not m["below_total"]:
            out.findings.append(f"memory peak {m['peak']} MiB of {name} reaches the total {m['total']} MiB")
    if not sampler.samples:
        out.findings.append("no memory samples (no local server process and no GPU tool)")
    return out

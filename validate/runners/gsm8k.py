"""GSM8K: greedy chain-of-thought answers, scored per question (strict and flexible extraction) on the answer
after a reasoning model's thinking (validate.reasoning), the thinking kept in the item.

The full 1,319-question test set by default; ``limit`` takes a fixed seeded sample, marked as a subset in the
record (a subset is never paired with a full-set record).
"""
from __future__ import annotations

import json
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from validate.client import gather_limited
from validate.data import require_file
from validate.errors import InputError
from validate.evals import gsm8k as g
from validate.reasoning import item_fields, split_reply, tally
from validate.record import Dataset, Item
from validate.runners.base import RunContext, SuiteResult, misjudged
from validate.suite import register_runner
from validate.util import sha256_file, sha256_text


class GSM8KParams(BaseModel):
    model_config = ConfigDict(extra="forbid")
    limit: int | None = Field(None, ge=1, description="seeded sample of this many questions (a subset); None = all")
    seed: int = 1234
    fewshot: int = Field(0, ge=0, le=8, description="train-set exemplars as prior chat turns")
    fewshot_seed: int = 0
    max_tokens: int = Field(384, ge=16)
    concurrency: int = Field(1, ge=1, description="1 is the reproducible setting; higher is recorded")
    primary: Literal["strict", "flexible"] = "strict"


def preflight(p: GSM8KParams, root, data_dir) -> None:
    """The test set (and the train set for exemplars) must load before any server starts."""
    g.load_split(require_file(data_dir, "gsm8k/test.jsonl"), "test")
    if p.fewshot:
        train_path = require_file(data_dir, "gsm8k/train.jsonl")
        if len(g.load_split(train_path, "train")) < p.fewshot:
            raise InputError(f"{train_path}: fewer than fewshot={p.fewshot} questions")


class GSM8KMetrics(BaseModel):
    """What a GSM8K record's ``metrics`` hold (accuracies as fractions of n)."""

    model_config = ConfigDict(extra="forbid")
    n: int
    errors: int
    primary: Literal["strict", "flexible"]
    concurrency: int
    correct: int
    accuracy: float
    correct_strict: int
    correct_flexible: int
    accuracy_strict: float
    accuracy_flexible: float
    truncated: int
    after_thinking: int = 0
    unclosed_thinking: int = 0
    think_end: str | None = None


def figures(records: list) -> list:
    from validate.figures import FigureSpec, metric

    def pct(r):
        v = metric("accuracy")(r)
        return None if v is None else 100 * v

    return [FigureSpec("gsm8k", "GSM8K accuracy", "gsm8k", "%", 2, True, pct)]


def headline(rec) -> str | None:
    m = rec.metrics
    if not {"accuracy", "n"} <= set(m):
        return None
    sub = " subset" if rec.dataset and rec.dataset.subset else ""
    return f"GSM8K {100 * m['accuracy']:.1f}% of {m['n']:,}{sub}"


def summary(rec) -> str:
    m = rec.metrics
    return f"{m['correct']} of {m['n']} ({100 * m['accuracy']:.2f}%)"


def dataset_hash(p: GSM8KParams, root, data_dir) -> str:
    """The sha256 a record's dataset would carry now: the test set's file."""
    return sha256_file(require_file(data_dir, "gsm8k/test.jsonl"))


def answers(reply) -> tuple[str | None, str | None]:
    """(strict, flexible) answer of a split reply (validate.reasoning.split_reply): thinking that never ended
    holds no answer. The runner judges each reply by it, and :func:`audit` each item again from its output."""
    said = reply.answer or ""
    return g.extract_answer(said, "strict"), g.extract_answer(said, "flexible")


def audit(rec, folder) -> list[str]:
    """Why a GSM8K record does not stand on its items (empty when it does): each item is judged again from its
    output against its expected answer (:func:`answers` after the end-of-thinking marker of its configuration as
    run, which its metrics only repeat: the answer the
    server sent apart from its thinking does not move it), so an item flagged right whose output gives another
    answer is named; and the counts in ``metrics`` (n, errors, correct, correct_strict, correct_flexible and the
    accuracies) are recounted from the items. A record without items has nothing to recount (the paired gate
    refuses it). ``folder`` is not read."""
    from validate.reasoning import DEFAULT_THINK_END

    if not rec.items:
        return []
    m = rec.metrics if isinstance(rec.metrics, dict) else {}
    snap = rec.config_snapshot if isinstance(rec.config_snapshot, dict) else {}
    # the params decide the extraction (the paired gate reads them too); the metrics only repeat it
    primary = (rec.params if isinstance(rec.params, dict) else {}).get("primary", "strict")
    if primary not in ("strict", "flexible"):
        return [f"its primary extraction {primary!r} is neither strict nor flexible"]
    if m.get("primary", primary) != primary:
        return [f"its metrics say the primary extraction is {m.get('primary')!r}, its params {primary!r}"]
    # the configuration as run decides the marker (the runner reads it from there: RunContext.think_end); the
    # metrics only repeat it
    think_end = snap.get("think_end") or DEFAULT_THINK_END
    if not isinstance(think_end, str):
        return [f"its end-of-thinking marker {think_end!r} is not text"]
    if m.get("think_end") not in (None, think_end):
        return [f"its metrics say the end-of-thinking marker is {m.get('think_end')!r}, its configuration "
                f"{think_end!r}"]
    right = {"strict": 0, "flexible": 0}
    errors, wrong = 0, []
    for i in rec.items:
        if i.error:
            errors += 1
            if i.correct:
                wrong.append(f"{i.id} failed to run ({i.error}) and says right")
            continue
        if not isinstance(i.expected, str):
            wrong.append(f"{i.id} holds no expected answer to judge it by")
            continue
        s, f = answers(split_reply(i.output or "", "", think_end))
        right["strict"] += s == i.expected
        right["flexible"] += f == i.expected
        ans = s if primary == "strict" else f
        if bool(i.correct) != (ans == i.expected) or i.answer != ans:
            wrong.append(f"{i.id} says {'right' if i.correct else 'wrong'} with answer {i.answer!r}; its output gives "
                         f"{ans!r} for the expected {i.expected!r}")
    out = misjudged(wrong, len(rec.items))
    n = len(rec.items)
    want = {"n": n, "errors": errors, "correct": right[primary], "correct_strict": right["strict"],
            "correct_flexible": right["flexible"], "accuracy": round(right[primary] / n, 6),
            "accuracy_strict": round(right["strict"] / n, 6), "accuracy_flexible": round(right["flexible"] / n, 6)}
    said = [f"{k} = {m[k]!r}, its items give {v!r}" for k, v in want.items() if k in m
            and not (isinstance(m[k], (int, float)) and not isinstance(m[k], bool) and abs(m[k] - v) <= 1e-6)]
    if said:
        out.append("its metrics are not its items' counts: " + "; ".join(said[:4]))
    if errors and rec.verdict.status == "pass":  # the runner's rule: a request that failed is an error of the run
        out.append(f"the record says pass, but {errors} of its items failed to run")
    return out


@register_runner("gsm8k", GSM8KParams, preflight=preflight, metrics_model=GSM8KMetrics, figures=figures,
                 headline=headline, summary=summary, paired_eval=True, order=30, dataset_hash=dataset_hash,
                 audit=audit, audit_hashes=False)
async def run(ctx: RunContext, p: GSM8KParams) -> SuiteResult:
    test_path = require_file(ctx.data_dir, "gsm8k/test.jsonl")
    questions = g.load_split(test_path, "test")
    exemplars = []
    if p.fewshot:
        exemplars = g.fewshot_exemplars(g.load_split(require_file(ctx.data_dir, "gsm8k/train.jsonl"), "train"),
                                        p.fewshot, p.fewshot_seed)
    chosen = g.sample(questions, p.limit, p.seed)
    subset = len(chosen) < len(questions)
    ctx.progress(0, total=len(chosen), description="gsm8k")
    gen = {"max_tokens": p.max_tokens, "temperature": 0.0, "fewshot": p.fewshot, "fewshot_seed": p.fewshot_seed}
    msgs = [g.build_messages(q, exemplars) for q in chosen]
    results = await gather_limited(
        [ctx.client.chat(m, max_tokens=p.max_tokens, top2=True) for m in msgs], limit=p.concurrency, on_done=lambda: ctx.progress(1))
    out = SuiteResult()
    right = {"strict": 0, "flexible": 0}
    errors = 0
    for q, m, r in zip(chosen, msgs, results):
        item = Item(id=q.id, prompt_hash=sha256_text(json.dumps(m, sort_keys=True)), gen=gen, output=r.text,
                    token_ids=r.token_ids, expected=q.gold, **ctx.top2_fields(r))
        if not r.ok:
            item.error = r.error
            errors += 1
        else:
            reply = split_reply(r.text, r.reasoning, ctx.think_end)
            s, f = answers(reply)
            item.answer_strict, item.answer_flexible = s, f
            item.correct_strict, item.correct_flexible = s == q.gold, f == q.gold
            right["strict"] += s == q.gold
            right["flexible"] += f == q.gold
            item.answer = s if p.primary == "strict" else f
            item.correct = item.answer == q.gold
            for k, v in item_fields(r, reply).items():
                setattr(item, k, v)
        out.items.append(item)
    n = len(chosen)
    out.dataset = Dataset(name="gsm8k-test", sha256=sha256_file(test_path), n_total=len(questions), n_used=n,
                          subset=subset, seed=p.seed if subset else None)
    out.metrics = {
        "n": n, "errors": errors, "primary": p.primary, "concurrency": p.concurrency,
        "correct": right[p.primary], "accuracy": round(right[p.primary] / n, 6),
        "correct_strict": right["strict"], "correct_flexible": right["flexible"],
        "accuracy_strict": round(right["strict"] / n, 6), "accuracy_flexible": round(right["flexible"] / n, 6),
        "truncated": sum(1 for r in results if r.ok and r.finish_reason == "length"),
        **tally(out.items, ctx.think_end),
    }
    if errors:
        out.errors.append(f"{errors} of {n} requests failed")
    return out

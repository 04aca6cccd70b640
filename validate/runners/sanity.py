"""Strict sanity: answers must stay right when more requests arrive than max_num_seqs.

First every prompt runs alone (concurrency 1): that is the solo reference, and it is gated itself: every
prompt has a known answer, so a server that gets fewer than ``min_solo_right_share`` of them right alone fails
(naming the prompts), and a garbage solo answer is bad. Without that gate a server whose kernels corrupt every
answer the same way solo and under load would pass, since nothing it says under load would differ. Then, for
each overload factor ``m``, ``ceil(m * max_num_seqs)`` requests (prompts cycled) are sent at once, ``rounds``
times. A *bad* answer under load is one the model gets right solo and wrong under load, or garbage (empty,
replacement characters, control characters, or one token repeated over ``garbage_repeat`` times in a row).
Answers that differ from the solo text but stay right are counted as divergent (numerics of batching), not
bad. A failed request is an error. A reasoning model is judged on its answer after the thinking
(validate.reasoning); a reply whose thinking never ended has no answer (bad, under load or alone).

A configuration of random weights (validate.config.ModelSpec.random_weights) answers noise: its answers are never
right and often garbage (byte-fallback tokens read as replacement characters) whatever serves them, so neither is
judged: no solo share, and nothing is bad; a garbage answer is recorded (the item's ``garbage``, the metrics'
``garbage``), and the answers under load are still compared with the solo answers token by token (``divergent``,
judged against the baseline's own share by the share gates: validate.loadgate).
"""
from __future__ import annotations

import asyncio
import math
import random
import re
import time
from pathlib import Path

import yaml
from pydantic import BaseModel, ConfigDict, Field, field_validator

from validate.client import RequestResult, gather_limited
from validate.data import require_file
from validate.errors import InputError
from validate.reasoning import Reply, item_fields, split_reply, tally
from validate.record import Item
from validate.runners.base import RunContext, SuiteResult, misjudged, recount
from validate.suite import register_runner
from validate.util import sha256_text


class SanityParams(BaseModel):
    model_config = ConfigDict(extra="forbid")
    prompts_file: str = Field("data/sanity_prompts.yaml", description="relative to suites/")
    overload: list[float] = Field([2.0], min_length=1, description="multiples of max_num_seqs sent at once (> 1)")
    rounds: int = Field(1, ge=1, description="times each overload batch is sent")
    max_tokens: int = Field(48, ge=1)
    garbage_repeat: int = Field(12, ge=2, description="a token repeated more than this in a row is garbage")
    min_solo_right_share: float = Field(1.0, ge=0, le=1, description="share of the prompts the server must answer "
                                        "right alone; fewer fails the suite, naming the prompts")
    after_long_prompt_tokens: int = Field(0, ge=0, description="also run each batch alongside a long prefill of this "
                                          "many tokens (capped by max_model_len); 0 = short prompts only")

    @field_validator("overload")
    @classmethod
    def _beyond_max_num_seqs(cls, v: list[float]) -> list[float]:
        bad = [m for m in v if not (math.isfinite(m) and m > 1)]
        if bad:  # at 1 or below nothing waits for a slot: no overload was ever sent
            raise ValueError(f"every factor must be a finite number above 1 (more requests than max_num_seqs), not "
                             f"{', '.join(map(str, bad))}")
        return v

    @field_validator("prompts_file")
    @classmethod
    def _inside_suites(cls, v: str) -> str:
        if Path(v).is_absolute() or ".." in Path(v).parts:  # outside suites/ the engine hash would not see it
            raise ValueError(f"{v!r}: give a path inside suites/ (no absolute path, no '..')")
        return v


def load_prompts(path: Path) -> list[dict]:
    """Prompts file: a list of {id, prompt, expect}. Raises InputError naming the file and entry."""
    try:
        data = yaml.safe_load(path.read_text())
    except FileNotFoundError:
        raise InputError(f"{path}: prompts file not found") from None
    except yaml.YAMLError as e:
        raise InputError(f"{path}: malformed YAML: {e}") from None
    if not isinstance(data, list) or not data:
        raise InputError(f"{path}: expected a non-empty list of {{id, prompt, expect}}")
    for i, p in enumerate(data):
        if not isinstance(p, dict) or not {"id", "prompt", "expect"} <= set(p):
            raise InputError(f"{path}: entry {i}: needs id, prompt and expect")
    return data


def _says(text: str, word: str) -> bool:
    """``word`` appears as a whole word, not as part of a longer number ("0" does not match "0.0001")."""
    return re.search(r"(?<![\w.])" + re.escape(str(word)) + r"(?!\w|\.\d)", text, re.IGNORECASE) is not None


def is_right(text: str, expect: str, others: set[str] | frozenset[str] = frozenset()) -> bool:
    """The answer says ``expect`` (a whole word) and none of ``others``, the expected answers of the other prompts
    that differ from this one's: an answer that lists every answer of the set ("Paris Tokyo Pacific 8 7 ...")
    says the right word without answering the question."""
    return _says(text, expect) and not any(_says(text, o) for o in others)


def distractors(prompts: list[dict]) -> dict[str, frozenset[str]]:
    """For each prompt id, the other prompts' expected answers that differ from its own (case-insensitively)."""
    expects = {str(q["expect"]).lower(): str(q["expect"]) for q in prompts}
    return {q["id"]: frozenset(v for k, v in expects.items() if k != str(q["expect"]).lower()) for q in prompts}


#: A phrase of 1-12 words said this many times in a row is a loop ("Paris. Paris. Paris. Paris.", or a whole
#: sentence over and over, as a corrupted KV cache says it), not an answer.
LOOP_REPEATS = 4
LOOP_MAX_WORDS = 12
_LOOP_RE = re.compile(r"\b(\w+(?:\W+\w+){0,%d}?)(?:\W+\1\b){%d,}" % (LOOP_MAX_WORDS - 1, LOOP_REPEATS - 1),
                      re.IGNORECASE)
#: One punctuation or symbol character this many times in a row ("Paris!!!!...") is a flood, not an answer; token
#: ids can alternate ('!', '!!', '!!!') so the token-id repeat rule does not see it.
PUNCT_RUN = 16
_PUNCT_RE = re.compile(r"([^\w\s])\1{%d,}" % (PUNCT_RUN - 1))


def garbage_reason(res: RequestResult, repeat: int, reply: Reply | None = None) -> str | None:
    """Why an answer is garbage, or None. Independent of correctness.

    ``reply``: the reply split at its thinking (validate.reasoning; default: no thinking). The answer after the
    thinking is judged whole; the thinking itself only for replacement and control characters (a thinking model
    may well say "wait" four times in a row); thinking that never ended is no answer."""
    reply = reply or Reply(res.text, "", "none")
    if reply.answer is None:
        return f"no answer: the thinking never ended (finish reason {res.finish_reason})"
    answer = reply.answer
    if not answer.strip():
        return "empty answer"
    if "\ufffd" in answer:
        return "replacement character in answer"
    if any(ord(c) < 32 and c not in "\n\r\t" for c in answer):
        return "control character in answer"
    if "\ufffd" in reply.thinking:
        return "replacement character in the thinking"
    if any(ord(c) < 32 and c not in "\n\r\t" for c in reply.thinking):
        return "control character in the thinking"
    loop = _LOOP_RE.search(answer)
    if loop:
        return f"the phrase {loop.group(1)!r} repeated {LOOP_REPEATS} or more times in a row"
    flood = _PUNCT_RE.search(answer)
    if flood:
        return f"{flood.group(1)!r} repeated {len(flood.group(0))} times in a row"
    ids = res.token_ids or []
    run = 1
    for a, b in zip(ids, ids[1:]):
        run = run + 1 if a == b else 1
        if run > repeat:
            return f"token {b} repeated over {repeat} times"
    return None


def first_divergence(a: list[int] | None, b: list[int] | None) -> int | None:
    """Index of the first differing token of two id lists (None when identical)."""
    a, b = a or [], b or []
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def preflight(p: SanityParams, root, data_dir) -> None:
    """The prompts file must load, and the train text must be there for the long-prefill condition."""
    load_prompts(root / "suites" / p.prompts_file)
    if p.after_long_prompt_tokens:
        require_file(data_dir, "gsm8k/train.jsonl")


class SanityMetrics(BaseModel):
    """What a strict-sanity record's ``metrics`` hold (counts of requests under load, and of prompts alone)."""

    model_config = ConfigDict(extra="forbid")
    n: int
    bad: int
    divergent: int
    errors: int
    solo_right: int
    prompts: int
    solo_wrong: list[str]
    solo_bad: int
    solo_right_share: float
    min_solo_right_share: float
    conditions: dict[str, dict[str, int]]
    max_num_seqs: int
    after_thinking: int = 0  # of the solo answers
    unclosed_thinking: int = 0
    think_end: str | None = None
    garbage: int | None = None  # garbage answers, alone and under load, of random weights (recorded, not judged)


def headline(rec) -> str | None:
    from validate.config import record_weights

    m = rec.metrics
    if record_weights(rec)[0] == "random" and {"divergent", "n"} <= set(m):
        return f"sanity {m['divergent']} of {m['n']:,} apart from solo (random weights)"
    return f"sanity {m['bad']} bad of {m['n']:,}" if {"bad", "n"} <= set(m) else None


def summary(rec) -> str:
    from validate.config import record_weights

    m = rec.metrics
    if record_weights(rec)[0] == "random":
        return (f"{m['divergent']} of {m['n']} apart from solo; answers not judged (random weights), "
                f"{m.get('garbage')} garbage")
    return f"{m['bad']} bad of {m['n']}, {m['solo_right']} of {m['prompts']} right alone"


def batches(p: SanityParams, max_num_seqs: int, max_model_len: int) -> list[tuple[float, int, int, int]]:
    """The runner's batches in order: (overload factor, round, requests, long prefill tokens or 0); each factor
    ``m`` sends ``ceil(m * max_num_seqs)`` requests, ``rounds`` times, with short prompts only and then, where
    ``after_long_prompt_tokens`` is set, beside a long prefill capped at ``max_model_len - 16``."""
    return [(m, r, math.ceil(m * max_num_seqs), L) for L in _modes(p, max_model_len) for m in p.overload
            for r in range(p.rounds)]


def _modes(p: SanityParams, max_model_len: int) -> list[int]:
    """The long prefill (tokens) beside each pass over the batches: 0 (short prompts only), then the params' long
    prefill capped at ``max_model_len - 16`` where one is set and fits."""
    long_n = min(p.after_long_prompt_tokens, max_model_len - 16)
    return [0] + ([long_n] if long_n > 0 else [])


def planned_ids(p: SanityParams, prompt_ids: list[str], server: dict, said_max_num_seqs=None,
                legacy: bool = False) -> list[str] | None:
    """The ids of the answers under load the runner writes for these prompts (in order; the prompts cycled within a
    batch; :func:`load_id`), or None where neither the recorded server settings nor the metrics give
    ``max_num_seqs`` (the ids do not depend on ``max_model_len`` beyond whether a long prefill fits at all).
    ``legacy``: the ids of records written before a long-prefill batch's ids said so (the plain batch's ids)."""
    mns = server.get("max_num_seqs", said_max_num_seqs)
    mml = server.get("max_model_len") if isinstance(server.get("max_model_len"), int) else 1 << 30
    if not isinstance(mns, int) or isinstance(mns, bool) or mns < 1 or not prompt_ids:
        return None
    if len(_modes(p, mml)) * p.rounds * sum(math.ceil(m * mns) for m in p.overload) > 10_000_000:
        return ["(more than 10,000,000 answers)"]  # no record holds that many: never built (a forged max_num_seqs)
    ident = load_id if not legacy else lambda q, m, rnd, k, _: f"{q}/x{m:g}/r{rnd}/{k}"
    return [ident(prompt_ids[k % len(prompt_ids)], m, rnd, k, L) for m, rnd, n, L in batches(p, mns, mml)
            for k in range(n)]


def load_id(prompt_id: str, m: float, rnd: int, k: int, long_len: int) -> str:
    """The id of an answer under load: ``<prompt>/x<factor>/r<round>/<k>`` (k its place in the batch), with
    ``/long`` after the factor for a batch beside a long prefill (``long_len`` > 0; the condition says its
    tokens), so that each condition's answers have ids of their own (records written before it had each such id
    twice: the plain batch's and the long-prefill batch's)."""
    return f"{prompt_id}/x{m:g}" + ("/long" if long_len else "") + f"/r{rnd}/{k}"


_LOAD_ID = re.compile(r"^(.*)/x[^/]+(?:/long)?/r\d+/\d+$")


def audit(rec, folder) -> list[str]:
    """Why a strict-sanity record does not stand on its items (empty when it does), by the runner's own rules:
    each solo answer is judged again from its output (right: :func:`is_right` against its expected answer and the
    other prompts' answers; garbage: :func:`garbage_reason` at the params' ``garbage_repeat``), each answer under
    load likewise and against its prompt's solo answer (bad: garbage, or right alone and wrong under load;
    divergent: other tokens or text than alone); the counts in ``metrics`` are recounted from that; and a record
    that says pass while its items give a bad answer, a failed request or fewer right alone than
    ``min_solo_right_share`` asks is named. A record of random weights (validate.config.record_weights: read from
    its configuration snapshot) is judged by the runner's rule for them: nothing is bad, a garbage answer is its
    item's ``garbage``, and no solo share is asked. A record without items has nothing to recount (the runner always
    writes them). ``folder`` is not read."""
    from validate.config import record_weights
    from validate.reasoning import DEFAULT_THINK_END

    if not rec.items:  # nothing to recount (the runner always writes them)
        return []
    try:
        p = SanityParams.model_validate(rec.params)
    except Exception as e:  # noqa: BLE001 - any malformed params: said
        return [f"its params do not validate: {e}".replace("\n", " ")[:300]]
    m = rec.metrics if isinstance(rec.metrics, dict) else {}
    snap = rec.config_snapshot if isinstance(rec.config_snapshot, dict) else {}
    think_end = m.get("think_end") or snap.get("think_end") or DEFAULT_THINK_END
    if not isinstance(think_end, str):
        return [f"its end-of-thinking marker {think_end!r} is not text"]
    solo = {i.id[: -len("/solo")]: i for i in rec.items if i.condition == "solo" and i.id.endswith("/solo")}
    load = [i for i in rec.items if i.condition != "solo"]
    if len(solo) != sum(1 for i in rec.items if i.condition == "solo"):
        return ["its solo answers are not one per prompt (an id repeated or not ending in /solo)"]
    others = distractors([{"id": k, "expect": i.expected} for k, i in solo.items()])
    judged = record_weights(rec)[0] == "trained"  # random weights: neither right answers nor garbage judged
    wrong: list[str] = []

    def judge(i, qid: str) -> tuple[bool, str | None]:  # (right, why garbage) of item i, prompt qid
        res = RequestResult(ok=True, text=i.output or "", reasoning=getattr(i, "reasoning", None) or "",
                            finish_reason=getattr(i, "finish_reason", None), token_ids=i.token_ids)
        reply = split_reply(res.text, res.reasoning, think_end)
        ok = reply.answer is not None and is_right(reply.answer, str(i.expected), others.get(qid, frozenset()))
        return ok, garbage_reason(res, p.garbage_repeat, reply)

    def check(i, ok: bool, why: str | None) -> None:  # the item's stored flags against what its output gives
        flag = "bad" if judged else "garbage"  # random weights: garbage is recorded, never bad
        if (bool(i.correct) != ok or bool(getattr(i, flag, None)) != (why is not None)
                or (not judged and getattr(i, "bad", None))):
            wrong.append(f"{i.id} says {'right' if i.correct else 'wrong'}"
                         f"{', bad' if getattr(i, 'bad', None) else ''}"
                         f"{', garbage' if getattr(i, 'garbage', None) else ''}; its output gives "
                         f"{'right' if ok else 'wrong'}{f', {flag}: ' + why if why else ''}")

    solo_right: dict[str, bool] = {}
    solo_bad = garbage = 0
    for qid, i in solo.items():
        if i.error or not isinstance(i.expected, str):
            wrong.append(f"{i.id} holds {'an error' if i.error else 'no expected answer'}")
            solo_right[qid] = False
            continue
        ok, why = judge(i, qid)
        solo_right[qid] = ok and why is None
        solo_bad += judged and why is not None
        garbage += why is not None
        check(i, solo_right[qid], why)
    bad = solo_bad
    divergent = errors = 0
    for i in load:
        mt = _LOAD_ID.match(i.id)
        if not mt or mt.group(1) not in solo:
            wrong.append(f"{i.id} is no prompt's answer under load")
            continue
        if i.error:
            errors += 1
            continue
        qid = mt.group(1)
        ref = solo[qid]
        if i.prompt_hash != ref.prompt_hash:  # the noise-floor gates pair an answer with its solo one by this hash
            wrong.append(f"{i.id} names another prompt ({i.prompt_hash!r}) than its solo answer {ref.id} "
                         f"({ref.prompt_hash!r})")
            continue
        ok, why = judge(i, qid)
        garbage += why is not None
        if judged and why is None and solo_right[qid] and not ok:
            why = "right solo, wrong under load"
        same = (i.token_ids == ref.token_ids and i.output == ref.output
                and (getattr(i, "reasoning", None) or "") == (getattr(ref, "reasoning", None) or ""))
        divergent += not same
        if getattr(i, "identical_to_solo", None) is not None and i.identical_to_solo != same:
            wrong.append(f"{i.id} says identical_to_solo={i.identical_to_solo}, but its tokens say {same}")
        bad += judged and why is not None
        check(i, ok, why)
    out = misjudged(wrong, len(rec.items))
    server = snap.get("server") if isinstance(snap.get("server"), dict) else {}
    plan = planned_ids(p, list(solo), server, m.get("max_num_seqs"))
    have = [i.id for i in load]
    if plan is not None and have not in (plan, planned_ids(p, list(solo), server, m.get("max_num_seqs"), legacy=True)):
        first = next((a for a, b in zip(plan, have) if a != b), None)
        out.append(f"its answers under load are not the runner's batches: {len(plan)} planned for {len(solo)} prompts "
                   f"at these params, it holds {len(load)}" + (f" (first apart: {first})" if first else ""))
    right = sum(solo_right.values())
    out += recount(m, {"n": len(load), "bad": bad, "divergent": divergent, "errors": errors, "solo_right": right,
                       "prompts": len(solo), "solo_bad": solo_bad, "solo_right_share": round(right / len(solo), 6),
                       "solo_wrong": [k for k, v in solo_right.items() if not v]}
                   | ({} if judged else {"garbage": garbage}))
    need = math.ceil(p.min_solo_right_share * len(solo) - 1e-9) if judged else 0
    if rec.verdict.status == "pass" and (bad or errors or right < need):
        out.append(f"the record says pass, but its items give {bad} bad answers, {errors} failed requests and "
                   f"{right} of {len(solo)} prompts right alone (min_solo_right_share {p.min_solo_right_share:g} "
                   f"asks {need})")
    return out


@register_runner("strict-sanity", SanityParams, preflight=preflight, metrics_model=SanityMetrics, headline=headline,
                 summary=summary, order=10, audit=audit, audit_hashes=False)
async def run(ctx: RunContext, p: SanityParams) -> SuiteResult:
    prompts = load_prompts(ctx.root / "suites" / p.prompts_file)
    mns = ctx.config.server.max_num_seqs
    long_n = _modes(p, ctx.config.server.max_model_len)[-1]  # 0: short prompts only
    pool = None
    if long_n > 0:
        from validate.runners.text import TextPool

        pool = await TextPool.build(ctx.client, ctx.data_dir, min_tokens=long_n * 2)
    plan = batches(p, mns, ctx.config.server.max_model_len)
    total = len(prompts) + sum(b[2] for b in plan)
    ctx.progress(0, total=total, description="sanity")
    out = SuiteResult()
    gen = {"max_tokens": p.max_tokens, "temperature": 0.0}

    def ask(prompt: str):
        return ctx.client.chat([{"role": "user", "content": prompt}], max_tokens=p.max_tokens, top2=True)

    solo: dict[str, RequestResult] = {}
    for q in prompts:  # concurrency 1: the reference
        solo[q["id"]] = await ask(q["prompt"])
        ctx.progress(1)
    solo_errors = [f"solo {k}: {r.error}" for k, r in solo.items() if not r.ok]
    if solo_errors:
        out.errors += solo_errors
        return out
    others = distractors(prompts)
    think_end = ctx.think_end
    judged = not ctx.config.model.random_weights  # random weights: neither right answers nor garbage judged
    garbage = 0

    def said(r: RequestResult) -> Reply:
        return split_reply(r.text, r.reasoning, think_end)

    def right(r: RequestResult, q: dict) -> bool:  # the answer after the thinking; none when it never ended
        a = said(r).answer
        return a is not None and is_right(a, q["expect"], others[q["id"]])

    solo_right = {q["id"]: right(solo[q["id"]], q) for q in prompts}
    bad = 0
    for q in prompts:
        r = solo[q["id"]]
        item = Item(id=f"{q['id']}/solo", prompt_hash=sha256_text(q["prompt"]), condition="solo", gen=gen,
                    output=r.text, token_ids=r.token_ids, expected=str(q["expect"]), correct=solo_right[q["id"]],
                    **item_fields(r, said(r)), **ctx.top2_fields(r))
        why = garbage_reason(r, p.garbage_repeat, said(r))
        if why:
            solo_right[q["id"]] = False  # garbage that happens to contain the answer is not a right answer
            item.correct = False
            garbage += 1
            if judged:
                item.bad = why
                bad += 1
                out.findings.append(f"bad answer {item.id} (solo): {why}")
            else:
                item.garbage = why
        out.items.append(item)
    solo_bad = bad
    wrong_solo = [q["id"] for q in prompts if not solo_right[q["id"]]]
    need = math.ceil(p.min_solo_right_share * len(prompts) - 1e-9)
    if judged and len(prompts) - len(wrong_solo) < need:
        out.findings.append(f"solo answers: {len(prompts) - len(wrong_solo)} of {len(prompts)} right alone, fewer than "
                            f"the {need} that min_solo_right_share={p.min_solo_right_share:g} asks; wrong solo: "
                            + ", ".join(wrong_solo))

    per_cond: dict[str, dict[str, int]] = {}
    divergent = errors = n_load = 0
    rng = random.Random(0)
    for batch_no, (m, rnd, n, long_len) in enumerate(plan):
        chosen = [prompts[i % len(prompts)] for i in range(n)]
        t0 = time.perf_counter()
        coros = [ask(q["prompt"]) for q in chosen]
        if long_len:
            # The long prompt goes first, so the batch shares steps with its chunked prefill; it is not scored.
            long_req = asyncio.ensure_future(ctx.client.completion(pool.window(long_len, rng), max_tokens=4))
            await asyncio.sleep(0)
        results = await gather_limited(coros, limit=n, on_done=lambda: ctx.progress(1))
        if long_len:
            lr = await long_req
            if not lr.ok:
                out.errors.append(f"long {long_len}-token prefill of batch {batch_no} failed: {lr.error}")
        cond = f"overload x{m:g} ({n} requests, max_num_seqs {mns})" + (f" after a {long_len:,}-token prefill" if long_len else "")
        c = per_cond.setdefault(cond, {"n": 0, "bad": 0, "divergent": 0, "errors": 0})
        for k, (q, r) in enumerate(zip(chosen, results)):
            ref = solo[q["id"]]
            item = Item(id=load_id(q["id"], m, rnd, k, long_len), prompt_hash=sha256_text(q["prompt"]), condition=cond,
                        gen=gen, output=r.text, token_ids=r.token_ids, expected=str(q["expect"]), batch=batch_no,
                        batch_wall_s=round(time.perf_counter() - t0, 3), **ctx.top2_fields(r))
            c["n"] += 1
            n_load += 1
            if not r.ok:
                item.error = r.error
                c["errors"] += 1
                errors += 1
                out.items.append(item)
                continue
            reply = said(r)
            for key, v in item_fields(r, reply).items():
                setattr(item, key, v)
            item.correct = right(r, q)
            item.identical_to_solo = r.token_ids == ref.token_ids and r.text == ref.text and r.reasoning == ref.reasoning
            if not item.identical_to_solo:
                item.first_divergent_token = first_divergence(r.token_ids, ref.token_ids)
                c["divergent"] += 1
                divergent += 1
            why = garbage_reason(r, p.garbage_repeat, reply)
            garbage += why is not None
            if not judged:
                if why:
                    item.garbage = why
                why = None
            elif why is None and solo_right[q["id"]] and not item.correct:
                why = "right solo, wrong under load"
            if why:
                item.bad = why
                c["bad"] += 1
                bad += 1
                out.findings.append(f"bad answer {item.id} in batch {batch_no}: {why}")
            out.items.append(item)
    if errors:
        out.errors.append(f"{errors} of {n_load} requests under load failed")
    out.metrics = {
        "n": n_load, "bad": bad, "divergent": divergent, "errors": errors,
        "solo_right": sum(solo_right.values()), "prompts": len(prompts), "solo_wrong": wrong_solo, "solo_bad": solo_bad,
        "solo_right_share": round(sum(solo_right.values()) / len(prompts), 6),
        "min_solo_right_share": p.min_solo_right_share,
        "conditions": per_cond, "max_num_seqs": mns,
        **tally([i for i in out.items if i.condition == "solo"], think_end),
    }
    if not judged:
        out.metrics["garbage"] = garbage
    return out

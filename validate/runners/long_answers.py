"""Long answers after long prompts, under decode load: answers must stay right when the server is busy.

Each long prompt is a chat message of real text (whole GSM8K train problems and their solutions, read from the
data directory) of up to ``prompt_tokens`` tokens, capped at ``max_model_len - max_tokens`` less
:data:`TEMPLATE_TOKENS` for the chat template, with a fact planted in it (the *needle*: "The secret code is
48213.", a code of :data:`CODE_DIGITS` digits that the text does not contain) and, at the end, :data:`QUESTION`,
which asks for the code and then a few hundred tokens of working on the text's last problem. An answer is
*right* when it states the code as a whole word and no other prompt's code (strict sanity's rule,
:func:`validate.runners.sanity.is_right`: an answer naming every code, or another request's, is not right).

First every prompt is sent alone (concurrency 1, greedy, ``max_tokens`` output tokens): the solo reference,
gated itself as strict sanity gates its own (fewer than ``min_solo_right_share`` right alone fails the suite,
naming the prompts). Then the decode load starts: ``load_clients`` clients (default ``max_num_seqs - 1``) each
streaming :data:`validate.runners.text.ESSAY` with ``load_tokens`` output tokens (ignore_eos) in a closed loop.
After ``load_warmup_s`` (their prefills done, every client decoding), each long prompt is sent again, one at a
time, ``rounds`` times, so its prefill is chunked in among the load's decode steps and its answer is decoded in
a full batch. Strict sanity's rule judges every answer: *bad* is an answer right alone and wrong under load, or
garbage (:func:`validate.runners.sanity.garbage_reason`: empty, replacement or control characters, a phrase
looping, a punctuation flood, one token over ``garbage_repeat`` times in a row), alone or under load; an answer
whose tokens differ from the solo answer's but that stays right is *divergent* (batching numerics), not bad. A
failed request, long or load, is an error, never a pass; so is a long answer under load sent while no load
request was in flight (nothing was checked under load).

A configuration of random weights (validate.config.ModelSpec.random_weights) answers noise, as strict sanity says
of it: no answer is bad and no solo share is asked; garbage is recorded (each item's ``garbage``, the metrics'
``solo_garbage``) and each answer under load is compared with its solo answer token by token (``divergent``,
judged against the baseline's own share by the share gates: validate.loadgate).

Where the needle sits: SmolLM2-135M (cpu-smol) does not find a code stated at the start of a 3,600-token prompt
(0 of 8 right at depth 0, 1 of 8 at depth 0.5, greedy, 300 tokens), and finds it at depth 0.9 (8 of 8, about
350 tokens before the question), so ``needle_depth`` (the share of the text's problems before the needle)
defaults to 0.9; the answer still depends on every earlier token's KV cache (a corrupted one reads as garbage,
and the text's own numbers as a wrong code).
"""
from __future__ import annotations

import asyncio
import math
import random
import re
import time
import uuid

from types import SimpleNamespace

from pydantic import BaseModel, ConfigDict, Field

from validate.client import OpenAIClient, RequestResult
from validate.data import needs_train_text, require_file
from validate.evals import gsm8k as g
from validate.metrics import summarize
from validate.reasoning import DEFAULT_THINK_END, Reply, item_fields, split_reply, tally
from validate.record import Item
from validate.runners.base import RunContext, SuiteResult
from validate.runners.sanity import first_divergence, garbage_reason, is_right
from validate.runners.text import ESSAY
from validate.suite import register_runner
from validate.util import sha256_text

#: Tokens left for the chat template around the user message (SmolLM2's system line and role markers take 31).
TEMPLATE_TOKENS = 64
#: Digits of a planted code: GSM8K's own numbers rarely run to five digits, and a code found in the text is drawn
#: again, so a right answer cannot come from the text alone.
CODE_DIGITS = 5
NEEDLE = "The secret code is {code}."
#: The question after the text. No digit in it: the only number of the prompt outside the text is the code.
QUESTION = "Tell me the secret code. Then solve the last problem of the text step by step, explaining each step."
#: GSM8K's calculator annotations (``<<48/2=24>>``; validate.evals.gsm8k drops them from its exemplars too): left
#: in, the model copies them, and "7 = <<7=7>>7" reads as a number said four times in a row (a loop).
_CALCULATOR_RE = re.compile(r"<<[^>]*>>")
#: Problems of the train split between the first problems of consecutive prompts: their texts differ.
PROMPT_STRIDE = 97


class LongAnswersParams(BaseModel):
    model_config = ConfigDict(extra="forbid")
    prompts: int = Field(8, ge=1, description="long prompts, each with its own text and code")
    prompt_tokens: int = Field(32768, ge=64, description="tokens of each long prompt at most; capped by "
                               "max_model_len - max_tokens - TEMPLATE_TOKENS")
    max_tokens: int = Field(300, ge=8, description="output tokens of each long answer (greedy; it may stop sooner)")
    needle_depth: float = Field(0.9, ge=0, le=1, description="share of the text's problems before the code")
    rounds: int = Field(1, ge=1, description="times each long prompt is sent under load")
    load_clients: int | None = Field(None, ge=1, description="closed-loop clients of the decode load (default "
                                     "max_num_seqs - 1, at least 1)")
    load_tokens: int = Field(256, ge=2, description="output tokens of each load request (ignore_eos)")
    load_warmup_s: float = Field(2.0, ge=0, description="seconds the load runs before the first long prompt")
    presence_penalty: float = Field(0.5, ge=-2, le=2, description="OpenAI presence penalty of the long answers "
                                    "(still greedy: it lowers the logits of tokens already said, then the argmax)")
    cache_salt: bool = Field(True, description="send each long prompt with a cache_salt of its own (vLLM's prefix "
                             "cache then reuses no block of an earlier send: each send prefills the whole prompt)")
    garbage_repeat: int = Field(12, ge=2, description="a token repeated more than this in a row is garbage")
    min_solo_right_share: float = Field(1.0, ge=0, le=1, description="share of the prompts the server must answer "
                                        "right alone; fewer fails the suite, naming the prompts")
    seed: int = 0


class LongAnswersMetrics(BaseModel):
    """What a long-answers record's ``metrics`` hold: counts of long answers (under load, and of prompts alone),
    token counts, and the decode load's own figures (``load``: validate.metrics.LoadMetrics fields, ms and tok/s)."""

    model_config = ConfigDict(extra="forbid")
    n: int
    bad: int
    divergent: int
    errors: int
    solo_right: int
    prompts: int
    solo_wrong: list[str]
    solo_garbage: int
    solo_right_share: float
    min_solo_right_share: float
    prompt_tokens: list[int | None]
    prompt_tokens_max: int | None
    needle_tokens_from_end: list[int]
    output_tokens_solo_mean: float | None
    output_tokens_under_load_mean: float | None
    load_clients: int
    load_tokens: int
    load: dict[str, float | int | None]
    load_in_flight_at_send_min: int | None
    max_num_seqs: int
    after_thinking: int = 0  # of the solo answers
    unclosed_thinking: int = 0
    think_end: str | None = None


class LongPrompt(BaseModel):
    """One long prompt: its text, planted code, and where the code sits (tokens of the server's tokenizer)."""

    id: str
    text: str
    code: str
    tokens: int  # of the user message alone
    needle_tokens_from_end: int  # tokens of the message after the code's sentence


async def build_prompts(client: OpenAIClient, data_dir, n: int, budget: int, depth: float, seed: int
                        ) -> list[LongPrompt]:
    """``n`` long prompts of at most ``budget`` tokens (the user message, by the server's /tokenize), each whole
    train problems from its own offset with a code planted at ``depth``.

    Raises:
        InputError: the data directory has no gsm8k/train.jsonl.
        ServerError: /tokenize fails.
        ValueError: ``budget`` cannot hold the code, the question and one problem.
    """
    train = g.load_split(require_file(data_dir, "gsm8k/train.jsonl"), "train")
    rng = random.Random(seed)
    first = rng.randrange(len(train))
    taken: set[str] = set()
    out = []
    for k in range(n):
        start = first + k * PROMPT_STRIDE
        parts: list[str] = []
        chars = 0
        while chars < budget * 8 and len(parts) < len(train):  # well over budget: English runs ~4 chars a token
            q = train[(start + len(parts)) % len(train)]
            parts.append(q.question + "\n" + _CALCULATOR_RE.sub("", q.solution))
            chars += len(parts[-1]) + 2
        context = "\n\n".join(parts)
        code = _draw_code(rng, context, taken)
        taken.add(code)
        while True:
            text, after = _compose(parts, code, depth)
            tokens = len(await client.tokenize(text))
            if tokens <= budget:
                break
            if len(parts) == 1:
                raise ValueError(f"a long prompt of {budget} tokens cannot hold the code, the question and one "
                                 f"problem ({tokens} tokens)")
            # drop about the excess at once (a few /tokenize calls, not one per problem)
            per_part = tokens / len(parts)
            parts = parts[:max(1, len(parts) - max(1, math.ceil((tokens - budget) / per_part)))]
        from_end = len(await client.tokenize(after))
        out.append(LongPrompt(id=f"long{k}", text=text, code=code, tokens=tokens, needle_tokens_from_end=from_end))
    return out


def _compose(parts: list[str], code: str, depth: float) -> tuple[str, str]:
    """(the user message, its text after the code's sentence): ``parts`` with the needle after the first
    ``round(depth * len(parts))`` of them, then the question."""
    k = int(round(depth * len(parts)))
    after = "\n\n".join(parts[k:] + [QUESTION])
    return "\n\n".join(parts[:k] + [NEEDLE.format(code=code), after]), after


def _draw_code(rng: random.Random, context: str, taken: set[str]) -> str:
    """A code of :data:`CODE_DIGITS` digits that the text does not say and no other prompt has."""
    while True:
        code = str(rng.randrange(10 ** (CODE_DIGITS - 1), 10 ** CODE_DIGITS))
        if code not in taken and not is_right(context, code):
            return code


def audit(rec, folder) -> list[str]:
    """Why a long-answers record does not stand on its items (empty when it does). ``folder`` is unused (no
    attachment: the items are in the record).

    - its items are exactly ``prompts`` solo answers ``long<k>/solo`` and ``prompts x rounds`` answers under load
      ``long<k>/load/r<j>`` (params), each under load expecting its solo answer's code;
    - each answered item judged again by strict sanity's rule from its text, kept thinking and token ids (its
      ``garbage`` and ``correct``); ``bad`` exactly where it is garbage, or under load right alone and wrong now;
    - ``n``, ``bad``, ``divergent``, ``errors``, ``solo_right`` and ``prompts`` are whole numbers its items give;
    - a record that says pass holds no error (its own or the decode load's), had load in flight at every send
      under load, and as many right alone as ``min_solo_right_share`` (params) asks;
    - a record of random weights (validate.config.record_weights: read from its configuration snapshot): no item
      is bad, and no solo share is asked.
    """
    from validate.config import record_weights

    judged = record_weights(rec)[0] == "trained"
    m = rec.metrics if isinstance(rec.metrics, dict) else {}
    params = rec.params if isinstance(rec.params, dict) else {}
    get = lambda k: params.get(k, LongAnswersParams.model_fields[k].default)  # noqa: E731
    items = list(rec.items)
    out = []
    prompts, rounds = get("prompts"), get("rounds")
    if type(prompts) is not int or type(rounds) is not int or prompts < 1 or rounds < 1:
        return [f"its params prompts = {prompts!r}, rounds = {rounds!r} are not counts"]
    want = [f"long{k}/solo" for k in range(prompts)] + [f"long{k}/load/r{j}" for j in range(rounds)
                                                         for k in range(prompts)]
    have = [i.id for i in items]
    if sorted(have) != sorted(want) or len(set(have)) != len(have):
        return [f"its items are not its {prompts} solo answers and {prompts * rounds} answers under load "
                f"(ids {have[:4]}{' ...' if len(have) > 4 else ''})"]
    solo = {i.id.split("/")[0]: i for i in items if i.id.endswith("/solo")}
    load = [i for i in items if "/load/" in i.id]
    for i in items:
        cond = "solo" if i.id.endswith("/solo") else "under load"
        if i.condition != cond:
            out.append(f"item {i.id} says condition {i.condition!r}, its id says {cond!r}")
    codes = {k: i.expected for k, i in solo.items()}
    if any(not isinstance(c, str) or not c for c in codes.values()):
        return out + ["a solo item holds no code it expected"]
    for i in load:
        if i.expected != codes[i.id.split("/")[0]]:
            out.append(f"item {i.id} expects {i.expected!r}, its solo answer {codes[i.id.split('/')[0]]!r}")
        ref = solo[i.id.split("/")[0]]
        if i.prompt_hash != ref.prompt_hash:  # the noise-floor gates pair an answer with its solo one by this hash
            out.append(f"item {i.id} names another prompt ({i.prompt_hash!r}) than its solo answer {ref.id}")
    think_end = m.get("think_end") if isinstance(m.get("think_end"), str) and m.get("think_end") else None
    repeat = get("garbage_repeat")
    for i in items:
        extra = i.model_extra or {}
        if i.error is not None:
            continue
        if extra.get("thinking") and think_end is None:
            out.append(f"item {i.id} says it thought, but the record names no end-of-thinking marker")
            continue
        reply = split_reply(i.output or "", extra.get("reasoning") or "", think_end or DEFAULT_THINK_END)
        res = SimpleNamespace(text=i.output or "", token_ids=i.token_ids, finish_reason=extra.get("finish_reason"))
        garbage = garbage_reason(res, repeat, reply)
        if bool(garbage) != bool(extra.get("garbage")):
            out.append(f"item {i.id} says garbage={extra.get('garbage')!r}, its text and tokens say {garbage!r}")
        k = i.id.split("/")[0]
        others = frozenset(c for j, c in codes.items() if j != k)
        right = reply.answer is not None and is_right(reply.answer, i.expected, others) and not garbage
        if i.correct is not right:
            out.append(f"item {i.id} says correct={i.correct}, its text says {right}")
    for i in items:
        extra = i.model_extra or {}
        ref = solo[i.id.split("/")[0]]
        should = judged and i.error is None and bool(extra.get("garbage") or (
            i in load and ref.error is None and ref.correct is True and i.correct is not True))
        if bool(extra.get("bad")) != should:
            out.append(f"item {i.id} is {'bad' if extra.get('bad') else 'not bad'}, its answers say "
                       f"{'bad' if should else 'not bad'}")
    counts = {"n": len(load), "bad": sum(bool((i.model_extra or {}).get("bad")) for i in items),
              "divergent": sum((i.model_extra or {}).get("identical_to_solo") is False for i in load),
              "errors": sum(i.error is not None for i in items),
              "solo_right": sum(i.correct is True for i in solo.values()), "prompts": len(solo)}
    said = [f"{k} = {m.get(k)!r}, its items give {v}" for k, v in counts.items()
            if type(m.get(k)) is not int or m.get(k) != v]
    if said:
        out.append("its counts are not its items': " + "; ".join(said))
    if rec.verdict.status == "pass":
        load_m = m.get("load") if isinstance(m.get("load"), dict) else {}
        if counts["errors"] or load_m.get("errors") != 0:
            out.append(f"it says pass with {counts['errors']} failed long answers and {load_m.get('errors')!r} "
                       "failed decode-load requests")
        at_send = [(i.model_extra or {}).get("load_in_flight_at_send") for i in load]
        if any(type(x) is not int or x < 1 for x in at_send):
            out.append("it says pass, but not every answer under load was sent while a load request was in flight")
        share = get("min_solo_right_share")
        need = math.ceil(share * prompts - 1e-9) if isinstance(share, (int, float)) else prompts
        if judged and counts["solo_right"] < need:
            out.append(f"it says pass with {counts['solo_right']} of {prompts} right alone, fewer than the {need} "
                       f"min_solo_right_share={share!r} asks")
    return out


def figures(records: list) -> list:
    """The notes' long-answers figures: bad answers, the longest prompt, the decode load's output rate."""
    from validate.figures import FigureSpec, metric

    return [FigureSpec("la_bad", "long answers bad under load", "long-answers", "", 0, False, metric("bad")),
            FigureSpec("la_prompt", "long-answer prompt (longest)", "long-answers", "tokens", 0, True,
                       metric("prompt_tokens_max")),
            FigureSpec("la_load", "decode load beside long prompts", "long-answers", "tok/s", 1, True,
                       metric("load", "output_tok_s"))]


def headline(rec) -> str | None:
    from validate.config import record_weights

    m = rec.metrics
    if record_weights(rec)[0] == "random" and {"divergent", "n"} <= set(m):
        return f"long answers {m['divergent']} of {m['n']:,} apart from solo (random weights)"
    return f"long answers {m['bad']} bad of {m['n']:,}" if {"bad", "n"} <= set(m) else None


def summary(rec) -> str:
    m = rec.metrics
    longest = f", prompts up to {m['prompt_tokens_max']:,} tokens" if m.get("prompt_tokens_max") else ""
    return (f"{m['bad']} bad of {m['n']} ({m['divergent']} divergent), {m['solo_right']} of {m['prompts']} right "
            f"alone{longest}")


@register_runner("long-answers", LongAnswersParams, preflight=needs_train_text, metrics_model=LongAnswersMetrics,
                 figures=figures, headline=headline, summary=summary, order=15, audit=audit)
async def run(ctx: RunContext, p: LongAnswersParams) -> SuiteResult:
    s = ctx.config.server
    budget = min(p.prompt_tokens, s.max_model_len - p.max_tokens - TEMPLATE_TOKENS)
    if budget < 64:
        raise ValueError(f"max_model_len {s.max_model_len} leaves {budget} tokens for a long prompt after "
                         f"max_tokens {p.max_tokens} and {TEMPLATE_TOKENS} for the chat template")
    clients = p.load_clients or max(1, s.max_num_seqs - 1)
    prompts = await build_prompts(ctx.client, ctx.data_dir, p.prompts, budget, p.needle_depth, p.seed)
    ctx.progress(0, total=p.prompts * (1 + p.rounds), description="long answers")
    out = SuiteResult()
    gen = {"max_tokens": p.max_tokens, "temperature": 0.0, "presence_penalty": p.presence_penalty}
    codes = {q.id: q.code for q in prompts}
    others = {q.id: frozenset(c for k, c in codes.items() if k != q.id) for q in prompts}
    think_end = ctx.think_end
    judged = not ctx.config.model.random_weights  # random weights: neither right answers nor garbage judged

    def ask(q: LongPrompt):
        extra: dict = {"presence_penalty": p.presence_penalty} if p.presence_penalty else {}
        if p.cache_salt:  # a salt of its own: no block of an earlier send (the solo one) is reused
            extra["cache_salt"] = f"long-answers-{uuid.uuid4().hex}"
        return ctx.client.chat([{"role": "user", "content": q.text}], max_tokens=p.max_tokens, extra=extra or None,
                               top2=True)

    def said(r: RequestResult) -> Reply:
        return split_reply(r.text, r.reasoning, think_end)

    def right(r: RequestResult, q: LongPrompt) -> bool:  # the answer after the thinking; none when it never ended
        a = said(r).answer
        return a is not None and is_right(a, q.code, others[q.id])

    def item(q: LongPrompt, r: RequestResult, ident: str, condition: str) -> Item:
        it = Item(id=ident, prompt_hash=sha256_text(q.text), condition=condition, gen=gen, output=r.text,
                  token_ids=r.token_ids, expected=q.code, prompt_tokens=r.prompt_tokens or None,
                  output_tokens=r.output_tokens, **ctx.top2_fields(r))
        if not r.ok:
            it.error = r.error
            return it
        for key, v in item_fields(r, said(r)).items():
            setattr(it, key, v)
        it.correct = right(r, q)
        why = garbage_reason(r, p.garbage_repeat, said(r))
        if why:
            it.garbage = why
            it.correct = False  # garbage that happens to contain the code is not a right answer
        return it

    solo: dict[str, RequestResult] = {}
    solo_right: dict[str, bool] = {}
    errors = solo_garbage = 0
    for q in prompts:  # concurrency 1: the reference
        r = solo[q.id] = await ask(q)
        ctx.progress(1)
        it = item(q, r, f"{q.id}/solo", "solo")
        solo_right[q.id] = bool(it.correct)
        if it.error:
            errors += 1
            out.errors.append(f"solo {q.id}: {r.error}")
        elif getattr(it, "garbage", None):
            solo_garbage += 1  # garbage alone is bad, as strict sanity counts it (and not right: the solo share)
            if judged:
                it.bad = it.garbage
                out.findings.append(f"bad answer {it.id} alone: {it.bad}")
        out.items.append(it)
    wrong_solo = [q.id for q in prompts if not solo_right[q.id]]
    need = math.ceil(p.min_solo_right_share * len(prompts) - 1e-9)
    if judged and len(prompts) - len(wrong_solo) < need:
        out.findings.append(f"solo answers: {len(prompts) - len(wrong_solo)} of {len(prompts)} right alone, fewer "
                            f"than the {need} that min_solo_right_share={p.min_solo_right_share:g} asks; wrong solo: "
                            + ", ".join(wrong_solo))

    # The decode load: closed-loop clients until every long answer under load is in.
    stop = asyncio.Event()
    load: list[RequestResult] = []
    in_flight = 0

    async def load_client() -> None:
        nonlocal in_flight
        while not stop.is_set():
            in_flight += 1
            try:
                r = await ctx.client.chat([{"role": "user", "content": ESSAY}], max_tokens=p.load_tokens,
                                          ignore_eos=True)
            finally:
                in_flight -= 1
            load.append(r)
            if not r.ok:  # an error of the suite; a client that went on would send thousands in a second
                if await ctx.server_gone():
                    stop.set()
                return

    t_load = time.perf_counter()
    tasks = [asyncio.create_task(load_client()) for _ in range(clients)]
    bad = divergent = n_load = 0
    at_send: list[int] = []
    try:
        await asyncio.sleep(p.load_warmup_s)
        for rnd in range(p.rounds):
            for q in prompts:
                if stop.is_set():
                    break
                at_send.append(in_flight)
                r = await ask(q)
                ctx.progress(1)
                n_load += 1
                it = item(q, r, f"{q.id}/load/r{rnd}", "under load")
                it.load_in_flight_at_send = at_send[-1]
                ref = solo[q.id]
                if it.error:
                    errors += 1
                    out.errors.append(f"under load {it.id}: {r.error}")
                    out.items.append(it)
                    continue
                if ref.ok:  # no reference to differ from when the solo request failed
                    it.identical_to_solo = (r.token_ids == ref.token_ids and r.text == ref.text
                                            and r.reasoning == ref.reasoning)
                if getattr(it, "identical_to_solo", None) is False:
                    it.first_divergent_token = first_divergence(r.token_ids, ref.token_ids)
                    divergent += 1
                if not judged:
                    pass  # random weights: garbage stays the item's garbage, nothing is bad
                elif getattr(it, "garbage", None):
                    it.bad = it.garbage
                elif solo_right[q.id] and not it.correct:
                    it.bad = "right solo, wrong under load"
                if getattr(it, "bad", None):
                    bad += 1
                    out.findings.append(f"bad answer {it.id} under load: {it.bad}")
                out.items.append(it)
    finally:
        stop.set()  # each client ends its request in flight (at most load_tokens more), then stops
        await asyncio.gather(*tasks, return_exceptions=True)
    load_wall = time.perf_counter() - t_load
    lm = summarize(load, load_wall).as_dict() if load else {}
    if lm.get("errors"):
        first = next(r.error for r in load if not r.ok)
        out.errors.append(f"{lm['errors']} of {lm['requests']} decode-load requests failed; first: {first}")
    if at_send and min(at_send) == 0:
        out.errors.append(f"{at_send.count(0)} long answers under load were sent while no load request was in "
                          "flight: nothing was checked under load for them")
    cause = await ctx.server_gone() if out.errors else None
    if cause:
        out.server_died = f"{cause}, during the long answers"

    solo_out = [r.output_tokens for r in solo.values() if r.ok and r.output_tokens is not None]
    load_out = [i.output_tokens for i in out.items if i.condition == "under load" and i.error is None
                and i.output_tokens is not None]
    ptoks = [solo[q.id].prompt_tokens if solo[q.id].ok else None for q in prompts]
    out.metrics = {
        "n": n_load, "bad": bad + solo_garbage * judged, "divergent": divergent, "errors": errors,
        "solo_right": sum(solo_right.values()), "prompts": len(prompts), "solo_wrong": wrong_solo,
        "solo_garbage": solo_garbage, "solo_right_share": round(sum(solo_right.values()) / len(prompts), 6),
        "min_solo_right_share": p.min_solo_right_share,
        "prompt_tokens": ptoks, "prompt_tokens_max": max((t for t in ptoks if t), default=None),
        "needle_tokens_from_end": [q.needle_tokens_from_end for q in prompts],
        "output_tokens_solo_mean": round(sum(solo_out) / len(solo_out), 1) if solo_out else None,
        "output_tokens_under_load_mean": round(sum(load_out) / len(load_out), 1) if load_out else None,
        "load_clients": clients, "load_tokens": p.load_tokens,
        "load": {k: lm.get(k) for k in ("requests", "ok", "errors", "wall_s", "output_tokens", "output_tok_s",
                                        "ttft_ms_p50", "tpot_ms_p50", "decode_tok_s_p50")},
        "load_in_flight_at_send_min": min(at_send) if at_send else None,
        "max_num_seqs": s.max_num_seqs,
        **tally([i for i in out.items if i.condition == "solo"], think_end),
    }
    return out

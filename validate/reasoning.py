"""Answers of reasoning models: the answer after the thinking is scored, the thinking is kept in the record.

A reply's thinking comes one of two ways. A server with a reasoning parser (vLLM's ``--reasoning-parser``) sends
it apart from the text, as the delta's ``reasoning`` (formerly ``reasoning_content``), which the client keeps in
``RequestResult.reasoning``. Without one the thinking sits inside the text, before the configuration's
end-of-thinking marker (``think_end``, ``</think>`` by default). The answer is then:

- separated thinking: the text (after the last marker, should the text still hold one);
- inline thinking: the text after the *last* marker (the thinking before it may recite a few-shot example's
  ``#### 72``, which a first-match extraction would score: lm-eval-harness issue #3438, its ``think_end_token``
  and PR #3675; lighteval's ``--remove-reasoning-tags``);
- thinking that never ended (an opening tag without a closing marker, or separated thinking with no text after
  it, as when ``max_tokens`` runs out mid-thought): no answer, counted as such, never scored from inside the
  thinking.

A reply without thinking is scored on its whole text, as before. A chat template that opens the thinking in the
prompt (the reply holds ``</think>`` but no ``<think>``) is handled by the last-marker rule once it closes; if it
never closes, nothing in the reply says it was thinking and it is scored whole.
"""
from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from typing import Any, Iterable, Literal

#: The end-of-thinking marker of the Qwen3 / DeepSeek-R1 families (``ServeConfig.think_end``'s default).
DEFAULT_THINK_END = "</think>"
#: Reasoning text up to this many characters is kept whole in an item; longer, its length and sha256.
KEEP_REASONING_CHARS = 4000
#: A GSM8K strict-flexible gap above this many points is flagged as a likely extraction problem: on ordinary
#: answers the two agree to within a few points (a model that ends with "#### n" is read alike by both).
GAP_POINTS = 5.0

ThinkState = Literal["none", "answered", "unclosed"]


@dataclass(frozen=True)
class Reply:
    """One reply split at its thinking.

    ``answer``: the text to score (None when the thinking never ended). ``thinking``: the reasoning text, separated
    or inline ("" when none). ``state``: ``none`` (no thinking), ``answered`` (an answer after thinking),
    ``unclosed`` (the thinking never ended: no answer). ``answer_at``: where the answer starts in the reply's text
    (characters; 0 without inline thinking), for attributing tokens.
    """

    answer: str | None
    thinking: str
    state: ThinkState
    answer_at: int = 0


def think_start(think_end: str) -> str | None:
    """The opening tag of an XML-like end marker (``</think>`` -> ``<think>``), None for any other marker."""
    m = re.fullmatch(r"</([^<>/\s]+)>", think_end)
    return f"<{m.group(1)}>" if m else None


def split_reply(text: str, reasoning: str = "", think_end: str = DEFAULT_THINK_END) -> Reply:
    """Split a reply into its thinking and the answer to score (see the module docstring for the rules).

    Args:
        text: the reply's text (``content``).
        reasoning: the thinking the server sent apart ("" when none).
        think_end: the configuration's end-of-thinking marker (non-empty).
    Raises:
        ValueError: ``think_end`` is empty.
    """
    if not think_end:
        raise ValueError("think_end must be a non-empty marker")
    start = think_start(think_end)
    cut = text.rfind(think_end)
    if cut >= 0:
        head = text[:cut]
        if start and start in head:
            head = head[head.find(start) + len(start):]
        thinking = reasoning + head if reasoning else head
        at = cut + len(think_end)
        return Reply(text[at:], thinking.strip(), "answered", at)
    if start and start in text:  # opened in the text, never closed
        return Reply(None, (reasoning + text[text.find(start) + len(start):]).strip(), "unclosed")
    if reasoning:
        return Reply(text, reasoning.strip(), "answered") if text.strip() else Reply(None, reasoning.strip(), "unclosed")
    return Reply(text, "", "none")


def thinking_tokens(res: Any, reply: Reply) -> int | None:
    """Tokens the reply spent thinking, or None when unknown.

    Separated thinking: the tokens of the chunks before the first text (the client counts them; vLLM sends the
    <think> and </think> tokens in chunks of an empty delta).
    Inline: the tokens of the chunks up to the one that completed the end marker (``chunk_chars``). An unclosed
    inline thinking: every output token.

    Args:
        res: a ``validate.client.RequestResult`` (``reasoning_tokens``, ``chunk_tokens``, ``chunk_chars``,
            ``output_tokens``).
    """
    if reply.state == "none":
        return 0
    if res.reasoning:
        if not reply.answer_at:
            return res.reasoning_tokens
        before = _tokens_before(res, reply.answer_at)  # a marker in the text as well: its tokens are thinking too
        return None if before is None else res.reasoning_tokens + before
    if reply.state == "unclosed":
        return res.output_tokens
    return _tokens_before(res, reply.answer_at)


def _tokens_before(res: Any, at: int) -> int | None:
    chars, toks = getattr(res, "chunk_chars", None), res.chunk_tokens
    if not chars or len(chars) != len(toks):
        return None
    seen = spent = 0
    for c, n in zip(chars, toks):
        if seen >= at:
            break
        seen += c
        spent += n
    return spent


def item_fields(res: Any, reply: Reply) -> dict[str, Any]:
    """What an eval item records of a reply's thinking: ``finish_reason`` always; with thinking, ``thinking``
    (its state), ``reasoning`` (the text, when at most :data:`KEEP_REASONING_CHARS`) or ``reasoning_chars`` and
    ``reasoning_sha256`` (of the UTF-8 text), ``thinking_tokens`` and ``answer_tokens`` (None where unknown)."""
    out: dict[str, Any] = {"finish_reason": res.finish_reason}
    if reply.state == "none":
        return out
    out["thinking"] = reply.state
    if len(reply.thinking) <= KEEP_REASONING_CHARS:
        out["reasoning"] = reply.thinking
    else:
        out["reasoning_chars"] = len(reply.thinking)
        out["reasoning_sha256"] = hashlib.sha256(reply.thinking.encode()).hexdigest()
    spent = thinking_tokens(res, reply)
    out["thinking_tokens"] = spent
    out["answer_tokens"] = (res.output_tokens - spent if spent is not None and res.output_tokens is not None
                            else None)
    return out


def tally(items: Iterable[Any], think_end: str) -> dict[str, Any]:
    """The thinking figures of a record's metrics: ``after_thinking`` (answers that came after thinking),
    ``unclosed_thinking`` (replies whose thinking never ended: no answer) and the ``think_end`` marker used."""
    states = [getattr(i, "thinking", None) for i in items]
    return {"after_thinking": states.count("answered"), "unclosed_thinking": states.count("unclosed"),
            "think_end": think_end}


def thinks(rec: Any) -> bool:
    """Whether a record's model thought: some reply of it had thinking (its metrics, else its items)."""
    m = rec.metrics or {}
    if "after_thinking" in m:
        return bool(m.get("after_thinking") or m.get("unclosed_thinking"))
    return any(getattr(i, "thinking", None) in ("answered", "unclosed") for i in rec.items)


def pairing_reasons(base: Any, cand: Any) -> list[str]:
    """Why two eval records' thinking forbids pairing them: one thinks and the other does not (the scores are of
    different answers: a false regression or improvement), or their end-of-thinking markers differ (the answers
    were cut from the replies differently). A record made before the thinking figures counts as not thinking."""
    out = []
    tb, tc = thinks(base), thinks(cand)
    if tb != tc:
        who, other = ("candidate", "baseline") if tc else ("baseline", "candidate")
        out.append(f"the {who} thinks and the {other} does not: their answers are not scored alike (thinking "
                   "against no thinking)")
    eb, ec = (base.metrics or {}).get("think_end"), (cand.metrics or {}).get("think_end")
    if eb is not None and ec is not None and eb != ec:
        out.append(f"end-of-thinking markers differ ({eb!r} vs {ec!r})")
    return out


@dataclass
class ThinkingRow:
    """One eval record's thinking figures for the release notes (shares are fractions of ``n``; None where the
    record predates them)."""

    config: str
    suite: str
    n: int
    after_thinking: int | None
    unclosed: int | None
    think_end: str | None
    gap_points: float | None = None  # GSM8K: flexible - strict accuracy, percentage points
    gap_flagged: bool = False
    gap_limit: float = GAP_POINTS

    @property
    def thought(self) -> bool:
        return bool(self.after_thinking or self.unclosed)

    @property
    def after_share(self) -> float | None:
        return None if self.after_thinking is None or not self.n else self.after_thinking / self.n

    @property
    def unclosed_share(self) -> float | None:
        return None if self.unclosed is None or not self.n else self.unclosed / self.n


def thinking_rows(by_kind: dict[str, dict[str, Any]]) -> list[ThinkingRow]:
    """Per configuration, a row for each of its GSM8K, HumanEval and strict-sanity records (``by_kind``: config
    -> suite kind -> record). Sanity's figures are of its solo answers (``prompts``); a GSM8K strict-flexible gap above
    :data:`GAP_POINTS` is flagged (any record, thinking or not)."""
    rows = []
    for cfg, kinds in by_kind.items():
        for kind in ("gsm8k", "humaneval", "strict-sanity"):
            rec = kinds.get(kind)
            if rec is None or not rec.metrics:
                continue
            m = rec.metrics
            n = (m.get("prompts") if kind == "strict-sanity" else m.get("n")) or 0
            row = ThinkingRow(cfg, rec.suite, n, m.get("after_thinking"), m.get("unclosed_thinking"), m.get("think_end"))
            if kind == "gsm8k" and m.get("accuracy_strict") is not None and m.get("accuracy_flexible") is not None:
                row.gap_points = round(100 * (m["accuracy_flexible"] - m["accuracy_strict"]), 2)
                row.gap_flagged = abs(row.gap_points) > GAP_POINTS
            rows.append(row)
    return rows

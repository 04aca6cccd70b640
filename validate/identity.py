"""Greedy outputs against the baseline, token by token: which answers a release changed, and where.

Two releases served by the same model with greedy decoding give the same tokens wherever their kernels compute the
same numbers in the same order; a kernel that sums bf16 in another order moves a logit by a rounding and can flip an
argmax at some step, after which the two answers part for good. So the share of answers that stay identical, and the
first token at which the others part, say whether a dispatch change is exact and, if not, how early its roundings
reach the output. This is a figure beside the gates, never a gate: a random-weight model's noise parts at a tie as
easily as a real one, and accuracy is what the paired gate judges (validate.compare).

Records are paired as the gates pair them (validate.pairing.match_records: by suite name, a renamed suite by kind
where that is unambiguous); a candidate record the baseline has no record for, or whose record on either side
failed its audit or was made by another tree than the one under validation, gives a row that says why it was not
compared. Two records are compared only when the pairing rule allows (validate.pairing.apart with every suite
parameter that can move an answer: the same model, configuration as run and parameters, since concurrency or
batching alone can move a greedy answer; the plugin's knobs may differ, the machine and the metrics formula too).

An answer is compared with the baseline's answer to the same item (same id, prompt hash and condition, same
generation parameters, both greedy, neither an error, some output on one side at least, its id once on each side,
or once in its condition where a record repeats it across conditions);
a baseline answer the candidate has no item for is counted as left out too. Identical means the same token ids, the
same text and the same thinking (its text or digest, and whether it ended). A row is compared by token where any of its pairs holds token ids on both sides
(an empty list is none: a server that ignores ``return_token_ids`` returns one), and a pair of it without them is
left out; else by character, the thinking kept in the item (validate.reasoning) before the answer (a thinking kept
only as a digest parts at character 0 when the digests differ: somewhere in it).

Rows: answers to one prompt at a time (strict sanity's and long answers' solo answers; an eval run at concurrency
1) are the kernels' figure. Answers batched as the server scheduled them (sanity's overload batches, long answers
beside decode load: "under load"; an eval's answers at a concurrency above 1: "batched") can part between two runs
of one tree, since a batch's composition picks the kernels' tiles, so each is a row of its own.

Where two answers compared by token part, each side's top two at the first token apart (the items' ``top2``,
validate.margins) give the parting's margins, and a near-tie (within what bf16 rounding of the logits can flip) is
told from a clear parting (validate.margins.classify states the rule and its source); a record whose values are
logprobs, or of an unknown mode, shows the margins and classifies nothing. :func:`compare_with_solo` does the same
within one record: each answer under load against the same prompt's solo answer (batch invariance).
"""
from __future__ import annotations

import statistics
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

from validate.margins import CLEAR, NEAR_TIE, Parting, classify
from validate.pairing import NON_SCORING_PARAMS, apart, match_records
from validate.record import Item, Record

#: The suite kinds whose items are greedy answers to fixed prompts (the ones compared).
IDENTITY_KINDS = ("strict-sanity", "long-answers", "gsm8k", "humaneval")


class PartingCounts:
    """The partings of a row (``self.partings``: (item id, validate.margins.Parting)) counted by kind."""

    partings: list[tuple[str, Parting]]

    @property
    def near_ties(self) -> int:
        """Partings within bf16 rounding of the logits on both sides (validate.margins)."""
        return sum(p.kind == NEAR_TIE for _, p in self.partings)

    @property
    def clear(self) -> list[tuple[str, Parting]]:
        """The partings wider than rounding: findings, by item id."""
        return [(i, p) for i, p in self.partings if p.kind == CLEAR]

    @property
    def unclassified(self) -> dict[str, int]:
        """Partings not classified, counted by why (no top two there, logprob values, an unknown mode...)."""
        return dict(Counter(p.why for _, p in self.partings if p.kind is None))

    @property
    def largest_margin(self) -> float | None:
        """The largest margin (top1 - top2, either side) at any parting, None where none has one."""
        ms = [p.largest_margin for _, p in self.partings if p.largest_margin is not None]
        return max(ms) if ms else None


@dataclass
class OutputIdentity(PartingCounts):
    """One (configuration, suite) of a candidate against the baseline's record of it.

    ``n``: answers compared; ``identical``: those equal token for token (or character for character where the
    records hold no token ids); ``first_apart``: for each of the others, the index of the first token (or character)
    that differs, 0-based, sorted; ``unit``: "token" or "character"; ``left_out``: answers not compared, counted by
    why (no such item in the baseline, only in the baseline, a duplicate item id, another prompt or condition, other
    generation parameters, not greedy, an error on either side, no output on both sides, no token ids on one side);
    ``refused``: why the records were not compared at all."""

    config: str
    suite: str
    kind: str
    part: str = ""  # :data:`PARTS`: "" (one prompt at a time), "solo", "batched" or "under load"
    n: int = 0
    identical: int = 0
    first_apart: list[int] = field(default_factory=list)
    unit: str = "token"
    left_out: dict[str, int] = field(default_factory=dict)
    refused: str | None = None  # why the two records were not compared at all (validate.pairing.apart)
    # (item id, its parting) for each answer compared by token that parts (validate.margins.Parting), by item
    partings: list[tuple[str, Parting]] = field(default_factory=list)

    @property
    def share(self) -> float | None:
        """Identical answers over answers compared, None when none was."""
        return self.identical / self.n if self.n else None

    @property
    def median_apart(self) -> float | None:
        """The median first index apart of the answers that differ, None when none does."""
        return statistics.median(self.first_apart) if self.first_apart else None


def first_apart(a: list | str, b: list | str) -> int | None:
    """The first index at which sequences ``a`` and ``b`` differ (the shorter one's length when it is a prefix of
    the other), None when they are equal."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


#: The rows of a record, in the order shown (:func:`part_of`).
PARTS = ("", "solo", "batched", "under load")


def _greedy(gen: dict) -> bool:
    t = gen.get("temperature")
    return type(t) in (int, float) and t == 0  # a flag (False) or a text is no temperature


def _why_not(c: Item, b: Item | None, dup: bool, cpart: str, bpart: str) -> str | None:
    if dup:
        return "a duplicate item id"
    if b is None:
        return "no such item in the baseline"
    if c.prompt_hash != b.prompt_hash or c.condition != b.condition or cpart != bpart:
        return "another prompt or condition"
    if c.gen != b.gen:
        return "other generation parameters"
    if not _greedy(c.gen):
        return "not greedy"
    if c.error or b.error or c.output is None or b.output is None:
        return "an error on either side"
    tc, tb = _thinking(c), _thinking(b)
    if tc is None or tb is None:
        return "a thinking field of no kind"
    if not (c.output or c.token_ids or tc[2]) and not (b.output or b.token_ids or tb[2]):
        return "no output on both sides"
    return None


def _thinking(it: Item) -> tuple | None:
    """The thinking an item keeps (validate.reasoning.item_fields), as (its state, "text" and the text, or "sha256",
    the digest and the length in characters); ("", "text", "") where it keeps none; None where a field of it is of
    no kind a runner writes (compared, it could only hide a difference)."""
    state, text = getattr(it, "thinking", None), getattr(it, "reasoning", None)
    digest, chars = getattr(it, "reasoning_sha256", None), getattr(it, "reasoning_chars", None)
    if state is not None and not isinstance(state, str):
        return None
    if text is not None:
        return (state or "", "text", text) if isinstance(text, str) else None
    if digest is not None:
        ok = isinstance(digest, str) and type(chars) is int and chars >= 0
        return (state or "", "sha256", digest, chars) if ok else None
    return (state or "", "text", "")


def _chars_apart(c: Item, b: Item, tc: tuple, tb: tuple) -> int | None:
    """The first character apart of the thinking (``tc``, ``tb``: :func:`_thinking`) then the answer, counted over
    the thinking's characters then the answer's; where a thinking kept as a digest differs, 0 (somewhere in it: a
    lower bound), and where the two end their thinking in other states (one answered, one never closed), the end
    of the thinking."""
    if tc[1:] != tb[1:]:
        return first_apart(tc[2], tb[2]) if tc[1] == tb[1] == "text" else 0
    length = len(tc[2]) if tc[1] == "text" else tc[3]
    if tc[0] != tb[0]:
        return length
    i = first_apart(c.output or "", b.output or "")
    return None if i is None else length + i


def part_of(item: Item, record: Record | None = None) -> str:
    """The row an item's answer counts in (:data:`PARTS`): "under load" where it names a condition other than
    "solo"; else "batched" where its record ran at a concurrency other than 1 (or one of no kind: not taken for
    one at a time); else "solo" where it names that condition, else ""."""
    if item.condition and item.condition != "solo":
        return "under load"
    params = record.params if record is not None and isinstance(record.params, dict) else {}
    conc = params.get("concurrency", 1)
    if type(conc) is not int or conc != 1:
        return "batched"
    return "solo" if item.condition == "solo" else ""


def _keys(*records: Record) -> Callable[[Item], object]:
    """How items pair: by id, and by (id, condition) for an id that some record holds more than once (strict
    sanity's records written before its long-prefill batches had ids of their own hold each such id once per
    condition); an id repeated within one condition stays a duplicate."""
    repeated = {i for r in records for i, k in Counter(it.id for it in r.items).items() if k > 1}
    return lambda it: (it.id, it.condition) if it.id in repeated else it.id


def compare_outputs(cand: Record, base: Record, part: str | None = None) -> OutputIdentity:
    """The candidate record's answers against the baseline record's, item by item (module docstring); with
    ``part`` (one of :data:`PARTS`), only the answers of that part (:func:`part_of`) on either side.

    Raises ValueError when the two records are not of one configuration and suite kind."""
    if (cand.config, cand.suite_kind) != (base.config, base.suite_kind):
        raise ValueError(f"{cand.config}/{cand.suite} and {base.config}/{base.suite} are not one configuration "
                         f"and suite kind")
    key = _keys(cand, base)
    by_id = {key(it): it for it in base.items}
    dups = {i for r in (base, cand) for i, k in Counter(key(it) for it in r.items).items() if k > 1}
    out = OutputIdentity(cand.config, cand.suite, cand.suite_kind, part=part or "")

    def why_left(why: str) -> None:
        out.left_out[why] = out.left_out.get(why, 0) + 1

    pairs = []
    for c in cand.items:
        cpart = part_of(c, cand)
        if part is not None and cpart != part:
            continue
        b = by_id.get(key(c))
        why = _why_not(c, b, key(c) in dups, cpart, part_of(b, base) if b is not None else cpart)
        if why:
            why_left(why)
        else:
            pairs.append((c, b))
    mine = {key(it) for it in cand.items if part is None or part_of(it, cand) == part}
    for b in base.items:
        if key(b) not in mine and (part is None or part_of(b, base) == part):
            why_left("only in the baseline")
    by_tokens = any(c.token_ids and b.token_ids for c, b in pairs)
    out.unit = "token" if by_tokens else "character"
    for c, b in pairs:
        if by_tokens:
            if not (c.token_ids and b.token_ids):
                why_left("no token ids on one side")
                continue
            i = first_apart(c.token_ids, b.token_ids)
            if i is None and (c.output != b.output or _thinking(c) != _thinking(b)):
                i = len(c.token_ids)  # the same ids read back as other text: apart at the end
        else:
            i = _chars_apart(c, b, _thinking(c), _thinking(b))
        out.n += 1
        if i is None:
            out.identical += 1
        else:
            out.first_apart.append(i)
            if by_tokens:
                out.partings.append((c.id, classify(i, _sides(c), _sides(b))))
    out.first_apart.sort()
    return out


def _sides(it: Item) -> dict:
    """What validate.margins.classify reads of an item."""
    return {"top2": it.top2, "token_ids": it.token_ids, "logprobs_mode": it.logprobs_mode, "gen": it.gen}


@dataclass
class SoloIdentity(PartingCounts):
    """One record's answers under load against its own solo answers to the same prompts (batch invariance).

    ``n``: answers under load compared (by token ids: both sides hold them, neither an error); ``identical``:
    those equal to their solo answer token for token and in text; ``first_apart``: sorted first tokens apart of
    the others; ``partings``: (item id, validate.margins.Parting) of each; ``left_out``: counted by why."""

    config: str
    suite: str
    n: int = 0
    identical: int = 0
    first_apart: list[int] = field(default_factory=list)
    partings: list[tuple[str, Parting]] = field(default_factory=list)
    left_out: dict[str, int] = field(default_factory=dict)

    @property
    def share(self) -> float | None:
        """Identical answers over answers compared, None when none was."""
        return self.identical / self.n if self.n else None

    @property
    def median_apart(self) -> float | None:
        """The median first token apart of the answers that part, None when none does."""
        return statistics.median(self.first_apart) if self.first_apart else None


def compare_with_solo(rec: Record) -> SoloIdentity | None:
    """Each answer under load of ``rec`` (a condition other than "solo") against the solo answer to the same prompt
    (the item of condition "solo" with its prompt hash), token by token, with the margins at each parting
    (:func:`validate.margins.classify`, the solo answer as the baseline's side). None for a record without both
    solo answers and answers under load."""
    solo: dict[str, list[Item]] = {}
    for it in rec.items:
        if it.condition == "solo":
            solo.setdefault(it.prompt_hash, []).append(it)
    load = [it for it in rec.items if it.condition and it.condition != "solo"]
    if not solo or not load:
        return None
    out = SoloIdentity(rec.config, rec.suite)

    def why_left(why: str) -> None:
        out.left_out[why] = out.left_out.get(why, 0) + 1

    for it in load:
        refs = solo.get(it.prompt_hash, [])
        if len(refs) != 1:
            why_left("no solo answer to its prompt" if not refs else "several solo answers to its prompt")
            continue
        ref = refs[0]
        if it.error or ref.error:
            why_left("an error on either side")
        elif not (it.token_ids and ref.token_ids):
            why_left("no token ids on one side")
        elif it.gen != ref.gen:
            why_left("other generation parameters")
        else:
            i = first_apart(it.token_ids, ref.token_ids)
            if i is None and (it.output != ref.output or _thinking(it) != _thinking(ref)):
                i = len(it.token_ids)
            out.n += 1
            if i is None:
                out.identical += 1
            else:
                out.first_apart.append(i)
                out.partings.append((it.id, classify(i, _sides(it), _sides(ref))))
    out.first_apart.sort()
    return out


#: Suite parameters that judge or select answers but cannot move one (an item's prompt, condition and generation
#: parameters are compared item by item): sandbox workers and timeouts, the extraction scored, the subset's size
#: (items pair by id) and gate thresholds.
NON_ANSWER_PARAMS = NON_SCORING_PARAMS | {"timeout_s", "primary", "limit", "min_solo_right_share"}


def compare_releases_outputs(cand: list[Record], base: list[Record], kinds: tuple[str, ...] = IDENTITY_KINDS,
                             stands: Callable[[Record], str | None] | None = None) -> list[OutputIdentity]:
    """Every candidate record of ``kinds`` against the baseline record the gates pair it with
    (validate.pairing.match_records), in the candidate's order: its rows (:func:`compare_outputs`, one per
    :data:`PARTS` its items or the baseline's fall in), or one row saying why it was not compared (no baseline
    record, an ambiguous rename, no answers on its side, a record that failed its audit, what ``stands`` says of a
    candidate record, such as another tree having made it, or :func:`validate.pairing.apart` with every suite
    parameter but :data:`NON_ANSWER_PARAMS`, and not the metrics formula version, which moves no answer). A
    record without answers beside a baseline record without answers gives no row."""
    out = []
    mine = [r for r in cand if r.suite_kind in kinds]
    for p in match_records(mine, [r for r in base if r.suite_kind in kinds]).pairs:
        r, b = p.cand, p.base
        if not r.items and (b is None or not b.items):
            continue
        why = [p.refused] if p.refused else []
        if b is None and not why:
            why = ["the baseline has no record of this suite"]
        if not r.items:
            why.append("the record holds no answers")
        if getattr(r, "audit_failed", None):
            why.append(f"the record failed its audit: {r.audit_failed}")
        if stands is not None and stands(r):
            why.append(stands(r))
        if b is not None and getattr(b, "audit_failed", None):
            why.append(f"the baseline's record failed its audit: {b.audit_failed}")
        if b is not None and not why:
            pb, pc = (x.params if isinstance(x.params, dict) else {} for x in (b, r))
            why = apart(b, r, params=sorted((set(pb) | set(pc)) - NON_ANSWER_PARAMS), machine=False, formula=False)
        if why:
            out.append(OutputIdentity(r.config, r.suite, r.suite_kind, refused="; ".join(why)))
            continue
        parts = {part_of(it, r) for it in r.items} | {part_of(it, b) for it in b.items}
        out += [compare_outputs(r, b, x) for x in PARTS if x in parts]
    return out

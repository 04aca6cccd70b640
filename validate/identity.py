"""Greedy outputs against the baseline, token by token: which answers a release changed, and where.

Two releases served by the same model with greedy decoding give the same tokens wherever their kernels compute the
same numbers in the same order; a kernel that sums bf16 in another order moves a logit by a rounding and can flip an
argmax at some step, after which the two answers part for good. So the share of answers that stay identical, and the
first token at which the others part, say whether a dispatch change is exact and, if not, how early its roundings
reach the output. This is a figure beside the gates, never a gate: a random-weight model's noise parts at a tie as
easily as a real one, and accuracy is what the paired gate judges (validate.compare).

An answer is compared with the baseline's answer to the same item (same id and prompt hash, same generation
parameters, both greedy, neither an error, its id once on each side). Identical means the same token ids and the
same text; where every answer of a row holds token ids on both sides (an empty list is none: a server that ignores
``return_token_ids`` returns one), the place apart is a token index, else a character index. Two records are
compared only when the pairing rule allows (validate.pairing.apart with every suite parameter: the same model,
configuration as run and parameters, since concurrency or batching alone can move a greedy answer; the plugin's
knobs may differ, the machine too). Answers under load (strict sanity's overload batches, long answers beside
decode load) are batched as the server scheduled them, so they can part between two runs of one tree: a record
whose items name a condition gives a row of its solo answers (the kernels' figure) and a row of those under load.
"""
from __future__ import annotations

import statistics
from collections import Counter
from dataclasses import dataclass, field

from validate.pairing import apart
from validate.record import Item, Record

#: The suite kinds whose items are greedy answers to fixed prompts (the ones compared).
IDENTITY_KINDS = ("strict-sanity", "long-answers", "gsm8k", "humaneval")


@dataclass
class OutputIdentity:
    """One (configuration, suite) of a candidate against the baseline's record of it.

    ``n``: answers compared; ``identical``: those equal token for token (or character for character where the
    records hold no token ids); ``first_apart``: for each of the others, the index of the first token (or character)
    that differs, 0-based, sorted; ``unit``: "token" or "character"; ``left_out``: items of the candidate not
    compared, each with why (no such item in the baseline, a duplicate item id, another prompt, other generation
    parameters, not greedy, an error or no output on either side); ``refused``: why the records were not compared
    at all."""

    config: str
    suite: str
    kind: str
    part: str = ""  # "solo" or "under load" where the items name a condition, else ""
    n: int = 0
    identical: int = 0
    first_apart: list[int] = field(default_factory=list)
    unit: str = "token"
    left_out: dict[str, int] = field(default_factory=dict)
    refused: str | None = None  # why the two records were not compared at all (validate.pairing.apart)

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


def _why_not(c: Item, b: Item | None, dup: bool) -> str | None:
    if dup:
        return "a duplicate item id"
    if b is None:
        return "no such item in the baseline"
    if c.prompt_hash != b.prompt_hash:
        return "another prompt"
    if c.gen != b.gen:
        return "other generation parameters"
    if c.gen.get("temperature", None) != 0:
        return "not greedy"
    if c.error or b.error or c.output is None or b.output is None:
        return "an error or no output on either side"
    return None


def part_of(item: Item) -> str:
    """The row an item's answer counts in: "" (no condition), "solo", or "under load" (any other condition)."""
    return "" if not item.condition else "solo" if item.condition == "solo" else "under load"


def compare_outputs(cand: Record, base: Record, part: str | None = None) -> OutputIdentity:
    """The candidate record's answers against the baseline record's, item by item (module docstring); with
    ``part``, only the candidate's items of that part (:func:`part_of`).

    Raises ValueError when the two records are not of one configuration and suite kind."""
    if (cand.config, cand.suite_kind) != (base.config, base.suite_kind):
        raise ValueError(f"{cand.config}/{cand.suite} and {base.config}/{base.suite} are not one configuration "
                         f"and suite kind")
    by_id = {it.id: it for it in base.items}
    dups = {i for r in (base, cand) for i, k in Counter(it.id for it in r.items).items() if k > 1}
    out = OutputIdentity(cand.config, cand.suite, cand.suite_kind, part=part or "")
    pairs = []
    for c in cand.items:
        if part is not None and part_of(c) != part:
            continue
        b = by_id.get(c.id)
        why = _why_not(c, b, c.id in dups)
        if why:
            out.left_out[why] = out.left_out.get(why, 0) + 1
        else:
            pairs.append((c, b))
    by_tokens = all(c.token_ids and b.token_ids for c, b in pairs)
    out.unit = "token" if by_tokens else "character"
    for c, b in pairs:
        if by_tokens:
            i = first_apart(c.token_ids, b.token_ids)
            if i is None and c.output != b.output:  # the same ids read back as other text: apart at the end
                i = len(c.token_ids)
        else:
            i = first_apart(c.output, b.output)
        out.n += 1
        if i is None:
            out.identical += 1
        else:
            out.first_apart.append(i)
    out.first_apart.sort()
    return out


def compare_releases_outputs(cand: list[Record], base: list[Record],
                             kinds: tuple[str, ...] = IDENTITY_KINDS) -> list[OutputIdentity]:
    """Every (configuration, suite kind) of ``kinds`` both releases hold, compared (:func:`compare_outputs`), in
    the candidate's order. A kind held twice on one side (two suites of one kind) is compared by suite name."""
    out = []
    base_by = {(r.config, r.suite_kind, r.suite): r for r in base}
    base_kind = {}
    for r in base:
        base_kind.setdefault((r.config, r.suite_kind), []).append(r)
    for r in cand:
        if r.suite_kind not in kinds or not r.items:
            continue
        b = base_by.get((r.config, r.suite_kind, r.suite))
        if b is None and len(base_kind.get((r.config, r.suite_kind), [])) == 1:
            b = base_kind[(r.config, r.suite_kind)][0]
        if b is None or not b.items:
            continue
        pb, pc = (x.params if isinstance(x.params, dict) else {} for x in (b, r))
        why = apart(b, r, params=sorted(set(pb) | set(pc)), machine=False)
        if why:
            out.append(OutputIdentity(r.config, r.suite, r.suite_kind, refused="; ".join(why)))
            continue
        parts = sorted({part_of(it) for it in r.items}, key=["", "solo", "under load"].index)
        out += [compare_outputs(r, b, p if p else None) for p in parts]
    return out

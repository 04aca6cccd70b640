"""Which baseline record each candidate record is compared with, and what the baseline has that the candidate
lacks: one rule for the paired eval gate, the performance gate and the share gates.

A candidate record pairs with the baseline's record of the same configuration and suite name. Where the
baseline has none of that name, a suite renamed between releases pairs by kind: the one baseline record of the
same configuration and suite kind that no candidate record of its name claims, when the candidate also has only
one unclaimed record of that kind there (``gsm8k-cot`` -> ``gsm8k``). Where either side has several, which was
renamed cannot be told: the pair is refused, naming both sides' suites. A baseline record that no candidate
record pairs with is *lacking*: the gate says so by name (validate.verdict turns it into a line that blocks).
"""
from __future__ import annotations

from dataclasses import dataclass, field

from validate.record import Record


@dataclass
class Pair:
    """One candidate record and the baseline record it is compared with (None: the baseline has none).
    ``renamed``: a line saying the two suites' names differ (paired by kind), else "". ``refused``: why no
    baseline record is chosen though the baseline holds records of the kind (ambiguous renames), else ""."""

    cand: Record
    base: Record | None
    renamed: str = ""
    refused: str = ""


@dataclass
class Matching:
    """:func:`match_records`' answer: a :class:`Pair` per candidate record, in its order, and the baseline's
    records no candidate record pairs with (``lacking``), each with whether the candidate holds any record of
    that configuration (``config_run``: else the configuration was not run at all)."""

    pairs: list[Pair] = field(default_factory=list)
    lacking: list[tuple[Record, bool]] = field(default_factory=list)


def match_records(cand: list[Record], base: list[Record], base_config: str | None = None,
                  configs: list[str] | None = None) -> Matching:
    """Pair ``cand`` with ``base`` by the module's rule.

    Args:
        cand, base: the records a gate compares (already filtered to the kinds it judges).
        base_config: the baseline's configuration every candidate record is compared with (``--against-config``);
            None: each with its own configuration's.
        configs: the configurations in scope (``--config``); a lacking baseline record outside them is not said.
    """
    by_name = {(b.config, b.suite): b for b in base}
    out = Matching()
    claimed: set[tuple[str, str]] = set()
    exact: dict[int, Record] = {}
    for i, c in enumerate(cand):
        b = by_name.get((base_config or c.config, c.suite))
        if b is not None:
            exact[i] = b
            claimed.add((b.config, b.suite))
    for i, c in enumerate(cand):
        if i in exact:
            out.pairs.append(Pair(c, exact[i]))
            continue
        bcfg = base_config or c.config
        free = [b for b in base if b.config == bcfg and b.suite_kind == c.suite_kind and (b.config, b.suite) not in claimed]
        mine = [x for j, x in enumerate(cand) if j not in exact and x.config == c.config and x.suite_kind == c.suite_kind]
        if not free:
            out.pairs.append(Pair(c, None))
        elif len(free) == 1 and len(mine) == 1:
            b = free[0]
            claimed.add((b.config, b.suite))
            out.pairs.append(Pair(c, b, renamed=(
                f"{c.config}/{c.suite}: paired with the baseline's {b.config}/{b.suite} (the same suite kind "
                f"{c.suite_kind!r} and configuration; the suite was renamed)")))
        else:
            out.pairs.append(Pair(c, None, refused=(
                f"{c.config}/{c.suite}: the baseline has no record of this name, and which of its suites of kind "
                f"{c.suite_kind!r} on {bcfg} ({', '.join(sorted(b.suite for b in free))}) the candidate's "
                f"({', '.join(sorted(x.suite for x in mine))}) were renamed from cannot be told: refused (give the "
                "suites their baseline's names)")))
    ran = {c.config for c in cand}
    for b in base:
        if (b.config, b.suite) in claimed:
            continue
        if base_config is not None and b.config != base_config:
            continue
        if base_config is None and configs and b.config not in configs:
            continue
        out.lacking.append((b, base_config is not None or b.config in ran))
    return out

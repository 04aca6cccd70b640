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


# --- whether a pair can be compared ------------------------------------------------------------------------

#: What a record's configuration snapshot MAY differ in between two records compared (dotted keys; a key names
#: everything under it): its name and words, how long the engine waits for a launch, the measured run-to-run
#: drift (validate.perfgate.noise_floor takes the smaller), the SLO (the share gate compares SLOs itself), the
#: port, the name clients send, Ray's placement resources, and the named knob sets (the env as run holds a set's
#: effect). Everything else in it (server settings, extra
#: args, memory utilisation, entrypoint, env, model and its dtype, hardware, warm restart, ...) can move the
#: figures and must be the same.
SNAPSHOT_MAY_DIFFER = ("name", "description", "launch_timeout_s", "perf_noise_pct", "slo", "server.port",
                       "model.served_name", "hardware.resources", "knob_sets")
#: Suite parameters that cannot change a score or an answer (how many sandboxes run at once); every other one must
#: match for two evals to be paired (validate.compare) or their answers compared (validate.identity).
NON_SCORING_PARAMS = frozenset({"workers"})
#: What a record's ``versions`` MAY differ in: the plugin under validation and the software stack a release
#: ships with it (vLLM, torch, Python: a release may upgrade them, and the notes list the change). The rest (the
#: CPU model and core count, the GPU driver, and whatever else the record holds) is the machine, and must be the
#: same.
VERSIONS_MAY_DIFFER = ("r9k", "vllm", "torch", "python")
#: What a record's ``hardware`` MAY differ in (Ray's placement resources); kind, GPU count and power cap must not.
HARDWARE_MAY_DIFFER = ("resources",)


def knob_keys() -> tuple[str, ...]:
    """The snapshot keys of r9k's registered knobs (``env.R9K_...``): what the plugin under validation dispatches
    MAY differ between two records compared, as its version may (a release turns a kernel on; r9k against stock
    on one configuration, ``--knobs stock``, is the pair this exists for). Other ``env`` entries must match."""
    from r9k.knobs import KNOBS

    return tuple(f"env.{k}" for k in sorted(KNOBS))


def _flat(d: object, prefix: str = "") -> dict[str, object]:
    """A nested mapping as {dotted key: leaf value}; a non-mapping is one leaf under ``prefix``."""
    if not isinstance(d, dict):
        return {prefix: d} if prefix else {}
    out: dict[str, object] = {}
    for k, v in d.items():
        key = f"{prefix}.{k}" if prefix else str(k)
        if isinstance(v, dict) and v:
            out.update(_flat(v, key))
        else:
            out[key] = v
    return out


def _skipped(key: str, may: tuple[str, ...]) -> bool:
    return any(key == m or key.startswith(m + ".") for m in may)


def _diff(what: str, b: object, c: object, may: tuple[str, ...]) -> str | None:
    fb, fc = _flat(b if isinstance(b, dict) else {}), _flat(c if isinstance(c, dict) else {})
    moved = [k for k in sorted(set(fb) | set(fc)) if not _skipped(k, may) and fb.get(k) != fc.get(k)]
    if not moved:
        return None
    return (f"{what} (" + "; ".join(f"{k}: {fb.get(k)!r} vs {fc.get(k)!r}" for k in moved[:6])
            + (f"; and {len(moved) - 6} more" if len(moved) > 6 else "") + ")")


def apart(b: Record, c: Record, params: tuple[str, ...] | list[str] = (), machine: bool = True,
          configuration: bool = True, formula: bool = True, may_differ: tuple[str, ...] = ()) -> list[str]:
    """Why record ``b`` (baseline) and ``c`` (candidate) cannot be compared, or [] when everything that can move
    their figures is the same: both completed, the same suite kind, the suite parameters ``params``, the metrics
    formula version (unless ``formula`` is False: the greedy answers' table compares outputs, not figures), the
    model, and

    - ``configuration``: the configuration snapshot as run, but for :data:`SNAPSHOT_MAY_DIFFER` (server
      settings, extra args, env, memory utilisation, model and dtype, hardware, ...); False where two
      configurations are compared on purpose (``--against-config`` of the paired evals); ``may_differ``: further
      snapshot keys that may differ (the performance gate across configurations lets ``server.extra_args`` differ,
      the flags that make the two configurations, and checks the rest);
    - ``machine``: the machine, as the records hold it: ``hardware`` (kind, GPU count, power cap; not
      :data:`HARDWARE_MAY_DIFFER`) and ``versions`` (the CPU model and core count, the GPU driver; not
      :data:`VERSIONS_MAY_DIFFER`). False for the paired evals, which judge each question's answer
      (a numerics difference shows as discordant questions, counted both ways); the snapshot's hardware is then
      left out too.

    A key one record holds and the other does not differs (None against its value). The performance gate, the
    share gates, the paired eval gate, the notes' Numbers table, their title and the figures pair by this one
    rule (validate.perfgate.refusal adds what only the performance gate reads)."""
    bad = []
    for label, r in (("baseline", b), ("candidate", c)):
        if r.verdict.status not in ("pass", "fail"):
            bad.append(f"the {label} did not complete ({r.verdict.status})")
    if b.suite_kind != c.suite_kind:
        bad.append(f"other suite kinds ({b.suite_kind} vs {c.suite_kind})")
    pb, pc = (r.params if isinstance(r.params, dict) else {} for r in (b, c))
    diff = [k for k in params if pb.get(k) != pc.get(k)]
    if diff:
        bad.append("suite parameters differ (" + ", ".join(f"{k}: {pb.get(k)!r} vs {pc.get(k)!r}" for k in diff) + ")")
    if formula and b.metrics_formula_version != c.metrics_formula_version:
        bad.append(f"metrics formula version {b.metrics_formula_version} vs {c.metrics_formula_version}")
    if b.model != c.model:  # a faster, smaller model must not hide a slower plugin
        bad.append(f"the model differs ({b.model!r} vs {c.model!r})")
    if configuration:
        for label, r in (("baseline", b), ("candidate", c)):
            s = r.config_snapshot.get("server", {}) if isinstance(r.config_snapshot, dict) else None
            if not isinstance(s, dict):
                bad.append(f"the {label}'s configuration snapshot holds no server settings (server = {s!r:.40})")
        may = SNAPSHOT_MAY_DIFFER + knob_keys() + tuple(may_differ) + (() if machine else ("hardware",))
        why = _diff("the configuration's settings as run differ", b.config_snapshot, c.config_snapshot, may)
        if why:
            bad.append(why)
    if machine:
        hw = _diff("the hardware differs", b.hardware, c.hardware, HARDWARE_MAY_DIFFER)
        vs = _diff("the machine differs", b.versions, c.versions, VERSIONS_MAY_DIFFER)
        bad += [x for x in (hw, vs) if x]
    return bad

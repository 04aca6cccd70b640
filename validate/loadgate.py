"""The share gates: figures with one value a run, which the performance gate's rank test across passes cannot
take, judged as shares of counted events against the baseline's.

- **SLO at the baseline's rate** (arrivals records): the share of requests meeting the SLO in the candidate's
  reference probe at the baseline's SLO rate against the share in the baseline's probe at that rate (the same
  seeded schedule and prompts: validate.runners.arrivals.probe_seed). A candidate that met the SLO at no rate
  where the baseline met it at one is a regression by itself.
- **Speculative-decoding acceptance** (any record whose server speculated): accepted over drafted tokens over
  the suite, from vLLM's counters (``server_metrics.delta.spec_decode``), against the baseline's record of the
  same configuration and suite.
- **Random weights against the noise floor** (a configuration of random weights, validate.config.record_weights:
  its answers are noise, so right answers and garbage are not judged): what such a configuration is judged on
  instead, each against the share of its answers under load that the *baseline's own* record of the same suite
  shows apart from that record's solo answers (the stack's noise floor: greedy answers part under load because a
  batch's composition picks the kernels' tiles and summation order, :func:`divergence_counts`), never against
  zero:

  - *batch invariance* (strict-sanity and long-answers records): the candidate's share of answers under load
    apart from its own solo answers, token by token;
  - *identity with the baseline* (every row of validate.identity for the configuration): the candidate's share
    of answers apart from the baseline's answers to the same items.

  Without a baseline record of the suite there is no noise floor: the share is recorded and the gate is not
  checked (limited).

A figure regresses when its share is lower by more than its threshold (percentage points, the suite file's
``share_gate`` stored in the record; the stricter of the baseline's stored one and the checkout's) and a
one-sided two-proportion z-test gives p < alpha (validate.stats.two_proportion_drop); for the noise-floor figures
the share tested is that of answers identical (to solo, or to the baseline's), so a drop is a rise of the share
apart over the floor, by more than ``divergence_rise_pts``.
The test counts requests
(SLO) or tokens (acceptance) as independent trials; they are not quite (requests of one probe share the server's
queue, tokens of one answer its text), which makes the test readier to call a drop than its alpha says; the
threshold is what keeps identical trees from failing it (the false-positive rate on identical trees is
measured by ``python -m benchmarks.serving.share_gate_fp``, docs/metrics.md).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from validate.config import record_weights
from validate.pairing import apart
from validate.record import Record
from validate.stats import two_proportion_drop

ARRIVALS_KIND = "arrivals"
#: Parameters of an arrivals suite that decide what its shares measure; records that differ in one never compare.
ARRIVALS_MEASURING = ("prompt_tokens", "output_tokens", "burstiness", "probe_min_duration_s", "seed")


class ShareGateSpec(BaseModel):
    """``share_gate`` of a suite file: the drops (percentage points) past which a share may regress."""

    model_config = ConfigDict(extra="forbid")
    slo_share_drop_pts: float = Field(5.0, ge=0, le=100)
    acceptance_drop_pts: float = Field(5.0, ge=0, le=100)
    divergence_rise_pts: float = Field(5.0, ge=0, le=100, description="random weights: the rise over the baseline's "
                                       "noise floor of the share of answers apart (under load from solo, or from "
                                       "the baseline's) past which it may regress")
    alpha: float = Field(0.05, gt=0, lt=1)


@dataclass
class ShareFigure:
    """One share of one configuration and suite, candidate against baseline. ``what``: "slo", "acceptance",
    "divergence" or "identity" (``part``: the validate.identity row). ``x_*`` / ``n_*``: successes (requests meeting
    the SLO, tokens accepted; for the noise-floor figures, answers apart) of trials; ``drop_pts``: how much worse
    the candidate is, percentage points. ``regression``: both conditions of the module docstring hold.
    ``message``: one line saying why."""

    config: str
    suite: str
    what: str
    threshold_pts: float
    alpha: float
    x_base: int = 0
    n_base: int = 0
    x_cand: int = 0
    n_cand: int = 0
    drop_pts: float = 0.0
    p_value: float = 1.0
    rate_per_s: float | None = None
    regression: bool = False
    message: str = ""
    part: str = ""


@dataclass
class ShareComparison:
    """The share gates of one candidate against one baseline: the figures judged, what should have been
    compared and could not (``unpaired``: not-checked), what was not by the run's own reach (``limited``)."""

    candidate: str
    baseline: str
    figures: list[ShareFigure] = field(default_factory=list)
    unpaired: list[str] = field(default_factory=list)
    limited: list[str] = field(default_factory=list)


def spec_of(rec: Record) -> ShareGateSpec | None:
    """The share gate a record stores (None when it stores none or a malformed one)."""
    try:
        return ShareGateSpec.model_validate(rec.share_gate) if rec.share_gate is not None else None
    except ValueError:
        return None


def rule(b: Record, checkout: ShareGateSpec | None) -> ShareGateSpec:
    """The stricter of the baseline's stored share gate and the checkout's (its defaults where neither is set):
    the smaller threshold of each figure, the larger alpha."""
    specs = [s for s in (spec_of(b), checkout) if s is not None] or [ShareGateSpec()]
    return ShareGateSpec(slo_share_drop_pts=min(s.slo_share_drop_pts for s in specs),
                         acceptance_drop_pts=min(s.acceptance_drop_pts for s in specs),
                         divergence_rise_pts=min(s.divergence_rise_pts for s in specs),
                         alpha=max(s.alpha for s in specs))


def _probe_at(rec: Record, rate: float, baseline: str | None = None) -> dict | None:
    """The record's valid probe at ``rate`` (to 1e-6 req/s): its reference probe where it ran one against
    ``baseline`` (the most requests, run for this comparison), else its last valid probe there; None when none."""
    probes = rec.metrics.get("probes") if isinstance(rec.metrics, dict) else None
    hits = [p for p in probes or [] if isinstance(p, dict) and isinstance(p.get("rate_per_s"), (int, float))
            and not isinstance(p.get("rate_per_s"), bool) and abs(p["rate_per_s"] - rate) <= 1e-6 and p.get("valid")]
    ref = rec.metrics.get("reference") if isinstance(rec.metrics, dict) else None
    if baseline is not None and isinstance(ref, dict) and ref.get("release") == baseline:
        mine = [p for p in hits if p.get("reference") is True and p.get("index") == ref.get("probe")]
        if mine:
            return mine[-1]
    return hits[-1] if hits else None


def _count(v: Any) -> int:
    """A count of requests as the record holds it: a whole number >= 0 (not a bool, a float or a string).
    Raises ValueError otherwise."""
    if type(v) is not int or v < 0:
        raise ValueError(f"{v!r} is not a count")
    return v


def _slo(rec: Record) -> dict | None:
    s = rec.metrics.get("slo") if isinstance(rec.metrics, dict) else None
    return {k: v for k, v in s.items() if k != "from"} if isinstance(s, dict) else None


def judge_slo(b: Record, c: Record, spec: ShareGateSpec, baseline: str) -> tuple[ShareFigure | None, str | None]:
    """The SLO share of arrivals record ``c`` against ``b`` (module docstring): (figure, None), or (None, why it
    could not be judged). Never raises for a malformed record."""
    where = f"{c.config}/{c.suite}"
    f = ShareFigure(c.config, c.suite, "slo", spec.slo_share_drop_pts, spec.alpha)
    rate = b.metrics.get("slo_rate_per_s") if isinstance(b.metrics, dict) else None
    if not (isinstance(rate, (int, float)) and not isinstance(rate, bool) and math.isfinite(rate) and rate > 0):
        return None, f"{where}: the baseline {baseline} met the SLO at no rate: there is no rate to compare at"
    f.rate_per_s = float(rate)
    if _slo(b) != _slo(c):
        return None, f"{where}: the SLOs differ ({_slo(b)} vs {_slo(c)}): shares meeting them measure other things"
    search = c.metrics.get("search") if isinstance(c.metrics, dict) else None
    if isinstance(search, dict) and search.get("status") == "none meets":
        probes = c.metrics.get("probes") if isinstance(c.metrics, dict) else None
        invalid = [p for p in probes or [] if isinstance(p, dict) and not p.get("valid")]
        if invalid:  # the client, not the server, may have missed the schedule: no evidence of a slower server
            return None, (f"{where}: no rate met the SLO, but {len(invalid)} of the candidate's probes were not valid "
                          f"(first: {invalid[0].get('why_invalid')}): the search cannot stand")
        f.regression = True
        f.message = (f"a regression: no rate met the SLO (down to the lowest probe), where the baseline {baseline} met "
                     f"it up to {rate:.3g} req/s")
        return f, None
    ref = c.metrics.get("reference") if isinstance(c.metrics, dict) else None
    if not (isinstance(ref, dict) and ref.get("release") == baseline):
        # only the probe run for this comparison is judged: a search probe that happens to sit at the rate would
        # let a record without its reference probe choose the sample it is judged on
        why = (f"its reference probe was at {ref.get('rate_per_s')} req/s of {ref.get('release')}" if isinstance(ref, dict)
               else "it ran no reference probe (run it in the release with this baseline)")
        return None, f"{where}: the candidate holds no reference probe at the baseline's SLO rate {rate:.3g} req/s: {why}"
    mine = [p for p in c.metrics.get("probes") or [] if isinstance(p, dict) and p.get("index") == ref.get("probe")]
    if not mine or not mine[0].get("valid") or mine[0].get("reference") is not True:  # never another in its place
        why = mine[0].get("why_invalid") if mine else "it is missing from the probes"
        return None, (f"{where}: the candidate's reference probe at the baseline's SLO rate {rate:.3g} req/s is not "
                      f"valid ({why})")
    pc = mine[0]
    at = pc.get("rate_per_s")
    if not (isinstance(at, (int, float)) and not isinstance(at, bool) and abs(at - rate) <= 1e-6):
        # a search probe that happens to sit at the baseline's rate is never judged in its place
        return None, (f"{where}: the candidate's reference probe ran at {at!r} req/s, not at the baseline's SLO rate "
                      f"{rate:.3g} req/s: it is not the sample the share is judged on")
    pb = _probe_at(b, rate)
    if pb is None:
        return None, f"{where}: the baseline {baseline} holds no valid probe at its own SLO rate {rate:.3g} req/s"
    try:
        t = two_proportion_drop(_count(pb["good"]), _count(pb["requests"]), _count(pc["good"]), _count(pc["requests"]))
    except (KeyError, TypeError, ValueError) as e:
        return None, f"{where}: the probes at {rate:.3g} req/s cannot be counted ({e})"
    f.x_base, f.n_base, f.x_cand, f.n_cand, f.drop_pts, f.p_value = t.x_base, t.n_base, t.x_cand, t.n_cand, t.drop_pts, t.p_one_sided
    f.regression = t.drop_pts > spec.slo_share_drop_pts and t.p_one_sided < spec.alpha
    share = f"{100 * t.share_base:.1f}% -> {100 * t.share_cand:.1f}% of requests met the SLO at {rate:.3g} req/s"
    f.message = (f"{'a regression: ' if f.regression else ''}{share} ({t.x_base}/{t.n_base} vs {t.x_cand}/{t.n_cand}), "
                 f"a drop of {t.drop_pts:.1f} points (threshold {spec.slo_share_drop_pts:g}), one-sided p = {t.p_one_sided:.3g}"
                 f" (alpha {spec.alpha:g})")
    return f, None


def spec_counts(rec: Record) -> tuple[int, int] | None:
    """(accepted tokens, drafted tokens) of the server's speculative decoding over the suite, or None where the
    record holds none (no speculation, no counters, or counters the record calls impossible)."""
    sm = rec.server_metrics if isinstance(rec.server_metrics, dict) else {}
    d = sm.get("delta") if isinstance(sm.get("delta"), dict) else {}
    sd = d.get("spec_decode") if isinstance(d.get("spec_decode"), dict) else None
    if sd is None or d.get("impossible"):
        return None
    a, n = sd.get("accepted_tokens"), sd.get("draft_tokens")
    if not all(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v >= 0 for v in (a, n)):
        return None
    return (int(round(a)), int(round(n))) if n >= 1 and a <= n else None


def judge_acceptance(b: Record, c: Record, spec: ShareGateSpec, baseline: str) -> tuple[ShareFigure | None, str | None]:
    """The speculative-decoding acceptance of ``c`` against ``b`` (module docstring): (figure, None), (None, why
    not judged), or (None, None) where neither side speculated."""
    where = f"{c.config}/{c.suite}"
    kb, kc = spec_counts(b), spec_counts(c)
    if kb is None and kc is None:
        return None, None
    if kb is None:
        return None, f"{where}: the candidate's server speculated and the baseline {baseline}'s record holds no counts"
    if kc is None:
        return None, (f"{where}: the baseline {baseline}'s server speculated ({kb[0]:,} of {kb[1]:,} draft tokens "
                      "accepted) and the candidate's record holds no speculative-decoding counts")
    t = two_proportion_drop(kb[0], kb[1], kc[0], kc[1])
    f = ShareFigure(c.config, c.suite, "acceptance", spec.acceptance_drop_pts, spec.alpha, t.x_base, t.n_base,
                    t.x_cand, t.n_cand, t.drop_pts, t.p_one_sided)
    f.regression = t.drop_pts > spec.acceptance_drop_pts and t.p_one_sided < spec.alpha
    f.message = (f"{'a regression: ' if f.regression else ''}draft acceptance {100 * t.share_base:.1f}% -> "
                 f"{100 * t.share_cand:.1f}% ({t.x_base:,}/{t.n_base:,} vs {t.x_cand:,}/{t.n_cand:,} tokens), "
                 f"a drop of {t.drop_pts:.1f} points (threshold {spec.acceptance_drop_pts:g}), one-sided p = "
                 f"{t.p_one_sided:.3g} (alpha {spec.alpha:g})")
    return f, None


#: Suite kinds whose records hold answers under load beside the same prompts' solo answers (the noise floor).
DIVERGENCE_KINDS = ("strict-sanity", "long-answers")
#: The words of a figure not checked for want of a noise floor (the verdict lists it as limited).
NO_FLOOR = "not checked (no noise floor)"


def random_weights(rec: Record) -> bool:
    """The record's configuration serves random weights, as its configuration snapshot gives it
    (validate.config.record_weights; a claim the snapshot does not give is not believed)."""
    return record_weights(rec)[0] == "random"


def divergence_counts(rec: Record) -> tuple[int, int] | None:
    """(answers under load apart from their prompt's solo answer, answers under load compared) of a record of
    :data:`DIVERGENCE_KINDS`, from its items (never from its flags or metrics): each answer under load (condition
    not "solo") without an error is compared with the solo answer of the same prompt (same ``prompt_hash``, no
    error) by token ids, text and kept thinking. None where no answer could be compared."""
    if rec.suite_kind not in DIVERGENCE_KINDS:
        return None
    solo = {i.prompt_hash: i for i in rec.items if i.condition == "solo" and i.error is None}
    apart_n = n = 0
    for i in rec.items:
        ref = solo.get(i.prompt_hash)
        if i.condition == "solo" or i.error is not None or ref is None:
            continue
        n += 1
        apart_n += (i.token_ids, i.output, getattr(i, "reasoning", None) or "") != (
            ref.token_ids, ref.output, getattr(ref, "reasoning", None) or "")
    return (apart_n, n) if n else None


def floor_gated(r: Record) -> bool:
    """The record's divergent share under load is judged against a noise floor (random weights, a kind of
    :data:`DIVERGENCE_KINDS`)."""
    return r.suite_kind in DIVERGENCE_KINDS and random_weights(r)


def _apart_text(k: tuple[int, int] | None, against: str) -> str:
    return f"{k[0]} of {k[1]} answers{against}" if k else f"no answers{against}"


def judge_divergence(b: Record, c: Record, spec: ShareGateSpec, baseline: str) -> tuple[ShareFigure | None, str | None]:
    """Batch invariance of random weights (module docstring): the candidate's answers under load apart from its
    solo answers against the baseline's own share. (figure, None), or (None, why not judged)."""
    where = f"{c.config}/{c.suite}"
    kb, kc = divergence_counts(b), divergence_counts(c)
    if kc is None:
        return None, f"{where}: the candidate's record holds no answer under load beside its solo answer"
    if kb is None:
        return None, (f"{where}: the divergent share under load is {NO_FLOOR}: the baseline {baseline}'s record holds "
                      f"no answer under load beside its solo answer; {_apart_text(kc, ' under load apart from solo')}")
    return floor_figure(c.config, c.suite, "divergence", "", kc, kb, spec, baseline,
                        "answers under load apart from their solo answers"), None


def floor_figure(config: str, suite: str, what: str, part: str, cand: tuple[int, int], floor: tuple[int, int],
                 spec: ShareGateSpec, baseline: str, said: str) -> ShareFigure:
    """The figure of ``cand`` (answers apart, answers compared) against the noise floor ``floor`` (the baseline's
    answers under load apart from its solo answers, compared): a regression when the share apart rises over the
    floor's by more than ``spec.divergence_rise_pts`` and the one-sided two-proportion test of the identical shares
    gives p < ``spec.alpha`` (validate.stats.two_proportion_drop)."""
    (xc, nc), (xb, nb) = cand, floor
    t = two_proportion_drop(nb - xb, nb, nc - xc, nc)
    f = ShareFigure(config, suite, what, spec.divergence_rise_pts, spec.alpha, xb, nb, xc, nc, t.drop_pts,
                    t.p_one_sided, part=part)
    f.regression = t.drop_pts > spec.divergence_rise_pts and t.p_one_sided < spec.alpha
    f.message = (f"{'a regression: ' if f.regression else ''}{xc}/{nc} {said} ({100 * xc / nc:.1f}%), against the "
                 f"noise floor of the baseline {baseline}: {xb}/{nb} of its answers under load apart from its solo "
                 f"answers ({100 * xb / nb:.1f}%); {'a rise' if t.drop_pts >= 0 else 'a fall'} of {abs(t.drop_pts):.1f} "
                 f"points (threshold "
                 f"{spec.divergence_rise_pts:g}), one-sided p = {t.p_one_sided:.3g} (alpha {spec.alpha:g})")
    return f


def unfloored(records: list[Record]) -> list[str]:
    """For a release with no baseline: one line per record whose divergent share is judged against a noise floor
    (:func:`floor_gated`), saying its share and that the gate is :data:`NO_FLOOR`."""
    return [f"{r.config}/{r.suite}: the divergent share under load is {NO_FLOOR}: "
            f"{_apart_text(divergence_counts(r), ' under load apart from solo')}, and no baseline record gives the "
            "stack's own share" for r in records if floor_gated(r)]


def judge_identity(rows: list, cand: list[Record], base: list[Record], baseline: str,
                   checkout: dict[str, ShareGateSpec] | None = None) -> tuple[list[ShareFigure], list[str]]:
    """Identity with the baseline of random weights (module docstring): each row of ``rows``
    (validate.identity.OutputIdentity) of a candidate record of random weights, its answers apart from the
    baseline's against the noise floor of the baseline's record of the same suite (:func:`divergence_counts`).
    Returns (figures, limited): a row not compared, or whose baseline record gives no noise floor (a suite of no
    answers under load: GSM8K, HumanEval), is a limited line saying why. Never raises for a malformed record."""
    from validate.pairing import match_records

    pairs = {(m.cand.config, m.cand.suite): m.base for m in match_records(cand, base).pairs}
    by = {(r.config, r.suite): r for r in cand}
    figures, limited = [], []
    for row in rows:
        c = by.get((row.config, row.suite))
        if c is None or not random_weights(c):
            continue
        where = f"{row.config}/{row.suite}" + (f" ({row.part})" if row.part else "")
        b = pairs.get((row.config, row.suite))
        if row.refused or not row.n or b is None:
            limited.append(f"{where}: identity with the baseline {baseline} is not checked: "
                           + (row.refused or "no answer was compared"))
            continue
        try:
            floor = divergence_counts(b)
            if floor is None:
                limited.append(f"{where}: identity with the baseline {baseline} is {NO_FLOOR}: {row.n - row.identical} "
                               f"of {row.n} answers apart from the baseline's, and its record of {b.suite} holds no "
                               "answers under load beside solo ones")
                continue
            spec = rule(b, (checkout or {}).get(c.suite))
            figures.append(floor_figure(row.config, row.suite, "identity", row.part, (row.n - row.identical, row.n),
                                        floor, spec, baseline, "answers apart from the baseline's"))
        except Exception as e:  # a record edited by hand: said, never a crash or a pass
            limited.append(f"{where}: identity with the baseline cannot be judged: {type(e).__name__}: {e}")
    return figures, limited


def gated_shares(r: Record) -> list[str]:
    """The shares a record holds that the share gates judge: "the SLO share" (an arrivals record), "the draft
    acceptance" (a server that speculated), "the divergent share under load" (random weights:
    :func:`floor_gated`)."""
    return ((["the SLO share"] if r.suite_kind == ARRIVALS_KIND else [])
            + (["the draft acceptance"] if spec_counts(r) is not None else [])
            + (["the divergent share under load"] if floor_gated(r) else []))


def compare_shares(candidate: str, cand: list[Record], baseline: str, base: list[Record],
                   checkout: dict[str, ShareGateSpec] | None = None,
                   configs: list[str] | None = None) -> ShareComparison:
    """Judge every share of the candidate's records against the baseline's record of the same configuration and
    suite, or the one it was renamed from (validate.pairing) (``checkout``: the suite files' share gates by suite
    name). A gated share of a baseline record the candidate lacks is named: unpaired where the candidate ran the
    configuration, else limited (``configs``: the configurations in scope). Never raises for a malformed
    record."""
    from validate.pairing import match_records

    out = ShareComparison(candidate, baseline)
    matching = match_records(cand, base, configs=configs)
    for b, config_run in matching.lacking:
        for what in gated_shares(b):
            (out.unpaired if config_run else out.limited).append(
                f"{b.config}/{b.suite}: {what} is gated and the candidate {candidate} has no such record (the "
                f"baseline {baseline} has)" + ("" if config_run else f"; the candidate ran nothing on {b.config}"))
    for m in matching.pairs:
        c, b = m.cand, m.base
        where = f"{c.config}/{c.suite}"
        if m.refused:
            if gated_shares(c):
                out.unpaired.append(m.refused)
            continue
        if b is None:
            if c.suite_kind == ARRIVALS_KIND:
                out.limited.append(f"{where}: the baseline {baseline} has no such record")
            if floor_gated(c):
                out.limited.append(f"{where}: the divergent share under load is {NO_FLOOR}: the baseline {baseline} "
                                   f"has no such record; "
                                   f"{_apart_text(divergence_counts(c), ' under load apart from solo')}")
            continue
        shared = gated_shares(c) or gated_shares(b)  # a record with no gated share is the other gates' business
        if c.audit_failed:  # a candidate that does not stand on what it holds is judged on nothing
            if shared:
                out.unpaired.append(f"{where}: the candidate's record does not stand on what it holds: {c.audit_failed}")
            continue
        if b.audit_failed:  # an edited baseline must not decide the gate either way
            if shared:
                out.unpaired.append(f"{where}: the baseline {baseline}'s record does not stand on what it holds: "
                                    f"{b.audit_failed}")
            continue
        spec = rule(b, (checkout or {}).get(c.suite))
        params = ARRIVALS_MEASURING if c.suite_kind == ARRIVALS_KIND else tuple(
            sorted(set(b.params) | set(c.params)))
        bad = apart(b, c, params)
        jobs = (([(judge_slo, "the SLO share")] if c.suite_kind == ARRIVALS_KIND else [])
                + ([(judge_divergence, "the divergent share under load")] if floor_gated(c) else [])
                + [(judge_acceptance, "the draft acceptance")])
        for job, what in jobs:
            if bad:
                if job is not judge_acceptance or spec_counts(b) is not None or spec_counts(c) is not None:
                    (out.limited if c.profile != b.profile else out.unpaired).append(
                        f"{where}: {what} cannot be compared: " + "; ".join(bad))
                continue
            try:
                fig, why = job(b, c, spec, baseline)
            except Exception as e:  # a record edited by hand: said, never a crash or a pass
                fig, why = None, f"{where}: cannot judge: {type(e).__name__}: {e}"
            if fig is not None:
                out.figures.append(fig)
            elif why:
                (out.limited if "met the SLO at no rate" in why or NO_FLOOR in why else out.unpaired).append(why)
    return out

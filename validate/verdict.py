"""The release's verdict, decided once: the suites' records, the paired eval gate and the performance gate (each
with what it could not compare), the baseline chosen and why, and the release's own faults (records of another
tree, notes that did not render), as one list of :class:`Check` lines.

Every output that says whether a release passed is rendered from one :class:`ReleaseVerdict`: the notes'
opening line and their "Checked / Not checked / Failures", the console's table, JUnit, the GitHub step summary
and the exit status. None of them works "passed" out on its own.

A check's ``outcome`` is one of:

- ``pass``: checked, and it held;
- ``finding``: a fact about the release that blocks it (a failed gate, a paired regression, a slower figure, a
  server of the wrong tree or with an inactive plugin): exit status 1;
- ``not-checked``: something that should have been checked and could not be (a suite that did not complete,
  evals or figures that cannot be paired, records of another tree, notes that did not render): exit status 2;
- ``limited``: not checked by the run's own choice or reach (a quick subset against a full baseline, a
  performance gate on too few passes to tell, no baseline, a suite of the checklist not run): listed under
  "Not checked", never called a pass, and it does not change the exit status.

A suite that passed at a quick profile or on a subset is a ``pass`` whose ``limits`` say so: the notes list it
under "Not checked" with that reason, as they list limited checks.

A configuration of random weights (validate.config.record_weights, from each record's configuration snapshot) is
judged by what random weights can show: its answers are noise, so its strict-sanity, long-answers and eval records
pass with the limit :data:`RANDOM_LIMIT`, its paired evals are limited ("not judged: random weights"), and what is
judged instead is batch invariance and identity with the baseline, each against the baseline's own noise floor
(the share gates: validate.loadgate).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from validate.errors import EXIT_FAIL, EXIT_INPUT, EXIT_INTERRUPTED, EXIT_OK, InputError, combine_exit
from validate.record import FINDING_STATUSES, Record, Tree, recheck
from validate.audit import audit_records, read_release  # noqa: F401 - the verdict's, kept here for its callers
from validate.suite import config_digest  # noqa: F401 - kept here for its callers

Outcome = Literal["pass", "finding", "not-checked", "limited"]
Area = Literal["suite", "paired", "perf", "release"]

#: The word each outcome is shown with, everywhere.
OUTCOME_WORD = {"pass": "pass", "finding": "FAIL", "not-checked": "NOT CHECKED", "limited": "not checked"}


@dataclass
class Check:
    """One line of the verdict.

    Attributes:
        config: the configuration it is about ("release" for the release as a whole).
        name: the suite, ``paired <task> vs <baseline>``, ``perf <figure>``, or what the release-level line is.
        area: suite, paired, perf or release.
        outcome: see the module docstring.
        status: the finer word: a record's verdict status, "regression", "cannot tell", "not compared", ...
        message: one line saying why.
        detail: further lines (reasons, figures), for JUnit and the summary.
        limits: for a passing suite, why it is not a full check (quick profile, a subset, ...); else None.
        record: the record it comes from, where there is one.
        properties: name -> value, JUnit's testcase properties (figures of the gate).
    """

    config: str
    name: str
    area: Area
    outcome: Outcome
    status: str
    message: str = ""
    detail: list[str] = field(default_factory=list)
    limits: str | None = None
    record: Record | None = None
    properties: dict[str, Any] = field(default_factory=dict)

    @property
    def time_s(self) -> float:
        return self.record.wall_s if self.record is not None and self.area == "suite" else 0.0

    @property
    def full_check(self) -> bool:
        """Passed and nothing limits it: listed under "Checked"."""
        return self.outcome == "pass" and not self.limits


@dataclass
class ReleaseVerdict:
    """Every check of one run of ``release`` (or of one gate), in the order the outputs show them."""

    release: str
    checks: list[Check] = field(default_factory=list)
    baseline: str | None = None
    baseline_why: str = ""
    comparison: Any = None  # validate.compare.Comparison, when evals were paired
    perf: Any = None  # validate.perfgate.PerfComparison, when BetterBench figures were compared
    identity: list = field(default_factory=list)  # validate.identity.OutputIdentity: greedy answers vs the baseline
    notes: list[str] = field(default_factory=list)  # said beside the verdict (thresholds that differ, ...)
    interrupted: bool = False
    what: str = "release"  # release, suite, gate, gate --perf: what the verdict is of

    def of(self, outcome: Outcome) -> list[Check]:
        return [c for c in self.checks if c.outcome == outcome]

    @property
    def findings(self) -> list[Check]:
        return self.of("finding")

    @property
    def not_checked(self) -> list[Check]:
        """Checks that should have been made and were not, then the limited ones, then passes with limits."""
        return self.of("not-checked") + self.of("limited") + [c for c in self.of("pass") if c.limits]

    @property
    def records(self) -> list[Record]:
        return [c.record for c in self.checks if c.area == "suite" and c.record is not None]

    def exit_code(self) -> int:
        """130 interrupted; 1 any finding; 2 anything not checked that should have been; else 0
        (:func:`validate.errors.combine_exit`)."""
        codes = [EXIT_INTERRUPTED if self.interrupted else EXIT_OK]
        codes += [EXIT_FAIL if c.outcome == "finding" else EXIT_INPUT if c.outcome == "not-checked" else EXIT_OK
                  for c in self.checks]
        return combine_exit(*codes)

    def why(self) -> str:
        """The one line that says what decided :meth:`exit_code`."""
        def names(cs: list[Check]) -> str:
            shown = [f"{c.config}/{c.name}" + (f" {c.status}" if c.status not in ("", c.outcome) else "") for c in cs]
            return ", ".join(shown[:6]) + (" ..." if len(shown) > 6 else "")

        parts = []
        if self.interrupted:
            parts.append("interrupted")
        if self.findings:
            parts.append(f"{len(self.findings)} finding(s): {names(self.findings)}")
        nc = self.of("not-checked")
        if nc:
            parts.append(f"{len(nc)} check(s) could not be made: {names(nc)}")
        limited = self.of("limited") + [c for c in self.of("pass") if c.limits]
        if limited and not self.findings and not nc:
            parts.append(f"no finding; {len(limited)} check(s) limited or not run: {names(limited)}")
        n = len([c for c in self.checks if c.area == "suite"])
        return "; ".join(parts) or f"every check passed ({n} suite(s), {len(self.checks) - n} gate check(s))"

    def opening(self) -> str:
        """The notes' opening line (markdown)."""
        code = self.exit_code()
        if code == EXIT_FAIL:
            return (f"**Not ready to ship:** {len(self.findings)} finding(s) (see \"Failures\"): "
                    + "; ".join(f"{c.config} / {c.name}: {c.message or c.status}" for c in self.findings[:5])
                    + (" ..." if len(self.findings) > 5 else "") + ".")
        if code == EXIT_INPUT:
            nc = self.of("not-checked")
            return (f"**Not ready to ship: not everything could be checked:** {len(nc)} check(s) could not be made "
                    "(see \"Not checked\"): " + "; ".join(f"{c.config} / {c.name}" for c in nc[:6])
                    + (" ..." if len(nc) > 6 else "") + ".")
        if code == EXIT_INTERRUPTED:
            return "**Interrupted:** the run did not finish; these notes hold what was recorded."
        limited = self.not_checked
        if limited:
            return (f"No finding in what was checked, and {len(limited)} check(s) were limited or not made (see "
                    "\"Not checked\"): this is not a full check of the release.")
        return "Every check passed: every suite of the checklist, the paired evals and the performance gate."


# --- building it --------------------------------------------------------------------------------------------

#: Suite kinds whose verdict judges the model's answers (right, wrong, garbage): of random weights, not judged.
ANSWER_KINDS = ("strict-sanity", "long-answers", "gsm8k", "humaneval")
#: The limit of a passing record of :data:`ANSWER_KINDS` of random weights.
RANDOM_LIMIT = ("random weights: right answers and garbage not judged (they test the weights, not the stack); "
                "judged: failed requests here, batch invariance and identity against the baseline's noise floor")


def record_limits(rec: Record) -> str | None:
    """Why a completed record is not a full check (its profile, a subset, an unverified external server, random
    weights' answers: :data:`RANDOM_LIMIT`), or None when it is one."""
    from validate.loadgate import random_weights

    reasons = []
    if rec.suite_kind in ANSWER_KINDS and random_weights(rec):
        reasons.append(RANDOM_LIMIT)
    if rec.profile != "full":
        reasons.append(f"{rec.profile} profile")
    if rec.dataset is not None and rec.dataset.subset:
        reasons.append(f"a subset: {rec.dataset.n_used:,} of {rec.dataset.n_total:,} items (seed {rec.dataset.seed})")
    if rec.server.launched is False and rec.server.provenance_ok is None and rec.server.url:
        reasons.append("provenance not verified (external server)")
    skipped = sum(1 for i in rec.items if (i.model_extra or {}).get("outcome") == "skipped")
    if skipped:  # a skipped test checked nothing (a GPU test on a CPU machine, a world size not set)
        reasons.append(f"{skipped:,} of {len(rec.items):,} tests skipped")
    return "; ".join(reasons) or None


def _dropped_depths(rec: Record) -> str | None:
    """BetterBench's prefill depths the server's max_model_len left out (the runner measures only those up to
    max_model_len - 8); None where none was. They are the configuration's reach, not a limit of the check: a
    comparison holds the configuration's settings the same on both sides (validate.pairing.apart), so neither
    side measured them; the verdict says them once, in its notes (:func:`depth_notes`)."""
    if rec.suite_kind != "betterbench":
        return None
    depths = rec.params.get("prefill_depths") if isinstance(rec.params, dict) else None
    server = rec.config_snapshot.get("server") if isinstance(rec.config_snapshot, dict) else None
    mml = server.get("max_model_len") if isinstance(server, dict) else None
    if not isinstance(depths, list) or not isinstance(mml, int) or isinstance(mml, bool):
        return None
    out = [d for d in depths if isinstance(d, int) and d > mml - 8]
    return (f"prefill depths {', '.join(f'{d:,}' for d in out)} not measured (above max_model_len {mml:,} - 8)"
            if out else None)


def depth_notes(records: list[Record]) -> list[str]:
    """One note per BetterBench record whose configuration cannot host some of its prefill depths (its
    max_model_len): said once beside the verdict, never a limited line of every gate on it."""
    out = []
    for r in records:
        d = _dropped_depths(r)
        if d:
            out.append(f"{r.config}/{r.suite}: {d}: the configuration cannot host them, so no run of it measures "
                       "them (sized to it)")
    return list(dict.fromkeys(out))


def exercise_notes(records: list[Record]) -> list[str]:
    """One note per dispatch a record's configuration asks for that no step of a kind it applies to exercised
    during the suite (validate.audit.never_exercised): said beside the verdict, never a finding (no such step
    ran, so nothing was routed either way)."""
    from validate.audit import never_exercised

    return list(dict.fromkeys(x for r in records for x in never_exercised(r)))


def other_tree(rec: Record, tree: Tree | None) -> str | None:
    """Why ``rec`` was not made by ``tree`` (its plugin and kernel source, its engine and suites), or None.
    Commits and the dirty flag do not count: a dirty working tree of the same sources is the same tree."""
    if tree is None:
        return None
    why = []
    if tree.source_hash and rec.tree.source_hash != tree.source_hash:
        why.append(f"plugin source {rec.tree.source_hash}, this tree's is {tree.source_hash}")
    if tree.engine_hash and rec.tree.engine_hash != tree.engine_hash:
        why.append(f"engine and suites {rec.tree.engine_hash}, this tree's are {tree.engine_hash}")
    return "; ".join(why) or None


def suite_check(rec: Record, tree: Tree | None = None, accept_other_tree: bool = False) -> Check:
    """The check of one suite record: its verdict (re-checked against its gates when read), its limits
    (:func:`record_limits`), what its server evidence says (:func:`server_faults`), whether its stored gate is its
    suite file's, and whether ``tree`` made it (:func:`other_tree`; limited instead of not-checked with
    ``accept_other_tree``)."""
    v = rec.verdict
    detail = ([v.cause] if v.cause else []) + list(v.reasons)
    base = dict(config=rec.config, name=rec.suite, area="suite", status=v.status, record=rec)
    if v.status in FINDING_STATUSES:
        chk = Check(outcome="finding", message=v.cause or (v.reasons[0] if v.reasons else v.status), detail=detail, **base)
    elif v.status == "pass":
        chk = Check(outcome="pass", message="", detail=detail, limits=record_limits(rec), **base)
    else:
        chk = Check(outcome="not-checked", message=v.cause or (v.reasons[0] if v.reasons else "no cause recorded"),
                    detail=detail, **base)
    finding, restart, limit = server_faults(rec)
    if finding and chk.outcome != "finding":
        chk.outcome, chk.status, chk.message = "finding", "wrong-tree", finding
    if restart and chk.outcome == "pass":
        chk.outcome, chk.status, chk.message = "not-checked", "server-restarted", restart
    if limit and chk.outcome == "pass":
        chk.limits = "; ".join(x for x in (chk.limits, limit) if x)
    stale = other_tree(rec, tree)
    if rec.gate_mismatch and not stale and chk.outcome == "pass":  # said first: it explains an audit that fails
        chk.outcome, chk.status = "not-checked", "gate-mismatch"
        chk.message = f"the record of this tree does not match its suite file: {rec.gate_mismatch}"
    if rec.audit_failed and chk.outcome == "pass":
        chk.outcome, chk.status = "not-checked", "audit-failed"
        chk.message = f"the record does not stand on what it holds: {rec.audit_failed}"
    if stale and chk.outcome != "finding":
        why = f"made by another tree ({stale})"
        if accept_other_tree:
            chk.limits = "; ".join(x for x in (chk.limits, why + ", accepted with --accept-other-tree") if x)
        else:
            chk.outcome, chk.status = "not-checked", "other-tree"
            chk.message = why + ": this tree's own run of it is missing (run the suite, or pass --accept-other-tree)"
    return chk


def _paired_lines(x, cmp) -> list[str]:
    lines = [f"{x.b} lost vs {x.c} gained of {x.n:,} (b = right only in {cmp.baseline}, c = right only in "
             f"{cmp.candidate}); one-sided p = {x.p_one_sided:.3g}, Holm-adjusted {x.p_holm:.3g}, alpha {cmp.alpha}; "
             f"two-sided p = {x.p_two_sided:.3g}",
             f"accuracy {100 * x.acc_baseline:.2f}% -> {100 * x.acc_candidate:.2f}%" + (" (subset)" if x.subset else "")]
    if x.diff_ci:
        lines.append(f"difference {100 * (x.acc_candidate - x.acc_baseline):+.1f} points, "
                     f"95% interval {100 * x.diff_ci[0]:+.1f} to {100 * x.diff_ci[1]:+.1f}")
    lines.append(f"verdict: {x.verdict_text}" + (f"; {x.sensitivity}" if x.sensitivity else ""))
    if x.baseline_task and x.baseline_task != x.task:
        lines.append(f"paired with the baseline's {x.baseline_config}/{x.baseline_task} (the same suite kind; renamed)")
    if x.lost:
        lines.append(f"right only in {cmp.baseline}: " + ", ".join(x.lost[:40]) + (" ..." if len(x.lost) > 40 else ""))
    return lines


def paired_name(task: str, baseline: str, baseline_config: str | None = None, config: str | None = None) -> str:
    name = f"paired {task} vs {baseline}"
    return name + (f" ({baseline_config})" if baseline_config and baseline_config != config else "")


def _task_of(reason: str) -> tuple[str, str]:
    """(configuration, task) named at the start of a gate's reason ("<config>/<suite>: ...")."""
    import re

    m = re.match(r"^([^/\s:]+)/([^\s:(]+)", reason)
    return (m.group(1), m.group(2)) if m else ("release", "?")


def paired_checks(cmp, strict: bool, records: list[Record] = ()) -> list[Check]:
    """Checks of the paired eval gate: one per task paired, one per task that could not be. ``strict``
    (``gate``): every task that could not be paired is not-checked; else (``release``) only the
    :attr:`Comparison.blocking` ones, the rest limited. ``records``: the candidate's, each task's check carries
    its own (JUnit's properties)."""
    out = []
    by_task = {(r.config, r.suite): r for r in records}
    for x in cmp.tasks:
        if x.random_weights:  # noise on both sides: recorded and shown, never a gate
            out.append(Check(x.config, paired_name(x.task, cmp.baseline, x.baseline_config, x.config), "paired",
                             "limited", "not judged",
                             f"{x.verdict_text} (accuracy {100 * x.acc_baseline:.1f}% -> {100 * x.acc_candidate:.1f}%, "
                             f"{x.b} lost vs {x.c} gained, one-sided p = {x.p_one_sided:.3g})", _paired_lines(x, cmp),
                             record=by_task.get((x.config, x.task))))
            continue
        props = {"baseline": cmp.baseline, "baseline_config": x.baseline_config, "n": x.n, "b": x.b, "c": x.c,
                 "p_one_sided": f"{x.p_one_sided:.6g}", "p_holm": f"{x.p_holm:.6g}",
                 "p_two_sided": f"{x.p_two_sided:.6g}", "alpha": cmp.alpha}
        if x.diff_ci:
            props.update({"diff_ci_low": f"{x.diff_ci[0]:.6g}", "diff_ci_high": f"{x.diff_ci[1]:.6g}"})
        name = paired_name(x.task, cmp.baseline, x.baseline_config, x.config)
        if x.baseline_task and x.baseline_task != x.task:  # paired by kind (validate.pairing): both names said
            props["baseline_task"] = x.baseline_task
        if x.regression:
            out.append(Check(x.config, name, "paired", "finding", "regression",
                             f"{x.config}/{x.task} regressed: {x.b} lost vs {x.c} gained, one-sided p = {x.p_one_sided:.3g}, Holm-adjusted "
                             f"{x.p_holm:.3g} < alpha {cmp.alpha}", _paired_lines(x, cmp), properties=props,
                             record=by_task.get((x.config, x.task))))
        else:
            limits = "too few questions to detect a regression" if "too few" in x.verdict_text else None
            if x.subset:
                limits = "; ".join(y for y in ("a subset", limits) if y)
            out.append(Check(x.config, name, "paired", "pass", x.verdict_text, x.verdict_text, _paired_lines(x, cmp),
                             limits=limits, properties=props, record=by_task.get((x.config, x.task))))
    for reason in cmp.unpaired:
        cfg, task = _task_of(reason)
        blocking = strict or reason in cmp.blocking
        out.append(Check(cfg, paired_name(task, cmp.baseline), "paired", "not-checked" if blocking else "limited",
                         "not paired", reason, [reason]))
    return out


def not_compared(gate: str, unpaired: list[str], limited: list[str], strict: bool) -> list[Check]:
    """A gate's lines for what it did not compare: each ``unpaired`` reason (should have been compared) is
    not-checked, each ``limited`` one (the run's own reach) limited, or not-checked with ``strict``; named
    ``<gate> <suite>`` after the configuration and suite the reason starts with."""
    from validate.loadgate import NO_FLOOR

    out = []
    for reason, outcome in [(r, "not-checked") for r in unpaired] + [(r, "not-checked" if strict else "limited")
                                                                      for r in limited]:
        cfg, suite = _task_of(reason)
        out.append(Check(cfg, f"{gate} {suite}", "perf", outcome, "no noise floor" if NO_FLOOR in reason else
                         "not compared", reason, [reason]))
    return out


def baseline_lacks(cand: list[Record], base: list[Record], kinds: set[str], gate: str, area: Area,
                   configs: list[str] | None = None, strict: bool = False) -> list[Check]:
    """Lines for the baseline's records of ``kinds`` that the candidate has no record of (not even one renamed:
    validate.pairing), for a gate that did not run because the candidate holds no record of those kinds: each
    named, not-checked where the candidate ran the configuration (or ``strict``: a gate on its own), else
    limited (the configuration was left out of the run). ``gate``: the lines' name, "<gate> <suite>"."""
    from validate.pairing import match_records

    m = match_records([r for r in cand if r.suite_kind in kinds], [b for b in base if b.suite_kind in kinds],
                      configs=configs)
    ran = {r.config for r in cand}
    out = []
    for b, _ in m.lacking:
        msg = (f"{b.config}/{b.suite}: the baseline holds a record of suite kind {b.suite_kind!r} and the candidate "
               f"none: the {gate} compared nothing" + ("" if b.config in ran else
                                                       f" (the candidate ran nothing on {b.config})"))
        out.append(Check(b.config, f"{gate} {b.suite}", area, "not-checked" if strict or b.config in ran else "limited",
                         "not compared", msg, [msg]))
    return out


def perf_checks(perf, strict: bool) -> list[Check]:
    """Checks of the performance gate: one per figure; one per record it could not compare (not-checked) or did
    not by the run's choice (limited). A figure the pass counts cannot decide is not-checked with ``strict``
    (``gate --perf``), else limited; never a pass."""
    out = []
    for f in perf.figures:
        props = {"figure": f.figure, "baseline": perf.baseline, "base_median": f"{f.base_median:.6g}",
                 "cand_median": f"{f.cand_median:.6g}", "change_pct": f"{f.change_pct:.3f}",
                 "threshold_pct": f.threshold_pct, "p_value": f"{f.p_value:.6g}", "passes_base": len(f.base),
                 "passes_cand": len(f.cand)}
        detail = [f.message, f"{perf.baseline} median {f.base_median:.4g} {f.unit} over {len(f.base)} passes (band "
                  f"{f.base_band[0]:.4g}-{f.base_band[1]:.4g}); {perf.candidate} {f.cand_median:.4g} {f.unit} over "
                  f"{len(f.cand)} (band {f.cand_band[0]:.4g}-{f.cand_band[1]:.4g}); change {f.change_pct:+.1f}%"]
        outcome = ("finding" if f.regression else ("not-checked" if strict else "limited") if f.cannot_tell else "pass")
        name = f"perf {f.figure}" if f.suite == "betterbench" else f"perf {f.suite}/{f.figure}"
        out.append(Check(f.config, name, "perf", outcome, "regression" if f.regression else f.mark,
                         f.message, detail, properties=props | {"suite": f.suite}))
    return out + not_compared("perf", perf.unpaired, perf.limited, strict)


def share_checks(shares, strict: bool) -> list[Check]:
    """Checks of the share gates (validate.loadgate): one per share judged (a regression is a finding), one per
    record that should have been compared and could not (not-checked), one per share not compared by the run's
    own reach (limited; not-checked with ``strict``)."""
    out = []
    for f in shares.figures:
        name = (f"slo {f.suite}" + (f" at {f.rate_per_s:.3g} req/s" if f.rate_per_s else "") if f.what == "slo"
                else f"{f.what} {f.suite}" + (f" ({f.part})" if f.part else ""))
        props = {"baseline": shares.baseline, "x_base": f.x_base, "n_base": f.n_base, "x_cand": f.x_cand,
                 "n_cand": f.n_cand, "drop_pts": f"{f.drop_pts:.3f}", "threshold_pts": f.threshold_pts,
                 "p_value": f"{f.p_value:.6g}", "alpha": f.alpha, "suite": f.suite}
        out.append(Check(f.config, name, "perf", "finding" if f.regression else "pass",
                         "regression" if f.regression else "within the threshold", f.message, [f.message],
                         properties=props))
    return out + not_compared("share gate", shares.unpaired, shares.limited, strict)


def tree_checks(records: list[Record], tree: Tree | None, accept_other_tree: bool, what: str) -> list[Check]:
    """For a gate on its own (``gate``, ``gate --perf``): a line per candidate record that ``tree`` did not make
    (:func:`other_tree`), not-checked unless ``accept_other_tree`` (then limited), and a line per record whose
    server evidence or gate the gate must not pass over, as :func:`suite_check` reads them: a server of another
    plugin source (a finding), a server that restarted during the suite, a record of this tree judged by another
    gate than its suite file's (not-checked). ``records``: re-checked by :func:`reapply_gates` first. ``what``:
    the gate's name."""
    out = []
    for r in records:
        why = other_tree(r, tree)
        if why:
            msg = f"the {what} would judge a record made by another tree ({why})"
            out.append(Check(r.config, f"{r.suite} (tree)", "release", "limited" if accept_other_tree else "not-checked",
                             "other-tree", msg + (", accepted with --accept-other-tree" if accept_other_tree else
                                                  ": run the suite on this tree, or pass --accept-other-tree"),
                             [msg], record=r))
        try:
            chk = suite_check(r, tree, accept_other_tree=True)
        except Exception as e:  # as in assess: never a crash or a pass
            chk = Check(r.config, r.suite, "suite", "not-checked", "unreadable",
                        f"the record could not be checked: {type(e).__name__}: {e}")
        if chk.status in ("wrong-tree", "server-restarted", "gate-mismatch", "unreadable", "audit-failed"):
            msg = f"the {what} would judge a record that cannot stand: {chk.message}"
            out.append(Check(r.config, f"{r.suite} (record)", "release", chk.outcome, chk.status, msg, [msg], record=r))
        elif chk.outcome == "pass" and chk.limits and not why:
            # what limits the record limits the gate on it (an unverified external server, impossible counters)
            msg = f"the {what} judges a record that is not a full check: {chk.limits}"
            out.append(Check(r.config, f"{r.suite} (record)", "release", "limited", "limited", msg, [msg], record=r))
    return out


def release_check(name: str, message: str, outcome: Outcome = "not-checked", status: str = "error") -> Check:
    """A line about the release as a whole (a baseline that cannot be read, notes that did not render)."""
    return Check("release", name, "release", outcome, status, message, [message])


def _gate_dict(gate) -> dict | None:
    from validate.record import StoredGate

    if gate is None:
        return None
    try:
        return StoredGate.model_validate(gate if isinstance(gate, dict) else gate.model_dump()).model_dump()
    except ValueError:
        return {"malformed": True}


def reapply_gates(records: list[Record], root: Path | None) -> list[Record]:
    """Judge each record by the gate of the checkout's suite file of the same name and kind as well
    (:func:`validate.record.recheck`): a schema-1 record stores none, and a stored gate that differs from the
    suite file's is named (``Record.gate_mismatch``: for a record of this very tree it was edited), and so is a
    record of this very engine whose configuration snapshot serves random weights where the checkout's
    configuration of its name serves trained ones. Records that store their gate were also re-checked by it when
    read."""
    if root is None:
        return records
    from r9k import provenance as prov
    from validate.config import load_config, serve_dir
    from validate.loadgate import random_weights
    from validate.provenance_checks import engine_hash as engine_of
    from validate.suite import find_suite

    engine = engine_of(root, root if (root / "r9k").is_dir() else prov.package_root())
    for r in records:
        if r.tree.engine_hash == engine and random_weights(r):
            # serve/ is part of the engine hash: this engine's configuration of that name says what it served
            try:
                mine = load_config(serve_dir(root) / f"{r.config}.yaml") if (
                    serve_dir(root) / f"{r.config}.yaml").exists() else None
            except InputError:
                mine = None
            if mine is not None and not mine.model.random_weights:
                r.gate_mismatch = (f"its configuration snapshot serves random weights, the checkout's "
                                   f"serve/{r.config}.yaml of this engine serves {mine.model.weights_kind} ones")
                continue
        try:
            s = find_suite(root, r.suite, "quick" if r.profile == "quick" else "full")
        except InputError:
            # for a record of this very tree (suite_check counts it only then) the suite was renamed or removed
            r.gate_mismatch = f"the checkout has no suite file suites/{r.suite}.yaml to judge it by"
            continue
        if s.spec.kind != r.suite_kind:
            r.gate_mismatch = (f"it says suite kind {r.suite_kind!r}, the checkout's suites/{r.suite}.yaml is of kind "
                               f"{s.spec.kind!r}")
            continue
        mine = s.spec.gate.model_dump()
        stored = _gate_dict(r.gate)
        if stored is not None and stored != mine:
            r.gate_mismatch = (f"its stored gate {stored} differs from the checkout's suite file's {mine}")
        elif r.tree.engine_hash == engine and isinstance(r.params, dict) and any(
                r.params[k] != s.params_dict.get(k) for k in r.params):
            # a record of this very engine and suites ran the file's params; they hold the rule's bounds too (a
            # soak's slope bound, sanity's solo share), so a value other than the file's was edited (a key left
            # out reads as the kind's default, which its params model gives and the audits apply)
            keys = sorted(k for k in r.params if r.params[k] != s.params_dict.get(k))
            r.gate_mismatch = ("its params differ from the checkout's suite file's for its profile ("
                               + ", ".join(f"{k}: {r.params.get(k)!r} vs {s.params_dict.get(k)!r}" for k in keys[:4])
                               + ")")
        if r.verdict.status == "pass":
            recheck(r, mine, "the checkout's suite file's")
    return records


def server_faults(rec: Record) -> tuple[str | None, str | None, str | None]:
    """(a finding, a restart, a limit) the record's server evidence gives: provenance that did not match the
    record's own tree while its verdict says pass (a finding); counters that went backwards during the suite (the
    server restarted: the suite's measurements straddle two servers, so the check was not made); impossible values
    (the server's counters are not to be believed: a limit)."""
    from validate.audit import other_sources, restarts  # the audit's rules: one source for both sides

    finding = None
    if rec.verdict.status == "pass" and rec.server.provenance_ok is False:
        finding = "the record says pass, but its server's provenance did not match the tree under validation"
    elif rec.verdict.status == "pass":
        # whoever launched the server: a provenance line of another plugin source is another tree's server
        wrong = other_sources(rec)
        if wrong:
            finding = (f"the record says pass, but its server printed plugin source {', '.join(wrong)}, not the "
                       f"record's {rec.tree.source_hash}")
    sm = rec.server_metrics if isinstance(rec.server_metrics, dict) else {}
    d = sm.get("delta") if isinstance(sm.get("delta"), dict) else {}
    resets = restarts(rec)
    impossible = d.get("impossible") if isinstance(d.get("impossible"), list) else []
    restart = (f"the server's counters went backwards during the suite ({', '.join(map(str, resets))}): it "
               "restarted" if resets else None)
    limit = f"the server reported impossible values ({'; '.join(map(str, impossible))})" if impossible else None
    return finding, restart, limit


def assess(release: str, records: list[Record], *, comparison=None, perf=None, shares=None, identity=None,
           baseline: str | None = None,
           baseline_why: str = "", planned: list[tuple[str, list[str]]] | None = None, tree: Tree | None = None,
           accept_other_tree: bool = False, extra: list[Check] | None = None, strict: bool = False,
           what: str = "release", notes: list[str] | None = None) -> ReleaseVerdict:
    """The one verdict of ``release`` from its records and gates.

    Args:
        records: the candidate's records (re-checked against their gates when read).
        comparison: the paired eval gate's :class:`validate.compare.Comparison`, or None.
        perf: the performance gate's :class:`validate.perfgate.PerfComparison`, or None.
        shares: the share gates' :class:`validate.loadgate.ShareComparison`, or None.
        identity: the greedy answers against the baseline's (:mod:`validate.identity`; a figure, not a check).
        baseline, baseline_why: the baseline compared with and why that one (None: no baseline).
        planned: the checklist's (configuration, suites) this run covers; a suite without a record is limited.
        tree: the tree under validation; a record another tree made is not-checked unless ``accept_other_tree``.
        extra: release-level checks the caller found (the baseline unreadable, the notes not rendered).
        strict: a gate on its own (``gate``, ``gate --perf``): what it could not compare is not-checked.
        what: what the verdict is of (release, suite, gate, gate --perf), for the outputs' titles.
        notes: lines to say beside the verdict.
    """
    v = ReleaseVerdict(release, baseline=baseline, baseline_why=baseline_why, comparison=comparison, perf=perf,
                       identity=list(identity or []),
                       notes=list(notes or []) + depth_notes(records) + weights_notes(records)
                       + exercise_notes(records), what=what)
    seen = set()
    for r in records:
        seen.add((r.config, r.suite))
        try:
            v.checks.append(suite_check(r, tree, accept_other_tree))
        except Exception as e:  # a record edited by hand that no check foresaw: said, never a crash or a pass
            v.checks.append(Check(r.config, r.suite, "suite", "not-checked", "unreadable",
                                  f"the record could not be checked: {type(e).__name__}: {e}", record=r))
    for cfg, suites in planned or []:
        for s in suites:
            if (cfg, s) not in seen:
                v.checks.append(Check(cfg, s, "suite", "limited", "not run", "did not run (no record)"))
    if comparison is not None:
        v.checks += paired_checks(comparison, strict, records)
        v.notes += getattr(comparison, "renamed", [])
    if perf is not None:
        v.checks += perf_checks(perf, strict)
        v.notes += perf.notes
    if shares is not None:
        v.checks += share_checks(shares, strict)
    v.checks += extra or []
    return v


def weights_notes(records: list[Record]) -> list[str]:
    """One note per configuration of random weights among ``records``: what it is judged on, and why."""
    from validate.loadgate import random_weights

    cfgs = sorted({r.config for r in records if random_weights(r)})
    return [f"{c} serves random weights: its answers are noise whatever serves them, so right answers and garbage "
            "are not judged (strict sanity and long answers ask no solo share and call no answer bad; GSM8K and "
            "HumanEval accuracy is recorded, their paired gate reads \"not judged: random weights\"); it is judged on "
            "batch invariance (answers under load against its own solo answers, token by token) and identity with "
            "the baseline, each against the share of answers under load the baseline's own record shows apart from "
            "solo (its noise floor)" for c in cfgs]


def newest_tree(records: list[Record]) -> Tree | None:
    """The tree most of the release's records were made by (plugin source and engine hashes; the newest record's
    among equals): what ``render`` checks the others against."""
    from collections import Counter

    done = [r for r in records if r.tree.source_hash]
    if not done:
        return None
    votes = Counter((r.tree.source_hash, r.tree.engine_hash) for r in done)
    return max(done, key=lambda r: (votes[(r.tree.source_hash, r.tree.engine_hash)], r.ended_at)).tree


def assess_release(reports: Path, release: str, *, root: Path | None = None, baseline: str | None = None,
                   planned: list[tuple[str, list[str]]] | None = None, configs: list[str] | None = None,
                   tree: Tree | None = None, accept_other_tree: bool = False, extra: list[Check] | None = None,
                   across_thinking: bool = False) -> ReleaseVerdict:
    """Read ``release``'s records, choose the baseline, run the paired eval gate and the performance gate against
    it once, and return the verdict (:func:`assess`). What the gates could not compare is in it; nothing here
    raises for a record or a baseline that cannot be read: it becomes a not-checked line.

    Args:
        reports: the reports folder; root: the checkout (its suite files re-check schema-1 records, its
            BetterBench thresholds stand in for a baseline that stored none).
        baseline: ``--baseline`` as given (None: the automatic choice, ``none``: no baseline).
        configs: only these configurations' records (``release --config``).
        tree: the tree under validation (None: the tree most records were made by, as ``render`` uses).
        across_thinking: pair evals of a thinking model with those of one that does not think
            (validate.compare.pair).
    """
    from validate.compare import (choose_baseline, compare_releases, held_elsewhere, same_version,
                                  unreadable_newer)
    from validate.perfgate import BENCH_KIND, compare_perf
    from validate.record import release_records
    from validate.suite import paired_eval_kinds, perf_gate_specs

    extra = list(extra or [])
    skipped: list[str] = []
    records = [r for r in release_records(reports, release, skipped=skipped) if not configs or r.config in configs]
    extra += [release_check("records", f"a file of {release} is not a readable record: {why}") for why in skipped]
    records = reapply_gates(records, root)
    audit_records(records, reports)
    if tree is None:
        tree = newest_tree(records)
    from validate.loadgate import ARRIVALS_KIND, compare_shares, floor_gated

    gated = paired_eval_kinds() | {BENCH_KIND, ARRIVALS_KIND}
    # random weights: the answers under load are gated against the baseline's noise floor, so a baseline holds them
    want = {(r.config, r.suite_kind) for r in records if r.suite_kind in gated or floor_gated(r)}
    base, why = choose_baseline(reports, release, baseline, want)
    cmp = perf = shares = None
    identity: list = []
    notes: list[str] = []
    if base is not None and not baseline:  # the automatic choice: what it lacks and another release holds is said
        try:
            for (cfg, kind), (other, older) in held_elsewhere(reports, release, base, want).items():
                what = (f"the baseline {base} holds an older record of it than {other}: its gate compared against a "
                        f"release the newer one may have regressed from" if older else
                        f"the baseline {base} holds no such record, {other} does: its gate compared nothing")
                extra.append(Check(cfg, f"baseline of {kind}", "release", "not-checked", "not compared",
                                   f"{cfg}/{kind}: {what} (name one with --baseline)"))
            for other in same_version(reports, release, base, want):
                extra.append(release_check("baseline", f"{other} and the baseline {base} name one version and both "
                                                       f"hold records the gates compare: which holds the release is "
                                                       f"not known, and {other}'s were compared with nothing (name a "
                                                       f"baseline with --baseline)"))
            for other in unreadable_newer(reports, release, base):
                extra.append(release_check("baseline", f"{other}, newer than the baseline {base}, holds a file that is "
                                                       f"no readable record: what it held was compared with nothing "
                                                       f"(name a baseline with --baseline)"))
        except Exception as e:  # a folder that cannot be read: said
            extra.append(release_check("baseline", f"the baselines under {reports} could not be read: "
                                                   f"{type(e).__name__}: {e}"))
    if base is not None:
        bskipped: list[str] = []
        base_records = release_records(reports, base, skipped=bskipped)
        audit_records(base_records, reports)
        if not base_records and not bskipped:
            if baseline:
                extra.append(release_check("baseline", f"the baseline {base} named with --baseline has no records "
                                                       f"under {reports}"))
        kinds = paired_eval_kinds()
        has_evals = any(r.suite_kind in kinds for r in records)
        if not has_evals:  # what the baseline has and the candidate lacks is named, never left out
            extra += baseline_lacks(records, base_records, set(kinds), "paired", "paired", configs)
        if not any(r.suite_kind == BENCH_KIND for r in records):
            extra += baseline_lacks(records, base_records, {BENCH_KIND}, "perf", "perf", configs)
        if has_evals:
            try:
                cmp = compare_releases(reports, release, base, configs=configs, skipped=[],
                                       across_thinking=across_thinking)
            except InputError as e:
                extra.append(release_check("paired evals", f"the candidate has eval records and the paired gate "
                                                           f"compared none: {e}"))
            except Exception as e:  # a record edited by hand: the gate could not run, never a crash or a pass
                extra.append(release_check("paired evals", f"the paired gate could not run: {type(e).__name__}: {e}"))
        if any(r.suite_kind == BENCH_KIND for r in records):
            try:
                perf = compare_perf(reports, release, base, perf_gate_specs(root) if root else None, configs=configs,
                                    skipped=[], records=records, base_records=base_records)
            except InputError as e:
                extra.append(release_check("performance gate", f"the performance gate compared nothing: {e}"))
            except Exception as e:
                extra.append(release_check("performance gate",
                                           f"the performance gate could not run: {type(e).__name__}: {e}"))
        try:
            from validate.suite import share_gate_specs

            shares = compare_shares(release, records, base, base_records, share_gate_specs(root) if root else None,
                                    configs=configs)
        except Exception as e:
            extra.append(release_check("share gates", f"the share gates could not run: {type(e).__name__}: {e}"))
        try:
            from validate.identity import compare_releases_outputs

            def stands(r: Record) -> str | None:
                why = None if accept_other_tree else other_tree(r, tree)
                return f"the record was made by another tree ({why})" if why else None

            identity = compare_releases_outputs(records, base_records, stands=stands)
        except Exception as e:  # a figure, not a gate: what it could not compare is said beside the verdict
            notes.append(f"greedy answers against {base} not compared: {type(e).__name__}: {e}")
        if shares is not None:  # random weights: identity with the baseline, against its noise floor
            from validate.loadgate import judge_identity

            figs, lim = judge_identity(identity, records, base_records, base, share_gate_specs(root) if root else None)
            shares.figures += figs
            shares.limited += lim
        extra += [release_check("baseline records", f"a file of the baseline {base} was not compared: {w}")
                  for w in dict.fromkeys(bskipped)]
    elif records:
        from validate.loadgate import unfloored

        extra.append(Check("release", "baseline", "release", "limited", "no baseline",
                           f"no baseline: {why}; no paired eval or performance gate ran"))
        extra += not_compared("share gate", [], unfloored(records), False)
    return assess(release, records, comparison=cmp, perf=perf, shares=shares, identity=identity, baseline=base,
                  baseline_why=why, planned=planned,
                  tree=tree, accept_other_tree=accept_other_tree, extra=extra, notes=notes)


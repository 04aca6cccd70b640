"""Paired comparison of two releases' eval records, and the CI gate on McNemar p-values.

Two records pair only when they evaluated the same questions the same way: equal dataset content hash, the
same subset flag (a subset never pairs with a full set), the same question ids, equal prompt hashes per
question and equal generation parameters and primary extraction, both thinking or neither, with one
end-of-thinking marker (validate.reasoning). Otherwise :class:`PairingError` says what
differs. Per task: b = questions right only in the baseline, c = right only in the candidate; exact McNemar
(validate.stats) two-sided and one-sided for a regression (b > c), Holm across the tasks of the comparison.
"""
from __future__ import annotations

import functools
import json
from dataclasses import dataclass, field
from pathlib import Path

from validate.errors import InputError
from validate.loadgate import random_weights
from validate.pairing import NON_SCORING_PARAMS, apart
from validate.reasoning import pairing_reasons
from validate.record import Record, release_records, same_run
from validate.stats import holm, mcnemar, min_detectable_regression, paired_diff_ci


SUBSET_REASON = "a subset never pairs with a full-set record"


class PairingError(InputError):
    """The two records cannot be paired. ``reasons`` lists every difference found."""

    def __init__(self, what: str, reasons: list[str]):
        super().__init__(f"{what}: cannot pair: " + "; ".join(reasons))
        self.reasons = reasons


@dataclass
class PairedTask:
    """One task (suite) of one configuration, candidate against baseline, question by question."""

    config: str
    baseline_config: str
    task: str
    n: int
    correct_baseline: int
    correct_candidate: int
    b: int  # right only in the baseline
    c: int  # right only in the candidate
    identical: int  # byte-identical outputs
    lost: list[str] = field(default_factory=list)  # ids right in the baseline, wrong in the candidate
    gained: list[str] = field(default_factory=list)
    p_two_sided: float = 1.0
    p_one_sided: float = 1.0  # regression: P[Binom(b + c, 1/2) >= b]
    p_holm: float = 1.0  # one-sided p after Holm across the tasks compared together
    regression: bool = False
    subset: bool = False
    # What the test could have seen at this size (see attach_sensitivity); fractions of n.
    diff_ci: tuple[float, float] | None = None  # 95% interval of candidate - baseline accuracy (Newcombe)
    min_flaggable_drop: int | None = None  # fewest questions lost (none gained) that the gate would flag
    mdr: float | None = None  # drop detected with 80% power at the observed discordant rate; inf: none; None: b+c=0
    power: float = 0.8
    baseline_task: str | None = None  # the baseline's suite, where it was renamed (validate.pairing)
    # the configuration serves random weights (validate.loadgate.random_weights): accuracy is noise, recorded and
    # tested but never a regression (the verdict lists the task as not judged)
    random_weights: bool = False

    @property
    def acc_baseline(self) -> float:
        return self.correct_baseline / self.n if self.n else 0.0

    @property
    def acc_candidate(self) -> float:
        return self.correct_candidate / self.n if self.n else 0.0

    @property
    def identical_share(self) -> float:
        return self.identical / self.n if self.n else 0.0

    @property
    def sensitivity(self) -> str:
        """What a "no regression" means at this size, in words (percentage points of accuracy)."""
        if self.min_flaggable_drop is None:
            return ""
        k = self.min_flaggable_drop
        if k > self.n:
            return f"no regression could have been flagged: {self.n} questions are too few at this alpha"
        if k > self.correct_baseline:  # a loss is of questions the baseline got right: there are too few to lose
            return (f"no regression could have been flagged: the baseline got {self.correct_baseline} of {self.n} "
                    f"right, fewer than the {k} a loss must reach to be flagged")
        floor = f"a loss of at least {k} questions ({100 * k / self.n:.1f} points) with none gained is the least it can flag"
        if self.mdr is None:
            return f"no discordant questions, so no power estimate; {floor}"
        if self.mdr == float("inf"):
            return (f"could not have detected a regression with {100 * self.power:.0f}% power at the observed "
                    f"discordant rate ({self.b + self.c} of {self.n:,}); {floor}")
        return (f"detects a drop of {100 * self.mdr:.1f} points with {100 * self.power:.0f}% power at the observed "
                f"discordant rate ({self.b + self.c} of {self.n:,}); {floor}")

    @property
    def verdict_text(self) -> str:
        if self.random_weights:
            return NOT_JUDGED
        if self.regression:
            return "regression"
        k = self.min_flaggable_drop
        if k is not None and (k > min(self.n, self.correct_baseline) or self.mdr == float("inf")):
            return "not significant; too few questions to detect a regression"
        return "no significant regression"


#: What a paired eval of a configuration of random weights reads as: its accuracy tests the weights, not the stack.
NOT_JUDGED = "not judged: random weights"


def pair(base: Record, cand: Record, across_thinking: bool = False, configuration: bool = True) -> PairedTask:
    """Pair two records of one task. Raises PairingError naming every difference that forbids it.
    ``across_thinking``: pair a thinking record with one that does not think, or across end-of-thinking
    markers (refused otherwise: validate.reasoning.pairing_reasons). The model, the configuration's settings as
    run (``configuration``: False where two configurations are compared on purpose, ``--against-config``) and
    the metrics formula must be the same (validate.pairing.apart; the machine may differ: each question's answer
    is judged)."""
    what = f"{cand.config}/{cand.suite} ({cand.release}) against {base.config}/{base.suite} ({base.release})"
    reasons = []
    for label, r in (("baseline", base), ("candidate", cand)):
        if r.verdict.status not in ("pass", "fail"):
            reasons.append(f"the {label} record did not complete ({r.verdict.status}: {r.verdict.cause})")
        if r.dataset is None or not r.items:
            reasons.append(f"the {label} record has no per-question items")
    if reasons:
        raise PairingError(what, reasons)
    if base.suite_kind != cand.suite_kind:
        reasons.append(f"different tasks ({base.suite_kind} vs {cand.suite_kind})")
    if base.dataset.sha256 != cand.dataset.sha256:
        reasons.append(f"dataset content differs ({base.dataset.sha256[:12]} vs {cand.dataset.sha256[:12]})")
    if base.dataset.subset != cand.dataset.subset:
        sub, full = ("baseline", "candidate") if base.dataset.subset else ("candidate", "baseline")
        reasons.append(f"the {sub} is a subset ({(base if sub == 'baseline' else cand).dataset.n_used} questions) "
                       f"and the {full} the full set: {SUBSET_REASON}")
    diff = [f"{k}: {base.params.get(k)!r} vs {cand.params.get(k)!r}"
            for k in sorted(set(base.params) | set(cand.params))
            if k not in NON_SCORING_PARAMS and base.params.get(k) != cand.params.get(k)]
    if diff:
        reasons.append("suite parameters differ (" + ", ".join(diff[:5]) + ")")
    reasons += [x for x in apart(base, cand, machine=False, configuration=configuration)
                if not x.startswith("other suite kinds")]  # another model or dtype must not pair (said above)
    if not across_thinking:
        reasons += pairing_reasons(base, cand)  # thinking against none, or other end-of-thinking markers
    for label, r in (("baseline", base), ("candidate", cand)):
        ids = [i.id for i in r.items]
        if len(ids) != len(set(ids)):
            dup = next(x for x in ids if ids.count(x) > 1)
            reasons.append(f"the {label} lists question {dup} more than once")
    if reasons:
        raise PairingError(what, reasons)
    bi = {i.id: i for i in base.items}
    ci = {i.id: i for i in cand.items}
    if set(bi) != set(ci):
        reasons.append(f"questions differ ({len(set(bi) - set(ci))} only in the baseline, "
                       f"{len(set(ci) - set(bi))} only in the candidate)")
    else:
        prompt_diff = [k for k in bi if bi[k].prompt_hash != ci[k].prompt_hash]
        if prompt_diff:
            reasons.append(f"prompts differ on {len(prompt_diff)} of {len(bi)} questions (first: {prompt_diff[0]})")
        # each side is judged against the answer it holds: one question, one expected answer on both sides
        expected_diff = [k for k in bi if bi[k].expected != ci[k].expected]
        if expected_diff:
            k = expected_diff[0]
            reasons.append(f"expected answers differ on {len(expected_diff)} of {len(bi)} questions (first: {k}, "
                           f"{bi[k].expected!r} vs {ci[k].expected!r})")
        gen_diff = sorted({f"{key}: {bi[k].gen.get(key)!r} vs {ci[k].gen.get(key)!r}"
                           for k in bi for key in set(bi[k].gen) | set(ci[k].gen)
                           if bi[k].gen.get(key) != ci[k].gen.get(key)})
        if gen_diff:
            reasons.append("generation parameters differ (" + ", ".join(gen_diff[:4]) + ")")
        errored = [k for k in bi if bi[k].error or ci[k].error]
        if errored:
            reasons.append(f"{len(errored)} questions failed to run in one record (first: {errored[0]}): "
                           "an infrastructure fault is never a wrong answer")
    if reasons:
        raise PairingError(what, reasons)
    ids = sorted(bi)
    lost = [k for k in ids if bi[k].correct and not ci[k].correct]
    gained = [k for k in ids if ci[k].correct and not bi[k].correct]
    m = mcnemar(len(lost), len(gained))
    return PairedTask(
        config=cand.config, baseline_config=base.config, task=cand.suite, n=len(ids),
        correct_baseline=sum(1 for k in ids if bi[k].correct), correct_candidate=sum(1 for k in ids if ci[k].correct),
        b=len(lost), c=len(gained), identical=sum(1 for k in ids if bi[k].output == ci[k].output),
        lost=lost, gained=gained, p_two_sided=m.p_two_sided, p_one_sided=m.p_one_sided, subset=cand.dataset.subset,
        random_weights=random_weights(cand),
    )


def attach_sensitivity(tasks: list[PairedTask], alpha: float, power: float = 0.8) -> None:
    """Say what each paired test could have detected, so a "no regression" on a small eval never reads as
    evidence of none.

    With m tasks Holm compares the smallest p with alpha / m, so a lone regression must reach that: the fewest
    questions lost with none gained that does is the least k with 0.5^k <= alpha / m (exact McNemar, one-sided).
    The minimum detectable regression (:func:`validate.stats.min_detectable_regression`) is taken at the observed
    discordant rate (b + c) / n and the same alpha / m; the 95% interval of the accuracy difference is
    Newcombe's (:func:`validate.stats.paired_diff_ci`).
    """
    import math

    if not tasks:
        return
    a_lone = alpha / len(tasks)
    k = math.ceil(math.log(a_lone) / math.log(0.5) - 1e-12)
    for t in tasks:
        both = t.correct_baseline - t.b
        d = t.n - both - t.b - t.c
        ci = paired_diff_ci(both, t.b, t.c, d)
        t.diff_ci = (ci.lower, ci.upper)
        t.min_flaggable_drop = k
        t.power = power
        t.mdr = None if t.b + t.c == 0 else min_detectable_regression(t.n, (t.b + t.c) / t.n, a_lone, power)


def apply_holm(tasks: list[PairedTask], alpha: float) -> None:
    """Holm-adjust the one-sided p of ``tasks`` together; mark a regression where adjusted p < alpha and b > c, but
    never on a task of random weights (its accuracy is noise; it stays in the family, so the other tasks' adjusted p
    do not depend on whether a configuration's weights are random)."""
    if not tasks:
        return
    adj = holm({f"{t.config}/{t.task}": t.p_one_sided for t in tasks}, alpha=alpha)
    for t in tasks:
        h = adj[f"{t.config}/{t.task}"]
        t.p_holm = h.p_adjusted
        t.regression = bool(h.reject and t.b > t.c) and not t.random_weights


@dataclass
class Comparison:
    candidate: str
    baseline: str
    tasks: list[PairedTask]
    unpaired: list[str]  # reasons, one per task that could not be paired
    alpha: float
    # the unpaired of them that no subset explains: both full sets (or the baseline's record incomplete), yet not
    # comparable (other scoring params, data, prompts). In a release these are "cannot check", not "Not checked"
    blocking: list[str] = field(default_factory=list)
    renamed: list[str] = field(default_factory=list)  # tasks paired by kind with a baseline suite of another name


def compare_releases(reports: Path, candidate: str, baseline: str, configs: list[str] | None = None,
                     against_config: str | None = None, alpha: float = 0.05, reports_baseline: Path | None = None,
                     tasks: list[str] | None = None, skipped: list[str] | None = None,
                     across_thinking: bool = False) -> Comparison:
    """Pair every eval record of ``candidate`` with the baseline's record of the same task.

    Args:
        configs: only these configurations of the candidate (default: all with eval records).
        tasks: only these eval suites (default: all).
        skipped: see :func:`validate.record.release_records` (for the baseline's files).
        across_thinking: see :func:`pair`.
        against_config: the baseline's configuration (default: the same name), e.g. bf16 against fp32.
        reports_baseline: where the baseline's records are (default: ``reports``).
    Raises:
        InputError: no eval records for the candidate or the baseline.
    """
    from validate.suite import paired_eval_kinds

    if (candidate == baseline and not against_config
            and (reports_baseline is None or Path(reports_baseline).resolve() == Path(reports).resolve())):
        raise InputError(f"{candidate} against itself: a release is never its own baseline (to compare two "
                         "configurations of one release, name the baseline's with --against-config)")

    from validate.pairing import match_records

    kinds = paired_eval_kinds()
    cand = [r for r in release_records(reports, candidate) if r.suite_kind in kinds]
    base_list = [r for r in release_records(reports_baseline or reports, baseline, skipped) if r.suite_kind in kinds]
    if configs:
        cand = [r for r in cand if r.config in configs]
    if tasks:
        cand = [r for r in cand if r.suite in tasks]
        base_list = [r for r in base_list if r.suite in tasks]
    if not cand:
        raise InputError(f"no eval records for {candidate}" + (f" on {', '.join(configs)}" if configs else "") + f" under {reports}")
    if not base_list:
        raise InputError(f"no eval records for the baseline {baseline} under {reports_baseline or reports}")
    from validate.audit import audit_records

    audit_records(cand, reports)  # each item judged again from its output, the counts recounted (Runner.audit)
    audit_records(base_list, reports_baseline or reports)
    tasks, unpaired, blocking, renamed = [], [], [], []
    same_folder = reports_baseline is None or Path(reports_baseline).resolve() == Path(reports).resolve()
    matching = match_records(cand, base_list, against_config, configs)
    for m in matching.pairs:
        r, b = m.cand, m.base
        key = (b.config, b.suite) if b is not None else (against_config or r.config, r.suite)
        if m.refused:
            unpaired.append(m.refused)
            blocking.append(m.refused)
            continue
        if m.renamed:
            renamed.append(m.renamed)
        if b is not None and candidate == baseline and same_folder and key == (r.config, r.suite):
            unpaired.append(f"{r.config}/{r.suite}: a record is never its own baseline")
            blocking.append(unpaired[-1])
            continue
        if b is not None and same_run(b, r):
            unpaired.append(f"{r.config}/{r.suite}: the baseline {baseline}'s record is a copy of the candidate's (the same "
                            "run: tree, start time and outputs): a record is never its own baseline")
            blocking.append(unpaired[-1])
            continue
        if b is None:
            unpaired.append(f"{r.config}/{r.suite}: the baseline {baseline} has no record of {key[0]}/{key[1]}")
            continue
        stand = [f"the {label}'s record does not stand on what it holds: {x.audit_failed}"
                 for label, x in (("candidate", r), ("baseline", b)) if x.audit_failed]
        if stand:  # a flag or a count the data do not give decides nothing, either way
            unpaired.append(f"{r.config}/{r.suite}: cannot pair: " + "; ".join(stand))
            blocking.append(unpaired[-1])
            continue
        try:
            tasks.append(pair(b, r, across_thinking, configuration=against_config is None))
            tasks[-1].baseline_task = b.suite
        except PairingError as e:
            unpaired.append(str(e))
            # a quick subset of the candidate against a full baseline is the run's own choice (listed); anything
            # else, a subset baseline under a full candidate included, should have been compared and was not
            cand_subset = r.dataset is not None and r.dataset.subset
            if r.verdict.status in ("pass", "fail") and not (cand_subset and any(SUBSET_REASON in w for w in e.reasons)):
                blocking.append(str(e))
    # A task the baseline has and the candidate lacks is a gap, never a silent pass: it blocks where the candidate
    # ran the configuration (a configuration left out of the run is limited in a release)
    for b, config_run in sorted(matching.lacking, key=lambda x: (x[0].config, x[0].suite)):
        unpaired.append(f"{b.config}/{b.suite}: the candidate {candidate} has no record of it (the baseline {baseline} "
                        f"has, of suite kind {b.suite_kind!r})" + ("" if config_run else
                                                                 f"; the candidate ran no eval on {b.config}"))
        if config_run:
            blocking.append(unpaired[-1])
    apply_holm(tasks, alpha)
    attach_sensitivity(tasks, alpha)
    return Comparison(candidate, baseline, tasks, unpaired, alpha, blocking, renamed)


#: ``--baseline none``: compare with no baseline (the automatic choice is :func:`previous_release`).
NO_BASELINE = "none"


def resolve_baseline(reports: Path, release: str, baseline: str | None) -> str | None:
    """The baseline a run compares with (:func:`choose_baseline`'s name)."""
    return choose_baseline(reports, release, baseline)[0]


def choose_baseline(reports: Path, release: str, baseline: str | None,
                    want: set[tuple[str, str]] | None = None) -> tuple[str | None, str]:
    """(the baseline a run compares with, why that one): ``baseline`` as named; None for :data:`NO_BASELINE`;
    else :func:`previous_release` (``want``: the candidate's gated (configuration, suite kind) pairs, which
    the baseline must hold one of). The reason is said in the notes and on the console."""
    if baseline == NO_BASELINE:
        return None, "--baseline none: no baseline"
    if baseline:
        return baseline, "named with --baseline"
    name = previous_release(reports, release, want)
    by_version = _version(release) is not None
    # the whole rule (most configurations and suites, newest among equals) is in the README; this is said often
    rule = RELEASED_RULE + "; name another with --baseline"
    if name is None:
        return None, (f"no {'older ' if by_version else ''}released version under reports/ holds a record to compare "
                      f"with ({rule})")
    if by_version:
        return name, f"the newest released version older than {release} that can be compared with ({rule})"
    return name, (f"{release!r} is not a version: the newest released version under reports/ that can be compared "
                  f"with ({rule})")


def _version(name: str):
    """``name`` as a packaging Version ('v0.3.3' and '0.3.3' alike; one leading 'v' only), None when it is not
    one. Any PEP 440 version: what a candidate's name is ordered by (the baselines are :func:`released_version`)."""
    from packaging.version import InvalidVersion, Version

    stem = name[1:] if name.startswith("v") else name
    if not stem[:1].isdigit():
        return None
    try:
        return Version(stem)
    except InvalidVersion:
        return None


#: The rule for a folder name that is a released version, said in the notes and the docs.
RELEASED_RULE = ("a released version is a folder named as a PEP 440 final release, optionally 'v'-prefixed, in "
                 "canonical form with at least major.minor (v0.3.2, 1.0, v0.3.2.post1): never a pre-release (rc, a, "
                 "b), dev or local version (+exp), an epoch, or a bare number such as a pull request's 1234")


def released_version(name: str):
    """``name`` as a packaging Version when it names a released version (:data:`RELEASED_RULE`), else None.

    A post-release (v0.3.2.post1) is a release of the same version's code with a fix outside it, so it counts;
    a name whose canonical form differs (v0.3.2-1, 01.2) or that has one release component (1234, a pull
    request's folder) does not."""
    k = _version(name)
    stem = name[1:] if name.startswith("v") else name
    if (k is None or str(k) != stem or len(k.release) < 2 or k.epoch or k.is_prerelease or k.is_devrelease
            or k.local is not None):
        return None
    return k


def previous_release(reports: Path, release: str, want: set[tuple[str, str]] | None = None) -> str | None:
    """The baseline release under ``reports`` for ``release``: among the *released* versions
    (:func:`released_version`: no pre-release such as v0.2.0rc1, no dev release, no local version such as
    v0.3.1+exp, no bare number such as a pull request's 1234/) older than ``release`` by version order
    (v0.3.2 before v0.3.3, v0.9 before v0.10), or for a name that is not a version (such as ``candidate``) among
    every released version, the one that holds records a gate compares (a paired eval or BetterBench) of the most
    (configuration, suite kind) pairs of ``want`` (any such record, when None), the newest among equals. A
    version that holds every pair is so taken over a newer one that holds only some (an eval-only point release
    would otherwise leave the candidate's BetterBench figures uncompared). A file that is no readable record
    counts as a folder that may hold one (the gates then say what they could not compare). A pre-release of the
    same version may itself have regressed, and an aborted run, a ``dev`` folder or a sibling candidate compared
    with would hide a regression: none is taken automatically."""
    found = []
    for k, name in _eligible(reports, release):
        eligible, pairs = _held(reports / name, want)
        if eligible:
            found.append((len(pairs) if want is not None else 0, k, name))
    return max(found)[2] if found else None


def _eligible(reports: Path, release: str) -> list:
    """(Version, folder name) of every released version under ``reports`` a baseline of ``release`` may be."""
    if not reports.is_dir():
        return []
    cur = _version(release)
    out = []
    for d in reports.iterdir():
        k = released_version(d.name) if d.is_dir() and d.name != release else None
        if k is None or (cur is not None and k >= cur):
            continue
        out.append((k, d.name))
    return out


def _held(folder: Path, want: set[tuple[str, str]] | None) -> tuple[bool, set[tuple[str, str]]]:
    """(whether ``folder`` holds a gated record (of ``want`` where given), or a file that may be one; the pairs of
    ``want`` it holds)."""
    from validate.loadgate import ARRIVALS_KIND
    from validate.perfgate import BENCH_KIND
    from validate.suite import paired_eval_kinds

    gated = set(paired_eval_kinds()) | {BENCH_KIND, ARRIVALS_KIND}  # every kind a gate compares (the share gates too)
    eligible, pairs = False, set()
    for p in folder.glob("*/*.json"):
        named = _kind_config(p)
        if named is None:
            eligible = True
            continue
        kind, cfg = named
        # ``want`` names gated kinds, and a random-weight configuration's answers under load (validate.loadgate)
        if (cfg, kind) in want if want is not None else kind in gated:
            eligible = True
            pairs.add((cfg, kind))
    return eligible, pairs


def _kind_config(path: Path) -> tuple[str, str] | None:
    """(suite kind, configuration) the record file ``path`` names, or None when it is no readable record to choose
    a baseline by (no JSON object naming both as text)."""
    try:
        st = path.stat()
    except OSError:
        return None
    return _kind_config_of(str(path), st.st_mtime_ns, st.st_size)


@functools.lru_cache(maxsize=4096)
def _kind_config_of(path: str, mtime_ns: int, size: int) -> tuple[str, str] | None:
    """:func:`_kind_config` of one version of a file (keyed by its modification time and size): the baseline's
    rules read every eligible release's records once per check, and a release run asks once per suite."""
    try:
        d = json.loads(Path(path).read_text())
        kind, cfg = d.get("suite_kind"), d.get("config")
    except (OSError, ValueError, AttributeError, RecursionError):
        return None
    return (kind, cfg) if isinstance(kind, str) and isinstance(cfg, str) else None


def _version_in(eligible: list, base: str):
    """The Version of folder ``base`` among :func:`_eligible`'s (Version, name) pairs, None when it is not one."""
    return next((k for k, name in eligible if name == base), None)


def unreadable_newer(reports: Path, release: str, base: str) -> list[str]:
    """The releases the automatic baseline ``base`` could have been, newer than it, that hold a file that is no
    readable record (:func:`_held` counts such a file as one that may hold a gated record): what it held was
    compared with nothing, so each is said rather than passed over for an older release."""
    eligible = _eligible(reports, release)
    base_k = _version_in(eligible, base)
    out = []
    for k, name in sorted(eligible):
        if name == base or (base_k is not None and k <= base_k):
            continue
        if any(_kind_config(p) is None for p in (reports / name).glob("*/*.json")):
            out.append(name)
    return out


def same_version(reports: Path, release: str, base: str, want: set[tuple[str, str]] | None = None) -> list[str]:
    """The other folders under ``reports`` that name the same released version as the automatic baseline ``base``
    (``v0.3`` and ``v0.3.0``, ``v0.3.2`` and ``0.3.2``) and hold a record of ``want``'s gated pairs (or a file that
    may be one, :func:`_held`): which of them is the release is not said by the records, and the choice among
    equals (by folder name) could compare against a stale run of it, so each is named."""
    eligible = _eligible(reports, release)
    base_k = _version_in(eligible, base)
    here = (reports / base).resolve()  # a link to the baseline's folder holds the same records: no doubt
    return sorted(name for k, name in eligible
                  if base_k is not None and k == base_k and name != base and (reports / name).resolve() != here
                  and _held(reports / name, want)[0])


def held_elsewhere(reports: Path, release: str, base: str,
                   want: set[tuple[str, str]]) -> dict[tuple[str, str], tuple[str, bool]]:
    """The pairs of ``want`` whose newest record among the releases the automatic baseline could have been is not
    the baseline ``base``'s: {(configuration, suite kind): (that newer release, whether ``base`` holds an older
    record of it)}. Either ``base`` lacks the pair (its gate compared nothing though a baseline of it exists) or
    holds an older record of it than a newer release does (its gate compared against a release the last one may
    have moved from: a regression since would be hidden). Each is said (and not checked) rather than left out."""
    eligible = _eligible(reports, release)
    base_k = _version_in(eligible, base)
    newest: dict[tuple[str, str], tuple] = {}
    for k, name in eligible:
        for pair in _held(reports / name, want)[1]:
            if pair not in newest or k > newest[pair][0]:
                newest[pair] = (k, name)
    _, mine = _held(reports / base, want)
    return {pair: (name, pair in mine) for pair, (k, name) in sorted(newest.items())
            if name != base and (pair not in mine or base_k is None or k > base_k)}

"""The performance gate: BetterBench figures of a candidate release against a baseline, pass by pass.

A figure regresses when both hold (and passes only when it moved by no more than its threshold):

1. practical: the candidate's median is worse than the baseline's by more than the figure's threshold (percent
   of the baseline median; the ``perf_gate`` stored in the baseline's record, else the suite file's; defaults
   decode step +3 %, combined decode -3 %, prefill -5 %);
2. significant: a one-sided Mann-Whitney rank test of the candidate's per-pass values against the baseline's
   (scipy.stats.mannwhitneyu, exact where no values tie) gives p < alpha.

The median hides a shift of some passes (9 of 20 twice as slow leave it where it was): a significant rank test
together with the mean or the bad tail (the 90th percentile of a time, the 10th of a rate) worse by more than the
threshold is a regression too.

A shift that is significant and larger than the threshold is a regression wherever it lies against the band:
the band (:func:`run_band`: the 10th to 90th percentile of the baseline's passes where there are five or more,
else their min and max) is shown to tell noise from a change, never to excuse one.

With n and m passes the smallest p the rank test can give is 1 / C(n + m, n) (1/6 for 2 and 2). Where that is
not below alpha the gate *cannot tell*: the figure is neither a regression nor a pass, whatever its move, and
the message says how many passes a side would let it decide (:func:`passes_needed`).

Where the run-to-run drift between runs of one tree on the hardware is known (the configuration's
``perf_noise_pct``, stored in the baseline's record), a move must pass it too to be a regression.

Marks: "slower" (a regression), "faster" (the same conditions in the good direction), "within the threshold"
(moved by no more than its threshold: a pass), "cannot tell" (worse by more than the threshold, but the pass
counts cannot give p < alpha, the passes do not separate, or the move lies within the run-to-run drift: never a
pass), "not significant" (better, not separated). Lower is better for times (``_ms`` in the name), higher for
rates (``_tok_s``); a figure of neither kind is not judged.
"""
from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, field_validator

from validate.errors import InputError
from validate.pairing import apart
from validate.record import Record, release_records, same_run

BENCH_KIND = "betterbench"
# Suite parameters that decide what a figure measures; records that differ in one never compare. Only the number
# of passes may differ (the rank test takes the counts as they are).
MEASURING_PARAMS = ("decode_tokens", "prefill_depths", "concurrency", "requests_per_client", "prompt_tokens", "agg_tokens",
                    "shared_copies", "shared_tokens", "prefix_tokens", "prefix_suffix_tokens", "prefix_concurrency",
                    "prefix_output_tokens", "seed")
#: The shared-prompt and prefix rows' parameters: a baseline recorded before the rows existed holds none of them;
#: its other figures still compare, and the rows' figures are "not measured by the baseline" (limited).
ROW_PARAMS = ("shared_copies", "shared_tokens", "prefix_tokens", "prefix_suffix_tokens", "prefix_concurrency",
              "prefix_output_tokens")
#: Row parameters whose None means another parameter's value (the rows' answers default to agg_tokens).
_DEFAULTS_TO = {"shared_tokens": "agg_tokens", "prefix_output_tokens": "agg_tokens"}


def measuring_params(r: Record) -> dict:
    """A BetterBench record's measuring parameters as they were run: None resolved to what it stands for
    (:data:`_DEFAULTS_TO`), the row parameters left out where the record holds none of them (it predates them)."""
    p = r.params if isinstance(r.params, dict) else {}
    rows = any(k in p for k in ROW_PARAMS)
    out = {k: p.get(k) for k in MEASURING_PARAMS if rows or k not in ROW_PARAMS}
    for k, other in _DEFAULTS_TO.items():
        if k in out and out[k] is None:
            out[k] = p.get(other)
    return out


class PerfGateSpec(BaseModel):
    """``perf_gate`` of a suite file: thresholds in percent of the baseline median, by figure name; a key with a
    ``*`` matches every figure its pattern does (``prefill_*`` every depth, ``c*_tok_s`` every concurrency level's
    aggregate rate); a figure's own name comes first, then the first pattern in the file's order."""

    model_config = ConfigDict(extra="forbid")
    thresholds_pct: dict[str, float] = Field(
        default_factory=lambda: {"decode_step_ms": 3.0, "combined_decode_tok_s": 3.0, "prefill_*": 5.0})
    alpha: float = Field(0.05, gt=0, lt=1)

    @field_validator("thresholds_pct")
    @classmethod
    def _finite(cls, v: dict[str, float]) -> dict[str, float]:
        bad = [k for k, t in v.items() if not (math.isfinite(t) and t >= 0)]
        if bad:  # a NaN threshold is never exceeded: the figure could never regress
            raise ValueError(f"threshold of {', '.join(bad)} must be a finite number >= 0 (percent)")
        return v

    def threshold(self, figure: str) -> float | None:
        """The threshold (percent) for ``figure``, None when the gate does not cover it."""
        if figure in self.thresholds_pct:
            return self.thresholds_pct[figure]
        from fnmatch import fnmatchcase

        for key, pct in self.thresholds_pct.items():
            if "*" in key and fnmatchcase(figure, key):
                return pct
        return None


@dataclass
class PerfFigure:
    """One gated figure of one configuration, candidate against baseline.

    ``base`` / ``cand``: per-pass values (unit of the figure). ``change_pct``: candidate median against the
    baseline's, signed (positive = higher). ``worse_pct``: the same move counted in the bad direction.
    ``p_value``: one-sided Mann-Whitney p for "the candidate is worse"; ``min_p``: the least p these pass counts
    allow. ``mark``: see the module docstring. ``regression``: both conditions hold. ``cannot_tell``: ``min_p`` is
    not below alpha.
    """

    config: str
    figure: str
    unit: str
    lower_is_better: bool
    base: list[float]
    cand: list[float]
    threshold_pct: float
    alpha: float
    base_median: float = 0.0
    cand_median: float = 0.0
    change_pct: float = 0.0
    worse_pct: float = 0.0
    p_value: float = 1.0
    min_p: float = 1.0
    outside_band: bool = False
    mark: str = "within the threshold"
    regression: bool = False
    cannot_tell: bool = False  # worse by more than the threshold without the evidence to call it: never a pass
    mean_worse_pct: float = 0.0  # the mean's move, in the bad direction (percent of the baseline's mean)
    tail_worse_pct: float = 0.0  # the bad tail's move (p90 of a time, p10 of a rate), in the bad direction
    suite: str = BENCH_KIND
    floor_pct: float = 0.0  # the run-to-run drift the move was held against
    message: str = ""
    base_band: tuple[float, float] = (0.0, 0.0)  # run_band of each side
    cand_band: tuple[float, float] = (0.0, 0.0)


def run_band(values: list[float]) -> tuple[float, float]:
    """A figure's run-to-run band: its 10th to 90th percentile over the passes where there are five or more (one
    slow pass must not widen it over a regression), else their min and max."""
    import numpy as np

    if len(values) >= 5:
        lo, hi = np.percentile(np.asarray(values, dtype=float), [10, 90])
        return float(lo), float(hi)
    return min(values), max(values)


def passes_needed(n_base: int, alpha: float) -> int:
    """The fewest candidate passes with which a rank test against ``n_base`` baseline passes can give
    p < ``alpha`` (least p 1 / C(n_base + n, n)); with ``n_base`` below that, the same count a side."""
    for n in range(1, 200):
        if 1.0 / math.comb(n_base + n, n) < alpha:
            return n
    return 200


def passes_a_side(alpha: float) -> int:
    """The fewest passes a side with which the rank test can give p < ``alpha`` (least p 1 / C(2n, n))."""
    n = 1
    while 1.0 / math.comb(2 * n, n) >= alpha:
        n += 1
    return n


def lower_is_better(figure: str) -> bool | None:
    """Whether a smaller value of ``figure`` is better, read from its unit: times (``_ms``, anywhere in the name:
    ``decode_step_ms``, ``c8_ttft_ms_p50``) are, rates (``_tok_s``, ``_per_s``) are not; None for a name of
    neither kind (the gate refuses to guess)."""
    if "_ms" in figure:
        return True
    if figure.endswith(("_tok_s", "_per_s")) or "_tok_s_" in figure:
        return False
    return None


def judge(config: str, figure: str, base: list[float], cand: list[float], threshold_pct: float,
          alpha: float = 0.05, suite: str = BENCH_KIND, floor_pct: float = 0.0, floor_why: str = "") -> PerfFigure:
    """Apply the rule of the module docstring to one figure.

    Args:
        base, cand: per-pass values of the figure (its unit; :func:`lower_is_better` gives the direction).
        threshold_pct: the practical threshold, percent of the baseline median.
        alpha: the rank test's significance level.
        floor_pct, floor_why: the run-to-run drift between runs of one tree on this hardware (percent) and where
            that figure comes from: a move past the threshold but not past the drift cannot be told from it.
    Raises:
        ValueError: either side has no values, the figure's direction is unknown, or the baseline's median is not
            a positive number (a move cannot be put in percent of it).
    """
    from scipy.stats import mannwhitneyu

    if not base or not cand:
        raise ValueError(f"{config}/{figure}: no per-pass values on one side")
    lower = lower_is_better(figure)
    if lower is None:
        raise ValueError(f"{config}/{figure}: neither a time (_ms) nor a rate (_tok_s): which way is worse is unknown")
    f = PerfFigure(config, figure, "ms" if lower else "tok/s", lower, list(base), list(cand), threshold_pct, alpha)
    f.suite, f.floor_pct = suite, floor_pct
    f.base_median, f.cand_median = statistics.median(base), statistics.median(cand)
    if not f.base_median > 0:
        raise ValueError(f"{config}/{figure}: the baseline's median is {f.base_median!r}: a move cannot be put in "
                         "percent of it")
    bad = [v for v in (*base, *cand) if not (math.isfinite(v) and v > 0)]
    if bad:  # a time or a rate is positive and finite: 0 ms or -1 ms would read as faster than anything
        raise ValueError(f"{config}/{figure}: a pass value of {bad[0]!r} is no time or rate")
    f.change_pct = 100.0 * (f.cand_median - f.base_median) / f.base_median
    f.worse_pct = f.change_pct if lower else -f.change_pct
    f.mean_worse_pct, f.tail_worse_pct = _spread_moves(base, cand, lower)
    f.base_band, f.cand_band = run_band(base), run_band(cand)
    lo, hi = f.base_band
    f.outside_band = (f.cand_median > hi) if lower else (f.cand_median < lo)
    better_outside = (f.cand_median < lo) if lower else (f.cand_median > hi)
    # exact where it is valid (no ties) and cheap; else the normal approximation with tie correction
    exact = len(set(base) | set(cand)) == len(base) + len(cand) and len(base) * len(cand) <= 10_000
    worse_way = "greater" if lower else "less"
    f.p_value = float(mannwhitneyu(cand, base, alternative=worse_way, method="exact" if exact else "asymptotic").pvalue)
    p_better = float(mannwhitneyu(cand, base, alternative="less" if lower else "greater",
                                  method="exact" if exact else "asymptotic").pvalue)
    f.min_p = 1.0 / math.comb(len(base) + len(cand), len(cand))
    f.cannot_tell = f.min_p >= alpha
    bar = max(threshold_pct, floor_pct)
    # the median alone hides a shift of some passes (9 of 20 twice as slow leave it where it was): the rank test
    # sees it, and the mean or the tail in the bad direction says how large it is
    hidden = f.worse_pct <= bar and max(f.mean_worse_pct, f.tail_worse_pct) > bar
    f.regression = not f.cannot_tell and (f.worse_pct > bar or hidden) and f.p_value < alpha
    band = "beyond the baseline's band" if f.outside_band or better_outside else "inside the baseline's band"
    move = f"{f.worse_pct:+.1f}% in the bad direction (threshold {threshold_pct:g}%), {band}"
    if f.cannot_tell:
        n = passes_needed(len(base), alpha)
        f.mark = "cannot tell"
        f.message = (f"cannot tell: {len(base)} and {len(cand)} passes cannot be significant (the least rank-test p "
                     f"is {f.min_p:.3g}, not below {alpha:g}); {move}; at least {n} candidate passes against these "
                     f"{len(base)} (or {passes_a_side(alpha)} a side) would let the gate decide")
        return f
    if f.regression:
        f.mark = "slower"
        f.message = f"a regression: {move}, rank-test p = {f.p_value:.3g} < {alpha:g}"
        if hidden:
            f.message = (f"a regression the median hides: the median {f.worse_pct:+.1f}%, the mean "
                         f"{f.mean_worse_pct:+.1f}% and the {'90th' if lower else '10th'} percentile "
                         f"{f.tail_worse_pct:+.1f}% in the bad direction (threshold {threshold_pct:g}%), rank-test "
                         f"p = {f.p_value:.3g} < {alpha:g}")
        if floor_pct > threshold_pct:
            f.message += f"; beyond the run-to-run drift of {floor_pct:g}% too"
    elif -f.worse_pct > bar and p_better < alpha:
        f.mark = "faster"
        f.message = f"faster: {-f.worse_pct:+.1f}% in the good direction, {band}, rank-test p = {p_better:.3g}"
    elif hidden:  # a tail far past the bar that the rank test does not separate: never "within the threshold"
        f.cannot_tell, f.mark = True, "cannot tell"
        f.message = (f"cannot tell: the median {f.worse_pct:+.1f}%, but the mean {f.mean_worse_pct:+.1f}% and the "
                     f"{'90th' if lower else '10th'} percentile {f.tail_worse_pct:+.1f}% in the bad direction "
                     f"(threshold {threshold_pct:g}%), and the rank test does not separate the passes "
                     f"(p = {f.p_value:.3g}, alpha {alpha:g}): some passes are far slower; more passes would decide")
    elif abs(f.worse_pct) <= threshold_pct:
        f.mark = "within the threshold"
        f.message = f"{move}: within the {threshold_pct:g}% threshold; rank-test p = {f.p_value:.3g}"
    elif f.worse_pct > 0 and f.worse_pct <= floor_pct:
        f.cannot_tell, f.mark = True, "cannot tell"
        f.message = (f"cannot tell: {move}, but within the run-to-run drift of {floor_pct:g}% between runs of one "
                     f"tree ({floor_why}); rank-test p = {f.p_value:.3g}")
    elif f.worse_pct > 0:
        f.cannot_tell, f.mark = True, "cannot tell"
        f.message = (f"cannot tell: {move}, but the rank test does not separate the passes "
                     f"(p = {f.p_value:.3g}, alpha {alpha:g}): more passes would decide")
    else:
        f.mark = "not significant"
        f.message = (f"{-f.worse_pct:+.1f}% in the good direction, {band}, not separated by the rank test "
                     f"(p = {p_better:.3g})")
    return f


def _spread_moves(base: list[float], cand: list[float], lower: bool) -> tuple[float, float]:
    """(the mean's move, the bad-direction tail's move), each in percent of the baseline's and counted in the bad
    direction: the tail is the 90th percentile for a time (slow passes), the 10th for a rate (numpy's linear
    interpolation)."""
    import numpy as np

    q = 90 if lower else 10
    out = []
    for b, c in ((statistics.fmean(base), statistics.fmean(cand)),
                 (float(np.percentile(base, q)), float(np.percentile(cand, q)))):
        move = 100.0 * (c - b) / b if b > 0 else 0.0
        out.append(move if lower else -move)
    return out[0], out[1]


def _rows(r: Record) -> list[dict]:
    """A record's per-pass rows, those that are mappings (a record edited by hand may hold anything)."""
    rows = r.metrics.get("per_pass") if isinstance(r.metrics, dict) else None
    return [row for row in rows if isinstance(row, dict)] if isinstance(rows, list) else []


def _passes(records: list[Record], figure: str) -> list[float]:
    """The finite per-pass values of ``figure`` (NaN, infinity or a non-number is no measurement)."""
    return [float(row[figure]) for r in records for row in _rows(r)
            if isinstance(row.get(figure), (int, float)) and not isinstance(row.get(figure), bool)
            and math.isfinite(row[figure])]


def unusable_passes(r: Record, figure: str, label: str) -> list[str]:
    """Why ``figure``'s per-pass values in record ``r`` cannot be used, naming each pass: a value that is not a
    positive finite number (NaN, Infinity, null, a string, a boolean, 0 or below), or the figure missing from
    some passes of a record that measured it in others (the runner writes every figure of every pass it
    completed). [] when every pass holds a positive finite number, or none holds the figure. ``label``:
    "baseline" or "candidate", for the message."""
    rows = _rows(r)
    held = [row for row in rows if figure in row]
    if not held:
        return []
    out = []
    for i, row in enumerate(held):
        v = row[figure]
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0:
            # a time or a rate is a positive finite number: 0 ms would read as faster than anything
            out.append(f"pass {row.get('pass', i)!r} of the {label} holds {v!r}, not a positive finite number")
    missing = [row.get("pass", i) for i, row in enumerate(rows) if figure not in row]
    if missing:
        out.append(f"the {label} measured it in {len(held)} of {len(rows)} passes (missing from pass "
                   f"{', '.join(map(str, missing[:5]))}{' ...' if len(missing) > 5 else ''})")
    return out


@dataclass
class PerfComparison:
    """The performance gate of one candidate against one baseline.

    ``unpaired``: one reason per configuration and suite that should have been compared and could not (other
    measuring parameters, server settings, model or hardware; a side that did not complete; a gated figure the
    candidate lost): the gate cannot say "no regression". ``limited``: what was not compared by the run's own
    choice (a quick-profile run against a full one, a suite the baseline does not have): listed, never a pass.
    ``notes``: thresholds that differ between the two records, or that came from the checkout."""

    candidate: str
    baseline: str
    figures: list[PerfFigure] = field(default_factory=list)
    unpaired: list[str] = field(default_factory=list)
    limited: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


#: What may differ between the configurations of a pair across configurations (``--against-config``): the server's
#: extra flags (vLLM's offload against r9k's expert cache), besides what validate.pairing lets differ everywhere.
ACROSS_CONFIG_MAY_DIFFER = ("server.extra_args",)


def comparable(b: Record, c: Record, across: bool = False) -> list[str]:
    """Why the figures of record ``b`` (baseline) and ``c`` (candidate) of one suite measure different things, or
    [] when they measure the same: the measuring parameters as run (:func:`measuring_params`; a row parameter
    compares only where both records hold the rows) and :func:`validate.pairing.apart` (completion, kind, the
    configuration's settings as run, model and dtype, the machine, the metrics formula). ``across``: the two are
    records of different configurations compared on purpose (``--against-config``): their server's extra flags
    may differ (:data:`ACROSS_CONFIG_MAY_DIFFER`; the gate's notes name them), every other setting may not."""
    pb, pc = measuring_params(b), measuring_params(c)
    bad = apart(b, c, may_differ=ACROSS_CONFIG_MAY_DIFFER if across else ())
    diff = [k for k in MEASURING_PARAMS if k in pb and k in pc and pb[k] != pc[k]]
    if diff:
        bad.insert(0, "suite parameters differ (" + ", ".join(f"{k}: {pb[k]!r} vs {pc[k]!r}" for k in diff) + ")")
    return bad


def refusal(b: Record, c: Record, across: bool = False) -> list[str]:
    """Why the performance gate refuses to compare ``c`` with ``b``, or []: a record either side whose audit
    failed (``Record.audit_failed``, validate.audit), :func:`comparable`, a baseline that
    is a copy of the candidate (validate.record.same_run), a completed BetterBench record without per-pass
    values, a stored ``perf_gate`` that is not a valid one. The gate, the notes' Numbers table, their title and
    the figures compare and draw a pair only where this is empty: a refused baseline is compared nowhere."""
    if same_run(b, c):
        return ["the baseline's record is a copy of the candidate's (the same run: tree, start time and outputs): "
                "a record is never its own baseline"]
    # a record that does not stand on what it holds (validate.audit, run wherever a record is read) decides
    # nothing, either side
    bad = [f"the {label}'s record does not stand on what it holds: {r.audit_failed}"
           for label, r in (("baseline", b), ("candidate", c)) if r.audit_failed]
    bad += comparable(b, c, across)
    for label, r in (("baseline", b), ("candidate", c)):
        if r.suite_kind == BENCH_KIND and r.verdict.status in ("pass", "fail") and not _rows(r):
            bad.append(f"the {label} record holds no per-pass values")
        if r.perf_gate is not None:
            try:
                PerfGateSpec.model_validate(r.perf_gate)
            except ValueError as e:
                bad.append(f"the {label}'s stored perf_gate is not a valid one ({' '.join(str(e).split())[:200]})")
    return bad


def noise_floor(b: Record, c: Record | None = None) -> tuple[float, str]:
    """The run-to-run drift (percent) between runs of one tree on the baseline's hardware, and where it comes
    from: the configuration's ``perf_noise_pct`` (measured by ``python -m benchmarks.serving.perf_gate_fp``) as
    the baseline's record stores it, and never above what the candidate's record stores (the configuration as
    the tree under validation sets it: an edited baseline cannot excuse any move, and no stored value in the
    candidate means no floor). Passes within one run share the machine's state during that run, so a rank test
    across the passes of two runs cannot tell a change from the drift between the runs; a move within it is
    "cannot tell", never a pass. (0, "") where it is not set."""
    def stored(r: Record) -> float:
        v = (r.config_snapshot or {}).get("perf_noise_pct") if isinstance(r.config_snapshot, dict) else None
        return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v > 0 else 0.0

    vb = stored(b)
    if vb <= 0:
        return 0.0, ""
    if c is None:
        return vb, f"the configuration's perf_noise_pct in the baseline's record: {vb:g}%"
    vc = stored(c)
    if vc < vb:
        return vc, (f"the configuration's perf_noise_pct: {vb:g}% in the baseline's record, {vc:g}% in the "
                    f"candidate's: the smaller" if vc > 0 else "")
    return vb, f"the configuration's perf_noise_pct in the baseline's record: {vb:g}%"


@dataclass
class GateRule:
    """The thresholds a comparison is judged by: for each figure the smallest threshold of ``specs`` that
    covers it, at the largest alpha of them (the stricter of the baseline's stored gate and the checkout's suite
    file: neither a pull request nor an edited baseline record can loosen the gate)."""

    specs: list[PerfGateSpec]

    def threshold(self, figure: str) -> float | None:
        ts = [t for t in (s.threshold(figure) for s in self.specs) if t is not None]
        return min(ts) if ts else None

    @property
    def alpha(self) -> float:
        return max(s.alpha for s in self.specs)

    def describe(self) -> str:
        return " and ".join(_thresholds(s) for s in self.specs) + (", the stricter of them" if len(self.specs) > 1 else "")


def gate_spec(b: Record, c: Record, checkout: dict[str, PerfGateSpec], notes: list[str]) -> GateRule:
    """The thresholds a comparison of ``c`` against ``b`` is judged by (:class:`GateRule`): the stricter of those
    stored in the baseline's record and the checkout's suite file's (its defaults where the checkout has no
    such suite file), figure by figure. A baseline recorded before thresholds were stored is judged by the
    checkout's; a candidate recorded under other thresholds, and a baseline recorded under other ones than the
    checkout's suite file sets now, are said in ``notes``.

    Raises:
        InputError: a stored ``perf_gate`` that is not a valid one (naming the record).
    """
    def stored(r: Record) -> PerfGateSpec | None:
        if r.perf_gate is None:
            return None
        try:
            return PerfGateSpec.model_validate(r.perf_gate)
        except ValueError as e:
            raise InputError(f"{r.release}/{r.config}/{r.suite}.json: perf_gate: {e}") from None

    where = f"{c.config}/{c.suite}"
    sb, sc = stored(b), stored(c)
    mine = checkout.get(c.suite) or PerfGateSpec()
    if sb is None:
        rule = GateRule([mine])
        notes.append(f"{where}: the baseline {b.release} was recorded before thresholds were stored: the checkout's "
                     f"thresholds are used ({_thresholds(mine)})")
    elif sb == mine:
        rule = GateRule([sb])
    else:
        rule = GateRule([sb, mine])
        notes.append(f"{where}: the baseline {b.release} was recorded under other thresholds ({_thresholds(sb)}) "
                     f"than the checkout's suite file sets ({_thresholds(mine)}): each figure is judged by the "
                     "stricter of the two")
    if sc is not None and sc not in rule.specs:
        notes.append(f"{where}: the candidate was recorded under other thresholds ({_thresholds(sc)}) than the "
                     f"baseline's and the checkout's: {rule.describe()} are used")
    return rule


def _thresholds(spec: PerfGateSpec) -> str:
    return ", ".join(f"{k} {v:g}%" for k, v in spec.thresholds_pct.items()) + f", alpha {spec.alpha:g}"


def compare_perf(reports: Path, candidate: str, baseline: str, specs: dict[str, PerfGateSpec] | None = None,
                 configs: list[str] | None = None, reports_baseline: Path | None = None,
                 skipped: list[str] | None = None, records: list[Record] | None = None,
                 base_config: str | None = None, base_records: list[Record] | None = None) -> PerfComparison:
    """Gate every BetterBench record of ``candidate`` against the baseline's record of the same configuration
    and suite (:func:`comparable`), with the thresholds :func:`gate_spec` picks (``specs``: the checkout's, by
    suite name). ``skipped``: see :func:`validate.record.release_records` (for the baseline's files).
    ``records``, ``base_records``: the candidate's and the baseline's records as already read and audited
    (validate.audit.read_release: every command passes both; default: read from ``reports``, unaudited).
    ``base_config``: the baseline's configuration every candidate record is compared with (``--against-config``;
    e.g. r9k's expert cache against vLLM's offload at equal device memory): the server's extra flags may then
    differ, and the notes say how.

    Raises:
        InputError: the candidate has no BetterBench record; a stored perf_gate is malformed.
    """
    specs = specs or {}
    same_folder = reports_baseline is None or Path(reports_baseline).resolve() == Path(reports).resolve()
    if candidate == baseline and same_folder and (base_config is None or (configs or []) == [base_config]):
        raise InputError(f"{candidate} against itself: a release is never its own baseline")
    breports = reports_baseline or reports
    from validate.pairing import match_records

    cand = [r for r in (records if records is not None else release_records(reports, candidate))
            if r.suite_kind == BENCH_KIND and (not configs or r.config in configs)]
    base = [r for r in (base_records if base_records is not None else release_records(breports, baseline, skipped))
            if r.suite_kind == BENCH_KIND]
    if not cand:
        raise InputError(f"no BetterBench records for {candidate} under {reports}")
    out = PerfComparison(candidate, baseline)
    matching = match_records(cand, base, base_config=base_config, configs=configs)
    # a BetterBench record the baseline has and the candidate lacks: it blocks where the candidate ran the
    # configuration (a configuration left out of the run is limited in a release)
    for b, config_run in matching.lacking:
        (out.unpaired if config_run else out.limited).append(
            f"{b.config}/{b.suite}: the candidate {candidate} has no such record (the baseline {baseline} has)"
            + ("" if config_run else f"; the candidate ran no BetterBench on {b.config}"))
    for m in matching.pairs:
        c, b = m.cand, m.base
        where = f"{c.config}/{c.suite}"
        if m.refused:
            out.unpaired.append(m.refused)
            continue
        if m.renamed:
            out.notes.append(m.renamed)
        if b is None:
            out.limited.append(f"{where}: the baseline {baseline} has no such record")
            continue
        across = b.config != c.config
        bad = refusal(b, c, across)  # the one rule the notes' Numbers table, title and figures read too
        if same_run(b, c):
            out.unpaired.append(f"{where}: the baseline {baseline}'s record is a copy of the candidate's (the same "
                                "run: tree, start time and outputs): a record is never its own baseline")
            continue
        if bad:
            # only a quick candidate against a full baseline is the run's own choice, and only where the profile
            # explains every difference (its parameters); anything else should have been compared and was not
            profile_only = all(x.startswith("suite parameters differ") for x in bad)
            if profile_only and c.profile == "quick" and b.profile == "full":
                out.limited.append(f"{where}: the candidate ran the quick profile and the baseline the full one: their "
                                   f"figures measure other things ({'; '.join(bad)})")
            else:
                out.unpaired.append(f"{where}: cannot compare: " + "; ".join(bad))
            continue
        if across:
            flags = _flags_apart(b, c)
            out.notes.append(f"{where} against {b.config}/{b.suite}: two configurations compared on purpose"
                             + (f"; their servers' extra flags differ ({flags})" if flags else ""))
        try:
            spec = gate_spec(b, c, specs, out.notes)
        except InputError as e:
            out.unpaired.append(f"{where}: cannot compare: {e}")
            continue
        # each side is its current record's passes: an earlier run kept in history/ (a slow one planted, or the
        # drift between runs of one tree) would move the median the figure is judged by
        bruns, cruns = [b], [c]
        floor, floor_why = noise_floor(b, c)
        names = sorted({k for r in (b, c) for row in _rows(r) for k in row if k != "pass"})
        judged = 0
        for name in names:
            t = spec.threshold(name)
            if t is None:
                continue
            unusable = unusable_passes(b, name, "baseline") + unusable_passes(c, name, "candidate")
            if unusable:  # dropping them would judge the passes left: a figure of 8 passes out of 20 may pass
                out.unpaired.append(f"{where}: {name}: cannot judge: " + "; ".join(unusable[:4])
                                    + (f" (and {len(unusable) - 4} more)" if len(unusable) > 4 else ""))
                continue
            bv, cv = _passes(bruns, name), _passes(cruns, name)
            if bv and not cv:  # a gated figure the candidate lost is never a silent pass
                out.unpaired.append(f"{where}: {name} is gated and measured in the baseline but missing from the "
                                    "candidate (every pass failed it, or it was not measured)")
            elif cv and not bv:
                out.limited.append(f"{where}: {name} is gated but the baseline {baseline} did not measure it")
            elif bv and cv:
                try:
                    out.figures.append(judge(c.config, name, bv, cv, t, spec.alpha, c.suite, floor, floor_why))
                    judged += 1
                except ValueError as e:
                    out.unpaired.append(f"{where}: {name}: cannot judge: {e}")
        if not judged and not any(x.startswith(f"{where}:") for x in out.unpaired + out.limited):
            out.unpaired.append(f"{where}: no figure was judged: the thresholds ({spec.describe()}) cover none of "
                                "the figures both records measured")
    return out


def _flags_apart(b: Record, c: Record) -> str:
    """The server's extra flags each record holds and the other does not ("baseline +x; candidate +y"), or ""."""
    def flags(r: Record) -> list[str]:
        snap = r.config_snapshot if isinstance(r.config_snapshot, dict) else {}
        args = (snap.get("server") or {}).get("extra_args") if isinstance(snap.get("server"), dict) else None
        return [str(a) for a in args] if isinstance(args, list) else []

    fb, fc = flags(b), flags(c)
    parts = [f"{label} {' '.join(x for x in mine if x not in other)}"
             for label, mine, other in (("baseline", fb, fc), ("candidate", fc, fb)) if any(x not in other for x in mine)]
    return "; ".join(parts)

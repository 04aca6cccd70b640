"""The performance gate: BetterBench figures of a candidate release against a baseline, pass by pass.

A figure regresses only when all three hold, so that neither noise nor a trivial move fails a release:

1. practical: the candidate's median is worse than the baseline's by more than the figure's threshold (percent
   of the baseline median; the suite file's ``perf_gate``, default decode step +3 %, combined decode -3 %,
   prefill -5 %);
2. outside the band: the candidate's median lies beyond the baseline's run-to-run band (:func:`run_band`: the
   10th to 90th percentile of its passes where there are five or more, else their min and max), the passes of the
   baseline record and of earlier runs of it that measured the same thing;
3. significant: a one-sided Mann-Whitney rank test of the candidate's per-pass values against the baseline's
   (scipy.stats.mannwhitneyu, exact where no values tie) gives p < alpha. With n and m passes the smallest p it
   can give is 1 / C(n + m, n) (1/6 for 2 and 2): a gate on too few passes says that it cannot be significant.

Each figure is marked "slower" or "faster" when its median lies beyond the baseline's band in that direction by
more than the figure's threshold (conditions 1 and 2, either way); else "within the band" when it lies inside the
band, "within the threshold" when it lies past it by less than the threshold (a median just past a narrow band is
not a move). A "slower" figure is a regression only when the rank test agrees. Lower is better for
figures in milliseconds (``_ms``), higher for rates.
"""
from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, field_validator

from validate.errors import InputError
from validate.record import Record, record_history, release_records

BENCH_KIND = "betterbench"
# Suite parameters that decide what a figure measures; records that differ in one never compare.
MEASURING_PARAMS = ("decode_tokens", "prefill_depths", "concurrency", "requests_per_client", "prompt_tokens", "agg_tokens")


class PerfGateSpec(BaseModel):
    """``perf_gate`` of a suite file: thresholds in percent of the baseline median, by figure name; a key ending
    in ``*`` matches every figure it prefixes (``prefill_*`` for every depth)."""

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
        for key, pct in self.thresholds_pct.items():
            if key.endswith("*") and figure.startswith(key[:-1]):
                return pct
        return None


@dataclass
class PerfFigure:
    """One gated figure of one configuration, candidate against baseline.

    ``base`` / ``cand``: per-pass values (unit of the figure). ``change_pct``: candidate median against the
    baseline's, signed (positive = higher). ``worse_pct``: the same move counted in the bad direction.
    ``p_value``: one-sided Mann-Whitney p for "the candidate is worse"; ``min_p``: the least p these pass counts
    allow. ``mark``: "slower", "faster", "within the band" or "within the threshold". ``regression``: all three conditions hold.
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
    mark: str = "within the band"
    regression: bool = False
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


def judge(config: str, figure: str, base: list[float], cand: list[float], threshold_pct: float,
          alpha: float = 0.05) -> PerfFigure:
    """Apply the three conditions of the module docstring to one figure.

    Raises:
        ValueError: either side has no values.
    """
    from scipy.stats import mannwhitneyu

    if not base or not cand:
        raise ValueError(f"{config}/{figure}: no per-pass values on one side")
    lower = figure.endswith("_ms")
    f = PerfFigure(config, figure, "ms" if lower else "tok/s", lower, list(base), list(cand), threshold_pct, alpha)
    f.base_median, f.cand_median = statistics.median(base), statistics.median(cand)
    f.change_pct = 100.0 * (f.cand_median - f.base_median) / f.base_median if f.base_median else 0.0
    f.worse_pct = f.change_pct if lower else -f.change_pct
    f.base_band, f.cand_band = run_band(base), run_band(cand)
    lo, hi = f.base_band
    f.outside_band = (f.cand_median > hi) if lower else (f.cand_median < lo)
    better_outside = (f.cand_median < lo) if lower else (f.cand_median > hi)
    # exact where it is valid (no ties) and cheap; else the normal approximation with tie correction
    exact = len(set(base) | set(cand)) == len(base) + len(cand) and len(base) * len(cand) <= 10_000
    f.p_value = float(mannwhitneyu(cand, base, alternative="greater" if lower else "less",
                                   method="exact" if exact else "asymptotic").pvalue)
    f.min_p = 1.0 / math.comb(len(base) + len(cand), len(cand))
    f.mark = ("slower" if f.outside_band and f.worse_pct > threshold_pct else
              "faster" if better_outside and -f.worse_pct > threshold_pct else
              "within the threshold" if f.outside_band or better_outside else "within the band")
    f.regression = f.worse_pct > threshold_pct and f.outside_band and f.p_value < alpha
    why = []
    if f.regression:
        why.append(f"a regression: {f.worse_pct:+.1f}% worse (threshold {threshold_pct:g}%), beyond the baseline's "
                   f"band, rank-test p = {f.p_value:.3g} < {alpha:g}")
    else:
        if f.worse_pct <= threshold_pct:
            why.append(f"{f.worse_pct:+.1f}% in the bad direction, within the {threshold_pct:g}% threshold")
        if not f.outside_band:
            why.append("inside the baseline's run-to-run band")
        if f.p_value >= alpha:
            why.append(f"rank-test p = {f.p_value:.3g}" + (f" (the least {len(base)} and {len(cand)} passes can give is "
                                                           f"{f.min_p:.3g}: cannot be significant)" if f.min_p >= alpha else ""))
    f.message = "; ".join(why)
    return f


def _passes(records: list[Record], figure: str) -> list[float]:
    """The finite per-pass values of ``figure`` (NaN or infinity is no measurement)."""
    return [float(row[figure]) for r in records for row in r.metrics.get("per_pass", [])
            if isinstance(row.get(figure), (int, float)) and math.isfinite(row[figure])]


@dataclass
class PerfComparison:
    candidate: str
    baseline: str
    figures: list[PerfFigure] = field(default_factory=list)
    unpaired: list[str] = field(default_factory=list)  # one reason per configuration that could not be compared


def _same_tree_runs(reports: Path, rec: Record) -> list[Record]:
    """``rec`` and the earlier runs of it kept in history that measured the same thing the same way: the same
    plugin and engine source, configuration, suite (kind, params, gate) and metrics formula version."""
    runs = record_history(reports, rec.release, rec.config, rec.suite)
    same = lambda r: (r.tree.source_hash, r.tree.engine_hash, r.config_hash, r.suite_hash, r.params_hash,  # noqa: E731
                      r.metrics_formula_version)
    return [r for r in runs if same(r) == same(rec) and r.verdict.status in ("pass", "fail")] or [rec]


#: Server settings that change what a BetterBench figure means (combined decode averages up to max_num_seqs;
#: another dtype is another model's speed).
MEASURING_SERVER = ("max_num_seqs", "max_model_len", "tensor_parallel_size", "dtype")


def specs_of(root: Path) -> dict[str, PerfGateSpec]:
    """{suite name: its perf_gate} for the BetterBench suite files under ``root``/suites (default thresholds where a
    file sets none)."""
    from validate.suite import load_suite, suites_dir

    out = {}
    for p in sorted(suites_dir(root).glob("*.yaml")):
        if p.stem == "release":
            continue
        try:
            spec = load_suite(p).spec
        except InputError:
            continue
        if spec.kind == BENCH_KIND:
            out[spec.name] = spec.perf_gate or PerfGateSpec()
    return out


def compare_perf(reports: Path, candidate: str, baseline: str, specs: dict[str, PerfGateSpec] | None = None,
                 configs: list[str] | None = None, reports_baseline: Path | None = None,
                 skipped: list[str] | None = None) -> PerfComparison:
    """Gate every BetterBench record of ``candidate`` against the baseline's record of the same configuration,
    with the thresholds of its suite (``specs``: suite name -> spec; default thresholds otherwise).
    ``skipped``: see :func:`validate.record.release_records` (for the baseline's files).

    Raises:
        InputError: the candidate has no BetterBench record.
    """
    specs = specs or {}
    if candidate == baseline and (reports_baseline is None or Path(reports_baseline).resolve() == Path(reports).resolve()):
        raise InputError(f"{candidate} against itself: a release is never its own baseline")
    breports = reports_baseline or reports
    cand = [r for r in release_records(reports, candidate) if r.suite_kind == BENCH_KIND and (not configs or r.config in configs)]
    base = {(r.config, r.suite): r for r in release_records(breports, baseline, skipped) if r.suite_kind == BENCH_KIND}
    if not cand:
        raise InputError(f"no BetterBench records for {candidate} under {reports}")
    out = PerfComparison(candidate, baseline)
    for c in cand:
        b = base.get((c.config, c.suite))
        where = f"{c.config}/{c.suite}"
        if b is None:
            out.unpaired.append(f"{where}: the baseline {baseline} has no such record")
            continue
        bad = []
        for label, r in (("baseline", b), ("candidate", c)):
            if r.verdict.status not in ("pass", "fail"):
                bad.append(f"the {label} did not complete ({r.verdict.status})")
            elif not r.metrics.get("per_pass"):
                bad.append(f"the {label} record holds no per-pass values")
        diff = [k for k in MEASURING_PARAMS if b.params.get(k) != c.params.get(k)]
        if diff:
            bad.append("suite parameters differ (" + ", ".join(f"{k}: {b.params.get(k)!r} vs {c.params.get(k)!r}" for k in diff) + ")")
        sb, sc = b.config_snapshot.get("server", {}), c.config_snapshot.get("server", {})
        moved = [k for k in MEASURING_SERVER if sb.get(k) != sc.get(k)]
        if moved:
            bad.append("the server settings that define the figures differ (" + ", ".join(
                f"{k}: {sb.get(k)!r} vs {sc.get(k)!r}" for k in moved) + ")")
        if b.model != c.model:  # a faster, smaller model must not hide a slower plugin
            bad.append(f"the model differs ({b.model!r} vs {c.model!r})")
        hb, hc = b.hardware or {}, c.hardware or {}
        moved = [k for k in ("kind", "gpus") if hb.get(k) != hc.get(k)]
        if moved:
            bad.append("the hardware differs (" + ", ".join(f"{k}: {hb.get(k)!r} vs {hc.get(k)!r}" for k in moved) + ")")
        if b.metrics_formula_version != c.metrics_formula_version:
            bad.append(f"metrics formula version {b.metrics_formula_version} vs {c.metrics_formula_version}")
        if bad:
            out.unpaired.append(f"{where}: cannot compare: " + "; ".join(bad))
            continue
        spec = specs.get(c.suite) or PerfGateSpec()
        bruns, cruns = _same_tree_runs(breports, b), _same_tree_runs(reports, c)
        names = sorted({k for r in (b, c) for row in r.metrics["per_pass"] for k in row if k != "pass"})
        for name in names:
            t = spec.threshold(name)
            if t is None:
                continue
            bv, cv = _passes(bruns, name), _passes(cruns, name)
            if bv and not cv:  # a gated figure the candidate lost is never a silent pass
                out.unpaired.append(f"{where}: {name} is gated and measured in the baseline but missing from the "
                                    "candidate (every pass failed it, or it was not measured)")
            elif bv and cv:
                out.figures.append(judge(c.config, name, bv, cv, t, spec.alpha))
    return out

"""Drawing: each ``plot_*`` function takes plain data (:class:`Band`, :class:`Samples`, :class:`MemorySeries`,
:class:`HistoryPanel`) and writes one PNG.

Drawing uses Figure objects on matplotlib's Agg canvas, never pyplot: nothing global changes between figures
(style settings apply inside ``matplotlib.rc_context``) and every figure is cleared once written. Files are
written atomically (a temp file renamed over the path), mode 0644, ``SIZE_PX`` (history ``HISTORY_SIZE_PX``) at
``DPI``.
"""
from __future__ import annotations

import math
import os
import re
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import matplotlib
import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch
from matplotlib.ticker import Formatter, FuncFormatter, LogLocator, NullFormatter, NullLocator

from validate.record import RECORD_MODE

DPI = 100
SIZE_PX = (900, 540)  # every per-configuration figure
HISTORY_SIZE_PX = (900, 960)  # three stacked panels

STYLE = {
    "font.size": 10, "axes.titlesize": 11, "axes.labelsize": 10, "figure.titlesize": 12,
    "legend.fontsize": 9, "xtick.labelsize": 9, "ytick.labelsize": 9,
    "axes.grid": True, "grid.alpha": 0.3, "axes.spines.top": False, "axes.spines.right": False,
}
BASELINE_COLOR, CANDIDATE_COLOR = "#7a7a7a", "#1f5fbf"
CONFIG_COLORS = ("#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf",
                 "#bcbd22", "#7f7f7f")


# ---- plain data the plotting functions take -------------------------------------------------------------

@dataclass
class Band:
    """One release's curve: at each ``x``, the median and the min-max band (same length lists)."""

    label: str
    x: list[float]
    median: list[float]
    lo: list[float]
    hi: list[float]


@dataclass
class Samples:
    """Latency samples (ms) of one release at one concurrency level; ``count``: how many were measured (more
    than ``len(values)`` when the record keeps a subsample)."""

    release: str
    level: int
    values: list[float]
    count: int | None = None


@dataclass
class RateCurve:
    """One release's open-loop probes (validate.runners.arrivals): per probe, in rate order, the scheduled rate
    (req/s), the SLO percentile's TTFT and TPOT (ms; None where undefined) and whether it met the SLO;
    ``slo_rate``: the highest rate that met it (None: none did)."""

    label: str
    rates: list[float]
    ttft_ms: list[float | None]
    tpot_ms: list[float | None]
    meets: list[bool]
    slo_rate: float | None = None


@dataclass
class MemorySeries:
    """One memory series of a soak.

    ``t_s`` / ``mib``: the samples (seconds since the soak began, MiB); the first ``in_life`` were taken while
    the server lived; ``fit_from``: index of the first sample of the fitted part (the fit runs from there to
    ``in_life``); ``slope_mib_per_min``: the slope the soak fitted (None when it had too few samples);
    ``total_mib``: the memory the series can reach, None when unknown; ``flat``: the soak's verdict on it.
    """

    name: str
    t_s: list[float]
    mib: list[float]
    in_life: int
    fit_from: int
    slope_mib_per_min: float | None
    total_mib: float | None = None
    flat: bool | None = None


@dataclass
class HistoryLine:
    """One configuration across releases: ``values[i]`` for ``releases[i]`` (None: no figure there);
    ``lo`` / ``hi``: an optional band per point; ``hollow[i]``: the point is of the panel's other kind."""

    config: str
    values: list[float | None]
    lo: list[float | None] | None = None
    hi: list[float | None] | None = None
    hollow: list[bool] = field(default_factory=list)


@dataclass
class HistoryPanel:
    """One panel of the history view. ``filled`` / ``hollow``: what each marker style means (``hollow`` None:
    every point is filled); points of one kind are joined (solid for filled, dotted for hollow), never points
    of different kinds."""

    title: str
    ylabel: str
    lines: list[HistoryLine]
    filled: str = ""
    hollow: str | None = None
    y_max: float | None = None  # the largest value the figure can take (100 for a percentage)


# ---- drawing --------------------------------------------------------------------------------------------

def _figure(size_px: tuple[int, int]) -> Figure:
    fig = Figure(figsize=(size_px[0] / DPI, size_px[1] / DPI), dpi=DPI, layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def _save(fig: Figure, path: Path) -> Path:
    """Write ``fig`` as PNG at ``path`` atomically (a temp file renamed over it), mode 0644, then clear it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=path.name + ".", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            fig.savefig(fh, format="png", dpi=DPI, metadata={"Software": None})
        os.chmod(tmp, RECORD_MODE)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    finally:
        fig.clear()
    return path


def _num(v: float, _pos=None) -> str:
    """Tick labels: '0.5', '2', '20', '1,000' (no exponents, no trailing zeros)."""
    if v == 0:
        return "0"
    if abs(v) >= 1000:
        return f"{v:,.0f}"
    return f"{v:.3g}"


class _Plain(Formatter):
    """Linear-axis tick labels with thousands separators and as many decimals as the tick step needs
    (22.75 / 22.80 rather than 22.8 / 22.8)."""

    ticks: list[float] = []

    def set_locs(self, locs):
        self.ticks = sorted(float(v) for v in locs)

    def __call__(self, x, pos=None):
        locs = self.ticks or [float(x)]
        # the fewest decimals that write every tick exactly (2.5 / 5.0 / 7.5, never 2 / 5 / 8)
        digits = next((d for d in range(7) if all(abs(round(t, d) - t) <= 1e-9 * max(1.0, abs(t)) for t in locs)), 6)
        return "0" if float(x) == 0 else f"{x:,.{digits}f}"


def _log_axis(axis, lo: float, hi: float) -> None:
    """A log axis with plain-number labels, denser the fewer decades it spans (1-2-3-5 steps within one and a half
    decades, 1-2-5 within four, powers of ten beyond: 2,000 and 3,000 collide on a half-width panel)."""
    decades = math.log10(hi / lo)
    subs = (1.0, 1.5, 2.0, 3.0, 5.0, 7.0) if decades < 1.2 else (1.0, 2.0, 3.0, 5.0) if decades < 1.6 else \
        (1.0, 2.0, 5.0) if decades < 4 else (1.0,)
    axis.set_major_locator(LogLocator(base=10, subs=subs))
    axis.set_major_formatter(FuncFormatter(_num))
    axis.set_minor_formatter(NullFormatter())


def _spans_decades(values: list[float]) -> bool:
    v = [x for x in values if x and x > 0]
    return bool(v) and max(v) / min(v) > 20


def plot_concurrency(path: Path, title: str, aggregate: list[Band], per_stream: list[Band],
                     max_num_seqs: int | None = None) -> Path:
    """BetterBench throughput against concurrency: a panel of aggregate output tok/s and one of per-stream
    decode tok/s, each curve a release with its median line and min-max band across passes.

    Args:
        path: the PNG to write (``SIZE_PX`` at ``DPI``).
        title: the figure title (name the configuration and releases).
        aggregate / per_stream: one :class:`Band` per release (x: streams), baseline first; an empty list
            leaves that panel out.
        max_num_seqs: the server's batch limit; levels above it are shaded as queued.

    Raises:
        ValueError: both lists empty (nothing to draw).
    """
    panels = [(b, t) for b, t in ((aggregate, "aggregate output (tok/s)"),
                                  (per_stream, "per-stream decode, 1 / TPOT p50 (tok/s)")) if b]
    if not panels:
        raise ValueError("no curve to draw")
    with matplotlib.rc_context(STYLE):
        fig = _figure(SIZE_PX)
        axes = fig.subplots(1, len(panels), squeeze=False)[0]
        levels = sorted({x for bands, _ in panels for b in bands for x in b.x})
        for ax, (bands, sub) in zip(axes, panels):
            for i, b in enumerate(bands):
                cand = i == len(bands) - 1
                color = CANDIDATE_COLOR if cand else BASELINE_COLOR
                ax.fill_between(b.x, b.lo, b.hi, color=color, alpha=0.22 if cand else 0.18, linewidth=0)
                # the baseline's dashed line lies over the candidate's, so equal curves still show both
                ax.plot(b.x, b.median, color=color, marker="s" if cand else "o", markersize=6 if cand else 4,
                        linestyle="-" if cand else "--", linewidth=2 if cand else 1.6, label=b.label,
                        zorder=3 if cand else 4)
            ax.set_xscale("log", base=2)
            ax.set_xticks(levels, [str(int(c)) for c in levels])
            ax.xaxis.set_minor_formatter(NullFormatter())
            ax.tick_params(axis="x", which="minor", length=0)
            if len(levels) > 1:
                ax.set_xlim(levels[0] / 1.25, levels[-1] * 1.25)
            else:
                ax.set_xlim(levels[0] / 2, levels[0] * 2)
            if max_num_seqs and levels[-1] > max_num_seqs:
                ax.axvspan(max_num_seqs * 1.1, ax.get_xlim()[1], color="#000000", alpha=0.05, linewidth=0)
            ax.set_xlabel("concurrent streams")
            ax.set_ylabel("tok/s")
            ax.set_title(sub)
            ys = [y for b in bands for y in b.lo + b.hi]
            if _spans_decades(ys):
                ax.set_yscale("log")
                _log_axis(ax.yaxis, min(ys), max(ys))
            else:
                ax.set_ylim(0, max(ys) * 1.12)
                ax.yaxis.set_major_formatter(_Plain())
        sides = max((bands for bands, _ in panels), key=len)
        handles = [Line2D([], [], color=CANDIDATE_COLOR if cand else BASELINE_COLOR, marker="s" if cand else "o",
                          linestyle="-" if cand else "--", label=b.label)
                   for i, b in enumerate(sides) for cand in [i == len(sides) - 1]]
        handles.append(Patch(color="#555555", alpha=0.25, label="min-max across passes"))
        if max_num_seqs and levels[-1] > max_num_seqs:
            handles.append(Patch(color="#000000", alpha=0.08, label=f"above max_num_seqs = {max_num_seqs} (queued)"))
        fig.legend(handles=handles, loc="outside lower center", ncol=len(handles), frameon=False)
        fig.suptitle(title)
        return _save(fig, path)


def plot_rate_latency(path: Path, title: str, curves: list[RateCurve], ttft_limit_ms: float | None,
                      tpot_limit_ms: float | None, percentile: float) -> Path:
    """Latency against arrival rate: a panel of the ``percentile``-th TTFT and one of TPOT against the scheduled
    rate (log scale), a curve per release (baseline first, dashed grey; the candidate solid blue), filled markers
    for probes that met the SLO and hollow ones for those that did not, the SLO's limits as horizontal lines and
    each release's SLO rate as a vertical one.

    Raises:
        ValueError: no curve, or a curve without a probe.
    """
    if not curves or not all(c.rates for c in curves):
        raise ValueError("no probe to draw")
    with matplotlib.rc_context(STYLE):
        fig = _figure(SIZE_PX)
        axes = fig.subplots(1, 2, squeeze=False)[0]
        for ax, key, limit, sub in ((axes[0], "ttft_ms", ttft_limit_ms, f"p{percentile:g} TTFT (ms)"),
                                    (axes[1], "tpot_ms", tpot_limit_ms, f"p{percentile:g} TPOT (ms)")):
            ys = []
            for i, c in enumerate(curves):
                cand = i == len(curves) - 1
                color = CANDIDATE_COLOR if cand else BASELINE_COLOR
                pts = sorted((r, y, m) for r, y, m in zip(c.rates, getattr(c, key), c.meets) if y is not None and y > 0)
                if not pts:
                    continue
                ys += [y for _, y, _ in pts]
                ax.plot([r for r, _, _ in pts], [y for _, y, _ in pts], color=color, linestyle="-" if cand else "--",
                        linewidth=2 if cand else 1.6, zorder=3 if cand else 4)
                for r, y, m in pts:
                    ax.plot([r], [y], marker="s" if cand else "o", markersize=7 if cand else 5, color=color,
                            markerfacecolor=color if m else "white", zorder=5)
                if c.slo_rate:
                    ax.axvline(c.slo_rate, color=color, linestyle=":" if not cand else "-.", linewidth=1.2)
            if limit:
                ax.axhline(limit, color="#b22222", linewidth=1.2)
                ys.append(limit)
            ax.set_xscale("log")
            xs = [r for c in curves for r in c.rates]
            _log_axis(ax.xaxis, min(xs) / 1.2, max(xs) * 1.2)
            ax.set_xlim(min(xs) / 1.2, max(xs) * 1.2)
            ax.set_xlabel("arrival rate (requests/s)")
            ax.set_title(sub)
            if ys and _spans_decades(ys):
                ax.set_yscale("log")
                _log_axis(ax.yaxis, min(ys), max(ys))
            elif ys:
                ax.set_ylim(0, max(ys) * 1.12)
                ax.yaxis.set_major_formatter(_Plain())
        handles = [Line2D([], [], color=CANDIDATE_COLOR if i == len(curves) - 1 else BASELINE_COLOR,
                          marker="s" if i == len(curves) - 1 else "o",
                          linestyle="-" if i == len(curves) - 1 else "--", label=c.label) for i, c in enumerate(curves)]
        handles += [Line2D([], [], color="#555555", marker="s" if len(curves) == 1 else "o", linestyle="",
                           markerfacecolor="white", label="probe missed the SLO"),
                    Line2D([], [], color="#b22222", label="SLO limit"),
                    Line2D([], [], color="#555555", linestyle="-.", label="SLO rate")]
        fig.legend(handles=handles, loc="outside lower center", ncol=len(handles), frameon=False)
        fig.suptitle(title)
        return _save(fig, path)


Y_RANGE = (0.004, 0.9975)  # the latency panels' percentile range


def _ecdf(values: list[float]) -> tuple[np.ndarray, np.ndarray]:
    """(x, q): numpy's linear percentile of ``values`` (what validate.metrics.pct and the records state) at
    the share q, over the panels' percentile range: the sample positions i / (n - 1) and a grid even on a
    logit axis, so the drawn curve bends where the percentile function does and passes through every marker."""
    v = np.asarray(values, dtype=float)
    grid = 1 / (1 + np.exp(-np.linspace(math.log(Y_RANGE[0] / (1 - Y_RANGE[0])) - 0.5,
                                         math.log(Y_RANGE[1] / (1 - Y_RANGE[1])) + 0.5, 400)))
    q = np.union1d(grid, np.linspace(0.0, 1.0, len(v))[1:-1] if len(v) > 2 else [])
    return np.percentile(v, 100 * q), q


PERCENTILE_TICKS = ((0.01, "p1"), (0.1, "p10"), (0.5, "p50"), (0.9, "p90"), (0.99, "p99"), (0.999, "p99.9"))


def plot_latency(path: Path, title: str, ttft: list[Samples], itl: list[Samples], candidate: str) -> Path:
    """TTFT and per-token ITL distributions: one ECDF per (release, concurrency level) on a log-x axis with
    a percentile (logit) y axis, so that the p99 tail is as readable as the median; the candidate solid and
    other releases dashed, colours by level, p50 (circle) and p99 (triangle) marked on each curve.

    Args:
        path: the PNG to write (``SIZE_PX`` at ``DPI``).
        title: the figure title (name the configuration and releases).
        ttft / itl: latency samples in ms (positive); an empty list leaves that panel out, a
            :class:`Samples` without values is ignored.
        candidate: the release drawn solid.

    Raises:
        ValueError: no sample at all.
    """
    ttft = [s for s in ttft if s.values]
    itl = [s for s in itl if s.values]
    panels = [(s, t, u) for s, t, u in ((ttft, "time to first token", "TTFT (ms, log scale)"),
                                        (itl, "inter-token latency, per token", "ITL (ms, log scale)")) if s]
    if not panels:
        raise ValueError("no latency samples to draw")
    levels = sorted({s.level for s, _, _ in panels for s in s})
    cmap = matplotlib.colormaps["viridis"]
    colors = {c: cmap(0.05 + 0.8 * i / max(1, len(levels) - 1)) for i, c in enumerate(levels)}
    releases = list(dict.fromkeys(s.release for s, _, _ in panels for s in s))
    releases = [r for r in releases if r != candidate] + ([candidate] if candidate in releases else [])
    with matplotlib.rc_context(STYLE):
        fig = _figure(SIZE_PX)
        axes = fig.subplots(1, len(panels), squeeze=False)[0]
        for ax, (samples, sub, xlabel) in zip(axes, panels):
            # the axis starts just below the lowest curve's 1st percentile: near-zero gaps (chunks read together)
            # would otherwise stretch a log axis over empty decades; what lies below is drawn at the left edge
            pooled = np.concatenate([np.asarray(s.values, dtype=float) for s in samples])
            firsts = [np.percentile(v[v > 0], 1) for s in samples if (v := np.asarray(s.values, dtype=float)).max() > 0]
            lo = (min(firsts) if firsts else 1e-3) / 1.3
            hi = max(float(pooled.max()), lo * 4) * 1.3
            below = int((pooled < lo).sum())
            for s in sorted(samples, key=lambda s: (s.release == candidate, s.level)):
                x, y = _ecdf(s.values)
                p50, p99 = np.percentile(np.asarray(s.values, dtype=float), [50, 99])
                x = np.maximum(x, lo)
                cand = s.release == candidate
                ax.plot(x, y, color=colors[s.level], linestyle="-" if cand else "--",
                        linewidth=1.8 if cand else 1.3, alpha=1.0 if cand else 0.75)
                p50, p99 = max(p50, lo), max(p99, lo)
                ax.plot([p50], [0.5], marker="o", color=colors[s.level], markersize=6, markeredgecolor="black",
                        markeredgewidth=0.6, linestyle="none")
                ax.plot([p99], [0.99], marker="^", color=colors[s.level], markersize=7, markeredgecolor="black",
                        markeredgewidth=0.6, linestyle="none")
            for q in (0.5, 0.99):
                ax.axhline(q, color="black", linewidth=0.7, linestyle=":", alpha=0.6)
            ax.set_xscale("log")
            ax.set_xlim(lo, hi)
            _log_axis(ax.xaxis, lo, hi)
            if below:
                xlabel += f"\n({below:,} of {len(pooled):,} below {lo:.2g} ms: at the left edge)"
            cut = [s for s in samples if s.count and s.count > len(s.values)]
            if cut:
                kept = max(len(s.values) for s in cut)
                xlabel += f"\n(kept: a seeded {kept:,} of up to {max(s.count for s in cut):,} per level)"
            # the range shows p1 to p99 with room for the p99 markers; the curves run on past its edges
            ax.set_yscale("logit")
            ax.set_ylim(*Y_RANGE)
            ax.set_yticks([q for q, _ in PERCENTILE_TICKS[:-1]], [t for _, t in PERCENTILE_TICKS[:-1]])
            ax.yaxis.set_minor_formatter(NullFormatter())
            ax.yaxis.set_minor_locator(NullLocator())
            ax.set_xlabel(xlabel)
            ax.set_ylabel("percentile (share of samples ≤ x)")
            ax.set_title(sub)
        handles = [Line2D([], [], color=colors[c], linewidth=3, label=f"{c} stream{'s' if c != 1 else ''}")
                   for c in levels]
        handles += [Line2D([], [], color="black", linestyle="-" if r == candidate else "--", label=r) for r in releases]
        handles += [Line2D([], [], marker="o", color="white", markeredgecolor="black", markersize=6, linestyle="none",
                           label="p50"),
                    Line2D([], [], marker="^", color="white", markeredgecolor="black", markersize=7, linestyle="none",
                           label="p99")]
        fig.legend(handles=handles, loc="outside lower center", ncol=math.ceil(len(handles) / 2), frameon=False)
        fig.suptitle(title)
        return _save(fig, path)


def _mib(v: float) -> str:
    return f"{v:,.0f}" if abs(v) >= 100 else f"{v:.1f}"


def _series_label(name: str) -> str:
    """'host_rss_mib' -> 'host RSS', 'gpu0_mib' -> 'gpu0'."""
    base = re.sub(r"_mib$", "", name)
    return "host RSS" if base == "host_rss" else base.replace("_", " ")


def _memory_group(name: str) -> str:
    """'host' for the server's process tree, 'device' for GPU memory series."""
    return "host" if name.startswith("host") else "device"


MEMORY_PANELS = {"device": "GPU memory", "host": "host memory (RSS of the server's process tree)"}


def plot_memory(path: Path, title: str, series: list[MemorySeries], max_slope_mib_per_min: float | None,
                died_at_s: float | None = None) -> Path:
    """Soak memory over time: GPU series in one panel and host RSS in another (each on its own scale, stacked on
    one time axis), one line per series, the fitted slope as a dotted straight line over the fitted part, the
    total as a dashed grey line where it lies near the data (stated in the legend otherwise), the server's death
    as a vertical line with the samples after it faded and left out of the scale.

    Args:
        path: the PNG to write (``SIZE_PX`` at ``DPI``).
        title: the figure title (name the configuration and release).
        series: :class:`MemorySeries` with at least one sample each (others are ignored).
        max_slope_mib_per_min: the bound the slopes were judged against (stated in the legend).
        died_at_s: seconds into the soak when the server was found dead, None if it lived.

    Raises:
        ValueError: no series with a sample.
    """
    series = [s for s in series if s.t_s]
    if not series:
        raise ValueError("no memory samples to draw")
    t_end = max([max(s.t_s) for s in series] + [died_at_s or 0])
    minutes = t_end >= 300
    scale = 1 / 60 if minutes else 1.0
    groups = [g for g in ("device", "host") if any(_memory_group(s.name) == g for s in series)]
    colors = {s.name: CONFIG_COLORS[i % len(CONFIG_COLORS)] for i, s in enumerate(series)}
    with matplotlib.rc_context(STYLE):
        fig = _figure(SIZE_PX)
        axes = fig.subplots(len(groups), 1, sharex=True, squeeze=False)[:, 0]
        handles = []
        any_fit = False
        for ax, group in zip(axes, groups):
            members = [s for s in series if _memory_group(s.name) == group]
            life_vals = [v for s in members for v in s.mib[: max(1, s.in_life)]]
            low, peak = min(life_vals), max(life_vals)
            allowed = 0.0  # the growth the bound allows over the fitted part: the least height of the y range
            totals: dict[float, list[str]] = {}
            for s in members:
                color, label = colors[s.name], _series_label(s.name)
                t, y = np.asarray(s.t_s) * scale, np.asarray(s.mib)
                ax.plot(t[: s.in_life], y[: s.in_life], color=color, linewidth=1.5)
                if s.in_life < len(t):
                    ax.plot(t[max(0, s.in_life - 1):], y[max(0, s.in_life - 1):], color=color, linewidth=1.0, alpha=0.3)
                text = f"{label}: peak {_mib(max(s.mib[: max(1, s.in_life)]))} MiB"
                fit_t, fit_y = np.asarray(s.t_s[s.fit_from: s.in_life]) / 60, y[s.fit_from: s.in_life]
                if s.slope_mib_per_min is not None and len(fit_t) >= 2:
                    # the least-squares line of that slope passes through the mean of the fitted points
                    a = fit_y.mean() - s.slope_mib_per_min * fit_t.mean()
                    ends = np.array([fit_t[0], fit_t[-1]])
                    ax.plot(ends * 60 * scale, a + s.slope_mib_per_min * ends, color="black", linewidth=1.6, linestyle=":")
                    slope = 0.0 if abs(s.slope_mib_per_min) < 0.005 else s.slope_mib_per_min
                    verdict = "" if s.flat is None else (", flat" if s.flat else ", GROWING")
                    text += f", slope {slope:+.2f} MiB/min{verdict}"
                    allowed = max(allowed, (max_slope_mib_per_min or 0) * (fit_t[-1] - fit_t[0]))
                    any_fit = True
                else:
                    text += ", too few samples for a slope"
                handles.append(Line2D([], [], color=color, linewidth=2, label=text))
                if s.total_mib:
                    totals.setdefault(s.total_mib, []).append(label)
            top = peak
            for total, names in sorted(totals.items()):
                who = ", ".join(names)
                if total <= peak + 1.5 * max(peak - low, 0.05 * peak):
                    ax.axhline(total, color="#555555", linestyle="--", linewidth=1.1)
                    handles.append(Line2D([], [], color="#555555", linestyle="--", label=f"total {total:,.0f} MiB ({who})"))
                    top = max(top, total)
                else:
                    handles.append(Line2D([], [], color="none", label=f"total {total:,.0f} MiB ({who}): far above, not drawn"))
            # noise of a flat series never fills a panel: the range is at least the growth the bound allows
            # over the fitted part (a series growing at the bound would rise across it), 2% of the peak and 1 MiB
            span = max(top - low, allowed, 0.02 * top, 1.0)
            mid = (top + low) / 2
            y0, y1 = (low, top) if span == top - low else (mid - span / 2, mid + span / 2)
            ax.set_ylim(max(0.0, y0 - 0.1 * span), y1 + 0.1 * span)
            ax.yaxis.set_major_formatter(_Plain())
            ax.set_ylabel("MiB")
            ax.set_title(MEMORY_PANELS[group], loc="left", fontsize=10)
            if died_at_s is not None:
                ax.axvline(died_at_s * scale, color="#b00000", linewidth=1.5)
        if any_fit:
            bound = f" (bound {max_slope_mib_per_min:g} MiB/min)" if max_slope_mib_per_min is not None else ""
            handles.append(Line2D([], [], color="black", linewidth=1.6, linestyle=":",
                                  label=f"fitted slope over the fitted part{bound}"))
        if died_at_s is not None:
            handles.append(Line2D([], [], color="#b00000", linewidth=1.5,
                                  label=f"server died at {died_at_s:,.1f} s (later samples faded)"))
        axes[-1].set_xlim(0, t_end * scale * 1.01)
        axes[-1].set_xlabel("time into the soak (min)" if minutes else "time into the soak (s)")
        fig.legend(handles=handles, loc="outside lower center", ncol=2, frameon=False)
        fig.suptitle(title)
        return _save(fig, path)


def plot_history(path: Path, title: str, releases: list[str], panels: list[HistoryPanel]) -> Path:
    """Figures across releases: one panel per :class:`HistoryPanel`, releases in the given order on a shared
    x axis, one line per configuration (colours fixed by configuration name), min-max bands as error bars.

    Args:
        path: the PNG to write (``HISTORY_SIZE_PX`` at ``DPI``).
        title: the figure title.
        releases: x axis labels, oldest first.
        panels: panels with at least one value; a panel without one is left out.

    Raises:
        ValueError: no panel holds a value.
    """
    panels = [p for p in panels if any(v is not None for ln in p.lines for v in ln.values)]
    if not panels:
        raise ValueError("no history to draw")
    configs = sorted({ln.config for p in panels for ln in p.lines})
    colors = {c: CONFIG_COLORS[i % len(CONFIG_COLORS)] for i, c in enumerate(configs)}
    x = np.arange(len(releases))
    with matplotlib.rc_context(STYLE):
        fig = _figure(HISTORY_SIZE_PX)
        axes = fig.subplots(len(panels), 1, sharex=True, squeeze=False)[:, 0]
        for ax, p in zip(axes, panels):
            shown, kinds, ys_all = [], set(), []
            for ln in p.lines:
                idx = [i for i, v in enumerate(ln.values) if v is not None]
                if not idx:
                    continue
                shown.append(ln.config)
                c = colors[ln.config]
                xs, ys = x[idx], np.array([ln.values[i] for i in idx], dtype=float)
                if ln.lo and ln.hi:
                    lo = np.array([ln.lo[i] if ln.lo[i] is not None else ln.values[i] for i in idx], dtype=float)
                    hi = np.array([ln.hi[i] if ln.hi[i] is not None else ln.values[i] for i in idx], dtype=float)
                    ax.errorbar(xs, ys, yerr=np.vstack([ys - lo, hi - ys]), color=c, linestyle="none", capsize=3, linewidth=1)
                ys_all += [float(v) for v in ys] + [float(v) for v in (lo if ln.lo and ln.hi else [])] \
                    + [float(v) for v in (hi if ln.lo and ln.hi else [])]
                hollow = [bool(ln.hollow[i]) if i < len(ln.hollow) else False for i in idx]
                kinds.update(hollow)
                for flag in (False, True):
                    sel = [k for k, h in enumerate(hollow) if h == flag]
                    if sel:
                        ax.plot(xs[sel], ys[sel], linestyle=":" if flag else "-", linewidth=1.5, marker="o",
                                markersize=6, color=c, markerfacecolor="white" if flag else c, markeredgewidth=1.5)
            ax.set_title(p.title)
            ax.set_ylabel(p.ylabel)
            lo, hi = min(ys_all), max(ys_all)
            if _spans_decades(ys_all):
                ax.set_yscale("log")
                _log_axis(ax.yaxis, lo, hi)
                ax.set_ylim(lo / 1.3, hi * 1.3)
            else:
                # a change of a few percent never fills the panel: the range is at least 10% of the largest value
                span = max(hi - lo, 0.1 * abs(hi), 1e-9)
                mid = (hi + lo) / 2
                top = mid + 0.6 * span if p.y_max is None else min(mid + 0.6 * span, p.y_max + 0.02 * span)
                ax.set_ylim(top - 1.2 * span, top)
                ax.yaxis.set_major_formatter(_Plain())
            handles = [Line2D([], [], color=colors[c], marker="o", label=c) for c in shown]
            if p.filled and False in kinds:
                handles.append(Line2D([], [], color="#333333", marker="o", linestyle="none", label=p.filled))
            if p.hollow and True in kinds:
                handles.append(Line2D([], [], color="#333333", marker="o", markerfacecolor="white", markeredgewidth=1.5,
                                      linestyle="none", label=p.hollow))
            ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0, frameon=False)
        axes[-1].set_xticks(x, releases, rotation=30 if len(releases) > 8 else 0,
                            ha="right" if len(releases) > 8 else "center")
        axes[-1].set_xlim(-0.4, len(releases) - 0.6)
        axes[-1].set_xlabel("release (version order)")
        fig.suptitle(title)
        return _save(fig, path)

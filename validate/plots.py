"""Pictures for the release notes, drawn from records alone: PNG files under ``reports/<release>/figures/``.

Per configuration (``<config>/<suite>-<kind>.png``: a folder per configuration, so no two names collide):

- ``concurrency``: BetterBench aggregate output tok/s and per-stream decode (1 / TPOT-p50, tok/s) against
  concurrent streams, baseline and candidate, each with its min-max band across passes;
- ``latency``: BetterBench TTFT and per-token ITL distributions (ECDFs on a log-x axis, one curve per
  concurrency level and release, p50 and p99 marked) from the record's ``latency_samples``;
- ``memory``: soak memory over time, one line per series, the fitted slope over the part the soak fitted, the
  bound, the total where known and the server's death where it died.

And ``history.png``: decode step, combined decode and GSM8K accuracy across releases in version order, one
line per configuration.

Drawing uses Figure objects on matplotlib's Agg canvas, never pyplot: nothing global changes between figures
(style settings apply inside ``matplotlib.rc_context``) and every figure is cleared once written. The ``plot_*``
functions take plain data and write one PNG; :func:`render_figures` reads the records and calls them.
"""
from __future__ import annotations

import math
import os
import re
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import matplotlib
import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch
from matplotlib.ticker import Formatter, FuncFormatter, LogLocator, NullFormatter, NullLocator

from validate.errors import InputError
from validate.record import RECORD_MODE, Record, check_release_name, read_record, release_records

FIGURES = "figures"
DPI = 100
SIZE_PX = (900, 540)  # every per-configuration figure
HISTORY_SIZE_PX = (900, 960)  # three stacked panels
PlotKind = Literal["concurrency", "latency", "memory", "history"]

STYLE = {
    "font.size": 10, "axes.titlesize": 11, "axes.labelsize": 10, "figure.titlesize": 12,
    "legend.fontsize": 9, "xtick.labelsize": 9, "ytick.labelsize": 9,
    "axes.grid": True, "grid.alpha": 0.3, "axes.spines.top": False, "axes.spines.right": False,
}
BASELINE_COLOR, CANDIDATE_COLOR = "#7a7a7a", "#1f5fbf"
CONFIG_COLORS = ("#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf",
                 "#bcbd22", "#7f7f7f")
# Statuses whose figures are drawn: an error record keeps what it measured before it stopped (a soak whose
# server died keeps its samples); wrong-tree and plugin-inactive records do not count, skipped ones hold nothing.
DRAWN = ("pass", "fail", "error")
HISTORY_STATUSES = ("pass", "fail")  # history points: suites that ran to the end


@dataclass(frozen=True)
class PlotFile:
    """One picture written beside RELEASE.md.

    ``path``: relative to ``reports/<release>/`` (``figures/<config>/<suite>-<kind>.png``, ``figures/history.png``);
    ``config``: the configuration it shows, None for the history view; ``kind``: what it shows.
    """

    path: str
    title: str
    config: str | None
    kind: PlotKind


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


# ---- records -> plain data ------------------------------------------------------------------------------

def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9._+-]", "_", name)


def _num_or_none(v) -> float | None:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) else None


def concurrency_bands(rec: Record, label: str) -> tuple[Band | None, Band | None]:
    """(aggregate tok/s, per-stream decode tok/s) against streams from a BetterBench record: the summary's
    median / min / max of ``c<N>_tok_s``; per-stream 1000 / ``c<N>_tpot_ms_p50`` per pass (median and min-max
    over the passes), or from the summary when the record keeps no passes. None where no level has the figure."""
    m = rec.metrics
    levels = [c for c in m.get("concurrency") or [] if isinstance(c, int)]
    summ = m.get("summary") or {}
    passes = m.get("per_pass") or []
    agg = Band(label, [], [], [], [])
    per = Band(label, [], [], [], [])
    for c in levels:
        b = summ.get(f"c{c}_tok_s") or {}
        med, lo, hi = (_num_or_none(b.get(k)) for k in ("median", "min", "max"))
        if med is not None:
            agg.x.append(c)
            agg.median.append(med)
            agg.lo.append(lo if lo is not None else med)
            agg.hi.append(hi if hi is not None else med)
        key = f"c{c}_tpot_ms_p50"
        rates = [1e3 / t for row in passes if (t := _num_or_none(row.get(key))) and t > 0]
        if rates:
            per.x.append(c)
            per.median.append(float(np.median(rates)))
            per.lo.append(min(rates))
            per.hi.append(max(rates))
        else:
            b = summ.get(key) or {}
            med, lo, hi = (_num_or_none(b.get(k)) for k in ("median", "min", "max"))
            if med:
                per.x.append(c)
                per.median.append(1e3 / med)
                per.lo.append(1e3 / hi if hi else 1e3 / med)
                per.hi.append(1e3 / lo if lo else 1e3 / med)
    return (agg if agg.x else None), (per if per.x else None)


def latency_series(rec: Record) -> tuple[list[Samples], list[Samples]]:
    """(TTFT, ITL) :class:`Samples` per concurrency level from a BetterBench record's ``latency_samples``
    (empty lists for a record that has none)."""
    ttft, itl = [], []
    for key, v in (rec.metrics.get("latency_samples") or {}).items():
        m = re.fullmatch(r"c(\d+)", key)
        if not m or not isinstance(v, dict):
            continue
        c = int(m.group(1))
        for out, name in ((ttft, "ttft"), (itl, "itl")):
            vals = [x for x in v.get(f"{name}_ms") or [] if _num_or_none(x) is not None]
            if vals:
                out.append(Samples(rec.release, c, vals, v.get(f"{name}_count")))
    return ttft, itl


def memory_series(rec: Record) -> list[MemorySeries]:
    """Memory series of a soak record: its ``samples``, ``memory_samples_in_life`` and per series the part the
    soak fitted (the last ``1 - slope_skip_fraction`` of the series' samples within the server's life, as
    :func:`validate.telemetry.slope_mib_per_min` drops them) with the recorded slope, total and verdict."""
    from validate.runners.soak import SoakParams

    m = rec.metrics
    samples = [s for s in m.get("samples") or [] if isinstance(s, (list, tuple)) and len(s) == 2 and isinstance(s[1], dict)]
    life_n = m.get("memory_samples_in_life")
    life_n = len(samples) if not isinstance(life_n, int) else min(life_n, len(samples))
    skip = rec.params.get("slope_skip_fraction", SoakParams.model_fields["slope_skip_fraction"].default)
    memory = m.get("memory") or {}
    names = list(memory) + sorted({k for _, row in samples for k in row} - set(memory))
    out = []
    for name in names:
        pts = [(i, float(t), float(row[name])) for i, (t, row) in enumerate(samples) if _num_or_none(row.get(name)) is not None]
        if not pts:
            continue
        in_life = sum(1 for i, _, _ in pts if i < life_n)
        info = memory.get(name) or {}
        out.append(MemorySeries(name, [t for _, t, _ in pts], [y for _, _, y in pts], in_life, int(in_life * skip),
                                _num_or_none(info.get("slope_mib_per_min")), _num_or_none(info.get("total")),
                                info.get("flat")))
    return out


def _version(name: str):
    from validate.compare import _version as version

    return version(name)


def history_releases(reports: Path, release: str) -> list[str]:
    """Releases under ``reports`` up to ``release`` in version order (``validate.compare.previous_release``'s
    rule: the name without a leading 'v' as a packaging version; v0.3.10 after v0.3.9). Folders whose names are
    not versions are left out, except ``release`` itself, which comes last."""
    cur = _version(release)
    found = []
    if reports.is_dir():
        for d in reports.iterdir():
            k = _version(d.name)
            if d.is_dir() and k is not None and d.name != release and (cur is None or k <= cur):
                found.append((k, d.name))
    names = [n for _, n in sorted(found)]
    if (reports / release).is_dir():
        names.append(release)
    return names


def _pick(records: list[Record], kind: str, statuses) -> dict[str, Record]:
    """config -> the record of suite kind ``kind`` (the suite named like its kind first), among ``statuses``."""
    out: dict[str, Record] = {}
    for r in sorted(records, key=lambda r: (r.suite != kind, r.suite)):
        if r.suite_kind == kind and r.verdict.status in statuses:
            out.setdefault(r.config, r)
    return out


def _readable_records(reports: Path, release: str) -> list[Record]:
    """Every record of an older release that reads; one that does not is left out of the history."""
    out = []
    for p in sorted((reports / release).glob("*/*.json")):
        try:
            out.append(read_record(p))
        except InputError:
            continue
    return out


HISTORY_NAMES = ("decode step", "combined decode", "GSM8K accuracy")  # history_panels' panels, in order


def history_panels(by_release: dict[str, list[Record]]) -> list[HistoryPanel]:
    """The history view's panels from each release's records (releases in order): decode step (BetterBench
    ``decode_step_ms`` median, else the probe's), combined decode (BetterBench median with its min-max band),
    GSM8K accuracy (subset runs hollow)."""
    releases = list(by_release)
    picks = {rel: {k: _pick(recs, k, HISTORY_STATUSES) for k in ("betterbench", "probe", "gsm8k")}
             for rel, recs in by_release.items()}
    configs = sorted({c for p in picks.values() for d in p.values() for c in d})
    step, combined, gsm = [], [], []
    for cfg in configs:
        s_vals, s_lo, s_hi, s_probe, c_vals, c_lo, c_hi, g_vals, g_sub = ([] for _ in range(9))
        for rel in releases:
            bb, pr, gs = (picks[rel][k].get(cfg) for k in ("betterbench", "probe", "gsm8k"))
            summ = (bb.metrics.get("summary") or {}) if bb else {}
            sb = summ.get("decode_step_ms") or {}
            v = _num_or_none(sb.get("median"))
            if v is None and bb:
                v = _num_or_none(bb.metrics.get("decode_step_ms"))
            from_probe = v is None and pr is not None and _num_or_none(pr.metrics.get("decode_step_ms")) is not None
            if from_probe:
                v = _num_or_none(pr.metrics.get("decode_step_ms"))
            s_vals.append(v)
            s_lo.append(None if from_probe or v is None else _num_or_none(sb.get("min")))
            s_hi.append(None if from_probe or v is None else _num_or_none(sb.get("max")))
            s_probe.append(from_probe)
            cb = summ.get("combined_decode_tok_s") or {}
            cv = _num_or_none(cb.get("median"))
            if cv is None and bb:
                cv = _num_or_none(bb.metrics.get("combined_decode_tok_s"))
            c_vals.append(cv)
            c_lo.append(_num_or_none(cb.get("min")) if cv is not None else None)
            c_hi.append(_num_or_none(cb.get("max")) if cv is not None else None)
            acc = _num_or_none(gs.metrics.get("accuracy")) if gs else None
            g_vals.append(None if acc is None else 100 * acc)
            g_sub.append(bool(gs and gs.dataset and gs.dataset.subset))
        step.append(HistoryLine(cfg, s_vals, s_lo, s_hi, hollow=s_probe))
        combined.append(HistoryLine(cfg, c_vals, c_lo, c_hi))
        gsm.append(HistoryLine(cfg, g_vals, hollow=g_sub))
    return [
        HistoryPanel("decode step p50 (ms, lower is better; bars: min-max across passes)", "ms", step,
                     "BetterBench", "probe (no BetterBench record)"),
        HistoryPanel("BetterBench combined decode (tok/s, higher is better; bars: min-max across passes)", "tok/s",
                     combined),
        HistoryPanel("GSM8K accuracy (%, primary extraction)", "%", gsm, "full test set", "subset", y_max=100.0),
    ]


def render_figures(reports: Path, release: str, baseline: str | None = None,
                   notes: list[str] | None = None) -> list[PlotFile]:
    """Draw the release's pictures from its records (and the baseline's, and every earlier release's for the
    history view) into ``reports/<release>/figures/``.

    Per configuration with a BetterBench record: ``<config>/<suite>-concurrency.png`` and, where the record
    holds ``latency_samples``, ``<config>/<suite>-latency.png`` (the baseline's record of the same
    configuration and suite drawn beside the candidate's where it exists); per configuration with a soak record
    holding memory samples: ``<config>/<suite>-memory.png``; and ``history.png`` when at least two releases up to
    ``release`` hold a decode step, combined decode or GSM8K figure. Records that did not run the tree under
    validation (wrong-tree, plugin-inactive) or were skipped are not drawn; an error record is drawn with
    what it measured; the history takes suites that ran to the end (pass or fail). A figure whose data is
    missing is not written, and a PNG of these kinds left in ``figures/`` by an earlier call that this call
    did not write is removed. Files are written atomically, mode 0644, ``SIZE_PX`` (history
    ``HISTORY_SIZE_PX``) at ``DPI``.

    Args:
        reports: the reports folder (``reports/<release>/<config>/<suite>.json``).
        release: the candidate release.
        baseline: the release to draw beside it, or None for none (pass the notes' baseline, e.g.
            ``validate.compare.resolve_baseline(reports, release, None)``). Its record of a suite is drawn only
            where it measured the same thing (:func:`validate.perfgate.comparable`, the performance gate's rule).
        notes: where given, a line per figure that could not be drawn (a record holding values no figure can
            show) or per baseline left out, and why; the figure is then not written, and nothing raises.

    Returns:
        What was written, per configuration in name order (concurrency, latency, memory), then the history.

    Raises:
        InputError: a bad release name, or a record of ``release`` or ``baseline`` that does not read (records of
            other releases that do not read are left out of the history).
        OSError: the figures folder cannot be written.
    """
    from validate.perfgate import comparable

    check_release_name(release)
    if baseline == release:
        baseline = None
    if baseline:
        check_release_name(baseline)
    rel_dir = reports / release
    out_dir = rel_dir / FIGURES
    cand = release_records(reports, release)
    base = release_records(reports, baseline, skipped=[]) if baseline else []
    base_by = {(r.config, r.suite): r for r in base if r.verdict.status in DRAWN}
    written: list[PlotFile] = []

    def emit(name: str, title: str, config: str | None, kind: PlotKind, plot, *args) -> None:
        try:
            plot(out_dir / name, title, *args)
        except (TypeError, ValueError, OverflowError, KeyError) as e:
            if notes is None:
                raise
            notes.append(f"{name}: not drawn: the records hold values it cannot show ({type(e).__name__}: {e})")
            return
        written.append(PlotFile(f"{FIGURES}/{name}", title, config, kind))

    def status_note(rec: Record) -> str:
        return "" if rec.verdict.status == "pass" else f" [{rec.release} verdict: {rec.verdict.status}]"

    def draw_config(cfg: str) -> None:
        recs = [r for r in cand if r.config == cfg and r.verdict.status in DRAWN]
        for rec in sorted((r for r in recs if r.suite_kind == "betterbench"), key=lambda r: r.suite):
            b = base_by.get((cfg, rec.suite))
            if b is not None and comparable(b, rec):
                if notes is not None:
                    notes.append(f"{cfg}/{rec.suite}: {b.release}'s record is not drawn beside it: "
                                 + "; ".join(comparable(b, rec)))
                b = None
            stem = f"{_safe(cfg)}/{_safe(rec.suite)}"
            who = f"{b.release} vs {release}" if b else release
            verdicts = (status_note(b) if b else "") + status_note(rec)
            sides = ([b] if b else []) + [rec]
            # a figure is drawn when the candidate has its data; the baseline joins it where it has them too
            bands = [concurrency_bands(r, r.release) for r in sides]
            agg = [a for a, _ in bands if a] if bands[-1][0] else []
            per = [p for _, p in bands if p] if bands[-1][1] else []
            if agg or per:
                mns = (rec.config_snapshot.get("server") or {}).get("max_num_seqs")
                emit(f"{stem}-concurrency.png", f"{cfg}: BetterBench throughput against concurrency, {who} (tok/s){verdicts}",
                     cfg, "concurrency", plot_concurrency, agg, per, mns if isinstance(mns, int) else None)
            lat = [latency_series(r) for r in sides]
            ttft = [s for t, _ in lat for s in t] if lat[-1][0] else []
            itl = [s for _, i in lat for s in i] if lat[-1][1] else []
            if ttft or itl:
                emit(f"{stem}-latency.png", f"{cfg}: BetterBench TTFT and ITL distributions, {who} (ms){verdicts}",
                     cfg, "latency", plot_latency, ttft, itl, release)
        for rec in sorted((r for r in recs if r.suite_kind == "soak"), key=lambda r: r.suite):
            series = memory_series(rec)
            if not series:
                continue
            m = rec.metrics
            died = _num_or_none(m.get("server_died_at_s"))
            dur = _num_or_none(m.get("duration_s"))
            span = ""
            if dur and isinstance(m.get("clients"), int):
                span = f", {m['clients']} clients, " + (f"{dur / 60:.1f} min" if dur >= 300 else f"{dur:.0f} s")
            emit(f"{_safe(cfg)}/{_safe(rec.suite)}-memory.png",
                 f"{cfg}: soak memory over time, {release}{span} (MiB){status_note(rec)}", cfg, "memory",
                 plot_memory, series, _num_or_none(m.get("max_slope_mib_per_min")), died)

    for cfg in sorted({r.config for r in cand}):
        try:  # a record holding values no figure can show (edited by hand) costs its figures, never the notes
            draw_config(cfg)
        except (TypeError, ValueError, OverflowError, KeyError, AttributeError) as e:
            if notes is None:
                raise
            notes.append(f"{cfg}: figures not drawn: the records hold values they cannot show ({type(e).__name__}: {e})")

    names = history_releases(reports, release)
    by_release = {rel: (cand if rel == release else base if rel == baseline else _readable_records(reports, rel))
                  for rel in names}
    try:
        panels = history_panels(by_release)
    except (TypeError, ValueError, OverflowError, KeyError, AttributeError) as e:
        if notes is None:
            raise
        notes.append(f"history.png: not drawn: the records hold values it cannot show ({type(e).__name__}: {e})")
        panels, names = [], []
    with_data = [i for i, rel in enumerate(names)
                 if any(ln.values[i] is not None for p in panels for ln in p.lines)]
    if len(with_data) >= 2:
        keep = names[with_data[0]:]  # from the first release that holds a figure
        off = with_data[0]
        for p in panels:
            for ln in p.lines:
                ln.values = ln.values[off:]
                ln.lo = ln.lo[off:] if ln.lo else None
                ln.hi = ln.hi[off:] if ln.hi else None
                ln.hollow = ln.hollow[off:]
        shown = [name for name, p in zip(HISTORY_NAMES, panels) if any(v is not None for ln in p.lines for v in ln.values)]
        emit("history.png", f"Release history up to {release}: {', '.join(shown)}", None, "history",
             plot_history, keep, panels)

    keep = {out_dir / Path(f.path).relative_to(FIGURES) for f in written}
    if out_dir.is_dir():  # figures of an earlier render that this one no longer draws
        for p in [out_dir / "history.png", *out_dir.glob("*/*.png")]:
            ours = p.name == "history.png" or p.name.endswith(("-concurrency.png", "-latency.png", "-memory.png"))
            if ours and p.is_file() and p not in keep:
                p.unlink(missing_ok=True)
        for d in out_dir.iterdir():
            if d.is_dir() and not any(d.iterdir()):
                d.rmdir()
    return written

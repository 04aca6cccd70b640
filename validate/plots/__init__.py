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

Three layers, each importing only from those below it: :mod:`validate.plots.layout` (where each file goes:
:func:`render_figures`, :class:`PlotFile`) over :mod:`validate.plots.select` (which records feed a picture,
and the plain data taken from them) over :mod:`validate.plots.draw` (the ``plot_*`` functions, which take
plain data and write one PNG).
"""
from validate.plots.draw import (DPI, HISTORY_SIZE_PX, SIZE_PX, Band, HistoryLine, HistoryPanel, MemorySeries,
                                 Samples, plot_concurrency, plot_history, plot_latency, plot_memory)
from validate.plots.layout import FIGURES, PlotFile, PlotKind, render_figures
from validate.plots.select import (DRAWN, HISTORY_NAMES, HISTORY_STATUSES, concurrency_bands, history_panels,
                                   history_releases, latency_series, memory_series, readable_records)

__all__ = ["DPI", "DRAWN", "FIGURES", "HISTORY_NAMES", "HISTORY_SIZE_PX", "HISTORY_STATUSES", "SIZE_PX", "Band",
           "HistoryLine", "HistoryPanel", "MemorySeries", "PlotFile", "PlotKind", "Samples", "concurrency_bands",
           "history_panels", "history_releases", "latency_series", "memory_series", "plot_concurrency",
           "plot_history", "plot_latency", "plot_memory", "readable_records", "render_figures"]

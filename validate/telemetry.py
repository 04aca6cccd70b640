"""Memory sampling during load: the server's process tree through psutil (always, when the server is local)
and GPU memory through the vendor library or tool that is present (NVML through nvidia-ml-py where it answers,
else nvidia-smi; amd-smi or rocm-smi).

Backends register by name (lm-eval-harness style); :class:`Sampler` runs every available one each interval.
"""
from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
import time
from dataclasses import dataclass, field
from typing import Callable

import psutil

from validate.util import within

MiB = 1024 * 1024
BACKENDS: dict[str, Callable[..., "Backend"]] = {}


def register_backend(name: str):
    def deco(cls):
        BACKENDS[name] = cls
        return cls
    return deco


class Backend:
    """One memory source. ``read()`` returns {series name: MiB used}; ``totals()`` {series name: MiB total}."""

    name = "?"

    @classmethod
    def available(cls, pid: int | None) -> bool:
        return False

    def read(self) -> dict[str, float]:
        raise NotImplementedError

    def totals(self) -> dict[str, float]:
        return {}


@register_backend("process-tree")
class ProcessTree(Backend):
    """RSS of the server's main process and all its descendants (MiB), and the host's total memory."""

    name = "process-tree"

    def __init__(self, pid: int | None):
        self.root = psutil.Process(pid)

    @classmethod
    def available(cls, pid):
        return pid is not None and psutil.pid_exists(pid)

    def read(self):
        total = 0
        try:
            procs = [self.root] + self.root.children(recursive=True)
        except psutil.NoSuchProcess:
            return {}
        for p in procs:
            try:
                total += p.memory_info().rss
            except psutil.Error:
                pass
        return {"host_rss_mib": total / MiB}

    def totals(self):
        return {"host_rss_mib": psutil.virtual_memory().total / MiB}


def _nvml():
    """NVML through nvidia-ml-py (``pynvml``), initialised, or None where the library or the driver does not
    answer (no NVIDIA GPU, no driver, the package absent)."""
    try:
        import pynvml

        pynvml.nvmlInit()
        return pynvml
    except Exception:  # noqa: BLE001 - ImportError, NVMLError_LibraryNotFound, NVMLError_DriverNotLoaded, ...
        return None


@register_backend("nvml")
class Nvml(Backend):
    """Used / total device memory of every NVIDIA GPU (MiB) from NVML's ``nvmlDeviceGetMemoryInfo``, one series
    per GPU index (``gpu0_mib``, ...): the vendor library, read in-process every interval (no subprocess)."""

    name = "nvml"

    def __init__(self, pid):
        self.nv = _nvml()
        self.handles = [self.nv.nvmlDeviceGetHandleByIndex(i) for i in range(self.nv.nvmlDeviceGetCount())]
        self._totals: dict[str, float] = {}

    @classmethod
    def available(cls, pid):
        nv = _nvml()
        return nv is not None and nv.nvmlDeviceGetCount() > 0

    def read(self):
        used = {}
        for i, h in enumerate(self.handles):
            m = self.nv.nvmlDeviceGetMemoryInfo(h)
            used[f"gpu{i}_mib"] = m.used / MiB
            self._totals[f"gpu{i}_mib"] = m.total / MiB
        return used

    def totals(self):
        return self._totals


@register_backend("nvidia-smi")
class NvidiaSmi(Backend):
    """memory.used / memory.total of every NVIDIA GPU (MiB), one series per GPU index; where NVML answers, the
    ``nvml`` backend reads the same series instead."""

    name = "nvidia-smi"

    def __init__(self, pid):
        self._totals: dict[str, float] = {}

    @classmethod
    def available(cls, pid):
        return shutil.which("nvidia-smi") is not None and not Nvml.available(pid)

    def _query(self):
        out = subprocess.run(["nvidia-smi", "--query-gpu=index,memory.used,memory.total", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=10).stdout
        used, tot = {}, {}
        for line in out.strip().splitlines():
            i, u, t = [x.strip() for x in line.split(",")]
            used[f"gpu{i}_mib"] = float(u)
            tot[f"gpu{i}_mib"] = float(t)
        return used, tot

    def read(self):
        used, self._totals = self._query()
        return used

    def totals(self):
        return self._totals


@register_backend("amd-smi")
class AmdSmi(Backend):
    """VRAM used / total per AMD GPU (MiB) from ``amd-smi metric --mem-usage --json``, else rocm-smi."""

    name = "amd-smi"

    def __init__(self, pid):
        self._totals: dict[str, float] = {}

    @classmethod
    def available(cls, pid):
        return shutil.which("amd-smi") is not None or shutil.which("rocm-smi") is not None

    def read(self):
        used = {}
        if shutil.which("rocm-smi"):
            out = subprocess.run(["rocm-smi", "--showmeminfo", "vram", "--json"], capture_output=True, text=True, timeout=10).stdout
            for card, v in json.loads(out or "{}").items():
                key = f"{card}_mib"
                used[key] = float(v.get("VRAM Total Used Memory (B)", 0)) / MiB
                self._totals[key] = float(v.get("VRAM Total Memory (B)", 0)) / MiB
        return used

    def totals(self):
        return self._totals


@dataclass
class Sampler:
    """Samples every available backend every ``interval_s`` until stopped. ``samples``: [(t_s, {series: MiB})]."""

    pid: int | None
    interval_s: float = 1.0
    samples: list[tuple[float, dict[str, float]]] = field(default_factory=list)
    totals: dict[str, float] = field(default_factory=dict)
    backends: list[str] = field(default_factory=list)
    t0: float = field(default_factory=time.monotonic)  # time.monotonic() of t_s = 0

    async def run(self, stop: asyncio.Event) -> None:
        active = []
        for name, cls in BACKENDS.items():
            try:
                if cls.available(self.pid):
                    active.append(cls(self.pid))
            except (psutil.Error, OSError):
                pass
        self.backends = [b.name for b in active]
        t0 = self.t0 = time.monotonic()
        while not stop.is_set():
            row: dict[str, float] = {}
            for b in active:
                try:
                    row.update(await asyncio.to_thread(b.read))
                    self.totals.update(b.totals())
                except (subprocess.SubprocessError, OSError, ValueError, psutil.Error):
                    pass
            if row:
                self.samples.append((round(time.monotonic() - t0, 2), {k: round(v, 1) for k, v in row.items()}))
            try:
                await within(stop.wait(), self.interval_s)
            except asyncio.TimeoutError:
                pass


def slope_mib_per_min(samples: list[tuple[float, dict[str, float]]], series: str, skip_fraction: float = 0.25) -> float | None:
    """Least-squares slope of ``series`` over time (MiB/min), after dropping the first ``skip_fraction`` of the
    samples (start-up growth: allocator warm-up, compile caches). None with fewer than 5 points left."""
    import numpy as np

    pts = [(t, row[series]) for t, row in samples if series in row]
    pts = pts[int(len(pts) * skip_fraction):]
    if len(pts) < 5:
        return None
    t = np.array([p[0] for p in pts]) / 60.0
    y = np.array([p[1] for p in pts])
    if np.ptp(t) == 0:
        return None
    return float(np.polyfit(t, y, 1)[0])

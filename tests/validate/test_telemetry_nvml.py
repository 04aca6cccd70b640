"""GPU memory through NVML (nvidia-ml-py's ``pynvml``): the backend's series and totals from the library's answers,
nvidia-smi left out where NVML answers, and NVML left out where it does not (no package, no driver). A stand-in
``pynvml`` module is injected: no GPU here."""
from __future__ import annotations

import sys
import types

import pytest

from validate import telemetry

MiB = 1024 * 1024


def _fake_pynvml(used_mib: list[float], total_mib: float, fail_init: bool = False):
    m = types.ModuleType("pynvml")

    def init():
        if fail_init:
            raise RuntimeError("NVML Shared Library Not Found")

    m.nvmlInit = init
    m.nvmlDeviceGetCount = lambda: len(used_mib)
    m.nvmlDeviceGetHandleByIndex = lambda i: i
    m.nvmlDeviceGetMemoryInfo = lambda h: types.SimpleNamespace(used=int(used_mib[h] * MiB),
                                                                total=int(total_mib * MiB))
    return m


def test_nvml_reads_each_gpu_and_its_total(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", _fake_pynvml([1024.0, 512.5], 81559.0))
    assert telemetry.Nvml.available(None)
    b = telemetry.Nvml(None)
    assert b.read() == {"gpu0_mib": 1024.0, "gpu1_mib": 512.5}
    assert b.totals() == {"gpu0_mib": 81559.0, "gpu1_mib": 81559.0}
    # one source a series: nvidia-smi is not sampled beside NVML
    monkeypatch.setattr(telemetry.shutil, "which", lambda name: "/usr/bin/nvidia-smi")
    assert not telemetry.NvidiaSmi.available(None)


@pytest.mark.parametrize("module", [None, "no-driver"])
def test_without_nvml_nvidia_smi_is_the_source(monkeypatch, module):
    monkeypatch.setitem(sys.modules, "pynvml", None if module is None else _fake_pynvml([1.0], 2.0, fail_init=True))
    assert not telemetry.Nvml.available(None)
    monkeypatch.setattr(telemetry.shutil, "which", lambda name: "/usr/bin/nvidia-smi")
    assert telemetry.NvidiaSmi.available(None)

"""What accelerators this machine has, for the preflight: a configuration asking for GPUs this machine does
not have is reported before anything launches, and its suites are recorded as not run with that cause.

GPUs are listed with the vendor tool that is present (``nvidia-smi -L``, ``amd-smi list``, ``rocm-smi
--showproductname``); without one, the DRM devices under /sys/class/drm count (display-class PCI devices of
AMD, NVIDIA or Intel), names unknown.
"""
from __future__ import annotations

import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from validate.config import Hardware

_VENDORS = {"0x1002": "AMD", "0x10de": "NVIDIA", "0x8086": "Intel"}


@dataclass(frozen=True)
class GPU:
    """One visible GPU: ``name`` as the vendor tool prints it ('' when only the device node is known)."""

    name: str
    vendor: str


def _run(cmd: list[str]) -> str:
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=20).stdout
    except (OSError, subprocess.SubprocessError):
        return ""


def visible_gpus() -> list[GPU]:
    """The GPUs this machine shows, by the first source that lists any (see the module docstring)."""
    if shutil.which("nvidia-smi"):
        names = re.findall(r"^GPU \d+: (.+?)(?: \(UUID|$)", _run(["nvidia-smi", "-L"]), re.M)
        if names:
            return [GPU(n.strip(), "NVIDIA") for n in names]
    if shutil.which("rocm-smi"):
        # one "GPU[i] : Card Series: <name>" line per GPU (also "Card Model", "Card Vendor", ... lines)
        names = dict(re.findall(r"^GPU\[(\d+)\]\s*:\s*Card [Ss]eries:\s*(.+)$", _run(["rocm-smi", "--showproductname"]), re.M))
        if names:
            return [GPU(n.strip(), "AMD") for _, n in sorted(names.items(), key=lambda kv: int(kv[0]))]
    if shutil.which("amd-smi"):
        n = len(re.findall(r"^GPU: \d+", _run(["amd-smi", "list"]), re.M))
        if n:
            return [GPU("", "AMD")] * n
    out = []
    for card in sorted(Path("/sys/class/drm").glob("card[0-9]*")):
        if "-" in card.name:  # connectors (card0-DP-1), not devices
            continue
        try:
            vendor = (card / "device" / "vendor").read_text().strip()
            klass = (card / "device" / "class").read_text().strip()
        except OSError:
            continue
        if klass.startswith("0x03") and vendor in _VENDORS:
            out.append(GPU("", _VENDORS[vendor]))
    return out


def _norm(text: str) -> str:
    return re.sub(r"[^a-z0-9]", "", text.lower())


def hardware_problem(hw: Hardware, gpus: list[GPU] | None = None) -> str | None:
    """Why this machine cannot host a configuration that asks for ``hw``, or None when it can.

    A configuration with ``gpus: 0`` runs anywhere. Otherwise the machine needs at least ``hw.gpus`` GPUs, and
    where their names are known, that many whose name contains ``hw.kind`` (letters and digits compared,
    case-insensitive: kind ``r9700`` matches "AMD Radeon AI PRO R9700").
    """
    if hw.gpus <= 0:
        return None
    gpus = visible_gpus() if gpus is None else gpus
    want = f"{hw.gpus} GPU(s) of kind {hw.kind!r}"
    if not gpus:
        return f"hardware: needs {want}; this machine shows no GPU"
    named = [g for g in gpus if g.name]
    if named:
        match = [g for g in named if _norm(hw.kind) and _norm(hw.kind) in _norm(g.name)]
        if len(match) < hw.gpus:
            have = ", ".join(sorted({g.name for g in named}))
            return f"hardware: needs {want}; this machine has {len(match)} of that kind ({len(named)} GPU(s): {have})"
        return None
    if len(gpus) < hw.gpus:
        return f"hardware: needs {want}; this machine shows {len(gpus)} GPU(s)"
    return None

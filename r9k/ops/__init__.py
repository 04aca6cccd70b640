"""Dispatch from vLLM layers to r9k kernels. Each installer patches only where vLLM has the layer."""
from __future__ import annotations

import logging

log = logging.getLogger("r9k")


def install() -> list[str]:
    """Install every op dispatch whose knob is not at its stock value. Returns the names installed."""
    installed: list[str] = []
    return installed

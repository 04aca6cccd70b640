"""Dispatch from vLLM layers to r9k kernels. Each installer patches only where vLLM has the layer."""
from __future__ import annotations

import logging

log = logging.getLogger("r9k")


def install() -> list[str]:
    """Install every op dispatch whose knob is not at its stock value. Returns the names installed."""
    installed: list[str] = []
    from r9k.ops import gdn

    try:
        installed += gdn.install()
    except Exception:  # a dispatch must never take the server down: log it, keep stock vLLM
        log.exception("r9k: GDN dispatch not installed")
    return installed

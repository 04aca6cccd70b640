"""r9k: custom kernels for vLLM, loaded through the ``vllm.general_plugins`` entry point.

vLLM calls :func:`register` in every process it starts (API server, engine core, workers). It installs the
op dispatch, then logs the provenance line (which tree this is, and which dispatch is installed in this
process); every behaviour is behind a knob in :mod:`r9k.knobs`, whose stock values leave vLLM untouched.
"""
from __future__ import annotations

from r9k.version import __version__

__all__ = ["__version__", "register"]

_registered = False


def register() -> None:
    """Entry point for ``vllm.general_plugins``: install the op dispatch, then log provenance once per process.

    Idempotent: vLLM may call it more than once in one process.
    """
    global _registered
    if _registered:
        return
    _registered = True
    from r9k import knobs, ops, provenance

    installed = ops.install()
    if knobs.PROVENANCE_LOG():
        provenance.log_once(installed.names, installed.failed)

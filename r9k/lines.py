"""Where the plugin's counter lines go: the r9k logger with a plain handler, and the process's tensor-parallel rank
that each line names (r9k/counters.py's and r9k/calls.py's lines, which the validation engine parses whole)."""
from __future__ import annotations

import logging

log = logging.getLogger("r9k")


def logger() -> logging.Logger:
    """The r9k logger with a plain stderr handler (the provenance line's: the message alone), at INFO."""
    if not log.handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(message)s"))
        log.addHandler(handler)
        log.propagate = False
    if log.level == logging.NOTSET or log.level > logging.INFO:
        log.setLevel(logging.INFO)
    return log


def rank() -> int:
    """This process's tensor-parallel rank in vLLM (0 where vLLM has no parallel state, as in a unit test)."""
    try:
        from vllm.distributed import parallel_state

        return int(parallel_state.get_tensor_model_parallel_rank())
    except Exception:  # noqa: BLE001 - no parallel state: rank 0
        return 0

"""Errors of the engine, each mapped to an exit status by the CLI."""
from __future__ import annotations


class InputError(Exception):
    """Bad input (a configuration, suite or checklist file, a CLI argument, missing data). Exit status 2."""


class LaunchError(Exception):
    """A server that did not come up: crashed, timed out, port taken, not ready. Exit status 2.

    Attributes:
        cause: one line naming what happened.
        log_tail: the last lines of the server log, when there is one.
    """

    def __init__(self, cause: str, log_tail: str = ""):
        super().__init__(cause + (f"\n--- server log tail ---\n{log_tail}" if log_tail else ""))
        self.cause = cause
        self.log_tail = log_tail

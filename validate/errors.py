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


class WrongTreeError(Exception):
    """A server announced another plugin source than the tree under validation while starting.

    Attributes:
        cause: one line naming both hashes.
        provenance: the provenance lines it printed.
    """

    def __init__(self, cause: str, provenance: list[str]):
        super().__init__(cause)
        self.cause = cause
        self.provenance = provenance


class ReportsError(Exception):
    """A record or the notes could not be written (reports folder full, read-only, gone). Exit status 2;
    records written before it stay intact."""


EXIT_OK, EXIT_FAIL, EXIT_INPUT, EXIT_INTERRUPTED = 0, 1, 2, 130


def combine_exit(*codes: int) -> int:
    """One exit status for several outcomes, by precedence: 130 (interrupted) over 1 (a finding: a gate failed,
    a regression, a server that ran the wrong tree or an inactive plugin) over 2 (something could not be
    checked: bad input, a launch, a suite that could not complete, records that cannot be paired) over 0.
    A finding is never hidden behind an error; ``release`` and ``gate`` use the same order."""
    for code in (EXIT_INTERRUPTED, EXIT_FAIL, EXIT_INPUT):
        if code in codes:
            return code
    return EXIT_OK

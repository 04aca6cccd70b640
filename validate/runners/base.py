"""What a runner gets (:class:`RunContext`) and returns (:class:`SuiteResult`)."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Awaitable, Callable

from validate.client import OpenAIClient
from validate.config import ServeConfig
from validate.margins import mode_of
from validate.record import Dataset, Item


@dataclass
class RunContext:
    """Everything a runner may use. Runners do not launch servers, write records or render."""

    root: Path  # checkout holding serve/, suites/ (suite data files are relative to suites/)
    config: ServeConfig
    profile: str
    client: OpenAIClient | None
    data_dir: Path | None
    record_dir: Path
    release: str | None = None  # the release being run: its records of this configuration are under record_dir
    server_alive: Callable[[], bool] = lambda: True
    # server_gone(): None while the server serves, else why it is gone (process exited, /health not 200)
    server_gone: Callable[[], Awaitable[str | None]] = None  # type: ignore[assignment]
    server_pid: int | None = None  # the launched server's main process (None for --url servers)
    # baseline_hint: {"release": name, "value": what the kind's Runner.baseline_hint took from the baseline's
    # record of this configuration and suite}, when a release with a baseline runs it; else None
    baseline_hint: dict[str, Any] | None = None
    # progress(advance, total=None, description=None): the CLI binds it to a rich progress bar
    progress: Callable[..., None] = lambda *a, **k: None
    log: Callable[[str], None] = print
    # the suite's time budget on its profile (seconds; the suite file's profiles.<profile>.budget_s), None if
    # unstated: a runner that sizes its work to it (BetterBench's passes) reads it here
    budget_s: float | None = None

    @property
    def think_end(self) -> str:
        """The configuration's end-of-thinking marker (the default without a configuration)."""
        from validate.reasoning import DEFAULT_THINK_END

        return self.config.think_end if self.config is not None else DEFAULT_THINK_END

    @property
    def logprobs_mode(self) -> str | None:
        """What the server's logprobs values are (vLLM's ``--logprobs-mode``, validate.margins.mode_of): from the
        configuration's extra_args for a server this engine launched, None for one it did not (``--url``)."""
        if self.config is None:
            return None
        return mode_of(self.config.server.extra_args, launched=self.server_pid is not None)

    def top2_fields(self, r) -> dict[str, Any]:
        """An item's ``top2`` and ``logprobs_mode`` from a RequestResult ``r`` (validate.record.Item): only where
        the server sent a step per token id (else the steps could not be placed at their tokens); {} otherwise."""
        if not r.top2 or not r.token_ids or len(r.top2) != len(r.token_ids):
            return {}
        return {"top2": r.top2, "logprobs_mode": self.logprobs_mode}

    def __post_init__(self):
        if self.server_gone is None:
            async def never() -> str | None:
                return None
            self.server_gone = never


@dataclass
class SuiteResult:
    """A runner's output: metrics for the gate, per-item records, dataset identity, and the reasons for
    anything that went wrong while running (each makes the verdict "error")."""

    metrics: dict[str, Any] = field(default_factory=dict)
    items: list[Item] = field(default_factory=list)
    dataset: Dataset | None = None
    errors: list[str] = field(default_factory=list)
    findings: list[str] = field(default_factory=list)  # gate-independent failures (e.g. a bad answer), verdict "fail"
    server_died: str | None = None  # the runner found the server dead: why, when, and what happened before
    server_metrics: dict[str, Any] | None = None  # the server's own counters over the suite (the engine fills it)
    moe_cache: dict[str, Any] | None = None  # r9k's expert-cache counters over the suite, from the server log (the engine)
    r9k_calls: dict[str, Any] | None = None  # r9k's dispatched calls by step kind over the suite (the engine)
    client_tally: dict[str, Any] | None = None  # every request as the client saw it (the engine fills it)
    # name -> (content, file extension): files the engine writes beside the record and hashes into it
    attachments: dict[str, tuple[bytes, str]] = field(default_factory=dict)


def misjudged(wrong: list[str], n: int, by: str = "outputs") -> list[str]:
    """The audits' line for the items whose stored judgement is not what their ``by`` (outputs, outcomes) give:
    ``wrong`` holds one phrase per such item, ``n`` the record's item count; the first three are named. Empty when
    ``wrong`` is."""
    if not wrong:
        return []
    return [f"{len(wrong)} of its {n:,} items are not judged as their {by} give: "
            + "; ".join(wrong[:3]) + (" ..." if len(wrong) > 3 else "")]


def recount(metrics: Any, want: dict[str, Any], label: str = "its metrics are not its items' counts") -> list[str]:
    """The audits' comparison of a record's ``metrics`` with what its items give: one line naming each key of
    ``want`` whose stored value differs (numbers within 1e-6; a bool, a missing key or another type differs), or
    nothing when all agree. A key the metrics lack is named too: a count left out is not a count that agrees."""
    m = metrics if isinstance(metrics, dict) else {}

    def same(a: Any, b: Any) -> bool:
        if isinstance(b, (int, float)) and not isinstance(b, bool):
            return isinstance(a, (int, float)) and not isinstance(a, bool) and abs(a - b) <= 1e-6
        return a == b

    said = [f"{k} = {m.get(k, 'missing')!r}, its items give {v!r}" for k, v in want.items()
            if k not in m or not same(m[k], v)]
    return [f"{label}: " + "; ".join(said[:4]) + (" ..." if len(said) > 4 else "")] if said else []

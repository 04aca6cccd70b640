"""How often r9k's dispatches ran, and in which kind of step: counted on the device, read by the engine.

A dispatch that is installed is not a dispatch that runs: vLLM may pick another kernel (on CUDA its automatic
order takes Marlin's fp8 kernel before the Triton one r9k wraps), a step may fall outside the dispatch's shapes, and
vLLM's decode replays CUDA graphs in which no Python runs. So each call a dispatch routes to r9k (for ``moe_cache``:
the expert cache planned the step; vLLM's experts compute it unless the layer reads its misses through r9k's
pointer-table GEMM) adds one to a counter kept in a device tensor, indexed by the kind of the step running, itself
held in a device tensor that the model runner's step sets before the forward and resets once the step is done
(:func:`install` wraps vLLM's ``execute_model`` and ``sample_tokens``, where a drafter proposes). The add is a kernel
on the call's stream: a call captured into a CUDA graph counts at every replay, in the kind of the step that replays
it. A call sent back to vLLM is counted where the dispatch decides at run time (eager code, and r9k's own ops);
inside code torch.compile traced, that decision was taken while tracing and such calls are not counted.

Routes (:data:`ROUTES`): ``r9k`` (r9k ran the call), ``rule`` (the dispatch's own rule sends it to vLLM by design:
the GDN prefill dispatch's calls beyond ``R9K_GDN_PREFILL_MAX``, a sequence longer than it under
``R9K_GDN_PREFILL_SPLIT=seq``, a step outside its crossover under ``step``; a split step counts one call ``r9k``
and one ``rule``, its long sequences), ``vllm`` (a call sent to vLLM for another reason: refused by the kernel,
vLLM's profile-run warm-up, a layout or backend r9k does not cover). ``rule`` is the GDN dispatch's alone: the fp8
linear and the expert cache have no length rule, so their ``vllm`` is every call they did not take.

Kinds: ``prefill`` (a step where some request schedules more than one token besides its speculative ones: a
prefill or a chunk of one, with any decodes beside it; a one-token prompt or last chunk reads as a decode),
``decode`` (every request one token), ``other`` (outside a step: vLLM's profile and capture runs, a step that
schedules nothing). vLLM's V2 runner warms up through real steps, before any suite.

Each process that counts prints a line after a step once ``R9K_CALLS_SEC`` seconds have passed since its last,
and at exit (cumulative since it started; the dispatches with no call left out)::

    R9K-CALLS pid=4242 rank=0 routes=r9k,rule,vllm steps=prefill:12,decode:840,other:3 calls=gdn_seq:r9k:prefill:36,gdn_seq:rule:prefill:4

alone on its line, at most behind vLLM's ``(EngineCore pid=42) `` prefix (whose pid must then be the line's).
``routes=`` names the routes the process counts; a line without it (a plugin from before ``rule`` was counted)
counts ``r9k`` and ``vllm`` only, its ``vllm`` calls holding those its rule declined. The
validation engine parses the lines (:func:`parse`) and keeps each suite's share (:func:`delta`): the steps and calls
of up to ``R9K_CALLS_SEC`` before a suite's end can fall in the next suite's share (the calls a step are not
moved). Costs: one small kernel per counted call and two a step, and a device-to-host read at each line.
"""
from __future__ import annotations

import atexit
import functools
import importlib
import logging
import os
import re
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable

log = logging.getLogger("r9k")

PREFIX = "R9K-CALLS"
KINDS = ("prefill", "decode", "other")
#: where a counted call went (the module docstring): r9k's kernel, vLLM's by the dispatch's own rule, vLLM's otherwise
ROUTES = ("r9k", "rule", "vllm")
#: the routes a line without ``routes=`` counts
OLD_ROUTES = ("r9k", "vllm")
#: the model runners whose ``execute_model`` marks the steps: vLLM's V2 GPU runner and the V1 one (its CPU runner
#: inherits it)
RUNNERS = (("vllm.v1.worker.gpu.model_runner", "GPUModelRunner"), ("vllm.v1.worker.gpu_model_runner", "GPUModelRunner"))


@dataclass
class _Device:
    """One device's counters: ``kind`` [1] int64 (the index in :data:`KINDS` of the step running), ``counts``
    [rows, kinds] int64 (a row per (dispatch, route)), ``one`` [1] int64."""

    kind: Any
    counts: Any
    one: Any


@dataclass
class _State:
    rows: dict[tuple[str, str], int] = field(default_factory=dict)   # (dispatch, route) -> row
    devices: dict[str, _Device] = field(default_factory=dict)
    steps: dict[str, int] = field(default_factory=lambda: dict.fromkeys(KINDS, 0))
    patches: list[tuple[Any, str, Callable, Callable]] = field(default_factory=list)  # (class, name, vLLM's, ours)
    interval: float = 1.0
    last_log: float = 0.0
    wrapped: set[str] = field(default_factory=set)  # the runner methods wrapped
    open: bool = False  # a step whose forward ran and whose sampling is still to come
    lock: threading.Lock = field(default_factory=threading.Lock)


STATE = _State()
MAX_ROWS = 16  # dispatch names x routes; r9k.ops.FAMILIES has 4 names
NAME_RE = re.compile(r"[a-z][a-z0-9_]*")  # a dispatch name (r9k.ops.FAMILIES' names)


def _row(dispatch: str, route: str) -> int:
    key = (dispatch, route)
    row = STATE.rows.get(key)
    if row is None:
        with STATE.lock:  # two threads (vLLM's dual-batch overlap) must not take one row for two keys
            row = STATE.rows.get(key)
            if row is None:
                if route not in ROUTES or not NAME_RE.fullmatch(dispatch) or len(STATE.rows) >= MAX_ROWS:
                    raise ValueError(f"r9k calls: cannot count {dispatch}:{route}")
                row = STATE.rows[key] = len(STATE.rows)
    return row


def _on(device: Any) -> _Device:
    """The counters of ``device`` (a torch.device or its name), made on first use; call it outside a CUDA-graph
    capture (the step's start does) so that the tensors are not the graph pool's."""
    import torch

    name = str(device)
    d = STATE.devices.get(name)
    if d is None:
        with STATE.lock:
            d = STATE.devices.get(name)
            if d is None:
                dev = torch.device(name)
                d = _Device(torch.full((1,), KINDS.index("other"), dtype=torch.int64, device=dev),
                            torch.zeros((MAX_ROWS, len(KINDS)), dtype=torch.int64, device=dev),
                            torch.ones(1, dtype=torch.int64, device=dev))
                STATE.devices[name] = d
    return d


def count(dispatch: str, route: str, device: Any) -> None:
    """One call of ``dispatch`` (an ``r9k.ops`` name) routed to ``route`` (:data:`ROUTES`) on ``device``, in the
    kind of the step running there: a kernel on the current stream (captured into a CUDA graph, it counts at every
    replay). Never raises: a count that cannot be taken is logged once."""
    try:
        import torch

        if torch.compiler.is_compiling():  # traced, it would count once at tracing: the op's body counts instead
            return
        d = _on(device)
        d.counts[_row(dispatch, route)].index_add_(0, d.kind, d.one)
    except Exception as e:  # noqa: BLE001 - counting must never fail a call
        _warn_once(f"r9k calls: {dispatch}:{route} not counted: {type(e).__name__}: {e}")


def count_args(dispatch: str, route: str, args: tuple, kwargs: dict) -> None:
    """:func:`count` on the device of the call's first tensor argument (none: not counted)."""
    import torch

    dev = next((x.device for x in (*args, *kwargs.values()) if isinstance(x, torch.Tensor)), None)
    if dev is not None:
        count(dispatch, route, dev)


_WARNED: set[str] = set()


def _warn_once(msg: str) -> None:
    if msg not in _WARNED:
        _WARNED.add(msg)
        log.warning(msg)


def step_kind(scheduler_output: Any) -> str:
    """The kind (:data:`KINDS`) of the step ``scheduler_output`` (vLLM's SchedulerOutput) schedules: "decode" when
    every request schedules one token besides its speculative ones, "prefill" when one schedules more, "other"
    when it schedules none."""
    n = getattr(scheduler_output, "num_scheduled_tokens", None)
    if not isinstance(n, dict) or not n:
        return "other"
    spec = getattr(scheduler_output, "scheduled_spec_decode_tokens", None) or {}
    return "decode" if all(k - len(spec.get(r, ()) or ()) <= 1 for r, k in n.items()) else "prefill"


def _mark(kind: str) -> None:
    i = KINDS.index(kind)
    for d in list(STATE.devices.values()):
        d.kind.fill_(i)


def begin_step(kind: str, device: Any = None) -> None:
    """A step of ``kind`` starts (its forward not yet enqueued): the host's step count, and every counting
    device's kind (``device``'s counters made first when given)."""
    if device is not None:
        _on(device)
    STATE.steps[kind] += 1
    _mark(kind)


def end_step() -> None:
    """The step's forward is enqueued: the devices' kind back to "other", and the line when it is due."""
    _mark("other")
    if time.monotonic() - STATE.last_log >= STATE.interval:
        STATE.last_log = time.monotonic()
        log_line()


def totals() -> dict[tuple[str, str, str], int]:
    """{(dispatch, route, kind): calls} summed over this process's devices (reads the devices: a sync)."""
    out: dict[tuple[str, str, str], int] = {}
    for d in list(STATE.devices.values()):
        table = d.counts.tolist()
        for (dispatch, route), row in STATE.rows.items():
            for kind, n in zip(KINDS, table[row]):
                if n:
                    out[(dispatch, route, kind)] = out.get((dispatch, route, kind), 0) + int(n)
    return out


def line(pid: int, rank: int, steps: dict[str, int], calls: dict[tuple[str, str, str], int]) -> str:
    """The ``R9K-CALLS`` line (no newline): ``steps`` by kind, ``calls`` with a count above 0, sorted."""
    c = ",".join(f"{d}:{r}:{k}:{n}" for (d, r, k), n in sorted(calls.items()) if n > 0)
    s = ",".join(f"{k}:{int(steps.get(k, 0))}" for k in KINDS)
    return f"{PREFIX} pid={pid} rank={rank} routes={','.join(ROUTES)} steps={s} calls={c or '-'}"


def log_line() -> None:
    """Print this process's line (never raises)."""
    try:
        from r9k.lines import logger, rank

        logger().info(line(os.getpid(), rank(), STATE.steps, totals()))
    except Exception as e:  # noqa: BLE001 - a counter line must never fail a step
        _warn_once(f"r9k calls: no line: {type(e).__name__}: {e}")


# ---- the step hook ------------------------------------------------------------------------------------------
def _device_of(runner: Any) -> Any:
    dev = getattr(runner, "device", None)
    return dev if dev is not None and str(dev) != "meta" else None


def _safely(fn: Callable, *args) -> None:
    try:
        fn(*args)
    except Exception as e:  # noqa: BLE001 - counting must never fail a step
        _warn_once(f"r9k calls: {getattr(fn, '__name__', fn)}: {type(e).__name__}: {e}")


def _start(runner: Any, scheduler_output: Any, dummy: bool) -> None:
    begin_step("other" if dummy else step_kind(scheduler_output), _device_of(runner))


def _wrap_execute(original: Callable) -> Callable:
    @functools.wraps(original)
    def execute_model(self, scheduler_output, *args, **kwargs):
        _safely(_start, self, scheduler_output, bool(kwargs.get("dummy_run", False)))
        out = None
        try:
            out = original(self, scheduler_output, *args, **kwargs)
            return out
        finally:
            # None: vLLM samples (and a drafter proposes) in sample_tokens next, still the same step
            STATE.open = out is None and "sample_tokens" in STATE.wrapped
            if not STATE.open:
                _safely(end_step)

    execute_model.__r9k_original__ = original
    return execute_model


def _wrap_sample(original: Callable) -> Callable:
    @functools.wraps(original)
    def sample_tokens(self, *args, **kwargs):
        try:
            return original(self, *args, **kwargs)
        finally:
            if STATE.open:
                STATE.open = False
                _safely(end_step)

    sample_tokens.__r9k_original__ = original
    return sample_tokens


_WRAPPERS = {"execute_model": _wrap_execute, "sample_tokens": _wrap_sample}


def install() -> list[str]:
    """Wrap ``execute_model`` of every model runner of :data:`RUNNERS` vLLM has (idempotent), read
    ``R9K_CALLS_SEC``, and print the line at exit. Returns the wrapped targets; a runner that cannot be imported
    here (the V2 runner on vLLM's CPU build) is passed over, said once in the log."""
    from r9k import knobs

    STATE.interval = float(knobs.CALLS_SEC())
    out = []
    for module, cls_name in RUNNERS:
        try:
            cls = getattr(importlib.import_module(module), cls_name)
        except Exception as e:  # noqa: BLE001 - a runner this build lacks: the others still count
            log.info("r9k calls: %s.%s not marked: %s: %s", module, cls_name, type(e).__name__, e)
            continue
        if "execute_model" not in vars(cls):
            continue
        for attr, wrap in _WRAPPERS.items():
            fn = vars(cls).get(attr)
            if fn is None:
                continue
            if getattr(fn, "__r9k_original__", None) is None:
                wrapper = wrap(fn)
                STATE.patches.append((cls, attr, fn, wrapper))
                setattr(cls, attr, wrapper)
            STATE.wrapped.add(attr)
            out.append(f"{module}.{cls_name}.{attr}")
    _atexit_once()
    return out


def uninstall() -> None:
    """Undo :func:`install` and forget the counters."""
    for owner, attr, original, wrapper in reversed(STATE.patches):
        if vars(owner).get(attr) is wrapper:  # ours still: never put back over another's wrap of it
            setattr(owner, attr, original)
    STATE.patches.clear()
    STATE.wrapped.clear()
    STATE.open = False
    STATE.devices.clear()
    STATE.rows.clear()
    STATE.steps = dict.fromkeys(KINDS, 0)


_ATEXIT = False


def _atexit_once() -> None:
    global _ATEXIT
    if not _ATEXIT:
        _ATEXIT = True
        atexit.register(lambda: STATE.devices and log_line())


# ---- what the engine reads ---------------------------------------------------------------------------------
_PROC = r"^(?:\((?P<proc>[\w:.-]+) pid=(?P<ppid>\d+)\) )?"
_N = r"(?:0|[1-9][0-9]{0,18})"  # ASCII digits only
_CALL = rf"{NAME_RE.pattern}:(?:{'|'.join(ROUTES)}):(?:{'|'.join(KINDS)}):{_N}"
_ROUTE = f"(?:{'|'.join(ROUTES)})"
_LINE_RE = re.compile(_PROC + PREFIX + rf" pid=(?P<pid>{_N}) rank=(?P<rank>{_N})"
                      + rf"(?: routes=(?P<routes>{_ROUTE}(?:,{_ROUTE})*))?"
                      + " steps=" + ",".join(rf"{k}:(?P<{k}>{_N})" for k in KINDS)
                      + rf" calls=(?P<calls>-|{_CALL}(?:,{_CALL})*)\s*$")
_START_RE = re.compile(_PROC + re.escape(PREFIX) + r"\b")


@dataclass(frozen=True)
class Calls:
    """A parsed ``R9K-CALLS`` line: one process's steps by kind, calls by (dispatch, route, kind), and the routes
    it counts (:data:`OLD_ROUTES` for a line without ``routes=``)."""

    pid: int
    rank: int
    steps: dict[str, int]
    calls: dict[tuple[str, str, str], int]
    routes: tuple[str, ...] = OLD_ROUTES


@dataclass
class Parsed:
    """Every ``R9K-CALLS`` line of a log, in order, and the lines that began like one but did not match."""

    lines: list[Calls] = field(default_factory=list)
    malformed: int = 0

    def last(self) -> dict[int, Calls]:
        """Each process's latest line: its counts since it started."""
        return {c.pid: c for c in self.lines}


def parse(text: str) -> Parsed:
    """Every ``R9K-CALLS`` line of ``text`` (a server log), whole lines only; a line whose vLLM prefix names another
    pid, that does not match in full, that names one (dispatch, route, kind) twice, that names a route twice in
    ``routes=``, or that counts a call on a route its ``routes=`` (or, without it, :data:`OLD_ROUTES`) does not
    name counts as malformed."""
    out = Parsed()
    for raw in text.replace("\r\n", "\n").split("\n"):
        if not _START_RE.match(raw):
            continue
        m = _LINE_RE.match(raw)
        calls: dict[tuple[str, str, str], int] = {}
        ok = m is not None and not (m["ppid"] and m["ppid"] != m["pid"])
        routes = tuple(m["routes"].split(",")) if ok and m["routes"] else OLD_ROUTES
        ok = ok and len(set(routes)) == len(routes)
        if ok and m["calls"] != "-":
            for item in m["calls"].split(","):
                d, r, k, n = item.split(":")
                ok = ok and (d, r, k) not in calls and r in routes
                calls[(d, r, k)] = int(n)
        if not ok:
            out.malformed += 1
            continue
        out.lines.append(Calls(int(m["pid"]), int(m["rank"]), {k: int(m[k]) for k in KINDS}, calls,
                               tuple(x for x in ROUTES if x in routes)))
    return out


def delta(before: Parsed, during: Parsed) -> dict:
    """One suite's share: each process's latest line in ``during`` less its latest in ``before`` (from 0 where it
    had none, or where a count went down: a restarted process), summed over processes.

    Returns:
        ``{"steps": {kind: n}, "calls": [{"dispatch", "route", "kind", "calls"}] (sorted), "per_step":
        {"<dispatch>:<route>:<kind>": calls / steps of that kind (None without such a step)}, "routes": [route]
        (those every process's latest line in ``during`` counts, in :data:`ROUTES` order: without ``rule``, a
        ``vllm`` call may be one the rule declined), "processes": n, "malformed": n}`` (``malformed``: ``during``'s).
    """
    b = before.last()
    steps = dict.fromkeys(KINDS, 0)
    calls: dict[tuple[str, str, str], int] = {}
    procs = during.last()
    for pid, c in procs.items():
        old = b.get(pid)
        if old is not None and (any(old.steps[k] > c.steps[k] for k in KINDS)
                                or any(n > c.calls.get(key, 0) for key, n in old.calls.items())):
            old = None
        for k in KINDS:
            steps[k] += c.steps[k] - (old.steps[k] if old else 0)
        for key, n in c.calls.items():
            calls[key] = calls.get(key, 0) + n - (old.calls.get(key, 0) if old else 0)
    rows = [{"dispatch": d, "route": r, "kind": k, "calls": n} for (d, r, k), n in sorted(calls.items()) if n]
    per_step = {f"{x['dispatch']}:{x['route']}:{x['kind']}": (x["calls"] / steps[x["kind"]] if steps[x["kind"]] else None)
                for x in rows}
    routes = [r for r in ROUTES if all(r in c.routes for c in procs.values())] if procs else []
    return {"steps": steps, "calls": rows, "per_step": per_step, "routes": routes, "processes": len(procs),
            "malformed": during.malformed}

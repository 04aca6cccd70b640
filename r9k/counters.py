"""The expert cache's log lines: what the plugin prints (r9k/ops/moe.py) and what the validation engine parses.

Two lines, each printed alone on its line by a process that loads the model (an engine core or a worker), at most
behind vLLM's ``(EngineCore pid=42) `` prefix (whose pid must then be the line's own, as for the provenance line):

* after the model's weights are loaded, how many MoE layers took the cache (the engine refuses a configuration
  that sets the slots on a server where none did, "plugin-inactive")::

      R9K-MOE-CACHE pid=4242 rank=0 layers=2 moe_layers=2 slots=4 staging=12 thresh=0.99

* every ``R9K_MOE_CACHE_STATS_SEC`` seconds a layer serves steps, and at exit, its counters since the server
  started (cumulative; integers)::

      R9K-MOE-CACHE-STATS pid=4242 rank=0 layer=model.layers.0.mlp.experts experts=16 slots=4 staging=12
      device_bytes=13107712 resident_bytes=50331648 steps=31 routed=496 distinct=301 distinct_max=16 hits=97
      misses=204 inserts=120 evictions=116 read_through=84 over_thresh=9 chunks=31 bytes=51380224

  (one line in the log). ``device_bytes`` is what the layer's cache holds on its device (slots, staging and its
  tables: on CUDA the allocator's count across the cache's set-up, ``torch.cuda.memory_allocated``; elsewhere the
  sum of its buffers), ``resident_bytes`` what the layer's experts took there before the cache took them (all
  resident); a line without the two (an older plugin's) is still read. ``steps`` counts the cache's planning steps (a vLLM step of more tokens than the cache's
  bound is several), ``routed`` the (token, choice) pairs, ``distinct`` the distinct experts summed over steps,
  ``distinct_max`` the most in one step, ``hits`` / ``misses`` distinct experts resident or not, ``inserts`` misses
  copied into a slot, ``read_through`` misses served from the staging slots for that step only, ``over_thresh``
  steps with misses whose distinct experts exceeded the insert threshold (nothing inserted), ``chunks`` the token
  chunks the steps were served in (one a step unless a step's read-through misses exceed the staging slots),
  ``bytes`` bytes moved from the host store: copied into slots (inserts and staged read-throughs) and, where a
  layer reads its misses through (R9K_MOE_CACHE_READ), each read-through expert once.

A line that does not match its pattern in full (a field missing, a value not a non-negative integer, text after
it) is not a counter line: it is counted as malformed, never read in part.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field

SUMMARY_PREFIX = "R9K-MOE-CACHE"
STATS_PREFIX = "R9K-MOE-CACHE-STATS"

#: the counters of a stats line, in the order it prints them (after layer, experts, slots, staging)
COUNTERS = ("steps", "routed", "distinct", "distinct_max", "hits", "misses", "inserts", "evictions", "read_through",
            "over_thresh", "chunks", "bytes")
_SHAPE = ("experts", "slots", "staging")
_PROC = r"^(?:\((?P<proc>[\w:.-]+) pid=(?P<ppid>\d+)\) )?"
_N = r"(?:0|[1-9][0-9]{0,18})"  # a non-negative integer (ASCII digits), no sign, no leading zeros, at most 19 digits
_SUMMARY_RE = re.compile(_PROC + SUMMARY_PREFIX + rf" pid=(?P<pid>{_N}) rank=(?P<rank>{_N}) layers=(?P<layers>{_N})"
                         rf" moe_layers=(?P<moe_layers>{_N}) slots=(?P<slots>{_N}) staging=(?P<staging>{_N})"
                         r" thresh=(?P<thresh>(?:0|1)(?:\.\d{1,6})?)\s*$")
#: the layer's memory on its device and all resident, bytes (after the shape; absent from an older plugin's lines)
MEMORY = ("device_bytes", "resident_bytes")
_STATS_RE = re.compile(_PROC + STATS_PREFIX + rf" pid=(?P<pid>{_N}) rank=(?P<rank>{_N}) layer=(?P<layer>[\w.:-]+)"
                       + "".join(rf" {k}=(?P<{k}>{_N})" for k in _SHAPE)
                       + "(?:" + "".join(rf" {k}=(?P<{k}>{_N})" for k in MEMORY) + ")?"
                       + "".join(rf" {k}=(?P<{k}>{_N})" for k in COUNTERS) + r"\s*$")


@dataclass(frozen=True)
class Summary:
    """A parsed ``R9K-MOE-CACHE`` line: MoE layers that took the cache (``layers``) of the model's
    (``moe_layers``) in process ``pid`` (tensor-parallel ``rank``), with the knobs' values in force."""

    pid: int
    rank: int
    layers: int
    moe_layers: int
    slots: int
    staging: int
    thresh: float


@dataclass(frozen=True)
class LayerStats:
    """A parsed ``R9K-MOE-CACHE-STATS`` line: one layer's cumulative counters (see the module doc) on one rank."""

    pid: int
    rank: int
    layer: str
    experts: int
    slots: int
    staging: int
    counters: dict[str, int] = field(default_factory=dict)
    device_bytes: int | None = None    # None: the line did not say (an older plugin's)
    resident_bytes: int | None = None


def summary_line(pid: int, rank: int, layers: int, moe_layers: int, slots: int, staging: int, thresh: float) -> str:
    """The ``R9K-MOE-CACHE`` line (no newline). ``staging``: the first taken layer's staging slots (0 when none took
    the cache; a negative value prints as 0); each layer's own is in its stats lines."""
    return (f"{SUMMARY_PREFIX} pid={pid} rank={rank} layers={layers} moe_layers={moe_layers} slots={slots} "
            f"staging={max(staging, 0)} thresh={thresh:.6g}")


def stats_line(pid: int, rank: int, layer: str, experts: int, slots: int, staging: int, counters: dict[str, int],
               device_bytes: int | None = None, resident_bytes: int | None = None) -> str:
    """The ``R9K-MOE-CACHE-STATS`` line (no newline). ``counters`` holds every name in :data:`COUNTERS` (ints >= 0);
    ``device_bytes`` and ``resident_bytes`` (ints >= 0) are printed when both are given.

    Raises:
        KeyError: a counter is missing.
    """
    memory = (f"device_bytes={int(device_bytes)} resident_bytes={int(resident_bytes)} "
              if device_bytes is not None and resident_bytes is not None else "")
    return (f"{STATS_PREFIX} pid={pid} rank={rank} layer={layer} experts={experts} slots={slots} staging={staging} "
            + memory + " ".join(f"{k}={int(counters[k])}" for k in COUNTERS))


@dataclass
class Parsed:
    """Every cache line of a log: the summaries in order, each (pid, layer)'s stats lines in order, and the
    number of lines that start like a cache line (after vLLM's prefix) but do not match in full (``malformed``)."""

    summaries: list[Summary] = field(default_factory=list)
    stats: list[LayerStats] = field(default_factory=list)
    malformed: int = 0

    def last(self) -> dict[tuple[int, str], LayerStats]:
        """The latest stats line of each (pid, layer): the counters since that process started."""
        out: dict[tuple[int, str], LayerStats] = {}
        for s in self.stats:
            out[(s.pid, s.layer)] = s
        return out


def _pid_ok(m: re.Match) -> bool:
    return not (m["ppid"] and m["ppid"] != m["pid"])


_START_RE = re.compile(_PROC + re.escape(SUMMARY_PREFIX) + r"(?:-STATS)?\b")


def parse(text: str) -> Parsed:
    """Every cache line of ``text`` (a server log), whole lines only ("\\n" ends a line, as for the provenance
    lines: a prompt that vLLM logs raw cannot make a line of its own with another separator). A line whose vLLM
    prefix names a pid other than its own, or that does not match its pattern in full, counts as malformed."""
    out = Parsed()
    for raw in text.replace("\r\n", "\n").split("\n"):
        if not _START_RE.match(raw):
            continue
        m = _STATS_RE.match(raw)
        if m and _pid_ok(m):
            out.stats.append(LayerStats(int(m["pid"]), int(m["rank"]), m["layer"], *(int(m[k]) for k in _SHAPE),
                                        counters={k: int(m[k]) for k in COUNTERS},
                                        **{k: int(m[k]) if m[k] is not None else None for k in MEMORY}))
            continue
        m = _SUMMARY_RE.match(raw)
        if m and _pid_ok(m):
            out.summaries.append(Summary(int(m["pid"]), int(m["rank"]), int(m["layers"]), int(m["moe_layers"]),
                                         int(m["slots"]), int(m["staging"]), float(m["thresh"])))
            continue
        out.malformed += 1
    return out


def delta(before: Parsed, during: Parsed) -> dict:
    """What the record keeps of the cache over one suite: each (pid, layer)'s latest counters in ``during`` (the
    log written while the suite ran) less its latest in ``before`` (the log up to the suite's start; 0 where the
    layer had no line yet, or where a counter went down: a restarted process), summed over layers and ranks.

    Returns:
        ``{"layers": [{"pid", "rank", "layer", "experts", "slots", "staging", "device_bytes", "resident_bytes",
        <counters>}], "total": {<counters>, "hit_rate", "distinct_per_step", "device_bytes", "resident_bytes",
        "device_share"}, "malformed": n}`` (``malformed``: ``during``'s); ``total`` is None when no stats line was
        read. ``hit_rate`` = hits / distinct, ``distinct_per_step`` = distinct / steps (None when their denominator
        is 0); ``distinct_max`` is the process's own maximum (since it started), in ``total`` the largest of the
        layers'. The memory (bytes, not differenced: what the layers hold) is each (rank, layer)'s latest line's,
        summed over layers and ranks, None unless every such line says it; ``device_share`` = device_bytes /
        resident_bytes.
    """
    b = before.last()
    rows = []
    for key, s in sorted(during.last().items(), key=lambda kv: (kv[1].rank, kv[1].pid, kv[1].layer)):
        old = b.get(key)
        base = old.counters if old is not None and all(old.counters[k] <= s.counters[k] for k in COUNTERS) else {}
        d = {k: s.counters[k] - base.get(k, 0) for k in COUNTERS}
        d["distinct_max"] = s.counters["distinct_max"]
        rows.append({"pid": s.pid, "rank": s.rank, "layer": s.layer, "experts": s.experts, "slots": s.slots,
                     "staging": s.staging, "device_bytes": s.device_bytes, "resident_bytes": s.resident_bytes, **d})
    total = None
    if rows:
        total = {k: sum(r[k] for r in rows) for k in COUNTERS if k != "distinct_max"}
        total["distinct_max"] = max(r["distinct_max"] for r in rows)
        total["hit_rate"] = total["hits"] / total["distinct"] if total["distinct"] else None
        total["distinct_per_step"] = total["distinct"] / total["steps"] if total["steps"] else None
        # what is held now: each (rank, layer)'s latest process (a process restarted in the suite held its
        # layers once, not twice); summed over layers and ranks
        held = {(s.rank, s.layer): s for s in during.stats}
        for k in MEMORY:
            vals = [getattr(s, k) for s in held.values()]
            total[k] = sum(vals) if all(v is not None for v in vals) else None
        total["device_share"] = (total["device_bytes"] / total["resident_bytes"]
                                 if total["device_bytes"] is not None and total["resident_bytes"] else None)
    return {"layers": rows, "total": total, "malformed": during.malformed}

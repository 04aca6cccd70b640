"""The compile gate for the seeds' cards: compile every case of benchmarks/portability/cases.py for each target
of :data:`benchmarks.portability.standin.DEVICES`, read each kernel's resources, and judge them.

A kernel fails on a compile error (the call raised while compiling), LDS over the target's limit (Triton's own
launch check raises OutOfResources under the stand-in too; the gate also compares the figure), and any VGPR
spill (AMD: VGPRs spilled to scratch memory; NVIDIA: bytes of spill stores) unless :data:`ACCEPTED` lists it
with a reason. SGPR spills (AMD: written to VGPR lanes, no memory traffic) are reported, not failed.

Each specialisation is compiled once: Triton's JIT cache keys a kernel by its specialisation (constexprs,
dtypes, alignment, the launch options), so a later call with the same key compiles nothing. The launch path's
own cache (kernels/_launch.py, keyed by device index, None without CUDA) is cleared between targets, so each
target compiles its own.
"""
from __future__ import annotations

import time
from dataclasses import asdict, dataclass

from benchmarks.portability import standin
from benchmarks.portability.resources import Usage, ptxas_version, usage

# (target, kernel label) -> why its spill is accepted. None is: every default configuration the dispatch picks
# for the serving systems' shapes builds without a spill on every target (docs/kernels/portability.md).
ACCEPTED: dict[tuple[str, str], str] = {}


@dataclass(frozen=True)
class Row:
    """One compiled kernel on one target, or one call that failed before compiling anything."""

    target: str
    kernel: str        # the label: name, the tile constexprs, warps and stages
    spec: str          # Triton's hash of the compile (its specialisation key and the source): one row each
    case: str          # the first call that compiled it
    system: str
    usage: Usage | None
    lds_limit: int
    error: str         # the call's exception where it raised ("" if none)
    verdict: str       # "ok", "accepted: <reason>" or "FAIL: <why>"


_TILE_KEYS = ("BM", "BN", "GROUP_M", "KPI", "QUANT_A", "BK", "BV", "U", "KC", "DEFER", "BD", "BT", "BH", "K",
              "GPP", "REDUCE", "BE", "NSP", "NT", "BLOCK", "W", "G", "PTX")


def label(ck) -> str:
    """A kernel's name, its tiling constexprs (those named in _TILE_KEYS, bools as 0 / 1) and its warps and
    stages: the key :data:`ACCEPTED` uses and the tables show."""
    names = ck.src.fn.arg_names
    parts = [ck.name]
    for path, val in sorted(ck.src.constants.items()):
        name = names[path[0]] if path and path[0] < len(names) else None
        if name in _TILE_KEYS and isinstance(val, (int, bool)):
            parts.append(f"{name}={int(val)}")
    md = ck.metadata
    parts.append(f"w{md.num_warps} s{md.num_stages}")
    return " ".join(parts)


def judge(dev: standin.Device, lab: str, u: Usage | None, error: str) -> str:
    """The verdict on one kernel of ``dev`` (see the module doc)."""
    if u is None:
        return f"FAIL: {error or 'nothing compiled'}"
    why = []
    if u.lds > dev.lds_bytes:
        why.append(f"LDS {u.lds} B over the {dev.lds_bytes} B a workgroup has")
    if u.spills:
        reason = ACCEPTED.get((dev.name, lab))
        if reason is None:
            why.append(f"{u.spills} {'VGPRs' if dev.backend == 'hip' else 'bytes'} spilled")
        elif not why:
            return f"accepted: {reason}"
    return "FAIL: " + "; ".join(why) if why else "ok"


def _clear_launch_caches() -> None:
    import kernels._launch as L

    for lau in L._LAUNCHERS.values():
        lau.cache.clear()


def run_target(dev: standin.Device, cases) -> list[Row]:
    """Every case compiled for ``dev``: one Row per compiled kernel (and per case that raised without
    compiling anything)."""
    from triton.runtime.errors import OutOfResources

    rows: list[Row] = []
    _clear_launch_caches()
    with standin.compiling_for(dev) as sd:
        for case in cases:
            first = len(sd.compiled)
            err = ""
            try:
                case.run()
            except OutOfResources as e:  # Triton's own launch check: the kernel compiled, it cannot launch
                err = f"OutOfResources: {e}"
            except Exception as e:  # noqa: BLE001 - a compile error is the gate's finding, recorded
                err = f"{type(e).__name__}: {str(e).splitlines()[0][:300] if str(e) else ''}"
            new = sd.compiled[first:]
            refused = err.startswith("OutOfResources")
            for ck in new:
                u, lab = usage(ck), label(ck)
                # the launch refused is the call's last: where it compiled here, its row carries the refusal
                rows.append(Row(dev.name, lab, ck.hash[:16], case.name, case.system, u, dev.lds_bytes,
                                err if refused and ck is new[-1] else "", judge(dev, lab, u, "")))
            if err and not (refused and new):  # a compile error (or a refusal of a kernel compiled earlier)
                rows.append(Row(dev.name, "-", "-", case.name, case.system, None, dev.lds_bytes, err,
                                judge(dev, "-", None, err)))
    return rows


def _target_rows(name: str) -> tuple[list[dict], list[dict], float]:
    """(rows, counterexample rows, seconds) of the target named ``name``: one worker's share of :func:`run`."""
    from benchmarks.portability import cases as C

    dev = standin.DEVICE_BY_NAME[name]
    t0 = time.time()
    rows = run_target(dev, C.cases())
    counter = run_target(dev, [C.old_prefill_tile_case()]) if dev.backend == "hip" else []
    return [asdict(r) for r in rows], [asdict(r) for r in counter], round(time.time() - t0, 1)


def run(names: tuple[str, ...] | None = None, jobs: int = 1) -> dict:
    """The gate's result: ``{"triton", "ptxas", "seconds", "per_target", "rows": [Row as dict],
    "counterexample": [...]}`` for the targets ``names`` (default all of :data:`standin.DEVICES`), ``jobs``
    targets at a time (worker processes, each with its own stand-in; 1: in this process). ``counterexample``:
    the rows of :func:`benchmarks.portability.cases.old_prefill_tile_case` on the AMD targets (the gate must
    fail them)."""
    names = tuple(names or (d.name for d in standin.DEVICES))
    t0 = time.time()
    if jobs > 1:
        import concurrent.futures as cf
        import multiprocessing as mp

        with cf.ProcessPoolExecutor(max_workers=jobs, mp_context=mp.get_context("spawn")) as ex:
            parts = list(ex.map(_target_rows, names))
    else:
        parts = [_target_rows(n) for n in names]
    return {"triton": standin.triton_version(), "ptxas": ptxas_version(), "seconds": round(time.time() - t0, 1),
            "per_target": {n: p[2] for n, p in zip(names, parts)},
            "rows": [r for p in parts for r in p[0]], "counterexample": [r for p in parts for r in p[1]]}

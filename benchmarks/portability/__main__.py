"""``python -m benchmarks.portability``: the compile gate for the seeds' cards, and its table.

    python -m benchmarks.portability --json OUT.json     # compile every case for every target, write the result
    python -m benchmarks.portability --write             # ... and put its table into docs/kernels/portability.md
    python -m benchmarks.portability --from OUT.json --check   # is the committed table the one OUT.json makes?

Exit status: 1 when a kernel fails the gate (or, with --check, when the committed table differs), else 0.
Run it without TRITON_INTERPRET (it compiles for real targets). ``--jobs N``: N targets at a time.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from benchmarks.portability.render import DOC, failures, replace_table, table


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.portability", description=__doc__.splitlines()[0])
    ap.add_argument("--json", type=Path, help="write the gate's result here")
    ap.add_argument("--from", dest="src", type=Path, help="read a result written by --json instead of compiling")
    ap.add_argument("--write", action="store_true", help=f"put the table into {DOC}")
    ap.add_argument("--check", action="store_true", help=f"exit 1 when {DOC}'s table is not this result's")
    ap.add_argument("--jobs", type=int, default=int(os.environ.get("R9K_PORTABILITY_JOBS", "2")))
    ap.add_argument("--target", action="append", help="a target name (repeatable; default all)")
    a = ap.parse_args(argv)
    if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0") and a.src is None:
        print("TRITON_INTERPRET is set: the gate compiles for real targets; unset it", file=sys.stderr)
        return 2
    if a.src is not None:
        result = json.loads(a.src.read_text())
    else:
        from benchmarks.portability import gate

        result = gate.run(tuple(a.target) if a.target else None, jobs=a.jobs)
    if a.json:
        a.json.write_text(json.dumps(result, indent=1) + "\n")
    text = table(result)
    rc = 0
    bad = failures(result)
    for r in bad:
        print(f"FAIL {r['target']} {r['kernel']} ({r['case']}, {r['system']}): {r['verdict']}", file=sys.stderr)
    if bad:
        rc = 1
    if a.write:
        DOC.write_text(replace_table(DOC.read_text(), text))
        print(f"wrote the table into {DOC}")
    if a.check:
        current = DOC.read_text()
        if replace_table(current, text) != current:
            print(f"{DOC}'s table is not current: run python -m benchmarks.portability --write", file=sys.stderr)
            rc = 1
    if not (a.write or a.check or a.json):
        print(text)
    print(f"{len(result['rows'])} kernels on {len(result['per_target'])} targets in {result['seconds']} s "
          f"(Triton {result['triton']}); {len(bad)} failing", file=sys.stderr)
    return rc


if __name__ == "__main__":
    sys.exit(main())

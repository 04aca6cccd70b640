"""Does the quick release keep to its budgets? Each suite's wall time against its budget, and each soak's end
against its duration.

    .venv/bin/python -m benchmarks.serving.quick_budget --reports /tmp/r41 v0.0.9 [--config cpu-smol]
    .venv/bin/python -m benchmarks.serving.quick_budget --run --reports /tmp/r41 v0.0.9 [--config cpu-smol]

With ``--run`` it first runs ``r9k-validate release RELEASE --config C --profile quick --baseline none --reports
DIR`` (the server's start included) and samples the machine's load average every 5 s meanwhile. It prints one
row per record (suite, profile, wall time, budget: the record's ``budget_s``, else the checkout's suite file's
for the record's profile, marked ``file``), the sum of the suites' wall times against the sum of their budgets,
the server's start, the span from the first suite's start to the last one's end, and for each soak record its
asked duration, the time its clients ran, its wall time and the requests cut at the deadline. Exit status 0
when every suite kept to its budget, 1 when one did not, 2 for bad input.
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import threading
import time
from datetime import datetime
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))


def run_release(release: str, config: str, reports: Path) -> tuple[int, float, list[float]]:
    """Run the quick release; returns (exit status, wall seconds, 1-minute load averages sampled every 5 s)."""
    loads: list[float] = []
    done = threading.Event()

    def sample() -> None:
        while not done.wait(5.0):
            loads.append(os.getloadavg()[0])

    t = threading.Thread(target=sample, daemon=True)
    t.start()
    t0 = time.monotonic()
    rc = subprocess.call([sys.executable, "-m", "validate.cli", "release", release, "--config", config,
                          "--profile", "quick", "--baseline", "none", "--reports", str(reports)])
    wall = time.monotonic() - t0
    done.set()
    t.join()
    return rc, wall, loads


def file_budget(root: Path, suite: str, profile: str) -> float | None:
    """The checkout's suite file's budget for ``profile``, None when it states none or does not load."""
    from validate.errors import InputError
    from validate.suite import find_suite

    try:
        return find_suite(root, suite, profile).budget_s  # type: ignore[arg-type]
    except InputError:
        return None


def table(records, root: Path) -> tuple[list[str], bool]:
    """The report's lines, and whether every suite with a budget kept to it."""
    lines = [f"{'configuration':<14} {'suite':<14} {'profile':<7} {'wall s':>8} {'budget s':>10}  over"]
    ok = True
    by_cfg: dict[str, list] = {}
    for r in sorted(records, key=lambda r: r.started_at):  # the order they ran in
        by_cfg.setdefault(r.config, []).append(r)
    for cfg, recs in by_cfg.items():
        wall = budget = 0.0
        for r in recs:
            b, src = (r.budget_s, "") if r.budget_s is not None else (file_budget(root, r.suite, r.profile), " file")
            over = b is not None and r.wall_s > b
            ok &= not over
            wall += r.wall_s
            budget += b or 0.0
            lines.append(f"{cfg:<14} {r.suite:<14} {r.profile:<7} {r.wall_s:>8.1f} "
                         f"{(f'{b:g}{src}' if b is not None else '-'):>10}  {'OVER' if over else ''}")
        lines.append(f"{cfg:<14} {'all suites':<14} {'':<7} {wall:>8.1f} {budget:>10g}  {'OVER' if wall > budget else ''}")
        starts = [datetime.fromisoformat(r.started_at) for r in recs]
        ends = [datetime.fromisoformat(r.ended_at) for r in recs]
        startup = next((r.server.startup_s for r in recs if r.server.startup_s), None)
        lines.append(f"{cfg}: server start {startup if startup is not None else '-'} s; first suite's start to last "
                     f"one's end {(max(ends) - min(starts)).total_seconds():.0f} s (server start included)")
        for r in recs:
            if r.suite_kind == "soak":
                m = r.metrics
                lines.append(f"{cfg}/{r.suite}: asked {r.params.get('duration_s')} s, clients ran "
                             f"{m.get('duration_s')} s, wall {r.wall_s:.1f} s; {m.get('served')} served, "
                             f"{m.get('errors')} errors, {m.get('cut_at_deadline', '-')} cut at the deadline; "
                             f"prompts {m.get('prompt_tokens_range')} tokens")
    return lines, ok


def main(argv: list[str] | None = None) -> int:
    from validate.errors import InputError
    from validate.record import release_records

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("release")
    ap.add_argument("--reports", type=Path, default=REPO / "reports")
    ap.add_argument("--config", default="cpu-smol")
    ap.add_argument("--run", action="store_true", help="run the quick release first")
    a = ap.parse_args(argv)
    root = Path(os.environ.get("R9K_ROOT", REPO))
    if a.run:
        print(f"load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())} on {os.cpu_count()} CPUs")
        rc, wall, loads = run_release(a.release, a.config, a.reports)
        mean = sum(loads) / len(loads) if loads else float("nan")
        print(f"release exit status {rc}, {wall:.0f} s in all; 1-minute load average during it: mean {mean:.2f}, "
              f"max {max(loads, default=float('nan')):.2f}")
    try:
        records = [r for r in release_records(a.reports, a.release) if r.config == a.config]
    except InputError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if not records:
        print(f"error: no records of {a.config} under {a.reports / a.release}", file=sys.stderr)
        return 2
    lines, ok = table(records, root)
    print("\n".join(lines))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

"""How often does the performance gate flag identical trees? Runs of one BetterBench suite on one tree, gated in
every ordered pair (A against B and B against A), with the gate's own rule (validate.perfgate.compare_perf).

Each run is a separate ``r9k-validate suite`` call that launches its own server, as a release does, so the
drift between runs (the machine's other load, the server's compile and warm-up) is in the figures, as it is
between a baseline and a candidate made on different days. A rule that flags more than its alpha of these pairs
would fail releases that changed nothing.

    .venv/bin/python -m benchmarks.serving.perf_gate_fp --runs 3 --out /tmp/fp          # run, then gate
    .venv/bin/python -m benchmarks.serving.perf_gate_fp --gate-only /tmp/fp [--noise 30]  # gate runs made before

The suite is BetterBench with ``--passes`` passes (default 10), 128 decode tokens, one prefill depth (2048),
concurrency 1-8 and one request per client (about 4 minutes a run on cpu-smol's 2-core box), written into a
scratch copy of the checkout's serve/, suites/ and templates/ (nothing is added to the checkout). ``--profile
quick`` runs the checklist's own betterbench suite at its quick profile instead (2 passes: the gate cannot tell,
by construction). ``--noise PCT`` gates as if the baseline's configuration set ``perf_noise_pct: PCT``.
"""
from __future__ import annotations

import argparse
import itertools
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SUITE = "bb-fp"


def suite_yaml(passes: int) -> str:
    return (f"name: {SUITE}\nkind: betterbench\ndescription: BetterBench reduced for the perf gate's false-positive "
            f"rate on identical trees\nneeds_server: true\nparams: {{passes: {passes}, decode_tokens: 128, "
            "prefill_depths: [2048], concurrency: [1, 2, 4, 8], requests_per_client: 1}\n")


def scratch_root(passes: int) -> Path:
    root = Path(tempfile.mkdtemp(prefix="r9k-fp-"))
    for d in ("serve", "suites", "templates"):
        shutil.copytree(REPO / d, root / d)
    (root / "suites" / f"{SUITE}.yaml").write_text(suite_yaml(passes))
    return root


def run(out: Path, runs: int, passes: int, config: str, profile: str) -> list[str]:
    """``runs`` releases fp0, fp1, ... of the suite under ``out``; returns their names."""
    root = scratch_root(passes)
    suite = SUITE if profile == "full" else "betterbench"
    names = []
    for i in range(runs):
        name = f"fp{i}"
        cmd = [sys.executable, "-m", "validate.cli", "suite", suite, "--config", config, "--release", name,
               "--reports", str(out), "--profile", profile]
        print(f"run {i + 1} of {runs}: {' '.join(cmd[2:])}", flush=True)
        env = {**os.environ, "R9K_ROOT": str(root)}
        if subprocess.run(cmd, env=env, cwd=REPO).returncode != 0:
            raise SystemExit(f"run {name} did not pass; its record is under {out / name}")
        names.append(name)
    shutil.rmtree(root, ignore_errors=True)
    return names


def gate(out: Path, noise: float | None) -> dict:
    """Every ordered pair of the runs under ``out``, gated; a row per figure and the share flagged."""
    from validate.perfgate import compare_perf
    from validate.record import release_records

    names = sorted(d.name for d in out.iterdir() if d.is_dir() and release_records(out, d.name))
    if noise is not None:  # as if the baseline's configuration had set perf_noise_pct (on a copy of the runs)
        copy = Path(tempfile.mkdtemp(prefix="r9k-fp-noise-")) / "reports"
        shutil.copytree(out, copy)
        out = copy
        for name in names:
            for p in out.glob(f"{name}/*/*.json"):
                d = json.loads(p.read_text())
                d.setdefault("config_snapshot", {})["perf_noise_pct"] = noise
                p.write_text(json.dumps(d))
    rows, flagged, cannot = [], 0, 0
    for cand, base in itertools.permutations(names, 2):
        cmp = compare_perf(out, cand, base)
        for f in cmp.figures:
            rows.append({"candidate": cand, "baseline": base, "figure": f.figure, "base_median": f.base_median,
                         "cand_median": f.cand_median, "change_pct": f.change_pct, "p": f.p_value, "mark": f.mark,
                         "regression": f.regression, "threshold_pct": f.threshold_pct})
            flagged += f.regression
            cannot += f.cannot_tell
    return {"runs": names, "rows": rows, "flagged": flagged, "cannot_tell": cannot, "figures": len(rows)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--passes", type=int, default=10)
    ap.add_argument("--config", default="cpu-smol")
    ap.add_argument("--profile", choices=["full", "quick"], default="full")
    ap.add_argument("--out", type=Path, help="reports folder for the runs (default: a new temporary one)")
    ap.add_argument("--gate-only", type=Path, metavar="DIR", help="gate the runs already under DIR")
    ap.add_argument("--noise", type=float, help="gate as if the configuration set perf_noise_pct to this")
    args = ap.parse_args(argv)
    out = args.gate_only or args.out or Path(tempfile.mkdtemp(prefix="r9k-fp-reports-"))
    if not args.gate_only:
        run(out, args.runs, args.passes, args.config, args.profile)
    res = gate(out, args.noise)
    for r in res["rows"]:
        print(f"{r['candidate']} vs {r['baseline']}  {r['figure']:24s} {r['base_median']:10.2f} -> "
              f"{r['cand_median']:10.2f}  {r['change_pct']:+6.1f}%  p = {r['p']:.3g}  threshold {r['threshold_pct']:.1f}%  "
              f"{'REGRESSION' if r['regression'] else r['mark']}")
    print(f"identical trees flagged: {res['flagged']} of {res['figures']} figure comparisons "
          f"({len(res['runs'])} runs, every ordered pair); cannot tell: {res['cannot_tell']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

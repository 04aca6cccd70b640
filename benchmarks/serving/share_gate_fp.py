"""How often do the share gates flag identical trees? Two estimates from records of one tree:

1. **Ordered pairs of runs**: every record of one (configuration, suite) under the given releases, gated against
   every other with the gate's own rule (validate.loadgate.compare_shares): each pair is one identical-tree
   comparison, with the drift between runs (the machine's other load, the server's warm-up) in it.
2. **Resampling requests**: the SLO share at a rate probed by two runs (the baseline's probe at its SLO rate and
   the candidate's reference probe, both in the records' requests attachments) pools both runs' requests,
   splits them at random into two sides of the original sizes ``--draws`` times and applies the gate's rule
   (drop > threshold and one-sided two-proportion p < alpha) to each split: the false-positive rate where the two
   sides differ only by chance. The same for draft acceptance would need per-token counts, which the counters
   do not give; its rate is the pairs' alone.

    .venv/bin/python -m benchmarks.serving.share_gate_fp --reports reports v0.0.1 v0.0.2 [--config cpu-smol]

Prints each pair's figures and verdict, then the resampled rate with its Wilson 95 % interval.
"""
from __future__ import annotations

import argparse
import itertools
import json
import random
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))


def requests_at(rec, folder: Path, rate: float) -> list[bool]:
    """The good flags of the requests of ``rec``'s last valid probe at ``rate`` (from its attachment)."""
    probes = [p for p in rec.metrics.get("probes") or [] if abs(p["rate_per_s"] - rate) <= 1e-6 and p.get("valid")]
    if not probes:
        return []
    idx = probes[-1]["index"]
    att = (rec.attachments or {}).get("requests") or {}
    rows = [json.loads(x) for x in (folder / att["file"]).read_text().splitlines()] if att else []
    return [bool(r["good"]) for r in rows if r["probe"] == idx]


def resampled_fp(a: list[bool], b: list[bool], threshold_pts: float, alpha: float, draws: int, seed: int) -> tuple[int, int]:
    """(splits flagged, splits drawn): the pooled requests of ``a`` and ``b`` split at random into sides of their
    sizes, gated by the share rule."""
    from validate.stats import two_proportion_drop

    pool, rng, hits = a + b, random.Random(seed), 0
    for _ in range(draws):
        rng.shuffle(pool)
        x, y = pool[:len(a)], pool[len(a):]
        t = two_proportion_drop(sum(x), len(x), sum(y), len(y))
        hits += t.drop_pts > threshold_pts and t.p_one_sided < alpha
    return hits, draws


def main(argv: list[str] | None = None) -> int:
    from validate.loadgate import compare_shares, rule
    from validate.record import record_path, release_records
    from validate.stats import wilson_interval

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("releases", nargs="+", help="releases whose records were made by one tree")
    ap.add_argument("--reports", default=str(REPO / "reports"))
    ap.add_argument("--config")
    ap.add_argument("--draws", type=int, default=2000)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args(argv)
    reports = Path(a.reports)
    recs = {rel: [r for r in release_records(reports, rel) if not a.config or r.config == a.config]
            for rel in a.releases}
    flagged = judged = 0
    for b, c in itertools.permutations(a.releases, 2):
        cmp = compare_shares(c, recs[c], b, recs[b])
        for f in cmp.figures:
            judged += 1
            flagged += f.regression
            print(f"{c} against {b}: {f.config}/{f.suite} {f.what}: {f.message}")
        for why in cmp.unpaired + cmp.limited:
            print(f"{c} against {b}: not compared: {why}")
    print(f"ordered pairs: {flagged} of {judged} shares flagged")
    for b, c in itertools.permutations(a.releases, 2):
        for rc in recs[c]:
            ref = rc.metrics.get("reference") if isinstance(rc.metrics, dict) else None
            if rc.suite_kind != "arrivals" or not isinstance(ref, dict) or ref.get("release") != b:
                continue
            rb = next((r for r in recs[b] if (r.config, r.suite) == (rc.config, rc.suite)), None)
            if rb is None:
                continue
            rate = ref["rate_per_s"]
            gb = requests_at(rb, record_path(reports, b, rb.config, rb.suite).parent, rate)
            gc = requests_at(rc, record_path(reports, c, rc.config, rc.suite).parent, rate)
            if not gb or not gc:
                continue
            spec = rule(rb, None)
            hits, n = resampled_fp(gb, gc, spec.slo_share_drop_pts, spec.alpha, a.draws, a.seed)
            lo, hi = wilson_interval(hits, n)
            print(f"resampled {rc.config}/{rc.suite} at {rate:.3g} req/s ({sum(gb)}/{len(gb)} and {sum(gc)}/{len(gc)} "
                  f"good): {hits} of {n} splits flagged = {100 * hits / n:.2f}% (95% {100 * lo:.2f}-{100 * hi:.2f}%), "
                  f"threshold {spec.slo_share_drop_pts:g} points, alpha {spec.alpha:g}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

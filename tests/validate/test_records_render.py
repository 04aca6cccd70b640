"""Records round-trip; RELEASE.md carries the records' figures and lists what was not checked, with why."""
from __future__ import annotations

import json

import pytest

from tests.conftest import REPO
from validate.errors import InputError
from validate.record import Dataset, Record, ServerInfo, Tree, Verdict, read_record, record_path, write_record
from validate.render import fmt_num, fmt_pct, render_release
from validate.suite import Checklist, ChecklistEntry


# suite file name -> its runner kind, where they differ
KIND = {"sanity": "strict-sanity"}

def rec(config, suite, status="pass", profile="full", metrics=None, dataset=None, cause=None, tree="aaaa"):
    return Record(release="v9", config=config, config_hash="c", suite=suite, suite_kind=KIND.get(suite, suite), params={},
                  params_hash="p", profile=profile, started_at="t0", ended_at="t1", wall_s=12.5,
                  tree=Tree(commit="0123456789abcdef", dirty=False, source_hash=tree),
                  server=ServerInfo(launched=True, provenance=[f"R9K-PROVENANCE version=0.1.0 source_hash={tree} files=5 pid=1"],
                                    provenance_ok=True, kv_cache_tokens=93184),
                  versions={"vllm": "0.32.0", "torch": "2.13.0+cpu"}, hardware={"gpus": 0, "kind": "x86-64 CPU", "power": None},
                  model="smol.gguf", verdict=Verdict(status=status, cause=cause), metrics=metrics or {}, dataset=dataset)


SANITY = {"n": 1040, "bad": 0, "divergent": 3}
GSM = {"n": 40, "correct": 2, "accuracy": 0.05, "accuracy_strict": 0.05, "accuracy_flexible": 0.075, "errors": 0}
PROBE = {"decode_tok_s": 26.137, "decode_step_ms": 38.26, "ttft_ms_p50": 61.2, "concurrency": 8,
         "aggregate_tok_s": 1180.49, "prefill_depth": 2048, "prefill_tok_s": 4321.7, "decode_tokens": 512, "repeats": 3}


def test_record_roundtrip_and_malformed(tmp_path):
    r = rec("cpu-smol", "sanity", metrics=SANITY)
    p = write_record(record_path(tmp_path, "v9", "cpu-smol", "sanity"), r)
    assert read_record(p) == r
    assert [x.name for x in p.parent.iterdir()] == ["sanity.json"]  # no temp file left behind
    d = json.loads(p.read_text())
    del d["verdict"]
    p.write_text(json.dumps(d))
    with pytest.raises(InputError, match=r"sanity.json: verdict: Field required"):
        read_record(p)
    p.write_text("{\n  oops")
    with pytest.raises(InputError, match=r"sanity.json:2: malformed JSON"):
        read_record(p)


def test_fmt():
    assert fmt_num(93184) == "93,184" and fmt_num(26.137, 1) == "26.1" and fmt_num(None) == "–"
    assert fmt_pct(0.0215) == "2.15%"


def test_release_notes_carry_figures_and_gaps(tmp_path):
    sub = Dataset(name="gsm8k-test", sha256="x", n_total=1319, n_used=40, subset=True, seed=1234)
    for r in [rec("cpu-smol", "sanity", metrics=SANITY),
              rec("cpu-smol", "gsm8k", profile="quick", metrics=GSM, dataset=sub),
              rec("cpu-smol", "probe", metrics=PROBE),
              rec("gpu-box", "sanity", status="error", cause="launch failed: port 8000 on 127.0.0.1 is already in use"),
              rec("gpu-box", "probe", metrics=PROBE, tree="bbbb")]:
        write_record(record_path(tmp_path, "v9", r.config, r.suite), r)
    cl = Checklist(configs=["cpu-smol", "gpu-box"], suites=[ChecklistEntry(suite=s) for s in ("sanity", "gsm8k", "probe")])
    md = render_release(REPO, tmp_path, "v9", cl).read_text()
    assert md.startswith("# v9: cpu-smol: sanity 0 bad of 1,040, GSM8K 5.0% of 40 subset, decode 26.1 tok/s")
    assert "| cpu-smol | 0 bad of 1,040 | – | – | 26.1 tok/s / 1,180.5 tok/s at 8 streams / 4,322 tok/s at 2,048 | 93,184 tokens |" in md
    assert "| single-stream decode (probe) | 26.1 tok/s |" in md
    assert "| decode step p50 (probe) | 38.26 ms |" in md
    assert "| cpu-smol | 2 of 40 (5.00%), subset of 1,319 (seed 1234) | 5.00% / 7.50% | – | 0 bad of 1,040 (3 divergent from solo, still right), – of – right alone |" in md
    nc = md.split("## Not checked")[1].split("##")[0]
    assert "- cpu-smol / gsm8k: quick profile; a subset: 40 of 1,319 items (seed 1234)." in nc
    assert "- gpu-box / sanity: did not complete: launch failed: port 8000 on 127.0.0.1 is already in use." in nc
    assert "- gpu-box / gsm8k: did not run (no record)." in nc
    assert "- cpu-smol / sanity, probe: quick profile." not in nc  # full-profile records are checked
    assert ("- gpu-box / probe: made by another tree (plugin source bbbb, this tree's is aaaa): this tree's own run "
            "of it is missing") in nc
    ck = md.split("## Checked")[1].split("##")[0]
    assert "cpu-smol / sanity: pass, full profile" in ck and "cpu-smol / probe" in ck and "gsm8k" not in ck
    assert "**Not ready to ship: not everything could be checked:** 2 check(s) could not be made" in md
    assert "`R9K-PROVENANCE version=0.1.0 source_hash=aaaa files=5` (matches the tree)" in md


def test_records_missing_metrics_render_as_dashes(tmp_path):
    for r in [rec("cpu-smol", "gsm8k", metrics={"n": 10}), rec("cpu-smol", "sanity", metrics={"n": 5}),
              rec("cpu-smol", "probe", metrics={"concurrency": 8})]:
        write_record(record_path(tmp_path, "v9", r.config, r.suite), r)
    md = render_release(REPO, tmp_path, "v9", None).read_text()
    assert md.startswith("# v9: no measurements")
    # every figure the records lack shows as a dash; nothing crashes
    assert "| cpu-smol | – of 10 (–) | – / – | – | – bad of 5 (– divergent from solo, still right), – of – right alone |" in md


@pytest.mark.parametrize("sandbox,text", [("none", "**programs ran unsandboxed** (allow_unsandboxed)"),
                                          ("bwrap", "sandbox bwrap")])
def test_notes_say_whether_humaneval_programs_were_sandboxed(tmp_path, sandbox, text):
    he = {"n": 20, "passed": 3, "timeout": 0, "sandbox": sandbox, "sandbox_detail": "x"}
    write_record(record_path(tmp_path, "v9", "cpu-smol", "humaneval"), rec("cpu-smol", "humaneval", metrics=he))
    md = render_release(REPO, tmp_path, "v9", None).read_text()
    assert f"| 3 / 20 passed, 0 timeouts, {text} |" in md


def test_the_provenance_row_is_a_served_suites_and_a_mismatch_wins(tmp_path):
    """The suites that start no server (unit gates, all-reduce) come first in the checklist: the row must not
    read "none" for a configuration whose server logged the plugin, and a suite whose log did not match the tree
    is the one shown."""
    gates = rec("cpu-smol", "allreduce")
    gates.server = ServerInfo(launched=False)
    served = rec("cpu-smol", "probe", metrics=PROBE)
    served.server.dispatch = {"1": []}
    for r in (gates, served):
        write_record(record_path(tmp_path, "v9", r.config, r.suite), r)
    cl = Checklist(configs=["cpu-smol"], suites=[ChecklistEntry(suite=s) for s in ("allreduce", "probe", "sanity")])
    md = render_release(REPO, tmp_path, "v9", cl).read_text()
    row = next(x for x in md.splitlines() if x.startswith("| cpu-smol | 0123456789ab |"))
    assert "`R9K-PROVENANCE version=0.1.0 source_hash=aaaa files=5` (matches the tree) | none (1 process(es)) |" in row
    bad = rec("cpu-smol", "sanity", metrics=SANITY, tree="bbbb")
    bad.server.provenance_ok = False
    write_record(record_path(tmp_path, "v9", bad.config, bad.suite), bad)
    md = render_release(REPO, tmp_path, "v9", cl).read_text()
    row = next(x for x in md.splitlines() if x.startswith("| cpu-smol | 0123456789ab |"))
    assert "source_hash=bbbb files=5` (**does not match** the tree bbbb)" in row


SOAK = {"clients": 8, "duration_s": 60.2, "served": 41, "errors": 0, "cut_at_deadline": 8, "prompt_tok_s": 812.4,
        "memory": {"host_rss_mib": {"peak": 4100.0, "total": 15000.0, "slope_mib_per_min": 3.2, "flat": True}},
        # the series the slope is re-derived from on read (validate.runners.soak.audit): 3.2 MiB/min exactly
        "samples": [[float(t), {"host_rss_mib": 4096.8 + 3.2 * t / 60}] for t in range(61)],
        "max_slope_mib_per_min": 512.0}


def test_notes_give_each_suites_wall_time_against_its_budget_and_the_soaks_cut_requests(tmp_path):
    server = ServerInfo(launched=True, startup_s=95.4)
    for r in [rec("cpu-smol", "sanity", profile="quick", metrics=SANITY).model_copy(update={"budget_s": 20.0, "server": server}),
              rec("cpu-smol", "soak", profile="quick", metrics=SOAK).model_copy(update={
                  "wall_s": 63.4, "budget_s": 60.0, "params": {"max_slope_mib_per_min": 512.0}}),  # the quick bound
              rec("cpu-smol", "probe", profile="quick", metrics=PROBE)]:  # a record without a budget (older)
        write_record(record_path(tmp_path, "v9", r.config, r.suite), r)
    cl = Checklist(configs=["cpu-smol"], suites=[ChecklistEntry(suite=s) for s in ("sanity", "soak", "probe")])
    md = render_release(REPO, tmp_path, "v9", cl).read_text()
    assert "| cpu-smol | 0 bad of 1,040 | 41 served, 0 errors, 8 cut at the deadline, 8 clients, 1.0 min," in md
    t = md.split("## Time")[1].split("\n## ")[0]
    assert "| cpu-smol / sanity | quick | 12.5 s | 20 s |" in t
    assert "| cpu-smol / soak | quick | 63.4 s | 60 s (**over**) |" in t
    assert "| cpu-smol / probe | quick | 12.5 s | – |" in t
    assert "| cpu-smol / all suites | | 88.4 s | 80 s (**over**) |" in t
    assert "- cpu-smol: the server started in 95.4 s." in t

"""What a release run says when parts of it cannot run: every configuration is attempted, its failures become
records with their cause, the notes render, and the exit status names the worst outcome (a finding over an
error). Also how records are written: atomically, readable by the group, history never overwritten."""
from __future__ import annotations

import errno
import json
import os
import stat

import pytest
import yaml

from tests.conftest import fake_procs
from tests.validate.test_compare import eval_record, save
from tests.validate.test_records_render import rec
from validate.cli import main
from validate.verdict import assess_release
from validate.compare import compare_releases
from validate.engine import Outcome
from validate.provenance_checks import tree_mismatch
from validate.errors import combine_exit
from validate.record import Tree, Verdict, record_history, record_path, write_record


def _release_gate(reports, release, baseline, configs):
    """The release's verdict on its records against ``baseline``: (exit status, paired comparison, perf)."""
    v = assess_release(reports, release, baseline=baseline, configs=configs)
    return v.exit_code(), v.comparison, v.perf


def _placeholder(scratch, name: str, **extra) -> None:
    """A seed-like configuration: its model path is a placeholder that does not exist here."""
    cfg = {"name": name, "model": {"path": f"/models/{name}-placeholder", "served_name": name},
           "server": {"max_num_seqs": 4, "max_model_len": 4096, "entrypoint": "tests.fake_vllm"}, **extra}
    (scratch.root / "serve" / f"{name}.yaml").write_text(yaml.safe_dump(cfg))
    cl = yaml.safe_load((scratch.root / "suites" / "release.yaml").read_text())
    cl["configs"] = cl["configs"] + [name]
    (scratch.root / "suites" / "release.yaml").write_text(yaml.safe_dump(cl))


def _rec(scratch, release, cfg, suite="fake-sanity"):
    return json.loads((scratch.root / "reports" / release / cfg / f"{suite}.json").read_text())


def test_placeholder_configurations_do_not_end_the_release(scratch, capsys):
    """One runnable configuration and two that cannot start here (a missing model path; GPUs this machine
    lacks): the runnable one runs and passes, the others get error records with their cause, the notes render
    with them under Not checked, every problem is said before anything launches, and the exit status is 2."""
    tag = scratch.config("fake-ok")
    _placeholder(scratch, "seed-a")
    _placeholder(scratch, "seed-b", hardware={"gpus": 4, "kind": "r9700"})
    assert main(["release", "v7", "--baseline", "none"]) == 2
    out = capsys.readouterr().out.replace("\n", " ")
    assert out.index("preflight: serve/seed-a.yaml") < out.index("fake-ok: launching")
    assert out.index("preflight: serve/seed-b.yaml") < out.index("fake-ok: launching")
    assert _rec(scratch, "v7", "fake-ok")["verdict"]["status"] == "pass"
    a, b = _rec(scratch, "v7", "seed-a"), _rec(scratch, "v7", "seed-b")
    assert a["verdict"]["status"] == b["verdict"]["status"] == "error"
    assert a["verdict"]["cause"] == ("not run: serve/seed-a.yaml: model.path: /models/seed-a-placeholder does not "
                                     "exist (edit the configuration to point at the model)")
    assert "hardware: needs 4 GPU(s) of kind 'r9700'; this machine shows no GPU" in b["verdict"]["cause"]
    notes = (scratch.root / "reports" / "v7" / "RELEASE.md").read_text()
    nc = notes.split("## Not checked")[1].split("##")[0]
    assert "- seed-a / fake-sanity: did not complete: not run: serve/seed-a.yaml: model.path:" in nc
    assert "- seed-b / fake-sanity: did not complete: not run: serve/seed-b.yaml:" in nc
    assert "fake-ok" not in nc
    assert "exit status 2: 2 check(s) could not be made: seed-a/fake-sanity error, seed-b/fake-sanity error" in out
    assert fake_procs(tag) == []


def test_a_failure_is_not_hidden_behind_an_error(scratch, capsys):
    scratch.config("fake-ok")
    path = scratch.root / "suites" / "fake-sanity.yaml"
    path.write_text(path.read_text().replace("max:\n    bad: 0", "max:\n    bad: 0\n  min:\n    n: 1000"))
    _placeholder(scratch, "seed-a")
    assert main(["release", "v8", "--baseline", "none"]) == 1
    out = capsys.readouterr().out.replace("\n", " ")
    assert ("exit status 1: 1 finding(s): fake-ok/fake-sanity fail; 1 check(s) could not be made: seed-a/fake-sanity "
            "error") in out


@pytest.mark.parametrize("statuses,code", [
    (["pass"], 0), (["pass", "error"], 2), (["error", "fail"], 1), (["wrong-tree", "error"], 1),
    (["plugin-inactive"], 1), (["skipped"], 2), ([], 0),
])
def test_exit_status_precedence(statuses, code):
    out = Outcome(records=[rec("c", f"s{i}", status=s) for i, s in enumerate(statuses)])
    assert out.exit_code() == code
    assert combine_exit(2, 1) == combine_exit(1, 2) == 1 and combine_exit(0, 2) == 2 and combine_exit(130, 1) == 130


def test_bad_input_is_said_all_at_once_and_nothing_launches(scratch, capsys):
    tag = scratch.config("fake-ok")
    path = scratch.root / "suites" / "fake-sanity.yaml"
    path.write_text(path.read_text() + "rounds_typo: 3\n")
    cfg_path = scratch.root / "serve" / "fake-ok.yaml"
    cfg = yaml.safe_load(cfg_path.read_text())
    cfg["env"]["R9K_GDN_PREFIL_MAX"] = "64"
    cfg_path.write_text(yaml.safe_dump(cfg))
    assert main(["release", "v9", "--baseline", "none"]) == 2
    out = capsys.readouterr().out.replace("\n", " ")
    assert "env.R9K_GDN_PREFIL_MAX: not a registered R9K_* knob" in out
    assert "fake-sanity.yaml:" in out and "rounds_typo: unknown key" in out  # both problems, one run
    assert fake_procs(tag) == [] and not (scratch.root / "reports" / "v9").exists()


def test_history_keeps_every_record_across_a_gap(tmp_path):
    path = record_path(tmp_path, "v9", "c", "sanity")
    for n in range(3):
        write_record(path, rec("c", "sanity", metrics={"run": n}))
    hist = path.parent / "history"
    assert sorted(p.name for p in hist.iterdir()) == ["sanity.0.json", "sanity.1.json"]
    (hist / "sanity.0.json").unlink()  # a gap: one file left, named .1
    write_record(path, rec("c", "sanity", metrics={"run": 3}))
    assert sorted(p.name for p in hist.iterdir()) == ["sanity.1.json", "sanity.2.json"]
    assert [r.metrics["run"] for r in record_history(tmp_path, "v9", "c", "sanity")] == [3, 1, 2]


def test_records_are_group_readable(tmp_path):
    old = os.umask(0o077)
    try:
        p = write_record(record_path(tmp_path, "v9", "c", "sanity"), rec("c", "sanity"))
    finally:
        os.umask(old)
    assert stat.S_IMODE(p.stat().st_mode) == 0o644


def test_a_full_disk_keeps_the_earlier_record(tmp_path, monkeypatch):
    path = record_path(tmp_path, "v9", "c", "sanity")
    write_record(path, rec("c", "sanity", metrics={"run": 0}))
    real_fsync = os.fsync

    def full(fd):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "fsync", full)
    with pytest.raises(OSError, match="No space left"):
        write_record(path, rec("c", "sanity", metrics={"run": 1}))
    monkeypatch.setattr(os, "fsync", real_fsync)
    assert json.loads(path.read_text())["metrics"] == {"run": 0}
    assert sorted(p.name for p in path.parent.iterdir()) == ["sanity.json"]  # no temp file, nothing moved


def test_a_ray_record_from_another_checkout_is_wrong_tree():
    r = rec("c", "sanity", tree="bbbb")
    r.tree.engine_hash = "e1"
    mine = Tree(source_hash="aaaa", engine_hash="e1")
    assert tree_mismatch(r, mine, True) == ("the node's checkout has plugin source bbbb, the tree under validation "
                                            "is aaaa; its server ran plugin source bbbb")
    r2 = rec("c", "sanity", tree="aaaa")
    r2.tree.engine_hash = "e2"
    assert tree_mismatch(r2, mine, True) == "the node's engine and suites hash e2, the driver's e1"
    r3 = rec("c", "sanity", tree="aaaa")
    r3.tree.engine_hash = "e1"
    assert tree_mismatch(r3, mine, True) is None


def test_ray_collect_turns_a_foreign_record_into_wrong_tree(scratch):
    from validate.engine import Engine, RunOptions
    from validate.executors import _collect

    scratch.config("fake-ok")
    engine = Engine(RunOptions(root=scratch.root, reports=scratch.root / "reports"))
    foreign = rec("fake-ok", "fake-sanity", tree="ffff")
    foreign.tree.engine_hash = engine.tree.engine_hash
    out = Outcome()
    _collect(engine, out, "vr", engine.config("fake-ok"),
             {"records": [foreign.model_dump_json()], "launch_failures": {}, "server_log": None, "node_folder": "/x"},
             say=lambda m: None)
    r = _rec(scratch, "vr", "fake-ok")
    assert r["verdict"]["status"] == "wrong-tree" and "plugin source ffff" in r["verdict"]["cause"]
    assert r["verdict"]["reasons"] == ["recorded on the node as pass"]
    assert out.exit_code() == 1


@pytest.fixture
def external_server(tmp_path):
    """The synthetic server started by hand, as someone else's running server."""
    import subprocess
    import sys
    import time
    import uuid

    from tests.conftest import REPO
    from validate.server import free_port, port_in_use

    port, tag = free_port(), f"fake-{uuid.uuid4().hex[:10]}"
    proc = subprocess.Popen([sys.executable, "-m", "tests.fake_vllm", "--port", str(port), "--served-model-name", tag],
                            cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)}, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    deadline = time.time() + 20
    while not port_in_use("127.0.0.1", port) and time.time() < deadline:
        time.sleep(0.1)
    yield f"http://127.0.0.1:{port}", tag, port
    proc.kill()
    proc.wait()


def test_a_url_run_is_recorded_under_the_external_server_not_cpu_smol(scratch, external_server, capsys):
    url, tag, port = external_server
    assert main(["suite", "fake-sanity", "--url", url, "--model", tag, "--release", "u1"]) == 2
    assert "give --max-num-seqs N" in capsys.readouterr().out.replace("\n", " ")
    assert main(["suite", "fake-sanity", "--url", url, "--model", tag, "--max-num-seqs", "4",
                 "--max-model-len", "4096", "--release", "u1"]) == 0
    runs = sorted(p.name for p in (scratch.root / "reports" / "u1").iterdir())
    assert runs == [f"external-127.0.0.1-{port}-{tag}"]  # nothing under cpu-smol
    r = _rec(scratch, "u1", runs[0])
    assert r["config_snapshot"]["model"]["path"] == url and r["server"]["launched"] is False
    assert r["config_snapshot"]["server"]["max_num_seqs"] == 4 and r["metrics"]["max_num_seqs"] == 4
    assert r["server"]["provenance_ok"] is None  # no --server-log: not checked, and the notes say so


def test_death_evidence_picks_the_traceback_not_the_request_noise(tmp_path):
    from validate.server import death_evidence

    log = tmp_path / "server.log"
    before = "INFO started\n" * 50
    log.write_text(before + "".join(
        f'(APIServer pid=1) INFO:     127.0.0.1:{5000 + i} - "POST /v1/completions HTTP/1.1" 500 Internal Server Error\n'
        for i in range(3)) +
        "(APIServer pid=1) ERROR 12-01 10:00:00 [core_client.py:600] Engine core proc EngineCore died unexpectedly, shutting down client.\n"
        "(APIServer pid=1) Traceback (most recent call last):\n"
        '(APIServer pid=1)   File "/x/async_llm.py", line 410, in generate\n'
        "(APIServer pid=1)     raise EngineDeadError()\n"
        "(APIServer pid=1) vllm.v1.engine.exceptions.EngineDeadError: EngineCore encountered an issue.\n"
        + "(APIServer pid=1) ERROR 12-01 10:00:01 [serving.py:1] EngineDeadError: EngineCore encountered an issue.\n" * 500)
    got = death_evidence(log, offset=len(before))
    assert got[0].endswith("Engine core proc EngineCore died unexpectedly, shutting down client.")
    assert any("Traceback" in x for x in got) and any(x.endswith("EngineCore encountered an issue.") for x in got)
    assert not any("POST /v1" in x for x in got) and len(got) <= 6
    assert death_evidence(log, offset=log.stat().st_size) == [] and death_evidence(None) == []


def test_release_junit_and_step_summary_read_back(scratch, tmp_path, monkeypatch):
    """A release with one failing suite and one that could not run: the JUnit file, read back by junitparser,
    counts one failure and one error; the GitHub step summary is appended with the same verdicts."""
    from junitparser import Error, Failure, JUnitXml

    scratch.config("fake-ok")
    path = scratch.root / "suites" / "fake-sanity.yaml"
    path.write_text(path.read_text().replace("max:\n    bad: 0", "max:\n    bad: 0\n  min:\n    n: 1000"))
    _placeholder(scratch, "seed-a")
    summary = tmp_path / "summary.md"
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(summary))
    junit = tmp_path / "out" / "r9k.xml"
    junit.parent.mkdir()
    assert main(["release", "vj", "--baseline", "none", "--junit-xml", str(junit)]) == 1
    xml = JUnitXml.fromfile(str(junit))
    assert (xml.tests, xml.failures, xml.errors, xml.skipped) == (3, 1, 1, 1)  # --baseline none: no gate ran
    cases = {(s.name, c.name): c for s in xml for c in s}
    (fail,) = cases[("fake-ok", "fake-sanity")].result
    (err,) = cases[("seed-a", "fake-sanity")].result
    assert isinstance(fail, Failure) and "gate: n = 16 < 1000" in (fail.text or "") + (fail.message or "")
    assert isinstance(err, Error) and "model.path: /models/seed-a-placeholder does not exist" in err.message
    text = summary.read_text()
    assert "exit status 1" in text and "**FAIL**" in text and "**ERROR**" in text


def test_a_finding_inside_a_suite_outranks_its_errors():
    """Garbage answers beside one failed request were an "error" (exit 2), hiding the finding."""
    from validate.engine import Engine, RunOptions
    from validate.runners.base import SuiteResult
    from validate.suite import find_suite
    from tests.conftest import REPO

    engine = Engine(RunOptions(root=REPO, reports=REPO / "reports"))
    s = find_suite(REPO, "sanity", "quick")
    v = engine._verdict(s, SuiteResult(metrics={"bad": 3, "n": 16}, errors=["1 of 16 requests under load failed"],
                                       findings=["bad answer x (solo): replacement character in answer"]), None)
    assert v.status == "fail" and v.cause.startswith("bad answer x")
    assert "1 of 16 requests under load failed" in v.reasons
    assert engine._verdict(s, SuiteResult(metrics={"bad": 0}, errors=["boom"]), None).status == "error"


def test_an_unreadable_baseline_never_ends_the_release_without_notes(scratch, capsys):
    """A stray non-record JSON in the baseline's folder made release exit 2 with no exit line and no notes."""
    scratch.config("fake-ok")
    junk = scratch.root / "reports" / "v0.0.1" / "fake-ok" / "notes.json"
    junk.parent.mkdir(parents=True)
    junk.write_text('{"not": "a record"}')
    # nothing could be compared: exit 2, never the "no regression" of 0 (a stray file hid a regression so)
    assert main(["release", "v0.0.2"]) == 2
    notes = (scratch.root / "reports" / "v0.0.2" / "RELEASE.md").read_text()
    nc = notes.split("## Not checked")[1].split("##")[0]
    assert "- release / baseline records: a file of the baseline v0.0.1 was not compared:" in nc
    assert notes.split("\n")[2].startswith("**Not ready to ship: not everything could be checked:**")
    out = capsys.readouterr().out.replace("\n", " ")
    assert "exit status 2: 1 check(s) could not be made: release/baseline records error" in out


def test_resume_runs_again_on_other_data_or_after_an_unverified_external_run(scratch, external_server, tmp_path,
                                                                            capsys, monkeypatch):
    from tests.conftest import tiny_gsm8k

    url, tag, port = external_server
    scratch.config("fake-ok")
    # a suite run against someone else's server, recorded under fake-ok: its provenance was never checked
    assert main(["suite", "fake-sanity", "--config", "fake-ok", "--url", url, "--model", tag, "--release", "rs"]) == 0
    assert main(["release", "rs", "--config", "fake-ok", "--resume", "--baseline", "none"]) == 0
    assert "not run again" not in capsys.readouterr().out  # launched this time, checked this time
    # gsm8k on other data: the record answered other questions and is not reused
    cl = scratch.root / "suites" / "release.yaml"
    cl.write_text(cl.read_text().replace("- suite: fake-sanity", "- suite: fake-sanity\n- suite: gsm8k"))
    monkeypatch.setenv("R9K_DATA_DIR", str(tiny_gsm8k(tmp_path / "data2")))
    args = ["release", "rs", "--config", "fake-ok", "--suite", "gsm8k", "--profile", "quick", "--baseline", "none"]
    main(args)
    main(args + ["--resume"])
    assert "gsm8k: complete record found" in capsys.readouterr().out
    test = tmp_path / "data2" / "gsm8k" / "test.jsonl"
    test.write_text(test.read_text().replace("cows", "goats"))
    main(args + ["--resume"])
    assert "gsm8k: complete record found" not in capsys.readouterr().out


def test_a_ray_record_of_another_configuration_is_wrong_tree():
    r = rec("c", "sanity", tree="aaaa")
    r.tree.engine_hash = "e1"
    why = tree_mismatch(r, Tree(source_hash="aaaa", engine_hash="e1"), True, config_hash="d")
    assert why == "the node ran configuration c with hash c, the driver's is d (its serve/ file differs)"


def test_resume_never_keeps_one_url_servers_record_for_another_server(scratch, tmp_path, capsys):
    """Server A passes; server B answers garbage. `release --url B --resume` must run B, not keep A's pass."""
    from validate.config import find_config
    from validate.server import launch

    scratch.config("fake-ok")
    good = scratch.config("fake-a")
    bad = scratch.config("fake-b", mode="garbage")
    (scratch.root / "suites" / "release.yaml").write_text(yaml.safe_dump(
        {"configs": ["fake-ok"], "suites": [{"suite": "fake-sanity"}]}))
    la, lb = tmp_path / "a.log", tmp_path / "b.log"
    a = launch(find_config(scratch.root, "fake-a"), "m", la)
    b = launch(find_config(scratch.root, "fake-b"), "m", lb)
    try:
        assert main(["release", "r1", "--config", "fake-ok", "--url", a.url, "--model", good, "--server-log", str(la),
                     "--baseline", "none"]) == 0
        capsys.readouterr()
        assert main(["release", "r1", "--config", "fake-ok", "--url", b.url, "--model", bad, "--server-log", str(lb),
                     "--baseline", "none", "--resume"]) == 1
        assert main(["release", "r1", "--config", "fake-ok", "--url", b.url, "--model", bad, "--server-log", str(lb),
                     "--baseline", "none", "--resume"]) == 1  # now B's own record is kept
        assert "not run again" in capsys.readouterr().out
    finally:
        a.stop()
        b.stop()
    rec = json.loads((scratch.root / "reports" / "r1" / "fake-ok" / "fake-sanity.json").read_text())
    assert rec["server"]["url"] == b.url and rec["verdict"]["status"] == "fail"
    assert fake_procs(good) == [] and fake_procs(bad) == []


# ---- the release gate's baseline: a regression never reads as exit 0 -------------------------------------------
BASE = set(range(150))
REGRESSED = BASE - set(range(60))  # 60 lost, none gained


@pytest.mark.timeout(120)
def test_previous_release_without_eval_records_skips_the_paired_gate(tmp_path, scratch):
    # v0.1.0: a full baseline. v0.2.0: an aborted run that wrote only a sanity record. v0.3.0: the candidate
    # lost 60 questions. The automatic baseline skips v0.2.0 (no gated record) and finds the regression.
    save(tmp_path, eval_record("v0.1.0", BASE))
    s = rec("cpu-smol", "sanity")
    s.release = "v0.2.0"
    save(tmp_path, s)
    save(tmp_path, eval_record("v0.3.0", REGRESSED))
    code, cmp, _ = _release_gate(tmp_path, "v0.3.0", None, ["cpu-smol"])
    assert code == 1 and cmp.baseline == "v0.1.0" and cmp.tasks[0].regression


@pytest.mark.timeout(120)
def test_named_baseline_that_does_not_exist_passes_the_release_gate(tmp_path, scratch):
    # `release --baseline v0.1.1`, a typo (the baseline is v0.1.0): nothing to compare with is "cannot check"
    save(tmp_path, eval_record("v0.1.0", BASE))
    save(tmp_path, eval_record("v0.3.0", REGRESSED))
    code, cmp, _ = _release_gate(tmp_path, "v0.3.0", "v0.1.1", ["cpu-smol"])
    assert code == 2


@pytest.mark.timeout(120)
def test_changed_scoring_params_hide_a_regression_in_release(tmp_path, scratch):
    # Full set on both sides, but the candidate's suites/gsm8k.yaml changed a scoring param: unpairable, and no
    # subset explains it (a quick run against a full baseline stays "Not checked"): the release cannot check it
    save(tmp_path, eval_record("v0.1.0", BASE))
    c = eval_record("v0.3.0", REGRESSED)
    c.params = {**c.params, "concurrency": 4}
    save(tmp_path, c)
    cmp = compare_releases(tmp_path, "v0.3.0", "v0.1.0")
    assert cmp.tasks == [] and len(cmp.unpaired) == 1 and cmp.blocking == cmp.unpaired
    code, _, _ = _release_gate(tmp_path, "v0.3.0", "v0.1.0", ["cpu-smol"])
    assert code == 2
    q = eval_record("v0.4.0", REGRESSED, subset=True)  # a quick run against the full baseline: only noted
    save(tmp_path, q)
    assert compare_releases(tmp_path, "v0.4.0", "v0.1.0").blocking == []
    assert _release_gate(tmp_path, "v0.4.0", "v0.1.0", ["cpu-smol"])[0] == 0
    assert _release_gate(tmp_path, "v0.4.0", "none", ["cpu-smol"])[0] == 0  # --baseline none: no gate


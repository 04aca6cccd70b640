"""What a device run reports (benchmarks/device_report.py), on sample JUnit XML and step records: the counts per
test file (pytest's xunit1 ``file`` attribute, or the classname's module under xunit2), the skip reasons, and the
summary of a run whose steps passed, failed, timed out or lost their report."""
from __future__ import annotations

import json

import pytest

from benchmarks import device_report as R

XUNIT1 = """<?xml version="1.0" encoding="utf-8"?><testsuites name="pytest tests"><testsuite name="pytest" errors="1"
failures="1" skipped="3" tests="7">
<testcase classname="tests.kernels.gdn.test_vllm_layer" name="test_a" file="tests/kernels/gdn/test_vllm_layer.py"/>
<testcase classname="tests.kernels.gdn.test_vllm_layer" name="test_b" file="tests/kernels/gdn/test_vllm_layer.py">
  <failure message="assert 1 == 2">tests/kernels/gdn/test_vllm_layer.py:40: AssertionError</failure></testcase>
<testcase classname="tests.kernels.gdn.test_vllm_layer" name="test_c" file="tests/kernels/gdn/test_vllm_layer.py">
  <skipped type="pytest.skip" message="needs a CUDA GPU">...</skipped></testcase>
<testcase classname="tests.kernels.fp8.test_wgmma" name="test_d" file="tests/kernels/fp8/test_wgmma.py">
  <skipped type="pytest.skip" message="needs a CUDA GPU">...</skipped></testcase>
<testcase classname="tests.kernels.fp8.test_wgmma" name="test_e" file="tests/kernels/fp8/test_wgmma.py">
  <skipped type="pytest.skip" message="needs Hopper (sm_90)">...</skipped></testcase>
<testcase classname="tests.kernels.fp8.test_wgmma" name="test_f" file="tests/kernels/fp8/test_wgmma.py">
  <error message="failed on setup">fixture 'x' not found</error></testcase>
<testcase classname="tests.kernels.fp8.test_wgmma" name="test_g" file="tests/kernels/fp8/test_wgmma.py"/>
</testsuite></testsuites>"""

XUNIT2 = """<testsuite name="pytest" tests="2">
<testcase classname="tests.kernels.moe.test_expert_cache.TestInsert" name="test_rate"/>
<testcase classname="tests.kernels.moe.test_expert_cache" name="test_plain"><skipped/></testcase>
</testsuite>"""


def test_counts_per_file_with_skip_reasons(tmp_path):
    xml = tmp_path / "gates.xml"
    xml.write_text(XUNIT1)
    files = R.junit_counts(xml)
    assert [f.line() for f in files] == [
        "tests/kernels/gdn/test_vllm_layer.py: 1 passed, 1 failed, 0 errors, 1 skipped (1 x needs a CUDA GPU)",
        "tests/kernels/fp8/test_wgmma.py: 1 passed, 0 failed, 1 errors, 2 skipped "
        "(1 x needs Hopper (sm_90); 1 x needs a CUDA GPU)",
    ]


def test_counts_from_classnames_when_there_is_no_file_attribute(tmp_path):
    xml = tmp_path / "moe.xml"
    xml.write_text(XUNIT2)
    [f] = R.junit_counts(xml)
    assert (f.file, f.passed, f.skipped, f.skip_reasons) == (
        "tests/kernels/moe/test_expert_cache.py", 1, 1, {"no reason given": 1})


def test_a_file_that_is_not_junit_is_named(tmp_path):
    bad = tmp_path / "gates.xml"
    bad.write_text("<html>no</html>")
    with pytest.raises(ValueError, match=r"gates.xml: root element <html>"):
        R.junit_counts(bad)
    bad.write_text("<testsuites><testsuite>")  # cut short: pytest killed mid-write
    with pytest.raises(ValueError, match="gates.xml: not a readable JUnit XML file"):
        R.junit_counts(bad)


def _run(tmp_path, steps: list[dict]) -> None:
    (tmp_path / "steps.jsonl").write_text("".join(json.dumps(s) + "\n" for s in steps))


def test_the_summary_of_a_run(tmp_path, capsys):
    (tmp_path / "gates.xml").write_text(XUNIT1)
    (tmp_path / "fp8_linear.json").write_text(json.dumps(
        {"meta": {}, "rows": [{"us": 1.0}] * 5, "problems": ["fp8_linear M=16 vllm: skipped: no vllm"]}))
    _run(tmp_path, [
        {"step": "gates", "kind": "pytest", "rc": 1, "seconds": 201.4},
        {"step": "fp8_linear", "kind": "bench", "rc": 1, "seconds": 88.0},
        {"step": "gdn_prefill_hv8", "kind": "bench", "rc": 124, "seconds": 240.0},
        {"step": "gates_all", "kind": "pytest", "rc": 137, "seconds": 300.1},
    ])
    assert R.main(["summary", str(tmp_path)]) == 1
    doc = json.loads((tmp_path / "summary.json").read_text())
    assert doc["ok"] is False and doc["not_ok"] == ["gates", "fp8_linear", "gdn_prefill_hv8", "gates_all"]
    gates, fp8, gdn, gall = doc["steps"]
    assert gates["tests"] == {"passed": 2, "failed": 1, "errors": 1, "skipped": 3} and gates["status"] == "failed"
    assert (fp8["rows"], fp8["problems"]) == (5, ["fp8_linear M=16 vllm: skipped: no vllm"])
    assert gdn["status"] == "timed out" and gdn["note"] == "no benchmark JSON: gdn_prefill_hv8.json was not written"
    assert gall["status"] == "timed out" and gall["note"].startswith("no JUnit: gates_all.xml was not written")
    table = capsys.readouterr().out.splitlines()
    assert table[2].split() == ["gates", "failed", "1", "201.4", "2", "1", "1", "3", "-", "-"]
    assert table[3].split() == ["fp8_linear", "failed", "1", "88.0", "-", "-", "-", "-", "5", "1"]
    assert table[-2] == "4 steps, 0 ok; not ok: gates, fp8_linear, gdn_prefill_hv8, gates_all"


def test_a_run_whose_steps_all_passed_exits_0(tmp_path, capsys):
    (tmp_path / "gates.xml").write_text(XUNIT2)
    _run(tmp_path, [{"step": "gates", "kind": "pytest", "rc": 0, "seconds": 3.0}])
    assert R.main(["summary", str(tmp_path)]) == 0
    assert json.loads((tmp_path / "summary.json").read_text())["ok"] is True
    assert "1 steps, 1 ok" in capsys.readouterr().out


def test_no_steps_is_not_a_pass_and_a_bad_record_is_named(tmp_path, capsys):
    _run(tmp_path, [])
    assert R.main(["summary", str(tmp_path)]) == 1
    (tmp_path / "steps.jsonl").write_text('{"step": "gates", "rc": 0, "seconds": 1}\n{"step": "x"}\n')
    assert R.main(["summary", str(tmp_path)]) == 2
    assert "steps.jsonl:2: not a step record" in capsys.readouterr().err

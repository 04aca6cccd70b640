"""Unit-gate suites record one item per test case from junit XML; a failing test fails the suite by name."""
from __future__ import annotations

import json

import pytest
import yaml

from tests.validate.test_hostile_server import cli
from validate.cli import main


def setup(scratch, body: str, name="gates"):
    d = scratch.root / "gate_tests"
    d.mkdir(exist_ok=True)
    (d / "test_x.py").write_text(body)
    (scratch.root / "suites" / f"{name}.yaml").write_text(yaml.safe_dump({
        "name": name, "kind": "pytest", "needs_server": False, "params": {"paths": ["gate_tests"]},
        "gate": {"max": {"failed": 0, "error": 0}, "min": {"passed": 1}}}))
    scratch.config("fake-gates")


def rec(scratch, release):
    return json.loads((scratch.root / "reports" / release / "fake-gates" / "gates.json").read_text())


def test_failing_gate_fails_the_suite_with_its_name(scratch):
    setup(scratch, "import pytest\n\ndef test_ok():\n    assert 1\n\ndef test_bad():\n    assert 1 == 2, 'numbers drifted'\n\n"
                   "@pytest.mark.skip(reason='needs a GPU')\ndef test_gpu():\n    pass\n\n"
                   "@pytest.mark.parametrize('n', [1, 2])\ndef test_p(n):\n    assert n\n")
    assert main(["suite", "gates", "--config", "fake-gates", "--release", "g1"]) == 1
    r = rec(scratch, "g1")
    assert r["metrics"]["tests"] == 5 and r["metrics"]["passed"] == 3 and r["metrics"]["failed"] == 1 and r["metrics"]["skipped"] == 1
    ids = {i["id"]: i for i in r["items"]}
    assert ids["gate_tests.test_x::test_bad"]["correct"] is False and ids["gate_tests.test_x::test_p[2]"]["correct"] is True
    assert ids["gate_tests.test_x::test_gpu"]["skip_reason"] == "needs a GPU"
    assert any("gate failed: gate_tests.test_x::test_bad" in x and "numbers drifted" in x for x in r["verdict"]["reasons"])
    assert r["server"]["launched"] is False  # no server for a suite that needs none


def test_no_test_collected_is_an_error(scratch):
    setup(scratch, "def helper():\n    pass\n")
    assert main(["suite", "gates", "--config", "fake-gates", "--release", "g2"]) == 2
    assert "no test ran" in rec(scratch, "g2")["verdict"]["cause"]


def test_passing_gates(scratch):
    setup(scratch, "def test_a():\n    assert True\n")
    assert main(["suite", "gates", "--config", "fake-gates", "--release", "g3"]) == 0



def _unit_suite(scratch, body: str) -> None:
    (scratch.root / "ut").mkdir(exist_ok=True)
    (scratch.root / "ut" / "test_k.py").write_text(body)
    (scratch.root / "suites" / "ut-gates.yaml").write_text(yaml.safe_dump({
        "name": "ut-gates", "kind": "pytest", "needs_server": False, "params": {"paths": ["ut"]},
        "gate": {"max": {"failed": 0, "error": 0}, "min": {"passed": 1}}}))
    scratch.config("fake-ok")
    cl = yaml.safe_load((scratch.root / "suites" / "release.yaml").read_text())
    cl["suites"] = [{"suite": "ut-gates"}]
    (scratch.root / "suites" / "release.yaml").write_text(yaml.safe_dump(cl))


PASS = "def test_ok():\n    assert True\n\ndef test_kernel():\n    assert 1 + 1 == 2\n"
FAIL = "def test_ok():\n    assert True\n\ndef test_kernel():\n    assert 1 + 1 == 3, 'kernel broken'\n"


@pytest.mark.timeout(180)
def test_resume_does_not_reuse_a_unit_gate_pass_after_its_tests_changed(scratch):
    # the test files a pytest suite runs are in neither the engine's nor the plugin's hash: the record holds their
    # own (its dataset), so --resume never keeps a pass made by other tests
    _unit_suite(scratch, PASS)
    rc, out = cli(["release", "ru1", "--config", "fake-ok"], 120)
    assert rc == 0, out[-1500:]
    (scratch.root / "ut" / "test_k.py").write_text(FAIL)  # the gate's tests now fail
    rc, out = cli(["release", "ru1", "--config", "fake-ok", "--resume"], 120)
    rec = json.loads((scratch.root / "reports" / "ru1" / "fake-ok" / "ut-gates.json").read_text())
    assert rc == 1 and rec["verdict"]["status"] == "fail", (
        f"exit {rc}, record {rec['verdict']}: the pass of the old tests was reused\n{out[-800:]}")


@pytest.mark.timeout(180)
def test_the_operators_pytest_addopts_do_not_reach_the_unit_gates(scratch, monkeypatch):
    # PYTEST_ADDOPTS (a CI-wide setting, or one left exported) would deselect the failing test: pytest runs
    # without the shell's PYTEST_* variables
    _unit_suite(scratch, FAIL)
    monkeypatch.setenv("PYTEST_ADDOPTS", "--deselect ut/test_k.py::test_kernel")
    rc, out = cli(["suite", "ut-gates", "--config", "fake-ok", "--release", "ru2"], 120)
    rec = json.loads((scratch.root / "reports" / "ru2" / "fake-ok" / "ut-gates.json").read_text())
    assert rc == 1 and rec["verdict"]["status"] == "fail", f"exit {rc}, {rec['verdict']}, {rec['metrics']}"

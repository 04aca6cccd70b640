"""A new suite kind is one module and one YAML file: a kind registered by a module the engine finds on its own
(no list to edit) is run, checked against its metrics model, recorded, and rendered in the notes."""
from __future__ import annotations

import json
import sys
import textwrap

import pytest
import yaml

import validate.runners
from validate import suite as suite_mod
from validate.cli import main
from validate.render import render_release

pytestmark = pytest.mark.timeout(120)

TOY = '''
"""A toy suite kind: asks the server to repeat a few numbers and counts the answers."""
from pydantic import BaseModel, ConfigDict

from validate.figures import FigureSpec, metric
from validate.runners.base import SuiteResult
from validate.suite import register_runner


class ToyParams(BaseModel):
    model_config = ConfigDict(extra="forbid")
    prompts: int = 3
    broken: bool = False


class ToyMetrics(BaseModel):
    model_config = ConfigDict(extra="forbid")
    asked: int
    answered: int
    mean_chars: float


def figures(records):
    return [FigureSpec("toy_chars", "toy answer length", "toy", "chars", 1, True, metric("mean_chars"))]


def headline(rec):
    return f"toy {rec.metrics['answered']} of {rec.metrics['asked']} answered"


def summary(rec):
    return f"{rec.metrics['answered']} answered"


@register_runner("toy", ToyParams, metrics_model=ToyMetrics, figures=figures, headline=headline, summary=summary)
async def run(ctx, p):
    out = SuiteResult()
    answered = chars = 0
    for i in range(p.prompts):
        r = await ctx.client.chat([{"role": "user", "content": f"Repeat the number {i}"}], max_tokens=6)
        answered += r.ok
        chars += len(r.text)
    out.metrics = {"asked": p.prompts, "answered": answered, "mean_chars": chars / max(1, answered)}
    if p.broken:
        out.metrics["asked"] = "many"
    return out
'''


@pytest.fixture
def toy_kind(tmp_path, monkeypatch):
    """toy_kind.py in a folder of its own, added to the runners package's search path."""
    folder = tmp_path / "kinds"
    folder.mkdir()
    (folder / "toy_kind.py").write_text(textwrap.dedent(TOY))
    suite_mod.discover()  # every real kind registered first, into the registry the test leaves as it found it
    monkeypatch.setattr(suite_mod, "RUNNERS", dict(suite_mod.RUNNERS))  # the toy kind leaves with the test
    monkeypatch.delitem(sys.modules, "validate.runners.toy_kind", raising=False)
    monkeypatch.setattr(validate.runners, "__path__", [*validate.runners.__path__, str(folder)])
    suite_mod.rediscover()
    yield
    suite_mod.rediscover()


def test_a_new_kind_is_found_recorded_and_rendered(scratch, toy_kind, capsys):
    (scratch.root / "suites" / "toy.yaml").write_text(yaml.safe_dump(
        {"name": "toy", "kind": "toy", "params": {"prompts": 3}, "gate": {"min": {"answered": 3}}}))
    scratch.config("fake-ok")
    assert main(["suite", "toy", "--config", "fake-ok", "--release", "tk"]) == 0
    assert "3 answered" in capsys.readouterr().out  # the kind's own summary in the verdict table
    rec = json.loads((scratch.root / "reports" / "tk" / "fake-ok" / "toy.json").read_text())
    # the synthetic server answers "The answer is N. more" (6 tokens)
    assert rec["suite_kind"] == "toy" and rec["metrics"] == {"asked": 3, "answered": 3,
                                                             "mean_chars": len("The answer is 0. more") * 1.0}
    md = render_release(scratch.root, scratch.root / "reports", "tk", None).read_text()
    assert md.startswith("# tk: fake-ok: toy 3 of 3 answered")  # its headline phrase
    assert "| toy answer length | 21.0 chars |" in md  # its figure in the numbers table
    assert "- fake-ok / toy: pass, full profile" in md


def test_metrics_that_break_the_kinds_model_are_an_error(scratch, toy_kind):
    (scratch.root / "suites" / "toy.yaml").write_text(yaml.safe_dump(
        {"name": "toy", "kind": "toy", "params": {"prompts": 1, "broken": True}}))
    scratch.config("fake-ok")
    assert main(["suite", "toy", "--config", "fake-ok", "--release", "tk2"]) == 2
    rec = json.loads((scratch.root / "reports" / "tk2" / "fake-ok" / "toy.json").read_text())
    assert rec["verdict"]["status"] == "error"
    assert rec["verdict"]["cause"].startswith("the toy runner's metrics do not match ToyMetrics: asked:")


def test_the_registry_knows_every_kind_without_a_list():
    kinds = suite_mod.discover()
    assert {"strict-sanity", "gsm8k", "humaneval", "probe", "soak", "betterbench", "pytest", "arrivals", "long-answers"} <= set(kinds)
    assert suite_mod.paired_eval_kinds() == {"gsm8k", "humaneval"}
    assert [r.kind for r in suite_mod.ordered_kinds()][:5] == ["strict-sanity", "long-answers", "betterbench", "arrivals", "gsm8k"]
    with pytest.raises(ValueError, match="unknown field"):
        suite_mod.register_runner("x", object, colour="red")


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), "3", True])
def test_a_gated_metric_that_is_not_a_finite_number_fails_every_bound(bad):
    # NaN compares false with every bound, and a record stores it as null: it must never read as inside them
    from validate.suite import Gate

    g = Gate(max={"bad": 0}, min={"answered": 3})
    assert g.check({"bad": bad, "answered": 5}) == [f"gate: metric bad = {bad!r} is not a finite number"]
    assert g.check({"bad": 0, "answered": bad}) == [f"gate: metric answered = {bad!r} is not a finite number"]
    assert g.check({"bad": 0, "answered": 5}) == [] and g.check({"bad": 1, "answered": 2}) == [
        "gate: bad = 1 > 0", "gate: answered = 2 < 3"]


def test_a_sourceless_module_in_a_runner_package_is_never_imported(tmp_path):
    """A planted ``zz.pyc`` with no ``zz.py`` (git ignores *.pyc, the engine hash reads *.py): never imported, so it
    cannot replace strict sanity's judge unseen."""
    import py_compile
    import subprocess

    from tests.conftest import REPO

    src = tmp_path / "zz.py"
    src.write_text("import validate.runners.sanity as s\ns.is_right = lambda *a, **k: True\n")
    pkg = tmp_path / "pkg"
    (pkg / "evilrunners").mkdir(parents=True)
    (pkg / "evilrunners" / "__init__.py").write_text("")
    py_compile.compile(str(src), cfile=str(pkg / "evilrunners" / "zz.pyc"), doraise=True)
    (pkg / "evilrunners" / "ok.py").write_text("LOADED = True\n")
    probe = ("import sys, validate.suite as su, validate.runners.sanity as s; su.RUNNER_PACKAGES = "
             "(*su.RUNNER_PACKAGES, 'evilrunners'); su.discover(); "
             "print(s.is_right('Tokyo', 'Paris'), 'evilrunners.ok' in sys.modules, 'evilrunners.zz' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, cwd=REPO,
                         env={"PYTHONPATH": f"{REPO}:{pkg}", "PATH": "/usr/bin:/bin"})
    assert out.returncode == 0, out.stderr[-1500:]
    assert out.stdout.split() == ["False", "True", "False"]

"""r9k's dispatched calls by step kind (r9k/calls.py): the step marks on a model runner, the device counters, the
R9K-CALLS line and how the engine reads it, and the notes' table."""
from __future__ import annotations

import functools
import logging
import types

import pytest
import torch

from r9k import calls

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def fresh(monkeypatch):
    calls.uninstall()
    monkeypatch.setattr(calls.STATE, "interval", 0.0)
    yield
    calls.uninstall()


def _out(**n):
    return types.SimpleNamespace(num_scheduled_tokens=n, scheduled_spec_decode_tokens={})


def test_step_kind():
    assert calls.step_kind(_out(a=1, b=1)) == "decode"
    assert calls.step_kind(_out(a=1, b=37)) == "prefill"  # a chunk beside decodes
    spec = _out(a=3, b=1)
    spec.scheduled_spec_decode_tokens = {"a": [5, 6]}  # one token and two drafts: still a decode
    assert calls.step_kind(spec) == "decode"
    assert calls.step_kind(_out()) == "other" and calls.step_kind(object()) == "other"


def test_counts_land_in_the_kind_of_the_step_running(fresh):
    cpu = torch.device("cpu")
    calls.count("fp8_block_gemm", "r9k", cpu)  # outside a step
    calls.begin_step("prefill", cpu)
    for _ in range(3):
        calls.count("gdn_seq", "r9k", cpu)
    calls.count("gdn_seq", "vllm", cpu)
    calls.end_step()
    for _ in range(4):
        calls.begin_step("decode", cpu)
        calls.count("fp8_block_gemm", "r9k", cpu)
        calls.count("fp8_block_gemm", "r9k", cpu)
        calls.end_step()
    assert calls.totals() == {("fp8_block_gemm", "r9k", "other"): 1, ("gdn_seq", "r9k", "prefill"): 3,
                              ("gdn_seq", "vllm", "prefill"): 1, ("fp8_block_gemm", "r9k", "decode"): 8}
    assert calls.STATE.steps == {"prefill": 1, "decode": 4, "other": 0}
    with pytest.raises(ValueError):
        calls._row("gdn_seq", "elsewhere")
    calls.count("gdn_seq", "elsewhere", cpu)  # a count that cannot be taken never raises


def test_the_step_marks_wrap_the_runner_and_print_the_line(fresh, monkeypatch):
    """A runner whose forward dispatches two MoE calls a step: the line after each step says the steps and calls
    by kind; a dummy run is no step; uninstall puts vLLM's method back."""
    mod = types.ModuleType("fake_runner")

    class Runner:
        device = torch.device("cpu")

        def execute_model(self, scheduler_output, intermediate_tensors=None, dummy_run=False):
            for _ in range(2):
                calls.count("moe_cache", "r9k", self.device)
            return "out"

    mod.Runner = Runner
    original = Runner.execute_model
    monkeypatch.setitem(__import__("sys").modules, "fake_runner", mod)
    monkeypatch.setattr(calls, "RUNNERS", (("fake_runner", "Runner"), ("no_such_module_here", "Runner")))
    monkeypatch.setenv("R9K_CALLS_SEC", "0")
    assert calls.install() == ["fake_runner.Runner.execute_model"]
    assert calls.install() == ["fake_runner.Runner.execute_model"]  # once
    r = Runner()
    # the lines' logger stops propagating once it has its handler (r9k/lines.py): listen on it directly
    seen: list[logging.LogRecord] = []
    listener = logging.Handler()
    listener.emit = seen.append
    monkeypatch.setattr(logging.getLogger("r9k"), "handlers", [*logging.getLogger("r9k").handlers, listener])
    assert r.execute_model(_out(a=12)) == "out"
    assert r.execute_model(_out(a=1)) == "out"
    r.execute_model(_out(a=1), dummy_run=True)
    lines = [m for m in (x.getMessage() for x in seen) if m.startswith("R9K-CALLS ")]
    assert len(lines) == 3
    last = calls.parse(lines[-1]).lines[0]
    assert last.steps == {"prefill": 1, "decode": 1, "other": 1}
    assert last.calls == {("moe_cache", "r9k", "prefill"): 2, ("moe_cache", "r9k", "decode"): 2,
                          ("moe_cache", "r9k", "other"): 2}
    assert calls.STATE.devices["cpu"].kind.item() == calls.KINDS.index("other")  # reset after the step
    calls.uninstall()
    assert Runner.execute_model is original


def test_the_line_parses_back_and_malformed_lines_are_counted():
    text = calls.line(42, 1, {"prefill": 3, "decode": 10}, {("gdn_seq", "r9k", "prefill"): 36,
                                                            ("fp8_block_gemm", "vllm", "decode"): 0})
    assert text == ("R9K-CALLS pid=42 rank=1 routes=r9k,rule,vllm steps=prefill:3,decode:10,other:0 "
                    "calls=gdn_seq:r9k:prefill:36")
    (c,) = calls.parse(f"noise\n(EngineCore pid=42) {text}\n").lines
    assert (c.pid, c.rank, c.steps["decode"], c.calls) == (42, 1, 10, {("gdn_seq", "r9k", "prefill"): 36})
    assert c.routes == ("r9k", "rule", "vllm")
    assert calls.parse(calls.line(1, 0, {}, {})).lines[0].calls == {}
    for bad in (text.replace("r9k:prefill", "r9k:warmup"), text + ",gdn_seq:r9k:prefill:1",
                text.replace("pid=42", "pid=042"), "(EngineCore pid=7) " + text, text + " x=1",
                text.replace("steps=prefill:3,", "steps=")):
        p = calls.parse(bad)
        assert (p.lines, p.malformed) == ([], 1), bad
    assert calls.parse(f"INFO prompt='{text}'\n").malformed == 0  # text inside a logged line is no line


def test_old_lines_parse_and_the_rule_route_is_only_where_the_line_counts_it():
    """A line without ``routes=`` (a plugin that counted r9k and vllm only) parses, counting those two; a ``rule``
    call on it, a route named twice, or an unknown route is malformed. The share says which routes every process
    counted."""
    old = "R9K-CALLS pid=7 rank=0 steps=prefill:3,decode:0,other:1 calls=gdn_seq:vllm:prefill:12"
    (c,) = calls.parse(old).lines
    assert c.routes == ("r9k", "vllm") and c.calls == {("gdn_seq", "vllm", "prefill"): 12}
    new = calls.line(8, 1, {"prefill": 3}, {("gdn_seq", "rule", "prefill"): 12, ("gdn_seq", "r9k", "prefill"): 2})
    assert calls.parse(new).lines[0].calls == {("gdn_seq", "r9k", "prefill"): 2, ("gdn_seq", "rule", "prefill"): 12}
    for bad in (old.replace("vllm:prefill", "rule:prefill"),
                new.replace("routes=r9k,rule,vllm", "routes=r9k,vllm"),
                new.replace("routes=r9k,rule,vllm", "routes=r9k,rule,rule,vllm"),
                new.replace("routes=r9k,rule,vllm", "routes=r9k,rule,vllm,gpu"),
                new.replace("routes=r9k,rule,vllm", "routes=")):
        p = calls.parse(bad)
        assert (p.lines, p.malformed) == ([], 1), bad
    assert calls.delta(calls.Parsed(), calls.parse(new))["routes"] == ["r9k", "rule", "vllm"]
    assert calls.delta(calls.Parsed(), calls.parse(old))["routes"] == ["r9k", "vllm"]
    assert calls.delta(calls.Parsed(), calls.parse(f"{old}\n{new}"))["routes"] == ["r9k", "vllm"]  # one old process


def test_the_suites_share_is_the_latest_less_the_one_before():
    a = calls.line(1, 0, {"prefill": 2, "decode": 5}, {("moe_cache", "r9k", "decode"): 10})
    b = calls.line(1, 0, {"prefill": 3, "decode": 25}, {("moe_cache", "r9k", "decode"): 50,
                                                        ("moe_cache", "r9k", "prefill"): 6})
    other = calls.line(2, 1, {"decode": 20}, {("moe_cache", "r9k", "decode"): 40})
    d = calls.delta(calls.parse(a), calls.parse(f"{a}\n{b}\n{other}"))
    assert d["steps"] == {"prefill": 1, "decode": 40, "other": 0} and d["processes"] == 2
    assert d["calls"] == [{"dispatch": "moe_cache", "route": "r9k", "kind": "decode", "calls": 80},
                          {"dispatch": "moe_cache", "route": "r9k", "kind": "prefill", "calls": 6}]
    assert d["per_step"] == {"moe_cache:r9k:decode": 2.0, "moe_cache:r9k:prefill": 6.0}
    restarted = calls.delta(calls.parse(b), calls.parse(a))  # counts went down: a new process of that pid
    assert restarted["steps"]["decode"] == 5 and restarted["calls"][0]["calls"] == 10


def test_the_engine_reads_a_suites_lines_and_never_raises(tmp_path):
    from validate.engine import r9k_calls

    log = tmp_path / "server.log"
    first = calls.line(1, 0, {"decode": 5}, {("moe_cache", "r9k", "decode"): 10}) + "\n"
    log.write_text(first + calls.line(1, 0, {"decode": 9}, {("moe_cache", "r9k", "decode"): 18}) + "\nR9K-CALLS x\n")
    d = r9k_calls(log, len(first))
    assert d["steps"]["decode"] == 4 and d["calls"][0]["calls"] == 8 and d["malformed"] == 1
    assert r9k_calls(None, 0) is None and r9k_calls(log, log.stat().st_size) is None
    assert r9k_calls(tmp_path / "missing.log", 0)["error"].startswith("FileNotFoundError")


def test_the_notes_show_the_calls_a_step(tmp_path):
    from tests.conftest import REPO
    from tests.validate.test_records_render import PROBE, rec
    from validate.record import record_path, write_record
    from validate.render import render_release

    lines = calls.line(1, 0, {"prefill": 4, "decode": 100}, {("fp8_block_gemm", "r9k", "decode"): 1200,
                                                             ("gdn_seq", "r9k", "prefill"): 12,
                                                             ("gdn_seq", "rule", "prefill"): 2,
                                                             ("gdn_seq", "r9k", "other"): 3})
    r = rec("h200-next", "probe", metrics=PROBE)
    r.r9k_calls = calls.delta(calls.Parsed(), calls.parse(lines))
    write_record(record_path(tmp_path, "v9", "h200-next", "probe"), r)
    idle = rec("h200-next", "sanity")
    idle.r9k_calls = {"steps": {"prefill": 2, "decode": 0}, "calls": [], "malformed": 0}
    write_record(record_path(tmp_path, "v9", "h200-next", "sanity"), idle)
    md = render_release(REPO, tmp_path, "v9", None).read_text()
    section = md.split("## r9k's dispatches in the steps", 1)[1].split("\n## ", 1)[0]
    assert "| h200-next | probe | 4 / 100 | fp8_block_gemm | r9k | – | 1,200 (12.0) |" in section
    assert "| h200-next | probe | 4 / 100 | gdn_seq | r9k | 12 (3.0) | – |" in section
    assert "| h200-next | probe | 4 / 100 | gdn_seq | vllm, beyond its rule | 2 (0.5) | – |" in section
    assert "| h200-next | sanity | 2 / 0 | – | – | – | – |" in section  # steps and no dispatched call: said


def test_a_drafter_in_sample_tokens_counts_in_its_step_and_counting_never_fails_a_step(fresh, monkeypatch):
    """vLLM samples, and a speculative drafter proposes, in sample_tokens after execute_model returns None: the
    step is still the same kind. A step the marks cannot read still runs; uninstall leaves another's wrap."""
    mod = types.ModuleType("fake_runner2")

    class Runner:
        device = torch.device("cpu")

        def execute_model(self, scheduler_output, intermediate_tensors=None):
            calls.count("fp8_block_gemm", "r9k", self.device)
            return None

        def sample_tokens(self, grammar_output):
            calls.count("moe_cache", "r9k", self.device)  # the drafter's MoE layer
            return "sampled"

    mod.Runner = Runner
    monkeypatch.setitem(__import__("sys").modules, "fake_runner2", mod)
    monkeypatch.setattr(calls, "RUNNERS", (("fake_runner2", "Runner"),))
    assert calls.install() == ["fake_runner2.Runner.execute_model", "fake_runner2.Runner.sample_tokens"]
    r = Runner()
    assert r.execute_model(_out(a=1)) is None and r.sample_tokens(None) == "sampled"
    assert calls.totals() == {("fp8_block_gemm", "r9k", "decode"): 1, ("moe_cache", "r9k", "decode"): 1}
    bad = _out(a=3)
    bad.scheduled_spec_decode_tokens = {"a": 5}  # of no kind vLLM sends: the step runs, uncounted as a kind
    assert r.execute_model(bad) is None and r.sample_tokens(None) == "sampled"
    assert calls.STATE.devices["cpu"].kind.item() == calls.KINDS.index("other")
    ours = Runner.execute_model
    Runner.execute_model = functools.wraps(ours)(lambda self, *a, **k: ours(self, *a, **k))  # another plugin's
    calls.uninstall()
    assert Runner.execute_model.__wrapped__ is ours  # not put back over the other plugin's wrap


def test_an_edited_record_shows_no_number_its_log_could_not_have_said(tmp_path):
    from tests.conftest import REPO
    from tests.validate.test_records_render import PROBE, rec
    from validate.record import record_path, write_record
    from validate.render import render_release

    r = rec("h200-next", "probe", metrics=PROBE)
    r.r9k_calls = {"steps": {"prefill": "many", "decode": -100}, "processes": "x", "malformed": [1],
                   "calls": [{"dispatch": "fp8_block_gemm", "route": "r9k", "kind": "decode", "calls": -1200},
                             {"dispatch": "gdn_seq", "route": "r9k | injected", "kind": "prefill", "calls": 5},
                             {"dispatch": "moe_cache", "route": "r9k", "kind": "decode", "calls": 7}]}
    r.moe_cache = {"layers": [], "total": {"bytes": "x", "device_bytes": True, "device_share": "lots"},
                   "malformed": "y"}
    write_record(record_path(tmp_path, "v9", "h200-next", "probe"), r)
    md = render_release(REPO, tmp_path, "v9", None).read_text()
    assert "could not be rendered" not in md
    section = md.split("## r9k's dispatches in the steps", 1)[1].split("\n## ", 1)[0]
    assert "| h200-next | probe | – / – | moe_cache | r9k | – | 7 (–) |" in section
    assert "injected" not in section and "-1,200" not in section and "many" not in section
    moe = md.split("## The expert cache", 1)[1].split("\n## ", 1)[0]
    assert "(lots)" not in moe and "0.0 MiB" not in moe


def test_nothing_is_counted_while_torch_compile_traces(fresh):
    """A dispatch decided inside traced code would count once at tracing and never at run time: not counted."""
    def f(x):
        calls.count("gdn_seq", "vllm", x.device)
        return x + 1

    torch.compile(f, backend="eager")(torch.zeros(3))
    assert calls.totals() == {}
    f(torch.zeros(3))
    assert calls.totals() == {("gdn_seq", "vllm", "other"): 1}

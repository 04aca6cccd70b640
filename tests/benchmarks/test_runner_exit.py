"""The kernel benchmark runner's exit status (benchmarks/kernels/__main__.py), on the CPU: a run in which any impl
asked for gives no figure at any shape exits 1 and names each one; a run where every impl times exits 0. The
GPU-only calls of the runner are stood in for (a device name, a sync, the timers), nothing else."""
from __future__ import annotations

import json
import math

import pytest
import torch

import benchmarks.kernels.__main__ as runner
from benchmarks.kernels import REGISTRY
from benchmarks.kernels.registry import Floor, Op, Unavailable, register

# what each impl of the fake op does, set per test: "ok", "raise" (the call fails), "unavailable", "nan" (timed, NaN)
BEHAVIOUR: dict[str, str] = {}


def _impl(name: str):
    def make(inputs):
        if BEHAVIOUR.get(name) == "unavailable":
            raise Unavailable(f"{name} is not installed")

        def call():
            if BEHAVIOUR.get(name) == "raise":
                raise NameError("name 'tl' is not defined")
            return inputs * 2
        call.impl = name
        return call
    return make


@pytest.fixture
def fake_op(monkeypatch):
    op = Op(name="tmp_exit", family="fp8", doc="runner exit test", shapes=({"M": 4}, {"M": 8}),
            build=lambda shape, device: torch.ones(shape["M"]), r9k=_impl("r9k"), floor=lambda s: Floor(),
            peers={"peer_a": _impl("peer_a"), "peer_b": _impl("peer_b")}, ref=lambda x: x * 2,
            modes=("host",), default_mode="host")
    register(op)
    monkeypatch.setattr(runner, "gpu_problem", lambda world_size=1: None)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a, **k: None)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "cpu stand-in")
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)

    def time_one(op, mode, fns, flush):
        return (math.nan if BEHAVIOUR.get(fns.impl) == "nan" else 3.0), {}
    monkeypatch.setattr(runner, "time_one", time_one)
    BEHAVIOUR.clear()
    yield op
    del REGISTRY["tmp_exit"]
    BEHAVIOUR.clear()


def test_every_impl_timed_exits_0(fake_op, tmp_path, capsys):
    out = tmp_path / "r.json"
    assert runner.main(["--op", "tmp_exit", "--json", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert doc["problems"] == [] and len(doc["rows"]) == 6  # 2 shapes x 3 impls x 1 mode
    assert {r["us"] for r in doc["rows"]} == {3.0} and {r["err"] for r in doc["rows"]} == {0.0}


@pytest.mark.parametrize("impl,what,expect", [
    ("r9k", "raise", "tmp_exit M=4 r9k: FAILED NameError: name 'tl' is not defined"),
    ("peer_b", "unavailable", "tmp_exit M=4 peer_b: skipped: peer_b is not installed"),
    ("peer_a", "nan", "tmp_exit M=4 peer_a host: no figure (nan us)"),
])
def test_an_impl_without_a_figure_exits_1(fake_op, tmp_path, capsys, impl, what, expect):
    """The failure `--op launch` had (r9k's call raising, its row missing) and the other ways a row goes
    missing or empty: each fails the run, once a shape, named in the JSON and at the end of the output."""
    BEHAVIOUR[impl] = what
    out = tmp_path / "r.json"
    assert runner.main(["--op", "tmp_exit", "--json", str(out)]) == 1
    doc = json.loads(out.read_text())
    assert doc["problems"] == [expect, expect.replace("M=4", "M=8")]
    err = capsys.readouterr().err
    assert "2 without a figure:" in err and expect in err
    # the others still ran and were timed
    assert {r["impl"] for r in doc["rows"] if r["us"] == 3.0} == {"r9k", "peer_a", "peer_b"} - {impl}


def test_only_the_peers_asked_for_count(fake_op, tmp_path):
    BEHAVIOUR["peer_b"] = "unavailable"
    assert runner.main(["--op", "tmp_exit", "--peer", "peer_a", "--json", str(tmp_path / "r.json")]) == 0


def test_the_launch_kernels_annotation_resolves():
    """`--op launch` died of `NameError: tl` where Triton evaluates the kernel's string annotation (this module
    has `from __future__ import annotations`) in the module's globals; it must resolve to tl.constexpr."""
    import inspect

    import triton.language as tl

    from benchmarks.kernels import fp8

    sig = inspect.signature(fp8._empty_kernel().fn, eval_str=True)
    assert sig.parameters["n"].annotation is tl.constexpr and len(sig.parameters) == 14

"""The decode-step benchmark's registration (benchmarks/kernels/moe.py ``moe_decode_step``) and the runner's
op-specific timers that return extra row figures, on the CPU."""
from __future__ import annotations

import types

import torch

from benchmarks.kernels import REGISTRY
from benchmarks.kernels.__main__ import time_one


def test_moe_decode_step_is_registered_with_the_issues_shapes():
    op = REGISTRY["moe_decode_step"]
    assert {(s["decode"], s["requests"], s["slots"]) for s in op.shapes} == {
        (d, r, s) for d in (0, 1) for r in (1, 8, 32) for s in (270, 135)}
    assert all(s["E"] == 512 and s["k"] == 10 and 3 * s["H"] * s["I"] * 2 == 1.5 * 2**20 for s in op.shapes)
    assert set(op.peers) == {"resident", "uva", "stage", "prefetch"} and op.modes == ("loop", "graph")
    assert op.default_mode == "graph" and set(op.timers) == {"loop", "graph"}
    assert op.shape_list("requests=1|8,slots=64")[1]["requests"] == 8
    assert [s["decode"] for s in op.shape_list("decode=0,requests=8")] == [0]


def test_the_inputs_build_on_the_cpu_and_the_impls_say_why_not():
    op = REGISTRY["moe_decode_step"]
    a = op.build(dict(op.shapes[0], **op.tiny), "cpu")
    assert len(a.steps) and a.steps[0][2].shape == (4, op.tiny["k"]) and a.why
    for make in (op.r9k, op.peers["uva"], op.peers["stage"], op.peers["prefetch"]):
        try:
            make(a)
        except Exception as e:  # noqa: BLE001 - Unavailable, with its reason
            assert type(e).__name__ == "Unavailable" and str(e)
        else:
            raise AssertionError("an impl built on the CPU")


def test_the_inputs_draw_decode_or_fresh_traffic():
    """decode=1 draws DecodeTraffic after its burn-in, decode=0 SeedTraffic: different steps, both seeded."""
    op = REGISTRY["moe_decode_step"]
    tiny = dict(op.shapes[0], **op.tiny)
    d1 = op.build(dict(tiny, decode=1), "cpu")
    d0 = op.build(dict(tiny, decode=0), "cpu")
    assert not torch.equal(d1.steps[0][2], d0.steps[0][2])
    assert torch.equal(op.build(dict(tiny, decode=1), "cpu").steps[5][2], d1.steps[5][2])


def test_a_timer_may_return_extra_figures():
    op = types.SimpleNamespace(timers={"loop": lambda fns: (5.0, {"hit_rate": 0.5})})
    assert time_one(op, "loop", [], "zero") == (5.0, {"hit_rate": 0.5})
    op = types.SimpleNamespace(timers={"loop": lambda fns: 3.0})
    assert time_one(op, "loop", [], "zero") == (3.0, {})

"""kernels/fp8/linear.py's plan caches, checked on the CPU: which calls build a plan and which reuse one.

A plan is built for a weight, an M bucket (the M values that share a kernel configuration and Triton's
specialisation of M) and the launch settings; a call that changes none of them must build nothing, and a new
weight, a new bucket, another output dtype or a changed setting must each build one. The plan builders are
replaced by stand-ins that record what they were asked for (the GPU gates, test_linear_dispatch.py and
test_block_gemm.py, check that the real plans give the general path's bits); the bucket choice itself is the
real one, with Gluon reported usable as on a Hopper GPU.
"""
from __future__ import annotations

import pytest
import torch

import kernels._launch as launch
import kernels.fp8.linear as L
import kernels.fp8.wgmma as W


@pytest.fixture
def planner(monkeypatch):
    from benchmarks.portability.standin import DEVICE_BY_NAME, compiling_for

    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    monkeypatch.setattr(L, "_plannable", lambda t, sb, M: M > 0)
    monkeypatch.setattr(W, "GLUON", True)
    monkeypatch.setattr(W, "gluon_supported", lambda dev: W.GLUON)
    built = []

    def linear_plan(x, qb, sb, out_dtype, fmt, cfg, gluon_ok):
        built.append(("linear", x.shape[0], cfg["kernel"], cfg["BM"] if "BM" in cfg else None, gluon_ok))
        return lambda x, qb, sb: ("plan", len(built))

    def gemm_launch(M, K, qb, sb, out_dtype, a_fmt, b_fmt, cfg, gluon_ok, dev):
        built.append(("gemm", M, cfg["kernel"], cfg.get("BM"), gluon_ok))
        return lambda qa, sa: ("gemm plan", len(built))

    monkeypatch.setattr(L, "_linear_plan", linear_plan)
    monkeypatch.setattr(L, "_gemm_launch", gemm_launch)
    monkeypatch.setattr(L._g, "fp8_block_gemm", lambda *a, **k: None)  # the general path's checks: a GPU's
    L.plans_clear()
    with compiling_for(DEVICE_BY_NAME["cuda:90"]):  # the target an H200 reports (what the bucket's config reads)
        yield built
    L.plans_clear()


def _weight(N=256, K=512):
    return torch.empty(N, K, dtype=torch.float8_e4m3fn), torch.empty((N + 127) // 128, K // 128)


def test_an_unchanged_call_builds_nothing_and_an_m_of_a_known_bucket_reuses_its_plan(planner):
    qb, sb = _weight()
    before = L.PLAN_BUILDS
    out = [L.fp8_linear(torch.empty(M, 512, dtype=torch.bfloat16), qb, sb) for M in (3, 3, 5, 15, 2)]
    assert L.PLAN_BUILDS - before == 1 and len(planner) == 1
    assert set(out) == {("plan", 1)}
    assert planner[0][:3] == ("linear", 3, "wgmma_small_m")


@pytest.mark.parametrize("Ms, builds", [
    ((3, 1), 2),  # M == 1 is specialised apart
    ((3, 16), 2),  # a multiple of 16 is specialised apart
    ((3, 20, 31), 2),  # 17-32: the 32-token tile
    ((3, 40, 63), 2),  # 33-64: the kernel without split-K
    ((3, 65, 129), 2),  # past 64: the prefill kernel (65 and 129: the same tile count class at N 256)
    ((3, 16, 32, 48, 64), 4),  # 16 and 32 share the 16-divisible class but not the tile; 48 and 64 share both
])
def test_each_new_bucket_builds_one_plan(planner, Ms, builds):
    qb, sb = _weight()
    before = L.PLAN_BUILDS
    for M in Ms:
        L.fp8_linear(torch.empty(M, 512, dtype=torch.bfloat16), qb, sb)
        L.fp8_linear(torch.empty(M, 512, dtype=torch.bfloat16), qb, sb)
    assert L.PLAN_BUILDS - before == builds


def test_a_new_weight_an_output_dtype_or_a_changed_setting_builds_a_plan(planner, monkeypatch):
    qb, sb = _weight()
    x = torch.empty(8, 512, dtype=torch.bfloat16)
    L.fp8_linear(x, qb, sb)
    n = L.PLAN_BUILDS
    qb2, sb2 = _weight()  # the same shape, another weight: its own descriptor
    L.fp8_linear(x, qb2, sb2)
    assert L.PLAN_BUILDS == n + 1
    L.fp8_linear(x, qb, sb, torch.float16)
    assert L.PLAN_BUILDS == n + 2
    monkeypatch.setattr(launch, "FAST", False)  # R9K_TRITON_FAST_LAUNCH=0
    L.fp8_linear(x, qb, sb)
    assert L.PLAN_BUILDS == n + 3
    monkeypatch.setattr(launch, "FAST", True)
    monkeypatch.setattr(W, "GLUON", False)  # the Triton kernels (the path ROCm takes)
    L.fp8_linear(x, qb, sb)
    assert L.PLAN_BUILDS == n + 4 and planner[-1][2:] == ("tile", 16, False)
    monkeypatch.setattr(W, "GLUON", True)
    L.fp8_linear(x, qb, sb)
    L.fp8_linear(torch.empty(8, 512, dtype=torch.float16), qb, sb)  # another activation dtype
    assert L.PLAN_BUILDS == n + 5
    L.fp8_linear(torch.empty(8, 512, dtype=torch.bfloat16)[:, :512], qb, sb)  # the same layout
    assert L.PLAN_BUILDS == n + 5


def test_an_activation_the_plan_cannot_take_is_refused_or_planned_apart(planner):
    qb, sb = _weight()
    L.fp8_linear(torch.empty(8, 512, dtype=torch.bfloat16), qb, sb)
    n = L.PLAN_BUILDS
    wide = torch.empty(8, 1024, dtype=torch.bfloat16)[:, :512]  # row stride 1024: another key
    L.fp8_linear(wide, qb, sb)
    assert L.PLAN_BUILDS == n + 1
    with pytest.raises(ValueError, match="contiguous last dim"):
        L.fp8_linear(torch.empty(512, 8, dtype=torch.bfloat16).t(), qb, sb)
    with pytest.raises(ValueError, match="x must be bf16, fp16 or fp32"):
        L.fp8_linear(torch.empty(8, 512, dtype=torch.int32), qb, sb)


def test_the_gemm_plans_by_weight_and_bucket_and_a_config_takes_the_general_path(planner, monkeypatch):
    qb, sb = _weight()
    qa, sa = torch.empty(5, 512, dtype=torch.float8_e4m3fn), torch.empty(5, 4)
    n = L.PLAN_BUILDS
    assert L.fp8_block_gemm(qa, sa, qb, sb) == ("gemm plan", 1)
    L.fp8_block_gemm(torch.empty(7, 512, dtype=torch.float8_e4m3fn), torch.empty(7, 4), qb, sb)
    assert L.PLAN_BUILDS == n + 1
    L.fp8_block_gemm(qa, torch.empty(4, 5).t(), qb, sb)  # column-major scales: the general path's copy
    assert L.PLAN_BUILDS == n + 2 and len(planner) == 1
    seen = []
    monkeypatch.setattr(L._g, "fp8_block_gemm", lambda *a, **k: seen.append(a[-1]) or "general")
    assert L.fp8_block_gemm(qa, sa, qb, sb, config=dict(kernel="tile")) == "general"
    assert seen == [dict(kernel="tile")] and L.PLAN_BUILDS == n + 2

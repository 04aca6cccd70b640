"""Fault-injection review of session 6 (Gluon fp8 kernels, their wiring, the benches). CPU only: each test
failed on commit 663c6ad and names the defect it showed (all fixed since); the review's GPU-only findings
are gated in tests/kernels/test_fp8_wgmma.py (long K, a 1-byte output, CUDA-graph capture)."""
from __future__ import annotations

import pytest
import torch

import kernels.fp8.gemm as F
import kernels.fp8.wgmma as W
from tests.kernels.cases import fp8_operands


def test_gluon_supported_is_false_on_rocm(monkeypatch):
    """ROCm reports gfx9xx as compute capability 9.x (MI300X: (9, 4), MI250: (9, 0)); gluon_supported then says
    True, so _gemm's default (M <= 64, pre-quantised A) picks the Hopper-only wgmma_small_m kernel there.
    tma_supported excludes ROCm (torch.version.hip); gluon_supported does not."""
    monkeypatch.setattr(torch.version, "hip", "6.2.41133", raising=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 4))
    monkeypatch.setattr(W, "HAVE_GLUON", True)
    monkeypatch.setattr(F, "_interpreting", lambda: False)
    assert not F.tma_supported("cuda:0")  # the existing rule
    assert not W.gluon_supported("cuda:0")  # was True on an MI300X


def test_wgmma_num_stages_is_bounded():
    """WS=1 / 2 pass num_stages to STAGES uncapped (only WS=0 is capped at K/128): a static_range of that length
    and [STAGES, 128, 128] buffers. 10**9 passes _check_config (compile hang / OutOfResources on the GPU)."""
    with pytest.raises(ValueError, match="num_stages"):
        F._check_config(dict(F.WGMMA_DEFAULT, num_stages=10**9))


@pytest.mark.parametrize("regs", [24, 128, 216])
def test_consumer_regs_leave_a_valid_budget_for_the_default_partition(regs):
    """WS=2 runs at maxnreg 168 with 3 warpgroups (default consumer, worker consumer, producer padded to a
    warpgroup at 24): Triton's AllocateWarpGroups gives the default partition 168 + (168 - regs) + (168 - 24)
    = 480 - regs, which must be <= 256 (setmaxnreg's range): regs >= 224. _check_config allowed [24, 256]."""
    assert 480 - regs > 256
    with pytest.raises(ValueError, match="CONSUMER_REGS"):
        F._check_config(dict(F.WGMMA_DEFAULT, CONSUMER_REGS=regs))


@pytest.mark.parametrize("bad", [dict(WS=2.0), dict(WS=1.0, MODE=2.0), dict(WS=True), dict(MODE=False, WS=0)])
def test_ws_and_mode_must_be_ints(bad):
    """num_stages / PROGRAMS / GROUP_M reject floats and bools; WS and MODE accept 2.0, True, False."""
    with pytest.raises((ValueError, TypeError), match="WS|MODE"):
        F._check_config(dict(F.WGMMA_DEFAULT, BM=128, num_warps=8, **bad))


@pytest.mark.parametrize("rot", ["no", "False", -1, 2.5])
def test_rotate_must_be_a_bool(rot):
    """ROTATE is launched as bool(cfg.get("ROTATE")): ROTATE="False" or "no" rotates."""
    with pytest.raises((ValueError, TypeError), match="ROTATE"):
        F._check_config(dict(F.WGMMA_SMALL_M_DEFAULT, ROTATE=rot))


@pytest.mark.parametrize("kernel", ["wgmma", "wgmma_small_m"])
def test_missing_scales_raise_a_named_error(kernel):
    """sa=None / sb=None reach ``t.dtype`` / ``sb.shape``: AttributeError instead of an error naming sa / sb."""
    _, qa, sa, qb, sb = fp8_operands(1, 8, 256, 256, "cpu")
    with pytest.raises((ValueError, TypeError), match="sa"):
        F.fp8_block_gemm(qa, None, qb, sb, config=dict(kernel=kernel))
    with pytest.raises((ValueError, TypeError), match="sb"):
        F.fp8_block_gemm(qa, sa, qb, None, config=dict(kernel=kernel))

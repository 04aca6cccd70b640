"""Fault-injection review of session 7 (the decode kernels' UNROLL, the split-K reduce, the benches). CPU only;
the GPU-side findings (UNROLL's bits compared in bf16, trivial UNROLL cases, the new M 33-64 default ungated)
are fixed in tests/kernels/test_fp8_wgmma.py."""
from __future__ import annotations

import pytest
import torch

import kernels.fp8.wgmma as W



@pytest.mark.parametrize("u", ["2", 2.5, 3, 0, -4, 8, True])
def test_launch_unroll_refuses_what_the_kernels_cannot_run(u):
    """_unroll cast UNROLL with int(): "2" and 2.5 became 2, 3 / 0 / -4 / 8 passed to the kernels, whose
    loop knows 1, 2 and 4 only (3 folded the wrong blocks; 0 built a kernel without a wgmma). A direct
    launch_small_m_wgmma / launch_rows_wgmma call skips fp8._check_config."""
    with pytest.raises(ValueError, match="UNROLL"):
        W._unroll(dict(UNROLL=u), 8)



"""Fault-injection review of session 7 (the decode kernels' UNROLL, the split-K reduce, the benches). CPU only;
the GPU-side findings (UNROLL's bits compared in bf16, trivial UNROLL cases, the new M 33-64 default ungated)
are fixed in tests/kernels/test_fp8_wgmma.py."""
from __future__ import annotations

import pytest
import torch

import kernels.fp8.wgmma as W
from kernels.bench import fp8_wgmma_bench, tma_stream_floor


@pytest.mark.parametrize("u", ["2", 2.5, 3, 0, -4, 8, True])
def test_launch_unroll_refuses_what_the_kernels_cannot_run(u):
    """_unroll cast UNROLL with int(): "2" and 2.5 became 2, 3 / 0 / -4 / 8 passed to the kernels, whose
    loop knows 1, 2 and 4 only (3 folded the wrong blocks; 0 built a kernel without a wgmma). A direct
    launch_small_m_wgmma / launch_rows_wgmma call skips fp8._check_config."""
    with pytest.raises(ValueError, match="UNROLL"):
        W._unroll(dict(UNROLL=u), 8)


def test_fp8_wgmma_bench_needs_something_to_run(capsys):
    """No option ran nothing and exited 0."""
    with pytest.raises(SystemExit) as e:
        fp8_wgmma_bench.main([])
    assert e.value.code == 2 and "nothing to run" in capsys.readouterr().err


def test_fp8_wgmma_bench_one_decode_table_a_run(capsys):
    """--decode --decode-sweep ran --decode only, silently."""
    with pytest.raises(SystemExit) as e:
        fp8_wgmma_bench.main(["--decode", "--decode-sweep"])
    assert e.value.code == 2 and "not allowed with" in capsys.readouterr().err


@pytest.mark.skipif(torch.cuda.is_available(), reason="the refusal is for machines without a CUDA device")
@pytest.mark.parametrize("main, argv", [(fp8_wgmma_bench.main, ["--decode-sweep"]),
                                        (tma_stream_floor.main, []), (tma_stream_floor.main, ["--decompose"])])
def test_benches_say_they_need_a_hopper_gpu(capsys, main, argv):
    """Without a GPU the benches died in the first CUDA call (AssertionError: Torch not compiled with CUDA)."""
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2 and "Hopper GPU" in capsys.readouterr().err

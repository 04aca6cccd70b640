"""The plugin's install on a ROCm vLLM, as its code reads it, with the platform queries stood in on the CPU
(docs/kernels/portability.md, "The ROCm dispatch walk"): the install runs there, no NVIDIA-only path is taken
on an AMD GPU (inline PTX, TMA, the Gluon kernels: ROCm reports gfx942 as compute capability 9.4), the fp8
format follows vLLM's platform dtype, and the kernels' defaults take the target Triton compiles for."""
from __future__ import annotations

import sys
import types

import pytest
import torch

from kernels.fp8 import gemm, wgmma  # imported as the session found TRITON_INTERPRET (Gluon checks it on import)
from kernels.target import Target


@pytest.fixture
def rocm(monkeypatch):
    """torch as a ROCm build sees an AMD GPU: torch.version.hip set, a device visible; no interpreter."""
    monkeypatch.setattr(torch.version, "hip", "7.0.0", raising=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda d=None: (9, 4))  # gfx942 reports 9.4
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)


def test_the_install_runs_on_rocm(rocm):
    from r9k.ops import kernels_can_run

    assert kernels_can_run() == (True, "")


def test_no_inline_ptx_on_rocm(monkeypatch):
    from kernels.gdn.seq import _use_ptx

    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    gpu_tensor = types.SimpleNamespace(is_cuda=True)  # ROCm tensors are "cuda" tensors too
    monkeypatch.setattr(torch.version, "hip", None, raising=False)
    assert _use_ptx(gpu_tensor) is True
    monkeypatch.setattr(torch.version, "hip", "7.0.0", raising=False)
    assert _use_ptx(gpu_tensor) is False
    from benchmarks.portability.standin import DEVICE_BY_NAME, compiling_for

    for name, ptx in (("gfx1201", False), ("gfx942", False), ("cuda:90", True)):  # CPU tensors: the target's
        with compiling_for(DEVICE_BY_NAME[name]):
            assert _use_ptx(torch.empty(1)) is ptx, name


def test_an_amd_gpu_reporting_9_4_takes_no_hopper_path(rocm, monkeypatch):
    assert gemm.tma_supported("cuda:0") is False
    if wgmma.HAVE_GLUON:  # with the Triton version check passed, the device check must refuse ROCm
        monkeypatch.setattr(wgmma, "GLUON_TRITON", ((0, 0), (99, 0)))
        assert wgmma.gluon_problem("cuda:0") == "cuda:0 is not a Hopper GPU (NVIDIA CUDA, compute capability 9.x)"
        monkeypatch.setattr(torch.version, "hip", None, raising=False)
        monkeypatch.setattr(torch.cuda, "get_device_capability", lambda d=None: (9, 0))
        assert wgmma.gluon_problem("cuda:0") is None
        assert gemm.tma_supported("cuda:0") is True


@pytest.mark.parametrize("arch, dtype", [("gfx1201", torch.float8_e4m3fn),
                                         ("gfx942:sramecc+:xnack-", torch.float8_e4m3fnuz)])
def test_vllm_rocm_fp8_dtype_per_arch_is_a_format_the_dispatch_covers(monkeypatch, arch, dtype):
    """vLLM's ROCm platform (vllm/platforms/rocm.py, read at import from the device's gcnArchName) quantises
    block-fp8 checkpoints to e4m3fnuz on gfx94x and e4m3fn on gfx12; r9k's dispatch covers both and quantises
    the activation to the weight's format (kernels/fp8/linear.py: ``_fmt_of(qb)``)."""
    pytest.importorskip("vllm")
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda d=None: types.SimpleNamespace(gcnArchName=arch))
    monkeypatch.delitem(sys.modules, "vllm.platforms.rocm", raising=False)
    import vllm.platforms.rocm as rocm_platform

    try:
        assert rocm_platform.RocmPlatform.fp8_dtype() == dtype
    finally:
        sys.modules.pop("vllm.platforms.rocm", None)  # its module state holds the stand-in arch
    from kernels.fp8.common import _fmt_of
    from r9k.ops.fp8 import _FP8

    assert dtype in _FP8
    assert _fmt_of(torch.empty(1, dtype=dtype)) == ("e4m3fnuz" if "gfx94" in arch else "e4m3fn")


@pytest.mark.parametrize("name, want", [
    ("gfx1201", Target("hip", "gfx1201", 32, 65536, True, 64)),
    ("gfx942", Target("hip", "gfx942", 64, 65536, False, 304)),
    ("cuda:90", Target("cuda", "90", 32, 232448, True, 132)),
])
def test_target_of_reads_the_active_driver(monkeypatch, name, want):
    from benchmarks.portability.standin import DEVICE_BY_NAME, compiling_for
    from kernels.target import target_of

    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    with compiling_for(DEVICE_BY_NAME[name]):
        assert target_of(torch.device("cpu")) == want


def test_fp8_tiles_per_target(monkeypatch):
    G = gemm
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)  # the GPU table, not the interpreter's

    gfx12, gfx942 = Target("hip", "gfx1201", 32, 65536, True), Target("hip", "gfx942", 64, 65536, False)
    h200 = Target("cuda", "90", 32, 232448, True)
    for M in (1, 16, 64):  # decode tiles: the same everywhere (they fit: 36 / 18 KiB, no spill)
        assert G.default_gemm_config(M, 4096, 4096, target=gfx12) == G.default_gemm_config(M, 4096, 4096)
    assert G.default_gemm_config(256, 4096, 4096, target=gfx12) == dict(
        kernel="tile", BM=128, BN=128, GROUP_M=8, KPI=1, num_warps=8, num_stages=2, FAST_DIV=True)
    assert G.default_gemm_config(256, 4096, 4096, quant_a=True, target=gfx12)["BM"] == 64
    assert G.default_gemm_config(256, 4096, 4096, quant_a=True, target=gfx942)["BM"] == 128
    # Hopper keeps its table: no target and an sm_90 target give the same configs
    for kw in (dict(), dict(tma=True), dict(quant_a=True), dict(quant_a=True, a_itemsize=4)):
        assert G.default_gemm_config(256, 4096, 4096, target=h200, **kw) == G.default_gemm_config(256, 4096, 4096, **kw)
    assert G.default_gemm_config(256, 4096, 4096) == dict(G.TILE_DEFAULT, KPI=2)
    for t in (Target("hip", "gfx950", 64, 163840, True), Target("hip", "gfx1100", 32, 65536, False)):
        with pytest.raises(ValueError, match=f"no fp8 GEMM tile was checked for hip:{t.arch} \\(wave {t.warp_size}"):
            G.default_gemm_config(256, 4096, 4096, target=t)  # their tiles were never compiled and read
        assert G.default_gemm_config(64, 4096, 4096, target=t)["BM"] == 16  # the decode tile (fits 64 KiB)
    with pytest.raises(ValueError, match="32768 B of LDS"):
        G.default_gemm_config(256, 4096, 4096, target=Target("hip", "gfx1201", 32, 32768, True))


def test_the_plan_key_holds_the_target(monkeypatch):
    from benchmarks.portability.standin import DEVICE_BY_NAME, compiling_for
    from kernels.fp8.linear import _plan_key

    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    x, qb, sb = torch.empty(16, 256), torch.empty(256, 256, dtype=torch.float8_e4m3fn), torch.empty(2, 2)
    keys = {}
    for name in ("gfx1201", "gfx942", "cuda:90"):
        with compiling_for(DEVICE_BY_NAME[name]):
            keys[name] = _plan_key(x, qb, sb, torch.bfloat16)
    assert len(set(keys.values())) == 3
    assert keys["gfx942"][-1].warp_size == 64


@pytest.mark.parametrize("name, tma", [("gfx1201", False), ("gfx942", False), ("cuda:90", True)])
def test_tma_follows_the_target_for_cpu_tensors(monkeypatch, name, tma):
    """The gate compiles from CPU tensors: whether the TMA kernel is picked is the target's (sm_90: yes, AMD:
    no), as a tensor on that GPU would have it."""
    from benchmarks.portability.standin import DEVICE_BY_NAME, compiling_for

    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    with compiling_for(DEVICE_BY_NAME[name]):
        assert gemm.tma_supported("cpu") is tma

"""``fp8_linear``: the activation quant and the block GEMM of a linear layer (what the vLLM dispatch runs,
r9k/ops/fp8.py), through a launch plan cached per shape."""
from __future__ import annotations

import torch

from kernels._util import _interpreting, cdiv
from kernels.fp8.common import FP8_MAX, GROUP, _check_x, _fmt_of
from kernels.fp8.gemm import (SMALL_M_MAX, _lock_buffer, _tma_layout_problem, default_gemm_config, fp8_block_gemm,
                               tma_supported)
from kernels.fp8.quant import _quant_group_kernel, fp8_quant_group
from kernels.target import target_of

try:  # the references work without Triton
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover
    triton = None
    tl = None


# ============================================================================================================
# fp8_linear: the activation quant and the block GEMM of a linear layer, through a launch plan cached per shape
# ============================================================================================================
_PLANS: dict = {}
_PLANS_MAX = 4096


def _plan_key(x, qb, sb, out_dtype) -> tuple:
    # the target too (kernels/target.py): a plan's configs are chosen for it, and one process may compile for
    # another (the portability gate's stand-in drivers)
    return (x.shape[0], x.shape[1], qb.shape[0], qb.shape[1], x.dtype, x.stride(0), x.data_ptr() % 16 == 0,
            out_dtype, qb.dtype, qb.stride(0), qb.stride(1), qb.data_ptr() % 16 == 0, sb.shape, sb.stride(0),
            sb.stride(1), sb.dtype, x.device, target_of(x.device))


def fp8_linear(x: torch.Tensor, qb: torch.Tensor, sb: torch.Tensor, out_dtype=torch.bfloat16) -> torch.Tensor:
    """``[M, N]`` = x ``[M, K]`` (bf16 / fp16 / fp32, last dim contiguous) times the block-quantised weight (qb
    ``[N, K]`` fp8, sb ``[ceil(N/128), K/128]`` fp32 row-major) transposed: x quantised per token and group of 128
    to qb's fp8 format (:func:`fp8_quant_group`'s kernel), then :func:`fp8_block_gemm`'s default kernel for the
    shape; the same bits as ``fp8_block_gemm(*fp8_quant_group(x, fmt), qb, sb, out_dtype)``.

    Why a separate entry: a linear layer calls it once a step with the same shapes, and the general path
    (:func:`_gemm`: checks, the config, Triton's JIT dispatcher, descriptor construction) costs ~100 us of host
    time a call, several times the GPU time of a decode GEMM. Here the first call of a shape checks everything
    and builds a plan: the launch arguments that do not change (grids, constexprs, strides, the split, the weight's
    TMA descriptor per weight), launched afterwards through kernels/_launch.py's cached compiled kernels. On a
    Hopper GPU with Gluon (:func:`kernels.fp8.wgmma.gluon_problem`) the plan covers the decode kernels and the
    prefill kernel; elsewhere (and under the interpreter) it calls the general path.

    Raises:
        ValueError: what :func:`fp8_quant_group` or :func:`fp8_block_gemm` raise for these operands.
    """
    key = _plan_key(x, qb, sb, out_dtype)
    plan = _PLANS.get(key)
    if plan is None:
        plan = _make_plan(x, qb, sb, out_dtype)
        if len(_PLANS) >= _PLANS_MAX:
            _PLANS.clear()
        _PLANS[key] = plan
    return plan(x, qb, sb)


def _desc(t: torch.Tensor, block: list[int], layout):
    """A Gluon TensorDescriptor over a 2-D tensor whose alignment the plan checked for its shape (its dataclass
    validation, a few us of host time a call, is skipped)."""
    from kernels.fp8.wgmma import TensorDescriptor

    d = object.__new__(TensorDescriptor)
    d.__dict__.update(base=t, shape=list(t.shape), strides=list(t.stride()), block_shape=block, layout=layout,
                      padding="zero")
    return d


def _make_plan(x, qb, sb, out_dtype):
    """The callable :func:`fp8_linear` runs for operands shaped like these (see there); checks them first by
    running the general path's checks (ValueError as fp8_block_gemm)."""
    fmt = _fmt_of(qb)
    M, K = _check_x(x)
    N = qb.shape[0]
    general = lambda x, qb, sb: fp8_block_gemm(*fp8_quant_group(x, fmt), qb, sb, out_dtype)  # noqa: E731
    if x.dtype not in (torch.bfloat16, torch.float16, torch.float32):
        raise ValueError(f"x must be bf16, fp16 or fp32, got {x.dtype}")
    if M == 0 or _interpreting() or not x.is_cuda or sb.dim() != 2 or sb.stride(1) != 1:
        return general
    # the general path's checks and choice, on this shape (one call: compiles the kernels it picks)
    qa0, sa0 = fp8_quant_group(x, fmt)
    fp8_block_gemm(qa0, sa0, qb, sb, out_dtype)
    from kernels.fp8 import wgmma as fp8_wgmma

    c0 = torch.empty(M, N, dtype=out_dtype, device=x.device)
    gluon_ok = (fp8_wgmma.gluon_supported(x.device) and _tma_layout_problem(qa0, qb, qb) is None
                and (M <= SMALL_M_MAX or out_dtype in (torch.bfloat16, torch.float16)))
    tma_ok = out_dtype in (torch.bfloat16, torch.float16) and _tma_layout_problem(qa0, qb, c0) is None
    cfg = default_gemm_config(M, N, K, False, 1, tma=tma_ok and tma_supported(x.device), gluon=gluon_ok,
                              target=target_of(x.device))
    if not gluon_ok or cfg["kernel"] not in ("wgmma", "wgmma_small_m"):
        return general
    from kernels._launch import launcher

    quant = launcher(_quant_group_kernel)
    BMq, GPP = 16, 2
    while (K // GROUP) % GPP:
        GPP -= 1
    q_grid = (triton.cdiv(M, BMq), K // GROUP // GPP)
    q_tail = (BMq, GPP, FP8_MAX[fmt], fmt == "e4m3fnuz", False, True)
    half = (0.5 if fmt == "e4m3fnuz" else 1.0) ** 2  # A is quantised to qb's format: HALF for both operands
    nkb = K // GROUP
    dev = x.device
    sms = torch.cuda.get_device_properties(dev).multi_processor_count
    i8, f32 = torch.uint8, torch.float32
    a_bytes = M * K  # qa then sa in one buffer: qa [M, K] bytes, sa [M, K/128] fp32 at a 16-byte aligned offset
    s_off = cdiv(a_bytes, 16) * 16

    def quantise(x):
        buf = torch.empty(s_off + M * nkb * 4, dtype=i8, device=dev)
        qa = buf[:a_bytes].view(M, K)
        sa = buf[s_off:].view(f32).view(M, nkb)
        quant(q_grid, (x, qa, sa, M, K, x.stride(0), K, nkb) + q_tail, num_warps=4)
        return qa.view(torch.float8_e4m3fn), sa

    if cfg["kernel"] == "wgmma":
        if cfg.get("WS") != 2:
            return general
        BN = cfg["BN"]
        tiles = triton.cdiv(M, 128) * triton.cdiv(N, BN)
        programs = min(sms, tiles)
        gemm = launcher(fp8_wgmma._block_gemm_ws2_kernel)
        a_layout = fp8_wgmma._layout((128, GROUP), torch.float8_e4m3fn)
        b_layout = fp8_wgmma._layout((BN, GROUP), torch.float8_e4m3fn)
        c_layout = fp8_wgmma._layout((64, BN), out_dtype)
        tail = (half, cfg["GROUP_M"], cfg["num_stages"], int(cfg.get("CONSUMER_REGS", 232)), 4)

        def run(x, qb, sb):
            qa8, sa = quantise(x)
            c = torch.empty(M, N, dtype=out_dtype, device=dev)
            gemm((programs,), (_desc(qa8, [128, GROUP], a_layout), _desc(qb.view(torch.float8_e4m3fn), [BN, GROUP],
                 b_layout), _desc(c, [64, BN], c_layout), sa, sb, M, N, K, nkb, sb.stride(0)) + tail, maxnreg=168)
            return c

        return run
    BN = cfg["BN"]
    if not cfg.get("SWAP_AB", True):  # _rows_wgmma_kernel: M <= 64 without split-K
        kbp = triton.next_power_of_2(nkb)
        stages = max(1, min(cfg["num_stages"], nkb, (fp8_wgmma.SMALL_M_SMEM - kbp * 64 * 4) // ((BN + 64) * GROUP)))
        gemm = launcher(fp8_wgmma._rows_wgmma_kernel)
        a_layout = fp8_wgmma._layout((64, GROUP), torch.float8_e4m3fn)
        b_layout = fp8_wgmma._layout((BN, GROUP), torch.float8_e4m3fn)
        tail = (half, kbp, stages, fp8_wgmma._unroll(cfg, stages))
        grid = (triton.cdiv(N, BN),)

        def run(x, qb, sb):
            qa8, sa = quantise(x)
            c = torch.empty(M, N, dtype=out_dtype, device=dev)
            gemm(grid, (_desc(qb.view(torch.float8_e4m3fn), [BN, GROUP], b_layout), _desc(qa8, [64, GROUP], a_layout),
                        sa, sb, c, M, N, K, nkb, sb.stride(0), N) + tail, num_warps=4)
            return c

        return run
    # _small_m_wgmma_kernel: swap-AB split-K, the split as _gemm and launch_small_m_wgmma choose it
    BM = cfg["BM"]
    n_tiles = triton.cdiv(N, BN)
    split = cfg.get("SPLIT_K", "auto")
    if split == "auto":
        split = max(1, min(nkb, round((cfg.get("PROGRAMS") or 2 * sms) / n_tiles)))
    split = min(int(split), nkb)
    if split * M * N >= 2**31:
        split = 1
    split = max(split, triton.cdiv(nkb, fp8_wgmma.SCALES_MAX // (4 * BM)))
    kb_per = triton.cdiv(nkb, split)
    split = triton.cdiv(nkb, kb_per)
    kbp = triton.next_power_of_2(kb_per)
    stages = max(1, min(cfg["num_stages"], kb_per, (fp8_wgmma.SMALL_M_SMEM - kbp * BM * 4) // ((BN + BM) * GROUP)))
    gemm = launcher(fp8_wgmma._small_m_wgmma_kernel)
    a_layout = fp8_wgmma._layout((BM, GROUP), torch.float8_e4m3fn)
    b_layout = fp8_wgmma._layout((BN, GROUP), torch.float8_e4m3fn)
    tail = (half, kbp, stages, bool(cfg.get("ROTATE", False)), BN // 16, fp8_wgmma._unroll(cfg, stages))
    grid = (n_tiles, split)

    def run(x, qb, sb):
        qa8, sa = quantise(x)
        c = torch.empty(M, N, dtype=out_dtype, device=dev)
        ws = torch.empty(split, M, N, dtype=f32, device=dev) if split > 1 else c
        lock = _lock_buffer(dev, n_tiles) if split > 1 else c
        gemm(grid, (_desc(qb.view(torch.float8_e4m3fn), [BN, GROUP], b_layout), _desc(qa8, [BM, GROUP], a_layout),
                    sa, sb, c, ws, lock, M, N, K, kb_per, split, nkb, sb.stride(0), N) + tail)
        return c

    return run

"""``fp8_linear`` (the activation quant and the block GEMM of a linear layer: what the vLLM dispatch runs,
r9k/ops/fp8.py) and ``fp8_block_gemm`` (the pre-quantised GEMM), through launch plans cached per weight and
M bucket.

A call through the general path (kernels/fp8/gemm.py ``_gemm``: its checks, the config table, Triton's JIT
dispatcher, descriptor construction) costs ~100 us of host time, several times the GPU time of a decode GEMM
(10-25 us on the H200 at M = 16, N = K = 4096), and a layer that runs outside a CUDA graph (eager mode,
prefills past the capture sizes) waits for it. A plan is what stays the same between the calls of one layer:

* its key: the weight (its address, shape, strides, dtype, its scales'), the activation's K, dtype, row
  stride and 16-byte alignment, the output dtype, the device and its target (kernels/target.py), the launch
  path's settings (kernels/_launch.py ``FAST``, kernels/fp8/wgmma.py ``GLUON``), and the **M bucket**: the M
  values that share a kernel configuration (:func:`kernels.fp8.gemm.default_gemm_config`'s answer for M,
  whether Gluon and TMA can run) and the specialisation Triton gives M (M == 1, M divisible by 16). Every M
  of a bucket runs the same compiled kernels with the same constexprs; only M, the grid over M and the
  activation's buffers change. A new M is looked up once (``_BY_M``), and builds a plan only if its bucket
  has none;
* what it holds: the compiled kernels (kernels/_launch.py :class:`Direct`: launched through Triton's C entry
  with no dispatch), the weight's TMA descriptor expanded once (its ``CUtensorMap``), the grids and
  constexprs, the split-K choice; the first call of a plan runs the general path (its checks, the kernels it
  compiles) and nothing is checked again on the hot path.

A plan holds its weight and scales (their descriptor is encoded over them), so a weight replaced by a new
tensor stays alive while its plan does: a caller that reloads weights into new tensors calls
:func:`plans_clear` after (in place, ``weight.copy_``, keeps every plan valid).

On a Hopper GPU with Gluon the plan covers the Gluon decode kernels and the warp-specialised prefill kernel;
elsewhere (ROCm, Gluon off) the tile kernel and, on a TMA GPU, the TMA prefill kernel; other configurations,
the interpreter and CPU tensors call the general path (a plan that is that call).
"""
from __future__ import annotations

import torch

from kernels import _launch
from kernels._util import _interpreting
import kernels.fp8.gemm as _g
import kernels.fp8.wgmma as fp8_wgmma
from kernels.fp8.common import FP8_MAX, GROUP, _check_x, _fmt_of
from kernels.fp8.gemm import SMALL_M_MAX, _lock_buffer, _tma_layout_problem, default_gemm_config, tma_supported
from kernels.fp8.quant import _quant_group_kernel, fp8_quant_group
from kernels.target import target_of

try:  # the references work without Triton
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover
    triton = None
    tl = None


# ============================================================================================================
# the plan caches
# ============================================================================================================
PLAN_BUILDS = 0  # plans built in this process (each runs the general path once); the plan-cache tests read it
_PLANS: dict = {}  # (operand key, bucket) -> plan
_BY_M: dict = {}  # (M,) + operand key -> plan: the bucket of an M found once
_PLANS_MAX = 4096


def _plan_key(x, qb, sb, out_dtype) -> tuple:
    """(M, the operand key): everything a plan depends on but the bucket (see the module doc); the target last.
    The weight and its scales by address: a plan holds the weight's TMA descriptor, which is valid for any
    tensor at that address of that shape and strides."""
    return (x.shape[0], x.shape[1:], x.dtype, x.stride(), x.data_ptr() % 16 == 0, out_dtype, qb.data_ptr(),
            qb.shape, qb.dtype, qb.stride(), sb.data_ptr(), sb.shape, sb.stride(), sb.dtype, x.device, _launch.FAST,
            fp8_wgmma.GLUON, target_of(x.device))


def _gemm_key(qa, sa, qb, sb, out_dtype) -> tuple:
    """:func:`_plan_key` for the pre-quantised GEMM: A's and its scales' layout too (sa column-major is copied
    by the general path, so it is part of the key)."""
    return (qa.shape[0], qa.shape[1:], qa.dtype, qa.stride(), qa.data_ptr() % 16 == 0, sa.shape[1:], sa.stride(),
            sa.dtype, sa.data_ptr() % 16 == 0, out_dtype, qb.data_ptr(), qb.shape, qb.dtype, qb.stride(),
            sb.data_ptr(), sb.shape, sb.stride(), sb.dtype, qa.device, _launch.FAST, fp8_wgmma.GLUON,
            target_of(qa.device))


def _remember(cache_key: tuple, pkey: tuple, build):
    """The plan of bucket ``pkey`` (built by ``build()`` if there is none, counted in PLAN_BUILDS), remembered
    for ``cache_key`` (an exact M)."""
    global PLAN_BUILDS
    plan = _PLANS.get(pkey)
    if plan is None:
        plan = build()
        PLAN_BUILDS += 1
        if len(_PLANS) >= _PLANS_MAX:
            _PLANS.clear()
            _BY_M.clear()
        _PLANS[pkey] = plan
    if len(_BY_M) >= 4 * _PLANS_MAX:
        _BY_M.clear()
    _BY_M[cache_key] = plan
    return plan


def plans_clear() -> None:
    """Forget every plan (their compiled kernels stay in Triton's cache)."""
    _PLANS.clear()
    _BY_M.clear()


# ============================================================================================================
# fp8_linear and fp8_block_gemm: the entries
# ============================================================================================================
def fp8_linear(x: torch.Tensor, qb: torch.Tensor, sb: torch.Tensor, out_dtype=torch.bfloat16) -> torch.Tensor:
    """``[M, N]`` = x ``[M, K]`` (bf16 / fp16 / fp32, last dim contiguous) times the block-quantised weight (qb
    ``[N, K]`` fp8, sb ``[ceil(N/128), K/128]`` fp32 row-major) transposed: x quantised per token and group of 128
    to qb's fp8 format (:func:`fp8_quant_group`'s kernel), then :func:`kernels.fp8.gemm.fp8_block_gemm`'s default
    kernel for the shape; the same bits as ``fp8_block_gemm(*fp8_quant_group(x, fmt), qb, sb, out_dtype)``,
    through the plan of this weight and M bucket (the module doc).

    Raises:
        ValueError: what :func:`fp8_quant_group` or :func:`fp8_block_gemm` raise for these operands (on the
            first call of a plan; later calls of it are not checked again).
    """
    key = _plan_key(x, qb, sb, out_dtype)
    plan = _BY_M.get(key)
    if plan is None:
        plan = _linear_plan_for(x, qb, sb, out_dtype, key)
    return plan(x, qb, sb)


def fp8_block_gemm(qa: torch.Tensor, sa: torch.Tensor, qb: torch.Tensor, sb: torch.Tensor,
                   out_dtype=torch.bfloat16, config: dict | None = None) -> torch.Tensor:
    """:func:`kernels.fp8.gemm.fp8_block_gemm` (the same operands, bits and errors), through the plan of this
    weight, A layout and M bucket where ``config`` is None; with a ``config`` the general path."""
    if config or not isinstance(sa, torch.Tensor) or sa.shape[0] != qa.shape[0]:  # (the latter: its ValueError)
        return _g.fp8_block_gemm(qa, sa, qb, sb, out_dtype, config)
    key = _gemm_key(qa, sa, qb, sb, out_dtype)
    plan = _BY_M.get(key)
    if plan is None:
        plan = _gemm_plan_for(qa, sa, qb, sb, out_dtype, key)
    return plan(qa, sa, qb, sb)


# ============================================================================================================
# buckets: the M values that share a configuration and a specialisation
# ============================================================================================================
def _choice(M: int, K: int, qa: torch.Tensor, qb: torch.Tensor, out_dtype) -> tuple[dict, bool, bool]:
    """(the default config, Gluon usable, TMA usable) for a pre-quantised A like ``qa`` [M, K] (as
    kernels/fp8/gemm.py ``_gemm`` decides them for a CUDA tensor)."""
    N = qb.shape[0]
    c0 = torch.empty(M, N, dtype=out_dtype, device=qa.device)
    gluon_ok = (fp8_wgmma.gluon_supported(qa.device) and _tma_layout_problem(qa, qb, qb) is None
                and (M <= SMALL_M_MAX or out_dtype in (torch.bfloat16, torch.float16)))
    tma_ok = (c0.element_size() <= 2 and tma_supported(qa.device) and _tma_layout_problem(qa, qb, c0) is None)
    cfg = default_gemm_config(M, N, K, False, 1, tma=tma_ok, gluon=gluon_ok, target=target_of(qa.device))
    return cfg, gluon_ok, tma_ok


def _bucket(M: int, cfg: dict, gluon_ok: bool, tma_ok: bool) -> tuple:
    return (tuple(sorted(cfg.items())), gluon_ok, tma_ok, M == 1, M % 16 == 0)


def _plannable(t: torch.Tensor, sb: torch.Tensor, M: int) -> bool:
    return M > 0 and not _interpreting() and t.is_cuda and sb.dim() == 2 and sb.stride(1) == 1


def _linear_plan_for(x, qb, sb, out_dtype, key):
    fmt = _fmt_of(qb)
    M, K = _check_x(x)
    if x.dtype not in (torch.bfloat16, torch.float16, torch.float32):
        raise ValueError(f"x must be bf16, fp16 or fp32, got {x.dtype}")
    if not _plannable(x, sb, M):
        return _remember(key, key + ("general",), lambda: _general_linear(fmt, out_dtype))
    # an A laid out as the plan's quant buffers are (fresh, row-major) decides the kernel
    cfg, gluon_ok, tma_ok = _choice(M, K, torch.empty(M, K, dtype=torch.float8_e4m3fn, device=x.device), qb,
                                    out_dtype)
    bucket = _bucket(M, cfg, gluon_ok, tma_ok)
    return _remember(key, key[1:] + (bucket,), lambda: _linear_plan(x, qb, sb, out_dtype, fmt, cfg, gluon_ok))


def _gemm_plan_for(qa, sa, qb, sb, out_dtype, key):
    M, K = _check_x(qa, "a")
    if (not _plannable(qa, sb, M) or not isinstance(sa, torch.Tensor) or sa.dim() != 2 or sa.stride(1) != 1
            or sa.stride(0) != K // GROUP or qa.stride(0) != K or qa.stride(1) != 1):
        return _remember(key, key + ("general",), lambda: _general_gemm(out_dtype))
    cfg, gluon_ok, tma_ok = _choice(M, K, qa, qb, out_dtype)
    bucket = _bucket(M, cfg, gluon_ok, tma_ok)

    def build():
        _g.fp8_block_gemm(qa, sa, qb, sb, out_dtype)  # the general path's checks and compiles, on this shape
        gemm = _gemm_launch(M, K, qb, sb, out_dtype, _fmt_of(qa), _fmt_of(qb), cfg, gluon_ok, qa.device)
        if gemm is None:
            return _general_gemm(out_dtype)
        return lambda qa, sa, qb, sb: gemm(qa.view(torch.uint8), sa)
    return _remember(key, key[1:] + (bucket,), build)


def _general_linear(fmt, out_dtype):
    return lambda x, qb, sb: _g.fp8_block_gemm(*fp8_quant_group(x, fmt), qb, sb, out_dtype)


def _general_gemm(out_dtype):
    return lambda qa, sa, qb, sb: _g.fp8_block_gemm(qa, sa, qb, sb, out_dtype)


# ============================================================================================================
# the plans
# ============================================================================================================
def _desc(cls, t: torch.Tensor, block: list[int], layout=None):
    """A host TensorDescriptor (Gluon's with a layout, Triton's without) over a 2-D tensor whose alignment the
    plan checked for its shape (the dataclass's validation, a few us of host time a call, is skipped)."""
    d = object.__new__(cls)
    d.__dict__.update(base=t, shape=list(t.shape), strides=list(t.stride()), block_shape=block, padding="zero")
    if layout is not None:
        d.layout = layout
    return d


def _linear_plan(x, qb, sb, out_dtype, fmt, cfg, gluon_ok):
    """The plan :func:`fp8_linear` runs for x's bucket (see there); checks the operands first by running the
    general path once (ValueError as fp8_quant_group and fp8_block_gemm)."""
    M, K = x.shape
    _g.fp8_block_gemm(*fp8_quant_group(x, fmt), qb, sb, out_dtype)  # the checks and compiles, on this shape
    gemm = _gemm_launch(M, K, qb, sb, out_dtype, fmt, fmt, cfg, gluon_ok, x.device)
    if gemm is None:
        return _general_linear(fmt, out_dtype)
    quant = _launch.Direct(_quant_group_kernel)
    BMq, GPP = 16, 2
    while (K // GROUP) % GPP:
        GPP -= 1
    nkb = K // GROUP
    q_cols = nkb // GPP
    q_tail = (BMq, GPP, FP8_MAX[fmt], fmt == "e4m3fnuz", False, True)
    dev, sxm = x.device, x.stride(0)
    u8, f32 = torch.uint8, torch.float32

    def run(x, qb, sb):
        M = x.shape[0]
        qa = torch.empty(M, K, dtype=u8, device=dev)
        sa = torch.empty(M, nkb, dtype=f32, device=dev)
        quant(((M + BMq - 1) // BMq, q_cols), (x, qa, sa, M, K, sxm, K, nkb) + q_tail, num_warps=4)
        return gemm(qa, sa)

    return run


def _gemm_launch(M, K, qb, sb, out_dtype, a_fmt, b_fmt, cfg, gluon_ok, dev):
    """``gemm(qa_u8 [M', K], sa [M', K/128]) -> c [M', N]`` for every M' of the bucket of M (cfg), or None where
    the plan has no launch of cfg's kernel (the general path then)."""
    N = qb.shape[0]
    nkb = K // GROUP
    half = (0.5 if a_fmt == "e4m3fnuz" else 1.0) * (0.5 if b_fmt == "e4m3fnuz" else 1.0)
    sms = torch.cuda.get_device_properties(dev).multi_processor_count
    f32, fp8 = torch.float32, torch.float8_e4m3fn
    qb8 = qb.view(fp8)  # fnuz bits read as e4m3fn: HALF undoes the doubling
    ssbn = sb.stride(0)
    kernel = cfg["kernel"]
    if gluon_ok and kernel == "wgmma":
        if cfg.get("WS") != 2:
            return None
        TD = fp8_wgmma.TensorDescriptor
        BN = cfg["BN"]
        n_tiles = triton.cdiv(N, BN)
        gemm = _launch.Direct(fp8_wgmma._block_gemm_ws2_kernel, fixed=(1,))
        a_layout = fp8_wgmma._layout((128, GROUP), fp8)
        c_layout = fp8_wgmma._layout((64, BN), out_dtype)
        bd = _desc(TD, qb8, [BN, GROUP], fp8_wgmma._layout((BN, GROUP), fp8))
        tail = (half, cfg["GROUP_M"], cfg["num_stages"], int(cfg.get("CONSUMER_REGS", 232)), 4)

        def run(qa, sa):
            M = qa.shape[0]
            c = torch.empty(M, N, dtype=out_dtype, device=dev)
            gemm((min(sms, (M + 127) // 128 * n_tiles),),
                 (_desc(TD, qa.view(fp8), [128, GROUP], a_layout), bd, _desc(TD, c, [64, BN], c_layout), sa, sb,
                  M, N, K, nkb, ssbn) + tail, maxnreg=168)
            return c

        return run
    if gluon_ok and kernel == "wgmma_small_m" and not cfg.get("SWAP_AB", True):  # _rows_wgmma_kernel
        TD = fp8_wgmma.TensorDescriptor
        BN = cfg["BN"]
        kbp = triton.next_power_of_2(nkb)
        stages = max(1, min(cfg["num_stages"], nkb, (fp8_wgmma.SMALL_M_SMEM - kbp * 64 * 4) // ((BN + 64) * GROUP)))
        gemm = _launch.Direct(fp8_wgmma._rows_wgmma_kernel, fixed=(0,))
        a_layout = fp8_wgmma._layout((64, GROUP), fp8)
        wd = _desc(TD, qb8, [BN, GROUP], fp8_wgmma._layout((BN, GROUP), fp8))
        tail = (half, kbp, stages, fp8_wgmma._unroll(cfg, stages))
        grid = (triton.cdiv(N, BN),)

        def run(qa, sa):
            M = qa.shape[0]
            c = torch.empty(M, N, dtype=out_dtype, device=dev)
            gemm(grid, (wd, _desc(TD, qa.view(fp8), [64, GROUP], a_layout), sa, sb, c, M, N, K, nkb, ssbn, N)
                 + tail, num_warps=4)
            return c

        return run
    if gluon_ok and kernel == "wgmma_small_m":  # _small_m_wgmma_kernel: swap-AB split-K, split as _gemm picks it
        TD = fp8_wgmma.TensorDescriptor
        BM, BN = cfg["BM"], cfg["BN"]
        n_tiles = triton.cdiv(N, BN)
        split = cfg.get("SPLIT_K", "auto")
        if split == "auto":
            split = max(1, min(nkb, round((cfg.get("PROGRAMS") or 2 * sms) / n_tiles)))
        split = min(int(split), nkb)
        if split * BM * N >= 2**31:  # the workspace is indexed in int32 (BM: the bucket's largest M)
            split = 1
        split = max(split, triton.cdiv(nkb, fp8_wgmma.SCALES_MAX // (4 * BM)))
        kb_per = triton.cdiv(nkb, split)
        split = triton.cdiv(nkb, kb_per)
        kbp = triton.next_power_of_2(kb_per)
        stages = max(1, min(cfg["num_stages"], kb_per,
                            (fp8_wgmma.SMALL_M_SMEM - kbp * BM * 4) // ((BN + BM) * GROUP)))
        gemm = _launch.Direct(fp8_wgmma._small_m_wgmma_kernel, fixed=(0,))
        a_layout = fp8_wgmma._layout((BM, GROUP), fp8)
        wd = _desc(TD, qb8, [BN, GROUP], fp8_wgmma._layout((BN, GROUP), fp8))
        tail = (half, kbp, stages, bool(cfg.get("ROTATE", False)), BN // 16, fp8_wgmma._unroll(cfg, stages))
        grid = (n_tiles, split)

        def run(qa, sa):
            M = qa.shape[0]
            c = torch.empty(M, N, dtype=out_dtype, device=dev)
            if split > 1:
                ws = torch.empty(split, M, N, dtype=f32, device=dev)
                lock = _lock_buffer(dev, n_tiles)
            else:
                ws = lock = c
            gemm(grid, (wd, _desc(TD, qa.view(fp8), [BM, GROUP], a_layout), sa, sb, c, ws, lock, M, N, K, kb_per,
                        split, nkb, ssbn, N) + tail)  # (num_warps: the positional constexpr, BN // 16)
            return c

        return run
    if gluon_ok:
        return None
    fast_div = bool(cfg.get("FAST_DIV", True))
    a_fnuz = a_fmt == "e4m3fnuz"
    kpi = cfg.get("KPI", 1)
    if nkb % kpi:
        kpi = 1
    BN = cfg["BN"]
    if kernel == "tile":  # the general path's tile kernel, pre-quantised A (no store of A)
        BM = cfg["BM"]
        gemm = _launch.Direct(_g._block_gemm_kernel)
        n_tiles = triton.cdiv(N, BN)
        qb_u8 = qb.view(torch.uint8)
        tail = (BM, BN, cfg["GROUP_M"], kpi, False, False, 448.0, a_fnuz, half, False, fast_div)
        opts = dict(num_warps=cfg["num_warps"], num_stages=cfg["num_stages"])

        def run(qa, sa):
            M = qa.shape[0]
            c = torch.empty(M, N, dtype=out_dtype, device=dev)
            gemm(((M + BM - 1) // BM * n_tiles,), (qa, sa, qb_u8, sb, c, c, c, M, N, K, K, nkb, qb_u8.stride(0),
                                                   ssbn, N, 0, 0) + tail, **opts)
            return c

        return run
    if kernel == "tma":  # Triton's TMA prefill kernel: a persistent grid, host descriptors
        from triton.tools.tensor_descriptor import TensorDescriptor as TTD

        BM = cfg["BM"]
        n_tiles = triton.cdiv(N, BN)
        gemm = _launch.Direct(_g._block_gemm_tma_kernel, fixed=(1,))
        bd = _desc(TTD, qb8, [BN, GROUP])
        programs_max = cfg.get("PROGRAMS") or sms
        tail = (BM, BN, cfg["GROUP_M"], kpi, half)
        opts = dict(num_warps=cfg["num_warps"], num_stages=cfg["num_stages"])

        def run(qa, sa):
            M = qa.shape[0]
            c = torch.empty(M, N, dtype=out_dtype, device=dev)
            programs = min(programs_max, (M + BM - 1) // BM * n_tiles)
            gemm((programs,), (_desc(TTD, qa.view(fp8), [BM, GROUP]), bd, _desc(TTD, c, [BM, BN]), sa, sb, M, N, K,
                               nkb, ssbn, programs) + tail, spec=(programs == 1, programs % 16 == 0), **opts)
            return c

        return run
    return None


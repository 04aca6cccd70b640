"""Block-scaled fp8 benchmarks (docs/kernels/fp8.md): the GEMM with a pre-quantised A (``fp8_gemm``), the linear
layer with its activation quant (``fp8_linear``, what r9k's vLLM dispatch runs), the activation quant alone
(``fp8_quant``) and the launch path of a Triton kernel (``launch``).

Operands: x ``[M, K]`` bf16 (standard normal), quantised per token and group of 128 (e4m3fn, fp32 scales
``[M, K/128]``); the weight ``[N, K]`` quantised per 128x128 block (scales ``[ceil(N/128), K/128]``). Where a
mode calls back to back (loop, graph, host) the weights are cycled over enough copies (2 x 60 MiB) that they
do not stay in the H200's L2. Peers:

* ``scaled_mm``: per-tensor fp8 ``torch._scaled_mm`` (unit scales, M padded to 16): the dense fp8 rate to beat,
  not the same computation (no block scales);
* ``torch_block``: torch's block-scaled ``torch._scaled_mm`` (scale_a ``[M, K/128]`` column-major for
  BlockWise1x128, scale_b ``[K/128, N/128]`` for BlockWise128x128; CUTLASS on sm90), called as vLLM's
  ``BlockWiseTorchFP8ScaledMMLinearKernel`` calls it (M padded to a multiple of 4);
* ``vllm``: vLLM's Triton kernel ``w8a8_triton_block_scaled_mm`` (what ``TritonFp8BlockScaledMMKernel`` runs, the
  class r9k's dispatch wraps); for the linear and the quant, vLLM's Triton per-token-group quant first.
"""
from __future__ import annotations

from types import SimpleNamespace

import torch
import triton
import triton.language as tl  # the launch entry's kernel annotation names it (_empty_kernel)

from benchmarks.kernels.registry import Floor, Op, Unavailable, register

L2_BYTES = 60 * 2**20


def operands(shape: dict, device: str, copies: int | None = None):
    """x (bf16), its group quant (qa, sa; sa_cm: the scales column-major too), and ``copies`` block-quantised
    weights (default: enough to exceed twice the L2 on CUDA, 1 on the CPU)."""
    import kernels.fp8 as F

    M, N, K = shape["M"], shape["N"], shape["K"]
    if copies is None:
        copies = max(1, min(8, -(-2 * L2_BYTES // (N * K)))) if str(device).startswith("cuda") else 1
    gen = torch.Generator(device="cpu").manual_seed(0)
    x = torch.randn(M, K, generator=gen).bfloat16().to(device)
    ws = [F.fp8_quant_block_weight_ref(torch.randn(N, K, generator=gen).to(device)) for _ in range(copies)]
    qa, sa = F.fp8_quant_group_ref(x)
    return SimpleNamespace(x=x, xb=x, qa=qa, sa=sa, sa_cm=sa.t().contiguous().t(), ws=ws, shape=shape)


def _cycle(a, fn):
    """One callable per weight copy: the timers take them in turn."""
    return [(lambda qb=qb, sb=sb: fn(qb, sb)) for qb, sb in a.ws]


def _block_gemm(config=None):
    def make(a):
        import kernels.fp8 as F

        return _cycle(a, lambda qb, sb: F.fp8_block_gemm(a.qa, a.sa, qb, sb, config=config))
    return make


def _vllm_block_mm():
    try:
        from vllm.model_executor.layers.quantization.utils.fp8_utils import w8a8_triton_block_scaled_mm
    except Exception as e:  # noqa: BLE001 - any import failure is the answer
        raise Unavailable(f"vLLM's w8a8_triton_block_scaled_mm does not import: {type(e).__name__}: {e}") from None
    return w8a8_triton_block_scaled_mm


def _pad_rows4(qa, sa_cm):
    """(qa, sa_cm, M, pad): A [M, K] and its column-major scales [M, K/128] padded to a multiple of 4 rows, as
    vLLM pads them for torch's block-scaled GEMM (the padded rows' output is dropped)."""
    M = qa.shape[0]
    pad = (-M) % 4
    if pad:
        ap = qa.new_empty((M + pad, qa.shape[1]))
        ap[:M] = qa
        sp = sa_cm.new_empty((sa_cm.shape[1], M + pad)).t()
        sp[:M] = sa_cm
        qa, sa_cm = ap, sp
    return qa, sa_cm, M, pad


def torch_block_mm(qa, sa_cm, qb, sb):
    """torch's block-scaled _scaled_mm as vLLM's BlockWiseTorchFP8ScaledMMLinearKernel calls it."""
    qa, sa_cm, M, pad = _pad_rows4(qa, sa_cm)
    out = torch._scaled_mm(qa, qb.t(), scale_a=sa_cm, scale_b=sb.t(), out_dtype=torch.bfloat16)
    out = out[0] if isinstance(out, tuple) else out
    return out[:M] if pad else out


def torch_f_block_mm(qa, sa_cm, qb, sb):
    """The same call through torch.nn.functional.scaled_mm (torch 2.10 on; in the H200's 2.11.0+cu130):
    BlockWise1x128 scales of A (column-major) and BlockWise128x128 of B, M padded to a multiple of 4 as above."""
    import torch.nn.functional as F

    if not hasattr(F, "scaled_mm"):
        raise Unavailable(f"torch {torch.__version__} has no torch.nn.functional.scaled_mm")
    qa, sa_cm, M, pad = _pad_rows4(qa, sa_cm)
    out = F.scaled_mm(qa, qb.t(), sa_cm, F.ScalingType.BlockWise1x128, sb.t(), F.ScalingType.BlockWise128x128,
                      output_dtype=torch.bfloat16)
    return out[:M] if pad else out


def _torch_f_block(a):
    torch_f_block_mm(a.qa[:1], a.sa_cm[:1], *a.ws[0])  # Unavailable before any timing where torch lacks it
    return _cycle(a, lambda qb, sb: torch_f_block_mm(a.qa, a.sa_cm, qb, sb))


def _no_gluon(fn):
    """``fn`` with kernels.fp8.wgmma's Gluon kernels switched off for its call (the Triton kernels ROCm and
    GPUs without Gluon run; the switch costs two attribute writes a call)."""
    import kernels.fp8.wgmma as W

    def run():
        was, W.GLUON = W.GLUON, False
        try:
            return fn()
        finally:
            W.GLUON = was
    return run


def _triton_gemm(a):
    return [_no_gluon(f) for f in _block_gemm()(a)]


def _scaled_mm(a):
    """Per-tensor fp8 _scaled_mm on e4m3fn copies of x and of each weight copy's dequantised values, M padded to
    16 (cuBLASLt wants 16-row multiples; the padded call a server would make)."""
    M, K = a.x.shape
    xa = torch.zeros(-(-M // 16) * 16, K, device=a.x.device, dtype=torch.float8_e4m3fn)
    xa[:M] = a.x.to(torch.float8_e4m3fn)
    one = torch.ones((), device=a.x.device)
    wts = [qb.t() for qb, _ in a.ws]
    return [(lambda wt=wt: torch._scaled_mm(xa, wt, scale_a=one, scale_b=one, out_dtype=torch.bfloat16))
            for wt in wts]


def _torch_block(a):
    return _cycle(a, lambda qb, sb: torch_block_mm(a.qa, a.sa_cm, qb, sb))


def _vllm_gemm(a):
    mm = _vllm_block_mm()
    return _cycle(a, lambda qb, sb: mm(a.qa, qb, a.sa, sb, [128, 128], torch.bfloat16))


def _gemm_ref(a):
    import kernels.fp8 as F

    qb, sb = a.ws[0]
    return F.fp8_block_gemm_ref(a.qa, a.sa, qb, sb, torch.float64)


def gemm_floor(s: dict) -> Floor:
    M, N, K = s["M"], s["N"], s["K"]
    by = M * K + N * K + M * N * 2 + 4 * (M * K // 128 + N * K // 128 ** 2)
    return Floor(bytes=by, flops=2 * M * N * K, bytes_ceiling="copy", flops_ceiling="fp8_mma")


SHAPES = [(1, 4096, 4096), (16, 4096, 4096), (32, 4096, 4096), (64, 4096, 4096), (128, 4096, 4096),
          (256, 4096, 4096), (512, 4096, 4096), (1024, 4096, 4096), (2048, 4096, 4096), (1, 8192, 8192),
          (16, 8192, 8192), (2048, 7168, 4096), (4096, 4096, 4096), (8192, 8192, 8192)]
# Variants: the other kernels and tiles measured against the default (docs/kernels/fp8.md, "Tried and
# rejected"); each is a config= of fp8_block_gemm.
GEMM_VARIANTS = {
    "tile": dict(kernel="tile", BM=128, BN=128, GROUP_M=8, KPI=2, num_warps=8, num_stages=3, FAST_DIV=True),
    "tile_decode": dict(kernel="tile", BM=16, BN=32, GROUP_M=1, KPI=2, num_warps=4, num_stages=4, FAST_DIV=True),
    "tma": dict(kernel="tma"),
    "small_m": dict(kernel="small_m", BM=16, BN=64, SPLIT_K="auto", REDUCE=2, num_warps=4, num_stages=3,
                    FAST_DIV=True),
    "ws0": dict(kernel="wgmma", WS=0),
    "ws1": dict(kernel="wgmma", WS=1, MODE=2),
    "ws2_bn64": dict(kernel="wgmma", WS=2, BN=64),
    "ws2_bn32": dict(kernel="wgmma", WS=2, BN=32),
    "split1": dict(kernel="wgmma_small_m", SPLIT_K=1),
    "rows_bn32": dict(kernel="wgmma_small_m", SWAP_AB=False, BN=32, num_stages=8),
    # prefill tiles that build for gfx1201 with no spill and fit its 64 KiB of LDS, the candidates to time on an
    # R9700 against the default there (kernels.fp8.gemm.AMD_TILE_PREFILL; docs/kernels/portability.md)
    "amd_64x64_s3": dict(kernel="tile", BM=64, BN=64, GROUP_M=8, KPI=1, num_warps=4, num_stages=3, FAST_DIV=True),
    "amd_64x128_s2": dict(kernel="tile", BM=64, BN=128, GROUP_M=8, KPI=1, num_warps=4, num_stages=2, FAST_DIV=True),
    "amd_64x128_s3": dict(kernel="tile", BM=64, BN=128, GROUP_M=8, KPI=1, num_warps=4, num_stages=3, FAST_DIV=True),
    "amd_64x128_w8_kpi2": dict(kernel="tile", BM=64, BN=128, GROUP_M=8, KPI=2, num_warps=8, num_stages=2,
                               FAST_DIV=True),
}


register(Op(
    name="fp8_gemm", family="fp8",
    doc="the block-scaled fp8 GEMM with a pre-quantised A (kernels.fp8.fp8_block_gemm, its default kernel for "
        "the shape) against torch's block-scaled and per-tensor _scaled_mm and vLLM's Triton kernel",
    shapes=tuple(dict(M=m, N=n, K=k) for m, n, k in SHAPES),
    build=operands, r9k=_block_gemm(), floor=gemm_floor,
    peers={"torch_block": _torch_block, "torch_f_block": _torch_f_block, "vllm": _vllm_gemm, "scaled_mm": _scaled_mm},
    variants={**{n: _block_gemm(c) for n, c in GEMM_VARIANTS.items()}, "triton": _triton_gemm},
    ref=_gemm_ref, unchecked=("scaled_mm",), tiny=dict(M=5, N=64, K=256),
    default_mode="kernel", needs="vLLM (CUDA sources) for the vllm peer",
))


def _linear(a):
    import kernels.fp8 as F

    return _cycle(a, lambda qb, sb: F.fp8_linear(a.xb, qb, sb, torch.bfloat16))


def vllm_quant(x, colmajor: bool):
    """vLLM's per-token-group quant by its Triton fallback kernels (fp8_utils, the branch it takes where its
    compiled op is not used): (q [M, K] e4m3fn, s [M, K/128] fp32, row- or column-major)."""
    try:
        from vllm.model_executor.layers.quantization.utils import fp8_utils
        from vllm.model_executor.layers.quantization.utils.quant_utils import get_fp8_min_max
    except Exception as e:  # noqa: BLE001
        raise Unavailable(f"vLLM's fp8 quant does not import: {type(e).__name__}: {e}") from None
    M, K = x.shape
    q = torch.empty(M, K, dtype=torch.float8_e4m3fn, device=x.device)
    fmin, fmax = get_fp8_min_max()
    if colmajor:
        s = torch.empty(K // 128, M, dtype=torch.float32, device=x.device).t()
        fp8_utils._per_token_group_quant_fp8_colmajor[(M * K // 128,)](
            x, q, s, 128, K, x.stride(0), s.stride(1), 1e-10, fp8_min=fmin, fp8_max=fmax, use_ue8m0=False,
            BLOCK=128, num_warps=1, num_stages=1)
    else:
        s = torch.empty(M, K // 128, dtype=torch.float32, device=x.device)
        fp8_utils._per_token_group_quant_fp8[(M * K // 128,)](
            x, q, s, 128, K, x.stride(0), 1e-10, fp8_min=fmin, fp8_max=fmax, use_ue8m0=False, BLOCK=128,
            num_warps=1, num_stages=1)
    return q, s


def _vllm_linear(a):
    mm = _vllm_block_mm()
    vllm_quant(a.xb[:1], False)  # Unavailable here, before any timing, where vLLM is absent

    def run(qb, sb):
        q, s = vllm_quant(a.xb, False)
        return mm(q, qb, s, sb, [128, 128], torch.bfloat16)
    return _cycle(a, run)


def _torch_linear(a):
    vllm_quant(a.xb[:1], True)

    def run(qb, sb):
        q, s = vllm_quant(a.xb, True)
        return torch_block_mm(q, s, qb, sb)
    return _cycle(a, run)


def _torch_f_linear(a):
    vllm_quant(a.xb[:1], True)
    torch_f_block_mm(a.qa[:1], a.sa_cm[:1], *a.ws[0])

    def run(qb, sb):
        q, s = vllm_quant(a.xb, True)
        return torch_f_block_mm(q, s, qb, sb)
    return _cycle(a, run)


def linear_floor(s: dict) -> Floor:
    M, N, K = s["M"], s["N"], s["K"]
    by = M * K * 2 + N * K + M * N * 2 + 4 * N * K // 128 ** 2
    return Floor(bytes=by, flops=2 * M * N * K, bytes_ceiling="copy", flops_ceiling="fp8_mma")


register(Op(
    name="fp8_linear", family="fp8",
    doc="the fp8 linear layer, a bf16 activation in (kernels.fp8.fp8_linear: r9k's quant then its GEMM through "
        "a launch plan per weight and M bucket, what the vLLM dispatch runs) against vLLM's quant + Triton GEMM "
        "and vLLM's quant + torch's block-scaled _scaled_mm (torch) or torch.nn.functional.scaled_mm (torch_f); "
        "variant triton: r9k with the Gluon kernels off (the Triton kernels ROCm runs)",
    shapes=tuple(dict(M=m, N=n, K=k) for m, n, k in SHAPES),
    build=operands, r9k=_linear, floor=linear_floor,
    peers={"vllm": _vllm_linear, "torch": _torch_linear, "torch_f": _torch_f_linear},
    variants={"triton": lambda a: [_no_gluon(f) for f in _linear(a)]},
    ref=_gemm_ref, tiny=dict(M=5, N=64, K=256),
    modes=("loop", "graph", "eager", "kernel", "host"), default_mode="graph", needs="vLLM (CUDA sources)",
))


def quant_inputs(shape: dict, device: str):
    gen = torch.Generator(device="cpu").manual_seed(0)
    x = torch.randn(shape["M"], shape["K"], generator=gen).bfloat16().to(device)
    return SimpleNamespace(x=x, shape=shape)


def _quant(**cfg):
    def make(a):
        import kernels.fp8 as F

        return lambda: F.fp8_quant_group(a.x, **cfg)
    return make


def _vllm_quant(a):
    vllm_quant(a.x[:1], False)
    return lambda: vllm_quant(a.x, False)


def _quant_ref(a):
    import kernels.fp8 as F

    return F.fp8_quant_group_ref(a.x)[0].float()


def quant_floor(s: dict) -> Floor:
    M, K = s["M"], s["K"]
    return Floor(bytes=M * K * 2 + M * K + 4 * M * K // 128, bytes_ceiling="copy")


register(Op(
    name="fp8_quant", family="fp8", tolerance=0.0,  # bit-identical to its reference
    doc="the per-token-group-128 activation quant (kernels.fp8.fp8_quant_group; bit-identical to its reference) "
        "against vLLM's Triton quant",
    shapes=(dict(M=16, K=4096), dict(M=4096, K=4096), dict(M=8192, K=8192)),
    build=quant_inputs, r9k=_quant(), floor=quant_floor, peers={"vllm": _vllm_quant},
    variants={"bm8_gpp1": _quant(BM=8, GPP=1), "bm32_gpp4": _quant(BM=32, GPP=4), "ieee_div": _quant(fast_div=False)},
    ref=_quant_ref, output=lambda r: r[0].float(), tiny=dict(M=3, K=256),
    default_mode="kernel", needs="vLLM (CUDA sources)",
))


# ============================================================================================================
# launch: the host cost of one Triton launch, through kernels/_launch.py and through Triton's JIT
# ============================================================================================================
_EMPTY = None


def _empty_kernel():
    """The empty kernel, defined on first use. Its ``tl.constexpr`` annotation is a string in this module (``from
    __future__ import annotations``) that Triton evaluates in the function's module globals: ``tl`` is imported at
    the top of the module for that (imported here, as a local, it gave ``NameError: tl`` at the first launch)."""
    global _EMPTY
    if _EMPTY is None:
        @triton.jit
        def _empty(a, b, c, d, e, f, g, h, i, j, k, l, m, n: tl.constexpr):  # noqa: E741
            pass
        _EMPTY = _empty
    return _EMPTY


def launch_inputs(shape: dict, device: str):
    t = torch.empty(16, device=device)
    return SimpleNamespace(args=(t, t, t) + tuple(range(1, 11)) + (4,), shape=shape)


def _cached_launch(a):
    from kernels._launch import launcher

    lau = launcher(_empty_kernel())
    return lambda: lau((1,), a.args)


def _jit_launch(a):
    k = _empty_kernel()
    return lambda: k[(1,)](*a.args)


def _torch_empty(a):
    return lambda: torch.empty(16, 4096, device=a.args[0].device, dtype=torch.bfloat16)


register(Op(
    name="launch", family="fp8",
    doc="the host cost of launching an empty Triton kernel of 14 arguments through kernels/_launch.py's cached "
        "compiled kernel (r9k) and through Triton's JIT dispatcher; torch.empty of 16 x 4096 bf16 for scale",
    shapes=(dict(args=14),), build=launch_inputs, r9k=_cached_launch, floor=lambda s: Floor(),
    peers={"triton_jit": _jit_launch, "torch_empty": _torch_empty}, check=lambda a, r: float("nan"),
    modes=("host", "loop"), default_mode="host", cpu=False,
))

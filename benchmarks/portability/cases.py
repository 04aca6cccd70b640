"""The calls the compile gate makes: every kernel the dispatch can launch, at the shapes of benchmarks/shapes.py,
through the code the dispatch runs (its real arguments, CPU tensors), plus the expert cache's kernels.

* GDN prefill (r9k/ops/gdn.py): ``run_core`` (what the dispatch runs for a routed core call: ``gdn_seq`` with
  the gathered state, default configuration, and its ``KC=0`` kernel) and ``gdn_conv`` with the arguments
  ``_route_conv`` passes, at a step of ``R9K_GDN_PREFILL_MAX`` tokens over 4 sequences. Layouts as vLLM 0.32's
  Qwen3-Next / Qwen3.5 GDN layer hands them over: q, k, v bf16 (the model dtype), g and beta fp32
  (``fused_post_conv_prep``), the recurrent state bf16 (``mamba_ssm_cache_dtype`` "auto": the model dtype),
  L2 norm already applied (``use_qk_l2norm_in_kernel=False``), the conv input the transpose of ``[T, dim]``
  and the conv state ``[slots, dim, W-1]`` over ``(W-1, dim)`` storage (vLLM's SD layout).
* block fp8 (r9k/ops/fp8.py): ``fp8_linear`` for every fp8 linear of the system at every M of
  :func:`benchmarks.shapes.fp8_ms` (the quant kernel and the GEMM the config table picks for that M); and
  ``fp8_block_gemm_qa`` (library code: the quant in the GEMM's A-load) at the decode and first prefill M of the
  system's first linear, for its rows of the table.
* the expert cache (kernels/moe/cache.py, library code): an ``ExpertCache`` over the system's routed experts
  on its device path (the plan kernel and the gather-copy kernel), staging and reading through; the MoE layer's
  pointer-table GEMM (kernels/moe/ptr_gemm.py, what a read-through step of the dispatch runs in place of vLLM's
  kernel) for the w13 GEMM of the decode step, block fp8, at vLLM's default block-fp8 tile for ROCm; and
  ``moe_topk_sum`` at the decode step;
* the one-shot all-reduce (kernels/allreduce/, library code): its launch at the TP size over one decode step's
  hidden states (fp32, up to its capacity).

A case is a name and a zero-argument callable; the runner calls each under a stand-in driver
(benchmarks/portability/standin.py) and collects what compiled.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from benchmarks import shapes as S


@dataclass(frozen=True)
class Case:
    """One call of the gate: ``name`` (the kernel family and what the call is), ``system`` and ``run``."""

    name: str
    system: str
    run: Callable[[], object]


def _gdn_core_args(sys: S.System, T: int, N: int) -> dict:
    g = sys.gdn
    H, HV, K, V = g.H.value, g.HV.value, g.K.value, g.V.value
    bf = torch.bfloat16
    cu = torch.linspace(0, T, N + 1).round().to(torch.int32)
    return dict(q=torch.empty(1, T, H, K, dtype=bf), k=torch.empty(1, T, H, K, dtype=bf),
                v=torch.empty(1, T, HV, V, dtype=bf), g=torch.empty(1, T, HV, dtype=torch.float32),
                beta=torch.empty(1, T, HV, dtype=torch.float32),
                initial_state=torch.empty(N, HV, V, K, dtype=bf), output_final_state=True, cu_seqlens=cu,
                scale=K ** -0.5, use_qk_l2norm_in_kernel=False, _n=N, _t=T, _hv=HV)


def _gdn_seq(sys: S.System, T: int, N: int, **tuning) -> Callable[[], object]:
    def run():
        from kernels.gdn import gdn_seq
        from r9k.ops import gdn as ops_gdn

        a = _gdn_core_args(sys, T, N)
        if not tuning:
            return ops_gdn.run_core(a)
        return gdn_seq(a["q"], a["k"], a["v"], a["g"], a["beta"], a["initial_state"],
                       torch.arange(N, dtype=torch.int32), cu_seqlens=a["cu_seqlens"], scale=a["scale"], **tuning)
    return run


def _gdn_conv(sys: S.System, T: int, N: int) -> Callable[[], object]:
    def run():
        from kernels.gdn import gdn_conv

        dim, W = sys.gdn.conv_dim.value, sys.gdn.conv_width.value
        x = torch.empty(T, dim, dtype=torch.bfloat16).t()  # vLLM passes mixed_qkv.transpose(0, 1)
        cs = torch.empty(N, W - 1, dim, dtype=torch.bfloat16).transpose(-1, -2)
        qsl = torch.linspace(0, T, N + 1).round().to(torch.int32)
        return gdn_conv(x, torch.empty(dim, W, dtype=torch.bfloat16), None, cs, qsl,
                        cache_indices=torch.arange(N, dtype=torch.int32),
                        has_initial_state=torch.ones(N, dtype=torch.bool), activation="silu", pad_slot_id=-1,
                        null_block_id=0)
    return run


def _fp8_linear(lin: S.Linear, M: int, hidden_dtype=torch.bfloat16) -> Callable[[], object]:
    def run():
        from kernels.fp8 import fp8_linear

        N, K = lin.N.value, lin.K.value
        return fp8_linear(torch.empty(M, K, dtype=hidden_dtype), torch.empty(N, K, dtype=torch.float8_e4m3fn),
                          torch.empty((N + 127) // 128, K // 128, dtype=torch.float32), torch.bfloat16)
    return run


def _fp8_gemm_qa(lin: S.Linear, M: int) -> Callable[[], object]:
    def run():
        from kernels.fp8 import fp8_block_gemm_qa

        N, K = lin.N.value, lin.K.value
        return fp8_block_gemm_qa(torch.empty(M, K, dtype=torch.bfloat16), torch.empty(N, K, dtype=torch.float8_e4m3fn),
                                 torch.empty((N + 127) // 128, K // 128, dtype=torch.float32))
    return run


def _expert_cache(sys: S.System, read: str = "stage") -> Callable[[], object]:
    def run():
        from kernels.moe import cache as C

        ex = sys.experts
        E, k, hid, inter = ex.E.value, ex.top_k.value, ex.hidden.value, ex.inter.value
        # untouched torch.empty pages cost no memory: the launches are no-ops under the stand-in
        host = [torch.empty(E, 2 * inter, hid, dtype=torch.float8_e4m3fn),
                torch.empty(E, hid, inter, dtype=torch.float8_e4m3fn)]
        real = C.ExpertCache._device_path_possible
        # the device path's own check refuses CPU slots without the interpreter; a GPU passes it (pinned host)
        C.ExpertCache._device_path_possible = lambda self: None
        try:
            cache = C.ExpertCache(host, n_slots=ex.slots.value, max_tokens=2048, top_k=k, device="cpu",
                                  pin=False, device_plan=True, read=read)
        finally:
            C.ExpertCache._device_path_possible = real
        # a step the device path plans (T k <= the staging slots): its two kernels
        return cache.prepare(torch.zeros(_cache_tokens(sys), k, dtype=torch.int32))
    return run


#: vLLM's default tile for a block-fp8 MoE GEMM on ROCm at decode (fused_moe.get_default_config, vLLM 0.32)
PTR_GEMM_CONFIG = {"BLOCK_SIZE_M": 16, "BLOCK_SIZE_N": 128, "BLOCK_SIZE_K": 128, "GROUP_SIZE_M": 1, "SPLIT_K": 1,
                   "num_warps": 4, "num_stages": 2}


def _ptr_gemm(sys: S.System) -> Callable[[], object]:
    def run():
        import triton.language as tl

        from kernels.moe import invoke_ptr_moe

        ex = sys.experts
        E, k, hid, inter, M = ex.E.value, ex.top_k.value, ex.hidden.value, ex.inter.value, sys.decode_m.value
        cfg = PTR_GEMM_CONFIG
        em = M * k + E * (cfg["BLOCK_SIZE_M"] - 1)  # vLLM's aligned assignment's padded rows
        return invoke_ptr_moe(torch.empty(M, hid, dtype=torch.float8_e4m3fn),
                              torch.empty(1, 2 * inter, hid, dtype=torch.float8_e4m3fn),
                              torch.zeros(E, dtype=torch.int64), torch.empty(M, k, 2 * inter, dtype=torch.bfloat16),
                              torch.empty(M, hid // 128), torch.empty(1, 2 * inter // 128, hid // 128),
                              torch.zeros(E, dtype=torch.int64), None, torch.empty(em, dtype=torch.int32),
                              torch.empty(-(-em // cfg["BLOCK_SIZE_M"]), dtype=torch.int32),
                              torch.empty(1, dtype=torch.int32), False, k, cfg, tl.bfloat16, True, [128, 128],
                              False, aligned16=True)
    return run


def _cache_tokens(sys: S.System) -> int:
    """Tokens of the expert cache's step: the decode step, cut to what the device path plans in one go
    (T top_k <= the staging slots; a larger step takes the host path, which launches no kernel)."""
    return min(sys.decode_m.value, sys.experts.slots.value // sys.experts.top_k.value)


def _allreduce(sys: S.System, n: int) -> Callable[[], object]:
    def run():
        from kernels.allreduce import one_shot as A

        W = sys.tp.value
        # OneShotAllReduce's launch (its _launch) on one rank's state; the peer tables are what its
        # symmetric-memory / IPC set-up would fill (addresses only: nothing runs under the stand-in)
        ptrs = torch.zeros(W, dtype=torch.int64)
        G = _allreduce_default("blocks")
        st = A._RankState(0, ptrs, ptrs.clone(), G, "cpu")
        x = torch.empty(n, dtype=torch.float32)
        return A._launch(st, x, torch.empty_like(x), W, G, _allreduce_default("cap"))
    return run


def _topk_sum(sys: S.System) -> Callable[[], object]:
    def run():
        from kernels.moe import moe_topk_sum

        T, k, H = sys.decode_m.value, sys.experts.top_k.value, sys.hidden.value
        return moe_topk_sum(torch.empty(T, k, H, dtype=torch.bfloat16), torch.empty(T, k),
                            torch.empty(T, H, dtype=torch.bfloat16), torch.empty(T, 1, dtype=torch.bfloat16))
    return run


def _allreduce_default(name: str) -> int:
    """A default of OneShotAllReduce (``cap``: elements a half; ``blocks``: the fixed grid), from its signature."""
    import inspect

    from kernels.allreduce import OneShotAllReduce

    return inspect.signature(OneShotAllReduce.__init__).parameters[name].default


def cases() -> list[Case]:
    """Every call of the gate, in a fixed order."""
    out: list[Case] = []
    for sys in S.SYSTEMS:
        T, N = sys.gdn.prefill_max.value, 4
        out.append(Case(f"gdn_seq (dispatch default), T={T} N={N}", sys.name, _gdn_seq(sys, T, N)))
        out.append(Case(f"gdn_seq KC=0, T={T} N={N}", sys.name, _gdn_seq(sys, T, N, KC=0)))
        out.append(Case(f"gdn_conv, T={T} N={N}", sys.name, _gdn_conv(sys, T, N)))
        for lin in sys.linears:
            for M in S.fp8_ms(sys):
                out.append(Case(f"fp8_linear {lin.name} M={M} N={lin.N.value} K={lin.K.value}", sys.name,
                                _fp8_linear(lin, M)))
        if sys.linears:  # the GEMM with the quant in its A-load (library code: the dispatch runs fp8_linear)
            lin = sys.linears[0]
            for M in (sys.decode_m.value, sys.prefill_m[0].value):
                out.append(Case(f"fp8_block_gemm_qa (library) {lin.name} M={M} N={lin.N.value} K={lin.K.value}",
                                sys.name, _fp8_gemm_qa(lin, M)))
        if sys.experts is not None and sys.experts.slots is not None:
            out.append(Case(f"ExpertCache.prepare, {sys.experts.slots.value} slots, T={_cache_tokens(sys)}",
                            sys.name, _expert_cache(sys)))
            out.append(Case(f"ExpertCache.prepare read-through, {sys.experts.slots.value} slots, "
                            f"T={_cache_tokens(sys)}", sys.name, _expert_cache(sys, "through")))
            out.append(Case(f"invoke_ptr_moe w13 block fp8, M={sys.decode_m.value}", sys.name, _ptr_gemm(sys)))
        if sys.experts is not None:
            out.append(Case(f"moe_topk_sum T={sys.decode_m.value}", sys.name, _topk_sum(sys)))
        n = min(sys.decode_m.value * sys.hidden.value, _allreduce_default("cap"))
        out.append(Case(f"one-shot all-reduce (library), W={sys.tp.value}, {n} fp32", sys.name, _allreduce(sys, n)))
    return out


def old_prefill_tile_case() -> Case:
    """The fp8 prefill tile the GEMM defaulted to at M > 64 before the table took the target (128 x 128,
    8 warps, 3 stages, two K-blocks a turn: ``TILE_DEFAULT`` with KPI 2), at Flash-Next TP2's in_proj_qkvz:
    what the gate must fail on the AMD targets."""
    sys = S.SYSTEM_BY_NAME["fn-tp2"]
    lin = sys.linears[0]

    def run():
        from kernels.fp8 import TILE_DEFAULT, fp8_block_gemm

        M, N, K = 2048, lin.N.value, lin.K.value
        return fp8_block_gemm(torch.empty(M, K, dtype=torch.float8_e4m3fn), torch.empty(M, K // 128),
                              torch.empty(N, K, dtype=torch.float8_e4m3fn), torch.empty(N // 128, K // 128),
                              config=dict(TILE_DEFAULT, KPI=2))
    return Case(f"old fp8 prefill tile 128x128/8w/3s, M=2048 N={lin.N.value} K={lin.K.value}", sys.name, run)

"""GDN prefill benchmarks (docs/kernels/gdn.md): ``gdn_seq`` against flash-linear-attention's recurrent and chunked
cores, ``gdn_conv`` against vLLM's ``causal_conv1d_fn``, and ``gdn_prefill``: a prefill step of N sequences of L
tokens through r9k's vLLM dispatch against vLLM's own chunked core (the crossover that r9k/ops/gdn.py's
CROSSOVER table comes from).

Inputs as vLLM's Qwen3-Next / Qwen3.5 layer makes them: q, k bf16 L2-normalised, v bf16, g (log decay in
[-0.51, -0.01]) and beta fp32, the state fp32 ``[slots, HV, V, K]`` (V first; fla is called with
``state_v_first=True``, so every peer reads and writes the same layout). The fla peers need ``fla-core`` (the
``bench`` extra: ``pip install -e '.[bench]'``); the vLLM peers need vLLM's CUDA Python sources importable.
"""
from __future__ import annotations

import sys
from types import SimpleNamespace

import torch

from benchmarks.kernels.registry import Floor, Op, Unavailable, register


def _fla():
    try:
        from fla.ops.gated_delta_rule import chunk_gated_delta_rule, fused_recurrent_gated_delta_rule
    except ImportError as e:
        raise Unavailable(f"fla-core is not importable ({e}); pip install -e '.[bench]'") from None
    return chunk_gated_delta_rule, fused_recurrent_gated_delta_rule


# ============================================================================================================
# gdn_seq: the recurrence, one launch
# ============================================================================================================
def seq_inputs(shape: dict, device: str, slots: int | None = None):
    """B sequences of T tokens (fixed length, no cu_seqlens), H key heads, HV value heads, K = V head dims."""
    B, T, H, HV, K, V = (shape[k] for k in ("B", "T", "H", "HV", "K", "V"))
    gen = torch.Generator(device="cpu").manual_seed(0)
    r = lambda *s: torch.randn(*s, generator=gen)  # noqa: E731
    q = torch.nn.functional.normalize(r(B, T, H, K), dim=-1).bfloat16()
    k = torch.nn.functional.normalize(r(B, T, H, K), dim=-1).bfloat16()
    v = r(B, T, HV, V).bfloat16()
    g = -(torch.rand(B, T, HV, generator=gen) * 0.5 + 0.01)
    beta = torch.rand(B, T, HV, generator=gen)
    h0 = r(slots or B, HV, V, K) * 0.5
    idx = torch.arange(B, dtype=torch.int32)
    q, k, v, g, beta, h0, idx = (x.to(device) for x in (q, k, v, g, beta, h0, idx))
    return SimpleNamespace(q=q, k=k, v=v, g=g, beta=beta, h0=h0, idx=idx, shape=shape)


def _gdn_seq(**cfg):
    def make(a):
        from kernels.gdn import gdn_seq

        st = a.h0.clone()
        return lambda: gdn_seq(a.q, a.k, a.v, a.g, a.beta, st, a.idx, **cfg)
    return make


def _fla_recurrent(a):
    _, rec = _fla()
    h = a.h0.clone()
    return lambda: rec(q=a.q, k=a.k, v=a.v, g=a.g, beta=a.beta, initial_state=h, output_final_state=True,
                       state_v_first=True)


def _fla_chunk(a):
    chunk, _ = _fla()
    h = a.h0.clone()
    return lambda: chunk(q=a.q, k=a.k, v=a.v, g=a.g, beta=a.beta, initial_state=h, output_final_state=True,
                         state_v_first=True)


def _seq_ref(a):
    from kernels.gdn import gdn_seq_ref

    return gdn_seq_ref(a.q, a.k, a.v, a.g, a.beta, a.h0, a.idx)[0]


def seq_floor(s: dict) -> Floor:
    """Bytes: q, k, v, g, beta read once, o written once, the state read and written once. Flops: 7 fp32
    operations a state element a token (S k and S q: two FMAs; e S + u k^T: a multiply and an FMA; an FMA
    counts 2)."""
    B, T, H, HV, K, V = (s[k] for k in ("B", "T", "H", "HV", "K", "V"))
    by = 2 * B * T * H * K * 2 + 2 * B * T * HV * V * 2 + 2 * B * T * HV * 4 + 2 * B * HV * V * K * 4
    return Floor(bytes=by, flops=7 * B * T * HV * V * K, bytes_ceiling="copy", flops_ceiling="fp32_fma")


_SEQ = dict(B=1, H=16, HV=32, K=128, V=128)
# Variants: the alternatives measured against the default (docs/kernels/gdn.md, "Tried and rejected"). The
# [BV, K] entries carry KC=0: without it gdn_seq's GPU default KC=4 would run the [KC, BV, K/KC] kernel.
SEQ_VARIANTS = {
    "bv_k": dict(BV=4, U=8, num_warps=1, KC=0),                       # the [BV, K] state block
    "lookahead": dict(BV=4, U=8, num_warps=1, lookahead=True, KC=0),  # one-token lookahead
    "scaled": dict(BV=16, U=4, num_warps=4, KC=4, defer_decay=True),  # the scaled state, at its best tile
    "plain_bv16": dict(BV=16, U=4, num_warps=4, KC=4, defer_decay=False),
    "plain_bv8_u4": dict(BV=8, U=4, num_warps=2, KC=4, defer_decay=False),
    "chunk16": dict(chunk=16, BV=16, num_warps=4),                    # C tokens a step as matrix products
}

register(Op(
    name="gdn_seq", family="gdn",
    doc="the gated delta rule over a prefill (kernels.gdn.gdn_seq) against fla's fused recurrent and chunked "
        "cores on the same state layout",
    shapes=tuple(dict(_SEQ, T=t) for t in (16, 45, 128, 256, 512, 1024)),
    build=seq_inputs, r9k=_gdn_seq(), floor=seq_floor,
    peers={"fla_recurrent": _fla_recurrent, "fla_chunk": _fla_chunk},
    variants={n: _gdn_seq(**c) for n, c in SEQ_VARIANTS.items()},
    ref=_seq_ref, tiny=dict(B=1, T=5, H=1, HV=2, K=16, V=8),
    default_mode="kernel", needs="fla-core",
))


# ============================================================================================================
# gdn_conv: the short conv before the recurrence
# ============================================================================================================
def conv_inputs(shape: dict, device: str):
    """One sequence of T tokens with a carried state: x ``[dim, T]`` channel-last (the transpose of
    ``[T, dim]``, as vLLM passes it), dim = 2 H K + HV V channels, W taps, bf16."""
    T, W = shape["T"], shape["W"]
    dim = 2 * shape["H"] * shape["K"] + shape["HV"] * shape["V"]
    gen = torch.Generator(device="cpu").manual_seed(0)
    x = torch.randn(T, dim, generator=gen).bfloat16().to(device).t()
    w = torch.randn(dim, W, generator=gen).bfloat16().to(device)
    bias = torch.randn(dim, generator=gen).bfloat16().to(device)
    cs = torch.randn(2, dim, W - 1, generator=gen).bfloat16().to(device)
    qsl = torch.tensor([0, T], dtype=torch.int32, device=device)
    ci = torch.tensor([1], dtype=torch.int32, device=device)
    hi = torch.tensor([True], device=device)
    return SimpleNamespace(x=x, w=w, bias=bias, cs=cs, qsl=qsl, ci=ci, hi=hi, shape=shape)


def _gdn_conv(**cfg):
    def make(a):
        from kernels.gdn import gdn_conv

        cs = a.cs.clone()
        return lambda: gdn_conv(a.x, a.w, a.bias, cs, a.qsl, a.ci, a.hi, **cfg)
    return make


def _vllm_conv(a):
    try:
        from vllm.model_executor.layers.mamba.ops.causal_conv1d import causal_conv1d_fn
    except Exception as e:  # noqa: BLE001 - any import failure is the answer
        raise Unavailable(f"vLLM's causal_conv1d_fn does not import: {type(e).__name__}: {e}") from None
    cs = a.cs.clone()
    return lambda: causal_conv1d_fn(a.x, a.w, a.bias, cs, a.qsl, cache_indices=a.ci, has_initial_state=a.hi,
                                    activation="silu")


def _conv_ref(a):
    from kernels.gdn import gdn_conv_ref

    return gdn_conv_ref(a.x, a.w, a.bias, a.cs, a.qsl, a.ci, a.hi, dtype=torch.float32)[0]


def conv_floor(s: dict) -> Floor:
    dim = 2 * s["H"] * s["K"] + s["HV"] * s["V"]
    T, W = s["T"], s["W"]
    by = 2 * dim * T * 2 + dim * (W + 1) * 2 + 2 * dim * (W - 1) * 2
    return Floor(bytes=by, flops=2 * W * dim * T, bytes_ceiling="copy", flops_ceiling="fp32_fma")


register(Op(
    name="gdn_conv", family="gdn",
    doc="the causal depthwise conv1d with carried state and SiLU (kernels.gdn.gdn_conv) against vLLM's "
        "causal_conv1d_fn",
    shapes=tuple(dict(_SEQ, W=4, T=t) for t in (16, 45, 128, 256, 512, 1024)),
    build=conv_inputs, r9k=_gdn_conv(), floor=conv_floor, peers={"vllm": _vllm_conv},
    variants={"bd64_bt16": _gdn_conv(BD=64, BT=16), "bd256_bt4": _gdn_conv(BD=256, BT=4)},
    ref=_conv_ref, tiny=dict(T=6, H=1, HV=2, K=4, V=4),
    default_mode="kernel", needs="vLLM (CUDA sources)",
))


# ============================================================================================================
# gdn_prefill: a prefill step through r9k's vLLM dispatch against vLLM's chunked core
# ============================================================================================================
def prefill_inputs(shape: dict, device: str):
    """N sequences of L tokens in one varlen call (T = N L), as vLLM's layer builds it: q, k already
    L2-normalised (``use_qk_l2norm_in_kernel=False``), the gathered initial states ``[N, HV, V, K]`` fp32,
    cu_seqlens int32 and, for fla, the chunk indices and offsets prepared ahead on the host."""
    N, L, H, HV = shape["N"], shape["L"], shape["H"], shape["HV"]
    K = V = shape["K"]
    T = N * L
    gen = torch.Generator(device="cpu").manual_seed(0)
    r = lambda *s: torch.randn(*s, generator=gen)  # noqa: E731
    q = torch.nn.functional.normalize(r(1, T, H, K), dim=-1).bfloat16()
    k = torch.nn.functional.normalize(r(1, T, H, K), dim=-1).bfloat16()
    v = r(1, T, HV, V).bfloat16()
    g = -(torch.rand(1, T, HV, generator=gen) * 0.5 + 0.01)
    beta = torch.rand(1, T, HV, generator=gen)
    h0 = r(N, HV, V, K) * 0.5
    cu_cpu = torch.arange(0, T + 1, L, dtype=torch.int32)
    kw = dict(q=q, k=k, v=v, g=g, beta=beta, initial_state=h0, output_final_state=True, cu_seqlens=cu_cpu,
              use_qk_l2norm_in_kernel=False)
    kw = {n: (t.to(device) if isinstance(t, torch.Tensor) else t) for n, t in kw.items()}
    try:
        from vllm.third_party.flash_linear_attention.ops.index import prepare_chunk_indices, prepare_chunk_offsets
        from vllm.third_party.flash_linear_attention.ops.utils import FLA_CHUNK_SIZE

        kw["chunk_indices"] = prepare_chunk_indices(cu_cpu, FLA_CHUNK_SIZE).to(device)
        kw["chunk_offsets"] = prepare_chunk_offsets(cu_cpu, FLA_CHUNK_SIZE).to(device)
    except Exception as e:  # noqa: BLE001 - without vLLM the peers are unavailable; r9k still runs
        kw["_no_vllm"] = f"{type(e).__name__}: {e}"
    return SimpleNamespace(kw=kw, N=N, T=T, HV=HV, shape=shape)


def _vllm_kwargs(a) -> dict:
    if "_no_vllm" in a.kw:
        raise Unavailable(f"vLLM's fla ops do not import: {a.kw['_no_vllm']}")
    return dict(a.kw, initial_state=a.kw["initial_state"].clone())


def _dispatch_r9k(a):
    """The call through r9k's dispatch as vLLM's CustomOp makes it (binding to vLLM's signature, the shape
    test, gdn_seq), every shape taken: the table decides the real crossover. Without vLLM, gdn_seq called as
    the dispatch calls it (r9k.ops.gdn.run_core)."""
    from r9k.ops import gdn as dispatch

    kw = {n: v for n, v in a.kw.items() if n != "_no_vllm"}
    kw["initial_state"] = kw["initial_state"].clone()
    dispatch.STATE.max_tokens = 1 << 30
    dispatch.CROSSOVER = ((1 << 30, 1 << 30),)
    try:
        import importlib

        sig = dispatch.signatures(importlib.import_module(dispatch.QWEN_MODULE))["qwen.core"]
    except Exception:  # noqa: BLE001 - no vLLM here: the core as the dispatch runs it
        core = dict(kw, _n=a.N, _t=a.T, _hv=a.HV)
        return lambda: dispatch.run_core(core)

    dispatch.STATE.split = "step"  # the whole step to r9k: the crossover the table measures

    def call():
        res = dispatch._route_core(sig, (), kw, lambda _: None, "triton")  # one step, never split
        if isinstance(res, str):
            raise RuntimeError(f"r9k's dispatch did not take the call (vLLM's op would have run it: route {res})")
        return res[0]
    return call


def _vllm_chunk(a):
    try:
        from tests.kernels.vllm_case import gdn_op

        op, _ = gdn_op()
    except Exception as e:  # noqa: BLE001
        raise Unavailable(f"vLLM's ChunkGatedDeltaRule cannot be built: {type(e).__name__}: {e}") from None
    kw = _vllm_kwargs(a)
    return lambda: op.forward_native(**kw)


def _vllm_recurrent(a):
    try:
        from vllm.third_party.flash_linear_attention.ops import fused_recurrent_gated_delta_rule
    except Exception as e:  # noqa: BLE001
        raise Unavailable(f"vLLM's fused recurrent kernel does not import: {type(e).__name__}: {e}") from None
    kw = _vllm_kwargs(a)
    return lambda: fused_recurrent_gated_delta_rule(q=kw["q"], k=kw["k"], v=kw["v"], g=kw["g"], beta=kw["beta"],
                                                    initial_state=kw["initial_state"], inplace_final_state=False,
                                                    cu_seqlens=kw["cu_seqlens"], use_qk_l2norm_in_kernel=False)


def _prefill_ref(a):
    from kernels.gdn import gdn_seq_ref

    kw = a.kw
    idx = torch.arange(a.N, dtype=torch.int32)
    return gdn_seq_ref(kw["q"], kw["k"], kw["v"], kw["g"], kw["beta"], kw["initial_state"], idx, kw["cu_seqlens"],
                       scale=kw["q"].shape[-1] ** -0.5)[0]


def prefill_floor(s: dict) -> Floor:
    return seq_floor(dict(B=s["N"], T=s["L"], H=s["H"], HV=s["HV"], K=s["K"], V=s["K"]))


NS = (1, 2, 4, 8, 16, 32, 64)
LS = (16, 32, 64, 128, 256, 512)
MAX_T = 4096


def crossover_report(rows: list) -> None:
    """Per head count and N, the largest L up to which r9k beat vLLM's chunked core at every measured L, in
    loop mode (calls back to back, host included: how vLLM runs the prefill core): the rows of
    r9k/ops/gdn.py's CROSSOVER."""
    loop = [r for r in rows if r["mode"] == "loop" and r["impl"] in ("r9k", "vllm_chunk") and r["us"] == r["us"]]
    if not loop:
        return
    by = {}
    for r in loop:
        s = r["shape"]
        by.setdefault((s["H"], s["HV"], s["N"]), {}).setdefault(s["L"], {})[r["impl"]] = r["us"]
    print("\ncrossover (loop mode): the largest L up to which r9k beat vLLM's chunked core at every measured L")
    for (H, HV, N), per_l in sorted(by.items()):
        best = 0
        for L in sorted(per_l):
            t = per_l[L]
            if "r9k" in t and "vllm_chunk" in t and t["r9k"] < t["vllm_chunk"]:
                best = L
            else:
                break
        print(f"  H:HV={H}:{HV} N={N:>3} (N*HV={N * HV:>5}): L <= {best}", file=sys.stdout)


register(Op(
    name="gdn_prefill", family="gdn",
    doc="a prefill step of N sequences of L tokens through r9k's vLLM dispatch (r9k.ops.gdn) against vLLM's "
        "chunked core (ChunkGatedDeltaRule.forward_native) and its fused recurrent kernel",
    shapes=tuple(dict(H=h, HV=hv, K=128, N=n, L=l) for h, hv in ((16, 32), (4, 8)) for n in NS for l in LS
                 if n * l <= MAX_T),
    build=prefill_inputs, r9k=_dispatch_r9k, floor=prefill_floor,
    peers={"vllm_chunk": _vllm_chunk, "vllm_recurrent": _vllm_recurrent},
    ref=_prefill_ref, tiny=dict(H=1, HV=2, K=16, N=2, L=3), valid=lambda s: s["N"] * s["L"] <= MAX_T,
    modes=("loop", "graph", "eager", "kernel", "host"), default_mode="loop", needs="vLLM (CUDA sources)",
    report=crossover_report,
))

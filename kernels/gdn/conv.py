"""``gdn_conv``: the short causal depthwise conv1d that precedes the recurrence in a GDN layer (the package
docstring, kernels/gdn/__init__.py, gives the function and the layouts)."""
from __future__ import annotations

import torch

from kernels._launch import launch as _launch
from kernels._util import _interpreting, cdiv, pow2
from kernels.gdn.common import PAD_SLOT_ID, _cast

try:  # the references and argument checks work without Triton
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - exercised only where triton is absent
    triton = None
    tl = None


# ============================================================================================================
# gdn_conv: causal depthwise conv1d with carried state and SiLU, varlen
# ============================================================================================================
if triton is not None:

    @triton.jit
    def _gdn_conv_kernel(
        x, w, bias, cs, cache_idx, has_init, qsl, out,
        n_seqs, dim,
        sx_d, sx_t, sw_d, sw_w, scs_n, scs_d, scs_t, so_d, so_t,
        pad_slot_id, null_block_id,
        W: tl.constexpr, CP: tl.constexpr, NP: tl.constexpr, BD: tl.constexpr, BT: tl.constexpr,
        HAS_BIAS: tl.constexpr, SILU: tl.constexpr, HAS_INIT: tl.constexpr, HAS_CACHE_IDX: tl.constexpr,
        HAS_NULL_BLOCK: tl.constexpr, RNE_FIX: tl.constexpr,
    ):
        # grid: (cdiv(dim, BD), cdiv(tokens, BT) + N). Program (d, c) takes the c-th chunk of the list of every
        # sequence's chunks of BT tokens, so a chunk never crosses a sequence start. The first chunk of a
        # sequence is the only reader of its old conv state (BT >= W-1) and so may write the new one.
        pid_d = tl.program_id(0)
        pid_c = tl.program_id(1)
        offs_n = tl.arange(0, NP)
        lo = tl.load(qsl + offs_n, mask=offs_n < n_seqs, other=0)
        hi = tl.load(qsl + offs_n + 1, mask=offs_n < n_seqs, other=0)
        nch = (hi - lo + BT - 1) // BT
        cum = tl.cumsum(nch, 0)                                  # inclusive
        total = tl.sum(nch, 0)
        if pid_c < total:
            seq = tl.sum((cum <= pid_c).to(tl.int32), 0)
            sel = offs_n == seq
            bos = tl.sum(tl.where(sel, lo, 0), 0).to(tl.int64)
            eos = tl.sum(tl.where(sel, hi, 0), 0).to(tl.int64)
            chunk = pid_c - tl.sum(tl.where(sel, cum - nch, 0), 0)
            if HAS_CACHE_IDX:
                slot = tl.load(cache_idx + seq).to(tl.int64)
            else:
                slot = seq.to(tl.int64)
            skip = slot == pad_slot_id
            if HAS_NULL_BLOCK:
                skip = skip | (slot == null_block_id)

            offs_d = pid_d * BD + tl.arange(0, BD)
            mask_d = offs_d < dim
            init = offs_d < 0                                        # [BD] (a block: see _seq_load)
            if HAS_INIT:
                init = (offs_d * 0 + tl.load(has_init + seq).to(tl.int32)) != 0
            tt = bos + chunk * BT + tl.arange(0, BT)                 # [BT] token rows
            mask_t = tt < eos
            m_out = mask_d[:, None] & mask_t[None, :]
            p_out = out + offs_d[:, None] * so_d + tt[None, :] * so_t
            if skip:
                tl.store(p_out, _cast(tl.zeros([BD, BT], dtype=tl.float32), out.dtype.element_ty, RNE_FIX), mask=m_out)
            else:
                p_cs = cs + slot * scs_n + offs_d * scs_d                # [BD]
                if HAS_BIAS:
                    acc = tl.load(bias + offs_d, mask=mask_d, other=0.0).to(tl.float32)[:, None] \
                        + tl.zeros([BD, BT], dtype=tl.float32)
                else:
                    acc = tl.zeros([BD, BT], dtype=tl.float32)
                for j in tl.static_range(W):
                    p = tt - (W - 1) + j
                    from_x = p >= bos
                    xv = tl.load(x + offs_d[:, None] * sx_d + p[None, :] * sx_t,
                                 mask=m_out & from_x[None, :], other=0.0)
                    col = (W - 1) + p - bos
                    sv = tl.load(p_cs[:, None] + col[None, :] * scs_t,
                                 mask=m_out & (~from_x)[None, :] & init[:, None], other=0.0)
                    xin = tl.where(from_x[None, :], xv.to(tl.float32), sv.to(tl.float32))
                    wj = tl.load(w + offs_d * sw_d + j * sw_w, mask=mask_d, other=0.0).to(tl.float32)
                    acc = acc + wj[:, None] * xin
                if SILU:
                    # 1 + exp(-y) in float64, rounded once to fp32: every float64 exp (libdevice, numpy, torch)
                    # rounds to the same fp32 value, where fp32 exps differ in the last bit between libraries.
                    den = (1.0 + tl.exp(-acc.to(tl.float64))).to(tl.float32)
                    acc = tl.math.div_rn(acc, den)
                tl.store(p_out, _cast(acc, out.dtype.element_ty, RNE_FIX), mask=m_out)

                if chunk == 0:
                    # New state: the last W-1 inputs of the sequence, oldest first; read everything, then write.
                    offs_c = tl.arange(0, CP)
                    mask_c = offs_c < W - 1
                    pc = eos - (W - 1) + offs_c                         # [C] token rows
                    c_from_x = pc >= bos
                    m_c = mask_d[:, None] & mask_c[None, :]
                    xc = tl.load(x + offs_d[:, None] * sx_d + pc[None, :] * sx_t,
                                 mask=m_c & c_from_x[None, :], other=0.0)
                    colc = (W - 1) + pc - bos
                    sc = tl.load(p_cs[:, None] + colc[None, :] * scs_t,
                                 mask=m_c & (~c_from_x)[None, :] & init[:, None], other=0.0)
                    new = tl.where(c_from_x[None, :], _cast(xc.to(tl.float32), cs.dtype.element_ty, RNE_FIX), sc)
                    tl.debug_barrier()
                    tl.store(p_cs[:, None] + offs_c[None, :] * scs_t, new, mask=m_c)


def gdn_conv(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    conv_states: torch.Tensor,
    query_start_loc: torch.Tensor,
    cache_indices: torch.Tensor | None = None,
    has_initial_state: torch.Tensor | None = None,
    activation: str | bool | None = "silu",
    pad_slot_id: int = PAD_SLOT_ID,
    null_block_id: int | None = None,
    out: torch.Tensor | None = None,
    BD: int = 128,
    BT: int = 8,
    num_warps: int = 4,
) -> torch.Tensor:
    """Causal depthwise conv1d with carried state (and SiLU), varlen, in one launch; conv state updated in place.

    Argument conventions are those of vLLM's ``causal_conv1d_fn``.

    Args:
        x: ``[dim, tokens]``, any strides (vLLM: channel-last, the transpose of ``[tokens, dim]``), any float.
        weight: ``[dim, W]``. bias: ``[dim]`` or None.
        conv_states: ``[slots, dim, >= W-1]``; columns ``0..W-2`` are the sequence's previous inputs, oldest
            first, read where ``has_initial_state`` and replaced by the last W-1 inputs (shifted in). Other
            columns are left alone. Its dtype is the state's (x is rounded to it when stored).
        query_start_loc: ``[N+1]`` int token offsets (cu_seqlens) into x's token axis.
        cache_indices: ``[N]`` slot per sequence (default: sequence n uses slot n); ``pad_slot_id`` (and
            ``null_block_id`` where given; vLLM's block 0) marks a sequence to skip: outputs zero, state untouched.
        has_initial_state: ``[N]`` bool; None = no sequence has one (zeros before the first token).
        activation: "silu" / "swish" / True for SiLU, None/False for none.
        out: optional ``[dim, tokens]`` output; default ``torch.empty_like(x)`` (same strides, x's dtype).
            Tokens that belong to no sequence are not written.

    Returns:
        out, ``y[d, t] = act(bias[d] + sum_j weight[d, j] * x[d, t-(W-1)+j])`` (fp32 math).
    """
    if x.dim() != 2 or weight.dim() != 2 or weight.shape[0] != x.shape[0]:
        raise ValueError(f"x must be [dim, tokens] and weight [dim, W], got {tuple(x.shape)}, {tuple(weight.shape)}")
    dim, n_tok = x.shape
    W = weight.shape[1]
    if not 2 <= W <= 8:
        raise ValueError(f"conv width {W} not supported (2..8)")
    if conv_states.dim() != 3 or conv_states.shape[1] != dim or conv_states.shape[2] < W - 1:
        raise ValueError(f"conv_states must be [slots, {dim}, >= {W - 1}], got {tuple(conv_states.shape)}")
    silu = activation in ("silu", "swish", True)
    if not silu and activation not in (None, False):
        raise ValueError(f"activation {activation!r} not supported")
    N = query_start_loc.numel() - 1
    if out is None:
        out = torch.empty_like(x)
    if N <= 0 or n_tok == 0:
        return out
    BT = max(BT, pow2(W - 1))
    grid = (cdiv(dim, BD), cdiv(n_tok, BT) + N)
    _launch(_gdn_conv_kernel, grid, (
        x, weight, bias if bias is not None else weight, conv_states,
        cache_indices if cache_indices is not None else query_start_loc,
        has_initial_state if has_initial_state is not None else query_start_loc,
        query_start_loc, out,
        N, dim,
        x.stride(0), x.stride(1), weight.stride(0), weight.stride(1),
        conv_states.stride(0), conv_states.stride(1), conv_states.stride(2), out.stride(0), out.stride(1),
        pad_slot_id, null_block_id if null_block_id is not None else pad_slot_id,
        W, max(2, pow2(W - 1)), max(2, pow2(N)), BD, BT,
        bias is not None, silu, has_initial_state is not None,
        cache_indices is not None, null_block_id is not None, _interpreting(),
    ), num_warps=num_warps, enable_fp_fusion=False)
    return out

"""The float64 references of the GDN kernels: :func:`gdn_seq_ref` (fla's naive recurrence with the state V first)
and :func:`gdn_conv_ref` (a loop over sequences and taps; in float32 it performs the kernel's operations in the
kernel's order). Plain PyTorch: they run without Triton."""
from __future__ import annotations

import torch

from kernels.gdn.common import PAD_SLOT_ID


def _cu_seqlens(T: int, B: int, cu_seqlens: torch.Tensor | None, device) -> torch.Tensor:
    if cu_seqlens is not None:
        return cu_seqlens
    if T == 0:  # B empty sequences (arange's step may not be 0)
        return torch.zeros(B + 1, dtype=torch.int32, device=device)
    return torch.arange(0, (B + 1) * T, T, dtype=torch.int32, device=device)


def gdn_seq_ref(
    q, k, v, g, beta, state, state_idx, cu_seqlens=None, scale=None, use_qk_l2norm=False,
    has_initial_state=None, pad_slot_id: int = PAD_SLOT_ID,
):
    """float64 reference of :func:`gdn_seq`, a plain loop over tokens (fla's naive recurrence, V-first state).

    Returns ``(o, new_state)``: o ``[B, T, HV, V]`` float64 (zeros for skipped sequences) and a float64 copy
    of ``state`` with the slots of the non-skipped sequences updated. The inputs are not modified.
    """
    B, T, H, K = q.shape
    HV, V = v.shape[2], v.shape[3]
    f = torch.float64
    qf, kf, vf = (x.to(f).reshape(B * T, x.shape[2], x.shape[3]) for x in (q, k, v))
    gf, bf = (x.to(f).reshape(B * T, HV) for x in (g, beta))
    cu = _cu_seqlens(T, B, cu_seqlens, "cpu").tolist()
    scale = K ** -0.5 if scale is None else scale
    new_state = state.to(f).clone()
    o = torch.zeros(B * T, HV, V, dtype=f, device=q.device)
    for n in range(len(cu) - 1):
        slot = int(state_idx[n])
        if slot == pad_slot_id or not 0 <= slot < state.shape[0]:  # skipped, as gdn_seq does
            continue
        S = new_state[slot].clone()  # [HV, V, K]
        if has_initial_state is not None and not bool(has_initial_state[n]):
            S.zero_()
        bos = min(max(cu[n], 0), B * T)  # offsets clamped to the rows, as gdn_seq does
        for t in range(bos, min(max(cu[n + 1], bos), B * T)):
            qt = qf[t].repeat_interleave(HV // H, dim=0)  # [HV, K]
            kt = kf[t].repeat_interleave(HV // H, dim=0)
            if use_qk_l2norm:
                qt = qt / torch.sqrt((qt * qt).sum(-1, keepdim=True) + 1e-6)
                kt = kt / torch.sqrt((kt * kt).sum(-1, keepdim=True) + 1e-6)
            qt = qt * scale
            S = S * torch.exp(gf[t])[:, None, None]
            u = bf[t][:, None] * (vf[t] - torch.einsum("hvk,hk->hv", S, kt))
            S = S + u[:, :, None] * kt[:, None, :]
            o[t] = torch.einsum("hvk,hk->hv", S, qt)
        new_state[slot] = S
    return o.reshape(B, T, HV, V), new_state


def gdn_conv_ref(
    x, weight, bias, conv_states, query_start_loc, cache_indices=None, has_initial_state=None,
    activation="silu", pad_slot_id: int = PAD_SLOT_ID, null_block_id=None, dtype=torch.float64,
):
    """Reference of :func:`gdn_conv`: a plain loop over sequences and taps in ``dtype``.

    With ``dtype=torch.float64`` it is the exact function; with ``torch.float32`` it performs the kernel's
    operations in the kernel's order (bias, then taps 0..W-1, one rounding each; SiLU as ``y / (1 + exp(-y))``),
    so the kernel must equal it bit for bit. Returns ``(out [dim, tokens] in dtype, new conv_states)``; skipped
    sequences get zero outputs, an empty sequence leaves its state alone, tokens outside every sequence stay NaN,
    the inputs are not modified.
    """
    dim, n_tok = x.shape
    W = weight.shape[1]
    cu = query_start_loc.tolist()
    xs = x.to(dtype)
    wd = weight.to(dtype)
    states = conv_states.clone()
    out = torch.full((dim, n_tok), float("nan"), dtype=dtype, device=x.device)
    silu = activation in ("silu", "swish", True)
    for n in range(len(cu) - 1):
        bos, eos = cu[n], cu[n + 1]
        slot = n if cache_indices is None else int(cache_indices[n])
        if slot == pad_slot_id or (null_block_id is not None and slot == null_block_id):
            out[:, bos:eos] = 0
            continue
        if eos == bos:  # an empty sequence has no program: its state stays as it was (as in vLLM's kernel)
            continue
        init = has_initial_state is not None and bool(has_initial_state[n])
        prev = conv_states[slot, :, : W - 1].to(dtype)
        if not init:
            prev = torch.zeros_like(prev)
        seq = torch.cat([prev, xs[:, bos:eos]], dim=1)  # [dim, W-1+L]
        for t in range(eos - bos):
            acc = bias.to(dtype).clone() if bias is not None else torch.zeros(dim, dtype=dtype, device=x.device)
            for j in range(W):
                acc = acc + wd[:, j] * seq[:, t + j]
            if silu:
                if dtype == torch.float64:
                    acc = acc / (1 + torch.exp(-acc))
                else:  # the kernel's SiLU: 1 + exp(-y) in float64 rounded once to dtype, then one IEEE division
                    acc = acc / (1 + torch.exp(-acc.double())).to(dtype)
            out[:, bos + t] = acc
        # the state holds inputs in the state's dtype: x rounded to it, old columns kept as they were
        raw = torch.cat([conv_states[slot, :, : W - 1] if init else torch.zeros_like(conv_states[slot, :, : W - 1]),
                         x[:, bos:eos].to(conv_states.dtype)], dim=1)
        states[slot, :, : W - 1] = raw[:, -(W - 1):]
    return out, states

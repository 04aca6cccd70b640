"""``gdn_seq``: the gated delta rule over every token of every sequence, in one launch (the package docstring,
kernels/gdn/__init__.py, gives the math and the layouts; docs/kernels/gdn.md the design and its figures).
"""
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
# gdn_seq: the gated delta rule, token by token, one launch
# ============================================================================================================
if triton is not None:

    @triton.jit
    def _seq_program(state_idx, cu_seqlens, max_T, n_slots, pad_slot_id, H: tl.constexpr, HV: tl.constexpr,
                     IS_VARLEN: tl.constexpr, RNE_FIX: tl.constexpr):
        """What a gdn_seq program works on, from its ids on the grid (cdiv(V, BV), N * HV): (V-block i_v,
        sequence i_n, value head i_hv, its key head i_h, the sequence's first row bos (int64) and length T,
        its state slot (int64), the bound of its token loops hi). Varlen: max_T is the total token count, a
        bound on every length; the offsets are clamped to [0, max_T] (a sequence past the tensors' rows is cut
        there; no access outside them, no host sync to check). Otherwise every sequence has max_T tokens. A
        slot outside [0, n_slots) comes back as pad_slot_id: the sequence is skipped like a padded one (no state
        access outside the tensor). hi is T when compiled (the sequence's own length, not the batch's token
        count) and max_T under the interpreter (RNE_FIX), which takes no tensor loop bound; the loops skip trips
        past T."""
        i_v = tl.program_id(0)
        i_nh = tl.program_id(1)
        i_n = i_nh // HV
        i_hv = i_nh % HV
        i_h = i_hv // (HV // H)
        if IS_VARLEN:
            bos = tl.minimum(tl.maximum(tl.load(cu_seqlens + i_n).to(tl.int64), 0), max_T)
            eos = tl.minimum(tl.maximum(tl.load(cu_seqlens + i_n + 1).to(tl.int64), bos), max_T)
            T = (eos - bos).to(tl.int32)
        else:
            bos = i_n.to(tl.int64) * max_T
            T = max_T
        slot = tl.load(state_idx + i_n).to(tl.int64)
        slot = tl.where((slot >= 0) & (slot < n_slots), slot, pad_slot_id)
        if RNE_FIX:
            hi = max_T
        else:
            hi = T
        return i_v, i_n, i_hv, i_h, bos, T, slot, hi

    @triton.jit
    def _seq_init_state(p_s, mask_s, has_init, i_n, HAS_INIT: tl.constexpr):
        """The state block at the pointers p_s (any shape) as fp32: loaded, or zeros for a sequence whose
        has_initial_state flag is False."""
        S = tl.zeros(p_s.shape, dtype=tl.float32)
        load_state = True
        if HAS_INIT:
            load_state = tl.load(has_init + i_n) != 0
        if load_state:
            S = tl.load(p_s, mask=mask_s, other=0.0).to(tl.float32)
        return S

    @triton.jit
    def _seq_load(q, k, v, g, beta, t, T, bos, i_h, i_hv, offs_k, offs_v, mask_k, mask_v,
                  sq_t, sq_h, sk_t, sk_h, sv_t, sv_h, sg_t, sg_h, sb_t, sb_h):
        """Token t's inputs for one (sequence, value head, V-block), in their own dtype (converted at use, so the
        prefetched registers hold bf16); zeros (g = 0) past the end,
        which makes the step an exact no-op on the state (exp(0) = 1, u = 0). offs_k / offs_v and their masks
        have the shapes of the layout: [BK] and [BV] for the [BV, K] kernel, [KC, BV, KK] and [KC, BV, 1] for
        the [KC, BV, K/KC] kernel (q, k broadcast over BV there)."""
        ok = t < T
        ok_k = (offs_k * 0 + t) < T  # block-shaped: Triton 3.9's interpreter rejects block & scalar masks
        ok_v = (offs_v * 0 + t) < T
        row = bos + t
        b_q = tl.load(q + row * sq_t + i_h * sq_h + offs_k, mask=mask_k & ok_k, other=0.0)
        b_k = tl.load(k + row * sk_t + i_h * sk_h + offs_k, mask=mask_k & ok_k, other=0.0)
        b_v = tl.load(v + row * sv_t + i_hv * sv_h + offs_v, mask=mask_v & ok_v, other=0.0)
        b_g = tl.load(g + row * sg_t + i_hv * sg_h, mask=ok, other=0.0)
        b_b = tl.load(beta + row * sb_t + i_hv * sb_h, mask=ok, other=0.0)
        return b_q, b_k, b_v, b_g, b_b

    @triton.jit
    def _seq_load_clamped(pq, pk, pv, pg, pb, t, T, Tm1, sq_t, sk_t, sv_t, sg_t, sb_t, mask_k, mask_v,
                          PTX: tl.constexpr, OFF64: tl.constexpr):
        """_seq_load for the token loop, from the sequence's base pointers (pq, pk: [KC, BV, KK] blocks of
        pointers; pv: [KC, BV, 1]; pg, pb: scalars; see _gdn_seq_kc_kernel): past the end, q, k and v are read
        from the sequence's last row (clamped at Tm1 = max(T - 1, 0): no per-element time mask, so no
        predicated loads and no zero fill in the loop) and g = 0, beta = 0, which makes the step an exact no-op
        on the state (u = 0 * (v - e a) = 0 for finite inputs). The sequence's base row is added once, outside
        the loop; the row offset within it is 32-bit unless OFF64 (the host sets it when a sequence's rows times
        a row stride can reach 2^31): 64-bit offsets with Triton's own conversion cost 45 instructions a token
        more on the scaled hot path (236 against 191, sm_90 SASS, `gdn_sass --hot`). q and k come back as fp32
        (_to_f32 with PTX), so the prefetched registers hold them converted."""
        ok = t < T
        tm = tl.minimum(t, Tm1)
        if OFF64:
            tm = tm.to(tl.int64)
        b_q = _to_f32(tl.load(pq + tm * sq_t, mask=mask_k, other=0.0), PTX)
        b_k = _to_f32(tl.load(pk + tm * sk_t, mask=mask_k, other=0.0), PTX)
        b_v = tl.load(pv + tm * sv_t, mask=mask_v, other=0.0)
        b_g = tl.load(pg + tm * sg_t, mask=ok, other=0.0)
        b_b = tl.load(pb + tm * sb_t, mask=ok, other=0.0)
        return b_q, b_k, b_v, b_g, b_b

    @triton.jit
    def _seq_prep(b_q, b_k, b_v, b_g, b_b, scale, L2NORM: tl.constexpr):
        """Token inputs to fp32 for the [BV, K] steps: q and k optionally L2-normalised (x / sqrt(|x|^2 + 1e-6),
        as fla), q scaled; returns (q, k, v, exp(g), beta)."""
        b_q = b_q.to(tl.float32)
        b_k = b_k.to(tl.float32)
        b_v = b_v.to(tl.float32)
        b_g = b_g.to(tl.float32)
        b_b = b_b.to(tl.float32)
        if L2NORM:
            b_q = b_q / tl.sqrt(tl.sum(b_q * b_q) + 1e-6)
            b_k = b_k / tl.sqrt(tl.sum(b_k * b_k) + 1e-6)
        b_q = b_q * scale
        return b_q, b_k, b_v, tl.exp(b_g), b_b

    @triton.jit
    def _seq_step(S, b_q, b_k, b_v, b_g, b_b, live, scale, L2NORM: tl.constexpr):
        """One token of the gated delta rule on the state block S [BV, BK]; returns (S_t, o_t [BV]). live: False
        for a step past the sequence's end, whose u is set to 0 outright (0 * (v - e a) is NaN once the state
        holds an inf)."""
        b_q, b_k, b_v, e, b_b = _seq_prep(b_q, b_k, b_v, b_g, b_b, scale, L2NORM)
        a = tl.sum(S * b_k[None, :], 1)          # S_{t-1} k_t        (the dependency chain)
        b = tl.sum(S * b_q[None, :], 1)          # S_{t-1} q_t        (independent of a)
        kq = tl.sum(b_k * b_q)                   # k_t . q_t          (independent of the state)
        u = tl.where(live, b_b * (b_v - e * a), 0.0)
        o = e * b + u * kq
        S = S * e + u[:, None] * b_k[None, :]
        return S, o

    @triton.jit
    def _seq_step_la(S, u_p, e_p, k_p, b_q, b_k, b_v, b_g, b_b, live, scale, L2NORM: tl.constexpr):
        """One token with a one-token lookahead. S holds S_{t-2}; the pending rank-1 update (e_p, u_p, k_p)
        turns it into S_{t-1} = e_p S_{t-2} + u_p k_p^T. The state reductions read S_{t-2}, so they do not wait
        for u_{t-1}: a_t = S_{t-1} k_t = e_p (S_{t-2} k_t) + u_p (k_p . k_t), and likewise S_{t-1} q_t. Returns
        (S_{t-1}, u_t, e_t, k_t, o_t); the same algebra as :func:`_seq_step`, in another rounding order."""
        b_q, b_k, b_v, e, b_b = _seq_prep(b_q, b_k, b_v, b_g, b_b, scale, L2NORM)
        p = tl.sum(S * b_k[None, :], 1)          # S_{t-2} k_t  (off the u chain)
        r = tl.sum(S * b_q[None, :], 1)          # S_{t-2} q_t
        kk = tl.sum(k_p * b_k)
        kq_p = tl.sum(k_p * b_q)
        kq = tl.sum(b_k * b_q)
        a = e_p * p + u_p * kk                   # S_{t-1} k_t
        bq = e_p * r + u_p * kq_p                # S_{t-1} q_t
        u = tl.where(live, b_b * (b_v - e * a), 0.0)
        o = e * bq + u * kq
        S = S * e_p + u_p[:, None] * k_p[None, :]
        return S, u, e, b_k, o

    @triton.jit
    def _gdn_seq_kernel(
        q, k, v, g, beta, o, state, state_idx, has_init, cu_seqlens, scale, max_T,
        sq_t, sq_h, sk_t, sk_h, sv_t, sv_h, sg_t, sg_h, sb_t, sb_h, so_t, so_h,
        ss_n, ss_h, ss_v,
        pad_slot_id, n_slots,
        H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
        BK: tl.constexpr, BV: tl.constexpr, U: tl.constexpr,
        L2NORM: tl.constexpr, HAS_INIT: tl.constexpr, IS_VARLEN: tl.constexpr, RNE_FIX: tl.constexpr,
        LOOKAHEAD: tl.constexpr = False,
    ):
        # grid: (cdiv(V, BV), N * HV). One program owns one [BV, K] block of one sequence's state.
        i_v, i_n, i_hv, i_h, bos, T, slot, hi = _seq_program(state_idx, cu_seqlens, max_T, n_slots, pad_slot_id,
                                                                    H, HV, IS_VARLEN, RNE_FIX)

        offs_k = tl.arange(0, BK)
        offs_v = i_v * BV + tl.arange(0, BV)
        mask_k = offs_k < K
        mask_v = offs_v < V
        mask_s = mask_v[:, None] & mask_k[None, :]
        p_o = o + i_hv * so_h + offs_v

        if slot == pad_slot_id:
            zero = tl.zeros([BV], dtype=tl.float32)
            for t in tl.range(0, hi):
                tl.store(p_o + (bos + t) * so_t, _cast(zero, o.dtype.element_ty, RNE_FIX), mask=mask_v & ((offs_v * 0 + t) < T))
        else:
            p_s = state + slot * ss_n + i_hv * ss_h + offs_v[:, None] * ss_v + offs_k[None, :]
            S = _seq_init_state(p_s, mask_s, has_init, i_n, HAS_INIT)

            # lookahead: the pending update starts as a no-op (S * 1 + 0 k^T is exact)
            u_p = tl.zeros([BV], dtype=tl.float32)
            e_p = tl.full([], 1.0, tl.float32)
            k_p = tl.zeros([BK], dtype=tl.float32)
            # Software pipeline: the U tokens of the next group are loaded while this group is computed.
            buf = ()
            for i in tl.static_range(U):
                buf = buf + (_seq_load(q, k, v, g, beta, i, T, bos, i_h, i_hv, offs_k, offs_v, mask_k, mask_v,
                                       sq_t, sq_h, sk_t, sk_h, sv_t, sv_h, sg_t, sg_h, sb_t, sb_h),)
            # Groups past T (interpreter: up to max_T) are skipped, and the masked loads make any step past T
            # an exact no-op on the state.
            for t0 in tl.range(0, hi, U):
                nxt = ()
                for i in tl.static_range(U):
                    nxt = nxt + (_seq_load(q, k, v, g, beta, t0 + U + i, T, bos, i_h, i_hv, offs_k, offs_v,
                                           mask_k, mask_v, sq_t, sq_h, sk_t, sk_h, sv_t, sv_h, sg_t, sg_h,
                                           sb_t, sb_h),)
                if t0 < T:
                    for i in tl.static_range(U):
                        b_q, b_k, b_v, b_g, b_b = buf[i]
                        if LOOKAHEAD:
                            S, u_p, e_p, k_p, b_o = _seq_step_la(S, u_p, e_p, k_p, b_q, b_k, b_v, b_g, b_b,
                                                                 t0 + i < T, scale, L2NORM)
                        else:
                            S, b_o = _seq_step(S, b_q, b_k, b_v, b_g, b_b, t0 + i < T, scale, L2NORM)
                        tl.store(p_o + (bos + t0 + i) * so_t, _cast(b_o, o.dtype.element_ty, RNE_FIX),
                                 mask=mask_v & ((offs_v * 0 + t0 + i) < T))
                buf = nxt
            if LOOKAHEAD:  # apply the last pending update
                S = S * e_p + u_p[:, None] * k_p[None, :]
            tl.store(p_s, _cast(S, state.dtype.element_ty, RNE_FIX), mask=mask_s)


    @triton.jit
    def _ksum(x):
        """Sum of a [KC, BV, KK] block over K (axes 0 and 2), kept as [1, BV, 1]."""
        return tl.sum(tl.sum(x, 2, keep_dims=True), 0, keep_dims=True)

    @triton.jit
    def _seq_step_kc(S, b_q, b_k, b_v, b_g, b_b, live, scale, L2NORM: tl.constexpr):
        """_seq_step on the [KC, BV, KK] state block; returns (S_t, o_t [KC, BV, 1]). live: False for a step past
        the sequence's end (its u is set to 0 outright: with the clamped loads, 0 * (v - e a) is NaN once
        S k overflows or v is inf)."""
        b_q, b_k, b_v, b_b = _seq_prep_kc(b_q, b_k, b_v, b_b, L2NORM)
        e = tl.exp(b_g.to(tl.float32))
        a = _ksum(S * b_k)                        # [1, BV, 1]
        # q's scale on the two sums, not on q: each lane holds K/KK elements of q, its row's copy of it
        b = _ksum(S * b_q) * scale
        kq = _ksum(b_k * b_q) * scale
        u = tl.where(live, b_b * (b_v - e * a), 0.0)   # [KC, BV, 1]
        o = e * b + u * kq
        S = S * e + u * b_k
        return S, o

    @triton.jit
    def _to_f32(x, PTX: tl.constexpr):
        """x (any shape) to fp32. PTX (compiled for NVIDIA, x bf16): one instruction an element, on the bf16
        pairs of 32-bit registers as loaded (the low half shifted up, the high half masked), where Triton's
        own conversion first unpacks each pair into 16-bit registers (PRMT, then a shift: ~2 instructions an
        element in the sm_90 SASS). Exact either way: a bf16 is the upper 16 bits of the fp32 it equals."""
        if PTX and x.dtype == tl.bfloat16:
            return tl.inline_asm_elementwise("shl.b32 $0, $2, 16;\n\tand.b32 $1, $2, 0xffff0000;", "=r,=r,r",
                                             [x], dtype=tl.float32, is_pure=True, pack=2)
        else:
            return x.to(tl.float32)

    @triton.jit
    def _seq_prep_kc(b_q, b_k, b_v, b_b, L2NORM: tl.constexpr):
        """Token inputs to fp32 for the [KC, BV, KK] steps (q, k already are: _seq_load_clamped), q and k
        optionally L2-normalised."""
        b_q = b_q.to(tl.float32)
        b_k = b_k.to(tl.float32)
        if L2NORM:
            b_q = b_q / tl.sqrt(_ksum(b_q * b_q) + 1e-6)
            b_k = b_k / tl.sqrt(_ksum(b_k * b_k) + 1e-6)
        return b_q, b_k, b_v.to(tl.float32), b_b.to(tl.float32)

    @triton.jit
    def _seq_step_kc_fast(X, c1, b_q, b_k, b_v, b_b, scale, L2NORM: tl.constexpr):
        """One token on the scaled state S = c X with the decay folded into the scalar: c1 = c exp(g_t) is
        S_t's scale, so the token costs no per-element multiply by exp(g):
        a = c1 (X k); u = beta (v - a); X += (u / c1) k^T; o = c1 (X q) (o after the update, as the definition
        o_t = S_t q_t, off the token-to-token chain since the next token's reduction reads the same X).
        The caller keeps c1 within [2^-24, 2^24] and runs it only for tokens inside the sequence (a group
        that reaches past the end takes the plain steps, see _gdn_seq_kc_kernel).
        Returns (X_t, o_t [KC, BV, 1])."""
        b_q, b_k, b_v, b_b = _seq_prep_kc(b_q, b_k, b_v, b_b, L2NORM)
        a = _ksum(X * b_k)
        u = b_b * (b_v - c1 * a)
        X = X + (u * (1.0 / c1)) * b_k
        o = _ksum(X * b_q) * (c1 * scale)
        return X, o

    @triton.jit
    def _seq_group_kc_fast(X, cs, buf, o_grp, ou, scale, U: tl.constexpr, L2NORM: tl.constexpr):
        """A group of U tokens wholly inside its sequence on the scaled state (_seq_step_kc_fast with the group's
        scales cs), their outputs gathered into o_grp [KC, BV, UP] at ou == i. Returns (X, o_grp)."""
        for i in tl.static_range(U):
            b_q, b_k, b_v, b_g, b_b = buf[i]
            X, b_o = _seq_step_kc_fast(X, cs[i], b_q, b_k, b_v, b_b, scale, L2NORM)
            o_grp = tl.where(ou == i, b_o, o_grp)
        return X, o_grp

    @triton.jit
    def _seq_step_kc_plain(S, e, b_q, b_k, b_v, b_b, live, scale, L2NORM: tl.constexpr):
        """One token on the unscaled state with o after the update (o_t = S_t q_t); e = exp(g_t); live as in
        _seq_step_kc."""
        b_q, b_k, b_v, b_b = _seq_prep_kc(b_q, b_k, b_v, b_b, L2NORM)
        S = S * e
        u = tl.where(live, b_b * (b_v - _ksum(S * b_k)), 0.0)
        S = S + u * b_k
        o = _ksum(S * b_q) * scale
        return S, o

    @triton.jit
    def _gdn_seq_kc_kernel(
        q, k, v, g, beta, o, state, state_idx, has_init, cu_seqlens, scale, max_T,
        sq_t, sq_h, sk_t, sk_h, sv_t, sv_h, sg_t, sg_h, sb_t, sb_h, so_t, so_h,
        ss_n, ss_h, ss_v,
        pad_slot_id, n_slots,
        H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
        BK: tl.constexpr, BV: tl.constexpr, U: tl.constexpr, KC: tl.constexpr,
        L2NORM: tl.constexpr, HAS_INIT: tl.constexpr, IS_VARLEN: tl.constexpr, RNE_FIX: tl.constexpr,
        DEFER: tl.constexpr, UP: tl.constexpr, PTX: tl.constexpr = False, OFF64: tl.constexpr = True,
    ):
        """gdn_seq with the state block held as [KC, BV, KK] (element (c, v, j) = S[v, c * KK + j]).
        Why: with K on one axis Triton puts all 32 lanes of a warp along K, so each K-reduction on the
        token-to-token chain takes 5 shuffle levels; splitting K into KC in-thread chunks and KK lanes lets
        the lanes spread over V too (e.g. 8 lanes on K, 4 on V: 3 levels). Same recurrence and order of tokens
        as _gdn_seq_kernel; grid (cdiv(V, BV), N * HV).

        DEFER (the scaled state, see the module docstring): S = c X; a group of U tokens starts with c folded
        into X if c is outside [2^-12, 2^12]; then the running scales c_i = c exp(g_0 + ... + g_i) are formed;
        if the group lies wholly inside its sequence and all c_i lie in [2^-24, 2^24], it runs
        _seq_step_kc_fast (|X| <= 2^24 |S|: finite for |S| up to ~2e31) and its outputs are stored as one
        [KC, BV, UP] block (UP: U's next power of two, as tl.arange needs); else (a sequence's last, partial
        group; a scale out of range) c is folded into X, the group runs _seq_step_kc_plain one token a trip of
        a loop, and c restarts at 1. The rounding order differs from _gdn_seq_kernel's.
        Without DEFER: _seq_step_kc, one output store a token. In the token loop q, k, v are read from the
        sequence's last row past its end (_seq_load_clamped), q and k converted to fp32 as they are prefetched
        (with PTX: NVIDIA's inline PTX on the bf16 pairs, _to_f32), the row offsets 32-bit unless OFF64
        (see _row_offsets_64)."""
        KK: tl.constexpr = BK // KC
        i_v, i_n, i_hv, i_h, bos, T, slot, hi = _seq_program(state_idx, cu_seqlens, max_T, n_slots, pad_slot_id,
                                                                    H, HV, IS_VARLEN, RNE_FIX)

        oc = tl.arange(0, KC)[:, None, None]
        ov = i_v * BV + tl.arange(0, BV)[None, :, None]
        oj = tl.arange(0, KK)[None, None, :]
        okk = oc * KK + oj                       # [KC, 1, KK]: the K index
        ok3 = okk + ov * 0                       # [KC, BV, KK]: loaded whole so that it shares S's layout
        ov3 = ov + oc * 0                        # [KC, BV, 1]
        mask_k3 = ok3 < K
        mask_v3 = ov3 < V
        mask_s = mask_k3 & (ov < V)
        p_o = o + i_hv * so_h + ov3
        first = oc == 0                          # o is stored by the KC = 0 copy of each row
        ou = tl.arange(0, UP)[None, None, :]     # [1, 1, UP]: a token of a group (DEFER's one store per group;
        ovg = ov + ou * 0 + oc * 0               # UP = U's next power of two, arange's need) [KC, BV, UP]
        p_og = o + i_hv * so_h + ovg

        if slot == pad_slot_id:
            zero = tl.zeros([KC, BV, 1], dtype=tl.float32)
            for t in tl.range(0, hi):
                tl.store(p_o + (bos + t) * so_t, _cast(zero, o.dtype.element_ty, RNE_FIX),
                         mask=mask_v3 & first & ((ov3 * 0 + t) < T))
        else:
            p_s = state + slot * ss_n + i_hv * ss_h + ov * ss_v + okk
            S = _seq_init_state(p_s, mask_s, has_init, i_n, HAS_INIT)
            buf = ()
            for i in tl.static_range(U):
                l_q, l_k, l_v, l_g, l_b = _seq_load(q, k, v, g, beta, i, T, bos, i_h, i_hv, ok3, ov3, mask_k3,
                                                    mask_v3, sq_t, sq_h, sk_t, sk_h, sv_t, sv_h, sg_t, sg_h, sb_t,
                                                    sb_h)
                buf = buf + ((_to_f32(l_q, PTX), _to_f32(l_k, PTX), l_v, l_g, l_b),)
            c = tl.full([], 1.0, tl.float32)     # DEFER: the state is c * S
            # the loop's loads start from the sequence's first row; for T = 0 (only the interpreter runs the
            # loop then) from the row before it, which exists whenever the batch has a token
            Tm1 = tl.maximum(T - 1, 0)
            b0 = tl.where(T > 0, bos, tl.maximum(bos - 1, 0))
            pq = q + b0 * sq_t + i_h * sq_h + ok3
            pk = k + b0 * sk_t + i_h * sk_h + ok3
            pv = v + b0 * sv_t + i_hv * sv_h + ov3
            pg = g + b0 * sg_t + i_hv * sg_h
            pb = beta + b0 * sb_t + i_hv * sb_h
            for t0 in tl.range(0, hi, U):
                nxt = ()
                for i in tl.static_range(U):
                    nxt = nxt + (_seq_load_clamped(pq, pk, pv, pg, pb, t0 + U + i, T, Tm1, sq_t, sk_t, sv_t, sg_t,
                                                   sb_t, mask_k3, mask_v3, PTX, OFF64),)
                if t0 < T:
                    if DEFER:
                        # X = S / c: a group starts with c within [2^-12, 2^12] (else c is folded into X first),
                        # so that X stays within 2^24 of S on the scaled path. The group's scales
                        # c_i = c exp(g_0 + ... + g_i): when all stay within [2^-24, 2^24] the group runs on the
                        # scaled state, else (rare: |g| of several units, g = -inf, NaN) it folds c into the
                        # state and runs plain steps, and c restarts at 1
                        if (c < 2.44140625e-4) | (c > 4096.0):
                            S = S * c
                            c = 1.0
                        cs = ()
                        ci = c
                        fast = t0 + U <= T
                        for i in tl.static_range(U):
                            ci = ci * tl.exp(buf[i][3].to(tl.float32))
                            fast = fast & (ci >= 5.960464477539063e-08) & (ci <= 16777216.0)
                            cs = cs + (ci,)
                        if fast:
                            # the group's outputs gathered into one [KC, BV, UP] block and stored once
                            o_grp = tl.zeros([KC, BV, UP], dtype=tl.float32)
                            S, o_grp = _seq_group_kc_fast(S, cs, buf, o_grp, ou, scale, U, L2NORM)
                            tl.store(p_og + (bos + t0 + ou) * so_t, _cast(o_grp, o.dtype.element_ty, RNE_FIX),
                                     mask=(ovg < V) & (oc == 0) & (ou < U))
                            c = cs[U - 1]
                        else:
                            # a sequence's last, partial group, or a scale out of range: plain steps, one token
                            # a trip of a loop (its inputs read again), so that this rare path adds the code of
                            # one step, not of U (the loop's code size is what the H200 showed costing time)
                            S = S * c
                            for j in tl.range(0, U):
                                r_q, r_k, r_v, r_g, r_b = _seq_load_clamped(pq, pk, pv, pg, pb, t0 + j, T, Tm1, sq_t,
                                                                            sk_t, sv_t, sg_t, sb_t, mask_k3, mask_v3,
                                                                            PTX, OFF64)
                                S, b_o = _seq_step_kc_plain(S, tl.exp(r_g.to(tl.float32)), r_q, r_k, r_v, r_b,
                                                            t0 + j < T, scale, L2NORM)
                                tl.store(p_o + (bos + t0 + j) * so_t, _cast(b_o, o.dtype.element_ty, RNE_FIX),
                                         mask=mask_v3 & first & ((ov3 * 0 + t0 + j) < T))
                            c = 1.0
                    else:
                        for i in tl.static_range(U):
                            b_q, b_k, b_v, b_g, b_b = buf[i]
                            S, b_o = _seq_step_kc(S, b_q, b_k, b_v, b_g, b_b, t0 + i < T, scale, L2NORM)
                            tl.store(p_o + (bos + t0 + i) * so_t, _cast(b_o, o.dtype.element_ty, RNE_FIX),
                                     mask=mask_v3 & first & ((ov3 * 0 + t0 + i) < T))
                buf = nxt
            if DEFER:
                S = S * c
            tl.store(p_s, _cast(S, state.dtype.element_ty, RNE_FIX), mask=mask_s)


    @triton.jit
    def _chunk_load(q, k, v, g, beta, c0, T, bos, i_h, i_hv, offs_c, offs_k, offs_v, mask_k, mask_v,
                    sq_t, sq_h, sk_t, sk_h, sv_t, sv_h, sg_t, sg_h, sb_t, sb_h):
        """Tokens c0 .. c0+C-1 of one (sequence, value head, V-block): q, k [C, BK], v [C, BV], g, beta [C], in
        their own dtype; zero rows (g = beta = 0) past the end, which leave the chunk's algebra exact (no
        correction, decay 1, no state change)."""
        ok = (c0 + offs_c) < T
        row = bos + c0 + offs_c
        mqk = ok[:, None] & mask_k[None, :]
        b_q = tl.load(q + row[:, None] * sq_t + i_h * sq_h + offs_k[None, :], mask=mqk, other=0.0)
        b_k = tl.load(k + row[:, None] * sk_t + i_h * sk_h + offs_k[None, :], mask=mqk, other=0.0)
        b_v = tl.load(v + row[:, None] * sv_t + i_hv * sv_h + offs_v[None, :], mask=ok[:, None] & mask_v[None, :],
                      other=0.0)
        b_g = tl.load(g + row * sg_t + i_hv * sg_h, mask=ok, other=0.0)
        b_b = tl.load(beta + row * sb_t + i_hv * sb_h, mask=ok, other=0.0)
        return b_q, b_k, b_v, b_g, b_b

    @triton.jit
    def _chunk_step(S, b_q, b_k, b_v, b_g, b_b, scale, rows, causal, strict,
                    LOG2C: tl.constexpr, L2NORM: tl.constexpr, PREC: tl.constexpr):
        """C tokens of the gated delta rule at once on the state block S [BV, BK] (fp32); returns (S_C, o [C, BV]).

        The token loop unrolled into matrix products (the WY/UT form of the delta rule: Yang et al.,
        "Parallelizing Linear Transformers with the Delta Rule over Sequence Length", arXiv:2406.06484, sec. 3;
        with the gates of arXiv:2412.06464 sec. 3.3; fla's chunk_gated_delta_rule computes the same per chunk in
        several kernels). With G_t = g_1 + ... + g_t (within the chunk) and S_0 the state before it:

            u_t = beta_t (v_t - e^{G_t} S_0 k_t - sum_{s<t} e^{G_t - G_s} (k_t . k_s) u_s)
            o_t = e^{G_t} S_0 q_t + sum_{s<=t} e^{G_t - G_s} (q_t . k_s) u_s
            S_C = e^{G_C} S_0 + sum_s e^{G_C - G_s} u_s k_s^T

        so U = (I + L)^-1 R with L_ts = beta_t e^{G_t - G_s} (k_t . k_s) (s < t) and R_t = beta_t (v_t -
        e^{G_t} S_0 k_t). The unit lower triangular I + L is inverted by block doubling: X_0 = I (its 1x1
        diagonal blocks), then for j = 0 .. log2(C)-1, with E_j the entries of L that join two 2^j-blocks of
        one 2^(j+1)-block, X_{j+1} = X_j - X_j E_j X_j (the inverse of [[A, 0], [B, D]] is [[A^-1, 0],
        [-D^-1 B A^-1, D^-1]]). That is 2 log2(C) products instead of C dependent substitution steps, and as
        stable as blocked substitution (fla's solve_tril merges its 16x16 blocks the same way); the shorter
        Neumann product (I - L)(I + L^2)(I + L^4)... is not: with repeated keys its terms grow as binomial
        coefficients and cancel (measured: 1.5e-4 relative error at C = 16, overflow at C = 32).
        Every product is an fp32 tl.dot (PREC "ieee": no TF32 rounding). The decays enter only as
        e^{G_t - G_s} with s <= t (<= 1, each a direct sum over its segment), never as e^{-G_s}, so nothing
        overflows. A NaN or Inf input makes every output of its chunk non-finite (0 * NaN in the products), not
        only those from its token on as in the token-by-token kernels; other sequences are not affected."""
        b_q = b_q.to(tl.float32)
        b_k = b_k.to(tl.float32)
        b_v = b_v.to(tl.float32)
        b_g = b_g.to(tl.float32)
        b_b = b_b.to(tl.float32)
        if L2NORM:
            b_q = b_q / tl.sqrt(tl.sum(b_q * b_q, 1) + 1e-6)[:, None]
            b_k = b_k / tl.sqrt(tl.sum(b_k * b_k, 1) + 1e-6)[:, None]
        b_q = b_q * scale
        gam = tl.cumsum(b_g, 0)                                        # [C]: G_t, a sum from the chunk start
        g_last = tl.sum(b_g, 0)
        # G_t - G_s as a direct sum over the segment (s, t] ("segsum", as Mamba2's chunked scan), not the
        # difference of two running sums, which after one large |g| loses the small ones (and gives NaN for
        # g = -inf): D[t, s] = sum_{s < r <= t} g_r
        seg = tl.cumsum(tl.where(rows[:, None] > rows[None, :], b_g[:, None], 0.0), 0)
        decay = tl.exp(tl.where(causal, seg, float("-inf")))           # [C, C], 0 above the diagonal
        kk = tl.dot(b_k, tl.trans(b_k), input_precision=PREC)         # [C, C]: k_t . k_s
        qk = tl.dot(b_q, tl.trans(b_k), input_precision=PREC)         # [C, C]: q_t . k_s
        ks = tl.dot(b_k, tl.trans(S), input_precision=PREC)           # [C, BV]: (S_0 k_t)^T
        qs = tl.dot(b_q, tl.trans(S), input_precision=PREC)           # [C, BV]: (S_0 q_t)^T
        eg = tl.exp(gam)
        L = tl.where(strict, b_b[:, None] * decay * kk, 0.0)
        u = b_b[:, None] * (b_v - eg[:, None] * ks)                    # R
        rt = rows[:, None]
        cs = rows[None, :]
        X = tl.where(rt == cs, 1.0, 0.0)                              # X_0 = I
        for j in tl.static_range(LOG2C):
            E = tl.where(((rt >> j) != (cs >> j)) & ((rt >> (j + 1)) == (cs >> (j + 1))), L, 0.0)
            X = X - tl.dot(tl.dot(X, E, input_precision=PREC), X, input_precision=PREC)
        u = tl.dot(X, u, input_precision=PREC)                         # (I + L)^-1 R
        o = eg[:, None] * qs + tl.dot(tl.where(causal, decay * qk, 0.0), u, input_precision=PREC)
        w = tl.exp(tl.sum(tl.where(rows[:, None] == (1 << LOG2C) - 1, seg, 0.0), 0))  # e^{G_C - G_s} <= 1
        S = S * tl.exp(g_last) + tl.dot(tl.trans(u * w[:, None]), b_k, input_precision=PREC)
        return S, o

    @triton.jit
    def _gdn_seq_chunk_kernel(
        q, k, v, g, beta, o, state, state_idx, has_init, cu_seqlens, scale, max_T,
        sq_t, sq_h, sk_t, sk_h, sv_t, sv_h, sg_t, sg_h, sb_t, sb_h, so_t, so_h,
        ss_n, ss_h, ss_v,
        pad_slot_id, n_slots,
        H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
        BK: tl.constexpr, BV: tl.constexpr, C: tl.constexpr, LOG2C: tl.constexpr,
        L2NORM: tl.constexpr, HAS_INIT: tl.constexpr, IS_VARLEN: tl.constexpr, RNE_FIX: tl.constexpr,
        PREC: tl.constexpr, PREFETCH: tl.constexpr = True, NS: tl.constexpr = 2,
    ):
        """gdn_seq C tokens at a time (:func:`_chunk_step`), the state block [BV, K] in registers across chunks;
        the next chunk's inputs are loaded while this one is computed. Grid (cdiv(V, BV), N * HV); C, BV and
        BK >= 16 (tl.dot's smallest tile)."""
        i_v, i_n, i_hv, i_h, bos, T, slot, hi = _seq_program(state_idx, cu_seqlens, max_T, n_slots, pad_slot_id,
                                                                    H, HV, IS_VARLEN, RNE_FIX)
        offs_c = tl.arange(0, C)
        offs_k = tl.arange(0, BK)
        offs_v = i_v * BV + tl.arange(0, BV)
        mask_k = offs_k < K
        mask_v = offs_v < V
        mask_s = mask_v[:, None] & mask_k[None, :]
        p_o = o + i_hv * so_h + offs_v[None, :]
        if slot == pad_slot_id:
            zero = tl.zeros([C, BV], dtype=tl.float32)
            for c0 in tl.range(0, hi, C):
                rows = c0 + offs_c
                tl.store(p_o + (bos + rows)[:, None] * so_t, _cast(zero, o.dtype.element_ty, RNE_FIX),
                         mask=(rows < T)[:, None] & mask_v[None, :])
        else:
            p_s = state + slot * ss_n + i_hv * ss_h + offs_v[:, None] * ss_v + offs_k[None, :]
            S = _seq_init_state(p_s, mask_s, has_init, i_n, HAS_INIT)
            causal = offs_c[:, None] >= offs_c[None, :]
            strict = offs_c[:, None] > offs_c[None, :]
            if PREFETCH:  # the next chunk's inputs are loaded in registers while this one is computed
                nxt = _chunk_load(q, k, v, g, beta, 0, T, bos, i_h, i_hv, offs_c, offs_k, offs_v, mask_k, mask_v,
                                  sq_t, sq_h, sk_t, sk_h, sv_t, sv_h, sg_t, sg_h, sb_t, sb_h)
                for c0 in tl.range(0, hi, C):  # chunks past T (interpreter: up to max_T) are skipped
                    b_q, b_k, b_v, b_g, b_b = nxt
                    nxt = _chunk_load(q, k, v, g, beta, c0 + C, T, bos, i_h, i_hv, offs_c, offs_k, offs_v, mask_k,
                                      mask_v, sq_t, sq_h, sk_t, sk_h, sv_t, sv_h, sg_t, sg_h, sb_t, sb_h)
                    if c0 < T:
                        S, b_o = _chunk_step(S, b_q, b_k, b_v, b_g, b_b, scale, offs_c, causal, strict, LOG2C,
                                             L2NORM, PREC)
                        rows = c0 + offs_c
                        tl.store(p_o + (bos + rows)[:, None] * so_t, _cast(b_o, o.dtype.element_ty, RNE_FIX),
                                 mask=(rows < T)[:, None] & mask_v[None, :])
            else:  # loads left to Triton's software pipeliner (shared memory, NS stages)
                for c0 in tl.range(0, hi, C, num_stages=NS):
                    b_q, b_k, b_v, b_g, b_b = _chunk_load(q, k, v, g, beta, c0, T, bos, i_h, i_hv, offs_c, offs_k,
                                                          offs_v, mask_k, mask_v, sq_t, sq_h, sk_t, sk_h, sv_t,
                                                          sv_h, sg_t, sg_h, sb_t, sb_h)
                    if c0 < T:
                        S, b_o = _chunk_step(S, b_q, b_k, b_v, b_g, b_b, scale, offs_c, causal, strict, LOG2C,
                                             L2NORM, PREC)
                        rows = c0 + offs_c
                        tl.store(p_o + (bos + rows)[:, None] * so_t, _cast(b_o, o.dtype.element_ty, RNE_FIX),
                                 mask=(rows < T)[:, None] & mask_v[None, :])
            tl.store(p_s, _cast(S, state.dtype.element_ty, RNE_FIX), mask=mask_s)


LOOKAHEAD_DEFAULT = False  # no faster on the H200 (docs/kernels/gdn.md, "Tried and rejected")
# the [KC, BV, K/KC] kernel's step: False = the plain step (_seq_step_kc), True = the scaled state
# (_seq_step_kc_fast). With q and k converted as they are prefetched, the plain step is the faster on the H200 at
# every T measured (docs/kernels/gdn.md)
DEFER_DEFAULT = False
CHUNK_DEFAULT = 0  # tokens per step of the chunked kernel; 0 = token by token (the chunked one is slower on H200)


GPU_SEQ_CONFIG = (8, 2, 2, 4)  # (BV, num_warps, U, KC): _default_seq_config on a GPU


def _default_seq_config(V: int) -> tuple[int, int, int, int]:
    """(BV, num_warps, U, KC) for gdn_seq on a GPU: the [KC, BV, K/KC] kernel at BV = 8, 2 warps, U = 2,
    KC = 4 whatever the token count, with the plain step (:data:`DEFER_DEFAULT`). From the H200 sweep of
    2026-12-01 by kernel time (docs/kernels/gdn.md): at T = 16, 0.0095 ms (fla recurrent 0.0197) against
    0.0099 for the scaled state at BV = 16, 4 warps, U = 4 in the same run; at T = 45, 0.0214 against 0.0242;
    and the fastest of the four tiles timed at T = 128, 256 and 1024 (0.401 ms at 1024, 2.77x fla).

    Under TRITON_INTERPRET=1 the programs run one after another in Python, so fewer, larger V-blocks are
    much faster there; the arithmetic per state element is the same whatever BV is."""
    if _interpreting():
        return min(32, pow2(V)), 1, 4, 0
    BV, num_warps, U, KC = GPU_SEQ_CONFIG
    return min(BV, pow2(V)), num_warps, U, KC


def _use_ptx(x: torch.Tensor) -> bool:
    """Whether a kernel launched on x's device may use NVIDIA inline PTX (_to_f32): CUDA, not ROCm, and not
    Triton's interpreter. A CPU tensor outside the interpreter (the portability gate compiles for a target from
    CPU tensors through a stand-in driver) takes the target Triton compiles for (kernels/target.py)."""
    if _interpreting():
        return False
    if x.is_cuda:
        return torch.version.hip is None
    from kernels.target import target_of

    try:
        return target_of(x.device).backend == "cuda"
    except RuntimeError:  # no active Triton driver: nothing can launch here
        return False


def _row_offsets_64(rows: int, strides) -> bool:
    """Whether the token loop of _gdn_seq_kc_kernel needs 64-bit row offsets: True when a row index below
    ``rows`` (a bound on a sequence's length) times one of the row ``strides`` (elements) can reach 2^31."""
    return max(rows - 1, 0) * max(max(strides), 0) >= 2 ** 31


def _check_seq_args(q, k, v, g, beta, state, state_idx, cu_seqlens, has_initial_state=None):
    if q.dim() != 4 or k.shape != q.shape:
        raise ValueError(f"q, k must be [B, T, H, K] of one shape, got {tuple(q.shape)} and {tuple(k.shape)}")
    B, T, H, K = q.shape
    if v.dim() != 4 or v.shape[:2] != (B, T):
        raise ValueError(f"v must be [B, T, HV, V], got {tuple(v.shape)}")
    HV, V = v.shape[2], v.shape[3]
    if HV % H:
        raise ValueError(f"HV={HV} must be a multiple of H={H}")
    for name, x in (("g", g), ("beta", beta)):
        if x.shape != (B, T, HV):
            raise ValueError(f"{name} must be [B, T, HV] = {(B, T, HV)}, got {tuple(x.shape)}")
    if state.dim() != 4 or state.shape[1:] != (HV, V, K):
        raise ValueError(f"state must be [slots, HV, V, K] = [*, {HV}, {V}, {K}], got {tuple(state.shape)}")
    if state.stride(-1) != 1:
        raise ValueError("state must be contiguous in K")
    for name, x in (("q", q), ("k", k), ("v", v)):
        if x.stride(-1) != 1:
            raise ValueError(f"{name} must be contiguous in its last dimension")
    if cu_seqlens is not None and B != 1:
        raise ValueError("with cu_seqlens, the batch dimension must be 1 (fla's convention)")
    for name, x in (("state_idx", state_idx), ("cu_seqlens", cu_seqlens)):
        if x is not None and (x.dtype.is_floating_point or x.dtype.is_complex or x.dtype == torch.bool):
            raise ValueError(f"{name} must hold integers, got {x.dtype}")
    N = B if cu_seqlens is None else cu_seqlens.numel() - 1
    if state_idx.shape != (N,):
        raise ValueError(f"state_idx must have one index per sequence ({N}), got {tuple(state_idx.shape)}")
    if has_initial_state is not None and has_initial_state.shape != (N,):
        raise ValueError(f"has_initial_state must have one flag per sequence ({N}), "
                         f"got {tuple(has_initial_state.shape)}")
    return B, T, H, K, HV, V, N


def gdn_seq(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    state: torch.Tensor,
    state_idx: torch.Tensor,
    cu_seqlens: torch.Tensor | None = None,
    scale: float | None = None,
    use_qk_l2norm: bool = False,
    has_initial_state: torch.Tensor | None = None,
    out: torch.Tensor | None = None,
    pad_slot_id: int = PAD_SLOT_ID,
    BV: int | None = None,
    num_warps: int | None = None,
    U: int | None = None,
    lookahead: bool | None = None,
    KC: int | None = None,
    defer_decay: bool | None = None,
    chunk: int | None = None,
    chunk_precision: str = "ieee",
    num_stages: int = 2,
) -> torch.Tensor:
    """The gated delta rule over every token of every sequence, in one launch; the state updated in place.

    Args:
        q, k: ``[B, T, H, K]``, bf16/fp16/fp32, last dim contiguous (fla: ``[1, T, H, K]`` with cu_seqlens).
        v: ``[B, T, HV, V]``; HV a multiple of H (value head hv reads key head ``hv // (HV // H)``).
        g: ``[B, T, HV]``, log-space decay (the state is multiplied by ``exp(g)`` first).
        beta: ``[B, T, HV]``, the delta rule's step size, post-sigmoid.
        state: ``[slots, HV, V, K]``, fp32 or bf16 (vLLM's ``ssm_state`` layout, V first), read and written
            in place at ``state[state_idx[n]]`` for sequence ``n``.
        state_idx: ``[N]`` integer slot per sequence; ``pad_slot_id`` marks a sequence to skip (state untouched,
            outputs zero). An index outside ``[0, slots)`` is skipped the same way (checked in the kernel: no
            access outside ``state``, no host sync).
        cu_seqlens: ``[N+1]`` int32/int64 token offsets (varlen, B = 1); None: B sequences of T tokens. Offsets
            are clamped to ``[0, T]`` in the kernel (a sequence running past the rows is cut at the last row).
        scale: multiplies q; default ``K ** -0.5``.
        use_qk_l2norm: L2-normalise q and k per head first (``x / sqrt(|x|^2 + 1e-6)``, as fla).
        has_initial_state: optional ``[N]`` bool; False starts that sequence from a zero state.
        out: optional output ``[B, T, HV, V]`` (any strides, last dim contiguous); default a new tensor in
            v's dtype.
        BV, num_warps, U: tuning (V-block per program, warps per program, tokens per prefetched group).
        lookahead: compute token t's state products from S_{t-2} plus the pending rank-1 update of token
            t-1 (:func:`_seq_step_la`), which takes the K-reductions off the token-to-token dependency chain;
            default: :data:`LOOKAHEAD_DEFAULT`.
        KC: hold the state block as [KC, BV, K / KC] (:func:`_gdn_seq_kc_kernel`), a power of two dividing
            the padded K; 0 = the [BV, K] kernel; default: 4 on a GPU (:func:`_default_seq_config`), 0 under
            TRITON_INTERPRET=1 and when lookahead or chunk is asked for. Not combined with lookahead.
        defer_decay: with KC, keep the state as c * X with the decays multiplied into the scalar c
            (:func:`_seq_step_kc_fast`: no per-element multiply by exp(g) per token, o = S_t q_t after the
            update); False: the plain step (:func:`_seq_step_kc`, o from the old state). Default:
            :data:`DEFER_DEFAULT`. Given with an explicit KC=0 or chunk: ValueError; ignored where KC only
            defaults to 0 (TRITON_INTERPRET=1, lookahead).
        chunk: run C = chunk tokens per step as matrix products (:func:`_chunk_step`, the same recurrence in
            another rounding order), 16 or 32, with BV >= 16; 0 = token by token; default:
            :data:`CHUNK_DEFAULT`. Not combined with KC or lookahead.
        chunk_precision: tl.dot's input_precision in the chunked kernel: "ieee" (fp32 products) or "tf32x3".
        num_stages: the chunked kernel's input pipeline: Triton's software pipeliner with this many stages
            (shared memory), or 0 = the next chunk loaded into registers by the kernel itself; default 2.

    Raises:
        ValueError: shapes, strides or layouts that do not match the above, or an invalid tuning value.

    Returns:
        o: ``[B, T, HV, V]``, ``o_t = S_t q_t`` per head.
    """
    B, T, H, K, HV, V, N = _check_seq_args(q, k, v, g, beta, state, state_idx, cu_seqlens, has_initial_state)
    if scale is None:
        scale = K ** -0.5
    if out is None:
        out = torch.empty_like(v)
    elif out.shape != v.shape or out.stride(-1) != 1:
        raise ValueError(f"out must be {tuple(v.shape)} with a contiguous last dim, got {tuple(out.shape)}")
    dBV, dW, dU, dKC = _default_seq_config(V)
    # every tuning value is checked before any early return, so a bad one fails whatever the batch
    for name, val, lo in (("BV", BV, 1), ("num_warps", num_warps, 1), ("U", U, 1)):
        if val is not None and (isinstance(val, bool) or not isinstance(val, int) or val < lo
                                or (name != "U" and val & (val - 1))):
            raise ValueError(f"{name} must be a positive int{'' if name == 'U' else ', a power of two'}, "
                             f"got {val!r}")
    BV_asked = BV
    BV = BV or dBV
    num_warps = num_warps or dW
    U = U or dU
    BK = pow2(K)
    BV = min(BV, pow2(V))
    for name, val in (("defer_decay", defer_decay), ("lookahead", lookahead)):
        if val is not None and not isinstance(val, bool):
            raise ValueError(f"{name} must be a bool or None, got {val!r}")
    lookahead = LOOKAHEAD_DEFAULT if lookahead is None else lookahead
    chunk_asked, KC_asked = chunk, KC
    chunk = CHUNK_DEFAULT if chunk is None else chunk
    if isinstance(chunk, bool) or not isinstance(chunk, int) or chunk < 0:
        raise ValueError(f"chunk must be a non-negative int, got {chunk!r}")
    if chunk_precision not in ("ieee", "tf32x3"):
        raise ValueError(f"chunk_precision must be 'ieee' or 'tf32x3', got {chunk_precision!r}")
    if isinstance(num_stages, bool) or not isinstance(num_stages, int) or num_stages < 0:
        raise ValueError(f"num_stages must be a non-negative int, got {num_stages!r}")
    if KC is None:
        KC = 0 if lookahead or chunk else min(dKC, BK)
    if isinstance(KC, bool) or not isinstance(KC, int) or KC < 0:
        raise ValueError(f"KC must be a non-negative int, got {KC!r}")
    if chunk:
        if chunk not in (16, 32):
            # tl.dot's smallest tile is 16; at 64 the sm_90 build spills ~26k registers and 128 barely compiles
            raise ValueError(f"chunk={chunk} must be 16 or 32")
        if KC or lookahead:
            raise ValueError("chunk is not combined with KC or lookahead")
        if BV_asked is not None and BV_asked < 16:
            raise ValueError(f"the chunked kernel needs BV >= 16, got BV={BV_asked}")
        BV = max(BV, 16)
    if defer_decay is not None and (chunk_asked or KC_asked == 0):
        # asked for together with an explicit other kernel; where KC only defaulted to 0 (the interpreter's
        # default, or lookahead) it is ignored, so that one call runs on the CPU and on a GPU
        raise ValueError("defer_decay applies to the [KC, BV, K/KC] kernel only, not with KC=0 or chunk")
    if KC and not chunk:
        if KC & (KC - 1) or BK % KC:
            raise ValueError(f"KC={KC} must be a power of two dividing {BK}")
        if lookahead:
            # a one-token lookahead on the scaled state was built and timed (docs/kernels/gdn.md): no faster
            raise ValueError("KC and lookahead are not combined")
    if N == 0:
        return out
    # Flatten (B, T) to rows: with B > 1 the rows of sequence n are n*T .. n*T+T-1, as cu says.
    qf, kf, vf, of = (x.reshape(B * T, x.shape[2], x.shape[3]) if B > 1 else x[0] for x in (q, k, v, out))
    gf, bf = (x.reshape(B * T, HV) if B > 1 else x[0] for x in (g, beta))
    grid = (cdiv(V, BV), N * HV)
    # the three kernels' arguments in signature order: the tensors, scalars and strides, then the shape and
    # tile constexprs of each kernel, then the flags
    head = (qf, kf, vf, gf, bf, of, state, state_idx,
            has_initial_state if has_initial_state is not None else state_idx,
            cu_seqlens if cu_seqlens is not None else state_idx, float(scale), B * T if cu_seqlens is not None else T,
            qf.stride(0), qf.stride(1), kf.stride(0), kf.stride(1), vf.stride(0), vf.stride(1),
            gf.stride(0), gf.stride(1), bf.stride(0), bf.stride(1), of.stride(0), of.stride(1),
            state.stride(0), state.stride(1), state.stride(2),
            pad_slot_id, state.shape[0], H, HV, K, V)
    flags = (bool(use_qk_l2norm), has_initial_state is not None, cu_seqlens is not None, _interpreting())
    if chunk:
        _launch(_gdn_seq_chunk_kernel, grid, head + (max(BK, 16), BV, chunk, chunk.bit_length() - 1) + flags
                + (chunk_precision, num_stages == 0, max(num_stages, 1)), num_warps=num_warps)
    elif KC:
        defer = DEFER_DEFAULT if defer_decay is None else defer_decay
        ptx = _use_ptx(q)
        off64 = _row_offsets_64(B * T if cu_seqlens is not None else T,
                                (qf.stride(0), kf.stride(0), vf.stride(0), gf.stride(0), bf.stride(0)))
        _launch(_gdn_seq_kc_kernel, grid, head + (BK, BV, U, KC) + flags + (defer, pow2(U), ptx, off64),
                num_warps=num_warps)
    else:
        _launch(_gdn_seq_kernel, grid, head + (BK, BV, U) + flags + (lookahead,), num_warps=num_warps)
    if B > 1 and of.data_ptr() != out.data_ptr():  # pragma: no cover - reshape of a strided out copied
        out.copy_(of.view_as(out))
    return out

"""Gated DeltaNet (GDN) prefill kernels: the recurrence token by token in one launch, and the short conv.

Two Triton kernels and their float64 references:

``gdn_seq`` / ``gdn_seq_ref``
    The gated delta rule (Yang, Kautz, Hatamizadeh, "Gated Delta Networks: Improving Mamba2 with Delta Rule",
    arXiv:2412.06464, eq. 10 and sec. 3) over any number of tokens per sequence, in one launch, the state held
    in registers across tokens. Per sequence ``n`` and value head ``hv`` (key head ``h = hv // (HV // H)``), with
    the state ``S`` of shape ``[V, K]`` (vLLM's layout: V first) and fp32 arithmetic, for each token ``t``::

        q_t, k_t   <- q_t / sqrt(|q_t|^2 + 1e-6), likewise k_t      (only with use_qk_l2norm)
        q_t        <- q_t * scale                                  (scale = K ** -0.5 by default)
        S          <- S * exp(g_t)                                 (decay first; g is the log-space decay, <= 0)
        u_t        <- beta_t * (v_t - S k_t)                       ([V]: the delta rule's correction)
        S          <- S + u_t k_t^T
        o_t        <- S q_t                                        ([V])

    This is flash-linear-attention's ``naive_recurrent_gated_delta_rule`` (fla/ops/gated_delta_rule/naive.py)
    and its ``fused_recurrent_gated_delta_rule`` with ``state_v_first=True``; fla writes the state ``[K, V]``
    and ``o = q^T S``, which is the same with S transposed. The kernels evaluate the step in algebraically
    identical orders:

    * the [BV, K] kernel and the [KC, BV, K/KC] kernel's plain step (``defer_decay=False``, the GPU
      default):
      ``a = S_{t-1} k_t, b = S_{t-1} q_t, e = exp(g_t), u = beta (v - e a), o = e b + u (k_t . q_t),
      S_t = e S_{t-1} + u k_t^T``: the two reductions read the same old state and run side by side, and only
      ``a`` is on the token-to-token dependency chain;
    * the [KC, BV, K/KC] kernel on the scaled state (``defer_decay=True``, an option): ``S = c X`` with
      c a scalar, ``c' = c exp(g_t), a = c' (X k_t), u = beta (v - a), X <- X + (u / c') k_t^T,
      o = c' (X q_t)``: no per-element multiply by exp(g), o after the update (no k.q reduction). A group of
      U tokens starts with c folded into X if it is outside [2^-12, 2^12]; a group whose running scale leaves
      [2^-24, 2^24], and a sequence's last, partial group, fold c into X and run the first order with o after
      the update instead (:func:`_seq_step_kc_plain`), one token a trip.

``gdn_conv`` / ``gdn_conv_ref``
    The short causal depthwise conv1d that precedes the recurrence in a GDN layer (vLLM's ``causal_conv1d_fn``,
    vllm/model_executor/layers/mamba/ops/causal_conv1d.py), with a carried conv state, optional SiLU, varlen,
    the conv state updated in place. Per channel ``d`` and token ``t`` of a sequence, with ``x_{t-j}`` taken
    from the conv state (the sequence's previous ``W-1`` inputs, oldest first) where ``t-j`` precedes the
    sequence::

        y_t[d] = silu(bias[d] + sum_{j=0}^{W-1} w[d, j] * x_{t-(W-1)+j}[d])

    summed in that order (bias first, then taps 0..W-1), in fp32, one rounding per multiply and per add (no
    fused multiply-add), and SiLU as ``y / fp32(1 + exp(-y))`` (the denominator in float64, rounded once; the
    division IEEE), so no library's fp32 exp rounding enters: the output equals
    ``gdn_conv_ref(..., dtype=torch.float32)`` bit for bit on the CPU (interpreter) and on CUDA.

Layouts follow vLLM so that the kernels read the layer's own tensors without copies:

* q, k: ``[1, T, H, K]``; v: ``[1, T, HV, V]``; g, beta: ``[1, T, HV]`` (fla's argument convention, ``B = 1``
  with ``cu_seqlens``; ``B > 1`` without ``cu_seqlens`` means B sequences of T tokens). Any strides with the
  last dimension contiguous. bf16, fp16 or fp32; the math is fp32.
* recurrent state: ``[slots, HV, V, K]`` (fp32 or bf16), one slot per sequence by index (``state_idx``); a
  sequence whose index is ``pad_slot_id`` (vLLM's PAD_SLOT_ID, -1) is skipped: its state is not read or
  written, its outputs are zeros.
* conv: x ``[dim, tokens]`` (vLLM passes the transpose of a ``[tokens, dim]`` tensor), weight ``[dim, W]``,
  conv states ``[slots, dim, >= W-1]`` of which columns ``0..W-2`` hold the previous inputs, oldest first
  (wider states, as with speculative decoding, keep their other columns untouched), cache indices, a
  has-initial-state flag per sequence, and ``query_start_loc`` (cu_seqlens) ``[N+1]``.

Modules: :mod:`kernels.gdn.seq` (gdn_seq and its kernels), :mod:`kernels.gdn.conv` (gdn_conv),
:mod:`kernels.gdn.reference` (the float64 references), :mod:`kernels.gdn.common` (the pad slot id and the output
rounding both use). The design, the figures against fla and the alternatives measured: docs/kernels/gdn.md.
"""
from kernels.gdn.common import PAD_SLOT_ID
from kernels.gdn.conv import gdn_conv
from kernels.gdn.reference import gdn_conv_ref, gdn_seq_ref
from kernels.gdn.seq import gdn_seq

__all__ = ["gdn_seq", "gdn_seq_ref", "gdn_conv", "gdn_conv_ref", "PAD_SLOT_ID"]

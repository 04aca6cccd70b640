"""Dispatch of GDN prefill steps to r9k's kernels (kernels/gdn/: gdn_conv + gdn_seq), inside vLLM's own layer.

Where vLLM has a Gated DeltaNet layer, a prefill step runs the chunked core (fla's ``chunk_gated_delta_rule``:
several Triton kernels and glue per layer, whatever the prompt length) after ``causal_conv1d_fn``. For short
prefills the token-by-token recurrence in one launch is faster. Which calls r9k takes (``R9K_GDN_PREFILL_SPLIT``):

* ``seq`` (the default): per sequence. Each sequence of at most R9K_GDN_PREFILL_MAX tokens runs r9k's kernels,
  each longer one vLLM's, a step holding both split between them (:func:`_split_core`, :func:`_split_conv`: the
  subsets' tokens and states gathered, their own offsets and per-batch metadata, the results scattered back). Both
  sides compute a sequence independently of its batch, so a sequence's result does not depend on what it is
  batched with; a step of only short sequences runs r9k whatever its shape (beyond :data:`CROSSOVER`: the price).
  The lengths are read on the host from the copy vLLM's metadata builder makes (hooked to leave it on the device
  offsets: :func:`attach_host_offsets`), else from the device.
* ``step``: per step. A step whose shape the crossover table says r9k wins (:func:`take`) runs r9k whole.

The hooks (vLLM 0.32, vllm/model_executor/layers/mamba/gdn/):

* ``qwen_gdn_linear_attn.ChunkGatedDeltaRule.forward`` (the CustomOp the Qwen3-Next / Qwen3.5 GDN layer calls
  for its prefill core, whichever backend it selected) is wrapped: a call :func:`take` accepts runs ``gdn_seq``
  on the gathered initial state the layer passes in (updated in place and returned as the final state, which
  the layer then scatters back as before); anything else goes to the original.
* the module-level name ``causal_conv1d_fn`` in the same module, likewise with ``gdn_conv``
  (``R9K_GDN_PREFILL_CONV=r9k``; ``stock`` keeps vLLM's conv).
* olmo_gdn_linear_attn's module-level ``chunk_gated_delta_rule`` and ``causal_conv1d_fn``, the same way.
* with ``seq``, ``GDNAttentionMetadataBuilder._build_chunk_metadata`` (vllm/v1/attention/backends/gdn_attn.py),
  which receives the prefill offsets on the host and on the device: the host copy is left on the device tensor.
* where vLLM's layer has ``get_prefill_checkpoint_alignment`` (0.33), its ``__init__``: a layer built to write
  prefix-cache checkpoints with FlashInfer's kernel (called without ``ChunkGatedDeltaRule``) takes the dispatch
  out of the process and refuses the binding ``gdn.qwen.checkpoint`` (:func:`refuse_checkpointed`).
* ``QwenGatedDeltaNetAttention._warmup_prefill_kernels`` (vLLM's profile-run warm-up: a 64-token core call with
  no attention metadata, made so that fla's autotuners run before the KV cache is sized) is wrapped so that
  every core call made inside it goes to vLLM's own kernels.

The arguments of a call are bound to the signature of the function vLLM really has (``inspect.signature`` of
``ChunkGatedDeltaRule.forward_native``, of the olmo module's ``chunk_gated_delta_rule`` and of
``causal_conv1d_fn``), read at install time: a vLLM whose function lacks a parameter the dispatch reads makes
the install raise :class:`SignatureMismatch` (the provenance line then says ``failed=gdn``), never a silent
misbinding. A kernel's ValueError on a call it cannot take (a layout it does not cover) sends that call to
vLLM's op and is logged once; it never fails the step.

Only CUDA tensors are routed (or any tensor under TRITON_INTERPRET=1, for the CPU unit gates); calls the
kernels do not cover (prefix-caching conv blocks, no g/beta, other layouts) go to vLLM. ``R9K_GDN_PREFILL_MAX=0``
installs nothing and removes what an earlier install put in place: stock vLLM.
"""
from __future__ import annotations

import functools
import importlib
import inspect
import logging
import threading
import types
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any, Callable

import torch

from r9k import calls, contract, knobs

log = logging.getLogger("r9k")

QWEN_MODULE = contract.QWEN_GDN
OLMO_MODULE = contract.OLMO_GDN

#: parameters of vLLM's core call that the dispatch needs by name (the install fails without one); the others it
#: reads (scale, use_qk_l2norm_in_kernel, core_attn_out, gk, gv) take the function's own default when absent
CORE_PARAMS = contract.GDN_CORE_PARAMS
#: parameters of vLLM's ``causal_conv1d_fn`` the dispatch needs by name; the others it reads (cache_indices,
#: has_initial_state, activation, pad_slot_id, null_block_id, block_idx_last_scheduled_token, initial_state_idx)
#: are taken from the call where given (named or through ``**kwargs``), else the function's default
CONV_PARAMS = contract.GDN_CONV_PARAMS
#: the binding a layer built to write prefix-cache checkpoints with FlashInfer's kernel (vLLM 0.33) fails
CHECKPOINT_BINDING = "gdn.qwen.checkpoint"

# The crossover (docs/kernels/gdn.md; `python -m benchmarks.kernels --op gdn_prefill`, H200, loop mode: calls back to
# back, host included, fla's chunked core called the way vLLM calls it, chunk indices prepared ahead). fla's chunked
# core costs a near-flat 340-750 us a call eager (its host path; the two leases' hosts differed twofold) whatever the
# step; gdn_seq costs max(its host path, its GPU time), and its GPU time follows the step's token-heads T * HV once the
# GPU is full (~0.33 us a token at HV = 32 whatever N: issue-bound, see the doc) and the longest sequence's length when
# it is not (~0.37 us a token). Rows of (most sequence-heads N * HV, most tokens a sequence on average T / N): the
# staircase T * HV <= 16384 with T / N <= 512, where gdn_seq's GPU time stays under ~190 us, at most 0.55 of fla's eager
# time on the faster host (measured at HV = 32: r9k/stock 0.22-0.27 in every such shape). Under the per-step rule
# (R9K_GDN_PREFILL_SPLIT=step) a step is routed when it lies within a row and has at most R9K_GDN_PREFILL_MAX tokens
# (default 1024: a step's longest sequence is not known without reading the offsets back, and 1024 tokens bound it to
# ~380 us of gdn_seq however the tokens are split). The per-sequence rule (seq) does not read this table: a step of
# only short sequences runs gdn_seq beyond it (up to 1.8x fla's eager time at 4096 tokens x 32 heads).
CROSSOVER: tuple[tuple[int, int], ...] = ((32, 512), (64, 256), (128, 128), (256, 64), (512, 32), (1024, 16))


class SignatureMismatch(RuntimeError):
    """vLLM's function lacks a parameter the dispatch reads: the dispatch is not installed there."""


@dataclass
class _State:
    max_tokens: int = 0
    conv: str = "stock"
    split: str = "step"
    patches: list[tuple[Any, str, Any, bool]] = field(default_factory=list)  # (owner, attr, original, was_own)
    routed: dict[str, int] = field(default_factory=lambda: {"seq": 0, "conv": 0, "stock_seq": 0, "stock_conv": 0,
                                                            "warmup": 0, "refused_seq": 0, "refused_conv": 0,
                                                            "split_seq": 0, "split_conv": 0, "unsplit_seq": 0,
                                                            "host_read": 0})
    refused_logged: set = field(default_factory=set)


STATE = _State()
_WARMUP = threading.local()  # .depth > 0 inside vLLM's prefill warm-up


def _kernels():
    from kernels import gdn

    return gdn


def _routable(t: torch.Tensor) -> bool:
    if t.is_cuda:
        return True
    from kernels._util import _interpreting

    return _interpreting()


def take(n_seqs: int, n_tokens: int, n_heads: int) -> bool:
    """Whether a step of ``n_seqs`` sequences, ``n_tokens`` tokens in all and ``n_heads`` value heads (this
    rank's) goes to r9k: at most R9K_GDN_PREFILL_MAX tokens, and within a row of :data:`CROSSOVER` (decided from
    the shapes alone: no sequence length is read back from the device)."""
    if not 0 < n_tokens <= STATE.max_tokens or n_seqs <= 0:
        return False
    sh, per_seq = n_seqs * n_heads, n_tokens / n_seqs
    return any(sh <= max_sh and per_seq <= max_len for max_sh, max_len in CROSSOVER)


def _refused(kind: str, err: Exception) -> None:
    STATE.routed[f"refused_{kind}"] += 1
    if kind not in STATE.refused_logged:
        STATE.refused_logged.add(kind)
        log.warning("r9k gdn: gdn_%s refused a call (%s); vLLM's op runs it, as it will any such call "
                    "(logged once)", kind, err)


def _in_warmup() -> bool:
    return getattr(_WARMUP, "depth", 0) > 0


def _signature(fn: Callable, needs: tuple[str, ...], method: bool) -> inspect.Signature:
    """The signature of vLLM's ``fn`` (without ``self`` for a method); SignatureMismatch when a parameter in
    ``needs`` is missing."""
    sig = inspect.signature(fn)
    params = list(sig.parameters.values())
    if method:
        params = params[1:]
    sig = sig.replace(parameters=params)
    missing = [n for n in needs if n not in sig.parameters]
    if missing:
        raise SignatureMismatch(f"{getattr(fn, '__qualname__', fn)}{sig} has no parameter(s) {', '.join(missing)} "
                                "that the r9k GDN dispatch reads")
    return sig


# ---- the core: (q, k, v, g, beta, initial_state, output_final_state, cu_seqlens, ...) -> (o, final_state) --
@functools.lru_cache(maxsize=64)
def _identity_slots(n: int, device: torch.device) -> torch.Tensor:
    """0..n-1 on device, made once per (n, device): the gathered state's rows are the sequences' slots."""
    return torch.arange(n, dtype=torch.int32, device=device)


def _bind(sig: inspect.Signature, args: tuple, kwargs: dict) -> dict | None:
    """The call's arguments by name, the function's defaults applied and ``**kwargs`` flattened in; None when
    they do not bind."""
    try:
        ba = sig.bind(*args, **kwargs)
    except TypeError:
        return None
    ba.apply_defaults()
    a = dict(ba.arguments)
    for name, p in sig.parameters.items():
        if p.kind is inspect.Parameter.VAR_KEYWORD:
            for k, v in (a.pop(name, None) or {}).items():
                a.setdefault(k, v)
    return a


def _core_call(sig: inspect.Signature, args: tuple, kwargs: dict) -> dict | None:
    """The call's arguments by name (defaults applied) when r9k could take it, else None."""
    a = _bind(sig, args, kwargs)
    if a is None:
        return None
    q, k, v, g, beta, h0 = a["q"], a["k"], a["v"], a.get("g"), a.get("beta"), a.get("initial_state")
    if g is None or beta is None or h0 is None or a.get("gk") is not None or a.get("gv") is not None:
        return None
    if not all(isinstance(t, torch.Tensor) for t in (q, k, v, g, beta, h0)):
        return None
    if q.dim() != 4 or q.shape[0] != 1 or v.dim() != 4 or not _routable(q):
        return None
    HV, V, K = v.shape[2], v.shape[3], k.shape[3]
    if h0.dim() != 4 or tuple(h0.shape[1:]) != (HV, V, K) or h0.stride(-1) != 1 or beta.dim() != 3:
        return None
    cu = a.get("cu_seqlens")
    N = 1 if cu is None else cu.numel() - 1
    if h0.shape[0] != N:
        return None
    a["_n"], a["_t"], a["_hv"] = N, q.shape[1], HV
    return a


def run_core(a: dict) -> tuple[torch.Tensor, torch.Tensor | None]:
    """gdn_seq on a bound core call (:func:`_core_call`): the state ``initial_state`` updated in place and
    returned as the final state. Raises the kernel's ValueError for a layout it does not cover."""
    q, h0 = a["q"], a["initial_state"]
    o = _kernels().gdn_seq(q, a["k"], a["v"], a["g"], a["beta"], h0, _identity_slots(a["_n"], q.device),
                           cu_seqlens=a.get("cu_seqlens"), scale=a.get("scale"),
                           use_qk_l2norm=bool(a.get("use_qk_l2norm_in_kernel")))
    out = a.get("core_attn_out")
    if out is not None:
        out.reshape(-1)[: o.numel()].copy_(o.reshape(-1))
    return o, (h0 if a.get("output_final_state") else None)


# ---- per sequence (R9K_GDN_PREFILL_SPLIT=seq): a step's sequences split between the two kernels ----------
#: vLLM core backends whose per-batch arguments a subset can be given: fla's chunked core (its chunk indices and
#: offsets are rebuilt for the subset) and FlashInfer's (it takes none). CuteDSL's and AITER's carry metadata in
#: their own formats: a step that would need a split there goes to vLLM whole.
SPLIT_BACKENDS = ("triton", "flashinfer")
#: the attribute of a device ``cu_seqlens`` tensor that holds its host copy: (the tensor's version, offsets)
HOST_ATTR = "_r9k_host_offsets"


def attach_host_offsets(t: torch.Tensor, host: Any) -> None:
    """Keep ``host`` (the offsets of ``t`` on the host: a CPU tensor or a list) on the device tensor ``t``, so that
    the dispatch reads a step's sequence lengths without a device-to-host copy; valid while ``t`` is not written
    in place (its version counter)."""
    try:
        offs = [int(x) for x in (host.tolist() if isinstance(host, torch.Tensor) else host)]
        setattr(t, HOST_ATTR, (t._version, offs))
    except Exception as e:  # noqa: BLE001 - a missing host copy costs a device read, never the step
        log.debug("r9k gdn: host offsets not attached (%s)", e)


def _attached(t: Any) -> list[int] | None:
    held = getattr(t, HOST_ATTR, None)
    if held is None or held[0] != t._version or len(held[1]) != t.numel():
        return None
    return held[1]


def _host_offsets(cu: torch.Tensor) -> list[int]:
    """The offsets ``cu`` [N+1] on the host: the copy vLLM's metadata builder made (attached by the builder hook)
    when present and current, else read back from the device (a sync; counted in ``STATE.routed["host_read"]``)."""
    offs = _attached(cu)
    if offs is not None:
        return offs
    STATE.routed["host_read"] += 1
    return [int(x) for x in cu.tolist()]


def _parts(offs: list[int], n_tokens: int) -> tuple[list[int], list[int]] | None:
    """The sequences of at most R9K_GDN_PREFILL_MAX tokens and the longer ones (indices), or None when the offsets
    are not a varlen layout of ``n_tokens`` tokens (starting at 0, non-decreasing, ending at ``n_tokens``)."""
    if not offs or offs[0] != 0 or offs[-1] != n_tokens or any(b < a for a, b in zip(offs, offs[1:])):
        return None
    short, long = [], []
    for i, (a, b) in enumerate(zip(offs, offs[1:])):
        (short if b - a <= STATE.max_tokens else long).append(i)
    return short, long


def _to_device(values: list[int], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    t = torch.tensor(values, dtype=dtype)
    if device.type == "cuda":  # pinned, asynchronous: no wait for the stream
        return t.pin_memory().to(device, non_blocking=True)
    return t.to(device)


@dataclass
class _Subset:
    """Sequences ``seqs`` of a varlen step: their tokens' indices ``tokens`` [T'] int64 and rows ``rows`` [N'] int64
    on the device, their own offsets ``cu`` [N'+1] (device, the step's offsets' dtype) and ``host`` (a list)."""

    seqs: list[int]
    tokens: torch.Tensor
    rows: torch.Tensor
    cu: torch.Tensor
    host: list[int]


def _subset(offs: list[int], seqs: list[int], cu_dtype: torch.dtype, device: torch.device) -> _Subset:
    tokens: list[int] = []
    host = [0]
    for i in seqs:
        tokens.extend(range(offs[i], offs[i + 1]))
        host.append(host[-1] + offs[i + 1] - offs[i])
    return _Subset(seqs, _to_device(tokens, torch.int64, device), _to_device(seqs, torch.int64, device),
                   _to_device(host, cu_dtype, device), host)


@dataclass
class _Plan:
    """A split step's two subsets (``short``: gdn_seq / gdn_conv, ``long``: vLLM's), with what vLLM's op needs for
    the long one, made once a step: kept on the step's offsets tensor for its other layers (``extra``)."""

    short: _Subset
    long: _Subset
    extra: dict = field(default_factory=dict)


PLAN_ATTR = "_r9k_split_plan"


def _plan(t: torch.Tensor, offs: list[int], short: list[int], long: list[int]) -> _Plan:
    """The plan of the split of ``offs`` (the offsets of ``t``), made once and kept on ``t`` for the step's other
    layers: keyed by the offsets themselves, so a tensor reused with other offsets gets a new one."""
    key = (t.device, tuple(offs), STATE.max_tokens)
    held = getattr(t, PLAN_ATTR, None)
    if held is not None and held[0] == key:
        return held[1]
    plan = _Plan(_subset(offs, short, t.dtype, t.device), _subset(offs, long, t.dtype, t.device))
    try:
        setattr(t, PLAN_ATTR, (key, plan))
    except Exception:  # noqa: BLE001 - only the reuse is lost
        pass
    return plan


def _fla_chunk_meta(host: list[int], dtype: torch.dtype, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """fla's ``chunk_indices`` [chunks, 2] (sequence, chunk within it) and ``chunk_offsets`` [N+1] for the offsets
    ``host``, as vLLM's ``prepare_chunk_indices`` / ``prepare_chunk_offsets`` build them (fla/ops/index.py), made on
    the host and copied over."""
    mod = _import("vllm.third_party.flash_linear_attention.ops.utils")
    bt = int(getattr(mod, "FLA_CHUNK_SIZE", 64))
    counts = [-(-(b - a) // bt) for a, b in zip(host, host[1:])]
    idx = [[n, t] for n, c in enumerate(counts) for t in range(c)]
    off = [0]
    for c in counts:
        off.append(off[-1] + c)
    ci = torch.tensor(idx, dtype=dtype).reshape(-1, 2)
    co = torch.tensor(off, dtype=dtype)
    if device.type == "cuda":
        return ci.pin_memory().to(device, non_blocking=True), co.pin_memory().to(device, non_blocking=True)
    return ci.to(device), co.to(device)


def _split_core(a: dict, offs: list[int], short: list[int], long: list[int], stock: Callable[[dict], Any]):
    """A step's short sequences through gdn_seq and its long ones through vLLM's op (``stock``), each on its
    subset's gathered tokens, states and offsets; the outputs and final states scattered back into the step's
    order (the final states into ``initial_state``, returned as the final state like :func:`run_core`).
    Raises gdn_seq's ValueError before anything is written."""
    q, h0, cu = a["q"], a["initial_state"], a["cu_seqlens"]
    dev = q.device
    plan = _plan(cu, offs, short, long)
    s, lg = plan.short, plan.long

    def pick(sub: _Subset, h: torch.Tensor) -> dict:
        out = {name: (t.index_select(1, sub.tokens) if t is not None else None)
               for name, t in ((n, a[n]) for n in ("q", "k", "v", "g", "beta"))}
        out.update(initial_state=h.index_select(0, sub.rows), cu_seqlens=sub.cu, core_attn_out=None)
        return out

    rs = dict(a, **pick(s, h0), _n=len(short), _t=s.host[-1])
    o_s, _ = run_core(rs)  # the gathered states updated in place
    kw = {n: v for n, v in a.items() if not n.startswith("_")}
    kw.update(pick(lg, h0))
    if kw.get("chunk_indices") is not None or kw.get("chunk_offsets") is not None:
        if "fla" not in plan.extra:
            plan.extra["fla"] = _fla_chunk_meta(lg.host, cu.dtype, dev)
        kw["chunk_indices"], kw["chunk_offsets"] = plan.extra["fla"]
    o_l, h_l = stock(kw)
    o = torch.empty((1, a["_t"], *o_l.shape[2:]), dtype=o_l.dtype, device=dev)
    o.index_copy_(1, s.tokens, o_s.to(o.dtype))
    o.index_copy_(1, lg.tokens, o_l)
    h0.index_copy_(0, s.rows, rs["initial_state"])
    if h_l is not None:
        h0.index_copy_(0, lg.rows, h_l.to(h0.dtype))
    out = a.get("core_attn_out")
    if out is not None:
        out.reshape(-1)[: o.numel()].copy_(o.reshape(-1))
    return o, (h0 if a.get("output_final_state") else None)


def _backend(op: Any) -> str:
    """The prefill backend vLLM's ChunkGatedDeltaRule selected (``triton`` = fla's chunked core, ``flashinfer``,
    ``cutedsl``, ``aiter_flydsl``); ``triton`` for the olmo module's fla function and for ops without the
    attribute."""
    return str(getattr(op, "gdn_prefill_backend", "triton"))


#: why a call goes to vLLM whole, the route it is counted under (r9k.calls.ROUTES): ``RULE``, the dispatch's rule
#: declines it (more than R9K_GDN_PREFILL_MAX tokens, every sequence longer than it, outside the crossover under
#: ``step``); ``FALLBACK``, the rule would take it or is never read (vLLM's warm-up, a layout or backend r9k does
#: not cover, arguments that do not bind, the kernel's refusal)
RULE, FALLBACK = "rule", "vllm"
#: the routes of a split step: its short sequences r9k's, its long ones declined by the rule
SPLIT_ROUTES = ("r9k", RULE)


def _route_core(sig: inspect.Signature, args: tuple, kwargs: dict, stock: Callable[[dict], Any],
                backend: str) -> tuple[Any, tuple[str, ...]] | str:
    """The call's result and the routes that computed it (``("r9k",)`` or, a split step, :data:`SPLIT_ROUTES`),
    or the route of a call the caller runs through vLLM's op whole: :data:`RULE` or :data:`FALLBACK`.
    ``stock(kwargs)`` runs vLLM's op on named arguments (a split step's long sequences)."""
    if _in_warmup():
        STATE.routed["warmup"] += 1
        return FALLBACK
    a = _core_call(sig, args, kwargs)
    if a is None:
        return FALLBACK
    if STATE.split == "step" or a["_t"] <= STATE.max_tokens:
        if STATE.split == "step" and not take(a["_n"], a["_t"], a["_hv"]):
            return RULE
        if not 0 < a["_t"] <= STATE.max_tokens:
            return RULE
        return _run_routed(lambda: run_core(a), "seq")
    # per sequence, a step of more than R9K_GDN_PREFILL_MAX tokens: which of its sequences are short
    cu = a.get("cu_seqlens")
    if cu is None:
        return RULE  # one sequence of more than R9K_GDN_PREFILL_MAX tokens
    offs = _host_offsets(cu)
    parts = _parts(offs, a["_t"])
    if parts is None:
        return FALLBACK
    short, long = parts
    if not short:
        return RULE
    if not long:
        return _run_routed(lambda: run_core(a), "seq")
    if backend not in SPLIT_BACKENDS or a.get("aiter_prefill_metadata") is not None:
        STATE.routed["unsplit_seq"] += 1  # a backend whose per-batch metadata r9k cannot rebuild for a subset
        return FALLBACK
    got = _run_routed(lambda: _split_core(a, offs, short, long, stock), "seq")
    if isinstance(got, str):
        return got
    STATE.routed["stock_seq"] += 1
    STATE.routed["split_seq"] += 1
    return got[0], SPLIT_ROUTES


def _run_routed(fn: Callable[[], Any], kind: str) -> tuple[Any, tuple[str, ...]] | str:
    """``(fn(), ("r9k",))``, or :data:`FALLBACK` where the kernel refused the call (its ValueError, logged once)."""
    try:
        res = fn()
    except ValueError as e:  # checked before any launch: the state is untouched, vLLM's op runs the call
        _refused(kind, e)
        return FALLBACK
    STATE.routed[kind] += 1
    return res, ("r9k",)


def _routes(got: tuple[Any, tuple[str, ...]] | str) -> tuple[str, ...]:
    """The routes to count for a routing function's answer (one call each)."""
    return (got,) if isinstance(got, str) else got[1]


def _wrap_core_method(original: Callable, sig: inspect.Signature) -> Callable:
    @functools.wraps(original)
    def forward(self, *args, **kwargs):
        got = _route_core(sig, args, kwargs, lambda kw: original(self, **kw), _backend(self))
        for route in _routes(got):
            calls.count_args("gdn_seq", route, args, kwargs)
        if not isinstance(got, str):
            return got[0]
        STATE.routed["stock_seq"] += 1
        return original(self, *args, **kwargs)

    forward.__r9k_original__ = original
    return forward


def _wrap_core_function(original: Callable, sig: inspect.Signature) -> Callable:
    @functools.wraps(original)
    def chunk_gated_delta_rule(*args, **kwargs):
        got = _route_core(sig, args, kwargs, lambda kw: original(**kw), "triton")
        for route in _routes(got):
            calls.count_args("gdn_seq", route, args, kwargs)
        if not isinstance(got, str):
            return got[0]
        STATE.routed["stock_seq"] += 1
        return original(*args, **kwargs)

    chunk_gated_delta_rule.__r9k_original__ = original
    return chunk_gated_delta_rule


def _wrap_warmup(original: Callable) -> Callable:
    @functools.wraps(original)
    def _warmup_prefill_kernels(self, *args, **kwargs):
        _WARMUP.depth = getattr(_WARMUP, "depth", 0) + 1
        try:
            return original(self, *args, **kwargs)
        finally:
            _WARMUP.depth -= 1

    _warmup_prefill_kernels.__r9k_original__ = original
    return _warmup_prefill_kernels


# ---- the conv: causal_conv1d_fn(x, weight, bias, conv_states, query_start_loc, ...) -> out ---------------
#: conv parameters that carry per-sequence prefix-caching state: a call with one of them goes to vLLM whole
CONV_BLOCK_PARAMS = ("block_idx_last_scheduled_token", "initial_state_idx", "block_idx_first_scheduled_token",
                     "num_computed_tokens")


def _conv_host_offsets(qsl: torch.Tensor, md: Any) -> list[int]:
    """The conv's ``query_start_loc`` on the host. vLLM's layer passes the non-spec offsets (its decodes first, then
    its prefills) and its attention metadata; the builder hook attached the prefill offsets' host copy to
    ``metadata.prefill_query_start_loc``: the conv's offsets are those behind the decodes' one token each when the
    builder peeled the decodes off (no spec decode, some decodes), else the same. Otherwise a device read."""
    pre = _attached(getattr(md, "prefill_query_start_loc", None)) if md is not None else None
    if pre is not None:
        nd, ndt = int(getattr(md, "num_decodes", 0) or 0), int(getattr(md, "num_decode_tokens", 0) or 0)
        if getattr(md, "spec_sequence_masks", None) is None and nd > 0:
            offs = list(range(nd + 1)) + [p + ndt for p in pre[1:]] if ndt == nd else None
        else:
            offs = pre
        if offs is not None and len(offs) == qsl.numel():
            return offs
    return _host_offsets(qsl)


def _run_conv(a: dict, x: torch.Tensor, qsl: torch.Tensor, ci: torch.Tensor | None,
              his: torch.Tensor | None) -> torch.Tensor:
    """gdn_conv on ``x`` [dim, T] with the call's weight, bias, states and options; x's dtype back."""
    cs = a["conv_states"]
    x_in = x if x.dtype == cs.dtype else x.to(cs.dtype)  # vLLM's kernel computes in the state's dtype
    out = _kernels().gdn_conv(x_in, a["weight"], a.get("bias"), cs, qsl, cache_indices=ci, has_initial_state=his,
                              activation=a.get("activation", "silu"), pad_slot_id=a.get("pad_slot_id", -1),
                              null_block_id=a.get("null_block_id", 0))
    return out if out.dtype == x.dtype else out.to(x.dtype)


def _route_conv(sig: inspect.Signature, args: tuple, kwargs: dict,
                stock: Callable[[dict], Any]) -> tuple[torch.Tensor, tuple[str, ...]] | str:
    """The conv's output and the routes that computed it (as :func:`_route_core`'s), or the route of a call the
    caller runs through vLLM's conv whole: :data:`RULE` or :data:`FALLBACK`."""
    a = _bind(sig, args, kwargs)
    if a is None:
        return FALLBACK
    x, cs, qsl = a["x"], a["conv_states"], a["query_start_loc"]
    if any(a.get(n) is not None for n in CONV_BLOCK_PARAMS[:2]):
        return FALLBACK  # prefix caching writes intermediate conv blocks: vLLM's
    if not isinstance(x, torch.Tensor) or x.dim() != 2 or cs is None or qsl is None or not _routable(x):
        return FALLBACK
    ci, his = a.get("cache_indices"), a.get("has_initial_state")
    if ci is not None and ci.dim() != 1:
        return FALLBACK
    if a.get("activation", "silu") not in ("silu", "swish", True, None, False):
        return FALLBACK
    T = x.shape[1]
    if T <= 0:
        return RULE
    if STATE.split == "step" or T <= STATE.max_tokens:
        if T > STATE.max_tokens:
            return RULE
        return _run_routed(lambda: _run_conv(a, x, qsl, ci, his), "conv")
    if any(a.get(n) is not None for n in CONV_BLOCK_PARAMS):
        return FALLBACK
    offs = _conv_host_offsets(qsl, a.get("metadata"))
    parts = _parts(offs, T)
    if parts is None:
        return FALLBACK
    short, long = parts
    if not short:
        return RULE
    if not long:
        return _run_routed(lambda: _run_conv(a, x, qsl, ci, his), "conv")
    got = _run_routed(lambda: _split_conv(a, offs, short, long, stock), "conv")
    if isinstance(got, str):
        return got
    STATE.routed["stock_conv"] += 1
    STATE.routed["split_conv"] += 1
    return got[0], SPLIT_ROUTES


def _split_conv(a: dict, offs: list[int], short: list[int], long: list[int],
                stock: Callable[[dict], Any]) -> torch.Tensor:
    """The conv of a step's short sequences through gdn_conv and of its long ones through vLLM's conv (without the
    step's precomputed launch metadata, which covers the whole step), each on its subset's tokens, offsets, cache
    indices and initial-state flags (the conv states are indexed by slot: shared); outputs scattered back.
    Raises gdn_conv's ValueError before anything is written."""
    x, qsl, ci, his = a["x"], a["query_start_loc"], a.get("cache_indices"), a.get("has_initial_state")
    dev = x.device
    if ci is None:  # the states are then the sequences' own rows: keep each sequence's
        ci = torch.arange(len(offs) - 1, dtype=torch.int32, device=dev)
    plan = _plan(qsl, offs, short, long)
    s, lg = plan.short, plan.long

    def pick(sub: _Subset) -> dict:
        # tokens gathered in x's own layout ([dim, T] as the transpose of [T, dim] in vLLM's layer)
        xs = x.t().index_select(0, sub.tokens).t() if x.stride(0) == 1 else x.index_select(1, sub.tokens)
        return dict(x=xs, query_start_loc=sub.cu, cache_indices=ci.index_select(0, sub.rows),
                    has_initial_state=None if his is None else his.index_select(0, sub.rows))

    ps = pick(s)
    y_s = _run_conv(a, ps["x"], ps["query_start_loc"], ps["cache_indices"], ps["has_initial_state"])
    kw = {n: v for n, v in a.items() if not n.startswith("_")}
    kw.update(pick(lg))
    if kw.get("metadata") is not None:  # the step's launch grid: rebuilt for the subset as vLLM's builder makes it
        if "conv" not in plan.extra:
            plan.extra["conv"] = _conv_meta(lg.host, dev)
        kw["metadata"] = plan.extra["conv"]
    y_l = stock(kw)
    out = torch.empty_like(x)
    out.t().index_copy_(0, s.tokens, y_s.t().to(out.dtype))
    out.t().index_copy_(0, lg.tokens, y_l.t().to(out.dtype))
    return out


def _conv_meta(host: list[int], device: torch.device) -> Any:
    """vLLM's causal-conv launch metadata (``nums_dict``, ``batch_ptr``, ``token_chunk_offset_ptr``, made by its
    ``compute_causal_conv1d_metadata`` from host offsets, as its GDN metadata builder does) for the offsets
    ``host``; None where that function is absent (vLLM's conv then derives it, reading the offsets back)."""
    mod = _import("vllm.v1.attention.backends.utils")
    fn = getattr(mod, "compute_causal_conv1d_metadata", None)
    if fn is None:
        return None
    nums_dict, batch_ptr, token_chunk_offset_ptr = fn(torch.tensor(host, dtype=torch.int32), device=device)
    return types.SimpleNamespace(nums_dict=nums_dict, batch_ptr=batch_ptr,
                                 token_chunk_offset_ptr=token_chunk_offset_ptr)


def _wrap_conv_function(original: Callable, sig: inspect.Signature) -> Callable:
    @functools.wraps(original)
    def causal_conv1d_fn(*args, **kwargs):
        got = _route_conv(sig, args, kwargs, lambda kw: original(**kw))
        for route in _routes(got):
            calls.count_args("gdn_conv", route, args, kwargs)
        if not isinstance(got, str):
            return got[0]
        STATE.routed["stock_conv"] += 1
        return original(*args, **kwargs)

    causal_conv1d_fn.__r9k_original__ = original
    return causal_conv1d_fn


# ---- the host copy of the prefill offsets: vLLM's GDN metadata builder ------------------------------------------
BUILDER_MODULE = "vllm.v1.attention.backends.gdn_attn"


def _wrap_build_chunk_metadata(original: Callable, sig: inspect.Signature) -> Callable:
    @functools.wraps(original)
    def _build_chunk_metadata(self, *args, **kwargs):
        out = original(self, *args, **kwargs)
        a = _bind(sig, args, kwargs)
        if a is not None and isinstance(a.get("prefill_query_start_loc"), torch.Tensor):
            attach_host_offsets(a["prefill_query_start_loc"], a.get("prefill_query_start_loc_cpu"))
        return out

    _build_chunk_metadata.__r9k_original__ = original
    return _build_chunk_metadata


def _hook_builder(mod: ModuleType | None) -> str | None:
    """Wrap ``GDNAttentionMetadataBuilder._build_chunk_metadata`` (vLLM's builder makes the prefill offsets on the
    host there, for fla's chunk indices) so that it leaves the host copy on the device offsets the layer passes to
    the core (:func:`attach_host_offsets`): a split step then reads its sequence lengths without a device read.
    None when the builder or those parameters are absent (the dispatch then reads the offsets back)."""
    cls = getattr(mod, "GDNAttentionMetadataBuilder", None)
    if cls is None or not hasattr(cls, "_build_chunk_metadata"):
        return None
    try:
        sig = _signature(_original(cls, "_build_chunk_metadata"),
                         ("prefill_query_start_loc", "prefill_query_start_loc_cpu"), True)
    except (SignatureMismatch, TypeError, ValueError) as e:
        log.info("r9k gdn: the prefill offsets are read back from the device (%s)", e)
        return None
    _patch(cls, "_build_chunk_metadata", _wrap_build_chunk_metadata(_original(cls, "_build_chunk_metadata"), sig))
    return f"host offsets <- {mod.__name__}.GDNAttentionMetadataBuilder._build_chunk_metadata"


# ---- the layers vLLM 0.33 serves without the op: FlashInfer's checkpointed prefill ------------------------
def _wrap_layer_init(original: Callable) -> Callable:
    """``QwenGatedDeltaNetAttention.__init__`` wrapped: a layer built to write prefix-cache checkpoints
    (``get_prefill_checkpoint_alignment()`` not None: FlashInfer prefill with the ``align`` cache mode, vLLM 0.33)
    runs those steps on FlashInfer's kernel without the op r9k wraps, so the GDN dispatch is taken out of this
    process and the binding refused (:func:`refuse_checkpointed`), before any step runs."""
    @functools.wraps(original)
    def __init__(self, *args, **kwargs):
        original(self, *args, **kwargs)
        try:
            align = self.get_prefill_checkpoint_alignment()
        except Exception as e:  # noqa: BLE001 - unreadable: refused, never assumed served
            align = f"unreadable ({type(e).__name__}: {e})"
        if align is not None and STATE.patches:
            refuse_checkpointed(getattr(self, "gdn_prefill_backend", "?"), align)

    __init__.__r9k_original__ = original
    return __init__


def refuse_checkpointed(backend: str, align: Any) -> None:
    """Take the GDN dispatch out of this process (stock vLLM) and record the refused binding
    :data:`CHECKPOINT_BINDING` with :func:`r9k.contract.refuse` (its listeners print the provenance line again)."""
    uninstall()
    why = (f"a GDN layer writes prefix-cache checkpoints (prefill backend {backend}, checkpoint alignment {align}): "
           "vLLM calls FlashInfer's prefill kernel for those steps without ChunkGatedDeltaRule, the op r9k wraps; "
           "the GDN dispatch is not installed (serve with --gdn-prefill-backend triton, or without prefix caching)")
    log.warning("r9k gdn: %s", why)
    contract.refuse(contract.Failure(CHECKPOINT_BINDING, "gdn", "bypassed", why))


# ---- install / uninstall ----------------------------------------------------------------------------------
def _original(owner: Any, attr: str) -> Callable:
    fn = getattr(owner, attr)
    return getattr(fn, "__r9k_original__", fn)  # never wrap twice


def _patch(owner: Any, attr: str, wrapper: Callable) -> None:
    original = _original(owner, attr)
    was_own = attr in vars(owner)
    setattr(owner, attr, wrapper)
    STATE.patches.append((owner, attr, original, was_own))


def uninstall() -> None:
    """Put back every original this module replaced (the stock vLLM functions and methods)."""
    while STATE.patches:
        owner, attr, original, was_own = STATE.patches.pop()
        if was_own:
            setattr(owner, attr, original)
        else:
            delattr(owner, attr)  # the method was inherited: remove our override


def _import(name: str) -> ModuleType | None:
    try:
        return importlib.import_module(name)
    except Exception as e:  # ImportError, or a vLLM build whose module fails to import on this platform
        log.debug("r9k gdn: %s not importable (%s)", name, e)
        return None


def signatures(qwen: ModuleType | None = None, olmo: ModuleType | None = None) -> dict[str, inspect.Signature]:
    """The signatures the dispatch binds calls to, read from vLLM's modules (default: the installed ones):
    ``{"qwen.core", "qwen.conv", "olmo.core", "olmo.conv"}`` for those present. Raises SignatureMismatch."""
    out = {}
    for tag, mod in (("qwen", qwen), ("olmo", olmo)):
        if mod is None:
            continue
        if tag == "qwen" and hasattr(mod, "ChunkGatedDeltaRule"):
            out["qwen.core"] = _signature(_original(mod.ChunkGatedDeltaRule, "forward_native"), CORE_PARAMS, True)
        if tag == "olmo" and hasattr(mod, "chunk_gated_delta_rule"):
            out["olmo.core"] = _signature(_original(mod, "chunk_gated_delta_rule"), CORE_PARAMS, False)
        if hasattr(mod, "causal_conv1d_fn") and f"{tag}.core" in out:
            out[f"{tag}.conv"] = _signature(_original(mod, "causal_conv1d_fn"), CONV_PARAMS, False)
    return out


def install(modules: dict[str, ModuleType | None] | None = None) -> list[str]:
    """Install the GDN prefill dispatch where vLLM has a GDN layer; returns what was installed.

    ``modules`` maps ``"qwen"`` / ``"olmo"`` to the module to patch and ``"builder"`` to the one holding vLLM's
    GDN metadata builder (hooked with ``R9K_GDN_PREFILL_SPLIT=seq``); by default the vLLM modules named above,
    skipped where absent. With ``R9K_GDN_PREFILL_MAX=0`` it installs nothing and removes an earlier install.

    Raises:
        SignatureMismatch: a vLLM function lacks a parameter the dispatch reads (nothing is left installed).
        r9k.contract.BindingFailed: (vLLM's own modules) a binding of the ``gdn`` family does not hold.
    """
    uninstall()
    STATE.max_tokens = int(knobs.GDN_PREFILL_MAX())
    STATE.conv = knobs.GDN_PREFILL_CONV()
    STATE.split = knobs.GDN_PREFILL_SPLIT()
    if STATE.max_tokens <= 0:
        log.info("r9k gdn: R9K_GDN_PREFILL_MAX=0: vLLM's GDN prefill core is left as is")
        return []
    if modules is None:
        contract.require("gdn", "gpu")  # every binding first: a failure installs nothing (BindingFailed)
        modules = {"qwen": _import(QWEN_MODULE), "olmo": _import(OLMO_MODULE), "builder": _import(BUILDER_MODULE)}
    qwen, olmo = modules.get("qwen"), modules.get("olmo")
    sigs = signatures(qwen, olmo)  # every signature first: a mismatch leaves nothing half-installed
    installed: list[str] = []
    if "qwen.core" in sigs:
        _patch(qwen.ChunkGatedDeltaRule, "forward", _wrap_core_method(
            _original(qwen.ChunkGatedDeltaRule, "forward"), sigs["qwen.core"]))
        installed.append(f"gdn_seq <- {qwen.__name__}.ChunkGatedDeltaRule.forward")
        layer = getattr(qwen, "QwenGatedDeltaNetAttention", None)
        if layer is not None and hasattr(layer, "_warmup_prefill_kernels"):
            _patch(layer, "_warmup_prefill_kernels", _wrap_warmup(_original(layer, "_warmup_prefill_kernels")))
        if STATE.split == "seq":
            hooked = _hook_builder(modules.get("builder"))
            if hooked:
                log.info("r9k gdn: %s", hooked)
        if layer is not None and hasattr(layer, "get_prefill_checkpoint_alignment"):
            _patch(layer, "__init__", _wrap_layer_init(_original(layer, "__init__")))
        if STATE.conv == "r9k" and "qwen.conv" in sigs:
            _patch(qwen, "causal_conv1d_fn", _wrap_conv_function(_original(qwen, "causal_conv1d_fn"),
                                                                 sigs["qwen.conv"]))
            installed.append(f"gdn_conv <- {qwen.__name__}.causal_conv1d_fn")
    if "olmo.core" in sigs:
        _patch(olmo, "chunk_gated_delta_rule", _wrap_core_function(_original(olmo, "chunk_gated_delta_rule"),
                                                                   sigs["olmo.core"]))
        installed.append(f"gdn_seq <- {olmo.__name__}.chunk_gated_delta_rule")
        if STATE.conv == "r9k" and "olmo.conv" in sigs:
            _patch(olmo, "causal_conv1d_fn", _wrap_conv_function(_original(olmo, "causal_conv1d_fn"),
                                                                 sigs["olmo.conv"]))
            installed.append(f"gdn_conv <- {olmo.__name__}.causal_conv1d_fn")
    if installed:
        rule = (f"sequences of <= {STATE.max_tokens} tokens" if STATE.split == "seq" else
                f"prefill steps within the crossover and <= {STATE.max_tokens} tokens")
        log.info("r9k gdn: %s -> r9k (conv: %s); installed: %s", rule, STATE.conv, "; ".join(installed))
    else:
        log.info("r9k gdn: this vLLM has no GDN layer module; nothing installed")
    return installed

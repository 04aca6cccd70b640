"""Dispatch of GDN prefill steps to r9k's kernels (kernels/gdn/: gdn_conv + gdn_seq), inside vLLM's own layer.

Where vLLM has a Gated DeltaNet layer, a prefill step runs the chunked core (fla's ``chunk_gated_delta_rule``:
several Triton kernels and glue per layer, whatever the prompt length) after ``causal_conv1d_fn``. For a step
whose shape the crossover table says r9k wins (:func:`take`), the token-by-token recurrence in one launch is
faster. The hooks (vLLM 0.32, vllm/model_executor/layers/mamba/gdn/):

* ``qwen_gdn_linear_attn.ChunkGatedDeltaRule.forward`` (the CustomOp the Qwen3-Next / Qwen3.5 GDN layer calls
  for its prefill core, whichever backend it selected) is wrapped: a call :func:`take` accepts runs ``gdn_seq``
  on the gathered initial state the layer passes in (updated in place and returned as the final state, which
  the layer then scatters back as before); anything else goes to the original.
* the module-level name ``causal_conv1d_fn`` in the same module, likewise with ``gdn_conv``
  (``R9K_GDN_PREFILL_CONV=r9k``; ``stock`` keeps vLLM's conv).
* olmo_gdn_linear_attn's module-level ``chunk_gated_delta_rule`` and ``causal_conv1d_fn``, the same way.
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
# time on the faster host (measured at HV = 32: r9k/stock 0.22-0.27 in every such shape). A step is routed when it lies
# within a row and has at most R9K_GDN_PREFILL_MAX tokens (default 1024: a step's longest sequence is not known without
# reading the offsets back, and 1024 tokens bound it to ~380 us of gdn_seq however the tokens are split).
CROSSOVER: tuple[tuple[int, int], ...] = ((32, 512), (64, 256), (128, 128), (256, 64), (512, 32), (1024, 16))


class SignatureMismatch(RuntimeError):
    """vLLM's function lacks a parameter the dispatch reads: the dispatch is not installed there."""


@dataclass
class _State:
    max_tokens: int = 0
    conv: str = "stock"
    patches: list[tuple[Any, str, Any, bool]] = field(default_factory=list)  # (owner, attr, original, was_own)
    routed: dict[str, int] = field(default_factory=lambda: {"seq": 0, "conv": 0, "stock_seq": 0, "stock_conv": 0,
                                                            "warmup": 0, "refused_seq": 0, "refused_conv": 0})
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


def _route_core(sig: inspect.Signature, args: tuple, kwargs: dict):
    if _in_warmup():
        STATE.routed["warmup"] += 1
        return None
    a = _core_call(sig, args, kwargs)
    if a is None or not take(a["_n"], a["_t"], a["_hv"]):
        return None
    try:
        res = run_core(a)
    except ValueError as e:  # checked before any launch: the state is untouched, vLLM's op runs the call
        _refused("seq", e)
        return None
    STATE.routed["seq"] += 1
    return res


def _wrap_core_method(original: Callable, sig: inspect.Signature) -> Callable:
    @functools.wraps(original)
    def forward(self, *args, **kwargs):
        res = _route_core(sig, args, kwargs)
        calls.count_args("gdn_seq", "vllm" if res is None else "r9k", args, kwargs)
        if res is not None:
            return res
        STATE.routed["stock_seq"] += 1
        return original(self, *args, **kwargs)

    forward.__r9k_original__ = original
    return forward


def _wrap_core_function(original: Callable, sig: inspect.Signature) -> Callable:
    @functools.wraps(original)
    def chunk_gated_delta_rule(*args, **kwargs):
        res = _route_core(sig, args, kwargs)
        calls.count_args("gdn_seq", "vllm" if res is None else "r9k", args, kwargs)
        if res is not None:
            return res
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
def _route_conv(sig: inspect.Signature, args: tuple, kwargs: dict) -> torch.Tensor | None:
    a = _bind(sig, args, kwargs)
    if a is None:
        return None
    x, cs, qsl = a["x"], a["conv_states"], a["query_start_loc"]
    if a.get("block_idx_last_scheduled_token") is not None or a.get("initial_state_idx") is not None:
        return None  # prefix caching writes intermediate conv blocks: vLLM's
    if not isinstance(x, torch.Tensor) or x.dim() != 2 or cs is None or qsl is None or not _routable(x):
        return None
    if not 0 < x.shape[1] <= STATE.max_tokens:
        return None
    ci = a.get("cache_indices")
    if ci is not None and ci.dim() != 1:
        return None
    act = a.get("activation", "silu")
    if act not in ("silu", "swish", True, None, False):
        return None
    # vLLM's kernel computes in the conv state's dtype and returns x's dtype
    x_in = x if x.dtype == cs.dtype else x.to(cs.dtype)
    try:
        out = _kernels().gdn_conv(x_in, a["weight"], a.get("bias"), cs, qsl, cache_indices=ci,
                                  has_initial_state=a.get("has_initial_state"), activation=act,
                                  pad_slot_id=a.get("pad_slot_id", -1), null_block_id=a.get("null_block_id", 0))
    except ValueError as e:  # checked before the launch: the conv state is untouched
        _refused("conv", e)
        return None
    STATE.routed["conv"] += 1
    return out if out.dtype == x.dtype else out.to(x.dtype)


def _wrap_conv_function(original: Callable, sig: inspect.Signature) -> Callable:
    @functools.wraps(original)
    def causal_conv1d_fn(*args, **kwargs):
        res = _route_conv(sig, args, kwargs)
        calls.count_args("gdn_conv", "vllm" if res is None else "r9k", args, kwargs)
        if res is not None:
            return res
        STATE.routed["stock_conv"] += 1
        return original(*args, **kwargs)

    causal_conv1d_fn.__r9k_original__ = original
    return causal_conv1d_fn


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

    ``modules`` maps ``"qwen"`` / ``"olmo"`` to the module to patch; by default the vLLM modules named above,
    skipped where absent. With ``R9K_GDN_PREFILL_MAX=0`` it installs nothing and removes an earlier install.

    Raises:
        SignatureMismatch: a vLLM function lacks a parameter the dispatch reads (nothing is left installed).
        r9k.contract.BindingFailed: (vLLM's own modules) a binding of the ``gdn`` family does not hold.
    """
    uninstall()
    STATE.max_tokens = int(knobs.GDN_PREFILL_MAX())
    STATE.conv = knobs.GDN_PREFILL_CONV()
    if STATE.max_tokens <= 0:
        log.info("r9k gdn: R9K_GDN_PREFILL_MAX=0: vLLM's GDN prefill core is left as is")
        return []
    if modules is None:
        contract.require("gdn", "gpu")  # every binding first: a failure installs nothing (BindingFailed)
        modules = {"qwen": _import(QWEN_MODULE), "olmo": _import(OLMO_MODULE)}
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
        log.info("r9k gdn: prefill steps within the crossover and <= %d tokens -> r9k (conv: %s); installed: %s",
                 STATE.max_tokens, STATE.conv, "; ".join(installed))
    else:
        log.info("r9k gdn: this vLLM has no GDN layer module; nothing installed")
    return installed

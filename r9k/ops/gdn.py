"""Dispatch of short GDN prefills to r9k's kernels (kernels/gdn.py: gdn_conv + gdn_seq).

Where vLLM has a Gated DeltaNet layer, a prefill step runs the chunked core (fla's ``chunk_gated_delta_rule``:
several Triton kernels and glue per layer, whatever the prompt length) after ``causal_conv1d_fn``. For a step
with few prefill tokens the token-by-token recurrence in one launch is faster. The hook is the least invasive
one found in vLLM 0.32 (vllm/model_executor/layers/mamba/gdn/):

* ``qwen_gdn_linear_attn.ChunkGatedDeltaRule.forward`` (the CustomOp the Qwen3-Next / Qwen3.5 GDN layer calls
  for its prefill core, whichever backend it selected) is wrapped: a call with at most ``R9K_GDN_PREFILL_MAX``
  tokens runs ``gdn_seq`` on the gathered initial state the layer passes in (updated in place and returned as
  the final state, which the layer then scatters back as before); anything else goes to the original.
* the module-level name ``causal_conv1d_fn`` in the same module is wrapped likewise with ``gdn_conv``
  (``R9K_GDN_PREFILL_CONV=r9k``; ``stock`` keeps vLLM's conv).
* olmo_gdn_linear_attn's module-level ``chunk_gated_delta_rule`` and ``causal_conv1d_fn``, the same way.

Only CUDA tensors are routed (or any tensor under TRITON_INTERPRET=1, for the CPU unit gates); calls the
kernels do not cover (prefix-caching conv blocks, no g/beta, other layouts) go to vLLM. ``R9K_GDN_PREFILL_MAX=0``
installs nothing and removes what an earlier install put in place: stock vLLM.
"""
from __future__ import annotations

import functools
import importlib
import inspect
import logging
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any, Callable

import torch

from r9k import knobs

log = logging.getLogger("r9k")

QWEN_MODULE = "vllm.model_executor.layers.mamba.gdn.qwen_gdn_linear_attn"
OLMO_MODULE = "vllm.model_executor.layers.mamba.gdn.olmo_gdn_linear_attn"


@dataclass
class _State:
    max_tokens: int = 0
    conv: str = "stock"
    patches: list[tuple[Any, str, Any, bool]] = field(default_factory=list)  # (owner, attr, original, was_own)
    routed: dict[str, int] = field(default_factory=lambda: {"seq": 0, "conv": 0, "stock_seq": 0, "stock_conv": 0})


STATE = _State()


def _kernels():
    from kernels import gdn

    return gdn


def _routable(t: torch.Tensor) -> bool:
    if t.is_cuda:
        return True
    return _kernels()._interpreting()


# ---- the core: chunk_gated_delta_rule(q, k, v, g, beta, ...) -> (o, final_state) -------------------------
def _core_signature(q, k, v, g=None, beta=None, scale=None, initial_state=None, output_final_state=False,
                    cu_seqlens=None, chunk_indices=None, chunk_offsets=None, use_qk_l2norm_in_kernel=False,
                    core_attn_out=None, **kwargs):  # pragma: no cover - only its signature is used
    pass


_CORE_SIG = inspect.signature(_core_signature)


@functools.lru_cache(maxsize=64)
def _identity_slots(n: int, device: torch.device) -> torch.Tensor:
    """0..n-1 on device, made once per (n, device): the gathered state's rows are the sequences' slots."""
    return torch.arange(n, dtype=torch.int32, device=device)


def _route_core(args: tuple, kwargs: dict) -> tuple[torch.Tensor, torch.Tensor | None] | None:
    """Run gdn_seq for a short prefill core call; None when the call is not ours to take."""
    try:
        a = _CORE_SIG.bind(*args, **kwargs).arguments
    except TypeError:
        return None
    q, k, v, g, beta, h0 = a["q"], a["k"], a["v"], a.get("g"), a.get("beta"), a.get("initial_state")
    extra = a.get("kwargs", {})
    if g is None or beta is None or h0 is None or extra.get("gk") is not None or extra.get("gv") is not None:
        return None
    if q.dim() != 4 or q.shape[0] != 1 or not _routable(q):
        return None
    T = q.shape[1]
    if not 0 < T <= STATE.max_tokens:
        return None
    HV, V, K = v.shape[2], v.shape[3], k.shape[3]
    if h0.dim() != 4 or tuple(h0.shape[1:]) != (HV, V, K) or h0.stride(-1) != 1 or beta.dim() != 3:
        return None
    cu = a.get("cu_seqlens")
    N = 1 if cu is None else cu.numel() - 1
    if h0.shape[0] != N:
        return None
    idx = _identity_slots(N, q.device)
    gdn = _kernels()
    o = gdn.gdn_seq(q, k, v, g, beta, h0, idx, cu_seqlens=cu, scale=a.get("scale"),
                    use_qk_l2norm=bool(a.get("use_qk_l2norm_in_kernel")))
    out = a.get("core_attn_out")
    if out is not None:
        out.reshape(-1)[: o.numel()].copy_(o.reshape(-1))
    STATE.routed["seq"] += 1
    return o, (h0 if a.get("output_final_state") else None)


def _wrap_core_method(original: Callable) -> Callable:
    @functools.wraps(original)
    def forward(self, *args, **kwargs):
        res = _route_core(args, kwargs)
        if res is not None:
            return res
        STATE.routed["stock_seq"] += 1
        return original(self, *args, **kwargs)

    forward.__r9k_original__ = original
    return forward


def _wrap_core_function(original: Callable) -> Callable:
    @functools.wraps(original)
    def chunk_gated_delta_rule(*args, **kwargs):
        res = _route_core(args, kwargs)
        if res is not None:
            return res
        STATE.routed["stock_seq"] += 1
        return original(*args, **kwargs)

    chunk_gated_delta_rule.__r9k_original__ = original
    return chunk_gated_delta_rule


# ---- the conv: causal_conv1d_fn(x, weight, bias, conv_states, query_start_loc, ...) -> out ---------------
def _conv_signature(x, weight, bias, conv_states, query_start_loc, cache_indices=None, has_initial_state=None,
                    activation="silu", pad_slot_id=-1, null_block_id=0, block_idx_first_scheduled_token=None,
                    block_idx_last_scheduled_token=None, initial_state_idx=None, num_computed_tokens=None,
                    block_size_to_align=0, metadata=None, validate_data=False):  # pragma: no cover
    pass


_CONV_SIG = inspect.signature(_conv_signature)


def _route_conv(args: tuple, kwargs: dict) -> torch.Tensor | None:
    try:
        a = _CONV_SIG.bind(*args, **kwargs).arguments
    except TypeError:
        return None
    x, cs, qsl = a["x"], a["conv_states"], a["query_start_loc"]
    if a.get("block_idx_last_scheduled_token") is not None or a.get("initial_state_idx") is not None:
        return None  # prefix caching writes intermediate conv blocks: vLLM's
    if x.dim() != 2 or cs is None or qsl is None or not _routable(x):
        return None
    if not 0 < x.shape[1] <= STATE.max_tokens:
        return None
    ci = a.get("cache_indices")
    if ci is not None and ci.dim() != 1:
        return None
    act = a.get("activation", "silu")
    if act not in ("silu", "swish", True, None, False):
        return None
    gdn = _kernels()
    # vLLM's kernel computes in the conv state's dtype and returns x's dtype
    x_in = x if x.dtype == cs.dtype else x.to(cs.dtype)
    out = gdn.gdn_conv(x_in, a["weight"], a.get("bias"), cs, qsl, cache_indices=ci,
                       has_initial_state=a.get("has_initial_state"), activation=act,
                       pad_slot_id=a.get("pad_slot_id", -1), null_block_id=a.get("null_block_id", 0))
    STATE.routed["conv"] += 1
    return out if out.dtype == x.dtype else out.to(x.dtype)


def _wrap_conv_function(original: Callable) -> Callable:
    @functools.wraps(original)
    def causal_conv1d_fn(*args, **kwargs):
        res = _route_conv(args, kwargs)
        if res is not None:
            return res
        STATE.routed["stock_conv"] += 1
        return original(*args, **kwargs)

    causal_conv1d_fn.__r9k_original__ = original
    return causal_conv1d_fn


# ---- install / uninstall ----------------------------------------------------------------------------------
def _patch(owner: Any, attr: str, wrapper_factory: Callable[[Callable], Callable]) -> None:
    original = getattr(owner, attr)
    original = getattr(original, "__r9k_original__", original)  # never wrap twice
    was_own = attr in vars(owner)
    setattr(owner, attr, wrapper_factory(original))
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


def install(modules: dict[str, ModuleType | None] | None = None) -> list[str]:
    """Install the GDN prefill dispatch where vLLM has a GDN layer; returns what was installed.

    ``modules`` maps ``"qwen"`` / ``"olmo"`` to the module to patch (tests pass fakes); by default the vLLM
    modules named above, skipped where absent. With ``R9K_GDN_PREFILL_MAX=0`` it installs nothing and removes
    an earlier install.
    """
    uninstall()
    STATE.max_tokens = int(knobs.GDN_PREFILL_MAX())
    STATE.conv = knobs.GDN_PREFILL_CONV()
    if STATE.max_tokens <= 0:
        log.info("r9k gdn: R9K_GDN_PREFILL_MAX=0: vLLM's GDN prefill core is left as is")
        return []
    if modules is None:
        modules = {"qwen": _import(QWEN_MODULE), "olmo": _import(OLMO_MODULE)}
    installed: list[str] = []
    qwen, olmo = modules.get("qwen"), modules.get("olmo")
    if qwen is not None and hasattr(qwen, "ChunkGatedDeltaRule"):
        _patch(qwen.ChunkGatedDeltaRule, "forward", _wrap_core_method)
        installed.append(f"gdn_seq <- {qwen.__name__}.ChunkGatedDeltaRule.forward")
        if STATE.conv == "r9k" and hasattr(qwen, "causal_conv1d_fn"):
            _patch(qwen, "causal_conv1d_fn", _wrap_conv_function)
            installed.append(f"gdn_conv <- {qwen.__name__}.causal_conv1d_fn")
    if olmo is not None and hasattr(olmo, "chunk_gated_delta_rule"):
        _patch(olmo, "chunk_gated_delta_rule", _wrap_core_function)
        installed.append(f"gdn_seq <- {olmo.__name__}.chunk_gated_delta_rule")
        if STATE.conv == "r9k" and hasattr(olmo, "causal_conv1d_fn"):
            _patch(olmo, "causal_conv1d_fn", _wrap_conv_function)
            installed.append(f"gdn_conv <- {olmo.__name__}.causal_conv1d_fn")
    if installed:
        log.info("r9k gdn: prefill steps of <= %d tokens -> r9k (conv: %s); installed: %s",
                 STATE.max_tokens, STATE.conv, "; ".join(installed))
    else:
        log.info("r9k gdn: this vLLM has no GDN layer module; nothing installed")
    return installed

"""The expert cache inside vLLM's MoE layer (kernels/moe/cache.py's ``ExpertCache``): vLLM's CPU experts on its CPU
platform, its Triton experts on CUDA and ROCm.

How vLLM 0.32 serves an unquantized MoE layer on the CPU (vllm/model_executor/layers/fused_moe/):
``UnquantizedFusedMoEMethod`` selects the CPU backend, whose experts class is the first of
``X86CPUUnquantizedExperts`` (AMX, bf16), ``ArmCPUUnquantizedExperts``, ``PowerCPUUnquantizedExperts``,
``CPUUnquantizedExperts`` (portable "vec") that supports the layer (experts/cpu_moe.py). All four are the one
class ``CPUUnquantizedExperts``, a *modular* experts kernel: routing runs before it (vLLM's CPU router gives
``topk_ids [T, k]`` and ``topk_weights``), and its ``apply(output, hidden_states, w1, w2, topk_weights, topk_ids,
activation, ..., apply_router_weight_on_input)`` calls ``cpu_fused_moe`` (``torch.ops._C.cpu_fused_moe``) on the
layer's ``w13_weight [E, 2I, H]`` and ``w2_weight [E, H, I]``. Its ``process_weights_after_loading(layer)``
repacks both with ``cpu_prepack_moe_weight`` (into the ISA's grouped-GEMM layout, same shape) and replaces the
parameters; the repack is per expert (expert e of the packed tensor is the packed expert e: checked in
tests/r9k/test_moe_dispatch.py), so the host store holds experts packed in the layout the kernel runs on and a slot
fill copies packed rows. (The zentorch path of the same class, taken where zentorch is installed, binds its own
handles and is passed through; vLLM's older per-expert oneDNN-handle path is not what 0.32 runs for this class.)

With ``R9K_MOE_CACHE_SLOTS`` > 0 two methods of ``CPUUnquantizedExperts`` are wrapped (bound to vLLM's real
signatures, read with ``inspect.signature`` at install time):

* ``process_weights_after_loading``: after vLLM's own repack, the layer's packed ``w13_weight`` / ``w2_weight``
  become the host store of an ``ExpertCache`` (no copy: the same tensors) and the layer's parameters are replaced
  by the cache's slot buffers ``[slots + staging, ...]`` (with r9k.contract.adopt_parameter, never vLLM's
  ``replace_parameter``, which on 0.33 copies a same-shape tensor into the old storage, the host store), so vLLM's forward passes the slots as ``w1`` / ``w2``.
  Knob values the layer cannot take raise ValueError naming the knob (slots above the layer's experts or below its
  top-k, staging below its top-k). A layer the cache cannot take (expert parallelism or an expert map, expert
  biases, zentorch, a weight that is not ``[E, ...]``) keeps vLLM's experts, said once in the log.
* ``apply``: a layer that took the cache maps the step's ``topk_ids`` to slot ids (``ExpertCache.prepare``:
  LRU hits, inserts below the insert threshold, read-through misses into the staging slots) and runs vLLM's own
  ``apply`` (its ``cpu_fused_moe``) on the slots, once per chunk of the plan: a step whose read-through misses
  exceed the staging slots is served chunk by chunk (token ranges whose misses fit; ``cpu_fused_moe`` of a token
  range equals the rows of the whole step bit for bit, as does a permutation of experts to slots: the gates), and
  a step of more tokens than the cache's bound (vLLM's ``max_num_batched_tokens``) in blocks of that bound.
  On the CPU the slots and the host store are both host memory and the cache plans on the host (its reference
  path; its device path needs Triton on a GPU).

vLLM's CPU platform compiles the model with torch.compile and calls the MoE op directly (moe_runner.py
``_select_forward``), so Dynamo traces into ``apply``: there the call is the custom op
``torch.ops.r9k.moe_cache_experts`` (opaque to Dynamo, it mutates ``output``), eager calls run the same function.
The CPU has no CUDA graphs.

On CUDA and ROCm vLLM serves 16-bit and fp8 MoE layers with ``TritonExperts`` (experts/triton_moe.py), also a
modular kernel: the router's ``topk_ids`` reach its ``apply`` (the same signature as the CPU class's), which runs
vLLM's ``fused_moe_kernel`` on ``w1`` / ``w2`` (the layer's ``w13_weight`` / ``w2_weight``, passed by the quant
method's forward) and the quant config's ``w1_scale`` / ``w2_scale``. There the layers are taken after the
model's weights are processed (the wrapped loader walks the model: a module whose
``quant_method.moe_kernel.fused_experts`` is a ``TritonExperts`` itself; ``Fp8MoEMethod`` never calls the experts'
own ``process_weights_after_loading``): the expert tensors (both weights; for fp8 w8a8 also their per-expert
scales, e.g. block 128x128 ``w13_weight_scale_inv``) are copied to a pinned host store, the parameters and the
quant config's scale references become the slot buffers, and every slot is filled. How a step's misses that are
not inserted are served is ``R9K_MOE_CACHE_READ`` (:func:`read_mode`): ``through`` (the default on CUDA for 16-bit
and block-fp8 layers) reads them from the pinned host store inside the GEMM: the cache has no staging slots, its
device plan writes per-expert address tables every step, vLLM's apply runs on the step's expert ids and vLLM's
``invoke_fused_moe_triton_kernel`` (wrapped, :data:`TRITON_GEMM`) runs r9k's pointer-table GEMM
(kernels/moe/ptr_gemm.py) on those tables, so every step plans on the device at any miss count (no sync,
capturable: vLLM calls the experts inside its ``moe_forward`` op, in its piecewise CUDA graphs). ``stage`` copies
them into staging slots first: staging of ``E - slots`` (the default) bounds any step's misses and every step
plans on the device; a smaller staging plans steps of more than ``staging / top_k`` tokens on the host (a sync,
chunks); such a step inside a graph capture raises, naming the knob. ``apply`` maps the ids to slots as on the CPU and runs vLLM's apply per chunk (token rows of the
activations and of a per-token ``a1q_scale``); two functions of triton_moe are wrapped so that a step on the slots
chooses the tiles stock chooses (``try_get_optimal_moe_config`` sees the layer's experts and the step's tokens,
not the slot count and a chunk's; ``_prepare_expert_assignment`` decides its naive or aligned path on them), which
keeps the outputs bit-identical (tests/kernels/moe/test_vllm_moe_layer.py). Subclasses (``TritonWNA16Experts``),
other experts kernels (Marlin, CUTLASS, FlashInfer, the gpt-oss Triton kernels that serve MXFP4 on Hopper), LoRA,
expert biases, zero points and expert parallelism pass through, said once. The layer's experts must fit the device
while vLLM loads them (the cache takes them after loading).

After the model's weights are processed (vLLM's ``base_loader.process_weights_after_loading`` is wrapped), each
loading process prints the ``R9K-MOE-CACHE`` line (r9k/counters.py) saying how many MoE layers took the cache; a
model without any MoE layer makes loading fail with a ValueError naming ``R9K_MOE_CACHE_SLOTS``. With
``R9K_MOE_CACHE_STATS`` each layer prints its counters (``R9K-MOE-CACHE-STATS``) every
``R9K_MOE_CACHE_STATS_SEC`` seconds it serves steps, and at exit.
"""
from __future__ import annotations

import atexit
import functools
import gc
import importlib
import inspect
import logging
import os
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from r9k import calls, contract, counters, knobs
from r9k.lines import logger as _logger
from r9k.lines import rank as _rank

log = logging.getLogger("r9k")

EXPERTS_MODULE = contract.CPU_MOE
EXPERTS_CLASS = "CPUUnquantizedExperts"
LOADER_MODULE = contract.LOADER
TRITON_MODULE = contract.TRITON_MOE
TRITON_CLASS = "TritonExperts"
#: module-level functions of TRITON_MODULE that ``TritonExperts.apply`` calls, wrapped so that a step on the slots
#: makes the choices stock makes for the layer (its experts, the step's tokens), and their parameters
TRITON_FUNCS = contract.MOE_TRITON_FUNCS
#: vLLM's MoE GEMM launcher (vllm/model_executor/layers/fused_moe/fused_moe.py, imported into TRITON_MODULE), wrapped
#: where present so that a read-through step runs r9k's pointer-table GEMM (kernels/moe/ptr_gemm.py) on the cache's
#: tables instead of vLLM's kernel on the slot buffer; its leading parameters
TRITON_GEMM = contract.MOE_TRITON_GEMM
DISPATCH = "moe_cache"
#: parameters of vLLM's ``apply`` the dispatch reads or passes by name
APPLY_PARAMS = contract.MOE_APPLY_PARAMS
DEFAULT_MAX_TOKENS = 8192  # the cache's token bound where vLLM's scheduler config cannot be read


class SignatureMismatch(RuntimeError):
    """vLLM's method lacks a parameter the dispatch reads: the dispatch is not installed there."""


@dataclass
class Layer:
    """One MoE layer that took the cache: the cache, vLLM's experts object and its original ``apply``."""

    index: int
    name: str
    cache: Any  # kernels.moe.ExpertCache
    experts: Any
    expert_bytes: int
    rank: int
    device_bytes: int = 0    # what the cache holds on the layer's device (take_triton_layer measures it)
    resident_bytes: int = 0  # what the layer's experts took there before: all resident
    staged: int = 0          # read-through experts copied into staging slots (every chunk's)
    distinct_max: int = 0
    last_log: float = 0.0

    def counters(self) -> dict[str, int]:
        """The layer's counters (see r9k.counters.COUNTERS), from the cache's own and the dispatch's."""
        st = self.cache.stats
        return {"steps": st.steps, "routed": st.routed, "distinct": st.distinct, "distinct_max": self.distinct_max,
                "hits": st.hits, "misses": st.misses, "inserts": st.inserts, "evictions": st.evictions,
                "read_through": st.read_through, "over_thresh": st.steps_over_thresh, "chunks": st.chunks,
                "bytes": (st.inserts + self.staged + (st.read_through if self.cache.read == "through" else 0))
                * self.expert_bytes}

    def line(self) -> str:
        c = self.cache
        return counters.stats_line(os.getpid(), self.rank, self.name, c.E, c.n_slots, c.stage_slots, self.counters(),
                                   self.device_bytes, self.resident_bytes)


@dataclass
class _State:
    patches: list[tuple[Any, str, Any, bool]] = field(default_factory=list)
    layers: list[Layer] = field(default_factory=list)
    passed: dict[str, int] = field(default_factory=dict)   # why a layer kept vLLM's experts -> layers
    slots: int = 0
    staging: int = -1
    read: str = "auto"            # R9K_MOE_CACHE_READ
    gemm: Callable | None = None  # vLLM's invoke_fused_moe_triton_kernel where wrapped (read-through possible)
    through: Any = None           # the Layer whose read-through step is running (its owner thread's)
    thresh: float = 0.99
    stats: bool = True
    stats_sec: float = 10.0
    apply_sig: inspect.Signature | None = None
    original_apply: Callable | None = None
    activation_cls: Any = None
    lock: threading.Lock = field(default_factory=threading.Lock)
    backend: str = "cpu"          # "cpu": CPUUnquantizedExperts; "triton": TritonExperts (CUDA, ROCm)
    experts_cls: Any = None
    current: tuple[int, int] | None = None  # (the layer's experts, the step's tokens) while a Triton step runs
    owner: int | None = None  # the thread running that step: another thread's TritonExperts calls are not its


STATE = _State()


def _pass(why: str, name: str) -> None:
    """A layer keeps vLLM's experts: said once per reason in the log."""
    STATE.passed[why] = STATE.passed.get(why, 0) + 1
    if STATE.passed[why] == 1:
        log.warning("r9k moe: %s keeps vLLM's experts: %s (said once; every such layer does the same)", name, why)


def _max_tokens() -> int:
    try:
        from vllm.config import get_current_vllm_config

        n = get_current_vllm_config().scheduler_config.max_num_batched_tokens
        return int(n) if n and int(n) > 0 else DEFAULT_MAX_TOKENS
    except Exception:  # noqa: BLE001 - outside a vLLM engine
        return DEFAULT_MAX_TOKENS


def _refusal(layer: Any) -> str | None:
    """Why the cache cannot take this layer (after vLLM's repack), or None."""
    if getattr(layer, "expert_map", None) is not None:
        return "an expert map (expert parallelism): the cache holds a layer's global experts"
    cfg = getattr(getattr(layer, "moe_config", None), "moe_parallel_config", None)
    if cfg is not None and getattr(cfg, "use_ep", False):
        return "expert parallelism"
    ws = [getattr(layer, n, None) for n in ("w13_weight", "w2_weight")]
    if not all(isinstance(w, torch.Tensor) and w.dim() == 3 for w in ws) or ws[0].shape[0] != ws[1].shape[0]:
        return "its expert weights are not two [E, ...] tensors"
    if ws[0].device.type != "cpu":
        return f"its experts are on {ws[0].device.type}, not the CPU"
    if getattr(layer, "w13_bias", None) is not None or getattr(layer, "w2_bias", None) is not None:
        return "expert biases (indexed by expert id inside the kernel; the cache moves weights only)"
    return None


def check_layer(name: str, n_experts: int, top_k: int, slots: int, staging: int) -> int:
    """The staging slots a layer of ``n_experts`` experts and ``top_k`` choices gets for the knobs' ``slots`` and
    ``staging`` (-1: ``max(top_k, n_experts - slots)``).

    Raises:
        ValueError: naming the knob: slots above ``n_experts`` or below ``top_k``; staging below ``top_k``.
    """
    if slots > n_experts:
        raise ValueError(f"R9K_MOE_CACHE_SLOTS={slots}: MoE layer {name} has {n_experts} experts; the slots are "
                         f"at most its experts")
    if slots < top_k:
        raise ValueError(f"R9K_MOE_CACHE_SLOTS={slots}: MoE layer {name} routes each token to {top_k} experts; "
                         f"the slots are at least its top-k")
    stage = max(top_k, n_experts - slots) if staging == -1 else staging
    if stage < top_k:
        raise ValueError(f"R9K_MOE_CACHE_STAGING={staging}: MoE layer {name} routes each token to {top_k} experts; "
                         f"the staging slots are at least its top-k (a token's misses must fit one chunk)")
    return stage


def take_layer(experts: Any, layer: Any) -> Layer | None:
    """Put ``layer`` (vLLM's MoE layer after ``experts``' repack) on the cache: the packed weights become its host
    store and the layer's ``w13_weight`` / ``w2_weight`` its slot buffers. None (and vLLM's experts kept) when
    :func:`_refusal` says the cache cannot take it.

    Raises:
        ValueError: the knobs' values do not fit the layer (see :func:`check_layer`).
    """
    from kernels.moe import ExpertCache

    name = str(getattr(layer, "layer_name", None) or f"moe{len(STATE.layers)}")
    if getattr(experts, "_use_zentorch", False):
        _pass("the zentorch experts (their own handles)", name)
        return None
    why = _refusal(layer)
    if why:
        _pass(why, name)
        return None
    E = int(layer.w13_weight.shape[0])
    top_k = int(getattr(layer, "top_k", 0) or layer.moe_config.experts_per_token)
    stage = check_layer(name, E, top_k, STATE.slots, STATE.staging)
    host = [layer.w13_weight.data, layer.w2_weight.data]
    cache = ExpertCache(host, STATE.slots, _max_tokens(), top_k, device="cpu", insert_thresh=STATE.thresh,
                        stage_slots=stage, pin=False, device_plan=False)
    # r9k's own setter: vLLM 0.33's replace_parameter would copy the slots into the host store (same shape where
    # slots + staging = experts) instead of adopting them (r9k/contract.py, binding moe.adopt)
    contract.adopt_parameter(layer, "w13_weight", cache.weights[0])
    contract.adopt_parameter(layer, "w2_weight", cache.weights[1])
    eb = sum(h[0].numel() * h.element_size() for h in cache.host)
    # on the CPU the slots are host memory too: what the cache's buffers hold against the packed experts'
    entry = Layer(len(STATE.layers), name, cache, experts, eb, _rank(), cache.buffer_bytes(),
                  sum(h.numel() * h.element_size() for h in host))
    STATE.layers.append(entry)
    experts._r9k_moe = entry
    log.info("r9k moe: %s: %d experts (%.3f MiB each, packed) in the host store, %d slots + %d staging slots "
             "(%.1f MiB), top-%d, insert threshold %g", name, E, eb / 2**20, cache.n_slots, stage,
             (cache.n_slots + stage) * eb / 2**20, top_k, STATE.thresh)
    return entry


def _wrap_pwal(original: Callable) -> Callable:
    @functools.wraps(original)
    def process_weights_after_loading(self, layer, *args, **kwargs):
        out = original(self, layer, *args, **kwargs)
        if getattr(self, "_r9k_moe", None) is None:
            take_layer(self, layer)
        return out

    process_weights_after_loading.__r9k_original__ = original
    return process_weights_after_loading


# ---- the step ---------------------------------------------------------------------------------------------
def _call_kwargs(activation: Any, apply_router_weight_on_input: bool, n_experts: int) -> dict[str, Any]:
    """vLLM's apply's arguments other than the step's tensors, by name (the signature's defaults for the rest)."""
    known = {"activation": activation, "global_num_experts": n_experts, "expert_map": None, "a1q_scale": None,
             "a2_scale": None, "workspace13": None, "workspace2": None, "expert_tokens_meta": None,
             "apply_router_weight_on_input": apply_router_weight_on_input}
    return {k: v for k, v in known.items() if k in STATE.apply_sig.parameters}


def run_step(entry: Layer, output: torch.Tensor, hidden_states: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor,
             topk_weights: torch.Tensor, topk_ids: torch.Tensor, activation: Any,
             apply_router_weight_on_input: bool) -> None:
    """One step of a layer on the cache: ``topk_ids [T, k]`` (expert ids) mapped to slots, vLLM's ``apply`` run on
    the slot buffers ``w1`` / ``w2`` chunk by chunk into ``output [T, H]`` (written in place; ``hidden_states
    [T, H]``, ``topk_weights [T, k]`` fp32).

    Raises:
        RuntimeError: ``w1`` is not the layer's slot buffer (the layer's parameters were replaced after loading).
    """
    cache = entry.cache
    calls.count(DISPATCH, "r9k", hidden_states.device)
    if w1.data_ptr() != cache.weights[0].data_ptr() or w2.data_ptr() != cache.weights[1].data_ptr():
        raise RuntimeError(f"r9k moe: {entry.name}: the experts kernel was called on weights that are not the "
                           "cache's slots (were the layer's parameters replaced after loading?)")
    kw = _call_kwargs(activation, apply_router_weight_on_input, cache.E)
    T = topk_ids.shape[0]
    with STATE.lock:  # the cache's state is one per layer: one step at a time
        for b0 in range(0, T, cache.max_tokens):
            b1 = min(T, b0 + cache.max_tokens)
            before = cache.stats.distinct
            plan = cache.prepare(topk_ids[b0:b1])
            entry.distinct_max = max(entry.distinct_max, cache.stats.distinct - before)
            entry.staged += sum(len(s) for s in plan.stage_of_chunk)
            for c, (t0, t1) in enumerate(plan.chunks):
                if t1 <= t0:
                    continue
                slot_ids = cache.stage(plan, c) if len(plan.chunks) > 1 else plan.slot_ids
                a, z = b0 + t0, b0 + t1
                STATE.original_apply(entry.experts, output=output[a:z], hidden_states=hidden_states[a:z], w1=w1,
                                     w2=w2, topk_weights=topk_weights[a:z], topk_ids=slot_ids, **kw)
        if STATE.stats and time.monotonic() - entry.last_log >= STATE.stats_sec:
            entry.last_log = time.monotonic()
            _logger().info(entry.line())


def _op_impl(output: torch.Tensor, hidden_states: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor,
             topk_weights: torch.Tensor, topk_ids: torch.Tensor, layer: int, activation: str,
             apply_router_weight_on_input: bool) -> None:
    act = STATE.activation_cls(activation) if STATE.activation_cls is not None else activation
    run_step(STATE.layers[layer], output, hidden_states, w1, w2, topk_weights, topk_ids, act,
             apply_router_weight_on_input)


_LIB = None


def _register_op() -> None:
    """torch.ops.r9k.moe_cache_experts(output!, hidden_states, w1, w2, topk_weights, topk_ids, layer, activation,
    apply_router_weight_on_input) -> (), once per process."""
    global _LIB
    if _LIB is not None:
        return
    lib = torch.library.Library("r9k", "FRAGMENT")
    lib.define("moe_cache_experts(Tensor(a!) output, Tensor hidden_states, Tensor w1, Tensor w2, Tensor topk_weights, "
               "Tensor topk_ids, int layer, str activation, bool apply_router_weight_on_input) -> ()")
    lib.impl("moe_cache_experts", _op_impl, "CompositeExplicitAutograd")
    lib._register_fake("moe_cache_experts", lambda *a: None)
    _LIB = lib


def _act_value(activation: Any) -> str:
    return activation.value if hasattr(activation, "value") else str(activation)


def _wrap_apply(original: Callable, sig: inspect.Signature) -> Callable:
    @functools.wraps(original)
    def apply(self, *args, **kwargs):
        entry = getattr(self, "_r9k_moe", None)
        if entry is None:
            if not torch.compiler.is_compiling():  # traced, this would count once at tracing: not counted
                calls.count_args(DISPATCH, "vllm", args, kwargs)
            return original(self, *args, **kwargs)
        ba = sig.bind(self, *args, **kwargs)
        ba.apply_defaults()
        a = ba.arguments
        if a.get("expert_map") is not None:  # refused at load: never here
            raise RuntimeError(f"r9k moe: {entry.name}: an expert map reached a layer on the cache")
        ariw = bool(a["apply_router_weight_on_input"])
        if STATE.backend == "triton":
            if torch.compiler.is_compiling():
                raise RuntimeError(f"r9k moe: {entry.name}: vLLM's Triton experts traced by torch.compile (vLLM "
                                   "calls them inside its opaque moe_forward op); the cache is not bound there")
            run_step_triton(entry, a)
            return None
        if torch.compiler.is_compiling():
            torch.ops.r9k.moe_cache_experts(a["output"], a["hidden_states"], a["w1"], a["w2"], a["topk_weights"],
                                            a["topk_ids"], entry.index, _act_value(a["activation"]), ariw)
        else:
            run_step(entry, a["output"], a["hidden_states"], a["w1"], a["w2"], a["topk_weights"], a["topk_ids"],
                     a["activation"], ariw)
        return None

    apply.__r9k_original__ = original
    return apply


# ---- vLLM's Triton experts (CUDA, ROCm) --------------------------------------------------------------------
def triton_tensors(layer: Any, experts: Any) -> tuple[list[tuple[str, str | None, torch.Tensor]] | None, str | None]:
    """What an expert of ``layer`` (served by ``experts``, vLLM's TritonExperts) is made of, as
    ``(layer parameter name or None, quant-config descriptor "_w1"/"_w2" or None, tensor [E, ...])``: the two
    weights, and for fp8 w8a8 their per-expert scales (block 128x128, per channel or per tensor of each expert);
    or ``(None, why not)``."""
    qc = experts.quant_config
    E = int(layer.w13_weight.shape[0])
    out: list[tuple[str, str | None, torch.Tensor]] = [("w13_weight", None, layer.w13_weight),
                                                       ("w2_weight", None, layer.w2_weight)]
    if qc.w1_bias is not None or qc.w2_bias is not None:
        return None, "expert biases (indexed by expert id inside the kernel)"
    if qc.w1_zp is not None or qc.w2_zp is not None:
        return None, "zero points"
    if qc.quant_dtype is None:
        if qc.w1_scale is not None or qc.w2_scale is not None:
            return None, "weight-only quantisation (scales without a quantised activation)"
        return out, None
    if not qc.use_fp8_w8a8:
        return None, (f"the format {qc.quant_dtype} (the cache takes 16-bit and fp8 w8a8 experts; MXFP4, int8 and "
                      "int4 layers are not served by TritonExperts on Hopper or are not known to the cache)")
    for desc, pname in (("_w1", "w13"), ("_w2", "w2")):
        sc = getattr(qc, desc).scale
        if not isinstance(sc, torch.Tensor) or sc.dim() == 0 or sc.shape[0] != E:
            return None, "fp8 weight scales that are not per expert [E, ...]"
        name = next((n for n, prm in layer.named_parameters(recurse=False)
                     if n.startswith(pname) and prm.data_ptr() == sc.data_ptr() and prm.shape == sc.shape), None)
        out.append((name, desc, sc))
    return out, None


def take_triton_layer(layer: Any, experts: Any, name: str | None = None) -> Layer | None:
    """Put ``layer`` (a vLLM MoE layer after loading, whose experts kernel is ``experts``, a TritonExperts) on
    the cache: its expert tensors (:func:`triton_tensors`) are copied to a pinned host store, the layer's
    parameters (and the quant config's scale references) become the cache's slot buffers ``[slots + staging,
    ...]`` on the layer's device (no staging where :func:`read_mode` says ``through``), and every slot is filled
    (experts 0..slots-1), so that read-through, or staging of ``E - slots`` (the knob's default), plans every step
    on the device (no sync; CUDA-graph safe). None (vLLM's experts kept, said once) when the cache cannot take the
    layer.

    Raises:
        ValueError: the knobs' values do not fit the layer (see :func:`check_layer`).
    """
    from kernels.moe import ExpertCache

    name = name or str(getattr(layer, "layer_name", None) or f"moe{len(STATE.layers)}")
    if getattr(layer, "expert_map", None) is not None:
        _pass("an expert map (expert parallelism): the cache holds a layer's global experts", name)
        return None
    cfg = getattr(getattr(layer, "moe_config", None), "moe_parallel_config", None)
    if cfg is not None and getattr(cfg, "use_ep", False):
        _pass("expert parallelism", name)
        return None
    if getattr(experts, "_lora_context", None) is not None or getattr(getattr(layer, "moe_config", None),
                                                                       "is_lora_enabled", False):
        _pass("LoRA (its kernels index the expert weights by expert id)", name)
        return None
    w13, w2 = getattr(layer, "w13_weight", None), getattr(layer, "w2_weight", None)
    if not (isinstance(w13, torch.Tensor) and isinstance(w2, torch.Tensor) and w13.dim() == 3
            and w13.shape[0] == w2.shape[0]):
        _pass("its expert weights are not two [E, ...] tensors", name)
        return None
    interp = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")
    if w13.device.type != "cuda" and not (w13.device.type == "cpu" and interp):
        _pass(f"its experts are on {w13.device.type}, not a GPU", name)
        return None
    tensors, why = triton_tensors(layer, experts)
    if tensors is None:
        _pass(why, name)
        return None
    E = int(w13.shape[0])
    top_k = int(getattr(layer, "top_k", 0) or layer.moe_config.experts_per_token)
    stage = check_layer(name, E, top_k, STATE.slots, STATE.staging)
    read = read_mode(experts, w13.device, name)
    if read == "through":
        stage = 0
    host = []
    for _, _, t in tensors:
        h = torch.empty(t.shape, dtype=t.dtype, pin_memory=w13.device.type == "cuda")  # CPU: the interpreter's
        h.copy_(t)
        host.append(h)
    cuda = w13.device.type == "cuda"
    # the allocator's count across the set-up (the layer's own tensors still held): what the cache added. Python's
    # cyclic collector is held off meanwhile: a collection here would free unrelated tensors (garbage in reference
    # cycles, e.g. an earlier layer's cache) inside the count.
    collecting = gc.isenabled()
    gc.disable()
    try:
        before = torch.cuda.memory_allocated(w13.device) if cuda else 0
        cache = ExpertCache(host, STATE.slots, _max_tokens(), top_k, device=w13.device, insert_thresh=STATE.thresh,
                            stage_slots=stage if read == "stage" else None, pin=cuda, read=read)
        cache.fill()
        device_bytes = torch.cuda.memory_allocated(w13.device) - before if cuda else cache.buffer_bytes()
    finally:
        if collecting:
            gc.enable()
    resident_bytes = sum(t.numel() * t.element_size() for _, _, t in tensors)
    qc = experts.quant_config
    for (pname, desc, _), buf in zip(tensors, cache.weights):
        if pname is not None:
            contract.adopt_parameter(layer, pname, buf)  # adopted, never copied (binding moe.adopt)
        if desc is not None:
            getattr(qc, desc).scale = buf
    eb = sum(h[0].numel() * h.element_size() for h in cache.host)
    entry = Layer(len(STATE.layers), name, cache, experts, eb, _rank(), device_bytes, resident_bytes)
    STATE.layers.append(entry)
    experts._r9k_moe = entry
    graph = ("misses not inserted are read from host memory through the step's pointer table (no staging; every "
             "step plans on the device: CUDA-graph safe)" if read == "through" and cache.device_plan else
             "every step plans on the device (no sync; CUDA-graph safe)" if cache.device_step(cache.max_tokens)
             else f"steps of more than {stage // top_k} tokens plan on the host (a sync; not CUDA-graph safe: "
                  f"R9K_MOE_CACHE_STAGING >= {E - STATE.slots} or --enforce-eager)")
    log.info("r9k moe: %s: %d experts (%.3f MiB each: %s) in pinned host memory, %d slots + %d staging slots on "
             "%s (%.1f MiB), top-%d, insert threshold %g; %s", name, E, eb / 2**20,
             " + ".join(str(p or d) for p, d, _ in tensors), cache.n_slots, stage, w13.device,
             (cache.n_slots + stage) * eb / 2**20, top_k, STATE.thresh, graph)
    return entry


def read_mode(experts: Any, device: torch.device, name: str) -> str:
    """How a layer served by ``experts`` (vLLM's TritonExperts) on ``device`` reads its misses: "through" or
    "stage", from R9K_MOE_CACHE_READ (auto: through on CUDA) and what the pointer-table GEMM computes
    (:func:`kernels.moe.ptr_gemm.supports`: 16-bit and block-fp8 layers; vLLM's GEMM launcher wrapped; vLLM's
    tensor-descriptor path off). A layer that cannot read through stages, said once."""
    from kernels.moe import ptr_gemm

    want = STATE.read
    if want == "stage" or (want == "auto" and device.type != "cuda"):
        return "stage"
    qc = experts.quant_config
    why = None if STATE.gemm is not None else f"vLLM's {TRITON_GEMM[0]} is not there to wrap"
    why = why or ptr_gemm.supports(bool(qc.use_fp8_w8a8), bool(getattr(qc, "use_int8_w8a8", False)),
                                   bool(getattr(qc, "use_int8_w8a16", False)),
                                   bool(getattr(qc, "use_int4_w4a16", False)),
                                   bool(getattr(experts, "per_act_token_quant", False)),
                                   getattr(experts, "block_shape", None), qc.w1_bias is not None)
    if why is None:
        fm = importlib.import_module(STATE.gemm.__module__)
        td = getattr(fm, "resolve_moe_use_td", None)
        if td is not None and not qc.use_fp8_w8a8 and td():
            why = "vLLM's tensor-descriptor MoE path (VLLM_TRITON_USE_TD) is on"
    if why is not None:
        if why not in _STAGED:  # said once per reason; the layer still takes the cache
            _STAGED.add(why)
            log.warning("r9k moe: %s stages the misses it does not insert (R9K_MOE_CACHE_READ=%s): %s (said once; "
                        "every such layer does the same)", name, want, why)
        return "stage"
    return "through"


_STAGED: set[str] = set()  # reasons a layer staged where R9K_MOE_CACHE_READ asked for read-through


def take_model(model: torch.nn.Module) -> int:
    """Take every MoE layer of ``model`` whose experts kernel is vLLM's TritonExperts itself (its quant method's
    ``moe_kernel.fused_experts``); returns how many were taken. Layers of another experts kernel (a subclass
    such as TritonWNA16Experts, Marlin, CUTLASS, FlashInfer, the gpt-oss Triton kernels of MXFP4) keep it, said
    once."""
    n = 0
    for mname, m in model.named_modules():
        qm = getattr(m, "quant_method", None)
        experts = getattr(getattr(qm, "moe_kernel", None), "fused_experts", None)
        if experts is None or getattr(experts, "_r9k_moe", None) is not None:
            continue
        if type(experts) is not STATE.experts_cls:
            _pass(f"served by {type(experts).__name__}, not {TRITON_CLASS}", mname)
            continue
        if take_triton_layer(m, experts, str(getattr(m, "layer_name", None) or mname)) is not None:
            n += 1
    return n


def _wrap_triton_func(name: str, original: Callable) -> Callable:
    """TRITON_FUNCS' wrappers: inside a cache step, the tile config is looked up for the layer's experts and the
    step's tokens (not the slot count and a chunk's tokens), and the expert assignment decides its naive or
    aligned path on them too, so the slots run the tiles stock runs, bit for bit."""
    if name == "try_get_optimal_moe_config":
        @functools.wraps(original)
        def wrapped(w1_shape, w2_shape, top_k, dtype, M, block_shape=None):
            cur = STATE.current
            if cur is not None and STATE.owner in (None, threading.get_ident()):
                E, T = cur
                w1_shape, w2_shape, M = (E, *tuple(w1_shape)[1:]), (E, *tuple(w2_shape)[1:]), T
            return original(w1_shape, w2_shape, top_k, dtype, M, block_shape=block_shape)
    else:
        @functools.wraps(original)
        def wrapped(topk_ids, config, num_tokens, top_k_num, global_num_experts, expert_map, **kwargs):
            cur = STATE.current
            if cur is not None and expert_map is None and STATE.owner in (None, threading.get_ident()):
                E, T = cur
                num_tokens, global_num_experts = T, max(E, int(global_num_experts))
            return original(topk_ids, config, num_tokens, top_k_num, global_num_experts, expert_map, **kwargs)
    wrapped.__r9k_original__ = original
    return wrapped


def run_step_triton(entry: Layer, a: dict[str, Any]) -> None:
    """One step of a layer on the cache through vLLM's TritonExperts: ``a`` holds vLLM's ``apply`` arguments by
    name (``output [T, H]`` written in place, ``hidden_states [T, H]`` (fp8 with ``a1q_scale [T, H / 128]`` for
    block fp8), ``topk_ids [T, k]``, ``topk_weights [T, k]``, the workspaces); the ids are mapped to slots and
    vLLM's apply runs on the slots, once per chunk of the plan (token rows of the step's tensors; a per-token
    ``a1q_scale`` sliced with them).

    Raises:
        RuntimeError: ``w1`` is not the layer's slot buffer; a step that would plan on the host (a sync) while a
            CUDA graph is being captured (naming R9K_MOE_CACHE_STAGING).
    """
    cache = entry.cache
    calls.count(DISPATCH, "r9k", a["hidden_states"].device)  # captured: counts at each replay
    w1, w2 = a["w1"], a["w2"]
    if w1.data_ptr() != cache.weights[0].data_ptr() or w2.data_ptr() != cache.weights[1].data_ptr():
        raise RuntimeError(f"r9k moe: {entry.name}: the experts kernel was called on weights that are not the "
                           "cache's slots (were the layer's parameters replaced after loading?)")
    topk_ids = a["topk_ids"]
    T = int(topk_ids.shape[0])
    if T and not cache.device_step(min(T, cache.max_tokens)) and torch.cuda.is_available() \
            and torch.cuda.is_current_stream_capturing():
        raise RuntimeError(
            f"r9k moe: {entry.name}: a step of {T} tokens plans on the host (R9K_MOE_CACHE_STAGING="
            f"{cache.stage_slots} < {cache.read_through_bound(T)} possible misses), which syncs, inside a CUDA "
            f"graph capture; set R9K_MOE_CACHE_STAGING >= {cache.E - cache.n_slots} (experts - slots) or serve "
            "with --enforce-eager")
    a1q = a.get("a1q_scale")
    if cache.read == "through":
        run_step_through(entry, a, T)
        return

    def rows(t: Any, i: int, j: int) -> Any:  # a per-token tensor's rows i..j-1; anything else as is
        return t[i:j] if isinstance(t, torch.Tensor) and t.dim() >= 1 and t.shape[0] == T else t
    # vLLM's modular kernel carves the output and workspace13 out of one buffer where it runs one chunk (ROCm
    # without aiter's fused MoE): a second apply of this step would write its intermediate over the rows the
    # first wrote, so a step of several applies there writes into its own output, copied back once
    out = a["output"]
    ws13 = a.get("workspace13")
    shared = (isinstance(ws13, torch.Tensor) and isinstance(out, torch.Tensor) and ws13.numel() > 0
              and out.untyped_storage().data_ptr() == ws13.untyped_storage().data_ptr())
    private = None
    with STATE.lock:
        STATE.current, STATE.owner = (cache.E, T), threading.get_ident()
        try:
            for b0 in range(0, T, cache.max_tokens):
                b1 = min(T, b0 + cache.max_tokens)
                before = cache.stats.distinct if STATE.stats and not cache.device_plan else None
                plan = cache.prepare(topk_ids[b0:b1])
                if before is not None:
                    entry.distinct_max = max(entry.distinct_max, cache.stats.distinct - before)
                entry.staged += sum(len(x) for x in plan.stage_of_chunk)
                if shared and private is None and (T > cache.max_tokens or len(plan.chunks) > 1):
                    private = torch.empty_like(out)
                dst = out if private is None else private
                for c, (t0, t1) in enumerate(plan.chunks):
                    if t1 <= t0:
                        continue
                    slot_ids = cache.stage(plan, c) if len(plan.chunks) > 1 else plan.slot_ids
                    i, j = b0 + t0, b0 + t1
                    kw = dict(a)
                    kw.update(output=dst[i:j], hidden_states=a["hidden_states"][i:j],
                              topk_weights=a["topk_weights"][i:j], topk_ids=slot_ids, a1q_scale=rows(a1q, i, j))
                    if (i, j) == (0, T):
                        kw["output"], kw["hidden_states"], kw["topk_weights"] = (dst, a["hidden_states"],
                                                                                 a["topk_weights"])
                    STATE.original_apply(**kw)
            if private is not None:
                out.copy_(private)
        finally:
            STATE.current = STATE.owner = None
    if STATE.stats and time.monotonic() - entry.last_log >= STATE.stats_sec and not (
            torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()):
        entry.last_log = time.monotonic()
        _logger().info(entry.line())


def run_step_through(entry: Layer, a: dict[str, Any], T: int) -> None:
    """A read-through step (``cache.read == "through"``): the cache plans on the device (hits, the inserts'
    copies, the per-expert pointer tables) and vLLM's apply runs on the step's expert ids, its two GEMM launches
    replaced by r9k's pointer-table GEMM on the cache's tables (:func:`_wrap_gemm`); vLLM's tile config and
    expert assignment are computed for the layer's experts, as stock. Steps of more tokens than the cache's bound
    run in blocks of that bound (token rows)."""
    cache = entry.cache
    a1q = a.get("a1q_scale")
    with STATE.lock:
        STATE.current, STATE.owner, STATE.through = (cache.E, T), threading.get_ident(), entry
        try:
            for b0 in range(0, T, cache.max_tokens):
                b1 = min(T, b0 + cache.max_tokens)
                cache.prepare(a["topk_ids"][b0:b1])
                kw = dict(a)
                if (b0, b1) != (0, T):
                    kw.update(output=a["output"][b0:b1], hidden_states=a["hidden_states"][b0:b1],
                              topk_weights=a["topk_weights"][b0:b1], topk_ids=a["topk_ids"][b0:b1],
                              a1q_scale=a1q[b0:b1] if isinstance(a1q, torch.Tensor) and a1q.dim() >= 1
                              and a1q.shape[0] == T else a1q)
                STATE.original_apply(**kw)
        finally:
            STATE.current = STATE.owner = STATE.through = None


def _wrap_gemm(original: Callable, sig: inspect.Signature) -> Callable:
    """vLLM's ``invoke_fused_moe_triton_kernel`` wrapped: inside a read-through step of a layer, a launch on
    that layer's slot buffer (``B`` is ``w13`` or ``w2`` of the cache) runs r9k's pointer-table GEMM on the
    cache's table for it (and its block scales'); every other launch is vLLM's."""
    @functools.wraps(original)
    def wrapped(*args, **kwargs):
        entry = STATE.through
        if entry is None or STATE.owner != threading.get_ident():
            return original(*args, **kwargs)
        ba = sig.bind(*args, **kwargs)
        ba.apply_defaults()
        g = ba.arguments
        c = entry.cache
        ptr = g["B"].data_ptr()
        i = 0 if ptr == c.weights[0].data_ptr() else 1 if ptr == c.weights[1].data_ptr() else None
        if i is None:
            return original(*args, **kwargs)
        from kernels.moe import invoke_ptr_moe

        fp8 = bool(g["use_fp8_w8a8"])
        cfg = g["config"]
        swap = bool(importlib.import_module(original.__module__).enable_swap_ab(cfg["BLOCK_SIZE_M"],
                                                                                cfg["BLOCK_SIZE_N"])) if fp8 else False
        invoke_ptr_moe(g["A"], c.weights[i], c.table(i), g["C"], g["A_scale"], c.weights[i + 2] if fp8 else None,
                       c.table(i + 2) if fp8 else None, g["topk_weights"], g["sorted_token_ids"], g["expert_ids"],
                       g["num_tokens_post_padded"], bool(g["mul_routed_weight"]), int(g["top_k"]), cfg,
                       g["compute_type"], fp8, g["block_shape"], swap, aligned16=c.aligned16)
        return None

    wrapped.__r9k_original__ = original
    return wrapped


# ---- the load summary -------------------------------------------------------------------------------------
def count_moe_layers(model: torch.nn.Module) -> int:
    """MoE layers of ``model``: modules with routed experts (``w13_weight`` and ``w2_weight`` of three dims and
    a ``quant_method``), vLLM's RoutedExperts / FusedMoE whatever experts kernel serves them."""
    n = 0
    for m in model.modules():
        w13, w2 = getattr(m, "w13_weight", None), getattr(m, "w2_weight", None)
        if (getattr(m, "quant_method", None) is not None and isinstance(w13, torch.Tensor)
                and isinstance(w2, torch.Tensor) and w13.dim() == 3):
            n += 1
    return n


def summary(model: torch.nn.Module, taken_before: int = 0) -> str:
    """Print and return the ``R9K-MOE-CACHE`` line for ``model`` (the layers taken since ``taken_before``).

    Raises:
        ValueError: naming R9K_MOE_CACHE_SLOTS: the model has no MoE layer.
    """
    moe = count_moe_layers(model)
    if moe == 0:
        raise ValueError(f"R9K_MOE_CACHE_SLOTS={STATE.slots} asks for r9k's expert cache, but the model has no MoE "
                         "layer (set it to 0, or serve a mixture-of-experts model)")
    taken = len(STATE.layers) - taken_before
    staging = STATE.layers[taken_before].cache.stage_slots if taken else 0  # the first taken layer's
    text = counters.summary_line(os.getpid(), _rank(), taken, moe, STATE.slots, staging, STATE.thresh)
    _logger().info(text)
    if taken < moe:
        log.warning("r9k moe: %d of %d MoE layers took the cache (%s)", taken, moe,
                    "; ".join(f"{k}: {v}" for k, v in STATE.passed.items()) or "served by another experts kernel")
    return text


def _wrap_loader(original: Callable) -> Callable:
    @functools.wraps(original)
    def process_weights_after_loading(model, *args, **kwargs):
        n0 = len(STATE.layers)
        out = original(model, *args, **kwargs)
        if STATE.backend == "triton":
            take_model(model)
        summary(model, n0)
        return out

    process_weights_after_loading.__r9k_original__ = original
    return process_weights_after_loading


def log_all() -> None:
    """Print every layer's counter line (at exit, when counters are on)."""
    if not STATE.stats:
        return
    for entry in STATE.layers:
        try:
            _logger().info(entry.line())
        except Exception:  # noqa: BLE001 - at exit: never raise
            pass


# ---- install / uninstall ----------------------------------------------------------------------------------
def _original(owner: Any, attr: str) -> Callable:
    fn = getattr(owner, attr)
    return getattr(fn, "__r9k_original__", fn)


def _patch(owner: Any, attr: str, wrapper: Callable) -> None:
    original = _original(owner, attr)
    was_own = attr in vars(owner)
    setattr(owner, attr, wrapper)
    STATE.patches.append((owner, attr, original, was_own))


def uninstall() -> None:
    """Put back vLLM's methods and functions (layers already on the cache stay on it)."""
    while STATE.patches:
        owner, attr, original, was_own = STATE.patches.pop()
        if was_own:
            setattr(owner, attr, original)
        else:
            delattr(owner, attr)


def signature(experts_cls: type) -> inspect.Signature:
    """The signature of vLLM's ``apply`` of ``experts_cls`` (with self); SignatureMismatch without one of
    :data:`APPLY_PARAMS`, or with a parameter the dispatch cannot fill that has no default."""
    fn = _original(experts_cls, "apply")
    sig = inspect.signature(fn)
    missing = [n for n in APPLY_PARAMS if n not in sig.parameters]
    fillable = set(APPLY_PARAMS) | {"self", "global_num_experts", "expert_map", "a1q_scale", "a2_scale", "workspace13",
                                    "workspace2", "expert_tokens_meta"}
    unknown = [n for n, p in sig.parameters.items() if n not in fillable and p.default is inspect.Parameter.empty
               and p.kind not in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)]
    if missing or unknown:
        raise SignatureMismatch(f"{fn.__qualname__}{sig}: " + "; ".join(
            ([f"no parameter(s) {', '.join(missing)} that the r9k MoE dispatch reads"] if missing else [])
            + ([f"parameter(s) {', '.join(unknown)} that it cannot fill"] if unknown else [])))
    return sig


def install(experts_cls: type | None = None, loader: Any = None, backend: str | None = None,
            triton_module: Any = None) -> list[str]:
    """Install the expert cache (default: on vLLM's own classes for the platform: ``CPUUnquantizedExperts`` on
    vLLM's CPU platform, ``TritonExperts`` on CUDA and ROCm, and vLLM's loader module); returns what was
    installed. ``backend`` ("cpu" or "triton") says which binding ``experts_cls`` gets (default "cpu" for a given
    class); ``triton_module`` is the module whose TRITON_FUNCS are wrapped (default TRITON_MODULE; None with a
    test's class: none). ``R9K_MOE_CACHE_SLOTS=0`` installs nothing and removes an earlier install.

    Raises:
        SignatureMismatch: vLLM's apply (or a TRITON_FUNCS function) lacks a parameter the dispatch reads.
        r9k.contract.BindingFailed: (vLLM's own classes) a binding of the ``moe`` family does not hold.
        ValueError: a knob's value its type or range rejects (naming it).
    """
    uninstall()
    STATE.slots = int(knobs.MOE_CACHE_SLOTS())
    STATE.staging = int(knobs.MOE_CACHE_STAGING())
    STATE.read = str(knobs.MOE_CACHE_READ())
    STATE.gemm = None
    STATE.thresh = float(knobs.MOE_CACHE_THRESH())
    STATE.stats = bool(knobs.MOE_CACHE_STATS())
    STATE.stats_sec = float(knobs.MOE_CACHE_STATS_SEC())
    if STATE.slots == 0:
        log.info("r9k moe: R9K_MOE_CACHE_SLOTS=0: vLLM's MoE experts are left as is")
        return []
    if experts_cls is None:
        try:
            from vllm.platforms import current_platform

            cpu, gpu = current_platform.is_cpu(), current_platform.is_cuda_alike()
        except Exception as e:  # noqa: BLE001 - no vLLM here
            log.info("r9k moe: vLLM's platform unknown (%s); nothing installed", e)
            return []
        if cpu or gpu:  # every binding of the family first: a failure installs nothing (BindingFailed)
            contract.require("moe", "cpu" if cpu else "gpu")
        if cpu:
            backend = "cpu"
            experts_cls = getattr(importlib.import_module(EXPERTS_MODULE), EXPERTS_CLASS)
        elif gpu:
            backend = "triton"
            triton_module = importlib.import_module(TRITON_MODULE)
            experts_cls = getattr(triton_module, TRITON_CLASS)
        else:
            log.info("r9k moe: the expert cache binds vLLM's CPU experts and its Triton experts (CUDA, ROCm); this "
                     "platform has neither; nothing installed")
            return []
        loader = importlib.import_module(LOADER_MODULE)
    backend = backend or "cpu"
    sig = signature(experts_cls)
    funcs = triton_signatures(triton_module) if backend == "triton" and triton_module is not None else {}
    gemm_sig = triton_gemm_signature(triton_module) if backend == "triton" and triton_module is not None else None
    try:
        from vllm.model_executor.layers.fused_moe.activation import MoEActivation

        STATE.activation_cls = MoEActivation
    except Exception:  # noqa: BLE001 - a test's stand-in experts class: activations stay strings
        STATE.activation_cls = None
    _register_op()
    STATE.backend = backend
    STATE.experts_cls = experts_cls
    STATE.apply_sig = sig
    STATE.original_apply = _original(experts_cls, "apply")
    if backend == "cpu":
        _patch(experts_cls, "process_weights_after_loading",
               _wrap_pwal(_original(experts_cls, "process_weights_after_loading")))
    _patch(experts_cls, "apply", _wrap_apply(STATE.original_apply, sig))
    for fname in funcs:
        _patch(triton_module, fname, _wrap_triton_func(fname, _original(triton_module, fname)))
    if gemm_sig is not None:
        STATE.gemm = _original(triton_module, TRITON_GEMM[0])
        _patch(triton_module, TRITON_GEMM[0], _wrap_gemm(STATE.gemm, gemm_sig))
    if loader is not None and hasattr(loader, "process_weights_after_loading"):
        _patch(loader, "process_weights_after_loading", _wrap_loader(_original(loader, "process_weights_after_loading")))
    _atexit_once()
    name = f"{DISPATCH} <- {experts_cls.__module__}.{experts_cls.__qualname__}.apply"
    what = ("unquantized MoE layers on the CPU" if backend == "cpu" else
            "16-bit and fp8 w8a8 MoE layers of vLLM's Triton experts (taken after loading; on CUDA vLLM calls them "
            "inside its moe_forward op, opaque to torch.compile)")
    log.info("r9k moe: %s -> r9k's expert cache (%d slots, misses read %s, staging %s, threshold %g); installed: %s",
             what, STATE.slots, STATE.read, "experts - slots" if STATE.staging == -1 else STATE.staging, STATE.thresh,
             name)
    return [name]


def triton_signatures(module: Any) -> dict[str, inspect.Signature]:
    """The signatures of TRITON_FUNCS in ``module`` (vLLM's triton_moe); SignatureMismatch where one is missing
    or its leading parameters are not the ones the wrappers pass."""
    out = {}
    for fname, params in TRITON_FUNCS.items():
        fn = getattr(module, fname, None)
        if fn is None:
            raise SignatureMismatch(f"{getattr(module, '__name__', module)} has no {fname} for the r9k MoE dispatch")
        sig = inspect.signature(_original(module, fname))
        if tuple(sig.parameters)[: len(params)] != params:
            raise SignatureMismatch(f"{fname}{sig}: the r9k MoE dispatch passes ({', '.join(params)})")
        out[fname] = sig
    return out


def triton_gemm_signature(module: Any) -> inspect.Signature | None:
    """The signature of TRITON_GEMM's function in ``module`` (None where the module has none: layers then stage
    their misses); SignatureMismatch where its leading parameters are not the ones the wrapper reads."""
    fname, params = TRITON_GEMM
    fn = getattr(module, fname, None)
    if fn is None:
        return None
    sig = inspect.signature(_original(module, fname))
    if tuple(sig.parameters)[: len(params)] != params:
        raise SignatureMismatch(f"{fname}{sig}: the r9k MoE dispatch reads ({', '.join(params)})")
    return sig


_ATEXIT = False


def _atexit_once() -> None:
    global _ATEXIT
    if not _ATEXIT:
        _ATEXIT = True
        atexit.register(log_all)

"""What r9k binds to in vLLM: every symbol it wraps, calls or reads, with the behaviour it relies on where a
signature is not enough, checked against the running vLLM when the plugin loads.

A :class:`Binding` names a vLLM module and an attribute path in it (``Class.method``), the parameters r9k passes
or reads by name, and the dispatch family that needs it (``gdn``, ``fp8``, ``moe``; ``calls`` for the step marks
of :mod:`r9k.calls`, a figure rather than a dispatch). :func:`check` reads the bindings of a family from a source
of facts: the running vLLM (:class:`LiveFacts`: import, ``inspect.signature``) or a record of another release's
sources (:class:`RecordedFacts`: tests/r9k/vllm_0_33_0.json). An installer (:mod:`r9k.ops`) checks its family
before it patches anything: where a binding fails, that family's dispatch is not installed and each failure is
named on the provenance line (``failed=moe:moe.cpu.apply:signature``: family, binding, code; :class:`Failure`).

Behaviour beyond a signature:

* the expert cache puts its slot buffers in a layer with :func:`adopt_parameter`, never through vLLM's
  ``replace_parameter``: vLLM 0.32's registers a new parameter holding the tensor given; 0.33's keeps the old
  parameter object and *copies* a tensor of the old one's shape, stride, dtype and device into the old storage
  (where slots + staging equal the layer's experts), which on the CPU is the host store the cache keeps. The
  binding ``moe.adopt`` sets a tiny parameter of a module on the CPU at load and requires the module to hand out
  the very storage it was given.
* vLLM 0.33's Qwen GDN layer calls FlashInfer's prefill kernel directly (not through ``ChunkGatedDeltaRule``, the
  op r9k wraps) for a step that writes prefix-cache checkpoints: where FlashInfer is the GDN prefill backend and
  the cache mode is ``align`` (prefix caching). That is known per layer once the model is built
  (``QwenGatedDeltaNetAttention.get_prefill_checkpoint_alignment()`` is not None): :mod:`r9k.ops.gdn` then takes
  its dispatch out of that process and calls :func:`refuse`, whose listeners (:func:`r9k.register`'s) print the
  provenance line again with the failure ``gdn:gdn.qwen.checkpoint:bypassed``.

``python -m r9k.contract`` (or ``import r9k.contract as c; c.report()``) prints every binding against the vLLM it
runs with. Failure codes: ``no-module`` (the module does not import), ``no-symbol`` (the attribute is missing),
``signature`` (a parameter r9k reads is missing, or the leading ones are not those it passes), ``behaviour`` (a
behaviour check failed), ``bypassed`` (vLLM reaches the kernel without the op r9k wraps).
"""
from __future__ import annotations

import importlib
import inspect
import json
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Protocol

# ---- the modules and parameters (the ops import these: one place) -------------------------------------------
QWEN_GDN = "vllm.model_executor.layers.mamba.gdn.qwen_gdn_linear_attn"
OLMO_GDN = "vllm.model_executor.layers.mamba.gdn.olmo_gdn_linear_attn"
FP8_KERNEL = "vllm.model_executor.kernels.linear.scaled_mm.triton"
FP8_UTILS = "vllm.model_executor.layers.quantization.utils.fp8_utils"
CPU_MOE = "vllm.model_executor.layers.fused_moe.experts.cpu_moe"
TRITON_MOE = "vllm.model_executor.layers.fused_moe.experts.triton_moe"
FUSED_MOE = "vllm.model_executor.layers.fused_moe.fused_moe"
LOADER = "vllm.model_executor.model_loader.base_loader"

#: the GDN core call's parameters the dispatch reads by name
GDN_CORE_PARAMS = ("q", "k", "v", "g", "beta", "initial_state", "output_final_state", "cu_seqlens")
#: ``causal_conv1d_fn``'s parameters the dispatch reads by name
GDN_CONV_PARAMS = ("x", "weight", "bias", "conv_states", "query_start_loc")
#: the fp8 kernel's ``apply_weights`` parameters
FP8_APPLY_PARAMS = ("layer", "x", "bias")
#: the experts' ``apply`` parameters the MoE dispatch reads or passes by name
MOE_APPLY_PARAMS = ("output", "hidden_states", "w1", "w2", "topk_weights", "topk_ids", "activation",
                    "apply_router_weight_on_input")
#: leading parameters of the triton_moe functions the MoE dispatch wraps
MOE_TRITON_FUNCS = {"try_get_optimal_moe_config": ("w1_shape", "w2_shape", "top_k", "dtype", "M", "block_shape"),
                    "_prepare_expert_assignment": ("topk_ids", "config", "num_tokens", "top_k_num",
                                                   "global_num_experts", "expert_map")}
#: vLLM's MoE GEMM launcher and its leading parameters
MOE_TRITON_GEMM = ("invoke_fused_moe_triton_kernel",
                   ("A", "B", "C", "A_scale", "B_scale", "topk_weights", "sorted_token_ids", "expert_ids",
                    "num_tokens_post_padded", "mul_routed_weight", "top_k", "config", "compute_type", "use_fp8_w8a8",
                    "use_int8_w8a8", "use_int8_w8a16", "use_int4_w4a16", "per_channel_quant", "block_shape",
                    "B_bias"))
CODES = ("no-module", "no-symbol", "signature", "behaviour", "bypassed")


@dataclass(frozen=True)
class Binding:
    """One thing r9k relies on in vLLM.

    ``symbol`` is an attribute path in ``module`` ("" for the module itself); ``params`` the parameter names r9k
    passes or reads (all present; with ``leading``, exactly the first ones in that order, ``self`` aside);
    ``optional``: r9k goes without it where vLLM lacks it (said in the log), never a failure; ``where``: the
    platform whose dispatch binds it ("cpu", "gpu" or "any"); ``relies``: the behaviour relied on, in words;
    ``behaviour``: a check of that behaviour run on the live vLLM (None or why it fails).
    """

    id: str
    family: str
    module: str
    symbol: str = ""
    params: tuple[str, ...] = ()
    leading: bool = False
    optional: bool = False
    where: str = "any"
    relies: str = ""
    behaviour: Callable[[], str | None] | None = None


@dataclass(frozen=True)
class Failure:
    """A binding that does not hold: its id, family, code (one of :data:`CODES`) and why, in words."""

    binding: str
    family: str
    code: str
    why: str

    def token(self) -> str:
        """The failure as the provenance line's ``failed=`` field names it: ``family:binding:code``."""
        return f"{self.family}:{self.binding}:{self.code}"


class BindingFailed(RuntimeError):
    """A family's bindings do not hold against the running vLLM: its dispatch is not installed."""

    def __init__(self, failures: list[Failure]):
        self.failures = failures
        super().__init__("; ".join(f"{f.binding}: {f.why}" for f in failures))


# ---- r9k's own parameter setter (what moe.adopt checks) -----------------------------------------------------
def adopt_parameter(layer: Any, name: str, tensor: Any) -> Any:
    """Make ``tensor`` the storage of ``layer``'s parameter ``name``: a new ``torch.nn.Parameter`` wrapping it
    (``requires_grad`` False) replaces the old one, carrying the old one's ``weight_loader`` (so the layer can
    reload weights) and the attributes set on ``tensor`` but no other of the old one's, as vLLM 0.32's
    ``replace_parameter`` does; never a copy into the old
    storage (vLLM 0.33's ``replace_parameter`` copies a same-shape tensor). Returns the new parameter.

    Raises:
        TypeError: ``tensor`` is not a torch.Tensor.
    """
    import torch

    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"adopt_parameter({name!r}): {type(tensor).__name__} is not a torch.Tensor")
    old = getattr(layer, name, None)
    attrs = {k: v for k, v in vars(tensor).items() if k not in ("weight_loader", "_weight_loader")}
    new = torch.nn.Parameter(tensor.data if isinstance(tensor, torch.nn.Parameter) else tensor, requires_grad=False)
    for k, v in attrs.items():  # a flag vLLM set on the tensor (e.g. is_shuffled) rides along, as in 0.32
        setattr(new, k, v)
    if old is not None and hasattr(old, "weight_loader"):
        new.weight_loader = old.weight_loader
    setattr(layer, name, new)  # an nn.Module registers it in place of the old one
    return new


def _adopts() -> str | None:
    """moe.adopt: the slot buffer r9k puts in a layer is the storage the layer's parameter hands out."""
    import torch

    layer = torch.nn.Module()
    layer.w = torch.nn.Parameter(torch.zeros(2, 3), requires_grad=False)
    layer.w.weight_loader = len
    old = layer.w.data_ptr()
    buf = torch.ones(2, 3)
    adopt_parameter(layer, "w", buf)
    if layer.w.data_ptr() != buf.data_ptr():
        return "a module's parameter set from a tensor does not hand out that tensor's storage"
    if layer._parameters.get("w") is not layer.w or layer.w.requires_grad or layer.w.weight_loader is not len:
        return "the parameter set is not the module's registered, frozen parameter with its weight_loader"
    if old == buf.data_ptr():
        return "the old storage was reused"
    return None


def replace_parameter_copies() -> bool | None:
    """Whether the running vLLM's ``replace_parameter`` copies a same-shape tensor into the old parameter's storage
    (0.33) rather than adopting it (0.32); None where it cannot be called. Informational: r9k does not call it."""
    try:
        import torch
        from vllm.model_executor.utils import replace_parameter

        layer = torch.nn.Module()
        layer.w = torch.nn.Parameter(torch.zeros(2, 3), requires_grad=False)
        buf = torch.ones(2, 3)
        replace_parameter(layer, "w", buf)
        return layer.w.data_ptr() != buf.data_ptr()
    except Exception:  # noqa: BLE001 - no vLLM, or another signature: unknown
        return None


# ---- the contract ---------------------------------------------------------------------------------------------
BINDINGS: tuple[Binding, ...] = (
    # GDN (CUDA, ROCm): r9k/ops/gdn.py
    Binding("gdn.qwen.op", "gdn", QWEN_GDN, "ChunkGatedDeltaRule.forward", where="gpu",
            relies="the Qwen3-Next / Qwen3.5 GDN layer runs its prefill core through this op's forward"),
    Binding("gdn.qwen.core", "gdn", QWEN_GDN, "ChunkGatedDeltaRule.forward_native", GDN_CORE_PARAMS, where="gpu",
            relies="the core call's signature, to which every call of the op is bound"),
    Binding("gdn.qwen.conv", "gdn", QWEN_GDN, "causal_conv1d_fn", GDN_CONV_PARAMS, where="gpu",
            relies="the layer calls the module-level name, so rebinding it routes the prefill conv"),
    Binding("gdn.qwen.layer", "gdn", QWEN_GDN, "QwenGatedDeltaNetAttention", where="gpu"),
    Binding("gdn.qwen.warmup", "gdn", QWEN_GDN, "QwenGatedDeltaNetAttention._warmup_prefill_kernels",
            optional=True, where="gpu", relies="the profile run's warm-up calls (kept on vLLM's kernels)"),
    Binding("gdn.qwen.checkpoint", "gdn", QWEN_GDN, "QwenGatedDeltaNetAttention.get_prefill_checkpoint_alignment",
            optional=True, where="gpu",
            relies="not None for a layer that writes prefix-cache checkpoints with FlashInfer's kernel, called "
                   "without the op: r9k refuses GDN in that process (checked as each layer is built)"),
    Binding("gdn.olmo.core", "gdn", OLMO_GDN, "chunk_gated_delta_rule", GDN_CORE_PARAMS, where="gpu",
            relies="the Olmo GDN layer calls the module-level name"),
    Binding("gdn.olmo.conv", "gdn", OLMO_GDN, "causal_conv1d_fn", GDN_CONV_PARAMS, where="gpu"),
    # fp8 block GEMM (CUDA with --linear-backend triton, ROCm): r9k/ops/fp8.py
    Binding("fp8.kernel", "fp8", FP8_KERNEL, "TritonFp8BlockScaledMMKernel", where="gpu"),
    Binding("fp8.apply", "fp8", FP8_KERNEL, "TritonFp8BlockScaledMMKernel.apply_weights", FP8_APPLY_PARAMS,
            where="gpu", relies="vLLM's selected block-fp8 kernel runs every such linear layer through it"),
    Binding("fp8.supported", "fp8", FP8_KERNEL, "TritonFp8BlockScaledMMKernel.is_supported", where="gpu"),
    Binding("fp8.layer_params", "fp8", FP8_KERNEL, "TritonFp8BlockScaledMMKernel._get_layer_params", ("layer",),
            where="gpu", relies="the layer's weight, block scale and input scales, read to decide coverage"),
    Binding("fp8.quant", "fp8", FP8_UTILS, "per_token_group_quant_fp8", where="gpu",
            relies="vLLM's own quant, run on a call r9k's kernels refuse"),
    Binding("fp8.gemm", "fp8", FP8_UTILS, "w8a8_triton_block_scaled_mm", where="gpu"),
    # the expert cache: r9k/ops/moe.py
    Binding("moe.platform", "moe", "vllm.platforms", "current_platform", where="any"),
    Binding("moe.loader", "moe", LOADER, "process_weights_after_loading", ("model",), where="any",
            relies="called once the model's weights are processed (the load summary; the Triton layers' take)"),
    Binding("moe.activation", "moe", "vllm.model_executor.layers.fused_moe.activation", "MoEActivation",
            where="any"),
    Binding("moe.config", "moe", "vllm.config", "get_current_vllm_config", where="any",
            relies="the scheduler's max_num_batched_tokens bounds a step's tokens"),
    Binding("moe.adopt", "moe", "torch.nn", "Module", where="any", behaviour=_adopts,
            relies="a parameter r9k sets hands out the slot buffer's storage (r9k's own setter, not vLLM's "
                   "replace_parameter, which copies a same-shape tensor on 0.33)"),
    Binding("moe.cpu.apply", "moe", CPU_MOE, "CPUUnquantizedExperts.apply", MOE_APPLY_PARAMS, where="cpu",
            relies="vLLM's CPU experts run every step of an unquantized MoE layer on w1 / w2 = the layer's "
                   "w13_weight / w2_weight"),
    Binding("moe.cpu.repack", "moe", CPU_MOE, "CPUUnquantizedExperts.process_weights_after_loading", ("layer",),
            where="cpu", relies="repacks the layer's experts per expert (same shape) before r9k takes them"),
    Binding("moe.triton.apply", "moe", TRITON_MOE, "TritonExperts.apply", MOE_APPLY_PARAMS, where="gpu"),
    *(Binding(f"moe.triton.{name}", "moe", TRITON_MOE, name, params, leading=True, where="gpu",
              relies="called by TritonExperts.apply through the module-level name")
      for name, params in MOE_TRITON_FUNCS.items()),
    Binding("moe.triton.gemm", "moe", TRITON_MOE, MOE_TRITON_GEMM[0], MOE_TRITON_GEMM[1], leading=True,
            optional=True, where="gpu", relies="the GEMM launcher the read-through path replaces (absent: stage)"),
    Binding("moe.triton.swap_ab", "moe", FUSED_MOE, "enable_swap_ab", where="gpu"),
    # the step marks (a figure: a failure here is logged, never a dispatch refused): r9k/calls.py
    Binding("calls.v2.execute", "calls", "vllm.v1.worker.gpu.model_runner", "GPUModelRunner.execute_model",
            ("scheduler_output",), optional=True),
    Binding("calls.v1.execute", "calls", "vllm.v1.worker.gpu_model_runner", "GPUModelRunner.execute_model",
            ("scheduler_output",), optional=True),
    Binding("calls.v1.sample", "calls", "vllm.v1.worker.gpu_model_runner", "GPUModelRunner.sample_tokens",
            optional=True),
    # the plugin entry point
    Binding("plugin.loader", "plugin", "vllm.plugins", "load_general_plugins",
            relies="calls r9k.register (entry point group vllm.general_plugins) in every process it starts"),
)
FAMILIES = ("gdn", "fp8", "moe", "calls", "plugin")


# ---- facts: the running vLLM, or a record of another release's sources --------------------------------------
class Facts(Protocol):
    """Where a binding's symbol is looked up."""

    def lookup(self, module: str, symbol: str) -> tuple[str | None, list[str] | None]:
        """(failure code or None, the parameter names where the symbol is a function or method, else None)."""
        ...


class LiveFacts:
    """The running vLLM: modules imported, attributes read, signatures by ``inspect.signature`` (the function r9k
    wrapped, where r9k's wrapper is in place: ``__r9k_original__``)."""

    def __init__(self):
        self.errors: dict[str, str] = {}

    def lookup(self, module: str, symbol: str) -> tuple[str | None, list[str] | None]:
        try:
            obj: Any = importlib.import_module(module)
        except Exception as e:  # noqa: BLE001 - ImportError, or a module that fails on this platform
            self.errors[module] = f"{type(e).__name__}: {e}"
            return "no-module", None
        for part in [p for p in symbol.split(".") if p]:
            if not hasattr(obj, part):
                return "no-symbol", None
            obj = getattr(obj, part)
            obj = getattr(obj, "__r9k_original__", obj)
        if inspect.isclass(obj) or not callable(obj):
            return None, None
        try:
            return None, list(inspect.signature(obj).parameters)
        except (TypeError, ValueError):
            return None, None


class RecordedFacts:
    """Facts recorded from a release's sources (a JSON file: ``{"vllm": version, "modules": [...], "symbols":
    {"module:Attr.path": [parameter names] | "class" | "value"}}``); a symbol not recorded is missing.

    Raises:
        ValueError: the file is not such a record (naming the file and the field).
    """

    def __init__(self, path: Path):
        data = json.loads(Path(path).read_text())
        for key, typ in (("vllm", str), ("modules", list), ("symbols", dict)):
            if not isinstance(data.get(key), typ):
                raise ValueError(f"{path}: field {key!r} must be a {typ.__name__}")
        self.version: str = data["vllm"]
        self.modules = set(data["modules"])
        self.symbols: dict[str, Any] = data["symbols"]
        self.facts: dict[str, Any] = data.get("facts", {})

    def lookup(self, module: str, symbol: str) -> tuple[str | None, list[str] | None]:
        if module not in self.modules:
            return "no-module", None
        if not symbol:
            return None, None
        got = self.symbols.get(f"{module}:{symbol}")
        if got is None:
            return "no-symbol", None
        return None, (list(got) if isinstance(got, list) else None)


def evaluate(b: Binding, facts: Facts, behaviour: bool = True) -> Failure | None:
    """The failure of binding ``b`` against ``facts`` (None where it holds, or where it is optional and absent);
    ``behaviour``: also run its behaviour check (the live vLLM only)."""
    code, params = facts.lookup(b.module, b.symbol)
    where = f"{b.module}{':' + b.symbol if b.symbol else ''}"
    if code is not None:
        if b.optional:
            return None
        extra = getattr(facts, "errors", {}).get(b.module, "")
        return Failure(b.id, b.family, code, f"{where}: {'does not import' if code == 'no-module' else 'missing'}"
                       + (f" ({extra})" if extra else ""))
    if b.params:
        have = [p for p in (params or []) if p != "self"]
        if params is None:
            return Failure(b.id, b.family, "signature", f"{where}: not a function with a signature")
        if b.leading and tuple(have[: len(b.params)]) != b.params:
            return Failure(b.id, b.family, "signature",
                           f"{where}({', '.join(have)}): r9k passes ({', '.join(b.params)}) first")
        missing = [p for p in b.params if p not in have]
        if missing:
            return Failure(b.id, b.family, "signature",
                           f"{where}({', '.join(have)}) has no parameter(s) {', '.join(missing)} that r9k reads")
    if behaviour and b.behaviour is not None:
        try:
            why = b.behaviour()
        except Exception as e:  # noqa: BLE001 - a check that cannot run does not hold
            why = f"the check raised {type(e).__name__}: {e}"
        if why:
            return Failure(b.id, b.family, "behaviour", f"{where}: {why}")
    return None


def bindings(family: str | None = None, where: str | None = None) -> list[Binding]:
    """The bindings of ``family`` (all where None) that a dispatch on platform ``where`` ("cpu" or "gpu"; all
    where None) needs."""
    return [b for b in BINDINGS if (family is None or b.family == family)
            and (where is None or b.where in ("any", where))]


def check(family: str | None = None, where: str | None = None, facts: Facts | None = None) -> list[Failure]:
    """The failures of :func:`bindings` ``(family, where)`` against ``facts`` (default: the running vLLM, with the
    behaviour checks). Never raises."""
    live = facts is None
    facts = LiveFacts() if facts is None else facts
    return [f for b in bindings(family, where) if (f := evaluate(b, facts, behaviour=live)) is not None]


def require(family: str, where: str) -> None:
    """Raise :class:`BindingFailed` where a binding of ``family`` on ``where`` fails against the running vLLM."""
    failures = check(family, where)
    if failures:
        raise BindingFailed(failures)


def vllm_version() -> str:
    """The running vLLM's version ("-" where vLLM does not import)."""
    try:
        from vllm.version import __version__

        return str(__version__)
    except Exception:  # noqa: BLE001
        return "-"


# ---- failures found after load (a layer built that the dispatch cannot serve) ---------------------------------
_LISTENERS: list[Callable[[Failure], None]] = []
_REFUSED: list[Failure] = []
_LOCK = threading.Lock()


def on_refusal(listener: Callable[[Failure], None]) -> None:
    """Call ``listener(failure)`` for every :func:`refuse` in this process (r9k.register's: the provenance line)."""
    with _LOCK:
        if listener not in _LISTENERS:
            _LISTENERS.append(listener)


def refuse(failure: Failure) -> bool:
    """Record a binding found not to hold after load (its family's dispatch already taken out by the caller) and
    tell the listeners, once per binding and process. Returns whether it was new."""
    with _LOCK:
        if any(f.binding == failure.binding for f in _REFUSED):
            return False
        _REFUSED.append(failure)
        listeners = list(_LISTENERS)
    for listener in listeners:
        try:
            listener(failure)
        except Exception:  # noqa: BLE001 - a listener never takes the model build down
            import logging

            logging.getLogger("r9k").exception("r9k contract: a refusal listener raised")
    return True


def refused() -> list[Failure]:
    """The failures :func:`refuse` recorded in this process."""
    with _LOCK:
        return list(_REFUSED)


def describe(token: str) -> str:
    """A ``failed=`` entry in words: ``family:binding:code`` -> "binding (code): what r9k relies on there"; a bare
    family name (an install that raised) -> "family (install raised)"."""
    parts = token.split(":")
    if len(parts) != 3:
        return f"{token} (install raised)"
    fam, bid, code = parts
    b = next((x for x in BINDINGS if x.id == bid), None)
    what = f"{b.module}:{b.symbol}" if b is not None else "a binding this tree does not know"
    return f"{bid} ({code}): {what}" + (f" - {b.relies}" if b is not None and b.relies else "")


def report(facts: Facts | None = None, file: Any = None) -> str:
    """Every binding against ``facts`` (default: the running vLLM), one line each, printed to ``file`` (default
    stdout) and returned: ``ok``, ``absent`` (optional, r9k goes without) or ``FAILED <code>: why``."""
    import sys

    live = facts is None
    facts = LiveFacts() if facts is None else facts
    version = vllm_version() if live else getattr(facts, "version", "?")
    out = [f"r9k binding contract against vLLM {version}"]
    for b in BINDINGS:
        f = evaluate(b, facts, behaviour=live)
        if f is not None:
            state = f"FAILED {f.code}: {f.why}"
        elif b.optional and facts.lookup(b.module, b.symbol)[0] is not None:
            state = "absent (optional: r9k goes without it)"
        else:
            state = "ok"
        out.append(f"  [{b.family:6}] {b.id:28} {state}")
    if live:
        copies = replace_parameter_copies()
        out.append("  vllm.model_executor.utils.replace_parameter: " + {
            True: "copies a same-shape tensor into the old storage (r9k does not call it)",
            False: "adopts the tensor given (r9k does not call it)", None: "not callable here"}[copies])
        out += [f"  refused after load: {f.token()} ({f.why})" for f in refused()]
    text = "\n".join(out)
    print(text, file=file or sys.stdout)
    return text


if __name__ == "__main__":  # python -m r9k.contract
    report()

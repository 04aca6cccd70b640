"""Dispatch of vLLM's block-scaled fp8 linear op to r9k's activation quant and block GEMM (kernels/fp8/).

vLLM 0.32 runs a block-quantised fp8 checkpoint (128x128 weight blocks, dynamic 1x128 activation groups:
DeepSeek-V3, Qwen3 fp8) through the ``Fp8BlockScaledMMLinearKernel`` it selects per platform
(vllm/model_executor/kernels/linear/__init__.py, ``_POSSIBLE_FP8_BLOCK_KERNELS``); its Triton one,
``TritonFp8BlockScaledMMKernel``, is what ROCm runs without AITER (the seeds' RDNA4 cards). On CUDA the automatic
order puts DeepGEMM, CUTLASS's block kernel and Marlin's fp8 kernel before it, so a CUDA server reaches this
dispatch only with ``--linear-backend triton`` (serve/h200-next-fp8.yaml). Its ``apply_weights(layer, x,
bias=None)`` (inherited from ``Fp8BlockScaledMMLinearKernel``) quantises x per token and group of 128
(``QuantFP8``) and calls
``torch.ops.vllm.w8a8_triton_block_scaled_mm_func`` -> ``fp8_utils.w8a8_triton_block_scaled_mm``.

With ``R9K_FP8_BLOCK_GEMM=r9k`` that method of ``TritonFp8BlockScaledMMKernel`` is wrapped (bound to the real
signature, read with ``inspect.signature`` at install time): a call whose layer r9k covers (weight blocks
128x128, dynamic 1x128 activation groups, no static input scale, an fp8 e4m3fn / e4m3fnuz weight ``[N, K]``
with K a multiple of 128 and fp32 block scales ``[ceil(N/128), K/128]``, a bf16 / fp16 / fp32 activation and
output) runs ``kernels.fp8.fp8_linear`` (quant + GEMM; ``+ bias``); anything else goes to vLLM's method. Under
torch.compile (vLLM's compiled model) the call is the custom op ``torch.ops.r9k.fp8_block_linear``, opaque to
Dynamo; eager calls run the same function directly. A ValueError from r9k's kernels (a call they cannot take)
sends the call to vLLM's kernel, logged once. ``stock`` installs nothing and removes an earlier install.
"""
from __future__ import annotations

import functools
import importlib
import inspect
import logging
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from kernels._util import _interpreting, cdiv
from r9k import calls, contract, knobs

log = logging.getLogger("r9k")

KERNEL_MODULE = contract.FP8_KERNEL
KERNEL_CLASS = "TritonFp8BlockScaledMMKernel"
APPLY_PARAMS = contract.FP8_APPLY_PARAMS  # what the wrapper reads of vLLM's apply_weights
DISPATCH = "fp8_block_gemm"
_FP8 = (torch.float8_e4m3fn, torch.float8_e4m3fnuz)
_FLOATS = (torch.bfloat16, torch.float16, torch.float32)


class SignatureMismatch(RuntimeError):
    """vLLM's method lacks a parameter the dispatch reads: the dispatch is not installed there."""


@dataclass
class _State:
    patches: list[tuple[Any, str, Any, bool]] = field(default_factory=list)
    routed: dict[str, int] = field(default_factory=lambda: {"r9k": 0, "stock": 0, "refused": 0})
    refused_logged: bool = False


STATE = _State()


def _refused(err: Exception) -> None:
    STATE.routed["refused"] += 1
    if not STATE.refused_logged:
        STATE.refused_logged = True
        log.warning("r9k fp8: the block GEMM refused a call (%s); vLLM's kernel runs it, as it will any such call "
                    "(logged once)", err)


def _covered(kernel, layer) -> tuple[torch.Tensor, torch.Tensor, torch.dtype] | None:
    """(weight, block scale, output dtype) when r9k covers this kernel's layer, else None. Reads only the
    kernel's configuration and the layer's parameters (shapes and dtypes), nothing on the device."""
    try:
        cfg = kernel.config
        act = cfg.activation_quant_key.scale
        gs, wgs = act.group_shape, kernel.weight_group_shape
        if act.static or (gs.row, gs.col) != (1, 128) or (wgs.row, wgs.col) != (128, 128):
            return None
        p = kernel._get_layer_params(layer)
        w, s, out_dtype = p.weight, p.block_scale, cfg.out_dtype
    except Exception:  # noqa: BLE001 - a layer or config this dispatch does not know: vLLM's
        return None
    if p.input_scale is not None or getattr(p, "input_scale_ub", None) is not None:
        return None
    if not isinstance(w, torch.Tensor) or w.dtype not in _FP8 or w.dim() != 2 or not w.is_contiguous():
        return None
    N, K = w.shape
    if K % 128 or s.dtype != torch.float32 or tuple(s.shape) != (cdiv(N, 128), K // 128):
        return None
    if out_dtype not in _FLOATS:
        return None
    return w, s, out_dtype


def linear(x2d: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor, out_dtype: torch.dtype) -> torch.Tensor:
    """The op's body: r9k's quant + block GEMM; on a ValueError from r9k's kernels, vLLM's own (its per-token-group
    quant and ``w8a8_triton_block_scaled_mm``, what ``TritonFp8BlockScaledMMKernel`` runs)."""
    from kernels.fp8 import fp8_linear

    try:
        y = fp8_linear(x2d if x2d.stride(-1) == 1 else x2d.contiguous(), weight, scale, out_dtype)
    except ValueError as e:
        _refused(e)
        from vllm.model_executor.layers.quantization.utils import fp8_utils

        calls.count(DISPATCH, "vllm", x2d.device)
        qa, sa = fp8_utils.per_token_group_quant_fp8(x2d, 128, dtype=weight.dtype)
        return fp8_utils.w8a8_triton_block_scaled_mm(qa, weight, sa, scale, [128, 128], out_dtype)
    calls.count(DISPATCH, "r9k", x2d.device)  # in the op's body: a call in a CUDA graph counts at each replay
    STATE.routed["r9k"] += 1
    return y


_LIB = None


def _register_op() -> None:
    """torch.ops.r9k.fp8_block_linear(x, weight, weight_scale, out_dtype) -> Tensor, once per process."""
    global _LIB
    if _LIB is not None:
        return
    lib = torch.library.Library("r9k", "FRAGMENT")
    lib.define("fp8_block_linear(Tensor x, Tensor weight, Tensor weight_scale, ScalarType out_dtype) -> Tensor")
    lib.impl("fp8_block_linear", linear, "CompositeExplicitAutograd")
    lib._register_fake("fp8_block_linear",
                       lambda x, w, s, dt: torch.empty((x.shape[0], w.shape[0]), dtype=dt, device=x.device))
    _LIB = lib


def _wrap_apply(original: Callable, sig: inspect.Signature) -> Callable:
    @functools.wraps(original)
    def apply_weights(self, *args, **kwargs):
        try:
            ba = sig.bind(self, *args, **kwargs)
        except TypeError:
            return original(self, *args, **kwargs)
        ba.apply_defaults()
        a = ba.arguments
        extra = {k: v for k, v in a.items() if k not in ("self",) + APPLY_PARAMS
                 and sig.parameters[k].kind is not inspect.Parameter.VAR_KEYWORD}
        var_kw = [v for k, v in a.items() if sig.parameters[k].kind is inspect.Parameter.VAR_KEYWORD]
        layer, x, bias = a["layer"], a["x"], a.get("bias")
        cov = _covered(self, layer)
        if (cov is None or any(var_kw) or any(v is not None for v in extra.values())
                or not isinstance(x, torch.Tensor) or x.dtype not in _FLOATS or x.shape[-1] != cov[0].shape[1]
                or not (x.is_cuda or _interpreting())):
            STATE.routed["stock"] += 1
            if not torch.compiler.is_compiling():  # traced, this would count once at tracing: not counted
                calls.count_args(DISPATCH, "vllm", args, kwargs)
            return original(self, *args, **kwargs)
        w, s, out_dtype = cov
        x2d = x.reshape(-1, x.shape[-1])
        if torch.compiler.is_compiling():
            y = torch.ops.r9k.fp8_block_linear(x2d, w, s, out_dtype)
        else:
            from kernels.fp8 import fp8_linear

            try:
                y = fp8_linear(x2d if x2d.stride(-1) == 1 else x2d.contiguous(), w, s, out_dtype)
            except ValueError as e:  # checked before any launch: vLLM's kernel runs the call
                _refused(e)
                calls.count(DISPATCH, "vllm", x.device)
                return original(self, *args, **kwargs)
            calls.count(DISPATCH, "r9k", x.device)
            STATE.routed["r9k"] += 1
        if bias is not None:
            y = y + bias
        return y.to(out_dtype).view(*x.shape[:-1], w.shape[0])

    apply_weights.__r9k_original__ = original
    return apply_weights


def _original(owner: Any, attr: str) -> Callable:
    fn = getattr(owner, attr)
    return getattr(fn, "__r9k_original__", fn)


def uninstall() -> None:
    """Put back vLLM's method."""
    while STATE.patches:
        owner, attr, original, was_own = STATE.patches.pop()
        if was_own:
            setattr(owner, attr, original)
        else:
            delattr(owner, attr)


def signature(kernel_cls: type) -> inspect.Signature:
    """The signature of vLLM's ``apply_weights`` of ``kernel_cls`` (with self); SignatureMismatch without one of
    :data:`APPLY_PARAMS`."""
    fn = _original(kernel_cls, "apply_weights")
    sig = inspect.signature(fn)
    missing = [n for n in APPLY_PARAMS if n not in sig.parameters]
    if missing:
        raise SignatureMismatch(f"{fn.__qualname__}{sig} has no parameter(s) {', '.join(missing)} that the r9k "
                                "fp8 dispatch reads")
    return sig


def install(kernel_cls: type | None = None) -> list[str]:
    """Install the block-fp8 linear dispatch on vLLM's Triton block kernel class (default: the one vLLM has, where
    its platform can select it); returns what was installed. ``R9K_FP8_BLOCK_GEMM=stock`` installs nothing and
    removes an earlier install.

    Raises:
        SignatureMismatch: vLLM's apply_weights lacks a parameter the dispatch reads.
        r9k.contract.BindingFailed: (vLLM's own class) a binding of the ``fp8`` family does not hold, the kernel
            class included.
    """
    uninstall()
    if knobs.FP8_BLOCK_GEMM() == "stock":
        log.info("r9k fp8: R9K_FP8_BLOCK_GEMM=stock: vLLM's block-fp8 linear op is left as is")
        return []
    if kernel_cls is None:
        contract.require("fp8", "gpu")  # every binding first: a failure installs nothing (BindingFailed)
        kernel_cls = getattr(importlib.import_module(KERNEL_MODULE), KERNEL_CLASS)
        ok, why = kernel_cls.is_supported()
        if not ok:
            log.info("r9k fp8: vLLM never selects %s on this platform (%s); nothing installed", KERNEL_CLASS, why)
            return []
    sig = signature(kernel_cls)
    _register_op()
    original = _original(kernel_cls, "apply_weights")
    was_own = "apply_weights" in vars(kernel_cls)
    kernel_cls.apply_weights = _wrap_apply(original, sig)
    STATE.patches.append((kernel_cls, "apply_weights", original, was_own))
    name = f"{DISPATCH} <- {kernel_cls.__module__}.{kernel_cls.__qualname__}.apply_weights"
    log.info("r9k fp8: block-scaled fp8 linear layers -> r9k; installed: %s", name)
    return [name]

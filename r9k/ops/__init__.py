"""Dispatch from vLLM layers to r9k kernels. Each installer patches only where vLLM has the layer.

What vLLM runs of r9k: the GDN prefill core and conv of the Qwen3-Next / Qwen3.5 / Olmo GDN layers
(:mod:`r9k.ops.gdn`: ``gdn_seq``, ``gdn_conv``), the block-scaled fp8 linear op of its Triton block kernel
(:mod:`r9k.ops.fp8`: ``fp8_block_gemm``), and on vLLM's CPU platform the expert cache (kernels/moe/) inside its
unquantized MoE layers (:mod:`r9k.ops.moe`: ``moe_cache``; on CUDA and ROCm not yet bound). The all-reduce
(kernels/allreduce/) is library code: no serving path calls it.

Each installer first checks its family's bindings of :mod:`r9k.contract` against the running vLLM (what it wraps,
calls or reads there, and the behaviour it relies on); where one does not hold, nothing of that family is installed.
A dispatch is named by the r9k kernel it routes to; the provenance line of every process lists the names
installed there and the failures (``family:binding:code`` for a binding that does not hold, the family alone for an
install that raised), so a server where the plugin is loaded but inactive cannot
pass for one that runs r9k's kernels. Where one is installed, :mod:`r9k.calls` counts its calls by step kind.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field

log = logging.getLogger("r9k")

#: Dispatch families, each with the kernel names it can install (what knobs expect, see r9k.knobs.Knob.dispatch).
FAMILIES = {"gdn": ("gdn_seq", "gdn_conv"), "fp8": ("fp8_block_gemm",), "moe": ("moe_cache",)}
#: families whose kernels run without Triton on a GPU (installed whatever kernels_can_run says)
HOST_FAMILIES = ("moe",)
#: The step kinds (:data:`r9k.calls.KINDS`) in which vLLM calls each dispatch's op: a dispatch the configuration asks
#: for that routes no call to r9k in a step of these kinds, while it sends one there back to vLLM that it should
#: have taken, did not run there (the GDN dispatch wraps the prefill core and conv; a decode step runs vLLM's
#: recurrent update, which r9k leaves alone).
STEP_KINDS = {"gdn_seq": ("prefill",), "gdn_conv": ("prefill",), "fp8_block_gemm": ("prefill", "decode"),
              "moe_cache": ("prefill", "decode")}
#: The dispatches whose own rule sends some calls to vLLM by design (counted on the route ``rule``, r9k/calls.py),
#: with the knob bounding what they take: the GDN prefill dispatch leaves a sequence beyond R9K_GDN_PREFILL_MAX to
#: vLLM (r9k/ops/gdn.py). The others have no such rule: every call they send to vLLM is one they did not take.
RULES = {"gdn_seq": "R9K_GDN_PREFILL_MAX", "gdn_conv": "R9K_GDN_PREFILL_MAX"}


@dataclass
class Installed:
    """What :func:`install` did in this process: dispatch names installed, failures (``family:binding:code``
    for a binding of r9k.contract that does not hold, the family's name for an install that raised), and families
    not attempted with the reason."""

    names: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)
    skipped: dict[str, str] = field(default_factory=dict)


def kernels_can_run() -> tuple[bool, str]:
    """(True, '') where r9k's Triton kernels can run in this process: a CUDA or ROCm device is visible, or
    Triton's interpreter is on (the CPU unit gates); else (False, why). On vLLM's CPU build nothing is routed,
    so nothing is installed there and the provenance line says ``dispatch=-``."""
    import os

    if os.environ.get("TRITON_INTERPRET") == "1":
        return True, ""
    try:
        import torch

        if torch.cuda.is_available():
            return True, ""
    except Exception as e:  # noqa: BLE001 - a broken torch must not take the server down
        return False, f"torch unusable: {type(e).__name__}: {e}"
    return False, "no CUDA or ROCm device visible (r9k's kernels run on GPUs only)"


def _set_fast_launch() -> None:
    """The kernels' launch path (kernels._launch.set_fast) from the knob R9K_TRITON_FAST_LAUNCH: the cached
    compiled kernel (default) or Triton's JIT dispatcher on every call. A value the knob rejects is logged and
    the default kept (the install never raises)."""
    import kernels._launch
    from r9k import knobs

    try:
        fast = bool(knobs.get("R9K_TRITON_FAST_LAUNCH"))
    except ValueError:
        log.exception("r9k: R9K_TRITON_FAST_LAUNCH not understood; the cached launch path stays on")
        fast = True
    kernels._launch.set_fast(fast)


def install() -> Installed:
    """Install every op dispatch whose knob is not at its stock value, where the kernels can run (the expert
    cache, :mod:`r9k.ops.moe`, decides by vLLM's platform itself: it runs on the CPU).

    Never raises: an install that fails is logged with its traceback and listed in ``failed``, and vLLM keeps
    its own op there.
    """
    out = Installed()
    from r9k.ops import moe

    _install_family(out, "moe", moe, "MoE expert-cache")
    ok, why = kernels_can_run()
    if not ok:
        for fam in FAMILIES:
            if fam not in HOST_FAMILIES:
                out.skipped[fam] = why
        log.info("r9k: no GPU op dispatch installed: %s", why)
        _count_calls(out)
        return out
    _set_fast_launch()
    from r9k.ops import fp8, gdn

    for fam, mod, what in (("gdn", gdn, "GDN"), ("fp8", fp8, "fp8 block-GEMM")):
        _install_family(out, fam, mod, what)
    _count_calls(out)
    return out


def _install_family(out: Installed, fam: str, mod, what: str) -> None:
    """``mod.install()`` into ``out``: its dispatch names, or ``fam``'s failure. A binding of the contract that
    does not hold (:class:`r9k.contract.BindingFailed`) is named per binding (``fam:binding:code``) and logged as a
    warning with why; any other exception names the family and is logged with its traceback."""
    from r9k import contract

    try:
        targets = mod.install()
        out.names += sorted({t.split(" <- ")[0] for t in targets})
    except contract.BindingFailed as e:  # this vLLM lacks what the dispatch relies on: stock vLLM, said per binding
        for f in e.failures:
            log.warning("r9k: %s dispatch not installed: binding %s does not hold on vLLM %s: %s", what, f.binding,
                        contract.vllm_version(), f.why)
            out.failed.append(f.token())
    except Exception:  # a dispatch must never take the server down: log it, keep stock vLLM, say so
        log.exception("r9k: %s dispatch not installed", what)
        out.failed.append(fam)


def _count_calls(out: Installed) -> None:
    """Mark vLLM's steps for r9k.calls where a dispatch is installed; nothing (and an earlier mark undone) where
    none is, so stock knobs leave vLLM untouched. Never raises: the counts are a figure, not the dispatch."""
    from r9k import calls

    try:
        if out.names:
            calls.install()
        else:
            calls.uninstall()
    except Exception:  # noqa: BLE001 - no counts rather than no server
        log.exception("r9k: the calls' step marks not installed (no R9K-CALLS lines)")

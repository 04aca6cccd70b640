"""The GPU a kernel is compiled for, and the limits its default configurations must fit.

A kernel's defaults (tile sizes, warps, pipeline stages) were tuned on an H200; the cards the serving systems run
on (AMD Radeon AI PRO R9700, gfx1201: RDNA4, wave32, 64 KiB of LDS a workgroup) and the MI300X (gfx942: CDNA3,
wave64, 64 KiB) have a quarter of its shared memory a workgroup and other matrix instructions. :func:`target_of`
reads what a configuration must respect from Triton's active driver (the one the JIT compiles through): its
``get_current_target()`` (backend, architecture, wave size) and its device properties (``max_shared_mem``, the
shared memory / LDS one workgroup may allocate), once per driver and device. Whether the matrix instructions
take the kernels' fp8 operands (OCP e4m3fn, Triton's ``float8e4nv``) is a property of the architecture
(:func:`fp8_mma`). Under Triton's interpreter there is no device: :data:`INTERPRETER`.
"""
from __future__ import annotations

from dataclasses import dataclass

from kernels._util import _interpreting


@dataclass(frozen=True)
class Target:
    """What a kernel configuration must fit: ``backend`` "cuda", "hip" or "interpreter"; ``arch`` ("90",
    "gfx1201", ...); ``warp_size`` lanes a warp / wavefront; ``lds_bytes`` shared memory (LDS) one workgroup may
    allocate; ``fp8_mma`` whether the matrix instructions take e4m3fn operands (else Triton upcasts them);
    ``units`` SMs / compute units (0 where unknown)."""

    backend: str
    arch: str
    warp_size: int
    lds_bytes: int
    fp8_mma: bool
    units: int = 0

    @property
    def is_amd(self) -> bool:
        return self.backend == "hip"

    @property
    def tma(self) -> bool:
        """Whether the target has NVIDIA's tensor memory accelerator (sm_90 and later)."""
        return self.backend == "cuda" and int(self.arch) >= 90


INTERPRETER = Target("interpreter", "cpu", 1, 1 << 30, True)


def fp8_mma(backend: str, arch: str) -> bool:
    """Whether ``arch`` has matrix instructions on OCP e4m3fn operands (what the fp8 kernels feed ``tl.dot``):
    CUDA from sm_89 (Ada's ``mma`` e4m3, Hopper's ``wgmma``); AMD gfx950 (CDNA4 fp8 MFMA) and gfx12 (RDNA4's
    ``v_wmma_f32_16x16x16_fp8_fp8``). gfx942's fp8 MFMAs take the fnuz encoding only, so Triton lowers an
    e4m3fn dot there to fp16 MFMAs (docs/kernels/portability.md has what each target's build used)."""
    if backend == "cuda":
        return int(arch) >= 89
    if backend == "hip":
        return arch.startswith("gfx12") or arch.startswith("gfx950")
    return backend == "interpreter"


_TARGETS: dict = {}
_DRIVER = None  # triton.runtime.driver, imported on first use (fp8_linear's plan key asks on every call)


def target_of(device=None) -> Target:
    """The :class:`Target` a kernel launched now for ``device`` (a torch device or None: used only as part of the
    cache key; Triton compiles for its current device) is compiled for; :data:`INTERPRETER` under
    TRITON_INTERPRET=1.

    Raises:
        RuntimeError: Triton has no active driver (no GPU and no interpreter).
    """
    global _DRIVER
    if _interpreting():
        return INTERPRETER
    if _DRIVER is None:
        from triton.runtime import driver as _DRIVER
    d = _DRIVER.active
    key = (id(d), device)
    hit = _TARGETS.get(key)
    if hit is None or hit[0] is not d:
        t = d.get_current_target()
        props = d.utils.get_device_properties(d.get_current_device())
        arch = str(t.arch)
        hit = (d, Target(t.backend, arch, int(t.warp_size), int(props["max_shared_mem"]), fp8_mma(t.backend, arch),
                         int(props.get("multiprocessor_count", 0))))
        _TARGETS[key] = hit  # the driver is kept alive here, so its id is never reused for another
    return hit[1]

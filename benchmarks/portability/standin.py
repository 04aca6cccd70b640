"""Compile Triton kernels for a GPU that is not here: a stand-in active driver.

Triton's JIT asks its active driver for the current target (``get_current_target()``), compiles for it, then
loads the binary and launches. :class:`StandInDriver` answers a chosen ``GPUTarget`` (``hip:gfx1201`` wave32,
``hip:gfx942`` wave64, ``cuda:90``) and the device properties of that GPU (its shared memory / LDS a workgroup,
its compute-unit count), and makes the load and the launch no-ops: a kernel called from the project's own call
path, with its real arguments as CPU tensors, is compiled by the real compiler for that target (every stage to
the binary: hsaco on AMD, cubin on NVIDIA), and the call returns as if the kernel ran (its outputs are whatever
``torch.empty`` held). Triton's own launch-time check that a kernel's shared memory fits the device
(``CompiledKernel._init_handles``) runs as on the card and raises ``OutOfResources``.

Every kernel compiled while a stand-in is active is recorded (:attr:`StandInDriver.compiled`) by wrapping
``triton.compiler.compile``, which the JIT calls for each new specialisation (a cache hit compiles nothing and
records nothing: each specialisation once).
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass

import triton
import triton.compiler as _tc
from triton.backends.compiler import GPUTarget
from triton.runtime import driver as _driver


@dataclass(frozen=True)
class Device:
    """A GPU the gate compiles for: Triton's target, what its driver reports, and a name for the tables.

    ``lds_bytes``: shared memory (LDS) one workgroup may allocate (HIP's hipDeviceAttributeMaxSharedMemoryPerBlock,
    CUDA's opt-in cudaDevAttrMaxSharedMemoryPerBlockOptin: what Triton's drivers report as ``max_shared_mem``).
    ``vgprs``: the architected vector registers a lane may use (AMD; 256 on gfx9 / gfx11 / gfx12 in wave32 and
    wave64 alike without AGPRs). ``units``: compute units / SMs."""

    name: str
    backend: str
    arch: str | int
    warp_size: int
    lds_bytes: int
    units: int
    source: str

    @property
    def target(self) -> GPUTarget:
        return GPUTarget(self.backend, self.arch, self.warp_size)

    @property
    def label(self) -> str:
        return f"{self.backend}:{self.arch}"


# The seeds' card first (AMD Radeon AI PRO R9700: Navi 48, 64 compute units, 64 KB of LDS a workgroup), then the
# MI300X (gfx942) and the H200 (sm_90, 132 SMs, 227 KiB of shared memory a block with the opt-in).
DEVICES = (
    Device("gfx1201", "hip", "gfx1201", 32, 65536, 64,
           "AMD Radeon AI PRO R9700 (RDNA4, Navi 48): LLVM AMDGPU usage, gfx12 LDS 64 KiB a workgroup"),
    Device("gfx942", "hip", "gfx942", 64, 65536, 304, "AMD Instinct MI300X (CDNA3): 64 KiB LDS a workgroup"),
    Device("cuda:90", "cuda", 90, 32, 232448, 132, "NVIDIA H200 (sm_90): 227 KiB shared memory a block (opt-in)"),
)
DEVICE_BY_NAME = {d.name: d for d in DEVICES}


class _Utils:
    def __init__(self, dev: Device):
        self.dev = dev

    def get_device_properties(self, device):
        return {"max_shared_mem": self.dev.lds_bytes, "multiprocessor_count": self.dev.units,
                "warpSize": self.dev.warp_size, "max_num_regs": 65536, "sm_clock_rate": 0, "mem_clock_rate": 0,
                "mem_bus_width": 0}

    def load_binary(self, name, kernel, shared, device):
        # (module, function, n_regs, n_spills, n_max_threads): nothing is loaded; registers and spills are read
        # from the binary by benchmarks.portability.resources instead
        return None, None, 0, 0, 1024

    def unload_module(self, module):
        return None


class _NoLaunch:
    """The launcher of a kernel that is never run: every launch is counted and does nothing."""

    def __init__(self, driver: "StandInDriver", src, metadata):
        self.driver, self.name = driver, metadata.name

    def __call__(self, *args, **kwargs):
        self.driver.launches[self.name] = self.driver.launches.get(self.name, 0) + 1


class StandInDriver:
    """The active driver while compiling for ``dev`` (see the module doc). ``compiled``: every CompiledKernel
    built meanwhile, in order; ``launches``: launches per kernel name."""

    def __init__(self, dev: Device):
        self.dev = dev
        self.utils = _Utils(dev)
        self.compiled: list = []
        self.launches: dict[str, int] = {}

    # what the JIT and CompiledKernel ask of the active driver
    def get_current_target(self) -> GPUTarget:
        return self.dev.target

    def get_current_device(self):
        return f"standin:{self.dev.name}"  # a key of the JIT's per-device caches: one cache per stand-in target

    def set_current_device(self, device) -> None:
        return None

    def get_current_stream(self, device=None):
        return 0

    def launcher_cls(self, src, metadata):
        return _NoLaunch(self, src, metadata)

    def get_active_torch_device(self):
        import torch

        return torch.device("cpu")

    def map_python_to_cpp_type(self, ty: str) -> str:
        return ty


_REAL_COMPILE = _tc.compile
_RECORDING: list = []  # the stand-in drivers recording now (innermost last)


def _compile(*args, **kwargs):
    """triton.compiler.compile, recording each kernel it builds in the innermost active stand-in. Installed once
    at import: the JIT keeps the ``compile`` it found when it first built a device's binder."""
    ck = _REAL_COMPILE(*args, **kwargs)
    if _RECORDING:
        _RECORDING[-1].compiled.append(ck)
    return ck


_tc.compile = _compile


@contextlib.contextmanager
def compiling_for(dev: Device):
    """Make a :class:`StandInDriver` for ``dev`` Triton's active driver (and record what compiles) for the
    duration; the previous driver is put back after. Import this module before any kernel is first called in
    the process (so the JIT's binders hold the recording ``compile``). One target at a time per process."""
    sd = StandInDriver(dev)
    prev = _driver._active
    _driver.set_active(sd)
    _RECORDING.append(sd)
    try:
        yield sd
    finally:
        _RECORDING.pop()
        _driver._active = prev


def triton_version() -> str:
    return triton.__version__

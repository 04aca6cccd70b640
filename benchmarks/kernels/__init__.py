"""The kernel benchmarks: one registry (:mod:`benchmarks.kernels.registry`) of r9k's kernels and the peers each is
measured against, and one runner (``python -m benchmarks.kernels``; benchmarks/README.md).

The entries live by family, one module each (gdn, fp8, moe, allreduce, ...): importing this package imports every
module of it (but the registry, the ceilings and the runner), and each registers its entries; a new module is
found with no list to edit. It needs torch (and Triton for the runner's timers), not a GPU.
"""
import importlib
import pkgutil

from benchmarks.kernels.registry import REGISTRY, Floor, Op, Unavailable, register  # noqa: F401

for _m in pkgutil.iter_modules(__path__):
    if _m.name not in ("registry", "ceilings", "__main__") and not _m.name.startswith("_"):
        importlib.import_module(f"{__name__}.{_m.name}")

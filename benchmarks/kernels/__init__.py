"""The kernel benchmarks: one registry (:mod:`benchmarks.kernels.registry`) of r9k's kernels and the peers each is
measured against, and one runner (``python -m benchmarks.kernels``; benchmarks/README.md).

The entries live by family: :mod:`~benchmarks.kernels.gdn`, :mod:`~benchmarks.kernels.fp8`,
:mod:`~benchmarks.kernels.moe`, :mod:`~benchmarks.kernels.allreduce`. Importing this package registers them all;
it needs torch (and Triton for the runner's timers), not a GPU.
"""
from benchmarks.kernels.registry import REGISTRY, Floor, Op, Unavailable, register  # noqa: F401
from benchmarks.kernels import allreduce, fp8, gdn, moe  # noqa: E402,F401  (register their entries)

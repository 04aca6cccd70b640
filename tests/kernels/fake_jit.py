"""A stand-in for a ``@triton.jit`` function, for testing kernels/_launch.py without a GPU.

``FakeKernel(names, constexprs)`` has the attributes the Launcher reads (``fn`` with that signature, ``params``
with ``is_constexpr``) and records every launch in ``log``: ``("jit", grid, args, opts)`` for a launch through
the JIT dispatcher (``kernel[grid](*args, **opts)``, which returns a fresh compiled kernel numbered 1, 2, ...)
and ``("cached", grid, args, number)`` for a launch of a compiled kernel (``compiled[grid](*args)``).
"""
from __future__ import annotations

import inspect


class _Param:
    def __init__(self, is_constexpr: bool):
        self.is_constexpr = is_constexpr


class FakeKernel:
    def __init__(self, names: tuple[str, ...], constexprs: tuple[str, ...]):
        self.log: list[tuple] = []
        self.compiled = 0
        self.params = [_Param(n in constexprs) for n in names]

        def fn(*args):  # the signature below is what the Launcher reads
            pass

        fn.__signature__ = inspect.Signature(
            [inspect.Parameter(n, inspect.Parameter.POSITIONAL_OR_KEYWORD) for n in names])
        self.fn = fn

    def __getitem__(self, grid):
        def jit_launch(*args, **opts):
            self.compiled += 1
            self.log.append(("jit", grid, args, opts))
            kernel, number = self, self.compiled

            class Compiled:
                def __getitem__(self, g):
                    def run(*a):
                        kernel.log.append(("cached", g, a, number))
                    return run
            return Compiled()
        return jit_launch

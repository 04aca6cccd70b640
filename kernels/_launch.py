"""A lower-overhead launch path for Triton kernels called once per layer and step.

``kernel[grid](*args)`` goes through Triton's (or Gluon's) JIT dispatcher on every call: binding and specialising every
argument, building and hashing a cache key, checking globals. For a kernel of ~40 arguments that costs tens
of microseconds of host time per call, more than the GPU time of a short prefill's GDN core. :class:`Launcher`
keeps the ``CompiledKernel`` that the JIT returns on the first call for a given specialisation and launches it
directly afterwards (``compiled[grid](*args)``: the same launcher the JIT ends in).

The specialisation key mirrors what Triton specialises on (triton/runtime/jit.py, ``specialize_impl``): every
constexpr by value; tensors by dtype and whether the data pointer is 16-byte aligned; integers by ``== 1``,
divisibility by 16 and whether they fit in int32; floats and bools by type; and the launch options. A new key
goes through the JIT (which compiles or finds the kernel) and is remembered. Under ``TRITON_INTERPRET=1``, or
when the fast path is off (:func:`set_fast`; ``FAST``), every call goes through the JIT unchanged.

The fast path is a setting of this module, on by default. The vLLM plugin sets it from its knob
``R9K_TRITON_FAST_LAUNCH`` when it installs its op dispatch (r9k/ops/__init__.py); this package reads no knob.
"""
from __future__ import annotations

import torch

from kernels._util import _interpreting

FAST = True  # the cached launch path on (see set_fast); tests flip it directly


def set_fast(on: bool) -> None:
    """Launch through the cached compiled kernel (True, the default) or through Triton's JIT dispatcher on every
    call (False). Outputs are identical either way; only the host's time per launch differs."""
    global FAST
    if not isinstance(on, bool):
        raise TypeError(f"set_fast takes a bool, got {on!r}")
    FAST = on


_HAS_CUDA: bool | None = None


def _current_device():
    """The current CUDA device index (Triton keeps one kernel cache per device, a CompiledKernel's function is
    loaded on one device); None without CUDA."""
    global _HAS_CUDA
    if _HAS_CUDA is None:
        try:
            _HAS_CUDA = bool(torch.cuda.is_available())
        except Exception:  # noqa: BLE001 - no usable CUDA: the JIT path reports the real problem
            _HAS_CUDA = False
    return torch.cuda.current_device() if _HAS_CUDA else None


_INT32_MIN, _INT32_END, _U64_START = -(2 ** 31), 2 ** 31, 2 ** 63
_BOOL, _FLOAT = ("b",), "f"


class Launcher:
    """Launch ``kernel`` (a ``@triton.jit`` function) with every argument positional, in signature order.

    ``launcher(grid, args, num_warps=..., num_stages=...)``: ``args`` holds every parameter of the kernel,
    constexprs included, in the order of its signature (the order the JIT passes them to the compiled kernel).
    """

    def __init__(self, kernel):
        self.kernel = kernel
        params = getattr(kernel, "params", None)
        fn = getattr(kernel, "fn", kernel)
        import inspect

        self.names = list(inspect.signature(fn).parameters)
        self.const = [bool(p.is_constexpr) for p in params] if params is not None else [False] * len(self.names)
        self.cache: dict = {}

    def key(self, args: tuple, opts: tuple) -> tuple:
        """The specialisation Triton would compile ``args`` under (see the module doc), plus the device.
        Dispatches on ``type(a)`` first: this runs on every launch, so it is kept to a few operations an arg."""
        k = [opts, _current_device()]
        ap = k.append
        for a, c in zip(args, self.const):
            t = type(a)
            if c:
                # typed: 1, True and 1.0 (and 0.0 / -0.0) are equal in Python but compile differently
                ap((t, repr(a) if t is float else a))
            elif t is int:
                ap((a == 1, a % 16 == 0, _INT32_MIN <= a < _INT32_END, a >= _U64_START))
            elif t is bool:
                ap(_BOOL)
            elif t is float:
                ap(_FLOAT)
            elif a is None:
                ap(None)
            elif hasattr(a, "data_ptr"):
                ap((a.dtype, a.data_ptr() % 16 == 0))
            elif isinstance(a, bool):
                ap(_BOOL)
            elif isinstance(a, int):
                ap((a == 1, a % 16 == 0, _INT32_MIN <= a < _INT32_END, a >= _U64_START))
            elif isinstance(a, float):
                ap(_FLOAT)
            elif hasattr(a, "block_shape") and hasattr(a, "base"):
                # a host-side TMA descriptor (Triton's or Gluon's TensorDescriptor): specialised on its dtype,
                # block shape, layout and padding; its base, shape and strides are launch arguments
                ap((t, a.base.dtype, tuple(a.block_shape), _layout_key(getattr(a, "layout", None)), a.padding))
            else:
                raise TypeError(f"{t.__name__} argument: the cached launch path takes tensors, ints, floats, "
                                "bools, None and tensor descriptors (constexprs: any hashable)")
        return tuple(k)

    def __call__(self, grid, args: tuple, **opts):
        if callable(grid):
            raise TypeError("the cached launch path takes a grid tuple, not a callable")
        if len(args) != len(self.names):
            raise TypeError(f"{getattr(self.kernel, '__name__', self.kernel)}: {len(args)} arguments for "
                            f"{len(self.names)} parameters ({', '.join(self.names)})")
        if not FAST or _interpreting():
            return self.kernel[grid](*args, **opts)
        key = self.key(args, tuple(sorted(opts.items())))
        ck = self.cache.get(key)
        if ck is None:
            ck = self.kernel[grid](*args, **opts)
            if ck is not None and hasattr(ck, "__getitem__"):
                self.cache[key] = ck
            return ck
        ck[tuple(grid) + (1,) * (3 - len(grid))](*args)
        return ck

    def positional(self, args, meta: dict) -> tuple[tuple, dict]:
        """(every kernel argument in signature order, launch options) from leading positional ``args`` and
        keyword ``meta`` holding the trailing parameters plus ``num_warps`` / ``num_stages``.

        Raises:
            TypeError: a ``meta`` key that is neither a launch option nor a trailing parameter.
            KeyError: a trailing parameter missing from ``meta``.
        """
        d = dict(meta)
        opts = {k: d.pop(k) for k in ("num_warps", "num_stages") if k in d}
        tail = self.names[len(args):]
        extra = sorted(set(d) - set(tail))
        if extra:
            raise TypeError(f"launch meta {extra} is neither a launch option nor a trailing kernel parameter")
        return tuple(args) + tuple(d[n] for n in tail), opts


_LAYOUT_KEYS: dict = {}


def _layout_key(layout) -> str | None:
    """repr of a descriptor's shared-memory layout, computed once per layout object (kept alive here, so its id
    is never reused for another)."""
    if layout is None:
        return None
    hit = _LAYOUT_KEYS.get(id(layout))
    if hit is None:
        hit = _LAYOUT_KEYS[id(layout)] = (layout, repr(layout))
    return hit[1]


_LAUNCHERS: dict = {}


def launcher(kernel) -> Launcher:
    """The one :class:`Launcher` of ``kernel`` in this process (its cache of compiled kernels is shared by every
    caller)."""
    lau = _LAUNCHERS.get(kernel)
    if lau is None:
        lau = _LAUNCHERS[kernel] = Launcher(kernel)
    return lau


def launch(kernel, grid, args: tuple, **opts):
    """``launcher(kernel)(grid, args, **opts)``: every argument positional, in signature order."""
    return launcher(kernel)(grid, args, **opts)

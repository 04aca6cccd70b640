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


def _raw_stream():
    """The raw current-stream getter Triton's own launch uses (``torch._C._cuda_getCurrentRawStream``, an int
    handle of the device's current stream: captured launches go to the capturing stream)."""
    try:
        from torch._C import _cuda_getCurrentRawStream
        return _cuda_getCurrentRawStream
    except ImportError:  # pragma: no cover - a torch without CUDA: the JIT path is taken
        return None


_RUNTIME = None  # triton.knobs.runtime, imported on the first direct launch


def _launch_hooks() -> bool:
    """True while a Triton launch hook is set (a profiler such as proton): launches then go through the compiled
    kernel's own launch, which calls them. A hook is a callable or None (Triton <= 3.4) or a ``HookChain`` with
    a list of ``calls`` (3.5 on), which is set when that list is not empty."""
    global _RUNTIME
    if _RUNTIME is None:
        from triton import knobs

        _RUNTIME = knobs.runtime
    for h in (_RUNTIME.launch_enter_hook, _RUNTIME.launch_exit_hook):
        if h is not None and getattr(h, "calls", True):
            return True
    return False


def _c_launch_contract(run, launch, names: tuple) -> bool:
    """True where ``run`` is the CUDA launcher whose C entry :class:`Direct` calls directly: Triton's
    ``CudaLauncher`` with the base argument format ``iiiKKppOOOOOO`` (grid, stream, function, cooperative, PDL,
    the two scratch buffers, packed metadata, launch metadata, the two hooks; Triton 3.5-3.6) and, for a kernel
    with tensor descriptors, ``wrap_handle_tensordesc``'s closure over ``launcher``, ``tensordesc_indices`` and
    ``tensordesc_meta``. Anything else (another Triton's layout) is launched through ``run`` instead."""
    if type(run).__name__ != "CudaLauncher" or launch is None:
        return False
    try:
        from triton.backends.nvidia import driver as nv
    except ImportError:  # pragma: no cover
        return False
    if getattr(nv, "_BASE_ARGS_FORMAT", None) != "iiiKKppOOOOOO":
        return False
    if not names:
        return type(launch).__name__ == "builtin_function_or_method"
    return {"launcher", "tensordesc_indices", "tensordesc_meta"} <= set(names)


class Direct:
    """One kernel launched at the specialisations its caller names, for a caller that guarantees them (a launch
    plan: kernels/fp8/linear.py): no specialisation key is computed, nothing is dispatched, only the compiled
    kernel is launched.

    ``direct(grid, args, spec=None, **opts)``: ``args`` every parameter in signature order, as :class:`Launcher`
    takes them; ``spec`` a hashable the caller changes whenever the specialisation may (what its int
    arguments are on either side of: 1, divisibility by 16, int32), None where it never does. The first call
    of a ``spec`` goes through the JIT (which compiles or finds the kernel) and keeps the ``CompiledKernel``;
    every later call of that ``spec`` launches it with these ``args`` whatever they are, so the caller may only
    vary what does not change the specialisation (tensor addresses at the same 16-byte alignment, ints within
    their ``spec``; never a dtype, a constexpr or an option: ``opts`` are read on the first call only).

    ``fixed``: indices of tensor-descriptor parameters whose descriptor is the same on every call (a weight's):
    on CUDA its expansion (Triton's ``make_tensordesc_arg``: the encoded ``CUtensorMap``, shape and strides) is
    made once and reused; the other descriptors are expanded a call. On CUDA with Triton's ``CudaLauncher`` of
    the base format ``iiiKKppOOOOOO`` (:func:`_c_launch_contract`) the launcher's C entry is called directly;
    on another backend or Triton the compiled kernel's ``run``; under the interpreter, with the fast path off
    (:func:`set_fast`), while launch hooks are set, or for a kernel that needs a global or profile scratch
    buffer, ``compiled[grid](*args)``, which handles them.
    """

    def __init__(self, kernel, fixed: tuple[int, ...] = ()):
        self.kernel = kernel
        self.fixed = tuple(fixed)
        self.states: dict = {}

    def __call__(self, grid, args: tuple, spec=None, **opts):
        st = self.states.get(spec)
        # (a state is only made outside the interpreter, for the device's tensors: the environment is not read
        # again on the hot path)
        if st is None or not FAST:
            ck = self.kernel[grid](*args, **opts)
            if st is None and ck is not None and hasattr(ck, "__getitem__") and FAST and not _interpreting():
                self.states[spec] = _Prepared(ck, args, self.fixed)
            return ck
        return st.launch(grid, args)


class _Prepared:
    """One compiled specialisation of a :class:`Direct` and how it is launched (see there)."""

    def __init__(self, ck, args: tuple, fixed: tuple[int, ...]):
        self.ck = ck
        self.c_launch = self.run = None
        self.segments: tuple = ()
        self.expanded: dict = {}
        if not hasattr(ck, "_init_handles"):
            return
        ck._init_handles()
        md = ck.metadata
        if getattr(md, "global_scratch_size", 0) or getattr(md, "profile_scratch_size", 0):
            return
        self.stream = _raw_stream()
        if self.stream is None:
            return
        self.device = torch.cuda.current_device()
        self.function, self.pm = ck.function, ck.packed_metadata
        run = ck.run
        launch = getattr(run, "launch", None)
        names = getattr(getattr(launch, "__code__", None), "co_freevars", ())
        if not _c_launch_contract(run, launch, names):
            self.run = run
            return
        raw, desc = launch, {}
        if names:  # wrap_handle_tensordesc's closure: the C entry and the descriptors' metadata
            cells = dict(zip(names, (c.cell_contents for c in launch.__closure__)))
            raw, meta = cells["launcher"], cells["tensordesc_meta"]
            idx = sorted(cells["tensordesc_indices"])
            desc = dict(zip(idx, meta or [None] * len(idx)))
        if desc:
            from triton.backends.nvidia.driver import make_tensordesc_arg

            self.make_desc = make_tensordesc_arg
        self.desc = desc
        self.coop, self.pdl = run.launch_cooperative_grid, run.launch_pdl
        self.c_launch = raw
        self.expanded = {i: list(self.make_desc(args[i], desc[i])) for i in fixed if i in desc}
        # args[s:e] pass as they are, then descriptor e expanded (a fixed one from self.expanded)
        segs, s = [], 0
        for i in sorted(desc):
            segs.append((s, i))
            s = i + 1
        self.segments = tuple(segs)
        self.tail = s

    def launch(self, grid, args: tuple):
        g = tuple(grid) + (1,) * (3 - len(grid))
        if (self.c_launch is None and self.run is None) or _launch_hooks():
            self.ck[g](*args)
            return self.ck
        stream = self.stream(self.device)
        if self.c_launch is not None:
            if self.segments:
                flat = []
                for s, i in self.segments:
                    flat.extend(args[s:i])
                    x = self.expanded.get(i)
                    flat.extend(x if x is not None else self.make_desc(args[i], self.desc[i]))
                flat.extend(args[self.tail:])
            else:
                flat = args
            self.c_launch(g[0], g[1], g[2], stream, self.function, self.coop, self.pdl, None, None, self.pm,
                          None, None, None, *flat)
        else:
            self.run(g[0], g[1], g[2], stream, self.function, self.pm, None, None, None, *args)
        return self.ck

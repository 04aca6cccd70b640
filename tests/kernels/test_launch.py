"""kernels/_launch.py: the cached CompiledKernel launch path, checked on the CPU with a stand-in for a JIT kernel.

The stand-in records every launch: through the JIT dispatcher (``kernel[grid](*args, **opts)``, which returns a
compiled kernel) or through the cached compiled kernel (``compiled[grid](*args)``). What must hold:
* a second call with the same specialisation goes through the cache, with the same arguments and a 3-d grid;
* any change Triton would compile differently (a constexpr's value, a dtype, a pointer's 16-byte alignment, an
  int becoming 1 or a multiple of 16 or leaving int32, a bool for an int, the launch options) goes through the
  JIT again, never through a kernel compiled for other arguments;
* under the interpreter, or with FAST off, every call goes through the JIT.
On a GPU, gdn/test_seq.py::test_cached_launch_equals_jit_launch checks that both paths give bit-identical results.
"""
from __future__ import annotations

import pytest
import torch

import kernels._launch as L
import kernels.moe.cache as moe
from kernels._launch import launcher
from tests.kernels.fake_jit import FakeKernel as _Fake


def FakeKernel():
    """A stand-in JIT kernel of signature (x, n, s, FLAG: constexpr, B: constexpr)."""
    return _Fake(("x", "n", "s", "FLAG", "B"), ("FLAG", "B"))


def test_second_call_uses_the_cached_kernel(fast):
    k = FakeKernel()
    lau = L.Launcher(k)
    x = torch.zeros(64)
    args = (x, 64, 0.5, True, 128)
    lau((4,), args, num_warps=4)
    lau((7, 2), args, num_warps=4)
    assert [e[0] for e in k.log] == ["jit", "cached"]
    assert k.log[1][1] == (7, 2, 1) and k.log[1][2] == args and k.log[1][3] == 1


@pytest.mark.parametrize("change", ["constexpr", "dtype", "alignment", "int_is_1", "int_div16", "int_range",
                                    "bool_for_int", "options"])
def test_a_new_specialisation_goes_through_the_jit(fast, change):
    k = FakeKernel()
    lau = L.Launcher(k)
    base = torch.zeros(64)
    args = [base, 48, 0.5, True, 128]
    opts = dict(num_warps=4)
    lau((1,), tuple(args), **opts)
    if change == "constexpr":
        args[4] = 256
    elif change == "dtype":
        args[0] = torch.zeros(64, dtype=torch.float16)
    elif change == "alignment":
        args[0] = base[1:]  # 4-byte offset: not 16-byte aligned
    elif change == "int_is_1":
        args[1] = 1
    elif change == "int_div16":
        args[1] = 47
    elif change == "int_range":
        args[1] = 2 ** 31 + 16
    elif change == "bool_for_int":
        args[1] = True
    elif change == "options":
        opts = dict(num_warps=8)
    lau((1,), tuple(args), **opts)
    assert [e[0] for e in k.log] == ["jit", "jit"], change
    lau((1,), tuple(args), **opts)  # and that one is cached in turn, as its own kernel
    assert k.log[-1][0] == "cached" and k.log[-1][3] == 2


def test_same_specialisation_other_values_share_the_kernel(fast):
    k = FakeKernel()
    lau = L.Launcher(k)
    lau((1,), (torch.zeros(64), 48, 0.5, True, 128))
    lau((1,), (torch.ones(32), 96, 2.0, True, 128))  # other tensor, other int of the same class, other float
    assert [e[0] for e in k.log] == ["jit", "cached"]


def test_interpreter_or_fast_off_always_uses_the_jit(monkeypatch):
    k = FakeKernel()
    lau = L.Launcher(k)
    args = (torch.zeros(8), 16, 1.0, False, 8)
    monkeypatch.setattr(L, "_interpreting", lambda: True)
    lau((1,), args)
    lau((1,), args)
    monkeypatch.setattr(L, "_interpreting", lambda: False)
    monkeypatch.setattr(L, "FAST", False)
    lau((1,), args)
    assert [e[0] for e in k.log] == ["jit", "jit", "jit"]


def test_wrong_argument_count_is_refused(fast):
    lau = L.Launcher(FakeKernel())
    with pytest.raises(TypeError, match="4 arguments for 5 parameters"):
        lau((1,), (torch.zeros(8), 16, 1.0, False))


def test_positional_refuses_unknown_meta():
    lau = launcher(moe._plan_kernel)
    meta = dict(E=8, NS=4, K=2, NC=8, BE=16, NSP=16, BT=16, NCP=16, ONE_TILE=True, THROUGH=False, NT=1,
                num_warps=4)
    lead = [None] * (len(lau.names) - (len(meta) - 1))  # every parameter before the constexpr tail
    args, opts = lau.positional(lead, meta)
    assert len(args) == len(lau.names) and opts == {"num_warps": 4}
    with pytest.raises(TypeError):
        lau.positional(lead, dict(meta, num_ctas=2))


# ---- Direct: the launch a plan makes, no key computed ------------------------------------------------------
def test_direct_launches_what_its_first_call_compiled_for_every_later_call(fast):
    """A Direct trusts its caller: after the first call of a spec (through the JIT) every call of that spec
    launches the same compiled kernel with the new arguments, even ones the JIT would specialise differently
    (that is the plan's guarantee to keep); a new spec goes through the JIT once."""
    k = FakeKernel()
    d = L.Direct(k)
    x = torch.zeros(64)
    d((4,), (x, 64, 0.5, True, 128), num_warps=4)
    d((5,), (x, 17, 0.25, True, 128))
    d((6, 2), (x, 18, 0.25, True, 128))
    assert [(e[0], e[-1] if e[0] == "cached" else None) for e in k.log] == [("jit", None), ("cached", 1),
                                                                            ("cached", 1)]
    assert k.log[1][1] == (5, 1, 1) and k.log[1][2][1] == 17 and k.log[2][1] == (6, 2, 1)
    d((4,), (x, 1, 0.5, True, 128), spec="one")
    d((4,), (x, 1, 0.5, True, 128), spec="one")
    assert [e[0] for e in k.log[3:]] == ["jit", "cached"] and k.log[4][-1] == 2


def test_direct_goes_through_the_jit_with_fast_off_or_interpreting(monkeypatch):
    k = FakeKernel()
    d = L.Direct(k)
    x = torch.zeros(64)
    monkeypatch.setattr(L, "FAST", False)
    d((1,), (x, 64, 0.5, True, 128))
    d((1,), (x, 64, 0.5, True, 128))
    monkeypatch.setattr(L, "FAST", True)
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    d((1,), (x, 64, 0.5, True, 128))
    assert [e[0] for e in k.log] == ["jit", "jit", "jit"] and d.states == {}


def test_launch_hooks_are_read_as_triton_sets_them(monkeypatch):
    """Triton 3.5+ keeps its launch hooks as a HookChain that is always there: set means its list is not empty;
    older Tritons hold a callable or None."""
    import types

    chain = types.SimpleNamespace(calls=[])
    rt = types.SimpleNamespace(launch_enter_hook=chain, launch_exit_hook=None)
    monkeypatch.setattr(L, "_RUNTIME", rt)
    assert not L._launch_hooks()
    chain.calls.append(print)
    assert L._launch_hooks()
    rt.launch_enter_hook = print
    assert L._launch_hooks()


def test_the_c_launch_is_taken_only_on_the_launcher_layout_it_was_written_for(monkeypatch):
    """Direct calls a CUDA launcher's C entry only where Triton's launcher has the layout it was written for;
    another layout (another Triton) goes through the compiled kernel's run."""
    import types

    CudaLauncher = type("CudaLauncher", (), {})
    nv = pytest.importorskip("triton.backends.nvidia.driver")

    def wrapped():
        launcher = tensordesc_indices = tensordesc_meta = None

        def inner(*a):
            return launcher, tensordesc_indices, tensordesc_meta
        return inner
    inner = wrapped()
    names = inner.__code__.co_freevars
    monkeypatch.setattr(nv, "_BASE_ARGS_FORMAT", "iiiKKppOOOOOO", raising=False)
    assert L._c_launch_contract(CudaLauncher(), inner, names)
    assert L._c_launch_contract(CudaLauncher(), len, ())  # a builtin: the C entry itself
    assert not L._c_launch_contract(types.SimpleNamespace(), inner, names)  # not a CUDA launcher
    assert not L._c_launch_contract(CudaLauncher(), inner, ("launcher", "signature"))  # another closure
    monkeypatch.setattr(nv, "_BASE_ARGS_FORMAT", "iiiKKOOOOOO", raising=False)
    assert not L._c_launch_contract(CudaLauncher(), inner, names)  # another base format

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
    meta = dict(E=8, NS=4, K=2, NC=8, BE=16, NSP=16, BT=16, NCP=16, ONE_TILE=True, num_warps=4)
    args, opts = lau.positional([None] * 15, meta)
    assert len(args) == len(lau.names) and opts == {"num_warps": 4}
    with pytest.raises(TypeError):
        lau.positional([None] * 15, dict(meta, num_ctas=2))

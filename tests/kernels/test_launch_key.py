"""kernels/_launch.py's specialisation key (Launcher.key) against Triton's own: two argument sets that Triton
compiles differently never map to one cached CompiledKernel.

The property checked against Triton itself (no GPU needed): for two values that get the same Launcher key,
Triton's own specialisation (``native_specialize_impl``, what the JIT keys its cache on) must be the same.
Regressions kept here: u64 ints, constexprs of other types with equal values, another current device, callable
grids (each once merged or accepted).
"""
from __future__ import annotations

import itertools

import pytest
import torch

import kernels._launch as L
from tests.kernels.fake_jit import FakeKernel as _Fake

triton = pytest.importorskip("triton")
try:  # Triton's own specialisation function (native since Triton 3.4 or so; the GPU host may have another)
    from triton.backends.compiler import BaseBackend  # noqa: E402
    from triton.runtime.jit import native_specialize_impl  # noqa: E402
except ImportError:  # pragma: no cover
    pytest.skip("this Triton has no native_specialize_impl to compare the key with", allow_module_level=True)


def FakeKernel():
    """A stand-in JIT kernel of signature (x, n, FLAG: constexpr)."""
    return _Fake(("x", "n", "FLAG"), ("FLAG",))


def _triton_spec(v):
    return native_specialize_impl(BaseBackend, v, False, True, True)


def _lkey(v, const=False):
    lau = L.Launcher.__new__(L.Launcher)
    lau.const = [const]
    return lau.key((v,), ())


INTS = [0, 1, -1, 2, 15, 16, -16, 17, 2**31 - 16, 2**31 - 1, 2**31, -2**31, -2**31 - 1, 2**40, 2**40 + 1,
        2**63 - 16, 2**63, 2**63 + 16, 2**64 - 1]


def _pairs_with_same_key(values, const=False):
    for a, b in itertools.combinations(values, 2):
        if _lkey(a, const) == _lkey(b, const):
            yield a, b


def test_int_key_classes_match_triton_below_2_63():
    """Every int pair the key merges gets the same Triton specialisation (int32 / int64 range, 1, %16)."""
    vals = [v for v in INTS if v < 2**63] + [True, False, 0.5, 2.0, None]
    for a, b in _pairs_with_same_key(vals):
        assert _triton_spec(a) == _triton_spec(b), (a, b)


def test_int_key_distinguishes_u64_from_i64():
    for a, b in _pairs_with_same_key(INTS):
        assert _triton_spec(a) == _triton_spec(b), (a, b)


def test_constexpr_values_of_other_types_are_not_merged(fast):
    for a, b in [(1, True), (1, 1.0), (0, False), (0.0, -0.0), (128, 128.0)]:
        k = FakeKernel()
        lau = L.Launcher(k)
        x = torch.zeros(4)
        lau((1,), (x, 5, a))
        lau((1,), (x, 5, b))
        assert [e[0] for e in k.log] == ["jit", "jit"], (a, b)


def test_other_current_device_goes_through_the_jit(fast, monkeypatch):
    dev = {"i": 0}
    monkeypatch.setattr(L, "_HAS_CUDA", True)  # the module asks torch.cuda.is_available() once and keeps it
    monkeypatch.setattr(torch.cuda, "current_device", lambda: dev["i"])
    k = FakeKernel()
    lau = L.Launcher(k)
    args = (torch.zeros(4), 5, True)
    lau((1,), args)
    dev["i"] = 1
    lau((1,), args)
    assert [e[0] for e in k.log] == ["jit", "jit"]


def test_callable_grid_is_refused(fast):
    """A callable grid worked on the JIT call and broke on the cache hit; it is refused up front now."""
    k = FakeKernel()
    lau = L.Launcher(k)
    with pytest.raises(TypeError, match="grid tuple"):
        lau(lambda meta: (2,), (torch.zeros(4), 5, True))
    assert k.log == []


def test_int32_boundaries_and_negative_multiples(fast):
    """The int32 range edges and negative multiples of 16 are separate specialisations, as in Triton."""
    for a, b in [(2**31 - 1, 2**31), (-2**31, -2**31 - 1), (-16, -15), (0, 1)]:
        k = FakeKernel()
        lau = L.Launcher(k)
        lau((1,), (torch.zeros(4), a, True))
        lau((1,), (torch.zeros(4), b, True))
        assert [e[0] for e in k.log] == ["jit", "jit"], (a, b)


def test_tensor_storage_offset_alignment(fast):
    """A view whose storage offset breaks 16-byte alignment re-dispatches; one that keeps it hits the cache."""
    base = torch.zeros(64)
    k = FakeKernel()
    lau = L.Launcher(k)
    lau((1,), (base, 5, True))
    lau((1,), (base[4:], 5, True))   # 16 B offset: still aligned
    lau((1,), (base[2:], 5, True))   # 8 B offset
    assert [e[0] for e in k.log] == ["jit", "cached", "jit"]


def test_none_vs_tensor_and_float_vs_int(fast):
    k = FakeKernel()
    lau = L.Launcher(k)
    lau((1,), (torch.zeros(4), 5, True))
    lau((1,), (None, 5, True))
    lau((1,), (torch.zeros(4), 5.0, True))
    assert [e[0] for e in k.log] == ["jit", "jit", "jit"]


def test_keyword_kernel_argument_is_refused(fast):
    """Arguments must all be positional: a kernel parameter given as a keyword is a count error, not a silent
    launch option."""
    lau = L.Launcher(FakeKernel())
    with pytest.raises(TypeError):
        lau((1,), (torch.zeros(4), 5), FLAG=True)


def test_grid_is_padded_to_three_dims(fast):
    k = FakeKernel()
    lau = L.Launcher(k)
    args = (torch.zeros(4), 5, True)
    lau((3,), args)
    lau([3, 2], args)
    assert k.log[-1][:2] == ("cached", (3, 2, 1))

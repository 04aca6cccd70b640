"""r9k/knobs.py: the one registry of R9K_* variables (types, defaults, stock values, parse errors)."""
from __future__ import annotations

import pytest

from r9k import knobs
from r9k.knobs import KNOBS, Knob, get, in_force, register_knob

EXPECTED = {  # name: (type, default, stock)
    "R9K_GDN_PREFILL_MAX": (int, 256, 0),
    "R9K_GDN_PREFILL_CONV": (str, "r9k", "stock"),
    "R9K_PROVENANCE": (bool, True, True),
    "R9K_TRITON_FAST_LAUNCH": (bool, True, True),
    "R9K_LRU_THRESH": (float, 0.99, 0.99),
}


def test_registry_holds_exactly_the_documented_knobs():
    assert {n: (k.type, k.default, k.stock) for n, k in KNOBS.items()} == EXPECTED
    for k in KNOBS.values():
        assert k.help and k.name.startswith("R9K_")
        assert k.parse(str(k.stock)) == k.stock  # the stock value is a valid value of the knob


@pytest.mark.parametrize("name,raw,value", [
    ("R9K_GDN_PREFILL_MAX", "0", 0), ("R9K_GDN_PREFILL_MAX", "1024", 1024),
    ("R9K_PROVENANCE", "off", False), ("R9K_PROVENANCE", "YES", True), ("R9K_TRITON_FAST_LAUNCH", "0", False),
    ("R9K_LRU_THRESH", "0.5", 0.5), ("R9K_GDN_PREFILL_CONV", "stock", "stock"),
])
def test_get_parses_the_environment(name, raw, value):
    assert get(name, {name: raw}) == value
    assert get(name, {}) == EXPECTED[name][1]


@pytest.mark.parametrize("name,raw", [("R9K_GDN_PREFILL_MAX", "12.5"), ("R9K_PROVENANCE", "maybe"),
                                      ("R9K_LRU_THRESH", "high"), ("R9K_GDN_PREFILL_CONV", "fla")])
def test_bad_values_name_the_variable(name, raw):
    with pytest.raises(ValueError, match=name):
        get(name, {name: raw})


def test_unregistered_and_duplicate_names_are_refused():
    with pytest.raises(KeyError):
        get("R9K_NOT_A_KNOB", {})
    with pytest.raises(ValueError, match="registered twice"):
        register_knob(Knob("R9K_LRU_THRESH", float, 0.5, 0.5, "dup"))
    with pytest.raises(ValueError, match="must start with R9K_"):
        register_knob(Knob("LRU_THRESH", float, 0.5, 0.5, "no prefix"))
    assert set(in_force({})) == set(EXPECTED) and knobs.KNOBS is KNOBS


def test_in_force_keeps_misspelt_and_invalid_values_visible():
    got = in_force({"R9K_GDN_PREFIL_MAX": "64", "R9K_LRU_THRESH": "lots", "PATH": "/bin"})
    assert got["?R9K_GDN_PREFIL_MAX"] == "64"
    assert got["R9K_LRU_THRESH"] == "invalid:lots"
    assert got["R9K_GDN_PREFILL_MAX"] == 256 and "PATH" not in got and "?PATH" not in got

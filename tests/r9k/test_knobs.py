"""r9k/knobs.py: the one registry of R9K_* variables (types, defaults, stock values, parse errors)."""
from __future__ import annotations

import pytest

from r9k import knobs
from r9k.knobs import KNOBS, Knob, get, in_force, register_knob

EXPECTED = {  # name: (type, default, stock)
    "R9K_GDN_PREFILL_MAX": (int, 1024, 0),
    "R9K_GDN_PREFILL_CONV": (str, "r9k", "stock"),
    "R9K_GDN_PREFILL_SPLIT": (str, "seq", "step"),
    "R9K_FP8_BLOCK_GEMM": (str, "r9k", "stock"),
    "R9K_PROVENANCE": (bool, True, True),
    "R9K_TRITON_FAST_LAUNCH": (bool, True, True),
    "R9K_MOE_CACHE_SLOTS": (int, 0, 0),
    "R9K_MOE_CACHE_STAGING": (int, -1, -1),
    "R9K_MOE_CACHE_READ": (str, "auto", "auto"),
    "R9K_MOE_CACHE_THRESH": (float, 0.99, 0.99),
    "R9K_MOE_CACHE_STATS": (bool, True, True),
    "R9K_MOE_CACHE_STATS_SEC": (float, 10.0, 10.0),
    "R9K_CALLS_SEC": (float, 1.0, 1.0),
}


def test_registry_holds_exactly_the_documented_knobs():
    assert {n: (k.type, k.default, k.stock) for n, k in KNOBS.items()} == EXPECTED
    for k in KNOBS.values():
        assert k.help and k.name.startswith("R9K_")
        assert k.parse(str(k.stock)) == k.stock  # the stock value is a valid value of the knob


@pytest.mark.parametrize("name,raw,value", [
    ("R9K_GDN_PREFILL_MAX", "0", 0), ("R9K_GDN_PREFILL_MAX", "1024", 1024),
    ("R9K_PROVENANCE", "off", False), ("R9K_PROVENANCE", "YES", True), ("R9K_TRITON_FAST_LAUNCH", "0", False),
    ("R9K_GDN_PREFILL_CONV", "stock", "stock"), ("R9K_GDN_PREFILL_SPLIT", "step", "step"),
])
def test_get_parses_the_environment(name, raw, value):
    assert get(name, {name: raw}) == value
    assert get(name, {}) == EXPECTED[name][1]


@pytest.mark.parametrize("name,raw", [("R9K_GDN_PREFILL_MAX", "12.5"), ("R9K_PROVENANCE", "maybe"),
                                      ("R9K_TRITON_FAST_LAUNCH", "high"), ("R9K_GDN_PREFILL_CONV", "fla"),
                                      ("R9K_GDN_PREFILL_SPLIT", "token")])
def test_bad_values_name_the_variable(name, raw):
    with pytest.raises(ValueError, match=name):
        get(name, {name: raw})


def test_unregistered_and_duplicate_names_are_refused():
    with pytest.raises(KeyError):
        get("R9K_NOT_A_KNOB", {})
    with pytest.raises(ValueError, match="registered twice"):
        register_knob(Knob("R9K_PROVENANCE", bool, True, True, "dup"))
    with pytest.raises(ValueError, match="must start with R9K_"):
        register_knob(Knob("LRU_THRESH", float, 0.5, 0.5, "no prefix"))
    assert set(in_force({})) == set(EXPECTED) and knobs.KNOBS is KNOBS


def test_in_force_keeps_misspelt_and_invalid_values_visible():
    got = in_force({"R9K_GDN_PREFIL_MAX": "64", "R9K_PROVENANCE": "lots", "PATH": "/bin"})
    assert got["?R9K_GDN_PREFIL_MAX"] == "64"
    assert got["R9K_PROVENANCE"] == "invalid:lots"
    assert got["R9K_GDN_PREFILL_MAX"] == 1024 and "PATH" not in got and "?PATH" not in got


def test_check_env_names_unknown_knobs_with_the_closest_and_bad_values():
    got = knobs.check_env({"R9K_GDN_PREFIL_MAX": "64", "R9K_HC_FP8": "r9k", "R9K_GDN_PREFILL_CONV": "fla",
                           "R9K_GDN_PREFILL_MAX": "32", "VLLM_X": "1"})
    assert set(got) == {"R9K_GDN_PREFIL_MAX", "R9K_HC_FP8", "R9K_GDN_PREFILL_CONV"}
    assert got["R9K_GDN_PREFIL_MAX"].endswith("did you mean R9K_GDN_PREFILL_MAX?")
    assert "nothing reads it" in got["R9K_HC_FP8"]
    assert "expected one of r9k, stock" in got["R9K_GDN_PREFILL_CONV"]


def test_expected_dispatch_follows_non_stock_values_only():
    # a family asked for once is asked for whole: the conv's default (r9k) is in force beside the bound set
    assert knobs.expected_dispatch({"R9K_GDN_PREFILL_MAX": "400"}) == {
        "gdn_seq": "R9K_GDN_PREFILL_MAX=400", "gdn_conv": "R9K_GDN_PREFILL_CONV=r9k (its default)"}
    assert knobs.expected_dispatch({"R9K_GDN_PREFILL_MAX": "400", "R9K_GDN_PREFILL_CONV": "stock"}) == {
        "gdn_seq": "R9K_GDN_PREFILL_MAX=400"}
    assert knobs.expected_dispatch({"R9K_GDN_PREFILL_MAX": "0", "R9K_GDN_PREFILL_CONV": "stock"}) == {}
    assert knobs.expected_dispatch({"R9K_PROVENANCE": "1"}) == {}
    assert knobs.expected_dispatch({"R9K_FP8_BLOCK_GEMM": "r9k"}) == {"fp8_block_gemm": "R9K_FP8_BLOCK_GEMM=r9k"}
    assert knobs.expected_dispatch({"R9K_MOE_CACHE_SLOTS": "4"}) == {"moe_cache": "R9K_MOE_CACHE_SLOTS=4"}
    assert knobs.expected_dispatch({"R9K_MOE_CACHE_SLOTS": "0", "R9K_MOE_CACHE_STATS_SEC": "0"}) == {}


def test_the_engines_own_variables_are_not_misspelt_knobs():
    got = in_force({"R9K_DATA_DIR": "/d", "R9K_ROOT": "/r", "R9K_MODEL_CACHE": "/c", "R9K_GDN_PREFIL_MAX": "1"})
    assert [k for k in got if k.startswith("?")] == ["?R9K_GDN_PREFIL_MAX"]


def test_every_knob_is_read_by_the_plugin():
    """A knob nothing reads is a promise the plugin does not keep: each registered name occurs in r9k/ or
    kernels/ outside the registry."""
    from tests.conftest import REPO

    text = "".join(p.read_text() for pkg in ("r9k", "kernels") for p in (REPO / pkg).rglob("*.py")
                   if p.name != "knobs.py" and "bench" not in p.parts)
    attrs = {"R9K_GDN_PREFILL_MAX": "GDN_PREFILL_MAX()", "R9K_GDN_PREFILL_CONV": "GDN_PREFILL_CONV()",
             "R9K_GDN_PREFILL_SPLIT": "GDN_PREFILL_SPLIT()",
             "R9K_PROVENANCE": "PROVENANCE_LOG()", "R9K_TRITON_FAST_LAUNCH": '"R9K_TRITON_FAST_LAUNCH"',
             "R9K_FP8_BLOCK_GEMM": "FP8_BLOCK_GEMM()", "R9K_MOE_CACHE_SLOTS": "MOE_CACHE_SLOTS()",
             "R9K_MOE_CACHE_STAGING": "MOE_CACHE_STAGING()", "R9K_MOE_CACHE_READ": "MOE_CACHE_READ()",
             "R9K_MOE_CACHE_THRESH": "MOE_CACHE_THRESH()",
             "R9K_MOE_CACHE_STATS": "MOE_CACHE_STATS()", "R9K_MOE_CACHE_STATS_SEC": "MOE_CACHE_STATS_SEC()",
             "R9K_CALLS_SEC": "CALLS_SEC()"}
    assert set(attrs) == set(KNOBS)
    for name, use in attrs.items():
        assert use in text, f"{name} is registered but nothing reads it"


@pytest.mark.parametrize("value, fast", [(None, True), ("0", False), ("1", True), ("high", True)])
def test_install_sets_the_kernels_launch_path_from_its_knob(monkeypatch, value, fast):
    """kernels/ reads no knob: the plugin's install sets kernels._launch's fast path from R9K_TRITON_FAST_LAUNCH
    (a value the knob rejects keeps the default, logged: the install never raises)."""
    import kernels._launch as L
    from r9k import ops
    from r9k.ops import fp8, gdn

    monkeypatch.setattr(L, "FAST", not fast)
    if value is None:
        monkeypatch.delenv("R9K_TRITON_FAST_LAUNCH", raising=False)
    else:
        monkeypatch.setenv("R9K_TRITON_FAST_LAUNCH", value)
    monkeypatch.setattr(ops, "kernels_can_run", lambda: (True, ""))
    monkeypatch.setattr(gdn, "install", lambda: [])
    monkeypatch.setattr(fp8, "install", lambda: [])
    ops.install()
    assert L.FAST is fast

"""validate/sandbox/wire.py and validate/sandbox/__init__.py: the wire format as a module, and the programs'
source texts as ``python -I -c`` gets them."""
from __future__ import annotations

import ast
import math
import os
import sys
from pathlib import Path

import pytest

from validate import sandbox
from validate.sandbox import wire

pytestmark = pytest.mark.timeout(60)
SANDBOX_DIR = Path(sandbox.__file__).parent


@pytest.mark.parametrize("value", [None, True, -(1 << 200), 1.5, -0.0, math.inf, 1 + 2j, "é", b"\x00", bytearray(b"x"),
                                   [1, (2, {3}), frozenset({4})], {"a": [None], 5: 6.0}])
def test_values_round_trip(value):
    back = wire.decode(wire.encode(value, strict=True))
    assert back == value and type(back) is type(value)


def test_nan_round_trips_as_nan():
    assert math.isnan(wire.decode(wire.encode(math.nan)))


def test_strict_refuses_what_the_lenient_marks_opaque():
    class MyInt(int):
        pass
    assert wire.decode(wire.encode(MyInt(3))) == 3
    with pytest.raises(TypeError):
        wire.encode(MyInt(3), strict=True)
    marker = wire.decode(wire.encode(object()))
    assert isinstance(marker, wire.Opaque) and marker != marker and "object" in repr(marker)
    with pytest.raises(TypeError):
        bool(marker)


@pytest.mark.parametrize("data", [[], ["i", "xyz"], ["zz", 1], "s", ["d", [[["n"]]]], ["b", "abc"]])
def test_decode_refuses_what_is_not_the_format(data):
    with pytest.raises(wire.ProtocolError):
        wire.decode(data)


def test_frames_over_a_pipe():
    r, w = os.pipe()
    try:
        wire.write_frame(w, {"seq": 1, "value": wire.encode([1, "x"])})
        msg = wire.read_frame(r)
        assert msg["seq"] == 1 and wire.decode(msg["value"]) == [1, "x"]
        os.write(w, (10).to_bytes(4, "big") + b"not json!!")
        with pytest.raises(wire.ProtocolError):
            wire.read_frame(r)
        os.write(w, (wire.MAX_FRAME + 1).to_bytes(4, "big"))
        with pytest.raises(wire.ProtocolError):
            wire.read_frame(r)
        with pytest.raises(ValueError):
            wire.write_frame(w, "x" * (wire.MAX_FRAME + 1))
    finally:
        os.close(w)
    with pytest.raises(EOFError):
        wire.read_frame(r)
    os.close(r)


def test_programs_are_the_wire_format_then_the_module():
    wire_src = (SANDBOX_DIR / "wire.py").read_text()
    for name, parts in sandbox.PROGRAMS.items():
        text = sandbox.program(name)
        assert text.startswith((SANDBOX_DIR / f"{parts[0]}.py").read_text())
        assert text.endswith((SANDBOX_DIR / f"{parts[-1]}.py").read_text())
        compile(text, f"<{name}>", "exec")  # one program: a __future__ import past the top would not compile
    assert not sandbox.program("launcher").startswith(wire_src)
    with pytest.raises(KeyError):
        sandbox.program("nothing")


@pytest.mark.parametrize("name", ["wire", "isolation", "judge", "launcher"])
def test_each_program_module_is_self_contained(name):
    """The base interpreter runs them with -I: the standard library only, but for the guarded import a module
    import (tests, tools) takes."""
    tree = ast.parse((SANDBOX_DIR / f"{name}.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.If) and "write_frame" in ast.unparse(node.test):
            continue  # `if "write_frame" not in globals(): from validate.sandbox.wire import ...`
        for sub in ast.walk(node):
            if isinstance(sub, ast.ImportFrom):
                assert sub.module != "__future__" and sub.level == 0
                assert sub.module.split(".")[0] in sys.stdlib_module_names, sub.module
            elif isinstance(sub, ast.Import):
                for alias in sub.names:
                    assert alias.name.split(".")[0] in sys.stdlib_module_names, alias.name

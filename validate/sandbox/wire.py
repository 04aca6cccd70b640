"""The wire format between the judge and the sandbox: tagged plain data in length-prefixed JSON frames.

Values are tagged lists: ["n"], ["B", bool], ["i", hex], ["f", float.hex], ["c", re, im], ["s", str], ["b", hex],
["ba", hex], ["l"|"t"|"S"|"F", [items]], ["d", [[k, v], ...]], ["o", type name]. No pickle, no eval: decoding
builds builtin values only, so nothing a program defines ever runs in the process that decodes.

Self-contained (stdlib only, no ``from __future__``): the judge and the sandbox run this file's source ahead of
their own with ``python -I -c`` on the base interpreter, where the project cannot be imported
(:func:`validate.sandbox.program`); the engine imports it as a module.
"""
import json as _json
import os as _os
import re as _re

MAX_FRAME = 16 << 20
MAX_DEPTH = 64
MAX_NODES = 1 << 20
_HEX_INT = _re.compile(r"-?[0-9a-f]+")
_HEX_BYTES = _re.compile(r"(?:[0-9a-f]{2})*")


class ProtocolError(Exception):
    """A message that does not follow the wire format."""


class Opaque:
    """A result that was not plain data: unequal to everything (itself included), no truth value; names its type."""

    __slots__ = ("type_name",)

    def __init__(self, type_name):
        self.type_name = type_name

    def __eq__(self, other):
        return False

    def __ne__(self, other):
        return True

    __hash__ = object.__hash__

    def __bool__(self):
        raise TypeError("the candidate returned %s, which is not plain data" % self.type_name)

    def __repr__(self):
        return "<not plain data: %s>" % self.type_name


class _TooLarge(Exception):
    pass


def encode(value, strict=False):
    """value -> tagged plain data. strict (the judge's arguments): exact builtin types only, else TypeError.
    Otherwise (the sandbox's results) subclasses of the builtin numbers, str and containers travel as their base
    type and anything else as an opaque marker."""
    budget = [MAX_NODES]

    def opaque(t):
        name = "%s.%s" % (getattr(t, "__module__", "?"), getattr(t, "__qualname__", "?"))
        if strict:
            raise TypeError("not plain data: %s" % name)
        return ["o", name[:100]]

    def sub(t, base):
        return t is base or (not strict and issubclass(t, base))

    def enc(x, depth):
        budget[0] -= 1
        if budget[0] < 0:
            raise _TooLarge("more than %d objects" % MAX_NODES)
        if depth > MAX_DEPTH:
            raise _TooLarge("nested deeper than %d" % MAX_DEPTH)
        t = type(x)
        if x is None:
            return ["n"]
        if t is bool:
            return ["B", x]
        if sub(t, int):
            return ["i", format(int.__index__(x), "x")]
        if sub(t, float):
            return ["f", float.hex(x)]
        if t is complex:
            return ["c", float.hex(x.real), float.hex(x.imag)]
        if sub(t, str):
            return ["s", str.__str__(x)]
        if t is bytes:
            return ["b", x.hex()]
        if t is bytearray:
            return ["ba", x.hex()]
        for base, tag in ((list, "l"), (tuple, "t"), (set, "S"), (frozenset, "F")):
            if sub(t, base):
                return [tag, [enc(i, depth + 1) for i in base.__iter__(x)]]
        if sub(t, dict):
            return ["d", [[enc(k, depth + 1), enc(v, depth + 1)] for k, v in dict.items(x)]]
        return opaque(t)

    try:
        return enc(value, 0)
    except (_TooLarge, RecursionError) as e:
        if strict:
            raise TypeError(str(e) or "nested too deep") from None
        return ["o", "a value too large to send (%s)" % (str(e) or "nested too deep")]


def decode(v, depth=0):
    """tagged plain data -> value; ProtocolError for anything else. Builds builtin values only."""
    if depth > MAX_DEPTH + 1 or type(v) is not list or not v or type(v[0]) is not str:
        raise ProtocolError("not a tagged value")
    tag, n = v[0], len(v)
    try:
        if n == 1 and tag == "n":
            return None
        if n == 2:
            a = v[1]
            if tag == "B" and type(a) is bool:
                return a
            if tag == "i" and type(a) is str and _HEX_INT.fullmatch(a):
                return int(a, 16)
            if tag == "f" and type(a) is str:
                return float.fromhex(a)
            if tag == "s" and type(a) is str:
                return a
            if tag in ("b", "ba") and type(a) is str and _HEX_BYTES.fullmatch(a):
                return (bytes if tag == "b" else bytearray).fromhex(a)
            if tag == "o" and type(a) is str:
                return Opaque(a[:100])
            if type(a) is list and tag in ("l", "t", "S", "F"):
                items = [decode(i, depth + 1) for i in a]
                return {"l": list, "t": tuple, "S": set, "F": frozenset}[tag](items)
            if type(a) is list and tag == "d":
                out = {}
                for pair in a:
                    if type(pair) is not list or len(pair) != 2:
                        raise ProtocolError("a dict entry that is not a pair")
                    out[decode(pair[0], depth + 1)] = decode(pair[1], depth + 1)
                return out
        if n == 3 and tag == "c" and type(v[1]) is str and type(v[2]) is str:
            return complex(float.fromhex(v[1]), float.fromhex(v[2]))
    except (ValueError, TypeError, OverflowError) as e:  # float.fromhex junk, an unhashable key
        raise ProtocolError("bad %r value (%s)" % (tag[:10], str(e)[:100])) from None
    raise ProtocolError("unknown tag %r" % tag[:10])


def write_frame(fd, message):
    """Send one JSON message, length-prefixed. ValueError when it is larger than MAX_FRAME."""
    data = _json.dumps(message, separators=(",", ":"), allow_nan=False).encode()
    if len(data) > MAX_FRAME:
        raise ValueError("a message of %d bytes (the most is %d)" % (len(data), MAX_FRAME))
    view = memoryview(len(data).to_bytes(4, "big") + data)
    while view:
        view = view[_os.write(fd, view):]


def _read_exact(fd, n):
    parts = []
    while n:
        chunk = _os.read(fd, min(n, 1 << 20))
        if not chunk:
            raise EOFError
        parts.append(chunk)
        n -= len(chunk)
    return b"".join(parts)


def read_frame(fd):
    """Receive one message. EOFError when the writer is gone, ProtocolError when it is not a frame of JSON."""
    size = int.from_bytes(_read_exact(fd, 4), "big")
    if size > MAX_FRAME:
        raise ProtocolError("a message of %d bytes announced (the most is %d)" % (size, MAX_FRAME))
    data = _read_exact(fd, size)
    try:
        return _json.loads(data)
    except (ValueError, RecursionError) as e:
        raise ProtocolError("not JSON (%s)" % str(e)[:100]) from None

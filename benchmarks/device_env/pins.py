"""The pin file (benchmarks/device_env/pins.toml), read into typed records; every malformed entry is an error that
names the file and the field."""
from __future__ import annotations

import tempfile
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

PINS = Path(__file__).resolve().parent / "pins.toml"
STAND_INS = Path(__file__).resolve().parent / "stand_ins"
DEFAULT_OUT = Path(__file__).resolve().parents[2] / ".device_env" / "gpu-env.tar.xz"  # ignored by git
DEFAULT_CACHE = Path(tempfile.gettempdir()) / "r9k-device-env-cache"  # downloaded wheels, reused by later builds


class PinError(ValueError):
    """The pin file is malformed: the message names the file and the field."""


@dataclass(frozen=True)
class Wheel:
    """One pinned wheel: its distribution name, exact version, the top-level import names it provides, and why
    the GPU host needs it."""

    name: str
    version: str
    imports: tuple[str, ...]
    why: str


@dataclass(frozen=True)
class Host:
    """The GPU host the archive is built for: its Python (``"3.12"``), the wheel ABI and platform tags it takes,
    and the import names its own install provides -> their versions (torch, triton); ``image``: the
    distributions of the host's image that r9k's own requirements (pyproject.toml) take from it instead of a pin
    (as the device tool's KINDS.md lists the image)."""

    python: str
    abis: tuple[str, ...]
    platforms: tuple[str, ...]
    provided: dict[str, str]
    image: tuple[str, ...] = ()


@dataclass(frozen=True)
class Vllm:
    """vLLM's version, the modules whose import closure must resolve on the host, and what of its wheel's tree goes
    into the archive (files with these suffixes, outside these directories); ``unreached``: modules the closure
    names that the host never imports (behind a run-time test for a compiled module that does not travel), each
    with why."""

    version: str
    roots: tuple[str, ...]
    keep_suffixes: tuple[str, ...]
    drop_dirs: tuple[str, ...]
    unreached: dict = field(default_factory=dict)


@dataclass(frozen=True)
class Pins:
    host: Host
    vllm: Vllm
    absent: dict[str, str]  # import name -> why the CUDA host never reaches it
    wheels: tuple[Wheel, ...]

    def provider(self, import_name: str) -> Wheel | None:
        """The pinned wheel whose top-level names include ``import_name``, else None."""
        return next((w for w in self.wheels if import_name in w.imports), None)


def _get(table: dict, key: str, kind: type, where: str):
    if key not in table:
        raise PinError(f"{where}: missing field '{key}'")
    v = table[key]
    if kind is tuple:
        if not isinstance(v, list) or not all(isinstance(x, str) and x for x in v):
            raise PinError(f"{where}.{key}: expected a list of non-empty strings, got {v!r}")
        return tuple(v)
    if kind is dict:
        if not isinstance(v, dict) or not all(isinstance(x, str) and x for x in v.values()):
            raise PinError(f"{where}.{key}: expected a table of non-empty strings, got {v!r}")
        return dict(v)
    if not isinstance(v, str) or not v:
        raise PinError(f"{where}.{key}: expected a non-empty string, got {v!r}")
    return v


def load(path: Path = PINS) -> Pins:
    """Read and check the pin file. Raises PinError naming ``path`` and the field on a malformed entry, a
    duplicate wheel, an import that is not a top-level name, or two wheels claiming one import name; TOML syntax
    errors are PinError with the line."""
    try:
        doc = tomllib.loads(path.read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as e:
        raise PinError(f"{path}: {e}") from e
    f = str(path)
    for key in ("host", "vllm", "absent", "wheel"):
        if key not in doc:
            raise PinError(f"{f}: missing table [{key}]")
    h, v = doc["host"], doc["vllm"]
    host = Host(_get(h, "python", str, f"{f}: host"), _get(h, "abis", tuple, f"{f}: host"),
                _get(h, "platforms", tuple, f"{f}: host"), _get(h, "provided", dict, f"{f}: host"),
                _get(h, "image", tuple, f"{f}: host") if "image" in h else ())
    vllm = Vllm(_get(v, "version", str, f"{f}: vllm"), _get(v, "roots", tuple, f"{f}: vllm"),
                _get(v, "keep_suffixes", tuple, f"{f}: vllm"), _get(v, "drop_dirs", tuple, f"{f}: vllm"),
                _get(v, "unreached", dict, f"{f}: vllm") if "unreached" in v else {})
    absent = _get(doc, "absent", dict, f)
    wheels, names, claimed = [], set(), {}
    for i, w in enumerate(doc["wheel"]):
        where = f"{f}: wheel[{i}]"
        wheel = Wheel(_get(w, "name", str, where), _get(w, "version", str, where), _get(w, "imports", tuple, where),
                      _get(w, "why", str, where))
        extra = set(w) - {"name", "version", "imports", "why"}
        if extra:
            raise PinError(f"{where} ({wheel.name}): unknown field(s) {sorted(extra)}")
        key = wheel.name.lower().replace("_", "-").replace(".", "-")
        if key in names:
            raise PinError(f"{where}: {wheel.name} is pinned twice")
        names.add(key)
        for imp in wheel.imports:
            if not imp.isidentifier():
                raise PinError(f"{where} ({wheel.name}): imports: {imp!r} is not a top-level import name")
            if imp in claimed:
                raise PinError(f"{where} ({wheel.name}): import name '{imp}' is also claimed by {claimed[imp]}")
            claimed[imp] = wheel.name
        wheels.append(wheel)
    return Pins(host, vllm, absent, tuple(wheels))

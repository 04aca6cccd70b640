"""Kernel unit gates: on the CPU through Triton's interpreter (small shapes, what CI runs), and at full shapes
on a CUDA GPU when one is present (marker ``gpu``).

Without a GPU, ``TRITON_INTERPRET=1`` is set here before any kernel module is imported (Triton reads it when a
kernel is decorated), so ``pytest tests/kernels`` runs the interpreter path with or without the variable.
"""
from __future__ import annotations

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

INTERPRET = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")
HAS_GPU = torch.cuda.is_available() and not INTERPRET

try:
    import triton  # noqa: F401

    HAS_TRITON = True
except ImportError:  # pragma: no cover
    HAS_TRITON = False

# One parameter per place the kernels can run; the one that cannot run here is skipped with its reason.
MODES = [
    pytest.param("interp", id="interp",
                 marks=pytest.mark.skipif(not (INTERPRET and HAS_TRITON), reason="needs TRITON_INTERPRET=1 and triton")),
    pytest.param("gpu", id="gpu",
                 marks=[pytest.mark.gpu, pytest.mark.skipif(not (HAS_GPU and HAS_TRITON), reason="needs a CUDA GPU")]),
]


@pytest.fixture(params=MODES)
def mode(request) -> str:
    return request.param


@pytest.fixture
def device(mode) -> str:
    return "cpu" if mode == "interp" else "cuda"


@pytest.fixture
def gen(device) -> torch.Generator:
    """A freshly seeded generator per test: fresh random inputs, reproducible from the printed seed."""
    seed = int.from_bytes(os.urandom(4), "little")
    print(f"seed={seed}")
    g = torch.Generator(device="cpu")
    g.manual_seed(seed)
    return g


@pytest.fixture
def fast(monkeypatch):
    """kernels/_launch.py's cached launch path switched on, as on a GPU (no interpreter): for stand-in kernels."""
    import kernels._launch as L

    monkeypatch.setattr(L, "FAST", True)
    monkeypatch.setattr(L, "_interpreting", lambda: False)

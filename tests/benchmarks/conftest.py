"""The registry's test runs r9k's kernels at tiny shapes on the CPU: Triton's interpreter is switched on before any
kernel module is imported, as in tests/kernels/conftest.py."""
from __future__ import annotations

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

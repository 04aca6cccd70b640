"""Stand-in for vLLM's compiled ``_C_stable_libtorch`` extension, for a GPU host that runs vLLM's Python sources
without its CUDA build (benchmarks/device_env: the air-gapped kernel benchmarks and gates).

``vllm/platforms/cuda.py`` imports this module at import time; the real one registers vLLM's CUDA ops under the
``torch.ops._C`` namespace. The four ops registered here are the ones vLLM's Python asks at import or when it
picks a kernel (``vllm/_custom_ops.py``: ``cutlass_scaled_mm_supports_fp8``, ``..._block_fp8``, ``..._fp4``,
``cutlass_group_gemm_supported``; ``w8a8_utils.CUTLASS_BLOCK_FP8_SUPPORTED`` is computed at import). Each answers
False for every device capability, so vLLM selects its Triton kernels, the path r9k's dispatch hooks. The
``torch.ops._C`` ops a serve cannot avoid get torch stand-ins from ``vllm._serve_ops`` (its docstring lists them and
why); any other ``torch.ops._C`` op is absent: a call to one fails with torch's AttributeError naming it.
"""
import torch

from vllm import _serve_ops

_QUERIES = (
    "cutlass_scaled_mm_supports_fp8",
    "cutlass_scaled_mm_supports_block_fp8",
    "cutlass_scaled_mm_supports_fp4",
    "cutlass_group_gemm_supported",
)


def _unsupported(cuda_device_capability: int) -> bool:
    """No CUTLASS kernel is built here, whatever the capability (an int such as 90)."""
    return False


def _registered(name: str) -> bool:
    try:
        getattr(torch.ops._C, name)
    except AttributeError:
        return False
    return True


_LIB = torch.library.Library("_C", "FRAGMENT")
for _name in _QUERIES:
    if not _registered(_name):  # a real _C loaded first keeps its own answers
        _LIB.define(f"{_name}(int cuda_device_capability) -> bool")
        _LIB.impl(_name, _unsupported, "CompositeExplicitAutograd")

_serve_ops.register("_C")

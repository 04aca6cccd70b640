"""Stand-in for vLLM's ``vllm_flash_attn`` package (its flash-attention CUDA extensions), for a GPU host that runs
vLLM's Python sources without its CUDA build (benchmarks/device_env).

vLLM's own ``__init__`` raises ImportError when neither compiled extension is present, and
``vllm/v1/attention/backends/fa_utils.py`` imports three of its names at import time on CUDA, on the import path
of the fp8 linear kernels (``vllm.model_executor.kernels.linear``). Here every version reports unsupported and
every attention entry point raises: nothing r9k's gates or benchmarks run calls flash attention.
"""
from vllm.vllm_flash_attn.flash_attn_interface import (
    FA2_AVAILABLE,
    FA3_AVAILABLE,
    compile_flash_attn_varlen_func_from_specs,
    fa_version_unsupported_reason,
    flash_attn_varlen_func,
    get_scheduler_metadata,
    is_fa_version_supported,
)

__all__ = [
    "FA2_AVAILABLE",
    "FA3_AVAILABLE",
    "compile_flash_attn_varlen_func_from_specs",
    "fa_version_unsupported_reason",
    "flash_attn_varlen_func",
    "get_scheduler_metadata",
    "is_fa_version_supported",
]

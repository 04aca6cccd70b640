"""Stand-in for ``vllm.vllm_flash_attn.flash_attn_interface`` (see the package's docstring): no flash-attention
version is available, and every attention entry point raises RuntimeError saying so."""
from __future__ import annotations

FA2_AVAILABLE = False
FA3_AVAILABLE = False
FA4_AVAILABLE = False
REASON = "vLLM's flash-attention extensions are not in this environment (benchmarks/device_env stand-in)"
FA2_UNAVAILABLE_REASON = FA3_UNAVAILABLE_REASON = FA4_UNAVAILABLE_REASON = REASON


def fa_version_unsupported_reason(fa_version: int, device=None) -> str:
    """Why flash-attention version ``fa_version`` cannot run: always this environment's reason."""
    return REASON


def is_fa_version_supported(fa_version: int, device=None) -> bool:
    """No flash-attention version is supported here."""
    return False


def _absent(*args, **kwargs):
    raise RuntimeError(REASON)


flash_attn_varlen_func = _absent
get_scheduler_metadata = _absent
compile_flash_attn_varlen_func_from_specs = _absent

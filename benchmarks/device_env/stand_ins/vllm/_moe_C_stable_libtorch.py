"""Stand-in for vLLM's compiled ``_moe_C_stable_libtorch`` extension (its fused-MoE routing and alignment ops), for
a GPU host that runs vLLM's Python sources without its CUDA build (benchmarks/device_env). ``CudaPlatform.
import_kernels`` imports it in every vLLM process; it registers the ``torch.ops._moe_C`` ops a serve of vLLM's
Triton experts cannot avoid (``topk_softmax``, ``moe_align_block_size``, ``moe_sum``) as torch stand-ins from
``vllm._serve_ops``. Any other ``torch.ops._moe_C`` op is absent."""
from vllm import _serve_ops

_serve_ops.register("_moe_C")

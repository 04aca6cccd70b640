"""One short device check that the carried vLLM sources import and their GDN / fp8 Triton ops run beside the device's
torch (no compiled vLLM extension). Prints what torch offers for block-scaled fp8."""
import time
import traceback

import torch

t0 = time.time()
print("torch", torch.__version__, "cuda", torch.version.cuda, torch.cuda.get_device_name())
import triton  # noqa: E402

print("triton", triton.__version__)
for name in ["vllm", "vllm.model_executor.layers.mamba.gdn.qwen_gdn_linear_attn",
             "vllm.model_executor.layers.quantization.utils.fp8_utils", "vllm.model_executor.kernels.linear",
             "vllm.v1.attention.backends.gdn_attn"]:
    try:
        __import__(name)
        print("import ok", name, f"{time.time() - t0:.1f}s")
    except Exception:
        print("import FAILED", name)
        traceback.print_exc()
from vllm.platforms import current_platform  # noqa: E402

print("platform", type(current_platform).__name__)
import vllm.triton_utils.importing as imp  # noqa: E402

print("vllm HAS_TRITON", imp.HAS_TRITON)
print("F.scaled_mm", hasattr(torch.nn.functional, "scaled_mm"), "ScalingType",
      [n for n in dir(torch.nn.functional) if "Scal" in n or "Swizzle" in n])
try:
    from vllm.third_party.flash_linear_attention.ops import chunk_gated_delta_rule
    from vllm.third_party.flash_linear_attention.ops.index import prepare_chunk_indices, prepare_chunk_offsets
    T, H, HV, K = 100, 4, 8, 128
    q = torch.nn.functional.normalize(torch.randn(1, T, H, K, device="cuda"), dim=-1).bfloat16()
    k = torch.nn.functional.normalize(torch.randn(1, T, H, K, device="cuda"), dim=-1).bfloat16()
    v = torch.randn(1, T, HV, K, device="cuda").bfloat16()
    g = -torch.rand(1, T, HV, device="cuda")
    b = torch.rand(1, T, HV, device="cuda")
    h0 = torch.randn(2, HV, K, K, device="cuda")
    cu_cpu = torch.tensor([0, 37, T], dtype=torch.int32)
    cu = cu_cpu.cuda()
    ci, co = prepare_chunk_indices(cu_cpu, 64).cuda(), prepare_chunk_offsets(cu_cpu, 64).cuda()
    o, ht = chunk_gated_delta_rule(q=q, k=k, v=v, g=g, beta=b, initial_state=h0.clone(), output_final_state=True,
                                   cu_seqlens=cu, chunk_indices=ci, chunk_offsets=co, use_qk_l2norm_in_kernel=False)
    from kernels.gdn import gdn_seq
    st = h0.clone()
    o2 = gdn_seq(q, k, v, g, b, st, torch.arange(2, dtype=torch.int32, device="cuda"), cu_seqlens=cu)
    print("fla chunk ran; vs gdn_seq rel o", ((o.float() - o2.float()).norm() / o2.float().norm()).item(),
          "state", ((ht - st).norm() / st.norm()).item(), f"{time.time() - t0:.1f}s")
except Exception:
    traceback.print_exc()
try:
    from vllm.model_executor.layers.quantization.utils.fp8_utils import (per_token_group_quant_fp8,
                                                                          w8a8_triton_block_scaled_mm)
    from kernels.fp8 import fp8_block_gemm_ref, fp8_quant_block_weight_ref
    M, N, K = 16, 512, 1024
    x = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
    qb, sb = fp8_quant_block_weight_ref(torch.randn(N, K, device="cuda"))
    qa, sa = per_token_group_quant_fp8(x, 128)
    y = w8a8_triton_block_scaled_mm(qa, qb, sa, sb, [128, 128], torch.bfloat16)
    ref = fp8_block_gemm_ref(qa, sa, qb, sb, torch.float64)
    print("vllm triton block mm rel", ((y.double() - ref).norm() / ref.norm()).item(), "sa stride", sa.stride())
    Mp = 16
    sa_cm = sa.t().contiguous().t()
    z = torch._scaled_mm(qa, qb.t(), scale_a=sa_cm, scale_b=sb.t(), out_dtype=torch.bfloat16)
    z = z[0] if isinstance(z, tuple) else z
    print("torch._scaled_mm blockwise rel", ((z.double() - ref).norm() / ref.norm()).item())
    if hasattr(torch.nn.functional, "scaled_mm"):
        F = torch.nn.functional
        try:
            z2 = F.scaled_mm(qa, qb.t(), sa_cm, F.ScalingType.BlockWise1x128, sb.t(), F.ScalingType.BlockWise128x128,
                             output_dtype=torch.bfloat16)
            print("F.scaled_mm blockwise rel", ((z2.double() - ref).norm() / ref.norm()).item())
        except Exception as e:
            print("F.scaled_mm failed", type(e).__name__, str(e)[:300])
except Exception:
    traceback.print_exc()
print(f"done {time.time() - t0:.1f}s")

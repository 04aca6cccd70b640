"""moe_topk_sum (kernels/moe/topk_sum.py): the fused top-k weighted sum with the sigmoid-gated shared expert
against moe_topk_sum_ref, with and without the shared expert, in bf16, fp16 and fp32."""
from __future__ import annotations

import pytest
import torch

from kernels.moe import moe_topk_sum, moe_topk_sum_ref


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("shared", ["gated", "none"])
def test_topk_sum(mode, device, gen, dtype, shared):
    shapes = [(5, 4, 48), (1, 1, 16), (0, 2, 8)] if mode == "interp" else [(4096, 8, 2048), (3, 10, 7168)]
    for T, k, H in shapes:
        y = torch.randn(T, k, H, generator=gen).to(device=device, dtype=dtype)
        w = torch.rand(T, k, generator=gen).to(device)
        sh = torch.randn(T, H, generator=gen).to(device=device, dtype=dtype) if shared == "gated" else None
        g = torch.randn(T, 1, generator=gen).to(device) * 3 if shared == "gated" else None
        out = torch.full((T, H), float("nan"), device=device, dtype=dtype)
        moe_topk_sum(y, w, sh, g, out=out)
        if T == 0:
            continue
        assert not torch.isnan(out).any()
        ref64 = moe_topk_sum_ref(y.double(), w.double(), None if sh is None else sh.double(),
                                 None if g is None else g.double().view(-1), torch.float64)
        e = ((out.double() - ref64).norm() / ref64.norm()).item()
        assert e < (1e-6 if dtype == torch.float32 else 4e-3), e
        if mode == "interp" and g is None:  # with a gate, numpy's and torch's fp32 exp may differ by an ulp
            assert torch.equal(out, moe_topk_sum_ref(y, w, sh, None if g is None else g.view(-1)))

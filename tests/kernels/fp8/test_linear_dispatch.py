"""r9k's block-fp8 linear dispatch (r9k/ops/fp8.py) on a real vLLM linear layer: ``ReplicatedLinear`` with vLLM's
``Fp8Config`` (128x128 weight blocks, dynamic activations) and ``TritonFp8BlockScaledMMKernel`` as its fp8 kernel,
called as vLLM calls it (``layer(x)`` -> ``Fp8LinearMethod.apply`` -> ``apply_weights``).

The layer's kernel is built directly (``init_fp8_linear_kernel`` is made to return the Triton block kernel for
the layer's own configuration): vLLM selects that kernel on ROCm without AITER and on CUDA without DeepGEMM or
CUTLASS; on this CPU it selects none (no AMX), and on the test GPU it could pick another.

CPU (TRITON_INTERPRET=1): r9k's side runs through the interpreter against a float64 reference (vLLM's own Triton
kernels are disabled there, so its side cannot run). GPU: vLLM's side against r9k's, within the GEMM's bound.
"""
from __future__ import annotations

import importlib
import importlib.util
import inspect
import logging
import socket
import types

import pytest
import torch

from kernels.fp8 import fp8_block_gemm_ref, fp8_quant_block_weight_ref, fp8_quant_group_ref
from r9k import calls
from r9k.ops import fp8 as dispatch

needs_vllm = pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vLLM is not installed")
INTERPRET = dispatch._interpreting()
HAS_GPU = torch.cuda.is_available() and not INTERPRET
# the GEMM's bound against the float64 product of the same fp8 operands: fp32 accumulation and up to two bf16
# roundings (the product, then the bias added to it), each within bf16's unit roundoff 2^-8 of its value. One
# rounding's RMS, 2^-8 / sqrt(3) = 2.3e-3, put a bound of 4e-3 within reach of two (4.006e-3 was seen at M = 1)
BOUND = 2 * 2.0 ** -8


def _kernel_module():
    return importlib.import_module(dispatch.KERNEL_MODULE)


_VC = None


def _vllm_config():
    """A VllmConfig with TP groups of one process (vLLM's linear layers read them) and a model dtype."""
    global _VC
    if _VC is not None:
        return _VC
    from vllm.config import VllmConfig, set_current_vllm_config
    from vllm.distributed import parallel_state as ps

    vc = VllmConfig()
    object.__setattr__(vc, "model_config", types.SimpleNamespace(dtype=torch.bfloat16, hf_config=None, is_moe=False))
    if ps._TP is None:
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        s.close()
        with set_current_vllm_config(vc):
            ps.init_distributed_environment(world_size=1, rank=0, local_rank=0,
                                            distributed_init_method=f"tcp://127.0.0.1:{port}", backend="gloo")
            ps.initialize_model_parallel(1, 1)
    _VC = vc
    return vc


def make_linear(K, N, bias, device, gen, monkeypatch):
    """A vLLM ReplicatedLinear [K -> N] with block-fp8 weights quantised from a random bf16 matrix; returns
    (layer, its Triton block kernel, the fp8 weight, its block scales)."""
    from vllm.config import set_current_vllm_config
    from vllm.model_executor.layers import linear as vlinear
    from vllm.model_executor.layers.quantization import fp8 as vfp8

    vc = _vllm_config()
    Triton = getattr(_kernel_module(), dispatch.KERNEL_CLASS)
    from vllm.model_executor.kernels.linear.scaled_mm.ScaledMMLinearKernel import FP8ScaledMMLinearLayerConfig

    def init_kernel(activation_quant_key, weight_quant_key, weight_shape, input_dtype, out_dtype, **_):
        return Triton(FP8ScaledMMLinearLayerConfig(weight_quant_key=weight_quant_key,
                                                   activation_quant_key=activation_quant_key,
                                                   input_dtype=input_dtype, out_dtype=out_dtype,
                                                   weight_shape=weight_shape))

    monkeypatch.setattr(vfp8, "init_fp8_linear_kernel", init_kernel)
    dflt = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)  # as vLLM's model loader does while it builds the layers
    with set_current_vllm_config(vc):
        qc = vfp8.Fp8Config(is_checkpoint_fp8_serialized=True, activation_scheme="dynamic",
                            weight_block_size=[128, 128])
        try:
            layer = vlinear.ReplicatedLinear(K, N, bias=bias, quant_config=qc, prefix="r9k_test",
                                             params_dtype=torch.bfloat16)
        finally:
            torch.set_default_dtype(dflt)
    qb, sb = fp8_quant_block_weight_ref(torch.randn(N, K, generator=gen))
    with torch.no_grad():
        layer.weight.copy_(qb)
        layer.weight_scale_inv.copy_(sb)
        if bias:
            layer.bias.copy_(torch.randn(N, generator=gen).bfloat16())
    layer.to(device)
    layer.quant_method.process_weights_after_loading(layer)
    kern = layer.quant_method.fp8_linear
    assert isinstance(kern, Triton)
    if device == "cuda" and not hasattr(torch.ops._C, "per_token_group_fp8_quant"):
        # vLLM's compiled extension is not on the test GPU (only its Python sources are): its QuantFP8 runs its
        # own torch implementation (forward_native) instead of the compiled kernel
        kern.quant_fp8._forward_method = kern.quant_fp8.forward_native
    return layer, kern, layer.weight, layer.weight_scale_inv


def _ref(x, w, s, bias):
    qa, sa = fp8_quant_group_ref(x.float().cpu())
    y = fp8_block_gemm_ref(qa, sa, w.cpu(), s.cpu(), torch.float64)
    return y + bias.cpu().double() if bias is not None else y


def _rel(a, b):
    return ((a.double().cpu() - b.double().cpu()).norm() / b.double().cpu().norm()).item()


@pytest.fixture
def gen():
    g = torch.Generator()
    print(f"seed={g.seed()}")
    return g


@needs_vllm
def test_signature_is_vllms():
    cls = getattr(_kernel_module(), dispatch.KERNEL_CLASS)
    sig = dispatch.signature(cls)
    assert sig == inspect.signature(cls.apply_weights) and list(sig.parameters)[:4] == ["self", "layer", "x", "bias"]


@needs_vllm
def test_a_changed_signature_fails_the_install(monkeypatch):
    cls = getattr(_kernel_module(), dispatch.KERNEL_CLASS)
    monkeypatch.setattr(cls, "apply_weights", lambda self, layer, inp, bias=None: None)
    with pytest.raises(dispatch.SignatureMismatch, match="x"):
        dispatch.install(cls)
    dispatch.uninstall()


@needs_vllm
def test_stock_installs_nothing_and_default_install_is_undone(monkeypatch):
    cls = getattr(_kernel_module(), dispatch.KERNEL_CLASS)
    monkeypatch.setenv("R9K_FP8_BLOCK_GEMM", "stock")
    assert dispatch.install(cls) == [] and "apply_weights" not in vars(cls)
    monkeypatch.setenv("R9K_FP8_BLOCK_GEMM", "r9k")
    (name,) = dispatch.install(cls)
    assert name.startswith("fp8_block_gemm <- ") and "apply_weights" in vars(cls)
    assert len(dispatch.install(cls)) == 1 and vars(cls)["apply_weights"].__r9k_original__ is not None
    dispatch.uninstall()
    assert "apply_weights" not in vars(cls)


def test_the_custom_op_has_a_shape_only_fake():
    dispatch._register_op()
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        x = torch.empty(5, 256, dtype=torch.bfloat16)
        w = torch.empty(384, 256, dtype=torch.float8_e4m3fn)
        s = torch.empty(3, 2)
        y = torch.ops.r9k.fp8_block_linear(x, w, s, torch.bfloat16)
    assert y.shape == (5, 384) and y.dtype == torch.bfloat16


def _device_or_skip():
    if INTERPRET:
        return "cpu"
    if HAS_GPU:
        return "cuda"
    pytest.skip("needs TRITON_INTERPRET=1 or a CUDA GPU")


@needs_vllm
@pytest.mark.gpu  # also runs under the interpreter on the CPU (r9k's side only)
@pytest.mark.parametrize("M,K,N,bias", [(1, 256, 384, True), (17, 384, 256, False), (3, 128, 130, True)])
def test_layer_runs_r9k_within_the_gemm_bound(M, K, N, bias, monkeypatch, gen):
    """``layer(x)`` routed to r9k: the fp8 GEMM of the quantised activation within BOUND of the float64 product
    (on a GPU also against vLLM's own kernel on the same layer)."""
    device = _device_or_skip()
    layer, kern, w, s = make_linear(K, N, bias, device, gen, monkeypatch)
    x = torch.randn(2, M, K, generator=gen).bfloat16().to(device)  # [batch, tokens, K]: apply_weights flattens
    ref = _ref(x.reshape(-1, K), w, s, layer.bias)
    stock = None
    if device == "cuda":
        stock = layer(x)
        stock = stock[0] if isinstance(stock, tuple) else stock
    monkeypatch.setenv("R9K_FP8_BLOCK_GEMM", "r9k")
    try:
        dispatch.install(type(kern))
        before = dispatch.STATE.routed["r9k"]
        counted = calls.totals().get(("fp8_block_gemm", "r9k", "other"), 0)
        y = layer(x)
        y = y[0] if isinstance(y, tuple) else y
        assert dispatch.STATE.routed["r9k"] == before + 1
        # outside a model runner's step: counted on the device as "other" (r9k/calls.py)
        assert calls.totals().get(("fp8_block_gemm", "r9k", "other"), 0) == counted + 1
    finally:
        dispatch.uninstall()
    assert y.shape == (2, M, N) and y.dtype == torch.bfloat16
    err = _rel(y.reshape(-1, N), ref)
    print(f"M={M} K={K} N={N}: r9k rel {err:.2e}" + (f", vLLM rel {_rel(stock.reshape(-1, N), ref):.2e}, r9k vs "
          f"vLLM {_rel(y, stock):.2e}" if stock is not None else ""))
    assert err < BOUND
    if stock is not None:  # vLLM quantises the activation itself (its rounding of the scales may differ by an ulp)
        assert _rel(stock.reshape(-1, N), ref) < 2.5 * BOUND and _rel(y, stock) < 2.5 * BOUND


@needs_vllm
@pytest.mark.gpu  # also runs under the interpreter on the CPU
def test_uncovered_layers_and_refusals_go_to_vllm(monkeypatch, gen, caplog):
    device = _device_or_skip()
    layer, kern, w, s = make_linear(256, 256, False, device, gen, monkeypatch)
    seen = []
    cls = type(kern)
    monkeypatch.setattr(cls, "apply_weights", lambda self, layer, x, bias=None, **kw: seen.append(1) or "stock",
                        raising=False)
    monkeypatch.setenv("R9K_FP8_BLOCK_GEMM", "r9k")
    try:
        dispatch.install(cls)
        x = torch.randn(4, 256, generator=gen).bfloat16().to(device)
        # an int activation, a K that is not the weight's, extra keywords: vLLM's
        assert kern.apply_weights(layer, x.to(torch.int32)) == "stock"
        assert kern.apply_weights(layer, x, extra=1) == "stock"
        # a static-scale layer: vLLM's
        layer.input_scale = torch.ones((), device=device)
        assert kern.apply_weights(layer, x) == "stock"
        layer.input_scale = None
        # r9k's kernels refusing the call: vLLM's, logged once
        from kernels import fp8 as kfp8

        def refuse(*a, **k):
            raise ValueError("not an operand layout the block GEMM covers")

        monkeypatch.setattr(kfp8, "fp8_linear", refuse)
        dispatch.STATE.refused_logged = False
        with caplog.at_level(logging.WARNING, logger="r9k"):
            assert kern.apply_weights(layer, x) == "stock" and kern.apply_weights(layer, x) == "stock"
        assert caplog.text.count("block GEMM refused a call") == 1
        assert len(seen) == 5
    finally:
        dispatch.uninstall()


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_GPU, reason="needs a CUDA GPU")
@pytest.mark.parametrize("gluon", [True, False], ids=["gluon", "triton"])
def test_the_plans_give_the_general_paths_bits_at_every_m_of_a_bucket(gluon, monkeypatch):
    """kernels.fp8.fp8_linear's and fp8_block_gemm's launch plans give the bits of the general path
    (kernels.fp8.gemm: fp8_quant_group + fp8_block_gemm) at decode and prefill shapes, for M values that reuse
    a plan another M of their bucket built (2 after 3, 17 after 20, 300 after 129...), on repeated calls and on
    a second weight of the same shape; with the Gluon kernels (Hopper) and without (the Triton kernels, what
    ROCm runs)."""
    import kernels.fp8.gemm as G
    import kernels.fp8.linear as L
    import kernels.fp8.wgmma as W
    from kernels.fp8 import fp8_block_gemm, fp8_linear, fp8_quant_group

    monkeypatch.setattr(W, "GLUON", gluon)
    L.plans_clear()
    torch.manual_seed(0)
    for _ in range(2):
        qb, sb = fp8_quant_block_weight_ref(torch.randn(1024, 2048, device="cuda"))
        for M in (3, 2, 1, 16, 20, 17, 33, 64, 65, 129, 300):
            for _ in range(2):
                x = torch.randn(M, 2048, device="cuda").bfloat16()
                qa, sa = fp8_quant_group(x)
                want = G.fp8_block_gemm(qa, sa, qb, sb, torch.bfloat16)
                assert torch.equal(fp8_linear(x, qb, sb, torch.bfloat16), want), M
                assert torch.equal(fp8_block_gemm(qa, sa, qb, sb, torch.bfloat16), want), M
    assert L.PLAN_BUILDS > 0
    L.plans_clear()


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_GPU, reason="needs a CUDA GPU")
def test_fp8_linear_in_a_cuda_graph():
    from kernels.fp8 import fp8_linear

    qb, sb = fp8_quant_block_weight_ref(torch.randn(4096, 4096, device="cuda"))
    x = torch.randn(16, 4096, device="cuda").bfloat16()
    want = fp8_linear(x, qb, sb, torch.bfloat16)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        fp8_linear(x, qb, sb, torch.bfloat16)
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        y = fp8_linear(x, qb, sb, torch.bfloat16)
    for _ in range(3):
        g.replay()
        torch.cuda.synchronize()
        assert torch.equal(y, want)
    assert torch.equal(fp8_linear(x, qb, sb, torch.bfloat16), want)  # eager again after the capture

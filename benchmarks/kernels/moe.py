"""MoE benchmarks (docs/kernels/moe.md): the expert cache's insert rate against pinned host-to-device copies of the
same size (``expert_cache``), and the fused top-k weighted sum with the shared expert (``moe_topk_sum``).

``expert_cache``: one call is one ``ExpertCache.prepare()`` step whose routed experts are all misses and all
inserted (threshold 1.0): ``per_step`` experts of ``bytes`` each, n_slots = per_step, and the steps take
distinct experts in turn (so every step of every round misses, the previous step's experts evicted). The
host store is pinned; the device path reads it zero-copy. ``r9k`` is the device path (two Triton launches a
step, no sync); ``host_path`` the reference path (``device_plan=False``: the ids copied to the host, a sync a
step; it cannot be captured in a CUDA graph); ``pinned_h2d`` a pinned ``copy_`` of the same bytes, the link's
rate for that size (also the floor's ceiling, ``h2d_pinned``). In loop mode (steps back to back, one sync) the
floor fraction is the insert rate over the pinned rate; in graph mode the steps replay from one graph, as vLLM
runs decode. Expert size 1,305,472 B: 1.245 MiB (one expert of the seeds' model per card) rounded down to a
multiple of 128 B, as real bf16 experts are.
"""
from __future__ import annotations

from types import SimpleNamespace

import torch

from benchmarks.kernels.registry import Floor, Op, register

EXPERT_BYTES = int(1.245 * 2**20) // 128 * 128
STEPS = 8  # distinct steps taken in turn


def cache_inputs(shape: dict, device: str):
    """The host store ``[E, bytes]`` uint8, E = per_step * STEPS (pinned on CUDA; every 8-byte word distinct, so
    a byte check catches a wrong expert or offset), and the ids of each step ``[per_step, 1]``."""
    per, nbytes = shape["per_step"], shape["bytes"]
    E = per * STEPS
    cuda = str(device).startswith("cuda")
    host = torch.empty(E, nbytes, dtype=torch.uint8, pin_memory=cuda)
    words = host.view(torch.int64) if nbytes % 8 == 0 else None
    if words is not None:
        base = torch.arange(nbytes // 8, dtype=torch.int64)
        for e in range(E):
            words[e].copy_(base + (e << 32))
    else:
        host.copy_(torch.randint(0, 256, host.shape, dtype=torch.uint8))
    ids = [torch.arange(s * per, (s + 1) * per, device=device).view(-1, 1) for s in range(STEPS)]
    return SimpleNamespace(host=host, ids=ids, per=per, device=device, shape=shape)


def _cache(device_plan: bool):
    def make(a):
        from kernels.moe import ExpertCache

        cache = ExpertCache([a.host], n_slots=a.per, max_tokens=a.per, top_k=1, device=a.device, insert_thresh=1.0,
                            stage_slots=a.per, device_plan=device_plan)
        return [(lambda ids=ids: (cache.prepare(ids), cache)) for ids in a.ids]
    return make


def _pinned_h2d(a):
    src = a.host[: a.per].reshape(-1)
    dst = torch.empty_like(src, device=a.device)
    return lambda: dst.copy_(src, non_blocking=True)


def cache_check(a, result) -> float:
    """0.0 when the first step's slots hold the host bytes of the experts it routed to, 1.0 when not."""
    plan, cache = result
    got = cache.weights[0][plan.slot_ids.view(-1).long()]
    return 0.0 if torch.equal(got.cpu(), a.host[a.ids[0].view(-1).cpu()]) else 1.0


def cache_floor(s: dict) -> Floor:
    nbytes = s["per_step"] * s["bytes"]
    return Floor(bytes=nbytes, bytes_ceiling="h2d_pinned", bytes_size=nbytes)


register(Op(
    name="expert_cache", family="moe",
    doc="ExpertCache.prepare() steps whose experts all miss and are all inserted (kernels.moe.ExpertCache, device "
        "path) against its host path and a pinned host-to-device copy of the same bytes",
    shapes=(dict(per_step=1, bytes=EXPERT_BYTES), dict(per_step=205, bytes=EXPERT_BYTES)),
    build=cache_inputs, r9k=_cache(True), floor=cache_floor,
    peers={"host_path": _cache(False), "pinned_h2d": _pinned_h2d},
    check=cache_check, unchecked=("pinned_h2d",), tiny=dict(per_step=2, bytes=256),
    modes=("loop", "graph", "host"), default_mode="loop",
))


def topk_inputs(shape: dict, device: str):
    T, k, H = shape["T"], shape["k"], shape["H"]
    gen = torch.Generator(device="cpu").manual_seed(0)
    y = torch.randn(T, k, H, generator=gen).bfloat16().to(device)
    w = torch.rand(T, k, generator=gen).to(device)
    sh = torch.randn(T, H, generator=gen).bfloat16().to(device)
    g = torch.randn(T, generator=gen).to(device)
    return SimpleNamespace(y=y, w=w, sh=sh, g=g, shape=shape)


def _topk(a):
    from kernels.moe import moe_topk_sum

    return lambda: moe_topk_sum(a.y, a.w, a.sh, a.g)


def _torch_topk(a):
    return lambda: ((a.y.float() * a.w[..., None]).sum(1) + torch.sigmoid(a.g)[:, None] * a.sh.float()).bfloat16()


def _topk_ref(a):
    from kernels.moe import moe_topk_sum_ref

    return moe_topk_sum_ref(a.y.double(), a.w.double(), a.sh.double(), a.g.double())


def topk_floor(s: dict) -> Floor:
    T, k, H = s["T"], s["k"], s["H"]
    return Floor(bytes=T * k * H * 2 + T * H * 2 + T * H * 2 + T * k * 4 + T * 4, bytes_ceiling="copy")


register(Op(
    name="moe_topk_sum", family="moe",
    doc="the fused top-k weighted sum with the sigmoid-gated shared expert (kernels.moe.moe_topk_sum) against "
        "the same in eager torch",
    shapes=(dict(T=16, k=8, H=4096), dict(T=4096, k=8, H=4096)),
    build=topk_inputs, r9k=_topk, floor=topk_floor, peers={"torch": _torch_topk},
    ref=_topk_ref, tiny=dict(T=3, k=2, H=64),
))

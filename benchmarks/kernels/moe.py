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


# ---- moe_decode_step: a decode step of vLLM's Triton MoE layer with its experts in host RAM ----------------------
DECODE = dict(E=512, k=10, H=2048, I=128, requests=8, slots=270, decode=1)  # an expert: 3 H I bf16 = 1.5 MiB
DECODE_STEPS = 48  # distinct steps of traffic, taken in turn (after as many warm-up steps)
DECODE_BURN = 512  # steps of DecodeTraffic drawn and dropped first: the batch's requests are mid-decode
_WEIGHTS: dict = {}


class _Steps(list):
    """The step callables of one impl, with what its timer reads: the layer, its cache (or None), the inputs."""

    layer = None
    cache = None
    inputs = None


def decode_inputs(shape: dict, device: str):
    """The layer's weights (CPU, bf16: make_weights), ``DECODE_STEPS`` steps of routing for ``requests`` requests
    of 4 tokens (1 + 3 MTP) and their activations, on ``device``: ``decode`` = 1: DecodeTraffic (requests that
    stay in the batch, after ``DECODE_BURN`` steps), 0: SeedTraffic's fresh draw."""
    from tests.kernels.moe import vllm_moe_case as case

    why = case.setup() if str(device).startswith("cuda") else "the decode step is measured on a GPU"
    gen = torch.Generator().manual_seed(26)
    E, k, H, I = shape["E"], shape["k"], shape["H"], shape["I"]
    key = (E, H, I)
    if key not in _WEIGHTS:  # one layer's weights for every shape of a run
        _WEIGHTS.clear()
        _WEIGHTS[key] = case.make_weights(E, H, I, "bf16", torch.Generator().manual_seed(25))
    weights = _WEIGHTS[key]
    traffic = case.TRAFFIC["decode" if shape.get("decode", 0) else "fresh"](E=E, k=k, requests=shape["requests"],
                                                                             seed=11)
    if shape.get("decode", 0):
        for _ in range(DECODE_BURN):
            traffic.step()
    steps = []
    for _ in range(DECODE_STEPS):
        ids, w = traffic.step()
        x = torch.randn(ids.shape[0], H, generator=gen).bfloat16()
        steps.append((x.to(device), w.to(device), ids.to(device)))
    return SimpleNamespace(weights=weights, steps=steps, shape=shape, device=device, why=why,
                           expert_bytes=sum(t[0].numel() * t.element_size() for t in weights.values()))


def _decode_layer(a, kind: str):
    """(the layer, its cache or None, the device bytes its set-up left allocated: torch.cuda.memory_allocated
    after less before)."""
    from benchmarks.kernels.registry import Unavailable

    if a.why is not None:
        raise Unavailable(a.why)
    import gc

    from r9k.ops import moe

    moe.STATE.layers.clear()  # earlier shapes' layers: freed (their cycles too) before the measurement
    gc.collect()
    torch.cuda.synchronize()
    m0 = torch.cuda.memory_allocated()
    layer, cache = _decode_layer_setup(a, kind)
    torch.cuda.synchronize()
    return layer, cache, torch.cuda.memory_allocated() - m0


def _decode_layer_setup(a, kind: str):
    from tests.kernels.moe import vllm_moe_case as case

    k = a.shape["k"]
    if kind == "uva":  # every expert read over the bus: the weights are pinned host tensors, which Triton's launcher
        #                hands to the kernel as their device-visible (UVA) address, as the cache's copy kernel reads
        #                its store (stands in for vLLM's compiled get_accelerator_view_from_cpu_tensor)
        w = {n: t.pin_memory() for n, t in a.weights.items()}
        layer = case.make_layer(a.weights, k, a.device)
        layer.w13_weight = torch.nn.Parameter(w["w13"], requires_grad=False)
        layer.w2_weight = torch.nn.Parameter(w["w2"], requires_grad=False)
        return layer, None
    layer = case.make_layer(a.weights, k, a.device)
    if kind == "resident":
        return layer, None
    import importlib
    import os

    from r9k.ops import moe

    tm = importlib.import_module(case.TRITON_MODULE)
    os.environ.update(R9K_MOE_CACHE_SLOTS=str(a.shape["slots"]), R9K_MOE_CACHE_STAGING="-1",
                      R9K_MOE_CACHE_STATS="0", R9K_MOE_CACHE_READ="stage" if kind == "stage" else "through")
    moe.install(experts_cls=tm.TritonExperts, backend="triton", triton_module=tm)
    holder = torch.nn.Module()
    holder.experts = layer
    if moe.take_model(holder) != 1:
        raise RuntimeError(f"the cache did not take the layer: {moe.STATE.passed}")
    return layer, moe.STATE.layers[-1].cache


def _decode(kind: str):
    def make(a):
        from tests.kernels.moe import vllm_moe_case as case

        layer, cache, dev = _decode_layer(a, kind)
        fns = _Steps(lambda s=s: case.forward(layer, *s) for s in a.steps)
        fns.layer, fns.cache, fns.inputs, fns.dev_bytes, fns.kind = layer, cache, a, dev, kind
        return fns
    return make


def _prefetch(a):
    from benchmarks.kernels.registry import Unavailable

    raise Unavailable(
        "vLLM's prefetch offloader (model_executor/offloader/prefetch.py) copies whole layers' offloaded "
        "parameters ahead of their forward on a side stream, in the model's layer order: one layer without a model "
        "has no next layer to overlap with; on the bus it moves every expert of every layer each step "
        f"({a.shape['E']} x {a.expert_bytes / 2**20:.2f} MiB a layer), the bound the report prints beside UVA")


def _h2d_rate(device, nbytes: int = 256 * 2**20) -> float:
    """Pinned host-to-device copy rate in B/s (the median of 5 copies of ``nbytes``)."""
    src = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
    dst = torch.empty(nbytes, dtype=torch.uint8, device=device)
    dst.copy_(src, non_blocking=True)
    torch.cuda.synchronize()
    ts = []
    for _ in range(5):
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        dst.copy_(src, non_blocking=True)
        e1.record()
        e1.synchronize()
        ts.append(e0.elapsed_time(e1) / 1e3)
    return nbytes / sorted(ts)[len(ts) // 2]


def _loop_us(fns) -> float:
    for f in fns:  # warm-up: a pass over every step (the cache reaches its steady state)
        f()
    torch.cuda.synchronize()
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    e0.record()
    for f in fns:
        f()
    e1.record()
    e1.synchronize()
    return e0.elapsed_time(e1) * 1e3 / len(fns)


def _graph_us(fns) -> float:
    """Decode as vLLM runs it: one step captured in a CUDA graph on static inputs (after an eager step), then each
    step's own routing and activations copied into them and the graph replayed, back to back (one sync), after a
    warm-up pass; us a step (the three small input copies included)."""
    from tests.kernels.moe import vllm_moe_case as case

    steps = fns.inputs.steps
    xs, ws, ids = (t.clone() for t in steps[0])
    case.forward(fns.layer, xs, ws, ids)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        case.forward(fns.layer, xs, ws, ids)

    def run():
        for x, w, i in steps:
            xs.copy_(x)
            ws.copy_(w)
            ids.copy_(i)
            g.replay()
    run()
    torch.cuda.synchronize()
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    e0.record()
    run()
    e1.record()
    e1.synchronize()
    return e0.elapsed_time(e1) * 1e3 / len(steps)


_STEP_US = {"loop": _loop_us, "graph": _graph_us}


def _decode_timer(mode: str):
    return lambda fns: decode_timer(fns, mode)


def decode_timer(fns, mode: str = "loop"):
    """The step's time in ``mode`` (loop: steps back to back, eager; graph: replayed from a CUDA graph), each step's
    own routing, after a warm-up pass; every impl's device memory (the allocator's bytes left by its set-up, and
    their share of all experts resident); for the cache also, over a warm-up and a timed pass after the first:
    the hit rate, distinct experts and bytes over the bus a step (inserts and read-through misses, each once),
    prepare()'s GPU time a step (the plan, its copies and tables alone, on the same steps), the all-resident step
    and the pinned H2D rate measured here, and the target (resident step + the step's bus bytes / pinned rate)."""
    step_us = _STEP_US[mode]
    cache, a = fns.cache, fns.inputs
    mem = dict(dev_bytes=fns.dev_bytes, mem_ratio=fns.dev_bytes / (a.shape["E"] * a.expert_bytes))
    us = step_us(fns)
    if cache is None:
        return us, mem
    from kernels.moe import device_bytes

    mem["dev_bytes_computed"] = device_bytes(cache.E, cache.n_slots, [h[0].numel() * h.element_size()
                                                                      for h in cache.host], cache.max_tokens,
                                             cache.top_k, stage_slots=cache.stage_slots, read=cache.read,
                                             device_plan=bool(cache.device_plan))
    cache.reset_stats()
    us = step_us(fns)
    st = cache.stats
    n = max(st.steps, 1)
    bus = (st.inserts + st.read_through) / n * a.expert_bytes
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    e0.record()
    for _, _, ids in a.steps:
        cache.prepare(ids)
    e1.record()
    e1.synchronize()
    prep_us = e0.elapsed_time(e1) * 1e3 / len(a.steps)
    rate = _h2d_rate(a.device)
    res_us = step_us(_decode("resident")(a))
    target = res_us + bus / rate * 1e6
    return us, dict(mem, read=cache.read, hit_rate=st.hits / st.distinct if st.distinct else 0.0,
                    distinct_step=st.distinct / n,
                    bus_bytes_step=bus, h2d_GBps=rate / 1e9, resident_us=res_us, target_us=target,
                    target_ratio=us / target if target else float("nan"), prepare_us=prep_us,
                    uva_bus_bytes_step=a.shape["E"] * a.expert_bytes, host_steps=cache.path_steps["host"])


def decode_check(a, result) -> float:
    """0.0 when the cache's first step equals the all-resident layer's bit for bit, 1.0 when not."""
    from tests.kernels.moe import vllm_moe_case as case

    want = case.forward(case.make_layer(a.weights, a.shape["k"], a.device), *a.steps[0])
    return 0.0 if torch.equal(result, want) else 1.0


def decode_floor(s: dict) -> Floor:
    """The routed experts' weights read once from device memory: at most min(E, tokens x k) experts a step."""
    return Floor(bytes=min(s["E"], 4 * s["requests"] * s["k"]) * 3 * s["H"] * s["I"] * 2, bytes_ceiling="copy")


def decode_report(rows: list) -> None:
    """The table of docs/kernels/moe.md: per traffic, mode and shape, the cache's step (read-through) against
    resident, UVA and the staging cache, with its figures and the device memory over all-resident."""
    print("\nmoe_decode_step: traffic mode requests slots | hit rate | bus MB/step | step us | resident us | "
          "target us (ratio) | uva us | stage us | H2D GB/s | prepare us | memory (stage)")
    by = {}
    for r in rows:
        sh = r["shape"]
        by.setdefault(("decode" if sh.get("decode", 0) else "fresh", r["mode"], sh["requests"], sh["slots"]),
                      {})[r["impl"]] = r
    nan = float("nan")
    for (traffic, mode, req, slots), d in sorted(by.items()):
        c, u, rs, sg = d.get("r9k", {}), d.get("uva", {}), d.get("resident", {}), d.get("stage", {})
        if not c:
            continue
        print(f"  {traffic:>6} {mode:>5} {req:>3} {slots:>4} | {c.get('hit_rate', nan):.3f} | "
              f"{c.get('bus_bytes_step', nan) / 1e6:8.1f} | {c['us']:8.1f} | "
              f"{rs.get('us', c.get('resident_us', nan)):8.1f} | {c.get('target_us', nan):8.1f} "
              f"({c.get('target_ratio', nan):.2f}) | {u.get('us', nan):8.1f} | {sg.get('us', nan):8.1f} | "
              f"{c.get('h2d_GBps', nan):5.1f} | {c.get('prepare_us', nan):6.1f} | "
              f"{c.get('mem_ratio', nan):.3f} ({sg.get('mem_ratio', nan):.3f})")


register(Op(
    name="moe_decode_step", family="moe",
    doc="a decode step of vLLM's Triton MoE layer (E=512, top-10; decode=1: requests that stay in the batch, "
        "DecodeTraffic; 0: SeedTraffic's fresh draw) on r9k's expert cache reading its misses through the pointer "
        "table (slots of the experts in device memory over pinned host RAM) against all experts resident, "
        "vLLM-style UVA offload (every expert read over the bus) and the cache staging its misses",
    shapes=tuple(dict(DECODE, requests=r, slots=s, decode=d) for d in (1, 0) for s in (270, 135) for r in (1, 8, 32)),
    build=decode_inputs, r9k=_decode("cache"), floor=decode_floor,
    peers={"resident": _decode("resident"), "uva": _decode("uva"), "stage": _decode("stage"), "prefetch": _prefetch},
    unchecked=("resident", "uva", "prefetch"), check=decode_check,
    tiny=dict(E=16, k=4, H=128, I=128, requests=1, slots=8, decode=1), cpu=False,
    modes=("loop", "graph"), default_mode="graph",
    timers={"loop": _decode_timer("loop"), "graph": _decode_timer("graph")}, report=decode_report,
    needs="vLLM's Python sources (benchmarks/device_env), a GPU",
))

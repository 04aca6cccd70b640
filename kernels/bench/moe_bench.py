"""H200 benchmark: the expert cache's insert copy rate against pinned host-to-device bandwidth, and the fused
top-k sum.

Insert rate: steps whose routed experts are all misses (under the insert threshold, so every one is inserted),
issued back to back with one sync at the end, timed end to end (prepare(): bookkeeping, the copies, the slot
ids); bytes inserted / time. The device path also captured in a CUDA graph (how vLLM runs decode): the steps
replayed from one graph, timed by CUDA events, so the host's launch cost is out of the figure. Both paths of ExpertCache are timed: the device path (two Triton launches per
step, no sync, the copy a zero-copy gather from the pinned store) and the host path (device_plan=False, the
old one: syncs every step). Floor: pinned H2D copies of the same size issued back to back (torch copy_,
non_blocking) -- the link rate for that copy size. Each figure is the median of 3 runs (a fresh cache each,
so every timed step misses). Expert size 1.245 MiB (the seeds' Flash-Next expert per card) rounded down to a
multiple of 128 B (1,305,472 B: real experts are bf16 matrices, 128-B multiples; the zero-copy reads go by
128-B lines); cases: one expert per step, and 205 experts (255 MiB) per step. Target: inserts >= 90% of the
pinned rate for the same copy size. Also printed per path: the CPU time to issue one step (if it exceeds the
copy time the path is host-bound), the synchronising torch calls per step (torch's sync debug mode, counted on
a separate warm-up cache), and a byte check of the last step's slots against the host store.

Usage (device): python -m kernels.bench.moe_bench [--json OUT.json]
"""
from __future__ import annotations

import argparse
import json
import statistics
import time
import traceback
import warnings

import torch
import triton.testing

from kernels.moe import ExpertCache, moe_topk_sum

EXPERT_BYTES = int(1.245 * 2**20) // 128 * 128
RUNS = 3


def h2d_rate(nbytes: int, reps: int = 20) -> float:
    """GB/s of ``reps`` pinned host -> device copies of ``nbytes`` issued back to back (median of RUNS)."""
    src = torch.empty(nbytes, dtype=torch.uint8).pin_memory()
    dst = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    dst.copy_(src, non_blocking=True)
    torch.cuda.synchronize()
    rates = []
    for _ in range(RUNS):
        t0 = time.perf_counter()
        for _ in range(reps):
            dst.copy_(src, non_blocking=True)
        torch.cuda.synchronize()
        rates.append(nbytes * reps / (time.perf_counter() - t0) / 1e9)
    return statistics.median(rates)


def make_host(E: int) -> torch.Tensor:
    """[E, EXPERT_BYTES] uint8, pinned; every 8-byte word distinct (word i of expert e holds i + e << 32), so
    the byte check catches a wrong expert or offset."""
    host = torch.empty(E, EXPERT_BYTES, dtype=torch.uint8, pin_memory=True)
    base = torch.arange(EXPERT_BYTES // 8, dtype=torch.int64)
    for e in range(E):
        host[e].view(torch.int64).copy_(base + (e << 32))
    return host


def all_miss_cache(host: torch.Tensor, per_step: int, device_plan: bool) -> ExpertCache:
    """A cache of ``per_step`` slots over the host store, every step's experts inserted (threshold 1.0)."""
    return ExpertCache([host], n_slots=per_step, max_tokens=per_step, top_k=1, device="cuda",
                       insert_thresh=1.0, stage_slots=per_step, device_plan=device_plan)


def step_ids(per_step: int, steps: int) -> list[torch.Tensor]:
    """The ids of steps 0..steps, ``[per_step, 1]`` each: experts s*per_step .. (s+1)*per_step - 1 at step s,
    so no step routes to an expert of another."""
    return [torch.arange(s * per_step, (s + 1) * per_step, device="cuda").view(-1, 1) for s in range(steps + 1)]


def slots_hold(cache: ExpertCache, plan, host: torch.Tensor, ids: torch.Tensor) -> bool:
    """The byte check: the slots of ``plan`` hold the host bytes of the experts ``ids`` routed to."""
    got = cache.weights[0][plan.slot_ids.view(-1).long()]
    return bool(torch.equal(got, host[ids.view(-1).cpu()].to("cuda")))


def insert_rate(host: torch.Tensor, per_step: int, steps: int, device_plan: bool) -> dict:
    """Insert rate of one path: RUNS fresh caches, each warmed by one step, then ``steps`` all-miss steps of
    ``per_step`` experts issued back to back, one sync. Returns the median GB/s and diagnostics."""
    def make():
        return all_miss_cache(host, per_step, device_plan)

    ids = step_ids(per_step, steps)
    # warm-up cache: compiles the kernels, then counts the synchronising torch calls of 3 steps
    cache = make()
    for s in range(3):
        cache.prepare(ids[s])
    torch.cuda.synchronize()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            for s in range(3, 6):
                cache.prepare(ids[s])
        finally:
            torch.cuda.set_sync_debug_mode("default")
    syncs = sum("synchroniz" in str(w.message) for w in caught) / 3
    del cache
    rates, issue = [], []
    for _ in range(RUNS):
        cache = make()
        cache.prepare(ids[0])
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for s in range(1, steps + 1):
            plan = cache.prepare(ids[s])
        t1 = time.perf_counter()
        torch.cuda.synchronize()
        dt = time.perf_counter() - t0
        rates.append(per_step * EXPERT_BYTES * steps / dt / 1e9)
        issue.append((t1 - t0) / steps * 1e6)
    # byte check of the last run's last step: every routed expert's slot holds the host bytes
    st = cache.stats
    return dict(GBps=statistics.median(rates), runs_GBps=rates, issue_us_per_step=statistics.median(issue),
                syncs_per_step=syncs, bytes_ok=slots_hold(cache, plan, host, ids[steps]), device_plan=cache.device_plan,
                path_steps=dict(cache.path_steps), inserts=st.inserts, misses=st.misses, evictions=st.evictions)


def insert_rate_graph(host: torch.Tensor, per_step: int, steps: int) -> dict:
    """Insert rate of the device path captured in a CUDA graph, as vLLM runs decode: ``steps`` all-miss steps
    (each its own ids tensor) captured once after a warm-up step, the graph replayed RUNS + 1 times (the first
    replay not counted), each replay timed by CUDA events. n_slots = per_step and every step's experts are new
    within a replay, so every step of every replay inserts all of its experts. Median GB/s."""
    cache = all_miss_cache(host, per_step, device_plan=True)
    ids = step_ids(per_step, steps)
    cache.prepare(ids[0])
    torch.cuda.synchronize()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=side):
        for s in range(1, steps + 1):
            plan = cache.prepare(ids[s])
    torch.cuda.synchronize()
    rates = []
    for r in range(RUNS + 1):
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        graph.replay()
        e1.record()
        e1.synchronize()
        if r:
            rates.append(per_step * EXPERT_BYTES * steps / (e0.elapsed_time(e1) * 1e-3) / 1e9)
    st = cache.stats
    return dict(GBps=statistics.median(rates), runs_GBps=rates, bytes_ok=slots_hold(cache, plan, host, ids[steps]),
                inserts=st.inserts, inserts_expected=per_step * (1 + steps * (RUNS + 1)), misses=st.misses)


def guarded(fn, *args, **kwargs) -> dict:
    """fn's result, or {"error": ...} with the traceback printed: one failing case must not cost the others."""
    try:
        return fn(*args, **kwargs)
    except Exception as exc:  # noqa: BLE001 -- a one-shot device run reports every case it can
        traceback.print_exc()
        try:
            torch.cuda.synchronize()
        except Exception:  # noqa: BLE001 -- a sticky CUDA error: the remaining cases will report it
            pass
        return {"error": f"{type(exc).__name__}: {exc}"}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--json")
    args = ap.parse_args()
    rows = []
    for per_step, steps in ((1, 100), (205, 12)):
        nbytes = per_step * EXPERT_BYTES
        pinned = h2d_rate(nbytes)
        host = make_host(per_step * (steps + 1))  # distinct experts for every step of a run
        dev = guarded(insert_rate, host, per_step, steps, device_plan=True)
        old = guarded(insert_rate, host, per_step, steps, device_plan=False)
        gr = guarded(insert_rate_graph, host, per_step, steps)
        del host
        rows.append(dict(experts_per_step=per_step, bytes=nbytes, steps=steps, h2d_pinned_GBps=pinned,
                         insert_GBps=dev.get("GBps"), ratio=dev["GBps"] / pinned if "GBps" in dev else None,
                         insert_host_path_GBps=old.get("GBps"), insert_graph_GBps=gr.get("GBps"),
                         graph_ratio=gr["GBps"] / pinned if "GBps" in gr else None, graph=gr,
                         host_path_ratio=old["GBps"] / pinned if "GBps" in old else None,
                         device_path=dev, host_path=old))
        for name, r in (("device path", dev), ("host path", old)):
            if "error" in r:
                print(f"inserts of {per_step} per step, {name}: FAILED {r['error']}", flush=True)
                continue
            print(f"inserts of {per_step} x {EXPERT_BYTES / 2**20:.3f} MiB per step, {name}: {r['GBps']:.1f} GB/s "
                  f"vs pinned H2D of {nbytes / 2**20:.1f} MiB {pinned:.1f} GB/s: {100 * r['GBps'] / pinned:.0f}%  "
                  f"(runs {', '.join(f'{x:.1f}' for x in r['runs_GBps'])}; issue {r['issue_us_per_step']:.1f} us/step "
                  f"vs copy {nbytes / pinned / 1e3:.1f} us; syncs/step {r['syncs_per_step']:.1f}; bytes ok "
                  f"{r['bytes_ok']}; device_plan {r['device_plan']} {r['path_steps']}; inserts {r['inserts']}, "
                  f"misses {r['misses']}, evictions {r['evictions']})", flush=True)
        if "error" in gr:
            print(f"inserts of {per_step} per step, device path in a CUDA graph: FAILED {gr['error']}", flush=True)
        else:
            print(f"inserts of {per_step} x {EXPERT_BYTES / 2**20:.3f} MiB per step, device path in a CUDA graph: "
                  f"{gr['GBps']:.1f} GB/s vs pinned H2D {pinned:.1f} GB/s: {100 * gr['GBps'] / pinned:.0f}%  (runs "
                  f"{', '.join(f'{x:.1f}' for x in gr['runs_GBps'])}; bytes ok {gr['bytes_ok']}; inserts "
                  f"{gr['inserts']} of {gr['inserts_expected']} expected)", flush=True)
    big = h2d_rate(256 * 2**20)
    print(f"pinned H2D 256 MiB: {big:.1f} GB/s", flush=True)
    rows.append(dict(h2d_256MiB_GBps=big))
    for T, k, H in ((16, 8, 4096), (4096, 8, 4096)):
        y = torch.randn(T, k, H, device="cuda", dtype=torch.bfloat16)
        w = torch.rand(T, k, device="cuda")
        sh = torch.randn(T, H, device="cuda", dtype=torch.bfloat16)
        g = torch.randn(T, device="cuda")
        t = triton.testing.do_bench(lambda: moe_topk_sum(y, w, sh, g), warmup=25, rep=100, return_mode="median")
        eager = triton.testing.do_bench(
            lambda: (y.float() * w[..., None]).sum(1) + torch.sigmoid(g)[:, None] * sh.float(),
            warmup=25, rep=100, return_mode="median")
        nbytes = y.numel() * 2 + sh.numel() * 2 + T * H * 2
        print(f"moe_topk_sum T={T} k={k} H={H}: {t * 1e3:.1f} us ({nbytes / t / 1e6:.0f} GB/s); torch eager "
              f"{eager * 1e3:.1f} us", flush=True)
        rows.append(dict(T=T, k=k, H=H, topk_sum_us=t * 1e3, eager_us=eager * 1e3, GBps=nbytes / t / 1e6))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()

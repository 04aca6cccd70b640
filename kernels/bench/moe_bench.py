"""H200 benchmark: the expert cache's insert copy rate against pinned host-to-device bandwidth, and the fused
top-k sum.

Insert rate: a step whose routed experts are all misses (under the insert threshold), timed end to end
(prepare(): bookkeeping, the copies, the slot map), bytes inserted / time. Floor: one pinned H2D copy of the
same total size (torch copy_, non_blocking) -- the link rate for that copy size. Expert size 1.245 MiB (the
seeds' Flash-Next expert per card); cases: one expert per step, and 205 experts (255 MiB) per step against a
256 MiB copy. Target: inserts >= 90% of the pinned rate for the same copy size.

Usage (device): python -m kernels.bench.moe_bench [--json OUT.json]
"""
from __future__ import annotations

import argparse
import json
import time

import torch
import triton.testing

from kernels.moe import ExpertCache, moe_topk_sum

EXPERT_BYTES = int(1.245 * 2**20)


def h2d_rate(nbytes: int, reps: int = 20) -> float:
    src = torch.empty(nbytes, dtype=torch.uint8).pin_memory()
    dst = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    dst.copy_(src, non_blocking=True)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(reps):
        dst.copy_(src, non_blocking=True)
    torch.cuda.synchronize()
    return nbytes * reps / (time.perf_counter() - t0) / 1e9


def insert_rate(per_step: int, steps: int = 12) -> tuple[float, dict]:
    E = per_step * (steps + 2)
    host = torch.empty(E, EXPERT_BYTES, dtype=torch.uint8)
    cache = ExpertCache([host], n_slots=per_step, max_tokens=per_step, top_k=1, device="cuda",
                        insert_thresh=1.0, stage_slots=1)
    ids = [torch.arange(s * per_step, (s + 1) * per_step, device="cuda").view(-1, 1) for s in range(steps + 1)]
    cache.prepare(ids[0])
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for s in range(1, steps + 1):
        cache.prepare(ids[s])
    torch.cuda.synchronize()
    dt = time.perf_counter() - t0
    st = cache.stats
    return per_step * EXPERT_BYTES * steps / dt / 1e9, dict(inserts=st.inserts, misses=st.misses)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--json")
    args = ap.parse_args()
    rows = []
    for per_step in (1, 205):
        nbytes = per_step * EXPERT_BYTES
        pinned = h2d_rate(nbytes)
        ins, st = insert_rate(per_step)
        rows.append(dict(experts_per_step=per_step, bytes=nbytes, h2d_pinned_GBps=pinned, insert_GBps=ins,
                         ratio=ins / pinned, **st))
        print(f"inserts of {per_step} x 1.245 MiB: {ins:.1f} GB/s vs pinned H2D of {nbytes / 2**20:.1f} MiB "
              f"{pinned:.1f} GB/s: {100 * ins / pinned:.0f}%  {st}", flush=True)
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

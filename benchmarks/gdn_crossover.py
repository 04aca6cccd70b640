"""The GDN prefill crossover: r9k's dispatch (gdn_seq) against fla's chunked core, called the way vLLM calls it.

Each row is one prefill step of N sequences of L tokens in one varlen call (T = N L), as vLLM's Qwen3-Next /
Qwen3.5 layer makes it: q, k bf16 already L2-normalised (``use_qk_l2norm_in_kernel=False``: the layer's
``fused_post_conv_prep`` normalises them), v bf16, g / beta fp32, the gathered initial states fp32
``[N, HV, V, K]``, cu_seqlens int32, and for fla the FLA chunk indices and offsets prepared ahead on the host
(``prepare_chunk_indices`` / ``prepare_chunk_offsets``, as vLLM's GDN metadata builder does).

* ``stock``: ``ChunkGatedDeltaRule.forward_native`` of vLLM's own CustomOp (fla's ``chunk_gated_delta_rule``);
* ``r9k``: the call through the dispatch (binding to vLLM's signature, the shape test, ``gdn_seq``);
* ``fused_rec``: fla's ``fused_recurrent_gated_delta_rule`` (vLLM's copy; what vLLM runs for decode), for the
  throughput comparison only.

Times (us): ``eager`` = calls back to back, host included (how vLLM runs the prefill core: outside CUDA
graphs); ``graph`` = CUDA-graph replay (the GPU's time). The table ends with the shapes where r9k wins in
eager mode, by sequence-heads N * HV and tokens a sequence: the rows of r9k/ops/gdn.py's CROSSOVER.

Usage (CUDA, vLLM's Python sources importable): python -m benchmarks.gdn_crossover [--heads 16:32,4:8] [--json F]
"""
from __future__ import annotations

import argparse
import json
import sys

import torch

from benchmarks._timing import eager_loop, graph_us

NS = (1, 2, 4, 8, 16, 32, 64)
LS = (16, 32, 64, 128, 256, 512)
MAX_T = 4096
K = V = 128


def inputs(N, L, H, HV, gen):
    from vllm.third_party.flash_linear_attention.ops.index import prepare_chunk_indices, prepare_chunk_offsets
    from vllm.third_party.flash_linear_attention.ops.utils import FLA_CHUNK_SIZE

    T = N * L
    dev = "cuda"
    q = torch.nn.functional.normalize(torch.randn(1, T, H, K, generator=gen, device=dev), dim=-1).bfloat16()
    k = torch.nn.functional.normalize(torch.randn(1, T, H, K, generator=gen, device=dev), dim=-1).bfloat16()
    v = torch.randn(1, T, HV, V, generator=gen, device=dev).bfloat16()
    g = -(torch.rand(1, T, HV, generator=gen, device=dev) * 0.5 + 0.01)
    beta = torch.rand(1, T, HV, generator=gen, device=dev)
    h0 = torch.randn(N, HV, V, K, generator=gen, device=dev) * 0.5
    cu_cpu = torch.arange(0, T + 1, L, dtype=torch.int32)
    cu = cu_cpu.to(dev)
    ci = prepare_chunk_indices(cu_cpu, FLA_CHUNK_SIZE).to(dev)
    co = prepare_chunk_offsets(cu_cpu, FLA_CHUNK_SIZE).to(dev)
    return dict(q=q, k=k, v=v, g=g, beta=beta, initial_state=h0, output_final_state=True, cu_seqlens=cu,
                chunk_indices=ci, chunk_offsets=co, use_qk_l2norm_in_kernel=False)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--heads", default="16:32,4:8", help="H:HV pairs (key heads : value heads of one rank)")
    ap.add_argument("--with-rec", action="store_true", help="also time fla's fused recurrent kernel")
    ap.add_argument("--json")
    args = ap.parse_args(argv)
    from tests.kernels.vllm_case import gdn_op
    from vllm.third_party.flash_linear_attention.ops import fused_recurrent_gated_delta_rule

    from r9k.ops import gdn as dispatch

    op, _ = gdn_op()
    import importlib

    qwen = importlib.import_module(dispatch.QWEN_MODULE)
    sig = dispatch.signatures(qwen)["qwen.core"]
    dispatch.STATE.max_tokens = 1 << 30
    dispatch.CROSSOVER = ((1 << 30, 1 << 30),)  # every shape to r9k here: the table is what decides the real one
    gen = torch.Generator(device="cuda")
    gen.manual_seed(0)
    res = []
    print(f"{'H:HV':>6} {'N':>4} {'L':>5} {'T':>5} | {'stock eager':>11} {'r9k eager':>9} {'rec eager':>9} | "
          f"{'stock graph':>11} {'r9k graph':>9} {'rec graph':>9} | {'r9k/stock eager':>15} | rel o", flush=True)
    for pair in args.heads.split(","):
        H, HV = (int(x) for x in pair.split(":"))
        for N in NS:
            for L in LS:
                if N * L > MAX_T:
                    continue
                a = inputs(N, L, H, HV, gen)
                h_s, h_r, h_f = (a["initial_state"].clone() for _ in range(3))
                kw_s = dict(a, initial_state=h_s)
                kw_r = dict(a, initial_state=h_r)

                def stock():
                    return op.forward_native(**kw_s)

                def r9k():
                    return dispatch._route_core(sig, (), kw_r)

                def rec():
                    return fused_recurrent_gated_delta_rule(q=a["q"], k=a["k"], v=a["v"], g=a["g"], beta=a["beta"],
                                                            initial_state=h_f, inplace_final_state=False,
                                                            cu_seqlens=a["cu_seqlens"],
                                                            use_qk_l2norm_in_kernel=False)
                try:
                    o_s, _ = op.forward_native(**dict(a, initial_state=a["initial_state"].clone()))
                    o_r, _ = dispatch.run_core(dict(a, initial_state=a["initial_state"].clone(), _n=N, _t=N * L,
                                                    _hv=HV))
                    rel = ((o_r.float() - o_s.float()).norm() / o_s.float().norm()).item()
                    row = dict(H=H, HV=HV, N=N, L=L, T=N * L, rel_o=rel)
                    for name, fn in (("stock", stock), ("r9k", r9k)) + ((("rec", rec),) if args.with_rec else ()):
                        try:
                            row[f"{name}_eager"] = eager_loop(fn)
                            row[f"{name}_graph"] = graph_us(fn, replays=8)
                        except Exception as e:  # keep the others
                            print(f"{name} N={N} L={L} failed: {type(e).__name__}: {str(e)[:200]}", file=sys.stderr)
                            row[f"{name}_eager"] = row[f"{name}_graph"] = float("nan")
                except Exception as e:  # keep the others
                    print(f"H:HV={H}:{HV} N={N} L={L} failed: {type(e).__name__}: {str(e)[:300]}", file=sys.stderr)
                    continue
                res.append(row)
                print(f"{H:>2}:{HV:<3} {N:>4} {L:>5} {N * L:>5} | {row['stock_eager']:11.1f} {row['r9k_eager']:9.1f} "
                      f"{row.get('rec_eager', float('nan')):9.1f} | {row['stock_graph']:11.1f} "
                      f"{row['r9k_graph']:9.1f} {row.get('rec_graph', float('nan')):9.1f} | "
                      f"{row['r9k_eager'] / row['stock_eager']:15.2f} | {rel:.1e}", flush=True)
                del a, kw_s, kw_r, h_s, h_r, h_f
    # the crossover: per value-head count, for each N the largest L at which r9k's eager time was below stock's
    # at that L and every smaller one
    print("\ncrossover (eager): the largest L (tokens a sequence) up to which r9k beat fla's chunked core at "
          "every measured L, per N")
    summary = {}
    for pair in args.heads.split(","):
        H, HV = (int(x) for x in pair.split(":"))
        for N in NS:
            rows = sorted((r for r in res if r["HV"] == HV and r["N"] == N), key=lambda r: r["L"])
            best = 0
            for r in rows:
                if r["r9k_eager"] < r["stock_eager"]:
                    best = r["L"]
                else:
                    break
            summary[f"{H}:{HV} N={N}"] = best
            print(f"  H:HV={H}:{HV} N={N:>3} (N*HV={N * HV:>5}): L <= {best}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(rows=res, crossover=summary), f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

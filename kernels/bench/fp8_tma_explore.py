"""Exploration behind kernels/fp8.py's TMA prefill kernel (session 5): a block-scaled fp8 GEMM with A, B and C
moved by tensor descriptors, timed on the H200 against torch._scaled_mm (per-tensor) and the repo's default,
at 4096^3 and 8192^3 (do_bench medians, us; TFLOP/s = 2 M N K / t). Variants, all bit-identical to the tile
kernel ("rel vs ours" 0):

* persist: one program per SM walking the output tiles (else one program per tile);
* mode 0: one K-block a turn; mode 1: block kb's scale-FMA after block kb+1's MMA is issued (its dot result
  carried across the turn); mode 2: two K-blocks a turn, both dots before either scale-FMA;
* ws: Triton's warp_specialize on the K loop; sat: the activation scales transposed to [K/128, M] on the host
  (inside the timed call) so that a K-block's scales are contiguous.

The three rounds are the three device runs of 2026-12-01 (results/2026-12-01_h200_fp8_tma_experiment_N.json;
rounds 1 and 2 ran earlier forms of this kernel without the later switches, the same code on their paths);
what kernels/fp8.py kept is ``persist`` with mode 0 / 2 at 128 x 128, 8 warps, 3 stages (kernel="tma", KPI).

Usage (CUDA): python -m kernels.bench.fp8_tma_explore --round 1|2|3 [--json OUT]
"""
from __future__ import annotations

import argparse
import json

import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

import kernels.fp8 as F

@triton.jit
def _tma_kernel(a_desc, b_desc, c_desc, sa, sb, M, N, K, ssam, ssak, ssbn,
                BM: tl.constexpr, BN: tl.constexpr, GROUP_M: tl.constexpr, NUM_SMS: tl.constexpr,
                PERSIST: tl.constexpr, HALF: tl.constexpr, MODE: tl.constexpr, WS: tl.constexpr):
    num_m = tl.cdiv(M, BM)
    num_n = tl.cdiv(N, BN)
    tiles = num_m * num_n
    kbs = K // 128
    if PERSIST:
        step = NUM_SMS
    else:
        step = tiles
    for tile in tl.range(tl.program_id(0), tiles, step, flatten=True):
        pid_m, pid_n = F._swizzle_tile(tile, num_m, num_n, GROUP_M)
        om = pid_m * BM
        on = pid_n * BN
        offs_m = om + tl.arange(0, BM)
        mm = offs_m < M
        if BN <= 128:
            sb_ptr = sb + (on // 128) * ssbn
        else:
            sb_ptr = sb + ((on + tl.arange(0, BN)) // 128) * ssbn
        acc = tl.zeros((BM, BN), dtype=tl.float32)
        if MODE == 0:
            for kb in tl.range(kbs, warp_specialize=WS):
                a = a_desc.load([om, kb * 128])
                b = b_desc.load([on, kb * 128])
                s_a = tl.load(sa + offs_m * ssam + kb * ssak, mask=mm, other=0.0)
                s_b = tl.load(sb_ptr + kb)
                acc += tl.dot(a, b.T) * ((s_a * HALF)[:, None] * s_b)
        elif MODE == 1:
            # the scale-FMA of block kb-1 after block kb's MMA is issued
            a = a_desc.load([om, 0])
            b = b_desc.load([on, 0])
            d_p = tl.dot(a, b.T)
            sc_p = tl.load(sa + offs_m * ssam, mask=mm, other=0.0) * HALF * tl.load(sb_ptr)
            for kb in range(1, kbs):
                a = a_desc.load([om, kb * 128])
                b = b_desc.load([on, kb * 128])
                d = tl.dot(a, b.T)
                acc += d_p * sc_p[:, None]
                d_p = d
                sc_p = tl.load(sa + offs_m * ssam + kb * ssak, mask=mm, other=0.0) * HALF * tl.load(sb_ptr + kb)
            acc += d_p * sc_p[:, None]
        else:
            for kb in range(0, kbs, 2):
                a0 = a_desc.load([om, kb * 128])
                b0 = b_desc.load([on, kb * 128])
                a1 = a_desc.load([om, kb * 128 + 128])
                b1 = b_desc.load([on, kb * 128 + 128])
                s0 = tl.load(sa + offs_m * ssam + kb * ssak, mask=mm, other=0.0) * HALF * tl.load(sb_ptr + kb)
                s1 = tl.load(sa + offs_m * ssam + (kb + 1) * ssak, mask=mm, other=0.0) * HALF * tl.load(sb_ptr + kb + 1)
                d0 = tl.dot(a0, b0.T)
                d1 = tl.dot(a1, b1.T)
                acc += d0 * s0[:, None]
                acc += d1 * s1[:, None]
        c_desc.store([om, on], acc.to(tl.bfloat16))


def tma_gemm(qa, sa, qb, sb, BM=128, BN=128, GROUP_M=8, num_warps=8, num_stages=3, persist=False, mode=0,
             ws=False, sat=False):
    """[M, N] bf16 = (qa [M, K] e4m3fn, sa [M, K/128]) @ (qb [N, K] e4m3fn, sb [N/128, K/128])^T by _tma_kernel
    with the variant's switches (module docstring). Modes 1 and 2 take one weight scale per tile (BN <= 128):
    round 2's BN=256 mode-1 config fails to compile, kept as it ran."""
    M, K = qa.shape
    N = qb.shape[0]
    c = torch.empty(M, N, dtype=torch.bfloat16, device=qa.device)
    a_d = TensorDescriptor.from_tensor(qa, [BM, 128])
    b_d = TensorDescriptor.from_tensor(qb, [BN, 128])
    c_d = TensorDescriptor.from_tensor(c, [BM, BN])
    nsm = torch.cuda.get_device_properties(qa.device).multi_processor_count
    tiles = triton.cdiv(M, BM) * triton.cdiv(N, BN)
    grid = (min(nsm, tiles),) if persist else (tiles,)
    sa_arg = sa.t().contiguous().t() if sat else sa
    _tma_kernel[grid](a_d, b_d, c_d, sa_arg, sb, M, N, K, sa_arg.stride(0), sa_arg.stride(1), sb.stride(0), BM=BM,
                      BN=BN, GROUP_M=GROUP_M, NUM_SMS=nsm, PERSIST=persist, HALF=1.0, MODE=mode, WS=ws,
                      num_warps=num_warps, num_stages=num_stages)
    return c


ROUNDS = {
    1: dict(checks=[dict(), dict(persist=True), dict(BN=256), dict(BM=64, BN=128, num_warps=4)],
            configs=[dict(BM=128, BN=128, num_warps=8, num_stages=3), dict(BM=128, BN=128, num_warps=8, num_stages=4),
                     dict(BM=128, BN=128, num_warps=8, num_stages=3, persist=True),
                     dict(BM=128, BN=128, num_warps=8, num_stages=4, persist=True),
                     dict(BM=128, BN=256, num_warps=8, num_stages=3),
                     dict(BM=128, BN=256, num_warps=8, num_stages=3, persist=True),
                     dict(BM=64, BN=256, num_warps=4, num_stages=4), dict(BM=128, BN=128, num_warps=4, num_stages=4),
                     dict(BM=256, BN=128, num_warps=8, num_stages=3)]),
    2: dict(checks=[dict(), dict(persist=True, mode=1), dict(mode=2), dict(mode=0, ws=True)],
            configs=[dict(persist=True), dict(persist=True, mode=1), dict(persist=True, mode=2),
                     dict(persist=True, ws=True), dict(mode=1), dict(mode=2),
                     dict(persist=True, mode=1, num_stages=4), dict(persist=True, mode=2, num_stages=2),
                     dict(persist=True, GROUP_M=16), dict(BM=128, BN=256, persist=True, mode=1),
                     dict(BM=256, BN=128, persist=True, mode=1)]),
    3: dict(checks=[dict(sat=True), dict(persist=True, mode=1, num_stages=2, sat=True),
                    dict(sat=True, BM=64, BN=256, num_warps=8)],
            configs=[dict(persist=True, mode=2), dict(persist=True, mode=2, sat=True), dict(persist=True, sat=True),
                     dict(persist=True, mode=1, num_stages=2),
                     dict(BM=64, BN=128, num_warps=4, num_stages=4, persist=True),
                     dict(BM=64, BN=128, num_warps=4, num_stages=4, persist=True, mode=2),
                     dict(BM=64, BN=128, num_warps=4, num_stages=3, sat=True),
                     dict(BM=64, BN=128, num_warps=4, num_stages=4, persist=True, sat=True),
                     dict(BM=64, BN=256, num_warps=8, num_stages=3, persist=True),
                     dict(BM=64, BN=256, num_warps=8, num_stages=4, persist=True, sat=True)]),
}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0].replace("\n", " "))
    ap.add_argument("--round", type=int, choices=sorted(ROUNDS), required=True,
                    help="which device run of 2026-12-01 to repeat (its list of variants, ROUNDS)")
    ap.add_argument("--json", help="write the times (us) here")
    args = ap.parse_args(argv)
    rnd = ROUNDS[args.round]
    torch.manual_seed(0)
    dev = "cuda"
    M, N, K = 300, 384, 512  # correctness on an odd shape against the float64 reference
    x = torch.randn(M, K, device=dev)
    w = torch.randn(N, K, device=dev)
    qa, sa = F.fp8_quant_group(x)
    qb, sb = F.fp8_quant_block_weight_ref(w)
    ref = F.fp8_block_gemm_ref(qa, sa, qb, sb, torch.float64)
    for cfg in rnd["checks"]:
        try:
            out = tma_gemm(qa, sa, qb, sb, **cfg)
            print("check", cfg, ((out.double() - ref).norm() / ref.norm()).item(), flush=True)
        except Exception as e:  # a config that does not compile (shared memory): report, go on
            print("check", cfg, "FAILED", type(e).__name__, str(e)[:300], flush=True)
    res = {}
    for n in (4096, 8192):
        M = N = K = n
        x = torch.randn(M, K, device=dev)
        w = torch.randn(N, K, device=dev)
        qa, sa = F.fp8_quant_group(x)
        qb, sb = F.fp8_quant_block_weight_ref(w)
        ref = F.fp8_block_gemm(qa, sa, qb, sb).float()
        xa, wt = x.to(torch.float8_e4m3fn), w.to(torch.float8_e4m3fn)
        one = torch.ones((), device=dev)

        def tf(us, M=M, N=N, K=K):
            return 2 * M * N * K / us / 1e6

        def bench(fn):
            return triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median") * 1e3

        t_mm = bench(lambda: torch._scaled_mm(xa, wt.t(), scale_a=one, scale_b=one, out_dtype=torch.bfloat16))
        t_ours = bench(lambda: F.fp8_block_gemm(qa, sa, qb, sb))
        print(f"{n}: _scaled_mm {t_mm:.1f} us {tf(t_mm):.0f} TF; ours default {t_ours:.1f} us {tf(t_ours):.0f} TF "
              f"({t_mm / t_ours:.2f})", flush=True)
        res[n] = {"scaled_mm": t_mm, "default": t_ours}
        for cfg in rnd["configs"]:
            name = "_".join(f"{k}{v}" for k, v in cfg.items())
            try:
                out = tma_gemm(qa, sa, qb, sb, **cfg)
                err = ((out.float() - ref).norm() / ref.norm()).item()
                t = bench(lambda cfg=cfg: tma_gemm(qa, sa, qb, sb, **cfg))
                print(f"{n}: {name:50} {t:8.1f} us {tf(t):6.0f} TF  vs mm {t_mm / t:.2f}  rel vs ours {err:.1e}",
                      flush=True)
                res[n][name] = t
            except Exception as e:
                print(f"{n}: {name} FAILED {type(e).__name__}: {str(e)[:200]}", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Fingerprints of the fp8 kernels' machine code: each kernel compiled offline for sm_90 (no GPU; Triton's own
ptxas and nvdisasm), its SASS instructions hashed (addresses and encodings dropped). A refactor that leaves
every fingerprint unchanged leaves the kernels as they were, instruction for instruction: the check behind
session 6's clean-up commits (kernels/NOTES_II.md). Kernels: the tile kernel (three configs), the TMA kernel
and fp8_tma_explore's (two each), the Gluon prefill kernels (WS=0 MODE 0 / 1 / 2, WS=1 MODE 0 / 2, WS=2) and
the two decode kernels.

The H200 machines run Triton 3.6: ``PYTHONPATH=<a triton 3.6 install> python -m kernels.bench.fp8_sass_hash``
(these kernels need Triton 3.5-3.8: kernels.fp8.wgmma.GLUON_TRITON).
"""
from __future__ import annotations

import hashlib
import inspect
import os
import re
import subprocess
import tempfile

import triton
from triton.backends.compiler import GPUTarget
from triton.experimental.gluon import language as gl
from triton.experimental.gluon._runtime import GluonASTSource

import kernels.bench.fp8_tma_explore as E
import kernels.fp8 as F
import kernels.fp8.wgmma as W

BINDIR = os.path.join(os.path.dirname(triton.__file__), "backends/nvidia/bin")
TARGET = GPUTarget("cuda", 90, 32)


def gdesc(dt: str, blk: list[int]) -> str:
    """A Gluon tensor-descriptor argument type (dtype fp8e4nv or bf16, block shape) with its default layout."""
    lay = gl.NVMMASharedLayout.get_default_for(blk, {"fp8e4nv": gl.float8e4nv, "bf16": gl.bfloat16}[dt])
    return f"tensordesc<{dt}[{blk[0]}, {blk[1]}],{lay!r}>"


def tdesc(dt: str, blk: list[int]) -> str:
    """A Triton tensor-descriptor argument type."""
    return f"tensordesc<{dt}[{blk[0]}, {blk[1]}]>"


def fingerprint(fn, sig: dict, cons: dict, num_warps: int, gluon: bool = False, **opt) -> tuple[str, int]:
    """(sha1 prefix of the instruction text, instruction count) of ``fn`` compiled for sm_90: ``sig`` the
    argument types by name (others i32, or constexpr where ``cons`` gives them), ``opt`` compile options."""
    names = list(inspect.signature(fn.fn).parameters)
    sig = {n: sig.get(n, "constexpr" if n in cons else "i32") for n in names}
    cons = {k: v for k, v in cons.items() if k in names}
    src = (GluonASTSource if gluon else triton.compiler.ASTSource)(fn, sig, cons, {})
    cubin = triton.compile(src, target=TARGET, options={"num_warps": num_warps, **opt}).asm["cubin"]
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        text = subprocess.run([os.path.join(BINDIR, "nvdisasm"), "-c", f.name], capture_output=True, text=True,
                              check=True).stdout
    ins = [re.sub(r"/\*[0-9a-f]+\*/", "", m.group(1)).strip()
           for m in re.finditer(r"^\s+/\*[0-9a-f]{4,}\*/\s+(.*?;)", text, re.M)]
    return hashlib.sha1("\n".join(ins).encode()).hexdigest()[:12], len(ins)


def main() -> int:
    out = {}
    ptr = dict(a="*u8", sa="*fp32", b="*u8", sb="*fp32", c="*bf16", qa_out="*u8", sa_out="*fp32")
    for cfg, nw, quant in [(dict(BM=128, BN=128, GROUP_M=8, KPI=2), 8, False),
                           (dict(BM=16, BN=32, GROUP_M=1, KPI=2), 4, False),
                           (dict(BM=64, BN=256, GROUP_M=8, KPI=1), 8, True)]:
        cons = dict(cfg, QUANT_A=quant, STORE_A=False, FMAX=448.0, A_FNUZ=False, HALF=1.0, RNE_FIX=False,
                    FAST_DIV=True)
        out[f"tile {cfg}"] = fingerprint(F._block_gemm_kernel, dict(ptr, a="*bf16" if quant else "*u8"), cons,
                                         nw, num_stages=3)
    for BM, BN, nw, kpi in [(128, 128, 8, 2), (64, 128, 4, 1)]:
        sig = dict(a_desc=tdesc("fp8e4nv", [BM, 128]), b_desc=tdesc("fp8e4nv", [BN, 128]),
                   c_desc=tdesc("bf16", [BM, BN]), sa="*fp32", sb="*fp32")
        out[f"tma {BM}x{BN} kpi{kpi}"] = fingerprint(F._block_gemm_tma_kernel, sig,
                                                     dict(BM=BM, BN=BN, GROUP_M=8, KPI=kpi, HALF=1.0), nw,
                                                     num_stages=3)
        out[f"explore {BM}x{BN}"] = fingerprint(E._tma_kernel, sig, dict(BM=BM, BN=BN, GROUP_M=8, NUM_SMS=132,
                                                                          PERSIST=True, HALF=1.0, MODE=2,
                                                                          WS=False), nw, num_stages=3)
    g = dict(a_desc=gdesc("fp8e4nv", [128, 128]), b_desc=gdesc("fp8e4nv", [128, 128]),
             c_desc=gdesc("bf16", [128, 128]), sa="*fp32", sb="*fp32")
    for mode in (0, 1, 2):
        out[f"ws0 mode{mode}"] = fingerprint(W._block_gemm_wgmma_kernel, g, dict(HALF=1.0, GROUP_M=8, STAGES=4,
                                                                                 MODE=mode, num_warps=8), 8,
                                             gluon=True)
    for mode in (0, 2):
        out[f"ws1 mode{mode}"] = fingerprint(W._block_gemm_ws_kernel, g, dict(HALF=1.0, GROUP_M=8, STAGES=4,
                                                                              MODE=mode, num_warps=8), 8,
                                             gluon=True, maxnreg=168)
    out["ws2"] = fingerprint(W._block_gemm_ws2_kernel, dict(g, c_desc=gdesc("bf16", [64, 128])),
                             dict(HALF=1.0, GROUP_M=8, STAGES=4, CONSUMER_REGS=232, num_warps=4), 4, gluon=True,
                             maxnreg=168)
    dec = dict(w_desc=gdesc("fp8e4nv", [64, 128]), a_desc=gdesc("fp8e4nv", [16, 128]), sa="*fp32", sb="*fp32",
               c="*bf16", ws="*fp32", lock="*i32")
    out["small_m"] = fingerprint(W._small_m_wgmma_kernel, dec, dict(HALF=1.0, KBP=8, STAGES=4, ROTATE=False,
                                                                    UNROLL=1, num_warps=4), 4, gluon=True)
    rows = dict(w_desc=gdesc("fp8e4nv", [32, 128]), a_desc=gdesc("fp8e4nv", [64, 128]), sa="*fp32",
                sb="*fp32", c="*bf16")
    out["rows"] = fingerprint(W._rows_wgmma_kernel, rows, dict(HALF=1.0, KBP=32, STAGES=8, UNROLL=1), 4,
                       gluon=True)
    print(f"Triton {triton.__version__}, sm_90: sha1 of the SASS instructions, instruction count")
    for name, (digest, n) in out.items():
        print(f"{name:50} {digest} {n:6d}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

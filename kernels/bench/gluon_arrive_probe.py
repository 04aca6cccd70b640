"""What Gluon makes of ``mbarrier.arrive`` in an 8-warp partition of a warp-specialised kernel, compiled offline
for sm_90 (no GPU needed): the PTX shows a barrier over the partition's 256 threads, then one thread's arrive.
This is why kernels/fp8_wgmma.py's WS=1 consumers, one partition, are held in step at every stage release, and
why WS=2 gives each consumer warpgroup its own partition (kernels/NOTES_II.md, "fp8 GEMM, session 6").

Usage: python -m kernels.bench.gluon_arrive_probe   (needs a Triton with Gluon, >= 3.5)
"""
from __future__ import annotations

import re

import triton
from triton.backends.compiler import GPUTarget
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon._runtime import GluonASTSource
from triton.experimental.gluon.language.nvidia.hopper import mbarrier


@gluon.jit
def _default(bars, x):
    mbarrier.arrive(bars.index(0), count=1)
    gl.store(x + gl.arange(0, 256, layout=gl.BlockedLayout([1], [32], [8], [0])), 1.0)


@gluon.jit
def _worker(bars, x):
    mbarrier.wait(bars.index(0), 0)


@gluon.jit
def _probe_kernel(x, num_warps: gl.constexpr):
    bars = gl.allocate_shared_memory(gl.int64, [1, 1], mbarrier.MBarrierLayout())
    mbarrier.init(bars.index(0), count=1)
    gl.warp_specialize([(_default, (bars, x)), (_worker, (bars, x))], [1], [24])


def main() -> int:
    src = GluonASTSource(_probe_kernel, {"x": "*fp32", "num_warps": "constexpr"}, {"num_warps": 8}, {})
    ptx = triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": 8}).asm["ptx"]
    lines = [ln.strip() for ln in ptx.splitlines()]
    i = next(k for k, ln in enumerate(lines) if "mbarrier.arrive" in ln)
    print(f"Triton {triton.__version__}, sm_90 PTX before the default partition's mbarrier.arrive:")
    for ln in lines[max(0, i - 4):i + 1]:
        if ln and not ln.startswith("//") and not ln.startswith(".loc"):
            print("   ", ln)
    print("barriers in the kernel:", sorted(set(re.findall(r"bar\.sync\s+\d+, \d+|barrier\.sync\s+\d+", ptx))))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

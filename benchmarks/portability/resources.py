"""What a compiled kernel uses: registers, spills, LDS / shared memory, the matrix instructions, read from the
binary Triton built (no device needed).

* AMD (hsaco): the amdgcn text's AMDHSA metadata: ``.vgpr_count`` (on gfx90a / gfx942 the unified count, AGPRs
  included), ``.vgpr_spill_count`` (VGPRs spilled to scratch memory), ``.sgpr_spill_count`` (SGPRs spilled,
  written to VGPR lanes, not to memory), ``.private_segment_fixed_size`` (scratch bytes a lane),
  ``.group_segment_fixed_size`` (static LDS) plus Triton's dynamic LDS (``metadata.shared``); matrix
  instructions: every ``v_wmma_*`` / ``v_mfma_*`` / ``v_swmmac_*`` mnemonic.
* NVIDIA (cubin): Triton calls ptxas itself but keeps no log, so the PTX is assembled again by the ptxas of
  Triton's wheel with the same flags and ``-v``: "Used N registers", "N bytes spill stores", the stack frame,
  static shared memory (plus ``metadata.shared``); matrix instructions: every ``wgmma.mma_async`` /
  ``mma.sync`` variant in the PTX.
"""
from __future__ import annotations

import os
import re
import subprocess
import tempfile
from dataclasses import dataclass


@dataclass(frozen=True)
class Usage:
    """One compiled kernel's resources. ``spills``: VGPRs spilled to scratch (AMD) / bytes of spill stores
    (NVIDIA), what the gate fails on; ``sgpr_spills``: AMD only (None elsewhere); ``lds``: bytes of shared
    memory a workgroup, dynamic and static; ``scratch``: bytes of private memory a lane (AMD) / the stack frame
    (NVIDIA); ``mma``: the matrix instructions, sorted."""

    regs: int
    spills: int
    sgpr_spills: int | None
    lds: int
    scratch: int
    mma: tuple[str, ...]


def _amd_field(text: str, key: str) -> int:
    m = re.search(rf"^\s+\.{key}:\s+(\d+)", text, re.M)
    if m is None:
        raise ValueError(f"amdgcn metadata has no .{key}")
    return int(m.group(1))


def amd_usage(ck) -> Usage:
    """:class:`Usage` of a CompiledKernel built for a ``hip`` target. Raises ValueError when its amdgcn lacks
    the AMDHSA fields."""
    a = ck.asm["amdgcn"]
    mma = sorted(set(re.findall(r"\b(v_(?:wmma|mfma|swmmac)_\w+)", a)))
    return Usage(regs=_amd_field(a, "vgpr_count"), spills=_amd_field(a, "vgpr_spill_count"),
                 sgpr_spills=_amd_field(a, "sgpr_spill_count"),
                 lds=int(ck.metadata.shared) + _amd_field(a, "group_segment_fixed_size"),
                 scratch=_amd_field(a, "private_segment_fixed_size"), mma=tuple(mma))


def _ptxas_cmd(ck, src: str, out: str) -> list[str]:
    from triton.backends.nvidia.compiler import get_ptxas, sm_arch_from_capability

    md = ck.metadata
    arch = int(md.target.arch)
    cmd = [get_ptxas(arch).path, "-lineinfo"]
    if not md.enable_fp_fusion:
        cmd.append("--fmad=false")
    cmd += ["-v", "--regAllocOptLevel=2"]
    if getattr(md, "ptx_options", None):
        cmd += md.ptx_options.split(" ")
    return cmd + [f"--gpu-name={sm_arch_from_capability(arch)}", src, "-o", out]


def ptxas_version() -> str:
    """The ptxas of Triton's wheel that :func:`cuda_usage` runs (its --version's last line)."""
    from triton.backends.nvidia.compiler import get_ptxas

    p = get_ptxas(90)
    return f"{os.path.basename(p.path)} {p.version}"


def cuda_usage(ck) -> Usage:
    """:class:`Usage` of a CompiledKernel built for a ``cuda`` target (ptxas -v on its PTX, see the module doc).
    Raises RuntimeError when ptxas fails or prints no register count."""
    ptx = ck.asm["ptx"]
    with tempfile.TemporaryDirectory() as d:
        src, out = os.path.join(d, "k.ptx"), os.path.join(d, "k.cubin")
        with open(src, "w") as f:
            f.write(ptx)
        r = subprocess.run(_ptxas_cmd(ck, src, out), capture_output=True, text=True, timeout=300)
    log = r.stderr + r.stdout
    regs = re.search(r"Used (\d+) registers", log)
    if r.returncode or regs is None:
        raise RuntimeError(f"ptxas -v on {ck.name}: exit {r.returncode}: {log[-2000:]}")
    spill = re.search(r"(\d+) bytes spill stores", log)
    stack = re.search(r"(\d+) bytes stack frame", log)
    smem = re.search(r"(\d+) bytes smem", log)
    mma = set()
    for m in re.findall(r"\b((?:wgmma\.mma_async|mma\.sync)(?:\.[\w]+)+)", ptx):
        mma.add(m.replace(".sync.aligned", "").replace(".aligned", ""))
    return Usage(regs=int(regs.group(1)), spills=int(spill.group(1)) if spill else 0, sgpr_spills=None,
                 lds=int(ck.metadata.shared) + (int(smem.group(1)) if smem else 0),
                 scratch=int(stack.group(1)) if stack else 0, mma=tuple(sorted(mma)))


def usage(ck) -> Usage:
    """:class:`Usage` of a CompiledKernel, by its target's backend. Raises ValueError for another backend."""
    backend = ck.metadata.target.backend
    if backend == "hip":
        return amd_usage(ck)
    if backend == "cuda":
        return cuda_usage(ck)
    raise ValueError(f"no resource reader for backend {backend!r}")

"""Offline look at gdn_seq's machine code: the token loop's instructions per token, compiled for sm_90.

Compiles the kernels for sm_90 (no GPU needed: Triton's own ptxas and nvdisasm) with the runtime's divisibility
specialisation, finds the token loop (the longest backward branch in the SASS) and prints its instructions per
token: all, shuffles (SHFL: the K-reductions' lane exchanges), FFMA/FADD/FMUL, shared-memory traffic (layout
conversions) and barriers; for the chunked kernel, per token = per chunk / C. Also the whole kernel's register
spills (LDL/STL). *: the scaled-state kernel's loop holds every body of a group (U steps on the scaled state, the
plain step it falls back to, one token a trip, and the fold of c), so its count is all of them; ``--hot``
compiles it with the fallback and the fold cut out (HOT_CUTS; a copy of the source, for counting only) to count
the path that runs.

Shape: H=16, HV=32, K=V=128, bf16 q/k/v/o, fp32 g/beta/state, fixed-length batch (as kernels/bench/gdn_bench.py).

Counts depend on the Triton version: the H200 machines run 3.6 (session 4's and 5's figures in kernels/NOTES.md
are from 3.6: ``PYTHONPATH=<a triton 3.6 install> python -m kernels.bench.gdn_sass --hot``); this repo's venv has
3.9.

Usage: python -m kernels.bench.gdn_sass [--l2norm] [--hot] [--ops]
"""
from __future__ import annotations

import argparse
import atexit
import inspect
import os
import re
import shutil
import subprocess
import tempfile

import triton
from triton.backends.compiler import GPUTarget

from kernels.gdn import _gdn_seq_chunk_kernel, _gdn_seq_kc_kernel, _gdn_seq_kernel

PTR = {"q": "*bf16", "k": "*bf16", "v": "*bf16", "g": "*fp32", "beta": "*fp32", "o": "*bf16", "state": "*fp32",
       "state_idx": "*i32", "has_init": "*i32", "cu_seqlens": "*i32"}
# the [KC, BV, K/KC] kernel as gdn_seq launches it on an NVIDIA GPU at this shape: q, k converted by inline PTX,
# 32-bit row offsets in the token loop (gdn._row_offsets_64); KC_SESSION4: session 4's form (Triton's conversion,
# 64-bit offsets, q and k still converted as prefetched), for comparison
KC_RUN = dict(PTX=True, OFF64=False)
KC_SESSION4 = dict(PTX=False, OFF64=True)
CONFIGS = [  # (name, kernel, constexprs, num_warps)
    ("[BV, K] bv4 u4", _gdn_seq_kernel, dict(BV=4, U=4, LOOKAHEAD=False), 1),
    ("[BV, K] bv4 u4 lookahead", _gdn_seq_kernel, dict(BV=4, U=4, LOOKAHEAD=True), 1),
    ("[KC, BV, K/KC] bv4 u4 kc4 plain", _gdn_seq_kc_kernel, dict(BV=4, U=4, KC=4, DEFER=False, UP=4, **KC_RUN), 1),
    ("[KC, BV, K/KC] bv8 u2 kc4 w2 plain (default)", _gdn_seq_kc_kernel,
     dict(BV=8, U=2, KC=4, DEFER=False, UP=2, **KC_RUN), 2),
    ("[KC, BV, K/KC] bv16 u4 kc4 w4 plain", _gdn_seq_kc_kernel,
     dict(BV=16, U=4, KC=4, DEFER=False, UP=4, **KC_RUN), 4),
    ("[KC, BV, K/KC] bv16 u4 kc4 w4 scaled*", _gdn_seq_kc_kernel,
     dict(BV=16, U=4, KC=4, DEFER=True, UP=4, **KC_RUN), 4),
    ("chunked c16 bv16 w4", _gdn_seq_chunk_kernel,
     dict(BV=16, C=16, LOG2C=4, PREC="ieee", PREFETCH=False, NS=2), 4),
    ("chunked c16 bv16 w8", _gdn_seq_chunk_kernel,
     dict(BV=16, C=16, LOG2C=4, PREC="ieee", PREFETCH=False, NS=2), 8),
]


def sass(fn, cons: dict, num_warps: int) -> tuple[str, int]:
    """(nvdisasm text, registers a thread) of ``fn`` compiled for sm_90 with ``cons`` (the remaining constexprs
    filled in here; names the kernel does not take are dropped, so that the tool also runs on older trees)."""
    names = list(inspect.signature(fn.fn).parameters)
    cons = {k: v for k, v in cons.items() if k in names}
    sig = {n: PTR[n] if n in PTR else "constexpr" if n in cons else "fp32" if n == "scale" else "i32" for n in names}
    # what the JIT would see at run time: 16-byte aligned pointers, strides divisible by 16
    attrs = {(i,): [["tt.divisibility", 16]] for i, n in enumerate(names)
             if n in PTR or (n.startswith("s") and n not in ("scale", "state", "state_idx"))}
    c = triton.compile(triton.compiler.ASTSource(fn=fn, signature=sig, constexprs=cons, attrs=attrs),
                       target=GPUTarget("cuda", 90, 32), options={"num_warps": num_warps})
    bindir = os.path.join(os.path.dirname(triton.__file__), "backends/nvidia/bin")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(c.asm["cubin"])
        f.flush()
        text = subprocess.run([os.path.join(bindir, "nvdisasm"), "-c", f.name], capture_output=True, text=True,
                              check=True).stdout
        res = subprocess.run([os.path.join(bindir, "cuobjdump"), "--dump-resource-usage", f.name],
                             capture_output=True, text=True, check=True).stdout
    m = re.search(r"REG:(\d+)", res)
    return text, int(m.group(1)) if m else -1


def opcodes(body: list[str]) -> dict[str, int]:
    """Count of each opcode (the mnemonic before its first '.', predicates skipped) in SASS lines."""
    out: dict[str, int] = {}
    for line in body:
        m = re.match(r"\s*/\*[0-9a-f]+\*/\s+(?:@!?U?P\w+\s+)?([A-Z0-9_]+)", line)
        if m:
            out[m.group(1)] = out.get(m.group(1), 0) + 1
    return out


def loop_body(text: str) -> list[str]:
    """Instructions of the longest loop: from a label to the last backward branch to it."""
    labels, insts, best = {}, [], []
    for line in text.splitlines():
        m = re.match(r"^\s*\.(L_x_\d+):", line)
        if m:
            labels[m.group(1)] = len(insts)
        elif re.match(r"\s+/\*[0-9a-f]{4}\*/", line):
            insts.append(line)
            b = re.search(r"BRA\s+`?\(?\.?(L_x_\d+)", line)
            if b and b.group(1) in labels and len(insts) - labels[b.group(1)] > len(best):
                best = insts[labels[b.group(1)]:]
    return best


HOT_CUTS = [  # (line of kernels/gdn.py, its replacement, required): the branches a group inside its sequence takes
    ("                        if (c < 2.44140625e-4) | (c > 4096.0):\n", "                        if False:\n", True),
    ("                        if fast:\n", "                        if True:\n", True),
    # session 4's tree (9e63f49) only: its group body for a group wholly inside the sequence
    ("                            if t0 + U <= T:\n", "                            if True:\n", False),
]


def hot_kc_kernel():
    """_gdn_seq_kc_kernel as a group wholly inside its sequence runs it on the scaled state: kernels/gdn.py
    copied to a temporary module with HOT_CUTS applied (the rare fold of c, the plain-step fallback and the
    past-the-end group cut out; Triton drops the dead branches). For counting only.

    Raises:
        RuntimeError: a line of HOT_CUTS is not found exactly once in kernels/gdn.py."""
    import importlib.util
    import kernels.gdn as G
    src = open(G.__file__).read()
    for line, repl, required in HOT_CUTS:
        if not required and src.count(line) == 0:
            continue
        if src.count(line) != 1:
            raise RuntimeError(f"kernels/gdn.py: the line {line.strip()!r} (gdn_sass.HOT_CUTS) is not there once")
        src = src.replace(line, repl)
    d = tempfile.mkdtemp()
    atexit.register(shutil.rmtree, d, True)
    path = os.path.join(d, "gdn_hot.py")
    with open(path, "w") as f:
        f.write(src)
    spec = importlib.util.spec_from_file_location("gdn_hot", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod._gdn_seq_kc_kernel


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--l2norm", action="store_true", help="compile with the in-kernel L2 norm of q and k")
    ap.add_argument("--hot", action="store_true",
                    help="also count the scaled-state kernel's fast path alone (see the module docstring)")
    ap.add_argument("--ops", action="store_true", help="also print each loop's opcodes per token (top 14)")
    args = ap.parse_args(argv)
    configs = list(CONFIGS)
    if args.hot:
        hot = hot_kc_kernel()
        configs.append(("[KC, BV, K/KC] ... scaled, hot path", hot, dict(BV=16, U=4, KC=4, DEFER=True, UP=4,
                                                                        **KC_RUN), 4))
        configs.append(("... hot path, Triton's cvt, 64-bit offsets", hot, dict(BV=16, U=4, KC=4, DEFER=True, UP=4,
                                                                    **KC_SESSION4), 4))
    print(f"{'config':44} {'per token:':>10} {'all':>5} {'SHFL':>5} {'FFMA':>5} {'FADD':>5} {'FMUL':>5} "
          f"{'STS+LDS':>7} {'BAR':>5} {'REG':>4}  spills (LDL/STL, whole kernel)")
    for name, fn, cons, nw in configs:
        full = dict(H=16, HV=32, K=128, V=128, BK=128, L2NORM=args.l2norm, HAS_INIT=False, IS_VARLEN=False,
                    RNE_FIX=False, **cons)
        text, regs = sass(fn, full, nw)
        lines = loop_body(text)
        body = "\n".join(lines)
        per_loop = cons.get("U") or cons["C"]  # tokens per trip of the loop: a prefetch group, or a chunk
        n = len(body.splitlines()) / per_loop
        per = {op: body.count(op) / per_loop for op in ("SHFL", "FFMA", "FADD", "FMUL", "STS", "LDS", "BAR")}
        print(f"{name:44} {'':>10} {n:5.0f} {per['SHFL']:5.0f} {per['FFMA']:5.0f} {per['FADD']:5.0f} "
              f"{per['FMUL']:5.0f} {per['STS'] + per['LDS']:7.0f} {per['BAR']:5.1f} {regs:4d}  "
              f"{text.count('LDL')}/{text.count('STL')}")
        if args.ops:
            top = sorted(opcodes(lines).items(), key=lambda kv: -kv[1])[:14]
            print(" " * 46 + "  ".join(f"{op} {k / per_loop:.1f}" for op, k in top))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

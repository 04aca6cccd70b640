"""The compile gate for the seeds' cards (benchmarks/portability/): every kernel the dispatch can launch, at the
serving systems' shapes (benchmarks/shapes.py), compiled for hip:gfx1201 (wave32), hip:gfx942 (wave64) and
cuda:90 through a stand-in driver, and judged on its registers, spills and LDS.

The compile runs once, in a subprocess of its own without TRITON_INTERPRET (this directory's conftest sets it for
the interpreter gates), under the marker ``portability``; its tests share one xdist group so that ``make test``
(``--dist loadgroup``) compiles once.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.portability import render

ROOT = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.portability, pytest.mark.xdist_group("portability")]

FAMILIES = {"_gdn_seq_kc_kernel", "_gdn_seq_kernel", "_gdn_conv_kernel", "_quant_group_kernel", "_block_gemm_kernel",
            "_plan_kernel", "_gather_copy_kernel", "_ptr_moe_kernel", "_topk_sum_kernel", "_oneshot_ar_kernel"}
PREFILL_GEMM = {"gfx1201": "_block_gemm_kernel", "gfx942": "_block_gemm_kernel", "cuda:90": "_block_gemm_tma_kernel"}
TARGETS = ("gfx1201", "gfx942", "cuda:90")


@pytest.fixture(scope="module")
def gate(tmp_path_factory) -> tuple[dict, int, str]:
    """(the gate's result, its exit status, its stderr) from one ``python -m benchmarks.portability`` run."""
    out = tmp_path_factory.mktemp("portability") / "gate.json"
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    p = subprocess.run([sys.executable, "-m", "benchmarks.portability", "--json", str(out), "--jobs", "2"],
                       cwd=ROOT, env=env, capture_output=True, text=True, timeout=840)
    if not out.exists():
        pytest.fail(f"the gate wrote no result (exit {p.returncode}):\n{p.stderr[-4000:]}")
    return json.loads(out.read_text()), p.returncode, p.stderr


@pytest.mark.timeout(900)
def test_every_dispatched_kernel_compiles_fits_and_does_not_spill(gate):
    result, rc, err = gate
    bad = render.failures(result)
    assert not bad, "\n".join(f"{r['target']} {r['kernel']} ({r['case']}): {r['verdict']}" for r in bad)
    assert rc == 0, err[-4000:]
    for t in TARGETS:
        rows = [r for r in result["rows"] if r["target"] == t]
        # every family compiled for every target (the H200's prefill GEMM: the TMA kernel)
        assert {r["kernel"].split()[0] for r in rows} == FAMILIES | {PREFILL_GEMM[t]}, t
        for r in rows:
            assert r["error"] == "", (t, r["case"], r["error"])
            assert r["usage"]["lds"] <= r["lds_limit"], (t, r["kernel"])
    # no spill on the seeds' card in any default configuration (nothing is accepted there)
    assert all(r["usage"]["spills"] == 0 for r in result["rows"] if r["target"] == "gfx1201")
    # each specialisation compiled once (Triton's key; a label can repeat: an int's divisibility by 16, a row
    # stride's among them, keys a specialisation too)
    specs = [(r["target"], r["spec"]) for r in result["rows"]]
    assert len(specs) == len(set(specs))


@pytest.mark.timeout(900)
def test_the_fp8_dot_is_native_on_gfx1201_and_upcast_on_gfx942(gate):
    result, _, _ = gate
    gemm = {t: {m for r in result["rows"] if r["target"] == t and r["kernel"].startswith("_block_gemm_kernel")
                for m in r["usage"]["mma"]} for t in TARGETS}
    assert gemm["gfx1201"] == {"v_wmma_f32_16x16x16_fp8_fp8"}
    assert gemm["gfx942"] and all(m.endswith("_f16") for m in gemm["gfx942"])  # e4m3fn has no MFMA on gfx942
    tma = {m for r in result["rows"] if r["target"] == "cuda:90" and r["kernel"].startswith("_block_gemm_tma_kernel")
           for m in r["usage"]["mma"]}  # the H200's prefill kernel (TMA), reached from CPU tensors by the target
    assert tma and all(m.startswith("wgmma.mma_async") and m.endswith(".e4m3.e4m3") for m in tma)


@pytest.mark.timeout(900)
def test_the_gate_fails_the_old_fp8_prefill_tile(gate):
    """128 x 128, 8 warps, 3 stages, KPI 2 (the M > 64 default before the table took the target) asks for
    128 KiB of LDS and spills on both AMD targets: the gate must say FAIL for both reasons."""
    result, _, _ = gate
    rows = {r["target"]: r for r in result["counterexample"]}
    assert set(rows) == {"gfx1201", "gfx942"}
    for t, r in rows.items():
        assert r["usage"]["lds"] == 131072 > r["lds_limit"] == 65536, t
        assert r["usage"]["spills"] > 0, t
        assert r["verdict"].startswith("FAIL: LDS 131072 B over the 65536 B"), r["verdict"]
        assert "VGPRs spilled" in r["verdict"], r["verdict"]
        assert r["error"].startswith("OutOfResources"), r["error"]  # Triton's own launch check refused it too


@pytest.mark.timeout(900)
def test_the_committed_table_is_current(gate):
    result, _, _ = gate
    doc = render.DOC.read_text()
    assert render.replace_table(doc, render.table(result)) == doc, \
        "docs/kernels/portability.md is not current: python -m benchmarks.portability --write"


def test_judge_fails_lds_and_spills_and_accepts_only_listed_configurations(monkeypatch):
    from benchmarks.portability import gate
    from benchmarks.portability.resources import Usage
    from benchmarks.portability.standin import DEVICE_BY_NAME

    assert gate.ACCEPTED == {}  # no default configuration spills anywhere
    gfx, h200 = DEVICE_BY_NAME["gfx1201"], DEVICE_BY_NAME["cuda:90"]
    ok = Usage(regs=100, spills=0, sgpr_spills=3, lds=65536, scratch=0, mma=())
    assert gate.judge(gfx, "k", ok, "") == "ok"  # at the limit, SGPR spills reported only
    over = Usage(regs=100, spills=0, sgpr_spills=0, lds=65537, scratch=0, mma=())
    assert gate.judge(gfx, "k", over, "") == "FAIL: LDS 65537 B over the 65536 B a workgroup has"
    spill = Usage(regs=256, spills=4, sgpr_spills=None, lds=1024, scratch=8, mma=())
    assert gate.judge(h200, "k w8 s3", spill, "") == "FAIL: 4 bytes spilled"
    monkeypatch.setitem(gate.ACCEPTED, ("cuda:90", "k w8 s3"), "a reason")
    assert gate.judge(h200, "k w8 s3", spill, "") == "accepted: a reason"
    assert gate.judge(h200, "k w8 s4", spill, "") == "FAIL: 4 bytes spilled"
    assert gate.judge(gfx, "k w8 s3", spill, "") == "FAIL: 4 VGPRs spilled"  # accepted on its target only
    big_spill = Usage(regs=256, spills=4, sgpr_spills=None, lds=1 << 20, scratch=8, mma=())
    assert gate.judge(h200, "k w8 s3", big_spill, "").startswith("FAIL: LDS")  # acceptance never covers LDS
    assert gate.judge(gfx, "-", None, "CompilationError: x") == "FAIL: CompilationError: x"


def test_a_call_that_raises_is_a_failing_row():
    """A compile error (here any exception of the call) is a FAIL row naming the call, whatever compiled."""
    from benchmarks.portability.cases import Case
    from benchmarks.portability.gate import run_target
    from benchmarks.portability.standin import DEVICE_BY_NAME

    def boom():
        raise ValueError("the kernel does not build\nsecond line")

    rows = run_target(DEVICE_BY_NAME["gfx1201"], [Case("a call", "fn-tp2", boom)])
    assert [(r.kernel, r.case, r.error, r.verdict) for r in rows] == [
        ("-", "a call", "ValueError: the kernel does not build", "FAIL: ValueError: the kernel does not build")]
    assert render.failures({"rows": [{"verdict": r.verdict} for r in rows]}) != []

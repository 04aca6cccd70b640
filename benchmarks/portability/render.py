"""The gate's table for docs/kernels/portability.md, made from a result of :func:`benchmarks.portability.gate.run`
alone (no Triton import: the currency test renders the result its subprocess wrote)."""
from __future__ import annotations

from pathlib import Path

DOC = Path(__file__).resolve().parents[2] / "docs" / "kernels" / "portability.md"
BEGIN = "<!-- portability-table: made by `python -m benchmarks.portability --write`; do not edit -->"
END = "<!-- portability-table end -->"


def failures(result: dict) -> list[dict]:
    """The rows of ``result`` the gate fails (the counterexample's are expected to fail and are not counted)."""
    return [r for r in result["rows"] if r["verdict"].startswith("FAIL")]


def _kib(b: int) -> str:
    return f"{b / 1024:.1f} KiB" if b >= 1024 else f"{b} B"


def _line(r: dict) -> str:
    u = r["usage"]
    if u is None:
        return f"| {r['target']} | - | {r['system']}: {r['case']} | - | - | - | - | - | {r['verdict']} |"
    spills = str(u["spills"]) if u["sgpr_spills"] is None else f"{u['spills']} / {u['sgpr_spills']}"
    mma = ", ".join(f"`{m}`" for m in u["mma"]) or "-"
    verdict = r["verdict"] if not r["verdict"].startswith("accepted") else "accepted (see ACCEPTED)"
    return (f"| {r['target']} | `{r['kernel']}` | {r['system']}: {r['case']} | {u['regs']} | {spills} | "
            f"{_kib(u['lds'])} of {_kib(r['lds_limit'])} | {u['scratch']} | {mma} | {verdict} |")


_HEAD = ("| target | kernel (tile constexprs, warps, stages) | first call (system: call) | registers | spills "
         "(AMD: VGPR / SGPR) | LDS a workgroup | scratch B | matrix instructions | verdict |\n"
         "|:--|:--|:--|--:|--:|--:|--:|:--|:--|")


def table(result: dict) -> str:
    """The markdown of ``result``: its Triton and ptxas, one row per compiled kernel (each specialisation once,
    in the order compiled), then the counterexample's rows."""
    out = [f"Triton {result['triton']} (NVIDIA: {result['ptxas']} of Triton's wheel, `ptxas -v`; AMD: the hsaco's "
           f"AMDHSA metadata). {len(result['rows'])} kernels; registers: VGPRs on AMD (gfx942: with AGPRs), "
           f"per thread on NVIDIA.", "", _HEAD]
    out += [_line(r) for r in result["rows"]]
    out += ["", "The prefill tile the fp8 GEMM defaulted to before the table took the target, compiled the same way "
                "(tests/kernels/test_portability.py checks the gate fails it):", "", _HEAD]
    out += [_line(r) for r in result["counterexample"]]
    return "\n".join(out)


def replace_table(doc: str, text: str) -> str:
    """``doc`` with the text between its BEGIN and END markers replaced by ``text``. Raises ValueError when the
    markers are missing."""
    i, j = doc.find(BEGIN), doc.find(END)
    if i < 0 or j < i:
        raise ValueError(f"{DOC} lacks the markers {BEGIN!r} ... {END!r}")
    return doc[: i + len(BEGIN)] + "\n" + text + "\n" + doc[j:]

"""The layering is a contract: pyproject.toml's [tool.importlinter] (each layer imports only from the layers below
it), no import cycle among the modules of r9k, kernels, validate and benchmarks, and no program kept in a string
in validate/ (a program is a module of its own: validate/sandbox holds those run with ``python -I -c``)."""
from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
PACKAGES = ("r9k", "kernels", "validate", "benchmarks")
# A string constant of this many lines or more that parses as Python holding a def, class or import is a program.
PROGRAM_LINES = 8


@pytest.mark.timeout(120)
def test_import_linter_contracts_are_kept():
    env = {**os.environ, "PYTHONPATH": str(REPO)}  # this checkout's packages, whatever is installed
    r = subprocess.run([sys.executable, "-c", "import sys; from importlinter.cli import lint_imports_command; "
                        "sys.exit(lint_imports_command())", "--no-cache"], cwd=REPO, env=env,
                       capture_output=True, text=True, timeout=100)
    assert r.returncode == 0, r.stdout[-6000:] + r.stderr[-2000:]
    assert "0 broken" in r.stdout


def _cycles(graph) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []
    for root in sorted(graph.modules):
        if root in index:
            continue
        work = [(root, iter(sorted(graph.find_modules_directly_imported_by(root))))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on.add(root)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(graph.find_modules_directly_imported_by(w)))))
                elif w in on:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    out.append(sorted(comp))
    return out


@pytest.mark.timeout(120)
def test_no_import_cycle_among_modules():
    """Every module, a package's __init__ included (the layers contract sees only siblings): function-level
    imports count."""
    grimp = pytest.importorskip("grimp")
    sys.path.insert(0, str(REPO))
    try:
        graph = grimp.build_graph(*PACKAGES, cache_dir=None)
    finally:
        sys.path.remove(str(REPO))
    assert not _cycles(graph)


def programs_in_strings(source: str, min_lines: int = PROGRAM_LINES) -> list[int]:
    """Line numbers of the string constants in ``source`` that are programs: ``min_lines`` lines or more that
    parse as Python with a def, class or import among them (prose and short snippets do not)."""
    hits = []
    for node in ast.walk(ast.parse(source)):
        if not (isinstance(node, ast.Constant) and isinstance(node.value, str)) or node.value.count("\n") < min_lines:
            continue
        try:
            body = ast.parse(node.value)
        except (SyntaxError, ValueError):
            continue
        if any(isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Import, ast.ImportFrom))
               for n in ast.walk(body)):
            hits.append(node.lineno)
    return hits


def test_the_program_check_finds_a_program_and_passes_prose():
    program = "import os\n\n\ndef f(x):\n    return x\n\n\nclass A:\n    pass\n"
    assert programs_in_strings(f"_PROGRAM = {program!r}\n") == [1]
    assert programs_in_strings(f"_PROGRAM = {program!r} + 'x = 1'\n") == [1]
    prose = '"""A module.\n\nIt runs:\n\n    python -I -c <source>\n\nand then\nreads one line\nfrom each.\n"""\n'
    assert programs_in_strings(prose) == []
    assert programs_in_strings(f"short = {'import os' + chr(10) + 'def f(): pass'!r}\n") == []


@pytest.mark.timeout(60)
def test_no_module_of_validate_holds_a_program_in_a_string():
    found = {str(p.relative_to(REPO)): lines for p in sorted((REPO / "validate").rglob("*.py"))
             if (lines := programs_in_strings(p.read_text(encoding="utf-8")))}
    assert not found, f"programs kept in strings (make them modules, e.g. under validate/sandbox): {found}"

"""The import closure of a set of modules, read statically with ``ast`` from a source tree (nothing is imported).

What a module runs at import: its top-level statements, including the bodies of module-level ``if``, ``try``,
``with``, ``for`` and class bodies, but not function bodies (imported when called) nor ``if TYPE_CHECKING:``
blocks. An import inside a ``try`` whose handler catches ImportError (or ModuleNotFoundError, Exception, a bare
``except``) or inside ``with contextlib.suppress(ImportError)`` is *optional*: the module imports without it.
Both arms of a module-level ``if`` are followed (platform branches included): the closure over-approximates what
one platform runs, so a name it reports as needed may be one the CUDA arm never reaches; it never misses a
top-level import statement of a module it reached. Dynamic imports (``importlib.import_module``, vLLM's
``resolve_obj_by_qualname``, which is how ``vllm.platforms`` loads ``vllm.platforms.cuda``) are not seen: a module
loaded that way is given as a root.

``from P import a`` reaches ``P.a`` too where ``P/a.py`` or ``P/a/__init__.py`` exists; importing ``a.b.c``
reaches ``a`` and ``a.b`` (their ``__init__``). Relative imports are resolved against the importing module.

A module-level ``x = LazyLoader("x", globals(), "pkg")`` (vLLM's deferred import) counts as an import of ``pkg``
where ``pkg`` is outside the package read: the name is resolved on first use, and a use at import time exists
(``vllm/v1/structured_output/backend_guidance.py`` reads ``llguidance.LLMatcher`` in a class body). A
LazyLoader of the package's own modules is not followed (``vllm.config.model`` defers all of
``vllm.model_executor.models``); their files are in the archive whatever the closure reaches.
"""
from __future__ import annotations

import ast
from dataclasses import dataclass, field
from pathlib import Path

_OPTIONAL_EXC = {"ImportError", "ModuleNotFoundError", "Exception", "BaseException"}


@dataclass(frozen=True)
class Edge:
    """One import statement: the module it names, where it stands, and whether its module imports without it."""

    target: str
    source: str  # the importing module
    line: int
    optional: bool
    conditional: bool = False  # under a module-level `if` (not TYPE_CHECKING): runs on some platforms/configs
    names: tuple[str, ...] = ()  # what `from target import ...` takes from it


@dataclass
class Closure:
    """``modules``: every module of the tree reached by required imports (name -> file); ``external``: top-level
    names outside the tree reached by required imports -> the first edge that reached each; ``missing``: names
    under the tree's own packages that have no file (e.g. compiled modules: ``vllm._C_stable_libtorch``) -> edge;
    ``optional``: edges skipped as optional (not followed); ``edges``: the edges followed."""

    modules: dict[str, Path] = field(default_factory=dict)
    via: dict[str, Edge] = field(default_factory=dict)  # module -> the edge that first reached it
    external: dict[str, Edge] = field(default_factory=dict)
    missing: dict[str, Edge] = field(default_factory=dict)
    optional: list[Edge] = field(default_factory=list)
    edges: list[Edge] = field(default_factory=list)  # the edges followed


def module_file(trees: list[Path], name: str) -> Path | None:
    """The source file of module ``name`` in the first of ``trees`` that has one (``a/b/__init__.py`` or
    ``a/b.py``: an overlay tree listed first shadows the ones after it), else None."""
    for root in trees:
        base = root.joinpath(*name.split("."))
        for p in (base / "__init__.py", base.with_suffix(".py")):
            if p.is_file():
                return p
    return None


def _handler_catches_import_error(handler: ast.ExceptHandler) -> bool:
    t = handler.type
    if t is None:
        return True
    names = t.elts if isinstance(t, ast.Tuple) else [t]
    return any((isinstance(n, ast.Name) and n.id in _OPTIONAL_EXC)
               or (isinstance(n, ast.Attribute) and n.attr in _OPTIONAL_EXC) for n in names)


def _suppresses_import_error(item: ast.withitem) -> bool:
    c = item.context_expr
    if not isinstance(c, ast.Call):
        return False
    f = c.func
    fname = f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else ""
    return fname == "suppress" and any(
        (isinstance(a, ast.Name) and a.id in _OPTIONAL_EXC) or (isinstance(a, ast.Attribute) and a.attr in _OPTIONAL_EXC)
        for a in c.args)


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _resolve(module: str, is_pkg: bool, level: int, name: str | None) -> str:
    """The absolute module a (possibly relative) ``from ... import`` names; level 0 is absolute."""
    if level == 0:
        return name or ""
    parts = module.split(".")
    base = parts if is_pkg else parts[:-1]
    if level > 1:
        base = base[: len(base) - (level - 1)]
    return ".".join(base + ([name] if name else []))


def _lazy_target(value: ast.expr) -> str | None:
    """The module of a ``LazyLoader(local_name, globals(), "module")`` call (vllm/utils/import_utils.py), else
    None."""
    if not isinstance(value, ast.Call) or len(value.args) < 3:
        return None
    f = value.func
    fname = f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else ""
    mod = value.args[2]
    if fname == "LazyLoader" and isinstance(mod, ast.Constant) and isinstance(mod.value, str):
        return mod.value
    return None


def imports_of(tree: ast.Module, module: str, is_pkg: bool, trees: list[Path]) -> list[Edge]:
    """The import edges a module runs at import time (see the module's docstring for the rules)."""
    edges: list[Edge] = []

    def visit(stmts: list[ast.stmt], optional: bool, cond: bool) -> None:
        for s in stmts:
            if isinstance(s, ast.Import):
                edges.extend(Edge(a.name, module, s.lineno, optional, cond) for a in s.names)
            elif isinstance(s, ast.ImportFrom):
                target = _resolve(module, is_pkg, s.level, s.module)
                edges.append(Edge(target, module, s.lineno, optional, cond, tuple(a.name for a in s.names)))
                for a in s.names:  # `from P import a` where a is a submodule of P
                    if a.name != "*" and module_file(trees, f"{target}.{a.name}") is not None:
                        edges.append(Edge(f"{target}.{a.name}", module, s.lineno, optional, cond))
            elif isinstance(s, ast.If):
                if _is_type_checking(s.test):
                    visit(s.orelse, optional, cond)
                else:
                    visit(s.body, optional, True)
                    visit(s.orelse, optional, True)
            elif isinstance(s, ast.Try) or type(s).__name__ == "TryStar":
                guarded = optional or any(_handler_catches_import_error(h) for h in s.handlers)
                visit(s.body, guarded, cond)
                for h in s.handlers:
                    visit(h.body, optional, cond)
                visit(s.orelse, optional, cond)
                visit(s.finalbody, optional, cond)
            elif isinstance(s, (ast.With, ast.AsyncWith)):
                visit(s.body, optional or any(_suppresses_import_error(i) for i in s.items), cond)
            elif isinstance(s, (ast.For, ast.AsyncFor, ast.While)):
                visit(s.body, optional, cond)
                visit(s.orelse, optional, cond)
            elif isinstance(s, ast.ClassDef):
                visit(s.body, optional, cond)
            if isinstance(s, (ast.Assign, ast.AnnAssign)) and s.value is not None:
                target = _lazy_target(s.value)
                if target and target.split(".")[0] != module.split(".")[0]:
                    edges.append(Edge(target, module, s.lineno, optional, cond))
    visit(tree.body, False, False)
    return edges


def closure(trees: Path | list[Path], roots: list[str], package: str, conditional: bool = True) -> Closure:
    """The import closure of ``roots`` (module names under ``package``, e.g. ``vllm``) in ``trees`` (directories
    holding ``package/``; the first that has a module's file wins); ``conditional=False`` follows only imports
    outside module-level ``if`` arms (what every platform runs).

    Raises FileNotFoundError naming a root module that has no source file in ``trees``, and SyntaxError (with
    the file) for a file that does not parse.
    """
    trees = [trees] if isinstance(trees, Path) else list(trees)
    out = Closure()
    todo: list[tuple[str, Edge | None]] = [(r, None) for r in roots]
    for r in roots:
        if module_file(trees, r) is None:
            raise FileNotFoundError(f"{r}: no source under {[str(t) for t in trees]}")
    while todo:
        name, edge = todo.pop()
        parts = name.split(".")
        for i in range(1, len(parts) + 1):  # a.b.c runs a/__init__ and a/b/__init__ first
            mod = ".".join(parts[:i])
            if mod in out.modules or mod in out.missing:
                continue
            if parts[0] != package:
                if parts[0] not in out.external and edge is not None:
                    out.external[parts[0]] = edge
                break
            path = module_file(trees, mod)
            if path is None:
                out.missing[mod] = edge or Edge(mod, "<root>", 0, False)
                break
            out.modules[mod] = path
            if edge is not None:
                out.via[mod] = edge
            tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
            for e in imports_of(tree, mod, path.name == "__init__.py", trees):
                if e.optional:
                    out.optional.append(e)
                elif e.conditional and not conditional:
                    continue
                elif e.target:
                    out.edges.append(e)
                    todo.append((e.target, e))
    return out

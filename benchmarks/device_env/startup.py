"""vLLM's OpenAI API server start-up, walked in this interpreter up to the engine's start, under an import guard
that lets through only what the GPU host's environment archive provides.

The static closure (closure.py) follows module-level imports; the API server also imports at run time, inside the
functions that build its FastAPI app (the /metrics instrumentator, the SageMaker standards hooks, uvicorn's
protocol implementations). This walk runs those functions as ``vllm.entrypoints.launchers.api_server.entry``'s
``main``/``run_server`` path does, in order, stopping where the engine would start (``AsyncLLM.from_vllm_config``
needs the model and a device):

    cli_env_setup, make_arg_parser + parse_args (the serve configuration's own argv), validate_parsed_serve_args,
    AsyncEngineArgs.from_cli_args, import AsyncLLM, get_uvicorn_log_config, build_app (routers, /metrics, the
    SageMaker hooks, middleware), the modules init_app_state imports for a generating model, uvicorn.Config.load
    (what serve_http starts).

The guard (:class:`Guard`) is the only finder of ``sys.meta_path``: it answers "no such module" for a top-level
name that is not allowed (:func:`allowed_names`), as the host would, both to an ``import`` and to a
``importlib.util.find_spec`` probe, and records each refusal with the module that asked. A module of the host's own
torch, Triton or image asks for what their install brings: those are let through. A step that fails after a refusal
is retried with the refused names let through (up to :data:`RETRIES` times), so one walk names every module a step
needs, not only the first.

Run it in a clean interpreter (the test does: ``python -I``, tests/benchmarks/test_device_startup.py)::

    python -I -c "import sys; sys.path.insert(0, ROOT); from benchmarks.device_env.startup import main; main()" \\
        ALLOWED_JSON ARGV_JSON

prints one JSON line (:func:`walk`'s result) after the marker :data:`MARK`.
"""
from __future__ import annotations

import importlib.abc
import json
import sys
import traceback

MARK = "r9k-startup-walk:"
RETRIES = 8
#: the repository's own packages and vLLM itself: on the host's path beside the archive
OWN = ("vllm", "r9k", "kernels", "validate", "benchmarks")
#: an image distribution whose import name is not its own name, where this interpreter does not have it installed
_IMAGE_IMPORTS = {"nvidia-ml-py": "pynvml"}


class Guard(importlib.abc.MetaPathFinder):
    """The only ``sys.meta_path`` finder while installed: delegates an allowed top-level name (and every
    submodule, whose parent was allowed) to the finders it replaced; answers None (no such module) for any other
    and records ``(name, asking module, "import" | "probe")`` in ``refused``. ``exempt``: top-level packages whose
    own imports are their install's business (the host's torch, Triton and image distributions)."""

    def __init__(self, allowed: set[str], exempt: set[str]):
        self.allowed, self.exempt = set(allowed), set(exempt)
        self.finders = list(sys.meta_path)
        self.refused: list[tuple[str, str, str]] = []

    def install(self) -> None:
        sys.meta_path[:] = [self]

    def find_spec(self, fullname, path=None, target=None):
        top = fullname.partition(".")[0]
        if path is not None or top in self.allowed or _stdlib(top):
            return self._delegate(fullname, path, target)
        asker, kind = _asker()
        if asker.partition(".")[0] in self.exempt or _stdlib(asker.partition(".")[0]):  # and what it brings brings its own (sympy: mpmath)
            self.exempt.add(top)
            return self._delegate(fullname, path, target)
        self.refused.append((top, asker, kind))
        return None

    def _delegate(self, fullname, path, target):
        for f in self.finders:
            spec = f.find_spec(fullname, path, target) if hasattr(f, "find_spec") else None
            if spec is not None:
                return spec
        return None

    def find_distributions(self, *args, **kwargs):
        """importlib.metadata's look-up, from the finders replaced (distribution metadata is not guarded: a name
        the guard refuses still imports as absent)."""
        for f in self.finders:
            if hasattr(f, "find_distributions"):
                yield from f.find_distributions(*args, **kwargs)

    def invalidate_caches(self) -> None:
        for f in self.finders:
            if hasattr(f, "invalidate_caches"):
                f.invalidate_caches()


def _stdlib(top: str) -> bool:
    # sysconfig imports its build's data module by a computed name (_sysconfigdata_<abi>_<platform>)
    return top in sys.stdlib_module_names or top.startswith("_sysconfigdata_")


def _asker() -> tuple[str, str]:
    """The module whose code asked for the import (the first frame outside importlib and this module), and
    whether it is an ``import`` (importlib's ``_find_and_load`` is on the way) or a ``find_spec`` probe."""
    f = sys._getframe(2)
    kind = "probe"
    while f is not None:
        if f.f_code.co_name == "_find_and_load":
            kind = "import"
        module = str(f.f_globals.get("__name__", "?"))
        if not f.f_code.co_filename.startswith("<frozen") and module != __name__ \
                and module.partition(".")[0] not in ("importlib", "_frozen_importlib"):
            return module, kind
        f = f.f_back
    return "?", kind


def allowed_names(pins) -> dict[str, list[str]]:
    """What the host's path holds, for :class:`Guard` (``pins``: benchmarks.device_env.pins.Pins): ``allowed``,
    the pinned wheels' import names, ``[host].provided`` and the import names of ``[host].image``'s distributions
    (read from this interpreter's installs where present, else the distribution's name with ``_`` for ``-``);
    ``exempt``: the provided and image names, whose own imports their install brings. The standard library and
    :data:`OWN` are always allowed."""
    import importlib.metadata

    by_dist: dict[str, set[str]] = {}
    for top, dists in importlib.metadata.packages_distributions().items():
        for d in dists:
            by_dist.setdefault(d.lower().replace("_", "-"), set()).add(top)
    image = set()
    for d in pins.host.image:
        image |= by_dist.get(d.lower().replace("_", "-"), {_IMAGE_IMPORTS.get(d, d.replace("-", "_"))})
    host = set(pins.host.provided) | image
    pinned = {n for w in pins.wheels for n in w.imports}
    return {"allowed": sorted(pinned | host), "exempt": sorted(host)}


def steps(argv: list[str]) -> list[tuple[str, object]]:
    """The start-up path of ``vllm.entrypoints.openai.api_server`` for the server command line ``argv`` (what
    follows ``-m ENTRYPOINT``), as (name, callable) in the order the server runs them; each callable takes and
    returns the walk's state dict."""

    def entry(s):
        import vllm.entrypoints.openai.api_server  # noqa: F401 - the module the launcher runs
        import vllm.entrypoints.launchers.api_server.entry  # noqa: F401
        return s

    def cli(s):
        import uvloop  # noqa: F401 - main() imports it to run the server
        from vllm.entrypoints.serve.utils.api_utils import cli_env_setup
        cli_env_setup()
        return s

    def parse(s):
        from vllm.entrypoints.launchers.cli_args import make_arg_parser, validate_parsed_serve_args
        from vllm.logger import configure_logging_from_args
        from vllm.utils.argparse_utils import FlexibleArgumentParser
        parser = make_arg_parser(FlexibleArgumentParser(description="vLLM OpenAI-Compatible RESTful API server."))
        s["args"] = parser.parse_args(argv)
        configure_logging_from_args(s["args"])
        validate_parsed_serve_args(s["args"])
        return s

    def engine_args(s):
        from vllm.engine.arg_utils import AsyncEngineArgs
        from vllm.entrypoints.launchers.cli_args import propagate_flash_late_interaction
        s["engine_args"] = AsyncEngineArgs.from_cli_args(s["args"])
        propagate_flash_late_interaction(s["args"], s["engine_args"])
        from vllm.v1.engine.async_llm import AsyncLLM  # noqa: F401 - imported before the engine is built
        return s

    def app(s):
        from vllm.entrypoints.launchers.app import build_app
        from vllm.entrypoints.launchers.utils.server_utils import get_uvicorn_log_config
        s["log_config"] = get_uvicorn_log_config(s["args"])
        s["app"] = build_app(s["args"], ("generate",), None)
        return s

    def app_state(s):
        # what init_app_state imports inside its body for a generating model (it needs the running engine)
        import vllm.entrypoints.generate.api_router  # noqa: F401
        import vllm.entrypoints.generate.structured_decisions.api_router  # noqa: F401
        import vllm.entrypoints.scale_out.factories  # noqa: F401
        return s

    def uvicorn_config(s):
        import uvicorn
        args = s["args"]
        kw = {"log_config": s["log_config"]} if s["log_config"] is not None else {}
        cfg = uvicorn.Config(s["app"], host=args.host, port=args.port, log_level=args.uvicorn_log_level,
                             h11_max_incomplete_event_size=args.h11_max_incomplete_event_size, **kw)
        cfg.load()  # the loop, HTTP, WebSocket and lifespan implementations, imported by name
        return s

    return [("entry", entry), ("cli_env_setup", cli), ("parse_args", parse), ("engine_args", engine_args),
            ("build_app", app), ("init_app_state imports", app_state), ("uvicorn.Config.load", uvicorn_config)]


def _missing_names(e: BaseException) -> set[str]:
    """Top-level names of the ModuleNotFoundErrors in ``e``'s chain (its causes and contexts)."""
    out, seen = set(), set()
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        if isinstance(e, ModuleNotFoundError) and e.name:
            out.add(e.name.partition(".")[0])
        e = e.__cause__ or e.__context__
    return out


def walk(guard: Guard, argv: list[str]) -> dict:
    """Run :func:`steps` under ``guard`` (installed). Returns ``{"done": [step names that completed], "needed":
    {name: "asker (step)"}: refused names a step failed without, "optional": {name: asker}: refused names the walk
    went on without (as on the host, where they are absent), "errors": [step: exception and traceback tail]}``."""
    state: dict = {}
    needed: dict[str, str] = {}
    done, errors = [], []
    for name, fn in steps(argv):
        for _ in range(RETRIES + 1):
            before = len(guard.refused)
            try:
                state = fn(state)
            except Exception as e:  # noqa: BLE001 - any failure of a step is the answer
                refused = {top: asker for top, asker, kind in guard.refused[before:] if kind == "import"}
                missing = _missing_names(e) & set(refused)
                new = {top: refused[top] for top in missing if top not in guard.allowed}
                if new:
                    for top, asker in new.items():
                        needed.setdefault(top, f"{asker} ({name})")
                    guard.allowed |= set(new)
                    continue
                tb = "".join(traceback.format_exception(e)[-3:])
                errors.append(f"{name}: {type(e).__name__}: {e}\n{tb}")
                break
            done.append(name)
            break
        if errors:
            break
    optional = {top: asker for top, asker, _ in guard.refused if top not in needed}
    return {"done": done, "needed": needed, "optional": optional, "errors": errors}


def main() -> None:
    """``python -I -c ... ALLOWED_JSON ARGV_JSON``: ALLOWED_JSON is ``{"allowed": [...], "exempt": [...]}``."""
    allowed = json.loads(sys.argv[1])
    argv = json.loads(sys.argv[2])
    guard = Guard(set(allowed["allowed"]) | set(OWN), set(allowed["exempt"]))
    guard.install()
    result = walk(guard, argv)
    print(MARK + json.dumps(result), flush=True)

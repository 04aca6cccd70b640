"""Which tree a server runs: the plugin's version and a hash of the plugin and kernel sources.

At load the plugin prints one line per process (API server, engine core, each worker), after it has
installed its op dispatch, naming the vLLM it runs on, what is installed in that process and what failed::

    R9K-PROVENANCE version=0.1.0 source_hash=3f2a... files=12 pid=4242 vllm=0.32.0 dispatch=gdn_seq,gdn_conv failed=-

``failed=`` lists, comma-separated, ``family:binding:code`` for each binding of :mod:`r9k.contract` that does not
hold against that vLLM (its family's dispatch then not installed; e.g. ``moe:moe.cpu.apply:signature``; the
codes are r9k.contract.CODES, ``r9k.contract.describe`` puts one in words) and the bare family name (``gdn``) for
an install that raised. A binding refused once the model is built (vLLM 0.33's checkpointed FlashInfer GDN
prefill: ``gdn:gdn.qwen.checkpoint:bypassed``) makes the process print its line again, without that family's
names and with the failure; a parser takes every line, so that process counts as failed.

The validation engine computes :func:`source_hash` over the tree it validates and refuses (verdict
"wrong-tree") a server whose line carries another hash, or none when the configuration expects the plugin;
and (verdict "plugin-inactive") a server where a dispatch that the configuration's knobs ask for is missing
from any process's line.
"""
from __future__ import annotations

import hashlib
import logging
import os
import re
from dataclasses import dataclass
from pathlib import Path

from r9k.version import __version__

PREFIX = "R9K-PROVENANCE"
# A whole line: the plugin prints it alone on its line, at most behind vLLM's "(EngineCore pid=42) " prefix (whose
# pid must then be the line's). Text elsewhere in a line (a logged request, a prompt) never counts.
_LINE_RE = re.compile(r"^(?:\((?P<proc>[\w:.-]+) pid=(?P<ppid>\d+)\) )?" + PREFIX
                      + r" version=(?P<version>\S+) source_hash=(?P<hash>[0-9a-f]+) files=(?P<files>\d{1,9})"
                      r"(?: pid=(?P<pid>\d+))?(?: vllm=(?P<vllm>[\w.+-]+))?(?: dispatch=(?P<dispatch>[\w,-]+))?"
                      r"(?: failed=(?P<failed>[\w.:,-]+))?\s*$")
# Packages whose sources define what the plugin does on a server.
HASHED_PACKAGES = ("r9k", "kernels")
HASH_HEX_CHARS = 16


def package_root() -> Path:
    """The directory that holds the ``r9k`` and ``kernels`` packages of this import."""
    return Path(__file__).resolve().parent.parent


def source_files(root: Path) -> list[Path]:
    """The ``.py`` files of the hashed packages under ``root``, sorted, excluding caches. (The benchmarks live
    outside these packages, in ``benchmarks/``: editing them does not change the hash.)"""
    files: list[Path] = []
    for pkg in HASHED_PACKAGES:
        base = root / pkg
        for p in base.rglob("*.py"):
            rel = p.relative_to(root)
            if "__pycache__" in rel.parts:
                continue
            files.append(p)
    return sorted(files, key=lambda p: p.relative_to(root).as_posix())


def source_hash(root: Path | None = None) -> tuple[str, int]:
    """SHA-256 over (relative path, NUL, content, NUL) of every file in :func:`source_files`.

    Returns:
        (the first 16 hex digits, the number of files hashed).
    Raises:
        FileNotFoundError: ``root`` holds no ``r9k`` package.
    """
    root = package_root() if root is None else root
    if not (root / "r9k").is_dir():
        raise FileNotFoundError(f"{root}: no r9k package to hash")
    h = hashlib.sha256()
    files = source_files(root)
    for p in files:
        h.update(p.relative_to(root).as_posix().encode())
        h.update(b"\0")
        h.update(p.read_bytes())
        h.update(b"\0")
    return h.hexdigest()[:HASH_HEX_CHARS], len(files)


def _names(names) -> str:
    return ",".join(names) if names else "-"


def line(dispatch: list[str] | tuple[str, ...] = (), failed: list[str] | tuple[str, ...] = (),
         vllm: str | None = None) -> str:
    """The provenance line for this process (without a trailing newline).

    Args:
        dispatch: names of the op dispatches installed in this process (e.g. ``gdn_seq``); ``-`` when none.
        failed: ``family:binding:code`` of each binding that does not hold, the family of each install that
            raised; ``-`` when none.
        vllm: the running vLLM's version (the field is left out where None).
    """
    digest, n = source_hash()
    v = f" vllm={vllm}" if vllm else ""
    return (f"{PREFIX} version={__version__} source_hash={digest} files={n} pid={os.getpid()}{v} "
            f"dispatch={_names(dispatch)} failed={_names(failed)}")


@dataclass(frozen=True)
class Provenance:
    """A parsed provenance line: plugin version, source hash, number of files hashed, the op dispatches
    installed in (``dispatch``) or failed in (``failed``: ``family:binding:code`` or a family) that process, both
    None when the line does not say (a plugin that predates the field), and the vLLM version (None where not
    named)."""

    version: str
    source_hash: str
    files: int
    raw: str
    dispatch: tuple[str, ...] | None = None
    failed: tuple[str, ...] | None = None
    vllm: str | None = None

    def failed_families(self) -> tuple[str, ...]:
        """The families of ``failed``'s entries, in order, each once."""
        return tuple(dict.fromkeys(f.split(":")[0] for f in self.failed or ()))


def parse(text: str) -> list[Provenance]:
    """Every provenance line in ``text`` (a server log), in order of appearance: whole lines only (see _LINE_RE),
    and where vLLM's process prefix names a pid, the line's own pid must be that one."""
    out = []
    # "\n" only: str.splitlines() also breaks at U+2028, U+0085 and others, which vLLM's request logging leaves
    # raw inside one logged line, so a prompt could make "whole lines" of its own
    for raw_line in text.replace("\r\n", "\n").split("\n"):
        m = _LINE_RE.match(raw_line)
        if m and not (m["ppid"] and m["pid"] and m["ppid"] != m["pid"]):
            names = {k: None if m[k] is None else tuple(x for x in m[k].split(",") if x and x != "-")
                     for k in ("dispatch", "failed")}
            out.append(Provenance(m["version"], m["hash"], int(m["files"]), raw_line[raw_line.index(PREFIX):].strip(),
                                  **names, vllm=m["vllm"]))
    return out


def log_once(dispatch: list[str] | tuple[str, ...] = (), failed: list[str] | tuple[str, ...] = (),
             vllm: str | None = None) -> str:
    """Print the provenance line (see :func:`line`) to stderr through logging and return it. Called by
    :func:`r9k.register` once the op dispatch is installed (and again should a binding be refused later)."""
    text = line(dispatch, failed, vllm)
    logger = logging.getLogger("r9k")
    if not logger.handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(message)s"))
        logger.addHandler(handler)
        logger.propagate = False
    logger.setLevel(logging.INFO)
    logger.info(text)
    return text

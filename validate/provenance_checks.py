"""Which tree, which plugin and which knobs a server ran, against the tree under validation.

The engine asks these before any suite runs on a server and records the answers: :func:`check_provenance`
(every provenance line carries the tree's source hash: else "wrong-tree"), :func:`check_dispatch` (every
process installed the dispatch the configuration's knobs ask for: else "plugin-inactive"), and, for a record
made on another machine, :func:`tree_mismatch`. The lines are those :mod:`r9k.provenance` prints.
"""
from __future__ import annotations

import hashlib
import math
from pathlib import Path
from typing import Any

from r9k import contract, counters, knobs
from r9k import provenance as prov

from validate.config import ServeConfig
from validate.record import Record, Tree
from validate.util import git_state


def provenance_lines(text: str) -> list[str]:
    """The provenance lines of a server log's ``text``, as printed."""
    return [p.raw for p in prov.parse(text)]


def line_pid(raw: str) -> str:
    """The pid a provenance line names ('?' where it names none)."""
    return raw.split(" pid=")[1].split()[0] if " pid=" in raw else "?"


def engine_hash(root: Path, tree: Path) -> str:
    """SHA-256 (16 hex) over the engine's code and the suite files (with their data, e.g. sanity prompts): a
    record made with other suites, gates or engine code is never reused by --resume, committed or not.
    (Each configuration has its own hash in the record.)"""
    h = hashlib.sha256()
    files = sorted((tree / "validate").rglob("*.py")) + sorted((root / "suites").rglob("*"))
    for f in files:
        if f.is_file() and "__pycache__" not in f.parts:
            h.update(f.name.encode() + b"\0" + f.read_bytes() + b"\0")
    return h.hexdigest()[:16]


def current_tree(root: Path, tree_root: Path | None = None) -> Tree:
    """The tree under validation: the commit and dirty flag of ``tree_root`` (default: ``root`` when it holds
    r9k/, else this package's checkout), the hash of its plugin and kernel sources, and the engine hash of its
    validate/ code with ``root``'s suites (:func:`engine_hash`)."""
    tree_root = tree_root or (root if (root / "r9k").is_dir() else prov.package_root())
    commit, dirty = git_state(tree_root)
    digest, _ = prov.source_hash(tree_root)
    return Tree(commit=commit, dirty=dirty, source_hash=digest, engine_hash=engine_hash(root, tree_root))


def check_provenance(cfg: ServeConfig, lines: list[str], expected_hash: str, launched: bool,
                     has_log: bool | None = None, serving_pid: int | None = None) -> tuple[bool | None, str | None]:
    """(ok, reason) of a server's provenance lines against the tree under validation.

    ``has_log``: a log was read (a launched server's, or ``--server-log``; default: ``launched``). With a log and
    no line, the plugin did not load: False. ``serving_pid``: the process listening for the server (known when it
    runs on this machine): its own line must be among them, so lines of another (earlier) process in the same log
    cannot vouch for it. ok None: could not be checked (an external server and no log).
    """
    has_log = launched if has_log is None else has_log
    parsed = prov.parse("\n".join(lines))
    if not cfg.expects_plugin:
        return True, None
    if not parsed:
        if not has_log:
            return None, "provenance not checked: external server and no --server-log"
        return False, "the server log has no R9K-PROVENANCE line but the configuration expects the plugin"
    wrong = sorted({p.source_hash for p in parsed if p.source_hash != expected_hash})
    if wrong:
        return False, f"server runs plugin source {', '.join(wrong)}, the tree under validation is {expected_hash}"
    if serving_pid is not None and not launched and str(serving_pid) not in {line_pid(p.raw) for p in parsed}:
        return False, (f"no provenance line in the log comes from the process serving the requests (pid {serving_pid}): "
                       "the lines are another process's")
    return True, None


_PARALLEL_FLAGS = {"pipeline_parallel_size": ("--pipeline-parallel-size", "-pp"),
                   "data_parallel_size": ("--data-parallel-size", "-dp")}


def parallel_sizes(cfg: ServeConfig) -> dict[str, int]:
    """{tensor_parallel_size, pipeline_parallel_size, data_parallel_size} of ``cfg``: the first from its field,
    the others from vLLM's flags in ``server.extra_args`` (``--pipeline-parallel-size 4``, ``-pp=4``; 1 where absent
    or not a positive integer, which vLLM itself refuses at launch)."""
    out = {"tensor_parallel_size": cfg.server.tensor_parallel_size}
    args = list(cfg.server.extra_args)
    for key, flags in _PARALLEL_FLAGS.items():
        out[key] = 1
        for i, a in enumerate(args):
            flag, eq, val = a.partition("=")
            if flag in flags:
                raw = val if eq else (args[i + 1] if i + 1 < len(args) else "")
                if raw.isdigit() and int(raw) >= 1:
                    out[key] = int(raw)
    return out


def check_dispatch(cfg: ServeConfig, lines: list[str], log_text: str | None = None) -> str | None:
    """Why a server whose provenance ``lines`` are these is "plugin-inactive" for ``cfg``, or None.

    Inactive: a process whose dispatch install failed (its line's ``failed=``: a binding of r9k.contract that does
    not hold on the server's vLLM, named and put in words with the vLLM version, or an install that raised), or a
    dispatch that a knob of ``cfg.env`` asks for (a
    non-stock value of a knob with :attr:`r9k.knobs.Knob.dispatch`) missing from some process's line. Lines
    that cannot say (no line at all) are the provenance check's business, not this one's. Where the knobs ask for
    the expert cache (``moe_cache``) and the server's log of its last launch is given (``log_text``), also: no
    process that printed a provenance line printed an ``R9K-MOE-CACHE`` line (r9k/counters.py), or one says that
    none of its MoE layers took the cache.
    """
    parsed = prov.parse("\n".join(lines))
    if not parsed:
        return None
    # vLLM runs an API server and at least one process per rank, tensor x pipeline x data parallel (the engine
    # core holds the rank when there is one): fewer lines means some process, maybe one running the kernels,
    # never loaded the plugin
    sizes = parallel_sizes(cfg)
    least = math.prod(sizes.values()) + 1
    if len({line_pid(p.raw) for p in parsed}) < least:
        shape = " x ".join(f"{k} {v}" for k, v in sizes.items())
        return (f"only {len({line_pid(p.raw) for p in parsed})} server process(es) printed a provenance line; a server of "
                f"{shape} has at least {least}")
    failed = [p for p in parsed if p.failed]
    if failed:
        why = "op dispatch failed to install in the server: " + "; ".join(
            f"{', '.join(p.failed)} ({line_pid(p.raw) if ' pid=' in p.raw else 'a process'})" for p in failed)
        versions = sorted({p.vllm for p in failed if p.vllm})
        bindings = [t for t in dict.fromkeys(t for p in failed for t in p.failed) if ":" in t]
        if versions:
            why += f" on vLLM {', '.join(versions)}"
        return why + "".join(f"; binding {contract.describe(t)}" for t in bindings)
    problems = []
    for name, knob in knobs.expected_dispatch(cfg.env).items():
        missing = [p for p in parsed if p.dispatch is None or name not in p.dispatch]
        if missing:
            pids = [line_pid(m.raw) for m in missing]
            problems.append(f"{knob} asks for the {name} dispatch, which {len(missing)} of {len(parsed)} server "
                            f"process(es) did not install (pid {', '.join(pids)})")
        elif name == "moe_cache" and log_text is not None:
            why = _moe_layers_missing(knob, parsed, log_text)
            if why:
                problems.append(why)
    return "; ".join(problems) or None


def _moe_layers_missing(knob: str, parsed: list, log_text: str) -> str | None:
    """Why the expert cache the knob ``knob`` asks for took no layer on the server of ``log_text``, or None."""
    pids = {line_pid(p.raw) for p in parsed}
    summaries = [s for s in counters.parse(log_text).summaries if str(s.pid) in pids]
    if not summaries:
        return (f"{knob} asks for the expert cache, but no server process printed an R9K-MOE-CACHE line (no MoE layer "
                "was loaded on it)")
    none = [s for s in summaries if s.layers == 0]
    if none:
        return (f"{knob} asks for the expert cache, but no MoE layer took it in " + ", ".join(
            f"pid {s.pid} (rank {s.rank}: 0 of {s.moe_layers} MoE layers)" for s in none))
    return None


def check_calls(env: dict[str, str], share: Any) -> tuple[list[str], list[str]]:
    """(findings, never exercised) of one suite's share of r9k's call counts (``share``: the record's ``r9k_calls``,
    :func:`r9k.calls.delta`) for the dispatches ``env``'s knobs ask for (:func:`r9k.knobs.expected_dispatch`).

    For each dispatch and each step kind it applies to (:data:`r9k.ops.STEP_KINDS`):

    * no step of that kind ran: never exercised in one (said, never a finding);
    * some call routed to r9k: it ran;
    * none to r9k, and some sent back to vLLM (route ``vllm``) that its rule would take (for a dispatch without a
      rule, :data:`r9k.ops.RULES`, any call not taken): it did not run where it should have, a finding (the
      runner's verdict is "plugin-inactive");
    * none to r9k, every call declined by the dispatch's own rule (route ``rule``: the GDN prefill's sequences
      beyond R9K_GDN_PREFILL_MAX), or no call at all: never exercised in a step it takes (said, never a finding);
    * a share whose processes could not count ``rule`` (its ``routes`` lacking it, or absent, and no ``rule`` row in
      the share) whose ruled dispatch sent every call to vLLM: the counts cannot tell a decline from a fallback, said
      as never exercised, neither a finding nor a claim that it ran.

    The engine judges each suite by it when it writes the record, and the audit (validate.audit) the record again.

    Raises:
        ValueError: ``share`` is not a readable share of counts (None, an error, a malformed row, ``routes`` not a
            list of routes), or a knob value its knob rejects.
    """
    from r9k.calls import KINDS, NAME_RE, ROUTES
    from r9k.ops import RULES, STEP_KINDS

    want = knobs.expected_dispatch({k: v for k, v in env.items() if k.startswith("R9K_")})
    if not want:
        return [], []

    def count(v: Any) -> int:
        if type(v) is not int or v < 0:
            raise ValueError(f"{v!r} is not a count")
        return v

    if not isinstance(share, dict) or "error" in share:
        why = share.get("error") if isinstance(share, dict) else "no R9K-CALLS line fell in the suite"
        raise ValueError(f"r9k's call counts cannot be read ({why})")
    steps, rows, routes = share.get("steps"), share.get("calls"), share.get("routes")
    if not isinstance(steps, dict) or not isinstance(rows, list):
        raise ValueError("r9k's call counts hold no steps or calls")
    if routes is not None and not (isinstance(routes, list) and all(r in ROUTES for r in routes)):
        raise ValueError(f"r9k's call counts name routes the log could not have given: {routes!r}")
    steps = {k: count(steps.get(k, 0)) for k in KINDS}
    routed: dict[tuple[str, str, str], int] = {}
    for x in rows:
        if not (isinstance(x, dict) and x.get("route") in ROUTES and x.get("kind") in KINDS
                and isinstance(x.get("dispatch"), str) and NAME_RE.fullmatch(x["dispatch"])):
            raise ValueError(f"r9k's call counts hold a row the log could not have given: {x!r}")
        key = (x["dispatch"], x["route"], x["kind"])
        routed[key] = routed.get(key, 0) + count(x.get("calls"))
    # processes that counted the rule's declines apart: said by the share, else shown by a row of that route
    rule_counted = "rule" in (routes or ()) or any(r == "rule" and n for (_, r, _), n in routed.items())
    findings, never = [], []
    for name, knob in want.items():
        for kind in STEP_KINDS.get(name, ("prefill", "decode")):
            r9k, back, rule = (routed.get((name, r, kind), 0) for r in ("r9k", "vllm", "rule"))
            bound = RULES.get(name)
            in_steps = f"the suite's {steps[kind]:,} {kind} steps"
            if not steps[kind]:
                never.append(f"{knob} asks for the {name} dispatch, and no {kind} step ran during the suite: it was "
                             f"never exercised in one")
            elif r9k:
                continue
            elif bound and back and not rule_counted:
                never.append(f"{knob} asks for the {name} dispatch, which routed no call to r9k in {in_steps}: "
                             f"whether it was exercised cannot tell from the counts (every call went to vLLM: beyond "
                             f"{bound}, or refused; {back:,} calls)")
            elif back or not bound:
                findings.append(f"{knob} asks for the {name} dispatch, but it routed no call to r9k in {in_steps} "
                                f"({back:,} calls routed back to vLLM"
                                + (f", {rule:,} beyond {bound}" if bound else "") + ")")
            elif not rule:
                never.append(f"{knob} asks for the {name} dispatch, and no call of it was counted in {in_steps}: it "
                             "was never exercised in one")
            else:
                never.append(f"{knob} asks for the {name} dispatch, and every call of it in {in_steps} was beyond "
                             f"{bound} ({rule:,} calls sent to vLLM by its rule): it was never exercised in a step "
                             "it takes")
    return findings, never


def dispatch_by_pid(lines: list[str]) -> dict[str, list[str]]:
    """{pid: dispatch names installed} from provenance lines (pid '?' where a line has none)."""
    out: dict[str, list[str]] = {}
    for p in prov.parse("\n".join(lines)):
        out[line_pid(p.raw)] = list(p.dispatch or ())
    return out


def tree_mismatch(rec: Record, tree: Tree, expects_plugin: bool, config_hash: str | None = None) -> str | None:
    """Why ``rec`` (made elsewhere, e.g. on a Ray node) was not made by the tree under validation, or None.

    The node's own checkout must hash like the driver's (plugin and kernels, engine and suites, and the
    configuration: ``config_hash``, the driver's), and where the configuration expects the plugin, every
    provenance line its server printed must carry the driver's hash.
    """
    why = []
    if config_hash is not None and rec.config_hash != config_hash:
        why.append(f"the node ran configuration {rec.config} with hash {rec.config_hash}, the driver's is {config_hash} "
                   "(its serve/ file differs)")
    if rec.tree.source_hash != tree.source_hash:
        why.append(f"the node's checkout has plugin source {rec.tree.source_hash}, the tree under validation "
                   f"is {tree.source_hash}")
    if rec.tree.engine_hash != tree.engine_hash:
        why.append(f"the node's engine and suites hash {rec.tree.engine_hash}, the driver's {tree.engine_hash}")
    if expects_plugin and rec.server.launched:
        wrong = sorted({p.source_hash for p in prov.parse("\n".join(rec.server.provenance))} - {tree.source_hash})
        if wrong:
            why.append(f"its server ran plugin source {', '.join(wrong)}")
    return "; ".join(why) or None

"""Where configurations run: here, one after another (the default), or as Ray tasks placed by hardware.

With Ray each configuration's suites are one task, placed by the resources its ``hardware`` states (``gpus: 4,
kind: r9700`` becomes the custom resource ``{"r9700": 4}``; ``hardware.resources`` adds any others), so a
configuration lands only on a node that has its hardware, and independent configurations run at the same time.
The task launches and stops its own server on its node, writes its records there (a temporary folder that is
kept) and returns them; the driver writes them under ``reports/`` exactly as a local run would, the moment
each task ends. Every node needs this checkout at the same path (a shared or identically deployed tree: the
provenance check proves it is the same source) and the same Python environment.

The driver checks every record a node returns against the tree under validation (the node's plugin, kernel,
engine and suite hashes, and its server's provenance lines): a node with another checkout produces
wrong-tree records, never passes. A lost node fails that configuration's suites with the cause; tasks are
never retried (a retried soak would count twice); ``--resume`` then re-runs only what is missing. A configuration no node can host fails at once,
naming the missing resource. Ray is imported only here, only when this executor is used.
"""
from __future__ import annotations

import json
import tempfile
from dataclasses import replace
from pathlib import Path

from validate.config import ServeConfig
from validate.engine import Engine, Outcome, RunOptions
from validate.provenance_checks import tree_mismatch
from validate.errors import InputError
from validate.record import Record, Verdict, record_path, write_record
from validate.suite import find_suite


def placement(cfg: ServeConfig) -> dict[str, float]:
    """Ray custom resources a configuration needs: ``hardware.resources`` plus ``{kind: gpus}`` for GPU boxes."""
    res = {k: float(v) for k, v in cfg.hardware.resources.items()}
    if cfg.hardware.gpus > 0:
        res.setdefault(cfg.hardware.kind, float(cfg.hardware.gpus))
    return res


def unplaceable(need: dict[str, float], nodes: list[dict]) -> str | None:
    """Why no alive node can host ``need`` (None when one can). ``nodes``: ``ray.nodes()`` entries."""
    alive = [n for n in nodes if n.get("Alive")]
    if not alive:
        return "the Ray cluster has no alive node"
    for n in alive:
        have = n.get("Resources", {})
        if all(have.get(k, 0.0) >= v for k, v in need.items()):
            return None
    for k, v in need.items():
        best = max((n.get("Resources", {}).get(k, 0.0) for n in alive), default=0.0)
        if best < v:
            return f"no node of the Ray cluster has resource {k!r}: {v:g} (the most any node has is {best:g})"
    return f"no single node has all of {need}"


def check_reachable(address: str, timeout_s: float = 5.0) -> None:
    """Fail fast when nothing listens at ``host:port`` (ray.init would retry for minutes).

    Raises:
        InputError: naming the address.
    """
    import socket

    host, _, port = address.rpartition(":")
    if not host or not port.isdigit():
        raise InputError(f"--address {address}: expected HOST:PORT of the Ray head (GCS)")
    try:
        with socket.create_connection((host, int(port)), timeout=timeout_s):
            pass
    except OSError as e:
        raise InputError(f"cannot reach the Ray cluster at {address}: {e}") from None


def _task(opts: RunOptions, release: str, config: str, suites: list[str]) -> dict:
    """Body of the Ray task: run one configuration on this node into a kept temporary folder."""
    folder = Path(tempfile.mkdtemp(prefix=f"r9k-ray-{release}-{config}-"))
    local = replace(opts, reports=folder, resume=False)
    out = Outcome()
    Engine(local).run_config(release, config, suites, out)
    log = folder / release / config / "server.log"
    return {
        "records": [r.model_dump_json() for r in out.records],
        "launch_failures": out.launch_failures,
        "server_log": log.read_text(errors="replace") if log.exists() else None,
        "node_folder": str(folder),
    }


def run_ray(engine: Engine, plan: list[tuple[str, list[str]]], release: str, outcome: Outcome,
            address: str | None = None, say=print) -> None:
    """Run ``plan`` on a Ray cluster (``address``; default: ``ray.init()``'s, i.e. RAY_ADDRESS or a local one)."""
    try:
        import ray
    except ImportError:
        raise InputError("--executor ray needs Ray: pip install 'r9k[ray]'") from None
    if address:
        check_reachable(address)
    kw = {}
    if address and address.split(":")[0] in ("127.0.0.1", "localhost"):
        kw["_node_ip_address"] = "127.0.0.1"  # a cluster on this machine: stay on loopback
    ray.init(address=address, ignore_reinit_error=True, log_to_driver=False,
             runtime_env={"env_vars": {"PYTHONPATH": str(engine.o.tree_root())}}, **kw)
    try:
        remote = ray.remote(_task)
        pending = {}
        nodes = ray.nodes()
        for cfg_name, suites in plan:
            todo = engine.split_done(release, cfg_name, suites, outcome)
            if not todo:
                continue
            cfg = engine.config(cfg_name)
            need = placement(cfg)
            why = unplaceable(need, nodes)
            if why:
                say(f"[red]{cfg_name}: cannot be placed: {why}[/red]")
                _fail(engine, outcome, release, cfg, todo, f"not placed: {why}")
                continue
            say(f"{cfg_name}: submitted to Ray (resources {need or 'none beyond 1 CPU'})")
            ref = remote.options(num_cpus=1, resources=need or None, max_retries=0).remote(engine.o, release, cfg_name, todo)
            pending[ref] = (cfg, todo)
        while pending:
            ready, _ = ray.wait(list(pending), num_returns=1)
            ref = ready[0]
            cfg, todo = pending.pop(ref)
            try:
                res = ray.get(ref)
            except ray.exceptions.RayTaskError as e:  # an exception inside the task (e.g. bad input on that node)
                cause = str(e.cause) if getattr(e, "cause", None) else str(e).splitlines()[-1]
                say(f"[red]{cfg.name}: failed on its node: {cause}[/red]")
                _fail(engine, outcome, release, cfg, todo, f"failed on its Ray node: {cause}")
                continue
            except ray.exceptions.RayError as e:  # node or worker lost
                cause = f"{type(e).__name__}: {str(e).splitlines()[0][:300]}"
                say(f"[red]{cfg.name}: node lost: {cause}[/red]")
                _fail(engine, outcome, release, cfg, todo, f"Ray node or worker lost mid-task ({cause}); not retried")
                continue
            _collect(engine, outcome, release, cfg, res, say)
    finally:
        ray.shutdown()


def _collect(engine: Engine, outcome: Outcome, release: str, cfg: ServeConfig, res: dict, say) -> None:
    if res["server_log"] is not None:
        log = engine.o.reports / release / cfg.name / "server.log"
        log.parent.mkdir(parents=True, exist_ok=True)
        with open(log, "a") as fh:
            fh.write(res["server_log"])
    outcome.launch_failures.update(res["launch_failures"])
    for text in res["records"]:
        rec = Record.model_validate(json.loads(text))
        # The node hashed its own checkout and may run other engine code: the driver decides what counts.
        why = tree_mismatch(rec, engine.tree, cfg.expects_plugin, cfg.digest())
        if why:
            was = f"recorded on the node as {rec.verdict.status}" + (f" ({rec.verdict.cause})" if rec.verdict.cause else "")
            rec.verdict = Verdict(status="wrong-tree", cause=f"not the tree under validation: {why}", reasons=[was])
            say(f"[red]{rec.config}/{rec.suite}: wrong tree on its Ray node: {why}[/red]")
        write_record(record_path(engine.o.reports, release, rec.config, rec.suite), rec)
        outcome.records.append(rec)
        say(f"{rec.config}/{rec.suite}: {rec.verdict.status} (from its Ray node; kept there in {res['node_folder']})")


def _fail(engine: Engine, outcome: Outcome, release: str, cfg: ServeConfig, suites: list[str], cause: str) -> None:
    """An error record for each suite of a configuration that did not run, with the cause."""
    loaded = [find_suite(engine.o.root, name, engine.o.profile) for name in suites]
    engine.record_unrun(release, cfg, loaded, Verdict(status="error", cause=cause), outcome)

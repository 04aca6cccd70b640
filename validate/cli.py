"""``r9k-validate``: run the release checklist, one suite, or render notes from records.

Exit status: 0 when every verdict passed; 1 when a gate failed (or a server ran the wrong tree);
2 for bad input, a launch that failed, or a suite that could not complete; 130 on Ctrl-C.
"""
from __future__ import annotations

import argparse
import signal
import statistics
import sys
from pathlib import Path

from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from validate.errors import InputError, LaunchError, ReportsError, combine_exit

# Off a terminal (CI logs, files) rich would wrap tables at 80 columns: give records' tables room.
console = Console(stderr=False, highlight=False, width=None if sys.stdout.isatty() else 160)


class _Bar:
    """Adapter from a runner's ``progress(advance, total=, description=)`` to one rich task; a description (what
    the runner is at: "pass 3 of 12") is shown after the suite's label.

    Off a terminal (CI logs, ``> file``) rich draws nothing until the end, so a plain line is printed every
    ``LOG_EVERY_S`` seconds instead.
    """

    LOG_EVERY_S = 30.0

    def __init__(self, progress: Progress, label: str):
        import time

        self.p = progress
        self.label = label
        self.task = progress.add_task(label, total=None)
        self._clock = time.monotonic
        self._last = self._clock()
        self._t0 = self._last

    def update(self, advance: int = 0, total: int | None = None, description: str | None = None) -> None:
        kw = {}
        if total is not None:
            kw["total"] = total
        if description is not None and description != self.label.rsplit("/", 1)[-1]:  # not the suite's name again
            kw["description"] = f"{self.label}: {description}"
        self.p.update(self.task, advance=advance, **kw)
        if not self.p.console.is_terminal and self._clock() - self._last >= self.LOG_EVERY_S:
            self._last = self._clock()
            t = self.p.tasks[self.task]
            self.p.console.print(f"{t.description}: {t.completed:.0f} of {t.total or '?'} "
                                 f"({self._last - self._t0:.0f} s)")

    def close(self) -> None:
        self.p.stop_task(self.task)


def _int_at_least(least: int):
    def parse(text: str) -> int:
        try:
            v = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
        if v < least:
            raise argparse.ArgumentTypeError(f"{v} is below {least}")
        return v
    return parse


def _knob_set(text: str) -> str:
    """``--knobs``: config, stock or a knob set's name (a configuration without it is refused before launch)."""
    from validate.record import check_name

    try:
        return check_name("--knobs", text, "gdn")
    except InputError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


_positive_int = _int_at_least(1)
_at_least_16 = _int_at_least(16)  # ServerSpec's bound on max_model_len


def _root() -> Path:
    """The checkout holding serve/, suites/, templates/: ``$R9K_ROOT`` or the one this package runs from."""
    import os

    from validate.util import repo_root

    return Path(os.environ["R9K_ROOT"]) if os.environ.get("R9K_ROOT") else repo_root()


def _opts(args) -> "RunOptions":
    from validate.data import resolve_data_dir
    from validate.engine import RunOptions

    root = _root()
    return RunOptions(root=root, reports=Path(args.reports) if args.reports else root / "reports",
                      profile=args.profile, resume=getattr(args, "resume", False),
                      data_dir=resolve_data_dir(args.data_dir),
                      model_cache=Path(args.model_cache) if args.model_cache else None,
                      url=args.url, model=args.model, server_log=Path(args.server_log) if args.server_log else None,
                      launch_timeout_s=getattr(args, "launch_timeout", None),
                      baseline=getattr(args, "baseline", None),
                      knobs=getattr(args, "knobs", None) or "config")


def _external(opts, args):
    """The configuration of the ``--url`` server when no ``--config`` names one (see external_config)."""
    from validate.config import external_config
    from validate.server import served_max_model_len

    if not opts.model:
        raise InputError("--url needs --model NAME (the served model name)")
    if not getattr(args, "max_num_seqs", None):
        raise InputError("--url without --config: give --max-num-seqs N (the server's max_num_seqs, which it does not "
                         "report), or --config NAME to record the run under a configuration of serve/")
    mml = getattr(args, "max_model_len", None) or served_max_model_len(opts.url, opts.model)
    if mml is None:
        raise InputError(f"--url {opts.url}: its /v1/models does not state max_model_len for {opts.model!r}: "
                         "give --max-model-len N")
    return external_config(opts.url, opts.model, args.max_num_seqs, mml)


def _preflight(engine, plan: list[tuple[str, list[str]]], executor: str) -> dict[str, tuple[str, set[str]]]:
    """Check every input before anything launches and say every problem at once.

    Returns {configuration: (why it cannot run here, the suites that need what is missing)} for configurations
    whose model or hardware is missing on this machine: their suites are recorded as errors and the rest of the
    release goes on. With Ray the model and the hardware are the node's, checked there.

    Raises:
        InputError: every malformed or unknown configuration or suite file, and every missing data file, one per
            line (nothing has launched).
    """
    from validate.hardware import hardware_problem, visible_gpus
    from validate.models import model_problems
    from validate.suite import find_suite

    o = engine.o
    problems: list[str] = []
    blocked: dict[str, tuple[str, set[str]]] = {}
    gpus = None
    for cfg_name, suites in plan:
        try:
            c = engine.config(cfg_name)
        except InputError as e:
            problems.append(str(e))
            c = None
        loaded = []
        for s in suites:
            try:
                ls = find_suite(o.root, s, o.profile)
                ls.preflight(o.root, o.data_dir)
                loaded.append(ls)
            except InputError as e:
                problems.append(str(e))
        if c is None or executor != "local" or o.url:
            continue
        why, hit = [], set()
        server_suites = {ls.spec.name for ls in loaded if ls.spec.needs_server}
        if server_suites:
            mp = model_problems(c.model, c.server.extra_args)
            if mp:
                why += mp
                hit |= server_suites
        if c.hardware.gpus > 0:
            gpus = visible_gpus() if gpus is None else gpus
            hp = hardware_problem(c.hardware, gpus)
            if hp:
                why.append(hp)
                hit |= {ls.spec.name for ls in loaded}
        if why:
            blocked[cfg_name] = (f"serve/{cfg_name}.yaml: " + "; ".join(why), hit)
    if problems:
        raise InputError("\n".join(dict.fromkeys(problems)))
    return blocked


def _run(plan: list[tuple[str, list[str]]], release: str, args, external=None):
    """Run ``plan``; returns (the Outcome: records written, configurations that could not start; the tree under
    validation)."""
    from validate.engine import Engine, Outcome
    from validate.record import Verdict, check_release_name
    from validate.suite import find_suite

    check_release_name(release)
    opts = _opts(args)
    if opts.url and len(plan) > 1:
        raise InputError("--url runs suites against one server: name one --config")
    if (opts.model or opts.server_log) and not opts.url:
        raise InputError("--model and --server-log go with --url (a server that is already running)")
    if opts.server_log and not opts.server_log.is_file():
        raise InputError(f"--server-log {opts.server_log}: not a readable file")
    opts.external_config = external
    executor = getattr(args, "executor", "local")
    outcome = Outcome()
    import gc

    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=console, transient=False) as progress:
        engine = Engine(opts, console=console, progress_factory=lambda label: _Bar(progress, label))
        blocked = _preflight(engine, plan, executor)
        for cfg_name, (why, _) in blocked.items():
            console.print(f"[red]preflight: {why}[/red]", soft_wrap=True)
        if blocked:
            console.print(f"[yellow]preflight: {len(blocked)} configuration(s) cannot run here; their suites are "
                          "recorded as not run and the others go on[/yellow]")
        runnable = []
        for cfg_name, suites in plan:
            if cfg_name not in blocked:
                runnable.append((cfg_name, suites))
                continue
            why, hit = blocked[cfg_name]
            todo = engine.split_done(release, cfg_name, [s for s in suites if s in hit], outcome)
            cfg = engine.config(cfg_name)
            engine.record_unrun(release, cfg, [find_suite(opts.root, s, opts.profile) for s in todo],
                                Verdict(status="error", cause=f"not run: {why}"), outcome)
            outcome.launch_failures[cfg_name] = why
            rest = [s for s in suites if s not in hit]
            if rest:
                runnable.append((cfg_name, rest))
        gc.freeze()  # objects from the imports (torch, vLLM) never die: keep full collections short, so a
        # collector pause does not land inside a timed stream (hundreds of ms measured with torch imported)
        if executor == "ray":
            from validate.executors import run_ray

            run_ray(engine, runnable, release, outcome, address=args.address, say=console.print)
        else:
            for cfg_name, suites in runnable:
                engine.run_config(release, cfg_name, suites, outcome)
    return outcome, engine.tree


def _exit(code: int, why: str) -> int:
    style = "green" if code == 0 else "red"
    console.print(f"[{style}]exit status {code}: {escape(why)}[/{style}]", soft_wrap=True)
    return code


def cmd_release(args) -> int:
    from validate.suite import load_checklist
    from validate.verdict import assess_release

    root = _root()
    checklist = load_checklist(root)
    plan = checklist.plan(args.config)
    if args.suite:
        unknown = sorted(set(args.suite) - {s for _, suites in plan for s in suites})
        if unknown:
            raise InputError(f"suite {unknown[0]!r} is not in the checklist for {', '.join(c for c, _ in plan)}")
        plan = [(c, [s for s in suites if s in args.suite]) for c, suites in plan]
    outcome, tree = _run(plan, args.release, args)
    opts = _opts(args)
    # the one verdict of the release: every record of it (a run of some configurations or suites leaves the
    # others' records standing: they are the release's too), the paired and performance gates, the tree
    verdict = assess_release(opts.reports, args.release, root=root, baseline=args.baseline,
                             planned=checklist.plan(), tree=tree, accept_other_tree=args.accept_other_tree)
    ran = {c for c, _ in plan}
    earlier = sorted({r.config for r in verdict.records} - ran)
    if earlier:
        verdict.notes.append(f"this run covered {', '.join(sorted(ran))}; the verdict also holds the records of "
                             f"{', '.join(earlier)} left in reports/{args.release}/ by earlier runs")
    _print_gates(verdict)
    _notes(root, opts.reports, args.release, checklist, verdict)
    n = len(verdict.checks)
    code = _finish(args, verdict)
    if len(verdict.checks) != n:  # JUnit could not be written: the notes must say so too
        _notes(root, opts.reports, args.release, checklist, verdict, quiet=True)
    return code


def _notes(root: Path, reports: Path, release: str, checklist, verdict, quiet: bool = False) -> None:
    """Render the release notes from ``verdict``; notes that cannot be rendered are a not-checked line of it."""
    from validate.verdict import release_check

    try:  # whatever the records hold, the run ends with its exit line and the CI reports
        out = _render(root, reports, release, checklist, verdict)
        if not quiet:
            console.print(f"release notes: {out}")
    except (InputError, ReportsError) as e:
        console.print(f"[red]error: the release notes could not be rendered: {escape(str(e))}[/red]", soft_wrap=True)
        verdict.checks.append(release_check("notes", f"the release notes could not be rendered: {e}"))
    except Exception as e:  # a record no renderer foresaw: the verdict still reaches JUnit, the summary and the exit
        console.print(f"[red]error: the release notes could not be rendered: {type(e).__name__}: "
                      f"{escape(str(e))}[/red]", soft_wrap=True)
        verdict.checks.append(release_check("notes", f"the release notes could not be rendered: "
                                                     f"{type(e).__name__}: {e}"))


def _print_gates(verdict) -> None:
    """The baseline and the gates' tables on the console (what the verdict holds; nothing decided here)."""
    console.print(escape(f"baseline: {verdict.baseline or 'none'} ({verdict.baseline_why})"), soft_wrap=True)
    if verdict.comparison is not None:
        print_comparison(verdict.comparison)
    if verdict.perf is not None:
        print_perf(verdict.perf)
    for n in verdict.notes:
        console.print(f"[yellow]note: {escape(n)}[/yellow]", soft_wrap=True)


def _finish(args, verdict) -> int:
    """The verdict's table, JUnit and the step summary, then the exit line: all from ``verdict``."""
    print_verdict(verdict)
    code = _ci_reports(args, verdict)
    return _exit(code, verdict.why())


def _stopped(args, why: str, interrupted: bool = False) -> int:
    """A command that stopped before its verdict (bad input, Ctrl-C): its JUnit and step summary still say so,
    from a verdict of that one line, so a report of an earlier run is never left standing as this one's. An
    interrupted ``release`` re-renders its notes from the records written so far, marked interrupted, so the
    notes of an earlier run are not left standing as this one's either."""
    from validate.verdict import ReleaseVerdict, release_check

    v = ReleaseVerdict(getattr(args, "release", None) or getattr(args, "name", None) or "-", interrupted=interrupted,
                       what=args.cmd + (" --perf" if getattr(args, "perf", False) else ""))
    v.checks.append(release_check("interrupted" if interrupted else "input", why))
    if args.cmd == "release":
        try:
            v = _aborted_release(args, v.checks[0], interrupted)
        except (Exception, KeyboardInterrupt) as e:  # best effort: the one-line verdict stands
            console.print(f"[yellow]the notes were not re-rendered: {type(e).__name__}: {escape(str(e))}[/yellow]")
    try:
        return _ci_reports(args, v) if interrupted else combine_exit(2, _ci_reports(args, v))
    except Exception:  # the reports are best effort here; the exit status stands
        return 130 if interrupted else 2


def _aborted_release(args, stop, interrupted: bool):
    """The verdict of a ``release`` that stopped early (interrupted, bad input, a report it could not write) from
    the records written so far and ``stop`` (the line saying why it stopped), its notes rendered from it, so the
    notes of an earlier run are never left standing as this one's, and a finding among the records written still
    decides the exit status."""
    from validate.suite import load_checklist
    from validate.verdict import assess_release

    root = _root()
    checklist = load_checklist(root)
    reports = Path(args.reports) if args.reports else root / "reports"
    v = assess_release(reports, args.release, root=root, baseline=args.baseline, planned=checklist.plan(),
                       accept_other_tree=args.accept_other_tree)
    v.interrupted = interrupted
    v.checks.append(stop)
    if (reports / args.release).is_dir():
        _notes(root, reports, args.release, checklist, v)
    return v


def _render(root: Path, reports: Path, release: str, checklist, verdict) -> Path:
    from validate.render import render_release

    try:
        return render_release(root, reports, release, checklist, verdict)
    except OSError as e:
        raise ReportsError(f"cannot write the release notes under {reports / release}: {e.strerror or e}") from None


def print_perf(perf) -> None:
    """The performance gate's table: per configuration and figure, medians with bands, change, p, mark."""
    t = Table(title=f"performance gate: {perf.candidate} against {perf.baseline} (BetterBench passes)")
    for col in ("configuration", "figure", perf.baseline, perf.candidate, "change", "threshold", "rank-test p", "mark"):
        t.add_column(col)
    for f in perf.figures:
        band = lambda v, b: f"{statistics.median(v):,.2f} ({b[0]:,.2f}-{b[1]:,.2f}, {len(v)})"  # noqa: E731
        t.add_row(escape(f.config), escape(f.figure), band(f.base, f.base_band), band(f.cand, f.cand_band),
                  f"{f.change_pct:+.1f}%",
                  f"{f.threshold_pct:g}%",
                  f"{f.p_value:.3g}", "[red]regression[/red]" if f.regression else escape(f.mark))
    console.print(t)
    for f in perf.figures:
        if f.mark != "within the threshold":
            console.print(escape(f"{f.config}/{f.figure}: {f.message}"), soft_wrap=True)
    for u in perf.unpaired + perf.limited:
        console.print(f"[yellow]not compared:[/yellow] {escape(u)}", soft_wrap=True)


def _ci_reports(args, verdict) -> int:
    """Write --junit-xml and append the GitHub step summary when $GITHUB_STEP_SUMMARY is set, both from
    ``verdict``. Returns the exit status (a report that cannot be written adds 2; a finding still outranks it)."""
    from validate.ci_formats import append_github_summary, github_summary, write_junit

    from validate.verdict import release_check

    if getattr(args, "junit_xml", None):
        try:
            path = write_junit(args.junit_xml, verdict)
            console.print(f"JUnit report: {path}")
        except OSError as e:
            why = f"cannot write the JUnit report {args.junit_xml}: {e.strerror or e}"
            console.print(f"[red]error: {why}[/red]")
            verdict.checks.append(release_check("junit", why))  # the summary and the exit status say it too
    if append_github_summary(github_summary(verdict)) is False:
        console.print("[yellow]warning: cannot append to $GITHUB_STEP_SUMMARY[/yellow]")
    return verdict.exit_code()


def cmd_suite(args) -> int:
    from validate.record import release_records
    from validate.verdict import assess, release_check

    ext = None
    if args.config is None:
        if args.url:
            ext = _external(_opts(args), args)
            console.print(f"--url without --config: records go under the configuration {ext.name!r}")
        args.config = ext.name if ext else "cpu-smol"
    outcome, tree = _run([(args.config, [args.name])], args.release, args, external=ext)
    skipped: list[str] = []  # another file of the release folder that is no record: this run's verdict still holds
    release_records(_opts(args).reports, args.release, skipped=skipped)
    extra = [release_check("records", f"the release folder holds a file that is not its record: {w}") for w in skipped]
    verdict = assess(args.release, outcome.records, tree=tree, extra=extra, what="suite")
    return _finish(args, verdict)


def cmd_render(args) -> int:
    from validate.suite import load_checklist
    from validate.verdict import assess_release

    root = _root()
    reports = Path(args.reports) if args.reports else root / "reports"
    if not (reports / args.release).is_dir():
        raise InputError(f"no records for {args.release} under {reports}")
    if args.baseline and args.baseline != "none" and not (reports / args.baseline).is_dir():
        raise InputError(f"--baseline {args.baseline}: no records under {reports / args.baseline}")
    checklist = load_checklist(root)
    verdict = assess_release(reports, args.release, root=root, baseline=args.baseline, planned=checklist.plan())
    out = _render(root, reports, args.release, checklist, verdict)
    print_verdict(verdict)
    console.print(f"release notes: {out}")
    console.print(f"the release's verdict: exit status {verdict.exit_code()} ({verdict.why()}); render itself exits 0")
    return 0


def print_verdict(verdict) -> None:
    """The verdict's table: a row per check (configuration, check, outcome, its figures or why)."""
    from validate.suite import discover

    from rich.markup import escape

    runners = discover()
    t = Table(title=f"{verdict.release}: the {verdict.what}'s verdict")
    for col in ("configuration", "check", "profile", "verdict", "key figures / why"):
        t.add_column(col)
    style = {"pass": "green", "finding": "red", "not-checked": "red", "limited": "yellow"}
    from validate.verdict import OUTCOME_WORD

    for c in verdict.checks:
        r = c.record if c.area == "suite" else None
        figures = ""
        runner = runners.get(r.suite_kind) if r is not None else None
        if r is not None and r.metrics and runner is not None and runner.summary:
            try:
                figures = runner.summary(r)
            except (KeyError, TypeError, ValueError):
                figures = ""
        word = OUTCOME_WORD[c.outcome] + (f" ({c.status})" if c.status not in ("pass", "") else "")
        if c.outcome == "pass" and c.limits:
            word += ", limited"
        why = figures if c.outcome == "pass" and figures else (c.message or c.limits or "")
        t.add_row(escape(c.config), escape(c.name), r.profile if r is not None else "",
                  f"[{style[c.outcome]}]{escape(word)}[/{style[c.outcome]}]", escape(why[:120]))
    console.print(t)
    for x in verdict.identity:  # a figure beside the verdict, not a check
        apart = (f"; the others part at {x.unit} {x.first_apart[0]} first, {x.median_apart:g} median"
                 if x.first_apart else "")
        left = ", ".join(f"{k} {why}" for why, k in x.left_out.items())
        if x.partings:  # near-tie: within bf16 rounding of the logits (validate.margins)
            apart += (f"; partings {x.near_ties} near-tie, {len(x.clear)} clear, "
                      f"{sum(x.unclassified.values())} not classified")
            apart += "".join(f"; clear: {item} {p.describe()}" for item, p in x.clear[:3])
        what = (f"not compared: {x.refused}" if x.refused else
                f"{x.identical} of {x.n} identical{apart}" + (f" (left out: {left})" if left else "") if x.n else
                "no answer compared" + (f": {left}" if left else ""))
        console.print(f"greedy answers against {escape(str(verdict.baseline))}: {escape(x.config)}/{escape(x.suite)}"
                      f"{' (' + x.part + ')' if x.part else ''} {escape(what)}")
    for c in verdict.checks:  # the table cuts its cells: what blocks the release is said whole
        if c.outcome in ("finding", "not-checked"):
            console.print(f"[{style[c.outcome]}]{escape(f'{c.config}/{c.name}: {c.message}')}[/{style[c.outcome]}]",
                          soft_wrap=True)


def _alpha(text: str) -> float:
    try:
        a = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not 0 < a < 1:
        raise argparse.ArgumentTypeError(f"{text} is not in (0, 1)")
    return a


def _comparison(args):
    from validate.compare import compare_releases

    reports = Path(args.reports) if args.reports else _root() / "reports"
    return compare_releases(reports, args.release, args.against, configs=args.config, tasks=args.task,
                            against_config=args.against_config, alpha=args.alpha,
                            across_thinking=args.pair_across_thinking,
                            reports_baseline=Path(args.baseline_reports) if args.baseline_reports else None)


def print_comparison(cmp) -> None:
    """The paired table: accuracy each, right-only counts each way, p, identical share, flipped ids."""
    t = Table(title=f"{cmp.candidate} against {cmp.baseline} (paired per question; Holm across {len(cmp.tasks)} task(s))")
    for col in ("configuration", "task", "n", cmp.baseline, cmp.candidate, "right only base / cand",
                "McNemar p (two-sided)", "p regression (Holm)", "identical outputs", "verdict"):
        t.add_column(col)
    for x in cmp.tasks:
        cfg = x.config if x.config == x.baseline_config else f"{x.config} vs {x.baseline_config}"
        t.add_row(escape(cfg), escape(x.task + (" (subset)" if x.subset else "")), f"{x.n:,}",
                  f"{100 * x.acc_baseline:.2f}% ({x.correct_baseline:,})", f"{100 * x.acc_candidate:.2f}% ({x.correct_candidate:,})",
                  f"{x.b} / {x.c}", f"{x.p_two_sided:.3g}", f"{x.p_holm:.3g}", f"{100 * x.identical_share:.1f}%",
                  "[red]regression[/red]" if x.regression else escape(x.verdict_text))
    console.print(t)
    for x in cmp.tasks:
        if x.diff_ci:
            console.print(escape(f"{x.config}/{x.task}: difference "
                                 f"{100 * (x.correct_candidate - x.correct_baseline) / x.n:+.1f} points, 95% interval "
                                 f"{100 * x.diff_ci[0]:+.1f} to {100 * x.diff_ci[1]:+.1f}; {x.sensitivity}"))
    for x in cmp.tasks:
        if x.lost or x.gained:
            console.print(escape(f"{x.config}/{x.task}: right only in {cmp.baseline}: {', '.join(x.lost[:40]) or '-'}"
                                 + (" ..." if len(x.lost) > 40 else "")), soft_wrap=True)
            console.print(escape(f"{x.config}/{x.task}: right only in {cmp.candidate}: "
                                 f"{', '.join(x.gained[:40]) or '-'}" + (" ..." if len(x.gained) > 40 else "")),
                          soft_wrap=True)
    for u in cmp.unpaired:
        console.print(f"[yellow]not paired:[/yellow] {escape(u)}", soft_wrap=True)


def cmd_compare(args) -> int:
    cmp = _comparison(args)
    print_comparison(cmp)
    return 0 if cmp.tasks else 2


def _gate_tree(args, kinds: set[str]):
    """Checks that the candidate's records of ``kinds`` were made by this checkout's tree (verdict.tree_checks)."""
    from validate.provenance_checks import current_tree
    from validate.record import release_records
    from validate.verdict import audit_records, reapply_gates, tree_checks

    reports = Path(args.reports) if args.reports else _root() / "reports"
    recs = [r for r in release_records(reports, args.release, skipped=[])
            if r.suite_kind in kinds and (not args.config or r.config in args.config)]
    what = "performance gate" if args.perf else "paired gate"
    recs = reapply_gates(recs, _root())
    audit_records(recs, reports)  # the one audit (validate.audit), after the checkout's gates as release reads them
    return tree_checks(recs, current_tree(_root()), args.accept_other_tree, what)


def cmd_gate(args) -> int:
    """The eval gate (default) or, with --perf, the performance gate. 0: nothing regressed; 1: something did
    (named), even beside tasks that could not be compared; 2: nothing, or not everything, could be compared, or
    the candidate's records were made by another tree (unless --accept-other-tree)."""
    from validate.suite import paired_eval_kinds
    from validate.verdict import assess

    if args.perf:
        return _perf_gate(args)
    cmp = _comparison(args)
    print_comparison(cmp)
    for x in cmp.tasks:
        if x.regression:
            console.print(f"[red]gate: {escape(x.config)}/{escape(x.task)} regressed: {x.b} lost vs {x.c} gained, one-sided p = "
                          f"{x.p_one_sided:.3g}, Holm-adjusted {x.p_holm:.3g} < alpha {cmp.alpha}[/red]")
    if cmp.unpaired:
        console.print(f"[red]gate: {len(cmp.unpaired)} task(s) cannot be paired[/red]")
    verdict = assess(args.release, [], comparison=cmp, baseline=args.against, baseline_why="named with --against",
                     extra=_gate_tree(args, paired_eval_kinds()), strict=True, what="gate")
    return _finish(args, verdict)


def _perf_gate(args) -> int:
    """``gate --perf``: the performance gate on BetterBench records and the share gates (the SLO share at the
    baseline's rate, draft acceptance) on audited records of both releases (``--baseline-reports`` for the
    baseline's folder). Raises InputError when the candidate is its own baseline or has neither BetterBench nor
    arrivals records."""
    from validate.errors import InputError
    from validate.loadgate import ARRIVALS_KIND, compare_shares
    from validate.perfgate import BENCH_KIND, compare_perf
    from validate.suite import perf_gate_specs, share_gate_specs
    from validate.verdict import assess, baseline_lacks, read_release, release_check

    reports = Path(args.reports) if args.reports else _root() / "reports"
    base_reports = Path(args.baseline_reports) if args.baseline_reports else reports
    # both sides read by the one audit (validate.audit): every gate below judges only records that stand
    cand = [r for r in read_release(reports, args.release, skipped=[]) if not args.config or r.config in args.config]
    base = read_release(base_reports, args.against, skipped=[])
    kinds = {r.suite_kind for r in cand}
    perf = None
    if BENCH_KIND in kinds or ARRIVALS_KIND not in kinds:  # neither: compare_perf says there is nothing to gate
        perf = compare_perf(reports, args.release, args.against, perf_gate_specs(_root()), configs=args.config,
                            reports_baseline=Path(args.baseline_reports) if args.baseline_reports else None,
                            base_config=args.against_config, records=cand, base_records=base)
        print_perf(perf)
    elif args.release == args.against and base_reports.resolve() == reports.resolve():
        raise InputError(f"{args.release} against itself: a release is never its own baseline")
    shares = compare_shares(args.release, cand, args.against, base, share_gate_specs(_root()), configs=args.config)
    shares = _judge_identity(args, cand, base, shares)
    extra = _gate_tree(args, {BENCH_KIND, ARRIVALS_KIND})
    if perf is None:  # the candidate holds no BetterBench record: the baseline's are named, never left out
        extra += baseline_lacks(cand, base, {BENCH_KIND}, "perf", "perf", args.config, strict=True)
    if not shares.figures and not shares.unpaired and (perf is None or not (perf.figures or perf.unpaired
                                                                            or perf.limited)):
        extra.append(release_check("performance gate", "no figure to compare"))
    verdict = assess(args.release, [], perf=perf, shares=shares, baseline=args.against,
                     baseline_why="named with --against", extra=extra, strict=True, what="gate --perf")
    return _finish(args, verdict)


def _judge_identity(args, cand: list, base: list, shares):
    """``shares`` with the identity of a random-weight configuration's greedy answers with the baseline's, judged
    against the baseline's noise floor (validate.loadgate.judge_identity), as ``release`` and ``render`` judge
    it: the one verdict, whichever command reads the records."""
    from validate.identity import compare_releases_outputs
    from validate.loadgate import judge_identity
    from validate.provenance_checks import current_tree
    from validate.suite import share_gate_specs
    from validate.verdict import other_tree

    tree = current_tree(_root())

    def stands(r) -> str | None:
        why = None if args.accept_other_tree else other_tree(r, tree)
        return f"the record was made by another tree ({why})" if why else None

    mine = [r for r in cand if not args.config or r.config in args.config]
    rows = compare_releases_outputs(mine, base, stands=stands)
    figs, lim = judge_identity(rows, mine, base, args.against, share_gate_specs(_root()))
    shares.figures += figs
    shares.limited += lim
    return shares


def cmd_attribution(args) -> int:
    """``attribution``: the table of each knob set's release against the baseline (validate.attribution). 0: every
    release compared; 2: something was refused (named: a record that fails its audit, a pair the gates refuse)."""
    from validate.attribution import HEADERS, attribute, markdown, table_rows
    from validate.suite import perf_gate_specs

    reports = Path(args.reports) if args.reports else _root() / "reports"
    a = attribute(reports, args.config, args.baseline, args.releases, perf_gate_specs(_root()),
                  base_config=args.against_config,
                  reports_baseline=Path(args.baseline_reports) if args.baseline_reports else None)
    t = Table(title=escape(f"{', '.join(a.releases)} against {a.baseline} "
                           f"({', '.join(a.knob_sets.get(a.baseline, []))}) on {a.config}"
                           + (f" (baseline: {a.base_config})" if a.base_config != a.config else "")))
    for col in HEADERS:
        t.add_column(col)
    style = {"slower": "red", "faster": "green", "cannot tell": "yellow"}
    for row, r in zip(table_rows(a), a.rows):
        s = style.get(r.mark)
        t.add_row(*[escape(c) for c in row[:5]], f"[{s}]{escape(row[5])}[/{s}]" if s else escape(row[5]), row[6])
    console.print(t)
    for x in a.notes:
        console.print(f"[dim]note: {escape(x)}[/dim]", soft_wrap=True)
    for x in a.refused:
        console.print(f"[red]not compared: {escape(x)}[/red]", soft_wrap=True)
    if args.markdown:
        Path(args.markdown).write_text(markdown(a))
        console.print(f"markdown: {args.markdown}")
    if a.refused:
        return _exit(2, f"{len(a.refused)} comparison(s) refused")
    return _exit(0, f"{len(a.rows)} figure(s) of {len(a.releases)} release(s) against {a.baseline}")


def cmd_configs(args) -> int:
    from validate.config import all_configs

    t = Table(title="serving configurations (serve/)")
    for col in ("name", "model", "tp", "max_num_seqs", "max_model_len", "hardware", "knob sets (--knobs)",
                "description"):
        t.add_column(col)
    for c in all_configs(_root()):
        model = c.model.path or (f"{c.model.prepare.distribution}:{c.model.prepare.file}" if getattr(c.model.prepare, "file", None)
                                 else c.model.source_name() or "")
        sets = "; ".join(f"{n}: {', '.join(ks)}" for n, ks in c.knob_sets.items()) or "–"
        t.add_row(c.name, model, str(c.server.tensor_parallel_size), str(c.server.max_num_seqs),
                  str(c.server.max_model_len), f"{c.hardware.gpus}x {c.hardware.kind}" if c.hardware.gpus else c.hardware.kind,
                  sets, c.description)
    console.print(t)
    return 0


def cmd_suites(args) -> int:
    from validate.suite import get_runner, load_checklist, load_suite, suites_dir

    root = _root()
    t = Table(title="suites (suites/)")
    for col in ("name", "kind", "server", "gate", "description"):
        t.add_column(col)
    for p in sorted(suites_dir(root).glob("*.yaml")):
        if p.stem == "release":
            continue
        s = load_suite(p).spec
        gate = ", ".join([f"{k} <= {v:g}" for k, v in s.gate.max.items()] + [f"{k} >= {v:g}" for k, v in s.gate.min.items()])
        if not gate and get_runner(s.kind).paired_eval:
            gate = "paired McNemar vs the baseline (release, gate)"
        t.add_row(s.name, s.kind, "yes" if s.needs_server else "no", gate or "–", s.description)
    console.print(t)
    cl = load_checklist(root)
    console.print("checklist (suites/release.yaml): " + "; ".join(f"{c}: {', '.join(s)}" for c, s in cl.plan()))
    return 0


def cmd_knobs(args) -> int:
    from r9k.knobs import KNOBS

    t = Table(title="R9K_* knobs")
    for col in ("name", "type", "default", "stock value", "what it does"):
        t.add_column(col)
    for k in KNOBS.values():
        t.add_row(k.name, k.type.__name__, str(k.default), str(k.stock), k.help)
    console.print(t)
    return 0


def _common(p: argparse.ArgumentParser, run: bool = True) -> None:
    p.add_argument("--reports", help="records folder (default: reports/ in the checkout)")
    if not run:
        return
    p.add_argument("--profile", choices=["quick", "full"], default="full", help="quick: smaller, for CI and smoke runs")
    p.add_argument("--data-dir", help="evaluation data (default: $R9K_DATA_DIR, else ../shared/data beside the checkout)")
    p.add_argument("--model-cache", help="where prepared models are kept (default: $R9K_MODEL_CACHE or the user cache)")
    p.add_argument("--url", help="run against this already running server instead of launching one")
    p.add_argument("--model", help="with --url: the served model name")
    p.add_argument("--server-log", help="with --url: the server's log, to check the plugin's provenance line")
    p.add_argument("--launch-timeout", type=float, help="seconds a server may take to become ready (overrides "
                   "the configuration's launch_timeout_s; a first start on a busy machine compiles slowly)")
    p.add_argument("--knobs", type=_knob_set, default="config", metavar="{config,stock,SET}", help="config: each "
                   "configuration's env; stock: every R9K_* knob at its stock value (r9k loaded, dispatching nothing): "
                   "the stock side of an r9k-against-stock pair on one configuration; SET: a knob set of the "
                   "configuration (its knob_sets; `configs` lists them): those knobs at the configuration's values, "
                   "every other knob stock")


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="r9k-validate", description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("release", help="every suite of the checklist on every (or the named) configuration")
    p.add_argument("release")
    p.add_argument("--config", action="append", help="only this configuration (repeatable)")
    p.add_argument("--suite", action="append", help="only this suite of the checklist (repeatable)")
    p.add_argument("--executor", choices=["local", "ray"], default="local",
                   help="local: configurations one after another here; ray: as Ray tasks placed by hardware")
    p.add_argument("--address", help="with --executor ray: the cluster (default: RAY_ADDRESS, else a local one)")
    p.add_argument("--resume", action="store_true", help="skip suites whose complete record for this tree exists")
    p.add_argument("--baseline", help="release to compare with (default: the previous release under reports/ that "
                                      "holds an eval or BetterBench record; 'none': no baseline)")
    p.add_argument("--junit-xml", metavar="FILE", help="also write the verdicts as JUnit XML (one testcase per "
                   "configuration and suite, and per gated task and figure)")
    p.add_argument("--accept-other-tree", action="store_true", help="let records another tree made (left in the "
                   "release folder) count, named as such, instead of making the release exit 2")
    _common(p)
    p.set_defaults(fn=cmd_release)
    p = sub.add_parser("suite", help="one suite on one configuration")
    p.add_argument("name")
    p.add_argument("--config", help="serving configuration (default: cpu-smol, the embedded default; with --url, one "
                   "named after that server and its model)")
    p.add_argument("--max-num-seqs", type=_positive_int, help="with --url and no --config: the server's max_num_seqs")
    p.add_argument("--max-model-len", type=_at_least_16, help="with --url and no --config: the server's max_model_len "
                   "(default: what its /v1/models says)")
    p.add_argument("--release", default="dev", help="records go to reports/<release>/ (default: dev)")
    p.add_argument("--junit-xml", metavar="FILE", help="also write the verdict as JUnit XML")
    _common(p)
    p.set_defaults(fn=cmd_suite)
    p = sub.add_parser("render", help="render reports/<release>/RELEASE.md from records")
    p.add_argument("release")
    p.add_argument("--baseline", help="release to compare with (default: the previous release under reports/ that "
                                      "holds an eval or BetterBench record; 'none': no baseline)")
    _common(p, run=False)
    p.set_defaults(fn=cmd_render)
    for name, fn, hlp in (("compare", cmd_compare, "paired per-question comparison of two releases' evals"),
                          ("gate", cmd_gate, "exit 1 when an eval regressed significantly (McNemar, Holm)")):
        p = sub.add_parser(name, help=hlp)
        p.add_argument("release", help="the candidate release")
        p.add_argument("--against", required=True, help="the baseline release")
        p.add_argument("--config", action="append", help="only this candidate configuration (repeatable)")
        p.add_argument("--against-config", help="the baseline's configuration, when it differs (e.g. bf16 vs fp32)")
        p.add_argument("--task", action="append", help="only this eval suite, e.g. gsm8k (repeatable)")
        p.add_argument("--alpha", type=_alpha, default=0.05, help="significance level, in (0, 1)")
        p.add_argument("--baseline-reports", help="folder holding the baseline's records (default: --reports)")
        p.add_argument("--pair-across-thinking", action="store_true", help="pair a thinking model's evals with "
                       "those of one that does not think, or across end-of-thinking markers (refused otherwise)")
        if name == "gate":
            p.add_argument("--perf", action="store_true", help="the performance gate on BetterBench records and the "
                           "share gates (SLO share, draft acceptance) instead of the paired eval gate")
            p.add_argument("--junit-xml", metavar="FILE", help="also write the gate's result as JUnit XML")
            p.add_argument("--accept-other-tree", action="store_true", help="gate candidate records another tree "
                           "made (named as such) instead of exiting 2")
        _common(p, run=False)
        p.set_defaults(fn=fn)
    p = sub.add_parser("attribution", help="what each knob set's release moves against a baseline: BetterBench's "
                       "gated figures, the probe's and the soak's, with the performance gate's marks")
    p.add_argument("--config", required=True, help="the configuration the releases ran (e.g. h200-next)")
    p.add_argument("--baseline", required=True, help="the baseline release (e.g. the --knobs stock run)")
    p.add_argument("--releases", nargs="+", required=True, help="the candidate releases, one a knob set (e.g. gdn "
                   "moe r9k)")
    p.add_argument("--against-config", help="the baseline's configuration, when it differs (the memory pair: "
                   "h200-next-offload)")
    p.add_argument("--baseline-reports", help="folder holding the baseline's records (default: --reports)")
    p.add_argument("--markdown", metavar="FILE", help="also write the table as Markdown")
    _common(p, run=False)
    p.set_defaults(fn=cmd_attribution)
    for name, fn, hlp in (("configs", cmd_configs, "list serving configurations"),
                          ("suites", cmd_suites, "list suites and the checklist"),
                          ("knobs", cmd_knobs, "list the R9K_* knobs")):
        p = sub.add_parser(name, help=hlp)
        p.set_defaults(fn=fn)
    return ap


def _sigterm(signum, frame):
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    signal.signal(signal.SIGTERM, _sigterm)  # teardown runs on SIGTERM as on Ctrl-C
    if argv is None:  # as a program: a signal state inherited from the parent (SIGINT ignored or blocked, as a
        # launcher's worker may hand down) must not make Ctrl-C's teardown impossible
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT, signal.SIGTERM})
        if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
            signal.signal(signal.SIGINT, signal.default_int_handler)
    reports = args.cmd in ("release", "suite", "gate")  # the commands that write JUnit and the step summary
    try:
        return args.fn(args)
    except InputError as e:
        console.print(f"[red]error:[/red] {escape(str(e))}", soft_wrap=True)
        return _exit(_stopped(args, f"bad input: {e}") if reports else 2, f"bad input: {e}")
    except LaunchError as e:
        console.print(f"[red]launch failed:[/red] {escape(str(e))}", soft_wrap=True)
        return _exit(_stopped(args, f"launch failed: {e.cause}") if reports else 2, f"launch failed: {e.cause}")
    except ReportsError as e:
        console.print(f"[red]error:[/red] {escape(str(e))}", soft_wrap=True)
        return _exit(_stopped(args, str(e)) if reports else 2, str(e))
    except KeyboardInterrupt:
        console.print("[yellow]interrupted: servers stopped, records written so far are kept[/yellow]")
        return _stopped(args, "interrupted before the verdict: the records written so far are kept",
                        interrupted=True) if reports else 130
    except Exception as e:  # a fault no check foresaw: said, attributed, and never an exit status of 0 or 1
        import traceback

        where = traceback.extract_tb(e.__traceback__)[-1]
        why = f"internal error: {type(e).__name__}: {e} (at {Path(where.filename).name}:{where.lineno})"
        console.print(f"[red]error:[/red] {escape(why)}", soft_wrap=True)
        return _exit(_stopped(args, why) if reports else 2, why)


if __name__ == "__main__":
    sys.exit(main())

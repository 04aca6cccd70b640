"""One audit of a record, wherever it is read: the candidate's and the baseline's alike, by ``gate``, ``gate
--perf``, the share gates, ``render``, ``release`` (``--resume`` included), the identity table and the figures.

A record is never trusted for what it says of itself. :func:`audit_record` re-derives from the data the record
holds what the runner and the engine would have said of it, by their own rules (each rule has one source, called
by the runner or the engine when the record is written and by the audit when it is read):

- its kind's own audit (``Runner.audit``: items judged again, counts recounted, a soak's memory series and
  request counts by :func:`validate.runners.soak.derived_findings` and :func:`validate.runners.soak.outcome_errors`,
  ...), and for the kinds that read them, its params and configuration against the hashes it holds;
- its dataset: a subset label the counts do not give (a full set relabelled ``subset`` would read as the run's
  own choice, never blocking);
- its server (for a completed record, pass or fail): counters that went backwards during the suite (it
  restarted), provenance that did not match its own tree or names another plugin source;
- its dispatch (for a completed record of a server whose log was read): a dispatch the configuration's knobs ask
  for missing from its provenance lines (:func:`validate.provenance_checks.check_dispatch`, the engine's
  "plugin-inactive" rule at launch), and one that routed no call to r9k in the suite's steps where it applies
  while sending a call it should have taken back to vLLM (:func:`validate.provenance_checks.check_calls`, the
  engine's rule when it writes the record; calls its own rule declines are no finding); a record that
  lacks the lines or the counts these rest on is refused, never trusted.

A record with a reason is not checked (``Record.audit_failed``: the reasons joined, one line): the verdict names
it, and no gate, Numbers table, title or figure pairs or draws it. Out of reach: a forger who rewrites data, flags
and counts consistently (records are not signed).
"""
from __future__ import annotations

from pathlib import Path

from r9k import knobs
from r9k import provenance as prov

from validate.config import record_weights
from validate.provenance_checks import check_calls, check_dispatch
from validate.record import Record, release_records
from validate.suite import config_digest, get_runner, params_digest

#: Verdicts of a suite that ran to its end: what gates pair and the notes show figures of.
COMPLETED = ("pass", "fail")


def kind_reasons(rec: Record, folder: Path) -> list[str]:
    """Why the record does not stand by its kind's own audit (``Runner.audit``, reading attachments from
    ``folder``) and, for a kind that reads its params and configuration, their hashes; a kind that cannot be found
    audits nothing, an audit that raises says so."""
    try:
        runner = get_runner(rec.suite_kind)
    except KeyError:
        return []
    if runner.audit is None:
        return []
    try:
        why = list(runner.audit(rec, folder))
    except Exception as e:  # noqa: BLE001 - a record edited by hand that no audit foresaw: said, never a pass
        why = [f"what it holds could not be checked ({type(e).__name__}: {e})"]
    if runner.audit_hashes and params_digest(rec.params) != rec.params_hash:  # the audits read their params
        why.insert(0, f"its params do not match the params_hash {rec.params_hash!r} it holds (edited)")
    if runner.audit_hashes and rec.config_snapshot and config_digest(rec.config_snapshot) != rec.config_hash:
        why.insert(0, f"its config_snapshot does not match the config_hash {rec.config_hash!r} it holds (edited)")
    return why


def dataset_reasons(rec: Record) -> list[str]:
    """Why the record's dataset label is not what its counts give: a subset is fewer items than the set (the
    runners' rule: ``subset = n_used < n_total``), and a record with items used as many as it holds."""
    d = rec.dataset
    if d is None:
        return []
    out = []
    if d.subset and d.n_used >= d.n_total:
        out.append(f"it is labelled a subset, but it used {d.n_used:,} of {d.n_total:,} items: the full set")
    if rec.items and d.n_used != len(rec.items):
        out.append(f"its dataset says {d.n_used:,} items used, it holds {len(rec.items):,}")
    return out


def restarts(rec: Record) -> list[str]:
    """The server counters that went backwards during the suite (``server_metrics.delta.resets``): the server
    restarted, so the suite's measurements straddle two servers."""
    sm = rec.server_metrics if isinstance(rec.server_metrics, dict) else {}
    d = sm.get("delta") if isinstance(sm.get("delta"), dict) else {}
    resets = d.get("resets") if isinstance(d.get("resets"), list) else []
    return [str(x) for x in resets]


def other_sources(rec: Record) -> list[str]:
    """The plugin sources the record's server printed (its provenance lines) other than the record's own tree's:
    whoever launched it, that server ran another tree."""
    if not rec.server.provenance or not rec.tree.source_hash:
        return []
    return sorted({p.source_hash for p in prov.parse("\n".join(rec.server.provenance))} - {rec.tree.source_hash})


def server_reasons(rec: Record) -> list[str]:
    """Why a completed record's server evidence does not let it stand: a restart during the suite, provenance that
    did not match its tree, or lines of another plugin source."""
    if rec.verdict.status not in COMPLETED:
        return []
    out = []
    gone = restarts(rec)
    if gone:
        out.append(f"its server's counters went backwards during the suite ({', '.join(gone)}): it restarted")
    wrong = other_sources(rec)
    if wrong:
        out.append(f"its server printed plugin source {', '.join(wrong)}, not the record's {rec.tree.source_hash}")
    elif rec.server.provenance_ok is False:
        out.append("its server's provenance did not match the tree it was made by")
    return out


def _dispatch_asked(rec: Record) -> tuple[dict[str, str], dict[str, str]] | None:
    """(the configuration's env as run, the dispatches its knobs ask for) of a completed record whose server's log
    was read (launched, or ``--server-log``) and whose configuration expects the plugin; None where the rules do not
    apply (no server, an external one whose provenance was not verified: a limit of the record). Raises
    ValueError: a knob value its knob rejects."""
    if rec.verdict.status not in COMPLETED:
        return None
    snap = rec.config_snapshot if isinstance(rec.config_snapshot, dict) else {}
    if snap.get("expects_plugin") is False:
        return None
    if not (rec.server.launched or (rec.server.url and rec.server.provenance_ok is not None)):
        return None
    env = snap.get("env") if isinstance(snap.get("env"), dict) else rec.env
    env = {str(k): str(v) for k, v in env.items()}
    return env, knobs.expected_dispatch({k: v for k, v in env.items() if k.startswith("R9K_")})


def snapshot_reasons(rec: Record) -> list[str]:
    """Why a completed record's configuration snapshot cannot be what it ran, where the dispatch is judged from it:
    the record's ``env`` sets an ``R9K_*`` knob the snapshot's env does not, or the snapshot says the configuration
    expects no plugin while its knobs ask for a dispatch (a configuration file the loader refuses). A record that
    holds no env, or no snapshot, is judged by what it holds. (Kinds that audit their hashes also check the whole
    snapshot against ``config_hash``: :func:`kind_reasons`.)"""
    snap = rec.config_snapshot
    if rec.verdict.status not in COMPLETED or not isinstance(snap, dict) or not snap:
        return []
    out = []
    senv = snap.get("env") if isinstance(snap.get("env"), dict) else {}
    knob = {str(k): str(v) for k, v in (rec.env or {}).items() if str(k).startswith("R9K_")}
    sknob = {str(k): str(v) for k, v in senv.items() if str(k).startswith("R9K_")}
    if knob and knob != sknob:  # a record that holds its env (the engine writes it) holds the snapshot's knobs
        moved = sorted(k for k in set(knob) | set(sknob) if knob.get(k) != sknob.get(k))
        out.append(f"its env and its config_snapshot's env set the knobs {', '.join(moved)} apart (edited)")
    if snap.get("expects_plugin") is False:
        try:
            asked = knobs.expected_dispatch(sknob or knob)
        except ValueError:
            asked = {}
        if asked:
            out.append(f"its config_snapshot expects no plugin, but its knobs ask for {', '.join(sorted(asked))} "
                       "(a configuration the loader refuses: edited)")
    return out


def dispatch_reasons(rec: Record) -> list[str]:
    """Why a completed record whose configuration asks for an r9k dispatch does not stand: its provenance lines do
    not show the dispatch installed in every server process (:func:`check_dispatch`), its call counts show it
    routed no call to r9k in steps where it applies while sending one it should have taken to vLLM
    (:func:`check_calls`), or it lacks the lines, the counts or a
    configuration these are judged by (refused, never trusted)."""
    try:
        asked = _dispatch_asked(rec)
    except ValueError as e:
        return [f"its configuration's knobs cannot be read ({e})"]
    if asked is None or not asked[1]:
        return []
    env, want = asked
    says = f"the record says {rec.verdict.status}, but"
    names = ", ".join(f"{n} ({k})" for n, k in want.items())
    if not prov.parse("\n".join(rec.server.provenance)):
        return [f"{says} its server printed no provenance line: the dispatch its knobs ask for ({names}) cannot be "
                "seen installed"]
    from validate.config import ServeConfig

    try:
        cfg = ServeConfig.model_validate(rec.config_snapshot)
    except Exception as e:  # noqa: BLE001 - any malformed snapshot: what the dispatch is judged by is missing
        return [f"{says} its config_snapshot is not a configuration ({type(e).__name__}), so the dispatch its knobs "
                f"ask for ({names}) cannot be checked against its provenance lines"]
    out = []
    why = check_dispatch(cfg, rec.server.provenance)
    if why:
        out.append(f"{says} its provenance lines give plugin-inactive: {why}")
    try:
        unrouted, _ = check_calls(env, rec.r9k_calls)
    except ValueError as e:
        out.append(f"{says} whether the dispatch its knobs ask for ({names}) routed any call to r9k cannot be seen: {e}")
    else:
        if unrouted:
            out.append(f"{says} its call counts give plugin-inactive: " + "; ".join(unrouted))
    return out


def never_exercised(rec: Record) -> list[str]:
    """The dispatches the record's configuration asks for that no step of a kind they apply to exercised during
    the suite (no such step, every call beyond the dispatch's rule, or counts that cannot tell: :func:`check_calls`),
    one line each, naming the record; [] where the counts cannot be read."""
    try:
        asked = _dispatch_asked(rec)
        if asked is None or not asked[1]:
            return []
        _, never = check_calls(asked[0], rec.r9k_calls)
    except ValueError:
        return []
    return [f"{rec.config}/{rec.suite}: {x}" for x in never]


def audit_record(rec: Record, folder: Path) -> list[str]:
    """Every reason ``rec`` (read from ``folder``) does not stand on what it holds (module docstring); [] when it
    does."""
    claim = record_weights(rec)[1]  # random weights its snapshot does not give: its kind's audit judges it as trained
    why = [claim] if claim else []
    why += kind_reasons(rec, folder)
    why += [w for w in snapshot_reasons(rec) if w not in why]  # a kind auditing its hashes said the first already
    return why + dataset_reasons(rec) + server_reasons(rec) + dispatch_reasons(rec)


def audit_records(records: list[Record], reports: Path) -> None:
    """Set ``Record.audit_failed`` (the reasons of :func:`audit_record`, joined) on each record of ``records`` read
    from ``reports`` that does not stand on what it holds."""
    from validate.record import record_path

    for r in records:
        try:
            folder = record_path(reports, r.release, r.config, r.suite).parent
        except Exception:  # noqa: BLE001 - a name no path can hold: no attachment can be read either
            folder = reports
        why = audit_record(r, folder)
        r.audit_failed = "; ".join(why) if why else None


def read_release(reports: Path, release: str, skipped: list[str] | None = None) -> list[Record]:
    """Every record of ``release`` under ``reports`` (:func:`validate.record.release_records`, ``skipped`` as
    there), each audited (:func:`audit_records`): how every command reads a release, the candidate's and the
    baseline's alike."""
    records = release_records(reports, release, skipped=skipped)
    audit_records(records, reports)
    return records

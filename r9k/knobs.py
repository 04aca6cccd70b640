"""The one registry of ``R9K_*`` environment variables.

Every knob the plugin reads is declared here once: its name, type, default, the value that restores stock
vLLM behaviour, and what it does. Code reads knobs only through :func:`get`, so ``r9k-validate knobs`` and
the records (which store the knobs in force) can never miss one.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Callable


@dataclass(frozen=True)
class Knob:
    """One ``R9K_*`` variable.

    Attributes:
        name: the environment variable, ``R9K_`` prefixed.
        type: ``int``, ``float``, ``bool`` or ``str``; values are parsed with it.
        default: value when the variable is unset.
        stock: value that restores stock vLLM (the plugin does nothing for this knob).
        help: one line: what it does, with units.
        choices: allowed values for ``str`` knobs (None = any).
        dispatch: the op dispatch (an ``r9k.ops`` name such as ``gdn_seq``) that a non-stock value of this knob
            needs in the server: a configuration that sets it so refuses a server whose provenance lines do not
            list that dispatch ("plugin-inactive"). None for knobs that route nothing.
        check: a parsed value's range check: returns why the value is refused (the error then names the variable),
            or None when it is allowed. None: every value of the type is allowed.
    """

    name: str
    type: type
    default: Any
    stock: Any
    help: str
    choices: tuple[str, ...] | None = None
    dispatch: str | None = None
    check: Callable[[Any], str | None] | None = None

    def parse(self, raw: str) -> Any:
        """Parse ``raw`` into the knob's type.

        Raises:
            ValueError: naming the variable when the text is not a valid value.
        """
        try:
            if self.type is bool:
                low = raw.strip().lower()
                if low in ("1", "true", "yes", "on"):
                    return True
                if low in ("0", "false", "no", "off", ""):
                    return False
                raise ValueError(raw)
            value = self.type(raw)
        except ValueError:
            raise ValueError(f"{self.name}={raw!r}: not a valid {self.type.__name__}") from None
        if self.choices is not None and value not in self.choices:
            raise ValueError(f"{self.name}={raw!r}: expected one of {', '.join(self.choices)}")
        why = self.check(value) if self.check is not None else None
        if why:
            raise ValueError(f"{self.name}={raw!r}: {why}")
        return value


KNOBS: dict[str, Knob] = {}


def register_knob(knob: Knob) -> Knob:
    """Add ``knob`` to the registry. Raises ValueError on a duplicate or a name without ``R9K_``."""
    if not knob.name.startswith("R9K_"):
        raise ValueError(f"knob {knob.name!r} must start with R9K_")
    if knob.name in KNOBS:
        raise ValueError(f"knob {knob.name} registered twice")
    KNOBS[knob.name] = knob
    return knob


def get(name: str, environ: dict[str, str] | None = None) -> Any:
    """Value of knob ``name`` from ``environ`` (default: ``os.environ``), or its default when unset.

    Raises:
        KeyError: the knob is not registered (a typo in code must not read an unregistered variable).
        ValueError: the variable is set to a value its type rejects.
    """
    knob = KNOBS[name]
    env = os.environ if environ is None else environ
    raw = env.get(name)
    return knob.default if raw is None else knob.parse(raw)


def in_force(environ: dict[str, str] | None = None) -> dict[str, Any]:
    """Every registered knob's effective value, plus any unregistered ``R9K_*`` variable as raw text.

    Unregistered variables are kept (prefixed ``?``) so a record shows a misspelt knob instead of hiding it.
    """
    env = os.environ if environ is None else environ
    out: dict[str, Any] = {}
    for name, knob in sorted(KNOBS.items()):
        raw = env.get(name)
        try:
            out[name] = knob.default if raw is None else knob.parse(raw)
        except ValueError:
            out[name] = f"invalid:{raw}"
    for name in sorted(env):
        if name.startswith("R9K_") and name not in KNOBS and name not in ENGINE_VARIABLES:
            out["?" + name] = env[name]
    return out


def closest(name: str) -> str | None:
    """The registered knob name nearest to ``name`` (difflib's ratio, at least 0.6), or None."""
    import difflib

    found = difflib.get_close_matches(name, list(KNOBS), n=1, cutoff=0.6)
    return found[0] if found else None


def check_env(env: dict[str, str]) -> dict[str, str]:
    """Problems with the ``R9K_*`` entries of ``env`` (a configuration's ``env``): {variable: why}.

    An unregistered ``R9K_*`` name (nothing reads it: a typo, or a knob r9k does not implement) and a value its
    knob's type rejects are problems; other variables are not looked at.
    """
    out = {}
    for name, raw in env.items():
        if not name.startswith("R9K_"):
            continue
        if name not in KNOBS:
            near = closest(name)
            out[name] = "not a registered R9K_* knob (nothing reads it)" + (f"; did you mean {near}?" if near else
                                                                        "; `r9k-validate knobs` lists them")
            continue
        try:
            KNOBS[name].parse(raw)
        except ValueError as e:
            out[name] = str(e)
    return out


def _family(dispatch: str) -> str:
    """The dispatch family of a dispatch name: ``gdn_seq`` and ``gdn_conv`` are both ``gdn``."""
    return dispatch.split("_", 1)[0]


def expected_dispatch(env: dict[str, str]) -> dict[str, str]:
    """{dispatch name: the knob asking for it} that a server of a configuration with ``env`` must install.

    A knob ``env`` sets to a non-stock value asks for its dispatch; and once a configuration asks for one dispatch
    of a family, every other knob of that family whose value in force (set, or its default) is non-stock asks for
    its own too (a GDN configuration that sets the prefill bound also runs the conv at its default, r9k).

    Raises:
        ValueError: a value its knob rejects (check with :func:`check_env` first).
    """
    out = {}
    for name, raw in sorted(env.items()):
        knob = KNOBS.get(name)
        if knob is not None and knob.dispatch and knob.parse(raw) != knob.stock:
            out.setdefault(knob.dispatch, f"{name}={raw}")
    families = {_family(d) for d in out}
    for name, knob in sorted(KNOBS.items()):
        if knob.dispatch and _family(knob.dispatch) in families and knob.dispatch not in out:
            value = knob.parse(env[name]) if name in env else knob.default
            if value != knob.stock:
                out[knob.dispatch] = f"{name}={value} ({'set' if name in env else 'its default'})"
    return out


#: Variables of the validation engine, not of the plugin: never knobs, never "misspelt".
ENGINE_VARIABLES = frozenset({"R9K_DATA_DIR", "R9K_ROOT", "R9K_MODEL_CACHE", "R9K_SERVER_TAG", "R9K_TOKENIZER_DIR"})


def _k(name: str, type_: type, default: Any, stock: Any, help_: str, choices: tuple[str, ...] | None = None,
       dispatch: str | None = None, check: Callable[[Any], str | None] | None = None) -> Callable[[], Any]:
    register_knob(Knob(name, type_, default, stock, help_, choices, dispatch, check))
    return lambda: get(name)


# ---- the knobs -------------------------------------------------------------------------------------------
# Kernel dispatch knobs are declared here, not beside their kernels, so the registry is complete on import.
# What vLLM runs of r9k (r9k/ops): the GDN prefill core and conv (r9k/ops/gdn.py), the block-scaled fp8 linear
# op (r9k/ops/fp8.py) and, on vLLM's CPU platform, the expert cache inside its unquantized MoE layers
# (r9k/ops/moe.py). The all-reduce (kernels/allreduce/) is library code that no serving path calls, and has no
# knob.
GDN_PREFILL_MAX = _k(
    "R9K_GDN_PREFILL_MAX", int, 1024, 0,
    "most tokens of a GDN prefill step that vLLM's Qwen3-Next / Qwen3.5 / Olmo GDN layer runs on r9k's "
    "token-by-token core (gdn_seq) instead of fla's chunked core, for step shapes within the measured crossover "
    "(r9k/ops/gdn.py CROSSOVER; docs/kernels/gdn.md); 0 = vLLM's chunked core",
    dispatch="gdn_seq",
)
GDN_PREFILL_CONV = _k(
    "R9K_GDN_PREFILL_CONV", str, "r9k", "stock",
    "causal conv of the GDN prefill steps of at most R9K_GDN_PREFILL_MAX tokens: r9k (one launch, gdn_conv) or "
    "stock (vLLM's causal_conv1d_fn)",
    choices=("r9k", "stock"), dispatch="gdn_conv",
)
GDN_PREFILL_SPLIT = _k(
    "R9K_GDN_PREFILL_SPLIT", str, "seq", "step",
    "how the GDN prefill dispatch chooses its kernel: seq = per sequence (a sequence of at most "
    "R9K_GDN_PREFILL_MAX tokens runs r9k's gdn_seq / gdn_conv, a longer one vLLM's core / conv, a step holding both "
    "kinds split between them), so a sequence's result does not depend on what it is batched with, at the price "
    "of running r9k on steps of many short sequences beyond the crossover (T x HV > 16384 tokens-heads: up to "
    "1.8x fla's eager time at 4096 tokens x 32 heads); step = per step (the whole step to r9k when it has at most "
    "R9K_GDN_PREFILL_MAX tokens and lies within r9k/ops/gdn.py CROSSOVER, else to vLLM); docs/kernels/gdn.md",
    choices=("seq", "step"),
)
FP8_BLOCK_GEMM = _k(
    "R9K_FP8_BLOCK_GEMM", str, "r9k", "stock",
    "vLLM's block-scaled fp8 linear op (TritonFp8BlockScaledMMKernel.apply_weights: 128x128 weight blocks, "
    "dynamic 1x128 activation groups, the kernel vLLM selects on ROCm without AITER and on CUDA with "
    "--linear-backend triton): r9k (its activation quant and block GEMM, kernels.fp8.fp8_linear) or stock "
    "(vLLM's own Triton kernel); docs/kernels/fp8.md",
    choices=("r9k", "stock"), dispatch="fp8_block_gemm",
)
PROVENANCE_LOG = _k(
    "R9K_PROVENANCE", bool, True, True,
    "log the plugin's provenance line at load (the validation engine refuses a server without it)",
)
TRITON_FAST_LAUNCH = _k(
    "R9K_TRITON_FAST_LAUNCH", bool, True, True,
    "launch r9k's Triton kernels through their cached compiled kernel (kernels/_launch.py) instead of Triton's JIT "
    "dispatcher on every call; outputs are identical either way (gated), only the host's time per launch differs",
)
MOE_CACHE_SLOTS = _k(
    "R9K_MOE_CACHE_SLOTS", int, 0, 0,
    "expert slots per MoE layer that r9k's expert cache (kernels/moe/cache.py) keeps beside the layer's host store "
    "of all its experts; the layer's expert tensors become the slots and each step's routed ids are mapped to them "
    "(r9k/ops/moe.py: vLLM's CPU unquantized experts, CPUUnquantizedExperts and its x86/Arm/Power subclasses, and "
    "on CUDA / ROCm its TritonExperts of 16-bit and fp8 w8a8 layers); "
    "top-k..experts of the layer, else loading the model fails naming this knob; 0 = vLLM's own experts",
    dispatch="moe_cache", check=lambda v: "must be 0 (vLLM's experts) or a slot count >= 1" if v < 0 else None,
)
MOE_CACHE_STAGING = _k(
    "R9K_MOE_CACHE_STAGING", int, -1, -1,
    "read-through (staging) slots per MoE layer beside R9K_MOE_CACHE_SLOTS: a step's misses that are not inserted "
    "are copied there for that step only; a step with more of them is served in token chunks that fit "
    "(docs/kernels/moe.md); -1 = the layer's experts less the slots, at least its top-k (slots + staging never "
    "hold more room than all experts unless slots > experts - top-k); at least the layer's top-k",
    dispatch="moe_cache",
    check=lambda v: "must be -1 (experts - slots, at least top-k) or a slot count >= 1 (0 staging slots could "
                    "serve no read-through miss)" if v == 0 or v < -1 else None,
)
MOE_CACHE_READ = _k(
    "R9K_MOE_CACHE_READ", str, "auto", "auto",
    "how the expert cache serves a step's misses that it does not insert, on vLLM's Triton experts: through (the "
    "layer's GEMM reads them from pinned host memory through a per-expert pointer table: no staging slots, every "
    "step planned on the device, CUDA-graph safe at any miss count; 16-bit and block-fp8 layers) or stage (copied "
    "into R9K_MOE_CACHE_STAGING slots first); auto = through on CUDA where the layer's format allows it, else "
    "stage (vLLM's CPU experts always stage); docs/kernels/moe.md",
    choices=("auto", "through", "stage"), dispatch="moe_cache",
)
MOE_CACHE_THRESH = _k(
    "R9K_MOE_CACHE_THRESH", float, 0.99, 0.99,
    "insert threshold of the expert cache: a step whose distinct routed experts exceed THRESH * slots inserts "
    "nothing and reads its misses through the staging slots (the seeds' R9K_LRU_THRESH; 0.5 stopped inserting on "
    "72% of the seeds' steps, 0.99 fixed it); 0..1",
    dispatch="moe_cache", check=lambda v: None if 0.0 <= v <= 1.0 else "must be in [0, 1]",
)
MOE_CACHE_STATS = _k(
    "R9K_MOE_CACHE_STATS", bool, True, True,
    "log the expert cache's counters (R9K-MOE-CACHE-STATS lines, one a layer and rank: hits, inserts, read-through "
    "misses, distinct experts a step, steps over the threshold, bytes copied) that the validation engine parses "
    "into the record (the seeds' R9K_EXPERT_CACHE_STATS)",
)
MOE_CACHE_STATS_SEC = _k(
    "R9K_MOE_CACHE_STATS_SEC", float, 10.0, 10.0,
    "seconds between a layer's counter lines (written at the first step after the interval, and at exit); 0 = "
    "after every step (the seeds' R9K_EXPERT_CACHE_STATS_SEC)",
    check=lambda v: "must be >= 0" if v < 0 else None,
)
CALLS_SEC = _k(
    "R9K_CALLS_SEC", float, 1.0, 1.0,
    "seconds between a process's R9K-CALLS lines (r9k/calls.py: its dispatched calls by route and step kind, "
    "counted on the device; written after the first step past the interval, and at exit; each is a device read, "
    "and a suite's share is exact to within this at its edges); 0 = after every step",
    check=lambda v: "must be >= 0" if v < 0 else None,
)

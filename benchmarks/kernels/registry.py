"""The registry of kernel benchmarks: one :class:`Op` per r9k kernel (or kernel path) that is measured against its
peers, looked up by name by the runner (``python -m benchmarks.kernels``, benchmarks/kernels/__main__.py).

An entry says:

* how to build its inputs at a shape (``build(shape, device)``: plain tensors, on the CPU too, so that the
  registry's own test can build every entry at its ``tiny`` shape without a GPU);
* the callable of r9k and of each peer on those inputs (``r9k(inputs)``, ``peers[name](inputs)``: each returns a
  zero-argument callable, or a list of them on distinct operands that the timers take in turn so that the
  working set exceeds the L2). A peer whose library is absent raises :class:`Unavailable` with the reason;
* named r9k variants (``variants[name](inputs)``): other configurations of the same kernel that were measured
  against the default (the alternatives of docs/kernels/<family>.md), run only when asked for;
* the floor at a shape (``floor(shape)``: the bytes that must move and the flops that must be done, each over a
  measured ceiling of benchmarks/kernels/ceilings.py);
* the default shapes, and how a call's result is checked (``ref(inputs)``: the reference output; ``output``:
  the tensor of a call's result that is compared; or ``check(inputs, result)``: a relative error).
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Any, Callable

import torch


class Unavailable(RuntimeError):
    """A peer (or an op) cannot run here: its library is not installed, or the device lacks what it needs."""


@dataclass(frozen=True)
class Floor:
    """The least time an op can take at a shape: ``bytes`` over the ceiling ``bytes_ceiling`` (at ``bytes_size``
    where that ceiling depends on the size) and ``flops`` over ``flops_ceiling``; the larger of the two."""

    bytes: float = 0.0
    flops: float = 0.0
    bytes_ceiling: str = "copy"
    flops_ceiling: str = "fp32_fma"
    bytes_size: int | None = None

    def us(self, ceilings) -> float:
        t = 0.0
        if self.bytes:
            t = max(t, self.bytes / ceilings.get(self.bytes_ceiling, self.bytes_size) * 1e6)
        if self.flops:
            t = max(t, self.flops / ceilings.get(self.flops_ceiling) * 1e6)
        return t

    def describe(self) -> str:
        parts = []
        if self.bytes:
            parts.append(f"{self.bytes / 1e6:.3g} MB / {self.bytes_ceiling}")
        if self.flops:
            parts.append(f"{self.flops / 1e9:.3g} GFLOP / {self.flops_ceiling}")
        return " | ".join(parts) or "-"


def first_tensor(result) -> torch.Tensor:
    """The output of a call for the check: the result itself, or the first element of a tuple (fla returns
    (o, final_state))."""
    return result[0] if isinstance(result, (tuple, list)) else result


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    """Relative Frobenius error of ``out`` against ``ref`` (float64, on ref's device)."""
    o, r = out.double().to(ref.device), ref.double()
    den = r.norm().item()
    return (o - r).norm().item() / den if den else (o - r).norm().item()


@dataclass(frozen=True)
class Op:
    name: str
    family: str                              # gdn, fp8, moe, allreduce: docs/kernels/<family>.md
    doc: str
    shapes: tuple[dict, ...]                 # the default shapes; the first is also the base of --shapes
    build: Callable[[dict, str], Any]        # (shape, device) -> inputs
    r9k: Callable[[Any], Any]                # inputs -> callable (or list of callables)
    floor: Callable[[dict], Floor]
    peers: dict[str, Callable[[Any], Any]] = field(default_factory=dict)
    variants: dict[str, Callable[[Any], Any]] = field(default_factory=dict)
    ref: Callable[[Any], torch.Tensor] | None = None
    tolerance: float = 1e-2                  # the most relative error r9k's output may have against ref (CPU test)
    output: Callable[[Any], torch.Tensor] = first_tensor
    check: Callable[[Any, Any], float] | None = None  # (inputs, result) -> error; instead of ref
    unchecked: tuple[str, ...] = ()          # peers whose output is another computation (not compared)
    tiny: dict = field(default_factory=dict)  # over shapes[0]: a shape small enough for the CPU test
    cpu: bool = True                         # r9k's callable runs under TRITON_INTERPRET=1 at the tiny shape
    valid: Callable[[dict], bool] = lambda shape: True  # shapes a --shapes product keeps
    world_size: int = 1                      # > 1: one process per GPU (the runner spawns them; a shape's
    #                                          "world_size" key overrides it)
    timers: dict[str, Callable] = field(default_factory=dict)  # mode -> timer(fns) -> us or (us, {extra row
    #                                                             figures}), instead of the runner's
    modes: tuple[str, ...] = ("eager", "graph", "loop", "kernel", "host")
    default_mode: str = "eager"
    needs: str = ""                          # what a peer needs beyond r9k's requirements
    report: Callable[[list], None] | None = None  # prints an op-specific summary of its rows

    def shape_list(self, spec: str | None) -> list[dict]:
        """The shapes of a run: the defaults, or ``spec`` (``--shapes``): items separated by ";", each
        ``key=value,...`` over the first default shape, a value ``a|b|c`` expanding into one shape per value
        (the product over the keys), shapes ``valid`` rejects dropped.

        Raises:
            ValueError: an item that is not ``key=value``, a key the op's shapes do not have, a non-int value.
        """
        if not spec:
            return [dict(s) for s in self.shapes]
        base = self.shapes[0]
        out = []
        for item in spec.split(";"):
            item = item.strip()
            if not item:
                continue
            keys, choices = [], []
            for kv in item.split(","):
                if "=" not in kv:
                    raise ValueError(f"--shapes: {kv!r} is not key=value")
                k, v = (x.strip() for x in kv.split("=", 1))
                if k not in base:
                    raise ValueError(f"--shapes: {self.name} has no shape key {k!r} (keys: {', '.join(base)})")
                try:
                    vals = [int(x) for x in v.split("|")]
                except ValueError:
                    raise ValueError(f"--shapes: {k}={v!r}: values are ints, separated by |") from None
                keys.append(k)
                choices.append(vals)
            for combo in itertools.product(*choices):
                s = dict(base, **dict(zip(keys, combo)))
                if self.valid(s):
                    out.append(s)
        return out


REGISTRY: dict[str, Op] = {}


def register(op: Op) -> Op:
    """Add ``op`` to the registry. Raises ValueError for a name taken, a peer and a variant of one name, or a
    default mode the op does not have."""
    if op.name in REGISTRY:
        raise ValueError(f"benchmark {op.name!r} is registered twice")
    if set(op.peers) & set(op.variants) or "r9k" in op.peers or "r9k" in op.variants:
        raise ValueError(f"{op.name}: peer and variant names must differ from each other and from 'r9k'")
    if op.default_mode not in op.modes:
        raise ValueError(f"{op.name}: default mode {op.default_mode!r} is not one of its modes {op.modes}")
    REGISTRY[op.name] = op
    return op


def shape_label(shape: dict) -> str:
    return " ".join(f"{k}={v}" for k, v in shape.items())

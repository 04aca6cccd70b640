"""The layer shapes of the three serving systems the seeds run (serve/fn-tp4.yaml, serve/fn-tp2.yaml,
serve/27b-tp2.yaml), per rank, each figure with its source.

What reads it: the compile gate for the seeds' cards (benchmarks/portability/, tests/kernels/test_portability.py)
calls every kernel the dispatch can launch at these shapes; the kernel benchmarks run at them with
``python -m benchmarks.kernels --op OP --system NAME`` (:func:`bench_spec`).

Sources, named in each :class:`Fig`:

* the seeds (/work/shared/seeds/*.txt, the release notes of the stack this project validates): which models,
  how many cards, the expert slots, the prefill thresholds, the speculative tokens;
* serve/<name>.yaml: tensor parallel size, max_num_seqs, the speculative config, the R9K_* knobs;
* the models' published configurations (Hugging Face ``config.json``). The seeds' Flash-Next ("Qwen3.8-Flash-Next")
  has no published configuration; its figures are those of Qwen/Qwen3-Next-80B-A3B-Instruct (the published model
  of that architecture: GDN hybrid, 512 routed experts, which the seeds confirm: "216-365 of its 512 experts"),
  so a Flash-Next figure below is that model's until the real configuration is at hand;
* vLLM's parallel layers (vllm/model_executor/layers/linear.py): a column-parallel linear splits N over the
  ranks, a row-parallel one splits K; a KV head count below the TP size is replicated to one head a rank.

Which linears are block-fp8 (the dispatch's ``fp8_block_gemm``): those of a 128x128 block-quantised checkpoint
(Qwen/Qwen3-Next-80B-A3B-Instruct-FP8: ``weight_block_size [128, 128]``) that vLLM runs through its linear op:
the GDN and attention projections and the shared expert. The routed experts go through vLLM's fused MoE, the
router and ``in_proj_ba`` (N = 32 a rank) are not quantised there. The 27B configuration sets no
``R9K_FP8_BLOCK_GEMM``, so no fp8 linear of it is dispatched to r9k.
"""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Fig:
    """One figure and where it comes from."""

    value: int
    source: str


@dataclass(frozen=True)
class Linear:
    """A block-fp8 linear layer on one rank: ``y [M, N] = x [M, K] W^T``."""

    name: str
    N: Fig
    K: Fig


@dataclass(frozen=True)
class Gdn:
    """A GDN layer's recurrence and conv on one rank: H key heads of K, HV value heads of V, the conv over
    ``conv_dim`` channels of width ``conv_width``."""

    H: Fig
    HV: Fig
    K: Fig
    V: Fig
    conv_dim: Fig
    conv_width: Fig
    prefill_max: Fig  # R9K_GDN_PREFILL_MAX: the most tokens of a step the dispatch routes to gdn_seq


@dataclass(frozen=True)
class Experts:
    """The routed experts of one MoE layer on one rank and the expert cache over them (``slots`` None: every
    expert in device memory, no cache)."""

    E: Fig
    top_k: Fig
    hidden: Fig
    inter: Fig  # moe_intermediate_size on this rank
    slots: Fig | None


@dataclass(frozen=True)
class System:
    """One serving system: its configuration file, model, TP size, and the per-rank shapes its kernels see."""

    name: str
    model: str
    tp: Fig
    hidden: Fig
    gdn: Gdn
    linears: tuple[Linear, ...]
    experts: Experts | None
    decode_m: Fig  # tokens of a decode step at max_num_seqs with every speculative token
    prefill_m: tuple[Fig, ...] = field(default_factory=tuple)  # prefill-step token counts the gate compiles at


QWEN3_NEXT = "Qwen/Qwen3-Next-80B-A3B-Instruct config.json"
QWEN35_27B = "Qwen/Qwen3.5-27B config.json"

# The published figures the per-rank shapes are derived from.
_NEXT = dict(hidden_size=2048, linear_num_key_heads=16, linear_num_value_heads=32, linear_key_head_dim=128,
             linear_value_head_dim=128, linear_conv_kernel_dim=4, num_attention_heads=16, num_key_value_heads=2,
             head_dim=256, attn_output_gate=1, num_experts=512, num_experts_per_tok=10, moe_intermediate_size=512,
             shared_expert_intermediate_size=512)
_27B = dict(hidden_size=5120, linear_num_key_heads=16, linear_num_value_heads=48, linear_key_head_dim=128,
            linear_value_head_dim=128, linear_conv_kernel_dim=4, num_attention_heads=24, num_key_value_heads=4,
            head_dim=256, intermediate_size=17408)


def _c(cfg: dict, src: str, key: str) -> Fig:
    return Fig(cfg[key], f"{src}: {key}")


def _split(f: Fig, tp: Fig, what: str) -> Fig:
    if f.value % tp.value:
        raise ValueError(f"{f.source} = {f.value} does not divide over TP {tp.value} ({what})")
    return Fig(f.value // tp.value, f"{f.source} / TP {tp.value} ({what})")


def _gdn(cfg: dict, src: str, tp: Fig, prefill_max: Fig) -> Gdn:
    H = _c(cfg, src, "linear_num_key_heads")
    HV = _c(cfg, src, "linear_num_value_heads")
    K = _c(cfg, src, "linear_key_head_dim")
    V = _c(cfg, src, "linear_value_head_dim")
    conv = 2 * H.value * K.value + HV.value * V.value
    return Gdn(H=_split(H, tp, "heads split over ranks"), HV=_split(HV, tp, "heads split over ranks"), K=K, V=V,
               conv_dim=Fig(conv // tp.value, f"(2 x linear_num_key_heads x linear_key_head_dim + "
                                              f"linear_num_value_heads x linear_value_head_dim) / TP {tp.value}, "
                                              f"{src}"),
               conv_width=_c(cfg, src, "linear_conv_kernel_dim"), prefill_max=prefill_max)


def _next_linears(tp: Fig) -> tuple[Linear, ...]:
    c, s, t = _NEXT, QWEN3_NEXT, tp.value
    hid = _c(c, s, "hidden_size")
    key_dim, val_dim = c["linear_num_key_heads"] * c["linear_key_head_dim"], \
        c["linear_num_value_heads"] * c["linear_value_head_dim"]
    q_out = c["num_attention_heads"] * c["head_dim"] * (2 if c["attn_output_gate"] else 1)
    kv_heads = max(1, c["num_key_value_heads"] // t)  # replicated below one head a rank (vLLM)
    qkv = q_out // t + 2 * kv_heads * c["head_dim"]
    shared = c["shared_expert_intermediate_size"]
    return (
        Linear("gdn.in_proj_qkvz", Fig((2 * key_dim + 2 * val_dim) // t,
                                       f"(2 x key heads x key dim + 2 x value heads x value dim) / TP {t}, {s}"), hid),
        Linear("gdn.out_proj", hid, Fig(val_dim // t, f"value heads x value dim / TP {t} (row-parallel), {s}")),
        Linear("attn.qkv_proj", Fig(qkv, f"(num_attention_heads x head_dim x 2 (output gate)) / TP {t} + 2 x "
                                         f"{kv_heads} KV head(s) x head_dim, {s}"), hid),
        Linear("attn.o_proj", hid, Fig(c["num_attention_heads"] * c["head_dim"] // t,
                                       f"num_attention_heads x head_dim / TP {t} (row-parallel), {s}")),
        Linear("shared_expert.gate_up_proj", Fig(2 * shared // t, f"2 x shared_expert_intermediate_size / TP {t}, "
                                                                  f"{s}"), hid),
        Linear("shared_expert.down_proj", hid, Fig(shared // t, f"shared_expert_intermediate_size / TP {t} "
                                                                f"(row-parallel), {s}")),
    )


def _serve(name: str, what: str) -> str:
    return f"serve/{name}.yaml: {what}"


def _flash_next(name: str, tp: int, seqs: int, slots: int | None) -> System:
    tpf = Fig(tp, _serve(name, "server.tensor_parallel_size"))
    c, s = _NEXT, QWEN3_NEXT
    hid = _c(c, s, "hidden_size")
    experts = Experts(E=_c(c, s, "num_experts"), top_k=_c(c, s, "num_experts_per_tok"), hidden=hid,
                      inter=_split(_c(c, s, "moe_intermediate_size"), tpf, "experts' intermediate split"),
                      slots=None if slots is None else Fig(slots, "seeds 004 (v0.2.1): 270 expert slots per layer "
                                                                  "in VRAM (their R9K_EXPERT_SLOTS; serve/fn-tp2.yaml's "
                                                                  "env.R9K_MOE_CACHE_SLOTS)"))
    pmax = Fig(256, _serve(name, "env.R9K_GDN_PREFILL_MAX (seeds 000: the Flash-Next break-even)"))
    return System(
        name=name, model="Flash-Next (figures: Qwen3-Next-80B-A3B)", tp=tpf, hidden=hid,
        gdn=_gdn(c, s, tpf, pmax), linears=_next_linears(tpf), experts=experts,
        decode_m=Fig(seqs * 4, _serve(name, f"max_num_seqs {seqs} x (1 + 3 MTP tokens, speculative config)")),
        prefill_m=(pmax, Fig(2048, "a prefill chunk of 2048 tokens (vLLM's max_num_batched_tokens default for "
                                   "chunked prefill; the seeds' 2k prefill figure)")))


def _qwen27b() -> System:
    name, c, s = "27b-tp2", _27B, QWEN35_27B
    tpf = Fig(2, _serve(name, "server.tensor_parallel_size"))
    pmax = Fig(400, _serve(name, "env.R9K_GDN_PREFILL_MAX (seeds 000: serve/27b.sh sets 400)"))
    return System(name=name, model="Qwen3.5-27B", tp=tpf, hidden=_c(c, s, "hidden_size"),
                  gdn=_gdn(c, s, tpf, pmax), linears=(), experts=None,
                  decode_m=Fig(16 * 8, _serve(name, "max_num_seqs 16 x (1 + 7 DFlash draft tokens)")),
                  prefill_m=(pmax,))


SYSTEMS: tuple[System, ...] = (
    _flash_next("fn-tp4", 4, 16, None),
    _flash_next("fn-tp2", 2, 8, 270),
    _qwen27b(),
)
SYSTEM_BY_NAME = {s.name: s for s in SYSTEMS}

# The M a GEMM is compiled at for each bucket of the fp8 dispatch's config table (kernels/fp8/gemm.py:
# M <= 16, M <= SMALL_M_MAX = 64, larger): 16 and 64, the system's decode step and its prefill steps. M = 1
# (a single-token step, which Triton specialises apart) does not occur with MTP-3: a decode step carries 4
# tokens a sequence.
M_BUCKETS = (16, 64)


def fp8_ms(system: System) -> tuple[int, ...]:
    """The M values the gate compiles the system's fp8 linears at (sorted, distinct)."""
    return tuple(sorted({*M_BUCKETS, system.decode_m.value, *(f.value for f in system.prefill_m)}))


def expert_bytes(system: System) -> int:
    """Bytes of one routed expert on one rank (w13 [2 I, hidden] and w2 [hidden, I] at one byte an element, the
    seeds' fp8 experts): the expert cache's copy unit. Raises ValueError for a system without experts."""
    ex = system.experts
    if ex is None:
        raise ValueError(f"{system.name} has no routed experts")
    return 3 * ex.inter.value * ex.hidden.value


def bench_spec(system: System, op: str) -> str:
    """The kernel benchmarks' ``--shapes`` spec (benchmarks/kernels: ``k=v,...;...``, ``a|b`` one shape each) of
    ``op`` at ``system``'s per-rank shapes: what ``python -m benchmarks.kernels --system NAME`` runs.

    Raises:
        ValueError: an op the table has no shapes for, or one the system does not run (fp8 ops on a system
            without fp8 linears, MoE ops on one without experts)."""
    g = system.gdn
    gdn = f"H={g.H.value},HV={g.HV.value},K={g.K.value},V={g.V.value}"
    ms = "|".join(str(m) for m in fp8_ms(system))
    T = g.prefill_max.value
    if op in ("fp8_gemm", "fp8_linear", "fp8_quant"):
        if not system.linears:
            raise ValueError(f"{system.name} dispatches no fp8 linear (no R9K_FP8_BLOCK_GEMM)")
        if op == "fp8_quant":
            return ";".join(f"M={ms},K={k}" for k in sorted({lin.K.value for lin in system.linears}))
        nk = sorted({(lin.N.value, lin.K.value) for lin in system.linears})
        return ";".join(f"M={ms},N={n},K={k}" for n, k in nk)
    if op == "gdn_seq":
        return f"B=1,{gdn},T={T}"
    if op == "gdn_conv":
        return f"{gdn},W={g.conv_width.value},T={T}"
    if op == "gdn_prefill":  # steps of up to R9K_GDN_PREFILL_MAX tokens over 1, 4 or 16 sequences
        return ";".join(f"H={g.H.value},HV={g.HV.value},K={g.K.value},N={n},L={T // n}" for n in (1, 4, 16))
    if op in ("moe_topk_sum", "expert_cache"):
        ex = system.experts
        if ex is None:
            raise ValueError(f"{system.name} has no routed experts")
        if op == "moe_topk_sum":
            return f"T={system.decode_m.value}|{T},k={ex.top_k.value},H={system.hidden.value}"
        return f"per_step=1|{ex.top_k.value},bytes={expert_bytes(system)}"
    raise ValueError(f"benchmarks/shapes.py has no shapes for op {op!r}")


def rows(system: System) -> list[tuple[str, int, str]]:
    """(what, value, source) for every figure of ``system``, in a fixed order: the table in
    docs/kernels/portability.md."""
    out = [("TP", system.tp.value, system.tp.source), ("hidden", system.hidden.value, system.hidden.source)]
    g = system.gdn
    for k in ("H", "HV", "K", "V", "conv_dim", "conv_width", "prefill_max"):
        f = getattr(g, k)
        out.append((f"gdn.{k}", f.value, f.source))
    for lin in system.linears:
        out.append((f"{lin.name}.N", lin.N.value, lin.N.source))
        out.append((f"{lin.name}.K", lin.K.value, lin.K.source))
    if system.experts is not None:
        ex = system.experts
        for k in ("E", "top_k", "inter", "slots"):
            f = getattr(ex, k)
            if f is not None:
                out.append((f"experts.{k}", f.value, f.source))
    out.append(("decode M", system.decode_m.value, system.decode_m.source))
    for f in system.prefill_m:
        out.append(("prefill M", f.value, f.source))
    return out


__all__ = ["Fig", "Linear", "Gdn", "Experts", "System", "SYSTEMS", "SYSTEM_BY_NAME", "M_BUCKETS", "fp8_ms",
           "expert_bytes", "bench_spec", "rows"]

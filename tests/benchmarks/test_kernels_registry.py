"""The kernel benchmarks' registry and runner (benchmarks/kernels), on the CPU: the runner's command line (``--list``
anywhere, a clear refusal without a GPU, options checked before anything runs), the timers' argument checks, and
every registry entry built at its tiny shape, r9k's callable run under Triton's interpreter against the entry's
own reference."""
from __future__ import annotations

import pytest
import torch

from benchmarks.kernels import REGISTRY
from benchmarks.kernels.__main__ import main
from benchmarks.kernels.registry import Floor, Op, register

NO_GPU = pytest.mark.skipif(torch.cuda.is_available(), reason="the refusal is for machines without a CUDA device")


def test_list_prints_every_entry_without_a_gpu(capsys):
    assert main(["--list"]) == 0
    out = capsys.readouterr().out
    for name, op in REGISTRY.items():
        assert name in out
        for peer in op.peers:
            assert peer in out
    assert {"gdn_seq", "fp8_gemm", "expert_cache", "allreduce"} <= set(REGISTRY)


@NO_GPU
def test_runner_says_it_needs_a_gpu(capsys):
    """Without a GPU the runner stops before any CUDA call, saying so (the benches used to die in the first CUDA
    call: AssertionError, Torch not compiled with CUDA)."""
    assert main(["--op", "fp8_gemm", "--mode", "kernel"]) == 2
    assert "needs a CUDA GPU" in capsys.readouterr().err


def test_runner_needs_something_to_run(capsys):
    with pytest.raises(SystemExit) as e:
        main([])
    assert e.value.code == 2 and "nothing to run" in capsys.readouterr().err


def test_list_and_op_are_one_or_the_other(capsys):
    with pytest.raises(SystemExit) as e:
        main(["--list", "--op", "gdn_seq"])
    assert e.value.code == 2 and "not allowed with" in capsys.readouterr().err


@pytest.mark.parametrize("rounds", ["0", "-1"])
def test_repeat_rejects_non_positive(monkeypatch, rounds):
    """--repeat 0 would run nothing and exit 0; -1 likewise: refused before any measurement."""
    import benchmarks.kernels.__main__ as R

    called = []
    monkeypatch.setattr(R, "run_op", lambda *a, **k: called.append(a))
    with pytest.raises(SystemExit) as e:
        main(["--op", "fp8_gemm", "--repeat", rounds])
    assert e.value.code == 2 and not called


def test_flush_without_kernel_mode_refused(capsys):
    """--flush applies to --mode kernel: given with another mode it would be silently ignored."""
    with pytest.raises(SystemExit) as e:
        main(["--op", "fp8_gemm", "--mode", "graph", "--flush", "read"])
    assert e.value.code == 2 and "--flush" in capsys.readouterr().err


@pytest.mark.parametrize("argv, what", [(["--op", "nope"], "unknown op"),
                                        (["--op", "gdn_seq", "--peer", "nope"], "no peer"),
                                        (["--op", "gdn_seq", "--variant", "nope"], "no variant"),
                                        (["--op", "launch", "--mode", "kernel"], "not timed in mode"),
                                        (["--op", "gdn_seq", "--shapes", "T=16,Q=3"], "no shape key"),
                                        (["--op", "gdn_seq", "--shapes", "T=x"], "ints")])
def test_bad_options_refused_by_name(capsys, argv, what):
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2 and what in capsys.readouterr().err


def test_shapes_expand_over_the_base_and_drop_invalid():
    op = REGISTRY["gdn_prefill"]
    shapes = op.shape_list("H=16,HV=32,N=1|64,L=16|512")
    assert [(s["N"], s["L"]) for s in shapes] == [(1, 16), (1, 512), (64, 16)]  # 64 x 512 > 4096 tokens
    assert all(s["K"] == 128 and (s["H"], s["HV"]) == (16, 32) for s in shapes)
    assert REGISTRY["gdn_seq"].shape_list(None) == [dict(s) for s in REGISTRY["gdn_seq"].shapes]


@pytest.mark.parametrize("n", [0, -3])
def test_kernel_time_validates_n_before_the_gpu(n):
    """flush_by and n are checked before any CUDA call: n <= 0 reached per_call[n // 2] on an empty list
    (IndexError) after a profiled run on the GPU, and on the CPU failed in torch.cuda (AssertionError)."""
    from benchmarks._timing import kernel_us

    with pytest.raises(ValueError, match="n"):
        kernel_us(lambda: None, n=n)
    with pytest.raises(ValueError, match="flush_by"):
        kernel_us(lambda: None, n=4, flush_by="write")


def test_gdn_variants_named_for_the_bv_k_kernel_launch_it(monkeypatch):
    """The gdn_seq variants of the [BV, K] kernel (KC=0, not lookahead) launch _gdn_seq_kernel with the GPU's
    defaults: an entry without KC would have resolved to the GPU default KC=4 and timed the [KC, BV, K/KC] kernel
    under a [BV, K] name."""
    import kernels.gdn.seq as G
    from benchmarks.kernels.gdn import SEQ_VARIANTS

    launched = []
    monkeypatch.setattr(G, "_interpreting", lambda: False)          # the GPU's default config
    monkeypatch.setattr(G, "_launch", lambda kern, grid, args, **kw: launched.append(kern))
    H, HV, K, V, T = 16, 32, 128, 128, 16                             # the benchmark's shapes
    q, v, g = torch.zeros(1, T, H, K), torch.zeros(1, T, HV, V), torch.zeros(1, T, HV)
    st, idx = torch.zeros(1, HV, V, K), torch.zeros(1, dtype=torch.int32)
    bv_k = {n: c for n, c in SEQ_VARIANTS.items() if c.get("KC") == 0 and not c.get("lookahead")}
    assert bv_k
    wrong = []
    for name, cfg in bv_k.items():
        launched.clear()
        G.gdn_seq(q, q, v, g, g, st, idx, **cfg)
        if launched[-1] is not G._gdn_seq_kernel:
            wrong.append(name)
    assert not wrong, f"labelled as the [BV, K] kernel but launch the [KC, BV, K/KC] kernel: {wrong}"


def test_impl_names_are_unique_per_entry():
    """r9k, each peer and each variant of an entry have distinct names (rows are keyed by them); register()
    refuses an entry that breaks it, or a name taken."""
    for op in REGISTRY.values():
        names = ["r9k"] + list(op.peers) + [f"r9k:{v}" for v in op.variants]
        assert len(set(names)) == len(names) and not set(op.peers) & set(op.variants)
    base = REGISTRY["moe_topk_sum"]
    kw = dict(family="moe", doc="x", shapes=base.shapes, build=base.build, r9k=base.r9k, floor=base.floor)
    with pytest.raises(ValueError, match="twice"):
        register(Op(name="moe_topk_sum", **kw))
    with pytest.raises(ValueError, match="differ"):
        register(Op(name="tmp_dup", peers={"a": base.r9k}, variants={"a": base.r9k}, **kw))
    with pytest.raises(ValueError, match="default mode"):
        register(Op(name="tmp_mode", modes=("host",), **kw))
    assert "tmp_dup" not in REGISTRY and "tmp_mode" not in REGISTRY


def test_floor_is_the_larger_of_bytes_and_flops():
    class C:
        def get(self, name, size=None):
            return {"copy": 1e12, "fp32_fma": 1e13}[name]

    f = Floor(bytes=2e6, flops=1e8)
    assert f.us(C()) == pytest.approx(10.0) and Floor(bytes=2e7, flops=1e8).us(C()) == pytest.approx(20.0)
    assert Floor().us(C()) == 0.0 and Floor().describe() == "-"


@pytest.mark.parametrize("name", sorted(REGISTRY))
def test_every_entry_builds_at_a_tiny_shape(monkeypatch, name):
    """Each entry's inputs at its tiny shape on the CPU, its floor, and (where r9k's kernels run under the
    interpreter) r9k's callable once, its output against the entry's reference or check."""
    from r9k.ops import gdn as dispatch

    monkeypatch.setattr(dispatch, "CROSSOVER", dispatch.CROSSOVER)   # gdn_prefill's r9k widens both
    monkeypatch.setattr(dispatch.STATE, "max_tokens", dispatch.STATE.max_tokens)
    op = REGISTRY[name]
    shape = dict(op.shapes[0], **op.tiny)
    inputs = op.build(shape, "cpu")
    assert inputs is not None
    f = op.floor(shape)
    assert f.bytes >= 0 and f.flops >= 0
    assert isinstance(op.peers, dict) and all(callable(p) for p in op.peers.values())
    if not op.cpu:
        return
    fns = op.r9k(inputs)
    result = (fns[0] if isinstance(fns, list) else fns)()
    if op.check is not None:
        assert op.check(inputs, result) == 0.0
    else:
        from benchmarks.kernels.registry import rel_err

        assert rel_err(op.output(result), op.ref(inputs)) <= op.tolerance

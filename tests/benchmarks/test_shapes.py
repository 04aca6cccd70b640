"""benchmarks/shapes.py: the serving systems' figures agree with their configuration files, and the per-rank
shapes are the published configurations split as vLLM splits them."""
from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from benchmarks import shapes as S

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("system", S.SYSTEMS, ids=lambda s: s.name)
def test_figures_taken_from_serve_agree_with_the_file(system):
    cfg = yaml.safe_load((ROOT / "serve" / f"{system.name}.yaml").read_text())
    assert system.tp.value == cfg["server"]["tensor_parallel_size"]
    assert system.gdn.prefill_max.value == int(cfg["env"]["R9K_GDN_PREFILL_MAX"])
    spec = yaml.safe_load(cfg["server"]["extra_args"][cfg["server"]["extra_args"].index("--speculative-config") + 1])
    assert system.decode_m.value == cfg["server"]["max_num_seqs"] * (1 + spec["num_speculative_tokens"])
    # fp8 linears are listed exactly where the configuration routes them to r9k
    assert bool(system.linears) == (cfg["env"].get("R9K_FP8_BLOCK_GEMM") == "r9k")
    for _, value, source in S.rows(system):
        assert isinstance(value, int) and value > 0 and source


def test_per_rank_shapes():
    tp4, tp2, b27 = (S.SYSTEM_BY_NAME[n] for n in ("fn-tp4", "fn-tp2", "27b-tp2"))
    assert (tp4.gdn.H.value, tp4.gdn.HV.value, tp2.gdn.H.value, tp2.gdn.HV.value) == (4, 8, 8, 16)
    assert (b27.gdn.H.value, b27.gdn.HV.value, b27.gdn.conv_dim.value) == (8, 24, 5120)
    lin = {x.name: (x.N.value, x.K.value) for x in tp2.linears}
    assert lin == {"gdn.in_proj_qkvz": (6144, 2048), "gdn.out_proj": (2048, 2048), "attn.qkv_proj": (4608, 2048),
                   "attn.o_proj": (2048, 2048), "shared_expert.gate_up_proj": (512, 2048),
                   "shared_expert.down_proj": (2048, 256)}
    # at TP 4 the two KV heads are replicated to one a rank: q 8192 / 4 + 2 x 256
    assert {x.name: x.N.value for x in tp4.linears}["attn.qkv_proj"] == 2560
    assert all(x.K.value % 128 == 0 for s in S.SYSTEMS for x in s.linears)  # the block GEMM's K rule
    assert S.fp8_ms(tp2) == (16, 32, 64, 256, 2048)
    assert S.expert_bytes(tp2) == 3 * 256 * 2048
    with pytest.raises(ValueError, match="27b-tp2 has no routed experts"):
        S.expert_bytes(b27)


def test_a_figure_that_does_not_split_is_refused():
    with pytest.raises(ValueError, match="does not divide over TP 3"):
        S._split(S.Fig(16, "x"), S.Fig(3, "y"), "heads")


def test_the_benchmark_runner_takes_a_systems_shapes(capsys):
    from benchmarks.kernels import REGISTRY
    from benchmarks.kernels.__main__ import parse_args

    a = parse_args(["--op", "fp8_gemm", "--system", "fn-tp2"])
    shapes = REGISTRY["fp8_gemm"].shape_list(a.shapes)
    assert dict(M=16, N=6144, K=2048) in shapes and dict(M=2048, N=2048, K=256) in shapes
    assert len(shapes) == 5 * len(S.fp8_ms(S.SYSTEM_BY_NAME["fn-tp2"]))  # 5 distinct (N, K), every M
    a = parse_args(["--op", "gdn_seq", "--system", "27b-tp2"])
    assert REGISTRY["gdn_seq"].shape_list(a.shapes) == [dict(B=1, H=8, HV=24, K=128, V=128, T=400)]
    a = parse_args(["--op", "gdn_prefill", "--system", "fn-tp4"])
    assert [(s["HV"], s["N"], s["L"]) for s in REGISTRY["gdn_prefill"].shape_list(a.shapes)] == [
        (8, 1, 256), (8, 4, 64), (8, 16, 16)]
    a = parse_args(["--op", "expert_cache", "--system", "fn-tp2"])
    assert REGISTRY["expert_cache"].shape_list(a.shapes) == [dict(per_step=1, bytes=1572864),
                                                             dict(per_step=10, bytes=1572864)]
    for argv, msg in ((["--op", "fp8_gemm", "--system", "27b-tp2"], "dispatches no fp8 linear"),
                      (["--op", "fp8_gemm", "--system", "nope"], "unknown system"),
                      (["--op", "fp8_gemm", "--system", "fn-tp2", "--shapes", "M=1"], "contradict"),
                      (["--op", "allreduce", "--system", "fn-tp2"], "no shapes for op 'allreduce'")):
        with pytest.raises(SystemExit):
            parse_args(argv)
        assert msg in capsys.readouterr().err

"""Knob sets (validate.config.knob_sets, ``--knobs SET``): their parsing and errors naming file, line and key, the
env a set launches with, the dispatch its provenance check expects, and the pairing of its records with the stock
run's."""
from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import REPO
from validate.config import find_config, load_config, with_knob_set, with_stock_knobs
from validate.errors import InputError

pytestmark = pytest.mark.timeout(120)

HEAD = """name: ks
model: {path: /models/x, served_name: x}
server: {max_num_seqs: 4, max_model_len: 1024}
env:
  R9K_GDN_PREFILL_MAX: "256"
  R9K_MOE_CACHE_SLOTS: "270"
  R9K_MOE_CACHE_THRESH: "0.99"
"""


def write(tmp_path: Path, sets: str) -> Path:
    p = tmp_path / "ks.yaml"
    p.write_text(HEAD + "knob_sets:\n" + sets)
    return p


def test_sets_load_and_leave_the_digest_alone(tmp_path):
    p = write(tmp_path, "  gdn: [R9K_GDN_PREFILL_MAX]\n  moe: [R9K_MOE_CACHE_SLOTS, R9K_MOE_CACHE_THRESH]\n")
    cfg = load_config(p)
    assert cfg.knob_sets == {"gdn": ["R9K_GDN_PREFILL_MAX"], "moe": ["R9K_MOE_CACHE_SLOTS", "R9K_MOE_CACHE_THRESH"]}
    # the sets change nothing a server runs: the same configuration without them hashes the same
    assert cfg.digest() == cfg.model_copy(update={"knob_sets": {}}).digest()


@pytest.mark.parametrize("sets, line, why", [
    ("  gdn: [R9K_GDN_PREFIL_MAX]\n", 9,
     "knob_sets.gdn: R9K_GDN_PREFIL_MAX: not a registered R9K_* knob (did you mean R9K_GDN_PREFILL_MAX?)"),
    ("  fp8: [R9K_FP8_BLOCK_GEMM]\n", 9, "knob_sets.fp8: R9K_FP8_BLOCK_GEMM: not set in env (a set runs the "
     "configuration's values of its knobs: set it in env)"),
    ("  gdn: [R9K_GDN_PREFILL_MAX]\n  stock: [R9K_MOE_CACHE_SLOTS]\n", 10,
     "knob_sets.stock: 'stock' is a --knobs value of its own (stock, config): name the set otherwise"),
    ("  config: [R9K_MOE_CACHE_SLOTS]\n", 9,
     "knob_sets.config: 'config' is a --knobs value of its own (stock, config): name the set otherwise"),
    ("  thresh: [R9K_MOE_CACHE_THRESH]\n", 9, "knob_sets.thresh: every knob of it is at its stock value in env "
     "(the set would be the stock run)"),
    ("  none: []\n", 9, "knob_sets.none: lists no knob (it would be the stock run)"),
    ("  gdn: [R9K_GDN_PREFILL_MAX, R9K_GDN_PREFILL_MAX]\n", 9, "knob_sets.gdn: R9K_GDN_PREFILL_MAX listed twice"),
    ("  ../x: [R9K_GDN_PREFILL_MAX]\n", 9, "knob_sets.../x: knob set '../x': use letters, digits"),
])
def test_a_bad_set_names_file_line_and_key(tmp_path, sets, line, why):
    p = write(tmp_path, sets)
    with pytest.raises(InputError) as e:
        load_config(p)
    assert str(e.value).startswith(f"{p}:{line}: {why}")


def test_a_set_launches_with_exactly_its_knobs_and_every_other_stock():
    from r9k.knobs import KNOBS, in_force
    from validate.cli import _opts, parser
    from validate.engine import Engine

    cfg = find_config(REPO, "h200-next-fp8")
    stock = with_stock_knobs(cfg).env
    want = {"gdn": {"R9K_GDN_PREFILL_MAX": "256", "R9K_GDN_PREFILL_CONV": "r9k", "R9K_GDN_PREFILL_SPLIT": "seq"},
            "moe": {"R9K_MOE_CACHE_SLOTS": "270", "R9K_MOE_CACHE_THRESH": "0.99"},
            "fp8": {"R9K_FP8_BLOCK_GEMM": "r9k"}}
    for name, own in want.items():
        args = parser().parse_args(["release", "x", "--config", "h200-next-fp8", "--knobs", name])
        env = Engine(_opts(args)).config("h200-next-fp8").env
        assert env == {**stock, **own}
        assert env["VLLM_USE_FLASHINFER_SAMPLER"] == "0"  # the other variables stay
        moved = {k for k, v in in_force(env).items() if v != KNOBS[k].stock}
        assert moved == {k for k in own if in_force(own)[k] != KNOBS[k].stock}
    assert with_knob_set(cfg, "config") is cfg and with_knob_set(cfg, "stock").env == stock


def test_a_set_the_configuration_lacks_is_refused_before_launch(tmp_path):
    from validate.cli import main

    assert main(["suite", "probe", "--config", "cpu-smol", "--knobs", "gdn", "--reports", str(tmp_path)]) == 2
    with pytest.raises(InputError, match=r"--knobs gdn: configuration cpu-smol has no knob set of that name .*it "
                                         r"takes stock, config\)"):
        with_knob_set(find_config(REPO, "cpu-smol"), "gdn")


@pytest.mark.parametrize("name, dispatch", [("stock", {}), ("gdn", {"gdn_seq", "gdn_conv"}), ("moe", {"moe_cache"}),
                                            ("fp8", {"fp8_block_gemm"}),
                                            ("config", {"gdn_seq", "gdn_conv", "moe_cache", "fp8_block_gemm"})])
def test_provenance_expects_the_sets_dispatch_and_no_other(name, dispatch):
    """A gdn server that installed only gdn's dispatch passes the check; one that misses a dispatch of its set is
    plugin-inactive; a dispatch outside the set is never asked for."""
    from r9k.knobs import expected_dispatch
    from validate.provenance_checks import check_dispatch

    cfg = with_knob_set(find_config(REPO, "h200-next-fp8"), name)
    assert set(expected_dispatch(cfg.env)) == set(dispatch)

    def line(pid, names):
        return (f"R9K-PROVENANCE version=0.1.0 source_hash=0123456789abcdef files=12 pid={pid} "
                f"dispatch={','.join(sorted(names)) or '-'} failed=-")

    lines = [line(1, dispatch), line(2, dispatch)]
    assert check_dispatch(cfg, lines, None) is None
    if dispatch:
        short = sorted(dispatch)[0]
        why = check_dispatch(cfg, [line(1, dispatch), line(2, set(dispatch) - {short})], None)
        assert f"asks for the {short} dispatch, which 1 of 2 server process(es) did not install (pid 2)" in why


def test_a_sets_records_pair_with_the_stock_runs():
    from tests.validate.test_one_verdict import bench
    from validate.pairing import apart

    cfg = find_config(REPO, "h200-next")
    for name in ("gdn", "moe"):
        base, cand = bench("stock", 38.0, 1), bench(name, 38.0, 2)
        base.config_snapshot = with_knob_set(cfg, "stock").model_dump(mode="json")
        cand.config_snapshot = with_knob_set(cfg, name).model_dump(mode="json")
        base.knob_set, cand.knob_set = "stock", name
        assert apart(base, cand) == []
    base.config_snapshot.pop("knob_sets")  # a stock record made before the sets were named
    assert apart(base, cand) == []


def test_the_release_verdict_gates_a_set_against_stock(tmp_path):
    """`release gdn --knobs gdn --baseline stock`: the verdict pairs the set's BetterBench record with stock's (no
    refusal) and a 40% slower decode step is a finding."""
    from tests.validate.test_attribution import bench
    from tests.validate.served import with_dispatch
    from tests.validate.test_compare import save
    from validate.verdict import assess_release

    cfg = find_config(REPO, "h200-next")
    b, c = bench("stock", 1.0, "stock"), bench("gdn", 1.4, "gdn")
    for r, knob_set in ((b, "stock"), (c, "gdn")):  # each as the engine writes it: snapshot, hash, model, dispatch
        run = with_knob_set(cfg, knob_set)
        r.config_snapshot, r.config_hash, r.model = run.model_dump(mode="json"), run.digest(), run.model.source_name()
        with_dispatch(r, run.env)
    save(tmp_path, b, c)
    v = assess_release(tmp_path, "gdn", baseline="stock", root=REPO, accept_other_tree=True)
    assert v.perf.unpaired == [] and v.perf.limited == []
    marks = {x.name: x.outcome for x in v.checks if x.name.startswith("perf ")}
    assert marks == {"perf decode_step_ms": "finding", "perf combined_decode_tok_s": "finding",
                     "perf prefill_1024_tok_s": "pass"}
    assert v.exit_code() == 1

"""The expert cache's log lines (r9k/counters.py) as the engine reads them: parsing, malformed lines, the suite's
delta, the plugin-inactive check and the notes' rows."""
from __future__ import annotations

import pytest

from r9k import counters
from validate.config import ServeConfig
from validate.engine import moe_counters
from validate.provenance_checks import check_dispatch
from validate.render import moe_rows

pytestmark = pytest.mark.timeout(60)

C = {k: i + 1 for i, k in enumerate(counters.COUNTERS)}  # steps=1, routed=2, ... bytes=12


def _stats(pid=100, layer="model.layers.0.mlp.experts", scale=1, **over):
    return counters.stats_line(pid, 0, layer, 16, 4, 12, {k: v * scale for k, v in {**C, **over}.items()})


def _prov(*pids, dispatch="moe_cache"):
    return [f"R9K-PROVENANCE version=0.1.0 source_hash=ab files=3 pid={p} dispatch={dispatch} failed=-" for p in pids]


def _cfg(**env) -> ServeConfig:
    return ServeConfig(name="c", model={"path": "m", "served_name": "m"},
                       server={"max_num_seqs": 4, "max_model_len": 4096}, env=env)


def test_stats_line_parses_back():
    text = _stats()
    assert text == ("R9K-MOE-CACHE-STATS pid=100 rank=0 layer=model.layers.0.mlp.experts experts=16 slots=4 staging=12 "
                    "steps=1 routed=2 distinct=3 distinct_max=4 hits=5 misses=6 inserts=7 evictions=8 read_through=9 "
                    "over_thresh=10 chunks=11 bytes=12")
    p = counters.parse(f"noise\n(EngineCore pid=100) {text}\nmore")
    assert p.malformed == 0 and len(p.stats) == 1
    s = p.stats[0]
    assert (s.pid, s.rank, s.layer, s.experts, s.slots, s.staging) == (100, 0, "model.layers.0.mlp.experts", 16, 4, 12)
    assert s.counters == C


def test_the_memory_fields_parse_back_and_sum_and_an_older_line_lacks_them():
    text = counters.stats_line(100, 0, "l0", 16, 4, 0, C, device_bytes=30, resident_bytes=120)
    assert " staging=0 device_bytes=30 resident_bytes=120 steps=1 " in text
    s = counters.parse(text).stats[0]
    assert (s.device_bytes, s.resident_bytes, s.counters) == (30, 120, C)
    assert counters.parse(_stats()).stats[0].device_bytes is None  # an older plugin's line is still read
    assert counters.parse(text.replace("device_bytes=30 ", "")).malformed == 1  # one without the other is not
    two = counters.parse(text + "\n" + counters.stats_line(100, 0, "l1", 16, 4, 0, C, 10, 40))
    t = counters.delta(counters.Parsed(), two)["total"]
    assert (t["device_bytes"], t["resident_bytes"], t["device_share"]) == (40, 160, 0.25)
    t = counters.delta(counters.Parsed(), counters.parse(text + "\n" + _stats(layer="l1")))["total"]
    assert (t["device_bytes"], t["resident_bytes"], t["device_share"]) == (None, None, None)  # one layer did not say


def test_summary_line_parses_back():
    text = counters.summary_line(7, 1, 2, 3, 4, -1, 0.99)
    assert text == "R9K-MOE-CACHE pid=7 rank=1 layers=2 moe_layers=3 slots=4 staging=0 thresh=0.99"
    (s,) = counters.parse(text).summaries
    assert (s.pid, s.rank, s.layers, s.moe_layers, s.slots, s.staging, s.thresh) == (7, 1, 2, 3, 4, 0, 0.99)


@pytest.mark.parametrize("line", [
    _stats().replace(" bytes=12", ""),                      # a counter missing
    _stats().replace("hits=5", "hits=-5"),                  # negative
    _stats().replace("hits=5", "hits=05"),                  # leading zero
    _stats().replace("hits=5", "hits=5.0"),                 # not an integer
    _stats().replace("hits=5", "hits=99999999999999999999"),  # more than 19 digits
    _stats() + " hits=500",                                 # a second value after the line
    _stats().replace("rank=0", "rank=0 rank=1"),
    "(EngineCore pid=101) " + _stats(),                     # vLLM's prefix names another process
    "R9K-MOE-CACHE-STATS",
    "R9K-MOE-CACHE pid=7 rank=0 layers=two moe_layers=2 slots=4 staging=12 thresh=0.99",
    "R9K-MOE-CACHE pid=7 rank=0 layers=2 moe_layers=2 slots=4 staging=12 thresh=2.5",
])
def test_malformed_lines_are_counted_never_read(line):
    p = counters.parse(f"{line}\n")
    assert p.stats == [] and p.summaries == [] and p.malformed == 1


def test_text_inside_a_line_is_not_a_line():
    """A prompt that vLLM logs (or another separator inside one logged line) cannot make a counter line."""
    p = counters.parse(f"INFO Received request: prompt='{_stats()}'\nx\u2028{_stats()}\n")
    assert p.stats == [] and p.malformed == 0


def test_delta_is_the_suites_share_summed_over_layers():
    before = counters.parse(_stats() + "\n" + _stats(layer="l1"))
    during = counters.parse("\n".join([_stats(scale=2), _stats(scale=3), _stats(layer="l1", scale=5),
                                       _stats(layer="l2", scale=2)]))
    d = counters.delta(before, during)
    rows = {r["layer"]: r for r in d["layers"]}
    assert rows["model.layers.0.mlp.experts"]["hits"] == 3 * 5 - 5      # latest less the one before the suite
    assert rows["l1"]["hits"] == 5 * 5 - 5 and rows["l2"]["hits"] == 2 * 5  # no line before: from 0
    assert rows["l2"]["distinct_max"] == 8  # a maximum is not differenced
    t = d["total"]
    assert t["hits"] == 10 + 20 + 10 and t["distinct"] == (9 - 3) + (15 - 3) + 6
    assert t["hit_rate"] == pytest.approx(40 / 24) and t["distinct_per_step"] == pytest.approx(24 / 8)
    assert d["malformed"] == 0


def test_delta_after_a_restart_starts_from_zero():
    """Counters that went down are a new process's (same pid reused): the suite's share is the new counters."""
    d = counters.delta(counters.parse(_stats(scale=10)), counters.parse(_stats(scale=2)))
    assert d["layers"][0]["hits"] == 10


def test_moe_counters_never_raises_on_a_hostile_log(tmp_path):
    log = tmp_path / "server.log"
    log.write_bytes(_stats().encode() + b"\n\xff\xfe garbage\n" + _stats().replace("hits=5", "hits=x").encode()
                    + b"\nR9K-MOE-CACHE-STATS pid=1\n")
    start = len(_stats()) + 1
    out = moe_counters(log, start)
    assert out["total"] is None and out["layers"] == [] and out["malformed"] == 2
    assert list(moe_counters(tmp_path / "missing.log", 0)) == ["error"]
    assert moe_counters(tmp_path / "missing.log", 0)["error"].startswith("FileNotFoundError")
    assert moe_counters(None, 0) is None
    log.write_text("nothing of the cache\n")
    assert moe_counters(log, 0) is None


def test_plugin_inactive_when_no_layer_took_the_cache():
    cfg = _cfg(R9K_MOE_CACHE_SLOTS="4")
    lines = _prov(100, 101)
    none = "R9K-MOE-CACHE pid=101 rank=0 layers=0 moe_layers=2 slots=4 staging=0 thresh=0.99"
    assert check_dispatch(cfg, lines, none) == ("R9K_MOE_CACHE_SLOTS=4 asks for the expert cache, but no MoE layer took "
                                                "it in pid 101 (rank 0: 0 of 2 MoE layers)")
    assert check_dispatch(cfg, lines, "").startswith("R9K_MOE_CACHE_SLOTS=4 asks for the expert cache, but no server "
                                                     "process printed an R9K-MOE-CACHE line")
    # a line of a process that printed no provenance line (a forged or stale one) does not count
    forged = none.replace("pid=101", "pid=999").replace("layers=0", "layers=2")
    assert "no server process printed" in check_dispatch(cfg, lines, forged)
    ok = none.replace("layers=0", "layers=2")
    assert check_dispatch(cfg, lines, ok) is None
    assert check_dispatch(cfg, lines, "(EngineCore pid=101) " + ok) is None
    # the dispatch itself missing is said as for the other dispatches
    assert "asks for the moe_cache dispatch, which 2 of 2" in check_dispatch(cfg, _prov(100, 101, dispatch="-"), ok)
    # stock: nothing asked
    assert check_dispatch(_cfg(R9K_MOE_CACHE_SLOTS="0"), _prov(100, 101, dispatch="-"), "") is None


class _Rec:
    def __init__(self, mc):
        self.moe_cache = mc


def test_notes_rows_skip_what_the_log_did_not_say():
    good = counters.delta(counters.Parsed(), counters.parse(_stats() + "\n" + _stats(layer="l1")))
    rows = moe_rows({"cpu-moe": {"sanity": _Rec(good), "probe": _Rec({"total": "x", "layers": []}),
                                 "soak": _Rec({"error": "OSError"}), "gsm8k": _Rec(None)}})
    assert len(rows) == 1
    r = rows[0]
    assert (r.config, r.suite, r.layers, r.shape) == ("cpu-moe", "sanity", 2, "4 + 12 of 16")
    assert r.total["inserts"] == 14 and r.mib == 24 / 2**20


def test_the_notes_show_what_the_caches_hold_against_all_resident(tmp_path):
    """The seeds' figure: 270 of 512 slots read through hold about half of the experts' bytes; a counter line that
    did not say its memory shows a dash, never a number."""
    from tests.conftest import REPO
    from tests.validate.test_records_render import PROBE, rec
    from validate.record import record_path, write_record
    from validate.render import render_release

    held = counters.stats_line(100, 0, "l0", 512, 270, 0, C, device_bytes=426_076_160, resident_bytes=805_306_368)
    for cfg, text in (("h200-next", held), ("fn-tp2", _stats())):
        r = rec(cfg, "probe", metrics=PROBE)
        r.moe_cache = counters.delta(counters.Parsed(), counters.parse(text))
        write_record(record_path(tmp_path, "v9", cfg, "probe"), r)
    md = render_release(REPO, tmp_path, "v9", None).read_text()
    section = md.split("## The expert cache", 1)[1].split("\n## ", 1)[0]
    assert "| h200-next | probe | 1 | 270 + 0 of 512 | 406.3 MiB (0.53) | 1 |" in section
    assert "| fn-tp2 | probe | 1 | 4 + 12 of 16 | – | 1 |" in section


def test_a_process_restarted_in_the_suite_holds_its_layers_once():
    old = counters.stats_line(100, 0, "l0", 16, 4, 0, C, device_bytes=30, resident_bytes=120)
    new = counters.stats_line(200, 0, "l0", 16, 4, 0, C, device_bytes=40, resident_bytes=120)
    t = counters.delta(counters.Parsed(), counters.parse(f"{old}\n{new}"))["total"]
    assert (t["device_bytes"], t["resident_bytes"]) == (40, 120)  # the latest process's, not both summed
    assert t["hits"] == 2 * C["hits"]  # the counters still add both processes' work

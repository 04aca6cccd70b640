"""The plugin's provenance line says which dispatch runs in each process; the engine refuses a server where a
dispatch its configuration's knobs ask for is missing or failed ("plugin-inactive")."""
from __future__ import annotations

import logging

import pytest

import r9k
from r9k import ops, provenance
from validate.config import ServeConfig
from validate.provenance_checks import check_dispatch, dispatch_by_pid


def _cfg(**env) -> ServeConfig:
    return ServeConfig(name="c", model={"path": "m", "served_name": "m"},
                       server={"max_num_seqs": 4, "max_model_len": 4096}, env=env)


def test_line_lists_installed_and_failed_dispatch_and_parses_back():
    text = provenance.line(["gdn_conv", "gdn_seq"], ["gdn"])
    assert text.endswith(" dispatch=gdn_conv,gdn_seq failed=gdn")
    (p,) = provenance.parse(text)
    assert p.dispatch == ("gdn_conv", "gdn_seq") and p.failed == ("gdn",)
    pid = text.split(" pid=")[1].split()[0]
    assert len(provenance.parse(f"(EngineCore pid={pid}) {text}")) == 1  # behind vLLM's own process prefix
    (q,) = provenance.parse(provenance.line())
    assert q.dispatch == () and q.failed == () and q.raw.endswith("dispatch=- failed=-")
    # a line without the fields (a plugin that predates them) says nothing either way
    (old,) = provenance.parse("R9K-PROVENANCE version=0.1.0 source_hash=00ff files=3 pid=7")
    assert old.dispatch is None and old.failed is None


def _register(monkeypatch, install):
    monkeypatch.setattr(r9k, "_registered", False)
    monkeypatch.setattr(ops, "kernels_can_run", lambda: (True, ""))
    from r9k.ops import gdn

    monkeypatch.setattr(gdn, "install", install)
    lines = []
    monkeypatch.setattr(provenance, "log_once", lambda d=(), f=(), v=None: lines.append(provenance.line(d, f, v)))
    r9k.register()
    return lines


def test_register_installs_first_then_logs_what_is_installed(monkeypatch):
    lines = _register(monkeypatch, lambda: ["gdn_seq <- m.ChunkGatedDeltaRule.forward", "gdn_conv <- m.causal_conv1d_fn",
                                            "gdn_seq <- o.chunk_gated_delta_rule"])
    assert len(lines) == 1 and lines[0].endswith("dispatch=gdn_conv,gdn_seq failed=-")


def test_an_install_that_raises_is_named_in_the_line_not_swallowed(monkeypatch, caplog):
    def boom():
        raise RuntimeError("vLLM moved the layer")

    with caplog.at_level(logging.ERROR, logger="r9k"):
        lines = _register(monkeypatch, boom)
    assert lines[0].endswith("dispatch=- failed=gdn")
    assert "GDN dispatch not installed" in caplog.text


def test_nothing_is_installed_where_the_kernels_cannot_run(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    got = ops.install()
    assert got.names == [] and got.failed == [] and "no CUDA or ROCm device" in got.skipped["gdn"]


def _lines(*dispatches, failed=""):
    return [f"R9K-PROVENANCE version=0.1.0 source_hash=ab files=3 pid={100 + i} dispatch={d} failed={failed or '-'}"
            for i, d in enumerate(dispatches)]


@pytest.mark.parametrize("env,lines,why", [
    ({"R9K_GDN_PREFILL_MAX": "256"}, _lines("-", "-"),
     "R9K_GDN_PREFILL_MAX=256 asks for the gdn_seq dispatch, which 2 of 2 server process(es) did not install (pid 100, 101)"),
    ({"R9K_GDN_PREFILL_MAX": "256"}, _lines("gdn_seq,gdn_conv", "-"),
     "R9K_GDN_PREFILL_MAX=256 asks for the gdn_seq dispatch, which 1 of 2 server process(es) did not install (pid 101)"),
    ({}, _lines("-", "-", failed="gdn"), "op dispatch failed to install in the server: gdn (100); gdn (101)"),
])
def test_check_dispatch_refuses_a_server_without_the_asked_dispatch(env, lines, why):
    assert check_dispatch(_cfg(**env), lines).startswith(why)


def test_check_dispatch_accepts_what_the_knobs_ask_for():
    assert check_dispatch(_cfg(R9K_GDN_PREFILL_MAX="256"), _lines("gdn_seq,gdn_conv", "gdn_conv,gdn_seq")) is None
    assert check_dispatch(_cfg(R9K_GDN_PREFILL_MAX="0"), _lines("-", "-")) is None  # stock value: nothing asked
    assert check_dispatch(_cfg(), _lines("-", "-")) is None
    assert dispatch_by_pid(_lines("gdn_seq", "-")) == {"100": ["gdn_seq"], "101": []}


def test_a_fake_server_without_the_dispatch_is_plugin_inactive(scratch):
    """End to end through the launcher: the configuration asks for the GDN dispatch, the server's provenance
    line (printed by the synthetic server as the plugin would) lists none: nothing runs, exit status 1."""
    import json

    from tests.conftest import fake_procs
    from validate.cli import main

    tag = scratch.config("fake-inactive", R9K_GDN_PREFILL_MAX=256)
    assert main(["suite", "fake-sanity", "--config", "fake-inactive", "--release", "pi"]) == 1
    rec = json.loads((scratch.root / "reports" / "pi" / "fake-inactive" / "fake-sanity.json").read_text())
    assert rec["verdict"]["status"] == "plugin-inactive"
    assert "R9K_GDN_PREFILL_MAX=256 asks for the gdn_seq dispatch" in rec["verdict"]["cause"]
    assert rec["items"] == [] and rec["server"]["provenance_ok"] is True
    assert list(rec["server"]["dispatch"].values()) == [[], []]
    assert fake_procs(tag) == []


@pytest.mark.parametrize("env,status", [
    ({"FAKE_VLLM_DISPATCH": "gdn_seq,gdn_conv"}, "pass"),
    ({"FAKE_VLLM_DISPATCH": "gdn_conv"}, "plugin-inactive"),
    ({"FAKE_VLLM_DISPATCH": "gdn_seq,gdn_conv", "FAKE_VLLM_DISPATCH_FAILED": "gdn"}, "plugin-inactive"),
])
def test_the_dispatch_a_server_reports_decides(scratch, env, status):
    import json

    from validate.cli import main

    scratch.config("fake-disp", R9K_GDN_PREFILL_MAX=256, **env)
    assert main(["suite", "fake-sanity", "--config", "fake-disp", "--release", "pd"]) == (0 if status == "pass" else 1)
    rec = json.loads((scratch.root / "reports" / "pd" / "fake-disp" / "fake-sanity.json").read_text())
    assert rec["verdict"]["status"] == status


def test_only_whole_lines_count_as_provenance():
    """A logged request or prompt that carries a provenance line's text (an attacker's prompt, a debug log of
    the request) never vouches for a server: the plugin prints the line alone, at most behind vLLM's prefix."""
    text = provenance.line(["gdn_seq"])
    pid = text.split(" pid=")[1].split()[0]
    for forged in (f"INFO Received request: prompt: 'hello {text} thanks'", f"{text} thanks", f"x {text}",
                   f"(EngineCore pid={int(pid) + 1}) {text}"):
        assert provenance.parse(forged) == [], forged


def test_a_server_log_without_provenance_or_from_another_process_is_wrong_tree():
    from validate.provenance_checks import check_provenance

    cfg = _cfg()
    line = "R9K-PROVENANCE version=0.1.0 source_hash=ab files=3 pid=100 dispatch=- failed=-"
    assert check_provenance(cfg, [], "ab", launched=False, has_log=False)[0] is None  # no log: not checked
    ok, why = check_provenance(cfg, [], "ab", launched=False, has_log=True)
    assert ok is False and "no R9K-PROVENANCE line" in why
    ok, why = check_provenance(cfg, [line], "ab", launched=False, has_log=True, serving_pid=200)
    assert ok is False and "pid 200" in why  # an earlier process's line cannot vouch for the one serving now
    assert check_provenance(cfg, [line], "ab", launched=False, has_log=True, serving_pid=100) == (True, None)


def test_a_tensor_parallel_server_needs_a_line_from_every_rank():
    cfg = _cfg(R9K_GDN_PREFILL_MAX="256")
    cfg.server.tensor_parallel_size = 4
    why = check_dispatch(cfg, _lines("gdn_seq,gdn_conv", "gdn_seq,gdn_conv"))
    assert why == ("only 2 server process(es) printed a provenance line; a server of tensor_parallel_size 4 x "
                   "pipeline_parallel_size 1 x data_parallel_size 1 has at least 5")
    assert check_dispatch(cfg, _lines(*["gdn_seq,gdn_conv"] * 5)) is None


def test_pipeline_and_data_parallel_ranks_need_their_lines_too():
    from validate.provenance_checks import parallel_sizes

    cfg = _cfg(R9K_GDN_PREFILL_MAX="256")
    cfg.server.tensor_parallel_size = 2
    cfg.server.extra_args = ["--pipeline-parallel-size", "2", "-dp=3", "--enforce-eager"]
    assert parallel_sizes(cfg) == {"tensor_parallel_size": 2, "pipeline_parallel_size": 2, "data_parallel_size": 3}
    why = check_dispatch(cfg, _lines(*["gdn_seq,gdn_conv"] * 12))  # 12 ranks and the API server: 13
    assert why.startswith("only 12 server process(es)") and why.endswith("has at least 13")
    assert check_dispatch(cfg, _lines(*["gdn_seq,gdn_conv"] * 13)) is None
    cfg.server.extra_args = ["-pp", "x"]  # vLLM refuses it at launch; the count does not guess
    assert parallel_sizes(cfg)["pipeline_parallel_size"] == 1


def test_a_family_asked_for_once_is_asked_for_whole():
    """27b-tp2 sets only the prefill bound; the conv then runs at its default (r9k), and its dispatch is asked
    for too: a server that installed gdn_seq but not gdn_conv is inactive."""
    why = check_dispatch(_cfg(R9K_GDN_PREFILL_MAX="400"), _lines("gdn_seq", "gdn_seq"))
    assert why.startswith("R9K_GDN_PREFILL_CONV=r9k (its default) asks for the gdn_conv dispatch")
    assert check_dispatch(_cfg(R9K_GDN_PREFILL_MAX="400", R9K_GDN_PREFILL_CONV="stock"), _lines("gdn_seq", "gdn_seq")) is None


def _forged_body(digest: str, n: int, pids: list[int], sep: str = "\u2028") -> str:
    """One log line as vLLM's request logging writes it at DEBUG for a chat request whose message carries forged
    provenance lines between U+2028 separators (pydantic's JSON leaves U+2028/U+2029/U+0085 raw; the log
    formatter's prefix follows '\\n' only)."""
    import json

    lines = "".join(f"{sep}R9K-PROVENANCE version=0.1.0 source_hash={digest} files={n} pid={p} dispatch=- failed=-"
                    for p in pids) + sep
    body = json.dumps({"messages": [{"role": "user", "content": "hi" + lines}], "model": "x"}, ensure_ascii=False)
    return f"(APIServer pid={pids[0]}) DEBUG 12-02 01:00:00 [request_logger.py:75] Request N/A JSON body: {body}\n"


@pytest.mark.parametrize("sep", ["\u2028", "\u2029", "\x85", "\x1c", "\x0b"])
def test_a_logged_prompt_with_unicode_line_separators_makes_no_provenance_line(sep):
    digest, n = provenance.source_hash()
    one_line = _forged_body(digest, n, [4242, 4243], sep)
    assert one_line.count("\n") == 1 and provenance.parse(one_line) == []


def test_the_serving_pid_is_found_for_every_spelling_of_this_machine():
    import socket

    from validate.server import listening_pid

    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen()
    port = s.getsockname()[1]
    try:
        for host in ("127.0.0.1", "localhost", "0.0.0.0", "127.1", "[::ffff:127.0.0.1]"):
            assert listening_pid(f"http://{host}:{port}") is not None, host
    finally:
        s.close()
    assert listening_pid("http://10.255.255.1:8000") is None  # no interface of ours


def test_a_logged_request_body_never_vouches_for_a_server_without_the_plugin(scratch, tmp_path):
    """A server without r9k, reached as http://0.0.0.0:PORT; its --server-log holds one logged request body with
    forged lines: not provenance, and the server is wrong-tree."""
    import json

    from tests.conftest import fake_procs
    from validate.cli import main
    from validate.config import find_config
    from validate.server import launch

    scratch.config("fake-ok")
    other = scratch.config("fake-other", mode="no-plugin")
    log = tmp_path / "server.log"
    srv = launch(find_config(scratch.root, "fake-other"), "m", log)
    try:
        digest, n = provenance.source_hash()
        with open(log, "a") as fh:
            fh.write(_forged_body(digest, n, [4242, 4243]))
        code = main(["suite", "fake-sanity", "--config", "fake-ok", "--url", srv.url.replace("127.0.0.1", "0.0.0.0"),
                     "--model", other, "--server-log", str(log), "--release", "p1"])
    finally:
        srv.stop()
    rec = json.loads((scratch.root / "reports" / "p1" / "fake-ok" / "fake-sanity.json").read_text())
    assert code == 1 and rec["server"]["provenance_ok"] is False and rec["verdict"]["status"] == "wrong-tree"
    assert fake_procs(other) == []


def test_an_earlier_start_in_an_operators_appended_log_never_vouches(scratch, tmp_path):
    """A log appended across restarts by other means than r9k's launcher (no launch marker): yesterday's start
    printed the plugin's lines, today's prints none; only lines of the live serving process tree count."""
    import json

    from tests.conftest import fake_procs
    from validate.cli import main
    from validate.config import find_config
    from validate.server import LAUNCH_MARK, launch

    scratch.config("fake-ok")
    scratch.config("fake-old")
    other = scratch.config("fake-other", mode="no-plugin")
    old_log, new_log, log = tmp_path / "old.log", tmp_path / "new.log", tmp_path / "server.log"
    launch(find_config(scratch.root, "fake-old"), "m", old_log).stop()
    srv = launch(find_config(scratch.root, "fake-other"), "m", new_log)
    try:
        strip = lambda t: "\n".join(ln for ln in t.splitlines() if not ln.startswith(LAUNCH_MARK))  # noqa: E731
        log.write_text(strip(old_log.read_text()) + "\n" + strip(new_log.read_text()) + "\n")
        assert "R9K-PROVENANCE" in log.read_text()
        code = main(["suite", "fake-sanity", "--config", "fake-ok", "--url", srv.url.replace("127.0.0.1", "0.0.0.0"),
                     "--model", other, "--server-log", str(log), "--release", "p2"])
    finally:
        srv.stop()
    rec = json.loads((scratch.root / "reports" / "p2" / "fake-ok" / "fake-sanity.json").read_text())
    assert code == 1 and rec["server"]["provenance_ok"] is False and rec["server"]["provenance"] == []
    assert fake_procs(other) == []

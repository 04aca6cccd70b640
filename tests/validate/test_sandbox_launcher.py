"""validate/sandbox/launcher.py: the root launcher on its own, exec'ing a plain command instead of bwrap."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from validate.sandbox import launcher, program

pytestmark = pytest.mark.timeout(60)


def launch(argv: list[str], uid: int = 65534) -> subprocess.CompletedProcess:
    spec = {"uid": uid, "hide": [], "argv": argv, "close": []}
    return subprocess.run([sys.executable, "-I", "-c", program("launcher"), json.dumps(spec)], capture_output=True,
                          text=True, timeout=30)


def test_id_map():
    assert launcher.id_map(65534) == "65534 65534 1\n"


@pytest.mark.skipif(os.geteuid() != 0, reason="the launcher is the root path (it maps uid 65534 to itself)")
def test_the_command_runs_as_uid_65534_outside_with_no_groups():
    r = launch(["/bin/sh", "-c", "id -u; id -g; id -G; cat /proc/self/uid_map"])
    if r.returncode == 125 and "unshare" in r.stderr:
        pytest.skip(f"no user namespaces here: {r.stderr.strip()}")
    assert r.returncode == 0, r.stderr
    uid, gid, groups, uid_map = r.stdout.splitlines()
    assert (uid, gid, groups) == ("65534", "65534", "65534") and uid_map.split() == ["65534", "65534", "1"]


@pytest.mark.skipif(os.geteuid() != 0, reason="the launcher is the root path")
def test_exit_status_is_the_commands_and_a_signal_is_128_plus_it():
    r = launch(["/bin/sh", "-c", "exit 3"])
    if r.returncode == 125 and "unshare" in r.stderr:
        pytest.skip(f"no user namespaces here: {r.stderr.strip()}")
    assert r.returncode == 3
    assert launch(["/bin/sh", "-c", "kill -9 $$"]).returncode == 128 + 9


def test_a_command_that_cannot_start_is_125_with_the_reason():
    r = launch(["/nonexistent/bwrap"])
    assert r.returncode == 125 and r.stderr.startswith("sandbox launcher: ")

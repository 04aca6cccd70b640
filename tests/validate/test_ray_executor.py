"""Runs tests/ray_cases.py (a real two-node Ray cluster) inside a private network namespace with only
loopback, so every byte Ray sends stays on 127.0.0.1 (Ray otherwise binds to the primary interface)."""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys

import pytest

from tests.conftest import REPO


def _netns_ok() -> bool:
    if not shutil.which("unshare") or not shutil.which("ip"):
        return False
    r = subprocess.run(["unshare", "-n", "true"], capture_output=True)
    return r.returncode == 0


@pytest.mark.skipif(not _netns_ok(), reason="needs unshare -n (root or user namespaces) and iproute2")
@pytest.mark.skipif(shutil.which("ray", path=os.path.dirname(sys.executable)) is None, reason="ray is not installed")
def test_ray_executor_in_a_loopback_only_namespace():
    inner = f"ip link set lo up && exec {sys.executable} -m pytest tests/ray_cases.py -q -p no:cacheprovider -x"
    r = subprocess.run(["unshare", "-n", "sh", "-c", inner], cwd=REPO, capture_output=True, text=True, timeout=900,
                       env={**os.environ, "RAY_USAGE_STATS_ENABLED": "0", "PATH": os.path.dirname(sys.executable) + ":" + os.environ.get("PATH", "")})
    tail = (r.stdout + r.stderr)[-4000:]
    assert r.returncode == 0, tail
    m = re.search(r"(\d+) passed", r.stdout)
    assert m and int(m.group(1)) == 3, tail

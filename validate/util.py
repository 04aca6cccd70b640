"""Small shared helpers: hashing, repository paths, git state."""
from __future__ import annotations

import hashlib
import subprocess
from pathlib import Path


def sha256_text(text: str, n: int = 16) -> str:
    """First ``n`` hex digits of SHA-256 of ``text`` (UTF-8)."""
    return hashlib.sha256(text.encode()).hexdigest()[:n]


def sha256_file(path: Path) -> str:
    """Full hex SHA-256 of a file's bytes."""
    h = hashlib.sha256()
    with path.open("rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def repo_root() -> Path:
    """The checkout this package runs from (holds serve/, suites/, templates/)."""
    return Path(__file__).resolve().parent.parent


def git_state(root: Path) -> tuple[str | None, bool | None]:
    """(HEAD commit, dirty?) of the git checkout at ``root``; (None, None) outside git.

    Dirty counts tracked changes and untracked files that git does not ignore (records under reports/ are
    ignored, so a run does not dirty its own tree).
    """
    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, check=True).stdout.strip()
        status = subprocess.run(["git", "status", "--porcelain"], cwd=root, capture_output=True, text=True, check=True).stdout
        return commit, bool(status.strip())
    except (subprocess.CalledProcessError, FileNotFoundError):
        return None, None


async def within(aw, seconds: float):
    """``await aw``, at most ``seconds`` in all; raises TimeoutError (asyncio.TimeoutError) past it.

    asyncio.timeout, not asyncio.wait_for: on Python 3.11 wait_for returns the result of an awaitable that
    completes as the waiting task is cancelled, swallowing the cancellation (CPython gh-86296), so a Ctrl-C
    that lands then is lost and the suite runs on.
    """
    import asyncio

    async with asyncio.timeout(seconds):
        return await aw



def atomic_write(path: Path, data: bytes) -> Path:
    """Write ``data`` at ``path`` atomically: a temp file in the same folder, written, flushed and fsynced, mode
    0644, renamed over ``path`` (the folder is made first). A failure leaves the old file, never a torn one.
    Raises OSError when the folder cannot be written."""
    import os
    import tempfile

    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=path.name + ".", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path

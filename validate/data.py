"""Where evaluation data comes from: ``--data-dir``, ``R9K_DATA_DIR``, or ``../shared/data`` beside the checkout.

Data files are never committed; they are read where they are.
"""
from __future__ import annotations

import os
from pathlib import Path

from validate.errors import InputError
from validate.util import repo_root

DATA_ENV = "R9K_DATA_DIR"


def default_data_dir() -> Path:
    """``../shared/data`` beside the checkout."""
    return repo_root().parent / "shared" / "data"


def resolve_data_dir(cli_value: str | None = None) -> Path | None:
    """The data directory: the CLI option, else ``$R9K_DATA_DIR``, else the default when it exists, else None."""
    if cli_value:
        return Path(cli_value)
    if os.environ.get(DATA_ENV):
        return Path(os.environ[DATA_ENV])
    d = default_data_dir()
    return d if d.is_dir() else None


def needs_train_text(params, root: Path, data_dir: Path | None) -> None:
    """Preflight of suites that build prompts from real text (GSM8K train): the file must be there."""
    require_file(data_dir, "gsm8k/train.jsonl")


def require_file(data_dir: Path | None, relative: str) -> Path:
    """``data_dir / relative``, or InputError naming both ways to point at the data."""
    if data_dir is not None and (data_dir / relative).is_file():
        return data_dir / relative
    where = f"{data_dir / relative} not found" if data_dir else "no data directory found"
    raise InputError(
        f"{where}: pass --data-dir DIR or set {DATA_ENV}=DIR to a folder holding {relative} "
        f"(default: {default_data_dir()})"
    )

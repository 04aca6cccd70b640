"""The programs that contain and judge untrusted code, as real modules: each is also run as ``python -I -c``.

* :mod:`validate.sandbox.wire`: the wire format between judge and sandbox (tagged plain data, JSON frames);
* :mod:`validate.sandbox.isolation`: the sandbox, which contains itself and answers calls of the program;
* :mod:`validate.sandbox.judge`: the judge, which runs only the dataset's code and alone decides the verdict;
* :mod:`validate.sandbox.launcher`: for root, puts bwrap and the program under uid 65534 outside too.

They run on the base interpreter with ``-I`` (inside bubblewrap for the sandbox), where the project cannot be
imported, so each is self-contained (stdlib only) and :func:`program` hands its source text to ``-c``: the judge
and the sandbox get the wire format's source ahead of their own. What runs them, with which limits and backend,
is the caller's (:mod:`validate.evals.humaneval`).
"""
from __future__ import annotations

import functools
from pathlib import Path

_HERE = Path(__file__).resolve().parent
#: The programs :func:`program` gives, and the modules whose source each is made of, in order.
PROGRAMS = {"isolation": ("wire", "isolation"), "judge": ("wire", "judge"), "launcher": ("launcher",)}


@functools.cache
def program(name: str) -> str:
    """The source text that ``python -I -c`` runs for the program ``name`` (a key of :data:`PROGRAMS`).

    Raises:
        KeyError: an unknown program.
    """
    return "\n".join((_HERE / f"{part}.py").read_text(encoding="utf-8") for part in PROGRAMS[name])

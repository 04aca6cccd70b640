"""What a launched server leaves in a record of a configuration that asks for r9k's dispatch: its two processes'
provenance lines (API server and engine core, each installing what the knobs ask for) and call counts routing
calls to r9k in prefill and decode steps, as validate.audit asks of such a record."""
from __future__ import annotations

from r9k import knobs
from validate.record import Record


def with_dispatch(r: Record, env: dict[str, str]) -> Record:
    """``r`` with the provenance lines and ``r9k_calls`` of a server that ran the dispatch ``env``'s knobs ask for
    (r9k.knobs.expected_dispatch), stamped with ``r``'s source hash; unchanged where ``env`` asks for none."""
    want = sorted(knobs.expected_dispatch({k: v for k, v in env.items() if k.startswith("R9K_")}))
    if not want:
        return r
    r.server.provenance = [f"R9K-PROVENANCE version=0.1.0 source_hash={r.tree.source_hash} files=5 pid={p} "
                           f"dispatch={','.join(want)} failed=-" for p in (41, 42)]
    r.r9k_calls = {"steps": {"prefill": 60, "decode": 800, "other": 3},
                   "calls": [{"dispatch": d, "route": "r9k", "kind": k, "calls": 120}
                             for d in want for k in ("prefill", "decode")],
                   "per_step": {}, "processes": 2, "malformed": 0}
    return r

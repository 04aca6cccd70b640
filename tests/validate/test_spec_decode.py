"""Speculative-decoding acceptance reaches the record: a suite run through the engine against the synthetic
server speculating with known per-generation counts (``FAKE_VLLM_SPEC``, vLLM's metric names and labels) leaves
the exact drafts, accepted tokens, per-position rates and mean accepted length in
``server_metrics.delta.spec_decode``."""
from __future__ import annotations

import json

import pytest

from validate.cli import main

pytestmark = pytest.mark.timeout(120)


def test_the_record_keeps_the_servers_acceptance_by_position(scratch):
    # each generation: 4 drafts of 3 tokens; accepted 3 at position 0, 2 at position 1, 1 at position 2 (6 of 12)
    scratch.config("fake-spec", FAKE_VLLM_SPEC="4,3,2,1")
    assert main(["suite", "fake-sanity", "--config", "fake-spec", "--release", "sd"]) == 0
    rec = json.loads((scratch.root / "reports" / "sd" / "fake-spec" / "fake-sanity.json").read_text())
    sm = rec["server_metrics"]
    assert sm["available"] is True, sm
    n = rec["client"]["ok"]  # generations the suite finished (the launch's own ready check is before the start)
    assert n == rec["client"]["requests"] and n >= 5
    assert sm["delta"]["spec_decode"] == {
        "drafts": 4 * n, "draft_tokens": 12 * n, "accepted_tokens": 6 * n, "num_speculative_tokens": 3,
        "accepted_per_position": [3 * n, 2 * n, n], "acceptance_rate": 0.5, "mean_accepted_length": 2.5,
        "per_position": [0.75, 0.5, 0.25]}
    assert sm["delta"]["spec_acceptance_rate"] == 0.5 and "impossible" not in sm["delta"]


def test_a_server_that_does_not_speculate_has_no_metrics_to_invent(scratch):
    scratch.config("fake-plain")
    assert main(["suite", "fake-sanity", "--config", "fake-plain", "--release", "sd"]) == 0
    rec = json.loads((scratch.root / "reports" / "sd" / "fake-plain" / "fake-sanity.json").read_text())
    assert rec["server_metrics"] == {"available": False, "why": "GET /metrics answered HTTP 404"}

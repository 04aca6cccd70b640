"""Serving benchmarks: how far the validation engine's client and its BetterBench figures can be trusted
(benchmarks/README.md)."""

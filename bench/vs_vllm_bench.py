"""Moved to :mod:`benchmarks.serving.vs_vllm_bench`; this name stays only until tests/validate/test_synth_server.py
imports the new path (that file belongs to the engine's tests)."""
from benchmarks.serving.vs_vllm_bench import *  # noqa: F401,F403
from benchmarks.serving.vs_vllm_bench import parse_args, vllm_command  # noqa: F401

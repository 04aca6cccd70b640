"""The GPU host's environment: what an air-gapped GPU host without vLLM needs to run r9k's gates and kernel
benchmarks against vLLM 0.32.0's own Python code, built here into one archive (``python -m benchmarks.device_env
build``) and unpacked there by ``benchmarks/_device_env.sh``.

* ``pins.toml``: every wheel the host needs, with its exact version and why; the host's Python and platform.
* ``stand_ins/``: tracked stand-ins for vLLM's compiled modules (``_C_stable_libtorch``, ``vllm_flash_attn``) and
  vLLM's dist-info.
* ``closure.py``: the import closure of modules, read with ``ast``; ``check.py``: what of it the host would lack.
* ``build.py``: download, check, pack.
"""

"""r9k's Triton kernels, one subpackage per family, each holding its kernels, its references (``reference.py``,
float64 or plain PyTorch) and its public API in ``__init__.py``:

* :mod:`kernels.gdn`: Gated DeltaNet prefill (``gdn_seq``, ``gdn_conv``);
* :mod:`kernels.fp8`: block-scaled fp8 activation quant, GEMM and linear (``fp8_quant_group``,
  ``fp8_block_gemm``, ``fp8_linear``), Triton and Gluon kernels;
* :mod:`kernels.moe`: the expert cache and the fused top-k sum (``ExpertCache``, ``moe_topk_sum``);
* :mod:`kernels.allreduce`: the one-shot all-reduce over peer memory (``OneShotAllReduce``).

Shared: :mod:`kernels._launch` (the cached launch path) and :mod:`kernels._util` (host helpers). The package
imports nothing of the plugin (r9k/); the design and the figures of each family: docs/kernels/<family>.md.
"""

"""Triton kernels of r9k, each module beside its pure-PyTorch reference."""

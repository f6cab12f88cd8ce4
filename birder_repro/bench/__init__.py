"""Benchmarks: ``make bench`` (kernels) and the 1-bit Adam hook's compression (onebit)."""

"""Counting a code path's device-to-host reads on the CPU, where nothing synchronises.

On a GPU each of these reads of a tensor waits for the device (a host sync): ``.item()``, ``.tolist()``,
``.cpu()``, ``float()``, ``int()``, ``bool()``. On the CPU they cost nothing, so a test counts the calls instead:
a code path that reads once per step on the CPU syncs once per step on a GPU.
"""

from __future__ import annotations

import contextlib

import torch

READS = ("item", "tolist", "cpu", "__float__", "__int__", "__bool__")


@contextlib.contextmanager
def counted_reads(monkeypatch):
    """Yields a list that gets one entry (the method's name) per tensor read while the block runs."""
    reads: list[str] = []

    def counting(name, real):
        def read(self, *args, **kwargs):
            reads.append(name)
            return real(self, *args, **kwargs)

        return read

    with monkeypatch.context() as patch:
        for name in READS:
            patch.setattr(torch.Tensor, name, counting(name, getattr(torch.Tensor, name)))
        yield reads

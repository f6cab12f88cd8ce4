"""An fp16 overflow on one rank at one step, for the runner's 2-process fp16 run in ``make gpu-check``.

``BIRDER_GPUCHECK_OVERFLOW=<rank>:<call>``: on that rank, the ``<call>``-th ``GradScaler.scale`` (one a
micro-batch) returns the scaled loss times 2^24 more, so that its fp16 backward overflows. A correct run then
skips that step on every rank (the hook turns the overflowing bucket into inf, GradScaler's found-inf check
sees it), halves the scale once and completes: the record's ``nonfinite_steps`` is 1 and its ``loss_scale``
half of GradScaler's initial 2^16. Without an injected overflow the tiny runs never overflow at all.
"""

from __future__ import annotations

from pathlib import Path

ENV = "BIRDER_GPUCHECK_OVERFLOW"
FACTOR = 2.0**24
# Python imports ``sitecustomize`` at start-up from a folder on PYTHONPATH: :func:`site_dir` writes this one for
# the run that asks for an overflow, so that torchrun's workers (which have RANK; the CLI has not) install it.
SITECUSTOMIZE = f"""import os

if os.environ.get({ENV!r}) and "RANK" in os.environ:
    from birder_repro.gpucheck.overflow import install

    install(os.environ[{ENV!r}], int(os.environ["RANK"]))
"""


def parse(spec: str) -> tuple[int, int]:
    """``"<rank>:<call>"`` as (rank, call)."""
    try:
        rank, call = (int(x) for x in spec.split(":"))
    except ValueError:
        raise ValueError(f"{ENV}={spec!r}: use <rank>:<call>, e.g. 1:3") from None
    return rank, call


def site_dir(folder: Path) -> Path:
    """``folder`` holding the ``sitecustomize.py`` that installs the overflow (put it on PYTHONPATH)."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "sitecustomize.py").write_text(SITECUSTOMIZE)
    return folder


def install(spec: str, rank: int) -> None:
    """Wrap ``torch.amp.GradScaler.scale`` in this process (``rank``) as ``spec`` says."""
    import torch

    want_rank, call = parse(spec)
    if rank != want_rank:
        return
    original, calls = torch.amp.GradScaler.scale, [0]

    def scale(self, outputs):
        calls[0] += 1
        scaled = original(self, outputs)
        return scaled * FACTOR if calls[0] == call else scaled

    torch.amp.GradScaler.scale = scale

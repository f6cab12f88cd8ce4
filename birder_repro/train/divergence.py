"""Runs that diverge stop: ``train.diverge_after`` consecutive non-finite steps end the run on every rank.

A step counts as non-finite when its training loss is NaN or Inf on some rank, or when the compressed hooks
skipped it for a non-finite gradient (:mod:`birder_repro.comm.nonfinite`: the hook state's ``nonfinite_steps``
grew). A run that stays there does not train: the baselines apply the NaN to their parameters, the compressed
hooks skip every step, and either way the run would end at chance accuracy and be tabled as if it had trained.

Every rank decides from the same agreed flag: each step's local flag is summed over the processes (one
1-element all-reduce per step, outside the timed step), so all ranks count the same consecutive steps and
stop after the same one, none left waiting in a collective. The loop then raises :class:`Diverged`, which the
worker turns into a record with ``status: diverged``, ``diverged_at_step`` and a one-line ``error`` naming the
likely cause (:func:`likely_cause`). ``train.diverge_after=0`` turns the check (and its all-reduce) off.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch

from birder_repro.train.collectives import allreduce_sum

__all__ = ["Diverged", "DivergenceWatch", "likely_cause"]

ONEBIT = ("onebit_adam", "onebit_adam_precond", "onebit_lamb")


class Diverged(Exception):
    """The run stopped: ``step`` is the last step taken, ``line`` says since when and the likely cause."""

    def __init__(self, step: int, line: str):
        super().__init__(line)
        self.step, self.line = step, line


def likely_cause(optim: Any, since: int, lr: float, stage: str | None) -> str:
    """The likeliest reason a run went non-finite from step ``since`` (1-based) on, and what to change.

    ``optim``: the run's ``optim`` config; ``stage``: the hook's stage at that step (1-bit Adam / LAMB).
    """
    name = str(optim.get("name", ""))
    if name in ONEBIT and stage == "compression":
        return (
            "1-bit compression with a frozen variance: elements whose warmup gradients were near zero get "
            "the bucket's whole 1-bit scale divided by their tiny sqrt(v) (docs/optimizers.md, '1-bit Adam: the "
            "warmup'); set optim.compress_preconditioned=true, or lengthen optim.freeze"
        )
    return (
        f"a learning rate too large for this model and batch (lr {lr:g} at step {since}; optim.lr="
        f"{optim.get('lr')}): lower optim.lr, or set train.grad_clip"
    )


@dataclass
class DivergenceWatch:
    """Counts consecutive non-finite steps, agreed over every rank; raises :class:`Diverged` at the limit."""

    limit: int  # train.diverge_after (0: off)
    optim: Any  # the run's optim config (for the cause)
    device: torch.device
    run: int = 0  # consecutive non-finite steps so far
    since: int = 0  # the first of them (1-based)
    since_lr: float = math.nan
    since_stage: str | None = None
    skips_seen: int = 0  # the hook's nonfinite_steps at the last step
    # fp16 (train/precision.py): GradScaler's skipped steps are its normal search for a scale that does not
    # overflow (the hooks count them as non-finite too), so there only a non-finite loss counts
    count_skips: bool = True

    def after_step(self, step: int, loss_sum: float, comm: Any, lr: float, stage: str | None) -> None:
        """After step ``step`` (1-based; collective on every rank when the check is on)."""
        if not self.limit:
            return
        skips = int(getattr(comm, "nonfinite_steps", 0))
        local = (not math.isfinite(loss_sum)) or (self.count_skips and skips > self.skips_seen)
        self.skips_seen = skips
        if allreduce_sum([1.0 if local else 0.0], self.device)[0] == 0:
            self.run = 0
            return
        if self.run == 0:
            self.since, self.since_lr, self.since_stage = step, lr, stage
        self.run += 1
        if self.run >= self.limit:
            raise Diverged(step, self.line(step))

    def line(self, step: int) -> str:
        cause = likely_cause(self.optim, self.since, self.since_lr, self.since_stage)
        return (
            f"diverged at step {step}: non-finite training loss (or steps skipped for non-finite gradients) "
            f"on some rank for {self.run} consecutive steps, since step {self.since} "
            f"(train.diverge_after={self.limit}); likely cause: {cause}"
        )

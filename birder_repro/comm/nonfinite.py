"""Non-finite gradients in the compressed hooks: detect, agree, and skip the whole step on every rank alike.

A NaN or Inf reaching Birder's m, b, e or e_bar (or 1-bit Adam's errors) would stay there for the rest of the
run, and the stochastic sign would silently turn it into -1. So every compressed hook:

    Step I    checks its bucket's fp32 gradient on this rank (``local_flag``) before touching any state;
    Step II   sends the flag WITH the payload it exchanges anyway (one extra element of the fp32 reduce-scatter,
              one extra byte of the packed bits of the all-to-all / all-gather): no extra round trip, and every
              rank learns the same answer for the bucket (``note``);
    Step III  backs up the bucket's state before its first update of the step (``backup``), so that a skipped
              step can be undone for the buckets already processed, whatever bucket the NaN was in;
    Step IV   at the optimizer's step (``end_step``, called by the hook's optimizer): if any bucket of the step
              was non-finite, every bucket's state is restored, the optimizer leaves parameters and its own
              state untouched, and ``nonfinite_steps`` counts it; otherwise the backups are dropped.

``optim.comm.nonfinite=raise`` instead fails the step with an error naming the step and the bucket (on every
rank alike, since all ranks see the same flag), and keeps no backups.
"""

from __future__ import annotations

from typing import Optional

import torch

__all__ = ["MODES", "NonFiniteGuard", "local_flag"]

MODES = ("skip", "raise")


def local_flag(x: torch.Tensor) -> torch.Tensor:
    """1.0 where ``x`` holds a NaN or an Inf, else 0.0 (a 0-dim float32 tensor on x's device; no sync)."""
    return (~torch.isfinite(x)).any().to(torch.float32)


class NonFiniteGuard:
    """One hook state's account of non-finite buckets within the current step, and its backups."""

    __slots__ = ("mode", "rank", "nonfinite_steps", "_backups", "_flags", "_where")

    def __init__(self, mode: str = "skip", rank: int = 0):
        if mode not in MODES:
            raise ValueError(f"optim.comm.nonfinite={mode!r}: use one of {', '.join(MODES)}")
        self.mode, self.rank = mode, rank
        self.nonfinite_steps = 0
        self._backups: dict[int, tuple[int, dict[str, torch.Tensor]]] = {}  # id(bucket) -> (step, fields)
        self._flags: list[torch.Tensor] = []
        self._where: list[tuple[int, int]] = []  # (bucket index, bucket step) of every flag

    def backup(self, bucket) -> None:
        """Before the bucket's first state update of this step (skip mode only)."""
        if self.mode == "skip" and id(bucket) not in self._backups:
            # Into the bucket's own backup buffers, reused every step (a fresh clone costs 3x the copy).
            saved = {k: bucket.workspace(f"backup:{k}", t).copy_(t) for k, t in bucket.state.items()}
            self._backups[id(bucket)] = (bucket, bucket.step, saved)

    def note(self, flag: torch.Tensor, index: int, step: int) -> None:
        """The bucket's agreed flag (> 0: some rank's gradient was non-finite). Raise mode fails here."""
        if self.mode == "raise":
            if float(flag) > 0:
                raise FloatingPointError(f"non-finite gradient (NaN or Inf) in DDP bucket {index} at the hook's "
                                         f"step {step}, on some rank (optim.comm.nonfinite=raise)")
            return
        self._flags.append(flag.reshape(()).to(torch.float32))
        self._where.append((index, step))

    @property
    def skip_step(self) -> bool:
        """Whether the step in progress saw a non-finite gradient (reads the flags: syncs the device)."""
        return bool(self._flags) and bool(torch.stack([f.cpu() for f in self._flags]).sum() > 0)

    def end_step(self) -> bool:
        """At the optimizer's step: restore every bucket's state if the step is skipped; True if it is."""
        skip = self.skip_step
        if skip:
            for bucket, step, saved in self._backups.values():
                bucket.step = step
                for k, t in saved.items():
                    bucket.state[k].copy_(t)
            self.nonfinite_steps += 1
            if self.rank == 0:
                bad = [i for (i, _), f in zip(self._where, self._flags) if float(f) > 0]
                print(f"[birder-repro] non-finite gradient in bucket(s) {bad}: step skipped on every rank "
                      f"(parameters and optimizer state unchanged; {self.nonfinite_steps} skipped so far)",
                      flush=True)
        self._backups.clear()
        self._flags.clear()
        self._where.clear()
        return skip

    def state_dict(self) -> dict:
        return {"nonfinite_steps": self.nonfinite_steps}

    def load_state_dict(self, sd: Optional[dict]) -> None:
        self.nonfinite_steps = int((sd or {}).get("nonfinite_steps", 0))

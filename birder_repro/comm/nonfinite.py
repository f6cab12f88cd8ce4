"""Non-finite gradients in the compressed hooks: detect, agree, and skip the whole step on every rank alike.

A NaN or Inf reaching Birder's m, b, e or e_bar (or 1-bit Adam's errors) would stay there for the rest of the
run, and the stochastic sign would silently turn it into -1. So every compressed hook:

    Step I    checks its bucket's fp32 gradient on this rank (``local_flag``) before touching any state;
    Step II   sends the flag WITH the payload it exchanges anyway (one extra element of the fp32 reduce-scatter,
              one extra byte of the packed bits of the all-to-all / all-gather): no extra round trip, and every
              rank learns the same answer for the bucket (``note``);
    Step III  keeps the bucket's old state through its first update of the step, so that a skipped step can be
              undone for the buckets already processed, whatever bucket the NaN was in: Birder's kernels write
              the new state beside the old (``fresh`` / ``commit``: no copy), 1-bit Adam copies it first
              (``backup``);
    Step IV   at the optimizer's step (``end_step``, called by the hook's optimizer): if any bucket of the step
              was non-finite, every bucket's state is restored, the optimizer leaves parameters and its own
              state untouched, and ``nonfinite_steps`` counts it; otherwise the old states are let go.

``optim.comm.nonfinite=raise`` instead fails the step at the optimizer's step, before anything is applied, with
an error naming the step and the bucket (on every rank alike, since all ranks see the same flag), and keeps no
backups. Neither mode reads a flag inside the hook: on a GPU that read would synchronise the device once per
bucket; the flags are read once per step, at ``end_step``.
"""

from __future__ import annotations

import torch

__all__ = ["MODES", "NonFiniteGuard", "local_flag"]

MODES = ("skip", "raise")


def local_flag(x: torch.Tensor) -> torch.Tensor:
    """1.0 where ``x`` holds a NaN or an Inf, else 0.0 (a 0-dim float32 tensor on x's device).

    On CPU the sum decides first: a NaN or Inf anywhere makes it NaN or Inf, so a finite sum proves there is
    none, in one read of ``x`` with no temporary (``isfinite().any()`` writes a bool per element and costs ~20x
    the sum here); only a non-finite sum (some NaN or Inf, or a finite overflow) pays for the exact test. On
    CUDA the exact test runs without a branch, so without a host sync."""
    if x.device.type == "cpu" and bool(torch.isfinite(x.sum())):
        return torch.zeros((), dtype=torch.float32)
    return (~torch.isfinite(x)).any().to(torch.float32)


class _Undo:
    """What restores one bucket's state at a skipped step: its step counter, copies of fields (``backup``) and
    the old tensors of fields whose new values were written elsewhere (``fresh`` / ``commit``)."""

    __slots__ = ("bucket", "step", "copies", "swapped")

    def __init__(self, bucket):
        self.bucket, self.step = bucket, bucket.step
        self.copies: dict[str, torch.Tensor] = {}
        self.swapped: dict[str, torch.Tensor] = {}

    def restore(self) -> None:
        bucket = self.bucket
        bucket.step = self.step
        for k, t in self.copies.items():
            bucket.state[k].copy_(t)
        for k, old in self.swapped.items():
            bucket.set_workspace(f"next:{k}", bucket.state[k])
            bucket.state[k] = old


class NonFiniteGuard:
    """One hook state's account of non-finite buckets within the current step, and how to undo it.

    Two ways to keep the old state of a bucket (skip mode; raise mode keeps nothing):

        ``backup(bucket)``          copies every field before a hook updates them in place (1-bit Adam);
        ``begin`` / ``fresh`` / ``commit``  the kernels write the new values of some fields into spare buffers
                                    (``fresh``), which ``commit`` swaps in: the old tensors ARE the backup, at no
                                    cost (Birder's kernels, ``state_out``); the next step writes into them.
    """

    __slots__ = ("mode", "rank", "nonfinite_steps", "_undo", "_flags", "_where")

    def __init__(self, mode: str = "skip", rank: int = 0):
        if mode not in MODES:
            raise ValueError(f"optim.comm.nonfinite={mode!r}: use one of {', '.join(MODES)}")
        self.mode, self.rank = mode, rank
        self.nonfinite_steps = 0
        self._undo: dict[int, _Undo] = {}  # id(bucket) -> how to restore it
        self._flags: list[torch.Tensor] = []
        self._where: list[tuple[int, int]] = []  # (bucket index, bucket step) of every flag

    def begin(self, bucket) -> _Undo | None:
        """Before the bucket's first state update of this step: remember its step (skip mode only)."""
        if self.mode != "skip":
            return None
        undo = self._undo.get(id(bucket))
        if undo is None:
            undo = self._undo[id(bucket)] = _Undo(bucket)
        return undo

    def backup(self, bucket) -> None:
        """``begin``, and copies of every field, into the bucket's own buffers reused every step (a fresh clone
        costs 3x the copy)."""
        undo = self.begin(bucket)
        if undo is not None and not undo.copies:
            undo.copies = {k: bucket.workspace(f"backup:{k}", t).copy_(t) for k, t in bucket.state.items()}

    def fresh(self, bucket, *names: str) -> dict[str, torch.Tensor] | None:
        """Buffers for the new values of ``names`` (skip mode; None: update in place). Call ``commit`` after."""
        if self.mode != "skip":
            return None
        self.begin(bucket)
        return {k: bucket.workspace(f"next:{k}", bucket.state[k]) for k in names}

    def commit(self, bucket, new: dict[str, torch.Tensor] | None) -> None:
        """The fields of ``new`` (from ``fresh``) become the bucket's state; the old tensors are kept for a
        restore, and the next step writes into them."""
        if new is None:
            return
        undo = self._undo[id(bucket)]
        for k, t in new.items():
            old = bucket.state[k]
            bucket.state[k] = t
            bucket.set_workspace(f"next:{k}", old)
            undo.swapped.setdefault(k, old)

    def note(self, flag: torch.Tensor, index: int, step: int) -> None:
        """The bucket's agreed flag (> 0: some rank's gradient was non-finite), read at :meth:`end_step`: reading
        it here would synchronise the device once per bucket (both modes read the flags once per step)."""
        self._flags.append(flag.reshape(()).to(torch.float32))
        self._where.append((index, step))

    @property
    def pending(self) -> bool:
        """Whether buckets were noted since the last :meth:`end_step` (a step the optimizer has not closed)."""
        return bool(self._flags)

    def _read_flags(self, extra: torch.Tensor | None = None) -> list[float]:
        """Every flag noted this step (and ``extra`` last), read in one device-to-host copy: the device syncs
        once per step, not once per bucket."""
        flags = self._flags if extra is None else [*self._flags, extra.reshape(()).to(self._device_of(extra))]
        return torch.stack(flags).tolist() if flags else []

    def _device_of(self, extra: torch.Tensor) -> torch.device:
        return self._flags[0].device if self._flags else extra.device

    @property
    def skip_step(self) -> bool:
        """Whether the step in progress saw a non-finite gradient (reads the flags: syncs the device once)."""
        return any(f > 0 for f in self._read_flags())

    def end_step(self, found_inf: torch.Tensor | None = None) -> bool:
        """At the optimizer's step: restore every bucket's state if the step is skipped; True if it is. Raise
        mode fails here, naming the first non-finite bucket, before the optimizer applies anything.

        ``found_inf``: GradScaler's verdict (> 0: an Inf or NaN somewhere, maybe outside the hook's buckets):
        it skips the step too, and is read with the flags in the same copy. Counted in ``nonfinite_steps``
        only where a bucket was non-finite (an overflow of the scaled loss is: the scaler's own count has the
        rest)."""
        flags = self._read_flags(found_inf)
        scaler_skips = found_inf is not None and flags.pop() > 0
        skip = any(f > 0 for f in flags)
        if skip and self.mode == "raise":
            index, step = next(w for w, f in zip(self._where, flags) if f > 0)
            self._flags.clear()
            self._where.clear()
            raise FloatingPointError(
                f"non-finite gradient (NaN or Inf) in DDP bucket {index} at the hook's step "
                f"{step}, on some rank (optim.comm.nonfinite=raise)"
            )
        if skip or scaler_skips:
            for undo in self._undo.values():
                undo.restore()
        if skip:
            self.nonfinite_steps += 1
            if self.rank == 0:
                bad = [i for (i, _), f in zip(self._where, flags) if f > 0]
                print(
                    f"[birder-repro] non-finite gradient in bucket(s) {bad}: step skipped on every rank "
                    f"(parameters and optimizer state unchanged; {self.nonfinite_steps} skipped so far)",
                    flush=True,
                )
        self._undo.clear()
        self._flags.clear()
        self._where.clear()
        return skip or scaler_skips

    def state_dict(self) -> dict:
        return {"nonfinite_steps": self.nonfinite_steps}

    def load_state_dict(self, sd: dict | None) -> None:
        """The count, and nothing of a step in progress: the flags and backups a settling forward and backward
        left before the load (the integrations run one to rebuild DDP's buckets) belong to no step of the resumed
        run; kept, a non-finite settle batch would skip its first step."""
        self.nonfinite_steps = int((sd or {}).get("nonfinite_steps", 0))
        self._undo.clear()
        self._flags.clear()
        self._where.clear()

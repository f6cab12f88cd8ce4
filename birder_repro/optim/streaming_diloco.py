"""Streaming DiLoCo: DiLoCo whose model is synced one fragment at a time, each sync overlapping inner steps.

Douillard et al., "Streaming DiLoCo with overlapping communication: towards a distributed free lunch", 2025
(Algorithm 1, as remembered: the paper is not in the repository), with k workers, here the nodes (DDP averages
the gradients inside a node every step, :mod:`birder_repro.comm.streaming`). What is implemented, t counting the
inner steps (1, 2, ...)::

    fragments   the parameters, in model order, cut into P contiguous groups balanced by size
                (:func:`split_fragments`; the paper's best fragments are strided over the transformer's
                blocks, which a model given as a list of parameters does not have)
    every step  theta_i = AdamW(theta_i, grad_i)                     (every parameter, each node its own)
    sync start  at every t with t mod H = t_p, t_p = p H / P (rounded down; :func:`sync_offsets`):
                    delta_p = theta_outer_p - theta_local_p          (fragment p's outer gradient)
                and its average over the nodes starts (optionally quantized to fp8 or int4), in flight for
                the next tau inner steps
    sync end    at t + tau (at once for tau = 0):
                    theta_outer_p = OuterOpt(theta_outer_p, avg delta_p)         (Nesterov SGD, as DiLoCo's)
                    theta_local_p = alpha theta_local_p + (1 - alpha) theta_outer_p       (the merge, alpha mixing)

Each fragment has its own outer parameters and momentum and is synced every H steps (one fragment every H/P
steps). Defaults: P = 2, tau = 1, alpha = 0.5 (the paper's mixing), quantize none, outer lr 0.7 and momentum
0.9 (DiLoCo's). With P = 1, tau = 0 and alpha = 0 it is DiLoCo (tests/test_local_steps_streaming.py).
The paper's fragments' first syncs: t_p; here too, so fragment p's first interval is t_p steps (H for p = 0).

Bad input is refused in one line: P must be between 1 and min(H, number of parameters); 0 <= tau < H;
alpha in [0, 1]. ``outer_steps`` counts the fragment syncs started (the record's outer steps), ``outer_seconds``
the host time in the syncs' starts and ends.

The evaluation rule of the local-step methods: :meth:`StreamingDiLoCo.synchronised` puts every fragment's last
outer value (the same on every rank) in the model for the block; :meth:`StreamingDiLoCo.finish` completes the
syncs in flight, syncs every fragment once more and ends with every rank holding the outer model.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Protocol

import torch

from birder_repro.optim.common import outer_state, restore_outer_state, synchronised_parameters
from birder_repro.optim.diloco import diloco_arguments

__all__ = ["StreamingDiLoCo", "build_streaming_diloco", "split_fragments", "sync_offsets", "mix_", "QUANTIZE"]

QUANTIZE = ("none", "fp8", "int4")


class Pending(Protocol):
    def wait(self) -> list[torch.Tensor]: ...


class FragmentAverage(Protocol):
    """What the optimizer asks of its hook's state (:class:`birder_repro.comm.streaming.StreamingState`)."""

    def start_average(self, tensors: list[torch.Tensor]) -> Pending: ...


class _Done:
    """A sync whose average is known (one worker, or loaded from a checkpoint)."""

    def __init__(self, tensors: list[torch.Tensor]):
        self.tensors = tensors

    def wait(self) -> list[torch.Tensor]:
        return self.tensors


def split_fragments(numels: Sequence[int], fragments: int) -> list[list[int]]:
    """The parameter indices of each of ``fragments`` contiguous groups, in order, balanced by size: group p ends
    at the first parameter whose running total reaches (p + 1)/P of the whole (every group keeps at least one)."""
    count, total = len(numels), float(sum(numels))
    if not 1 <= fragments <= count:
        raise ValueError(f"StreamingDiLoCo: fragments must be between 1 and the {count} parameters, got {fragments}")
    groups: list[list[int]] = []
    start, running = 0, 0.0
    for p in range(fragments):
        if p == fragments - 1:
            groups.append(list(range(start, count)))
            break
        end = start
        running += numels[end]
        # take parameters until the share is reached, leaving one for each group still to come
        while end + 1 < count - (fragments - 1 - p) and running < (p + 1) * total / fragments:
            end += 1
            running += numels[end]
        groups.append(list(range(start, end + 1)))
        start = end + 1
    return groups


def sync_offsets(local_steps: int, fragments: int) -> list[int]:
    """t_p = p H / P, rounded down: fragment p starts a sync at every inner step t with t mod H = t_p."""
    return [p * local_steps // fragments for p in range(fragments)]


def mix_(local: torch.Tensor, outer: torch.Tensor, alpha: float) -> torch.Tensor:
    """The merge (Streaming DiLoCo, Algorithm 1): local = alpha local + (1 - alpha) outer, in place."""
    return local.mul_(alpha).add_(outer, alpha=1.0 - alpha)


class StreamingDiLoCo(torch.optim.AdamW):
    """AdamW inside (``lr``, ``betas``, ``eps``, ``weight_decay``) and the fragments' outer steps (module doc):
    ``local_steps`` H, ``fragments`` P, ``overlap_steps`` tau, ``mixing`` alpha, ``outer_lr``,
    ``outer_momentum``, ``quantize`` (none | fp8 | int4, applied by the hook)."""

    def __init__(
        self,
        params: Iterable,
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 0.01,
        local_steps: int = 10,
        fragments: int = 2,
        overlap_steps: int = 1,
        mixing: float = 0.5,
        outer_lr: float = 0.7,
        outer_momentum: float = 0.9,
        quantize: str = "none",
    ):
        for name, value in (("local_steps", local_steps), ("fragments", fragments), ("overlap_steps", overlap_steps)):
            if isinstance(value, bool) or not isinstance(value, int):
                raise ValueError(f"StreamingDiLoCo: {name} must be an integer, got {value!r}")
        if local_steps < 1:
            raise ValueError(f"StreamingDiLoCo: local_steps must be >= 1, got {local_steps}")
        if fragments > local_steps:
            raise ValueError(f"StreamingDiLoCo: fragments ({fragments}) must be <= local_steps ({local_steps})")
        if not 0 <= overlap_steps < local_steps:
            raise ValueError(f"StreamingDiLoCo: overlap_steps must be in [0, local_steps), got {overlap_steps}")
        if not 0.0 <= mixing <= 1.0:
            raise ValueError(f"StreamingDiLoCo: mixing must be in [0, 1], got {mixing}")
        if not outer_lr > 0.0:
            raise ValueError(f"StreamingDiLoCo: outer_lr must be > 0, got {outer_lr}")
        if not 0.0 <= outer_momentum < 1.0:
            raise ValueError(f"StreamingDiLoCo: outer_momentum must be in [0, 1), got {outer_momentum}")
        if quantize not in QUANTIZE:
            raise ValueError(f"StreamingDiLoCo: quantize must be one of {', '.join(QUANTIZE)}, got {quantize!r}")
        super().__init__(params, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay)
        self.local_steps, self.num_fragments, self.overlap_steps = local_steps, fragments, overlap_steps
        self.mixing, self.outer_lr, self.outer_momentum, self.quantize = mixing, outer_lr, outer_momentum, quantize
        self.fragments = split_fragments([p.numel() for p in self._params()], fragments)
        self.offsets = sync_offsets(local_steps, fragments)
        self.inner_steps = 0
        self.outer_steps = 0  # fragment syncs started
        self.outer_seconds = 0.0
        self.hook_state: FragmentAverage | None = None  # set by birder_repro.comm.streaming.attach_streaming
        self._outer: list[torch.Tensor] | None = None
        self._momentum: list[torch.Tensor] | None = None
        self._pending: list[tuple[int, int, Pending]] = []  # (fragment, the step its sync ends, its average)
        self._finished = False

    def _params(self) -> list[torch.Tensor]:
        return [p for group in self.param_groups for p in group["params"]]

    def held_tensors(self) -> list[torch.Tensor]:
        """The outer parameters and momentum (for the run's memory figures)."""
        return [*(self._outer or []), *(self._momentum or [])]

    # ---------------------------------------------------------------------------------------------- steps
    @torch.no_grad()
    def step(self, closure=None):
        if self._outer is None:  # theta_0: the parameters before the first inner step
            self._outer = [p.detach().clone() for p in self._params()]
            self._momentum = [torch.zeros_like(p) for p in self._outer]
        loss = super().step(closure)
        self.inner_steps += 1
        t = self.inner_steps
        for p, offset in enumerate(self.offsets):
            if t % self.local_steps == offset:
                self._start(p, t + self.overlap_steps)
        self._end_due(t)
        return loss

    def _start(self, fragment: int, due: int) -> None:
        assert self._outer is not None
        started = time.perf_counter()
        params = self._params()
        deltas = [self._outer[i] - params[i] for i in self.fragments[fragment]]  # theta_outer_p - theta_local_p
        # one worker (no hook): the average is its own
        pending = self.hook_state.start_average(deltas) if self.hook_state is not None else _Done(deltas)
        self.outer_steps += 1
        self._pending.append((fragment, due, pending))
        self.outer_seconds += time.perf_counter() - started

    def _end_due(self, t: int) -> None:
        for entry in [e for e in self._pending if e[1] <= t]:
            self._pending.remove(entry)
            self._end(entry[0], entry[2].wait(), self.mixing)

    def _end(self, fragment: int, averages: list[torch.Tensor], alpha: float) -> None:
        assert self._outer is not None and self._momentum is not None
        started = time.perf_counter()
        params = self._params()
        mu, lr = self.outer_momentum, self.outer_lr
        for i, delta in zip(self.fragments[fragment], averages):
            outer, buf = self._outer[i], self._momentum[i]
            buf.mul_(mu).add_(delta)
            outer.sub_(delta.add(buf, alpha=mu), alpha=lr)  # torch's SGD(nesterov=True), dampening 0
            mix_(params[i], outer, alpha)
        self.outer_seconds += time.perf_counter() - started

    # ---------------------------------------------------------------------------------- the evaluation rule
    def synchronised(self) -> contextlib.AbstractContextManager[None]:
        """Inside, the model's parameters hold every fragment's last outer value (theta_0 before its first sync
        ends), the same on every rank; each rank's own are put back on exit. Collective-free."""
        return synchronised_parameters(self._params(), self._outer)

    @torch.no_grad()
    def finish(self) -> None:
        """End the run on a sync: the syncs in flight end now, then every fragment is synced once more with no
        overlap and merged with alpha = 0, so that every rank holds the outer model. A collective; idempotent."""
        if self._finished or self._outer is None:
            self._finished = True
            return
        self._finished = True
        for fragment, _, pending in list(self._pending):
            self._end(fragment, pending.wait(), self.mixing)
        self._pending.clear()
        for fragment in range(self.num_fragments):
            self._start(fragment, self.inner_steps)
            fragment_, _, pending = self._pending.pop()
            self._end(fragment_, pending.wait(), 0.0)

    # ---------------------------------------------------------------------------------------- checkpoints
    def state_dict(self) -> dict[str, Any]:
        """AdamW's, and the fragments' outer parameters and momentum, this worker's parameters and the syncs in
        flight (their averages completed here, applied at their own step after a resume)."""
        sd = super().state_dict()
        pending = [(f, due, [t.clone() for t in p.wait()]) for f, due, p in self._pending]
        self._pending = [(f, due, _Done(ts)) for f, due, ts in pending]
        sd["streaming"] = {
            "inner_steps": self.inner_steps,
            "outer_steps": self.outer_steps,
            "outer_seconds": self.outer_seconds,
            **outer_state(self._outer, self._momentum, self._params()),
            "pending": pending,
        }
        return sd

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        state_dict = dict(state_dict)
        own = state_dict.pop("streaming", None)
        super().load_state_dict(state_dict)
        if own is None:
            return
        params = self._params()
        self.inner_steps, self.outer_steps = int(own["inner_steps"]), int(own["outer_steps"])
        self.outer_seconds = float(own.get("outer_seconds", 0.0))
        self._outer, self._momentum = restore_outer_state(own, params)
        device = params[0].device if params else None
        self._pending = [(int(f), int(due), _Done([t.to(device) for t in ts])) for f, due, ts in own["pending"]]


def build_streaming_diloco(params: Iterable, cfg: Mapping[str, Any]) -> StreamingDiLoCo:
    """The registry's builder, from the ``optim`` node (conf/optim/streaming_diloco.yaml)."""
    return StreamingDiLoCo(
        params,
        **diloco_arguments(cfg),
        fragments=int(cfg.get("fragments", 2)),
        overlap_steps=int(cfg.get("overlap_steps", 1)),
        mixing=float(cfg.get("mixing", 0.5)),
        quantize=str(cfg.get("quantize", "none")),
    )

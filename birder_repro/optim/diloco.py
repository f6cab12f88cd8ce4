"""DiLoCo: H local AdamW steps per node, then one outer Nesterov step on the nodes' average pseudo-gradient.

DiLoCo (Douillard et al., "DiLoCo: Distributed Low-Communication Training of Language Models", 2023,
Algorithm 1) with k workers, here the nodes (DDP averages the gradients inside a node every step,
:mod:`birder_repro.comm.diloco`)::

    for outer step t = 1 .. T:
        theta_i = theta_{t-1}                                  (every worker starts from the outer parameters)
        for inner step h = 1 .. H:  theta_i = InnerOpt(theta_i, grad_i)               (AdamW, its own state kept)
        delta_t = (1/k) sum_i (theta_{t-1} - theta_i)                       (the outer gradient, all-reduced)
        theta_t = OuterOpt(theta_{t-1}, delta_t)            (SGD with Nesterov momentum; the paper: lr 0.7, 0.9)

The outer step is torch's SGD with ``nesterov=True`` applied to delta_t: buf = mu buf + delta,
theta = theta - lr_out (delta + mu buf). The inner AdamW's state is each worker's own and is kept across outer
steps, as in the paper. Every process of a node holds the same parameters (DDP averaged their gradients), so
the node's processes share the exchange across nodes (:meth:`OuterSync.sync`), which also averages the
module's floating buffers (BatchNorm's running statistics) over every process.

The model a user would deploy is theta_{t-1} with the buffers of the same sync: between two outer steps no
process holds it (each worker's theta_i has moved on its own data), so DiLoCo is a
:class:`birder_repro.optim.common.LocalSteps` optimizer: evaluate it inside :meth:`DiLoCo.synchronised`, and
end a run with :meth:`DiLoCo.finish` (an outer step over the inner steps since the last one), so that the
final model is a synchronised one.

Without a hook (one process) delta is that process's own: DiLoCo with one worker, which is AdamW with a
lookahead-style outer step every H steps (its buffers, which it does not see without the hook, are left alone).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterable, Iterator, Mapping
from typing import Any, Protocol

import torch

from birder_repro.optim.common import outer_state, restore_outer_state

__all__ = ["DiLoCo", "build_diloco"]


class OuterSync(Protocol):
    """What the optimizer asks of its hook's state (:class:`birder_repro.comm.diloco.DiLoCoState`): the outer
    step's exchange, and the module's floating buffers (``buffers``: the module's own tensors;
    ``synced_buffers``: their values at the last sync)."""

    buffers: list[torch.Tensor]
    synced_buffers: list[torch.Tensor]

    def sync(self, deltas: list[torch.Tensor]) -> None: ...


class DiLoCo(torch.optim.AdamW):
    """AdamW inside (``lr``, ``betas``, ``eps``, ``weight_decay``: the inner optimizer's, which a schedule
    changes as usual), and every ``local_steps`` optimizer steps the outer Nesterov step (``outer_lr``,
    ``outer_momentum``) on the average over the nodes of the parameters' movement since the last one."""

    def __init__(
        self,
        params: Iterable,
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 0.01,
        local_steps: int = 10,
        outer_lr: float = 0.7,
        outer_momentum: float = 0.9,
    ):
        if isinstance(local_steps, bool) or not isinstance(local_steps, int) or local_steps < 1:
            raise ValueError(f"DiLoCo: local_steps must be an integer >= 1, got {local_steps!r}")
        if not outer_lr > 0.0:
            raise ValueError(f"DiLoCo: outer_lr must be > 0, got {outer_lr}")
        if not 0.0 <= outer_momentum < 1.0:
            raise ValueError(f"DiLoCo: outer_momentum must be in [0, 1), got {outer_momentum}")
        super().__init__(params, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay)
        self.local_steps, self.outer_lr, self.outer_momentum = local_steps, outer_lr, outer_momentum
        self.inner_steps = 0  # optimizer steps taken
        self.since_sync = 0  # inner steps since the last outer step; an outer step follows every local_steps
        self.outer_steps = 0
        self.outer_seconds = 0.0  # host seconds in outer steps (the record's outer_step_s)
        self.hook_state: OuterSync | None = None  # set by birder_repro.comm.attach_diloco
        # theta_{t-1} and the outer momentum, per parameter (kept apart from AdamW's per-parameter state)
        self._outer: list[torch.Tensor] | None = None
        self._momentum: list[torch.Tensor] | None = None

    def held_tensors(self) -> list[torch.Tensor]:
        """What this optimizer holds beside AdamW's state (for the run's memory figures): theta_{t-1} and the
        outer momentum."""
        return [*(self._outer or []), *(self._momentum or [])]

    def _params(self) -> list[torch.Tensor]:
        return [p for group in self.param_groups for p in group["params"]]

    @torch.no_grad()
    def step(self, closure=None):
        if self._outer is None:  # theta_0: the parameters before the first inner step
            self._outer = [p.detach().clone() for p in self._params()]
            self._momentum = [torch.zeros_like(p) for p in self._outer]
        loss = super().step(closure)
        self.inner_steps += 1
        self.since_sync += 1
        if self.since_sync == self.local_steps:
            self._outer_step()
        return loss

    @torch.no_grad()
    def finish(self) -> None:
        """End the run on a sync: the outer step over the inner steps since the last one, if any were taken
        (fewer than H: the paper's outer step on a shorter round); nothing otherwise. Collective: every rank
        calls it at the same point (:class:`birder_repro.optim.common.LocalSteps`)."""
        if self.since_sync:
            self._outer_step()

    @contextlib.contextmanager
    def synchronised(self) -> Iterator[None]:
        """Inside: the parameters hold theta_{t-1}, the outer parameters of the last sync (before any, the
        initial ones), and the module's floating buffers those of the same sync (through the hook's state),
        the same on every rank: the model a user would deploy. This worker's own are restored on exit. Not
        collective (:class:`birder_repro.optim.common.LocalSteps`)."""
        params = self._params() if self._outer is not None else []
        buffers = list(self.hook_state.buffers) if self.hook_state is not None else []
        synced = list(self.hook_state.synced_buffers) if self.hook_state is not None else []
        with torch.no_grad():
            own = [t.detach().clone() for t in [*params, *buffers]]
            for t, outer in zip([*params, *buffers], [*(self._outer or []), *synced]):
                t.copy_(outer)
        try:
            yield
        finally:
            with torch.no_grad():
                for t, mine in zip([*params, *buffers], own):
                    t.copy_(mine)

    def _outer_step(self) -> None:
        assert self._outer is not None and self._momentum is not None
        started = time.perf_counter()
        params = self._params()
        deltas = [outer - p for outer, p in zip(self._outer, params)]  # theta_{t-1} - theta_i
        if self.hook_state is not None:
            self.hook_state.sync(deltas)  # and the module's buffers averaged over every process
        mu, lr = self.outer_momentum, self.outer_lr
        for p, outer, buf, delta in zip(params, self._outer, self._momentum, deltas):
            buf.mul_(mu).add_(delta)
            outer.sub_(delta.add(buf, alpha=mu), alpha=lr)  # torch's SGD(nesterov=True), dampening 0
            p.copy_(outer)
        self.since_sync = 0
        self.outer_steps += 1
        self.outer_seconds += time.perf_counter() - started

    # ---------------------------------------------------------------------------------------- checkpoints
    def state_dict(self) -> dict[str, Any]:
        """AdamW's, and DiLoCo's own: the step counts, theta_{t-1}, the outer momentum and this worker's
        parameters (between outer steps the nodes' parameters differ, and a checkpoint keeps the model of
        rank 0 only: each rank resumes its own; the hook's state keeps each rank's buffers likewise)."""
        sd = super().state_dict()
        sd["diloco"] = {
            "inner_steps": self.inner_steps,
            "since_sync": self.since_sync,
            "outer_steps": self.outer_steps,
            "outer_seconds": self.outer_seconds,
            **outer_state(self._outer, self._momentum, self._params()),
        }
        return sd

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        state_dict = dict(state_dict)
        own = state_dict.pop("diloco", None)
        super().load_state_dict(state_dict)
        if own is None:
            return
        params = self._params()
        self.inner_steps, self.outer_steps = int(own["inner_steps"]), int(own["outer_steps"])
        self.since_sync = int(own.get("since_sync", self.inner_steps % self.local_steps))
        self.outer_seconds = float(own.get("outer_seconds", 0.0))
        self._outer, self._momentum = restore_outer_state(own, params)


def diloco_arguments(cfg: Mapping[str, Any]) -> dict[str, Any]:
    """DiLoCo's arguments from an ``optim`` node: the inner AdamW's and the outer step's (shared by the builders
    of DiLoCo and the methods built on it)."""
    return {
        "lr": cfg["lr"],
        "betas": tuple(cfg.get("betas", (0.9, 0.999))),
        "eps": cfg.get("eps", 1e-8),
        "weight_decay": cfg.get("weight_decay", 0.01),
        "local_steps": int(cfg.get("local_steps", 10)),
        "outer_lr": cfg.get("outer_lr", 0.7),
        "outer_momentum": cfg.get("outer_momentum", 0.9),
    }


def build_diloco(params: Iterable, cfg: Mapping[str, Any]) -> DiLoCo:
    """The registry's builder, from the ``optim`` node (conf/optim/diloco.yaml)."""
    return DiLoCo(params, **diloco_arguments(cfg))

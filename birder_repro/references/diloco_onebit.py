"""Single-process reference of DiLoCo with a 1-bit outer exchange (``optim=diloco_1bit``).

DiLoCo (Douillard et al., "DiLoCo: Distributed Low-Communication Training of Language Models", 2023, Algorithm 1)
with k workers (the nodes), its outer gradient averaged as in the Birder paper's Hierarchical-1-bit-All-Reduce
(Birder paper, Algorithm 1 lines 7-12 and section 4) with a per-tensor scale. Written from the papers, not from
the hook: every node holds its whole model, AdamW state and worker error e, the server its whole e_bar; nothing
is sharded or padded. What it shares with the hook is the documented scale (the nodes' mean |delta + e| of each
tensor, summed in float64) and random-draw convention: element j of outer step t (1, 2, ...) draws
``kernels.uniform(derive_seed(seed, t, "worker", node), j)`` as node ``node``'s worker and
``kernels.uniform(derive_seed(seed, t, "server", 0), j)`` as the server, j its place among all the parameters.
With those, the hook's parameters must equal these.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from birder_repro.comm import kernels


def quantize(x: torch.Tensor, rand: torch.Tensor) -> torch.Tensor:
    """Birder's Eq. (5): +1 with probability (x + 1) / 2 (clipped to [0, 1]), else -1."""
    return torch.where(rand < (x + 1) / 2, 1.0, -1.0)


class ReferenceOneBitAverage:
    """The compressed average of the nodes' outer gradients, with its error feedback across outer steps."""

    def __init__(self, nodes: int, seed: int, numels: Sequence[int], rounding: str = "stochastic"):
        self.nodes, self.seed, self.numels, self.rounding = nodes, seed, list(numels), rounding
        total = sum(self.numels)
        self.e = [torch.zeros(total) for _ in range(nodes)]  # each node's worker error (parameter units)
        self.e_bar = torch.zeros(total)  # the server's error (parameter units)
        self.t = 0

    def __call__(self, deltas: list[torch.Tensor], keep_error: bool = True) -> torch.Tensor:
        """``deltas[i]``: node i's flat outer gradient. Returns the average every node applies."""
        self.t += 1
        n, positions = self.nodes, torch.arange(sum(self.numels), dtype=torch.int64)
        xs = [delta + e for delta, e in zip(deltas, self.e)]  # the error-compensated outer gradients
        sums = sum(torch.stack([part.double().abs().sum() for part in x.split(self.numels)]) for x in xs)
        count = torch.tensor(self.numels, dtype=torch.float64)
        scale = torch.repeat_interleave((sums / (n * count)).float(), torch.tensor(self.numels))  # S_j: l1 means
        divisor = torch.where(scale > 0, scale, 1.0)
        us = []
        for i, x in enumerate(xs):  # the workers: u = Q(x / S); e = x - S u
            u = quantize(x / divisor, self._draws("worker", i, positions))
            self.e[i] = x - scale * u if keep_error else torch.zeros_like(x)
            us.append(u)
        y = torch.stack(us).sum(dim=0) / n + self.e_bar / divisor  # the server, in units of S
        u_bar = quantize(y, self._draws("server", 0, positions))
        self.e_bar = (y - u_bar) * scale if keep_error else torch.zeros_like(y)
        return scale * u_bar

    def _draws(self, role: str, rank: int, positions: torch.Tensor) -> torch.Tensor:
        """The uniforms of Q; with ``rounding='nearest'`` 1/2 everywhere, which makes Q(x) the sign (+1 for x > 0)."""
        if self.rounding == "nearest":
            return torch.full(positions.shape, 0.5)
        return kernels.uniform(kernels.derive_seed(self.seed, self.t, role, rank), positions)


class ReferenceDiLoCoOneBit:
    """Algorithm 1 of DiLoCo on ``nodes`` models, the outer gradient averaged by :class:`ReferenceOneBitAverage`.

    ``models``: one per node, all starting from the same parameters; :meth:`step` takes each node's gradients
    (the node's average of its processes' gradients) for one inner step."""

    def __init__(
        self,
        models: list[torch.nn.Module],
        inner: dict,
        local_steps: int,
        outer_lr: float,
        outer_momentum: float,
        seed: int,
        keep_error: bool = True,
        rounding: str = "stochastic",
    ):
        self.models = models
        self.inner = [torch.optim.AdamW(m.parameters(), **inner) for m in models]
        self.H, self.lr, self.mu, self.keep_error = local_steps, outer_lr, outer_momentum, keep_error
        self.outer = [p.detach().clone() for p in models[0].parameters()]
        self.momentum = [torch.zeros_like(p) for p in self.outer]
        self.average = ReferenceOneBitAverage(len(models), seed, [p.numel() for p in self.outer], rounding)
        self.steps = 0

    def step(self, grads: list[list[torch.Tensor]]) -> None:
        for model, opt, node_grads in zip(self.models, self.inner, grads):
            for p, g in zip(model.parameters(), node_grads):
                p.grad = g.clone()
            opt.step()
        self.steps += 1
        if self.steps % self.H == 0:
            self.outer_step()

    @torch.no_grad()
    def outer_step(self) -> None:
        deltas = [torch.cat([(x - p).reshape(-1) for x, p in zip(self.outer, m.parameters())]) for m in self.models]
        if len(self.models) > 1:
            delta = self.average(deltas, self.keep_error)
        else:
            delta = deltas[0]
        for x, buf, d in zip(self.outer, self.momentum, delta.split([p.numel() for p in self.outer])):
            d = d.view_as(x)
            buf.mul_(self.mu).add_(d)
            x.sub_(d.add(buf, alpha=self.mu), alpha=self.lr)  # torch's SGD(nesterov=True)
        for m in self.models:
            for p, x in zip(m.parameters(), self.outer):
                p.copy_(x)

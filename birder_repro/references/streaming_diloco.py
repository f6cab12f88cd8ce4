"""Single-process reference of Streaming DiLoCo (Douillard et al., "Streaming DiLoCo with overlapping
communication: towards a distributed free lunch", 2025, Algorithm 1).

Written from the paper, not from the optimizer: one model per node with its own AdamW; the fragments (the
parameters cut into P contiguous groups balanced by size, given to it), each with its outer parameters and
Nesterov momentum. At inner step t, for every fragment p with t mod H = t_p = p H / P (rounded down), the
outer gradient delta_p = theta_outer_p - theta_local_p of every node is taken, and its average over the nodes is
applied tau steps later: theta_outer_p = Nesterov(theta_outer_p, avg), then every node merges
theta_local_p = alpha theta_local_p + (1 - alpha) theta_outer_p. With ``quantize`` each node's delta_p is the
fragment quantized with the fragment's amax scale (:func:`birder_repro.comm.streaming.encode` /
``decode``, the codec the exchange documents), and the average is of the dequantized values, summed in node
order. It records which fragment synced at which step (``self.syncs``) for the schedule's own check.
"""

from __future__ import annotations

import torch

from birder_repro.comm.streaming import decode, encode, fragment_scale


class ReferenceStreamingDiLoCo:
    def __init__(
        self,
        models: list[torch.nn.Module],
        inner: dict,
        fragments: list[list[int]],
        local_steps: int,
        overlap_steps: int,
        mixing: float,
        outer_lr: float,
        outer_momentum: float,
        quantize: str = "none",
    ):
        self.models, self.fragments = models, fragments
        self.inner = [torch.optim.AdamW(m.parameters(), **inner) for m in models]
        self.H, self.tau, self.alpha = local_steps, overlap_steps, mixing
        self.lr, self.mu, self.quantize = outer_lr, outer_momentum, quantize
        self.outer = [p.detach().clone() for p in models[0].parameters()]
        self.momentum = [torch.zeros_like(p) for p in self.outer]
        self.t = 0
        self.in_flight: list[tuple[int, int, list[torch.Tensor]]] = []  # (fragment, step it ends, average)
        self.syncs: list[tuple[int, int]] = []  # (step, fragment) of every sync started

    def _average(self, per_node: list[torch.Tensor]) -> torch.Tensor:
        if self.quantize != "none" and len(per_node) > 1:
            per_node = [
                decode(encode(d, fragment_scale(d, self.quantize), self.quantize), d.numel(), self.quantize)
                for d in per_node
            ]
        total = per_node[0]
        for d in per_node[1:]:
            total = total + d
        return total / len(per_node)

    @torch.no_grad()
    def step(self, grads: list[list[torch.Tensor]]) -> None:
        for model, opt, node_grads in zip(self.models, self.inner, grads):
            for p, g in zip(model.parameters(), node_grads):
                p.grad = g.clone()
            opt.step()
        self.t += 1
        P = len(self.fragments)
        for p, members in enumerate(self.fragments):
            if self.t % self.H == p * self.H // P:
                self.syncs.append((self.t, p))
                per_node = []
                for m in self.models:
                    params = list(m.parameters())
                    per_node.append(torch.cat([(self.outer[i] - params[i]).reshape(-1) for i in members]))
                self.in_flight.append((p, self.t + self.tau, [self._average(per_node)]))
        for entry in [e for e in self.in_flight if e[1] <= self.t]:
            self.in_flight.remove(entry)
            p, _, (avg,) = entry
            offset = 0
            for i in self.fragments[p]:
                x, buf = self.outer[i], self.momentum[i]
                d = avg[offset : offset + x.numel()].view_as(x)
                offset += x.numel()
                buf.mul_(self.mu).add_(d)
                x.sub_(d.add(buf, alpha=self.mu), alpha=self.lr)
                for m in self.models:
                    local = list(m.parameters())[i]
                    local.mul_(self.alpha).add_(x, alpha=1.0 - self.alpha)

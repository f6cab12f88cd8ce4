"""Single-process reference of Birder (papers/birder.txt Algorithm 1) with Section 4's sharding of the work.

Written from the paper, not from the hook: every worker (a node, or a process for the flat schemes) holds its
whole m, b, e per parameter; the server holds e_bar per parameter. The only thing shared with the hook is the
documented random-draw convention (birder_repro/comm/birder.py): rank r's generator is seeded with
seed * 1_000_003 + r, and per bucket call a rank draws the P'/m uniforms of its shard, then the P'/(m n)
uniforms of the server chunk it owns (chunk k of shard r on node k, local rank r). With those draws the
reference's +-1 results must equal the hook's exactly.
"""

from __future__ import annotations

import torch


def quantize(x: torch.Tensor, rand: torch.Tensor) -> torch.Tensor:
    """Eq. (5): +1 with probability (x + 1) / 2, else -1."""
    return torch.where(rand < (x + 1) / 2, 1.0, -1.0)


class ReferenceBirder:
    def __init__(self, nodes: int, gpus_per_node: int, scheme: str, beta: float, eps: float, seed: int):
        self.world = nodes * gpus_per_node
        if scheme == "hierarchical":
            self.n, self.m = nodes, gpus_per_node
        else:
            self.n, self.m = self.world, 1
        self.scheme, self.beta, self.eps = scheme, beta, eps
        self.gens = [torch.Generator().manual_seed(seed * 1_000_003 + r) for r in range(self.world)]
        self.worker = [{"m": {}, "b": {}, "e": {}} for _ in range(self.n)]  # per worker, per parameter
        self.e_bar: dict[int, torch.Tensor] = {}

    def _full(self, per_param: dict, signature, padded: int) -> torch.Tensor:
        out = torch.zeros(padded)
        for p, off, numel in signature:
            if p in per_param:
                out[off: off + numel] = per_param[p]
        return out

    def _store(self, per_param: dict, signature, full: torch.Tensor) -> None:
        for p, off, numel in signature:
            per_param[p] = full[off: off + numel].clone()

    def bucket(self, signature, numel: int, grads: list[torch.Tensor]) -> torch.Tensor:
        """One bucket call on every rank; ``grads[r]`` is rank r's local gradient of the bucket."""
        n, m = self.n, self.m
        mult = 8 * m * (1 if self.scheme == "allgather" else n)
        padded = -(-numel // mult) * mult
        shard = padded // m
        chunk = shard if self.scheme == "allgather" else shard // n
        worker_rand, server_rand = [], [None] * self.world
        for r in range(self.world):  # each rank: its shard's draws, then its server chunk's
            worker_rand.append(torch.rand(shard, generator=self.gens[r]))
            if self.scheme != "allgather":
                server_rand[r] = torch.rand(chunk, generator=self.gens[r])
        us = []
        for k in range(n):  # Algorithm 1, lines 3-9, on worker k
            ranks = range(k * m, (k + 1) * m)
            g = torch.zeros(padded)
            g[:numel] = sum(grads[r] for r in ranks) / m  # node average
            st = {key: self._full(self.worker[k][key], signature, padded) for key in ("m", "b", "e")}
            st["m"] = self.beta * st["m"] + (1 - self.beta) * g
            st["b"] = self.beta * st["b"] + (1 - self.beta) * g.abs()
            x = st["m"] / (st["b"] + self.eps) + st["e"]
            u = quantize(x, torch.cat([worker_rand[r] for r in ranks]))
            st["e"] = x - u
            for key in st:
                self._store(self.worker[k][key], signature, st[key])
            us.append(u)
        mean = torch.stack(us).mean(dim=0)
        if self.scheme == "allgather":
            return mean[:numel]
        # lines 11-12 on the server; the uniform for element j comes from the rank owning j's chunk
        rand = torch.empty(padded)
        for r_local in range(m):
            for k in range(n):
                lo = r_local * shard + k * chunk
                rand[lo: lo + chunk] = server_rand[k * m + r_local]
        e_bar = self._full(self.e_bar, signature, padded)
        x = mean + e_bar
        u_bar = quantize(x, rand)
        self._store(self.e_bar, signature, x - u_bar)
        return u_bar[:numel]

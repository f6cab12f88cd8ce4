"""Single-process reference of Birder (Birder paper, Algorithm 1) with Section 4's sharding of the work.

Written from the paper, not from the hook: every worker (a node, or a process for the flat schemes) holds its
whole m, b, e per parameter; the server holds e_bar per parameter, and each parameter its step t. The only
thing shared with the hook is the documented random-draw convention (birder_repro/comm/birder.py): element j's
uniform is ``kernels.uniform(key, position of j)``, the position being j's place among all the model's
parameters (padding at ``total + its index in the padded bucket``), the key
``derive_seed(seed, t, "worker", w)`` for worker w's quantization and ``derive_seed(seed, t, "server", 0)`` for
the server's. With those draws the reference's +-1 results must equal the hook's exactly.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from birder_repro.comm import kernels


def quantize(x: torch.Tensor, rand: torch.Tensor) -> torch.Tensor:
    """Eq. (5): +1 with probability (x + 1) / 2, else -1."""
    return torch.where(rand < (x + 1) / 2, 1.0, -1.0)


class ReferenceBirder:
    def __init__(
        self,
        nodes: int,
        gpus_per_node: int,
        scheme: str,
        beta: float,
        eps: float,
        seed: int,
        param_numels: Sequence[int],
        amsgrad_after: int | None = None,
    ):
        self.world = nodes * gpus_per_node
        if scheme == "hierarchical":
            self.n, self.m = nodes, gpus_per_node
        else:
            self.n, self.m = self.world, 1
        self.scheme, self.beta, self.eps, self.seed = scheme, beta, eps, seed
        self.amsgrad_after = amsgrad_after  # Algorithm 1, line 6: after T0 steps, b = max(b, EMA of |g|)
        self.starts = [sum(param_numels[:i]) for i in range(len(param_numels))]  # each parameter's first position
        self.total = sum(param_numels)
        keys = ("m", "b", "e") + (("b_hat",) if amsgrad_after is not None else ())
        self.worker = [{key: {} for key in keys} for _ in range(self.n)]  # per worker, per parameter
        self.e_bar: dict[int, torch.Tensor] = {}
        self.step: dict[int, int] = {}  # per parameter: its t (Algorithm 1)

    def _full(self, per_param: dict, signature, padded: int) -> torch.Tensor:
        out = torch.zeros(padded)
        for p, off, numel in signature:
            if p in per_param:
                out[off : off + numel] = per_param[p]
        return out

    def _store(self, per_param: dict, signature, full: torch.Tensor) -> None:
        for p, off, numel in signature:
            per_param[p] = full[off : off + numel].clone()

    def _positions(self, signature, padded: int) -> torch.Tensor:
        """Every element's position among all the parameters; padding past the end."""
        pos = self.total + torch.arange(padded, dtype=torch.int64)
        for p, off, numel in signature:
            pos[off : off + numel] = self.starts[p] + torch.arange(numel, dtype=torch.int64)
        return pos

    def bucket(self, signature, numel: int, grads: list[torch.Tensor]) -> torch.Tensor:
        """One bucket call on every rank; ``grads[r]`` is rank r's local gradient of the bucket."""
        n, m = self.n, self.m
        mult = 8 * m * (1 if self.scheme == "allgather" else n)
        padded = -(-numel // mult) * mult
        t = 1 + max(self.step.get(p, 0) for p, _, _ in signature)
        for p, _, _ in signature:
            self.step[p] = t
        positions = self._positions(signature, padded)
        us = []
        for k in range(n):  # Algorithm 1, lines 3-9, on worker k
            ranks = range(k * m, (k + 1) * m)
            g = torch.zeros(padded)
            g[:numel] = sum(grads[r] for r in ranks) / m  # node average
            st = {key: self._full(self.worker[k][key], signature, padded) for key in self.worker[k]}
            st["m"] = self.beta * st["m"] + (1 - self.beta) * g
            if self.amsgrad_after is not None and t > self.amsgrad_after:
                st["b_hat"] = self.beta * st["b_hat"] + (1 - self.beta) * g.abs()
                st["b"] = torch.maximum(st["b"], st["b_hat"])
            else:
                st["b"] = self.beta * st["b"] + (1 - self.beta) * g.abs()
                if "b_hat" in st:
                    st["b_hat"] = st["b"].clone()  # until T0 the EMA is b itself
            x = st["m"] / (st["b"] + self.eps) + st["e"]
            u = quantize(x, kernels.uniform(kernels.derive_seed(self.seed, t, "worker", k), positions))
            st["e"] = x - u
            for key in st:
                self._store(self.worker[k][key], signature, st[key])
            us.append(u)
        mean = torch.stack(us).mean(dim=0)
        if self.scheme == "allgather":
            return mean[:numel]
        # lines 11-12 on the server
        e_bar = self._full(self.e_bar, signature, padded)
        x = mean + e_bar
        u_bar = quantize(x, kernels.uniform(kernels.derive_seed(self.seed, t, "server", 0), positions))
        self._store(self.e_bar, signature, x - u_bar)
        return u_bar[:numel]

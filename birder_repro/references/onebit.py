"""Single-process references for 1-bit Adam and 1-bit LAMB, written from the papers, using no library code.

N workers are simulated in one process: every step takes each worker's local gradient. The compressed
all-reduce follows 1-bit Adam paper, Algorithm 1 (lines 6-13) with the system's chunking of its section 6
(each of the N processes serves one chunk of a buffer padded to a multiple of 8 N) and the compressor of
1-bit LAMB paper, Algorithm 1, line 1: C[x] = ||x|| / ||Sign(x)|| * Sign(x), where Sign is 0 on the
elements known to be zero (padding, masked elements) and +-1 elsewhere (+1 for x > 0, -1 otherwise).
"""

from __future__ import annotations

import math

import torch


def sign(x: torch.Tensor) -> torch.Tensor:
    return torch.where(x > 0, 1.0, -1.0).to(x.dtype)


def compress(x: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(scale, C[x]) with Sign = 0 outside ``mask``; the scale is a 0-d tensor."""
    x = x * mask
    count = int(mask.sum())
    scale = torch.linalg.vector_norm(x) / math.sqrt(count) if count else torch.zeros((), dtype=x.dtype)
    return scale, scale * sign(x) * mask


def compressed_allreduce_reference(
    momenta: list[torch.Tensor],
    worker_errors: list[torch.Tensor],
    server_error: torch.Tensor,
    mask: torch.Tensor,
    workers: int,
) -> dict:
    """One step over vectors of P elements; the errors are P-element vectors too (each element's own).

    The buffer is padded to P' (a multiple of 8 N) with masked zeros and cut into N chunks, chunk k served by
    process k. Returns the averaged momentum, the new errors and every intermediate the tests compare (signs
    and server errors over P').
    """
    numel = mask.numel()
    padded = -(-numel // (8 * workers)) * 8 * workers
    chunk = padded // workers

    def pad(x, fill=0):
        out = torch.full((padded,), fill, dtype=x.dtype)
        out[:numel] = x.reshape(-1)
        return out

    mask = pad(mask, fill=False)
    worker_scales, worker_signs, compressed, new_worker_errors = [], [], [], []
    for m, e in zip(momenta, worker_errors):  # lines 7-8 on each worker
        c = pad(m) + pad(e)
        scale, m_hat = compress(c, mask)
        new_worker_errors.append(((c - m_hat) * mask)[:numel])
        worker_scales.append(scale)
        worker_signs.append(sign(c * mask))
        compressed.append(m_hat)
    mean = torch.stack(compressed).mean(dim=0)  # line 10: the average the servers compress
    server_scales, server_signs = [], []
    result, new_server_error, old_server_error = torch.zeros(padded), torch.zeros(padded), pad(server_error)
    for k in range(workers):  # lines 10-11 on server k, for chunk k
        part = slice(k * chunk, (k + 1) * chunk)
        c = mean[part] + old_server_error[part]
        scale, m_bar = compress(c, mask[part])
        new_server_error[part] = (c - m_bar) * mask[part]
        server_scales.append(scale)
        server_signs.append(sign(c * mask[part]))
        result[part] = m_bar
    return {
        "result": result[:numel],
        "worker_errors": new_worker_errors,
        "server_error": new_server_error,
        "worker_scales": torch.stack(worker_scales),
        "worker_signs": worker_signs,
        "server_scales": torch.stack(server_scales),
        "server_signs": torch.cat(server_signs),
    }


class CompressedAllReduceReference:
    """The compressed all-reduce of N workers' vectors of ``numel`` elements, keeping its errors between steps."""

    def __init__(self, numel: int, workers: int):
        self.numel, self.n = numel, workers
        self.padded = -(-numel // (8 * workers)) * 8 * workers
        self.chunk = self.padded // workers
        self.worker_errors = [torch.zeros(self.padded) for _ in range(workers)]  # delta^(i), over P'
        self.server_error = torch.zeros(self.padded)  # delta-bar over P': chunk k is served by process k

    def __call__(self, momenta: list[torch.Tensor], mask: torch.Tensor) -> dict:
        out = compressed_allreduce_reference(
            momenta, [e[: self.numel] for e in self.worker_errors], self.server_error[: self.numel], mask, self.n
        )
        for e, new in zip(self.worker_errors, out["worker_errors"]):
            e[: self.numel] = new
        self.server_error = out["server_error"]
        return out


def _flat(tensors: list[torch.Tensor]) -> torch.Tensor:
    return torch.cat([t.reshape(-1) for t in tensors])


def _unflat(flat: torch.Tensor, like: list[torch.Tensor]) -> list[torch.Tensor]:
    out, i = [], 0
    for t in like:
        out.append(flat[i : i + t.numel()].reshape(t.shape))
        i += t.numel()
    return out


class OneBitAdamReference:
    """1-bit Adam paper, Algorithm 1 for N simulated workers; Adam of Eq. (1) (no bias correction) in the
    warmup; decoupled weight decay; the compressed all-reduce per bucket (lists of parameter indices, in the
    order their momenta are laid out in the buffer; a step may be given its own layout); momentum masked where
    the frozen variance is 0. The errors belong to parameter elements, whatever the layout."""

    def __init__(
        self,
        params: list[torch.Tensor],
        buckets: list[list[int]],
        workers: int,
        lr: float,
        betas: tuple[float, float],
        eps: float,
        weight_decay: float,
        freeze_step: int,
    ):
        self.x = [p.detach().clone().float() for p in params]
        self.m = [torch.zeros_like(p) for p in self.x]
        self.v = [torch.zeros_like(p) for p in self.x]
        self.worker_errors = [[torch.zeros_like(p) for p in self.x] for _ in range(workers)]
        self.server_errors = [torch.zeros_like(p) for p in self.x]
        self.buckets, self.n = buckets, workers
        self.lr, (self.beta1, self.beta2), self.eps, self.wd = lr, betas, eps, weight_decay
        self.freeze_step, self.t = freeze_step, 0

    def step(self, grads: list[list[torch.Tensor]], buckets: list[list[int]] | None = None) -> None:
        """``grads[i][j]``: worker i's local gradient of parameter j; ``buckets``: this step's layout."""
        self.t += 1
        if self.t <= self.freeze_step:
            for j in range(len(self.x)):
                g = sum(grads[i][j] / self.n for i in range(self.n))
                self.m[j] = self.beta1 * self.m[j] + (1 - self.beta1) * g
                self.v[j] = self.beta2 * self.v[j] + (1 - self.beta2) * g * g
        else:
            self.m = self.compressed_momentum(grads, [1.0] * len(self.x), buckets or self.buckets)
        for j in range(len(self.x)):
            self.x[j] = self.x[j] - self.lr * (self.m[j] / (self.v[j].sqrt() + self.eps) + self.wd * self.x[j])

    def compressed_momentum(
        self, grads: list[list[torch.Tensor]], scales: list[float], buckets: list[list[int]]
    ) -> list[torch.Tensor]:
        """Lines 6-13: local momenta from the last averaged one, compressed all-reduce per bucket (each tensor
        multiplied by its scale before and divided after, 1-bit LAMB's A.5.2; 1 for 1-bit Adam)."""
        local = [
            [(self.beta1 * self.m[j] + (1 - self.beta1) * grads[i][j]) * scales[j] for j in range(len(self.x))]
            for i in range(self.n)
        ]
        masks = [self.v[j] > 0 for j in range(len(self.x))]
        if self.n == 1:  # one process: nothing to communicate, so nothing is compressed (exact momentum)
            return [local[0][j] * masks[j] / scales[j] for j in range(len(self.x))]
        new_m = [None] * len(self.x)
        for b in buckets:
            like = [self.x[j] for j in b]
            out = compressed_allreduce_reference(
                [_flat([local[i][j] for j in b]) for i in range(self.n)],
                [_flat([self.worker_errors[i][j] for j in b]) for i in range(self.n)],
                _flat([self.server_errors[j] for j in b]),
                _flat([masks[j] for j in b]),
                self.n,
            )
            for i in range(self.n):
                for j, e in zip(b, _unflat(out["worker_errors"][i], like)):
                    self.worker_errors[i][j] = e
            for j, e, mj in zip(
                b, _unflat(out["server_error"][: out["result"].numel()], like), _unflat(out["result"], like)
            ):
                self.server_errors[j] = e
                new_m[j] = mj / scales[j]
        return new_m


class OneBitLambReference(OneBitAdamReference):
    """1-bit LAMB paper, Algorithm 1 for N simulated workers, with the choices its module documents
    (birder_repro/optim/onebit_lamb.py): the ratio of denominators for line 17, weight decay blended into the
    ratio, clips in the paper's order, coefficient 1 (not averaged) where a norm is 0, momentum scales."""

    def __init__(
        self, *args, c_min: float, c_max: float, beta3: float, r_min: float, r_max: float, r_threshold: float, **kwargs
    ):
        super().__init__(*args, **kwargs)
        self.c_min, self.c_max, self.beta3 = c_min, c_max, beta3
        self.r_min, self.r_max, self.r_threshold = r_min, r_max, r_threshold
        self.c_avg = [0.0] * len(self.x)
        self.r = [1.0] * len(self.x)
        self.v_fresh: list[torch.Tensor] = []
        self.scales: list[float] = []

    def step(self, grads: list[list[torch.Tensor]], buckets: list[list[int]] | None = None) -> None:
        self.t += 1
        if self.t <= self.freeze_step:
            self.warmup_step(grads)
            if self.t == self.freeze_step:  # line 3, and appendix A.5.2's momentum scales
                self.v_fresh = [v.clone() for v in self.v]
                s = [float(m.norm()) / math.sqrt(m.numel()) for m in self.m]
                united = sum(x for x in s if x > 0) / max(1, sum(1 for x in s if x > 0))
                self.scales = [united / x if x > 0 else 1.0 for x in s]
            return
        m_prev = self.m
        self.m = self.compressed_momentum(grads, self.scales, buckets or self.buckets)
        for j in range(len(self.x)):
            g = (self.m[j] - self.beta1 * m_prev[j]) / (1 - self.beta1)  # line 15
            self.v_fresh[j] = self.beta2 * self.v_fresh[j] + (1 - self.beta2) * g * g  # line 16
            denom = self.v[j].sqrt() + self.eps
            adaptive = self.m[j] / denom
            u = adaptive + self.wd * self.x[j]
            r = float((denom / (self.v_fresh[j].sqrt() + self.eps)).max())  # line 17
            if self.wd and float(u.norm()) > 0:
                q = min(1.0, float(adaptive.norm()) / float(u.norm()))
                r = r * q + (1 - q)
            r = min(max(r, (1 - self.r_threshold) * self.r[j]), (1 + self.r_threshold) * self.r[j])  # line 18
            r = min(max(r, self.r_min), self.r_max)  # line 19
            self.r[j] = r
            self.x[j] = self.x[j] - self.lr * (r * self.c_avg[j]) * u  # lines 20-21

    def warmup_step(self, grads: list[list[torch.Tensor]]) -> None:
        """Eq. (1) on the averaged gradient, with c_avg of line 2."""
        for j in range(len(self.x)):
            g = sum(grads[i][j] / self.n for i in range(self.n))
            self.m[j] = self.beta1 * self.m[j] + (1 - self.beta1) * g
            self.v[j] = self.beta2 * self.v[j] + (1 - self.beta2) * g * g
            u = self.m[j] / (self.v[j].sqrt() + self.eps) + self.wd * self.x[j]
            wn, un = float(self.x[j].norm()), float(u.norm())
            if wn > 0 and un > 0:
                c = min(max(wn / un, self.c_min), self.c_max)
                self.c_avg[j] = self.beta3 * self.c_avg[j] + (1 - self.beta3) * c
            else:
                c = 1.0
            self.x[j] = self.x[j] - self.lr * c * u

"""A single-process reference of DeepSpeed's OnebitAdam, written from its algorithm (DeepSpeed v0.19.6,
``deepspeed/runtime/fp16/onebit/adam.py`` and the compressed all-reduce of ``deepspeed/runtime/comm/nccl.py``;
read to learn, none of its code), with N workers simulated in one process.

DeepSpeed's algorithm, as this reference runs it by default (:class:`Choices` with no arguments):

- the first ``step()`` only initialises (buffers, and a compressed all-reduce of the zero momentum); it moves
  nothing but counts as a step, so a freeze step F gives F-1 Adam steps before compression starts;
- warmup: Adam without bias correction on the averaged gradient, decoupled weight decay;
- compression: each worker's momentum m_i = beta1 m + (1-beta1) g_i; every tensor on its own padded to a
  multiple of N lcm(N, 8) with zeros; worker: c = m_i + e_i over the padded tensor, scale = ||c|| /
  sqrt(padded numel) (the padding counted), sign(c) with sign(0) = +1, e_i = c - scale sign(c) (the padding
  carries error too); server k on chunk k of the tensor: the mean of the workers' scale sign, plus its error,
  compressed again with its own scale; the result is every chunk's server scale times its signs, cut back to
  the tensor; then ``exp_avg_mask`` (if given) multiplies the averaged momentum, after the all-reduce.

The project departs from it on purpose (docs/optimizers.md, "1-bit Adam next to DeepSpeed's"); each departure
is a field of :class:`Choices`, so that the reference can run the project's choices for a comparison.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Choices:
    """DeepSpeed's choices by default; :meth:`project` gives this project's."""

    zero_sign: float = 1.0  # what sign(0) sends: DeepSpeed +1; the project's bit 0 = -1
    mask_padding: bool = False  # padding left out of the scales and the errors (DeepSpeed: counted, carries error)
    pad_multiple: int | None = None  # pad to a multiple of this; None: DeepSpeed's N lcm(N, 8)
    init_step: bool = True  # the first step() only initialises (DeepSpeed); False: F Adam steps, as the project
    mask_inside: bool = False  # mask (v == 0, and exp_avg_mask) inside the compression: zero in, not counted in
    # the scales, no error (the project); False: exp_avg_mask after the all-reduce
    by_bucket: bool = False  # tensors grouped in buckets (step's layout), the servers' chunks cut over a bucket
    scale: str = "tensor"  # a scale per tensor (and per piece of a tensor in a chunk); "bucket": one per bucket
    # and per chunk (the project's optim.comm.scale=bucket)

    @classmethod
    def project(cls, world: int, by_bucket: bool = True) -> Choices:
        return cls(
            zero_sign=-1.0,
            mask_padding=True,
            pad_multiple=8 * world,
            init_step=False,
            mask_inside=True,
            by_bucket=by_bucket,
        )

    def padded(self, numel: int, world: int) -> int:
        multiple = self.pad_multiple or world * (world * 8 // math.gcd(world, 8))
        return -(-numel // multiple) * multiple


def _sign(c: torch.Tensor, zero: float) -> torch.Tensor:
    return torch.where(c > 0, 1.0, torch.where(c < 0, -1.0, zero)).to(c.dtype)


def _compress(c: torch.Tensor, keep: torch.Tensor, starts: list[int], zero: float):
    """(scale sign(c), new error) with a scale per segment starting at ``starts``: ||c_seg|| / sqrt(#keep)."""
    ends = starts[1:] + [c.numel()]
    out = torch.zeros_like(c)
    for a, b in zip(starts, ends):
        count = int(keep[a:b].sum())
        scale = torch.linalg.vector_norm(c[a:b]) / math.sqrt(count) if count else torch.zeros((), dtype=c.dtype)
        out[a:b] = scale * _sign(c[a:b], zero) * keep[a:b]
    return out, (c - out) * keep


class DeepSpeedOnebitAdamReference:
    """OnebitAdam for N simulated workers over a list of parameters (module doc), with ``choices``.

    State per parameter: m, v, each worker's error and the server error (over the padded compressed buffer,
    kept per element so that a bucket layout may change between steps, as the project's does).
    """

    def __init__(
        self,
        params: list[torch.Tensor],
        workers: int,
        lr: float,
        betas: tuple[float, float],
        eps: float,
        weight_decay: float,
        freeze_step: int,
        choices: Choices = Choices(),
        exp_avg_mask: dict[int, torch.Tensor] | None = None,
    ):
        self.x = [p.detach().clone().float() for p in params]
        self.m = [torch.zeros_like(p) for p in self.x]
        self.v = [torch.zeros_like(p) for p in self.x]
        self.n, self.lr, (self.beta1, self.beta2), self.eps, self.wd = workers, lr, betas, eps, weight_decay
        self.freeze_step, self.choices, self.calls = freeze_step, choices, 0
        self.exp_avg_mask = exp_avg_mask or {}
        # (parameter, worker or "server") -> its elements' error; (bucket's parameters, who) -> its padding's
        self.errors: dict[tuple, torch.Tensor] = {}

    @property
    def adam_steps(self) -> int:
        """The warmup's Adam steps: F - 1 with DeepSpeed's initialising first step, F without it."""
        return self.freeze_step - (1 if self.choices.init_step else 0)

    def step(self, grads: list[list[torch.Tensor]], buckets: list[list[int]] | None = None) -> str:
        """``grads[i][j]``: worker i's gradient of parameter j; ``buckets``: parameter indices in buffer order
        (only with ``by_bucket``). Returns what the step was: ``init``, ``warmup`` or ``compression``."""
        self.calls += 1
        if self.choices.init_step and self.calls == 1:
            return "init"  # buffers made, the zero momentum compressed to zero: nothing moves
        if self.calls <= self.freeze_step:
            for j in range(len(self.x)):
                g = sum(grads[i][j] / self.n for i in range(self.n))
                self.m[j] = self.beta1 * self.m[j] + (1 - self.beta1) * g
                self.v[j] = self.beta2 * self.v[j] + (1 - self.beta2) * g * g
            stage = "warmup"
        else:
            local = [
                [self.beta1 * self.m[j] + (1 - self.beta1) * grads[i][j] for j in range(len(self.x))]
                for i in range(self.n)
            ]
            alone = [[j] for j in range(len(self.x))]
            layout = buckets or alone if self.choices.by_bucket else alone
            for bucket in layout:
                for j, mj in zip(bucket, self._allreduce(local, bucket)):
                    self.m[j] = mj
            stage = "compression"
        for j in range(len(self.x)):
            update = self.m[j] / (self.v[j].sqrt() + self.eps)
            if self.wd > 0:
                update = update + self.wd * self.x[j]
            self.x[j] = self.x[j] - self.lr * update
        return stage

    def reset_errors(self) -> None:
        """What DeepSpeed's ``load_state_dict`` does to the compression errors: drops them (each rank's are its
        own and only rank 0's would be saved). The project saves every rank's and loads them: a resume
        continues the reference without calling this."""
        self.errors.clear()

    def _keep(self, j: int) -> torch.Tensor:
        """1 where parameter j's compressed momentum may be non-zero (the project: v > 0 and exp_avg_mask)."""
        keep = torch.ones_like(self.x[j]).reshape(-1)
        if self.choices.mask_inside:
            keep = keep * (self.v[j].reshape(-1) > 0)
            if j in self.exp_avg_mask:
                keep = keep * self.exp_avg_mask[j].reshape(-1)
        return keep

    def _allreduce(self, local: list[list[torch.Tensor]], bucket: list[int]) -> list[torch.Tensor]:
        """One compressed all-reduce of the tensors ``bucket`` (one tensor: DeepSpeed's); averaged momenta."""
        ch, n = self.choices, self.n
        numel = sum(self.x[j].numel() for j in bucket)
        padded = ch.padded(numel, n)
        chunk = padded // n
        keep = torch.full((padded,), 0.0 if ch.mask_padding else 1.0)
        keep[:numel] = torch.cat([self._keep(j) for j in bucket])
        starts = [sum(self.x[t].numel() for t in bucket[:k]) for k in range(len(bucket))]
        segments = starts if ch.scale == "tensor" else [0]
        sent = []
        for i in range(n):  # each worker: its own scale per tensor (the padding joins the last tensor)
            c = torch.zeros(padded)
            c[:numel] = torch.cat([local[i][j].reshape(-1) for j in bucket])
            c = (c + self._error(bucket, i, padded)) * keep
            out, error = _compress(c, keep, segments, ch.zero_sign)
            self._keep_error(bucket, i, error)
            sent.append(out)
        mean = torch.stack(sent).mean(dim=0)
        server_error, result = self._error(bucket, "server", padded), torch.zeros(padded)
        for k in range(n):  # each server: its chunk, a scale per piece of a tensor in it
            part = slice(k * chunk, (k + 1) * chunk)
            cuts = sorted({0, *(s - k * chunk for s in segments if k * chunk < s < (k + 1) * chunk)})
            c = (mean[part] + server_error[part]) * keep[part]
            result[part], server_error[part] = _compress(c, keep[part], cuts, ch.zero_sign)
        self._keep_error(bucket, "server", server_error)
        out = []
        for j, start in zip(bucket, starts):
            mj = result[start : start + self.x[j].numel()].reshape(self.x[j].shape)
            if not ch.mask_inside and j in self.exp_avg_mask:
                mj = mj * self.exp_avg_mask[j]  # DeepSpeed: the mask multiplies the all-reduce's result
            out.append(mj)
        return out

    def _error(self, bucket: list[int], who, padded: int) -> torch.Tensor:
        """The padded error of ``who`` (a worker or "server") for this bucket: its elements' own errors, whatever
        layout held them before, and the padding's (zeros for a bucket not seen before)."""
        own = [self.errors.get((j, who), torch.zeros(self.x[j].numel())) for j in bucket]
        numel = sum(t.numel() for t in own)
        pad = self.errors.get((tuple(bucket), who), torch.zeros(padded - numel))
        return torch.cat([*own, pad])

    def _keep_error(self, bucket: list[int], who, error: torch.Tensor) -> None:
        offset = 0
        for j in bucket:
            self.errors[(j, who)] = error[offset : offset + self.x[j].numel()].clone()
            offset += self.x[j].numel()
        self.errors[(tuple(bucket), who)] = error[offset:].clone()

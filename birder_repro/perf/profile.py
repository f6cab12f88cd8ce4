"""A profile of one node: what the performance model needs to predict a step on any layout.

A :class:`Profile` is measured on one node (or derived from the paper's 1-node rows, see
birder_repro.perf.paper_profiles) and is JSON-serialisable, so that a run can write one into its record
(``record["profile"]``) and the model can be run on it later. Fields:

    name, device, task           what was profiled and on what (e.g. "8 x A100-80GB")
    batch_size                   per-process batch the times are for
    forward_backward_s           forward + backward seconds of one step at that batch, without communication
    backward_fraction            the backward pass's share of forward_backward_s (default 2/3: a backward
                                 pass costs about twice the forward's FLOPs, Kaplan et al. 2020, section 2.1)
    optimizer_s                  the optimizer step, seconds
    parameter_count              elements of all gradients
    bucket_elements              DDP's buckets in the order they fire (reverse parameter order); empty: made
                                 from parameter_count with bucket_cap_mb (first bucket first_bucket_mb)
    bucket_ready                 when each bucket is ready, as a fraction of the backward pass; empty: in
                                 proportion to the buckets' sizes
    bucket_cap_mb, first_bucket_mb   DDP's caps (25 MB; torch's _DEFAULT_FIRST_BUCKET_BYTES, 1 MB)
    compression_s_per_element    seconds per element compressed, per backend (birder, onebit, fp16, powersgd):
                                 multiplied by birder_repro.perf.schemes.compressed_elements
    scheme_overhead_s            seconds a scheme adds to every step that the model does not see (its
                                 optimizer's extra arithmetic, kernels competing with the backward pass),
                                 measured on one node; added to the compute
    matrices                     optional (rows, cols) of every parameter, for PowerSGD
    bucket_ready_s               a measured profile: when each bucket's hook was called, seconds from the start
                                 of the backward pass (median over the timed steps; bucket_ready is this over
                                 the calibrated backward pass, capped at 1)
    data_wait_s                  the wait for the data loader per step, added to every predicted step
    loop_overhead_s              a measured 1-node profile: what its training loop added to every step beyond
                                 the timed step and the loop's own collectives as the model prices them
                                 (record's loop_step_s - step_time_s.total - perf.model.loop_collectives_s on
                                 its layout): the loop's Python, log lines and waits; added to every step of
                                 the training clock (perf.advise.step_times); 0 in older profiles
    threads, host_cores          compute threads of the profiled process and cores of its machine: on an
                                 emulated cluster (ClusterSpec.shared_host) the nodes share that machine's cores
    processes, node_cores        the profiled node's processes and the cores they could run on (its pinning):
                                 the contention already in the profile's times, which the model divides out
                                 (perf.cluster.node_contention; null in older profiles: none)
    unexplained_share            per scheme, scheme_overhead_s over the measured 1-node step: the part of that
                                 step the model does not explain (above LEFTOVER_WARN, predictions say so)
    link_mbit_measured           a multi-node emulated run: the busiest node's link bytes per step over the
                                 step's communication time, Mbit/s (the rate the link reached; null elsewhere)
    forward_backward_at          forward + backward measured at other per-process batches: [batch, seconds]
                                 pairs; with the profile's own batch, two sizes or more make the compute affine
                                 in the batch (least squares: a fixed part plus a part per sample), where one
                                 size leaves it linear through 0 (a GPU at a small batch costs far more a sample:
                                 the 1-bit Adam paper's Table 1 has BERT-Large at 1 and 16 a GPU within 3 %)
    precision                    the run's training precision, fp32 or fp16: a two-stage run's warmup exchange
                                 is a 16-bit all-reduce where the run is fp16 (the 1-bit papers' runs are)
    bucket_layout                ``ddp``: DDP's buckets (bucket_cap_mb); ``one_buffer``: the whole gradient
                                 in one flattened buffer, one collective a step (DeepSpeed)
    optimizer_collectives        the optimizer step's own collectives every step, as [kind, nbytes] pairs over
                                 every process (LAMB's global norm, a loss scaler's overflow flag), priced on the
                                 cluster and added to optimizer_s
    notes                        where the numbers come from
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

__all__ = [
    "BUCKET_LAYOUTS",
    "LEFTOVER_WARN",
    "PRECISIONS",
    "Profile",
    "affine_compute",
    "bucket_matrices",
    "combine_batches",
    "ddp_bucket_elements",
    "load_profile",
]

MB = 1024 * 1024
# A 1-node step the model leaves more of than this unexplained (scheme_overhead_s) is named in every prediction
# from it: the leftover is charged as a fixed time a step, which holds for waiting, not for work that grows
# with the layout.
LEFTOVER_WARN = 0.05
PRECISIONS = ("fp32", "fp16")  # a profile's training precision (its two-stage runs' warmup exchange)
BUCKET_LAYOUTS = ("ddp", "one_buffer")  # DDP's buckets, or one flattened buffer (DeepSpeed)


@dataclass
class Profile:
    name: str
    device: str
    task: str
    batch_size: int
    forward_backward_s: float
    parameter_count: int
    optimizer_s: float = 0.0
    backward_fraction: float = 2.0 / 3.0
    bucket_elements: list[int] = field(default_factory=list)
    bucket_ready: list[float] = field(default_factory=list)
    bucket_cap_mb: float = 25.0
    first_bucket_mb: float = 1.0
    compression_s_per_element: dict[str, float] = field(default_factory=dict)
    scheme_overhead_s: dict[str, float] = field(default_factory=dict)
    unexplained_share: dict[str, float] = field(default_factory=dict)
    matrices: list[list[int]] = field(default_factory=list)
    bucket_ready_s: list[float] = field(default_factory=list)
    data_wait_s: float = 0.0
    loop_overhead_s: float = 0.0
    threads: int = 1
    host_cores: int | None = None
    processes: int | None = None
    node_cores: int | None = None
    link_mbit_measured: float | None = None
    forward_backward_at: list[list[float]] = field(default_factory=list)
    precision: str = "fp32"
    bucket_layout: str = "ddp"
    optimizer_collectives: list[list[Any]] = field(default_factory=list)
    notes: str = ""

    def __post_init__(self) -> None:
        if self.batch_size < 1 or self.forward_backward_s <= 0 or self.parameter_count < 1:
            raise ValueError(
                f"profile {self.name!r}: batch_size, forward_backward_s and parameter_count must "
                f"be positive, got {self.batch_size}, {self.forward_backward_s}, {self.parameter_count}"
            )
        if not 0 < self.backward_fraction <= 1:
            raise ValueError(f"profile {self.name!r}: backward_fraction must be in (0, 1]")
        if self.precision not in PRECISIONS:
            raise ValueError(f"profile {self.name!r}: precision {self.precision!r} is not one of {PRECISIONS}")
        if self.bucket_layout not in BUCKET_LAYOUTS:
            raise ValueError(
                f"profile {self.name!r}: bucket_layout {self.bucket_layout!r} is not one of {BUCKET_LAYOUTS}"
            )
        for point in self.forward_backward_at:
            if len(point) != 2 or not (point[0] > 0 and point[1] > 0):
                raise ValueError(f"profile {self.name!r}: forward_backward_at takes [batch, seconds] > 0, got {point}")
        if self.bucket_elements and sum(self.bucket_elements) != self.parameter_count:
            raise ValueError(
                f"profile {self.name!r}: bucket_elements sum to {sum(self.bucket_elements)}, "
                f"not parameter_count {self.parameter_count}"
            )

    def buckets(self) -> list[int]:
        if self.bucket_layout == "one_buffer":
            return [self.parameter_count]
        return list(self.bucket_elements) or ddp_bucket_elements(
            self.parameter_count, self.bucket_cap_mb, self.first_bucket_mb
        )

    def compute_s(self, batch_size: int | None = None) -> float:
        """forward + backward at ``batch_size``: affine in the batch where two batch sizes or more were measured
        (:func:`affine_compute`, with ``forward_backward_at``); else ASSUMPTION, linear in the batch (a GPU at a
        small batch is less efficient; profile two batch sizes, or the batch you predict for)."""
        batch = self.batch_size if batch_size is None else batch_size
        points = [(float(self.batch_size), self.forward_backward_s)]
        points += [(float(b), float(t)) for b, t in self.forward_backward_at if float(b) != self.batch_size]
        if len(points) > 1:
            return affine_compute(points, batch)
        return self.forward_backward_s * batch / self.batch_size

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Profile:
        known = {f.name for f in fields(cls)}
        unknown = set(data) - known
        if unknown:
            raise ValueError(f"unknown profile keys {sorted(unknown)}; known: {sorted(known)}")
        return cls(**dict(data))


def affine_compute(points: Sequence[tuple[float, float]], batch: float) -> float:
    """forward + backward at ``batch`` from (batch, seconds) points at two batch sizes or more: t = a + b batch by
    least squares, a and b at least 0 (a fixed cost a step, a cost a sample; Williams, Waterman and Patterson's
    roofline reading of a kernel at low arithmetic intensity: a small batch cannot fill the device)."""
    n = len(points)
    mx = sum(b for b, _ in points) / n
    my = sum(t for _, t in points) / n
    sxx = sum((b - mx) ** 2 for b, _ in points)
    if sxx == 0:
        raise ValueError(f"an affine compute needs two different batch sizes, got {list(points)}")
    slope = max(sum((b - mx) * (t - my) for b, t in points) / sxx, 0.0)
    fixed = my - slope * mx
    if fixed < 0:  # no negative fixed cost: through 0 by least squares
        fixed, slope = 0.0, sum(b * t for b, t in points) / sum(b * b for b, _ in points)
    return fixed + slope * float(batch)


def combine_batches(profiles: Sequence[Profile]) -> Profile:
    """One profile from 1-node profiles of the same run at several batch sizes: the first one's, with the others'
    forward + backward as ``forward_backward_at`` (so the compute is affine in the batch; Profile.compute_s)."""
    if not profiles:
        raise ValueError("combine_batches needs one profile or more")
    first, others = profiles[0], list(profiles[1:])
    for p in others:
        if p.task != first.task or p.parameter_count != first.parameter_count:
            raise ValueError(
                f"profiles {first.name!r} and {p.name!r} are of different models ({first.task}, "
                f"{first.parameter_count} against {p.task}, {p.parameter_count}): profile one model at two batches"
            )
    points = [list(pt) for pt in first.forward_backward_at]
    points += [[p.batch_size, p.forward_backward_s] for p in others if p.batch_size != first.batch_size]
    return Profile.from_dict({**first.to_dict(), "forward_backward_at": points})


def bucket_matrices(matrices: Sequence[Sequence[int]], sizes: Sequence[int]) -> list[list | None]:
    """Each bucket's (rows, cols) for PowerSGD, ``matrices`` in parameter order; None per bucket where none are
    listed (perf.schemes.compressed_elements then takes the bucket as one square)."""
    if not matrices:
        return [None] * len(sizes)
    mats = list(reversed(matrices))  # DDP fills buckets in reverse parameter order
    out, i = [], 0
    for size in sizes:
        group, got = [], 0
        while i < len(mats) and got < size:
            group.append(list(mats[i]))
            got += int(mats[i][0]) * (int(mats[i][1]) if len(mats[i]) > 1 else 1)
            i += 1
        out.append(group)
    return out


def ddp_bucket_elements(numel: int, cap_mb: float = 25.0, first_mb: float = 1.0, element_size: int = 4) -> list[int]:
    """DDP's buckets for ``numel`` contiguous gradient elements: a first bucket of ``first_mb`` (torch's
    _DEFAULT_FIRST_BUCKET_BYTES), then ``cap_mb`` each (bucket_cap_mb), the remainder last. Real buckets
    end on parameter boundaries; measured sizes belong in Profile.bucket_elements."""
    sizes, left = [], int(numel)
    cap = max(int(first_mb * MB) // element_size, 1)
    while left > 0:
        take = min(cap, left)
        sizes.append(take)
        left -= take
        cap = max(int(cap_mb * MB) // element_size, 1)
    return sizes


def load_profile(source: Any) -> Profile:
    """A profile from a Profile, a dict, a JSON file, a record.json (its ``profile`` key) or a run directory
    (its record.json). The paper's profiles are derived, not loaded: birder_repro.perf.paper_profiles (which
    builds on this module, not the other way round)."""
    if isinstance(source, Profile):
        return source
    if isinstance(source, Mapping):
        return Profile.from_dict(source.get("profile", source))
    text = str(source)
    path = Path(text)
    if path.is_dir():
        path = path / "record.json"
    if not path.is_file():
        raise FileNotFoundError(
            f"no profile at {text!r}: give a run directory, a record.json or a profile "
            f"JSON file (the paper's: birder_repro.perf.paper_profiles.paper_profile)"
        )
    data = json.loads(path.read_text())
    if "profile" in data:
        if data["profile"] is None:
            raise ValueError(f"{path} has no profile (profile: null)")
        data = data["profile"]
    return Profile.from_dict(data)

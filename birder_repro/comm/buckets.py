"""Per-element state of a 1-bit hook, kept per DDP bucket and sharded over process groups, that follows DDP's
bucket layout through rebuilds and checkpoints. Both 1-bit hooks (:mod:`~birder_repro.comm.birder`,
:mod:`~birder_repro.comm.onebit`) keep their state here and do only their arithmetic and collectives.

Fields and parts. A bucket of P elements is padded to P' (the hook's multiple). Each field of the state (Birder:
the worker's m, b, e and the server's e_bar; 1-bit Adam: the worker and server errors) is this process's part
of the padded bucket, cut by a sequence of levels, each a process group: the bucket is split into ``size``
equal parts over the first level's group and this process holds part ``rank``; that part is split again over
the next level, and so on. A field with no levels is the whole padded bucket, this process's own. Birder's m of
shard r: one level (the node's processes); its e_bar of chunk k of shard r: two (the node's, then the servers').
1-bit Adam's server error of chunk k: one level (all processes); its worker error: none.

Layout. DDP names a bucket by its index, but what an index holds changes: DDP rebuilds its buckets after the
first iteration, and a resumed run starts from DDP's initial layout again (or runs another ``bucket_cap_mb``).
So each bucket keeps its signature, ((parameter index, offset in the bucket, numel), ...), the parameter index
being its position in ``model.parameters()`` (:func:`parameter_index`, resolved once when the hook attaches).
When an index arrives with another signature, or with a parameter another bucket holds, the layout changed:

    Step I    migrate: every rank gathers every stored bucket's fields, in bucket-index order (DDP's layout is
              the same on every rank, so the collectives match), into per-parameter form, the canonical state,
              and forgets the old buckets (and their padding: its state never touches a real element);
    Step II   re-shard lazily: each new bucket, when it first arrives, slices its parameters' elements of this
              rank's parts out of the canonical state (its step counter: the largest of its parameters');
    Step III  the canonical state is dropped once every parameter in it has found its new bucket.

Checkpoints. :meth:`BucketStore.state_dict` holds this rank's parts with their signatures (and any canonical
state still waiting for its bucket); loaded into a run whose DDP lays the buckets out otherwise, the first
bucket that differs migrates it as above. So a checkpoint taken with DDP's initial buckets loads after a
rebuild, and one taken after a rebuild loads into a fresh DDP model, whatever its ``bucket_cap_mb``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from birder_repro.comm.collectives import all_gather_flat
from birder_repro.comm.pack import padded_size

__all__ = [
    "Level",
    "Field",
    "Bucket",
    "BucketStore",
    "parameter_index",
    "bucket_signature",
    "ElementPositions",
    "adopt",
    "require_buckets",
]

Signature = tuple  # ((parameter index, offset in the bucket, numel[, start within the parameter]), ...)


# ------------------------------------------------------------------------------------ parameter identity
def parameter_index(model: torch.nn.Module) -> dict[int, int]:
    """id(parameter) -> its index in ``model.parameters()``: the one name a parameter has in every signature.

    Resolved once, when a hook attaches: DDP hands the hook the same parameter objects every step.
    """
    return {id(p): i for i, p in enumerate(model.parameters())}


def require_buckets(ddp_model, attach: str) -> None:
    """What a compressed hook needs of its DDP module, refused in one line each where it is not so:

    - not built for compiled autograd (``torch._dynamo.config.optimize_ddp = "python_reducer"``): its Python
      reducer calls a communication hook once per parameter with a ``(grad, param)`` pair and ignores the
      returned future, where the compressed hooks work on whole buckets (docs/integrations.md, torch.compile);
    - ``find_unused_parameters=False``: with True, DDP all-reduces its map of locally used parameters on its own
      process group from the autograd thread once the last bucket's hook has returned, while the hook's
      collectives may still run on its communication thread (:mod:`~birder_repro.comm.overlap`) on the same
      group, or on the node's and the nodes' groups: two threads issuing collectives in no common order
      deadlock (gloo) or hang (NCCL). The HF Trainer turns it on by default for models without gradient
      checkpointing;
    - no hook yet: DDP takes one (torch's reducer refuses a second in words that do not say which was there).
    """
    if getattr(ddp_model, "_use_python_reducer", False):
        raise ValueError(
            f"{attach}: DDP was built with torch._dynamo.config.optimize_ddp='python_reducer' (compiled "
            "autograd), whose reducer hands hooks single parameters, not buckets; use torch.compile "
            "with optimize_ddp='ddp_optimizer' (the default) and compiled_autograd=False"
        )
    if getattr(ddp_model, "find_unused_parameters", False):
        raise ValueError(
            f"{attach}: DDP(find_unused_parameters=True) would deadlock with this hook (DDP all-reduces its map of "
            "used parameters from the autograd thread while the hook's collectives run): build DDP with "
            "find_unused_parameters=False (HF Trainer: ddp_find_unused_parameters=False; Lightning: "
            "DDPStrategy(find_unused_parameters=False)), every parameter taking part in each step's loss"
        )
    hooks = getattr(ddp_model, "_comm_hooks", None)
    if hooks:
        raise ValueError(
            f"{attach}: this DDP module has a communication hook already (its state: {type(hooks[0][1]).__name__}); "
            "DDP takes one: wrap the model in a new DistributedDataParallel to attach another"
        )


def bucket_signature(param_index: Mapping[int, int], bucket: dist.GradBucket) -> Signature:
    """((parameter index, offset in the bucket, numel), ...) from the bucket's gradient views."""
    buffer = bucket.buffer()
    base, size = buffer.data_ptr(), buffer.element_size()
    return tuple(
        (param_index[id(p)], (g.data_ptr() - base) // size, g.numel())
        for p, g in zip(bucket.parameters(), bucket.gradients())
    )


class ElementPositions:
    """Where every element of a bucket sits among all the model's parameters: the counter of its random draws.

    Position of element i of parameter p: the numels of the parameters before p in ``model.parameters()`` plus
    i, so it does not depend on how DDP cut the buckets (in which bucket, at which offset, p lands). Padding
    (and any gap between the bucket's views) has no parameter: element j of a padded bucket that is not a
    parameter's sits at ``total + j`` (``total``: the model's number of elements), past every real position.
    Only real elements' draws must not repeat; padding's draws are never read by a real element.
    """

    __slots__ = ("offsets", "total")

    def __init__(self, numels: Sequence[int]):
        self.offsets: list[int] = []
        total = 0
        for n in numels:
            self.offsets.append(total)
            total += int(n)
        self.total = total

    @classmethod
    def of(cls, model: torch.nn.Module) -> ElementPositions:
        return cls([p.numel() for p in model.parameters()])

    def segments(self, signature: Signature, padded: int, lo: int, hi: int) -> tuple[list[int], list[int]]:
        """(starts, positions) of the pieces of padded-bucket range [lo, hi): piece s covers
        [starts[s], starts[s+1]) of the range (relative to lo) and its first element sits at positions[s]."""
        pieces = []  # (start in the bucket, its position), real elements and the padding between them
        cursor = 0
        for p, offset, numel, *first in sorted(signature, key=lambda s: s[1]):
            if numel <= 0:
                continue
            if p >= len(self.offsets):
                raise ValueError(
                    f"parameter index {p} of a bucket is beyond the model's {len(self.offsets)} "
                    "parameters: the hook's positions were made for another model"
                )
            if offset > cursor:
                pieces.append((cursor, self.total + cursor))
            # A 4th entry: the piece starts that far into p (an FSDP shard of p's rows, birder_repro.comm.fsdp)
            pieces.append((offset, self.offsets[p] + (first[0] if first else 0)))
            cursor = offset + numel
        if cursor < padded:
            pieces.append((cursor, self.total + cursor))
        starts, positions = [], []
        for i, (start, position) in enumerate(pieces):
            end = pieces[i + 1][0] if i + 1 < len(pieces) else padded
            a, b = max(start, lo), min(end, hi)
            if a < b:
                starts.append(a - lo)
                positions.append(position + (a - start))
        return starts, positions


# ------------------------------------------------------------------------------------- fields and parts
@dataclass(frozen=True)
class Level:
    """One cut of the bucket: over ``group`` (None when ``size`` is 1) into ``size`` parts, this rank's ``rank``."""

    group: dist.ProcessGroup | None
    size: int
    rank: int


@dataclass(frozen=True)
class Field:
    """A named per-element state of the bucket, cut by ``levels`` (outermost first; none: the whole bucket)."""

    name: str
    levels: tuple[Level, ...] = ()

    @property
    def parts(self) -> int:
        return math.prod(level.size for level in self.levels)

    def start(self, padded: int) -> int:
        """Where this rank's part begins in the padded bucket."""
        start, length = 0, padded
        for level in self.levels:
            length //= level.size
            start += level.rank * length
        return start

    def gather(self, part: torch.Tensor) -> torch.Tensor:
        """The whole padded bucket from every rank's part: all-gathers, innermost level first. Collective."""
        full = part
        for level in reversed(self.levels):
            if level.size > 1:
                out = torch.empty(full.numel() * level.size, device=full.device, dtype=full.dtype)
                all_gather_flat(out, full.contiguous(), group=level.group)
                full = out
        return full


class Bucket:
    """One bucket's fields on this rank, and the layout they were made for."""

    __slots__ = (
        # saved: the layout, the hook's step counter for the bucket, and this rank's part of every field
        "signature",
        "numel",
        "padded",
        "step",
        "state",
        # not saved: whatever the hook derives for the bucket from elsewhere (1-bit Adam: the optimizer's mask
        # and scales), None after creation and after loading; the hook's scratch buffers (:meth:`workspace`);
        # values the hook derives from the layout alone (:meth:`cached`: the segment tables of the draws)
        "derived",
        "_workspace",
        "_cache",
    )
    SAVED = ("signature", "numel", "padded", "step", "state")

    def __init__(self, signature: Signature, numel: int, padded: int, state: dict[str, torch.Tensor], step: int = 0):
        self.signature, self.numel, self.padded, self.step, self.state = signature, numel, padded, step, state
        self.derived: Any = None
        self._workspace: dict[str, torch.Tensor] = {}
        self._cache: dict[Any, Any] = {}

    def cached(self, key: Any, make: Callable[[], Any]) -> Any:
        """``make()`` once per bucket and ``key``, for what depends only on the bucket's layout (which never
        changes for a Bucket: a new layout is a new Bucket). Why: a GPU kernel's tables stay on the device
        instead of being built and copied from the host at every step."""
        value = self._cache.get(key)
        if value is None:
            value = self._cache[key] = make()
        return value

    def workspace(
        self,
        name: str,
        like: torch.Tensor | None = None,
        *,
        numel: int = 0,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str = "cpu",
    ) -> torch.Tensor:
        """A scratch buffer of this bucket that lives as long as the bucket: zeros when first made, then
        whatever its user left in it. Why: a bucket's per-step temporaries are the size of the bucket (a
        padded gradient, the backup of its state), and allocating them afresh every step costs page faults,
        2-3x a copy of the same bytes on CPU. ``like`` gives shape, dtype and device; else ``numel``, ``dtype``,
        ``device``. Only the hook's own thread touches it, one bucket at a time."""
        if like is not None:
            shape, dtype, device = tuple(like.shape), like.dtype, like.device
        else:
            shape = (int(numel),)
        buf = self._workspace.get(name)
        if buf is None or tuple(buf.shape) != shape or buf.dtype != dtype or buf.device != torch.device(device):
            buf = self._workspace[name] = torch.zeros(shape, dtype=dtype, device=device)
        return buf

    def set_workspace(self, name: str, tensor: torch.Tensor) -> None:
        """Hand ``tensor`` to the workspace as ``name`` (a state field's old tensor, to be written next step)."""
        self._workspace[name] = tensor

    @classmethod
    def from_saved(cls, saved: Mapping[str, Any]) -> Bucket:
        return cls(
            tuple(tuple(s) for s in saved["signature"]),
            int(saved["numel"]),
            int(saved["padded"]),
            {k: t.clone() for k, t in saved["state"].items()},
            int(saved["step"]),
        )

    def saved(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in Bucket.SAVED}


# ---------------------------------------------------------------------------------------------- the store
class BucketStore:
    """Every bucket's fields on this rank, which bucket holds each parameter, and a layout change in progress.

    Args:
        fields: the per-element state of a bucket (zeros until the hook writes it).
        pad_to: buckets are padded to a multiple of this (every field's part a whole number of elements, and
            whatever else the hook needs, e.g. whole bytes of packed bits).
    """

    __slots__ = ("fields", "pad_to", "buckets", "owner", "canonical", "pending", "layout_changes", "_foreign")

    def __init__(self, fields: Sequence[Field], pad_to: int):
        for f in fields:
            if pad_to % f.parts:
                raise ValueError(
                    f"buckets padded to a multiple of {pad_to} do not split into {f.parts} parts for {f.name}"
                )
        self.fields = tuple(fields)
        self.pad_to = pad_to
        self.buckets: dict[int, Bucket] = {}
        self.owner: dict[int, int] = {}  # parameter index -> index of the bucket holding its state
        # Between a layout change and the arrival of every new bucket: field (and "step") -> parameter index ->
        # the parameter's whole state of that field; and the parameters still to re-shard.
        self.canonical: dict[str, dict[int, Any]] | None = None
        self.pending: set[int] = set()
        self.layout_changes = 0
        self._foreign = False  # tensors loaded by another thread, not yet adopted by the hook's stream (adopt)

    def bucket(self, index: int, numel: int, signature: Signature, device: torch.device) -> Bucket:
        """The bucket DDP calls ``index`` with this ``signature``: the stored one, or a new one (migrating the
        state first if the layout changed: collective, and every rank meets the same change at the same call)."""
        if self._foreign:
            self._adopt(device)
        bucket = self.buckets.get(index)
        if bucket is not None and bucket.signature == signature:
            return bucket
        params = [p for p, *_ in signature]
        if bucket is not None or any(p in self.owner for p in params):
            self._migrate()
        padded = padded_size(numel, self.pad_to)
        state = {f.name: torch.zeros(padded // f.parts, device=device, dtype=torch.float32) for f in self.fields}
        bucket = Bucket(signature, numel, padded, state)
        if self.canonical is not None:
            self._fill(bucket, self.canonical)
        self.buckets[index] = bucket
        self.owner.update((p, index) for p in params)
        return bucket

    def _adopt(self, device: torch.device) -> None:
        """Loaded state first goes to the device of DDP's buckets: a checkpoint loaded with
        ``map_location="cpu"`` (the integrations load so) would otherwise meet CUDA gradients in the update, or
        be all-gathered from the CPU over NCCL by a layout change.

        Loaded state (cloned on the training thread, on its stream) is read from here on by the hook, on its
        side stream (:mod:`birder_repro.comm.overlap`), and freed there too by a migration: without
        ``record_stream`` the caching allocator would hand the freed block to the training stream (backward)
        while side-stream kernels may still read it, silently corrupting m, b, e, e_bar after a resume into
        another bucket layout. Called once, from the first bucket after a load."""
        for b in self.buckets.values():
            b.state = {k: t.to(device) for k, t in b.state.items()}
        for per_param in (self.canonical or {}).values():
            for p, t in per_param.items():
                if isinstance(t, torch.Tensor) and t.is_floating_point():
                    per_param[p] = t.to(device)
        tensors = [t for b in self.buckets.values() for t in b.state.values()]
        for per_param in (self.canonical or {}).values():
            tensors += [t for t in per_param.values() if isinstance(t, torch.Tensor)]
        adopt(tensors)
        self._foreign = False

    # ----------------------------------------------------------------------------------------- migration
    def _migrate(self) -> None:
        """Step I: every stored bucket into per-parameter form, then forget the old layout. Collective."""
        self.layout_changes += 1
        out: dict[str, dict[int, Any]] = {k: {} for k in (*(f.name for f in self.fields), "step")}
        if self.canonical is not None:  # a change still in progress: keep what was not re-sharded yet
            for k, per_param in self.canonical.items():
                out.setdefault(k, {}).update({p: t for p, t in per_param.items() if p in self.pending})
        for index in sorted(self.buckets):  # the same buckets, in the same order, on every rank
            bucket = self.buckets[index]
            full = {f.name: f.gather(bucket.state[f.name]) for f in self.fields}
            for p, offset, numel, *_ in bucket.signature:
                for k, t in full.items():
                    out[k][p] = t[offset : offset + numel].clone()
                out["step"][p] = bucket.step
        self.buckets.clear()
        self.owner.clear()
        self.canonical = out
        self.pending = set(out["step"])

    def _fill(self, bucket: Bucket, canon: dict[str, dict[int, Any]]) -> None:
        """Steps II and III: this rank's parts of a new bucket out of the per-parameter state ``canon``."""
        for f in self.fields:
            target, start = bucket.state[f.name], f.start(bucket.padded)
            for p, offset, numel, *_ in bucket.signature:
                src = canon.get(f.name, {}).get(p)
                if src is None:
                    continue
                a, b = max(offset, start), min(offset + numel, start + target.numel())  # p's elements in my part
                if a < b:
                    target[a - start : b - start] = src[a - offset : b - offset].to(target.device)
        steps = [int(canon["step"][p]) for p, *_ in bucket.signature if p in canon["step"]]
        bucket.step = max(steps, default=0)
        self.pending.difference_update(p for p, *_ in bucket.signature)
        if not self.pending:
            self.canonical = None

    # --------------------------------------------------------------------------------------- checkpoints
    def state_dict(self) -> dict[str, Any]:
        """This rank's parts with their layouts, and any per-parameter state still waiting for its bucket."""
        return {
            "parts": {f.name: [level.size for level in f.levels] for f in self.fields},
            "buckets": {i: b.saved() for i, b in self.buckets.items()},
            "canonical": self.canonical,
            "pending": sorted(self.pending),
            "layout_changes": self.layout_changes,
        }

    def load_state_dict(self, sd: Mapping[str, Any]) -> None:
        """Load a rank's :meth:`state_dict` (saved by this rank of the same process layout; any bucket layout)."""
        mine = {f.name: [level.size for level in f.levels] for f in self.fields}
        saved = {k: list(v) for k, v in sd["parts"].items()}
        if saved != mine:
            raise ValueError(
                f"checkpoint's hook state is cut into parts {saved} (field: group sizes), this run's "
                f"into {mine}: it was saved with another layout of processes or another variant"
            )
        self.buckets = {int(i): Bucket.from_saved(b) for i, b in sd["buckets"].items()}
        self.owner = {p: i for i, b in self.buckets.items() for p, *_ in b.signature}
        canon = sd["canonical"]
        self.canonical = (
            None
            if canon is None
            else {
                k: {int(p): (t.clone() if isinstance(t, torch.Tensor) else t) for p, t in per_param.items()}
                for k, per_param in canon.items()
            }
        )
        self.pending = {int(p) for p in sd["pending"]}
        self.layout_changes = int(sd["layout_changes"])
        self._foreign = True


def adopt(tensors) -> None:
    """Mark CUDA ``tensors`` as used by the current stream (``Tensor.record_stream``), so that freeing them waits
    for that stream's queued work. A no-op on the CPU and on the stream a tensor was made on."""
    for t in tensors:
        if t.is_cuda:
            t.record_stream(torch.cuda.current_stream(t.device))

"""How an implementation runs each scheme's communication: overlapped with the backward pass or not, and on
what granularity. The same scheme (the same collectives, the same bytes) costs very different step times
depending on this, so the model takes it as an explicit, named choice.

An :class:`Implementation` of a scheme says

    ``overlap``      True: the buckets' compression and collectives run on their own stream while the backward
                     pass goes on (wait-free backprop; what is not hidden is exposed). False: they run in the
                     compute stream's order, so every second of them adds to the step (Figure 4's stacked bars).
    ``granularity``  ``bucket``: once per DDP bucket (25 MB caps), as a comm hook sees the gradients.
                     ``whole``: once on the whole flattened vector, after the backward pass (an optimizer step).

Two sets, chosen by ``predict.implementation``:

``this``   THIS project's DDP comm hooks (birder_repro.comm): every scheme per bucket, overlapped (the hooks
           chain their collectives on futures, so DDP's reducer never waits on them inside the backward pass).

``paper``  What the Birder paper's runs did, as far as its text says:

    fp32 / fp16 / powersgd   DDP and torch's hooks: per bucket, overlapped. "the system-level engineered
                 distributed data-parallel framework DDP" (section 5) runs the baselines.
    hierarchical Birder: per bucket ("certain components of Birder and our hierarchical communication scheme
                 were implemented within the customized communication hook of DDP", section 5.1), NOT
                 overlapped: Figure 4 draws "computation time, communication time and compression/decompression
                 time per iteration" as stacked bars, and section 5.3 reads Birder's total as their sum ("the
                 extreme 1-bit quantization ... effectively reduces communication overhead, resulting in only a
                 marginal increase in the total time"). A hook that waits on its all-to-all before it averages
                 and re-quantizes (Step iii) makes the compute stream wait for the network: the backward pass
                 stalls on every bucket, which is the same as running the buckets after it.
    flat / allgather         Birder's other exchanges: as hierarchical.
    onebit       1-bit Adam: once on the whole momentum, after the backward pass, not overlapped. Its
                 compressed all-reduce compresses the momentum m_t (1-bit Adam paper, Algorithm 1, lines 6-7),
                 which exists only once the optimizer has the whole gradient; DeepSpeed runs it inside the
                 optimizer's step. The Birder paper did not run it as a DDP hook: "the vector-wise quantization
                 technique employed by 1-bit Adam is not compatible with the common-used distributed framework
                 DDP" (section 2, Remark), and it used "off-the-shelf communication primitives in PyTorch for
                 all the optimizers" (appendix E), i.e. torch.distributed's all_to_all_single and all_gather on
                 NCCL, as DeepSpeed's NCCL backend does (1-bit Adam paper, section 6: gather step = Alltoall,
                 scatter step = Allgather).
"""

from __future__ import annotations

from dataclasses import dataclass

from .schemes import SCHEMES

__all__ = ["Implementation", "IMPLEMENTATIONS", "implementation_of"]

GRANULARITIES = ("bucket", "whole")


@dataclass(frozen=True)
class Implementation:
    overlap: bool
    granularity: str = "bucket"

    def __post_init__(self) -> None:
        if self.granularity not in GRANULARITIES:
            raise ValueError(f"granularity must be one of {GRANULARITIES}, got {self.granularity!r}")
        if self.granularity == "whole" and self.overlap:
            raise ValueError("a whole-vector exchange runs after the backward pass: it cannot overlap it")


_HOOK = Implementation(overlap=True)
_BLOCKING_HOOK = Implementation(overlap=False)
_IN_STEP = Implementation(overlap=False, granularity="whole")

IMPLEMENTATIONS: dict[str, dict[str, Implementation]] = {
    "this": {scheme: _HOOK for scheme in SCHEMES},
    "paper": {"fp32": _HOOK, "fp16": _HOOK, "powersgd": _HOOK, "onebit": _IN_STEP,
              "hierarchical": _BLOCKING_HOOK, "flat": _BLOCKING_HOOK, "allgather": _BLOCKING_HOOK},
}


def implementation_of(name: str, scheme: str) -> Implementation:
    """How implementation ``name`` (``this`` or ``paper``) runs ``scheme``."""
    try:
        table = IMPLEMENTATIONS[name]
    except KeyError:
        raise ValueError(f"unknown implementation {name!r}; known: {', '.join(IMPLEMENTATIONS)}") from None
    try:
        return table[scheme]
    except KeyError:
        raise ValueError(f"implementation {name!r} has no entry for scheme {scheme!r}") from None

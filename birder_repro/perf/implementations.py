"""How an implementation runs each scheme's communication: overlapped with the backward pass or not, and on
what granularity. The same scheme (the same collectives, the same bytes) costs very different step times
depending on this, so the model takes it as an explicit, named choice.

An :class:`Implementation` of a scheme says

    ``overlap``      the fraction of what a perfect overlap would hide that is hidden. 1: the buckets'
                     compression and collectives run on their own stream while the backward pass goes on
                     (wait-free backprop; what is not hidden is exposed). 0: they run in the compute stream's
                     order, so every second of them adds to the step (Figure 4's stacked bars). In between:
                     the step is that mixture of the two (birder_repro.perf.timeline.blend).
    ``granularity``  ``bucket``: once per DDP bucket (25 MB caps), as a comm hook sees the gradients.
                     ``whole``: once on the whole flattened vector, after the backward pass (an optimizer step).

Two sets, chosen by ``predict.implementation``:

``this``   THIS project's DDP comm hooks (birder_repro.comm): every scheme per bucket, overlapped (the hooks
           run their collectives on a communication thread or stream, so DDP's reducer never waits on them
           inside the backward pass).

``paper``  What the Birder paper's runs did, as far as its text and its tables say:

    fp32 / fp16 / powersgd   DDP and torch's hooks, per bucket ("the system-level engineered distributed
                 data-parallel framework DDP", section 5), NOT overlapped: FITTED (PAPER_DDP_OVERLAP). DDP is
                 built to overlap its all-reduces with the backward pass, but the paper's baseline rows are
                 fitted best with no overlap at all: python -m birder_repro.perf.validate --overlap-sweep
                 refits both interconnects' links at each overlap from 0 to 1, and the loss over all
                 multi-node rows of Tables 3 and 4 (baselines included) is lowest at 0 (least absolute
                 deviations in log throughput: 4.71 at 0, 4.81 at 0.2, 4.95 at 0.4, 5.65 at 1; least squares
                 agrees: 1.33 at 0, 1.73 at 1). The rows that decide it are InfiniBand's: ResNet-50 with SGDM
                 keeps 56-63 % scale efficiency at 16-64 GPUs, 40-54 ms a step beyond its 1-node 69 ms
                 whatever the node count, which a 102 MB all-reduce hidden behind a 46 ms backward pass cannot
                 give on any link that also fits BERT's rows. The paper itself draws the baselines' time as
                 computation plus communication (Figure 4; section 5.3: "the communication time substantially
                 exceeds the computation time ... Consequently, the system throughput is lower"). Why its DDP
                 did not overlap, the paper does not say (NCCL's kernels competing with the backward pass for
                 the GPU's SMs hide less than a timeline assumes; a synchronizing timer per step hides none).
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

Anything that takes an implementation's name also takes a mapping of scheme to :class:`Implementation`
(:func:`with_overlap` makes one: a named set with other overlaps for some schemes).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace

from .schemes import SCHEMES

__all__ = [
    "Implementation",
    "IMPLEMENTATIONS",
    "implementation_of",
    "with_overlap",
    "PAPER_DDP_OVERLAP",
    "DDP_SCHEMES",
    "ImplementationLike",
]

GRANULARITIES = ("bucket", "whole")


@dataclass(frozen=True)
class Implementation:
    overlap: float = 1.0  # fraction of a perfect overlap's hiding (True / False: 1 / 0)
    granularity: str = "bucket"

    def __post_init__(self) -> None:
        object.__setattr__(self, "overlap", float(self.overlap))
        if not 0.0 <= self.overlap <= 1.0:
            raise ValueError(f"overlap must be in [0, 1], got {self.overlap}")
        if self.granularity not in GRANULARITIES:
            raise ValueError(f"granularity must be one of {GRANULARITIES}, got {self.granularity!r}")
        if self.granularity == "whole" and self.overlap:
            raise ValueError("a whole-vector exchange runs after the backward pass: it cannot overlap it")


# FITTED: how much of a perfect overlap the paper's DDP baselines got (the module doc; --overlap-sweep).
PAPER_DDP_OVERLAP = 0.0
DDP_SCHEMES = ("fp32", "fp16", "powersgd")  # run by DDP itself or torch's own hooks

_HOOK = Implementation(overlap=1.0)
_BLOCKING_HOOK = Implementation(overlap=0.0)
_IN_STEP = Implementation(overlap=0.0, granularity="whole")

IMPLEMENTATIONS: dict[str, dict[str, Implementation]] = {
    "this": {scheme: _HOOK for scheme in SCHEMES},
    "paper": {
        **{s: Implementation(overlap=PAPER_DDP_OVERLAP) for s in DDP_SCHEMES},
        "onebit": _IN_STEP,
        "hierarchical": _BLOCKING_HOOK,
        "flat": _BLOCKING_HOOK,
        "allgather": _BLOCKING_HOOK,
    },
}

ImplementationLike = str | Mapping[str, Implementation]


def implementation_of(name: ImplementationLike, scheme: str) -> Implementation:
    """How implementation ``name`` (``this``, ``paper``, or a mapping of scheme to Implementation) runs
    ``scheme``."""
    if isinstance(name, str):
        try:
            table = IMPLEMENTATIONS[name]
        except KeyError:
            raise ValueError(f"unknown implementation {name!r}; known: {', '.join(IMPLEMENTATIONS)}") from None
    else:
        table = name
    try:
        return table[scheme]
    except KeyError:
        raise ValueError(f"implementation {name!r} has no entry for scheme {scheme!r}") from None


def with_overlap(name: str, overlap: float, schemes: Iterable[str] = DDP_SCHEMES) -> dict[str, Implementation]:
    """Implementation ``name`` with ``schemes`` overlapped by ``overlap`` instead (the overlap sweep of
    birder_repro.perf.validate)."""
    table = dict(IMPLEMENTATIONS[name])
    for scheme in schemes:
        table[scheme] = replace(table[scheme], overlap=overlap)
    return table

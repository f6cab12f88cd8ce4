"""Communication: topology, 1-bit packing, and the DDP communication hooks with their states.

Every scheme is attached with ``attach_<scheme>(ddp_model, optimizer, ...)`` and returns a state that
subclasses :class:`CommState` (bytes sent intra- and inter-node, compression and communication seconds, the
stage of a step, what ``.grad`` holds after the hook) and has ``state_dict()`` / ``load_state_dict()``.
:func:`attach_comm` picks the scheme an optimizer is listed with (``birder_repro.optim.OptimInfo.comm``) in
:data:`SCHEMES` and builds it from the ``optim`` config node.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch

from birder_repro.comm.accounting import CommStats
from birder_repro.comm.state import GRADIENT, MOMENTUM, UPDATE, CommState
from birder_repro.comm.topology import Topology, build_topology, flat_topology
from birder_repro.registry import Registry

__all__ = [
    "CommState",
    "CommStats",
    "GRADIENT",
    "UPDATE",
    "MOMENTUM",
    "Topology",
    "build_topology",
    "flat_topology",
    "Scheme",
    "SCHEMES",
    "attach_comm",
    "list_schemes",
    "attach_birder",
    "BirderState",
    "attach_onebit",
    "OneBitState",
    "attach_allreduce",
    "attach_powersgd",
    "attach_birder_fsdp",
    "attach_onebit_fsdp",
    "attach_hsdp",
]


@dataclass(frozen=True)
class Scheme:
    """A communication scheme: the module whose ``attach_from_config(ddp_model, optimizer, cfg, topology,
    scheme=name)`` registers its hook and returns its state (imported on first use, so that
    ``import birder_repro.comm`` stays light)."""

    name: str
    module: str
    description: str


SCHEMES: Registry[Scheme] = Registry(
    "communication scheme",
    [
        Scheme("allreduce", "birder_repro.comm.allreduce", "DDP's fp32 all-reduce, counted"),
        Scheme("fp16", "birder_repro.comm.allreduce", "torch's fp16 compression hook, counted"),
        Scheme("diloco", "birder_repro.comm.diloco", "DiLoCo: node average every step, nodes every H steps"),
        Scheme("diloco_1bit", "birder_repro.comm.diloco_onebit", "DiLoCo, its outer average 1-bit (Birder's exchange)"),
        Scheme("diloco_streaming", "birder_repro.comm.streaming", "Streaming DiLoCo: a fragment every H/P steps"),
        Scheme("two_level", "birder_repro.comm.two_level", "fp32 all-reduce in two levels (node, then nodes)"),
        Scheme("two_level_bf16", "birder_repro.comm.two_level", "bf16 all-reduce in two levels (node, then nodes)"),
        Scheme("powersgd", "birder_repro.comm.powersgd", "torch's PowerSGD hook, counted"),
        Scheme("birder", "birder_repro.comm.birder", "Hierarchical-1-bit-All-Reduce"),
        Scheme("onebit", "birder_repro.comm.onebit", "1-bit Adam / 1-bit LAMB compressed all-reduce"),
    ],
)


def list_schemes() -> list[str]:
    return SCHEMES.names()


def attach_comm(
    scheme: str,
    ddp_model: torch.nn.parallel.DistributedDataParallel,
    optimizer: torch.optim.Optimizer,
    cfg: Mapping[str, Any],
    topology: Topology,
) -> CommState:
    """Register the hook of ``scheme`` on ``ddp_model`` and return its state (KeyError naming the schemes if
    ``scheme`` is not one)."""
    module = importlib.import_module(SCHEMES[scheme].module)
    # Every hook registered here is timed per call: when each bucket became ready (birder_repro.comm.readiness).
    from birder_repro.comm.readiness import clocked_registration

    with clocked_registration(ddp_model):
        return module.attach_from_config(ddp_model, optimizer, cfg, topology, scheme=scheme)


def __getattr__(name: str):
    # Public attach functions and states, imported on first use so that `import birder_repro.comm` stays light.
    public = {
        "attach_birder": "birder_repro.comm.birder",
        "BirderState": "birder_repro.comm.birder",
        "attach_onebit": "birder_repro.comm.onebit",
        "OneBitState": "birder_repro.comm.onebit",
        "attach_allreduce": "birder_repro.comm.allreduce",
        "attach_two_level": "birder_repro.comm.two_level",
        "attach_diloco": "birder_repro.comm.diloco",
        "attach_diloco_1bit": "birder_repro.comm.diloco_onebit",
        "attach_streaming": "birder_repro.comm.streaming",
        "attach_powersgd": "birder_repro.comm.powersgd",
        "attach_birder_fsdp": "birder_repro.comm.fsdp",
        "attach_onebit_fsdp": "birder_repro.comm.fsdp",
        "attach_hsdp": "birder_repro.comm.fsdp",
    }
    if name in public:
        return getattr(importlib.import_module(public[name]), name)
    raise AttributeError(f"module 'birder_repro.comm' has no attribute {name!r}")

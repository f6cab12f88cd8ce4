"""Communication: topology, 1-bit packing, and the DDP communication hooks with their states.

Every scheme is attached with ``attach_<scheme>(ddp_model, optimizer, ...)`` and returns a state that
subclasses :class:`CommStats` (bytes sent intra- and inter-node, compression and communication seconds) and
has ``state_dict()`` / ``load_state_dict()``. :func:`attach_comm` picks the scheme an optimizer is
registered with (``birder_repro.optim.OptimInfo.comm``) and builds it from the ``optim`` config node.
"""

from __future__ import annotations

import importlib
from typing import Any, Mapping

import torch

from birder_repro.comm.accounting import CommStats
from birder_repro.comm.topology import Topology, build_topology, flat_topology

__all__ = ["CommStats", "Topology", "build_topology", "flat_topology", "attach_comm", "list_schemes",
           "attach_birder"]

# scheme name -> module defining attach_from_config(ddp_model, optimizer, cfg, topology) -> CommStats
_SCHEMES = {
    "allreduce": "birder_repro.comm.allreduce",  # DDP's fp32 all-reduce, counted
    "fp16": "birder_repro.comm.allreduce",  # torch's fp16 compression hook, counted
    "powersgd": "birder_repro.comm.powersgd",  # torch's PowerSGD hook, counted
    "birder": "birder_repro.comm.birder",  # Hierarchical-1-bit-All-Reduce
    "onebit": "birder_repro.comm.onebit",  # 1-bit Adam / 1-bit LAMB compressed all-reduce
}


def list_schemes() -> list[str]:
    return sorted(_SCHEMES)


def attach_comm(scheme: str, ddp_model: torch.nn.parallel.DistributedDataParallel, optimizer: torch.optim.Optimizer,
                cfg: Mapping[str, Any], topology: Topology) -> CommStats:
    """Register the hook of ``scheme`` on ``ddp_model`` and return its state."""
    if scheme not in _SCHEMES:
        raise KeyError(f"communication scheme {scheme!r} is unknown; known: {', '.join(list_schemes())}")
    module = importlib.import_module(_SCHEMES[scheme])
    return module.attach_from_config(ddp_model, optimizer, cfg, topology, scheme=scheme)


def __getattr__(name: str):
    # Public attach functions, imported on first use so that `import birder_repro.comm` stays light.
    public = {"attach_birder": "birder_repro.comm.birder", "attach_onebit": "birder_repro.comm.onebit",
              "attach_allreduce": "birder_repro.comm.allreduce", "attach_powersgd": "birder_repro.comm.powersgd"}
    if name in public:
        return getattr(importlib.import_module(public[name]), name)
    raise AttributeError(f"module 'birder_repro.comm' has no attribute {name!r}")

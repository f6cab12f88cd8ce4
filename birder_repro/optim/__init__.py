"""Optimizers by name: each listed with how it communicates and how it is built from its config.

``optim=<name>`` on the command line picks a record of :data:`OPTIMIZERS` and its file
``conf/optim/<name>.yaml``; the task's recipe (``conf/recipe/<task>/<name>.yaml``) sets the paper's
hyperparameters for that pair. The table below is the whole list: adding an optimizer is a line here (and its
module and config file); no module registers itself on import.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from birder_repro.registry import Registry, import_from, lazy_attributes

if TYPE_CHECKING:  # the classes are imported on first use (__getattr__ below): each module imports torch
    import torch

    from birder_repro.optim.bertadam import BertAdam
    from birder_repro.optim.birder import Birder
    from birder_repro.optim.diloco import DiLoCo
    from birder_repro.optim.diloco_1bit import DiLoCo1bit
    from birder_repro.optim.onebit_adam import OneBitAdam
    from birder_repro.optim.onebit_lamb import OneBitLamb
    from birder_repro.optim.softsignsgd import SoftSignSGD
    from birder_repro.optim.streaming_diloco import StreamingDiLoCo

__all__ = [
    "Birder",
    "OneBitAdam",
    "OneBitLamb",
    "BertAdam",
    "SoftSignSGD",
    "DiLoCo",
    "DiLoCo1bit",
    "StreamingDiLoCo",
    "OptimInfo",
    "OPTIMIZERS",
    "get_optim_info",
    "list_optimizers",
    "build_optimizer",
]

# class -> its module under birder_repro.optim. The table below and the names are torch-free, so that the CLI
# checks a config (optim.name, its scheme) without importing torch; the code is imported when it is used.
_CLASSES = {
    "Birder": "birder",
    "OneBitAdam": "onebit_adam",
    "OneBitLamb": "onebit_lamb",
    "BertAdam": "bertadam",
    "SoftSignSGD": "softsignsgd",
    "DiLoCo": "diloco",
    "DiLoCo1bit": "diloco_1bit",
    "StreamingDiLoCo": "streaming_diloco",
}


__getattr__ = lazy_attributes(__name__, _CLASSES)


@dataclass(frozen=True)
class OptimInfo:
    """A registered optimizer.

    ``builder`` is ``"<module>:<function>"`` under ``birder_repro.optim``: ``function(params, cfg)`` makes the
    torch optimizer from the ``optim`` config node (:meth:`build`); ``comm`` names the communication scheme in
    :data:`birder_repro.comm.SCHEMES` (``allreduce`` is DDP's fp32 all-reduce, counted).
    """

    name: str
    builder: str
    comm: str
    description: str

    def build(self, params: Iterable[torch.nn.Parameter], cfg: Mapping[str, Any]) -> torch.optim.Optimizer:
        module, function = self.builder.split(":")
        return import_from(__name__, module, function)(params, cfg)


OPTIMIZERS: Registry[OptimInfo] = Registry(
    "optimizer",
    [
        OptimInfo("birder", "birder:build_birder", "birder", "Birder with the Hierarchical-1-bit-All-Reduce hook"),
        OptimInfo(
            "onebit_adam",
            "onebit_adam:build_onebit_adam",
            "onebit",
            "1-bit Adam: Adam warmup, then frozen variance and 1-bit compressed momentum all-reduce",
        ),
        OptimInfo(
            "onebit_adam_precond",
            "onebit_adam:build_onebit_adam",
            "onebit",
            "1-bit Adam compressing the preconditioned momentum m / sqrt(v) (its opt-in setting, "
            "docs/optimizers.md): a peer of its own, so that it has recipes and tuned values of its own",
        ),
        OptimInfo(
            "onebit_lamb",
            "onebit_lamb:build_onebit_lamb",
            "onebit",
            "1-bit LAMB: LAMB warmup, then frozen variance, 1-bit compressed momentum and scaling ratios",
        ),
        OptimInfo(
            "bertadam",
            "bertadam:build_bertadam",
            "allreduce",
            "BERT's Adam (no bias correction, decoupled weight decay, global clipping at 1.0) with "
            "DDP's fp32 all-reduce (the BERT baseline)",
        ),
        OptimInfo(
            "softsignsgd",
            "softsignsgd:build_softsignsgd",
            "allreduce",
            "SoftSignSGD, Birder uncompressed (appendix B), with DDP's fp32 all-reduce",
        ),
        # torch's own optimizers (birder_repro.optim.torch_optims), and the same over torch's compressing hooks
        OptimInfo(
            "sgd", "torch_optims:build_plain_sgd", "allreduce", "Vanilla SGD (no momentum) with DDP's fp32 all-reduce"
        ),
        OptimInfo(
            "sgdm",
            "torch_optims:build_sgdm",
            "allreduce",
            "SGD with momentum and DDP's fp32 all-reduce (the CNN baseline)",
        ),
        OptimInfo("adamw", "torch_optims:build_adamw", "allreduce", "torch's AdamW with DDP's fp32 all-reduce"),
        OptimInfo(
            "sgdm_powersgd", "torch_optims:build_sgdm", "powersgd", "SGD with momentum over torch's PowerSGD hook"
        ),
        OptimInfo("adamw_powersgd", "torch_optims:build_adamw", "powersgd", "torch's AdamW over torch's PowerSGD hook"),
        OptimInfo(
            "sgdm_fp16", "torch_optims:build_sgdm", "fp16", "SGD with momentum over torch's fp16 compression hook"
        ),
        OptimInfo(
            "diloco",
            "diloco:build_diloco",
            "diloco",
            "DiLoCo: AdamW inside each node, an outer Nesterov step on the nodes' average every H steps",
        ),
        OptimInfo(
            "diloco_1bit",
            "diloco_1bit:build_diloco_1bit",
            "diloco_1bit",
            "DiLoCo whose outer average goes through Birder's Hierarchical-1-bit-All-Reduce (scale, error feedback)",
        ),
        OptimInfo(
            "streaming_diloco",
            "streaming_diloco:build_streaming_diloco",
            "diloco_streaming",
            "Streaming DiLoCo: fragments synced in turn, each sync overlapping tau inner steps, optionally quantized",
        ),
        OptimInfo(
            "sgdm_2level", "torch_optims:build_sgdm", "two_level", "SGD with momentum over a two-level fp32 all-reduce"
        ),
        OptimInfo(
            "sgdm_bf16_2level",
            "torch_optims:build_sgdm",
            "two_level_bf16",
            "SGD with momentum over a two-level bf16 all-reduce",
        ),
    ],
)


def get_optim_info(name: str) -> OptimInfo:
    """The record of optimizer ``name``; KeyError naming every known optimizer if there is none."""
    return OPTIMIZERS[name]


def list_optimizers() -> list[str]:
    return OPTIMIZERS.names()


def build_optimizer(params: Iterable[torch.nn.Parameter], cfg: Mapping[str, Any]) -> torch.optim.Optimizer:
    return OPTIMIZERS[cfg["name"]].build(params, cfg)

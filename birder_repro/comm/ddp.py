"""What a compressed hook needs of the DDP module it is attached to, checked at the attach in one line each.

- ``find_unused_parameters=True``: DDP all-reduces its map of locally used parameters on its own process group
  from the autograd thread once the last bucket's hook has returned, while the hook's collectives may still run
  on its communication thread (:mod:`~birder_repro.comm.overlap`) on the same group, or on the node's and the
  nodes' groups: two threads issuing collectives in no common order deadlock (gloo) or hang (NCCL). The HF
  Trainer turns it on by default (``ddp_find_unused_parameters``) for models without gradient checkpointing.
- compiled autograd's reducer (``torch._dynamo.config.optimize_ddp = "python_reducer"``): DDP's buckets are then
  all-reduced by the compiled graph, and a communication hook is never called.
- a second hook: DDP takes one communication hook per module (torch's reducer refuses a second, in words that do
  not say which hook was there).
"""

from __future__ import annotations

from typing import Any

__all__ = ["check_ddp_for_hook"]


def check_ddp_for_hook(ddp_model: Any, who: str) -> None:
    """Raise ValueError, in one line saying what to change, where ``ddp_model`` cannot run ``who``'s hook."""
    if getattr(ddp_model, "find_unused_parameters", False):
        raise ValueError(
            f"{who}: DDP(find_unused_parameters=True) would deadlock with this hook (DDP all-reduces its map of "
            "used parameters from the autograd thread while the hook's collectives run): build DDP with "
            "find_unused_parameters=False (HF Trainer: ddp_find_unused_parameters=False; Lightning: "
            "DDPStrategy(find_unused_parameters=False)), every parameter taking part in each step's loss"
        )
    if getattr(ddp_model, "_use_python_reducer", False):
        raise ValueError(
            f"{who}: compiled autograd's DDP reducer (torch._dynamo.config.optimize_ddp='python_reducer') never "
            "calls a communication hook: leave optimize_ddp at its default, or compile the model only "
            "(torch.compile(ddp_model))"
        )
    hooks = getattr(ddp_model, "_comm_hooks", None)
    if hooks:
        state = type(hooks[0][1]).__name__
        raise ValueError(
            f"{who}: this DDP module has a communication hook already (its state: {state}); DDP takes one: wrap "
            "the model in a new DistributedDataParallel to attach another"
        )

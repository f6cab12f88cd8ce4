"""PyTorch Lightning: a ``DDPStrategy`` that trains with Birder's (or 1-bit Adam's) compressed DDP hook.

    trainer = Trainer(accelerator="gpu", devices=8, num_nodes=4, strategy=BirderStrategy())

``configure_optimizers`` returns a :class:`~birder_repro.optim.Birder` (or ``OneBitAdam`` / ``OneBitLamb``) as
usual; the strategy attaches the hook that optimizer needs to the model Lightning wraps in DDP, with nodes and
processes per node from Lightning's own ``num_nodes`` and ``devices``.

Why not ``DDPStrategy(ddp_comm_hook=..., ddp_comm_state=...)``: Lightning registers that hook in
``configure_ddp``, before ``setup_optimizers`` builds the optimizer the hook needs, and only on CUDA (its
``_register_ddp_hooks`` skips other devices). So the strategy attaches in :meth:`BirderStrategy.setup`, after
both exist.

Checkpoints: Lightning writes its checkpoint file from global rank 0 only, but the hook's state is per rank
(Birder's m, b, e shards and the server's e_bar; 1-bit Adam's worker and server errors). So every rank writes
its own side file next to the checkpoint, ``<checkpoint>.birder_hook_rank{r:05d}.pt`` (:func:`hook_state_path`),
removed with it; ``Trainer.fit(ckpt_path=...)`` loads each rank's own. Before loading, one forward and backward
of the first batch (its gradients dropped, the random state kept) makes DDP rebuild its buckets as the saved
run had, so that 1-bit Adam's per-bucket scales, and so the parameters, continue bit for bit.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from lightning.pytorch.strategies import DDPStrategy
from lightning.pytorch.trainer.states import TrainerFn

from birder_repro.comm import attach_birder, attach_onebit, build_topology
from birder_repro.comm.state import CompressedCommState
from birder_repro.integrations.settle import buffers_kept
from birder_repro.optim import Birder
from birder_repro.optim.onebit_adam import OneBitOptimizer

__all__ = ["BirderStrategy", "hook_state_path"]


def hook_state_path(checkpoint: str | os.PathLike, rank: int) -> Path:
    """Where rank ``rank`` keeps its hook state for Lightning checkpoint file ``checkpoint``."""
    return Path(f"{os.fspath(checkpoint)}.birder_hook_rank{rank:05d}.pt")


def save_rank_file(state: dict, path: Path) -> None:
    """Write one rank's file, making its folder first: Lightning makes the checkpoint's folder on rank 0 alone, so
    another rank may get there first, and without a shared file system the folder is never made on its node."""
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save(state, path)


def load_rank_file(path: Path) -> dict:
    """One rank's hook state, read onto the CPU as data only (as Accelerate's path reads it): the hook's
    ``load_state_dict`` copies it onto its own device. Without ``map_location`` every tensor would go back to the
    device it was saved from, which on another machine or ``CUDA_VISIBLE_DEVICES`` may not exist or be taken."""
    return torch.load(path, map_location="cpu", weights_only=True)


class BirderStrategy(DDPStrategy):
    """``DDPStrategy`` with Birder's Hierarchical-1-bit-All-Reduce (for a ``Birder`` optimizer) or the 1-bit
    compressed all-reduce (for ``OneBitAdam`` / ``OneBitLamb``) as DDP's communication hook.

    Args:
        gpus_per_node: processes per node for Birder's hierarchy; default Lightning's ``devices`` (the
            processes of one machine). Give it to stand several nodes on one machine (tests, examples).
        scheme, kernel_backend, overlap, nonfinite: as in :func:`birder_repro.comm.attach_birder`
            (``overlap`` and ``nonfinite`` also for 1-bit Adam's hook).
        **kwargs: :class:`lightning.pytorch.strategies.DDPStrategy`'s and DDP's (``bucket_cap_mb``, ...).

    The optimizer is the only one ``configure_optimizers`` returns. ``strategy.hook_state`` is the attached
    state (byte counters, ``state_dict()``).
    """

    strategy_name = "birder_ddp"

    def __init__(
        self,
        gpus_per_node: int | None = None,
        scheme: str = "hierarchical",
        kernel_backend: str = "auto",
        overlap: bool = True,
        nonfinite: str = "skip",
        **kwargs: Any,
    ):
        for key in ("ddp_comm_hook", "ddp_comm_state", "ddp_comm_wrapper"):
            if kwargs.get(key) is not None:
                raise ValueError(
                    f"BirderStrategy({key}=...): the strategy registers its own hook; use DDPStrategy for another one"
                )
        super().__init__(**kwargs)
        self.gpus_per_node, self.scheme, self.kernel_backend = gpus_per_node, scheme, kernel_backend
        self.overlap, self.nonfinite = overlap, nonfinite
        self.hook_state: CompressedCommState | None = None
        self._ckpt_path: str | None = None  # the checkpoint fit() resumes from
        self._resume: dict | None = None  # its optimizer states, loaded at the first batch

    # ------------------------------------------------------------------------------------------ attaching
    @property
    def processes_per_node(self) -> int:
        """Birder's processes per node: ``gpus_per_node`` where given, else Lightning's ``devices`` (the nodes
        are then Lightning's ``num_nodes``: Lightning checks that devices x num_nodes is the world size)."""
        return self.gpus_per_node if self.gpus_per_node is not None else self.num_processes

    @property
    def layout_source(self) -> str:
        """Where :attr:`processes_per_node` came from, as rank 0's layout line says it."""
        if self.gpus_per_node is not None:
            return f"gpus_per_node={self.gpus_per_node} given to BirderStrategy"
        return f"Lightning's devices={self.num_processes} a node, num_nodes={self.num_nodes}"

    def setup(self, trainer) -> None:
        super().setup(trainer)  # wraps the model in DDP (configure_ddp), then builds the optimizer
        if trainer.state.fn == TrainerFn.FITTING:
            self.hook_state = self._attach()

    def _attach(self):
        if len(self.optimizers) != 1:
            raise ValueError(
                f"BirderStrategy: configure_optimizers returned {len(self.optimizers)} optimizers; "
                "the hook serves exactly one"
            )
        opt, per_node, said = self.optimizers[0], self.processes_per_node, self.layout_source
        # precision="16-mixed" on a GPU: the precision plugin's GradScaler (Lightning makes none on the CPU,
        # where it runs 16-mixed as bf16-mixed)
        scaler = getattr(self.precision_plugin, "scaler", None)
        if isinstance(opt, Birder):
            return attach_birder(
                self.model,
                opt,
                gpus_per_node=per_node,
                layout_source=said,
                scheme=self.scheme,
                kernel_backend=self.kernel_backend,
                overlap=self.overlap,
                nonfinite=self.nonfinite,
                grad_scaler=scaler,
            )
        if isinstance(opt, OneBitOptimizer):
            return attach_onebit(
                self.model,
                opt,
                topology=build_topology(per_node),
                overlap=self.overlap,
                nonfinite=self.nonfinite,
                layout_source=said,
                grad_scaler=scaler,
            )
        raise TypeError(
            f"BirderStrategy: configure_optimizers returned {type(opt).__name__}; return a "
            "birder_repro.optim Birder, OneBitAdam or OneBitLamb (other optimizers: DDPStrategy)"
        )

    def teardown(self) -> None:
        if self.hook_state is not None:
            # Stops the hook's communication thread; the state stays, so that trainer.save_checkpoint() after
            # fit() still writes every rank's hook state.
            self.hook_state.close()
        super().teardown()

    # ----------------------------------------------------------------------------------------- checkpoints
    def save_checkpoint(self, checkpoint: dict[str, Any], filepath, storage_options: Any | None = None) -> None:
        super().save_checkpoint(checkpoint, filepath, storage_options)  # rank 0 writes Lightning's file
        if self.hook_state is not None:  # every rank writes its own hook state beside it
            save_rank_file(self.hook_state.state_dict(), hook_state_path(filepath, self.global_rank))

    def remove_checkpoint(self, filepath) -> None:
        super().remove_checkpoint(filepath)
        hook_state_path(filepath, self.global_rank).unlink(missing_ok=True)

    def load_checkpoint(self, checkpoint_path, weights_only: bool | None = None) -> dict[str, Any]:
        self._ckpt_path = os.fspath(checkpoint_path)
        return super().load_checkpoint(checkpoint_path, weights_only=weights_only)

    def load_optimizer_state_dict(self, checkpoint) -> None:
        if self.hook_state is None:
            return super().load_optimizer_state_dict(checkpoint)
        if self._ckpt_path is None:
            raise RuntimeError(
                "BirderStrategy: an optimizer state arrived without a checkpoint path to read the hook's from"
            )
        path = hook_state_path(self._ckpt_path, self.global_rank)
        if not path.is_file():
            raise FileNotFoundError(
                f"{path}: this rank's Birder hook state is missing beside {self._ckpt_path} "
                "(BirderStrategy writes one per rank; resume on the same number of processes)"
            )
        self._resume = {"checkpoint": checkpoint, "hook": load_rank_file(path)}

    def on_train_batch_start(self, batch: Any, batch_idx: int) -> None:
        super().on_train_batch_start(batch, batch_idx)
        if self._resume is not None:
            resume, self._resume = self._resume, None
            self._settle_buckets(batch, batch_idx)
            super().load_optimizer_state_dict(resume["checkpoint"])
            if self.hook_state is not None:  # set whenever a resume was read (load_optimizer_state_dict)
                self.hook_state.load_state_dict(resume["hook"])

    def _settle_buckets(self, batch: Any, batch_idx: int) -> None:
        """One forward and backward through DDP, before the saved states are loaded (the fresh optimizer is in
        its first step, so the hook changes nothing that the load does not replace): DDP rebuilds its buckets
        after its first backward, as the saved run's did. Gradients dropped, random state and buffers (batch
        norm's statistics) kept. Collective."""
        devices = [self.root_device] if self.root_device.type == "cuda" else []
        with torch.random.fork_rng(devices=devices), buffers_kept(self.lightning_module):
            out = self.training_step(batch, batch_idx)
            loss = out["loss"] if isinstance(out, Mapping) else out
            if not isinstance(loss, torch.Tensor):
                raise TypeError(
                    f"BirderStrategy: training_step returned {type(out).__name__}, not a loss to resume with"
                )
            loss.backward()
        module = self.lightning_module
        for p in module.parameters() if module is not None else ():
            p.grad = None

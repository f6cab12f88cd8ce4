"""Birder's (or 1-bit Adam's) hook in the Hugging Face Trainer (docs/integrations.md).

    trainer = BirderTrainer(model=model, args=TrainingArguments(..., max_grad_norm=0), train_dataset=ds,
                            optimizers=(Birder(model.parameters(), ...), None), gpus_per_node=8)
    trainer.train()                                   # or trainer.train(resume_from_checkpoint=True)

The Trainer has no hook argument and wraps the model in DDP inside ``train()`` (``accelerator.prepare`` in
``_prepare_for_training``), so :class:`BirderTrainer` attaches the hook at the first ``training_step``: the
model it is handed there is the DDP module, and no backward has run yet. A ``train(resume_from_checkpoint=...)``
then loads every rank's hook state from the checkpoint before that first backward, after one backward of that
batch whose gradients are dropped (:func:`~birder_repro.integrations.accelerate.regroup_buckets`: DDP's buckets
grouped as the saved run had them, so that 1-bit Adam resumes bit for bit).

Checkpoints: the Trainer's own files are the model, the optimizer (rank 0's), the scheduler and one RNG-state
file per process (``_save_rng_state``, called on every process with the checkpoint folder); each rank writes its
``birder_hook_rank{r:05d}.pt`` beside its RNG state, since the hook's state is per rank.

Two settings the hook changes the meaning of: ``.grad`` holds Birder's update (+-1) or 1-bit Adam's averaged
momentum after the hook, so gradient clipping (``max_grad_norm``, 1.0 by default) would rescale the update
itself: it must be 0. And a ``train_sampler`` that is a ``DistributedSampler`` (or has ``num_replicas`` and
``rank``, or is declared so by ``train_sampler_per_rank=True``) is already one rank's share: the loader uses it as
is (Accelerate's ``prepare`` would otherwise shard its batches again); any other is sharded, with a warning.
"""

from __future__ import annotations

import warnings

import torch
from accelerate.optimizer import AcceleratedOptimizer
from torch.utils.data import DistributedSampler, Sampler
from transformers import Trainer
from transformers.trainer_utils import get_last_checkpoint

from birder_repro.comm import CommState
from birder_repro.integrations.accelerate import (
    attach_hook,
    ddp_module,
    inner_optimizer,
    load_hook_state,
    regroup_buckets,
    report_skips_to_accelerate,
    save_hook_state,
)

__all__ = ["BirderTrainer"]


def _settle_arguments(args) -> None:
    """The two TrainingArguments the hook changes the meaning of, checked before anything runs: what the Trainer
    would only have guessed is set, what the user asked for and the hook cannot honour is refused, both problems
    in one message.

    - ``ddp_find_unused_parameters``: left at None, the Trainer turns it on for a model without gradient
      checkpointing, and DDP's map of used parameters would deadlock with the hook
      (:func:`birder_repro.comm.buckets.require_buckets`): set to False. Asked for (True): refused.
    - ``max_grad_norm`` (1.0 by default): clipping rescales ``.grad``, which holds the hook's result (Birder's
      +-1 update, 1-bit Adam's averaged momentum), not a gradient: it must be 0.
    """
    problems = []
    if args.max_grad_norm and args.max_grad_norm > 0 and args.world_size > 1:  # one process: no hook, true grads
        problems.append(
            f"max_grad_norm={args.max_grad_norm} (the Trainer's default is 1.0) would clip .grad, which holds the "
            "hook's result, not a gradient: pass max_grad_norm=0"
        )
    if args.ddp_find_unused_parameters:
        problems.append(
            "ddp_find_unused_parameters=True would deadlock DDP's map of used parameters with the hook's "
            "collectives: pass ddp_find_unused_parameters=False"
        )
    if problems:
        raise ValueError("BirderTrainer: TrainingArguments " + "; ".join(problems))
    if args.ddp_find_unused_parameters is None:
        args.ddp_find_unused_parameters = False


def sampler_is_per_rank(sampler, declared: bool | None, world_size: int) -> tuple[bool, str | None]:
    """Whether ``train_sampler`` yields one rank's share already (so Accelerate must not shard its batches again),
    and a warning where that is a guess. ``declared`` (``train_sampler_per_rank=``) decides; else a
    ``DistributedSampler``, or a sampler with ``num_replicas`` and ``rank`` (the convention of rank-aware
    samplers), is per rank; any other sampler is sharded across the processes, with a warning saying so, since
    a per-rank sampler sharded again would show each rank every other batch of its share (and the epochs pass
    twice as fast)."""
    if sampler is None or world_size <= 1:
        return False, None
    if declared is not None:
        return declared, None
    if isinstance(sampler, DistributedSampler) or (hasattr(sampler, "num_replicas") and hasattr(sampler, "rank")):
        return True, None
    return False, (
        f"BirderTrainer: train_sampler={type(sampler).__name__} is taken as the whole data set's order and its "
        f"batches are sharded across the {world_size} processes; if it already yields this rank's share, pass "
        "train_sampler_per_rank=True"
    )


class BirderTrainer(Trainer):
    """A :class:`transformers.Trainer` that trains with Birder's (or 1-bit Adam's) hook on its DDP model.

    Pass the optimizer as ``optimizers=(Birder(...), scheduler_or_None)``; ``gpus_per_node`` (processes per
    node; default torchrun's LOCAL_WORLD_SIZE) and ``scheme`` go to the attach, ``hook_kwargs`` too (overlap,
    kernel_backend, nonfinite). ``train_sampler``: the training set's sampler in place of the Trainer's.
    After ``train()`` has started, ``trainer.hook_state`` is the hook's state (None in a single process).
    """

    def __init__(
        self,
        *args,
        gpus_per_node: int | None = None,
        scheme: str = "hierarchical",
        hook_kwargs: dict | None = None,
        train_sampler: Sampler | None = None,
        train_sampler_per_rank: bool | None = None,
        **kwargs,
    ):
        super().__init__(*args, **kwargs)
        _settle_arguments(self.args)  # again: a Trainer without _build_accelerator_args reaches here unchecked
        self.gpus_per_node, self.scheme, self.hook_kwargs = gpus_per_node, scheme, dict(hook_kwargs or {})
        self.train_sampler = train_sampler
        self.train_sampler_per_rank = train_sampler_per_rank
        self.hook_state: CommState | None = None
        self._hook_model: torch.nn.Module | None = None  # the DDP module the hook is on
        self._resume_dir: str | None = None

    def _build_accelerator_args(self, **kwargs):
        # Where the Trainer (inside __init__) turns ddp_find_unused_parameters into DDP's keyword: settled first.
        _settle_arguments(self.args)
        return super()._build_accelerator_args(**kwargs)

    # ------------------------------------------------------------------------------------------ the hook
    def train(self, resume_from_checkpoint=None, *args, **kwargs):
        """``Trainer.train``, remembering which checkpoint (if any) the hook state comes from."""
        resume = resume_from_checkpoint
        if resume is True:  # the Trainer's own rule: the last checkpoint-* in output_dir
            resume = get_last_checkpoint(self.args.output_dir)
        self._resume_dir = resume or None
        return super().train(resume_from_checkpoint, *args, **kwargs)

    def training_step(self, model, inputs, num_items_in_batch=None):
        if self._hook_model is None or self._hook_model is not ddp_module(self.accelerator, model):
            self._attach(model, inputs)
        return super().training_step(model, inputs, num_items_in_batch)

    def _attach(self, model: torch.nn.Module, inputs: dict) -> None:
        """Attach to the DDP module the Trainer built (collective: every rank's first training_step)."""
        ddp = ddp_module(self.accelerator, model)
        if ddp is None:  # one process: the optimizer runs Algorithm 1 on its own, no hook
            return
        if self.optimizer is None:
            raise RuntimeError("BirderTrainer: the Trainer built no optimizer before its first training step")
        self.hook_state = attach_hook(
            ddp,
            inner_optimizer(self.optimizer),
            gpus_per_node=self.gpus_per_node,
            scheme=self.scheme,
            **{"grad_scaler": self.accelerator.scaler, **self.hook_kwargs},  # fp16=True: the Trainer's scaler
        )
        if isinstance(self.optimizer, AcceleratedOptimizer) and self.optimizer.scaler is not None:
            report_skips_to_accelerate(self.optimizer, inner_optimizer(self.optimizer))
        self._hook_model = ddp
        if self._resume_dir is not None:
            # DDP's buckets as the saved run had them (1-bit Adam's scales are per bucket), then the saved state.
            # The optimizer's state is loaded already; the hook only reads it, and its errors are replaced.
            model.train()
            regroup_buckets(model, lambda: self._loss_of(model, inputs))
            load_hook_state(self.hook_state, self._resume_dir, self.args.process_index)

    def _loss_of(self, model: torch.nn.Module, inputs: dict) -> torch.Tensor:
        """The Trainer's loss of ``inputs`` (compute_loss returns (loss, outputs) when asked for outputs)."""
        out = self.compute_loss(model, self._prepare_inputs(dict(inputs)))
        return out[0] if isinstance(out, tuple) else out

    # ----------------------------------------------------------------------------------------- checkpoints
    def _save_rng_state(self, output_dir: str) -> None:
        """The Trainer's per-process file of a checkpoint, and beside it this rank's hook state."""
        super()._save_rng_state(output_dir)
        if self.hook_state is not None:
            save_hook_state(self.hook_state, output_dir, self.args.process_index)

    # ---------------------------------------------------------------------------------------------- data
    def _get_train_sampler(self, train_dataset=None):
        return self.train_sampler if self.train_sampler is not None else super()._get_train_sampler(train_dataset)

    def get_train_dataloader(self):
        """The Trainer's loader; a ``train_sampler`` that is one rank's share already is not sharded again."""
        loader = super().get_train_dataloader()
        per_rank, note = sampler_is_per_rank(self.train_sampler, self.train_sampler_per_rank, self.args.world_size)
        if note:
            warnings.warn(note, stacklevel=2)
        if per_rank:
            shard = getattr(loader, "batch_sampler", None)  # Accelerate's BatchSamplerShard
            if hasattr(shard, "num_processes"):
                # transformers does the same for its own rank-aware BatchRebalanceSampler
                shard.num_processes, shard.process_index = 1, 0
        return loader

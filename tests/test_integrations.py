"""The integrations' small parts, in one process: per-rank hook files and the attach's refusals."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("accelerate")

from birder_repro.comm import flat_topology
from birder_repro.comm.birder import BirderState
from birder_repro.integrations.accelerate import attach_hook, hook_state_path, load_hook_state, save_hook_state


def test_hook_state_round_trips_through_its_rank_file(tmp_path):
    state = BirderState(flat_topology(), seed=3)
    state.intra_node_bytes = 123.0
    path = save_hook_state(state, str(tmp_path / "ckpt"), rank=1)
    assert path == hook_state_path(str(tmp_path / "ckpt"), 1) and path.endswith("birder_hook_rank00001.pt")
    fresh = BirderState(flat_topology(), seed=0)
    load_hook_state(fresh, str(tmp_path / "ckpt"), rank=1)
    assert fresh.seed == 3 and fresh.intra_node_bytes == 123.0


def test_missing_hook_file_names_it(tmp_path):
    with pytest.raises(FileNotFoundError, match="birder_hook_rank00002.pt is missing"):
        load_hook_state(BirderState(flat_topology()), str(tmp_path), rank=2)


def test_attach_refuses_an_optimizer_without_a_hook():
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(2))], lr=0.1)
    with pytest.raises(TypeError, match="SGD: the hook needs"):
        attach_hook(None, opt)


def test_the_trainer_arguments_the_hook_needs_are_set_or_refused_in_one_message():
    from types import SimpleNamespace

    from birder_repro.integrations.hf_trainer import _settle_arguments

    defaults = SimpleNamespace(max_grad_norm=1.0, ddp_find_unused_parameters=None, world_size=2)  # the Trainer's
    with pytest.raises(ValueError, match=r"max_grad_norm=1.0 .* pass max_grad_norm=0$"):
        _settle_arguments(defaults)
    both = SimpleNamespace(max_grad_norm=1.0, ddp_find_unused_parameters=True, world_size=2)
    with pytest.raises(ValueError) as err:
        _settle_arguments(both)
    assert "max_grad_norm=0" in str(err.value) and "ddp_find_unused_parameters=False" in str(err.value)
    assert "\n" not in str(err.value)
    guessed = SimpleNamespace(max_grad_norm=0.0, ddp_find_unused_parameters=None, world_size=2)
    _settle_arguments(guessed)  # the Trainer's guess (on for a model without gradient checkpointing): turned off
    assert guessed.ddp_find_unused_parameters is False
    alone = SimpleNamespace(max_grad_norm=1.0, ddp_find_unused_parameters=None, world_size=1)
    _settle_arguments(alone)  # one process: no hook, .grad holds gradients, clipping stays the user's


def test_a_ranks_lightning_hook_file_makes_its_folder(tmp_path):
    """Rank 1 may save before rank 0 has made the checkpoint's folder (or on a node that never sees it)."""
    pytest.importorskip("lightning")
    from birder_repro.integrations.lightning import hook_state_path, save_rank_file

    path = hook_state_path(tmp_path / "not-made-yet" / "epoch=0-step=10.ckpt", rank=1)
    save_rank_file({"m": torch.ones(2)}, path)
    assert torch.load(path, weights_only=True)["m"].tolist() == [1.0, 1.0]


def test_a_per_rank_sampler_is_not_sharded_again_and_any_other_is_sharded_with_a_warning():
    """A sampler that already yields one rank's share, sharded again by Accelerate, shows each rank every other
    batch of it (seen: the Trainer reported epoch 2 after 20 steps)."""
    from torch.utils.data import DistributedSampler, RandomSampler, Sampler

    from birder_repro.integrations.hf_trainer import sampler_is_per_rank

    class RankAware(Sampler):  # a user's own, with the usual rank-aware attributes
        num_replicas, rank = 2, 1

        def __iter__(self):
            return iter(range(1, 10, 2))

    data = list(range(10))
    assert sampler_is_per_rank(DistributedSampler(data, num_replicas=2, rank=0), None, 2) == (True, None)
    assert sampler_is_per_rank(RankAware(), None, 2) == (True, None)
    per_rank, note = sampler_is_per_rank(RandomSampler(data), None, 2)
    assert not per_rank and "train_sampler=RandomSampler" in note and "train_sampler_per_rank=True" in note
    assert sampler_is_per_rank(RandomSampler(data), True, 2) == (True, None)  # declared: no guess, no warning
    assert sampler_is_per_rank(RandomSampler(data), None, 1) == (False, None)  # one process: nothing to shard

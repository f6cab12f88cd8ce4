"""Crash-safe checkpoints: one directory per step, complete only once marked, rotation, data-only loading."""

from __future__ import annotations

import json

import pytest
import torch
from torch import nn

from birder_repro.train.checkpoint import (
    COMPLETE,
    MANIFEST,
    CheckpointError,
    RunIdentity,
    complete_checkpoints,
    load_checkpoint,
    save_checkpoint,
    step_dir,
)
from birder_repro.train.resume_point import choose_resume

CPU = torch.device("cpu")
IDENTITY = RunIdentity(task="blobs", optim="sgdm", scheme="allreduce", nodes=1, gpus_per_node=1, world_size=1)


def _parts(seed=0):
    torch.manual_seed(seed)
    model = nn.Linear(3, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model(torch.randn(4, 3)).sum().backward()
    opt.step()
    return model, opt


def _save(run_dir, step, keep=2, identity=IDENTITY):
    model, opt = _parts(step)
    return save_checkpoint(run_dir, step, float(step * 4), model, opt, None, 0, 1, CPU, identity, keep)


def test_each_step_has_its_own_complete_directory_and_only_the_newest_are_kept(tmp_path):
    for step in (10, 20, 30):
        _save(tmp_path, step)
    assert [s for s, _ in complete_checkpoints(tmp_path / "checkpoints")] == [20, 30]
    manifest = json.loads((step_dir(tmp_path, 30) / MANIFEST).read_text())
    assert manifest["step"] == 30 and manifest["layout"] == {"nodes": 1, "gpus_per_node": 1, "world_size": 1}
    assert {"task", "optim", "scheme", "config_digest", "versions"} <= set(manifest)


def test_an_incomplete_checkpoint_is_never_resumed_and_the_previous_one_survives(tmp_path):
    _save(tmp_path, 10)
    _save(tmp_path, 20)
    (step_dir(tmp_path, 20) / COMPLETE).unlink()  # a crash between the shards and the marker
    assert choose_resume("auto", tmp_path, restarted=False, device=CPU) == step_dir(tmp_path, 10)
    with pytest.raises(CheckpointError, match="not a complete checkpoint"):
        choose_resume(str(step_dir(tmp_path, 20)), tmp_path, restarted=False, device=CPU)
    _save(tmp_path, 30)  # the incomplete one is cleaned away once a newer one is complete
    assert not step_dir(tmp_path, 20).exists() and step_dir(tmp_path, 10).exists()


def test_resume_rules(tmp_path):
    other = tmp_path / "other"
    _save(other, 40)
    run = tmp_path / "run"
    assert choose_resume(None, run, restarted=False, device=CPU) is None
    assert choose_resume("auto", run, restarted=False, device=CPU) is None  # nothing yet: a fresh start
    assert choose_resume(str(other), run, restarted=False, device=CPU) == step_dir(other, 40)
    _save(run, 20)
    assert choose_resume(None, run, restarted=True, device=CPU) == step_dir(run, 20)  # its own, after a restart
    assert choose_resume(str(other), run, restarted=True, device=CPU) == step_dir(run, 20)
    assert choose_resume(None, run, restarted=False, device=CPU) is None


def test_a_checkpoint_round_trips_as_data_only(tmp_path):
    where = _save(tmp_path, 10)
    model, opt = _parts(99)
    step, samples = load_checkpoint(where, model, opt, None, 0, 1, CPU, IDENTITY)
    ref, ref_opt = _parts(10)
    assert (step, samples) == (10, 40.0)
    assert torch.equal(model.weight, ref.weight)
    assert torch.equal(
        opt.state_dict()["state"][0]["momentum_buffer"], ref_opt.state_dict()["state"][0]["momentum_buffer"]
    )


@pytest.mark.parametrize("key,value", [("task", "bert"), ("optim", "birder"), ("scheme", "onebit")])
def test_a_checkpoint_of_another_task_optimizer_or_scheme_is_refused_naming_both(tmp_path, key, value):
    where = _save(tmp_path, 10)
    model, opt = _parts()
    other = RunIdentity(**{**IDENTITY.__dict__, key: value})
    with pytest.raises(CheckpointError, match=f"{key} '{getattr(IDENTITY, key)}'.*{key} is '{value}'"):
        load_checkpoint(where, model, opt, None, 0, 1, CPU, other)

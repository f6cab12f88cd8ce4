"""train.* settings read once (birder_repro.train.settings): defaults, the derived run plan, clear errors."""

from __future__ import annotations

from pathlib import Path

import pytest
from omegaconf import OmegaConf

from birder_repro.config.settings import ConfigError
from birder_repro.train import RunPlan, TrainSettings

ROOT = Path(__file__).resolve().parents[1]


def cfg_with(**train):
    base = OmegaConf.load(ROOT / "conf" / "config.yaml")
    base.train.merge_with(train)
    return OmegaConf.create({"train": base.train})


def test_the_shipped_defaults_are_the_dataclass_defaults():
    from dataclasses import fields

    shipped = TrainSettings.from_config(cfg_with())
    for f in fields(TrainSettings):
        if f.name not in ("batch_size", "schedule"):
            assert getattr(shipped, f.name) == f.default, f.name
    assert shipped.schedule["name"] == "constant" and shipped.batch_size == 128


def test_missing_optional_keys_take_defaults_and_task_keys_are_ignored():
    s = TrainSettings.from_config(OmegaConf.create({"train": {"batch_size": 4, "label_smoothing": 0.1}}))
    assert (s.log_every, s.compute_calibration_passes, s.eval_max_batches, s.resume) == (10, 3, None, None)


def test_run_plan_computes_global_batch_and_steps_once():
    plan = RunPlan.build(cfg_with(batch_size=16, epochs=2), world_size=4, train_size=1000)
    assert plan.global_batch == 64 and plan.steps == 2 * 16  # ceil(1000 / 64) = 16 steps an epoch
    assert RunPlan.build(cfg_with(batch_size=16, steps=7), world_size=4, train_size=1000).steps == 7


@pytest.mark.parametrize(
    "key,value,message",
    [
        ("batch_size", 0, "train.batch_size=0"),
        ("steps", 0, "train.steps=0"),
        ("log_every", 0, "train.log_every=0"),
        ("eval_max_batches", 0, "train.eval_max_batches=0"),
        ("timing_warmup_steps", -1, "train.timing_warmup_steps=-1"),
        ("compute_calibration_passes", 0, "train.compute_calibration_passes=0"),
        ("checkpoint_every", 1.5, "train.checkpoint_every=1.5"),
        ("grad_clip", -1.0, "train.grad_clip=-1.0"),
        ("schedule", {"name": "linear"}, "train.schedule.name='linear'"),
    ],
)
def test_bad_values_name_their_key(key, value, message):
    with pytest.raises(ConfigError, match=message.replace(".", r"\.").replace("(", r"\(")):
        TrainSettings.from_config(cfg_with(**{key: value}))

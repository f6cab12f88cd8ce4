"""LR schedules at the points the paper fixes (Birder paper, section 5.1 and appendix B.1)."""

import math

import pytest

from birder_repro.optim.schedule import lr_factor, steps_of


def test_constant_is_one_everywhere():
    cfg = {"name": "constant"}
    assert [lr_factor(s, 100, cfg) for s in (0, 50, 99, 100)] == [1.0] * 4


def test_resnet50_divides_by_ten_after_30_60_90_of_100_epochs():
    # Section 5.1: "divided by 10 after 30, 60 and 90 epochs, ... terminated after 100 epochs".
    # 100 steps per epoch: the milestones as fractions land on the first step of epochs 30, 60 and 90.
    per_epoch, total = 100, 100 * 100
    cfg = {"name": "multistep", "milestones": [0.3, 0.6, 0.9], "gamma": 0.1}
    for epoch, want in [(0, 1.0), (29, 1.0), (30, 0.1), (59, 0.1), (60, 0.01), (89, 0.01), (90, 0.001), (99, 0.001)]:
        assert lr_factor(epoch * per_epoch, total, cfg) == pytest.approx(want)
    assert lr_factor(30 * per_epoch - 1, total, cfg) == 1.0  # the last step of epoch 29 still at the peak


def test_multistep_milestones_given_as_steps():
    cfg = {"name": "multistep", "milestones": [75, 130], "gamma": 0.1}
    assert lr_factor(74, 150, cfg) == 1.0
    assert lr_factor(75, 150, cfg) == pytest.approx(0.1)
    assert lr_factor(130, 150, cfg) == pytest.approx(0.01)


def test_resnet20_recipe_milestones_are_epochs_75_and_130_of_150():
    # conf/task/resnet20.yaml: milestones [0.5, 0.8667] of 150 epochs (appendix B.1).
    assert [steps_of(m, 150) for m in (0.5, 0.8667)] == [75, 130]


def test_bert_warmup_500_then_linear_to_zero():
    # Section 5.1: "linearly increases ... in the early 500 steps and then linearly decreases to 0".
    total = 2500
    cfg = {"name": "warmup_linear", "warmup": 500}
    assert lr_factor(0, total, cfg) == 0.0
    assert lr_factor(250, total, cfg) == pytest.approx(0.5)
    assert lr_factor(500, total, cfg) == pytest.approx(1.0)  # the peak at the end of warmup
    assert lr_factor(1500, total, cfg) == pytest.approx(0.5)  # halfway through the decay
    assert lr_factor(2500, total, cfg) == 0.0
    assert lr_factor(3000, total, cfg) == 0.0  # never negative past the end


def test_warmup_as_fraction_of_the_run():
    cfg = {"name": "warmup_linear", "warmup": 0.1}
    assert lr_factor(50, 1000, cfg) == pytest.approx(0.5)
    assert lr_factor(100, 1000, cfg) == pytest.approx(1.0)


def test_cosine_with_warmup():
    cfg = {"name": "cosine", "warmup": 100}
    assert lr_factor(50, 1100, cfg) == pytest.approx(0.5)
    assert lr_factor(100, 1100, cfg) == pytest.approx(1.0)
    assert lr_factor(600, 1100, cfg) == pytest.approx(0.5)  # half of the cosine: cos(pi/2) = 0
    assert lr_factor(350, 1100, cfg) == pytest.approx(0.5 * (1 + math.cos(math.pi / 4)))
    assert lr_factor(1100, 1100, cfg) == pytest.approx(0.0)


def test_warmup_applies_before_multistep():
    cfg = {"name": "multistep", "milestones": [0.5], "gamma": 0.1, "warmup": 10}
    assert lr_factor(5, 100, cfg) == pytest.approx(0.5)
    assert lr_factor(10, 100, cfg) == 1.0
    assert lr_factor(50, 100, cfg) == pytest.approx(0.1)


def test_unknown_schedule_and_negative_length_fail_loudly():
    with pytest.raises(ValueError, match="unknown lr schedule 'step'"):
        lr_factor(0, 10, {"name": "step"})
    with pytest.raises(ValueError, match=">= 0"):
        lr_factor(0, 10, {"name": "cosine", "warmup": -1})


def test_steps_of_is_the_one_reading_of_fractions_or_steps():
    # birder_repro.optim.schedule.steps_of reads train.schedule.warmup / milestones, optim.freeze and
    # optim.comm.start_iter alike: a fraction of the run below 1, a whole number of steps from 1 on.
    assert steps_of(0.15, 1000, "optim.freeze") == 150
    assert steps_of(500, None, "optim.freeze") == 500  # steps need no run length
    assert steps_of(0, None, "train.schedule.warmup") == 0
    with pytest.raises(ValueError, match=r"optim\.freeze=0\.15 is a fraction of the run, so optim\.total_steps"):
        steps_of(0.15, None, "optim.freeze")
    with pytest.raises(ValueError, match=r"optim\.comm\.start_iter >= 1 is a number of steps and must be whole"):
        steps_of(12.5, 100, "optim.comm.start_iter")
    with pytest.raises(ValueError, match=r"train\.schedule\.warmup must be >= 0"):
        lr_factor(0, 10, {"name": "cosine", "warmup": -0.5})

"""Synthetic data evaluates on a small set by default and says so at start; real data keeps its whole set.

A smoke run (``model.size=tiny data.source=synthetic train.steps=4``) must not spend minutes evaluating 50,000
synthetic images after four steps.
"""

from __future__ import annotations

import pytest

from birder_repro.tasks import get_task

# task -> the keys that size its synthetic evaluation, and the most each may hold by default
SMALL_EVAL = {
    "resnet20": {"data.synthetic_eval_size": 1000},
    "resnet50": {"data.synthetic_eval_size": 500},
    "vit": {"data.synthetic_eval_size": 500},
    "bert_squad": {"data.synthetic_eval_size": 256},
    "bert_pretrain": {"data.synthetic_eval_size": 256},
    "lstm_ptb": {"data.synthetic_valid_tokens": 7000, "data.synthetic_test_tokens": 7000},
}
FAST = {"lstm_ptb": ["data.synthetic_train_tokens=5000"], "vit": ["data.image_size=32"],
        "resnet50": ["data.image_size=32"]}
NO_LOADER = {"lstm_ptb"}  # batches are cut from token streams: no DataLoader, no data.num_workers


@pytest.mark.parametrize("task", sorted(SMALL_EVAL))
def test_synthetic_evaluation_is_small_by_default_and_said(compose, task):
    from omegaconf import OmegaConf

    loader = [] if task in NO_LOADER else ["data.num_workers=0"]
    cfg = compose([f"task={task}", "model.size=tiny", "data.source=synthetic", "train.batch_size=4", *loader,
                   *FAST.get(task, [])])
    for key, most in SMALL_EVAL[task].items():
        assert OmegaConf.select(cfg, key) <= most, key
    data = get_task(task).build_data(cfg, rank=0, world_size=1)
    assert "small evaluation set by default" in data.description
    for key in SMALL_EVAL[task]:
        assert key in data.description

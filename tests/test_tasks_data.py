"""What every task says of its data before it reads any: the real files it needs (checked by the CLI before it
launches anything), and a small synthetic evaluation set by default, said at start.

A smoke run (``model.size=tiny data.source=synthetic train.steps=4``) must not spend minutes evaluating 50,000
synthetic images after four steps; real data keeps its whole evaluation set.
"""

from __future__ import annotations

import pytest

from birder_repro.tasks import DatasetNotFound, check_data, get_task

# task -> the keys that size its synthetic evaluation, and the most each may hold by default
SMALL_EVAL = {
    "resnet20": {"data.synthetic_eval_size": 1000},
    "resnet50": {"data.synthetic_eval_size": 500},
    "vit": {"data.synthetic_eval_size": 500},
    "bert_squad": {"data.synthetic_eval_size": 256},
    "bert_pretrain": {"data.synthetic_eval_size": 256},
    "lstm_ptb": {"data.synthetic_valid_tokens": 7000, "data.synthetic_test_tokens": 7000},
}
FAST = {
    "lstm_ptb": ["data.synthetic_train_tokens=5000"],
    "vit": ["data.image_size=32"],
    "resnet50": ["data.image_size=32"],
}
NO_LOADER = {"lstm_ptb"}  # batches are cut from token streams: no DataLoader, no data.num_workers


@pytest.mark.parametrize("task", sorted(SMALL_EVAL))
def test_synthetic_evaluation_is_small_by_default_and_said(compose, task):
    from omegaconf import OmegaConf

    loader = [] if task in NO_LOADER else ["data.num_workers=0"]
    cfg = compose(
        [f"task={task}", "model.size=tiny", "data.source=synthetic", "train.batch_size=4", *loader, *FAST.get(task, [])]
    )
    for key, most in SMALL_EVAL[task].items():
        assert OmegaConf.select(cfg, key) <= most, key
    data = get_task(task).build_data(cfg, rank=0, world_size=1)
    assert "small evaluation set by default" in data.description
    for key in SMALL_EVAL[task]:
        assert key in data.description


# task -> the files (name ending in /: a folder) that make its real dataset under data.root, for check_data
REAL_FILES = {
    "resnet20": ["cifar-100-python/train", "cifar-100-python/test", "cifar-100-python/meta"],
    "resnet50": ["train/", "val/"],
    "vit": ["train/", "val/"],
    "lstm_ptb": ["ptb.train.txt", "ptb.valid.txt", "ptb.test.txt"],
    "bert_squad": ["train-v1.1.json", "dev-v1.1.json"],
    "bert_pretrain": ["wiki.txt"],
}


@pytest.mark.parametrize("task", sorted(REAL_FILES))
def test_check_data_names_each_missing_file_and_passes_once_all_are_there(compose, tmp_path, task):
    cfg = compose([f"task={task}", f"data.root={tmp_path}"])
    for name in REAL_FILES[task]:
        with pytest.raises(DatasetNotFound, match="data.root"):
            check_data(cfg)
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.mkdir() if name.endswith("/") else path.write_text("")
    check_data(cfg)


@pytest.mark.parametrize(
    "overrides,files",
    [
        (["task=resnet50", "data.source=synthetic"], "data.source=real"),  # synthetic data is made, never missing
        (["task=resnet20", "data.download=true"], "data.download=false"),  # torchvision fetches it
        (["task=bert_squad", "data.hf_name=squad"], "data.hf_name=null"),  # the datasets library fetches it
        (["task=bert_pretrain", "data.hf_name=wikimedia/wikipedia"], "data.hf_name=null"),
        (["task=digits"], None),  # scikit-learn's bundled copy
    ],
)
def test_check_data_leaves_data_that_is_not_files_under_data_root(compose, tmp_path, overrides, files):
    """Passes with nothing under data.root; the same run reading its files from data.root (``files``) is
    refused, so the check did look at the setting that decides it."""

    def check(extra):
        cfg = compose([*overrides, *extra])
        if cfg.data.root is not None:
            cfg.data.root = str(tmp_path / "nothing")
        return check_data(cfg)

    assert check([]) is None
    if files is None:
        assert compose(overrides).data.root is None  # no data.root at all: nothing that could be missing
    else:
        with pytest.raises(DatasetNotFound, match="data.root"):
            check([files])

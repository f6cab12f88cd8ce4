"""The image tasks (resnet20, resnet50, digits): models, real-format loading, synthetic data, metrics, sharding.

Real datasets cannot be downloaded here, so each real loader reads small files in the dataset's own format that
the tests write (CIFAR-100's pickles, ImageNet-style image folders); digits ship with scikit-learn.
"""

from __future__ import annotations

import os
import pickle

import numpy as np
import pytest
import torch
from PIL import Image

from birder_repro.tasks import DatasetNotFound, get_task, list_tasks
from birder_repro.tasks.common import ShardSampler, SyntheticImages, num_parameters, topk_correct
from birder_repro.tasks.digits import synthetic_digits
from birder_repro.tasks.resnet20 import resnet20

CPU = torch.device("cpu")


@pytest.fixture(autouse=True)
def _one_thread():
    """One intra-op thread: these small models gain nothing from two, and on a busy 2-core machine two OpenMP
    threads waiting on each other made the digits test 20x slower (49 s against 2.5 s)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def task_cfg(compose, task: str, *overrides: str):
    """The composed config of ``birder-repro task=<task> <overrides>``, loading in this process (no workers)."""
    return compose([f"task={task}", "data.num_workers=0", *overrides])


def train_steps(task, cfg, steps: int, lr: float = 3e-3, epochs: int = 1) -> torch.nn.Module:
    """Adam on one process for ``steps`` batches per epoch: enough to tell a learnable task from noise."""
    torch.manual_seed(0)
    model, data = task.build_model(cfg), task.build_data(cfg, 0, 1)
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    for epoch in range(epochs):
        data.sampler.set_epoch(epoch)
        for _, batch in zip(range(steps), data.train):
            loss, _ = task.loss(model, batch, CPU)
            opt.zero_grad()
            loss.backward()
            opt.step()
    return model, data


def accuracy(task, model, loader) -> dict[str, float]:
    sums = task.evaluate(model, loader, CPU)
    return task.finalize({k: s / n for k, (s, n) in sums.items()})


# ------------------------------------------------------------------------------------------------ registry


def test_image_tasks_registered():
    assert {"resnet20", "resnet50", "digits"} <= set(list_tasks())
    for name in ("resnet20", "resnet50", "digits"):
        assert get_task(name).name == name


@pytest.mark.parametrize("task", ["resnet20", "resnet50", "digits"])
def test_config_composes_with_the_keys_the_task_reads(compose, task):
    cfg = task_cfg(compose, task, "optim=sgdm")
    assert cfg.task.name == task and cfg.model.size == "full" and cfg.data.source == "real"
    assert "num_classes" in cfg.model
    for key in ("synthetic_train_size", "synthetic_eval_size", "num_workers", "root"):
        assert key in cfg.data
    # The task's train block must survive composition: conf/config.yaml's own train: block (1 epoch, constant
    # lr) is a default that the task overrides, which needs _self_ before task in its defaults list.
    assert cfg.train.schedule.name == "multistep", "conf/config.yaml's train: block overrode the task's"


def test_paper_hyperparameters_in_task_configs(compose):
    # (Needs _self_ before task in conf/config.yaml's defaults list, like the test above.)
    r20 = task_cfg(compose, "resnet20")  # appendix B.1: 150 epochs of 128, lr / 10 after epochs 75 and 130
    assert (r20.train.epochs, r20.train.batch_size) == (150, 128)
    assert [round(f * 150) for f in r20.train.schedule.milestones] == [75, 130]
    r50 = task_cfg(compose, "resnet50")  # section 5.1: 100 epochs, 32 per GPU, lr / 10 after 30, 60, 90
    assert (r50.train.epochs, r50.train.batch_size) == (100, 32)
    assert [round(f * 100) for f in r50.train.schedule.milestones] == [30, 60, 90]


# ------------------------------------------------------------------------------------------------ models


def test_resnet20_parameter_count_and_shapes():
    # He et al. 2016 Table 6: ResNet-20 has 0.27M parameters (option-A shortcuts, 10 classes: 269,722);
    # CIFAR-100's classifier adds 64 x 90 + 90.
    assert num_parameters(resnet20(10)) == 269_722
    full, tiny = resnet20(100), resnet20(100, "tiny")
    assert num_parameters(full) == 275_572
    assert num_parameters(tiny) < num_parameters(full) / 5
    x = torch.randn(2, 3, 32, 32)
    assert full(x).shape == tiny(x).shape == (2, 100)
    with pytest.raises(ValueError, match="model.size"):
        resnet20(100, "huge")


def test_resnet50_full_and_tiny(compose):
    task = get_task("resnet50")
    full = task.build_model(task_cfg(compose, "resnet50"))
    tiny = task.build_model(task_cfg(compose, "resnet50", "model.size=tiny"))
    assert num_parameters(full) == 25_557_032  # torchvision's resnet50, 1000 classes
    assert num_parameters(tiny) < num_parameters(full) / 4
    assert type(full) is type(tiny)  # the same torchvision ResNet class: the same code path
    assert tiny(torch.randn(2, 3, 64, 64)).shape == (2, 1000)


# ------------------------------------------------------------------------------------------------ CIFAR-100


def write_fake_cifar100(root, n_train: int = 24, n_test: int = 10) -> None:
    """CIFAR-100 in its own format: ``cifar-100-python/{train,test,meta}`` pickles of uint8 rows (N, 3072).

    The real files are Python 2 pickles whose keys load as str under torchvision's ``encoding="latin1"``;
    these are written with str keys, which load the same way.
    """
    folder = os.path.join(root, "cifar-100-python")
    os.makedirs(folder)
    rng = np.random.default_rng(0)
    for name, n in (("train", n_train), ("test", n_test)):
        fine = [int(i) for i in rng.integers(0, 100, n)]
        entry = {
            "batch_label": name,
            "filenames": [f"img_{i}.png" for i in range(n)],
            "data": rng.integers(0, 256, (n, 3072), dtype=np.uint8),
            "fine_labels": fine,
            "coarse_labels": [f // 5 for f in fine],
        }
        with open(os.path.join(folder, name), "wb") as f:
            pickle.dump(entry, f, protocol=2)
    meta = {
        "fine_label_names": [f"class_{i}" for i in range(100)],
        "coarse_label_names": [f"super_{i}" for i in range(20)],
    }
    with open(os.path.join(folder, "meta"), "wb") as f:
        pickle.dump(meta, f, protocol=2)


def test_cifar100_real_format(compose, tmp_path):
    write_fake_cifar100(tmp_path)
    task = get_task("resnet20")
    cfg = task_cfg(
        compose, "resnet20", f"data.root={tmp_path}", "data.check_md5=false", "train.batch_size=4", "model.size=tiny"
    )
    data = task.build_data(cfg, 0, 1)
    assert "real" in data.description and "SYNTHETIC" not in data.description
    assert data.train_size == 24
    images, labels = next(iter(data.train))
    assert images.shape == (4, 3, 32, 32) and labels.dtype == torch.int64
    assert abs(float(images.mean())) < 1.5  # normalized, not raw 0..255 or 0..1 pixels
    sums = task.evaluate(task.build_model(cfg), data.eval, CPU)
    assert sums["top1"][1] == sums["top5"][1] == 10
    loss, n = task.loss(task.build_model(cfg), (images, labels), CPU)
    assert n == 4 and torch.isfinite(loss)


def test_cifar100_md5_mismatch_names_the_setting(compose, tmp_path):
    write_fake_cifar100(tmp_path)
    cfg = task_cfg(compose, "resnet20", f"data.root={tmp_path}", "train.batch_size=4")  # check_md5 on
    with pytest.raises(RuntimeError, match="data.check_md5=false"):
        get_task("resnet20").build_data(cfg, 0, 1)


def test_cifar100_missing_names_path_and_setting(compose, tmp_path):
    cfg = task_cfg(compose, "resnet20", f"data.root={tmp_path / 'nowhere'}")
    with pytest.raises(DatasetNotFound) as err:
        get_task("resnet20").build_data(cfg, 0, 1)
    message = str(err.value)
    assert str(tmp_path / "nowhere" / "cifar-100-python" / "train") in message
    assert "data.root" in message and "data.source=synthetic" in message


# ------------------------------------------------------------------------------------------------ ImageNet folders


def write_image_folder(root, split: str, classes, per_class: int, size=(40, 30)) -> None:
    rng = np.random.default_rng(len(split))
    for wnid in classes:
        os.makedirs(os.path.join(root, split, wnid))
        for i in range(per_class):
            pixels = rng.integers(0, 256, (size[1], size[0], 3), dtype=np.uint8)
            ext = "JPEG" if i % 2 == 0 else "png"  # ImageNet's own files are JPEG; ImageFolder takes both
            Image.fromarray(pixels).save(os.path.join(root, split, wnid, f"{wnid}_{i}.{ext}"))


def test_resnet50_image_folders(compose, tmp_path):
    classes = ["n01440764", "n01443537", "n01484850"]
    write_image_folder(tmp_path, "train", classes, 4)
    write_image_folder(tmp_path, "val", classes, 3)
    task = get_task("resnet50")
    cfg = task_cfg(
        compose,
        "resnet50",
        f"data.root={tmp_path}",
        "data.image_size=32",
        "train.batch_size=4",
        "model.size=tiny",
        "model.num_classes=3",
    )
    data = task.build_data(cfg, 0, 1)
    assert data.train_size == 12 and "real" in data.description
    images, labels = next(iter(data.train))
    assert images.shape == (4, 3, 32, 32) and set(labels.tolist()) <= {0, 1, 2}
    val_images, _ = next(iter(data.eval))
    assert val_images.shape[1:] == (3, 32, 32)  # resize + center crop to data.image_size
    sums = task.evaluate(task.build_model(cfg), data.eval, CPU)
    assert sums["top1"][1] == 9 and sums["top5"][0] == 9  # 3 classes: every target is in the top 5


def test_resnet50_missing_and_mismatched_folders(compose, tmp_path):
    task = get_task("resnet50")
    cfg = task_cfg(compose, "resnet50", f"data.root={tmp_path}")
    with pytest.raises(DatasetNotFound) as err:
        task.build_data(cfg, 0, 1)
    assert str(tmp_path / "train") in str(err.value) and "data.root" in str(err.value)
    write_image_folder(tmp_path, "train", ["a", "b"], 1)
    write_image_folder(tmp_path, "val", ["a", "c"], 1)
    with pytest.raises(ValueError, match="different class folders"):
        task.build_data(task_cfg(compose, "resnet50", f"data.root={tmp_path}", "train.batch_size=1"), 0, 1)


# ------------------------------------------------------------------------------------------------ synthetic


def test_synthetic_images_deterministic_and_split():
    train = SyntheticImages(50, 10, (3, 8, 8), seed=1, split="train")
    again = SyntheticImages(50, 10, (3, 8, 8), seed=1, split="train")
    held_out = SyntheticImages(50, 10, (3, 8, 8), seed=1, split="eval")
    (x, y), (x2, y2), (x3, y3) = train[13], again[13], held_out[13]
    assert torch.equal(x, x2) and y == y2 == y3 == 3
    assert not torch.equal(x, x3)  # same class pattern, its own noise
    assert torch.equal(train.patterns, held_out.patterns)
    with pytest.raises(IndexError):
        train[50]


def test_synthetic_resnet20_is_learnable_and_says_so(compose):
    task = get_task("resnet20")
    cfg = task_cfg(
        compose,
        "resnet20",
        "data.source=synthetic",
        "model.size=tiny",
        "train.batch_size=32",
        "data.synthetic_train_size=3200",
        "data.synthetic_eval_size=500",
    )
    model, data = train_steps(task, cfg, steps=60)
    assert "SYNTHETIC" in data.description and "data.source=synthetic" in data.description
    images, _ = next(iter(data.train))
    assert images.shape == (32, 3, 32, 32)
    metrics = accuracy(task, model, data.eval)
    assert metrics["top1"] > 5.0, metrics  # chance is 1 %


def test_synthetic_resnet50_shapes(compose):
    cfg = task_cfg(compose, "resnet50", "data.source=synthetic", "data.image_size=48", "train.batch_size=2")
    data = get_task("resnet50").build_data(cfg, 0, 1)
    assert data.train_size == 1_281_167  # lazily generated: costs no memory
    assert "SYNTHETIC" in data.description
    images, labels = next(iter(data.train))
    assert images.shape == (2, 3, 48, 48) and int(labels.max()) < 1000


def test_unknown_source_and_size_fail(compose):
    task = get_task("resnet20")
    with pytest.raises(ValueError, match="data.source"):
        task.build_data(task_cfg(compose, "resnet20", "data.source=imaginary"), 0, 1)
    with pytest.raises(ValueError, match="model.size"):
        task.build_model(task_cfg(compose, "resnet20", "model.size=medium"))


# ------------------------------------------------------------------------------------------------ digits


def test_digits_real_split(compose):
    task = get_task("digits")
    cfg = task_cfg(compose, "digits")
    data = task.build_data(cfg, 0, 1)
    train_labels = torch.cat([y for _, y in data.train])  # full batches only: 44 x 32 of the 1,437
    eval_labels = torch.cat([y for _, y in data.eval])
    assert data.train_size == 1437 and len(eval_labels) == 360 and len(train_labels) == 1437 // 32 * 32
    assert torch.bincount(eval_labels, minlength=10).min() >= 35  # stratified: 36 or 37 of each digit
    again = task.build_data(cfg, 0, 1)
    assert torch.equal(eval_labels, torch.cat([y for _, y in again.eval]))  # the split is fixed
    with pytest.raises(ValueError, match="data.root"):
        task.build_data(task_cfg(compose, "digits", "data.root=/some/where"), 0, 1)


def test_digits_adam_reaches_90_percent(compose):
    task = get_task("digits")
    cfg = task_cfg(compose, "digits", "train.batch_size=32")
    model, data = train_steps(task, cfg, steps=45, epochs=4)
    metrics = accuracy(task, model, data.eval)
    assert metrics["top1"] > 90.0, metrics


def test_digits_synthetic_glyphs_learnable(compose):
    x, y = synthetic_digits(20, seed=0)
    assert x.shape == (20, 1, 8, 8) and y.tolist() == list(range(10)) * 2
    task = get_task("digits")
    cfg = task_cfg(compose, "digits", "data.source=synthetic", "model.size=tiny")
    model, data = train_steps(task, cfg, steps=30, epochs=2)
    assert "SYNTHETIC" in data.description
    assert accuracy(task, model, data.eval)["top1"] > 80.0  # chance is 10 %


# ------------------------------------------------------------------------------------------------ sharding, metric


def test_shard_sampler_splits_exactly():
    for n, world in [(10, 3), (101, 2), (2, 4)]:
        shards = [list(ShardSampler(n, r, world)) for r in range(world)]
        assert sorted(i for s in shards for i in s) == list(range(n))
        assert [len(ShardSampler(n, r, world)) for r in range(world)] == [len(s) for s in shards]


def test_eval_counts_over_two_ranks_equal_eval_set(compose):
    """An odd-sized eval set over 2 simulated ranks: counts add up to it (DistributedSampler would give 102)."""
    task = get_task("resnet20")
    cfg = task_cfg(
        compose,
        "resnet20",
        "data.source=synthetic",
        "model.size=tiny",
        "train.batch_size=16",
        "data.synthetic_train_size=64",
        "data.synthetic_eval_size=101",
    )
    model = task.build_model(cfg)
    counts = [task.evaluate(model, task.build_data(cfg, rank, 2).eval, CPU)["top1"][1] for rank in (0, 1)]
    assert counts == [51, 50] and sum(counts) == 101
    digits = get_task("digits")
    cfg = task_cfg(compose, "digits")
    model = digits.build_model(cfg)
    assert sum(digits.evaluate(model, digits.build_data(cfg, r, 2).eval, CPU)["top1"][1] for r in (0, 1)) == 360


def test_train_loader_shards_differ_and_refuse_tiny_sets(compose):
    cfg = task_cfg(compose, "digits")
    first = [next(iter(get_task("digits").build_data(cfg, r, 2).train))[0] for r in (0, 1)]
    assert not torch.equal(first[0], first[1])  # each process its own share of the permutation
    with pytest.raises(ValueError, match="train.batch_size"):
        get_task("digits").build_data(task_cfg(compose, "digits", "train.batch_size=1000"), 0, 2)


def test_topk_correct_and_finalize():
    logits = torch.tensor([[0.1, 0.5, 0.4], [0.9, 0.05, 0.05], [0.2, 0.3, 0.5]])
    targets = torch.tensor([2, 0, 0])
    assert topk_correct(logits, targets, (1, 2, 5)) == {1: 1, 2: 2, 5: 3}  # k capped at 3 classes
    task = get_task("resnet20")
    assert task.finalize({"top1": 0.25, "top5": 0.5, "loss": 1.5}) == {"top1": 25.0, "top5": 50.0, "loss": 1.5}

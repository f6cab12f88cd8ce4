"""The fashion_mnist task: IDX files in Debian's layout (gzipped), the missing-dataset line, the validation
split, synthetic mode, and the model's size (its gradient is what puts the task in the bandwidth-bound regime).

The real dataset is not downloaded here: the tests write small gzipped IDX files as Debian's package installs
them (``<root>/{train,t10k}-{images-idx3,labels-idx1}-ubyte.gz``), in the format torchvision's reader parses.
"""

from __future__ import annotations

import gzip
import os
import struct

import numpy as np
import pytest
import torch

from birder_repro.tasks import DatasetNotFound, check_data, fashion_mnist, get_task
from birder_repro.tasks.common import num_parameters
from birder_repro.tasks.fashion_mnist import DEBIAN_ROOT, fashion_root, val_indices

CPU = torch.device("cpu")


@pytest.fixture(autouse=True)
def _one_thread():
    """One intra-op thread on the shared 2-core machine (as tests/test_tasks_images.py)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def write_idx_gz(path, array: np.ndarray) -> None:
    """An IDX file (LeCun's MNIST format: magic 0x0000 0x08 <ndim>, big-endian dims, uint8 data), gzipped."""
    header = struct.pack(">I", 0x0800 + array.ndim) + struct.pack(f">{array.ndim}I", *array.shape)
    with gzip.open(path, "wb") as f:
        f.write(header + array.astype(np.uint8).tobytes())


def write_fake_fashion(root, n_train: int = 40, n_test: int = 12) -> dict:
    """Debian's layout, with images whose mean brightness encodes the label (so they are learnable)."""
    os.makedirs(root, exist_ok=True)
    rng = np.random.default_rng(0)
    arrays = {}
    for prefix, n in (("train", n_train), ("t10k", n_test)):
        labels = np.arange(n) % 10
        images = rng.integers(0, 30, (n, 28, 28)) + 20 * labels[:, None, None]
        write_idx_gz(os.path.join(root, f"{prefix}-images-idx3-ubyte.gz"), images)
        write_idx_gz(os.path.join(root, f"{prefix}-labels-idx1-ubyte.gz"), labels)
        arrays[prefix] = (images, labels)
    return arrays


def task_cfg(compose, *overrides: str):
    return compose(["task=fashion_mnist", "data.num_workers=0", *overrides])


def test_reads_debians_gzipped_idx_files(compose, tmp_path):
    arrays = write_fake_fashion(tmp_path)
    task = get_task("fashion_mnist")
    cfg = task_cfg(compose, f"data.root={tmp_path}", "data.val_size=8", "train.batch_size=4", "model.size=tiny")
    data = task.build_data(cfg, 0, 1)
    assert data.train_size == 32 and "real" in data.description and "test set of 12" in data.description
    images, labels = next(iter(data.train))
    assert images.shape == (4, 1, 28, 28) and labels.dtype == torch.int64
    test_labels = torch.cat([y for _, y in data.eval])
    assert test_labels.tolist() == arrays["t10k"][1].tolist()  # the test files, in order
    # Pixels are normalized: the first test image, read back, is the one written.
    first = next(iter(data.eval))[0][0, 0]
    assert torch.allclose(first * 0.3530 + 0.2860, torch.as_tensor(arrays["t10k"][0][0] / 255.0).float(), atol=1e-6)
    loss, n = task.loss(task.build_model(cfg), (images, labels), CPU)
    assert n == 4 and torch.isfinite(loss)


def test_decoded_splits_are_kept_and_a_changed_or_damaged_copy_is_decoded_again(tmp_path, monkeypatch):
    """The first read decodes (torchvision's reader) and keeps the result; the next reads it back without
    decoding; a damaged cache file is decoded again, and a changed IDX file is a new entry, not stale data."""
    root = tmp_path / "fashion"
    arrays = write_fake_fashion(root)
    monkeypatch.setenv("BIRDER_CACHE", str(tmp_path / "cache"))
    images, labels = fashion_mnist.decoded_split(str(root), "train")
    assert images.dtype == torch.uint8 and images.tolist() == arrays["train"][0].tolist()
    assert labels.tolist() == arrays["train"][1].tolist()
    cached = fashion_mnist.split_cache_path(str(root), "train")
    assert os.path.isfile(cached) and cached.startswith(str(tmp_path / "cache"))

    decode = fashion_mnist.decode_split
    calls = []
    monkeypatch.setattr(fashion_mnist, "decode_split", lambda *a: calls.append(a) or decode(*a))
    again, _ = fashion_mnist.decoded_split(str(root), "train")
    assert torch.equal(again, images) and calls == []  # read back, not decoded

    with open(cached, "wb") as f:
        f.write(b"half a file")
    assert torch.equal(fashion_mnist.decoded_split(str(root), "train")[0], images) and len(calls) == 1
    assert torch.equal(fashion_mnist.decoded_split(str(root), "train")[0], images) and len(calls) == 1  # rewritten

    write_idx_gz(root / "train-labels-idx1-ubyte.gz", (arrays["train"][1] + 1) % 10)  # a new copy of the labels
    assert fashion_mnist.split_cache_path(str(root), "train") != cached
    assert fashion_mnist.decoded_split(str(root), "train")[1].tolist() == ((arrays["train"][1] + 1) % 10).tolist()
    assert len(calls) == 2


def test_normalization_in_place_gives_the_formulas_values():
    images = torch.randint(0, 256, (64, 28, 28), dtype=torch.uint8, generator=torch.Generator().manual_seed(0))
    expected = (images.unsqueeze(1).float() / 255.0 - fashion_mnist.FASHION_MEAN) / fashion_mnist.FASHION_STD
    assert torch.equal(fashion_mnist._normalized(images), expected)  # bit for bit: runs repeat across versions


def test_validation_split_is_held_out_and_fixed(compose, tmp_path):
    write_fake_fashion(tmp_path)
    task = get_task("fashion_mnist")
    cfg = task_cfg(compose, f"data.root={tmp_path}", "data.val_size=8", "data.eval_set=val", "train.batch_size=4")
    data = task.build_data(cfg, 0, 1)
    assert data.train_size == 32 and "validation" in data.description and "val set of 8" in data.description
    train, val = val_indices(40, 8, 0)
    assert len(set(train.tolist()) | set(val.tolist())) == 40 and not set(train.tolist()) & set(val.tolist())
    assert torch.equal(val, val_indices(40, 8, 0)[1]) and not torch.equal(val, val_indices(40, 8, 1)[1])
    # The validation images are training images, never test ones, and none of them is trained on.
    seen = {tuple(x.flatten()[:16].tolist()) for x, _ in data.train.dataset}
    held = [tuple(x.flatten()[:16].tolist()) for x, _ in data.eval.dataset]
    assert len(held) == 8 and not seen & set(held)
    with pytest.raises(ValueError, match="data.eval_set"):
        task.build_data(task_cfg(compose, f"data.root={tmp_path}", "data.eval_set=train"), 0, 1)
    with pytest.raises(ValueError, match="data.val_size"):
        task.build_data(task_cfg(compose, f"data.root={tmp_path}", "data.val_size=40"), 0, 1)


def test_missing_dataset_is_one_line_with_path_setting_and_install_command(compose, tmp_path):
    cfg = task_cfg(compose, f"data.root={tmp_path / 'nowhere'}")
    with pytest.raises(DatasetNotFound) as err:
        check_data(cfg)  # what the CLI runs before launching
    message = str(err.value)
    assert "\n" not in message
    assert str(tmp_path / "nowhere" / "train-images-idx3-ubyte.gz") in message
    assert "data.root" in message and "apt-get install dataset-fashion-mnist" in message
    assert "data.source=synthetic" in message
    with pytest.raises(DatasetNotFound):
        get_task("fashion_mnist").build_data(cfg, 0, 1)


def test_default_root_is_birder_data_then_debians(compose, tmp_path, monkeypatch):
    monkeypatch.setenv("BIRDER_DATA", str(tmp_path))
    cfg = task_cfg(compose)
    expected = DEBIAN_ROOT if os.path.isdir(DEBIAN_ROOT) else str(tmp_path / "fashion-mnist")
    assert fashion_root(cfg) == expected
    (tmp_path / "fashion-mnist").mkdir()
    assert fashion_root(cfg) == str(tmp_path / "fashion-mnist")  # the user's own copy comes first


def test_synthetic_mode_has_the_same_shapes_and_says_so(compose):
    task = get_task("fashion_mnist")
    cfg = task_cfg(
        compose,
        "data.source=synthetic",
        "data.synthetic_train_size=64",
        "data.synthetic_eval_size=20",
        "train.batch_size=8",
        "model.size=tiny",
    )
    data = task.build_data(cfg, 0, 1)
    assert "SYNTHETIC" in data.description
    images, labels = next(iter(data.train))
    assert images.shape == (8, 1, 28, 28) and int(labels.max()) < 10
    assert task.build_model(cfg)(images).shape == (8, 10)


def test_model_gradient_is_large_beside_its_compute(compose):
    task = get_task("fashion_mnist")
    model = task.build_model(task_cfg(compose))
    assert num_parameters(model) == 5_828_618  # 23.3 MB of fp32 gradient a step
    # Every weight a matrix of a linear layer: one multiply-add per parameter and sample, no reuse (no conv).
    assert not any(isinstance(m, torch.nn.Conv2d) for m in model.modules())
    units = task.fsdp_units(model)
    assert len(units) == 2 and all(any(True for _ in u.parameters()) for u in units)


def test_model_width_sets_both_hidden_layers_and_a_bad_one_names_the_key(compose):
    task = get_task("fashion_mnist")
    model = task.build_model(task_cfg(compose, "model.width=512"))
    assert num_parameters(model) == 670_730  # the time-to-accuracy experiment's model: 2.68 MB a step
    assert [m.out_features for m in model.modules() if isinstance(m, torch.nn.Linear)] == [512, 512, 10]
    with pytest.raises(ValueError, match="model.width=0"):
        task.build_model(task_cfg(compose, "model.width=0"))

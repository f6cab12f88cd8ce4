"""Fashion-MNIST with an MLP whose gradient is large beside its compute: the real-data task where communication
dominates a step, the regime of the Birder paper's claim.

Not an experiment of the Birder paper. Where compression pays is a ratio: gradient bytes per step over the
link rate against compute per step. The paper's ResNet-50 sends 102 MB a step on 10 GbE and SGDM spends 60 %
of a 2-node step communicating (Table 3); digits' 0.12 MB never leave the latency-bound regime. This task's
model sends 23 MB of fp32 gradient a step for little compute, so that on the emulated cluster at 100 Mbit/s
SGDM's step is mostly communication, as the paper's are (docs/tasks.md, "fashion_mnist").

Data: Fashion-MNIST (Xiao, Rasul and Vollgraf 2017: 60,000 train / 10,000 test 28x28 grayscale images of 10
clothing classes) in its original IDX files, gzipped, as Debian's package ``dataset-fashion-mnist`` installs
them (``/usr/share/datasets/fashion-mnist/{train,t10k}-{images-idx3,labels-idx1}-ubyte.gz``; the dataset's own
release has the same names). Each file is decompressed into a temporary file and parsed by torchvision's own IDX
reader (``torchvision.datasets.mnist.read_image_file`` / ``read_label_file``, which open plain files only);
torchvision's ``FashionMNIST`` class itself wants its ``FashionMNIST/raw/`` folder of decompressed files, which
the Debian layout is not. The decoded uint8 arrays are kept in ``$BIRDER_CACHE`` (default
``~/.cache/birder-repro``), named by the files' paths, sizes and times, so that a run's processes read them back
instead of decoding (and importing torchvision) each time (:func:`decoded_split`). A validation split of
``data.val_size`` training images (chosen by a permutation with the fixed seed ``data.split_seed``) is never
trained on; ``data.eval_set`` scores runs on it (``val``: for tuning) or on the test set (``test``).
``data.source=synthetic`` gives class-conditional images of the same shape (tasks.common.SyntheticImages).

Model: a multilayer perceptron 784-2048-2048-10 (each hidden layer linear, batch norm, ReLU): 5,828,618
parameters, 23.3 MB of fp32 gradient a step, for about one multiply-add per parameter and sample in forward
(a CNN of the same gradient size computes several times more: its convolutions reuse their weights at every
pixel: a two-convolution CNN with 3.3M parameters was predicted to spend 1.9x as long computing as
communicating, 2 nodes at 100 Mbit/s). ``model.size=tiny`` (128 units) is for tests and smoke runs.
Loss and metric: cross-entropy, top-1 accuracy in percent (tasks.common.ClassificationTask). Defaults:
conf/task/fashion_mnist.yaml; per-optimizer starting values: conf/recipe/fashion_mnist/.
"""

from __future__ import annotations

import contextlib
import gzip
import hashlib
import itertools
import json
import os
import shutil
import socket
import tempfile

import torch
from torch import nn
from torch.utils.data import TensorDataset

from birder_repro.tasks.base import TaskData
from birder_repro.tasks.common import (
    ClassificationTask,
    build_by_source,
    eval_loader,
    pick_size,
    synthetic_image_data,
    train_loader,
)
from birder_repro.tasks.data_files import (
    FASHION_DEBIAN_ROOT,
    FASHION_FILES,
    check_fashion,
    check_fashion_files,
    fashion_root,
)

# model.size -> units of the two hidden layers.
SIZES = {"full": (2048, 2048), "tiny": (128, 128)}

# Pixel mean and std of the 60,000 training images scaled to [0, 1] (Fashion-MNIST's usual constants): fixed,
# so that train, validation, test and synthetic images see the same input scale.
FASHION_MEAN, FASHION_STD = 0.2860, 0.3530
NUM_CLASSES = 10

# The files, where they are and the check that they are there: birder_repro.tasks.data_files (no torch: the CLI
# checks them on every node before it launches anything).
FILES, DEBIAN_ROOT = FASHION_FILES, FASHION_DEBIAN_ROOT
EVAL_SETS = ("test", "val")


# --------------------------------------------------------------------------------------------------------------
# Model


def _hidden(cin: int, cout: int) -> nn.Sequential:
    return nn.Sequential(nn.Linear(cin, cout, bias=False), nn.BatchNorm1d(cout), nn.ReLU(inplace=True))


class FashionMLP(nn.Module):
    """784-2048-2048-10: every multiply-add is in a matrix product, one per parameter and sample, so compute is
    as small as a gradient of this size allows. Batch norm keeps sign-based updates (Birder's) from blowing
    activations up, as in the digits CNN."""

    def __init__(self, widths: tuple[int, ...] = SIZES["full"], num_classes: int = NUM_CLASSES):
        super().__init__()
        sizes = (28 * 28, *widths)
        self.hidden = nn.Sequential(*(_hidden(a, b) for a, b in itertools.pairwise(sizes)))
        self.fc = nn.Linear(sizes[-1], num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.hidden(torch.flatten(x, 1)))


def model_widths(cfg) -> tuple[int, int]:
    """The two hidden layers' units: ``model.width`` where given, else ``model.size``'s preset."""
    width = cfg.model.get("width")
    if width is None:
        return pick_size(cfg.model.size, SIZES)
    if isinstance(width, bool) or not isinstance(width, int) or width < 1:
        raise ValueError(f"model.width={width!r}: give the hidden layers' units (an integer >= 1), or null")
    return (width, width)


# --------------------------------------------------------------------------------------------------------------
# Data


def read_idx_gz(path: str, reader) -> torch.Tensor:
    """A gzipped IDX file parsed by torchvision's ``reader`` (it opens plain files only: decompress first)."""
    with tempfile.TemporaryDirectory() as tmp:
        plain = os.path.join(tmp, os.path.basename(path).removesuffix(".gz"))
        with gzip.open(path, "rb") as src, open(plain, "wb") as dst:
            shutil.copyfileobj(src, dst)
        return reader(plain)


def decode_split(root: str, split: str) -> tuple[torch.Tensor, torch.Tensor]:
    """(uint8 images N x 28 x 28, int64 labels) of ``train`` or ``test``, read by torchvision's IDX reader, with
    their counts checked against each other."""
    from torchvision.datasets.mnist import read_image_file, read_label_file  # 2 s of import: only on a cache miss

    image_file, label_file = (os.path.join(root, name) for name in FILES[split])
    images, labels = read_idx_gz(image_file, read_image_file), read_idx_gz(label_file, read_label_file)
    if images.shape[0] != labels.shape[0] or images.shape[1:] != (28, 28):
        raise ValueError(
            f"{image_file}: {tuple(images.shape)} images against {labels.shape[0]} labels in "
            f"{label_file}; expected N x 28 x 28 with one label each (a damaged copy? reinstall it)"
        )
    return images, labels


def cache_dir(env=os.environ) -> str:
    """Where decoded splits are kept: ``$BIRDER_CACHE``, else ``$XDG_CACHE_HOME/birder-repro``, else
    ``~/.cache/birder-repro``."""
    if env.get("BIRDER_CACHE"):
        return env["BIRDER_CACHE"]
    return os.path.join(env.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"), "birder-repro")


def split_cache_path(root: str, split: str, env=os.environ) -> str:
    """The cache file of ``split``, named by its two files' absolute paths, sizes and modification times: a
    changed or moved copy is decoded anew."""
    files = [os.path.abspath(os.path.join(root, name)) for name in FILES[split]]
    stats = [(path, os.stat(path).st_size, os.stat(path).st_mtime_ns) for path in files]
    key = hashlib.sha256(json.dumps(stats).encode()).hexdigest()[:16]
    return os.path.join(cache_dir(env), f"fashion-mnist-{split}-{key}.pt")


def _valid(data) -> bool:
    images, labels = data.get("images"), data.get("labels")
    return (
        isinstance(images, torch.Tensor)
        and isinstance(labels, torch.Tensor)
        and images.dtype == torch.uint8
        and images.dim() == 3
        and tuple(images.shape[1:]) == (28, 28)
        and labels.shape == (images.shape[0],)
    )


def decoded_split(root: str, split: str, env=os.environ) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`decode_split`, kept decoded in :func:`cache_dir` after the first run.

    Why: every process of every run decoded both splits (gunzip, then torchvision's reader) and imported
    torchvision for it, about 3 s of CPU each: on this project's 2-core machine 6 s of every 4-process run of
    the time-to-accuracy experiment's 150. The cache holds torchvision's own output, uint8, and is written
    atomically (a temporary file renamed), so that processes starting together never read half a file; one that
    cannot be read is decoded again and rewritten, and a cache that cannot be written (a read-only home) only
    costs the decoding."""
    path = split_cache_path(root, split, env)
    try:
        data = torch.load(path, weights_only=True)
        if isinstance(data, dict) and _valid(data):
            return data["images"], data["labels"]
    except FileNotFoundError:
        pass
    except Exception:  # noqa: BLE001  damaged: torch's unpickler raises what the bytes lead it to; decode again
        pass
    images, labels = decode_split(root, split)
    tmp = f"{path}.{socket.gethostname()}.{os.getpid()}.tmp"  # a home shared by several nodes: names of their own
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        torch.save({"images": images, "labels": labels}, tmp)
        os.replace(tmp, path)
    except OSError:
        with contextlib.suppress(OSError):
            os.remove(tmp)
    return images, labels


def _normalized(images: torch.Tensor) -> torch.Tensor:
    """uint8 (N, 28, 28) -> normalized float (N, 1, 28, 28): ``(x / 255 - mean) / std``, in place on the one new
    float tensor (the same operations, so the same values, as written out of place)."""
    return images.unsqueeze(1).float().div_(255.0).sub_(FASHION_MEAN).div_(FASHION_STD)


def read_split(root: str, split: str) -> tuple[torch.Tensor, torch.Tensor]:
    """(images, labels) of ``train`` or ``test``, normalized."""
    images, labels = decoded_split(root, split)
    return _normalized(images), labels


def val_indices(n: int, val_size: int, split_seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(train, val) indices of ``n`` training images: the last ``val_size`` of a permutation seeded with
    ``split_seed``, the same for every run, so that tuning never sees the test set nor trains on its own scores."""
    if not 0 <= val_size < n:
        raise ValueError(f"data.val_size={val_size}: use 0 to {n - 1} (the training set holds {n} images)")
    order = torch.randperm(n, generator=torch.Generator().manual_seed(split_seed))
    return order[: n - val_size].sort().values, order[n - val_size :].sort().values


def eval_set_of(cfg) -> str:
    choice = str(cfg.data.eval_set)
    if choice not in EVAL_SETS:
        raise ValueError(f"data.eval_set={choice!r}: use test (the reported score) or val (tuning)")
    return choice


def build_real(cfg, rank: int, world_size: int) -> TaskData:
    root = fashion_root(cfg)
    check_fashion_files(root)
    choice = eval_set_of(cfg)
    images, labels = decoded_split(root, "train")  # normalized after the split: the same values, fewer bytes
    train_idx, val_idx = val_indices(len(labels), int(cfg.data.val_size), int(cfg.data.split_seed))
    train_set = TensorDataset(_normalized(images[train_idx]), labels[train_idx])
    eval_set = (
        TensorDataset(_normalized(images[val_idx]), labels[val_idx])
        if choice == "val"
        else TensorDataset(*read_split(root, "test"))
    )
    loader, sampler = train_loader(train_set, cfg, rank, world_size)
    description = (
        f"Fashion-MNIST (real, IDX files) from {root}: {len(train_set)} train images "
        f"({len(val_idx)} held out for validation, seed {cfg.data.split_seed}), evaluated on the "
        f"{choice} set of {len(eval_set)} images"
    )
    return TaskData(loader, eval_loader(eval_set, cfg, rank, world_size), len(train_set), description, sampler)


def build_synthetic(cfg, rank: int, world_size: int) -> TaskData:
    """Fashion-MNIST-shaped (1x28x28) class-conditional images."""
    return synthetic_image_data(cfg, rank, world_size, (1, 28, 28), "Fashion-MNIST")


# --------------------------------------------------------------------------------------------------------------
# Task


class FashionMNISTTask(ClassificationTask):
    """A wide MLP on Fashion-MNIST: real data in the bandwidth-bound regime."""

    name = "fashion_mnist"
    baseline = "sgdm"
    metrics = ("top1",)
    headline_metric = "top1"

    def fsdp_units(self, model: nn.Module) -> list[nn.Module]:
        return list(model.hidden)  # the hidden layers

    def build_model(self, cfg) -> nn.Module:
        return FashionMLP(model_widths(cfg), int(cfg.model.num_classes))

    def build_data(self, cfg, rank: int, world_size: int) -> TaskData:
        return build_by_source(cfg, rank, world_size, {"real": build_real, "synthetic": build_synthetic})

    def check_data(self, cfg) -> None:
        check_fashion(cfg)

"""Handwritten digits (8x8) with a small CNN: the quick real-data task for comparing optimizers.

Not an experiment of the Birder paper: it exists so that every optimizer can be run, on any cluster layout, on
real images that need no download, in seconds on a CPU (the convergence-parity test uses it).

Data: scikit-learn's bundled copy of the UCI optical recognition of handwritten digits test set
(``sklearn.datasets.load_digits``: 1,797 images of 8x8 pixels with values 0..16, classes 0-9), split once into
80 % train / 20 % test, stratified by class, with the fixed seed ``data.split_seed`` (1,437 / 360 images), so
that every optimizer, layout and run is scored on the same test images. ``data.source=synthetic`` gives
seven-segment digit glyphs, shifted, with random stroke intensity and pixel noise, on the same 0..16 scale.

Model: three 3x3 convolutions with batch norm (32, 32, 64 channels; 8x8 -> 4x4 -> 2x2), then a linear
classifier: 30,762 parameters (tiny, at half the widths: 8,474). Loss and metric: cross-entropy and top-1
accuracy in percent (tasks.common.ClassificationTask). Defaults: conf/task/digits.yaml; per-optimizer
learning rates: conf/recipe/digits/.
"""

from __future__ import annotations

import numpy as np
import torch
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split
from torch import nn
from torch.utils.data import TensorDataset

from birder_repro.tasks.base import TaskData
from birder_repro.tasks.common import (
    ClassificationTask,
    build_by_source,
    eval_loader,
    pick_size,
    synthetic_description,
    train_loader,
)

# model.size -> channels of the three convolutions.
SIZES = {"full": (32, 32, 64), "tiny": (16, 16, 32)}

# Pixel mean and std of all 1,797 images scaled to [0, 1]: fixed constants, so that real and synthetic images,
# and every split seed, see the same input scale.
DIGITS_MEAN, DIGITS_STD = 0.3053, 0.3760
NUM_CLASSES = 10


# --------------------------------------------------------------------------------------------------------------
# Model


def _conv_bn(cin: int, cout: int) -> nn.Sequential:
    return nn.Sequential(nn.Conv2d(cin, cout, 3, padding=1, bias=False), nn.BatchNorm2d(cout), nn.ReLU(inplace=True))


class DigitsCNN(nn.Module):
    """conv-conv-pool-conv-pool, then a linear layer on the 2x2 map: small, and stable under every optimizer
    (batch norm keeps sign-based updates such as Birder's from blowing activations up)."""

    def __init__(self, widths: tuple[int, int, int] = SIZES["full"], num_classes: int = NUM_CLASSES):
        super().__init__()
        c1, c2, c3 = widths
        self.features = nn.Sequential(
            _conv_bn(1, c1), _conv_bn(c1, c2), nn.MaxPool2d(2), _conv_bn(c2, c3), nn.MaxPool2d(2)
        )
        self.fc = nn.Linear(c3 * 2 * 2, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.flatten(self.features(x), 1))


# --------------------------------------------------------------------------------------------------------------
# Data


def _to_tensor(images: np.ndarray) -> torch.Tensor:
    """Images with pixel values 0..16, (N, 8, 8) -> normalized float (N, 1, 8, 8)."""
    x = torch.as_tensor(images, dtype=torch.float32).unsqueeze(1) / 16.0
    return (x - DIGITS_MEAN) / DIGITS_STD


def digits_split(split_seed: int, test_fraction: float) -> tuple[TensorDataset, TensorDataset]:
    """The bundled digits, split into train and test by class-stratified sampling with a fixed seed."""
    bunch = load_digits()
    x_train, x_test, y_train, y_test = train_test_split(
        bunch.images, bunch.target, test_size=test_fraction, stratify=bunch.target, random_state=split_seed
    )
    return (
        TensorDataset(_to_tensor(x_train), torch.as_tensor(y_train)),
        TensorDataset(_to_tensor(x_test), torch.as_tensor(y_test)),
    )


# Seven-segment glyphs: segment -> cells of a 5-wide x 7-tall box; digit -> its lit segments.
_SEGMENTS = {
    "a": [(0, c) for c in range(5)],
    "g": [(3, c) for c in range(5)],
    "d": [(6, c) for c in range(5)],
    "f": [(r, 0) for r in range(4)],
    "b": [(r, 4) for r in range(4)],
    "e": [(r, 0) for r in range(3, 7)],
    "c": [(r, 4) for r in range(3, 7)],
}
_DIGIT_SEGMENTS = ["abcdef", "bc", "abged", "abgcd", "fgbc", "afgcd", "afgedc", "abc", "abcdefg", "abcdfg"]


def _glyphs() -> torch.Tensor:
    """(digit, row shift, col shift, 8, 8): every glyph at every placement of its 7x5 box (rows 0-1, cols 1-2)."""
    glyphs = torch.zeros(NUM_CLASSES, 2, 2, 8, 8)
    for digit, segments in enumerate(_DIGIT_SEGMENTS):
        cells = [cell for seg in segments for cell in _SEGMENTS[seg]]
        for dr in range(2):
            for dc in range(2):
                for r, c in cells:
                    glyphs[digit, dr, dc, dr + r, 1 + dc + c] = 1.0  # col 1 + shift: centred as the real ones
    return glyphs


def synthetic_digits(n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``n`` seven-segment digits (label ``i % 10``) on the 0..16 scale of the real ones, then normalized.

    Each glyph is shifted by up to one pixel down and right, its strokes get an intensity in [0.6, 1] x 16,
    and every pixel Gaussian noise of std 2, clipped to [0, 16].
    """
    g = torch.Generator().manual_seed(seed)
    labels = torch.arange(n) % NUM_CLASSES
    shifts = torch.randint(0, 2, (2, n), generator=g)
    strength = 16 * (0.6 + 0.4 * torch.rand(n, 1, 1, generator=g))
    images = _glyphs()[labels, shifts[0], shifts[1]] * strength
    images = (images + 2.0 * torch.randn(n, 8, 8, generator=g)).clamp_(0, 16)
    return _to_tensor(images.numpy()), labels


def build_real(cfg, rank: int, world_size: int) -> TaskData:
    if cfg.data.get("root") is not None:  # a user pointing at their own copy would otherwise be ignored
        raise ValueError(
            f"data.root={cfg.data.root!r}: the digits task reads scikit-learn's bundled copy "
            f"(sklearn.datasets.load_digits) and takes no data.root; leave it null"
        )
    train_set, test_set = digits_split(int(cfg.data.split_seed), float(cfg.data.test_fraction))
    loader, sampler = train_loader(train_set, cfg, rank, world_size)
    description = (
        f"digits (real): scikit-learn's 8x8 handwritten digits, {len(train_set)} train / "
        f"{len(test_set)} test images (stratified split, seed {cfg.data.split_seed})"
    )
    return TaskData(loader, eval_loader(test_set, cfg, rank, world_size), len(train_set), description, sampler)


def build_synthetic(cfg, rank: int, world_size: int) -> TaskData:
    # Train and eval draw from different seeds: the same glyphs, never the same noisy sample.
    train_set = TensorDataset(*synthetic_digits(int(cfg.data.synthetic_train_size), 2 * int(cfg.seed)))
    eval_set = TensorDataset(*synthetic_digits(int(cfg.data.synthetic_eval_size), 2 * int(cfg.seed) + 1))
    loader, sampler = train_loader(train_set, cfg, rank, world_size)
    what = "seven-segment 8x8 digit glyphs with noise (10 classes)"
    description = synthetic_description(what, cfg, len(train_set), len(eval_set))
    return TaskData(loader, eval_loader(eval_set, cfg, rank, world_size), len(train_set), description, sampler)


# --------------------------------------------------------------------------------------------------------------
# Task


class DigitsTask(ClassificationTask):
    """Small CNN on scikit-learn's 8x8 digits: real data for optimizer comparisons on a CPU."""

    name = "digits"
    baseline = "sgdm"
    metrics = ("top1",)
    headline_metric = "top1"

    def fsdp_units(self, model: nn.Module) -> list[nn.Module]:
        return [m for m in model.features if any(True for _ in m.parameters())]  # the conv-bn blocks

    def build_model(self, cfg) -> nn.Module:
        return DigitsCNN(pick_size(cfg.model.size, SIZES), int(cfg.model.num_classes))

    def build_data(self, cfg, rank: int, world_size: int) -> TaskData:
        return build_by_source(cfg, rank, world_size, {"real": build_real, "synthetic": build_synthetic})

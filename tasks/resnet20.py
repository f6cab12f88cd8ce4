"""ResNet-20 on CIFAR-100: Birder paper, appendix B.1 (Figure 5).

Model: the CIFAR ResNet of He et al. 2016 ("Deep Residual Learning for Image Recognition", section 4.2): a 3x3
convolution with 16 channels, then 3 stages of n = 3 basic blocks with 16, 32 and 64 channels (feature maps
32, 16, 8), global average pooling and a linear classifier: 6n + 2 = 20 layers. Shortcuts are option A (identity,
with zero-padded channels and stride-2 subsampling where the shape changes: parameter-free), as He et al. use
on CIFAR; that is what gives their 0.27M parameters (269,722 with 10 classes; 275,572 with CIFAR-100's 100).
``model.size=tiny`` is a ResNet-8 at half the width (22,188 parameters), for CPU smoke runs.

Data: CIFAR-100 (50,000 train / 10,000 test 32x32 images) read by torchvision from its own pickled format
(``<data.root>/cifar-100-python/{train,test,meta}``), normalized with the training set's per-channel mean and
std; with ``data.augment``, 4-pixel padding + random 32x32 crop and horizontal flips (He et al. 2016, 4.2).
``data.source=synthetic`` gives CIFAR-shaped class-conditional images instead (tasks.common.SyntheticImages).
Appendix B.1 samples its batches "with replacement"; here, as in DDP practice, every epoch is a permutation
split over the processes (DistributedSampler), which differs from it only in which samples repeat.

Loss and metric: cross-entropy, top-1 and top-5 accuracy in percent (tasks.common.ClassificationTask).
Hyperparameters: conf/task/resnet20.yaml (150 epochs, 128 per batch, lr / 10 at epochs 75 and 130) and the
per-optimizer recipes in conf/recipe/resnet20/.
"""

from __future__ import annotations

from typing import ClassVar

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torchvision import datasets, transforms

from birder_repro.tasks.base import TaskData
from birder_repro.tasks.common import (
    ClassificationTask,
    build_by_source,
    check_labels_fit,
    eval_loader,
    pick_size,
    synthetic_image_data,
    train_loader,
)
from birder_repro.tasks.data_files import check_cifar100, check_cifar100_files

# model.size -> (basic blocks per stage, channels per stage). tiny is a ResNet-8 of half the width, for CPU
# smoke runs: the same code, only chosen explicitly.
SIZES = {
    "full": (3, (16, 32, 64)),
    "tiny": (1, (8, 16, 32)),
}

# Per-channel mean and std of the CIFAR-100 training images (pixel values in [0, 1]).
CIFAR100_MEAN = (0.5071, 0.4865, 0.4409)
CIFAR100_STD = (0.2673, 0.2564, 0.2762)


# --------------------------------------------------------------------------------------------------------------
# Model


class BasicBlock(nn.Module):
    """Two 3x3 convolutions with batch norm; option-A shortcut (He et al. 2016, section 3.3 and 4.2)."""

    def __init__(self, in_planes: int, planes: int, stride: int):
        super().__init__()
        self.conv1 = nn.Conv2d(in_planes, planes, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, stride=1, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.stride, self.pad = stride, planes - in_planes

    def shortcut(self, x: torch.Tensor) -> torch.Tensor:
        """Identity; where the block halves the map and widens the channels, subsample and zero-pad."""
        if self.stride != 1:
            x = x[:, :, :: self.stride, :: self.stride]
        if self.pad:
            x = F.pad(x, (0, 0, 0, 0, self.pad // 2, self.pad - self.pad // 2))
        return x

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return F.relu(out + self.shortcut(x))


class CifarResNet(nn.Module):
    """The 6n + 2 layer CIFAR ResNet of He et al. 2016, section 4.2 (n = 3: ResNet-20)."""

    def __init__(self, blocks: int, widths: tuple[int, int, int], num_classes: int):
        super().__init__()
        self.conv = nn.Conv2d(3, widths[0], 3, padding=1, bias=False)
        self.bn = nn.BatchNorm2d(widths[0])
        stages, in_planes = [], widths[0]
        for i, planes in enumerate(widths):
            for j in range(blocks):
                # The first block of stages 2 and 3 halves the feature map (32 -> 16 -> 8).
                stages.append(BasicBlock(in_planes, planes, stride=2 if i > 0 and j == 0 else 1))
                in_planes = planes
        self.blocks = nn.Sequential(*stages)
        self.fc = nn.Linear(in_planes, num_classes)
        self._init_weights()

    def _init_weights(self) -> None:
        # He et al. 2016 initialize as in their "Delving deep into rectifiers" (He et al. 2015).
        for m in self.modules():
            if isinstance(m, (nn.Conv2d, nn.Linear)):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
            elif isinstance(m, nn.BatchNorm2d):
                nn.init.ones_(m.weight)
                nn.init.zeros_(m.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.blocks(F.relu(self.bn(self.conv(x))))
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


def resnet20(num_classes: int = 100, size: str = "full") -> CifarResNet:
    """ResNet-20 (``size="full"``) or its tiny CPU variant."""
    blocks, widths = pick_size(size, SIZES)
    return CifarResNet(blocks, widths, num_classes)


# --------------------------------------------------------------------------------------------------------------
# Data


class _CIFAR100Unverified(datasets.CIFAR100):
    """torchvision's CIFAR-100 with its md5 checks replaced by presence checks (``data.check_md5=false``).

    For copies that were re-packed, and for the tests' small files in the real format; torchvision checks a
    file without an md5 for presence only (``torchvision.datasets.utils.check_integrity``).
    """

    train_list: ClassVar[list] = [["train", None]]
    test_list: ClassVar[list] = [["test", None]]
    meta: ClassVar[dict] = {**datasets.CIFAR100.meta, "md5": None}


def cifar100_transform(train: bool, augment: bool) -> transforms.Compose:
    steps = [transforms.RandomCrop(32, padding=4), transforms.RandomHorizontalFlip()] if train and augment else []
    return transforms.Compose(steps + [transforms.ToTensor(), transforms.Normalize(CIFAR100_MEAN, CIFAR100_STD)])


def _download_once(cfg, rank: int) -> None:
    """Only rank 0 downloads (concurrent writers would corrupt the archive); the others wait for it.

    data.root must then be visible to every node; without a shared filesystem, fetch the data beforehand.
    """
    if rank == 0:
        datasets.CIFAR100(root=cfg.data.root, train=True, download=True)
    if dist.is_available() and dist.is_initialized():
        dist.barrier()


def real_cifar100(cfg, train: bool) -> datasets.CIFAR100:
    """The CIFAR-100 split from ``data.root``; a missing file is a :class:`DatasetNotFound` naming it."""
    folder = check_cifar100_files(cfg, ("train" if train else "test",))
    cls = datasets.CIFAR100 if cfg.data.check_md5 else _CIFAR100Unverified
    try:
        dataset = cls(root=cfg.data.root, train=train, transform=cifar100_transform(train, cfg.data.augment))
    except RuntimeError as err:  # torchvision's message for an md5 mismatch does not say which setting to change
        raise RuntimeError(
            f"CIFAR-100 under {folder!r} failed torchvision's md5 check ({err}); re-download it, "
            f"or set data.check_md5=false to accept a re-packed copy"
        ) from err
    check_labels_fit(len(dataset.classes), cfg, folder)
    return dataset


def build_cifar100(cfg, rank: int, world_size: int) -> TaskData:
    if cfg.data.download:
        _download_once(cfg, rank)
    train_set, test_set = real_cifar100(cfg, train=True), real_cifar100(cfg, train=False)
    loader, sampler = train_loader(train_set, cfg, rank, world_size)
    augment = "random crop 32 pad 4 + flip" if cfg.data.augment else "no augmentation"
    description = (
        f"CIFAR-100 (real) from {cfg.data.root}: {len(train_set)} train / {len(test_set)} test images, {augment}"
    )
    return TaskData(loader, eval_loader(test_set, cfg, rank, world_size), len(train_set), description, sampler)


def build_synthetic(cfg, rank: int, world_size: int) -> TaskData:
    """CIFAR-shaped (3x32x32) class-conditional images; data.augment does not apply to them."""
    return synthetic_image_data(cfg, rank, world_size, (3, 32, 32), "CIFAR-100")


# --------------------------------------------------------------------------------------------------------------
# Task


class ResNet20Task(ClassificationTask):
    """ResNet-20 / CIFAR-100, Birder paper, appendix B.1."""

    name = "resnet20"
    baseline = "sgdm"
    metrics = ("top1", "top5")
    headline_metric = "top1"

    def fsdp_units(self, model: nn.Module) -> list[nn.Module]:
        return list(model.blocks)  # the residual blocks

    def build_model(self, cfg) -> nn.Module:
        return resnet20(int(cfg.model.num_classes), cfg.model.size)

    def build_data(self, cfg, rank: int, world_size: int) -> TaskData:
        return build_by_source(cfg, rank, world_size, {"real": build_cifar100, "synthetic": build_synthetic})

    def check_data(self, cfg) -> None:
        check_cifar100(cfg)

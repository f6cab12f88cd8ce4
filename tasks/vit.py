"""ViT-B/16 on ImageNet (ILSVRC2012): Birder paper, appendix B.3 (Figure 7).

The paper uses "the Pytorch official implementation for ViT" (its footnote 8: torchvision's
``references/classification``) with its recommended settings, 150 epochs instead of 300, on 4 nodes x 8 GPUs.

Model: torchvision's ``vit_b_16(weights=None)`` trained from scratch (86,567,656 parameters with 1000 classes and
224 x 224 images). ``model.size=tiny`` is the same torchvision ``VisionTransformer`` class with 2 layers, 2 heads,
width 32 (patch 16), for CPU smoke runs; it is only ever chosen explicitly. Both take their image size from
``data.image_size``.

Data: ImageNet train and val image folders, loaded as for ResNet-50 (tasks.common.build_imagenet), or
``data.source=synthetic`` ImageNet-shaped class-conditional images (tasks.common.build_imagenet_synthetic).
torchvision's vit_b_16 recipe (references/classification/README.md, "vit_b_16") adds, and this task applies:

- RandAugment (``--auto-augment ra``; torchvision's defaults: 2 operations, magnitude 9) after the random
  resized crop and flip, on real images only (``data.rand_augment``);
- mixup alpha 0.2 or cutmix alpha 1.0, one of the two per batch (``--mixup-alpha 0.2 --cutmix-alpha 1.0``;
  torchvision's ``transforms.v2.MixUp`` / ``CutMix`` under ``RandomChoice``, as its train.py does);
- label smoothing 0.11 (``--label-smoothing 0.11``), folded into the batch's soft targets, so that the loss is
  the cross-entropy against them: (1 - e) * mixed one-hot + e / classes is what ``F.cross_entropy(...,
  label_smoothing=e)`` computes for the mixed targets.

The rest of the recipe lives in conf/task/vit.yaml (AdamW lr 0.003, weight decay 0.3, cosine schedule with 30
linear warmup epochs, global batch 4096, gradient clipping at norm 1.0). Left out, and said so: the repeated
augmentation sampler (``--ra-sampler``), the model EMA (``--model-ema``) and mixed precision (``--amp``).

Loss and metric: cross-entropy against the (soft) targets; top-1 and top-5 accuracy in percent on the
validation images with their hard labels (tasks.common.ClassificationTask).
"""

from __future__ import annotations

from collections.abc import Iterator

import torch
import torch.nn.functional as F
from torch import nn
from torchvision import transforms
from torchvision.models import vit_b_16
from torchvision.models.vision_transformer import VisionTransformer
from torchvision.transforms import v2

from birder_repro.tasks.base import TaskData
from birder_repro.tasks.common import (
    IMAGENET_MEAN,
    IMAGENET_STD,
    ClassificationTask,
    build_by_source,
    build_imagenet,
    build_imagenet_synthetic,
    check_imagenet,
    pick_size,
)

# torchvision's RandAugment magnitude for --auto-augment ra (train.py --ra-magnitude default).
RA_MAGNITUDE = 9


def _vit_b_16(num_classes: int, image_size: int) -> VisionTransformer:
    return vit_b_16(weights=None, num_classes=num_classes, image_size=image_size)


def _vit_tiny(num_classes: int, image_size: int) -> VisionTransformer:
    """torchvision's VisionTransformer at tiny widths: the same code as ViT-B/16."""
    return VisionTransformer(
        image_size=image_size,
        patch_size=16,
        num_layers=2,
        num_heads=2,
        hidden_dim=32,
        mlp_dim=64,
        num_classes=num_classes,
    )


# model.size -> constructor; both are torchvision.models.vision_transformer.VisionTransformer.
SIZES = {"full": _vit_b_16, "tiny": _vit_tiny}


# --------------------------------------------------------------------------------------------------------------
# Training transforms of torchvision's ViT recipe


def vit_train_transform(image_size: int) -> transforms.Compose:
    """torchvision's ClassificationPresetTrain with ``auto_augment="ra"``: crop, flip, RandAugment, normalize."""
    return transforms.Compose(
        [
            transforms.RandomResizedCrop(image_size),
            transforms.RandomHorizontalFlip(),
            transforms.RandAugment(magnitude=RA_MAGNITUDE),
            transforms.ToTensor(),
            transforms.Normalize(IMAGENET_MEAN, IMAGENET_STD),
        ]
    )


class SoftTargets:
    """A batch's integer labels as soft targets: mixup or cutmix (one of the two, at random), then label smoothing.

    With both alphas 0 and no smoothing the labels stay integers. The randomness is torch's global generator
    (seeded per rank by the worker), in the main process, batch by batch.
    """

    def __init__(self, num_classes: int, mixup_alpha: float, cutmix_alpha: float, label_smoothing: float):
        if not 0.0 <= label_smoothing < 1.0:
            raise ValueError(f"train.label_smoothing must be in [0, 1), got {label_smoothing}")
        mixers = []
        if mixup_alpha > 0:
            mixers.append(v2.MixUp(alpha=mixup_alpha, num_classes=num_classes))
        if cutmix_alpha > 0:
            mixers.append(v2.CutMix(alpha=cutmix_alpha, num_classes=num_classes))
        self.mix = v2.RandomChoice(mixers) if mixers else None
        self.num_classes, self.label_smoothing = num_classes, label_smoothing

    @property
    def identity(self) -> bool:
        return self.mix is None and self.label_smoothing == 0

    def __call__(self, images: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if self.identity:
            return images, labels
        if self.mix is not None:
            images, targets = self.mix(images, labels)
        else:
            targets = F.one_hot(labels, self.num_classes).float()
        e = self.label_smoothing
        return images, targets * (1 - e) + e / self.num_classes


class MappedBatches:
    """A loader whose batches go through ``fn(images, labels)``; its length is the loader's."""

    def __init__(self, loader, fn):
        self.loader, self.fn = loader, fn

    def __len__(self) -> int:
        return len(self.loader)

    def __iter__(self) -> Iterator:
        for images, labels in self.loader:
            yield self.fn(images, labels)


def soft_targets(cfg) -> SoftTargets:
    return SoftTargets(
        int(cfg.model.num_classes),
        float(cfg.data.mixup_alpha),
        float(cfg.data.cutmix_alpha),
        float(cfg.train.label_smoothing),
    )


def with_recipe(data: TaskData, cfg, rand_augment: bool) -> TaskData:
    """The ImageNet TaskData with the ViT recipe's training augmentation and soft targets."""
    notes = []
    if rand_augment:
        # ImageFolder applies its ``transform`` per item; the loader's workers start on first iteration, later.
        data.train.dataset.transform = vit_train_transform(int(cfg.data.image_size))
        notes.append(f"RandAugment (2 ops, magnitude {RA_MAGNITUDE})")
    targets = soft_targets(cfg)
    if not targets.identity:
        data.train = MappedBatches(data.train, targets)
        notes.append(
            f"mixup {cfg.data.mixup_alpha} / cutmix {cfg.data.cutmix_alpha}, label smoothing "
            f"{cfg.train.label_smoothing}"
        )
    if notes:
        data.description += "; training batches: " + ", ".join(notes)
    return data


def build_real(cfg, rank: int, world_size: int) -> TaskData:
    return with_recipe(build_imagenet(cfg, rank, world_size), cfg, bool(cfg.data.rand_augment))


def build_synthetic(cfg, rank: int, world_size: int) -> TaskData:
    """Synthetic images are tensors, not pictures: RandAugment does not apply, mixup, cutmix and smoothing do."""
    return with_recipe(build_imagenet_synthetic(cfg, rank, world_size), cfg, rand_augment=False)


# --------------------------------------------------------------------------------------------------------------
# Task


class ViTTask(ClassificationTask):
    """ViT-B/16 / ImageNet, Birder paper, appendix B.3."""

    name = "vit"
    baseline = "adamw"  # torchvision's recipe is AdamW's; appendix B.3 tunes SGD and SGDM against it
    metrics = ("top1", "top5")
    headline_metric = "top1"

    def fsdp_units(self, model: nn.Module) -> list[nn.Module]:
        return list(model.encoder.layers)  # the transformer blocks

    def build_model(self, cfg) -> nn.Module:
        return pick_size(cfg.model.size, SIZES)(int(cfg.model.num_classes), int(cfg.data.image_size))

    def build_data(self, cfg, rank: int, world_size: int) -> TaskData:
        return build_by_source(cfg, rank, world_size, {"real": build_real, "synthetic": build_synthetic})

    def check_data(self, cfg) -> None:
        check_imagenet(cfg)


__all__ = [
    "SIZES",
    "RA_MAGNITUDE",
    "vit_train_transform",
    "SoftTargets",
    "MappedBatches",
    "soft_targets",
    "with_recipe",
    "ViTTask",
]

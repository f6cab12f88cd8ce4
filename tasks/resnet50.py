"""ResNet-50 on ImageNet (ILSVRC2012): Birder paper, section 5.1, Tables 1 and 3, Figures 2 to 4.

Model: torchvision's ``resnet50(weights=None)`` trained from scratch, as the paper does (25,557,032 parameters
with 1000 classes). ``model.size=tiny`` is the same torchvision ``ResNet`` class with one basic block per stage
(a ResNet-10, 5,418,792 parameters) for CPU smoke runs; it is only ever chosen explicitly.

Data: ImageNet train and val as image folders (``<data.root>/{train,val}/<wnid>/*.JPEG``) through torchvision's
ImageFolder with the standard transforms (random resized crop + flip for training; resize 256 and center crop
224 for evaluation; ``data.image_size``), or ``data.source=synthetic``: ImageNet-shaped class-conditional images
(tasks.common.build_imagenet, build_imagenet_synthetic; shared with the ViT task).

Loss and metric: cross-entropy, top-1 and top-5 accuracy in percent (tasks.common.ClassificationTask).
Hyperparameters: conf/task/resnet50.yaml (100 epochs, 32 per GPU, lr / 10 after epochs 30, 60, 90) and the
per-optimizer recipes in conf/recipe/resnet50/ (lr x batch / 256).
"""

from __future__ import annotations

from torch import nn
from torchvision.models import resnet50
from torchvision.models.resnet import BasicBlock, ResNet

from birder_repro.tasks.base import TaskData
from birder_repro.tasks.common import (
    ClassificationTask,
    build_by_source,
    build_imagenet,
    build_imagenet_synthetic,
    check_imagenet,
    pick_size,
)


def _resnet10(num_classes: int) -> ResNet:
    """torchvision's ResNet with one basic block per stage: the tiny variant."""
    return ResNet(BasicBlock, [1, 1, 1, 1], num_classes=num_classes)


def _resnet50(num_classes: int) -> ResNet:
    return resnet50(weights=None, num_classes=num_classes)


# model.size -> constructor; both are torchvision.models.resnet.ResNet.
SIZES = {"full": _resnet50, "tiny": _resnet10}


class ResNet50Task(ClassificationTask):
    """ResNet-50 / ImageNet, Birder paper, section 5.1."""

    name = "resnet50"
    baseline = "sgdm"
    metrics = ("top1", "top5")
    headline_metric = "top1"

    def fsdp_units(self, model: nn.Module) -> list[nn.Module]:
        return [block for stage in (model.layer1, model.layer2, model.layer3, model.layer4) for block in stage]

    def build_model(self, cfg) -> nn.Module:
        return pick_size(cfg.model.size, SIZES)(int(cfg.model.num_classes))

    def build_data(self, cfg, rank: int, world_size: int) -> TaskData:
        return build_by_source(cfg, rank, world_size, {"real": build_imagenet, "synthetic": build_imagenet_synthetic})

    def check_data(self, cfg) -> None:
        check_imagenet(cfg)

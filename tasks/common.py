"""Pieces the image-classification tasks share: loaders, synthetic images, ImageNet folders, top-k accuracy.

Every image task (``resnet20``, ``resnet50``, ``digits``, and ``vit`` where it wants them) builds its data
with :func:`train_loader` / :func:`eval_loader` and inherits its loss and metric from
:class:`ClassificationTask`, so that a reader who knows one task knows them all (DESIGN.md, "tasks/").
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, Dataset, Sampler
from torch.utils.data.distributed import DistributedSampler

from birder_repro.config import settings as layout
from birder_repro.tasks.base import Task, TaskData, small_eval_note
from birder_repro.tasks.data_files import check_imagenet, imagenet_split

if TYPE_CHECKING:  # imported where used: torchvision costs a task that reads no image folder 2 s a process
    from torchvision import datasets, transforms

__all__ = [
    "pick_size",
    "build_by_source",
    "ShardSampler",
    "train_loader",
    "eval_loader",
    "SyntheticImages",
    "synthetic_description",
    "IMAGENET_MEAN",
    "IMAGENET_STD",
    "imagenet_transform",
    "imagenet_folder",
    "check_imagenet",
    "build_imagenet",
    "build_imagenet_synthetic",
    "topk_correct",
    "ClassificationTask",
    "num_parameters",
    "check_labels_fit",
]

# --------------------------------------------------------------------------------------------------------------
# model.size presets


def pick_size(size: str, presets: Mapping[str, Any]) -> Any:
    """The preset for ``model.size`` (``full`` or ``tiny``); an unknown name is an error naming the key."""
    if size not in presets:
        raise ValueError(f"model.size={size!r} is not one of {sorted(presets)}")
    return presets[size]


def build_by_source(cfg, rank: int, world_size: int, builders: Mapping[str, Callable]) -> TaskData:
    """Call the data builder that ``data.source`` names (``real`` or ``synthetic``); never fall back."""
    if cfg.data.source not in builders:
        raise ValueError(f"data.source={cfg.data.source!r} is not one of {sorted(builders)}")
    return builders[cfg.data.source](cfg, rank, world_size)


# --------------------------------------------------------------------------------------------------------------
# Loaders: training data through DistributedSampler, evaluation data split exactly over the processes


class ShardSampler(Sampler[int]):
    """Indices ``rank, rank + world, rank + 2 world, ...`` of ``n``: every sample on exactly one process.

    DistributedSampler pads the last round with repeated samples so that every process gets as many; for
    evaluation that would count some samples twice, so the summed (correct, count) would not be the accuracy
    over the evaluation set. Shards here differ in length by at most one and add up to ``n``.
    """

    def __init__(self, n: int, rank: int, world_size: int):
        if not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} is not in [0, {world_size})")
        self.n, self.rank, self.world_size = n, rank, world_size

    def __iter__(self) -> Iterator[int]:
        return iter(range(self.rank, self.n, self.world_size))

    def __len__(self) -> int:
        return len(range(self.rank, self.n, self.world_size))


def _loader_kwargs(cfg) -> dict:
    workers = layout.data_workers(cfg)
    # Pinned host memory only helps copies to a GPU, and only on a run that uses one: asking torch whether CUDA
    # is available would pin (and make a CUDA context on GPU 0 in every process) on a CPU run of a GPU machine.
    # Persistent workers spare a re-spawn every epoch.
    return dict(num_workers=workers, pin_memory=runs_on_gpu(cfg), persistent_workers=workers > 0)


def runs_on_gpu(cfg) -> bool:
    """Whether this run's processes compute on GPUs: the device the worker resolved (``device`` is ``auto``
    until then, so the worker's own resolution is asked, with this machine's processes)."""
    device = cfg.get("device", "auto")
    if device != "auto":
        return device == "cuda"
    try:
        return layout.resolve_device(cfg, int(os.environ.get("LOCAL_WORLD_SIZE", 1))) == "cuda"
    except layout.ConfigError:
        return False


def train_loader(dataset: Dataset, cfg, rank: int, world_size: int) -> tuple[DataLoader, DistributedSampler]:
    """This process's training loader: a shuffling DistributedSampler seeded with ``seed``, full batches only.

    The loop calls ``sampler.set_epoch(epoch)`` so that every epoch is a different permutation, the same on
    every process. Fails when a process's share cannot fill one batch (the loop would otherwise never step).
    """
    batch = int(cfg.train.batch_size)
    sampler = DistributedSampler(dataset, num_replicas=world_size, rank=rank, shuffle=True, seed=int(cfg.seed))
    if len(sampler) < batch:
        raise ValueError(
            f"the training set of {len(dataset)} samples gives each of {world_size} processes "
            f"{len(sampler)} samples, fewer than train.batch_size={batch}"
        )
    loader = DataLoader(dataset, batch_size=batch, sampler=sampler, drop_last=True, **_loader_kwargs(cfg))
    return loader, sampler


def eval_loader(dataset: Dataset, cfg, rank: int, world_size: int) -> DataLoader:
    """This process's evaluation shard (:class:`ShardSampler`), in order, the last batch kept."""
    sampler = ShardSampler(len(dataset), rank, world_size)
    return DataLoader(
        dataset, batch_size=int(cfg.train.batch_size), sampler=sampler, drop_last=False, **_loader_kwargs(cfg)
    )


# --------------------------------------------------------------------------------------------------------------
# Synthetic class-conditional images


class SyntheticImages(Dataset):
    """Images whose class a model can learn: a fixed low-frequency pattern per class plus per-sample noise.

    Class ``c``'s pattern is a ``grid x grid`` Gaussian field per channel, drawn once from ``seed`` and
    upsampled bilinearly to the image size; sample ``i`` has label ``i % num_classes`` (balanced classes) and
    its own Gaussian noise of std ``noise`` drawn from a generator seeded by ``(seed, split, i)``. Samples are
    made on demand, so 1.28M ImageNet-shaped samples cost no memory, and the same index always gives the same
    image, in any worker or process. Train and eval splits share the class patterns and never a noise draw.
    Values are already roughly zero-mean and unit-scale, like normalized real images.
    """

    def __init__(
        self,
        size: int,
        num_classes: int,
        shape: Sequence[int],
        seed: int,
        split: str,
        grid: int = 4,
        noise: float = 1.0,
    ):
        if split not in ("train", "eval"):
            raise ValueError(f"split must be 'train' or 'eval', not {split!r}")
        if not 0 < int(size) <= 2**31:
            raise ValueError(f"a synthetic split holds 1 to 2**31 samples, not {size}")
        self.size, self.num_classes, self.shape, self.noise = int(size), int(num_classes), tuple(shape), noise
        g = torch.Generator().manual_seed(int(seed))
        self.patterns = torch.randn(num_classes, shape[0], grid, grid, generator=g)  # tiny: 1000 x 3 x 4 x 4
        # torch's CPU generator (mt19937) keeps only the low 32 bits of a seed, so sample seeds live in 32 bits:
        # index + split bit 31 + a seed offset. Within one seed, train and eval never share a noise draw.
        self._base = (int(seed) * 0x9E3779B1 + (0 if split == "train" else 2**31)) % 2**32

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        if not 0 <= index < self.size:
            raise IndexError(index)
        label = index % self.num_classes
        pattern = F.interpolate(self.patterns[label][None], size=self.shape[1:], mode="bilinear", align_corners=False)[
            0
        ]
        g = torch.Generator().manual_seed((self._base + index) % 2**32)
        return pattern + self.noise * torch.randn(self.shape, generator=g), label


def synthetic_description(what: str, cfg, train_size: int, eval_size: int) -> str:
    """The line printed at the start of a synthetic run: it must never be mistaken for real data."""
    return (
        f"SYNTHETIC data (data.source=synthetic): {what}, {train_size} train / {eval_size} eval samples "
        f"({small_eval_note('data.synthetic_eval_size')}), seed {cfg.seed}; its accuracy says nothing about "
        "the real dataset's"
    )


# --------------------------------------------------------------------------------------------------------------
# ImageNet (ILSVRC2012) as image folders, for resnet50 and vit

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


def imagenet_transform(train: bool, image_size: int) -> transforms.Compose:
    """The standard ImageNet transforms (torchvision's reference recipe, as Birder paper, section 5.1 uses).

    Train: random resized crop + horizontal flip; evaluation: resize the short side to 256/224 of the crop,
    then center crop. Both normalize with the ImageNet training set's mean and std.
    """
    from torchvision import transforms

    if train:
        steps = [transforms.RandomResizedCrop(image_size), transforms.RandomHorizontalFlip()]
    else:
        steps = [transforms.Resize(round(image_size * 256 / 224)), transforms.CenterCrop(image_size)]
    return transforms.Compose(steps + [transforms.ToTensor(), transforms.Normalize(IMAGENET_MEAN, IMAGENET_STD)])


def imagenet_folder(cfg, split: str) -> datasets.ImageFolder:
    """``<data.root>/<split>/<wnid>/*.JPEG``; a missing folder is a :class:`DatasetNotFound` naming it.

    The validation images must be sorted into class folders as well (the usual ``valprep.sh`` layout).
    """
    from torchvision import datasets

    path = imagenet_split(cfg, split)
    folder = datasets.ImageFolder(path, transform=imagenet_transform(split == "train", int(cfg.data.image_size)))
    check_labels_fit(len(folder.classes), cfg, path)
    return folder


def build_imagenet(cfg, rank: int, world_size: int) -> TaskData:
    """ImageNet train and val folders through torchvision's ImageFolder and the standard transforms."""
    train_set, val_set = imagenet_folder(cfg, "train"), imagenet_folder(cfg, "val")
    # ImageFolder numbers classes by sorted folder name: the two splits must hold the same classes.
    if train_set.classes != val_set.classes:
        raise ValueError(
            f"{cfg.data.root}/train and {cfg.data.root}/val hold different class folders "
            f"({len(train_set.classes)} and {len(val_set.classes)} classes)"
        )
    loader, sampler = train_loader(train_set, cfg, rank, world_size)
    description = (
        f"ImageNet (real) image folders under {cfg.data.root}: {len(train_set)} train / "
        f"{len(val_set)} val images, {len(train_set.classes)} classes, {cfg.data.image_size}px"
    )
    return TaskData(loader, eval_loader(val_set, cfg, rank, world_size), len(train_set), description, sampler)


def synthetic_image_data(cfg, rank: int, world_size: int, shape: tuple[int, ...], like: str) -> TaskData:
    """Class-conditional synthetic images of ``shape`` (C, H, W) for a task whose real data is ``like``: the image
    tasks' one synthetic source (train and eval drawn apart from the run's seed)."""
    classes, seed = int(cfg.model.num_classes), int(cfg.seed)
    train_set = SyntheticImages(cfg.data.synthetic_train_size, classes, shape, seed, "train")
    eval_set = SyntheticImages(cfg.data.synthetic_eval_size, classes, shape, seed, "eval")
    loader, sampler = train_loader(train_set, cfg, rank, world_size)
    what = f"{like}-shaped class-conditional images ({'x'.join(map(str, shape))}, {classes} classes)"
    description = synthetic_description(what, cfg, len(train_set), len(eval_set))
    return TaskData(loader, eval_loader(eval_set, cfg, rank, world_size), len(train_set), description, sampler)


def build_imagenet_synthetic(cfg, rank: int, world_size: int) -> TaskData:
    """ImageNet-shaped (3 x image_size x image_size) class-conditional images."""
    size = int(cfg.data.image_size)
    return synthetic_image_data(cfg, rank, world_size, (3, size, size), "ImageNet")


# --------------------------------------------------------------------------------------------------------------
# Loss and metric


def topk_correct(logits: torch.Tensor, targets: torch.Tensor, ks: Iterable[int]) -> dict[int, int]:
    """Per k, how many samples have their target among the k highest logits (k capped at the class count)."""
    ks = tuple(ks)
    maxk = min(max(ks), logits.shape[1])
    hit = logits.topk(maxk, dim=1).indices.eq(targets[:, None])
    return {k: int(hit[:, :k].any(dim=1).sum()) for k in ks}


class ClassificationTask(Task):
    """Cross-entropy loss and top-k accuracy (percent) for tasks whose batches are ``(images, labels)``.

    ``metrics`` names the accuracies (``top<k>``); ``evaluate`` returns, per metric, (sum, count) over this
    process's shard: ``top<k>`` counts correct samples, and ``loss`` sums the per-sample cross-entropy as well;
    ``finalize`` turns the averaged accuracies into percentages (Birder paper reports top-1 in percent).
    """

    metrics: tuple[str, ...] = ("top1", "top5")

    def _ks(self) -> tuple[int, ...]:
        return tuple(int(m.removeprefix("top")) for m in self.metrics)

    def loss(self, model: nn.Module, batch, device: torch.device) -> tuple[torch.Tensor, int]:
        images, labels = (t.to(device, non_blocking=True) for t in batch)
        return F.cross_entropy(model(images), labels), labels.shape[0]

    @torch.no_grad()
    def evaluate(self, model: nn.Module, loader: Iterable, device: torch.device) -> dict[str, tuple[float, float]]:
        # Evaluate the bare module: shards may differ by one batch between processes, and a DDP forward can
        # start a buffer broadcast that a process with no batch left would never join.
        if isinstance(model, DistributedDataParallel):
            model = model.module
        was_training = model.training
        model.eval()  # batch norm on its running statistics
        correct = {k: 0 for k in self._ks()}
        loss_sum, count = 0.0, 0
        for images, labels in loader:
            images, labels = images.to(device, non_blocking=True), labels.to(device, non_blocking=True)
            logits = model(images)
            loss_sum += float(F.cross_entropy(logits, labels, reduction="sum"))
            for k, c in topk_correct(logits, labels, self._ks()).items():
                correct[k] += c
            count += labels.shape[0]
        model.train(was_training)
        sums = {f"top{k}": (float(c), float(count)) for k, c in correct.items()}
        sums["loss"] = (loss_sum, float(count))
        return sums

    def finalize(self, means: dict[str, float]) -> dict[str, float]:
        return {k: (100.0 * v if k in self.metrics else v) for k, v in means.items()}


def num_parameters(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def check_labels_fit(num_found: int, cfg, where: str) -> None:
    """A dataset with more classes than the model's output layer is a configuration error, not a crash later."""
    if num_found > int(cfg.model.num_classes):
        raise ValueError(f"{where} holds {num_found} classes but model.num_classes={cfg.model.num_classes}")

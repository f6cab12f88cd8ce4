"""Where each task's real dataset lives, and the check that it is there, without torch.

The CLI checks the data before it launches anything (a missing dataset is one line naming the path and the
setting to change, not a traceback from every worker). It does so on every node of a cluster: each node of a
``launcher=torchrun`` or ``cluster=emulated`` run starts its own CLI. Importing a task module for that check
costs torch and torchvision (about 5 s of CPU here, in every node's CLI of every run), so the paths and the
checks live here, in plain Python, and the task modules read their files from the same functions.

:data:`CHECKS` maps a task name to its check; a task with none (``digits``: scikit-learn's copy) is absent.
``tests/test_tasks_registry.py`` holds it to the registry's ``checks_data`` and to each task's ``check_data``.
"""

from __future__ import annotations

import glob
import os
from collections.abc import Callable

__all__ = [
    "DatasetNotFound",
    "CHECKS",
    "FASHION_FILES",
    "FASHION_DEBIAN_ROOT",
    "FASHION_INSTALL_HINT",
    "fashion_root",
    "check_fashion",
    "check_fashion_files",
    "CIFAR100_FOLDER",
    "check_cifar100",
    "check_cifar100_files",
    "imagenet_split",
    "check_imagenet",
    "PTB_SPLITS",
    "ptb_path",
    "check_ptb",
    "SQUAD_TRAIN_FILE",
    "SQUAD_DEV_FILE",
    "squad_file",
    "check_squad",
    "pretrain_text_files",
    "check_pretrain_text",
]


class DatasetNotFound(FileNotFoundError):
    """A real dataset is missing: the message names the path and the setting to change."""

    def __init__(self, what: str, path: str, hint: str = ""):
        msg = (
            f"{what} not found at {path!r}. Point data.root=<dir> at a copy"
            f"{' (' + hint + ')' if hint else ''}, or run on synthetic data with data.source=synthetic."
        )
        super().__init__(msg)


# ------------------------------------------------------------------------------------------- Fashion-MNIST
# The files of the dataset's release and of Debian's package, by split.
FASHION_FILES = {
    "train": ("train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz"),
    "test": ("t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz"),
}
FASHION_DEBIAN_ROOT = "/usr/share/datasets/fashion-mnist"
FASHION_INSTALL_HINT = "or install Debian's copy: apt-get install dataset-fashion-mnist"


def fashion_root(cfg) -> str:
    """``data.root``; null: ``$BIRDER_DATA/fashion-mnist``, or Debian's copy where only that one exists."""
    if cfg.data.get("root"):
        return str(cfg.data.root)
    own = os.path.join(os.environ.get("BIRDER_DATA", "data"), "fashion-mnist")
    return FASHION_DEBIAN_ROOT if not os.path.isdir(own) and os.path.isdir(FASHION_DEBIAN_ROOT) else own


def check_fashion(cfg) -> None:
    """Fashion-MNIST's four IDX files under :func:`fashion_root`."""
    check_fashion_files(fashion_root(cfg))


def check_fashion_files(root: str) -> None:
    """Every IDX file is there; the first missing one is a :class:`DatasetNotFound` naming it (one line)."""
    for names in FASHION_FILES.values():
        for name in names:
            path = os.path.join(root, name)
            if not os.path.isfile(path):
                raise DatasetNotFound("Fashion-MNIST's IDX file", path, FASHION_INSTALL_HINT)


# ------------------------------------------------------------------------------------------- CIFAR-100
CIFAR100_FOLDER = "cifar-100-python"  # torchvision.datasets.CIFAR100.base_folder (a test holds them equal)


def check_cifar100_files(cfg, splits: tuple[str, ...] = ("train", "test")) -> str:
    """The folder of CIFAR-100's files under ``data.root``; a missing file is a :class:`DatasetNotFound`."""
    folder = os.path.join(cfg.data.root, CIFAR100_FOLDER)
    for name in (*splits, "meta"):
        path = os.path.join(folder, name)
        if not os.path.isfile(path):
            raise DatasetNotFound(
                "CIFAR-100 (torchvision's cifar-100-python format)",
                path,
                "or set data.download=true where there is a network",
            )
    return folder


def check_cifar100(cfg) -> None:
    if not cfg.data.download:  # otherwise torchvision fetches what is missing
        check_cifar100_files(cfg)


# ------------------------------------------------------------------------------------------- ImageNet
def imagenet_split(cfg, split: str) -> str:
    """``<data.root>/<split>``, ImageFolder's layout; missing: a :class:`DatasetNotFound`."""
    path = os.path.join(cfg.data.root, split)
    if not os.path.isdir(path):
        raise DatasetNotFound(f"ImageNet {split} images (<data.root>/{split}/<class>/*.JPEG)", path)
    return path


def check_imagenet(cfg) -> None:
    """The train and val folders are there (the ImageNet tasks: resnet50, vit)."""
    for split in ("train", "val"):
        imagenet_split(cfg, split)


# ------------------------------------------------------------------------------------------- Penn Treebank
PTB_SPLITS = ("train", "valid", "test")


def ptb_path(cfg, split: str) -> str:
    """``<data.root>/ptb.<split>.txt``; a missing file is a :class:`DatasetNotFound` naming it."""
    path = os.path.join(cfg.data.root, f"ptb.{split}.txt")
    if not os.path.isfile(path):
        raise DatasetNotFound(
            f"Penn Treebank {split} text (ptb.train.txt / ptb.valid.txt / ptb.test.txt)",
            path,
            "Mikolov's word-level PTB, as AWD-LSTM's getdata.sh fetches it into data/penn",
        )
    return path


def check_ptb(cfg) -> None:
    for split in PTB_SPLITS:
        ptb_path(cfg, split)


# ------------------------------------------------------------------------------------------- SQuAD 1.1
SQUAD_TRAIN_FILE, SQUAD_DEV_FILE = "train-v1.1.json", "dev-v1.1.json"


def squad_file(cfg, train: bool) -> str:
    """``<data.root>/train-v1.1.json`` or ``dev-v1.1.json``; a missing file is a :class:`DatasetNotFound`."""
    path = os.path.join(str(cfg.data.root), SQUAD_TRAIN_FILE if train else SQUAD_DEV_FILE)
    if not os.path.isfile(path):
        raise DatasetNotFound(
            f"SQuAD 1.1 {'training' if train else 'development'} file",
            path,
            f"holding {SQUAD_TRAIN_FILE} and {SQUAD_DEV_FILE}, or set data.hf_name=squad to load it through datasets",
        )
    return path


def check_squad(cfg) -> None:
    if not cfg.data.get("hf_name"):  # a datasets corpus is fetched (or found in its cache) by the workers
        for train in (True, False):
            squad_file(cfg, train)


# ------------------------------------------------------------------------------------------- pretraining text
def pretrain_text_files(cfg) -> list[str]:
    """``<data.root>/*.txt``, sorted; none is a :class:`DatasetNotFound` naming the folder."""
    root = str(cfg.data.root)
    files = sorted(glob.glob(os.path.join(root, "*.txt")))
    if not files:
        raise DatasetNotFound(
            "pretraining text (<data.root>/*.txt: one sentence per line, a blank line between documents)",
            root,
            "or set data.hf_name to read a datasets corpus such as wikimedia/wikipedia",
        )
    return files


def check_pretrain_text(cfg) -> None:
    if not cfg.data.get("hf_name"):  # a datasets corpus is fetched (or found in its cache) by the workers
        pretrain_text_files(cfg)


# ------------------------------------------------------------------------------------------- the checks
CHECKS: dict[str, Callable[..., None]] = {
    "resnet20": check_cifar100,
    "resnet50": check_imagenet,
    "vit": check_imagenet,
    "fashion_mnist": check_fashion,
    "bert_squad": check_squad,
    "bert_pretrain": check_pretrain_text,
    "lstm_ptb": check_ptb,
}

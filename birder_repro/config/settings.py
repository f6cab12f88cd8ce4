"""The cluster layout and learning rate a composed config stands for, as small pure functions.

The Hydra app composes the config; these functions turn its shorthands into numbers (``gpus_per_node=auto``,
the world size, the global batch, the learning rate scaled by the batch) and check the values no YAML type
can check. Every error names the setting to change. Workers read the resolved config the CLI writes, so they
see the same numbers.

Types: the YAML files declare them by example. :func:`check_types` compares every value with the same key in
reference configs (the same choice of task, optimizer, cluster, ... before the command line's ``key=value``
overrides, composed by the CLI), so that ``optim.lr=abc`` is one error line naming ``optim.lr``; and
:func:`check_known_keys` refuses a key that the first of them lacks (``+train.stepz=3``), naming the closest one.

Sections that higher layers own (the task and optimizer names, ``task.target``, ``parallel``, ``probe.*``) are
checked by their owners' functions, which :func:`validate` runs from a table it is handed
(:func:`install_section_checks`; birder_repro.train.checks writes the table out and the CLI loads it): this module
sits below them all and imports none of them (docs/architecture.md).
"""

from __future__ import annotations

import difflib
import os
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any

from omegaconf import DictConfig, OmegaConf, open_dict

from birder_repro import cuda_env
from birder_repro.config.plain import plain_config

__all__ = [
    "ConfigError",
    "resolve_gpus_per_node",
    "world_size",
    "global_batch",
    "effective_lr",
    "resolve_device",
    "resolve_backend",
    "cpu_count",
    "data_workers",
    "check_types",
    "check_known_keys",
    "check_misplaced_sections",
    "check_link",
    "no_such_setting",
    "no_such_choice",
    "dotted_keys",
    "validate",
    "resolve",
    "install_section_checks",
    "section_checks",
]

AUTO_MAX_DATA_WORKERS = 8  # data.num_workers=auto never starts more loader processes per training process

# Values a setting may take, where the YAML type alone does not say (a typo in a value fails early, here,
# rather than minutes later in a worker).
CHOICES = {
    "mode": ("train", "predict", "probe", "advise"),
    "predict.implementation": ("this", "paper"),
    "device": ("auto", "cpu", "cuda"),
    "cluster.backend": ("auto", "gloo", "nccl"),
    "launcher.name": ("auto", "local", "torchrun", "slurm"),
    "launcher.rdzv_backend": ("c10d", "static"),
    "data.source": ("real", "synthetic"),
    "model.size": ("full", "large", "tiny"),  # large: the BERT tasks' only (tasks/bert_common.py SIZES)
    # Birder's variants (DESIGN.md "Birder inside DDP"): they share one implementation in birder_repro.comm.
    "optim.comm.scheme": ("hierarchical", "flat", "allgather"),
    # 1-bit Adam's compression scale: one per tensor (DeepSpeed's) or one per DDP bucket (docs/optimizers.md).
    "optim.comm.scale": ("tensor", "bucket"),
}


class ConfigError(ValueError):
    """A setting has a value the runner cannot use; the message names the setting and what to do."""


def cpu_count() -> int:
    """CPU cores this process may run on (the affinity mask under SLURM or taskset, not the whole machine)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not available on macOS
        return os.cpu_count() or 1


def auto_data_workers(cores: int, local_processes: int) -> int:
    """Loader processes per training process for ``data.num_workers=auto``.

    The cores this machine gives the job, shared out among its training processes, less one that the training
    process itself computes on; none when a process has a single core (a loader process would only take
    turns with it on that core), and at most :data:`AUTO_MAX_DATA_WORKERS`.
    """
    return max(0, min(AUTO_MAX_DATA_WORKERS, cores // max(local_processes, 1) - 1))


def data_workers(cfg: DictConfig, env: Mapping[str, str] = os.environ) -> int:
    """``data.num_workers`` for this process: a number as given, or for ``auto``
    :func:`auto_data_workers` of this process's cores (:func:`cpu_count`) and the training processes torchrun
    started on this machine (``LOCAL_WORLD_SIZE``; 1 for a process started alone)."""
    setting = cfg.data.num_workers
    if setting != "auto":
        return int(setting)
    return auto_data_workers(cpu_count(), int(env.get("LOCAL_WORLD_SIZE", 1)))


def _cuda_count() -> int:
    if cuda_env.no_gpu_here():  # a CPU machine: 0, without importing torch (cuda_env.no_gpu_here)
        return 0
    import torch  # imported here: composing and validating a config should not need torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def resolve_gpus_per_node(value: Any, gpu_count: int | None = None) -> int:
    """``gpus_per_node`` as a number: ``auto`` is the GPUs present, or 1 process per node on CPU."""
    if value == "auto":
        count = _cuda_count() if gpu_count is None else gpu_count
        return max(count, 1)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"gpus_per_node={value!r}: use a whole number of processes per node (>= 1) or auto")
    return value


def world_size(cfg: DictConfig) -> int:
    """Processes in the layout: nodes x processes per node (``gpus_per_node`` already a number or auto)."""
    return int(cfg.nodes) * resolve_gpus_per_node(cfg.gpus_per_node)


def global_batch(cfg: DictConfig) -> int:
    """Samples per optimizer step over all processes (``train.batch_size`` is per process and micro-batch,
    ``train.accumulate`` micro-batches make a step)."""
    accumulate = OmegaConf.select(cfg, "train.accumulate", default=1) or 1
    return int(cfg.train.batch_size) * world_size(cfg) * int(accumulate)


def effective_lr(cfg: DictConfig) -> float:
    """The learning rate the optimizer gets.

    With ``optim.lr_batch_scaling`` set to a reference batch B, the rate scales linearly with the global
    batch: lr x global_batch / B (Birder paper, section 5.1: "0.1 x batch size/256" for SGDM on
    ImageNet, after Goyal et al. 2017). Without it, ``optim.lr`` is used as given.
    """
    lr = float(cfg.optim.lr)
    scaling = cfg.optim.get("lr_batch_scaling")
    return lr * global_batch(cfg) / float(scaling) if scaling else lr


def resolve_device(
    cfg: DictConfig,
    local_processes: int,
    gpu_count: int | None = None,
    why_no_cuda: Callable[[], str | None] | None = None,
) -> str:
    """``cuda`` when every process on this machine has a GPU of its own, ``cpu`` on a machine without GPUs or
    when asked; a machine with GPUs, but fewer than its processes, is an error (never a silent run on the CPU).

    A machine whose NVIDIA GPUs torch cannot use (a driver older than the build's CUDA, an empty
    ``CUDA_VISIBLE_DEVICES``) is an error too, naming the cause and the fix (:mod:`birder_repro.cuda_env`):
    ``device=cpu`` given explicitly still runs there. ``why_no_cuda`` is that diagnosis; by default this
    machine's where the GPUs are counted here, none where ``gpu_count`` is handed in (tests)."""
    if cfg.device == "cpu":  # asked for: the GPUs need not be counted
        return "cpu"
    gpus = _cuda_count() if gpu_count is None else gpu_count
    if gpus == 0:
        if why_no_cuda is None and gpu_count is None:
            why_no_cuda = cuda_env.why_no_cuda
        unusable = why_no_cuda() if why_no_cuda is not None else None
        if unusable:
            raise ConfigError(
                f"device={cfg.device}: torch sees no CUDA device, and {unusable}; or set device=cpu to train on the CPU"
            )
        if cfg.device == "auto":
            return "cpu"
    if gpus < local_processes:
        raise ConfigError(
            f"device={cfg.device} needs a GPU for each of the {local_processes} processes on this machine, and "
            f"{gpus} {'is' if gpus == 1 else 'are'} visible: lower gpus_per_node (or nodes, with launcher=local), "
            "or set device=cpu to run on the CPU"
        )
    return "cuda"


def resolve_backend(cfg: DictConfig, device: str) -> str:
    """The torch.distributed backend: ``cluster.backend``, or for ``auto`` nccl on GPUs and gloo on CPU."""
    backend = cfg.cluster.backend
    if backend == "auto":
        return "nccl" if device == "cuda" else "gloo"
    if backend == "nccl" and device != "cuda":
        raise ConfigError(
            "cluster.backend=nccl needs a GPU per process; this run is on the CPU: set cluster.backend=gloo (or auto)"
        )
    return backend


def _kind(value: Any) -> str | None:
    if value is None:
        return None
    if isinstance(value, bool):
        return "flag"
    if isinstance(value, (int, float)):
        return "number"
    return {list: "list", tuple: "list", dict: "section"}.get(type(value), "text")


_KIND_HINTS = {
    "flag": "use true or false",
    "number": "use a number",
    "list": "use a list, e.g. [1, 2]",
    "section": "it is a section of keys: set its keys (section.key=value)",
    "text": "use a single value, not a list or section",
}


def _fits(value: Any, want: Any) -> bool:
    """``value`` may stand where ``want`` does: null fits anywhere (it means "not set" throughout conf/), a
    number where a number is, and where the reference is null or text (``auto``, a path) any single value."""
    got, need = _kind(value), _kind(want)
    if got is None or need is None:
        return True
    if need == "text":
        return got not in ("list", "section")
    return got == need


def check_types(cfg: Any, references: Sequence[Any], prefix: str = "") -> None:
    """Every value must fit its key's value in at least one reference config that has the key (a number stays a
    number, a flag a flag, a list a list); keys no reference has (``+key=``) are :func:`check_known_keys`'s. Raises
    :class:`ConfigError` naming the first key that does not fit."""
    values, refs = plain_config(cfg), [plain_config(r) for r in references]
    for key, value in values.items():
        wants = [r[key] for r in refs if isinstance(r, Mapping) and key in r]
        name = f"{prefix}{key}"
        if not wants:
            continue
        if isinstance(value, dict) and any(isinstance(w, dict) for w in wants):
            check_types(value, [w for w in wants if isinstance(w, dict)], prefix=f"{name}.")
        elif not any(_fits(value, w) for w in wants):
            want = next(w for w in wants if w is not None)
            default = "" if isinstance(want, dict) else f" (its default: {_show(want)})"
            raise ConfigError(f"{name}={_show(value)}: {_KIND_HINTS[_kind(want)]}{default}")


def check_known_keys(cfg: Any, reference: Any) -> None:
    """Every key must be one that ``reference`` has, the config of the same group choices (task, optimizer,
    cluster, ..., experiment) without the command line's values: struct mode refuses ``train.stepz=3``, but
    ``+train.stepz=3`` adds the key, and nothing would ever read it. Keys that the chosen groups add are in the
    reference; a section it leaves empty (``{}``) takes any key. Raises :class:`ConfigError` naming the key and
    the closest known one."""
    ref = plain_config(reference)
    unknown = _unknown_key(plain_config(cfg), ref, prefix="")
    if unknown is None:
        return
    raise ConfigError(
        f"{no_such_setting(unknown, _dotted_keys(ref))} (a '+key=' override cannot add a setting that no config "
        "file declares)"
    )


def no_such_setting(key: str, known: Iterable[str]) -> str:
    """``train.stepz: no such setting; did you mean train.steps?``: the key and the closest of ``known``. A key
    whose last part is a setting of that name elsewhere (``resume`` -> ``train.resume``) is told that one first."""
    known = sorted(set(known))
    leaf = key.rpartition(".")[2]
    same_name = [k for k in known if k != key and k.rpartition(".")[2] == leaf]
    close = same_name[:1] or difflib.get_close_matches(key, known, n=1)
    if not close and "." not in key:  # a top-level key: the closest setting of a section by its last part
        by_leaf = {k.rpartition(".")[2]: k for k in reversed(known)}
        close = [by_leaf[m] for m in difflib.get_close_matches(key, sorted(by_leaf), n=1)]
    hint = f"did you mean {close[0]}?" if close else "check the spelling (birder-repro --cfg job lists the keys)"
    return f"{key}: no such setting; {hint}"


def no_such_choice(group: str, choice: str, options: Iterable[str]) -> str:
    """``optim=adamz: no such choice; did you mean optim=adamw? the choices: adamw, ...``: a config group's
    option that has no file, the closest one where one is close, and every one."""
    options = sorted(options)
    close = difflib.get_close_matches(choice, options, n=1)
    hint = f"did you mean {group}={close[0]}? " if close else ""
    return f"{group}={choice}: no such choice; {hint}the choices: {', '.join(options)}"


def check_misplaced_sections(cfg: Any, shipped: Any) -> None:
    """A top-level key that no shipped config has, holding sections the shipped ones do (``mine.train.steps``):
    the settings of a ``+mine=fast`` file of the user's whose ``# @package _global_`` is not on its first line
    (Hydra reads the directive only there, and otherwise puts the file under its group's name), where nothing
    reads them. Raises :class:`ConfigError` saying so."""
    values, sections = plain_config(cfg), plain_config(shipped)
    for key, value in values.items():
        if key in sections or not isinstance(value, Mapping):
            continue
        misplaced = sorted(k for k in value if k in sections and isinstance(sections[k], Mapping))
        if misplaced:
            landed = ", ".join(f"{key}.{k}" for k in misplaced)
            raise ConfigError(
                f"{landed}: settings under '{key}.', where nothing reads them: the config file picked as "
                f"+{key}=... needs '# @package _global_' as its first line (Hydra reads the directive only there)"
            )


def _unknown_key(values: Mapping, reference: Mapping, prefix: str) -> str | None:
    """The dotted name of the first key of ``values`` that ``reference`` lacks, or None."""
    if not reference:  # a section the config files leave empty: its keys are the user's
        return None
    for key, value in values.items():
        if key not in reference:
            return f"{prefix}{key}"
        # A section where the reference has a single value or null is check_types' to judge, not this check's.
        if isinstance(value, Mapping) and isinstance(reference[key], Mapping):
            unknown = _unknown_key(value, reference[key], prefix=f"{prefix}{key}.")
            if unknown is not None:
                return unknown
    return None


def dotted_keys(cfg: Any) -> list[str]:
    """Every key of a config (plain or DictConfig, Hydra's node left out) as a dotted path, sections included."""
    return list(_dotted_keys(plain_config(cfg)))


def _dotted_keys(node: Mapping, prefix: str = "") -> Iterator[str]:
    """Every key of a plain config as a dotted path, sections included."""
    for key, value in node.items():
        yield f"{prefix}{key}"
        if isinstance(value, Mapping):
            yield from _dotted_keys(value, f"{prefix}{key}.")


def _show(value: Any) -> str:
    """A value as it would be written on the command line."""
    if value is None or isinstance(value, bool):
        return {None: "null", True: "true", False: "false"}[value]
    return repr(value)


def validate(cfg: DictConfig, references: Sequence[Any] = ()) -> None:
    """Check the values a run needs before anything is started; raise :class:`ConfigError` naming the key.

    ``references``: configs that give each key's type (see :func:`check_types`), the first one of this run's
    group choices, which gives the keys that exist (see :func:`check_known_keys`); without them only the keys
    checked one by one below are. Then the checks of the sections higher layers own, where their table is
    installed (:func:`install_section_checks`; ``import birder_repro.train.checks`` installs it, as the CLI does).
    """
    if references:
        # The first reference has this run's group choices; the others (the task alone) would let keys of
        # other choices through (another optimizer's, say).
        check_misplaced_sections(cfg, references[-1])
        check_known_keys(cfg, references[0])
        check_types(cfg, references)
    _check_positive_int(cfg, "nodes")
    _check_positive_int(cfg, "train.batch_size")
    if cfg.train.get("accumulate") is not None:
        _check_positive_int(cfg, "train.accumulate")
    if cfg.train.get("steps") is not None:
        _check_positive_int(cfg, "train.steps")
    resolve_gpus_per_node(cfg.gpus_per_node, gpu_count=0)  # type check only; auto is always fine
    _check_fp16_nonfinite(cfg)
    check_link(cfg)
    workers = OmegaConf.select(cfg, "data.num_workers", default=None)
    if (
        workers is not None
        and workers != "auto"
        and (isinstance(workers, bool) or not isinstance(workers, int) or workers < 0)
    ):
        raise ConfigError(
            f"data.num_workers={workers!r}: use auto (from the cores of each process) or a whole "
            "number >= 0 (0: load in the training process)"
        )
    for key, allowed in CHOICES.items():
        value = OmegaConf.select(cfg, key, default=None)
        if value is not None and value not in allowed:
            raise ConfigError(f"{key}={value!r} is not one of: {', '.join(allowed)}")
    lr = cfg.optim.lr
    if isinstance(lr, bool) or not isinstance(lr, (int, float)) or not lr > 0:
        raise ConfigError(f"optim.lr={lr!r}: the learning rate must be a number > 0")
    scaling = cfg.optim.get("lr_batch_scaling")
    if scaling is not None and not (isinstance(scaling, (int, float)) and scaling > 0):
        raise ConfigError(f"optim.lr_batch_scaling={scaling!r}: give a reference batch size > 0, or null")
    for _, check in _SECTION_CHECKS:  # the sections higher layers own, in the table's order
        check(cfg)


# (section, check) of the sections that higher layers own; empty until birder_repro.train.checks installs its table.
_SECTION_CHECKS: list[tuple[str, Callable[[DictConfig], None]]] = []


def install_section_checks(checks: Iterable[tuple[str, Callable[[DictConfig], None]]]) -> None:
    """Have :func:`validate` run ``check(cfg)`` for each ``(section, check)``, in this order, after its own
    checks (each raises :class:`ConfigError` naming its key). Replaces any table installed before. The table is
    handed in, not imported, because its checks belong to layers above this one (birder_repro.train.checks)."""
    _SECTION_CHECKS[:] = list(checks)


def section_checks() -> list[str]:
    """The sections whose checks :func:`validate` runs besides its own (empty: no table installed)."""
    return [section for section, _ in _SECTION_CHECKS]


def _check_fp16_nonfinite(cfg: DictConfig) -> None:
    """fp16's loss scaling overflows routinely (GradScaler then skips the step and lowers its scale), and the
    hook turns an overflowing bucket into inf for it: ``nonfinite=raise`` would end the run at the first one."""
    optim = cfg.get("optim") or {}
    comm = optim.get("comm") or {}
    if (cfg.get("train") or {}).get("precision") == "fp16" and comm.get("nonfinite") == "raise":
        raise ConfigError(
            "optim.comm.nonfinite=raise with train.precision=fp16: fp16's loss scale overflows routinely and "
            "GradScaler skips those steps itself; raise would end the run at the first: use nonfinite=skip"
        )


def check_link(cfg: Any) -> None:
    """``cluster.link_mbit``, on every cluster: null (no link given: unshaped on an emulated cluster, the
    cluster's ``perf`` figures in the performance model) or a rate > 0 in Mbit/s. Every cluster reads it: the
    emulated one shapes its links to it, the record and the tables report it, the performance model predicts
    with it."""
    rate = OmegaConf.select(cfg, "cluster.link_mbit", default=None)
    if rate is not None and (isinstance(rate, bool) or not isinstance(rate, (int, float)) or not rate > 0):
        raise ConfigError(f"cluster.link_mbit={_show(rate)}: give a rate > 0 in Mbit/s, or null (no link given)")


def _check_positive_int(cfg: DictConfig, key: str) -> None:
    value = OmegaConf.select(cfg, key)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"{key}={value!r}: use a whole number >= 1")


def resolve(cfg: DictConfig, gpu_count: int | None = None, references: Sequence[Any] = ()) -> DictConfig:
    """A validated copy of ``cfg`` with every interpolation resolved, as the workers will read it.

    ``gpus_per_node`` becomes a number and ``optim.effective_lr`` records the learning rate the optimizer
    gets. The ``hydra`` node, where present, is left out: it is Hydra's, not the run's. ``references``: see
    :func:`validate`.
    """
    validate(cfg, references)
    # Key by key, leaving "hydra" out before resolving: its run-time fields resolve only inside a Hydra job.
    out = OmegaConf.create(
        {
            key: OmegaConf.to_container(cfg[key], resolve=True) if OmegaConf.is_config(cfg[key]) else cfg[key]
            for key in cfg
            if key != "hydra"
        }
    )
    out.gpus_per_node = resolve_gpus_per_node(cfg.gpus_per_node, gpu_count)
    with open_dict(out):
        out.optim.effective_lr = effective_lr(out)
    OmegaConf.set_struct(out, True)
    return out

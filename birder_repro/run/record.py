"""The run directory and its ``record.json``: what every run leaves behind, completed or failed.

A run directory holds ``config.yaml`` (the resolved config the workers read), ``command.txt`` (the command
that reproduces the run), ``output.log`` (what the processes printed) and ``record.json``. The record's keys
are documented once, in :mod:`birder_repro.run.schema`, and a record is checked against them when written; a
failed run has the same keys, with ``status: failed``, the ``error`` and null measurements. This module is
also the one place that knows where runs go (:func:`runs_root`) and reads a record back (:func:`read_record`);
writing one is the run directory's (birder_repro.run.directory.RunDir.write), which alone writes ``record.json``.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import platform
import shlex
import subprocess
import tempfile
import warnings
from collections.abc import Mapping, Sequence
from importlib import metadata
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from birder_repro.config import settings as layout
from birder_repro.config.plain import plain_config
from birder_repro.run import schema
from birder_repro.run.digest import cell_digest

__all__ = [
    "CONFIG_FILE",
    "COMMAND_FILE",
    "RECORD_FILE",
    "LOG_FILE",
    "runs_root",
    "new_run_dir",
    "write_run_files",
    "load_run_config",
    "read_command",
    "format_command",
    "now",
    "versions",
    "accelerator_versions",
    "git_sha",
    "base_record",
    "completed_record",
    "failed_record",
    "diverged_record",
    "interrupted_record",
    "resume_command",
    "read_record",
    "find_records",
    "effective_lr",
    "host_load",
    "atomic_write",
    "json_default",
]

CONFIG_FILE = "config.yaml"
COMMAND_FILE = "command.txt"
RECORD_FILE = "record.json"
LOAD_FILE = "host_load.json"  # the host's load average when the run directory was made (record: host_load)
LOG_FILE = "output.log"
DEFAULT_RUNS = "runs"


def runs_root(given: str | os.PathLike | None = None) -> Path:
    """Where runs go and where reports look: ``given`` (``--runs DIR``), else ``$BIRDER_RUNS``, else ``runs/``
    (the same rule as ``hydra.run.dir`` in conf/config.yaml)."""
    return Path(given or os.environ.get("BIRDER_RUNS") or DEFAULT_RUNS)


def new_run_dir(cfg: DictConfig, root: Path | None = None) -> Path:
    """A fresh, sub-second unique run directory for callers outside a Hydra job (tests, scripts)."""
    stamp = _dt.datetime.now()
    name = f"{stamp:%H-%M-%S-%f}_{cfg.task.name}_{cfg.optim.name}_n{cfg.nodes}"
    path = (root or runs_root()) / f"{stamp:%Y-%m-%d}" / name
    path.mkdir(parents=True, exist_ok=False)  # never reuse another run's directory
    return path


def write_run_files(run_dir: Path, cfg: DictConfig, command: str | None) -> None:
    """Write the resolved config and the command line: all a worker, on any node, needs to start. Every node of
    a multi-node run writes the config (its workers may start before node 0's CLI has written it; the copies
    differ only in ``launcher.node_rank``); ``command=None`` (nodes other than 0) leaves node 0's command."""
    run_dir.mkdir(parents=True, exist_ok=True)
    atomic_write(run_dir / CONFIG_FILE, OmegaConf.to_yaml(cfg))
    if command is not None:
        atomic_write(run_dir / COMMAND_FILE, command + "\n")
        if not (run_dir / LOAD_FILE).exists():  # a resumed run keeps its first start's load
            atomic_write(run_dir / LOAD_FILE, json.dumps(host_load()))


def host_load() -> list[float] | None:
    """os.getloadavg(): the host's 1, 5 and 15 minute load averages; None where the platform has none."""
    try:
        return [round(x, 3) for x in os.getloadavg()]
    except OSError:
        return None


def _host_load(run_dir: Path) -> dict[str, Any] | None:
    """The record's ``host_load``: the load at the run directory's making (``start``, from LOAD_FILE), now
    (``end``) and the host's cpus."""
    try:
        start = json.loads((run_dir / LOAD_FILE).read_text())
    except (OSError, ValueError):
        start = None
    end = host_load()
    if start is None and end is None:
        return None
    return {"start": start, "end": end, "cpus": os.cpu_count()}


def load_run_config(run_dir: Path) -> DictConfig:
    """The resolved config of a run, in struct mode as Hydra gave it (a misspelt key in code is an error)."""
    path = Path(run_dir) / CONFIG_FILE
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing: start runs with birder-repro, which writes it")
    cfg = OmegaConf.load(path)
    OmegaConf.set_struct(cfg, True)
    return cfg


def read_command(run_dir: Path) -> str | None:
    path = Path(run_dir) / COMMAND_FILE
    return path.read_text().strip() if path.is_file() else None


def format_command(args: Sequence[str]) -> str:
    """A command line a shell runs as it was given (arguments quoted where needed)."""
    return shlex.join(list(args))


def now() -> str:
    """A local timestamp with its UTC offset, to the second."""
    return _dt.datetime.now().astimezone().isoformat(timespec="seconds")


def versions() -> dict[str, str | None]:
    """Python and the versions of the packages a result depends on (None where one is not installed)."""
    out: dict[str, str | None] = {"python": platform.python_version()}
    for package in ("torch", "torchvision", "birder-repro", "hydra-core", "omegaconf", "numpy", "wandb"):
        try:
            out[package.replace("-", "_")] = metadata.version(package)
        except metadata.PackageNotFoundError:
            out[package.replace("-", "_")] = None
    return out


def accelerator_versions(device_type: str) -> dict[str, str | None]:
    """CUDA (torch's build), NCCL and Triton where the run is on a GPU (None where one is absent); on the CPU,
    Triton alone (its interpreter runs the GPU kernels in tests). For the worker's start line and record."""
    import torch

    out: dict[str, str | None] = {"triton": None}
    try:
        out["triton"] = metadata.version("triton")
    except metadata.PackageNotFoundError:
        pass
    if device_type == "cuda":
        out["cuda"] = torch.version.cuda
        try:
            nccl = torch.cuda.nccl.version()
            out["nccl"] = ".".join(map(str, nccl)) if isinstance(nccl, tuple) else str(nccl)
        except (AttributeError, RuntimeError):
            out["nccl"] = None
    return out


def git_sha() -> str | None:
    """The commit of the checkout this package runs from, or None where it is not a git checkout."""
    repo = Path(__file__).resolve().parent.parent
    try:
        out = subprocess.run(
            ["git", "-C", str(repo), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10, check=False
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def base_record(cfg: DictConfig, run_dir: Path) -> dict[str, Any]:
    """Every key of the schema, those the config and the environment give filled in; measurements are null.

    The run's own figures (global batch, steps) replace these in a completed record; a failed run keeps what
    the config says.
    """
    record = schema.empty_record()
    record.update(
        {
            "task": cfg.task.name,
            "optim": cfg.optim.name,
            "cluster": _cluster(cfg),
            "world_size": _try(lambda: layout.world_size(cfg)),
            "parallel": str(OmegaConf.select(cfg, "parallel", default="ddp")),
            "batch_size": cfg.train.batch_size,
            "global_batch_size": _try(lambda: layout.global_batch(cfg)),
            "accumulate": OmegaConf.select(cfg, "train.accumulate", default=1),
            "lr": _try(lambda: effective_lr(cfg)),
            "versions": versions(),
            "git_sha": git_sha(),
            "precision": str(OmegaConf.select(cfg, "train.precision", default="fp32")),
            "run_dir": str(run_dir),
            "command": read_command(run_dir),
            "config": plain_config(cfg, lenient=True),
            "config_digest": _try(lambda: cell_digest(cfg)),
            "host_load": _host_load(Path(run_dir)),
        }
    )
    return record


def effective_lr(cfg: DictConfig) -> float:
    """The learning rate the optimizer gets: ``optim.effective_lr`` as ``config.resolve`` recorded it in the
    run's config; for a config that did not go through it, ``config.effective_lr`` (the one formula)."""
    recorded = OmegaConf.select(cfg, "optim.effective_lr", default=None)
    return float(recorded) if recorded is not None else layout.effective_lr(cfg)


def _cluster(cfg: DictConfig) -> dict[str, Any]:
    return {
        "name": cfg.cluster.name,
        "nodes": cfg.nodes,
        "gpus_per_node": _try(lambda: layout.resolve_gpus_per_node(cfg.gpus_per_node)),
        "interconnect": cfg.cluster.get("interconnect"),
        "link_mbit": cfg.cluster.get("link_mbit"),
    }


def completed_record(cfg: DictConfig, run_dir: Path, result: Mapping[str, Any], **fields: Any) -> dict[str, Any]:
    """The record of a run that finished: the training loop's ``result`` merged over the base keys.

    ``fields`` adds what the worker knows (``started``, ``ended``, ``device``, ``backend``).
    """
    record = base_record(cfg, run_dir)
    record.update({key: value for key, value in result.items()})
    record.update(fields)
    record["status"] = "completed"
    return record


def failed_record(cfg: DictConfig, run_dir: Path, error: str, **fields: Any) -> dict[str, Any]:
    record = base_record(cfg, run_dir)
    record.update(fields)
    record.update({"status": "failed", "error": error})
    record["ended"] = record.get("ended") or now()
    return record


def diverged_record(cfg: DictConfig, run_dir: Path, step: int, line: str, **fields: Any) -> dict[str, Any]:
    """The record of a run stopped as diverged (birder_repro.train.divergence): its step and one-line cause;
    its measurements stay null, so that no table shows a number for it."""
    record = base_record(cfg, run_dir)
    record.update(fields)
    record.update({"status": "diverged", "error": line, "diverged_at_step": int(step)})
    record["ended"] = record.get("ended") or now()
    return record


def interrupted_record(
    cfg: DictConfig, run_dir: Path, step: int | None, signal: str, checkpoint: Path | None, **fields: Any
) -> dict[str, Any]:
    """The record of a run a signal stopped (birder_repro.train.stop): the last step its workers completed, its
    newest complete checkpoint and the command that resumes it; its measurements stay null."""
    record = base_record(cfg, run_dir)
    record.update(fields)
    command = resume_command(run_dir)
    when = "before its first step" if not step else f"after step {step}"
    kept = f"checkpoint {checkpoint}" if checkpoint else "no checkpoint (it will start afresh)"
    record.update(
        {
            "status": "interrupted",
            "stopped_at_step": step,
            "checkpoint": str(checkpoint) if checkpoint else None,
            "resume_command": command,
            "error": f"interrupted by {signal} {when}; {kept}; resume: {command}",
        }
    )
    record["ended"] = record.get("ended") or now()
    return record


def resume_command(run_dir: Path, command: str | None = None) -> str:
    """The command that continues the run in its own directory: its command line and ``hydra.run.dir`` (a run
    directory holding an interrupted or failed run with a checkpoint resumes; birder_repro.run.directory).
    ``command``: another command line than the run's recorded one (a node's own CLI, birder_repro.run.finish)."""
    command = command or read_command(run_dir) or "birder-repro"
    return f"{command} {shlex.quote(f'hydra.run.dir={Path(run_dir).resolve()}')}"


def read_record(run_dir: Path) -> dict[str, Any] | None:
    """The record of ``run_dir``; None where it has none, or (with a warning naming the file) where it cannot
    be read as a JSON object: a run killed while writing leaves a truncated file, which must not stop a
    report of every other run."""
    path = Path(run_dir) / RECORD_FILE
    if not path.is_file():
        return None
    try:
        record = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        warnings.warn(f"skipping unreadable run record {path}: {err}", stacklevel=2)
        return None
    if not isinstance(record, dict):
        warnings.warn(f"skipping run record {path}: not a JSON object", stacklevel=2)
        return None
    return record


def find_records(root: Path) -> list[Path]:
    """Every ``record.json`` under ``root``, at any depth (single runs and multirun sweeps alike)."""
    root = Path(root)
    return sorted(root.rglob(RECORD_FILE)) if root.is_dir() else []


def atomic_write(path: Path, text: str) -> None:
    # A temporary file in the same directory, then rename: os.replace is atomic within one file system.
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        os.fchmod(fd, 0o666 & ~_umask())  # mkstemp makes it private; a record is for everyone who reads runs/
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _umask() -> int:
    mask = os.umask(0)  # the only way to read it is to set it; put it straight back
    os.umask(mask)
    return mask


def _try(compute) -> Any:
    """A derived value, or None when the config cannot give it (a failed run's record is written anyway)."""
    try:
        return compute()
    except Exception:  # noqa: BLE001
        return None


def json_default(value: Any) -> Any:
    if hasattr(value, "item"):  # numpy and torch scalars
        return value.item()
    if isinstance(value, Path):
        return str(value)
    if OmegaConf.is_config(value):
        return OmegaConf.to_container(value, resolve=True)
    raise TypeError(f"record value of type {type(value).__name__} is not JSON serializable")

"""``launcher=local``: the whole layout as processes on this machine.

One ``torchrun --standalone`` starts nodes x gpus_per_node workers; the workers form the nodes by rank
grouping (node = rank // gpus_per_node, birder_repro.comm.topology), so a 2 x 2 layout runs as 4 local
processes whose intra- and inter-node groups are the ones a real cluster would have.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from omegaconf import DictConfig

from birder_repro.config import settings as layout
from birder_repro.launch.process import Command
from birder_repro.launch.torchrun import max_restarts, stop_timeout, torchrun_argv

__all__ = ["LocalLayoutTooLarge", "max_local_processes", "check_fits_this_machine", "omp_threads", "command"]


class LocalLayoutTooLarge(layout.ConfigError):
    """The layout needs more processes than this machine can sensibly run."""


def max_local_processes(cfg: DictConfig) -> int:
    """``launcher.max_local_processes``, or 4 processes per CPU core (past that, start-up and memory dominate)."""
    value = cfg.launcher.get("max_local_processes")
    return int(value) if value is not None else 4 * layout.cpu_count()


def check_fits_this_machine(cfg: DictConfig) -> None:
    """Refuse a layout whose processes, all on this machine, far outnumber its cores; say what to do. A dry run
    starts nothing, so it prints the command of any layout (its note says when this machine is too small)."""
    world, limit = layout.world_size(cfg), max_local_processes(cfg)
    if world <= limit or cfg.get("dry_run"):
        return
    raise LocalLayoutTooLarge(
        f"nodes={cfg.nodes} x gpus_per_node={cfg.gpus_per_node} needs {world} processes; launcher=local runs "
        f"at most {limit} on this machine ({layout.cpu_count()} CPU cores; launcher.max_local_processes). "
        "Run a smaller layout here (for example nodes=2 gpus_per_node=1), or run it on a cluster with "
        "launcher=torchrun (one command per node; add dry_run=true to print them), or raise "
        "launcher.max_local_processes if this machine can take it."
    )


def omp_threads(local_processes: int, env: Mapping[str, str]) -> str | None:
    """OMP_NUM_THREADS for CPU workers: the cores shared out (at least 1), unless the user has set it.

    torchrun would otherwise set 1 for every worker, leaving cores idle when there are fewer processes
    than cores; more threads than cores in total only makes the processes fight.
    """
    if env.get("OMP_NUM_THREADS"):
        return None
    return str(max(1, layout.cpu_count() // local_processes))


def command(cfg: DictConfig, run_dir: Path, env: Mapping[str, str] = os.environ) -> Command:
    """The one torchrun command that starts every worker of the layout on this machine."""
    check_fits_this_machine(cfg)
    world = layout.world_size(cfg)
    argv = torchrun_argv(Path(run_dir).resolve(), world, restarts=max_restarts(cfg), shutdown_timeout=stop_timeout(cfg))
    extra = {}
    if _device(cfg, world) == "cpu":
        threads = omp_threads(world, env)
        if threads is not None:
            extra["OMP_NUM_THREADS"] = threads
    note = f"nodes={cfg.nodes} x gpus_per_node={cfg.gpus_per_node} as {world} processes on this machine"
    if world > max_local_processes(cfg):  # only a dry run gets here (check_fits_this_machine)
        note += (
            f"; more than launcher=local runs here (launcher.max_local_processes={max_local_processes(cfg)}): "
            "on a cluster, launcher=torchrun prints one command per node"
        )
    return Command(argv=argv, env=extra, note=note)


def _device(cfg: DictConfig, world: int) -> str:
    """The workers' device; in a dry run, cuda where this machine has too few GPUs for the layout (it prints
    the command of any layout, and the machine it is meant for has them)."""
    try:
        return layout.resolve_device(cfg, local_processes=world)
    except layout.ConfigError:
        if not cfg.get("dry_run"):
            raise
        return "cuda"

"""Launchers: start the workers of a run whose directory holds the resolved config.

``launch(cfg, run_dir)`` picks the launcher (``launcher.name``; ``auto`` is torchrun inside a multi-node SLURM
allocation, local elsewhere), prints the command(s) when ``dry_run`` is set and starts nothing, or runs this
machine's command with its output streamed into ``output.log`` and returns its exit code. ``cluster=emulated``
(network namespaces on this machine, ``emulated.py``) and ``launcher=slurm`` (a batch job, ``slurm.py``) start or
submit the whole layout themselves.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from pathlib import Path

from omegaconf import DictConfig

from birder_repro.launch import emulated, emulated_nodes, local, slurm, slurm_env, torchrun
from birder_repro.launch.process import Command, run_streaming
from birder_repro.run import record

__all__ = ["choose_launcher", "check", "plan", "launch", "format_dry_run", "Command"]


def choose_launcher(cfg: DictConfig, env: Mapping[str, str] = os.environ) -> str:
    """``launcher.name``; for ``auto``: torchrun (this node's share) when SLURM gave this job step more than
    one node, local otherwise (on a single SLURM node the whole layout fits as local processes)."""
    name = cfg.launcher.name
    if emulated.is_emulated(cfg):
        if emulated_nodes.node_index(env) is not None:  # one node's CLI, which the emulated cluster started in it
            return "torchrun"
        emulated.check_launcher(cfg)  # the emulated cluster starts its own nodes; it needs launcher=auto
        return "emulated"
    if name != "auto":
        return name
    return "torchrun" if slurm_env.allocation_nodes(env) > 1 else "local"


def check(cfg: DictConfig, env: Mapping[str, str] = os.environ) -> None:
    """The chosen launcher's refusals (:class:`ConfigError`), without starting anything: the CLI checks them,
    then the data, then launches (which checks them again, cheaply)."""
    name = choose_launcher(cfg, env)
    if name == "local":
        local.check_fits_this_machine(cfg)
    elif name == "torchrun":
        torchrun.check_slurm_layout(cfg, env)
        torchrun.node_rank(cfg, env)
    elif name == "emulated":
        emulated.check_config(cfg)
    elif name == "slurm":
        slurm.check_config(cfg)


def plan(cfg: DictConfig, run_dir: Path, env: Mapping[str, str] = os.environ) -> tuple[str, list[Command], int]:
    """(launcher, every command of the layout, index of the one this machine runs); local and torchrun only."""
    name = choose_launcher(cfg, env)
    if name not in ("local", "torchrun"):
        raise ValueError(f"plan() covers launcher=local and torchrun; {name} launches through launch()")
    if name == "local":
        return name, [local.command(cfg, run_dir, env)], 0
    torchrun.check_slurm_layout(cfg, env)
    return name, torchrun.commands(cfg, run_dir, env), torchrun.node_rank(cfg, env)


def format_dry_run(cfg: DictConfig, run_dir: Path, name: str, commands: list[Command]) -> str:
    """What a dry run prints: a header, then one shell line per command."""
    head = [
        f"# dry run (launcher={name}): {cfg.nodes} nodes x {cfg.gpus_per_node} processes per node; "
        f"nothing was started. Run directory with the resolved config: {Path(run_dir).resolve()}"
    ]
    if name == "torchrun":
        head.append(
            "# run each line on its node (same rendezvous endpoint and id on all); with the c10d "
            "rendezvous the lines are the same and torchrun numbers the nodes as they join"
        )
        if int(cfg.nodes) > 1 and torchrun.master_addr(cfg) == torchrun.DEFAULT_ADDR:
            head.append(
                f"# the rendezvous is at {torchrun.DEFAULT_ADDR}: on a real cluster set "
                "launcher.master_addr=<node 0's address> (SLURM's first node is used inside SLURM)"
            )
    return "\n".join(head + [c.shell() for c in commands])


def launch(cfg: DictConfig, run_dir: Path, env: Mapping[str, str] = os.environ) -> int:
    """Start this machine's workers (or, with ``dry_run``, print every command); return the exit code."""
    # These two start (emulated: every node, in namespaces) or submit (slurm: a batch job) the whole layout
    # themselves, and print their own dry run.
    own = {"emulated": emulated.launch, "slurm": slurm.launch}.get(choose_launcher(cfg, env))
    if own is not None:
        return own(cfg, run_dir, env)
    name, commands, mine = plan(cfg, run_dir, env)
    if name == "torchrun" and mine == 0 and slurm_env.in_allocation(env) and slurm.cluster_warning(cfg):
        print(f"[birder-repro] {slurm.cluster_warning(cfg)}", file=sys.stderr, flush=True)
    if cfg.dry_run:
        print(format_dry_run(cfg, run_dir, name, commands), flush=True)
        return 0
    command = commands[mine]
    if name == "torchrun" and int(cfg.nodes) > 1:
        endpoint = f"{torchrun.master_addr(cfg, env)}:{cfg.launcher.master_port}"
        print(
            f"[birder-repro] node {mine} of {cfg.nodes}: the other nodes must start at the same rendezvous "
            f"({endpoint}); inside SLURM: srun --ntasks-per-node=1 birder-repro ...",
            flush=True,
        )
    print(f"[birder-repro] {command.shell()}", flush=True)
    log = torchrun.log_name(cfg, env) if name == "torchrun" else record.LOG_FILE  # one file per node
    return run_streaming(command, Path(run_dir) / log, stop_timeout_s=torchrun.stop_timeout(cfg))

"""``launcher=torchrun``: this node's share of a multi-node layout, one torchrun per node.

Every node runs ``torchrun --nnodes=N --nproc-per-node=M`` with the same rendezvous (endpoint and id), and
its workers write into the same run directory, ``$BIRDER_RUNS/<rendezvous id>`` (or the ``hydra.run.dir`` given
on every node), which must be on a file system every node shares (the workers check it at start:
birder_repro.train.shared_dir). Each node's CLI keeps its torchrun's output in its own log file there
(:func:`log_name`).

How ranks come out (torch/distributed/run.py and elastic/agent/server/api.py, torch 2.14): with the ``c10d``
rendezvous, ``--node-rank`` is ignored (torchrun warns so); the rendezvous numbers the nodes ("group rank")
in its own order, and each node's agent gives its M workers the contiguous global ranks
group_rank x M + local_rank. So rank // gpus_per_node is always the node a worker runs on, as the topology
assumes, though node 0 need not be the host listed first. With ``launcher.rdzv_backend=static`` the group
rank is ``--node-rank`` itself; then each node must be given its own rank (``launcher.node_rank`` or
``SLURM_NODEID``), and the commands differ by it.

:func:`torchrun_argv` is the one place a torchrun command line is put together: every launcher (local, this
one, the emulated cluster, the SLURM batch script) builds its command with it.
"""

from __future__ import annotations

import importlib.metadata
import os
import re
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from omegaconf import DictConfig

from birder_repro.config import settings as layout
from birder_repro.launch import slurm_env
from birder_repro.launch.process import Command
from birder_repro.run.digest import run_digest

__all__ = [
    "Rendezvous",
    "torchrun_argv",
    "torchrun_has_option",
    "max_restarts",
    "node_rank",
    "master_addr",
    "rdzv_id",
    "log_name",
    "stop_timeout",
    "check_slurm_layout",
    "node_command",
    "commands",
]

WORKER = ["-m", "birder_repro.train.worker"]
DEFAULT_ADDR = "127.0.0.1"
TORCHRUN_STOP_GRACE_S = 30  # torch elastic's grace for workers after a signal (elastic/multiprocessing/api.py)


@dataclass(frozen=True)
class Rendezvous:
    """Where the nodes' torchrun agents meet: the same on every node (``endpoint`` is host:port)."""

    backend: str
    endpoint: str
    id: str


# The first torch whose torchrun takes --shutdown-timeout. pytorch/pytorch pull request 172596 ("Makes worker
# shutdown timeout configurable in torchrun") was merged in March 2026, after torch 2.11 was branched: 2.11's
# torchrun refuses the option (seen on a GPU run), 2.14.1's has it. 2.12 is the first release that can carry it;
# its own run.py was not read here, so this is the rule the known versions support, not a pinned fact (a 2.12
# nightly from before the merge would lack it).
SHUTDOWN_TIMEOUT_SINCE = (2, 12)
TORCHRUN_OPTIONS_SINCE = {"--shutdown-timeout": SHUTDOWN_TIMEOUT_SINCE}


def torch_version() -> tuple[int, int] | None:
    """The installed torch's (major, minor), read from its distribution's metadata without importing torch (a dry
    run and a config check import no torch); None where torch is not installed."""
    try:
        version = importlib.metadata.version("torch")
    except importlib.metadata.PackageNotFoundError:
        return None
    return release_of(version)


def release_of(version: str) -> tuple[int, int]:
    """``"2.14.1+cu128"`` -> (2, 14): a version string's major and minor numbers."""
    found = re.match(r"(\d+)\.(\d+)", version)
    if found is None:
        raise ValueError(f"birder-repro: cannot read a torch version from {version!r}")
    return int(found[1]), int(found[2])


@cache
def torchrun_has_option(option: str) -> bool:
    """Whether this torch's torchrun takes ``option`` (one of :data:`TORCHRUN_OPTIONS_SINCE`), decided by the
    installed torch's version: torch 2.11's torchrun stops with "unrecognized arguments" on
    ``--shutdown-timeout``."""
    if option not in TORCHRUN_OPTIONS_SINCE:
        raise ValueError(f"birder-repro: no known first torch version for torchrun's {option}")
    version = torch_version()
    return version is not None and version >= TORCHRUN_OPTIONS_SINCE[option]


def shutdown_timeout_option(seconds: int) -> list[str]:
    """``--shutdown-timeout=<seconds>`` where torchrun has it. An older torchrun gives its workers a fixed 30 s
    after a signal: then a different ``train.stop_timeout_s`` cannot be honoured, and this says so once."""
    if torchrun_has_option("--shutdown-timeout"):
        return [f"--shutdown-timeout={seconds}"]
    if seconds != TORCHRUN_STOP_GRACE_S:
        _say_once(
            f"birder-repro: this torch's torchrun has no --shutdown-timeout: its workers get its fixed "
            f"{TORCHRUN_STOP_GRACE_S} s to stop after a signal, not train.stop_timeout_s={seconds}"
        )
    return []


@cache
def _say_once(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def max_restarts(cfg: DictConfig) -> int:
    """``train.max_restarts``: how often torchrun may restart the workers after a failure (0: never)."""
    return int(cfg.get("train", {}).get("max_restarts") or 0)


def torchrun_argv(
    run_dir: str,
    nproc_per_node: object,
    rendezvous: Rendezvous | None = None,
    nnodes: object = 1,
    extra: Sequence[str] = (),
    python: str = sys.executable,
    restarts: int = 0,
    shutdown_timeout: int | None = None,
) -> list[str]:
    """``python -m torch.distributed.run ... -m birder_repro.train.worker --run-dir RUN_DIR``.

    Without ``rendezvous`` the command runs the whole layout on one machine (``--standalone``); with it, it is
    one of ``nnodes`` nodes meeting there. ``extra`` holds the torchrun options a launcher adds (``--node-rank``,
    ``--local-addr``, ``--rdzv-conf``). Values are taken as given, so that the SLURM script can pass shell
    variables (``$SLURM_NNODES``) and quote them itself. ``restarts`` (``train.max_restarts``): torchrun's
    ``--max-restarts``, after which every worker is started again and resumes from the run directory's newest
    complete checkpoint (birder_repro.train.restarts). ``shutdown_timeout``: torchrun's grace for its workers
    to stop after a signal (:func:`stop_timeout`).
    """
    argv = [python, "-m", "torch.distributed.run"]
    if rendezvous is None:
        argv.append("--standalone")
    argv += [f"--nnodes={nnodes}", f"--nproc-per-node={nproc_per_node}"]
    if restarts:
        argv.append(f"--max-restarts={restarts}")
    if shutdown_timeout is not None:
        argv += shutdown_timeout_option(shutdown_timeout)
    if rendezvous is not None:
        argv += [
            f"--rdzv-backend={rendezvous.backend}",
            f"--rdzv-endpoint={rendezvous.endpoint}",
            f"--rdzv-id={rendezvous.id}",
        ]
    return argv + [*extra, *WORKER, "--run-dir", str(run_dir)]


def node_rank(cfg: DictConfig, env: Mapping[str, str] = os.environ) -> int:
    """This node's rank: ``launcher.node_rank``, else SLURM's node id, else 0."""
    value = cfg.launcher.get("node_rank")
    rank = int(value) if value is not None else slurm_env.node_id(env) or 0
    if not 0 <= rank < int(cfg.nodes):
        raise layout.ConfigError(
            f"launcher.node_rank={rank} is outside the layout's nodes 0..{cfg.nodes - 1}: "
            "set launcher.node_rank (or nodes) so that it is"
        )
    return rank


def master_addr(cfg: DictConfig, env: Mapping[str, str] = os.environ) -> str:
    """Node 0's address: ``launcher.master_addr``, else MASTER_ADDR, else SLURM's first node, else 127.0.0.1."""
    return cfg.launcher.get("master_addr") or env.get("MASTER_ADDR") or slurm_env.first_host(env) or DEFAULT_ADDR


def rdzv_id(cfg: DictConfig, env: Mapping[str, str] = os.environ) -> str:
    """The rendezvous id, which must be the same on every node, and which names the run directory.

    ``launcher.rdzv_id``, else the SLURM job (and step), which every node of the job shares, else a name made
    of the layout and a digest of the config less the per-node settings (birder_repro.run.digest.run_digest): every
    node composes the same config, so every node derives the same id and run directory, and two different
    configs never share one. Two jobs cannot meet by mistake: each rendezvous lives in the store its own
    node 0 serves on the endpoint's port.
    """
    if cfg.launcher.get("rdzv_id"):
        return str(cfg.launcher.rdzv_id)
    if slurm_env.in_allocation(env):
        step = env.get("SLURM_STEP_ID")
        return f"slurm-{env['SLURM_JOB_ID']}" + (f".{step}" if step else "")

    return f"birder-{cfg.task.name}-{cfg.optim.name}-{cfg.nodes}x{cfg.gpus_per_node}-{run_digest(cfg)[:8]}"


def log_name(cfg: DictConfig, env: Mapping[str, str] = os.environ) -> str:
    """This node's copy of its torchrun's output in the shared run directory: ``output.log`` on node 0 (the
    one the failure report reads), ``output.node<k>.log`` on node k (appends from several machines to one
    file are not safe on network file systems)."""
    rank = node_rank(cfg, env)
    return "output.log" if rank == 0 else f"output.node{rank}.log"


def stop_timeout(cfg: DictConfig) -> int:
    """``train.stop_timeout_s``: seconds torchrun gives its workers to stop after SIGINT / SIGTERM (to finish
    the step, save a checkpoint and write the record) before it SIGKILLs them (torchrun --shutdown-timeout;
    torch's default, 30 s, elastic/multiprocessing/api.py)."""
    return int(cfg.get("train", {}).get("stop_timeout_s") or TORCHRUN_STOP_GRACE_S)


def check_slurm_layout(cfg: DictConfig, env: Mapping[str, str] = os.environ) -> None:
    """Inside a SLURM step, the layout's node count must be the step's: otherwise the rendezvous waits forever."""
    nodes = slurm_env.allocation_nodes(env)
    if nodes and nodes != int(cfg.nodes):
        raise layout.ConfigError(
            f"nodes={cfg.nodes} but this SLURM job step runs on {nodes} nodes: set nodes={nodes}, or start the "
            f"step on {cfg.nodes} nodes (srun --nodes={cfg.nodes} --ntasks-per-node=1 birder-repro ...)"
        )


def node_command(cfg: DictConfig, run_dir: Path, rank: int, env: Mapping[str, str] = os.environ) -> Command:
    """The torchrun command node ``rank`` runs."""
    backend = cfg.launcher.get("rdzv_backend", "c10d")
    meet = Rendezvous(backend, f"{master_addr(cfg, env)}:{cfg.launcher.master_port}", rdzv_id(cfg, env))
    # static is the only rendezvous that reads --node-rank (see the module docstring)
    extra = [f"--node-rank={rank}"] if backend == "static" else []
    argv = torchrun_argv(
        Path(run_dir).resolve(),
        cfg.gpus_per_node,
        meet,
        nnodes=cfg.nodes,
        extra=extra,
        restarts=max_restarts(cfg),
        shutdown_timeout=stop_timeout(cfg),
    )
    return Command(argv=argv, note=f"node {rank} of {cfg.nodes}")


def commands(cfg: DictConfig, run_dir: Path, env: Mapping[str, str] = os.environ) -> list[Command]:
    """One command per node, node ranks 0..nodes-1 (what a dry run prints)."""
    return [node_command(cfg, run_dir, k, env) for k in range(int(cfg.nodes))]

"""``cluster=emulated``: what each node runs: the birder-repro CLI with the run's overrides, as one node's share.

Started in the node's namespace with ``ip netns exec``, under ``taskset`` on the node's own block of cores, with
what a real node would not need in its environment (birder_repro.launch.emulated's docstring); the dry run's lines.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from omegaconf import DictConfig

from birder_repro.config import settings as layout
from birder_repro.launch import local
from birder_repro.launch.process import Command
from birder_repro.netns import plan
from birder_repro.run import record
from birder_repro.train.probes import LINK_IFACE_ENV  # the interface whose counters a node's local rank 0 reads

__all__ = ["NODE_ENV", "node_cores", "pin_prefix", "node_command", "node_index", "commands", "format_dry_run"]

NODE_ENV = "BIRDER_EMULATED_NODE"  # set for each node's CLI: k, the node it runs as (it builds no fabric)


def node_cores(nodes: int, cores: Sequence[int], per: int | None = None) -> list[list[int]]:
    """The machine's ``cores`` dealt out to ``nodes`` nodes in contiguous blocks: node k gets
    cores[k*c:(k+1)*c], c = ``per`` (``cluster.cores_per_node``) or else len(cores) // nodes; [] for every node
    when there are fewer cores than nodes. A ``per`` the machine cannot give every node is a ConfigError."""
    if per is not None and (per < 1 or per * nodes > len(cores)):
        raise layout.ConfigError(
            f"cluster.cores_per_node={per} on {nodes} node(s) needs {per * nodes} cores; this process may run on "
            f"{len(cores)}: lower it, or null for the cores shared out ({len(cores)} // {nodes})"
        )
    per = per if per is not None else len(cores) // max(nodes, 1)
    if per == 0:
        return [[] for _ in range(nodes)]
    return [list(cores[k * per : (k + 1) * per]) for k in range(nodes)]


def pin_prefix(cfg: DictConfig, k: int) -> list[str]:
    """``taskset -c <node k's cores>`` when ``cluster.pin_cores`` (a real node's cores are its own: unpinned,
    one node's communication thread would run on another node's core and slow its compute), else []."""
    if not cfg.cluster.get("pin_cores", False) or shutil.which("taskset") is None:  # taskset: util-linux
        return []
    per = cfg.cluster.get("cores_per_node")
    cores = node_cores(int(cfg.nodes), sorted(os.sched_getaffinity(0)), None if per is None else int(per))[k]
    return ["taskset", "-c", ",".join(map(str, cores))] if cores else []


def node_overrides(run_dir: Path) -> list[str]:
    """The user's overrides of this run (its ``command.txt``, as the CLI wrote it), which every node's CLI is
    started with, as a user starts the same command on every node of a real cluster."""
    command = record.read_command(run_dir)
    words = shlex.split(command, comments=True) if command else []
    if not words or "#" in command:
        raise layout.ConfigError(
            f"cluster=emulated starts `birder-repro <overrides>` on every node, but this run's "
            f"overrides are unknown ({run_dir / record.COMMAND_FILE}: {command!r}): start it "
            "with the birder-repro command"
        )
    # a dry run starts no node: the lines it prints are what the nodes would run
    return [w for w in words[1:] if not w.startswith("dry_run=")]


def node_command(
    cfg: DictConfig, run_dir: Path, fabric: plan.Fabric, k: int, env: Mapping[str, str] = os.environ
) -> Command:
    """What node ``k`` runs, inside its namespace: the birder-repro CLI with the run's overrides, as one node's
    share (``launcher=torchrun``, its node rank, node 0's address, the one run directory), bound to its veth.

    What a real node would not need goes in the environment: :data:`NODE_ENV` (the CLI is one node's: it
    builds no fabric), and the two torchrun options as torchrun reads them from ``PET_*`` variables
    (``--local-addr``; with c10d ``--rdzv-conf=is_host``, see the module doc).
    """
    node, run_dir = fabric.nodes[k], Path(run_dir).resolve()
    backend = cfg.launcher.get("rdzv_backend") or "c10d"
    argv = [
        "ip",
        "netns",
        "exec",
        node.netns,
        *pin_prefix(cfg, k),
        sys.executable,
        "-m",
        "birder_repro.cli",
        *node_overrides(run_dir),
        "launcher=torchrun",
        f"launcher.node_rank={k}",
        f"launcher.master_addr={fabric.nodes[0].address}",
        f"launcher.rdzv_id={cfg.launcher.get('rdzv_id') or f'emulated-{fabric.run_id}'}",
        f"hydra.run.dir={_hydra_value(str(run_dir))}",
        "hydra.output_subdir=null",
    ]
    extra = {
        NODE_ENV: str(k),
        "PET_LOCAL_ADDR": node.address,
        "GLOO_SOCKET_IFNAME": node.node_veth,
        LINK_IFACE_ENV: node.node_veth,
        "CUDA_VISIBLE_DEVICES": "",
    }  # device=auto resolves to the CPU in every node (check_config)
    if backend == "c10d":
        extra["PET_RDZV_CONF"] = f"is_host={int(k == 0)}"
    threads = local.omp_threads(layout.world_size(cfg), env)  # every node shares this machine's cores
    if threads is not None:
        extra["OMP_NUM_THREADS"] = threads
    if env.get("SLURM_JOB_ID"):  # inside a SLURM allocation: the node's CLI must not take the job's layout for its own
        extra["SLURM_JOB_ID"] = ""
    return Command(argv=argv, env=extra, note=f"node {k} of {cfg.nodes}, namespace {node.netns} ({node.address})")


def node_index(env: Mapping[str, str] = os.environ) -> int | None:
    """Which node of an emulated cluster this CLI runs as (:data:`NODE_ENV`), or None for the one that builds it."""
    value = env.get(NODE_ENV, "")
    return int(value) if value.isdigit() else None


def _hydra_value(text: str) -> str:
    """A value for a Hydra override, quoted where its grammar would read characters of it otherwise."""
    if re.fullmatch(r"[\w./-]+", text):
        return text
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def commands(cfg: DictConfig, run_dir: Path, fabric: plan.Fabric, env: Mapping[str, str] = os.environ) -> list[Command]:
    return [node_command(cfg, run_dir, fabric, k, env) for k in range(int(cfg.nodes))]


def format_dry_run(cfg: DictConfig, run_dir: Path, fabric: plan.Fabric, cmds: Sequence[Command]) -> str:
    """The fabric's setup, one line per node (all run at once), and the teardown, as a root shell would."""
    tbf = " ".join(fabric.shaping.tbf()) or "unshaped"
    lines = [
        f"# dry run (cluster=emulated): {cfg.nodes} nodes x {cfg.gpus_per_node} processes per node, "
        f"each node a network namespace; links: {tbf}; nothing was started.",
        f"# Run directory with the resolved config: {Path(run_dir).resolve()}",
        "# 1. the fabric (as root), and /etc/netns/<namespace>/hosts naming every node in each namespace:",
    ]
    lines += [" ".join(c) for c in plan.setup_commands(fabric)]
    lines.append("# 2. one birder-repro CLI per node (it starts the node's torchrun), all at once:")
    lines += [f"{Command(c.argv, c.env).shell()} &  # {c.note}" for c in cmds]
    lines.append("wait")
    lines.append("# 3. removal (also on failure or interruption):")
    lines += [" ".join(c) for c in plan.teardown_commands(fabric)]
    return "\n".join(lines)

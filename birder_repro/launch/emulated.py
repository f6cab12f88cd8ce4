"""``cluster=emulated``: a multi-node cluster on this machine, one network namespace per node.

    birder-repro cluster=emulated nodes=4 cluster.link_mbit=200 ...      # needs root and iproute2
    birder-repro cluster=emulated nodes=4 dry_run=true                   # prints the ip/tc commands and the nodes'

The fabric (birder_repro.netns) gives every node a namespace with its own loopback and one veth to a
bridge, shaped by ``tc ... tbf`` to ``cluster.link_mbit`` in both directions. Each node runs what a user runs
on every node of a real cluster: the birder-repro CLI with the run's own overrides, as one node's share
(``launcher=torchrun launcher.node_rank=k launcher.master_addr=<node 0's address>``, the one run directory as
``hydra.run.dir``), started with ``ip netns exec``; that CLI starts the node's torchrun, as on a cluster.
gloo binds to the node's veth (``GLOO_SOCKET_IFNAME``), so every byte between nodes crosses a shaped link and
intra-node traffic stays on the node's loopback.

What a real node does not need goes in the node CLI's environment: ``BIRDER_EMULATED_NODE`` (the CLI is one
node's, and builds no fabric of its own), and two torchrun options as torchrun reads them from ``PET_*``
variables: ``--local-addr`` (the address other nodes reach this one at; torchrun would otherwise publish the
machine's host name, which every namespace shares) and, with the c10d rendezvous, ``--rdzv-conf=is_host=...``
(torchrun recognises the store's host by its host name). The nodes' CLIs rewrite the run's config and command
with their own launcher settings; the user's are put back when the nodes end (and into the record).

Real bytes: the launcher sets ``BIRDER_LINK_IFACE`` for each node; the worker on each node's local rank 0 reads
that interface's kernel counters at the start and the end of the timed steps (``birder_repro.train.probes``, a probe
of the training loop), and the record gets ``link_bytes_per_step``: one figure per node.

Cores: with ``cluster.pin_cores`` (the default) node k runs under ``taskset`` on its own block of this machine's
cores (cores // nodes each; no pinning with fewer cores than nodes), as a real node owns its CPU.

Output: each node's CLI keeps its torchrun's output in the run directory as on a cluster (``output.log`` on
node 0, ``output.node<k>.log`` on node k); every line of every node's CLI, prefixed with its node, goes to the
terminal and to ``emulated.log``.

The fabric is removed when the run ends, fails, or is stopped with SIGINT or SIGTERM (each node's CLI gets
SIGTERM and passes it on: its workers stop after their step and checkpoint); one left by a run killed with
SIGKILL is removed by the next emulated run (birder_repro.netns.build.clean_stale).

Its parts: ``emulated_nodes`` (the command each node runs, the dry run's lines), ``node_processes`` (the nodes
run at once, their output prefixed, stopped together, signals turned into an unwinding); this module checks the
config and builds, runs and removes the cluster.
"""

from __future__ import annotations

import json
import os
import signal
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from omegaconf import DictConfig

from birder_repro.config import settings as layout
from birder_repro.launch import local
from birder_repro.launch.emulated_nodes import commands, format_dry_run
from birder_repro.launch.node_processes import SIGNAL_CODES, STOP_TIMEOUT_S, Interrupted, run_nodes, signals_raise
from birder_repro.launch.torchrun import stop_timeout
from birder_repro.netns import build, counters, plan
from birder_repro.run import record
from birder_repro.run.directory import RunDir
from birder_repro.train.probes import LINK_IFACE_ENV  # the interface whose counters a node's local rank 0 reads

__all__ = [
    "CLUSTER",
    "LINK_IFACE_ENV",
    "INFO_FILE",
    "is_emulated",
    "check_launcher",
    "check_config",
    "shaping",
    "fabric_for",
    "commands",
    "launch",
]

CLUSTER = "emulated"
INFO_FILE = "emulated.json"  # in the run directory: the fabric, its commands and whole-run link bytes
NODES_LOG = "emulated.log"  # in the run directory: every node's output, each line prefixed with its node


# ------------------------------------------------------------------------------------------ the config
def is_emulated(cfg: DictConfig) -> bool:
    return cfg.cluster.name == CLUSTER


def check_launcher(cfg: DictConfig) -> None:
    """The emulated cluster starts its own nodes: another launcher would run the layout without its links."""
    if cfg.launcher.name != "auto":
        raise layout.ConfigError(
            f"cluster=emulated starts its nodes itself (one network namespace and torchrun each); "
            f"launcher={cfg.launcher.name} cannot run it: leave launcher=auto (the default)"
        )


def check_config(cfg: DictConfig) -> None:
    """Values the emulated cluster cannot use, refused before anything is made; each names its key (the link's
    rate is every cluster's: birder_repro.config.settings.check_link)."""
    cl = cfg.cluster
    if cl.get("latency_ms") is not None:
        raise layout.ConfigError(
            f"cluster.latency_ms={cl.latency_ms}: a propagation delay needs tc netem, "
            "which the emulated cluster does not use; set cluster.latency_ms=null "
            "(cluster.queue_ms bounds the queueing delay of a shaped link)"
        )
    for key in ("queue_ms", "burst_ms"):
        if not float(cl[key]) > 0:
            raise layout.ConfigError(f"cluster.{key}={cl[key]}: use a time > 0 in milliseconds")
    if cl.backend == "nccl" or cfg.device == "cuda":
        raise layout.ConfigError(
            "cluster=emulated runs its workers on the CPU with gloo, whose TCP traffic "
            "is what its links carry (NCCL would bypass them through shared memory): set "
            "device=cpu (or auto) and cluster.backend=gloo"
        )
    if not 1 <= int(cfg.nodes) <= plan.MAX_NODES:
        raise layout.ConfigError(f"nodes={cfg.nodes}: an emulated cluster has 1 to {plan.MAX_NODES} nodes")
    local.check_fits_this_machine(cfg)  # every process of every node runs on this machine


def shaping(cfg: DictConfig) -> plan.Shaping:
    return plan.cluster_shaping(cfg.cluster)


def fabric_for(cfg: DictConfig, run_id: str | None = None) -> plan.Fabric:
    try:
        return plan.plan_fabric(int(cfg.nodes), str(cfg.cluster.subnet), shaping(cfg), run_id)
    except ValueError as err:  # a malformed or too small subnet
        raise layout.ConfigError(
            f"cluster.subnet={cfg.cluster.subnet}: {err}; use a private IPv4 subnet with "
            "room for every node, e.g. 10.77.0.0/24"
        ) from None


# ------------------------------------------------------------------------------------------- the launch
def launch(cfg: DictConfig, run_dir: Path, env: Mapping[str, str] = os.environ) -> int:
    """Build the fabric, run every node's torchrun, remove the fabric whatever happens; the exit code."""
    check_config(cfg)
    run_dir = Path(run_dir)
    fabric = fabric_for(cfg)
    cmds = commands(cfg, run_dir, fabric, env)
    if cfg.dry_run:
        print(format_dry_run(cfg, run_dir, fabric, cmds), flush=True)
        return 0
    build.require_tools()
    stale = build.clean_stale()
    if stale:
        print(
            f"[birder-repro] removed the emulated cluster(s) {', '.join(stale)} left by runs that were killed",
            flush=True,
        )
    info: dict[str, Any] = {
        **fabric.describe(),
        "setup": [" ".join(c) for c in plan.setup_commands(fabric)],
        "nodes_commands": [c.shell() for c in cmds],
    }
    users = _run_files(run_dir)
    code = 1
    with signals_raise() as signals:
        try:
            build.create(fabric)
            print(
                f"[birder-repro] emulated cluster {fabric.run_id}: {len(fabric.nodes)} namespaces on "
                f"{cfg.cluster.subnet}, links {' '.join(fabric.shaping.tbf()) or 'unshaped'}",
                flush=True,
            )
            before = _whole_run_bytes(fabric)
            # a node's CLI waits train.stop_timeout_s for its workers after SIGTERM, and a minute more for torchrun
            code = run_nodes(cmds, run_dir / NODES_LOG, stop_timeout_s=stop_timeout(cfg) + 60 + STOP_TIMEOUT_S)
            info["link_bytes_whole_run"] = _difference(_whole_run_bytes(fabric), before)
        except Interrupted as stop:
            code = SIGNAL_CODES[stop.signum]
            print(
                f"[birder-repro] stopped by {signal.Signals(stop.signum).name}; removing the emulated cluster",
                file=sys.stderr,
                flush=True,
            )
        finally:
            signals.disarm()  # a second Ctrl-C must not cut the removal short
            info["left_after_removal"] = build.destroy(fabric)
            _write_info(run_dir, info)
            _restore_run_files(run_dir, users, cfg)
    if info["left_after_removal"]:
        print(
            f"[birder-repro] could not remove {', '.join(info['left_after_removal'])}; the next emulated run "
            "removes them (or: ip netns delete / ip link delete)",
            file=sys.stderr,
            flush=True,
        )
    return code


def _run_files(run_dir: Path) -> dict[str, str]:
    """The config and command the user's CLI wrote, which each node's CLI rewrites with its own launcher."""
    return {
        name: (run_dir / name).read_text()
        for name in (record.CONFIG_FILE, record.COMMAND_FILE)
        if (run_dir / name).is_file()
    }


def _restore_run_files(run_dir: Path, files: dict[str, str], cfg: DictConfig) -> None:
    """Put the user's config and command back, in the run directory and in the record, so that the run is
    described (and can be run again) by what the user typed, not by one node's share of it."""
    for name, text in files.items():
        (run_dir / name).write_text(text)
    RunDir(run_dir).relay_user_command(cfg, files)


def _whole_run_bytes(fabric: plan.Fabric) -> list[int | None]:
    # The bridge end of node k's veth receives exactly what node k sends: read from the root namespace.
    return [counters.rx_bytes(n.host_veth) for n in fabric.nodes]


def _difference(after: list[int | None], before: list[int | None]) -> list[int | None]:
    return [None if a is None or b is None else a - b for a, b in zip(after, before)]


def _write_info(run_dir: Path, info: dict) -> None:
    try:
        (run_dir / INFO_FILE).write_text(json.dumps(info, indent=2) + "\n")
    except OSError as err:  # the run's outcome must not depend on this note
        print(f"[birder-repro] could not write {run_dir / INFO_FILE}: {err}", file=sys.stderr)

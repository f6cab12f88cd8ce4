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
SIGKILL is removed by the next emulated run (netns.clean_stale).
"""

from __future__ import annotations

import ctypes
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from omegaconf import DictConfig

from birder_repro import netns
from birder_repro.config import settings as layout
from birder_repro.launch import local
from birder_repro.launch.process import Command
from birder_repro.launch.torchrun import stop_timeout
from birder_repro.run import record
from birder_repro.run.directory import RunDir
from birder_repro.run.failures import TerminalEcho
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
    "node_command",
    "commands",
    "format_dry_run",
    "launch",
]

CLUSTER = "emulated"
NODE_ENV = "BIRDER_EMULATED_NODE"  # set for each node's CLI: k, the node it runs as (it builds no fabric)
INFO_FILE = "emulated.json"  # in the run directory: the fabric, its commands and whole-run link bytes
NODES_LOG = "emulated.log"  # in the run directory: every node's output, each line prefixed with its node
STOP_GRACE_S = 20.0  # after one node fails, how long the others get to notice before they are stopped
STOP_TIMEOUT_S = 30.0  # SIGTERM to SIGKILL of a node's CLI, beyond the workers' grace (train.stop_timeout_s)
SIGNAL_CODES = {signal.SIGINT: 130, signal.SIGTERM: 143}  # the shell's codes for a command stopped by them


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
    if not 1 <= int(cfg.nodes) <= netns.MAX_NODES:
        raise layout.ConfigError(f"nodes={cfg.nodes}: an emulated cluster has 1 to {netns.MAX_NODES} nodes")
    local.check_fits_this_machine(cfg)  # every process of every node runs on this machine


def shaping(cfg: DictConfig) -> netns.Shaping:
    return netns.cluster_shaping(cfg.cluster)


def fabric_for(cfg: DictConfig, run_id: str | None = None) -> netns.Fabric:
    try:
        return netns.plan_fabric(int(cfg.nodes), str(cfg.cluster.subnet), shaping(cfg), run_id)
    except ValueError as err:  # a malformed or too small subnet
        raise layout.ConfigError(
            f"cluster.subnet={cfg.cluster.subnet}: {err}; use a private IPv4 subnet with "
            "room for every node, e.g. 10.77.0.0/24"
        ) from None


# ---------------------------------------------------------------------------------------- the commands
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
    cfg: DictConfig, run_dir: Path, fabric: netns.Fabric, k: int, env: Mapping[str, str] = os.environ
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


def commands(
    cfg: DictConfig, run_dir: Path, fabric: netns.Fabric, env: Mapping[str, str] = os.environ
) -> list[Command]:
    return [node_command(cfg, run_dir, fabric, k, env) for k in range(int(cfg.nodes))]


def format_dry_run(cfg: DictConfig, run_dir: Path, fabric: netns.Fabric, cmds: Sequence[Command]) -> str:
    """The fabric's setup, one line per node (all run at once), and the teardown, as a root shell would."""
    tbf = " ".join(fabric.shaping.tbf()) or "unshaped"
    lines = [
        f"# dry run (cluster=emulated): {cfg.nodes} nodes x {cfg.gpus_per_node} processes per node, "
        f"each node a network namespace; links: {tbf}; nothing was started.",
        f"# Run directory with the resolved config: {Path(run_dir).resolve()}",
        "# 1. the fabric (as root), and /etc/netns/<namespace>/hosts naming every node in each namespace:",
    ]
    lines += [" ".join(c) for c in netns.setup_commands(fabric)]
    lines.append("# 2. one birder-repro CLI per node (it starts the node's torchrun), all at once:")
    lines += [f"{Command(c.argv, c.env).shell()} &  # {c.note}" for c in cmds]
    lines.append("wait")
    lines.append("# 3. removal (also on failure or interruption):")
    lines += [" ".join(c) for c in netns.teardown_commands(fabric)]
    return "\n".join(lines)


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
    netns.require_tools()
    stale = netns.clean_stale()
    if stale:
        print(
            f"[birder-repro] removed the emulated cluster(s) {', '.join(stale)} left by runs that were killed",
            flush=True,
        )
    info: dict[str, Any] = {
        **fabric.describe(),
        "setup": [" ".join(c) for c in netns.setup_commands(fabric)],
        "nodes_commands": [c.shell() for c in cmds],
    }
    users = _run_files(run_dir)
    code = 1
    with _signals_raise() as signals:
        try:
            netns.create(fabric)
            print(
                f"[birder-repro] emulated cluster {fabric.run_id}: {len(fabric.nodes)} namespaces on "
                f"{cfg.cluster.subnet}, links {' '.join(fabric.shaping.tbf()) or 'unshaped'}",
                flush=True,
            )
            before = _whole_run_bytes(fabric)
            # a node's CLI waits train.stop_timeout_s for its workers after SIGTERM, and a minute more for torchrun
            code = run_nodes(cmds, run_dir / NODES_LOG, stop_timeout_s=stop_timeout(cfg) + 60 + STOP_TIMEOUT_S)
            info["link_bytes_whole_run"] = _difference(_whole_run_bytes(fabric), before)
        except _Interrupted as stop:
            code = SIGNAL_CODES[stop.signum]
            print(
                f"[birder-repro] stopped by {signal.Signals(stop.signum).name}; removing the emulated cluster",
                file=sys.stderr,
                flush=True,
            )
        finally:
            signals.disarm()  # a second Ctrl-C must not cut the removal short
            info["left_after_removal"] = netns.destroy(fabric)
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


class _Interrupted(BaseException):
    """SIGINT or SIGTERM arrived: unwind to the fabric's removal (BaseException: no handler swallows it)."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


class _SignalGuard:
    """While armed, the first SIGINT or SIGTERM raises :class:`_Interrupted`; any other is ignored."""

    def __init__(self) -> None:
        self.armed = True

    def disarm(self) -> None:
        self.armed = False

    def handler(self, signum, _frame) -> None:
        if self.armed:
            self.armed = False
            raise _Interrupted(signum)


@contextmanager
def _signals_raise() -> Iterator[_SignalGuard]:
    """Turn SIGINT and SIGTERM into :class:`_Interrupted` (Python's default for SIGTERM is to die on the
    spot, which would leave the namespaces behind); the previous handlers come back afterwards."""
    guard = _SignalGuard()
    if threading.current_thread() is not threading.main_thread():  # signal handlers live in the main thread
        yield guard
        return
    previous = {sig: signal.signal(sig, guard.handler) for sig in SIGNAL_CODES}
    try:
        yield guard
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


def run_nodes(
    cmds: Sequence[Command], log_path: Path, grace_s: float = STOP_GRACE_S, stop_timeout_s: float = STOP_TIMEOUT_S
) -> int:
    """Start every node's command at once, stream their output (prefixed by node) to stdout and ``log_path``.

    Returns 0, or the exit code of the first node that failed. When one fails the others may wait on it for
    ever (gloo's timeout is 30 minutes): they get ``grace_s`` to end, then are stopped. On an exception
    (an interruption) every node is stopped before it propagates.
    """
    # each node in a session of its own: a Ctrl-C at the terminal reaches this launcher only, which stops each
    # node once, through its CLI
    procs = [
        subprocess.Popen(
            c.argv,
            env=c.full_env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=_die_with_parent,
        )
        for c in cmds
    ]
    lock = threading.Lock()
    first = TerminalEcho(sys.stdout)  # one a node, muted together: a failure on any node spares the terminal
    echoes = [first] + [TerminalEcho(sys.stdout, shared=first) for _ in procs[1:]]
    with open(log_path, "ab") as log:
        pumps = [
            threading.Thread(target=_pump, args=(p.stdout, log, f"[node {k}] ".encode(), lock, echoes[k]), daemon=True)
            for k, p in enumerate(procs)
        ]
        for t in pumps:
            t.start()
        try:
            first_failure = _wait_all(procs, grace_s, stop_timeout_s)
        except BaseException:
            _stop_all(procs, stop_timeout_s)
            raise
        finally:
            for t in pumps:
                t.join(timeout=5)
    return first_failure


def _wait_all(procs: Sequence[subprocess.Popen], grace_s: float, stop_timeout_s: float) -> int:
    first_failure, failed_at = 0, None
    while None in [p.poll() for p in procs]:  # a list, not any(): every process must be polled
        for p in procs:
            if p.returncode not in (None, 0) and failed_at is None:
                first_failure, failed_at = p.returncode, time.monotonic()
        if failed_at is not None and time.monotonic() - failed_at > grace_s:
            _stop_all(procs, stop_timeout_s)
        time.sleep(0.1)
    failures = [p.returncode for p in procs if p.returncode != 0]
    return first_failure or (failures[0] if failures else 0)


def _stop_all(procs: Sequence[subprocess.Popen], timeout_s: float = STOP_TIMEOUT_S) -> None:
    """SIGTERM to every node's CLI, which passes it on to its torchrun and waits for the workers (they stop after
    their step and checkpoint, birder_repro.launch.process); SIGKILL to a CLI still running ``timeout_s`` later."""
    for stop in ("terminate", "kill"):
        running = [p for p in procs if p.poll() is None]
        for p in running:
            getattr(p, stop)()
        deadline = time.monotonic() + timeout_s
        while any(p.poll() is None for p in running) and time.monotonic() < deadline:
            time.sleep(0.1)


def _die_with_parent() -> None:
    # PR_SET_PDEATHSIG (1): should this launcher die without cleaning up (SIGKILL), the kernel sends each
    # node's CLI SIGTERM, which it passes on to its torchrun, so no worker outlives it; the next run then
    # removes the stale namespaces.
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)


def _pump(stream, log, prefix: bytes, lock: threading.Lock, echo: TerminalEcho) -> None:
    """Copy one node's output, prefixing every line (progress bars redraw with \\r: those are lines too), to
    the log, and to the terminal through ``echo`` (whole lines, up to a worker's failure)."""
    at_line_start = True
    while chunk := stream.read1(65536):
        out = bytearray()
        for piece in chunk.splitlines(keepends=True):
            if at_line_start and piece not in (b"\r", b"\n", b"\r\n"):  # no prefix before a bare line end
                out += prefix
            out += piece
            at_line_start = piece.endswith((b"\n", b"\r"))
        with lock:
            log.write(out)
            log.flush()
            echo.write(bytes(out))
    with lock:
        echo.close()


def _whole_run_bytes(fabric: netns.Fabric) -> list[int | None]:
    # The bridge end of node k's veth receives exactly what node k sends: read from the root namespace.
    return [netns.rx_bytes(n.host_veth) for n in fabric.nodes]


def _difference(after: list[int | None], before: list[int | None]) -> list[int | None]:
    return [None if a is None or b is None else a - b for a, b in zip(after, before)]


def _write_info(run_dir: Path, info: dict) -> None:
    try:
        (run_dir / INFO_FILE).write_text(json.dumps(info, indent=2) + "\n")
    except OSError as err:  # the run's outcome must not depend on this note
        print(f"[birder-repro] could not write {run_dir / INFO_FILE}: {err}", file=sys.stderr)

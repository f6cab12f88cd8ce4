"""The emulated cluster's fabric made and removed on this machine (root, iproute2): the namespaces, veths, bridge
and qdiscs of a plan (birder_repro.netns.plan), each node's hosts file, the run's state file, and the stale
fabrics of killed runs cleaned up."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path

from .plan import PREFIX, Fabric, Node, _run_id_of, setup_commands, teardown_commands

__all__ = [
    "STATE_DIR",
    "NETNS_ETC",
    "EmulationUnavailable",
    "FabricError",
    "require_tools",
    "hosts_file",
    "create",
    "destroy",
    "list_ours",
    "clean_stale",
]

STATE_DIR = Path(os.environ.get("BIRDER_EMULATED_STATE", "/run/birder-repro/emulated"))
# ip netns exec bind-mounts /etc/netns/<namespace>/<file> over /etc/<file> (ip-netns(8)): each node gets a
# hosts file that names every node, so that name lookups (gloo's and c10d's logs, torchrun's own host name)
# are answered locally and never go looking for a DNS server the namespace cannot reach.
NETNS_ETC = Path("/etc/netns")
IP_TIMEOUT_S = 30


class EmulationUnavailable(RuntimeError):
    """This machine cannot host an emulated cluster (not root, no iproute2); the message says what to do."""


class FabricError(RuntimeError):
    """A command that builds or removes the fabric failed; the message quotes it and its error."""


def require_tools() -> None:
    """Refuse, saying what to do, where namespaces cannot be made: not root, or iproute2 missing."""
    missing = [tool for tool in ("ip", "tc") if shutil.which(tool) is None]
    problems = []
    if os.geteuid() != 0:
        problems.append(
            "it must run as root (network namespaces, veth pairs and qdiscs need CAP_NET_ADMIN): "
            "sudo -E $(which birder-repro) cluster=emulated ..."
        )
    if missing:
        problems.append(
            f"{' and '.join(missing)} not found: install iproute2 (apt-get install -y iproute2; dnf install -y iproute)"
        )
    if problems:
        raise EmulationUnavailable(
            "cluster=emulated cannot run here: "
            + "; ".join(problems)
            + ". Without them, run the layout as local processes: cluster=local"
        )


def run(cmd: Sequence[str], check: bool = True) -> subprocess.CompletedProcess:
    out = subprocess.run(list(cmd), capture_output=True, text=True, timeout=IP_TIMEOUT_S, check=False)
    if check and out.returncode != 0:
        raise FabricError(f"`{' '.join(cmd)}` failed (exit code {out.returncode}): {out.stderr.strip()}")
    return out


def hosts_file(fabric: Fabric, node: Node, hostname: str) -> str:
    """Node ``node``'s /etc/hosts: loopback, every node by its namespace's name, and this machine's host name
    as the node's own address (as each machine of a cluster resolves its own name).

    Every IPv4 address is listed a second time in its IPv4-mapped IPv6 form (``::ffff:10.77.0.2``), and the
    IPv6 loopback too: c10d's store listens on a dual-stack socket, sees its clients at such addresses, and
    names them with ``getnameinfo``; glibc's hosts file answers an IPv6 query only from IPv6 lines, so without
    them the lookup goes to a DNS server the namespace cannot reach, and c10d warns "The hostname of the
    client socket cannot be retrieved. err=-3" (EAI_AGAIN) for every connection.
    """
    names = [("127.0.0.1", "localhost"), (node.address, hostname), *[(n.address, n.netns) for n in fabric.nodes]]
    lines = [f"{address} {name}" for address, name in names] + ["::1 localhost"]
    return "\n".join(lines + [f"::ffff:{address} {name}" for address, name in names]) + "\n"


def create(fabric: Fabric, state_dir: Path = STATE_DIR, etc: Path = NETNS_ETC) -> None:
    """Build ``fabric``; on any failure remove what was made and raise :class:`FabricError`.

    The state file comes first, so that every object of ours has an owner a later run can check.
    """
    _write_state(fabric, state_dir)
    try:
        hostname = socket.gethostname()
        for node in fabric.nodes:
            (etc / node.netns).mkdir(parents=True, exist_ok=True)
            (etc / node.netns / "hosts").write_text(hosts_file(fabric, node, hostname))
        for cmd in setup_commands(fabric):
            run(cmd)
    except BaseException:
        destroy(fabric, state_dir)
        raise


def destroy(fabric: Fabric, state_dir: Path = STATE_DIR, etc: Path = NETNS_ETC) -> list[str]:
    """Stop what still runs in the namespaces and remove every object of the fabric; returns what is left.

    Idempotent: objects already gone are skipped. A namespace that still holds processes would outlive
    its name (and keep its veth), hence the processes are stopped first.
    """
    _stop_processes(fabric.namespaces)
    present = _present(fabric.run_id)
    for cmd in teardown_commands(fabric):
        if cmd[-1] in present:
            run(cmd, check=False)
    for ns in fabric.namespaces:
        shutil.rmtree(etc / ns, ignore_errors=True)
    left = _wait_gone(fabric.run_id)
    if not left:
        (state_dir / f"{fabric.run_id}.json").unlink(missing_ok=True)
    return left


def list_ours() -> dict[str, set[str]]:
    """run id -> names of our namespaces and links present now (the ``ip`` view, by prefix)."""
    found: dict[str, set[str]] = {}
    for name in _netns_names() + _link_names():
        run_id = _run_id_of(name)
        if run_id is not None:
            found.setdefault(run_id, set()).add(name)
    return found


def clean_stale(state_dir: Path = STATE_DIR, etc: Path = NETNS_ETC) -> list[str]:
    """Remove every fabric whose run is gone (no state file, or its process dead); return their run ids."""
    removed = []
    for path in etc.glob(f"{PREFIX}-*") if etc.is_dir() else []:  # hosts files: the namespace may be gone
        run_id = _run_id_of(path.name)
        if run_id is not None and not _owner_alive(state_dir / f"{run_id}.json"):
            shutil.rmtree(path, ignore_errors=True)
    for run_id, names in list_ours().items():
        if _owner_alive(state_dir / f"{run_id}.json"):
            continue
        namespaces = sorted(n for n in names if n.startswith(f"{PREFIX}-"))
        _stop_processes(namespaces)
        for name in namespaces:
            run(["ip", "netns", "delete", name], check=False)
        for name in sorted(_present(run_id) - set(namespaces)):  # bridge ends first, then the bridge
            run(["ip", "link", "delete", name], check=False)
        _wait_gone(run_id)
        (state_dir / f"{run_id}.json").unlink(missing_ok=True)
        removed.append(run_id)
    remaining = list_ours()
    for path in state_dir.glob("*.json") if state_dir.is_dir() else []:  # owners gone, nothing left
        if not _owner_alive(path) and path.stem not in remaining:
            path.unlink(missing_ok=True)
    return removed


def _netns_names() -> list[str]:
    out = run(["ip", "netns", "list"], check=False)
    return [line.split()[0] for line in out.stdout.splitlines() if line.strip()]


def _link_names() -> list[str]:
    out = run(["ip", "-j", "link", "show"], check=False)
    try:
        return [entry["ifname"] for entry in json.loads(out.stdout or "[]")]
    except (ValueError, KeyError, TypeError):
        return []


def _present(run_id: str) -> set[str]:
    return list_ours().get(run_id, set())


def _wait_gone(run_id: str, timeout_s: float = 10.0) -> list[str]:
    """What is left of a run's objects once the kernel is done (it destroys a deleted namespace, and the
    veths in it, asynchronously)."""
    deadline = time.monotonic() + timeout_s
    while (left := _present(run_id)) and time.monotonic() < deadline:
        time.sleep(0.1)
    return sorted(left)


def _stop_processes(namespaces: Sequence[str], timeout_s: float = 10.0) -> None:
    """SIGTERM every process in the namespaces (torchrun stops its workers on it), SIGKILL what remains."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        pids = [pid for ns in namespaces for pid in _pids_in(ns)]
        if not pids:
            return
        for pid in pids:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and any(_pids_in(ns) for ns in namespaces):
            time.sleep(0.1)


def _pids_in(netns: str) -> list[int]:
    out = run(["ip", "netns", "pids", netns], check=False)
    return [int(p) for p in out.stdout.split() if p.isdigit() and int(p) != os.getpid()]


def _start_time(pid: int) -> str | None:
    """The process's start time in clock ticks since boot (field 22 of /proc/<pid>/stat): a pid reused by
    another process has another one."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()[19]


def _write_state(fabric: Fabric, state_dir: Path) -> None:
    state_dir.mkdir(parents=True, exist_ok=True)
    pid = os.getpid()
    state = {"pid": pid, "start_time": _start_time(pid), **fabric.describe()}
    (state_dir / f"{fabric.run_id}.json").write_text(json.dumps(state, indent=2) + "\n")


def _owner_alive(path: Path) -> bool:
    try:
        state = json.loads(path.read_text())
    except (OSError, ValueError):
        return False
    pid = state.get("pid")
    return isinstance(pid, int) and _start_time(pid) is not None and _start_time(pid) == state.get("start_time")

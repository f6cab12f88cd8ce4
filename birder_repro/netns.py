"""Network namespaces as the nodes of an emulated cluster: plan, create, shape, count and remove them.

It sits below every layer that needs it (docs/architecture.md), and imports nothing of the project: the
emulated launcher (birder_repro.launch.emulated) builds a run's fabric with it, the link probe
(birder_repro.perf.linkprobe) builds its own, and the training loop's link-byte probe (birder_repro.train.probes)
reads a node's kernel counters with it. ``from birder_repro.launch import netns`` still finds it.

One run's fabric (``<id>``: 6 hex digits, new for every run)::

    root namespace                              node k's namespace  bdrp-<id>-<k>
    bridge bdrp<id>br ── bdrp<id>h<k>  ═veth═  bdrp<id>n<k>  10.77.0.(k+1)/24  (+ its own loopback, up)

Every node has its own loopback, so the processes of one node talk over it, fast and unshaped, while every
byte between nodes crosses the node's veth. Both ends of each veth get a token bucket (``tc qdisc ... tbf``):
the namespace end's egress is the node's uplink, the bridge end's egress its downlink, as a switch port
limits both directions. Each namespace also gets a hosts file naming every node (:func:`hosts_file`). The
bridge has no address: the root namespace takes no part in the traffic, and two
runs on the same subnet never meet (each has its own bridge).

Names start with :data:`PREFIX` (interface names: at most 15 characters, Linux's IFNAMSIZ). Before creating
anything, a run writes ``<STATE_DIR>/<id>.json`` with its process id and that process's start time; a
fabric whose process is gone (a run killed with SIGKILL) is stale, and :func:`clean_stale`, which every
emulated run calls first, kills what still runs in its namespaces and removes it. Fabrics of live runs are
left alone, so two runs may go on side by side.

Kernel counters (``/sys/class/net/<iface>/statistics``) count every frame a veth sent: TCP payload plus
66 bytes of headers per packet (Ethernet 14, IPv4 20, TCP 20 + 12 of the timestamp option), pure ACKs
included; :func:`read_counters` reads them, with TCP's retransmitted segments (``/proc/net/snmp``).
"""

from __future__ import annotations

import ipaddress
import json
import math
import os
import secrets
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

__all__ = [
    "PREFIX",
    "STATE_DIR",
    "FRAME_HEADER_BYTES",
    "EmulationUnavailable",
    "FabricError",
    "Shaping",
    "Node",
    "Fabric",
    "require_tools",
    "cluster_shaping",
    "burst_bytes",
    "plan_fabric",
    "setup_commands",
    "teardown_commands",
    "create",
    "destroy",
    "list_ours",
    "clean_stale",
    "read_counters",
]

PREFIX = "bdrp"  # "birder-repro": every namespace, veth and bridge of ours starts with it
STATE_DIR = Path(os.environ.get("BIRDER_EMULATED_STATE", "/run/birder-repro/emulated"))
# ip netns exec bind-mounts /etc/netns/<namespace>/<file> over /etc/<file> (ip-netns(8)): each node gets a
# hosts file that names every node, so that name lookups (gloo's and c10d's logs, torchrun's own host name)
# are answered locally and never go looking for a DNS server the namespace cannot reach.
NETNS_ETC = Path("/etc/netns")
MAX_NODES = 99  # keeps bdrp<id>h<k> within 15 characters, and node addresses within one /24
ETHERNET_FRAME = 1514  # bytes of a full frame at MTU 1500 (14 of Ethernet header), as tbf counts it
FRAME_HEADER_BYTES = 66  # Ethernet 14 + IPv4 20 + TCP 20 + timestamp option 12 (Linux's default)
IP_TIMEOUT_S = 30


class EmulationUnavailable(RuntimeError):
    """This machine cannot host an emulated cluster (not root, no iproute2); the message says what to do."""


class FabricError(RuntimeError):
    """A command that builds or removes the fabric failed; the message quotes it and its error."""


# ------------------------------------------------------------------------------------------- the plan
@dataclass(frozen=True)
class Shaping:
    """One link's token bucket; ``rate_mbit`` None: the link is left unshaped."""

    rate_mbit: float | None
    burst_bytes: int = 0
    queue_ms: float = 100.0  # tbf's "latency": the longest a packet may wait in the queue before it is dropped

    def tbf(self) -> list[str]:
        """The qdisc arguments after ``root``, or [] for an unshaped link."""
        if self.rate_mbit is None:
            return []
        return [
            "tbf",
            "rate",
            f"{_number(self.rate_mbit)}mbit",
            "burst",
            str(self.burst_bytes),
            "latency",
            f"{_number(self.queue_ms)}ms",
        ]


def cluster_shaping(cluster) -> Shaping:
    """The links of the ``cluster`` config node (``link_mbit``, null: unshaped; ``queue_ms``, ``burst_ms``)."""
    rate = cluster.get("link_mbit")
    if rate is None:
        return Shaping(rate_mbit=None, queue_ms=float(cluster["queue_ms"]))
    return Shaping(
        rate_mbit=float(rate),
        burst_bytes=burst_bytes(float(rate), float(cluster["burst_ms"])),
        queue_ms=float(cluster["queue_ms"]),
    )


def burst_bytes(rate_mbit: float, burst_ms: float) -> int:
    """tbf's bucket: ``max(rate x burst_ms, 2 frames of 1514 bytes)``.

    The bucket must hold a whole frame (tbf drops a packet larger than its bucket, and splits GSO
    super-packets into frames only up to it), and two so that back-to-back frames pass; beyond that, the
    bucket is the burst a link may send above its rate, so it is kept to ``burst_ms`` of traffic (1 ms:
    25,000 bytes at 200 Mbit/s). The long-run rate does not depend on it.
    """
    return max(math.ceil(rate_mbit * 1e6 / 8 * burst_ms / 1e3), 2 * ETHERNET_FRAME)


@dataclass(frozen=True)
class Node:
    index: int
    netns: str
    host_veth: str  # the bridge's end, in the root namespace
    node_veth: str  # the node's end, in its namespace: the interface gloo binds to
    address: str


@dataclass(frozen=True)
class Fabric:
    run_id: str
    bridge: str
    prefix_len: int
    shaping: Shaping
    nodes: tuple[Node, ...] = field(default_factory=tuple)

    @property
    def namespaces(self) -> list[str]:
        return [n.netns for n in self.nodes]

    def describe(self) -> dict:
        return {
            "run_id": self.run_id,
            "bridge": self.bridge,
            "shaping": asdict(self.shaping),
            "tbf": " ".join(self.shaping.tbf()) or None,
            "nodes": [asdict(n) for n in self.nodes],
        }


def new_run_id() -> str:
    return secrets.token_hex(3)


def netns_name(run_id: str, k: int) -> str:
    return f"{PREFIX}-{run_id}-{k}"


def plan_fabric(nodes: int, subnet: str, shaping: Shaping, run_id: str | None = None) -> Fabric:
    """Names and addresses of a fabric of ``nodes`` nodes on ``subnet`` (node k: the subnet's host k+1)."""
    if not 1 <= nodes <= MAX_NODES:
        raise ValueError(f"an emulated cluster has 1 to {MAX_NODES} nodes, not {nodes}")
    net = ipaddress.ip_network(subnet, strict=False)
    if net.version != 4 or net.num_addresses - 2 < nodes:
        raise ValueError(f"subnet {subnet} has no room for {nodes} IPv4 node addresses")
    run_id = run_id or new_run_id()
    hosts = net.hosts()
    return Fabric(
        run_id=run_id,
        bridge=f"{PREFIX}{run_id}br",
        prefix_len=net.prefixlen,
        shaping=shaping,
        nodes=tuple(
            Node(k, netns_name(run_id, k), f"{PREFIX}{run_id}h{k}", f"{PREFIX}{run_id}n{k}", str(next(hosts)))
            for k in range(nodes)
        ),
    )


def setup_commands(fabric: Fabric) -> list[list[str]]:
    """The ``ip`` and ``tc`` commands that build the fabric, in order."""
    cmds = [["ip", "link", "add", fabric.bridge, "type", "bridge"], ["ip", "link", "set", fabric.bridge, "up"]]
    for node in fabric.nodes:
        ns = node.netns
        cmds += [
            ["ip", "netns", "add", ns],
            ["ip", "-n", ns, "link", "set", "lo", "up"],
            ["ip", "link", "add", node.host_veth, "type", "veth", "peer", "name", node.node_veth, "netns", ns],
            ["ip", "link", "set", node.host_veth, "master", fabric.bridge],
            ["ip", "link", "set", node.host_veth, "up"],
            ["ip", "-n", ns, "addr", "add", f"{node.address}/{fabric.prefix_len}", "dev", node.node_veth],
            ["ip", "-n", ns, "link", "set", node.node_veth, "up"],
        ]
        tbf = fabric.shaping.tbf()
        if tbf:
            cmds += [
                ["tc", "-n", ns, "qdisc", "add", "dev", node.node_veth, "root", *tbf],  # uplink
                ["tc", "qdisc", "add", "dev", node.host_veth, "root", *tbf],
            ]  # downlink
    return cmds


def teardown_commands(fabric: Fabric) -> list[list[str]]:
    """Remove the namespaces (their veths go with them), any bridge end left, and the bridge."""
    return (
        [["ip", "netns", "delete", ns] for ns in fabric.namespaces]
        + [["ip", "link", "delete", n.host_veth] for n in fabric.nodes]
        + [["ip", "link", "delete", fabric.bridge]]
    )


# ------------------------------------------------------------------------------------ running commands
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


# ------------------------------------------------------------------------------------- kernel counters
def read_counters(
    iface: str, sys_net: Path = Path("/sys/class/net"), snmp: Path = Path("/proc/net/snmp")
) -> dict[str, int]:
    """``tx_bytes``, ``tx_packets`` of ``iface`` and TCP's ``retrans_segs``, as seen from this namespace."""
    stats = sys_net / iface / "statistics"
    return {
        "tx_bytes": int((stats / "tx_bytes").read_text()),
        "tx_packets": int((stats / "tx_packets").read_text()),
        "retrans_segs": _tcp_retransmits(snmp),
    }


def _tcp_retransmits(snmp: Path) -> int:
    # /proc/net/snmp: a "Tcp:" line of names, then one of values (per network namespace).
    rows = [line.split() for line in snmp.read_text().splitlines() if line.startswith("Tcp:")]
    return int(dict(zip(rows[0], rows[1])).get("RetransSegs", 0)) if len(rows) >= 2 else 0


def rx_bytes(iface: str, sys_net: Path = Path("/sys/class/net")) -> int | None:
    """Bytes ``iface`` received (the bridge end of a node's veth: what the node sent), None if it is gone."""
    try:
        return int((sys_net / iface / "statistics" / "rx_bytes").read_text())
    except OSError:
        return None


# ------------------------------------------------------------------------------------------- helpers
def _number(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else str(x)


def _netns_names() -> list[str]:
    out = run(["ip", "netns", "list"], check=False)
    return [line.split()[0] for line in out.stdout.splitlines() if line.strip()]


def _link_names() -> list[str]:
    out = run(["ip", "-j", "link", "show"], check=False)
    try:
        return [entry["ifname"] for entry in json.loads(out.stdout or "[]")]
    except (ValueError, KeyError, TypeError):
        return []


def _run_id_of(name: str) -> str | None:
    """The run id in one of our names (bdrp-<id>-<k>, bdrp<id>br, bdrp<id>h<k>, bdrp<id>n<k>), else None."""
    if not name.startswith(PREFIX):
        return None
    rest = name[len(PREFIX) :].lstrip("-")
    run_id = rest[:6]
    if len(run_id) == 6 and all(c in "0123456789abcdef" for c in run_id) and rest[6:7] in ("-", "b", "h", "n"):
        return run_id
    return None


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

"""The emulated cluster's fabric as a plan: its names, addresses and link shaping, and the ``ip`` / ``tc``
commands that build and remove it (data only: nothing here runs a command; birder_repro.netns.build does)."""

from __future__ import annotations

import ipaddress
import math
import secrets
from dataclasses import asdict, dataclass, field

__all__ = [
    "PREFIX",
    "MAX_NODES",
    "Shaping",
    "Node",
    "Fabric",
    "cluster_shaping",
    "burst_bytes",
    "new_run_id",
    "netns_name",
    "plan_fabric",
    "setup_commands",
    "teardown_commands",
]

PREFIX = "bdrp"  # "birder-repro": every namespace, veth and bridge of ours starts with it
MAX_NODES = 99  # keeps bdrp<id>h<k> within 15 characters, and node addresses within one /24
ETHERNET_FRAME = 1514  # bytes of a full frame at MTU 1500 (14 of Ethernet header), as tbf counts it


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


def _number(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else str(x)


def _run_id_of(name: str) -> str | None:
    """The run id in one of our names (bdrp-<id>-<k>, bdrp<id>br, bdrp<id>h<k>, bdrp<id>n<k>), else None."""
    if not name.startswith(PREFIX):
        return None
    rest = name[len(PREFIX) :].lstrip("-")
    run_id = rest[:6]
    if len(run_id) == 6 and all(c in "0123456789abcdef" for c in run_id) and rest[6:7] in ("-", "b", "h", "n"):
        return run_id
    return None

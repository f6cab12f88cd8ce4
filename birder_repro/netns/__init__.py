"""Network namespaces as the nodes of an emulated cluster: plan, create, shape, count and remove them.

It sits below every layer that needs it (docs/architecture.md), and imports nothing of the project: the
emulated launcher (birder_repro.launch.emulated) builds a run's fabric with it, the link probe
(birder_repro.perf.linkprobe) builds its own, and the training loop's link-byte probe (birder_repro.train.probes)
reads a node's kernel counters with it.

Its modules, one job each: ``plan`` (the fabric's names, addresses, shaping and its ``ip`` / ``tc`` commands, as
data), ``build`` (making, removing and cleaning up fabrics on this machine: root and iproute2), ``counters`` (the
kernel's link counters).

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

"""Measure an emulated cluster's link as the performance model prices it (nccl-tests' role, for gloo here).

    python -m birder_repro.perf.linkprobe --link-mbit 100 [--nodes 2]     # needs root and iproute2

Builds a fabric of ``--nodes`` namespaces as ``cluster=emulated`` does (conf/cluster/emulated.yaml's queue and
burst), runs one process per node (gloo bound to the node's veth), and times ``all_to_all_single`` and
``all_gather`` of 4 KiB to 4 MiB (each call after a barrier, timed on every rank and taken as the slowest
rank's time, as a training step waits for the slowest; the median of the repeats after a warmup). Each
collective's times are fitted by least squares to the model's pairwise exchange (birder_repro.perf.collectives,
Thakur, Rabenseifner and Gropp 2005): t = (n-1) alpha + (n-1)/n S / bandwidth, S as NCCL-tests counts it (each
process's all-to-all input, the all-gather's output). It prints the fit and what conf/cluster/emulated.yaml's
``perf`` block would say: ``inter_latency_us`` (alpha) and ``exchange_efficiency`` (bandwidth over the tbf
rate). Nothing of a training run goes into it.

The timing and the fit are birder_repro.perf.measure's, the same that ``birder-repro mode=probe``
(birder_repro.perf.probe) uses on any launcher; the fabric is birder_repro.netns's, built here as the emulated
launcher builds it (not imported from the launcher this probe measures).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from birder_repro.netns import build, plan

from .cluster import CLUSTER_DIR
from .measure import call_points, fit_alpha_beta, measure

SIZES = [4 << 10, 16 << 10, 64 << 10, 256 << 10, 1 << 20, 4 << 20]  # bytes per process
KINDS = ("all_to_all", "all_gather")


# ------------------------------------------------------------------------------------------- one node
def _worker(rank: int, world: int, master: str, port: int, out: str) -> None:
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"tcp://{master}:{port}", rank=rank, world_size=world)
    results = measure(KINDS, SIZES)
    if rank == 0:
        Path(out).write_text(json.dumps(results))
    dist.destroy_process_group()


# --------------------------------------------------------------------------------------- the launcher
def probe(nodes: int, link_mbit: float | None, port: int = 29533) -> dict[str, dict[int, float]]:
    """Build the fabric, run a worker per node, remove the fabric; rank 0's medians per kind and size."""
    import yaml

    cluster = {**yaml.safe_load((CLUSTER_DIR / "emulated.yaml").read_text()), "link_mbit": link_mbit}
    fabric = plan.plan_fabric(nodes, str(cluster["subnet"]), plan.cluster_shaping(cluster))
    build.require_tools()
    with tempfile.TemporaryDirectory() as tmp:
        out = str(Path(tmp) / "probe.json")
        build.create(fabric)
        try:
            procs = [
                subprocess.Popen(
                    [
                        "ip",
                        "netns",
                        "exec",
                        node.netns,
                        sys.executable,
                        "-m",
                        "birder_repro.perf.linkprobe",
                        "--worker",
                        str(node.index),
                        str(nodes),
                        fabric.nodes[0].address,
                        str(port),
                        out,
                    ],
                    env={**os.environ, "GLOO_SOCKET_IFNAME": node.node_veth, "OMP_NUM_THREADS": "1"},
                )
                for node in fabric.nodes
            ]
            codes = [p.wait(timeout=600) for p in procs]
        finally:
            build.destroy(fabric)
        if any(codes):
            raise RuntimeError(f"link probe workers exited with {codes}")
        return {k: {int(s): t for s, t in v.items()} for k, v in json.loads(Path(out).read_text()).items()}


def main(argv: list[str] | None = None) -> int:
    if argv is None:
        argv = sys.argv[1:]
    if argv[:1] == ["--worker"]:
        rank, world, master, port, out = argv[1:6]
        _worker(int(rank), int(world), master, int(port), out)
        return 0
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=2)
    parser.add_argument("--link-mbit", type=float, default=None, help="the tbf rate (default: unshaped)")
    args = parser.parse_args(argv)
    results = probe(args.nodes, args.link_mbit)
    n = args.nodes
    print(f"emulated link probe: {n} nodes, link {args.link_mbit or 'unshaped'} Mbit/s; median seconds per call")
    print("bytes/process  " + "  ".join(f"{k:>12s}" for k in KINDS))
    for size in sorted(next(iter(results.values()))):
        print(f"{size:13d}  " + "  ".join(f"{statistics.median(results[k][size]) * 1e3:10.2f}ms" for k in KINDS))
    for kind in KINDS:
        alpha, beta = fit_alpha_beta(*call_points(results[kind]), n, kind)
        rate = 8 / beta / 1e6 if beta > 0 else float("inf")
        eff = f", {rate / args.link_mbit:.2f} of the link" if args.link_mbit else ""
        print(f"{kind}: alpha {alpha * 1e6:.0f} us per network step, {rate:.1f} Mbit/s{eff}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

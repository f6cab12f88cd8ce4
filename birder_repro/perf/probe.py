"""``birder-repro mode=probe``: measure the network between nodes and write the cluster spec the model needs.

    birder-repro mode=probe nodes=2 [gpus_per_node=M] [cluster=...] [launcher=...]
    birder-repro mode=predict ... predict.cluster_spec=<run dir>/cluster_spec.yaml

The run starts its workers as a training run does (the same launchers: local, torchrun on every node, SLURM,
the emulated cluster), but each worker times collectives instead of training, as NVIDIA's nccl-tests do:
all-reduce, reduce-scatter, all-gather and all-to-all of ``probe.min_bytes`` to ``probe.max_bytes`` (growing
by ``probe.step_factor``), each call after a barrier and taken at its slowest rank, the median of
``probe.iters`` calls after ``probe.warmup_iters`` (birder_repro.perf.measure.measure). Its table has
nccl-tests' columns: size, time, algorithm bandwidth (size / time) and bus bandwidth (algbw times nccl-tests'
factor: 2(p-1)/p for all-reduce, (p-1)/p for the others), which for large messages approaches the link's rate.

Four groups are timed, one after the other:

    inter   one process per node (local rank 0 of each): the inter-node link as one process sees it;
    inter_all  with several processes a node, every local rank's inter-node group at once (all-reduce,
            all-gather, all-to-all), local rank 0's group's times kept;
    intra   the processes of a node (with gpus_per_node > 1), every node at once, node 0's times kept;
    world   every process at once (with several nodes of several processes): the group of the flat schemes'
            exchanges (1-bit Adam's), whose steps wait on processes that share a node's cores.

Each collective's times are fitted to the cost the model gives it (Thakur, Rabenseifner and Gropp 2005,
birder_repro.perf.collectives): t = steps alpha + factor size / bandwidth, as Hockney's model is read from
nccl-tests' tables: the bandwidth is the rate three in four calls of the larger half of the sizes reach (the
plateau), alpha the median of the smaller half's calls (a call slowed by a busy machine bends neither; small
messages that beat the link, as the emulated link's burst lets them, do not raise its rate, nor do spells of
calls at twice the usual rate; birder_repro.perf.measure._fit_two_regimes). The cluster spec
(``cluster_spec.yaml`` in the run directory: the cluster config's keys, its ``perf`` block measured, and a
``probe`` block saying how) maps the fits to the model's parameters (birder_repro.perf.cluster):

    inter_latency_us      the median alpha of the collectives the model's schemes send across nodes
                          (all-reduce, all-gather, all-to-all; the reduce-scatter stays inside nodes);
    inter_efficiency      the all-reduce's bandwidth over ``cluster.link_mbit`` (the model prices DDP's
                          all-reduce on this link); where link_mbit is null, inter_mbit is the measured rate
                          and the efficiency 1;
    exchange_efficiency   the mean bandwidth of all-gather and all-to-all over the same rate (the model's
                          pairwise exchanges);
    intra_*               the median over all four collectives of the intra-node group; without one (one
                          process per node) the cluster config's values are kept, and the spec says so;
    world_latency_us      each kind's alpha (all-reduce, all-gather, all-to-all) in the world group, per step
                          of it; the model prices a world exchange's steps at it (perf.cluster.op_time), and
                          a cluster config may keep only the kinds it trusts (conf/cluster/emulated.yaml);
    inter_all_latency_us  each kind's alpha (all-reduce, all-gather, all-to-all) between the nodes with every
                          local rank's group running at once (with several processes a node): the inter-node
                          steps of the two-level and hierarchical schemes run so, and on shared cores each
                          step also waits for the node's other processes; the model prices those steps at it;
    reduce_ns_per_element per 16-bit dtype, what a process's sum of one element costs beyond an fp32 sum of the
                          same bytes (``probe.reduce_elements`` elements all-reduced over every process in fp16,
                          in bf16 and, in turns with each, half as many in fp32: perf.measure.measure_reduce_cost;
                          at least 0). The 16-bit exchanges (the fp16 hook, the two-level bf16 one) pay it in
                          perf.cluster.reduce_time. Measure it on a fast link: on a slow one the bytes' time
                          varies more than the sums cost.

The all-reduce's growth with the node count (``scaling``): the world all-reduce over the processes of the
first k nodes, for k = 2, 4, 8, ... and the probe's own node count (:func:`scaling_counts`), each group timed on
its own. :func:`scaling_spec` writes what it measured into the spec as measured (perf.cluster.ClusterSpec):

    allreduce_table       per node count, [bytes, median seconds] per size: the model takes a world all-reduce at
                          a measured node count and size from it (interpolated between sizes);
    allreduce_shape       with two node counts or more (a probe of 3 nodes or more), the shape the times' growth
                          fits best (perf.shape.detect_shape: flat ring, two-level, tree; the node's own phase
                          from the intra group's all-reduce fit), which carries them to other node counts. With
                          one node count there is no shape, and the spec says so (``shape_note``): a prediction
                          at other node counts is then uncalibrated.
    exchange_shape        the all-gather and all-to-all timed the same way, over every process of the first k
                          nodes (``world``: 1-bit Adam's exchange) and among them with every local rank's group
                          at once (``inter``: Birder's), each group's shape and rate (perf.exchange_probe): the
                          model prices the 1-bit exchanges by them, not at the all-reduce's rate.
    allreduce16_table, allreduce16_shape   the world all-reduce timed the same way in fp16 (its sums included): a
                          16-bit run's all-reduce across nodes (the fp16 hook, DeepSpeed's fp16 buffer, a 1-bit
                          run's warmup) is priced by them, not by the fp32 one's.

Keys the probe cannot measure (``shared_host``: whether the nodes share one machine's cores) come from the
cluster config. Rank 0 writes the spec, and the worker the record (``status: completed``, the table and the fits
under ``probe``, which tells a probe's record from a training run's).
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from birder_repro.config.settings import ConfigError
from birder_repro.run import record

from .cluster import MBIT
from .exchange_probe import exchange_spec, scaling_counts, time_scaling
from .measure import COLLECTIVES, bus_factor, fit_level, latency_steps, measure, measure_reduce_cost, table_rows
from .shape import Measured, rank_shapes

__all__ = [
    "SPEC_FILE",
    "is_probe_record",
    "probe_sizes",
    "check_settings",
    "spec_from_fits",
    "probe_worker",
    "format_probe",
    "load_cluster_spec",
    "scaling_counts",
    "scaling_spec",
    "time_scaling",
]

SPEC_FILE = "cluster_spec.yaml"
# What crosses nodes in the model's schemes (birder_repro.perf.schemes): DDP's all-reduce, and the compressed
# schemes' all-to-all and all-gather (their reduce-scatter stays inside a node). The inter-node spec comes from
# these; the reduce-scatter is timed and shown all the same (measured on gloo between two emulated nodes: as
# long as the all-reduce of the same vector, twice what the (p-1)/p of its formula gives).
INTER_KINDS = ("allreduce", "all_gather", "all_to_all")
LEVELS = {
    "inter": "inter-node (one process per node)",
    "inter_all": "inter-node, every local rank's group at once",
    "intra": "intra-node (the processes of node 0)",
    "world": "world (every process: the flat schemes' groups)",
}
PAIRWISE = ("all_gather", "all_to_all")


def is_probe_record(rec: Mapping[str, Any]) -> bool:
    """A record of ``mode=probe``: a link measured, no training run (the report leaves it out)."""
    return rec.get("probe") is not None


def probe_sizes(min_bytes: int, max_bytes: int, step_factor: int) -> list[int]:
    """nccl-tests' sizes (-b, -e, -f): min_bytes, times step_factor, ... up to max_bytes (always included)."""
    sizes, size = [], int(min_bytes)
    while size < max_bytes:
        sizes.append(size)
        size *= int(step_factor)
    return sizes + [int(max_bytes)]


def check_settings(cfg: Any) -> None:
    """The ``probe.*`` values and the layout a probe needs; a ConfigError names the key and what to do."""
    probe = cfg.probe
    for key in ("min_bytes", "max_bytes", "step_factor", "iters", "warmup_iters", "reduce_elements"):
        value = probe.get(key)
        least = {"step_factor": 2, "warmup_iters": 0, "reduce_elements": 0}.get(key, 1)
        if isinstance(value, bool) or not isinstance(value, int) or value < least:
            raise ConfigError(f"probe.{key}={value!r}: use a whole number >= {least}")
    if probe.max_bytes < probe.min_bytes:
        raise ConfigError(
            f"probe.max_bytes={probe.max_bytes} is below probe.min_bytes={probe.min_bytes}: give max_bytes >= min_bytes"
        )
    if int(cfg.nodes) < 2:
        raise ConfigError(f"nodes={cfg.nodes}: mode=probe measures the link between nodes; use nodes=2 or more")


def _fraction(rate_Bps: float, line_mbit: float) -> float:
    """A measured rate as a fraction of the line rate, at most 1 (ClusterSpec's range): a link measured faster
    than ``cluster.link_mbit`` says the setting is low; the record keeps the measured rate."""
    return min(1.0, rate_Bps / (line_mbit * MBIT))


def spec_from_fits(
    cluster: Mapping[str, Any],
    inter: Mapping[str, Mapping[str, float]],
    intra: Mapping[str, Mapping[str, float]] | None,
    world: Mapping[str, Mapping[str, float]] | None = None,
    reduce: Mapping[str, Mapping[str, float]] | None = None,
    inter_all: Mapping[str, Mapping[str, float]] | None = None,
) -> dict[str, Any]:
    """The cluster config ``cluster`` with its ``perf`` block replaced by what the fits measured (the module
    doc's mapping); keys the probe cannot measure are kept."""
    perf = {k: v for k, v in (cluster.get("perf") or {}).items() if k != "fitted_on"}  # measured, not fitted
    line = cluster.get("link_mbit")
    median_alpha = statistics.median(inter[k]["alpha_s"] for k in INTER_KINDS)
    allreduce = inter["allreduce"]["bandwidth_Bps"]
    pairwise = statistics.fmean(inter[k]["bandwidth_Bps"] for k in PAIRWISE)
    if line is None:  # no line rate given: the all-reduce's rate is the link, the exchanges a fraction of it
        perf.update(
            inter_mbit=allreduce / MBIT, inter_efficiency=1.0, exchange_efficiency=min(1.0, pairwise / allreduce)
        )
    else:
        perf.update(inter_efficiency=_fraction(allreduce, line), exchange_efficiency=_fraction(pairwise, line))
    perf["inter_latency_us"] = 1e6 * median_alpha
    if intra:
        perf.update(
            intra_mbit=statistics.median(f["bandwidth_Bps"] for f in intra.values()) / MBIT,
            intra_efficiency=1.0,
            intra_latency_us=1e6 * statistics.median(f["alpha_s"] for f in intra.values()),
        )
    if world:
        perf["world_latency_us"] = {k: 1e6 * world[k]["alpha_s"] for k in INTER_KINDS}
    if inter_all:
        perf["inter_all_latency_us"] = {k: 1e6 * inter_all[k]["alpha_s"] for k in INTER_KINDS}
    if reduce:
        perf["reduce_ns_per_element"] = {k: max(0.0, float(v["extra_ns_per_element"])) for k, v in reduce.items()}
    return {**{k: v for k, v in cluster.items() if k != "perf"}, "perf": perf}


def scaling_spec(
    scaling: Mapping[int, Mapping[int, Sequence[float]]],
    gpus_per_node: int,
    intra_allreduce: Mapping[str, float] | None = None,
) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """The spec's measured all-reduce from the world all-reduce's calls at each node count (``{k: {bytes:
    [seconds, ...]}}``): ``allreduce_table`` (the median call per size), and with two node counts or more
    ``allreduce_shape`` (perf.shape.detect_shape, the node's phase from ``intra_allreduce``, the intra group's
    fit: alpha_s, bandwidth_Bps as bus bandwidth). Returns (the perf keys, the shape's fits for the record:
    the one found and the runner-up, or None with one node count)."""
    m = gpus_per_node
    table = {
        int(k): [[float(b), float(statistics.median(ts))] for b, ts in sorted(v.items())] for k, v in scaling.items()
    }
    perf: dict[str, Any] = {"allreduce_table": table} if table else {}
    if len(table) < 2:
        perf["shape_note"] = (
            "the all-reduce measured at one node count: no shape, a prediction at other node counts is "
            "uncalibrated (probe 3 nodes or more)"
        )
        return perf, None
    points = [Measured(k, b, t) for k, rows in table.items() for b, t in rows]

    def node_time(nbytes: float) -> float:
        if m == 1 or not intra_allreduce:
            return 0.0
        return latency_steps("allreduce", m) * float(intra_allreduce["alpha_s"]) + bus_factor(
            "allreduce", m
        ) * nbytes / float(intra_allreduce["bandwidth_Bps"])

    ranked = rank_shapes(points, m, node_time)
    perf["allreduce_shape"] = {
        k: v for k, v in ranked[0].to_dict().items() if k in ("shape", "alpha_us", "bytes_per_s")
    }
    return perf, {"found": ranked[0].to_dict(), "runner_up": ranked[1].to_dict()}


def _groups(nodes: int, m: int):
    """(the inter-node group of local rank 0, this node's group or None, this process's own inter-node group);
    collective over the world."""
    import torch.distributed as dist

    from birder_repro.comm.topology import default_timeout, layout_groups

    timeout = default_timeout()  # the run's train.timeout_s: a subgroup would wait the backend's 10-30 minutes
    intra_ranks, inter_ranks = layout_groups(nodes * m, m)
    inter = dist.new_group(inter_ranks[0], timeout=timeout)
    mine = None
    for ranks in intra_ranks:  # every rank creates every group, in the same order
        group = dist.new_group(ranks, timeout=timeout) if m > 1 else None
        if dist.get_rank() in ranks:
            mine = group
    own = inter
    for ranks in inter_ranks[1:]:
        group = dist.new_group(ranks, timeout=timeout)
        if dist.get_rank() in ranks:
            own = group
    return inter, mine, own


def probe_worker(cfg: Any, rank: int, device: Any, run_dir: Path) -> dict[str, Any]:
    """One worker of ``mode=probe`` in a joined process group: time and fit; on rank 0 write the spec and return
    what the record holds (``probe``); an empty result elsewhere."""
    import torch.distributed as dist
    from omegaconf import OmegaConf

    n, m = int(cfg.nodes), int(cfg.gpus_per_node)
    p = cfg.probe
    sizes = probe_sizes(p.min_bytes, p.max_bytes, p.step_factor)
    timing = dict(device=device, warmup=int(p.warmup_iters), repeats=int(p.iters))
    inter_group, intra_group, own_inter = _groups(n, m)
    inter = measure(COLLECTIVES, sizes, inter_group, **timing) if rank % m == 0 else None
    dist.barrier()
    # one process per node again, but every local rank's group at once, as the two-level and hierarchical
    # schemes' inter-node steps run: on shared cores each step also waits for the node's other processes
    inter_all = measure(INTER_KINDS, sizes, own_inter, **timing) if m > 1 else None
    dist.barrier()
    intra = measure(COLLECTIVES, sizes, intra_group, **timing) if intra_group is not None else None
    dist.barrier()
    # every process at once, as the flat schemes' collectives run: with several processes a node they take turns
    # on its cores, which neither group above shows
    world = measure(COLLECTIVES, sizes, None, **timing) if n > 1 and m > 1 else None
    dist.barrier()
    # every process at once, as a training step's 16-bit all-reduces run
    reduce = measure_reduce_cost(int(p.reduce_elements), None, **timing) if p.reduce_elements else None
    dist.barrier()
    scaling, scaling16, exchanges = time_scaling(n, m, sizes, timing)
    if rank != 0:
        return {}
    fits = {
        "inter": fit_level(inter, n),
        "intra": fit_level(intra, m) if intra else None,
        "world": fit_level(world, n * m) if world else None,
        "inter_all": fit_level(inter_all, n) if inter_all else None,
    }
    cluster = OmegaConf.to_container(cfg.cluster, resolve=True)
    spec = spec_from_fits(cluster, fits["inter"], fits["intra"], fits["world"], reduce, fits["inter_all"])
    measured, shape = scaling_spec(scaling, m, (fits["intra"] or {}).get("allreduce"))
    spec["perf"].update(measured)
    measured16, shape16 = scaling_spec(scaling16, m, (fits["intra"] or {}).get("allreduce"))
    spec["perf"].update(
        {k.replace("allreduce_", "allreduce16_"): v for k, v in measured16.items() if k != "shape_note"}
    )
    measured_exchanges, exchange_shapes = exchange_spec({g: c for g, c in exchanges.items() if c}, m)
    spec["perf"].update(measured_exchanges)
    spec["probe"] = {
        "measured": record.now(),
        "command": record.read_command(run_dir),
        "nodes": n,
        "gpus_per_node": m,
        "backend": dist.get_backend(),
        "device": str(device),
        "intra_measured": intra is not None,
        "fits": _floats(fits),
    }
    spec_path = Path(run_dir) / SPEC_FILE
    import yaml

    spec_path.write_text(
        "# birder-repro mode=probe: the cluster as measured (birder_repro.perf.probe). Use it with\n"
        f"#   birder-repro mode=predict ... predict.cluster_spec={spec_path.resolve()}\n"
        + yaml.safe_dump(spec, sort_keys=False)
    )
    return {
        "probe": {
            "inter": table_rows(inter, n),
            "intra": table_rows(intra, m) if intra else None,
            "world": table_rows(world, n * m) if world else None,
            "inter_all": table_rows(inter_all, n) if inter_all else None,
            "fits": _floats(fits),
            "reduce": _floats(reduce),
            "cluster_spec_file": str(spec_path.resolve()),
            "cluster_spec": spec["perf"],
            "sizes": sizes,
            "scaling": {str(k): table_rows({"allreduce": v}, k * m) for k, v in scaling.items()},
            "shape": shape,
            "exchange_shapes": exchange_shapes,
            "shape16": shape16,
        }
    }


def _floats(value: Any) -> Any:
    """Floats and dicts only (YAML and JSON both take them)."""
    if isinstance(value, Mapping):
        return {str(k): _floats(v) for k, v in value.items()}
    return None if value is None else float(value)


def format_probe(rec: Mapping[str, Any]) -> str:
    """What ``birder-repro mode=probe`` prints: nccl-tests' table per level, the fits and the spec's path."""
    probe = rec["probe"]
    c = rec["cluster"]
    lines = [
        f"probe: {c['nodes']} nodes x {c['gpus_per_node']} processes, cluster {c['name']}, "
        f"link {c.get('link_mbit') or 'not given'} Mbit/s; median of each call's slowest rank"
    ]
    for level in ("inter", "inter_all", "intra", "world"):
        rows = probe.get(level)
        if not rows:
            continue
        lines += [
            "",
            f"{LEVELS[level]}:",
            f"{'collective':>15s} {'size (B)':>11s} {'time (us)':>11s} {'algbw (GB/s)':>13s} "
            f"{'busbw (GB/s)':>13s} {'busbw (Mbit/s)':>15s}",
        ]
        for r in rows:
            lines.append(
                f"{r['kind']:>15s} {r['bytes']:11d} {1e6 * r['seconds']:11.1f} {r['algbw_Bps'] / 1e9:13.4f} "
                f"{r['busbw_Bps'] / 1e9:13.4f} {r['busbw_Bps'] / MBIT:15.1f}"
            )
        for kind, f in probe["fits"][level].items():
            lines.append(
                f"  fit {kind}: alpha {1e6 * f['alpha_s']:.0f} us, bus bandwidth {f['bandwidth_Bps'] / MBIT:.1f} Mbit/s"
            )
    for dtype, r in (probe.get("reduce") or {}).items():
        lines.append(
            f"{dtype} sum over every process: {int(r['elements'])} elements {1e6 * r['seconds']:.0f} us, fp32 of "
            f"the same bytes {1e6 * r['fp32_same_bytes_s']:.0f} us: {r['extra_ns_per_element']:.2f} ns an "
            "element added beyond its bytes"
        )
    for k, rows in (probe.get("scaling") or {}).items():
        lines.append(
            f"world all-reduce over the first {k} nodes: "
            + ", ".join(f"{r['bytes']} B {1e6 * r['seconds']:.0f} us" for r in rows)
        )
    shape = probe.get("shape")
    if shape:
        found, runner = shape["found"], shape["runner_up"]
        lines.append(
            f"all-reduce shape: {found['shape']} (alpha {found['alpha_us']:.0f} us a step, "
            f"{8 * found['bytes_per_s'] / 1e6:.1f} Mbit/s through a node's link); runner-up {runner['shape']}, "
            f"residual {runner['residual']:.3g} against {found['residual']:.3g}"
        )
    for group, got in (probe.get("exchange_shapes") or {}).items():
        if "found" in got:
            found, runner = got["found"], got["runner_up"]
            lines.append(
                f"{group} exchange shape (all-gather, all-to-all): {found['shape']} (alpha {found['alpha_us']:.0f} us "
                f"a step, {8 * found['bytes_per_s'] / 1e6:.1f} Mbit/s); runner-up {runner['shape']}, residual "
                f"{runner['residual']:.3g} against {found['residual']:.3g}"
            )
        else:
            lines.append(f"{group} exchange: {got['note']}")
    skip = ("allreduce_table", "allreduce_shape", "exchange_shape", "allreduce16_table", "allreduce16_shape")
    perf = {k: v for k, v in probe["cluster_spec"].items() if k not in skip}
    lines += [
        "",
        "cluster spec (perf): "
        + ", ".join(f"{k} {v:.3g}" if isinstance(v, float) else f"{k} {v}" for k, v in perf.items()),
        f"[birder-repro] cluster spec: {probe['cluster_spec_file']}",
        f"[birder-repro] predict with it: birder-repro mode=predict ... "
        f"predict.cluster_spec={probe['cluster_spec_file']}",
    ]
    return "\n".join(lines)


def load_cluster_spec(path: Any) -> dict[str, Any]:
    """A cluster spec YAML (mode=probe's, or any cluster config) as a mapping for ClusterSpec.from_config."""
    import yaml

    path = Path(path)
    if path.is_dir():
        path = path / SPEC_FILE
    if not path.is_file():
        raise FileNotFoundError(
            f"predict.cluster_spec={path}: no such file (birder-repro mode=probe writes "
            f"{SPEC_FILE} in its run directory)"
        )
    spec = yaml.safe_load(path.read_text())
    if not isinstance(spec, dict) or "perf" not in spec:
        raise ValueError(f"predict.cluster_spec={path}: not a cluster spec (no perf block)")
    return spec

"""``mode=predict``: a run record predicted by the performance model instead of measured.

``predict_record(cfg)`` takes the resolved config of a run (task, optim, nodes, gpus_per_node, cluster,
train.batch_size, predict.profile) and returns a record with the keys of a measured one (DESIGN.md "Run
records and tables") and ``status: "predicted"``, plus its inputs: the profile and the cluster spec.

``predict.profile``: ``paper`` (the paper's 8 x A100 nodes, birder_repro.perf.paper_profiles, chosen by task
and batch per GPU), a run directory or record.json holding a ``profile``, or a profile JSON file; or a list of
them, 1-node runs of one model at several batch sizes (``predict.profile=[run_b8,run_b32]``): the compute is then
affine in the batch (perf.profile.combine_batches), not linear through 0.

``predict.cluster_spec``: a cluster spec YAML (``birder-repro mode=probe`` writes one, birder_repro.perf.probe),
whose link figures the model uses instead of the cluster config's ``perf`` block; null: the cluster config's.

Every multi-node prediction names its route (perf.cluster.ClusterSpec.route): ``probed`` where the spec holds the
all-reduce measured at that node count or its shape, ``uncalibrated`` where it does not (a cluster config's line
rate times its shipped efficiency), with the error band ``make validate-published`` found for that route.

``predict.implementation`` (default ``this``): how the schemes run (birder_repro.perf.implementations):
``this`` project's hooks, every scheme overlapped with the backward pass; ``paper``: as the Birder paper's
runs did (Birder's hook and 1-bit Adam's compressed all-reduce not overlapped).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from birder_repro.config.plain import plain_config
from birder_repro.config.settings import resolve_gpus_per_node
from birder_repro.run import record as records
from birder_repro.run.directory import RunDir

from .cluster import PAIRWISE, ROUTE_ERROR_BANDS, ClusterSpec
from .model import predict_run
from .paper_profiles import paper_profile
from .profile import LEFTOVER_WARN, combine_batches, load_profile
from .schemes import bucket_collectives, scheme_for_optim

__all__ = ["predict_record", "write_predicted_record", "format_prediction"]


def _warmup_fraction(optim: Mapping[str, Any], scheme: str, steps: Any) -> float:
    """1-bit Adam / LAMB's ``freeze`` and PowerSGD's ``comm.start_iter``: a fraction (< 1) or steps."""
    value = optim.get("freeze") if scheme in ("onebit", "fsdp_onebit") else (optim.get("comm") or {}).get("start_iter")
    if scheme not in ("onebit", "fsdp_onebit", "powersgd") or value is None:
        return 0.0
    value = float(value)
    if value < 1:
        return value
    if not steps:
        raise ValueError(f"optim warmup of {value:g} steps needs train.steps to say what share of the run it is")
    return min(value / float(steps), 1.0)


def predict_record(cfg: Any) -> dict[str, Any]:
    """The predicted record of the run ``cfg`` describes (see the module doc)."""
    c = plain_config(cfg)
    source = (c.get("predict") or {}).get("profile")
    implementation = str((c.get("predict") or {}).get("implementation") or "this")
    if source is None:
        raise ValueError(
            "predict.profile is null: give 'paper', a run directory or record.json with a profile, "
            "or a profile JSON file"
        )
    task, optim, train = c["task"]["name"], c["optim"], c.get("train") or {}
    gpus = c.get("gpus_per_node", 1)
    if gpus == "auto":
        gpus = resolve_gpus_per_node(gpus)
    nodes, gpus, batch = int(c["nodes"]), int(gpus), int(train["batch_size"])
    accumulate = int(train.get("accumulate") or 1)  # micro-batches a step: compute for batch x accumulate samples
    spec_file = (c.get("predict") or {}).get("cluster_spec")
    if spec_file:  # measured by mode=probe: its perf block replaces the cluster config's (its line rate too)
        from .probe import load_cluster_spec

        cluster_config = load_cluster_spec(spec_file)
    else:
        cluster_config = c["cluster"]
    cluster = ClusterSpec.from_config(cluster_config)
    # the paper's rows the links were fitted on (the report marks those cells in-sample); none for a measured spec
    fitted_on = (cluster_config.get("perf") or {}).get("fitted_on")
    profile = (
        paper_profile(task=task, batch_size=batch, node=cluster, implementation=implementation)
        if source == "paper"
        else combine_batches([load_profile(s) for s in source])  # several: one model at several batch sizes
        if isinstance(source, (list, tuple))
        else load_profile(source)
    )
    if profile.task != task:
        raise ValueError(f"profile {profile.name!r} is for task {profile.task!r}, not {task!r}")
    parallel = str(c.get("parallel") or "ddp")
    scheme = scheme_for_optim(
        optim["name"], (optim.get("comm") or {}).get("scheme"), parallel, quantize=optim.get("quantize")
    )
    rank = int((optim.get("comm") or {}).get("rank", 1) or 1)
    run = predict_run(
        profile,
        cluster,
        nodes,
        gpus,
        scheme,
        batch * accumulate,
        rank,
        warmup_fraction=_warmup_fraction(optim, scheme, train.get("steps")),
        implementation=implementation,
        local_steps=int(optim.get("local_steps") or 1),  # DiLoCo's H
    )
    mean, stages = run["run"], run["stages"]
    by_stage = None
    if len(stages) > 1:
        by_stage = {s: p["throughput_samples_per_s"] for s, p in stages.items()}
    return {
        "status": "predicted",
        "task": task,
        "optim": optim["name"],
        "cluster": {
            "name": c["cluster"].get("name"),
            "nodes": nodes,
            "gpus_per_node": gpus,
            "interconnect": c["cluster"].get("interconnect"),
            "link_mbit": c["cluster"].get("link_mbit"),
        },
        "world_size": nodes * gpus,
        "parallel": parallel,
        "batch_size": batch,
        "accumulate": accumulate,
        "global_batch_size": batch * nodes * gpus * accumulate,
        "throughput_samples_per_s": mean["throughput_samples_per_s"],
        "throughput_by_stage": by_stage,
        "step_time_s": {
            "total": mean["total_s"],
            "compute": mean["compute_s"],
            "communication": mean["communication_s"],
            "compression": mean["compression_s"],
            "data_wait": mean["data_wait_s"],
        },
        "data_wait_s_per_step": mean["data_wait_s"],
        "intra_node_bytes_per_step": mean["intra_node_bytes"],
        "inter_node_bytes_per_step": mean["inter_node_bytes"],
        "collectives_per_step": mean["collectives"],
        "prediction": {
            "scheme": scheme,
            "implementation": implementation,
            "stages": stages,
            "weights": run["weights"],
            "fitted_on": fitted_on,
            "cluster_spec_file": spec_file,
            # how the all-reduce across nodes was priced (ClusterSpec.route) and that route's validated error
            "route": cluster.route(nodes),
            "error_band": ROUTE_ERROR_BANDS.get(cluster.route(nodes)),
            # how each exchange across nodes of the scheme (all-to-all, all-gather) was priced
            "exchange_routes": exchange_routes(cluster, scheme, profile.parameter_count, nodes, gpus),
        },
        "profile": profile.to_dict(),
        "cluster_spec": cluster.to_dict(),
    }


def exchange_routes(cluster: ClusterSpec, scheme: str, elements: int, nodes: int, gpus: int) -> dict[str, str]:
    """Per group of the pairwise exchanges ``scheme`` sends across nodes (world: 1-bit Adam's; inter: Birder's):
    ``probed`` where the spec holds that exchange's own measured shape (mode=probe's exchange_shape), else
    ``uncalibrated`` (the links' formula), ``emulated`` on the emulated cluster; empty on one node or for a scheme
    without such exchanges."""
    if nodes <= 1:
        return {}
    ops = bucket_collectives(scheme, elements, nodes, gpus)
    groups = sorted({op.group for op in ops if op.kind in PAIRWISE and op.group != "intra"})
    if cluster.shared_host:  # the emulated cluster's exchanges: its wait model (make validate-emulated)
        return {g: "emulated" for g in groups}
    return {g: "probed" if cluster.measured_exchange(g) is not None else "uncalibrated" for g in groups}


def write_predicted_record(cfg: Any, run_dir: Any, started: str) -> dict[str, Any]:
    """The predicted record of the resolved config ``cfg`` with the keys every record has (the config, the
    command, versions), written to ``run_dir/record.json``; returned."""
    from pathlib import Path

    rec = records.base_record(cfg, Path(run_dir))
    rec.update(predict_record(cfg))
    rec.update(started=started, ended=records.now(), device=f"predicted for: {rec['profile']['device']}")
    RunDir(run_dir).write(rec)
    return rec


def format_prediction(rec: Mapping[str, Any]) -> str:
    """The few lines ``birder-repro mode=predict`` prints: throughput, the step's parts, the bytes."""
    c, st, pred = rec["cluster"], rec["step_time_s"], rec["prediction"]
    ms = {k: 1e3 * float(v or 0.0) for k, v in st.items()}
    lines = [
        f"predicted:  {rec['task']} with {rec['optim']} ({pred['scheme']}, implementation {pred['implementation']})"
        f" on {c['nodes']} nodes x {c['gpus_per_node']} GPUs, cluster {c['name']}; profile {rec['profile']['name']}",
        f"throughput: {rec['throughput_samples_per_s']:.1f} samples/s (global batch {rec['global_batch_size']})",
        f"step time:  {ms['total']:.1f} ms = compute {ms['compute']:.1f} + communication {ms['communication']:.1f}"
        f" + compression {ms['compression']:.1f} + data wait {ms.get('data_wait', 0.0):.1f} ms",
        f"sent/step:  intra-node {rec['intra_node_bytes_per_step'] / 1e6:.3f} MB, inter-node "
        f"{rec['inter_node_bytes_per_step'] / 1e6:.3f} MB per process, {rec['collectives_per_step']:.0f} "
        "collectives",
    ]
    route, band = pred.get("route"), pred.get("error_band")
    if route in ("probed", "uncalibrated") and band:
        how = (
            "the all-reduce as a probe measured it"
            if route == "probed"
            else "no probe at this node count: the line rate x the shipped efficiency; run mode=probe (3 nodes or "
            "more find the all-reduce's shape) and pass predict.cluster_spec"
        )
        lines.append(
            f"route:      {route} ({how}); make validate-published found this route's step time within "
            f"{100 * band['step_median']:.0f} % (median), {100 * band['step_worst']:.0f} % (worst) on real clusters"
        )
    for group, how in (pred.get("exchange_routes") or {}).items():
        lines.append(
            f"exchange:   {group} {how} "
            + (
                "(its own shape and rate, as a probe measured it)"
                if how == "probed"
                else "(the emulated cluster's validated wait model)"
                if how == "emulated"
                else "(the links' formula: run mode=probe at 3 nodes or more, which times the all-to-all and "
                "all-gather, and pass predict.cluster_spec)"
            )
        )
    share = (rec["profile"].get("unexplained_share") or {}).get(pred["scheme"])
    if share is not None and share > LEFTOVER_WARN:
        lines.append(
            f"caution:    the profile's 1-node step is {100 * share:.0f} % unexplained by the model "
            f"(scheme_overhead_s, charged once a step): a prediction far from that layout is less certain"
        )
    if rec.get("throughput_by_stage"):
        lines.append(
            "by stage:   " + ", ".join(f"{k} {v:.1f} samples/s" for k, v in rec["throughput_by_stage"].items())
        )
    return "\n".join(lines)

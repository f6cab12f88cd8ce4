"""The run record (``record.json``, one per run): every key, documented once, for its writer and its readers.

The writer (:mod:`birder_repro.run.record`, with the training loop's figures and the probes') builds a record from
:data:`KEYS` and refuses a key that is not documented here; the readers (:mod:`birder_repro.report.records`,
:mod:`birder_repro.run.summary`) read values through :func:`get`, which refuses an undocumented key, so that a
misspelt name fails loudly instead of reading as missing. Outside scripts can rely on these names
(DESIGN.md, "Run records and tables"). A failed run's record has the same keys, with ``status: failed``, the
one-line ``error``, the ``traceback`` and null measurements; a diverged run's, ``status: diverged``, the
one-line ``error`` and ``diverged_at_step``; an interrupted run's (a signal stopped it: Ctrl-C, SIGTERM),
``status: interrupted``, ``stopped_at_step``, ``checkpoint`` and ``resume_command``. A run resumed in its own
directory keeps one record, with one entry per attempt in ``attempts``; its ``steps``, ``samples`` and
``time_to_target`` count across the attempts. Units: bytes, seconds, samples; "per step" means per optimizer step
and, for
times and bytes, per process (the mean over processes), over the timed steps only.

Metrics: each task declares its own (``Task.metrics``, with ``Task.headline_metric`` the one the paper
reports first); ``metrics`` holds them in that order, headline first, then any other figure the evaluation
returned, then ``eval_loss`` (the evaluation's own loss) and ``loss`` (the training loss, ``final_loss``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

__all__ = [
    "Key",
    "KEYS",
    "NAMES",
    "CLUSTER_PARTS",
    "STEP_TIME_PARTS",
    "OVERLAP_PARTS",
    "TARGET_PARTS",
    "LOSS_METRICS",
    "empty_record",
    "check",
    "get",
    "declared_metrics",
    "headline_metric",
    "ordered_metrics",
    "metric_names",
]

CLUSTER_PARTS = ("name", "nodes", "gpus_per_node", "interconnect", "link_mbit")
# total = the sum of the other four (data_wait: the wait for the data loader's batch, counted in throughput)
STEP_TIME_PARTS = ("total", "compute", "communication", "compression", "data_wait")
# beside step_time_s, not parts of it: whether the hook overlaps backward, the exposed time (step - compute), and
# the seconds per step the hook spent in collectives and in compression work, hidden or not
OVERLAP_PARTS = ("overlapped", "exposed", "collectives", "compression_work")
LOSS_METRICS = ("eval_loss", "loss")  # every task's, after its own metrics
# time to accuracy (birder_repro.train.target): the target (task.target), whether and when it was reached
TARGET_PARTS = (
    "metric",
    "target",
    "direction",
    "reached",
    "step",
    "samples",
    "seconds",
    "wall_s",
    "value",
    "evaluations",
    "eval_every",
    "clock_from_step",
)


@dataclass(frozen=True)
class Key:
    name: str
    doc: str
    parts: tuple[str, ...] = ()  # the keys of a nested object, where they are fixed
    empty: Any = None  # the value before (or without) a measurement


KEYS: tuple[Key, ...] = (
    # ---- what ran, from the config
    Key(
        "status",
        "completed | failed | diverged (stopped after train.diverge_after consecutive non-finite steps; "
        "its measurements are null) | interrupted (a signal stopped it, Ctrl-C or SIGTERM: every rank after the "
        "same step, with a checkpoint there by default; its measurements are null; resume_command continues it) "
        "| predicted (mode=predict: the performance model's, nothing ran)",
    ),
    Key(
        "error",
        "why the run did not complete, in one line: a failed run's first failing rank and cause "
        "(exception type and message) and where the full output is, a diverged run's step and likely cause, or an "
        "interrupted run's signal, step, checkpoint and resume command; null when completed",
    ),
    Key(
        "traceback",
        "a failed run's traceback (the first failing rank's; every rank's is in output.log); null otherwise",
    ),
    Key(
        "diverged_at_step",
        "a diverged run's last step: the last of train.diverge_after consecutive steps whose "
        "training loss was non-finite on some rank or that the hook skipped for a non-finite gradient; null "
        "otherwise",
    ),
    Key(
        "stopped_at_step",
        "an interrupted run's last step, the one every rank completed before stopping (null: "
        "it stopped before its first step); null otherwise",
    ),
    Key("checkpoint", "an interrupted run's newest complete checkpoint directory (null: none, it resumes afresh)"),
    Key(
        "resume_command",
        "an interrupted run's command that resumes it in its own directory: its command line "
        "and hydra.run.dir=<run directory> (multi-node: on every node, with that node's launcher.node_rank)",
    ),
    Key(
        "attempts",
        "one entry per launch of this run directory (a resumed run has several): launch (its id), "
        "started, ended, status, from_step (the checkpoint's step it started from; null where unknown), to_step "
        "(the last step it completed), restarts (torchrun's within it)",
        empty=[],
    ),
    Key(
        "config_digest",
        "16 hex digits of the resolved config less the settings that cannot change a result "
        "(birder_repro.run.digest.NO_RESULT, each with why: logger, launcher, dry_run, checkpointing, resume and stop "
        "settings, the target's ladder; a table's rows leave the same out): runs of "
        "one digest are the same experiment, seed included; train.resume=auto continues only such a run",
    ),
    Key("task", "the task's name (conf/task)"),
    Key("optim", "the optimizer's name (conf/optim)"),
    Key(
        "cluster",
        "the layout: cluster name, nodes, processes (GPUs) per node, interconnect, link Mbit/s",
        CLUSTER_PARTS,
    ),
    Key("world_size", "processes in the layout: nodes x gpus_per_node"),
    Key(
        "parallel",
        "ddp (DDP and the scheme's hook) | fsdp (FSDP2, sharded inside each node: the 1-bit schemes' "
        "exchange between nodes in its all-reduce hook, the baselines on native HSDP)",
        empty="ddp",
    ),
    Key(
        "batch_size",
        "samples per micro-batch per process (train.batch_size; a step is one micro-batch unless train.accumulate > 1)",
    ),
    Key(
        "accumulate", "micro-batches per optimizer step and process (train.accumulate: gradient accumulation)", empty=1
    ),
    Key("global_batch_size", "samples per optimizer step over all processes: batch_size x world_size x accumulate"),
    Key("lr", "the peak learning rate the optimizer got (optim.lr, scaled by the global batch if asked)"),
    Key("data", "what the training data was, real or synthetic"),
    # ---- how long
    Key("steps", "optimizer steps of the whole run"),
    Key(
        "planned_steps",
        "the run's planned length (train.steps or epochs): the schedule's length; more than "
        "steps when train.stop_at_target ended it at the target",
    ),
    Key(
        "stopped_at_target",
        "train.stop_at_target ended the run at the first evaluation that reached the target",
        empty=False,
    ),
    Key("resumed_from_step", "the checkpoint's step a resumed run started from; null when not resumed"),
    Key("restarts", "times torchrun restarted the workers after a failure (train.max_restarts)", empty=0),
    Key(
        "nonfinite_steps",
        "steps skipped on every rank because some rank's gradient held a NaN or Inf (the "
        "compressed hooks, optim.comm.nonfinite=skip)",
        empty=0,
    ),
    Key(
        "outer_steps",
        "DiLoCo: outer steps taken (the nodes' pseudo-gradients averaged, every optim.local_steps steps); null "
        "for the other optimizers",
    ),
    Key(
        "outer_step_s",
        "DiLoCo: mean seconds of an outer step on rank 0's host (the exchange across nodes and the Nesterov "
        "update; on a GPU the host's share: collectives are queued); null for the other optimizers",
    ),
    Key(
        "steps_redone",
        "steps trained again after restarts: from each restart's checkpoint to the step the failed attempt had reached",
        empty=0,
    ),
    Key("samples", "training samples over all processes, resumes included"),
    Key("epochs_trained", "samples / training-set size"),
    Key("timing_warmup_steps", "first steps left out of throughput, step time and bytes per step"),
    Key("timed_steps", "steps the throughput, step time and bytes per step are over"),
    # ---- how fast
    Key(
        "throughput_samples_per_s",
        "global samples per second over the timed steps, each counted whole: "
        "the wait for its batch included (step_time_s.data_wait)",
    ),
    Key("throughput_by_stage", "the same per stage of the hook (1-bit Adam / LAMB: warmup, compression)", empty={}),
    Key(
        "step_time_s",
        "mean step time and its parts: compute, communication not hidden by compute, "
        "compression, data_wait (for the data loader's batch); the parts sum to total",
        STEP_TIME_PARTS,
    ),
    Key("step_time_s_by_stage", "step_time_s per stage of the hook", empty={}),
    Key(
        "overlap_s",
        "the hook's overlap with compute: overlapped (its work runs beside backward), exposed "
        "(step - compute), collectives and compression_work (seconds per step, hidden or not)",
        OVERLAP_PARTS,
        empty={},
    ),
    Key(
        "startup_s",
        "seconds from the start of rank 0's worker process to its first training step (imports, "
        "process group, data, model, DDP); not in time_to_target",
    ),
    Key(
        "first_step_s",
        "rank 0's first training step, in seconds: it holds one-time work (JIT compilation or "
        "its cache load, DDP's first iteration)",
    ),
    Key(
        "compile_s",
        "first_step_s less the median step: the first step's one-time work (a resumed run: every attempt's, "
        "summed), left out of time_to_target.seconds and of Figure 2's time axis",
    ),
    Key(
        "training_clock",
        "what time_to_target.seconds and metrics.jsonl's train_s count: loop (birder_repro.train.target: the "
        "training loop's wall time, the same on every rank); absent in older records, whose clock summed rank 0's "
        "step times (report.clock re-reads their logs on the loop clock)",
    ),
    Key(
        "loop_step_s",
        "the training clock's mean seconds a timed step (the loop's whole pass: the step, the loop's own "
        "collectives, the next batch, the log lines; evaluations and checkpoints left out); beyond "
        "step_time_s.total it is what the loop adds to every step (rank 0's; this attempt's timed steps)",
    ),
    Key("forward_backward_s", "forward + backward without communication (median of the calibration passes)"),
    Key("compute_calibration_passes", "how many calibration passes measured forward_backward_s"),
    Key("data_wait_s_per_step", "mean wait for the data loader per step (also step_time_s.data_wait)"),
    Key(
        "profile",
        "the run's profile for the performance model, measured on its device "
        "(birder_repro.perf.profile.Profile as a dict: forward+backward, optimizer step, each DDP "
        "bucket's elements and when it became ready in backward, compression seconds per element, "
        "measured link rate); a predicted record: the profile it was predicted from",
    ),
    # ---- what was sent
    Key("intra_node_bytes_per_step", "payload bytes a process sent within its node per step (the hook's count)"),
    Key("inter_node_bytes_per_step", "payload bytes a process sent across nodes per step (the hook's count)"),
    Key("intra_node_bytes_per_step_by_stage", "intra_node_bytes_per_step per stage of the hook", empty={}),
    Key("inter_node_bytes_per_step_by_stage", "inter_node_bytes_per_step per stage of the hook", empty={}),
    Key("parameters", "trainable parameters of the model"),
    Key(
        "memory",
        "bytes per process, one entry per rank (birder_repro.train.parallel.memory_report): parameters, "
        "gradients and optimizer_state (the optimizer's and the hook's state) this process holds, and "
        "peak (the process's peak resident memory on CPU, peak allocated on CUDA)",
    ),
    Key(
        "fp32_allreduce_bytes_per_step",
        "bytes a process would send in an fp32 ring all-reduce of the gradients (birder_repro.comm.accounting)",
    ),
    Key("fp32_allreduce_intra_node_bytes_per_step", "the intra-node share of fp32_allreduce_bytes_per_step"),
    Key("fp32_allreduce_inter_node_bytes_per_step", "the inter-node share of fp32_allreduce_bytes_per_step"),
    Key(
        "link_bytes_per_step",
        "emulated clusters: bytes each node's link sent per timed step as the kernel "
        "counted them (headers included), in node order; null elsewhere",
    ),
    Key("link_packets_per_step", "emulated clusters: packets each node's link sent per timed step"),
    Key("link_tcp_retransmits_per_step", "emulated clusters: TCP segments each node retransmitted per step"),
    Key("link_interfaces", "emulated clusters: the interface counted on each node"),
    Key("link_header_bytes_per_packet", "emulated clusters: header bytes per packet inside the link counts"),
    # ---- predicted records (mode=predict, status: predicted)
    Key("collectives_per_step", "predicted: collectives one process issues per step"),
    Key(
        "prediction",
        "predicted: scheme, implementation, each stage's predicted step and the stages' weights, "
        "fitted_on (the paper rows the cluster's link numbers were fitted on: perf.fitted_on) and "
        "cluster_spec_file (predict.cluster_spec, if given)",
    ),
    Key("cluster_spec", "predicted: the cluster as the performance model saw it (birder_repro.perf.cluster)"),
    Key(
        "probe",
        "mode=probe (collectives timed, no training): per level (inter, intra) nccl-tests' rows (kind, bytes, "
        "seconds, algbw_Bps, "
        "busbw_Bps), each collective's fit (alpha_s, bandwidth_Bps), the sizes, and the cluster spec "
        "written (cluster_spec_file, its perf block as cluster_spec)",
    ),
    # ---- how well
    Key("final_loss", "the training loss at the end (see loss_definition)"),
    Key("loss_definition", "how final_loss was taken"),
    Key("headline_metric", "the task's main metric (its Task.headline_metric), a key of metrics"),
    Key("metrics", "the task's metrics at the end, headline first, then eval_loss and loss", empty={}),
    Key(
        "time_to_target",
        "time to accuracy (birder_repro.train.target; null without task.target): metric, "
        "target and direction (higher | lower is better), reached (true | false), and at the first evaluation "
        "that reached it: step, samples (all processes), seconds (training clock from the first step: the "
        "training loop's wall time, evaluations, checkpoints, calibration passes and compile_s left out), "
        "wall_s (wall-clock from the first step's start to the end of that evaluation, everything included), "
        "value; evaluations (how many ran), "
        "eval_every (train.eval_every: 0 = the final one only), clock_from_step (0: the clock, samples and "
        "evaluations count from the run's first step, across the attempts of a resumed run, whose checkpoints carry "
        "them; else the step a resume started from, for a checkpoint that did not carry them)",
        TARGET_PARTS,
    ),
    # ---- where and when
    Key("device", "cpu, or cuda with the GPU's name"),
    Key("backend", "the torch.distributed backend: gloo | nccl"),
    Key("precision", "train.precision: fp32 | bf16 | fp16 (autocast in forward and loss; fp16 with loss scaling)"),
    Key("loss_scale", "fp16: the loss scale at the end (torch.amp.GradScaler's); null otherwise"),
    Key(
        "versions",
        "Python and the versions of the packages a result depends on; the workers add triton, and on "
        "a GPU cuda (torch's build) and nccl",
    ),
    Key("git_sha", "the commit of the checkout that ran"),
    Key("started", "local time with UTC offset, ISO 8601"),
    Key("ended", "local time with UTC offset, ISO 8601"),
    Key(
        "host_load",
        "the host's load average when the run directory was made (start) and when the record was written (end): "
        "os.getloadavg()'s 1, 5 and 15 minutes each, and the host's cpus; null where the platform has none",
    ),
    Key("run_dir", "the run directory"),
    Key("command", "the command line that reproduces the run"),
    Key("config", "the resolved config (Hydra's own node left out)"),
)
NAMES = frozenset(k.name for k in KEYS)
_BY_NAME = {k.name: k for k in KEYS}


def empty_record() -> dict[str, Any]:
    """Every key with its empty value, in the documented order."""
    return {k.name: (type(k.empty)(k.empty) if isinstance(k.empty, (dict, list)) else k.empty) for k in KEYS}


def check(record: Mapping[str, Any]) -> None:
    """Refuse keys that are not documented here (a writer adding one documents it in :data:`KEYS` first)."""
    unknown = sorted(set(record) - NAMES)
    if unknown:
        raise ValueError(f"run record keys not documented in birder_repro.run.schema.KEYS: {', '.join(unknown)}")
    for key in ("cluster", "step_time_s", "overlap_s", "time_to_target"):
        value = record.get(key)
        if isinstance(value, Mapping) and set(value) - set(_BY_NAME[key].parts):
            raise ValueError(
                f"record[{key!r}] has keys {sorted(set(value) - set(_BY_NAME[key].parts))}, "
                f"not among {_BY_NAME[key].parts}"
            )


def get(record: Mapping[str, Any], key: str, *parts: str, default: Any = None) -> Any:
    """``record[key][part]...``, or ``default`` where a level is missing, null or not an object.

    ``key`` must be documented; so must ``parts`` where the key's parts are fixed (cluster, step_time_s).
    """
    if key not in NAMES:
        raise KeyError(f"{key!r} is not a run record key (birder_repro.run.schema.KEYS)")
    fixed = _BY_NAME[key].parts
    if parts and fixed and parts[0] not in fixed:
        raise KeyError(f"{key}.{parts[0]} is not a run record key; {key} has {', '.join(fixed)}")
    value: Any = record
    for name in (key, *parts):
        if not isinstance(value, Mapping) or value.get(name) is None:
            return default
        value = value[name]
    return value


# ------------------------------------------------------------------------------------------- metrics
def declared_metrics(task) -> tuple[str, ...]:
    """The metrics a task declares (``Task.metrics``), headline first."""
    names = tuple(getattr(task, "metrics", ()) or ())
    headline = headline_metric(task)
    return ((headline,) if headline else ()) + tuple(m for m in names if m != headline)


def headline_metric(task) -> str | None:
    """``Task.headline_metric``, else the first of ``Task.metrics``; None for a task without metrics."""
    names = tuple(getattr(task, "metrics", ()) or ())
    return getattr(task, "headline_metric", "") or (names[0] if names else None)


def ordered_metrics(
    metrics: Mapping[str, float], declared: Iterable[str] = (), headline: str | None = None
) -> dict[str, float]:
    """``metrics`` in the record's order: ``headline``, the declared ones, the others by name, then losses."""
    first = [headline] if headline else []
    own = [m for m in [*first, *declared] if m in metrics and m not in LOSS_METRICS]
    others = sorted(m for m in metrics if m not in own and m not in LOSS_METRICS)
    order = list(dict.fromkeys(own)) + others + [m for m in LOSS_METRICS if m in metrics]
    return {m: metrics[m] for m in order}


def metric_names(records: Iterable[Mapping[str, Any]]) -> list[str]:
    """Every metric any of ``records`` has, in a stable order: each record's own order (headline first) as
    records come, new names appended, and the losses last. Pass the records sorted (by task, run)."""
    records = list(records)
    names: list[str] = []
    for record in records:
        metrics = get(record, "metrics", default={})
        ordered = ordered_metrics(metrics, metrics.keys(), get(record, "headline_metric"))
        names += [m for m in ordered if m not in names and m not in LOSS_METRICS]
    seen = {m for record in records for m in get(record, "metrics", default={})}
    return names + [m for m in LOSS_METRICS if m in seen]

"""The user's query to ``mode=advise``: the layout and link the advice is priced on, and what the user's runs
would run (model, target, batch, evaluation cadence, run length, the command-line overrides), read from the
resolved config; and which runs are the query's (its model, its target)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from birder_repro.config.settings import global_batch, resolve_gpus_per_node

from .advise import LINK_GRID
from .cluster import ClusterSpec

__all__ = ["Layout", "layout_of", "planned_steps", "same_model", "same_target", "query_runs"]


@dataclass
class Layout:
    """The user's query: the layout and link the advice is priced on, and what its runs would run (model,
    target, batch, evaluation cadence, its command-line overrides) for the commands that measure."""

    task: str
    nodes: int
    gpus_per_node: int
    batch_size: int  # per process and micro-batch step, times accumulate
    global_batch: int
    cluster: str
    cluster_config: dict[str, Any]
    link_mbit: float
    implementation: str = "this"
    links: list[float] = field(default_factory=lambda: [float(x) for x in LINK_GRID])
    model: dict[str, Any] | None = None  # the query's model config; None: runs and profiles of any model count
    target: tuple[str, float, str] | None = None  # the query's task.target: metric, value, higher | lower
    baseline: str | None = None  # the task's baseline optimizer (task.baseline)
    accumulate: int = 1
    eval_every: int = 0  # the query's train.eval_every (0 where train.eval=false)
    planned_steps: int | None = None  # the query's run length in steps, where the config says it
    query: list[str] = field(default_factory=list)  # the query's command-line overrides
    seq_length: int | None = None  # the query's data.max_seq_length (a sequence task's), where it has one
    precision: str = "fp32"  # the query's train.precision

    def spec(self, link: float) -> ClusterSpec:
        return ClusterSpec.from_config({**self.cluster_config, "link_mbit": float(link)})


def planned_steps(train: Mapping[str, Any], data: Mapping[str, Any], global_batch: int) -> int | None:
    """The run's length in steps: ``train.steps``, else its epochs over the task's training set as its config
    gives the size (``data.synthetic_train_size``, the real set's); None where neither is known."""
    if train.get("steps"):
        return int(train["steps"])
    size = data.get("synthetic_train_size")
    if train.get("epochs") and size:
        return math.ceil(float(train["epochs"]) * math.ceil(int(size) / global_batch))
    return None


def layout_of(cfg: Any, query: Sequence[str] = ()) -> Layout:
    """The user's query from the resolved config: nodes, GPUs, batch, cluster and its link (``predict.cluster_spec``,
    a probed link, in place of the cluster config's perf block where given, as mode=predict reads it), the model,
    the target, the evaluation cadence, the run's length; ``query``: its command-line overrides."""
    from omegaconf import OmegaConf

    c: dict[str, Any] = cfg if isinstance(cfg, dict) else OmegaConf.to_container(cfg, resolve=True)  # type: ignore[assignment]
    predict, adv = c.get("predict") or {}, c.get("advise") or {}
    if predict.get("cluster_spec"):
        from .probe import load_cluster_spec

        cluster_config = dict(load_cluster_spec(predict["cluster_spec"]))
    else:
        cluster_config = dict(c["cluster"])
    train = c.get("train") or {}
    accumulate = int(train.get("accumulate") or 1)
    task = c.get("task") or {}
    target = task.get("target") or {}
    gb = global_batch(cfg)
    data = c.get("data") or {}
    return Layout(
        task=task["name"],
        nodes=int(c["nodes"]),
        gpus_per_node=resolve_gpus_per_node(c["gpus_per_node"]),
        batch_size=int(train["batch_size"]) * accumulate,
        global_batch=gb,
        cluster=str(c["cluster"].get("name")),
        cluster_config=cluster_config,
        link_mbit=float(ClusterSpec.from_config(cluster_config).inter_mbit),
        implementation=str(predict.get("implementation") or "this"),
        links=[float(x) for x in (adv.get("links") or LINK_GRID)],
        model=dict(c.get("model") or {}),
        target=(str(target["metric"]), float(target["value"]), str(target.get("direction") or "higher"))
        if target.get("metric") and target.get("value") is not None
        else None,
        baseline=task.get("baseline"),
        accumulate=accumulate,
        eval_every=int(train.get("eval_every") or 0) if train.get("eval", True) else 0,
        planned_steps=planned_steps(train, data, gb),
        query=list(query),
        seq_length=int(data["max_seq_length"]) if data.get("max_seq_length") else None,
        precision=str(train.get("precision") or "fp32"),
    )


def same_model(model: Any, wanted: Mapping[str, Any] | None) -> bool:
    """A run's or profile's model is the query's: every key both name holds the same value (a width 512 run is
    not a width 2048 query's). ``wanted`` None: any model."""
    if wanted is None:
        return True
    model = model or {}
    return all(model[k] == wanted[k] for k in model.keys() & wanted.keys())


def same_target(rec: Mapping[str, Any], target: tuple[str, float, str] | None) -> bool:
    """A run's steps are to the query's target (its metric, value and direction)."""
    ttt = rec.get("time_to_target") or {}
    if target is None or not ttt.get("metric") or ttt.get("target") is None:
        return True
    metric, value, direction = target
    same = (ttt.get("metric"), ttt.get("direction") or "higher") == (metric, direction)
    return same and math.isclose(float(ttt["target"]), value)


def query_runs(runs: Sequence[tuple[Path, dict]], lay: Layout) -> tuple[list[tuple[Path, dict]], list[str]]:
    """The runs that are the query's (its model, its target), and a note on those of the task left out."""
    kept, model_off, target_off = [], 0, 0
    for run_dir, rec in runs:
        model_ok = same_model((rec.get("config") or {}).get("model"), lay.model)
        target_ok = same_target(rec, lay.target)
        if model_ok and target_ok:
            kept.append((run_dir, rec))
        elif rec.get("task") == lay.task:
            model_off += not model_ok
            target_off += model_ok and not target_ok
    notes = []
    if model_off:
        notes.append(f"{model_off} runs of {lay.task} of another model than yours are not counted")
    if target_off:
        notes.append(f"{target_off} runs of {lay.task} scored against another target than yours are not counted")
    return kept, notes

"""The performance model against runs on the emulated cluster: multi-node runs predicted from 1-node runs.

    python -m birder_repro.perf.validate --emulated RUNS_DIR      (make validate-emulated runs the sweep first)

Reads every completed record of ``cluster=emulated`` under RUNS_DIR. The profile of each optimizer (and
setting: task, model size, batch, image size) is the one its newest 1-node run measured (record key
``profile``, birder_repro.train.profile): nothing of a multi-node run goes into its prediction but the
layout and its link rate; the model's parameters are conf/cluster/emulated.yaml's ``perf`` block as it is
now (efficiency, the veth's latency, ``shared_host``: the nodes share this machine's cores). Each multi-node run's
measured
throughput (over whole steps, data wait included) is compared with the prediction, implementation ``this``.

TARGET: median absolute error of the predicted throughput at most 10 %, none over 20 %.
"""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

import pandas as pd

from birder_repro.run.record import find_records, read_record

from .cluster import CLUSTER_DIR, ClusterSpec
from .model import predict_run
from .profile import load_profile
from .schemes import scheme_for_optim

__all__ = ["TARGET_MEDIAN", "TARGET_MAX", "emulated_frame", "format_emulated", "main_emulated"]

TARGET_MEDIAN, TARGET_MAX = 0.10, 0.20


def _setting(rec: dict[str, Any]) -> tuple:
    cfg = rec.get("config") or {}
    return (
        rec.get("task"),
        rec.get("optim"),
        ((cfg.get("optim") or {}).get("comm") or {}).get("scheme"),
        (cfg.get("model") or {}).get("size"),
        rec.get("batch_size"),
        (cfg.get("data") or {}).get("image_size"),
    )


def _warmup_fraction(rec: dict[str, Any]) -> float:
    """Share of the TIMED steps in 1-bit Adam's fp32 warmup (the record's throughput is over those)."""
    if "warmup" not in (rec.get("throughput_by_stage") or {}):
        return 0.0
    steps, skip = int(rec["steps"]), int(rec.get("timing_warmup_steps") or 0)
    freeze = float((rec.get("config") or {}).get("optim", {}).get("freeze") or 0)
    freeze_step = round(freeze * steps) if freeze < 1 else int(freeze)
    return max(0, freeze_step - skip) / max(steps - skip, 1)


def _spec(link_mbit, spec_file: Path | None = None) -> ClusterSpec:
    """The model's emulated cluster at the run's link: conf/cluster/emulated.yaml's perf block as it is now, or
    ``spec_file`` (a cluster spec that ``birder-repro mode=probe`` wrote), whose efficiencies are fractions of
    the line rate and so carry over to another ``link_mbit``."""
    import yaml

    cluster = yaml.safe_load(Path(spec_file or CLUSTER_DIR / "emulated.yaml").read_text())
    return ClusterSpec.from_config({**cluster, "link_mbit": link_mbit})


def _records(root: Path) -> list[dict[str, Any]]:
    out = []
    for path in find_records(Path(root)):
        rec = read_record(path.parent)
        if rec and rec.get("status") == "completed" and (rec.get("cluster") or {}).get("name") == "emulated":
            out.append(rec)
    return sorted(out, key=lambda r: str(r.get("started")))


def emulated_frame(root: Path, implementation: str = "this", spec_file: Path | None = None) -> pd.DataFrame:
    """One row per multi-node emulated run with a 1-node run of the same setting: measured and predicted
    (with ``spec_file``'s cluster spec instead of conf/cluster/emulated.yaml, if given)."""
    recs = _records(root)
    profiles = {_setting(r): r for r in recs if r["cluster"]["nodes"] == 1 and r.get("profile")}  # newest wins
    rows = []
    for rec in recs:
        one = profiles.get(_setting(rec))
        if rec["cluster"]["nodes"] == 1 or one is None:
            continue
        cfg = rec["config"]
        profile = load_profile(one)
        spec = _spec(rec["cluster"]["link_mbit"], spec_file)
        scheme = scheme_for_optim(rec["optim"], (cfg["optim"].get("comm") or {}).get("scheme"))
        nodes, gpus = int(rec["cluster"]["nodes"]), int(rec["cluster"]["gpus_per_node"])
        pred = predict_run(
            profile,
            spec,
            nodes,
            gpus,
            scheme,
            int(rec["batch_size"]),
            warmup_fraction=_warmup_fraction(rec),
            implementation=implementation,
            local_steps=int(cfg["optim"].get("local_steps") or 1),  # DiLoCo's H
        )["run"]
        measured = float(rec["throughput_samples_per_s"])
        st = rec.get("step_time_s") or {}
        rows.append(
            {
                "optim": rec["optim"],
                "nodes": nodes,
                "link_mbit": rec["cluster"]["link_mbit"],
                "measured": measured,
                "predicted": pred["throughput_samples_per_s"],
                "error": pred["throughput_samples_per_s"] / measured - 1,
                "step_ms": 1e3 * float(st.get("total") or float("nan")),
                "pred_step_ms": 1e3 * pred["total_s"],
                "comm_ms": 1e3 * float(st.get("communication") or 0.0),
                "pred_comm_ms": 1e3 * pred["communication_s"],
                "compress_ms": 1e3 * float(st.get("compression") or 0.0),
                "pred_compress_ms": 1e3 * pred["compression_s"],
                "link_mbit_measured": (rec.get("profile") or {}).get("link_mbit_measured"),
                "run": "/".join(Path(str(rec.get("run_dir"))).parts[-2:]),
            }
        )
    return pd.DataFrame(rows)


def format_emulated(frame: pd.DataFrame) -> str:
    if frame.empty:
        return "no multi-node emulated run with a 1-node run of the same setting: nothing to compare"
    shown = frame.sort_values(["optim", "link_mbit", "nodes"]).copy()
    for col in ("measured", "predicted"):
        shown[col] = shown[col].map(lambda x: f"{x:.1f}")
    shown["error"] = shown["error"].map(lambda x: f"{100 * x:+.1f}%")
    for col in ("step_ms", "pred_step_ms", "comm_ms", "pred_comm_ms", "compress_ms", "pred_compress_ms"):
        shown[col] = shown[col].map(lambda x: f"{x:.0f}")
    shown["link_mbit_measured"] = shown["link_mbit_measured"].map(
        lambda x: "—" if x is None or pd.isna(x) else f"{x:.0f}"
    )
    errors = frame["error"].abs()
    med, worst = float(statistics.median(errors)), float(errors.max())
    verdict = "meets" if med <= TARGET_MEDIAN and worst <= TARGET_MAX else "MISSES"
    return (
        shown.to_markdown(index=False) + f"\n\nthroughput error over {len(frame)} runs: median |error| "
        f"{100 * med:.1f}%, max {100 * worst:.1f}% ({verdict} the target: median <= "
        f"{100 * TARGET_MEDIAN:.0f}%, none over {100 * TARGET_MAX:.0f}%)"
    )


def main_emulated(root: str, implementation: str = "this", spec_file: str | None = None) -> int:
    if spec_file:
        print(f"cluster spec: {spec_file}")
    frame = emulated_frame(Path(root), implementation, Path(spec_file) if spec_file else None)
    print(format_emulated(frame))
    if frame.empty:
        return 1
    errors = frame["error"].abs()
    return 0 if statistics.median(errors) <= TARGET_MEDIAN and errors.max() <= TARGET_MAX else 1

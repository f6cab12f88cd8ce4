"""Rank-0 logging: ``metrics.jsonl`` in the run directory always, Weights & Biases when configured.

Only rank 0 builds a :class:`RunLogger` that writes (the others get a disabled one), so there is one
``metrics.jsonl`` per run. W&B is best effort: an import error, a failed ``wandb.init`` or a failed ``log``
prints one warning and the run goes on with ``metrics.jsonl`` alone. A run never fails because of W&B.
"""

from __future__ import annotations

import json
import math
import os
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from birder_repro.config.plain import plain_config

METRICS_FILE = "metrics.jsonl"


def wandb_mode(configured: str | None, environ: Mapping[str, str] = os.environ) -> str:
    """The W&B mode to run in: the configured one; else $WANDB_MODE; else online with an API key, offline without.

    Offline runs are kept under the run directory and can be uploaded later with ``wandb sync``.
    """
    if configured:
        return str(configured)
    if environ.get("WANDB_MODE"):
        return environ["WANDB_MODE"]
    return "online" if environ.get("WANDB_API_KEY") else "offline"


def offline_hint(sync_dir: str | os.PathLike) -> str:
    """The one line an offline W&B run prints at start: where the run is kept and how to upload it later."""
    return f"W&B: offline run; upload it later with: wandb sync {sync_dir}"


def _json_value(value: Any) -> Any:
    """JSON has no NaN or infinity: write them as null so that every line stays parseable."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def wandb_group(cfg) -> str | None:
    """The experiment cell a run belongs to, ``<task>/<cluster>/<nodes>x<gpus_per_node>``: W&B groups runs by it,
    so that a dashboard shows the optimizers of one cell side by side."""
    try:
        return f"{cfg.task.name}/{cfg.cluster.name}/{cfg.nodes}x{cfg.gpus_per_node}"
    except Exception:  # noqa: BLE001 - a config without these (tests): no group
        return None


class RunLogger:
    """One JSON line per logged step in ``run_dir/metrics.jsonl``, mirrored to W&B when it is on.

    Every line holds ``time_s``, the wall-clock seconds since the logger started, and, where the loop gives
    its training clock, ``train_s``: the training seconds so far (birder_repro.train.target; the convergence
    figure's x-axis against time, birder_repro.report.figures).

    Args:
        cfg: the resolved run config; ``cfg.logger`` picks ``none`` or ``wandb`` and holds W&B's settings.
        run_dir: the run directory (shared by all processes; only the enabled logger writes to it).
        enabled: True on rank 0 only.
        clock: the training clock (seconds), read for every line's ``train_s``.
    """

    def __init__(
        self, cfg, run_dir: str | os.PathLike, enabled: bool = True, clock: Callable[[], float] | None = None
    ) -> None:
        self.enabled = enabled
        self.clock = clock
        self.run_dir = Path(run_dir)
        self._t0 = time.perf_counter()
        self._file = None
        self._wandb_run = None
        if not enabled:
            return
        self.run_dir.mkdir(parents=True, exist_ok=True)
        # Append: a resumed run in the same directory continues the file.
        self._file = open(self.run_dir / METRICS_FILE, "a", encoding="utf-8")
        logger_cfg = cfg.get("logger") if hasattr(cfg, "get") else None
        if logger_cfg is not None and logger_cfg.get("name") == "wandb":
            self._wandb_run = self._start_wandb(cfg, logger_cfg)

    def _start_wandb(self, cfg, logger_cfg):
        try:
            import wandb

            config = plain_config(cfg, lenient=True)
            mode = wandb_mode(logger_cfg.get("mode"))
            run = wandb.init(
                project=logger_cfg.get("project") or "birder-repro",
                entity=logger_cfg.get("entity"),
                dir=str(self.run_dir),
                name=self.run_dir.name,
                group=wandb_group(cfg),
                job_type=str(cfg.optim.name) if "optim" in cfg else None,
                config=config,
                # the precision as a tag too, so that a dashboard can split fp32 / bf16 / fp16 curves at a click
                tags=[*(logger_cfg.get("tags") or []), str(OmegaConf.select(cfg, "train.precision", default="fp32"))],
                mode=mode,
                # Console capture would wrap the worker's stdout; the progress bar and summary stay ours.
                # Offline, W&B's own header says "Run `wandb online`", the wrong advice here (the mode follows
                # WANDB_API_KEY / WANDB_MODE, wandb_mode above), and it prints whatever `quiet` says
                # (wandb 0.31, Run._header_sync_info): only `silent` stops it. We print our own line instead.
                settings=wandb.Settings(console="off", quiet=mode == "offline", silent=mode == "offline"),
            )
        except Exception as err:  # noqa: BLE001 - ImportError, wandb.Error, network and permission errors alike
            self._warn(f"W&B is off for this run ({type(err).__name__}: {err}); metrics go to {METRICS_FILE} only")
            return None
        if mode == "offline":
            print(offline_hint(getattr(run, "sync_dir", None) or self.run_dir / "wandb"), flush=True)
        return run

    @staticmethod
    def _warn(message: str) -> None:
        print(f"warning: {message}", file=sys.stderr, flush=True)

    def log(self, step: int, values: Mapping[str, Any]) -> None:
        """Write ``values`` for ``step`` (the number of optimizer steps completed)."""
        if not self.enabled:
            return
        row = {
            "step": int(step),
            "time_s": round(time.perf_counter() - self._t0, 4),
            **({"train_s": round(self.clock(), 4)} if self.clock is not None else {}),
            **{k: _json_value(v) for k, v in values.items()},
        }
        self._file.write(json.dumps(row) + "\n")
        self._file.flush()
        if self._wandb_run is not None:
            try:
                self._wandb_run.log({k: v for k, v in values.items() if v is not None}, step=int(step))
            except Exception as err:  # noqa: BLE001 - W&B's failures are logged, never fatal
                self._warn(f"W&B logging failed and is off from now on ({type(err).__name__}: {err})")
                self._wandb_run = None

    def summary(self, values: Mapping[str, Any]) -> None:
        """Final figures (throughput, metrics) into the W&B run's summary; metrics.jsonl has them per step."""
        if self._wandb_run is None:
            return
        try:
            self._wandb_run.summary.update(dict(values))
        except Exception as err:  # noqa: BLE001 - W&B's failures are logged, never fatal
            self._warn(f"W&B summary failed ({type(err).__name__}: {err})")

    def finish(self, exit_code: int = 0) -> None:
        """Close metrics.jsonl and the W&B run (marked failed with a non-zero ``exit_code``)."""
        if self._file is not None:
            self._file.close()
            self._file = None
        if self._wandb_run is not None:
            run, self._wandb_run = self._wandb_run, None
            try:
                run.finish(exit_code=exit_code)
            except Exception as err:  # noqa: BLE001 - W&B's failures are logged, never fatal
                self._warn(f"W&B finish failed ({type(err).__name__}: {err})")

    def __enter__(self) -> RunLogger:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        self.finish(exit_code=0 if exc_type is None else 1)

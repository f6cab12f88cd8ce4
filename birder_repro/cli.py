"""``birder-repro``: compose the config with Hydra, write the run directory, launch the workers.

    birder-repro task=resnet20 optim=birder nodes=2              # one run
    birder-repro -m optim=sgdm,birder nodes=1,2                  # a sweep: one run directory per cell
    birder-repro ... dry_run=true                                # print the torchrun command(s), start nothing
    birder-repro mode=predict ... predict.profile=paper          # the performance model's record, nothing runs
    birder-repro mode=probe nodes=2 ...                          # time the collectives, write a cluster spec
    birder-repro mode=advise task=t nodes=4 cluster=c ...        # rank the methods by predicted time to target
    birder-repro --help | --cfg job

The Hydra app runs once per run, in this one process; the workers read the resolved ``config.yaml`` it writes
and never compose a config again. :func:`run` is what the decorated entry point calls, and what tests call.

One run, one directory (birder_repro.run.directory): a torchrun run's is named after its rendezvous id, the same on
every node; a directory that holds an interrupted or failed run with a checkpoint is resumed in place, one that
holds a completed run is never run again. Ctrl-C or SIGTERM stops the workers after their current step, with a
checkpoint; the CLI waits for them and ends with the command that resumes the run (birder_repro.run.finish).
"""

from __future__ import annotations

import contextlib
import os
import socket
import sys
import traceback
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import hydra
from hydra.core.global_hydra import GlobalHydra
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf

from birder_repro import launch
from birder_repro.config import settings as layout
from birder_repro.config.compose import (
    CONF_DIR,
    CONF_PACKAGE,
    _group_choices,
    _hydra_initialized,
    _task_overrides,
    config_path,
    reference_configs,
)
from birder_repro.launch.ending import node_of, teller
from birder_repro.launch.process import signals_deferred
from birder_repro.run import directory, finish, record
from birder_repro.run.digest import LAUNCH_ENV
from birder_repro.tasks import DatasetNotFound, check_data
from birder_repro.train import checks  # noqa: F401 - installs the checks of the sections higher layers own

__all__ = ["CONF_DIR", "run", "main"]

INTERRUPTED = 130  # the shell's exit code for a command stopped by Ctrl-C
TERMINATED = 143  # ... and by SIGTERM (the emulated launcher returns it after removing its namespaces)


def run(cfg: DictConfig, run_dir: Path | None = None) -> int:
    """One run: resolve and check the config, choose and write the run directory, launch; return the exit code.

    Never raises for a failed run: the failure is printed and written to ``record.json`` (except in a dry run,
    which writes no record, and on nodes other than node 0 of a multi-node run, whose record is rank 0's), so
    that one failed cell of a sweep does not stop the others.
    """
    started = record.now()
    if cfg.get("mode") == "predict":
        return _predict(cfg, Path(run_dir) if run_dir is not None else _job_dir(cfg), started)
    if cfg.get("mode") == "advise":
        return _advise(cfg, Path(run_dir) if run_dir is not None else None)
    given = Path(run_dir) if run_dir is not None else None
    run_dir = given
    try:
        _check_gpus_per_node_knowable(cfg)
        resolved = layout.resolve(cfg, references=reference_configs(cfg))
        run_dir = given or _job_dir(cfg, resolved)
        if not _prepare_in_place(resolved, run_dir):
            return 2
        os.environ[LAUNCH_ENV] = f"{started} {socket.gethostname()} {os.getpid()}"  # this attempt's id
        record.write_run_files(run_dir, resolved, _command_line(cfg) if _writes_record(resolved) else None)

        launch.check(resolved)  # the launcher's refusals, then the data: nothing has started yet
        # a probe reads no data
        missing = None if cfg.get("mode") == "probe" else (_missing_data(resolved) or _missing_resume(resolved))
        if missing is not None:
            return _fail(cfg, run_dir, missing, started, code=2)
        code = launch.launch(resolved, run_dir)
    except layout.ConfigError as err:
        return _fail(cfg, run_dir or _job_dir(cfg), f"config error: {err}", started, code=2)
    except Exception as err:  # noqa: BLE001 - a bug must not stop the other cells of a sweep either
        return _fail(
            cfg,
            run_dir or _job_dir(cfg),
            f"{type(err).__name__}: {err}",
            started,
            code=1,
            traceback=traceback.format_exc(),
        )
    if cfg.dry_run or (code == 0 and _submitted(resolved)):
        return code

    with signals_deferred():  # a second Ctrl-C must not cut the record and the resume command short
        return _finish(resolved, run_dir, code, started)


def _predict(cfg: DictConfig, run_dir: Path, started: str) -> int:
    """mode=predict: the performance model's record of this run (birder_repro.perf.predict); nothing starts."""
    try:
        _check_gpus_per_node_knowable(cfg)
        resolved = layout.resolve(cfg, references=reference_configs(cfg))
        record.write_run_files(run_dir, resolved, _command_line(cfg))
        from birder_repro.perf.predict import format_prediction, write_predicted_record  # imports torch: here

        rec = write_predicted_record(resolved, run_dir, started)
    except layout.ConfigError as err:
        return _fail(cfg, run_dir, f"config error: {err}", started, code=2)
    except (ValueError, FileNotFoundError) as err:  # no profile, or one for another task
        return _fail(cfg, run_dir, f"predict: {err}", started, code=2)
    print(format_prediction(rec), flush=True)
    print(f"[birder-repro] predicted record: {run_dir / record.RECORD_FILE}", flush=True)
    return 0


def _advise(cfg: DictConfig, run_dir: Path | None) -> int:
    """mode=advise: the methods ranked by predicted time to the task's target on this layout and link, from the
    user's measured runs and 1-node profiles, else the paper's (birder_repro.perf.advisor); nothing starts, and no
    record is written (the directory would otherwise count as a run): the config, the command, advice.json, a
    figure, in a folder named for the advice (``advise-<task>-<nodes>x<gpus>``). 0 whenever advice is printed;
    2 for bad input."""
    try:
        _check_gpus_per_node_knowable(cfg)
        resolved = layout.resolve(cfg, references=reference_configs(cfg))
        from birder_repro.perf.advisor import advice_dir_name, run_advice  # imports torch: here, not in every run

        run_dir = run_dir or _advice_dir(
            cfg, advice_dir_name(resolved.task.name, resolved.nodes, resolved.gpus_per_node)
        )
        record.write_run_files(run_dir, resolved, _command_line(cfg))
        return run_advice(resolved, run_dir, _task_overrides(cfg))
    except layout.ConfigError as err:
        print(f"[birder-repro] config error: {err}", file=sys.stderr, flush=True)
    except (ValueError, FileNotFoundError) as err:  # a profile of another task, a missing cluster spec
        print(f"[birder-repro] advise: {err}", file=sys.stderr, flush=True)
    return 2


def _advice_dir(cfg: DictConfig, name: str) -> Path:
    """Hydra's directory where ``hydra.run.dir`` was given; else a fresh ``<runs>/<date>/<time>_<name>`` (Hydra's
    own, named for an optimizer, removed where it holds only Hydra's files)."""
    import datetime as _dt

    if HydraConfig.initialized() and _run_dir_given():
        return Path(HydraConfig.get().runtime.output_dir)
    stamp = _dt.datetime.now()
    path = record.runs_root() / f"{stamp:%Y-%m-%d}" / f"{stamp:%H-%M-%S-%f}_{name}"
    path.mkdir(parents=True, exist_ok=False)
    if HydraConfig.initialized():
        directory.remove_if_unused(Path(HydraConfig.get().runtime.output_dir))
    return path


def _check_gpus_per_node_knowable(cfg: DictConfig) -> None:
    """``gpus_per_node=auto`` counts the GPUs of the machine the CLI runs on: the node itself with the local and
    torchrun launchers (each node runs the CLI), but not with ``launcher=slurm``, which submits from a login node
    that may have none (it would quietly become one process per node)."""
    if str(cfg.get("gpus_per_node")) != "auto":
        return

    try:
        launcher = launch.choose_launcher(cfg)
    except layout.ConfigError:  # a refused launcher is reported by the launcher's own check, after this one
        return
    if launcher == "slurm":
        raise layout.ConfigError(
            "gpus_per_node=auto with launcher=slurm: the machine that submits the job cannot "
            "count the compute nodes' GPUs; set gpus_per_node=<processes per node>"
        )


def _missing_data(cfg: DictConfig) -> str | None:
    """The one line that says the run's real dataset is missing, or None; checked before anything starts.

    A dry run and a SLURM job only warn: a dry run starts nothing, and the job's nodes may see files that this
    (login) machine does not.
    """
    try:
        check_data(cfg)
    except DatasetNotFound as err:
        if not (cfg.dry_run or _submitted(cfg)):
            return str(err)
        where = "this machine" if cfg.dry_run else "this machine (the job's nodes may have it)"
        print(f"[birder-repro] warning, on {where}: {err}", file=sys.stderr, flush=True)
    return None


def _missing_resume(cfg: DictConfig) -> str | None:
    """The one line that says ``train.resume`` names no usable checkpoint (a missing path, an incomplete
    checkpoint, a directory without one), or None; checked before anything starts. A dry run and a SLURM job
    only warn, as for the data."""
    spec = OmegaConf.select(cfg, "train.resume", default=None)
    if spec in (None, "", "null", "auto"):
        return None
    # these import torch: only for a path
    from birder_repro.train.checkpoint_files import CheckpointError
    from birder_repro.train.resume_point import resolve_path

    try:
        resolve_path(str(spec))
    except CheckpointError as err:
        if not (cfg.dry_run or _submitted(cfg)):
            return f"{err}: give a checkpoint directory, a run directory holding one, auto, or null"
        print(f"[birder-repro] warning, on this machine: {err}", file=sys.stderr, flush=True)
    return None


def _submitted(cfg: DictConfig) -> bool:
    """launcher=slurm returns once the job is queued: its workers write the record when the job runs."""
    return launch.choose_launcher(cfg) == "slurm"


def _job_dir(cfg: DictConfig, resolved: DictConfig | None = None) -> Path:
    """The run directory (birder_repro.run.directory.job_dir), from Hydra's job directory and this launcher's
    rendezvous id."""
    hydra_dir = Path(HydraConfig.get().runtime.output_dir) if HydraConfig.initialized() else None
    return directory.job_dir(cfg, resolved, hydra_dir, hydra_dir is not None and _run_dir_given(), _torchrun_id)


def _torchrun_id(cfg: DictConfig) -> str | None:
    """A torchrun run's rendezvous id, which names its directory on every node; None for the other launchers."""
    return launch.torchrun.rdzv_id(cfg) if launch.choose_launcher(cfg) == "torchrun" else None


def _run_dir_given() -> bool:
    """``hydra.run.dir=`` (or a sweep's ``hydra.sweep.dir=``) on the command line: the user's choice wins."""
    return any(
        o.split("=", 1)[0].lstrip("+~") in ("hydra.run.dir", "hydra.sweep.dir")
        for o in HydraConfig.get().overrides.hydra
    )


def _prepare_in_place(cfg: DictConfig, run_dir: Path) -> bool:
    """A torchrun run's rendezvous id pinned into the config the workers read; then what the run directory
    already holds decides (birder_repro.run.directory.prepare_in_place)."""
    rdzv = _torchrun_id(cfg)
    if rdzv is not None and not cfg.launcher.get("rdzv_id"):
        cfg.launcher.rdzv_id = rdzv
    return directory.prepare_in_place(cfg, run_dir, node_of(cfg))


def _writes_record(cfg: DictConfig) -> bool:
    """Whether this CLI may write the run's record: node 0's (birder_repro.launch.ending.node_of), where the
    workers could not; the CLIs of the other nodes of a torchrun run never do (rank 0's worker writes it)."""
    return node_of(cfg) == 0


def _command_line(cfg: DictConfig) -> str:
    """The command that reproduces this run: ``birder-repro`` and this job's overrides (a sweep's cell alone)."""
    if HydraConfig.initialized():
        overrides = list(HydraConfig.get().overrides.task)
    elif "hydra" in cfg:  # composed with return_hydra_config=True (tests)
        overrides = list(cfg.hydra.overrides.task)
    else:
        return "birder-repro  # run(cfg) called with a config composed elsewhere: its overrides are unknown"
    return record.format_command(["birder-repro", *overrides])


def _fail(cfg: DictConfig, run_dir: Path, error: str, started: str, code: int, **fields) -> int:
    """Report a run that could not be launched in one line, its only one; its record (in the run directory the
    line names where it can, else under runs/) says the same (a dry run writes none, nor a node other than 0)."""
    if not cfg.get("dry_run") and _writes_record(cfg):
        run = directory.RunDir(run_dir)
        fields.setdefault("attempts", run.previous_attempts())  # a resumed run's earlier attempts stay listed
        run.write_failed(cfg, error, started=started, **fields)
    print(f"[birder-repro] {error.rstrip()}", file=sys.stderr, flush=True)
    return code


def _finish(cfg: DictConfig, run_dir: Path, code: int, started: str) -> int:
    """After the workers: how the run ended, told once (birder_repro.run.finish.finish_run)."""
    return finish.finish_run(cfg, run_dir, code, started, teller(cfg), command_line=_command_line(cfg))


@hydra.main(config_path=config_path() or str(CONF_DIR), config_name="config", version_base="1.3")
def _hydra_main(cfg: DictConfig) -> int:
    note = missing_recipe_line(cfg)
    if note is not None:
        print(f"[birder-repro] {note}", file=sys.stderr, flush=True)
    code = run(cfg)
    # A single run exits with its code; in a sweep every cell runs and keeps its own record, but Ctrl-C stops
    # the sweep rather than only its current cell (SIGTERM too).
    if code != 0 and (code in (INTERRUPTED, TERMINATED) or HydraConfig.get().mode != RunMode.MULTIRUN):
        sys.exit(code)
    return code


def missing_recipe_line(cfg: DictConfig) -> str | None:
    """One line when the run's (task, optimizer) pair has no paper recipe (conf/recipe/<task>/<optim>.yaml is
    optional in the defaults list) and which settings apply instead; None when it has one, and for
    ``mode=probe``, which trains nothing."""
    choices = _group_choices(cfg)
    task, optim = choices.get("task"), choices.get("optim")
    if not task or not optim or cfg.get("mode") == "probe" or _has_recipe(task, optim):
        return None
    optim_settings = _leaves(OmegaConf.to_container(cfg.optim, resolve=True))
    settings = ", ".join(f"{key}={_yaml_value(value)}" for key, value in optim_settings if key != "name")
    return (
        f"no paper recipe for task={task} optim={optim} (no conf/recipe/{task}/{optim}.yaml): the generic "
        f"settings of conf/optim/{optim}.yaml apply: {settings}"
    )


def _has_recipe(task: str, optim: str) -> bool:
    with _hydra_initialized():
        return optim in GlobalHydra.instance().config_loader().get_group_options(f"recipe/{task}")


def _leaves(node: dict, prefix: str = "") -> Iterator[tuple[str, Any]]:
    """(dotted key, value) of every value of a plain config section, lists as values."""
    for key, value in node.items():
        if isinstance(value, dict):
            yield from _leaves(value, f"{prefix}{key}.")
        else:
            yield f"{prefix}{key}", value


def _yaml_value(value: Any) -> str:
    """A value as the YAML files and the command line write it (null, true, 0.001, [0.9, 0.999])."""
    if isinstance(value, list):
        return "[" + ", ".join(_yaml_value(v) for v in value) + "]"
    if value is None or isinstance(value, bool):
        return {None: "null", True: "true", False: "false"}[value]
    return str(value)


def main() -> None:
    """The ``birder-repro`` console script."""
    if config_path() is None:
        sys.exit(
            f"birder-repro: the config tree is not at {CONF_DIR} and no {CONF_PACKAGE} package is installed: "
            "reinstall the project (pip install <checkout>, or a wheel built from it: both carry conf/ as "
            f"{CONF_PACKAGE})"
        )
    problem = _runs_dir_problem()
    if problem:
        sys.exit(f"birder-repro: {problem}")
    with _override_errors_in_one_line():
        _hydra_main()


@contextlib.contextmanager
def _override_errors_in_one_line() -> Iterator[None]:
    """``train.stepz=3`` (no ``+``) or ``optim=adamz``: Hydra refuses the override while composing, in five to
    twenty lines of its own, before the app can check anything. Hydra 1.3 has no public hook for how it reports a
    composition error: its ``run_and_report`` (the one place Hydra turns an exception into that message, looked
    up at call time) is wrapped so that these refusals, told apart by Hydra's public exception types
    (:func:`override_error_line`), are the project's one line with the closest key or choice, exit 2 like every
    config error; any other exception takes Hydra's own way. (Checking the choices before Hydra composes would
    mean parsing its command line a second time: sweeps, ``--config-dir``, an experiment that picks groups.)"""
    from hydra._internal import utils as hydra_utils

    report = hydra_utils.run_and_report

    def one_line(func):
        def guarded():
            try:
                return func()
            except Exception as exc:
                line = override_error_line(exc)
                if line is None:
                    raise
                print(f"[birder-repro] config error: {line}", file=sys.stderr, flush=True)
                sys.exit(2)

        return report(guarded)

    hydra_utils.run_and_report = one_line
    try:
        yield
    finally:
        hydra_utils.run_and_report = report


def override_error_line(exc: BaseException) -> str | None:
    """The one line for Hydra's refusal of a command-line override (None for anything else): ``key=value`` where
    the config has no ``key`` (the key, the closest setting, the ``+key=`` form's verdict), or ``group=choice``
    where the group has no such option (Hydra's :class:`~hydra.errors.MissingConfigException` names the file
    it looked for and the group's options: :func:`birder_repro.config.settings.no_such_choice`)."""
    from hydra.errors import ConfigCompositionException, MissingConfigException
    from omegaconf.errors import ConfigAttributeError, ConfigKeyError

    if isinstance(exc, MissingConfigException):
        return _missing_choice_line(exc)
    cause = exc.__cause__
    if not isinstance(exc, ConfigCompositionException) or not isinstance(cause, ConfigAttributeError | ConfigKeyError):
        return None
    full_key, parent = cause.full_key, cause.parent_node
    if not full_key:
        return None
    section, _, _ = full_key.rpartition(".")
    known = [f"{section}.{k}" if section else str(k) for k in (parent.keys() if isinstance(parent, DictConfig) else ())]
    if not section and isinstance(parent, DictConfig):  # a top-level key: a setting of that name in a section too
        known += [key for key in layout.dotted_keys(parent) if "." in key]
    return layout.no_such_setting(full_key, known)


def _missing_choice_line(exc: BaseException) -> str | None:
    """``optim=adamz``: Hydra found no conf/optim/adamz.yaml; its exception carries the group's options (None
    where it has none to offer: a primary config missing, a file it could not load)."""
    missing, options = getattr(exc, "missing_cfg_file", None), getattr(exc, "options", None)
    if not missing or not options or "/" not in missing:
        return None
    group, _, choice = str(missing).rpartition("/")
    return layout.no_such_choice(group, choice, [str(o) for o in options])


def _runs_dir_problem(env=os.environ) -> str | None:
    """Why the runs directory (BIRDER_RUNS, default ./runs) cannot take a run, before Hydra tries to make one.
    Creates nothing: the nearest existing directory on the way must be writable."""
    root = Path(env.get("BIRDER_RUNS") or "runs").absolute()
    existing = next((p for p in (root, *root.parents) if p.exists()), None)
    if existing is not None and existing.is_dir() and os.access(existing, os.W_OK | os.X_OK):
        return None
    why = "not a directory" if existing is not None and not existing.is_dir() else "not writable"
    return f"cannot write the runs directory {root} ({existing} is {why}): set BIRDER_RUNS to a writable directory"


if __name__ == "__main__":
    main()

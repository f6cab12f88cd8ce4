"""A sweep's verdict: the cells that failed or were refused, one line each at the end, and a non-zero exit.

Hydra's basic launcher runs the cells of ``birder-repro -m ...`` one after another in this process, and a
failed cell does not stop the others (each keeps its own record). :class:`SweepReport`, a Hydra callback
(registered in conf/config.yaml under ``hydra.callbacks``), notes every cell that ended with a non-zero code
together with the last line it wrote to stderr, which is the CLI's one-line error; when the sweep ends it lists
them and exits with :data:`FAILED_SWEEP`. Before each cell it prints ``cell k of N, about T left`` (N from the
sweep's overrides, :func:`sweep_size`; T the mean of the cells done so far times the cells left). Ctrl-C is no
cell's failure: the CLI exits from inside the cell, which stops the whole sweep at once. With a launcher that
runs cells elsewhere (``hydra/launcher=submitit_slurm``) the cells end in their own jobs, unseen here: their
records say how each ended.

``python -m birder_repro.sweep`` is the other way to sweep: cells read one per line (each a ``birder-repro``
argument line, as ``python -m birder_repro.report.protocol`` prints them), run one after another as single
runs in an order shuffled by a recorded seed (:func:`interleaved`), so that a method's seeds are not run in a
row and the host's load over the hours is not confounded with the method. The order is written before the
first cell (``RUNS/order-<name>.txt``); before each cell it prints ``cell k of N, about T left`` (T: the mean
time of the cells done so far times the cells left). A line ``# order-seed: N`` in the input gives the seed
where ``--seed`` does not. Each cell that ends with exit code 0 is appended to ``RUNS/done-<name>.txt``; a sweep
started again (after Ctrl-C, a reboot, a session's end) skips the cells listed there, saying so, and runs the
rest in the same order: hours of tuning are never run twice. ``--fresh`` forgets the list.
"""

from __future__ import annotations

import argparse
import os
import random
import shlex
import shutil
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from hydra.core.utils import JobReturn, JobStatus
from hydra.experimental.callback import Callback
from omegaconf import DictConfig

__all__ = [
    "FAILED_SWEEP",
    "FailedCell",
    "SweepReport",
    "interleaved",
    "order_text",
    "progress_line",
    "run_cells",
    "sweep_size",
]

FAILED_SWEEP = 1  # the exit code of a sweep in which any cell failed or was refused
PREFIX = "[birder-repro] "


@dataclass(frozen=True)
class FailedCell:
    number: int  # hydra.job.num: the run directory's prefix under the sweep's directory
    overrides: tuple[str, ...]
    code: int
    error: str

    def line(self) -> str:
        cell = " ".join(self.overrides) or "(no overrides)"
        return f"{PREFIX}  #{self.number} {cell}: {self.error} (exit code {self.code})"


class _LastLine:
    """A stream that writes through to ``stream`` and keeps the last non-blank line written to it."""

    def __init__(self, stream: TextIO) -> None:
        self.stream, self.last = stream, ""

    def write(self, text: str) -> int:
        lines = [line for line in text.splitlines() if line.strip()]
        if lines:
            self.last = lines[-1]
        return self.stream.write(text)

    def __getattr__(self, name: str) -> Any:  # flush, fileno, isatty, encoding ...: the stream's own
        return getattr(self.stream, name)


class SweepReport(Callback):
    """Collects a sweep's failed cells; lists them at its end and exits non-zero (a single run: nothing)."""

    def __init__(self) -> None:
        self.failed: list[FailedCell] = []
        self.cells = 0
        self._sweeping = False
        self._total: int | None = None
        self._done_s: list[float] = []
        self._started = 0.0
        self._stderr: _LastLine | None = None

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        from omegaconf import OmegaConf

        self._sweeping = True
        self._total = sweep_size(OmegaConf.select(config, "hydra.overrides.task", default=None) or [])
        self._done_s: list[float] = []
        self._started = 0.0

    def on_job_start(self, config: DictConfig, **kwargs: Any) -> None:
        if self._sweeping:  # a cell: keep its last stderr line, its error line should it fail
            k = self.cells + 1
            said = progress_line(k, self._total, self._done_s) if self._total else f"cell {k}"
            print(f"{PREFIX}{said}", file=sys.stderr, flush=True)  # before the cell's own stderr is watched
            self._started = time.monotonic()
            self._stderr = _LastLine(sys.stderr)
            sys.stderr = self._stderr

    def on_job_end(self, config: DictConfig, job_return: JobReturn, **kwargs: Any) -> None:
        watched, self._stderr = self._stderr, None
        if watched is None:
            return
        sys.stderr = watched.stream
        self.cells += 1
        self._done_s.append(time.monotonic() - self._started)
        code = _exit_code(job_return)
        if code != 0:
            error = watched.last.removeprefix(PREFIX) or "(it printed no error)"
            number = int(config.hydra.job.get("num") or 0) if "hydra" in config else self.cells - 1
            self.failed.append(FailedCell(number, tuple(job_return.overrides or ()), code, error))

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        if not self.failed:
            return
        print(f"{PREFIX}sweep: {len(self.failed)} of {self.cells} cells failed or were refused:", file=sys.stderr)
        for cell in self.failed:
            print(cell.line(), file=sys.stderr, flush=True)
        sys.exit(FAILED_SWEEP)


def _top_level_parts(value: str) -> list[str]:
    """``value`` split at the commas outside brackets and quotes: "1,[2,3]" -> ["1", "[2,3]"]."""
    parts, depth, quote, current = [], 0, "", ""
    for ch in value:
        if quote:
            quote = "" if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        elif ch == "," and depth == 0:
            parts.append(current)
            current = ""
            continue
        current += ch
    return [*parts, current]


def sweep_size(overrides: Sequence[str]) -> int | None:
    """How many cells Hydra's basic sweeper makes of ``overrides`` (the product of each override's values:
    ``a=1,2``, ``choice(x,y)``, ``range(0,5)``); None where one is a sweep it cannot count (``glob(...)``)."""
    total = 1
    for override in overrides:
        value = override.split("=", 1)[1] if "=" in override else ""
        if value.startswith("range(") and value.endswith(")"):
            try:
                total *= len(range(*(int(float(v)) for v in _top_level_parts(value[6:-1]))))
            except (TypeError, ValueError):
                return None
            continue
        if value.startswith("choice(") and value.endswith(")"):
            total *= len(_top_level_parts(value[7:-1]))
            continue
        if "(" in value.split(",", 1)[0] and not value.startswith(("[", "{", "'", '"')):
            return None  # another sweep function (glob, interval, ...)
        total *= len(_top_level_parts(value))
    return total


def _exit_code(job_return: JobReturn) -> int:
    """The cell's exit code: what the CLI's task function returned; 1 where it raised."""
    if job_return.status != JobStatus.COMPLETED:
        return 1
    value = job_return.return_value
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


# ---------------------------------------------------------------------------------------------------------------
# An interleaved sweep: python -m birder_repro.sweep


def interleaved(cells: Sequence[str], seed: int) -> list[str]:
    """The cells in a random order drawn from ``seed`` (random.Random(seed).shuffle over the cells as given):
    the same cells and seed always give the same order; every cell once."""
    order = list(cells)
    random.Random(seed).shuffle(order)
    return order


def order_text(order: Sequence[str], seed: int) -> str:
    """The order file: how it was drawn, then each cell numbered in the order it runs."""
    head = f"# {len(order)} cells in the order run: random.Random({seed}).shuffle over the cells as given\n"
    head += f"# order-seed: {seed}\n"
    return head + "".join(f"{k} {cell}\n" for k, cell in enumerate(order, 1))


def progress_line(k: int, n: int, done_s: Sequence[float]) -> str:
    """``cell k of N, about T left``: T the mean of the cells done so far times the cells left (this one too)."""
    if not done_s:
        return f"cell {k} of {n}, time left not known yet"
    left = sum(done_s) / len(done_s) * (n - k + 1)
    return f"cell {k} of {n}, about {_duration(left)} left"


def _duration(seconds: float) -> str:
    minutes = round(seconds / 60)
    return f"{minutes // 60} h {minutes % 60:02d} min" if minutes >= 60 else f"{max(minutes, 1)} min"


def _load() -> str:
    try:
        return f"{os.getloadavg()[0]:.2f}"
    except OSError:
        return "unknown"


def with_extra(cell: str, extra: str) -> str:
    """The cell with ``extra``'s overrides, each replacing the cell's own of the same key (``train.steps=5``)."""
    if not extra.strip():
        return cell
    added = shlex.split(extra)
    keys = {a.split("=", 1)[0].lstrip("+~") for a in added}
    kept = [a for a in shlex.split(cell) if a.split("=", 1)[0].lstrip("+~") not in keys]
    return " ".join(shlex.quote(a) for a in [*kept, *added])


def done_cells(path: Path | None) -> set[str]:
    """The cells a sweep of this name finished before (exit code 0), one a line in ``RUNS/done-<name>.txt``."""
    if path is None or not path.is_file():
        return set()
    return {line.strip() for line in path.read_text().splitlines() if line.strip()}


def run_cells(
    order: Sequence[str],
    cli: Sequence[str],
    runs: Path,
    dry_run: bool = False,
    out=None,
    done_path: Path | None = None,
) -> int:
    """Run each cell as ``cli <cell>`` with BIRDER_RUNS=runs; the failed ones listed at the end (exit 1).
    With ``done_path``: a cell listed there is skipped, and each cell that succeeds is appended to it."""
    out = out or sys.stdout
    env = {**os.environ, "BIRDER_RUNS": str(runs)}
    done_before = done_cells(done_path)
    todo = sum(cell not in done_before for cell in order)
    if done_before:
        print(f"{PREFIX}sweep: {len(order) - todo} of {len(order)} cells done before ({done_path}): skipped", file=out)
    done_s: list[float] = []
    failed: list[str] = []
    k = 0
    for number, cell in enumerate(order, 1):
        if cell in done_before:
            continue
        k += 1
        said = progress_line(k, todo, done_s)
        print(f"{PREFIX}{said} (load {_load()}): #{number} {cell}", file=out, flush=True)
        if dry_run:
            continue
        start = time.monotonic()
        code = subprocess.run([*cli, *shlex.split(cell)], env=env, check=False).returncode
        done_s.append(time.monotonic() - start)
        if code != 0:
            failed.append(f"{PREFIX}  #{number} {cell} (exit code {code})")
        elif done_path is not None:
            with done_path.open("a") as done:
                done.write(cell + "\n")
    if failed:
        print(f"{PREFIX}sweep: {len(failed)} of {len(order)} cells failed or were refused:", file=out)
        print("\n".join(failed), file=out, flush=True)
        return FAILED_SWEEP
    return 0


def _cells_and_seed(lines: Sequence[str]) -> tuple[list[str], int | None]:
    cells, seed = [], None
    for line in (raw.strip() for raw in lines):
        if line.startswith("# order-seed:"):
            seed = int(line.split(":", 1)[1])
        elif line and not line.startswith("#"):
            cells.append(line)
    return cells, seed


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m birder_repro.sweep", description=__doc__)
    parser.add_argument("--runs", type=Path, required=True, help="BIRDER_RUNS for every cell; the order file goes here")
    parser.add_argument("--name", default="sweep", help="the order file's name: RUNS/order-<name>.txt")
    parser.add_argument("--seed", type=int, default=None, help="the order's seed (else the input's '# order-seed: N')")
    parser.add_argument("--cli", default=None, help="the birder-repro command (default: the one on PATH)")
    parser.add_argument("--dry-run", action="store_true", help="write the order and print it; run nothing")
    parser.add_argument("--fresh", action="store_true", help="run every cell, forgetting RUNS/done-<name>.txt")
    parser.add_argument("--extra", default="", help="overrides added to every cell, replacing its own of a key")
    parser.add_argument("cells", nargs="?", default="-", help="a file of cells, one a line ('-': standard input)")
    args = parser.parse_args(argv)
    text = sys.stdin.read() if args.cells == "-" else Path(args.cells).read_text()
    cells, given = _cells_and_seed(text.splitlines())
    cells = [with_extra(cell, args.extra) for cell in cells]
    seed = args.seed if args.seed is not None else given
    if seed is None:
        print(f"{PREFIX}sweep: no order seed: give --seed N or a '# order-seed: N' line", file=sys.stderr)
        return 2
    if not cells:
        print(f"{PREFIX}sweep: no cells to run ({args.name})", flush=True)
        return 0
    order = interleaved(cells, seed)
    args.runs.mkdir(parents=True, exist_ok=True)
    path = args.runs / f"order-{args.name}.txt"
    path.write_text(order_text(order, seed))
    print(f"{PREFIX}sweep: {len(order)} cells in the order written to {path}", flush=True)
    cli = (
        shlex.split(args.cli) if args.cli else ([shutil.which("birder-repro")] if shutil.which("birder-repro") else [])
    )
    if not cli:
        cli = [sys.executable, "-m", "birder_repro.cli"]
    done_path = args.runs / f"done-{args.name}.txt"
    if args.fresh and not args.dry_run:
        done_path.unlink(missing_ok=True)
    try:
        return run_cells(order, cli, args.runs, args.dry_run, done_path=done_path)
    except KeyboardInterrupt:
        print(f"{PREFIX}sweep: interrupted; the order is in {path}", file=sys.stderr)
        return 130


if __name__ == "__main__":
    raise SystemExit(main())

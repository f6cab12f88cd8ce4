"""``make gpu-check``: does the project work on this GPU node? One command, one table, non-zero on a failure.

Without CUDA it prints one line: on a machine with no NVIDIA device, what it would check, and exits 0, claiming
nothing; on a machine whose NVIDIA GPUs torch cannot use (:mod:`birder_repro.cuda_env`: a driver older than the
build's CUDA, an empty ``CUDA_VISIBLE_DEVICES``), the cause and the fix, and exits 1. With CUDA:

1. kernels (:mod:`.kernels`): Birder's Triton kernels on the GPU against the CPU backend on the same inputs,
   bit for bit (worker, server, unpack; ``state_out``, ``b_hat``, several segments), on a ResNet-50-sized
   (25.6M) and a BERT-base-sized (110M) bucket; and each kernel's time against a device-to-device copy;
2. runs (:mod:`.runs`): a 1-process DDP run through the real runner of Birder, 1-bit Adam and the baseline of
   every task (tiny model, synthetic data, overlap on) in fp32 and bf16, and in fp16 with GradScaler for the
   digits task (``--fp16-tasks``), and the record of each;
3. hooks (:mod:`.hooks`), across ranks: every hook against its single-process reference and the bytes it
   counted against the formulas, and Birder and 1-bit Adam as training runs them (:mod:`.training`: DDP and
   FSDP2, fp32, bf16 and fp16 with GradScaler) against their references; with 2 or more GPUs on NCCL, a GPU a
   process, as 2 nodes x 1 and 1 node x 2 (and the runner's layout for all GPUs with 3 or more); on 1 GPU, 2
   processes sharing it with their collectives staged through gloo (:mod:`.staged`, which cannot show a missing
   wait: :mod:`.plan`); and once more under CSAN (``TORCH_CUDA_SANITIZER=1``). Every process group times out
   after a minute (:data:`.scenarios.PG_TIMEOUT_S`), so a rank that fails ends the check instead of hanging.

The rows that need 2 GPUs (the NCCL layouts, the 2-process runs: an injected fp16 overflow, accumulation, a
SIGTERM and a resume) show as ``skipped: needs 2 GPUs`` on a 1-GPU machine.

It writes ``gpu-check.md`` and ``gpu-check.json`` into ``--out`` (default ``runs/gpu-check/<time>``) and
prints the table; the files are rewritten as each row completes, so a check stopped from outside still leaves the
rows it got to. ``--quick`` runs the quick plan (:mod:`.quick`: at most 6 minutes on one GPU, for a lent
machine); ``--dry-run`` prints the plan and its predicted time, importing no torch and starting nothing.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import time
from pathlib import Path

from birder_repro.cuda_env import why_no_cuda
from birder_repro.gpucheck import procs, quick, runs
from birder_repro.gpucheck.table import FAIL, Check, exit_code, markdown, write
from birder_repro.tasks import list_tasks

__all__ = ["main", "no_cuda_line", "unusable_cuda_line", "WHAT"]

WHAT = (
    "Birder's Triton kernels against the CPU backend bit for bit and against a device copy (25.6M and 110M "
    "elements); a 1-process DDP run of Birder, 1-bit Adam and the baseline of every task (tiny, synthetic, "
    "fp32 and bf16; digits in fp16 too) and its record; every hook across ranks against its reference and byte "
    "formulas, Birder and "
    "1-bit Adam under DDP and FSDP2 in fp32, bf16 and fp16 (NCCL as 2x1 and 1x2 with 2+ GPUs, else 2 ranks sharing "
    "one GPU; once under CSAN); with 2+ GPUs, 2-process runs with an fp16 overflow, accumulation, a SIGTERM and "
    "a resume"
)
SECTIONS = ("kernels", "runs", "hooks")


def no_cuda_line() -> str:
    import torch

    return (
        f"gpu-check: no NVIDIA GPU here (no /dev/nvidia*, nvidia-smi lists none; torch {torch.__version__}, "
        f"built with CUDA {torch.version.cuda or 'none'}): nothing was checked. On a GPU node it checks {WHAT}."
    )


def unusable_cuda_line(why: str) -> str:
    return f"gpu-check: FAILED: torch sees no CUDA device, and {why}; nothing was checked."


def environment() -> dict:
    """What the table was measured on."""
    import torch

    env = {"torch": torch.__version__, "cuda": torch.version.cuda, "gpus": torch.cuda.device_count()}
    if env["gpus"]:
        env["device"] = torch.cuda.get_device_name(0)
        env["nccl"] = ".".join(map(str, torch.cuda.nccl.version())) if torch.distributed.is_nccl_available() else None
    try:
        import triton

        env["triton"] = triton.__version__
    except ImportError:
        env["triton"] = None
    return env


# the full check's kernel sizes (birder_repro.bench.kernels.SIZES, which imports torch: the dry run must not)
FULL_SIZES = (25_557_032, 109_482_240)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m birder_repro.gpucheck", description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, default=None, help="where the table goes (default runs/gpu-check/<time>)")
    p.add_argument("--only", nargs="*", choices=SECTIONS, default=None, help="sections to run")
    p.add_argument("--sizes", nargs="*", type=int, default=None, help="bucket sizes (elements)")
    p.add_argument("--tasks", nargs="*", default=list_tasks(), choices=list_tasks())
    p.add_argument("--precisions", nargs="*", default=["fp32", "bf16"], choices=["fp32", "bf16", "fp16"])
    p.add_argument("--fp16-tasks", nargs="*", default=["digits"], help="tasks also run in fp16 (GradScaler)")
    p.add_argument("--jobs", type=int, default=None, help="runs at a time on the GPU (default: one per 4 cores)")
    p.add_argument("--repeats", type=int, default=20, help="timed calls of each kernel")
    p.add_argument("--quick", action="store_true", help="the quick plan: at most 6 minutes on one GPU (.quick)")
    p.add_argument("--dry-run", "--plan", dest="dry_run", action="store_true", help="print the plan; run nothing")
    return p


class Rows(list):
    """The table's rows so far, written out again as each arrives (a check stopped midway leaves a table)."""

    def __init__(self, out: Path, header: str, env: dict):
        super().__init__()
        self.out, self.header, self.env = out, header, env

    def add(self, row: Check) -> None:
        self.append(row)
        write(list(self), self.out, self.header + " (in progress)", self.env)

    def extend_rows(self, rows: list[Check]) -> None:
        for row in rows:
            self.add(row)


def _section(name: str, fn) -> list[Check]:
    """A section that crashes is one failed row: the other sections still run and the table is still written."""
    t0 = time.perf_counter()
    print(f"gpu-check: {name} ...", flush=True)
    try:
        rows = fn()
    except Exception as exc:  # noqa: BLE001
        rows = [Check(name, f"{name} section", FAIL, detail=f"{type(exc).__name__}: {exc}")]
    print(
        f"gpu-check: {name}: {sum(r.status == FAIL for r in rows)} of {len(rows)} failed "
        f"({time.perf_counter() - t0:.0f} s)",
        flush=True,
    )
    return rows


def _kernels(args) -> list[Check]:
    import torch

    from birder_repro.comm import kernels as k  # these import torch: here, so that --dry-run imports none
    from birder_repro.gpucheck.kernels import compare_kernels, time_kernels

    try:
        k.resolve_backend("triton", "cuda")
    except ValueError as exc:  # triton missing or broken: its one line says why
        return [Check("kernels", "triton backend", FAIL, detail=str(exc))]
    reference = "cpu" if "cpu" in k.available_backends("cpu") else "torch"
    rows = []
    for numel in args.sizes:
        numel -= numel % 8
        rows += compare_kernels(numel, "cuda", "triton", reference)
        rows += time_kernels(numel, "cuda", "triton", repeats=args.repeats)
        torch.cuda.empty_cache()
    return rows


def _runs(args, out: Path, gpus: int, on_row=None) -> list[Check]:
    """The 1-process runs of every task; then, with 2+ GPUs, the 2-process runs (:func:`.runs.pair_specs`),
    which a 1-GPU machine lists as skipped. Quick: :func:`.quick.quick_runs` alone, 2 minutes each at most."""
    from birder_repro.gpucheck.plan import NEEDS_2, skipped  # imports torch: here, so that --dry-run imports none

    on_row = on_row or (lambda row: None)

    plan = quick.quick_runs() if args.quick else runs.plan(args.tasks, args.precisions, tuple(args.fp16_tasks))
    jobs = args.jobs or quick.jobs_for(len(plan))
    timeout_s = quick.RUN_TIMEOUT_S if args.quick else 300
    rows = runs.check_runs(plan, out / "runs", jobs=jobs, timeout_s=timeout_s, on_row=on_row)
    if args.quick:
        return rows
    pairs = runs.pair_specs()
    if gpus >= NEEDS_2:
        return rows + runs.check_pairs(pairs, out / "runs-2", on_row=on_row)
    left = [skipped("runs", s.name, NEEDS_2) for s in pairs]
    for row in left:
        on_row(row)
    return rows + left


def _hooks(gpus: int, on_row=None, quick: bool = False) -> list[Check]:
    """Across ranks, each spawn of :func:`.plan.hook_runs` (NCCL in 2x1 and 1x2 with 2+ GPUs; the staged
    backend on 1 GPU, where the NCCL rows are skipped; once under CSAN), its rows named by its layout. Quick:
    the first spawn alone, with the stress checks (:mod:`.stress`) in it."""
    from birder_repro.gpucheck.hooks import check_hooks  # these import torch: here, so that --dry-run imports none
    from birder_repro.gpucheck.plan import hook_runs, skipped

    on_row = on_row or (lambda row: None)

    rows: list[Check] = []
    planned = [r for r in hook_runs(gpus) if r.runs_on(gpus) and not r.sanitizer][:1] if quick else hook_runs(gpus)
    for run in planned:
        if not run.runs_on(gpus):
            got = [skipped("hooks", run.label, run.gpus)]
        else:
            more = {"stress": True} if quick else {}
            got = check_hooks(run.world, run.backend, run.training, run.gpus_per_node, run.sanitizer, **more)
            got = [dataclasses.replace(r, name=f"{run.label}: {r.name}") for r in got]
        for row in got:
            on_row(row)
        rows += got
    return rows


def _dry_run(args) -> int:
    """The plan and its predicted time: no torch imported, nothing started."""
    cores = os.cpu_count() or 1
    if args.quick:
        items = quick.plan(gpus=1, cores=cores, only=tuple(args.only or quick.SECTIONS))
        print(f"gpu-check --quick on 1 GPU, {cores} cores (2+ GPUs: NCCL 2x1 instead of staged):", flush=True)
        print(quick.describe(items), flush=True)
        return 0
    print(
        f"gpu-check (full) checks: {WHAT}; sections {', '.join(args.only or SECTIONS)}; kernels at "
        f"{', '.join(f'{n / 1e6:.1f}M' for n in args.sizes or FULL_SIZES)} elements; about 7-10 minutes on 1 GPU, "
        "12-15 with 2 or more (docs/gpus.md)",
        flush=True,
    )
    return 0


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.dry_run:
        return _dry_run(args)
    import torch

    args.only = args.only or list(quick.SECTIONS if args.quick else SECTIONS)
    args.sizes = args.sizes or ([quick.KERNEL_SIZE] if args.quick else list(FULL_SIZES))
    if not torch.cuda.is_available():
        why = why_no_cuda()
        print(unusable_cuda_line(why) if why else no_cuda_line(), flush=True)
        return 1 if why else 0

    saved = procs.install_stop_handler()  # a SIGTERM to gpu-check (an outer limit) ends the runs it started first
    try:
        return _checked(args)
    finally:
        procs.end_everything()  # nothing it started outlives it
        procs.uninstall_stop_handler(saved)


def _checked(args) -> int:
    import torch

    out = (args.out or Path("runs") / "gpu-check" / time.strftime("%Y-%m-%d_%H-%M-%S")).resolve()
    env = environment()
    header = ", ".join(f"{k} {v}" for k, v in env.items()) + ("; quick plan" if args.quick else "")
    print(f"gpu-check: {header}; writing to {out}", flush=True)
    t0 = time.perf_counter()
    rows = Rows(out, header, env)
    gpus = torch.cuda.device_count()

    def section(name: str, fn) -> None:
        # the rows the section did not write as it went (kernels; a crash's failed row)
        got = _section(name, fn)
        rows.extend_rows([r for r in got if not any(r is x for x in rows)])

    # the full check: kernels, runs, hooks; the quick plan: by value (hooks and the stress in one spawn, runs,
    # kernels), each row written as it completes
    order = ("hooks", "runs", "kernels") if args.quick else ("kernels", "runs", "hooks")
    for name in order:
        if name not in args.only and not (name == "hooks" and "stress" in args.only and args.quick):
            continue
        if name == "kernels":
            section("kernels", lambda: _kernels(args))
        elif name == "runs":
            section("runs", lambda: _runs(args, out, gpus, on_row=rows.add))
        else:
            section("hooks", lambda: _hooks(gpus, on_row=rows.add, quick=args.quick))
    rows = list(rows)
    header += f"; {time.perf_counter() - t0:.0f} s"
    md, js = write(rows, out, header, env)
    print(markdown(rows, header), flush=True)
    print(f"gpu-check: the table is in {md} and {js}", flush=True)
    return exit_code(rows)

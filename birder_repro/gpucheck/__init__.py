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
prints the table.
"""

from __future__ import annotations

import argparse
import dataclasses
import time
from pathlib import Path

import torch

from birder_repro.gpucheck.table import FAIL, Check, exit_code, markdown, write

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
    return (
        f"gpu-check: no NVIDIA GPU here (no /dev/nvidia*, nvidia-smi lists none; torch {torch.__version__}, "
        f"built with CUDA {torch.version.cuda or 'none'}): nothing was checked. On a GPU node it checks {WHAT}."
    )


def unusable_cuda_line(why: str) -> str:
    return f"gpu-check: FAILED: torch sees no CUDA device, and {why}; nothing was checked."


def environment() -> dict:
    """What the table was measured on."""
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


def _parser() -> argparse.ArgumentParser:
    from birder_repro.bench import SIZES
    from birder_repro.tasks import list_tasks

    p = argparse.ArgumentParser(prog="python -m birder_repro.gpucheck", description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, default=None, help="where the table goes (default runs/gpu-check/<time>)")
    p.add_argument("--only", nargs="*", choices=SECTIONS, default=list(SECTIONS), help="sections to run")
    p.add_argument("--sizes", nargs="*", type=int, default=list(SIZES.values()), help="bucket sizes (elements)")
    p.add_argument("--tasks", nargs="*", default=list_tasks(), choices=list_tasks())
    p.add_argument("--precisions", nargs="*", default=["fp32", "bf16"], choices=["fp32", "bf16", "fp16"])
    p.add_argument("--fp16-tasks", nargs="*", default=["digits"], help="tasks also run in fp16 (GradScaler)")
    p.add_argument("--jobs", type=int, default=6, help="runs at a time on the GPU")
    p.add_argument("--repeats", type=int, default=20, help="timed calls of each kernel")
    return p


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
    from birder_repro.comm import kernels as k
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


def _runs(args, out: Path, gpus: int) -> list[Check]:
    """The 1-process runs of every task; then, with 2+ GPUs, the 2-process runs (:func:`.runs.pair_specs`),
    which a 1-GPU machine lists as skipped."""
    from birder_repro.gpucheck import runs
    from birder_repro.gpucheck.plan import NEEDS_2, skipped

    plan = runs.plan(args.tasks, args.precisions, tuple(args.fp16_tasks))
    rows = runs.check_runs(plan, out / "runs", jobs=args.jobs)
    pairs = runs.pair_specs()
    if gpus >= NEEDS_2:
        return rows + runs.check_pairs(pairs, out / "runs-2")
    return rows + [skipped("runs", s.name, NEEDS_2) for s in pairs]


def _hooks(gpus: int) -> list[Check]:
    """Across ranks, each spawn of :func:`.plan.hook_runs` (NCCL in 2x1 and 1x2 with 2+ GPUs; the staged
    backend on 1 GPU, where the NCCL rows are skipped; once under CSAN), its rows named by its layout."""
    from birder_repro.gpucheck.hooks import check_hooks
    from birder_repro.gpucheck.plan import hook_runs, skipped

    rows = []
    for run in hook_runs(gpus):
        if not run.runs_on(gpus):
            rows.append(skipped("hooks", run.label, run.gpus))
            continue
        got = check_hooks(run.world, run.backend, run.training, run.gpus_per_node, run.sanitizer)
        rows += [dataclasses.replace(r, name=f"{run.label}: {r.name}") for r in got]
    return rows


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if not torch.cuda.is_available():
        from birder_repro.cuda_env import why_no_cuda

        why = why_no_cuda()
        print(unusable_cuda_line(why) if why else no_cuda_line(), flush=True)
        return 1 if why else 0
    from birder_repro.gpucheck import procs

    procs.install_stop_handler()  # a SIGTERM to gpu-check (an outer limit) ends the runs it started first
    try:
        return _checked(args)
    finally:
        procs.end_everything()  # nothing it started outlives it


def _checked(args) -> int:
    out = (args.out or Path("runs") / "gpu-check" / time.strftime("%Y-%m-%d_%H-%M-%S")).resolve()
    env = environment()
    header = ", ".join(f"{k} {v}" for k, v in env.items())
    print(f"gpu-check: {header}; writing to {out}", flush=True)
    t0 = time.perf_counter()
    rows = []
    if "kernels" in args.only:
        rows += _section("kernels", lambda: _kernels(args))
    gpus = torch.cuda.device_count()
    if "runs" in args.only:
        rows += _section("runs", lambda: _runs(args, out, gpus))
    if "hooks" in args.only:
        rows += _section("hooks", lambda: _hooks(gpus))
    header += f"; {time.perf_counter() - t0:.0f} s"
    md, js = write(rows, out, header, env)
    print(markdown(rows, header), flush=True)
    print(f"gpu-check: the table is in {md} and {js}", flush=True)
    return exit_code(rows)

"""Why torch cannot use this machine's NVIDIA GPUs, in one line with the fix: the runner and ``make gpu-check``
stop on it rather than train on the CPU without a word.

``torch.cuda.is_available()`` is False on a GPU node when the driver is older than the CUDA the torch build was
made for (a cu130 build needs a driver of the 580 series or newer; 535-570 are common on H100 nodes), when
``CUDA_VISIBLE_DEVICES`` is empty or names no device, or when torch is a CPU-only build. The GPUs still show in
``/dev/nvidia*`` and ``nvidia-smi -L``: :func:`probe` reads those, the driver version (``nvidia-smi
--query-gpu=driver_version --format=csv,noheader``, else ``/proc/driver/nvidia/version``) and what torch was built
for (``torch.version.cuda``) and CUDA's own error (``torch._C._cuda_init``: a GPU in compute mode
EXCLUSIVE_PROCESS that another process holds raises "busy or unavailable", whose compute mode is then asked);
:func:`diagnosis` turns that into the line. Every ``nvidia-smi`` call has a deadline and is killed, not waited
for, past it (a driver in trouble leaves it stuck in the kernel): that, too, is named as the cause. A machine
without NVIDIA devices gets None: there, the CPU is the right device.

The probe is injectable, so that tests (and ``make gpu-check`` in tests) use a stand-in: the arguments of
:func:`probe`, or the environment: ``BIRDER_CUDA_PROBE_ROOT`` stands for ``/`` (``<root>/dev/nvidia0``,
``<root>/proc/driver/nvidia/version``) and ``BIRDER_NVIDIA_SMI`` is the ``nvidia-smi`` command.

Imports no torch at module level: the config layer calls it only where a run would otherwise go to the CPU.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["Probe", "probe", "diagnosis", "why_no_cuda", "no_gpu_here", "MIN_DRIVER", "ROOT_ENV", "SMI_ENV"]

ROOT_ENV, SMI_ENV = "BIRDER_CUDA_PROBE_ROOT", "BIRDER_NVIDIA_SMI"

# The oldest Linux driver each CUDA major version runs on (NVIDIA's CUDA Toolkit release notes, table "CUDA
# Toolkit and Minimum Required Driver Version for CUDA Minor Version Compatibility": 13.x >= 580, 12.x >= 525,
# 11.x >= 450). The wheels torch publishes for an older CUDA (cu126, cu128) are the fix for an older driver.
MIN_DRIVER = {13: 580, 12: 525, 11: 450}
OLDER_WHEEL = {13: ("cu126", 525), 12: ("cu118", 450)}


@dataclass
class Probe:
    """What the machine and torch say about CUDA."""

    devices: list[str] = field(default_factory=list)  # /dev/nvidia0, /dev/nvidia1, ... (not nvidiactl, -uvm)
    gpus: list[str] = field(default_factory=list)  # nvidia-smi -L, one line a GPU
    driver: str | None = None  # e.g. "570.124.06"
    torch_version: str = ""
    torch_cuda: str | None = None  # torch.version.cuda: None for a CPU-only build
    visible: str | None = None  # CUDA_VISIBLE_DEVICES, None when unset
    slurm_job: bool = False  # inside a SLURM job (SLURM_JOB_ID set)
    slurm_gpus: str | None = None  # the GPUs SLURM gave the job (SLURM_JOB_GPUS / SLURM_STEP_GPUS / _ON_NODE)
    torch_error: str | None = None  # CUDA's own error when torch initialises it (None: none, or not asked)
    compute_modes: list[str] = field(default_factory=list)  # nvidia-smi's compute_mode, one a GPU (asked if busy)
    smi_hung: float | None = None  # nvidia-smi did not answer in this many seconds (killed; not asked again)

    @property
    def nvidia_present(self) -> bool:
        return bool(self.devices or self.gpus)

    @property
    def gpu_count(self) -> int:
        return max(len(self.devices), len(self.gpus))


SMI_TIMEOUT_S = 20.0  # nvidia-smi answers in well under a second; a driver in trouble can leave it stuck


class _SmiHung(Exception):
    """``nvidia-smi`` did not answer within the timeout (it was killed, and is not waited for)."""


def _smi(command: str | None, *args: str, timeout_s: float = SMI_TIMEOUT_S) -> str | None:
    """``nvidia-smi`` output, or None where it is missing or fails (no driver loaded); raises :class:`_SmiHung`
    where it does not answer in ``timeout_s``.

    Not ``subprocess.run(timeout=...)``: on a timeout it kills the child and then waits for it, and an
    ``nvidia-smi`` stuck in the kernel (D-state, a driver in trouble) ignores SIGKILL until it leaves the kernel,
    so that wait never returns. Here the child is killed and left; its output goes to a file, not a pipe, so
    nothing blocks on reading it."""
    if not command:
        return None
    with tempfile.TemporaryFile("w+") as out:
        try:
            child = subprocess.Popen([command, *args], stdout=out, stderr=subprocess.DEVNULL, text=True)
        except OSError:
            return None
        try:
            code = child.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            child.kill()  # no wait after it: a child in D-state would block it forever
            raise _SmiHung from None
        out.seek(0)
        return out.read() if code == 0 else None


def _proc_driver(path: Path) -> str | None:
    """The driver version from ``/proc/driver/nvidia/version`` ("NVRM version: ... Kernel Module  570.124.06 ...")."""
    try:
        match = re.search(r"Kernel Module\s+(?:for \S+\s+)?([0-9]+(?:\.[0-9]+)+)", path.read_text())
    except OSError:
        return None
    return match.group(1) if match else None


def _cuda_error() -> str | None:
    """CUDA's own error when torch initialises it (e.g. "CUDA-capable device(s) is/are busy or unavailable"),
    where ``torch.cuda.is_available()`` says only False; None where it initialises or torch has no CUDA."""
    import torch

    init = getattr(torch._C, "_cuda_init", None)
    if init is None:
        return None
    try:
        init()
    except Exception as exc:  # noqa: BLE001 - any error here is the cause to report
        return str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return None


BUSY = "busy or unavailable"  # cudaErrorDevicesUnavailable's text, as torch raises it


def probe(
    root: Path | None = None,
    smi: str | None = None,
    env: Mapping[str, str] = os.environ,
    torch_version: str | None = None,
    torch_cuda: str | None = "unset",
    torch_error: str | None = "unset",
    smi_timeout_s: float = SMI_TIMEOUT_S,
) -> Probe:
    """Read the devices, ``nvidia-smi`` and the driver under ``root`` (default ``/`` or ``$BIRDER_CUDA_PROBE_ROOT``)
    with the ``smi`` command (default ``$BIRDER_NVIDIA_SMI`` or ``nvidia-smi`` on the PATH, each call at most
    ``smi_timeout_s``); torch's version, CUDA and CUDA's own error as given, else from the installed torch."""
    root = Path(root if root is not None else env.get(ROOT_ENV, "/"))
    smi = smi if smi is not None else env.get(SMI_ENV) or shutil.which("nvidia-smi")
    if torch_version is None or torch_cuda == "unset":
        import torch

        torch_version = torch.__version__ if torch_version is None else torch_version
        torch_cuda = torch.version.cuda if torch_cuda == "unset" else torch_cuda
    devices = sorted(str(p) for p in (root / "dev").glob("nvidia*") if re.fullmatch(r"nvidia[0-9]+", p.name))
    if torch_error == "unset":  # asked only where there are GPUs to be busy (and a CUDA build to say so)
        torch_error = _cuda_error() if torch_cuda is not None and devices else None
    listing, driver, modes, hung = "", [], [], None
    try:  # once nvidia-smi hangs, it is not asked again: each call would hang as long
        listing = _smi(smi, "-L", timeout_s=smi_timeout_s) or ""
        query = _smi(smi, "--query-gpu=driver_version", "--format=csv,noheader", timeout_s=smi_timeout_s)
        driver = (query or "").strip().splitlines()
        if torch_error and BUSY in torch_error:
            query = _smi(smi, "--query-gpu=compute_mode", "--format=csv,noheader", timeout_s=smi_timeout_s)
            modes = [m.strip() for m in (query or "").strip().splitlines() if m.strip()]
    except _SmiHung:
        hung = smi_timeout_s
    return Probe(
        devices=devices,
        gpus=[line for line in listing.splitlines() if line.startswith("GPU ")],
        driver=driver[0].strip() if driver else _proc_driver(root / "proc/driver/nvidia/version"),
        torch_version=torch_version,
        torch_cuda=torch_cuda,
        visible=env.get("CUDA_VISIBLE_DEVICES"),
        slurm_job=bool(env.get("SLURM_JOB_ID")),
        slurm_gpus=next(
            (env[k] for k in ("SLURM_STEP_GPUS", "SLURM_JOB_GPUS", "SLURM_GPUS_ON_NODE") if env.get(k)), None
        ),
        torch_error=torch_error,
        compute_modes=modes,
        smi_hung=hung,
    )


def _major(version: str | None) -> int | None:
    match = re.match(r"\s*([0-9]+)", version or "")
    return int(match.group(1)) if match else None


def cpu_allocation(p: Probe) -> bool:
    """A SLURM job given no GPU on a GPU node: the device files show, but the CPU is what the job was given
    (SLURM sets CUDA_VISIBLE_DEVICES=NoDevFiles, or leaves the job's GPU variables unset or 0)."""
    no_gpus = p.slurm_gpus is None or p.slurm_gpus.strip() in ("", "0")
    return p.slurm_job and (no_gpus or (p.visible or "").strip() == "NoDevFiles")


def diagnosis(p: Probe) -> str | None:
    """One line: why torch sees no CUDA device on a machine with NVIDIA GPUs, and the fix; None without them,
    and None for a SLURM job given no GPU (:func:`cpu_allocation`: ``device=auto`` trains on the CPU there)."""
    if not p.nvidia_present or cpu_allocation(p):
        return None
    seen = f"this machine has {p.gpu_count} NVIDIA GPU{'s' if p.gpu_count != 1 else ''}"
    visible = (p.visible or "").strip()
    if p.visible is not None and visible == "NoDevFiles":
        return (
            f"{seen}, but CUDA_VISIBLE_DEVICES=NoDevFiles: the scheduler gave this job no GPU; ask for GPUs "
            "(SLURM: --gres=gpu:N or --gpus-per-node=N) or run with device=cpu"
        )
    if p.visible is not None and visible in ("", "-1"):
        return (
            f"{seen}, but CUDA_VISIBLE_DEVICES={p.visible!r} hides them from torch: unset it or list the GPUs "
            "(e.g. CUDA_VISIBLE_DEVICES=0,1)"
        )
    named = [v.strip() for v in visible.split(",") if v.strip()]
    if any(v.startswith("MIG-") for v in named):
        return (
            f"{seen}, and CUDA_VISIBLE_DEVICES names MIG instances ({', '.join(named)}): check that each still "
            "exists (nvidia-smi -L lists them) and that torch's CUDA supports MIG; one process sees one MIG "
            "instance only"
        )
    listed = " ".join(p.gpus)
    stale = [v for v in named if v.startswith("GPU-") and p.gpus and v not in listed]
    if stale:
        return (
            f"{seen}, but CUDA_VISIBLE_DEVICES names GPU UUIDs this machine does not have ({', '.join(stale)}): "
            "a value left from another node or job; unset it or take the UUIDs from nvidia-smi -L"
        )
    if p.torch_error and BUSY in p.torch_error:
        return _busy(p, seen)
    if p.torch_cuda is None:
        return (
            f"{seen}, but torch {p.torch_version} is a CPU-only build: install a CUDA build of torch "
            "(https://pytorch.org/get-started/locally/)"
        )
    cuda, driver = _major(p.torch_cuda), _major(p.driver)
    need = MIN_DRIVER.get(cuda or 0)
    if driver is not None and need is not None and driver < need:
        wheel, wheel_driver = OLDER_WHEEL.get(cuda, (None, None))
        older = (
            f"install a torch built for an older CUDA that this driver runs (e.g. pip install torch "
            f"--index-url https://download.pytorch.org/whl/{wheel}, for drivers >= {wheel_driver}), or "
            if wheel and driver >= wheel_driver
            else ""
        )
        return (
            f"{seen}, but its NVIDIA driver {p.driver} is older than torch {p.torch_version} (built for CUDA "
            f"{p.torch_cuda}) needs (driver >= {need}): {older}update the driver to {need} or newer"
        )
    if p.smi_hung is not None:
        found = f"driver {p.driver} in /proc" if p.driver else "/proc/driver/nvidia/version is missing"
        return (
            f"{seen}, but nvidia-smi did not answer in {p.smi_hung:.0f} s (killed; {found}): the driver is stuck, "
            "often after a GPU fault; look for NVIDIA Xid errors in dmesg, then reset the GPU (nvidia-smi -r) or "
            "reboot the node"
        )
    if p.driver is None:
        return (
            f"{seen}, but no NVIDIA driver answers (nvidia-smi failed and /proc/driver/nvidia/version is "
            "missing): load or reinstall the driver"
        )
    visible = f", CUDA_VISIBLE_DEVICES={p.visible!r}" if p.visible is not None else ""
    return (
        f"{seen} (driver {p.driver}{visible}), but torch {p.torch_version} (CUDA {p.torch_cuda}) cannot use "
        "them: run python -c 'import torch; torch.cuda.init()' for CUDA's own error and fix what it names"
    )


def _busy(p: Probe, seen: str) -> str:
    """cudaErrorDevicesUnavailable: on a GPU in compute mode EXCLUSIVE_PROCESS another process holds the context
    (or, in PROHIBITED, none may be made)."""
    modes = sorted(set(p.compute_modes))
    mode = f"compute mode {', '.join(modes)}" if modes else "compute mode unknown (nvidia-smi did not say)"
    return (
        f"{seen}, but CUDA says the device(s) are busy or unavailable ({mode}): in Exclusive_Process mode one "
        "process at a time may use a GPU and another holds it (nvidia-smi lists it); wait for it to end, pick a "
        "free GPU with CUDA_VISIBLE_DEVICES, or have an admin set nvidia-smi -c DEFAULT"
        + ("; Prohibited mode allows no process at all" if "Prohibited" in modes else "")
    )


def why_no_cuda() -> str | None:
    """The :func:`diagnosis` of this machine (as the environment's stand-ins say), for a caller that found
    ``torch.cuda.is_available()`` False."""
    if no_gpu_here():  # diagnosis() would say None: no need to import torch to say it
        return None
    return diagnosis(probe())


def no_gpu_here(env: Mapping[str, str] = os.environ) -> bool:
    """True where this machine certainly has no GPU torch could use: no ``/dev/nvidia<N>``, no ``nvidia-smi``
    and no ``/dev/kfd`` (ROCm builds of torch count AMD GPUs as CUDA devices). There the CLI counts 0 GPUs
    without importing torch (about 1.5 s of every launch on a CPU machine); anywhere else torch counts them."""
    root = Path(env.get(ROOT_ENV, "/"))
    devices = any(re.fullmatch(r"nvidia[0-9]+", p.name) for p in (root / "dev").glob("nvidia*"))
    smi = shutil.which(env.get(SMI_ENV) or "nvidia-smi", path=env.get("PATH", os.defpath))
    return not devices and not smi and not (root / "dev" / "kfd").exists()

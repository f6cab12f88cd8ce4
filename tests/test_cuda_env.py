"""A GPU node where torch cannot use CUDA stops in one line naming the cause and the fix (birder_repro.cuda_env),
in the runner (config.resolve_device, through the CLI) and in ``make gpu-check``; a machine without NVIDIA
devices runs on the CPU as before. The driver query is a stand-in: a fake ``/`` and a fake ``nvidia-smi``."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from birder_repro import cuda_env
from birder_repro.config import settings as layout

REPO = Path(__file__).resolve().parent.parent
H100 = "GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-0f5c)"
PROC_VERSION = (
    "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  550.90.07  Release Build  "
    "(dvs-builder@U16-I3-B03-4-3)  Fri May 31 09:35:42 UTC 2024\nGCC version:  gcc version 12.3.0\n"
)


def stand_in(
    tmp_path: Path, driver: str | None = "570.124.06", gpus: int = 1, smi: bool = True, proc: bool = False
) -> dict[str, str]:
    """A fake ``/`` with ``/dev/nvidia<i>`` (and ``/proc/driver/nvidia/version``) and a fake ``nvidia-smi`` that
    answers ``-L`` and the driver query as the real one does; the environment that points the probe at them."""
    root = tmp_path / "root"
    (root / "dev").mkdir(parents=True)
    for i in range(gpus):
        (root / "dev" / f"nvidia{i}").touch()
    (root / "dev" / "nvidiactl").touch()  # not a GPU
    if proc:
        (root / "proc/driver/nvidia").mkdir(parents=True)
        (root / "proc/driver/nvidia/version").write_text(PROC_VERSION)
    script = tmp_path / "nvidia-smi"
    listing = "\\n".join(H100.replace("GPU 0", f"GPU {i}") for i in range(gpus))
    script.write_text(
        "#!/bin/sh\n"
        + ("exit 9\n" if not smi else f'case "$1" in -L) printf "{listing}\\n";; *) printf "{driver}\\n";; esac\n')
    )
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    return {cuda_env.ROOT_ENV: str(root), cuda_env.SMI_ENV: str(script)}


def _probe(env: dict, torch_cuda: str | None = "13.0", **extra) -> cuda_env.Probe:
    return cuda_env.probe(env={**env, **extra}, torch_version="2.14.1+cu130", torch_cuda=torch_cuda)


# ------------------------------------------------------------------------------------------ the diagnosis
def test_a_driver_older_than_the_builds_cuda_is_named_with_both_versions_and_the_fix(tmp_path):
    p = _probe(stand_in(tmp_path, driver="570.124.06", gpus=2))
    assert p.devices and len(p.gpus) == 2 and p.driver == "570.124.06"
    line = cuda_env.diagnosis(p)
    assert "\n" not in line and "2 NVIDIA GPUs" in line
    assert "driver 570.124.06" in line and "CUDA 13.0" in line and ">= 580" in line
    assert "whl/cu126" in line and "update the driver" in line


def test_an_empty_cuda_visible_devices_is_named(tmp_path):
    line = cuda_env.diagnosis(_probe(stand_in(tmp_path, driver="580.65.06"), CUDA_VISIBLE_DEVICES=""))
    assert "CUDA_VISIBLE_DEVICES=''" in line and "unset it" in line


def test_the_driver_version_from_proc_where_nvidia_smi_fails(tmp_path):
    p = _probe(stand_in(tmp_path, smi=False, proc=True))
    assert p.gpus == [] and p.devices and p.driver == "550.90.07"
    assert "driver 550.90.07" in cuda_env.diagnosis(p)


def test_no_driver_and_a_cpu_build_are_named(tmp_path):
    env = stand_in(tmp_path, smi=False)
    assert "no NVIDIA driver answers" in cuda_env.diagnosis(_probe(env))
    assert "CPU-only build" in cuda_env.diagnosis(_probe(env, torch_cuda=None))


def test_a_driver_new_enough_gets_cudas_own_error_as_the_next_step(tmp_path):
    line = cuda_env.diagnosis(_probe(stand_in(tmp_path, driver="580.65.06")))
    assert "torch.cuda.init()" in line and "580.65.06" in line


def test_a_machine_without_nvidia_devices_has_nothing_to_diagnose(tmp_path):
    (tmp_path / "root").mkdir()
    env = {cuda_env.ROOT_ENV: str(tmp_path / "root"), cuda_env.SMI_ENV: str(tmp_path / "no-such-nvidia-smi")}
    assert cuda_env.diagnosis(_probe(env)) is None


def test_no_gpu_here_only_where_no_nvidia_device_nvidia_smi_or_rocm_shows(tmp_path):
    """Where it says so the CLI counts 0 GPUs without importing torch; anything NVIDIA or ROCm and torch counts."""
    (tmp_path / "root" / "dev").mkdir(parents=True)
    bare = {cuda_env.ROOT_ENV: str(tmp_path / "root"), cuda_env.SMI_ENV: str(tmp_path / "no-such-nvidia-smi")}
    assert cuda_env.no_gpu_here(bare)
    assert not cuda_env.no_gpu_here(stand_in(tmp_path / "gpus", gpus=1))  # devices and nvidia-smi
    no_smi = {**stand_in(tmp_path / "gpus2", gpus=1), cuda_env.SMI_ENV: bare[cuda_env.SMI_ENV]}
    assert not cuda_env.no_gpu_here(no_smi)  # the device files alone
    (tmp_path / "root" / "dev" / "kfd").touch()
    assert not cuda_env.no_gpu_here(bare)  # a ROCm machine


# ------------------------------------------------------------------------------------------ the runner
def test_device_auto_stops_on_unusable_cuda_and_device_cpu_still_runs(compose):
    why = lambda: "this machine has 8 NVIDIA GPUs, but its NVIDIA driver 570 is older ..."  # noqa: E731
    with pytest.raises(
        layout.ConfigError,
        match=r"device=auto: torch sees no CUDA device, and this machine has 8 "
        r"NVIDIA GPUs.*driver 570.*or set device=cpu",
    ):
        layout.resolve_device(compose([]), local_processes=1, gpu_count=0, why_no_cuda=why)
    with pytest.raises(layout.ConfigError, match="device=cuda: torch sees no CUDA device"):
        layout.resolve_device(compose(["device=cuda"]), local_processes=1, gpu_count=0, why_no_cuda=why)
    assert layout.resolve_device(compose(["device=cpu"]), local_processes=1, gpu_count=0, why_no_cuda=why) == "cpu"
    assert layout.resolve_device(compose([]), local_processes=1, gpu_count=0, why_no_cuda=lambda: None) == "cpu"


def _cli(tmp_path: Path, env: dict, *args: str) -> subprocess.CompletedProcess:
    cmd = [
        sys.executable,
        "-m",
        "birder_repro.cli",
        "task=digits",
        "optim=sgdm",
        "logger=none",
        "model.size=tiny",
        "data.source=synthetic",
        "train.steps=1",
        "train.eval=false",
        "nodes=1",
        "gpus_per_node=1",
        *args,
    ]
    return subprocess.run(
        cmd,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
        env={
            **os.environ,
            **env,
            "BIRDER_RUNS": str(tmp_path / "runs"),
            "OMP_NUM_THREADS": "1",
            "CUDA_VISIBLE_DEVICES": "",
        },
    )


def test_the_cli_on_a_gpu_node_without_usable_cuda_stops_in_one_line(tmp_path):
    """The real command with a stand-in NVIDIA device and CUDA hidden from torch: no run on the CPU."""
    out = _cli(tmp_path, stand_in(tmp_path))
    assert out.returncode != 0
    last = out.stderr.strip().splitlines()[-1]
    assert "torch sees no CUDA device" in last and "CUDA_VISIBLE_DEVICES=''" in last and "device=cpu" in last
    records = [json.loads(p.read_text()) for p in (tmp_path / "runs").rglob("record.json")]
    assert [r["status"] for r in records] in ([], ["failed"])  # nothing trained: at most a failed record


def test_a_slurm_job_given_no_gpu_on_a_gpu_node_trains_on_the_cpu(tmp_path):
    """The device files show, the job was given the CPU: not an error (device=auto takes the CPU)."""
    env = stand_in(tmp_path, driver="580.65.06", gpus=4)
    assert cuda_env.diagnosis(_probe(env, SLURM_JOB_ID="17")) is None
    assert cuda_env.diagnosis(_probe(env, SLURM_JOB_ID="17", CUDA_VISIBLE_DEVICES="NoDevFiles")) is None
    assert cuda_env.diagnosis(_probe(env, SLURM_JOB_ID="17", SLURM_GPUS_ON_NODE="0")) is None
    given = cuda_env.diagnosis(_probe(env, SLURM_JOB_ID="17", SLURM_JOB_GPUS="0,1"))
    assert given is not None and "cannot use them" in given  # GPUs given, torch still cannot: diagnosed


def test_nodevfiles_mig_and_stale_uuids_are_named_for_what_they_are(tmp_path):
    env = stand_in(tmp_path, driver="580.65.06", gpus=2)
    line = cuda_env.diagnosis(_probe(env, CUDA_VISIBLE_DEVICES="NoDevFiles"))
    assert "gave this job no GPU" in line and "unset it" not in line
    line = cuda_env.diagnosis(_probe(env, CUDA_VISIBLE_DEVICES="MIG-4f2a-1c"))
    assert "MIG instances (MIG-4f2a-1c)" in line
    line = cuda_env.diagnosis(_probe(env, CUDA_VISIBLE_DEVICES="GPU-dead,GPU-0f5c"))
    assert "UUIDs this machine does not have (GPU-dead)" in line
    assert "UUIDs" not in (cuda_env.diagnosis(_probe(env, CUDA_VISIBLE_DEVICES="GPU-0f5c")) or "")


def _smi_script(tmp_path: Path, body: str) -> str:
    script = tmp_path / "bin" / "nvidia-smi"
    script.parent.mkdir(exist_ok=True)
    script.write_text("#!/bin/sh\n" + body)
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    return str(script)


def test_a_busy_exclusive_process_gpu_is_named_with_its_compute_mode(tmp_path):
    """torch's cudaErrorDevicesUnavailable on a GPU that another process holds in Exclusive_Process mode."""
    env = stand_in(tmp_path, gpus=1)
    env[cuda_env.SMI_ENV] = _smi_script(
        tmp_path,
        f'case "$*" in -L) echo "{H100}";; *compute_mode*) echo Exclusive_Process;; *) echo 570.124.06;; esac\n',
    )
    p = cuda_env.probe(
        env=env,
        torch_version="2.14.1+cu128",
        torch_cuda="12.8",
        torch_error="CUDA error: CUDA-capable device(s) is/are busy or unavailable",
    )
    assert p.compute_modes == ["Exclusive_Process"]
    line = cuda_env.diagnosis(p)
    assert "\n" not in line and "busy or unavailable" in line and "compute mode Exclusive_Process" in line
    assert "nvidia-smi -c DEFAULT" in line and "CUDA_VISIBLE_DEVICES" in line


def test_an_nvidia_smi_that_never_answers_is_killed_and_named(tmp_path):
    """A stand-in for nvidia-smi stuck in the kernel: it does not answer. (A process in D-state, which ignores
    SIGKILL and so blocks any wait for it, cannot be staged in a test: the probe's not waiting after the kill is
    by construction.) The probe returns after its deadline, names the hang as the cause and asks nothing more."""
    import threading

    env = stand_in(tmp_path, gpus=2, proc=True)
    calls = tmp_path / "calls"
    pids = tmp_path / "pids"
    env[cuda_env.SMI_ENV] = _smi_script(tmp_path, f'echo "$*" >> {calls}\necho $$ >> {pids}\nexec sleep 60\n')
    got: list = []
    worker = threading.Thread(
        target=lambda: got.append(
            cuda_env.probe(env=env, torch_version="2.14.1+cu128", torch_cuda="12.8", torch_error=None, smi_timeout_s=1)
        ),
        daemon=True,
    )
    worker.start()
    worker.join(30)  # a guard against a hang, not a measurement: the probe returns after about 1 s
    for pid in pids.read_text().split():  # killed already; in case it was not
        try:
            os.kill(int(pid), 9)
        except ProcessLookupError:
            pass
    assert got, "the probe waited for an nvidia-smi that never answers"
    p = got[0]
    assert p.smi_hung == 1 and p.gpus == [] and p.driver == "550.90.07"  # the driver from /proc
    assert calls.read_text().splitlines() == ["-L"]
    line = cuda_env.diagnosis(p)
    assert "\n" not in line and "nvidia-smi did not answer in 1 s" in line and "dmesg" in line

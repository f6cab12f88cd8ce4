"""``parallel=fsdp`` in the runner: every task with Birder, 1-bit Adam and its baseline (the whole sweep is slow;
one cell runs by default), the refusals, and a run killed mid-way that restarts from its DCP checkpoint and
ends as the run left alone."""

from __future__ import annotations

import math
import subprocess
from pathlib import Path

import pytest
import torch
from test_restart import TINY, birder_repro, only_run

FSDP = [
    "parallel=fsdp",
    "nodes=2",
    "gpus_per_node=2",
    "model.size=tiny",
    "data.source=synthetic",
    "train.steps=4",
    "train.batch_size=4",
    "logger=none",
    "train.eval_max_batches=1",
    "data.num_workers=0",
]
TASKS = {
    "digits": "sgdm",
    "resnet20": "sgdm",
    "resnet50": "sgdm",
    "vit": "adamw",
    "lstm_ptb": "sgdm",
    "bert_squad": "bertadam",
    "bert_pretrain": "bertadam",
}


def _run(tmp_path: Path, *args: str, name: str = "runs") -> tuple[subprocess.CompletedProcess, dict]:
    done = birder_repro(*args, env={"BIRDER_RUNS": str(tmp_path / name)}, timeout=600)
    _, rec = only_run(tmp_path / name)
    return done, rec


def _check_fsdp_record(done: subprocess.CompletedProcess, rec: dict, optim: str) -> None:
    assert done.returncode == 0 and rec["status"] == "completed", done.stdout[-2000:] + done.stderr[-3000:]
    assert rec["parallel"] == "fsdp" and rec["optim"] == optim
    assert len(rec["memory"]) == 4 and all(m["parameters"] > 0 and m["peak"] > 0 for m in rec["memory"])
    assert rec["inter_node_bytes_per_step"] > 0 and rec["intra_node_bytes_per_step"] > 0
    assert "parallel: fsdp" in done.stdout  # the summary says which


def _digits_units(bf16: bool = False) -> list[list[torch.Tensor]]:
    """The tiny digits CNN's FSDP units as the runner makes them (tasks/digits.py ``fsdp_units``: the conv-bn
    blocks, then the root with the rest; under bf16 every BatchNorm is a unit of its own, kept fp32,
    birder_repro.train.parallel), each as its parameters in FSDP's order."""
    from birder_repro.tasks.digits import SIZES, DigitsCNN

    model = DigitsCNN(SIZES["tiny"])
    norms = [m for m in model.modules() if isinstance(m, torch.nn.BatchNorm2d)] if bf16 else []
    blocks = norms + [b for b in model.features if any(True for _ in b.parameters())]
    units, taken = [], set()
    for block in [*blocks, model]:
        params = [p for p in block.parameters() if id(p) not in taken]
        taken.update(id(p) for p in params)
        units.append(params)
    return units


def _rows(p: torch.Tensor, m: int, r: int) -> int:
    """Rows of ``p`` that process r of a node holds: FSDP's dim-0 chunks of ceil(rows / m)."""
    per = math.ceil(p.shape[0] / m)
    return max(0, min(per, p.shape[0] - r * per))


def _expected_birder_figures(n: int, m: int, bf16: bool = False) -> dict:
    """Per process: the bytes of parameters and gradients (rank r's real rows, fp32), of Birder's state (m, b, e
    over each unit's shard S padded to S' = a multiple of 8n, and e_bar, this node's 1/n of it; the optimizer
    keeps none) and the inter-node bytes per step: per unit, the all-to-all of n-1 chunks of S'/(8n) bytes
    and the node's flag byte each, and the all-gather of the n-1 others' chunks (birder_repro.comm.fsdp)."""
    units = _digits_units(bf16)
    shards = [sum(math.ceil(p.shape[0] / m) * (p.numel() // p.shape[0]) for p in u) for u in units]
    padded = [math.ceil(s / (8 * n)) * 8 * n for s in shards]
    local = [sum(_rows(p, m, r) * (p.numel() // p.shape[0]) * 4 for u in units for p in u) for r in range(m)]
    return {
        "local": local,
        "shards": shards,
        "hook_state": sum(3 * 4 * s + 4 * s // n for s in padded),
        "inter": sum((n - 1) * (s // (8 * n) + 1) + (n - 1) * s // (8 * n) for s in padded),
    }


def test_digits_birder_under_fsdp_completes(tmp_path):
    done, rec = _run(tmp_path, "task=digits", "optim=birder", *FSDP)
    _check_fsdp_record(done, rec, "birder")
    # The figures by formula, exactly: bytes are counted, not timed, so no tolerance.
    want = _expected_birder_figures(n=2, m=2)
    for rank, mem in enumerate(rec["memory"]):
        assert mem["parameters"] == mem["gradients"] == want["local"][rank % 2], (rank, mem)
        assert mem["optimizer_state"] == want["hook_state"], (rank, mem)
        assert mem["peak"] > mem["parameters"] + mem["gradients"] + mem["optimizer_state"]
    assert rec["inter_node_bytes_per_step"] == want["inter"]
    # Against the fp32 all-reduce of the same shards across the nodes, 2 (n-1)/n x 4 bytes each: 1/32 of it
    # for the payload; the rest is the padding to 8n elements and the flag byte per unit and peer, which the
    # tiny model's small units make visible (the exact count is asserted above).
    fp32 = sum(2 * (2 - 1) / 2 * 4 * s for s in want["shards"])
    payload = sum(s / 8 for s in want["shards"])  # 1 bit per element, to and from the other node
    assert payload == fp32 / 32 and payload <= rec["inter_node_bytes_per_step"] <= payload + 4 * 16 / 8 + 4 * 1


@pytest.mark.slow
@pytest.mark.parametrize("task", sorted(TASKS))
def test_every_task_with_birder_onebit_adam_and_its_baseline_under_fsdp(tmp_path, task):
    for optim in ("birder", "onebit_adam", TASKS[task]):
        # lstm_ptb's loader has no worker processes, so no data.num_workers setting to give (refused as unknown)
        args = [a for a in FSDP if task != "lstm_ptb" or not a.startswith("data.num_workers")]
        done, rec = _run(tmp_path, f"task={task}", f"optim={optim}", *args, name=optim)
        _check_fsdp_record(done, rec, optim)


POWERSGD_SAYS = "scheme 'powersgd', which has no FSDP path; the schemes that have one: allreduce, birder, onebit"


@pytest.mark.parametrize(
    "overrides, says",
    [
        ({"optim": {"name": "sgdm_powersgd"}}, POWERSGD_SAYS),
        ({"optim": {"name": "birder", "comm": {"scheme": "flat"}}}, "optim.comm.scheme='flat' has no FSDP path"),
        ({"optim": {"name": "birder"}, "train": {"precision": "fp16"}}, "train.precision=fp16 is not supported"),
        ({"optim": {"name": "birder"}, "parallel": "zero"}, "parallel='zero': use one of ddp, fsdp"),
    ],
)
def test_what_has_no_fsdp_path_is_refused_naming_the_setting(overrides, says):
    from omegaconf import OmegaConf

    from birder_repro.optim import get_optim_info
    from birder_repro.train.parallel import check_parallel

    cfg = OmegaConf.merge({"parallel": "fsdp"}, overrides)
    with pytest.raises(ValueError, match=".*") as err:
        check_parallel(cfg, get_optim_info(cfg.optim.name).comm)
    assert says in str(err.value) and "\n" not in str(err.value)


def test_the_cli_refuses_powersgd_under_fsdp_before_launching(tmp_path):
    done = birder_repro("task=digits", *FSDP, "optim=sgdm_powersgd", env={"BIRDER_RUNS": str(tmp_path)})
    assert done.returncode != 0 and POWERSGD_SAYS in done.stderr + done.stdout
    _, rec = only_run(tmp_path)
    assert rec["status"] == "failed" and POWERSGD_SAYS in rec["error"] and rec["parallel"] == "fsdp"


@pytest.mark.slow
def test_one_process_per_node_under_fsdp_runs_and_says_so_once(tmp_path):
    done, rec = _run(tmp_path, "task=digits", "optim=birder", *FSDP, "gpus_per_node=1")
    assert done.returncode == 0 and rec["status"] == "completed", done.stderr[-3000:]
    assert (done.stdout + done.stderr).count("nothing to shard inside a node") == 1


def _dcp_state(run_dir: Path, step: int, out: Path) -> dict:
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    dcp_to_torch_save(run_dir / "checkpoints" / f"step-{step:06d}" / "dcp", out)
    return torch.load(out, weights_only=False)


@pytest.mark.slow
def test_a_killed_fsdp_run_restarts_and_ends_as_if_uninterrupted(tmp_path):
    """Birder under FSDP on 2 nodes x 2: rank 1 SIGKILLs itself before step 7; torchrun restarts every worker,
    which resume from the DCP checkpoint of step 4. Loss, metrics and the final sharded state (model, hook:
    m, b, e, e_bar per element) are bit-identical to the run left alone."""
    common = [
        *TINY,
        "optim=birder",
        "parallel=fsdp",
        "nodes=2",
        "gpus_per_node=2",
        "train.steps=10",
        "train.checkpoint_every=4",
        "train.keep_checkpoints=5",
    ]
    plain = birder_repro(*common, env={"BIRDER_RUNS": str(tmp_path / "plain")}, timeout=600)
    assert plain.returncode == 0, plain.stderr[-3000:]
    killed = birder_repro(
        *common,
        "train.max_restarts=2",
        env={"BIRDER_RUNS": str(tmp_path / "killed"), "BIRDER_TEST_FAULT": "kill:1:7"},
        timeout=600,
    )
    assert killed.returncode == 0, killed.stdout[-3000:] + killed.stderr[-3000:]
    assert "rank 1 kill before step 7" in killed.stdout
    plain_dir, a = only_run(tmp_path / "plain")
    killed_dir, b = only_run(tmp_path / "killed")
    assert b["status"] == "completed" and b["restarts"] == 1 and b["steps_redone"] == 2
    assert b["final_loss"] == a["final_loss"] and b["metrics"] == a["metrics"]
    sa, sb = _dcp_state(plain_dir, 8, tmp_path / "a.pt"), _dcp_state(killed_dir, 8, tmp_path / "b.pt")
    assert sa.keys() == sb.keys() and any(k.startswith("e_bar.") for k in sa["hook"])
    for part in ("model", "hook"):
        for k in sa[part]:
            assert torch.equal(sa[part][k], sb[part][k]), f"{part}/{k}"


@pytest.mark.slow  # a whole run on 4 processes, ~50-80 s on 2 cores
def test_digits_birder_under_fsdp_in_bf16_keeps_batchnorm_fp32_in_units_of_its_own(tmp_path):
    """bf16 under FSDP (MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32)): every BatchNorm is a unit
    with fp32 parameters (bf16 weights beside fp32 running statistics fail), so the hook sees 3 more units, each
    exchanged as the formula says; the loss stays finite."""
    done, rec = _run(tmp_path, "task=digits", "optim=birder", *FSDP, "train.precision=bf16")
    _check_fsdp_record(done, rec, "birder")
    assert rec["config"]["train"]["precision"] == "bf16" and math.isfinite(rec["final_loss"])
    want = _expected_birder_figures(n=2, m=2, bf16=True)
    assert len(want["shards"]) == 7 and rec["inter_node_bytes_per_step"] == want["inter"]
    assert all(mem["optimizer_state"] == want["hook_state"] for mem in rec["memory"])


def test_the_report_keeps_ddp_and_fsdp_runs_of_one_cell_apart(tmp_path, monkeypatch):
    """``parallel`` is part of a cell (birder_repro.report.identity: not an ignored key; report/cells.py: a
    setting column): a DDP run and an FSDP run of the same settings are two rows, each with its speedup over
    its own baseline, never one in the other's place."""
    from test_report_cells import config, only, report, run_record

    from birder_repro.report import figures, identity

    monkeypatch.setattr(figures, "drawing", lambda: False)
    assert not identity.is_ignored("parallel")
    ddp = config("birder")
    assert identity.config_key(ddp) != identity.config_key({**ddp, "parallel": "fsdp"})

    def under(parallel: str, rec: dict) -> dict:
        rec["config"]["parallel"] = rec["parallel"] = parallel
        return rec

    records = [
        under("ddp", run_record("sgdm", 100.0)),
        under("ddp", run_record("birder", 150.0)),
        under("fsdp", run_record("sgdm", 80.0, started="2026-01-01T11:00:00")),
        under("fsdp", run_record("birder", 160.0, started="2026-01-01T11:00:00")),
    ]
    rows, left, md = report(tmp_path, records)
    assert len(rows) == 4 and left.empty
    assert only(rows, optim="birder", parallel="ddp")["speedup"] == pytest.approx(1.5)
    assert only(rows, optim="birder", parallel="fsdp")["speedup"] == pytest.approx(2.0)
    assert sum(line.startswith("| Birder") for line in md.splitlines()) == 2

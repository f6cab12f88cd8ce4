"""DiLoCo through the CLI, as a user runs it: 2 nodes of 1 process on the digits task, H = 10, an evaluation every
5 steps and 45 steps, so that evaluations fall between syncs and the last step does too.

Every evaluation scores the model a user would deploy, the last synchronised one (``optimizer.synchronised()``
in birder_repro.train.loop), so the one of step 15 equals that of step 10 to the last bit; and the run ends on a
sync (``optimizer.finish()`` after step 45: the 5 inner steps since step 40 synced), so every rank's checkpoint
of step 45 holds the same model, theta_t itself, with the same buffers.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from birder_repro.run import record
from birder_repro.train.checkpoint import MODEL, step_dir
from birder_repro.train.logger import METRICS_FILE

REPO = Path(__file__).resolve().parent.parent
H, EVERY, STEPS = 10, 5, 45
RUN = [
    "task=digits",
    "optim=diloco",
    "logger=none",
    "model.size=tiny",
    "nodes=2",
    "gpus_per_node=1",
    "launcher=local",
    "train.batch_size=8",
    f"optim.local_steps={H}",
    f"train.eval_every={EVERY}",
    f"train.steps={STEPS}",
    "train.checkpoint_every=15",
    "train.keep_checkpoints=3",
]


def _cli(args: list[str], runs: Path) -> dict:
    env = {**os.environ, "BIRDER_RUNS": str(runs), "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}
    out = subprocess.run(
        [sys.executable, "-m", "birder_repro.cli", *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    [rec] = [record.read_record(p.parent) for p in runs.rglob(record.RECORD_FILE)]
    return rec


def _evaluations(run_dir: Path) -> dict[int, dict]:
    lines = [json.loads(line) for line in (run_dir / METRICS_FILE).read_text().splitlines()]
    return {r["step"]: {k: v for k, v in r.items() if k.startswith(("eval/", "final/"))} for r in lines if "step" in r}


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    return _cli(RUN, tmp_path_factory.mktemp("diloco"))


def test_every_evaluation_between_syncs_scores_the_last_synchronised_model(run):
    evals = _evaluations(Path(run["run_dir"]))
    for step in range(H + EVERY, STEPS, H):  # 15, 25, 35: half way to the next sync
        synced = step - step % H
        assert evals[step] == evals[synced], (step, evals[step], evals[synced])
    assert evals[2 * H] != evals[H]  # a sync moves the model


def test_the_run_ends_on_a_sync(run):
    """finish() took the outer step over the 5 inner steps after step 40: every rank's checkpoint of step 45 holds
    theta_t as its own parameters, nothing left since the sync, the same buffers as every other rank, and
    model.pt is that model."""
    assert run["outer_steps"] == STEPS // H + 1 and run["steps"] == STEPS
    where = step_dir(Path(run["run_dir"]), STEPS)
    shards = [torch.load(where / f"rank{r:05d}.pt", weights_only=True) for r in range(2)]
    model = torch.load(where / MODEL, weights_only=True)["model"]
    floats = [v for k, v in model.items() if v.is_floating_point() and "running" in k]
    for shard in shards:
        own, hook = shard["optimizer"]["diloco"], shard["comm"]
        assert own["since_sync"] == 0 and own["outer_steps"] == STEPS // H + 1
        assert all(torch.equal(a, b) for a, b in zip(own["local"], own["outer"]))
        assert all(torch.equal(a, b) for a, b in zip(own["local"], shards[0]["optimizer"]["diloco"]["local"]))
        assert all(torch.equal(a, b) for a, b in zip(hook["buffers"], hook["synced_buffers"]))
        assert all(torch.equal(a, b) for a, b in zip(hook["buffers"], shards[0]["comm"]["buffers"]))
    # every byte: each sync of the timed steps (finish()'s included) put the parameters and then the floating
    # buffers, 2 (n-1)/n 4 (P + B) at n = 2, on the link; nothing else crossed it
    buffers = sum(b.numel() for b in shards[0]["comm"]["buffers"])
    timed = range(run["timing_warmup_steps"] + 1, STEPS + 1)
    syncs = len([s for s in timed if s % H == 0 or s == STEPS])
    assert run["inter_node_bytes_per_step"] * run["timed_steps"] == pytest.approx(
        syncs * 4 * (run["parameters"] + buffers)
    )
    params = [v for k, v in model.items() if v.is_floating_point() and "running" not in k]
    assert all(torch.equal(a, b) for a, b in zip(params, shards[0]["optimizer"]["diloco"]["local"]))
    assert len(floats) == len(shards[0]["comm"]["buffers"])
    assert all(torch.equal(a, b) for a, b in zip(floats, shards[0]["comm"]["buffers"]))


@pytest.mark.slow
def test_a_run_resumed_between_syncs_ends_bit_equal(run, tmp_path):
    """Resumed from the checkpoint of step 15 (5 inner steps after a sync): every later evaluation and the
    final metrics equal the uninterrupted run's."""
    resumed = _cli([*RUN, f"train.resume={step_dir(Path(run['run_dir']), 15)}"], tmp_path)
    assert resumed["resumed_from_step"] == 15
    whole, again = _evaluations(Path(run["run_dir"])), _evaluations(Path(resumed["run_dir"]))
    for step in range(20, STEPS + 1, EVERY):
        assert again[step] == whole[step], step
    assert resumed["metrics"] == run["metrics"]


def test_a_run_stopped_at_its_target_between_syncs_ends_on_a_sync(tmp_path):
    """``train.stop_at_target`` with an evaluation every 15 steps at H = 10: the evaluation of step 15 (the model
    synced at step 10) reaches the low target, the run stops there, 5 inner steps after its last sync, and
    finish() syncs them before the checkpoint of step 15 and the final evaluation."""
    stop = [a for a in RUN if not a.startswith(("train.eval_every", "train.keep"))]
    rec = _cli([*stop, "train.eval_every=15", "train.stop_at_target=true", "task.target.value=15"], tmp_path)
    assert rec["stopped_at_target"] and rec["steps"] == 15 and rec["outer_steps"] == 2
    shards = [torch.load(step_dir(Path(rec["run_dir"]), 15) / f"rank{r:05d}.pt", weights_only=True) for r in range(2)]
    for shard in shards:
        own = shard["optimizer"]["diloco"]
        assert own["since_sync"] == 0 and all(torch.equal(a, b) for a, b in zip(own["local"], own["outer"]))
        assert all(torch.equal(a, b) for a, b in zip(own["local"], shards[0]["optimizer"]["diloco"]["local"]))

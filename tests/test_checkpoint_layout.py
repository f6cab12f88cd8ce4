"""Resuming on another layout: Birder's per-node state re-sharded exactly for another gpus_per_node; another
node count refused, unless train.resume_policy=reset_errors."""

from __future__ import annotations

import pytest
import torch
from test_restart import TINY, birder_repro, only_run

from birder_repro.train.relayout import rebuild_canonical


def _store(rank: int, nodes: int, m: int, full: dict, signature, padded: int) -> dict:
    """Rank ``rank``'s BucketStore.state_dict of one bucket in Birder's hierarchical layout (nodes x m)."""
    local, node = rank % m, rank // m
    shard = padded // m
    chunk = shard // nodes
    parts = {
        "m": full["m"][local * shard : (local + 1) * shard],
        "e_bar": full["e_bar"][local * shard + node * chunk : local * shard + (node + 1) * chunk],
    }
    return {
        "parts": {"m": [m], "e_bar": [m, nodes]},
        "canonical": None,
        "pending": [],
        "layout_changes": 1,
        "buckets": {0: {"signature": signature, "numel": 30, "padded": padded, "step": 7, "state": parts}},
    }


def test_old_shards_are_put_back_together_per_parameter():
    nodes, m, padded = 2, 2, 32
    full = {"m": torch.arange(padded, dtype=torch.float32), "e_bar": -torch.arange(padded, dtype=torch.float32)}
    signature = ((1, 0, 10), (0, 10, 20))  # parameter 1 first in the bucket, then parameter 0
    stores = [_store(r, nodes, m, full, signature, padded) for r in range(nodes * m)]
    canon = rebuild_canonical(stores, lambda r: [r % m, r // m])
    assert torch.equal(canon["m"][1], full["m"][:10]) and torch.equal(canon["m"][0], full["m"][10:30])
    assert torch.equal(canon["e_bar"][0], full["e_bar"][10:30])
    assert canon["step"] == {1: 7, 0: 7}


@pytest.fixture(scope="module")
def saved_2x2(tmp_path_factory):
    runs = tmp_path_factory.mktemp("layout")
    out = birder_repro(
        *TINY,
        "optim=birder",
        "nodes=2",
        "gpus_per_node=2",
        "train.steps=4",
        "train.checkpoint_every=4",
        env={"BIRDER_RUNS": str(runs / "a")},
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return only_run(runs / "a")[0]


# slow: 36 s of 4-process runs; the re-sharding itself stays by default (the test above), the refusal of another layout
# in test_bad_input.py
@pytest.mark.slow
def test_birder_resumes_with_another_gpus_per_node(saved_2x2, tmp_path):
    out = birder_repro(
        *TINY,
        "optim=birder",
        "nodes=2",
        "gpus_per_node=1",
        "train.steps=6",
        f"train.resume={saved_2x2}",
        env={"BIRDER_RUNS": str(tmp_path)},
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    _, rec = only_run(tmp_path)
    assert rec["status"] == "completed" and rec["resumed_from_step"] == 4


# slow: 16 s; the refusal, its message included, stays by default: test_bad_input.py, test_checkpoint_of_another_layout
@pytest.mark.slow
def test_another_number_of_nodes_is_refused_naming_both_layouts(saved_2x2, tmp_path):
    out = birder_repro(
        *TINY,
        "optim=birder",
        "nodes=1",
        "gpus_per_node=2",
        "train.steps=6",
        f"train.resume={saved_2x2}",
        env={"BIRDER_RUNS": str(tmp_path)},
    )
    assert out.returncode != 0
    _, rec = only_run(tmp_path)
    assert rec["status"] == "failed"
    assert "nodes=2 x gpus_per_node=2" in rec["error"] and "nodes=1 x gpus_per_node=2" in rec["error"]
    assert "train.resume_policy=reset_errors" in rec["error"]


@pytest.mark.slow
def test_reset_errors_resumes_on_another_number_of_nodes(saved_2x2, tmp_path):
    out = birder_repro(
        *TINY,
        "optim=birder",
        "nodes=1",
        "gpus_per_node=2",
        "train.steps=6",
        f"train.resume={saved_2x2}",
        "train.resume_policy=reset_errors",
        env={"BIRDER_RUNS": str(tmp_path)},
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "starts afresh" in out.stdout
    assert only_run(tmp_path)[1]["resumed_from_step"] == 4

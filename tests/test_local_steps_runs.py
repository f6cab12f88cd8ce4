"""The local-step methods end to end through the CLI (``experiment=quickstart``: digits on 2 nodes x 1 process of
this machine), and their pricing by the performance model against the bytes the hooks count.

The runs are slow (a run is ~30 s of start-up): the 1-bit DiLoCo must send fewer inter-node bytes a step than
DiLoCo (by ~32x), and both methods must run on 2 x 2.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
SHORT = ["experiment=quickstart", "logger=none", "train.steps=20", "train.eval=false", "optim.local_steps=5"]


def _run(runs: Path, *args: str) -> dict:
    out = subprocess.run(
        [sys.executable, "-m", "birder_repro.cli", *SHORT, *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=240,
        env={**os.environ, "BIRDER_RUNS": str(runs), "PYTHONUNBUFFERED": "1"},
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    (path,) = runs.rglob("record.json")
    return json.loads(path.read_text())


@pytest.mark.slow
def test_the_1bit_diloco_sends_a_32nd_of_dilocos_inter_node_bytes(tmp_path):
    onebit = _run(tmp_path / "a", "optim=diloco_1bit")
    diloco = _run(tmp_path / "b", "optim=diloco")
    assert onebit["status"] == diloco["status"] == "completed"
    ratio = diloco["inter_node_bytes_per_step"] / onebit["inter_node_bytes_per_step"]
    assert 25 < ratio < 33, ratio  # 1/32 of the fp32 exchange, plus the flag bytes and the scales


@pytest.mark.slow
@pytest.mark.parametrize("optim", ["diloco_1bit", "streaming_diloco"])
def test_runs_on_2_nodes_of_2(tmp_path, optim):
    rec = _run(tmp_path, f"optim={optim}", "gpus_per_node=2")
    assert rec["status"] == "completed" and rec["inter_node_bytes_per_step"] > 0


@pytest.mark.parametrize("nodes,gpus", [(2, 1), (2, 2), (4, 2)])
def test_the_model_prices_the_outer_exchange_at_the_hooks_bytes(nodes, gpus):
    """sync_collectives' bytes, once per H steps, are what comm.diloco_onebit and comm.streaming count."""
    from birder_repro.comm.accounting import all_gather_bytes, allreduce_bytes
    from birder_repro.comm.streaming import payload_bytes
    from birder_repro.perf.schemes import counted_bytes, scheme_for_optim, sync_collectives

    numel = 30_762  # digits' CNN
    n, m = nodes, gpus

    def priced(scheme):
        sums = [counted_bytes(op, n, m) for op in sync_collectives(scheme, numel, n, m)]
        return sum(a for a, _ in sums), sum(b for _, b in sums)

    padded = -(-numel // (8 * n * m)) * (8 * n * m)
    chunk = padded // (8 * m * n)
    onebit_inter = (n - 1) * (chunk + 1) + (n - 1) * chunk  # the hook's, less its scales (not priced)
    assert priced(scheme_for_optim("diloco_1bit")) == ((m - 1) * padded / (8 * m), onebit_inter)
    shard = -(-numel // m)
    fp32_inter = allreduce_bytes(4 * shard, n)
    assert priced(scheme_for_optim("streaming_diloco"))[1] == fp32_inter
    for q in ("fp8", "int4"):
        scheme = scheme_for_optim("streaming_diloco", quantize=q)
        assert scheme == f"diloco_streaming_{q}"
        assert priced(scheme) == (all_gather_bytes(4 * shard, m), all_gather_bytes(payload_bytes(shard, q), n))
    assert priced(scheme_for_optim("diloco_1bit"))[1] * 30 < priced("diloco")[1]


def test_the_advisors_step_prices_the_local_step_methods_below_dilocos():
    """predict_step (what mode=advise prices a method with) on a made-up profile and a slow link: the 1-bit DiLoCo's
    step is cheaper than DiLoCo's at the same H, Streaming DiLoCo's fp32 step costs as DiLoCo's, int4 and fp8 less."""
    from birder_repro.perf.cluster import ClusterSpec
    from birder_repro.perf.model import predict_step
    from birder_repro.perf.profile import Profile

    numel, n, m, h = 1_000_000, 2, 2, 10
    profile = Profile(
        name="p", device="cpu", task="t", batch_size=64, forward_backward_s=0.01, parameter_count=numel,
        optimizer_s=0.001, threads=1, host_cores=8,
    )  # fmt: skip
    spec = ClusterSpec(
        name="x", intra_mbit=100_000, inter_mbit=100, inter_latency_us=50, inter_efficiency=1.0, intra_latency_us=5
    )
    step = {s: predict_step(profile, spec, n, m, s, local_steps=h) for s in ("diloco", "diloco_1bit")}
    for s in ("diloco_streaming", "diloco_streaming_fp8", "diloco_streaming_int4"):
        step[s] = predict_step(profile, spec, n, m, s, local_steps=h)
    assert step["diloco_1bit"].inter_node_bytes * 30 < step["diloco"].inter_node_bytes
    assert step["diloco_1bit"].total_s < step["diloco"].total_s
    assert step["diloco_streaming"].total_s == pytest.approx(step["diloco"].total_s)
    assert step["diloco_streaming_int4"].total_s < step["diloco_streaming_fp8"].total_s < step["diloco"].total_s

"""Probes of the timed steps (birder_repro.train.probes): where the loop starts and stops them, and the link
counters of an emulated cluster's node (kernel counters stubbed; tests/test_emulated.py reads real ones)."""

from __future__ import annotations

import sys
from pathlib import Path

import torch

from birder_repro.comm.topology import Topology
from birder_repro.netns import counters
from birder_repro.train import probes, train

sys.path.insert(0, str(Path(__file__).parent))
from test_train import BlobsTask, blobs_data, make_config, tiny_model


class CountingTask(BlobsTask):
    """Counts forward passes and evaluations, so that a probe can tell where in the run it is called."""

    def __init__(self):
        self.losses = self.evaluations = 0

    def loss(self, model, batch, device):
        self.losses += 1
        return super().loss(model, batch, device)

    def evaluate(self, model, loader, device):
        self.evaluations += 1
        return super().evaluate(model, loader, device)


class RecordingProbe:
    def __init__(self, task):
        self.task, self.calls = task, []

    def start(self):
        self.calls.append(("start", self.task.losses, self.task.evaluations))

    def stop(self, timed_steps):
        self.calls.append(("stop", self.task.losses, self.task.evaluations, timed_steps))
        return {"link_bytes_per_step": [1.0]}


def test_probes_cover_exactly_the_timed_steps(tmp_path):
    torch.manual_seed(0)
    task, model = CountingTask(), tiny_model()
    probe = RecordingProbe(task)
    rec = train(
        make_config(tmp_path, steps=7, timing_warmup_steps=2, compute_calibration_passes=3),
        task=task,
        data=blobs_data(0, 1, 16),
        model=model,
        optimizer=torch.optim.SGD(model.parameters(), lr=0.2),
        comm=None,
        topology=Topology(rank=0, world_size=1, gpus_per_node=1),
        device=torch.device("cpu"),
        run_dir=tmp_path,
        probes=[probe],
    )
    # start: after the 2 warm-up steps and the 3 calibration passes; stop: after all 7 steps, before evaluation.
    assert probe.calls == [("start", 2 + 3, 0), ("stop", 7 + 3, 0, 5)]
    assert task.evaluations == 1 and rec["link_bytes_per_step"] == [1.0] and rec["timed_steps"] == 5


def test_link_counters_per_step_in_node_order(monkeypatch):
    readings = iter(
        [
            {"tx_bytes": 1000, "tx_packets": 10, "retrans_segs": 0},
            {"tx_bytes": 5000, "tx_packets": 30, "retrans_segs": 2},
        ]
    )
    monkeypatch.setattr(counters, "read_counters", lambda iface: next(readings))
    probe = probes.link_probe(Topology(rank=0, world_size=1, gpus_per_node=1), {probes.LINK_IFACE_ENV: "v0"})
    probe.start()
    out = probe.stop(timed_steps=4)
    assert out["link_bytes_per_step"] == [1000.0] and out["link_packets_per_step"] == [5.0]
    assert out["link_tcp_retransmits_per_step"] == [0.5] and out["link_interfaces"] == ["v0"]
    assert probes.link_probe(Topology(rank=0, world_size=1, gpus_per_node=1), {}) is None


def test_the_worker_gets_a_link_probe_only_where_the_launcher_names_a_link():
    one = Topology(rank=0, world_size=1, gpus_per_node=1)
    assert probes.probes_for(one, {}) == []
    (probe,) = probes.probes_for(one, {probes.LINK_IFACE_ENV: "v0"})
    assert isinstance(probe, probes.LinkCounters) and probe.reader and probe.iface == "v0"


def test_the_worker_does_not_import_the_launchers():
    import subprocess

    code = (
        "import sys, birder_repro.train.worker, birder_repro.train.probes; print('birder_repro.launch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"

"""``make bench`` runs end to end on a tiny bucket (no speed is asserted: the machine is shared; only what a
timing must be whatever the load: seconds, at least as long as what it timed)."""

from __future__ import annotations

import time

from birder_repro.bench import kernels as bench
from birder_repro.comm import kernels


def test_bench_prints_every_backend_beside_the_copy(capsys):
    bench.main(["--sizes", "4096", "--rounds", "2", "--device", "cpu"])
    lines = capsys.readouterr().out.splitlines()
    rows = [line.split()[1] for line in lines[2:]]
    assert rows == ["copy", *kernels.available_backends("cpu"), "torch.rand"]
    assert all(len(line.split()) == 9 for line in lines[2:])


def test_bench_bucket_reports_medians_and_threads():
    result = bench.bench_bucket(1000, nodes=2, rounds=1, device=bench.torch.device("cpu"), backends=["torch"])
    assert set(result) == {"copy", "torch", "torch.rand"}
    assert all(t["compress"] > 0 and t["rounds"] == 1 and t["threads"] >= 1 for t in result.values())


def test_bench_times_in_seconds():
    """A block that sleeps 50 ms is timed at 50 ms or more, never less (a sleep lasts at least its time), and
    not in other units (50, or 5e7)."""
    timed = bench._time(lambda: time.sleep(0.05), bench.torch.device("cpu"))
    assert 0.05 <= timed < 50

"""Stopping at a step boundary (birder_repro.train.stop): every rank agrees on the signal one of them got, across
gloo processes; the record names the signal that stopped the run."""

from __future__ import annotations

import signal

import torch
from dist_utils import run_distributed


def _agree(rank: int, world: int, got: dict) -> list[int]:
    from birder_repro.train import stop

    out = []
    for case in got:
        stop._State.signum = case.get(rank, 0)  # only some ranks were signalled
        out.append(int(stop.agreed(torch.device("cpu"))))
    return out


def test_every_rank_agrees_on_the_signal_only_some_ranks_got():
    """The agreeing all-reduce runs when one rank holds the signal and the others do not yet (torchrun signals
    its workers one by one): all stop, with SIGINT where ranks got different ones."""
    cases = [{1: signal.SIGTERM}, {0: signal.SIGINT, 1: signal.SIGTERM}, {}, {0: signal.SIGINT}]
    results = run_distributed(_agree, 2, cases)
    assert results[0] == results[1] == [signal.SIGTERM, signal.SIGINT, 0, signal.SIGINT]


def test_the_stop_names_the_signal_it_was():
    from birder_repro.train.stop import Stopped, signal_name

    assert signal_name(signal.SIGTERM) == "SIGTERM" and signal_name(signal.SIGINT) == "SIGINT"
    assert "stopped by SIGTERM" in str(Stopped(signal.SIGTERM))

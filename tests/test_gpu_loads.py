"""Checkpoint reads that must not put what they do not need on the GPU: Lightning's hook state goes to the CPU
(the hook copies it onto its device), and a relayout reads every old rank's shard on the CPU, memory-mapped,
moving only its hook state ("comm") to the device."""

from __future__ import annotations

import torch

from birder_repro.train import checkpoint_files, relayout


def test_lightnings_hook_state_is_read_onto_the_cpu(tmp_path, monkeypatch):
    from birder_repro.integrations import lightning

    path = tmp_path / "hook.pt"
    lightning.save_rank_file({"e": torch.ones(3)}, path)
    seen = []
    real = torch.load
    monkeypatch.setattr(torch, "load", lambda *a, **k: seen.append(k) or real(*a, **k))
    state = lightning.load_rank_file(path)
    assert torch.equal(state["e"], torch.ones(3))
    assert seen and seen[0].get("map_location") == "cpu" and seen[0].get("weights_only") is True


def test_a_relayout_takes_only_the_hook_state_of_another_ranks_shard_to_the_device(tmp_path, monkeypatch):
    path = tmp_path / "rank00001.pt"
    torch.save({"model": {"w": torch.ones(4)}, "optimizer": {"m": torch.ones(4)}, "comm": {"e": [torch.ones(2)]}}, path)
    reads = []
    real = checkpoint_files.load_file
    monkeypatch.setattr(
        checkpoint_files, "load_file", lambda p, d, mmap=False: reads.append((d, mmap)) or real(p, d, mmap)
    )
    comm = relayout.comm_of_shard(path, torch.device("meta"))  # "meta" stands for the GPU: any other device
    assert reads == [(torch.device("cpu"), True)]
    assert comm["e"][0].device.type == "meta" and comm["e"][0].shape == (2,)

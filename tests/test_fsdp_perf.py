"""The performance model's FSDP schemes (birder_repro.perf.schemes): bytes per unit against the counts the FSDP
hooks make (birder_repro.comm.fsdp, written out here), and ``mode=predict parallel=fsdp``."""

from __future__ import annotations

from pathlib import Path

import pytest

from birder_repro.perf.schemes import bucket_collectives, counted_bytes, padded_elements, scheme_for_optim

REPO = Path(__file__).resolve().parent.parent


def _bytes(scheme: str, numel: int, n: int, m: int) -> tuple[float, float]:
    intra = inter = 0.0
    for op in bucket_collectives(scheme, numel, n, m):
        a, b = counted_bytes(op, n, m)
        intra, inter = intra + a, inter + b
    return intra, inter


@pytest.mark.parametrize("n, m", [(2, 2), (4, 2), (8, 8), (2, 1)])
def test_fsdp_birder_inter_node_bytes_are_the_hooks_formula(n, m):
    numel = 100_003
    padded = padded_elements("fsdp_birder", numel, n, m)
    chunk = padded // (8 * m * n)  # bytes of one node's chunk of this process's shard
    # all-to-all: a chunk and the node's flag byte to each other node; all-gather: the chunk to each
    assert _bytes("fsdp_birder", numel, n, m)[1] == (n - 1) * (chunk + 1) + (n - 1) * chunk


@pytest.mark.parametrize("n, m", [(2, 2), (4, 8)])
def test_fsdp_hsdp_sends_fsdps_collectives_and_an_fp32_allreduce_of_the_shard(n, m):
    numel = 4096 * m
    intra, inter = _bytes("fsdp_hsdp", numel, n, m)
    assert inter == 2 * (n - 1) / n * 4 * numel / m
    # two all-gathers of the parameters ((m-1) shards of 4 numel/m bytes each) and the reduce-scatter
    assert intra == 2 * (m - 1) * 4 * numel / m + (m - 1) / m * 4 * numel


def test_fsdp_schemes_follow_the_optimizer_and_refuse_the_rest():
    assert scheme_for_optim("birder", None, "fsdp") == "fsdp_birder"
    assert scheme_for_optim("onebit_lamb", None, "fsdp") == "fsdp_onebit"
    assert scheme_for_optim("sgdm", None, "fsdp") == "fsdp_hsdp"
    with pytest.raises(ValueError, match="no FSDP path"):
        scheme_for_optim("sgdm_powersgd", None, "fsdp")


def test_predict_parallel_fsdp():
    from omegaconf import OmegaConf

    from birder_repro.perf.predict import predict_record

    cluster = OmegaConf.load(REPO / "conf" / "cluster" / "ethernet_10g.yaml")

    def cfg(optim: str, parallel: str):
        return OmegaConf.create(
            {
                "task": {"name": "resnet50"},
                "optim": {"name": optim, "freeze": 0.1},
                "nodes": 8,
                "gpus_per_node": 8,
                "parallel": parallel,
                "train": {"batch_size": 32, "steps": 100},
                "cluster": cluster,
                "predict": {"profile": "paper", "implementation": "this"},
            }
        )

    birder = predict_record(cfg("birder", "fsdp"))
    hsdp, ddp = predict_record(cfg("sgdm", "fsdp")), predict_record(cfg("birder", "ddp"))
    onebit = predict_record(cfg("onebit_adam", "fsdp"))
    assert birder["parallel"] == "fsdp" and birder["prediction"]["scheme"] == "fsdp_birder"
    assert set(onebit["throughput_by_stage"]) == {"warmup", "compression"}
    # Birder's exchange across nodes is ~1/32 of the fp32 all-reduce of the shard, under FSDP as under DDP
    assert birder["inter_node_bytes_per_step"] < hsdp["inter_node_bytes_per_step"] / 25
    assert birder["inter_node_bytes_per_step"] == pytest.approx(ddp["inter_node_bytes_per_step"], rel=0.01)
    assert birder["throughput_samples_per_s"] > hsdp["throughput_samples_per_s"]

"""The run record's schema (birder_repro.run.schema): one documented key set for the writer and the readers."""

from __future__ import annotations

import pytest

from birder_repro.run import schema


def test_every_key_is_documented_once_and_design_keys_are_there():
    names = [k.name for k in schema.KEYS]
    assert len(names) == len(set(names)) and all(k.doc for k in schema.KEYS)
    for key in (
        "status",
        "task",
        "optim",
        "cluster",
        "world_size",
        "batch_size",
        "global_batch_size",
        "steps",
        "throughput_samples_per_s",
        "throughput_by_stage",
        "step_time_s",
        "intra_node_bytes_per_step",
        "inter_node_bytes_per_step",
        "fp32_allreduce_bytes_per_step",
        "link_bytes_per_step",
        "metrics",
        "versions",
        "device",
        "git_sha",
        "started",
        "ended",
        "lr",
        "command",
        "config",
    ):
        assert key in schema.NAMES, key


def test_check_refuses_undocumented_keys_and_parts():
    schema.check(schema.empty_record())
    with pytest.raises(ValueError, match="throughput_samples_per_sec"):
        schema.check({"throughput_samples_per_sec": 1.0})
    with pytest.raises(ValueError, match="step_time_s"):
        schema.check({"step_time_s": {"total": 1.0, "idle": 0.1}})


def test_get_reads_nested_values_and_refuses_misspelt_keys():
    record = {"step_time_s": {"total": 0.5}, "cluster": {"nodes": 2}, "metrics": None}
    assert schema.get(record, "step_time_s", "total") == 0.5 and schema.get(record, "cluster", "nodes") == 2
    assert schema.get(record, "metrics", default={}) == {} and schema.get(record, "steps") is None
    with pytest.raises(KeyError, match="not a run record key"):
        schema.get(record, "step_time")
    with pytest.raises(KeyError, match="cluster.node "):
        schema.get(record, "cluster", "node")


class _Pretrain:
    metrics = ("mlm_loss", "mlm_accuracy", "nsp_accuracy")
    headline_metric = "mlm_accuracy"


def test_metrics_in_the_tasks_order_headline_first_losses_last():
    assert schema.declared_metrics(_Pretrain()) == ("mlm_accuracy", "mlm_loss", "nsp_accuracy")
    got = schema.ordered_metrics(
        {"loss": 1.0, "nsp_accuracy": 50.0, "eval_loss": 2.0, "extra": 1.0, "mlm_loss": 3.0, "mlm_accuracy": 9.0},
        schema.declared_metrics(_Pretrain()),
    )
    assert list(got) == ["mlm_accuracy", "mlm_loss", "nsp_accuracy", "extra", "eval_loss", "loss"]
    assert schema.headline_metric(type("T", (), {"metrics": ("top1", "top5")})()) == "top1"


def test_metric_names_union_in_a_stable_order():
    records = [
        {"headline_metric": "f1", "metrics": {"f1": 1, "exact_match": 2, "loss": 3}},
        {"metrics": {"top1": 1, "top5": 2, "eval_loss": 1, "loss": 2}},
    ]
    assert schema.metric_names(records) == ["f1", "exact_match", "top1", "top5", "eval_loss", "loss"]
    assert schema.metric_names(reversed(records))[:2] == ["top1", "top5"]

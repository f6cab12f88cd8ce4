"""A config as plain data (birder_repro.config.plain): the one conversion of the record, the digests, the config checks,
W&B's config and a prediction's input; and the one resume command (birder_repro.run.record.resume_command)."""

from __future__ import annotations

import pytest
from omegaconf import OmegaConf

from birder_repro.config.plain import plain_config
from birder_repro.run import digest


def test_a_config_becomes_plain_data_resolved_without_hydras_node():
    cfg = OmegaConf.create(
        {"train": {"steps": 10, "eval_every": "${train.steps}"}, "tags": ["${train.steps}"], "hydra": {"x": 1}}
    )
    plain = plain_config(cfg)
    assert plain == {"train": {"steps": 10, "eval_every": 10}, "tags": [10]}
    assert type(plain) is dict and type(plain["train"]) is dict and type(plain["tags"]) is list


def test_hydras_node_is_never_resolved_so_its_job_only_fields_do_no_harm():
    cfg = OmegaConf.create({"seed": 1, "hydra": {"run": {"dir": "${hydra:runtime.output_dir}"}}})
    assert plain_config(cfg) == {"seed": 1}


def test_an_unresolvable_config_raises_or_leniently_comes_as_written():
    cfg = OmegaConf.create({"a": 1, "b": "${nowhere}", "hydra": {"x": 1}})
    with pytest.raises(Exception, match="nowhere"):
        plain_config(cfg)
    assert plain_config(cfg, lenient=True) == {"a": 1, "b": "${nowhere}"}


def test_a_mapping_is_copied_so_that_changing_the_result_leaves_it_alone():
    given = {"train": {"steps": 10}, "hydra": {"x": 1}}
    plain = plain_config(given)
    plain["train"].pop("steps")
    assert given == {"train": {"steps": 10}, "hydra": {"x": 1}} and plain == {"train": {}}
    assert plain_config([1, 2]) == [1, 2] and plain_config(None) is None


def test_a_config_and_its_plain_record_have_one_digest():
    """The record keeps plain_config(cfg); train.resume=auto compares its digest with a new config's."""
    cfg = OmegaConf.create({"train": {"steps": 10, "eval_every": "${train.steps}"}, "seed": 0, "dry_run": True})
    assert digest.cell_digest(cfg) == digest.cell_digest(plain_config(cfg))
    assert digest.run_digest(cfg) != digest.run_digest({**plain_config(cfg), "seed": 1})


def test_one_resume_command_the_runs_own_or_a_nodes(tmp_path):
    """record.resume_command: the run's recorded command line, or a node's own (birder_repro.run.finish), with the
    run directory; a run without a recorded command resumes with a bare birder-repro."""
    from birder_repro.run import record

    where = f"hydra.run.dir={tmp_path.resolve()}"
    assert record.resume_command(tmp_path) == f"birder-repro {where}"
    (tmp_path / record.COMMAND_FILE).write_text("birder-repro optim=birder nodes=2\n")
    assert record.resume_command(tmp_path) == f"birder-repro optim=birder nodes=2 {where}"
    node = "birder-repro optim=birder nodes=2 launcher.node_rank=1"
    assert record.resume_command(tmp_path, node) == f"{node} {where}"

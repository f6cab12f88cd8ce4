"""mode=advise for BERT-Large pre-training with no runs: the 1-bit Adam paper's schedule (section 7.1, Table 2) and
its 1-node V100 rows (section 3.1, Table 1), every number traced to them, every method marked."""

from __future__ import annotations

import json

import pytest

from birder_repro.perf import paper_profiles, paper_steps
from birder_repro.perf.paper_profiles import v100_profile, v100_rows
from birder_repro.perf.paper_steps import PAPER_METHODS
from birder_repro.perf.paper_steps import paper_steps as steps_of

LARGE = {"size": "large", "nsp": True, "vocab_size": 30522}
TARGET = ("mlm_accuracy", 60.0, "higher")  # conf/task/bert_pretrain.yaml
PAPER_RUN = ["data.max_seq_length=128", "train.precision=fp16", "train.batch_size=32"]  # global batch 4096 on 16 x 8
QUERY = ["task=bert_pretrain", "model.size=large", "nodes=16", "gpus_per_node=8", "cluster=ethernet_10g"]


def cli_advice(compose, tmp_path, overrides, capsys):
    """``birder-repro mode=advise <overrides>`` with an empty runs folder: (exit code, printed text, advice)."""
    from birder_repro.cli import run

    out_dir = tmp_path / "advice"
    code = run(compose(["mode=advise", f"advise.runs={tmp_path / 'empty'}", *overrides], hydra_config=True), out_dir)
    return code, capsys.readouterr().out, json.loads((out_dir / "advice.json").read_text())


# ---- the numbers, each against the paper as printed -------------------------------------------------------------


def test_the_schedule_is_the_1bit_adam_papers_table_2():
    """Table 2, BERT-Large, sequence 128: Adam 152K (N/A), 1-bit Adam 152K (23K); section 7.1: batch 4K."""
    for optim, freeze in (("bertadam", 0), ("onebit_adam", 23_000)):
        m = PAPER_METHODS[("bert_pretrain", optim)]
        assert (m.schedule_steps, m.schedule_batch, m.freeze_steps, m.seq_length) == (152_000, 4096, freeze, 128)
        assert dict(m.model) == {"size": "large"} and "Table 2" in m.schedule_source
    assert ("bert_pretrain", "birder") not in PAPER_METHODS  # no paper trains Birder on BERT-Large


def test_bert_large_steps_at_the_users_global_batch():
    at_4k = steps_of("bert_pretrain", "onebit_adam", 4096, 32, TARGET, LARGE, 128)
    assert (at_4k.steps, at_4k.freeze) == (152_000, 23_000) and "ASSUMPTION" not in at_4k.text
    # the same 622,592,000 sequences at half the batch, said to be an assumption
    at_2k = steps_of("bert_pretrain", "onebit_adam", 2048, 16, TARGET, LARGE, 128)
    assert (at_2k.steps, at_2k.freeze) == (304_000, 46_000) and "ASSUMPTION" in at_2k.text
    # the paper reports no masked-LM accuracy: not reached, no value, and said so (no conversion invented)
    assert not at_4k.reached and at_4k.value is None and "the paper reports no mlm_accuracy" in at_4k.text
    assert steps_of("bert_pretrain", "bertadam", 4096, 32, TARGET, LARGE, 128).freeze == 0
    # another model, sequence length or method: the paper does not cover it
    assert steps_of("bert_pretrain", "bertadam", 4096, 32, TARGET, {"size": "full"}, 128) is None
    assert steps_of("bert_pretrain", "bertadam", 4096, 32, TARGET, LARGE, 512) is None
    assert steps_of("bert_pretrain", "birder", 4096, 32, TARGET, LARGE, 128) is None


# The 1-bit Adam paper, Table 1, its two 1-node rows as printed: forward, all-reduce, backward else, step (ms).
TABLE1_ONE_NODE = {8: (13, 32.74, 28.18, 59.73, 57.29), 4: (7, 35.99, 239.76, 59.95, 74.21)}


@pytest.mark.parametrize("gpus", [8, 4])
def test_the_v100_profile_is_table_1s_one_node_row(gpus):
    row, forward, _allreduce, backward_else, step = TABLE1_ONE_NODE[gpus]
    p = v100_profile("bert_pretrain", LARGE, 128, gpus, "fp16")
    assert p.name == f"paper:bert_large_seq128_v100x{gpus}" and p.batch_size == 16
    assert p.forward_backward_s == pytest.approx((forward + backward_else) / 1e3)
    assert p.backward_fraction == pytest.approx(backward_else / (forward + backward_else))
    assert p.optimizer_s == pytest.approx(step / 1e3)
    assert f"{gpus} x V100" in p.device and "not your GPUs" in p.device and f"row {row} " in p.notes
    assert "Table 1" in p.device and p.precision == "fp16"
    # compression: the Birder paper's A100 figure per element (section 5.3), named a lower bound
    a100 = paper_profiles.paper_profile(name="bert_squad_b3")
    assert p.compression_s_per_element == a100.compression_s_per_element and "lower bound" in p.notes


def test_the_lamb_papers_one_node_rows_as_the_docs_state_them():
    """docs/performance-model.md: the 1-bit LAMB paper's 1-node rows (Table 5) cost 12 % (Ethernet, micro-batch 16)
    and 26 % (InfiniBand, micro-batch 64) less a sample than the profile's Table 1 rows."""
    import csv

    from birder_repro.config.resources import paper_tables_dir

    def one_node(name: str, cluster: str) -> dict:
        with open(paper_tables_dir() / name, newline="") as f:
            return next(r for r in csv.DictReader(f) if r["cluster"] == cluster and r["nodes"] == "1")

    def per_sample(r: dict) -> float:
        samples = int(r["batch_per_gpu"]) * int(r["accumulation"])
        return (float(r["forward_ms"]) + float(r["backward_else_ms"])) / samples

    for cluster, less in (("ethernet", 0.12), ("infiniband", 0.26)):
        adam, lamb = one_node("onebit_adam_table1.csv", cluster), one_node("onebit_lamb_table5.csv", cluster)
        assert 1 - per_sample(lamb) / per_sample(adam) == pytest.approx(less, abs=0.005)


def test_a_v100_profile_is_only_the_run_its_row_measured():
    assert v100_profile("bert_pretrain", {"size": "full"}, 128, 8, "fp16") is None  # BERT-Base
    assert v100_profile("bert_pretrain", LARGE, 512, 8, "fp16") is None  # sequence 512
    assert v100_profile("bert_pretrain", LARGE, 128, 8, "fp32") is None  # not the papers' fp16
    assert v100_profile("bert_pretrain", LARGE, 128, 2, "fp16").name.endswith("v100x8")  # 8 a node otherwise


def test_a_planted_multi_node_row_is_refused(monkeypatch):
    """The profile is derived from 1-node rows only: a yaml entry pointing at Table 1's row 12 (2 nodes) fails."""
    data = paper_profiles._yaml()
    planted = {**data, "v100_profiles": {"x": {**data["v100_profiles"]["bert_large_seq128_v100x8"], "row": 12}}}
    monkeypatch.setattr(paper_profiles, "_yaml", lambda: planted)
    with pytest.raises(ValueError, match="not a 1-node row"):
        v100_profile("bert_pretrain", LARGE, 128, 8, "fp16")


# ---- the answer ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("link", [10_000, 25_000])
def test_the_bert_large_answer_marks_every_method(compose, tmp_path, capsys, link):
    """16 x 8 at 10 and 25 Gbit/s, nothing run: BertAdam and 1-bit Adam ranked on the paper's schedule and V100
    profile, each so marked, the V100s named as not the user's; Birder and the rest named, to measure."""
    code, out, advice = cli_advice(compose, tmp_path, [*QUERY, *PAPER_RUN, f"cluster.link_mbit={link}"], capsys)
    assert code == 0 and advice["layout"]["global_batch"] == 4096
    ranked = {r["optim"]: r for r in advice["ranked"]}
    assert set(ranked) == {"bertadam", "onebit_adam"}
    for r in ranked.values():
        assert r["steps"]["source"] == "from the paper" and r["steps"]["value"] == 152_000
        assert r["steps"]["ended_at"] is None and "Table 2" in r["steps"]["table"]
        assert r["profile"]["source"] == "from the paper" and "V100" in r["profile"]["device"]
        assert r["step_s"]["source"] == r["time_to_target_s"]["source"] == "predicted"
    assert ranked["onebit_adam"]["freeze"] == 23_000 and ranked["bertadam"]["freeze"] == 0
    methods = {m["optim"]: m for m in advice["methods"]}
    assert {"bertadam", "onebit_adam", "birder", "sgdm", "sgdm_powersgd", "diloco"} <= set(methods)
    for m in methods.values():
        assert m["steps"] in ("measured", "from the paper", "to measure")
        assert m["profile"] in ("yours", "given", "from the paper", "to measure")
    assert methods["birder"]["steps"] == "to measure" and not methods["birder"]["ranked"]
    birder = [c for c in advice["cannot_rank"] if c["method"] == "birder"]
    assert birder and all(
        "model.size=large" in c["command"] and "data.max_seq_length=128" in c["command"] for c in birder
    )
    assert "target not reported there" in out and "the paper reports no mlm_accuracy" in out
    assert "not your GPUs" in out and "ended short of your target" not in out


def test_bert_large_at_the_tasks_own_sequence_length_names_what_it_needs(compose, tmp_path, capsys):
    """The task's own sequence 512 in fp32: no paper profiles it, nothing ranked, exit 0, the note says how."""
    code, out, advice = cli_advice(compose, tmp_path, QUERY, capsys)
    assert code == 0 and not advice["ranked"]
    assert all(m["profile"] == "to measure" for m in advice["methods"] if m["optim"] in ("bertadam", "onebit_adam"))
    assert "data.max_seq_length=128" in out and "train.precision=fp16" in out


def test_the_render_marks_a_schedule_without_the_targets_metric():
    from birder_repro.perf.advice_render import _steps_cell

    cell = _steps_cell({"source": "from the paper", "value": 152000, "reached": 0, "table": "T2", "ended_at": None})
    assert "target not reported there" in cell and not cell.startswith("<=")
    ended = _steps_cell({"source": "from the paper", "value": 10, "reached": 1, "table": "T1", "ended_at": 76.0})
    assert ended.startswith("<=") and "reached by its end" in ended


def test_module_docs_cite_the_sources():
    assert "Table 2" in paper_steps.__doc__ and "Table 1" in paper_profiles.__doc__
    assert set(v100_rows()) == {"bert_large_seq128_v100x8", "bert_large_seq128_v100x4"}

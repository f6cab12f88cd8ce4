"""The report: run records -> tables (birder_repro.report), and the paper's transcribed numbers.

Records here are synthetic fixtures written to temporary directories; the throughputs are the paper's
Table 1 / Table 3 figures so the expected speedups and efficiencies are the paper's own.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest
from conftest import write_records

from birder_repro.report import figures, paper, tables
from birder_repro.report.__main__ import main
from birder_repro.report.records import load_frame

PAPER_DIR = Path(__file__).resolve().parents[1] / "tables" / "paper"


@pytest.fixture(autouse=True)
def no_figures(monkeypatch):
    """Drawing costs seconds (importing matplotlib); only the figure test below draws."""
    monkeypatch.setattr(figures, "drawing", lambda: False)


def make_record(
    optim="birder",
    nodes=1,
    gpus_per_node=8,
    throughput=100.0,
    *,
    task="resnet50",
    status="completed",
    started="2025-01-01T10:00:00",
    batch=32,
    cluster="ethernet_10g",
    source="synthetic",
    stages=None,
    top1=75.0,
    error=None,
    baseline="sgdm",
) -> dict:
    """A record with DESIGN.md's keys (values are made up unless a test passes the paper's)."""
    world = nodes * gpus_per_node
    record = {
        "status": status,
        "task": task,
        "optim": optim,
        "cluster": {
            "name": cluster,
            "nodes": nodes,
            "gpus_per_node": gpus_per_node,
            "interconnect": cluster.split("_")[0],
            "link_mbit": 10000,
        },
        "world_size": world,
        "batch_size": batch,
        "global_batch_size": batch * world,
        "steps": 50,
        "throughput_samples_per_s": throughput,
        "throughput_by_stage": stages or {},
        "step_time_s": {"total": 0.1, "compute": 0.06, "communication": 0.03, "compression": 0.01},
        "intra_node_bytes_per_step": 2e6,
        "inter_node_bytes_per_step": 1e5,
        "fp32_allreduce_bytes_per_step": 3.2e6,
        "link_bytes_per_step": None,
        "metrics": {"top1": top1, "loss": 1.5},
        "versions": {},
        "device": "cpu",
        "git_sha": "abc",
        "started": started,
        "ended": started,
        "lr": 0.001,
        "config": {"data": {"source": source}, "task": {"name": task, "baseline": baseline}},
    }
    if error is not None:
        record["error"] = error
    return record


def write_runs(root: Path, records: list[dict]) -> Path:
    return write_records(root, records, lambda i, rec: f"2025-01-01/10-00-{i:02d}_{rec['task']}_{rec['optim']}")


def paper_cell_records() -> list[dict]:
    """Table 1 / Table 3 (Ethernet, 32 per GPU) at 8 and 16 GPUs for SGDM and Birder."""
    return [
        make_record("sgdm", 1, 8, 3693.0),
        make_record("birder", 1, 8, 3462.0),
        make_record("sgdm", 2, 8, 2959.0),
        make_record("birder", 2, 8, 6015.0),
    ]


def cells_of(root: Path, mode="whole") -> pd.DataFrame:
    return tables.cell_table(load_frame(root), mode)


def row(cells: pd.DataFrame, optim: str, nodes: int) -> pd.Series:
    found = cells[(cells["optim"] == optim) & (cells["nodes"] == nodes)]
    assert len(found) == 1, found
    return found.iloc[0]


# --- formulas ----------------------------------------------------------------------------------------------


def test_scale_efficiency_reproduces_paper_table3():
    # Birder paper, Table 3, Ethernet: SGDM 16 GPUs 2959 vs 8 GPUs 3693 -> 40.1%; Birder 6015/3462 -> 86.9%.
    assert round(100 * tables.scale_efficiency(2959, 16, 3693, 8), 1) == 40.1
    assert round(100 * tables.scale_efficiency(6015, 16, 3462, 8), 1) == 86.9
    assert round(100 * tables.scale_efficiency(15253, 64, 3462, 8), 1) == 55.1


def test_speedup_and_scale_efficiency_from_records(tmp_path):
    cells = cells_of(write_runs(tmp_path, paper_cell_records()))
    assert row(cells, "birder", 1)["speedup"] == pytest.approx(3462 / 3693)
    assert row(cells, "birder", 2)["speedup"] == pytest.approx(6015 / 2959)  # the paper's 2.03x
    assert row(cells, "sgdm", 2)["speedup"] == pytest.approx(1.0)
    assert round(100 * row(cells, "sgdm", 2)["scale_efficiency"], 1) == 40.1
    assert round(100 * row(cells, "birder", 2)["scale_efficiency"], 1) == 86.9
    assert row(cells, "birder", 2)["scale_ref"] == "1x8"


def test_speedup_only_within_the_same_cell(tmp_path):
    # A baseline on another cluster or batch size is another cell: no speedup against it.
    records = [
        make_record("sgdm", 1, 8, 1000.0, cluster="infiniband_200g"),
        make_record("birder", 1, 8, 900.0, cluster="ethernet_10g"),
        make_record("sgdm", 1, 8, 500.0, batch=128),
    ]
    cells = cells_of(write_runs(tmp_path, records))
    assert pd.isna(row(cells, "birder", 1)["speedup"])
    assert (cells.loc[cells["optim"] == "sgdm", "speedup"] == 1.0).all()


def test_bert_baseline_is_bertadam(tmp_path):
    records = [
        make_record("bertadam", 2, 8, 84.0, task="bert_squad", batch=3, baseline="bertadam"),
        make_record("birder", 2, 8, 431.0, task="bert_squad", batch=3, baseline="bertadam"),
    ]
    cells = cells_of(write_runs(tmp_path, records))
    assert round(row(cells, "birder", 2)["speedup"], 2) == 5.13  # Birder paper, Table 2


# --- which runs are shown ---------------------------------------------------------------------------------


def test_a_repeated_run_of_one_configuration_and_seed_supersedes_the_older(tmp_path):
    records = [
        make_record("birder", 1, 8, 111.0, started="2025-01-01T09:00:00"),
        make_record("birder", 1, 8, 333.0, started="2025-01-03T09:00:00"),
        make_record("birder", 1, 8, 222.0, started="2025-01-02T09:00:00"),
        make_record("birder", 1, 8, 999.0, started="2025-01-04T09:00:00", status="failed", error="x"),
    ]
    root = write_runs(tmp_path / "runs", records)
    cells = cells_of(root)
    assert row(cells, "birder", 1)["throughput_shown"] == 333.0
    assert row(cells, "birder", 1)["n"] == 1
    main(["--runs", str(root), "--out", str(tmp_path / "out"), "--figures", str(tmp_path / "fig")])
    text = (tmp_path / "out" / "resnet50.md").read_text()
    assert text.count("superseded by a newer run of the same configuration and seed (2025-01-01/10-00-01") == 2
    assert "failed: x" in text


def test_failed_runs_are_listed_not_dropped(tmp_path, capsys):
    records = [
        make_record("sgdm", 1, 8, 3693.0),
        make_record("birder", 2, 8, status="failed", error="RuntimeError: gloo timeout\nTraceback ..."),
        make_record("onebit_adam", 1, 8, task="bert_squad", status="failed", error="OOM"),
    ]
    root = write_runs(tmp_path / "runs", records)
    assert main(["--runs", str(root), "--out", str(tmp_path / "out"), "--figures", str(tmp_path / "f")]) == 0
    assert "3 run record(s) under" in capsys.readouterr().out
    resnet = (tmp_path / "out" / "resnet50.md").read_text()
    assert "Runs left out" in resnet and "failed: RuntimeError: gloo timeout" in resnet
    assert "Traceback" not in resnet  # first line of the error only
    summary = (tmp_path / "out" / "summary.md").read_text()
    assert "1 completed, 2 not completed" in summary and "OOM" in summary
    assert (tmp_path / "out" / "bert_squad.md").exists()  # a task with only failed runs still has its file


def test_unreadable_record_is_skipped_with_a_warning(tmp_path):
    root = write_runs(tmp_path, [make_record("sgdm")])
    bad = tmp_path / "broken" / "record.json"
    bad.parent.mkdir()
    bad.write_text('{"status": "compl')
    with pytest.warns(UserWarning, match="broken"):
        frame = load_frame(root)
    assert len(frame) == 1


def test_a_record_with_an_unreadable_value_is_skipped_naming_it(tmp_path, capsys):
    # a record edited by hand (a refused run's train.steps=ten is read cleanly: test_report_cells.py)
    edited = make_record("birder")
    edited["intra_node_bytes_per_step"] = "ten"
    root = write_runs(tmp_path / "runs", [make_record("sgdm"), edited])
    assert main(["--runs", str(root), "--out", str(tmp_path / "out"), "--figures", str(tmp_path / "f")]) == 0
    err = capsys.readouterr().err
    [line] = [x for x in err.splitlines() if "skipping run record" in x]
    assert "record.json" in line and "'ten'" in line and "Traceback" not in err
    assert (tmp_path / "out" / "resnet50.md").exists()


def test_inter_node_bytes_against_fp32_allreduce(tmp_path):
    # Without the record's own fp32 inter-node figure, a ring over 2 nodes x 8 sends 1/8 of it across nodes.
    derived = make_record("sgdm", 2, 8, 100.0)  # fp32 total 3.2 MB, inter 0.1 MB
    given = make_record("birder", 2, 8, 100.0)
    given["fp32_allreduce_inter_node_bytes_per_step"] = 1.0e6
    one_node = make_record("birder", 1, 8, 100.0)
    cells = cells_of(write_runs(tmp_path, [derived, given, one_node]))
    assert row(cells, "sgdm", 2)["inter_vs_fp32"] == pytest.approx(0.1 / (3.2 / 8))
    assert row(cells, "birder", 2)["inter_vs_fp32"] == pytest.approx(0.1)
    assert pd.isna(row(cells, "birder", 1)["inter_vs_fp32"])  # nothing crosses nodes on one node


# --- 1-bit Adam stage throughput ------------------------------------------------------------------------


def test_stage_throughput_is_labelled(tmp_path):
    records = [
        make_record("sgdm", 2, 8, 2959.0),
        make_record("onebit_adam", 2, 8, 4715.0, stages={"warmup": 3000.0, "compression": 5500.0}),
    ]
    root = write_runs(tmp_path, records)
    whole = row(cells_of(root, "whole"), "onebit_adam", 2)
    stage = row(cells_of(root, "stage"), "onebit_adam", 2)
    assert (whole["throughput_shown"], whole["throughput_basis"]) == (4715.0, "whole run")
    assert (stage["throughput_shown"], stage["throughput_basis"]) == (5500.0, "compression stage")
    assert stage["speedup"] == pytest.approx(5500 / 2959)
    shown = tables.display_frame(cells_of(root, "stage"), "stage")
    column = tables.throughput_header("stage")
    assert "compression stage" in column
    assert shown[column].tolist() == ["2959 (1.00x)", f"5500{tables.STAGE_MARK} (1.86x)"]
    assert shown["warmup / compression stage"].tolist() == ["", "3000 / 5500"]
    assert shown["inter MB/step"].tolist() == ["0.1", "0.1"]  # no per-stage bytes in these records


def test_stage_mode_shows_compression_stage_bytes(tmp_path):
    record = make_record("onebit_adam", 2, 8, 4715.0, stages={"warmup": 3000.0, "compression": 5500.0})
    record["inter_node_bytes_per_step_by_stage"] = {"warmup": 4e5, "compression": 1.3e4}
    root = write_runs(tmp_path, [record])
    assert row(cells_of(root, "whole"), "onebit_adam", 2)["inter_mb_shown"] == pytest.approx(0.1)
    stage = cells_of(root, "stage")
    assert row(stage, "onebit_adam", 2)["inter_mb_shown"] == pytest.approx(0.013)
    assert tables.display_frame(stage, "stage")["inter MB/step"].tolist() == [f"0.013{tables.STAGE_MARK}"]
    with pytest.raises(ValueError, match="throughput mode"):
        tables.cell_table(load_frame(root), "fastest")


# --- files written ------------------------------------------------------------------------------------------


def test_markdown_contains_the_birder_row(tmp_path, capsys):
    root = write_runs(tmp_path / "runs", paper_cell_records())
    out = tmp_path / "tables"
    main(["--runs", str(root), "--out", str(out), "--figures", str(tmp_path / "figures")])
    text = (out / "resnet50.md").read_text()
    birder = [line for line in text.splitlines() if line.startswith("| Birder")]
    assert len(birder) == 2
    assert "6015 (2.03x)" in birder[1] and "86.9% (vs 1x8)" in birder[1] and "16 (2x8)" in birder[1]
    assert "synthetic data" in text
    csv = pd.read_csv(out / "resnet50.csv")
    assert set(csv["optim"]) == {"sgdm", "birder"}
    printed = capsys.readouterr().out
    assert "4 completed, 0 not completed" in printed and str(out / "summary.md") in printed
    assert "Birder" in (out / "summary.md").read_text()


def test_emulated_link_bytes_column_appears_when_present(tmp_path):
    plain = make_record("sgdm", 2, 1, 50.0)
    emulated = make_record("birder", 2, 1, 80.0)
    emulated["link_bytes_per_step"] = [2.0e6, 4.0e6]
    cells = cells_of(write_runs(tmp_path, [plain, emulated]))
    assert row(cells, "birder", 2)["link_mb_per_step"] == pytest.approx(3.0)
    shown = tables.display_frame(cells, "whole")
    assert shown["link MB/step/node"].tolist() == ["—", "3"]
    assert "link MB/step/node" not in tables.display_frame(cells[cells["optim"] == "sgdm"], "whole")


def test_each_tasks_own_metrics_become_columns(tmp_path):
    pretrain = make_record("birder", 1, 1, 10.0, task="bert_pretrain", baseline="bertadam")
    pretrain["headline_metric"] = "mlm_accuracy"
    pretrain["metrics"] = {"mlm_accuracy": 12.5, "mlm_loss": 6.1, "nsp_accuracy": 50.0, "loss": 6.3}
    lstm = make_record("sgdm", 1, 1, 10.0, task="lstm_ptb")
    lstm["metrics"] = {"perplexity": 400.0, "val_perplexity": 420.0, "loss": 6.0}
    root = write_runs(tmp_path / "runs", [pretrain, lstm, make_record("sgdm", 1, 1, 10.0)])
    frame = load_frame(root)
    assert frame.attrs["metric_columns"] == [
        "mlm_accuracy",
        "mlm_loss",
        "nsp_accuracy",
        "perplexity",
        "val_perplexity",
        "top1",
        "loss",
    ]
    main(["--runs", str(root), "--out", str(tmp_path / "out"), "--figures", str(tmp_path / "f")])
    line = next(x for x in (tmp_path / "out" / "bert_pretrain.md").read_text().splitlines() if "| optimizer" in x)
    header = [cell.strip() for cell in line.split("|")]
    at = header.index("MLM acc.")
    assert header[at : at + 4] == ["MLM acc.", "MLM loss", "NSP acc.", "train loss"] and "top-1" not in header
    assert "val ppl" in (tmp_path / "out" / "lstm_ptb.md").read_text()
    summary = (tmp_path / "out" / "summary.md").read_text()
    assert "MLM acc. 12.5" in summary and "ppl 400" in summary and "top-1 75" in summary
    csv = pd.read_csv(tmp_path / "out" / "bert_pretrain.csv")
    assert csv.loc[0, "mlm_accuracy"] == 12.5 and csv.loc[0, "headline_metric"] == "mlm_accuracy"


def test_no_records_writes_nothing(tmp_path, capsys):
    out = tmp_path / "tables"
    assert main(["--runs", str(tmp_path / "empty"), "--out", str(out)]) == 0
    assert "no run records" in capsys.readouterr().out
    assert not out.exists()


def comparison_lines(tmp_path, records, name) -> list[str]:
    root = write_runs(tmp_path / name / "runs", records)
    out = tmp_path / name / "out"
    main(["--runs", str(root), "--out", str(out), "--figures", str(tmp_path / name / "f")])
    text = (out / "paper_comparison.md").read_text()
    return [line for line in text.splitlines() if "| Birder" in line and "16 (2x8)" in line]


def test_paper_comparison_puts_paper_numbers_beside_reproduced_cells(tmp_path):
    # A run on the paper's Ethernet cluster meets Tables 1 and 3 (same figures, merged into one row) only.
    ethernet = comparison_lines(tmp_path, paper_cell_records(), "ethernet")
    assert len(ethernet) == 1
    assert "1, 3" in ethernet[0] and "6015 (2.03x)" in ethernet[0] and "86.9%" in ethernet[0]
    # A run elsewhere (here: local processes) is shown beside every interconnect the paper reports.
    local = [
        make_record(r["optim"], r["cluster"]["nodes"], 8, r["throughput_samples_per_s"], cluster="local")
        for r in paper_cell_records()
    ]
    lines = comparison_lines(tmp_path, local, "local")
    assert len(lines) == 2 and any("infiniband" in line and "6784 (1.45x)" in line for line in lines)


def test_no_paper_match_says_so(tmp_path):
    text = paper.comparison_markdown(
        cells_of(write_runs(tmp_path, [make_record(nodes=3)])), paper.load_paper_tables(PAPER_DIR)
    )
    assert "No reproduced cell matches" in text and "resnet50 8x8 batch 128" in text


# --- the paper's transcribed numbers ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def paper_rows() -> pd.DataFrame:
    return paper.load_paper_tables(PAPER_DIR)


def paper_value(rows, table, optimizer, gpus, column, batch=None, interconnect="ethernet"):
    sel = (
        (rows["table"] == table)
        & (rows["optimizer"] == optimizer)
        & (rows["gpus"] == gpus)
        & (rows["interconnect"] == interconnect)
    )
    if batch is not None:
        sel &= rows["batch_per_gpu"] == batch
    assert sel.sum() == 1
    return rows.loc[sel, column].iloc[0]


def test_paper_csvs_spot_values(paper_rows):
    assert len(paper_rows) == 24 + 12 + 24 + 24
    assert paper_value(paper_rows, 1, "birder", 64, "throughput", batch=32) == 15253
    assert paper_value(paper_rows, 1, "birder", 64, "top1", batch=32) == 75.30
    assert paper_value(paper_rows, 1, "sgdm", 64, "throughput", batch=128) == 16640
    assert paper_value(paper_rows, 2, "bertadam", 16, "throughput") == 84
    assert paper_value(paper_rows, 2, "birder", 8, "exact_match") == 81.18
    assert paper_value(paper_rows, 3, "sgdm", 16, "scale_efficiency") == 40.1
    assert paper_value(paper_rows, 3, "birder", 64, "throughput", interconnect="infiniband") == 19956
    assert paper_value(paper_rows, 4, "birder", 16, "speedup", interconnect="infiniband") == 2.85
    assert (paper_rows["gpus"] == paper_rows["nodes"] * paper_rows["gpus_per_node"]).all()


def test_paper_speedups_and_efficiencies_agree_with_their_throughputs(paper_rows):
    """A transcription check: printed speedups and scale efficiencies follow from the printed throughputs
    within rounding (the paper sometimes truncates: 0.01x and 0.1 point), except the misprints listed in
    tables/paper/README.md."""
    baseline = {"resnet50": "sgdm", "bert_squad": "bertadam"}
    keys = ["table", "batch_per_gpu", "interconnect"]
    misprints = {(1, "onebit_adam", 8), (3, "onebit_adam", 8), (4, "onebit_adam", 8), (4, "birder", 8)}
    for _, r in paper_rows.iterrows():
        same = (paper_rows[keys] == r[keys]).all(axis=1)
        base = paper_rows[same & (paper_rows["gpus"] == r["gpus"]) & (paper_rows["optimizer"] == baseline[r["task"]])][
            "throughput"
        ].iloc[0]
        first = paper_rows[same & (paper_rows["gpus"] == 8) & (paper_rows["optimizer"] == r["optimizer"])][
            "throughput"
        ].iloc[0]
        where = (r["table"], r["optimizer"], r["gpus"], r["batch_per_gpu"], r["interconnect"])
        if (r["table"], r["optimizer"], r["gpus"]) not in misprints:
            assert abs(r["throughput"] / base - r["speedup"]) <= 0.011, where
        if not pd.isna(r["scale_efficiency"]):
            eff = 100 * tables.scale_efficiency(r["throughput"], r["gpus"], first, 8)
            assert abs(eff - r["scale_efficiency"]) <= 0.11, where


def test_figures_drawn_where_matplotlib_is_installed(tmp_path, monkeypatch):
    monkeypatch.setattr(figures, "drawing", lambda: True)
    root = write_runs(tmp_path / "runs", paper_cell_records())
    main(["--runs", str(root), "--out", str(tmp_path / "out"), "--figures", str(tmp_path / "fig")])
    predicted = [
        dict(make_record("birder", 2, 8, 7000.0), status="predicted"),
        dict(make_record("sgdm", 2, 8, 3000.0), status="predicted"),
    ]
    (tmp_path / "runs" / "pred").mkdir(parents=True)
    write_runs(tmp_path / "runs" / "pred", predicted)
    main(["--runs", str(root), "--out", str(tmp_path / "out"), "--figures", str(tmp_path / "fig")])
    drawn = sorted(p.name for p in (tmp_path / "fig").iterdir())
    # Figure 3 holds both sources (solid / dashed); Figure 4 one per source; Figure 2 needs metrics.jsonl. The
    # run's length is part of the setting, so of the name (runs of 50 and 2000 steps never share a figure).
    assert drawn == [
        "fig3_resnet50_ethernet_10g_10000mbit_synthetic_b32_50steps.png",
        "fig4_measured_resnet50_ethernet_10g_10000mbit_synthetic_b32_50steps.png",
        "fig4_predicted_resnet50_ethernet_10g_10000mbit_synthetic_b32_50steps.png",
    ]


def test_predicted_records_stay_apart_from_measured_ones(tmp_path):
    measured = paper_cell_records()
    predicted = [
        dict(make_record("sgdm", 2, 8, 3000.0), status="predicted"),
        dict(make_record("birder", 2, 8, 6600.0), status="predicted"),
    ]
    root = write_runs(tmp_path / "runs", measured + predicted)
    cells = cells_of(root)
    assert sorted(cells["source"]) == ["measured"] * 4 + ["predicted"] * 2
    pred = cells[(cells["source"] == "predicted") & (cells["optim"] == "birder")].iloc[0]
    assert pred["speedup"] == pytest.approx(6600 / 3000)  # over the predicted baseline, not the measured one
    meas = cells[(cells["source"] == "measured") & (cells["optim"] == "birder") & (cells["nodes"] == 2)].iloc[0]
    assert meas["speedup"] == pytest.approx(6015 / 2959)
    main(["--runs", str(root), "--out", str(tmp_path / "out"), "--figures", str(tmp_path / "f")])
    md = (tmp_path / "out" / "resnet50.md").read_text()
    assert md.count("PREDICTED by the performance model") == 1
    comparison = (tmp_path / "out" / "paper_comparison.md").read_text()
    assert "## Predicted by the performance model" in comparison and "## Measured runs" in comparison
    assert f"{100 * (6600 / 6015 - 1):+.1f}%" in comparison  # the predicted cell's error against the paper


def test_data_wait_is_a_column_of_the_step(tmp_path):
    rec = make_record("sgdm", 1, 8, 100.0)
    rec["step_time_s"] = {"total": 0.15, "compute": 0.06, "communication": 0.03, "compression": 0.01, "data_wait": 0.05}
    root = write_runs(tmp_path / "runs", [rec])
    cells = cells_of(root)
    assert cells.iloc[0]["step_ms_data_wait"] == pytest.approx(50.0)
    assert "data wait ms" in tables.display_frame(cells, "whole").columns


def test_birder_variants_and_model_sizes_are_separate_rows(tmp_path):
    flat = make_record("birder", 2, 8, 500.0)
    flat["config"]["optim"] = {"comm": {"scheme": "flat"}}
    hierarchical = make_record("birder", 2, 8, 900.0)
    hierarchical["config"]["optim"] = {"comm": {"scheme": "hierarchical"}}
    tiny = make_record("birder", 2, 8, 5000.0)
    tiny["config"]["model"] = {"size": "tiny"}
    cells = cells_of(write_runs(tmp_path, [flat, hierarchical, tiny, make_record("sgdm", 2, 8, 450.0)]))
    assert len(cells) == 4  # none hides another under the newest-per-cell rule
    labels = tables.display_frame(cells, "whole")["optimizer"].tolist()
    assert "Birder (flat)" in labels and labels.count("Birder") == 2
    assert row(cells[cells["variant"] == "flat"], "birder", 2)["speedup"] == pytest.approx(500 / 450)
    # Only the full-size hierarchical Birder is put beside the paper's Birder.
    joined = paper.comparison_frame(cells, paper.load_paper_tables(PAPER_DIR))
    assert joined.loc[joined["optimizer"] == "birder", "throughput_shown"].tolist() == [900.0]

"""mode=advise (birder_repro.perf.advisor, birder_repro.perf.advise): made-up records of fashion_mnist on 2 nodes
x 2 GPUs (global batch 256), 1-node profiles of each optimizer, and a layout on 10 GbE-like links. SGDM takes 100
steps, Birder 150, 1-bit Adam 120 (its first 30 in fp32): Birder wins on slow links (it sends 1/32 of SGDM's
bytes), SGDM on fast ones (fewer steps of about the same compute). Where the ranking flips is worked out here by
bisection on the pure arithmetic, independently of the grid the advisor scans."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import yaml
from conftest import write_records
from test_report_tuning import profile  # the same made-up 1-node profile of the MLP

from birder_repro.perf import advise as arithmetic
from birder_repro.perf import advisor as advise
from birder_repro.perf.advice_query import Layout
from birder_repro.perf.advice_render import advice_figure, format_advice
from birder_repro.perf.advice_steps import load_runs, measured_steps
from birder_repro.perf.advise import LINK_GRID as GRID
from birder_repro.perf.cluster import CLUSTER_DIR
from birder_repro.perf.profile import Profile

STEPS = {"sgdm": 100, "birder": 150, "onebit_adam": 120}
FREEZE = 30


def record(
    optim: str, step, *, seed: int = 0, nodes: int = 2, prof=None, evaluations: int = 10, batch=None, task=None
) -> dict:
    """A completed run as the runner writes it, with the keys the advisor reads."""
    task = task or "fashion_mnist"
    optim_cfg = {"name": optim, "lr": 0.01, "seed": seed, **({"freeze": FREEZE} if optim == "onebit_adam" else {})}
    reached = step is not None
    return {
        "status": "completed",
        "task": task,
        "optim": optim,
        "cluster": {"name": "emulated", "nodes": nodes, "gpus_per_node": 2, "link_mbit": 200},
        "world_size": 2 * nodes,
        "batch_size": 64,
        "global_batch_size": batch or 128 * nodes,
        "steps": 430,
        "planned_steps": 430,
        "metrics": {"top1": 88.0},
        "headline_metric": "top1",
        "started": f"2026-01-01T10:00:{seed:02d}",
        "profile": prof,
        "time_to_target": {
            "metric": "top1",
            "target": 87.0,
            "direction": "higher",
            "reached": reached,
            "step": step,
            "seconds": step * 0.1 if reached else None,
            "evaluations": evaluations,
        },
        "config": {
            "seed": seed,
            "nodes": nodes,
            "data": {"source": "real", "eval_set": "test"},
            "model": {"size": "full", "width": 512},
            "optim": optim_cfg,
            "cluster": {"name": "emulated", "link_mbit": 200},
            "train": {"epochs": 2},
            "task": {"name": task},
        },
    }


def profile_run(optim: str) -> dict:
    """A 1-node profile run: train.eval=false, no time to target."""
    return record(optim, None, nodes=1, prof=profile(optim), evaluations=0)


def runs(root: Path, optims=tuple(STEPS), seeds=(0, 1), profiles=tuple(STEPS), extra=()) -> Path:
    recs = [record(o, STEPS[o], seed=s) for o in optims for s in seeds]
    recs += [profile_run(o) for o in profiles] + list(extra)
    return write_records(root, recs, lambda i, rec: f"{i:02d}_{rec['optim']}_n{rec['config']['nodes']}")


MODEL = {"size": "full", "width": 512, "num_classes": 10}  # the query's (the records name size and width)


def layout(link: float, **more) -> Layout:
    """A query of fashion_mnist on 2 x 2 at batch 64, the width 512 MLP, to top-1 87 %, evaluated every 10 steps."""
    cluster = yaml.safe_load((CLUSTER_DIR / "ethernet_10g.yaml").read_text())
    return Layout(
        **{
            "task": "fashion_mnist",
            "nodes": 2,
            "gpus_per_node": 2,
            "batch_size": 64,
            "global_batch": 256,
            "cluster": "ethernet_10g",
            "cluster_config": cluster,
            "link_mbit": link,
            "model": MODEL,
            "target": ("top1", 87.0, "higher"),
            "baseline": "sgdm",
            "eval_every": 10,
            "planned_steps": 430,
            **more,
        }
    )


def order(advice: dict) -> list[str]:
    return [r["method"] for r in advice["ranked"]]


def hand_time(optim: str, scheme: str, link: float, freeze: int = 0) -> float:
    lay = layout(link)
    warm, main, _ = arithmetic.step_times(
        Profile.from_dict(profile(optim)), lay.spec(link), 2, 2, scheme, 64, freeze=freeze
    )
    return arithmetic.time_to_target(STEPS[optim], freeze, warm, main)


def hand_crossover() -> float:
    """Where SGDM's 100 fp32 steps take as long as Birder's 150: bisection in log link rate."""
    lo, hi = 10.0, 1e5
    gap = lambda x: math.log(hand_time("sgdm", "fp32", x) / hand_time("birder", "hierarchical", x))  # noqa: E731
    assert gap(lo) > 0 > gap(hi)  # the premise: Birder faster on the slowest link, SGDM on the fastest
    for _ in range(60):
        mid = math.sqrt(lo * hi)
        lo, hi = (mid, hi) if gap(mid) > 0 else (lo, mid)
    return math.sqrt(lo * hi)


# ---------------------------------------------------------------------------------------------- the arithmetic
def test_time_to_target_prices_the_freeze_steps_at_the_warmup_step():
    assert arithmetic.time_to_target(100, 30, 0.2, 0.05) == pytest.approx(30 * 0.2 + 70 * 0.05)
    assert arithmetic.time_to_target(20, 30, 0.2, 0.05) == pytest.approx(20 * 0.2)  # reached inside the warmup
    assert arithmetic.time_to_target(100, 0, 0.2, 0.05) == pytest.approx(100 * 0.05)


def test_ranking_puts_methods_that_did_not_always_reach_after_the_others():
    times = {"a": 3.0, "b": 1.0, "c": 2.0}
    assert arithmetic.ranking(times) == ["b", "c", "a"]
    assert arithmetic.ranking(times, frozenset({"b"})) == ["c", "a", "b"]


def test_bands_and_winner_changes_on_two_crossing_lines():
    """t_a = 10 / x^0.5 and t_b = 1: equal at x = 100, a slower below and faster above."""
    links = [10.0, 50.0, 200.0, 1000.0]
    times = {"a": [10 / math.sqrt(x) for x in links], "b": [1.0] * 4}
    bands = arithmetic.ranking_bands(links, times)
    assert [(b["from"], b["to"], b["order"]) for b in bands] == [(10, 50, ["b", "a"]), (200, 1000, ["a", "b"])]
    [change] = arithmetic.winner_changes(links, times)
    assert change["below"] == "b" and change["above"] == "a" and change["link"] == pytest.approx(100.0)


# ---------------------------------------------------------------------------------------------- the advice
@pytest.fixture
def measured(tmp_path):
    return load_runs(runs(tmp_path / "runs"))


def test_the_ranking_flips_between_a_slow_and_a_fast_link(measured):
    slow, fast = advise.advise(layout(20.0), measured), advise.advise(layout(100_000.0), measured)
    assert order(slow)[0] == "birder" and order(fast)[0] == "sgdm"
    assert order(slow)[-1] == "sgdm"
    best = slow["ranked"][0]
    assert best["slower_than_best"] == 1.0 and all(r["slower_than_best"] > 1 for r in slow["ranked"][1:])
    assert best["steps"] == {**best["steps"], "value": 150.0, "source": "measured", "seeds": [0, 1], "reached": 2}
    assert best["time_to_target_s"]["source"] == "predicted"
    assert best["time_to_target_s"]["value"] == pytest.approx(hand_time("birder", "hierarchical", 20.0))


def test_the_crossover_lies_within_one_grid_step_of_the_hand_value(measured):
    advice = advise.advise(layout(1000.0), measured, optims=["sgdm", "birder"])
    [change] = advice["winner_changes"]
    assert change["below"] == "birder" and change["above"] == "sgdm"
    step = math.log(GRID[1] / GRID[0])
    assert abs(math.log(change["link"] / hand_crossover())) <= step
    first, last = advice["bands"][0], advice["bands"][-1]
    assert first["order"] == ["birder", "sgdm"] and last["order"] == ["sgdm", "birder"]
    assert first["from"] == GRID[0] and last["to"] == GRID[-1]


def test_onebit_adams_freeze_steps_are_priced_at_the_fp32_step(measured):
    """At 20 Mbit/s an fp32 step costs many 1-bit steps: the 30 warmup steps are most of the time."""
    [row] = [r for r in advise.advise(layout(20.0), measured)["ranked"] if r["optim"] == "onebit_adam"]
    warm, main = row["warmup_step_s"]["value"], row["step_s"]["value"]
    fp32 = arithmetic.step_times(Profile.from_dict(profile("onebit_adam")), layout(20.0).spec(20.0), 2, 2, "fp32", 64)
    assert row["freeze"] == FREEZE and warm == pytest.approx(fp32[1]) and warm > 5 * main
    assert row["time_to_target_s"]["value"] == pytest.approx(FREEZE * warm + (120 - FREEZE) * main)


def test_a_method_whose_seeds_did_not_all_reach_is_ranked_after_and_says_k_of_n(tmp_path):
    root = runs(tmp_path / "runs", extra=[record("birder", None, seed=2)])
    advice = advise.advise(layout(20.0), load_runs(root))
    assert order(advice)[-1] == "birder"
    [row] = [r for r in advice["ranked"] if r["optim"] == "birder"]
    assert (row["steps"]["reached"], row["steps"]["runs"]) == (2, 3) and row["ranked_after_reliable"]
    assert "2 of 3 reached" in format_advice(advice)


def test_runs_at_another_global_batch_are_used_only_where_none_match_and_said(tmp_path):
    other = [record("sgdm", 90, seed=s, batch=512) for s in (0, 1)]
    advice = advise.advise(layout(20.0), load_runs(runs(tmp_path / "runs", optims=("birder",), extra=other)))
    [sgdm] = [r for r in advice["ranked"] if r["optim"] == "sgdm"]
    assert sgdm["steps"]["value"] == 90 and not sgdm["steps"]["at_your_global_batch"]
    assert "global batch 512, not yours" in sgdm["steps_source"]


def test_missing_inputs_are_listed_with_the_command_that_makes_them(tmp_path):
    """AdamW has runs but no 1-node profile; SGDM (fp16) a profile but no run: neither is ranked or made up."""
    extra = [record("adamw", 80, seed=0), profile_run("sgdm_fp16")]
    advice = advise.advise(layout(20.0), load_runs(runs(tmp_path / "runs", extra=extra)))
    assert set(order(advice)) == {"sgdm", "birder", "onebit_adam"}
    missing = {(c["method"], c["reason"].split(" (")[0]): c["command"] for c in advice["cannot_rank"]}
    assert ("adamw", "no measured run reaching the target") not in missing
    assert missing["adamw", "no 1-node profile"] == (  # the query's model, batch and cluster, 60 steps on 1 node
        "birder-repro -m task=fashion_mnist cluster=ethernet_10g cluster.link_mbit=20 model.size=full "
        "model.width=512 model.num_classes=10 train.batch_size=64 "
        "optim=adamw,diloco,diloco_1bit,sgdm_bf16_2level,sgdm_powersgd,streaming_diloco "
        "nodes=1 gpus_per_node=2 train.steps=60 train.eval=false"
    )
    assert ("sgdm_fp16", "no 1-node profile") not in missing
    assert missing["sgdm_fp16", "no measured run reaching the target"] == (
        "birder-repro -m task=fashion_mnist cluster=ethernet_10g cluster.link_mbit=20 model.size=full "
        "model.width=512 model.num_classes=10 train.batch_size=64 "
        "optim=diloco,diloco_1bit,sgdm_bf16_2level,sgdm_fp16,sgdm_powersgd,streaming_diloco seed=0,1 nodes=2 "
        "gpus_per_node=2 train.eval=true "
        "train.eval_every=10 train.stop_at_target=true"
    )
    text = format_advice(advice)
    assert "cannot rank adamw: no 1-node profile" in text
    assert missing["sgdm_fp16", "no measured run reaching the target"] in text
    # its expected time: the 430 steps of the run, twice, at sgdm_fp16's step predicted from its profile
    [cmd] = [c for c in advice["commands"] if c["what"] == "steps to the target on your layout"]
    assert cmd["expected"].startswith("at most ") and "2 x 430 steps of 1 method" in cmd["expected"]
    assert (
        "unknown for sgdm_bf16_2level, sgdm_powersgd, diloco, diloco_1bit, streaming_diloco (no 1-node profile"
        in cmd["expected"]
    )


# ---------------------------------------------------------------------------------------------- the CLI
def cli_config(compose, root: Path, *more: str):
    return compose(
        [
            "mode=advise",
            "task=fashion_mnist",
            "nodes=2",
            "gpus_per_node=2",
            "cluster=ethernet_10g",
            "cluster.link_mbit=20",
            "model.width=512",  # the records' model
            f"advise.runs={root}",
            *more,
        ],
        hydra_config=True,
    )


def test_cli_advise_prints_the_table_and_writes_the_figure_and_advice_json(compose, tmp_path, capsys):
    from birder_repro.cli import run

    root = runs(tmp_path / "measured")
    assert run(cli_config(compose, root), tmp_path / "advice") == 0
    out = capsys.readouterr().out
    advice = json.loads((tmp_path / "advice" / "advice.json").read_text())
    assert order(advice)[0] == "birder" and advice["layout"]["link_mbit"] == 20.0
    assert (tmp_path / "advice" / "advise_fashion_mnist.png").stat().st_size > 10_000
    assert not (tmp_path / "advice" / "record.json").exists()  # launches nothing, and is no run
    assert "(measured, 2 of 2 reached, seeds 0,1)" in out and "s (predicted)" in out
    assert "the winner changes at about" in out
    assert np.isfinite(advice["ranked"][0]["time_to_target_s"]["value"])


def test_cli_advise_exits_0_with_the_commands_when_nothing_can_be_ranked(compose, tmp_path, capsys):
    """ "Measure these first" is advice: exit 0 (non-zero is for bad input)."""
    from birder_repro.cli import run

    root = runs(tmp_path / "measured", optims=(), profiles=("sgdm",))  # a profile, no measured steps
    code = run(cli_config(compose, root, "advise.optims=[sgdm,birder]"), tmp_path / "advice")
    assert code == 0
    out = capsys.readouterr().out
    assert "cannot rank sgdm: no measured run reaching the target" in out
    none_ran = "no measured run reaching the target (none ran; the papers give no steps for it)"
    assert f"cannot rank birder: {none_ran}; no 1-node profile" in out
    assert "optim=birder,sgdm seed=0,1 nodes=2 gpus_per_node=2" in out
    assert "optim=birder nodes=1 gpus_per_node=2 train.steps=60 train.eval=false" in out


def test_cli_advise_exits_2_on_bad_input(compose, tmp_path, capsys):
    from birder_repro.cli import run

    cfg = cli_config(compose, tmp_path, "predict.profile=" + str(tmp_path / "missing.json"))
    assert run(cfg, tmp_path / "advice") == 2
    assert "advise:" in capsys.readouterr().err
    assert run(cli_config(compose, tmp_path, "advise.optims=[sgdm,birdr]"), tmp_path / "advice") == 2
    assert "advise.optims: no optimizer birdr" in capsys.readouterr().err


def test_cli_advise_honours_a_probed_cluster_spec_and_the_papers_profiles(compose, tmp_path, capsys):
    """predict.cluster_spec's link (mode=probe's YAML) replaces the cluster config's, as in mode=predict; and
    predict.profile=paper prices every method of a paper task with the paper's 1-node profile."""
    from birder_repro.cli import run

    spec = yaml.safe_load((CLUSTER_DIR / "ethernet_10g.yaml").read_text())
    spec["link_mbit"] = 123.0
    (tmp_path / "cluster_spec.yaml").write_text(yaml.safe_dump(spec))
    recs = [
        record(o, n, seed=s, task="resnet50", batch=512) for o, n in (("sgdm", 100), ("birder", 150)) for s in (0, 1)
    ]
    for rec in recs:  # scored against the task's target (a run against another one is not counted)
        rec["time_to_target"]["target"] = 75.0
    root = write_records(tmp_path / "measured", recs, lambda i, rec: f"{i:02d}_{rec['optim']}")
    cfg = compose(
        [
            "mode=advise",
            "task=resnet50",
            "nodes=2",
            "gpus_per_node=8",
            "cluster=ethernet_10g",
            f"predict.cluster_spec={tmp_path / 'cluster_spec.yaml'}",
            "predict.profile=paper",
            f"advise.runs={root}",
        ],
        hydra_config=True,
    )
    assert run(cfg, tmp_path / "advice") == 0
    advice = json.loads((tmp_path / "advice" / "advice.json").read_text())
    assert advice["layout"]["link_mbit"] == 123.0
    sources = {r["optim"]: r["steps"]["source"] for r in advice["ranked"]}
    assert sources == {"sgdm": "measured", "birder": "measured", "onebit_adam": "from the paper"}
    assert all(r["profile"]["name"].startswith("paper") for r in advice["ranked"]), advice["ranked"]
    # the paper's profile prices every scheme but those it has no cost for (16-bit casts, PowerSGD's compression)
    unpriced = {c["method"] for c in advice["cannot_rank"] if c["reason"] == "no 1-node profile"}
    assert unpriced == {"sgdm_fp16", "sgdm_bf16_2level", "sgdm_powersgd"}


def test_runs_on_the_users_layout_are_preferred_to_the_same_global_batch_elsewhere(tmp_path):
    """4 x 1 runs have the 2 x 2 user's global batch (256) but other workers: used only where no 2 x 2 run is."""

    def four_by_one(optim: str, step: int, seed: int) -> dict:
        rec = record(optim, step, seed=seed, nodes=4, batch=256)
        rec["cluster"]["gpus_per_node"], rec["world_size"] = 1, 4
        return rec

    extra = [four_by_one("sgdm", 90, s) for s in (5, 6)] + [four_by_one("adamw", 95, 0), profile_run("adamw")]
    advice = advise.advise(layout(20.0), load_runs(runs(tmp_path / "runs", extra=extra)))
    [sgdm] = [r for r in advice["ranked"] if r["optim"] == "sgdm"]
    [adamw] = [r for r in advice["ranked"] if r["optim"] == "adamw"]
    assert sgdm["steps"]["value"] == 100 and sgdm["steps"]["on_your_layout"]  # the 2 x 2 runs only, not 95
    assert sgdm["steps"]["seeds"] == [0, 1]
    assert adamw["steps"]["value"] == 95 and not adamw["steps"]["on_your_layout"]
    assert "your global batch on another layout" in adamw["steps_source"]


def test_with_nothing_of_the_task_measured_it_names_the_field_and_the_commands(tmp_path):
    """A user's first call, before any run: the field is listed as not rankable, with the runs to make."""
    advice = advise.advise(layout(20.0), load_runs(runs(tmp_path / "runs", optims=(), profiles=())))
    assert not advice["ranked"]
    named = {c["method"] for c in advice["cannot_rank"]}
    assert set(advise.FIELD) <= named
    assert any("seed=0,1 nodes=2 gpus_per_node=2" in c["command"] for c in advice["cannot_rank"])


def test_the_figure_draws_each_method_in_its_style_of_every_figure(tmp_path, monkeypatch):
    """Eleven methods and matplotlib's ten colours: no two lines share colour and style, and each method has its
    colour and line style of the report's figures (birder_repro.styles, as birder_repro.report.figstyle)."""
    import matplotlib.colors
    import matplotlib.pyplot as plt

    from birder_repro.report.figstyle import optim_style

    kept = []
    monkeypatch.setattr(plt, "close", lambda fig=None: kept.append(fig))
    methods = list(dict.fromkeys([*advise.FIELD, "diloco_1bit", "streaming_diloco", "onebit_lamb"]))
    assert len(methods) >= 11
    ranked = [{"method": m, "ranked_after_reliable": False, "steps": {"reached": 2, "runs": 2}} for m in methods]
    advice = {
        "ranked": ranked,
        "links": [10.0, 100.0],
        "curves": {m: [10.0 + i, 5.0 + i] for i, m in enumerate(methods)},
        "layout": {"link_mbit": 50.0, "nodes": 2, "gpus_per_node": 2},
        "task": "fashion_mnist",
        "target": "top1 >= 87",
    }
    advice_figure(advice, tmp_path / "advice.png")
    lines = [ln for ln in kept[0].axes[0].get_lines() if ln.get_label() in methods]
    assert len({(ln.get_color(), ln.get_linestyle()) for ln in lines}) == len(methods)
    for line in lines:
        style = optim_style(line.get_label())
        assert matplotlib.colors.same_color(line.get_color(), style["color"]), line.get_label()
        assert line.get_linestyle() == plt.Line2D([], [], linestyle=style["linestyle"]).get_linestyle()


def test_of_several_profiles_the_model_takes_the_median_one_made_by_the_newest_ones_code():
    """One 60-step profile can land 15-24 % off the next three of the same command (DiLoCo's did): of a setting's
    1-node runs, the one with the median step, among those made by the newest one's code (profiles made before a
    fix are made again, not pooled); of an even count the newer middle one."""
    from birder_repro.perf.advice_profiles import median_profile_record

    def rec(ms: float, started: str, sha: str = "b") -> dict:
        return {"step_time_s": {"total": ms / 1e3}, "started": started, "git_sha": sha, "id": ms}

    three = [rec(18.5, "1"), rec(24.3, "3"), rec(21.5, "2")]
    assert median_profile_record(three)["id"] == 21.5
    assert median_profile_record([rec(18.5, "1"), rec(24.3, "2")])["id"] == 24.3  # two: the newer
    assert median_profile_record([rec(24.3, "1"), rec(18.5, "2")])["id"] == 18.5
    old_code = [rec(10.0, "0", "a"), rec(11.0, "0", "a"), rec(12.0, "0", "a")]
    assert median_profile_record([*old_code, rec(30.0, "5")])["id"] == 30.0  # the newest code's only
    assert median_profile_record([*old_code, *three])["id"] == 21.5
    with pytest.raises(ValueError, match="no 1-node run"):
        median_profile_record([])


# ---------------------------------------------------------------------------------------------- a new user
def cli_advice(compose, tmp_path, overrides, capsys, run_dir=None):
    """``birder-repro mode=advise <overrides>`` with an empty runs folder: (exit code, printed text, advice)."""
    from birder_repro.cli import run

    out_dir = run_dir or tmp_path / "advice"
    code = run(compose(["mode=advise", f"advise.runs={tmp_path / 'empty'}", *overrides], hydra_config=True), out_dir)
    advice = json.loads((out_dir / "advice.json").read_text()) if (out_dir / "advice.json").exists() else None
    return code, capsys.readouterr().out, advice


def test_the_papers_user_gets_an_answer_from_the_paper_with_no_runs(compose, tmp_path, capsys):
    """ResNet-50 on 16 x 8 over the paper's Ethernet, nothing run: SGDM, 1-bit Adam and Birder ranked on the
    paper's steps (Table 1) and 1-node profile, each marked so; PowerSGD and DiLoCo named, to measure."""
    code, out, advice = cli_advice(
        compose, tmp_path, ["task=resnet50", "nodes=16", "gpus_per_node=8", "cluster=ethernet_10g"], capsys
    )
    assert code == 0
    ranked = {r["optim"]: r for r in advice["ranked"]}
    assert set(ranked) == {"sgdm", "onebit_adam", "birder"}
    for r in ranked.values():
        assert r["steps"]["source"] == "from the paper" and r["profile"]["source"] == "from the paper"
        assert r["steps"]["table"] == "Birder paper, Table 1 (32 GPUs x 128)"  # global batch 4096, as the user's
        assert r["time_to_target_s"]["source"] == "predicted"
    assert ranked["onebit_adam"]["freeze"] == math.ceil(0.15 * ranked["onebit_adam"]["steps"]["value"])
    assert "to top1 >= 75 on 16 nodes x 8 GPUs" in out
    assert "cannot rank sgdm_powersgd: no measured run reaching the target" in out
    assert "cannot rank diloco: no measured run reaching the target" in out
    assert "steps to the target on your layout" in out and "expected time: at most" in out
    assert "from the paper" in out and "(predicted)" in out


@pytest.mark.parametrize("task", ["bert_pretrain", "bert_squad"])
def test_the_bert_tasks_answer_with_no_runs_and_exit_0(compose, tmp_path, capsys, task):
    """BERT-Base pre-training: the papers give no steps to a masked-LM accuracy (said), so every method is to
    measure; SQuAD: Table 2 ranks BertAdam, 1-bit Adam and Birder."""
    code, out, advice = cli_advice(
        compose, tmp_path, [f"task={task}", "nodes=16", "gpus_per_node=8", "cluster=ethernet_10g"], capsys
    )
    assert code == 0
    named = {m["optim"] for m in advice["methods"]}
    assert {"bertadam", "sgdm", "onebit_adam", "birder", "sgdm_powersgd", "diloco"} <= named
    if task == "bert_pretrain":
        assert not advice["ranked"] and "no steps to a masked-LM accuracy" in out
        assert all(m["steps"] == "to measure" for m in advice["methods"])
    else:
        assert {r["optim"] for r in advice["ranked"]} == {"bertadam", "onebit_adam", "birder"}
        assert all(r["steps"]["reached"] for r in advice["ranked"])  # F1 >= 87 in every row of Table 2


def test_the_run_folder_is_named_for_the_advice(compose, tmp_path, capsys, runs_dir):
    from birder_repro.cli import run

    cfg = compose(["mode=advise", "task=resnet50", "nodes=16", "gpus_per_node=8", "cluster=ethernet_10g"])
    assert run(cfg) == 0
    [folder] = [p.parent for p in runs_dir.rglob("advice.json")]
    assert folder.name.endswith("_advise-resnet50-16x8"), folder


def measuring_command(advice: dict, what: str = "steps to the target on your layout") -> str:
    [command] = [c["command"] for c in advice["commands"] if c["what"] == what]
    return command


def composed(compose, command: str):
    """The config the printed sweep's first cell would run with (each comma list's first value)."""
    words = command.split()
    assert words[:2] == ["birder-repro", "-m"]
    return compose([w.split(",")[0] if "=" in w and "[" not in w else w for w in words[2:]])


def test_the_command_to_measure_carries_the_querys_experiment_link_width_and_cadence(compose, tmp_path, capsys):
    """A new user's query of the time-to-accuracy experiment at 300 Mbit/s: the command that measures steps to
    the target runs that experiment's width 512 MLP at 300 Mbit/s, evaluated every 10 steps as it says (not the
    2048-wide default at 200 with eval_every 0), and says how long it takes."""
    query = ["experiment=fashion_time_to_accuracy", "cluster.link_mbit=300"]
    code, out, advice = cli_advice(compose, tmp_path, query, capsys)
    assert code == 0
    command = measuring_command(advice)
    assert "experiment=fashion_time_to_accuracy" in command and "cluster.link_mbit=300" in command
    cfg = composed(compose, command)
    assert cfg.model.width == 512 and cfg.cluster.link_mbit == 300 and cfg.train.eval_every == 10
    assert (cfg.nodes, cfg.gpus_per_node, cfg.cluster.name) == (2, 2, "emulated") and cfg.train.stop_at_target
    [entry] = [c for c in advice["commands"] if c["command"] == command]
    assert entry["expected"]  # said, known or not
    assert f"{command}\n    expected time: {entry['expected']}" in out
    # the header names the experiment's target and model, though nothing was measured
    assert "advice: fashion_mnist (model num_classes=10, size=full, width=512) to top1 >= 87 on 2 nodes" in out


def test_a_query_evaluated_only_at_the_end_gets_a_command_that_evaluates_along_the_way(compose, tmp_path, capsys):
    """eval_every 0 would make the steps to the target the run's length: the command evaluates about 20 times."""
    _, _, advice = cli_advice(compose, tmp_path, ["task=fashion_mnist", "nodes=2", "gpus_per_node=2"], capsys)
    cfg = composed(compose, measuring_command(advice))
    planned = 3 * math.ceil(55_000 / 256)  # 3 epochs of the 55,000 training images at 2 x 2 x 64
    assert cfg.train.eval_every == math.ceil(planned / 20) and cfg.train.eval


def test_the_proxy_command_keeps_the_global_batch_on_two_nodes(compose, tmp_path, capsys):
    from birder_repro.config.settings import global_batch
    from birder_repro.perf.advice_commands import STEPS_PROXY

    _, _, advice = cli_advice(
        compose, tmp_path, ["task=resnet50", "nodes=16", "gpus_per_node=8", "cluster=ethernet_10g"], capsys
    )
    proxy = composed(compose, measuring_command(advice, STEPS_PROXY))
    assert proxy.nodes == 2 and proxy.train.accumulate == 8 and global_batch(proxy) == 16 * 8 * 32


def test_a_profile_of_another_width_is_not_this_widths(tmp_path):
    """A 1-node SGDM profile of the 2048-wide MLP must not silence "no 1-node profile" for a width 512 query."""
    wide = profile_run("sgdm")
    wide["config"]["model"] = {"size": "full", "width": 2048}
    advice = advise.advise(layout(20.0), load_runs(runs(tmp_path / "runs", optims=(), profiles=(), extra=[wide])))
    reasons = {(c["method"], c["reason"]) for c in advice["cannot_rank"]}
    assert ("sgdm", "no 1-node profile") in reasons
    none_ran = "no measured run reaching the target (none ran; the papers give no steps for it)"
    assert f"cannot rank sgdm: {none_ran}; no 1-node profile" in format_advice(advice)


def test_runs_of_another_width_or_target_are_not_counted_and_said(tmp_path):
    wide = [record("sgdm", 40, seed=s) for s in (0, 1)]
    for rec in wide:
        rec["config"]["model"] = {"size": "full", "width": 2048}
    other_target = record("birder", 50)
    other_target["time_to_target"]["target"] = 80.0
    advice = advise.advise(layout(20.0), load_runs(runs(tmp_path / "runs", extra=[*wide, other_target])))
    [sgdm] = [r for r in advice["ranked"] if r["optim"] == "sgdm"]
    [birder] = [r for r in advice["ranked"] if r["optim"] == "birder"]
    assert sgdm["steps"]["value"] == 100 and birder["steps"]["value"] == 150
    assert "2 runs of fashion_mnist of another model than yours are not counted" in advice["notes"]
    assert "1 runs of fashion_mnist scored against another target than yours are not counted" in advice["notes"]


def test_every_method_stays_in_the_answer_with_what_it_lacks(tmp_path):
    """Two methods measured: the rest of the field is still named, each with what it lacks."""
    advice = advise.advise(layout(20.0), load_runs(runs(tmp_path / "runs", optims=("sgdm", "birder"))))
    rows = {m["optim"]: m for m in advice["methods"]}
    assert set(advise.FIELD) <= set(rows)
    assert rows["sgdm"]["ranked"] and rows["birder"]["ranked"]
    assert rows["onebit_adam"]["lacks"] == [
        "no measured run reaching the target (none ran; the papers give no steps for it)"
    ]
    assert rows["onebit_adam"]["profile"] == "yours"  # profiled, not run
    assert rows["diloco"]["lacks"] == [
        "no measured run reaching the target (none ran; the papers give no steps for it)",
        "no 1-node profile",
    ]
    text = format_advice(advice)
    assert all(f"cannot rank {name}:" in text for name in set(advise.FIELD) - {"sgdm", "birder"})


def test_with_one_method_ranked_no_claim_about_every_link_rate(tmp_path):
    advice = advise.advise(layout(20.0), load_runs(runs(tmp_path / "runs", optims=("birder",))))
    assert order(advice) == ["birder"]
    text = format_advice(advice)
    assert "same at every link rate" not in text and "one method ranked: no comparison over link rates" in text


def test_the_papers_steps_by_hand():
    """Table 1 at global batch 2048 (64 GPUs x 32): every method ended at or beyond 75 % in its 100 epochs; at 4096
    (32 GPUs x 128) none did. Table 2 has no global batch of 384: the nearest, 192 (64 GPUs x 3)."""
    from birder_repro.perf.paper_steps import paper_steps

    top1 = ("top1", 75.0, "higher")
    p = paper_steps("resnet50", "onebit_adam", 2048, 32, top1)
    assert p.steps == math.ceil(100 * 1_281_167 / 2048) and p.freeze == math.ceil(0.15 * p.steps)
    assert p.reached and p.value == 75.54 and p.row.table == "Birder paper, Table 1 (64 GPUs x 32)"
    assert not paper_steps("resnet50", "birder", 4096, 32, top1).reached  # 74.82
    assert paper_steps("resnet50", "birder", 4096, 32, ("top1", 74.0, "higher")).reached
    squad = paper_steps("bert_squad", "bertadam", 384, 3, ("f1", 87.0, "higher"))
    assert squad.row.gpus == 64 and squad.value == 88.13 and squad.steps == math.ceil(2 * 88_641 / 384)
    assert paper_steps("bert_squad", "bertadam", 384, 3, ("exact_match", 81.0, "higher")).reached is False
    assert paper_steps("resnet50", "diloco", 2048, 32, top1) is None  # the paper does not cover it
    assert paper_steps("resnet50", "sgdm", 2048, 32, ("loss", 1.0, "lower")) is None  # nor that metric


def test_the_local_step_variants_are_in_an_empty_runs_advice_with_what_they_lack(tmp_path):
    """diloco_1bit and streaming_diloco are in the advisor's field: named, with what they lack, before any run."""
    advice = advise.advise(layout(20.0), load_runs(runs(tmp_path / "runs", optims=(), profiles=())))
    lacking = {c["method"]: c for c in advice["cannot_rank"]}
    for name in ("diloco_1bit", "streaming_diloco"):
        assert name in lacking
    rows = {m["optim"]: m for m in advice["methods"]}
    assert "no 1-node profile" in rows["streaming_diloco"]["lacks"] and rows["diloco_1bit"]["lacks"]


def test_a_quantized_stream_is_priced_at_its_width(compose):
    """Streaming DiLoCo's optim.quantize reaches the scheme the model prices: int4 below fp32, everywhere the
    scheme is taken from a config (the advisor's inputs, the profile's scheme, mode=predict)."""
    from test_perf import _profile, _spec

    from birder_repro.perf.advice_methods import method_inputs
    from birder_repro.perf.model import predict_step
    from birder_repro.train.profile import _scheme

    schemes = {
        q: method_inputs("streaming_diloco", {"quantize": q, "local_steps": 10}, 100)["scheme"]
        for q in ("none", "int4")
    }
    assert schemes == {"none": "diloco_streaming", "int4": "diloco_streaming_int4"}
    prof, spec = _profile(parameter_count=10_000_000), _spec(inter_mbit=100.0)
    step = {q: predict_step(prof, spec, 2, 2, s, local_steps=10).total_s for q, s in schemes.items()}
    assert step["int4"] < step["none"]
    cfg = compose(["task=fashion_mnist", "optim=streaming_diloco", "optim.quantize=int4"])
    assert _scheme(cfg) == "diloco_streaming_int4"


def test_mode_predict_prices_a_quantized_stream_at_its_width():
    import yaml

    from birder_repro.perf.cluster import CLUSTER_DIR
    from birder_repro.perf.predict import predict_record

    cfg = {
        "task": {"name": "resnet50"},
        "nodes": 4,
        "gpus_per_node": 8,
        "cluster": yaml.safe_load((CLUSTER_DIR / "ethernet_10g.yaml").read_text()),
        "train": {"batch_size": 32, "steps": None},
        "predict": {"profile": "paper"},
    }
    optim = {"name": "streaming_diloco", "local_steps": 10, "fragments": 2}
    none = predict_record({**cfg, "optim": {**optim, "quantize": "none"}})
    int4 = predict_record({**cfg, "optim": {**optim, "quantize": "int4"}})
    assert int4["inter_node_bytes_per_step"] < none["inter_node_bytes_per_step"]


def test_a_run_sized_to_a_time_budget_gives_no_steps_to_the_target():
    """A budget run (``tuning.budget_s``) is evaluated once, at the end of a schedule sized to the budget: its
    steps are its length, not the steps to the target (seen: paper_scale listed 'birder [steps=548]' beside the
    field's Birder)."""
    budget = record("birder", 548, seed=1)
    budget["config"]["tuning"] = {"budget_s": 28.5}
    runs = [(Path(f"r{i}"), rec) for i, rec in enumerate([record("sgdm", 100), record("birder", 150), budget])]
    found = measured_steps(runs, "fashion_mnist", 256, (2, 2))
    birder = [s for s in found if s.optim == "birder"]
    assert len(birder) == 1 and birder[0].steps == 150

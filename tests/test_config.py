"""The config tree composes in every combination, rejects typos by name, and resolves to the right layout."""

from __future__ import annotations

import re

import pytest
from conftest import CONF_DIR, compose_config
from hydra.errors import ConfigCompositionException
from omegaconf import OmegaConf

from birder_repro.config import settings as layout
from birder_repro.train import checks  # noqa: F401 - validate runs the higher layers' section checks too

# Groups whose options are chosen on the command line (recipe/ is chosen by the task x optim pair; tuning/ holds
# the protocols report.protocol reads, no group a run composes).
GROUPS = sorted(p.name for p in CONF_DIR.iterdir() if p.is_dir() and p.name not in ("recipe", "tuning"))
OPTIONS = [(group, path.stem) for group in GROUPS for path in sorted((CONF_DIR / group).glob("*.yaml"))]
RECIPES = sorted((p.parent.name, p.stem) for p in (CONF_DIR / "recipe").glob("*/*.yaml"))
TASKS = sorted(p.stem for p in (CONF_DIR / "task").glob("*.yaml"))
OPTIMS = sorted(p.stem for p in (CONF_DIR / "optim").glob("*.yaml"))


def leaf_keys(node, prefix=""):
    """Dotted paths of every value in the config (lists count as values)."""
    for key, value in node.items():
        path = f"{prefix}{key}"
        if OmegaConf.is_dict(value):
            yield from leaf_keys(value, path + ".")
        else:
            yield path


DEFAULT_KEYS = sorted(leaf_keys(compose_config()))


def test_the_tree_has_what_the_design_names():
    assert {"task", "optim", "cluster", "launcher", "logger", "experiment"} <= set(GROUPS)
    assert RECIPES, "no recipes found under conf/recipe/<task>/<optim>.yaml"


@pytest.mark.parametrize("group,option", OPTIONS, ids=[f"{g}={o}" for g, o in OPTIONS])
def test_every_option_composes_with_the_defaults_and_validates(compose, group, option):
    cfg = compose([f"{group}={option}"])
    assert OmegaConf.is_struct(cfg)
    layout.validate(cfg)
    if group in ("task", "optim", "cluster", "launcher", "logger"):
        selected = cfg[group].name
        assert selected == option, f"conf/{group}/{option}.yaml sets {group}.name={selected!r}"


@pytest.mark.parametrize("task", TASKS)
@pytest.mark.parametrize("optim", OPTIMS)
def test_every_task_optimizer_pair_composes(compose, task, optim):
    cfg = compose([f"task={task}", f"optim={optim}"])
    layout.validate(cfg)
    assert (cfg.task.name, cfg.optim.name) == (task, optim)


@pytest.mark.parametrize("task,optim", RECIPES, ids=[f"{t}-{o}" for t, o in RECIPES])
def test_each_recipe_is_applied_to_its_pair(compose, task, optim):
    cfg = compose([f"task={task}", f"optim={optim}"])
    recipe = OmegaConf.load(CONF_DIR / "recipe" / task / f"{optim}.yaml")
    for key in leaf_keys(recipe):
        assert OmegaConf.select(cfg, key) == OmegaConf.select(recipe, key), f"{key} of recipe {task}/{optim}"


def test_task_settings_win_over_the_top_level_defaults(compose):
    """conf/task/*.yaml sets the paper's epochs, batch and schedule; config.yaml's generic values must not
    replace them (its ``_self_`` has to come before the groups in the defaults list)."""
    lost = []
    for task in TASKS:
        cfg = compose([f"task={task}"])
        own = OmegaConf.load(CONF_DIR / "task" / f"{task}.yaml")
        for key in leaf_keys(own.get("train", {}), "train."):
            got, want = OmegaConf.select(cfg, key), OmegaConf.select(own, key)
            if got != want:
                lost.append(f"task={task}: {key} is {got!r}, conf/task/{task}.yaml says {want!r}")
    assert not lost, "\n".join(lost)


@pytest.mark.parametrize("optim", ["sgdm", "onebit_adam", "birder"])
def test_quickstart_experiment_composes(compose, optim):
    """make run's sweep: real data that ships with scikit-learn (no download), curves for the figures."""
    cfg = compose(["experiment=quickstart", f"optim={optim}"])
    layout.validate(cfg)
    assert (cfg.task.name, cfg.optim.name, cfg.nodes, cfg.gpus_per_node) == ("digits", optim, 2, 1)
    assert cfg.data.source == "real" and cfg.train.eval_every > 0


def test_smoke_experiment_composes(compose):
    cfg = compose(["experiment=smoke"])
    layout.validate(cfg)
    assert (cfg.task.name, cfg.optim.name, cfg.nodes, cfg.gpus_per_node) == ("resnet20", "birder", 2, 1)
    assert cfg.data.source == "synthetic"


@pytest.mark.parametrize("key", DEFAULT_KEYS)
def test_a_typo_in_any_key_is_an_error_naming_it(key):
    typo = key + "x"
    with pytest.raises(ConfigCompositionException, match=typo.replace(".", r"\.")):
        compose_config([f"{typo}=1"])


def test_a_typo_in_a_group_option_lists_the_options():
    with pytest.raises(ConfigCompositionException, match="birdr") as err:
        compose_config(["optim=birdr"])
    assert "sgdm" in str(err.value.__cause__ or err.value) or "sgdm" in str(err.value)


# ------------------------------------------------------------------------------------ layout resolution
def test_gpus_per_node_auto_is_the_gpus_present_or_one():
    assert layout.resolve_gpus_per_node("auto", gpu_count=0) == 1
    assert layout.resolve_gpus_per_node("auto", gpu_count=8) == 8
    assert layout.resolve_gpus_per_node(4, gpu_count=8) == 4
    for bad in (0, -1, "two", True, 1.5):
        with pytest.raises(layout.ConfigError, match="gpus_per_node"):
            layout.resolve_gpus_per_node(bad)


def test_world_size_global_batch_and_scaled_lr(compose):
    # Birder paper, section 5.1: SGDM lr 0.1 x batch/256; 8 nodes x 8 GPUs x 32 per GPU = 2048.
    cfg = compose(["task=resnet50", "optim=sgdm", "nodes=8", "gpus_per_node=8", "train.batch_size=32"])
    assert layout.world_size(cfg) == 64
    assert layout.global_batch(cfg) == 2048
    assert layout.effective_lr(cfg) == pytest.approx(0.1 * 2048 / 256)


def test_lr_is_as_given_without_batch_scaling(compose):
    cfg = compose(["task=resnet20", "optim=birder", "nodes=4", "gpus_per_node=2"])
    assert cfg.optim.lr_batch_scaling is None
    assert layout.effective_lr(cfg) == cfg.optim.lr == 0.005  # appendix B.1


def test_device_and_backend(compose):
    cfg = compose([])
    # auto: the CPU where no GPU is visible, the GPUs where every process has one, and never a silent fallback
    assert layout.resolve_device(cfg, local_processes=4, gpu_count=0) == "cpu"
    assert layout.resolve_device(cfg, local_processes=8, gpu_count=8) == "cuda"
    with pytest.raises(
        layout.ConfigError,
        match=r"device=auto needs a GPU for each of the 4 processes.*2 are "
        r"visible.*device=cpu",
    ):
        layout.resolve_device(cfg, local_processes=4, gpu_count=2)
    assert layout.resolve_backend(cfg, "cuda") == "nccl"
    assert layout.resolve_backend(cfg, "cpu") == "gloo"
    with pytest.raises(layout.ConfigError, match="device=cuda"):
        layout.resolve_device(compose(["device=cuda"]), local_processes=4, gpu_count=2)
    assert layout.resolve_device(compose(["device=cpu"]), local_processes=1, gpu_count=8) == "cpu"
    with pytest.raises(layout.ConfigError, match="cluster.backend=nccl"):
        layout.resolve_backend(compose(["cluster.backend=nccl"]), "cpu")


@pytest.mark.parametrize(
    "override,named",
    [
        ("nodes=0", "nodes"),
        ("train.batch_size=0", "train.batch_size"),
        ("train.steps=0", "train.steps"),
        ("optim.comm.scheme=ring", "optim.comm.scheme"),
        ("data.source=fake", "data.source"),
        ("cluster.backend=mpi", "cluster.backend"),
        ("gpus_per_node=0", "gpus_per_node"),
        ("optim.lr=0", "optim.lr"),
        ("optim.lr_batch_scaling=-256", "optim.lr_batch_scaling"),
        ("launcher.rdzv_backend=etcd", "rdzv_backend"),
    ],
)
def test_invalid_values_are_errors_naming_the_setting(compose, override, named):
    with pytest.raises(layout.ConfigError, match=named.replace(".", r"\.")):
        layout.validate(compose([override]))


def test_resolve_gives_what_workers_read(compose):
    cfg = compose(
        ["task=resnet50", "optim=birder", "nodes=2", "gpus_per_node=4", "train.batch_size=32"], hydra_config=True
    )
    out = layout.resolve(cfg, gpu_count=0)
    assert "hydra" not in out and OmegaConf.is_struct(out)
    assert out.gpus_per_node == 4 and isinstance(out.gpus_per_node, int)
    assert out.optim.effective_lr == pytest.approx(0.001 * 256 / 256)
    assert out.optim.seed == out.seed  # interpolations are resolved, not kept as ${...}
    assert "${" not in OmegaConf.to_yaml(out)
    assert layout.resolve(compose(["gpus_per_node=auto"]), gpu_count=0).gpus_per_node == 1


@pytest.mark.parametrize("task", TASKS)
def test_the_readme_overrides_work_for_every_task(task):
    """train.steps, train.batch_size, data.source, data.root and model.size work as written everywhere."""
    cfg = compose_config(
        [
            f"task={task}",
            "train.steps=3",
            "train.batch_size=2",
            "data.source=synthetic",
            "data.root=/nowhere",
            "model.size=tiny",
        ]
    )
    assert (cfg.train.steps, cfg.train.batch_size, cfg.data.source, cfg.data.root, cfg.model.size) == (
        3,
        2,
        "synthetic",
        "/nowhere",
        "tiny",
    )


# ------------------------------------------------------------------------- a value of the wrong type
@pytest.mark.parametrize(
    "override,message",
    [
        ("optim.lr=abc", "optim.lr='abc': use a number"),
        ("optim.beta=abc", "optim.beta='abc': use a number"),
        ("train.eval=yes", "train.eval='yes': use true or false"),
        ("train.schedule.milestones=0.5", "train.schedule.milestones=0.5: use a list"),
        ("train=3", "train=3: it is a section"),
        ("data.root=[a,b]", "data.root=['a', 'b']: use a single value"),
    ],
)
def test_a_value_of_the_wrong_type_is_one_error_naming_the_key(override, message):
    from birder_repro.config.compose import reference_configs

    cfg = compose_config([override], hydra_config=True)
    with pytest.raises(layout.ConfigError) as err:
        layout.validate(cfg, reference_configs(cfg))
    assert str(err.value).startswith(message)


@pytest.mark.parametrize(
    "overrides,wrong",
    [
        (["optim.lr=1"], "optim.lr=abc"),  # an int where the default is a float
        (["train.grad_clip=null", "task=vit"], "train.grad_clip=abc"),  # null: "not set", anywhere
        (["gpus_per_node=auto", "experiment=table1"], "gpus_per_node=[1,2]"),  # the experiment's 8 replaces auto
        (["data.root=123"], "data.root=[a,b]"),  # text takes any single value
        (["task=lstm_ptb", "data.bptt=35"], "data.bptt=abc"),  # a key the task group adds
    ],
)
def test_values_of_the_right_kind_pass_the_type_check(overrides, wrong):
    """Each passes; the same config with one value of the wrong kind beside it is refused, naming that key, so
    the pass is the check's verdict and not a check that looked at nothing."""
    from birder_repro.config.compose import reference_configs

    cfg = compose_config(overrides, hydra_config=True)
    assert layout.validate(cfg, reference_configs(cfg)) is None
    bad = compose_config([*overrides, wrong], hydra_config=True)
    with pytest.raises(layout.ConfigError, match=re.escape(wrong.split("=")[0])):
        layout.validate(bad, reference_configs(bad))


def test_the_type_check_needs_no_hydra_node():
    """A config composed elsewhere (no hydra node) is checked against its group options' names."""
    from birder_repro.config.compose import reference_configs

    cfg = compose_config(["task=lstm_ptb", "data.bptt=long"])
    with pytest.raises(layout.ConfigError, match=r"data\.bptt='long': use a number"):
        layout.validate(cfg, reference_configs(cfg))


# ------------------------------------------------------------------------------- data loader processes
@pytest.mark.parametrize("cores,local,workers", [(2, 2, 0), (2, 1, 1), (1, 1, 0), (16, 2, 7), (96, 1, 8), (8, 16, 0)])
def test_auto_data_workers_share_out_the_cores_of_the_machine(cores, local, workers):
    assert layout.auto_data_workers(cores, local) == workers


def test_data_workers_auto_reads_this_machines_processes_and_a_number_wins(compose, monkeypatch):
    monkeypatch.setattr(layout, "cpu_count", lambda: 16)
    cfg = compose(["task=resnet50"])
    assert cfg.data.num_workers == "auto"
    assert layout.data_workers(cfg, env={"LOCAL_WORLD_SIZE": "4"}) == 3
    assert layout.data_workers(cfg, env={}) == 8
    assert layout.data_workers(compose(["task=resnet50", "data.num_workers=5"]), env={"LOCAL_WORLD_SIZE": "4"}) == 5


@pytest.mark.parametrize("value", ["-1", "many", "1.5"])
def test_data_workers_must_be_auto_or_a_whole_number(compose, value):
    with pytest.raises(layout.ConfigError, match=r"data\.num_workers="):
        layout.validate(compose(["task=resnet50", f"data.num_workers={value}"]))


# ------------------------------------------------------------------------------- a key no config declares
@pytest.mark.parametrize(
    "override,named,closest",
    [
        ("+train.stepz=3", "train.stepz", "train.steps"),
        ("+optim.betaz=[0.9,0.9]", "optim.betaz", "optim.betas"),
        ("+nodez=2", "nodez", "nodes"),
    ],
)
def test_an_added_key_no_config_declares_is_refused_with_the_closest_one(override, named, closest):
    from birder_repro.config.compose import reference_configs

    cfg = compose_config(["optim=adamw", override], hydra_config=True)
    with pytest.raises(layout.ConfigError) as err:
        layout.validate(cfg, reference_configs(cfg))
    assert str(err.value).startswith(f"{named}: no such setting; did you mean {closest}?")


@pytest.mark.parametrize(
    "overrides",
    [
        ["task=lstm_ptb"],
        ["experiment=table2"],
        ["task=vit", "optim=onebit_adam"],
        ["cluster=emulated", "launcher=slurm"],
        ["hydra.job.chdir=false"],
    ],
)
def test_the_keys_the_chosen_groups_add_are_known(overrides):
    from birder_repro.config.compose import reference_configs

    cfg = compose_config(overrides, hydra_config=True)
    reference = reference_configs(cfg)[0]
    layout.check_known_keys(cfg, reference)
    with pytest.raises(layout.ConfigError, match=r"^data\.rooot: no such setting; did you mean data\.root\?"):
        layout.check_known_keys(compose_config([*overrides, "+data.rooot=x"]), reference)


def test_another_optimizers_key_is_not_known():
    """optim=adamw has no ``beta`` (Birder's, the default optimizer's): the task-alone reference must not let it
    through."""
    from birder_repro.config.compose import reference_configs

    cfg = compose_config(["optim=adamw", "+optim.beta=0.9"], hydra_config=True)
    with pytest.raises(layout.ConfigError, match=r"^optim\.beta: no such setting; did you mean optim\.betas\?"):
        layout.validate(cfg, reference_configs(cfg))


def test_a_section_every_reference_leaves_empty_takes_any_key():
    layout.check_known_keys({"env": {"NCCL_DEBUG": "INFO"}}, {"env": {}})
    with pytest.raises(layout.ConfigError, match="env.NCCL_DEBUG"):
        layout.check_known_keys({"env": {"NCCL_DEBUG": "INFO"}}, {"env": {"OTHER": 1}})


@pytest.mark.parametrize("optim", ["birder", "onebit_adam"])
def test_fp16_with_nonfinite_raise_is_refused_before_its_first_routine_overflow(compose, optim):
    """GradScaler's scale overflows in the first steps by design (it starts at 65536 and backs off): with
    nonfinite=raise such a run died at step 0 with a FloatingPointError; refused in one line instead."""
    cfg = compose([f"optim={optim}", "train.precision=fp16", "optim.comm.nonfinite=raise"])
    with pytest.raises(
        layout.ConfigError, match=r"^optim\.comm\.nonfinite=raise with train\.precision=fp16: .* use nonfinite=skip$"
    ):
        layout.validate(cfg)
    layout.validate(compose([f"optim={optim}", "train.precision=fp16"]))  # skip, the default, is fine
    layout.validate(compose([f"optim={optim}", "train.precision=bf16", "optim.comm.nonfinite=raise"]))


# ---------------------------------------------------------------------------- what a new user tripped on
def test_a_setting_without_its_section_or_in_another_one_is_told_where_it_lives():
    known = ["nodes", "train", "train.steps", "train.resume", "optim", "optim.betas", "optim.lr", "data.root"]
    assert layout.no_such_setting("resume", known) == "resume: no such setting; did you mean train.resume?"
    assert layout.no_such_setting("optim.steps", known) == "optim.steps: no such setting; did you mean train.steps?"
    assert layout.no_such_setting("data.lr", known) == "data.lr: no such setting; did you mean optim.lr?"
    assert layout.no_such_setting("resum", known) == "resum: no such setting; did you mean train.resume?"
    assert layout.no_such_setting("nodez", known) == "nodez: no such setting; did you mean nodes?"
    assert layout.no_such_setting("zzz", known).endswith("check the spelling (birder-repro --cfg job lists the keys)")


def test_an_unknown_choice_names_the_choices_and_the_closest():
    assert layout.no_such_choice("optim", "adamz", ["sgdm", "adamw", "birder"]) == (
        "optim=adamz: no such choice; did you mean optim=adamw? the choices: adamw, birder, sgdm"
    )
    assert layout.no_such_choice("task", "mnist", ["digits", "fashion_mnist"]) == (
        "task=mnist: no such choice; the choices: digits, fashion_mnist"
    )


@pytest.mark.parametrize("cluster", ["local", "emulated", "ethernet_10g"])
@pytest.mark.parametrize("rate", ["-5", "0", "abc", "true"])
def test_the_link_rate_is_checked_on_every_cluster(cluster, rate):
    cfg = compose_config([f"cluster={cluster}", f"cluster.link_mbit={rate}"])
    with pytest.raises(layout.ConfigError, match=r"^cluster\.link_mbit=.*: give a rate > 0 in Mbit/s, or null"):
        layout.validate(cfg)
    layout.validate(compose_config([f"cluster={cluster}", "cluster.link_mbit=100"]))
    layout.validate(compose_config([f"cluster={cluster}", "cluster.link_mbit=null"]))

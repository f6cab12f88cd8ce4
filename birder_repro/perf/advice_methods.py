"""The methods of ``mode=advise``'s answer and where each one's inputs come from.

A method's steps to the target are measured (the user's runs: birder_repro.perf.advice_steps), else from the paper
(birder_repro.perf.paper_steps), else to measure; its 1-node profile is given (``predict.profile``), the
user's, else the paper's where the query's cluster is the paper's nodes and the paper prices its scheme
(birder_repro.perf.paper_profiles), else to measure. A method with both is priced by the model
(birder_repro.perf.advise): its time to target at a link.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from birder_repro.config.resources import conf_dir

from .advice_query import Layout
from .advise import step_times, time_to_target
from .paper_steps import PaperSteps, paper_steps

__all__ = [
    "PAPER_CLUSTERS",
    "prices",
    "Method",
    "optim_label",
    "freeze_step",
    "comm_rank",
    "method_inputs",
    "optim_settings",
    "unmeasured",
    "paper_node_profile",
    "price",
]

PAPER_CLUSTERS = ("ethernet_10g", "infiniband_200g")  # conf/cluster/: the paper's nodes of 8 A100s


def optim_label(name: str, variant: str = "") -> str:
    """``birder``, or ``birder (flat)`` for a Birder scheme other than its default."""
    return f"{name} ({variant})" if variant else name


def freeze_step(cfg: dict, planned_steps: int) -> int:
    """The steps a method runs the fp32 exchange before its own: 1-bit Adam's freeze step (``optim.freeze``),
    PowerSGD's start iteration (``optim.comm.start_iter``, at least 2 as its hook reads it:
    birder_repro.comm.powersgd.start_iter_from_config); 0 for other optimizers."""
    from birder_repro.optim.schedule import steps_of

    optim = cfg.get("optim") or {}
    freeze, start = optim.get("freeze"), (optim.get("comm") or {}).get("start_iter")
    if freeze is not None:
        return steps_of(float(freeze), planned_steps, "optim.freeze")
    if start is not None:
        return max(2, steps_of(float(start), planned_steps, "optim.comm.start_iter"))
    return 0


def comm_rank(cfg: dict) -> int:
    """PowerSGD's rank (``optim.comm.rank``), which sets its bytes and its compression work; 1 elsewhere."""
    return int(((cfg.get("optim") or {}).get("comm") or {}).get("rank") or 1)


@dataclass
class Method:
    """One method of the answer: its steps to the target (measured, from the paper, or to measure) and its 1-node
    profile (yours, given, from the paper, or none), with what the model needs of its setting."""

    label: str
    optim: str
    variant: str
    scheme: str
    freeze: int
    local_steps: int
    rank: int
    steps: float | None
    source: str  # measured | from the paper | to measure
    steps_text: str
    settings: dict[str, Any]  # its optim config (a run's, or conf/optim + the task's recipe)
    runs: int = 0
    reached: int = 0
    measured: Any = None  # advice_steps.MeasuredSteps: the user's runs
    paper: PaperSteps | None = None
    profile: Any = None
    profile_source: str = ""  # yours | given | from the paper

    @property
    def every_run_reached(self) -> bool:
        return self.reached == self.runs

    @property
    def rankable(self) -> bool:
        return self.steps is not None and self.profile is not None

    def copy(self, **changes: Any) -> Method:
        return replace(self, **changes)


def method_inputs(optim: str, settings: Mapping[str, Any], planned: int, parallel: str = "ddp") -> dict[str, Any]:
    """What the model needs of an optimizer's config besides its profile: scheme, fp32 warmup steps in a run of
    ``planned`` steps, DiLoCo's H, PowerSGD's rank."""
    from .schemes import scheme_for_optim

    # a run of unknown length (planned 0) has no fraction of it to run in fp32: its warmup is priced where its
    # steps are known (from the paper, or the measuring command's run length)
    return {
        # Streaming DiLoCo's optim.quantize: a quantized stream is priced at its width
        "scheme": scheme_for_optim(
            optim, (settings.get("comm") or {}).get("scheme"), parallel, quantize=settings.get("quantize")
        ),
        "freeze": freeze_step({"optim": settings}, planned) if planned > 0 else 0,
        "local_steps": int(settings.get("local_steps") or 1),
        "rank": comm_rank({"optim": settings}),
    }


def optim_settings(task: str, optim: str) -> dict[str, Any]:
    """An optimizer's config as a run of ``task`` would get it: conf/optim/<optim>.yaml, then the task's recipe
    (conf/recipe/<task>/<optim>.yaml) over it; empty where neither exists."""
    import yaml

    root = conf_dir()
    out: dict[str, Any] = {}
    for folder, section in (("optim", None), (f"recipe/{task}", "optim")):
        path = root / folder / f"{optim}.yaml" if root is not None else None
        if path is None or not path.is_file():
            continue
        data = yaml.safe_load(path.read_text()) or {}
        for k, v in ((data.get(section) or {}) if section else data).items():
            out[k] = {**(out.get(k) or {}), **v} if isinstance(v, dict) else v
    return out


def unmeasured(name: str, lay: Layout) -> Method:
    """A method with no run of the query's: its steps from the paper where it covers the task, else to measure."""
    settings = optim_settings(lay.task, name)
    inputs = method_inputs(name, settings, int(lay.planned_steps or 0))
    paper = paper_steps(lay.task, name, lay.global_batch, lay.batch_size, lay.target, lay.model, lay.seq_length)
    common = {"label": optim_label(name), "optim": name, "variant": "", "settings": settings}
    if paper is None:
        return Method(
            **common,
            **inputs,
            steps=None,
            source="to measure",
            steps_text="no run reaching the target (none ran; the papers give no steps for it)",
        )
    inputs["freeze"] = paper.freeze  # the paper's warmup, at the user's global batch
    return Method(
        **common,
        **inputs,
        steps=float(paper.steps),
        source="from the paper",
        steps_text=paper.text,
        runs=1,
        reached=int(paper.reached),
        paper=paper,
    )


def prices(profile: Any, scheme: str) -> bool:
    """The profile has a cost for the scheme's compression (the paper's has none for PowerSGD's nor for the
    16-bit casts: perf.paper_scale's module doc), so the model can price the scheme's step with it."""
    from .schemes import COMPRESSION_BACKEND

    backend = COMPRESSION_BACKEND.get(scheme)
    return not backend or backend in profile.compression_s_per_element


def paper_node_profile(lay: Layout) -> Any:
    """The paper's 1-node profile of the task (its nodes of 8 A100s), where the query's cluster is the paper's
    and the paper has the task; BERT-Large's from the 1-bit Adam paper's V100 nodes (perf.paper_profiles
    .v100_profile: at its sequence length and precision only, the device named as not the user's); else None."""
    from .paper_profiles import paper_profile, v100_profile

    if lay.cluster not in PAPER_CLUSTERS:
        return None
    if (v100 := v100_profile(lay.task, lay.model, lay.seq_length, lay.gpus_per_node, lay.precision)) is not None:
        return v100
    if (lay.model or {}).get("size") == "large":  # the Birder paper trains no BERT-Large: none of its profiles
        return None
    try:
        return paper_profile(
            task=lay.task, batch_size=lay.batch_size, node=lay.spec(lay.link_mbit), implementation=lay.implementation
        )
    except ValueError:  # the paper has no profile of this task
        return None


def price(m: Method, lay: Layout, link: float, nodes: int | None = None, batch: int | None = None) -> dict[str, float]:
    """The model's step times of method ``m`` (with its profile) at ``link``, on ``nodes`` of the user's nodes at
    ``batch`` a process (the user's own where not given), and its time to target from its steps."""
    warm, main, share = step_times(
        m.profile,
        lay.spec(link),
        nodes or lay.nodes,
        lay.gpus_per_node,
        m.scheme,
        batch or lay.batch_size,
        freeze=m.freeze,
        local_steps=m.local_steps,
        rank=m.rank,
        implementation=lay.implementation,
    )
    return {
        "warmup_step_s": warm,
        "step_s": main,
        "comm_share": share,
        "time_to_target_s": time_to_target(m.steps or 0.0, m.freeze, warm, main),
    }

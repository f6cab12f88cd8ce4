"""Steps to a task's target where the user has measured none: the papers' own runs, transcribed, each row cited.

The Birder paper reports, per method and layout, the metric each run ended its schedule at, not the step at
which it crossed a target (Figure 2's curves are not given as numbers). So what is transcribed here is:

- the schedule every method ran (section 5.1): ResNet-50 on ILSVRC2012 for 100 epochs, 1-bit Adam's first 15 of
  them uncompressed; BERT-Base fine-tuned on SQuAD 1.1 for 2 epochs, 1-bit Adam's first 0.2 of the steps
  uncompressed;
- the metric each run ended at (Table 1: top-1 per 8, 16, 32, 64 GPUs at 32 and 128 a GPU; Table 2: F1 and exact
  match per 8-64 GPUs at 3 a GPU).

From the paper, then, the steps to a target are the schedule's steps at the user's global batch, **at most**:
where the paper's run at (or nearest to) that global batch ended at or beyond the target it reached it within
them; where it ended short, the paper says the target was not reached in that schedule. The 1-bit Adam paper
(Tang et al. 2021, "1-bit Adam: Communication Efficient Large-Scale Training with Adam's Convergence Speed",
section 7.1, Figure 4a and Table 2) adds that 1-bit Adam's sample-wise convergence is Adam's; its runs are of
other tasks and schedules, so no steps are taken from it. Nothing here is measured and nothing is made up: a
method or task the papers do not cover returns None (the advice prints the command that measures it).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

__all__ = ["PaperRow", "PaperMethod", "PaperSteps", "PAPER_METHODS", "PAPER_NOTES", "paper_steps"]

BIRDER = "Birder paper"
ONEBIT = "1-bit Adam paper (Tang et al. 2021), section 7.1"


@dataclass(frozen=True)
class PaperRow:
    """One run of the paper: its layout and the metrics at the end of its schedule."""

    gpus: int
    batch_per_gpu: int
    metrics: tuple[tuple[str, float], ...]
    table: str

    @property
    def global_batch(self) -> int:
        return self.gpus * self.batch_per_gpu

    def metric(self, name: str) -> float | None:
        return dict(self.metrics).get(name)


@dataclass(frozen=True)
class PaperMethod:
    """One method of one task as the paper trained it: its schedule, its warmup and its runs."""

    task: str
    optim: str
    epochs: float
    train_size: int  # samples an epoch
    train_size_source: str
    freeze_fraction: float  # the share of the steps run uncompressed first (1-bit Adam's warmup); 0 elsewhere
    schedule_source: str
    rows: tuple[PaperRow, ...]
    also: str = ""  # further support from another paper


IMAGENET = 1_281_167  # ILSVRC2012's training images
IMAGENET_SOURCE = "ILSVRC2012's 1,281,167 training images"
SQUAD = 88_641  # conf/task/bert_squad.yaml: SQuAD 1.1's training windows at 384 tokens, stride 128
SQUAD_SOURCE = "SQuAD 1.1's 88,641 training windows at 384 / 128 (conf/task/bert_squad.yaml)"
RESNET_SCHEDULE = f"{BIRDER}, section 5.1: 100 epochs for every method"
SQUAD_SCHEDULE = f"{BIRDER}, section 5.1: 2 epochs for every method"


def _resnet50(top1_32: tuple[float, ...], top1_128: tuple[float, ...]) -> tuple[PaperRow, ...]:
    """Table 1's rows of one method: top-1 at 8, 16, 32, 64 GPUs, 32 and 128 a GPU."""
    return tuple(
        PaperRow(gpus, batch, (("top1", top1),), f"{BIRDER}, Table 1 ({gpus} GPUs x {batch})")
        for batch, column in ((32, top1_32), (128, top1_128))
        for gpus, top1 in zip((8, 16, 32, 64), column)
    )


def _squad(f1: tuple[float, ...], em: tuple[float, ...]) -> tuple[PaperRow, ...]:
    """Table 2's rows of one method: F1 and exact match at 8, 16, 32, 64 GPUs, 3 a GPU."""
    return tuple(
        PaperRow(gpus, 3, (("f1", a), ("exact_match", b)), f"{BIRDER}, Table 2 ({gpus} GPUs x 3)")
        for gpus, a, b in zip((8, 16, 32, 64), f1, em)
    )


# The Birder paper, Tables 1 and 2, as printed (top-1 %, F1 %, exact match %).
PAPER_METHODS: dict[tuple[str, str], PaperMethod] = {
    ("resnet50", "sgdm"): PaperMethod(
        task="resnet50",
        optim="sgdm",
        epochs=100,
        train_size=IMAGENET,
        train_size_source=IMAGENET_SOURCE,
        freeze_fraction=0.0,
        schedule_source=RESNET_SCHEDULE,
        rows=_resnet50((76.19, 75.96, 75.47, 75.37), (75.05, 74.61, 74.54, 74.22)),
    ),
    ("resnet50", "onebit_adam"): PaperMethod(
        task="resnet50",
        optim="onebit_adam",
        epochs=100,
        train_size=IMAGENET,
        train_size_source=IMAGENET_SOURCE,
        freeze_fraction=0.15,
        schedule_source=f"{RESNET_SCHEDULE}, the first 15 uncompressed",
        rows=_resnet50((75.55, 75.33, 75.18, 75.54), (75.42, 75.05, 74.62, 74.14)),
        also=f"{ONEBIT}: 1-bit Adam's sample-wise convergence is Adam's",
    ),
    ("resnet50", "birder"): PaperMethod(
        task="resnet50",
        optim="birder",
        epochs=100,
        train_size=IMAGENET,
        train_size_source=IMAGENET_SOURCE,
        freeze_fraction=0.0,
        schedule_source=RESNET_SCHEDULE,
        rows=_resnet50((75.98, 75.53, 75.27, 75.30), (75.45, 75.09, 74.82, 74.24)),
    ),
    ("bert_squad", "bertadam"): PaperMethod(
        task="bert_squad",
        optim="bertadam",
        epochs=2,
        train_size=SQUAD,
        train_size_source=SQUAD_SOURCE,
        freeze_fraction=0.0,
        schedule_source=SQUAD_SCHEDULE,
        rows=_squad((88.13, 88.47, 88.38, 88.13), (80.59, 81.07, 80.94, 80.94)),
    ),
    ("bert_squad", "onebit_adam"): PaperMethod(
        task="bert_squad",
        optim="onebit_adam",
        epochs=2,
        train_size=SQUAD,
        train_size_source=SQUAD_SOURCE,
        freeze_fraction=0.2,
        schedule_source=f"{SQUAD_SCHEDULE}, the first 0.2 of the steps uncompressed",
        rows=_squad((88.05, 87.87, 87.78, 87.33), (80.06, 80.31, 80.08, 79.67)),
        also=f"{ONEBIT}: 1-bit Adam's sample-wise convergence is Adam's (SQuAD: 400 of 1848 steps in warmup)",
    ),
    ("bert_squad", "birder"): PaperMethod(
        task="bert_squad",
        optim="birder",
        epochs=2,
        train_size=SQUAD,
        train_size_source=SQUAD_SOURCE,
        freeze_fraction=0.0,
        schedule_source=SQUAD_SCHEDULE,
        rows=_squad((88.71, 88.31, 88.08, 88.28), (81.18, 80.80, 80.50, 80.75)),
    ),
}

# What the papers say of a task without giving steps to its target (printed with the advice).
PAPER_NOTES: dict[str, str] = {
    "bert_pretrain": (
        f"the {BIRDER}, appendix C (Figure 8, loss curves only): Birder's iteration-wise convergence comparable to "
        f"BertAdam's over 37,000 iterations; the {ONEBIT} (Table 2, Figure 4a): 1-bit Adam's sample-wise "
        "convergence the same as Adam's on BERT pre-training; neither gives the steps to a masked-LM accuracy"
    ),
}


@dataclass(frozen=True)
class PaperSteps:
    """A method's steps to the target from the paper, at the user's global batch."""

    optim: str
    steps: int  # the schedule's steps at the user's global batch: at most this many to the target
    freeze: int  # of them, run uncompressed first
    reached: bool  # the paper's run at (or nearest to) that global batch ended at or beyond the target
    row: PaperRow
    value: float  # the metric that run ended at
    text: str


def _nearest(rows: tuple[PaperRow, ...], global_batch: int, batch_per_gpu: int) -> PaperRow:
    """The row at the user's global batch, else the nearest (in ratio); a tie goes to the user's batch a GPU."""
    return min(rows, key=lambda r: (abs(math.log(r.global_batch / global_batch)), r.batch_per_gpu != batch_per_gpu))


def paper_steps(
    task: str,
    optim: str,
    global_batch: int,
    batch_per_gpu: int,
    target: tuple[str, float, str] | None,
) -> PaperSteps | None:
    """``optim``'s steps to ``target`` (metric, value, ``higher`` or ``lower``) on ``task`` at ``global_batch``
    from the paper's runs; None where the paper has no run of that method and task reporting that metric."""
    method = PAPER_METHODS.get((task, optim))
    if method is None or target is None or global_batch <= 0:
        return None
    metric, value, direction = target
    rows = tuple(r for r in method.rows if r.metric(metric) is not None)
    if not rows:
        return None
    row = _nearest(rows, global_batch, batch_per_gpu)
    ended = float(row.metric(metric))  # type: ignore[arg-type]
    reached = ended <= value if direction == "lower" else ended >= value
    steps = math.ceil(method.epochs * method.train_size / global_batch)
    freeze = math.ceil(method.freeze_fraction * steps)
    where = "your" if row.global_batch == global_batch else "the nearest"
    verdict = (
        f"reached {metric} {'<=' if direction == 'lower' else '>='} {value:g} by its end: at most these steps"
        if reached
        else f"short of the target {value:g}: not reached within the paper's schedule"
    )
    text = (
        f"from the paper: {method.epochs:g} epochs of {method.train_size_source} = {steps} steps at global batch "
        f"{global_batch}{f', the first {freeze} uncompressed' if freeze else ''} ({method.schedule_source}); its run "
        f"at {where} global batch {row.global_batch} ({row.table}) ended at {metric} {ended:g}, {verdict}"
        + (f"; {method.also}" if method.also else "")
    )
    return PaperSteps(optim, steps, freeze, reached, row, ended, text)

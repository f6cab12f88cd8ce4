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
section 7.1, Figure 4a and Table 2) adds that 1-bit Adam's sample-wise convergence is Adam's.

BERT-Large pre-training (``task=bert_pretrain model.size=large data.max_seq_length=128``), which the Birder paper
does not train, has the 1-bit Adam paper's schedule (section 7.1, Table 2): 152K steps at global batch 4K for
BertAdam and 1-bit Adam alike, 1-bit Adam's first 23K uncompressed. That paper reports no masked-LM accuracy (its
runs are shown as loss curves, Figure 4a, and judged by GLUE after fine-tuning, Table 3), so whether the task's
target is reached within them is not given: the advice says so and times them to the schedule's end; no
conversion of a loss or a GLUE score into a masked-LM accuracy is made. At another global batch the same
sequences are taken (an ASSUMPTION, printed: the paper trained at 4K only). Its sequence-512 phase (10K steps)
continues from the sequence-128 checkpoint, which this task does not: it is not counted. No paper gives Birder's
steps on BERT-Large.

Nothing here is measured and nothing is made up: a method or task the papers do not cover returns None (the
advice prints the command that measures it).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["PaperRow", "PaperMethod", "PaperSteps", "PAPER_METHODS", "PAPER_NOTES", "covers", "paper_steps"]

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
    model: tuple[tuple[str, Any], ...] = ()  # what the query's model must hold (model.size=large); (): any
    seq_length: int | None = None  # the query's data.max_seq_length must be this; None: any
    # a schedule the paper gives in steps at a global batch (in place of epochs of a training set)
    schedule_steps: int = 0
    schedule_batch: int = 0
    freeze_steps: int = 0  # of them, run uncompressed first (1-bit Adam's warmup)
    reports: str = ""  # what the paper reports of its runs where it does not report the target's metric


IMAGENET = 1_281_167  # ILSVRC2012's training images
IMAGENET_SOURCE = "ILSVRC2012's 1,281,167 training images"
SQUAD = 88_641  # conf/task/bert_squad.yaml: SQuAD 1.1's training windows at 384 tokens, stride 128
SQUAD_SOURCE = "SQuAD 1.1's 88,641 training windows at 384 / 128 (conf/task/bert_squad.yaml)"
RESNET_SCHEDULE = f"{BIRDER}, section 5.1: 100 epochs for every method"
SQUAD_SCHEDULE = f"{BIRDER}, section 5.1: 2 epochs for every method"
BERT_LARGE_SCHEDULE = (
    f"{ONEBIT} and Table 2: BERT-Large pre-training at sequence 128, the same 152K steps for BertAdam (its baseline) "
    "and 1-bit Adam, the learning rate warmed up to 4e-4 over 12.5K steps, then x0.99 every 520 steps; its "
    "sequence-512 phase (10K steps) not counted"
)
BERT_LARGE_RUN = PaperRow(64, 64, (), "1-bit Adam paper, Table 2 (BERT-Large, sequence 128, global batch 4K, 64 GPUs)")
BERT_LARGE_REPORTS = (
    "its pre-training is shown as training-loss curves only (Figure 4a) and judged by GLUE dev scores after "
    "fine-tuning (Table 3, MNLI-m/mm: BertAdam 86.1/86.2, 1-bit Adam 85.7/85.4)"
)


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

PAPER_METHODS.update(
    {
        ("bert_pretrain", optim): PaperMethod(
            task="bert_pretrain",
            optim=optim,
            epochs=0,
            train_size=0,
            train_size_source="",
            freeze_fraction=0.0,
            schedule_source=BERT_LARGE_SCHEDULE,
            rows=(BERT_LARGE_RUN,),
            also=also,
            model=(("size", "large"),),
            seq_length=128,
            schedule_steps=152_000,
            schedule_batch=4096,
            freeze_steps=freeze,
            reports=BERT_LARGE_REPORTS,
        )
        for optim, freeze, also in (
            ("bertadam", 0, ""),
            (
                "onebit_adam",
                23_000,
                f"{ONEBIT}: 1-bit Adam's sample-wise convergence the same as BertAdam's (Figure 4a); its 23K "
                "uncompressed steps tuned by hand (the variance's norm stable after about 23K, section 3.3)",
            ),
        )
    }
)

# What the papers say of a task without giving steps to its target (printed with the advice).
PAPER_NOTES: dict[str, str] = {
    "bert_pretrain": (
        f"BERT-Base (model.size=full): the {BIRDER}, appendix C (Figure 8, loss curves only): Birder's iteration-wise "
        "convergence comparable to BertAdam's over 37,000 iterations, no steps to a masked-LM accuracy; BERT-Large "
        f"(model.size=large): the {ONEBIT} gives BertAdam's and 1-bit Adam's schedule (Table 2) and 1-node V100 "
        "profiles (section 3.1, Table 1) at sequence 128 only (data.max_seq_length=128; the profiles in fp16: "
        "train.precision=fp16), no masked-LM accuracy; "
        "no paper gives Birder's steps on BERT-Large"
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
    value: float | None  # the metric that run ended at; None: the paper does not report the target's metric
    text: str


def _nearest(rows: tuple[PaperRow, ...], global_batch: int, batch_per_gpu: int) -> PaperRow:
    """The row at the user's global batch, else the nearest (in ratio); a tie goes to the user's batch a GPU."""
    return min(rows, key=lambda r: (abs(math.log(r.global_batch / global_batch)), r.batch_per_gpu != batch_per_gpu))


def covers(method: PaperMethod, model: Mapping[str, Any] | None, seq_length: int | None) -> bool:
    """The paper's runs are of the query's model (every key the method names, e.g. ``size=large``) and sequence
    length, where the method names them."""
    if method.model and not all((model or {}).get(k) == v for k, v in method.model):
        return False
    return method.seq_length is None or seq_length == method.seq_length


def paper_steps(
    task: str,
    optim: str,
    global_batch: int,
    batch_per_gpu: int,
    target: tuple[str, float, str] | None,
    model: Mapping[str, Any] | None = None,
    seq_length: int | None = None,
) -> PaperSteps | None:
    """``optim``'s steps to ``target`` (metric, value, ``higher`` or ``lower``) on ``task`` at ``global_batch``
    from the paper's runs; None where the paper has no run of that method, task, ``model`` and ``seq_length``
    (data.max_seq_length), or none reporting that metric where the paper's steps are epochs of runs scored on it."""
    method = PAPER_METHODS.get((task, optim))
    if method is None or target is None or global_batch <= 0 or not covers(method, model, seq_length):
        return None
    if method.schedule_steps:
        return _from_schedule(method, global_batch, target)
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


def _from_schedule(method: PaperMethod, global_batch: int, target: tuple[str, float, str]) -> PaperSteps:
    """A schedule the paper gives in steps at one global batch (BERT-Large): the same sequences at the user's
    global batch; reached only where the paper's run reports the target's metric at or beyond it."""
    metric, value, direction = target
    op = "<=" if direction == "lower" else ">="
    samples = method.schedule_steps * method.schedule_batch
    steps = math.ceil(samples / global_batch)
    freeze = math.ceil(method.freeze_steps * method.schedule_batch / global_batch)
    row = method.rows[0]
    ended = row.metric(metric)
    reached = ended is not None and (ended <= value if direction == "lower" else ended >= value)
    uncompressed = f", the first {method.freeze_steps:,} uncompressed" if method.freeze_steps else ""
    here = f"{steps} steps at your global batch {global_batch}{f', the first {freeze} uncompressed' if freeze else ''}"
    if global_batch != method.schedule_batch:
        here += f" (the same {samples:,} sequences: ASSUMPTION, the paper trained at {method.schedule_batch} only)"
    if ended is None:
        verdict = (
            f"the paper reports no {metric} ({method.reports}): whether {metric} {op} {value:g} is reached within "
            "them is not given, the time is to the schedule's end"
        )
    elif reached:
        verdict = f"its run ({row.table}) ended at {metric} {ended:g}, {op} {value:g}: at most these steps"
    else:
        verdict = f"its run ({row.table}) ended at {metric} {ended:g}, short of the target {value:g}"
    text = (
        f"from the paper: {method.schedule_steps:,} steps at global batch {method.schedule_batch}{uncompressed} "
        f"({method.schedule_source}) = {here}; {verdict}" + (f"; {method.also}" if method.also else "")
    )
    return PaperSteps(method.optim, steps, freeze, reached, row, ended, text)

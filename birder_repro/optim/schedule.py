"""Learning-rate schedules as pure functions of the step: the factor the peak learning rate is multiplied by.

The training loop sets every parameter group's lr to ``base_lr * lr_factor(step, total_steps, cfg)`` before
each optimizer step, ``base_lr`` being the peak learning rate the optimizer was built with. Being a function of
the step alone, a resumed run gets the same learning rate as an uninterrupted one.

``step`` counts from 0: it is the index of the optimizer step about to be taken. Lengths (``warmup``, the
milestones of ``multistep``) below 1 are fractions of the run, from 1 on they are steps (:func:`steps_of`).

Schedules (``cfg.name``):

- ``constant``: 1;
- ``multistep``: ``gamma`` to the number of milestones reached (Birder paper, section 5.1: ResNet-50's lr
  "divided by 10 after 30, 60 and 90 epochs" of 100 is ``milestones=[0.3, 0.6, 0.9], gamma=0.1``);
- ``warmup_linear``: linear warmup from 0 to the peak over ``warmup`` steps, then linear decay to 0 at the last
  step (Birder paper, section 5.1: BERT-Base fine-tuning "linearly increases ... in the early 500 steps
  and then linearly decreases to 0"; BERT's BertAdam ``warmup_linear`` and Hugging Face's
  ``get_linear_schedule_with_warmup`` compute the same);
- ``cosine``: the same linear warmup, then half a cosine from the peak to 0 (Loshchilov and Hutter, SGDR,
  ICLR 2017, Eq. (5) without restarts; Hugging Face's ``get_cosine_schedule_with_warmup``).

``constant`` and ``multistep`` honour ``warmup`` too, as the gradual warmup of Goyal et al. 2017 ("Accurate,
Large Minibatch SGD", section 2.2); with the default ``warmup: 0`` they are the plain schedules.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

SCHEDULES = ("constant", "multistep", "warmup_linear", "cosine")


def steps_of(value: float, total_steps: int | None, setting: str = "a schedule length") -> int:
    """A length given as a fraction of the run or as a number of steps, in steps.

    The one reading of such lengths in the project: the schedule's ``warmup`` and ``milestones`` here, 1-bit
    Adam's ``optim.freeze`` and PowerSGD's ``optim.comm.start_iter``.

    1. below 0: an error;
    2. from 1 on: a number of steps, which must be whole;
    3. 0: no steps;
    4. between 0 and 1: that fraction of ``total_steps`` (the optimizer steps of the whole run), rounded to the
       nearest step; an error when the run's length is not known.

    ``setting`` names the config key in the errors (e.g. ``optim.freeze``).
    """
    if value is None or value < 0:
        raise ValueError(f"{setting} must be >= 0 (a fraction of the run below 1, or a number of steps), got {value}")
    if value >= 1:
        if value != int(value):
            raise ValueError(f"{setting} >= 1 is a number of steps and must be whole, got {value}")
        return int(value)
    if value == 0:
        return 0
    if total_steps is None or total_steps < 1:
        raise ValueError(
            f"{setting}={value} is a fraction of the run, so optim.total_steps (the optimizer steps "
            f"of the whole run) must be set; got {total_steps}"
        )
    return round(value * total_steps)


def warmup_factor(step: int, warmup_steps: int) -> float:
    """Linear ramp from 0 at step 0 to 1 at ``warmup_steps`` (Hugging Face's convention: step / warmup)."""
    return step / warmup_steps if step < warmup_steps else 1.0


def multistep_factor(step: int, milestones: Sequence[int], gamma: float) -> float:
    """gamma ** (number of milestones <= step): the lr drops when ``step`` reaches a milestone."""
    return gamma ** sum(1 for m in milestones if step >= m)


def linear_decay_factor(step: int, warmup_steps: int, total_steps: int) -> float:
    """1 at the end of warmup, falling linearly to 0 at ``total_steps``."""
    return max(0.0, (total_steps - step) / max(1, total_steps - warmup_steps))


def cosine_factor(step: int, warmup_steps: int, total_steps: int) -> float:
    """Half a cosine from 1 at the end of warmup to 0 at ``total_steps``."""
    progress = min(1.0, (step - warmup_steps) / max(1, total_steps - warmup_steps))
    return 0.5 * (1.0 + math.cos(math.pi * progress))


def lr_factor(step: int, total_steps: int, schedule_cfg: Mapping[str, Any]) -> float:
    """The factor of the peak learning rate at ``step`` (0-based) of a run of ``total_steps`` steps."""
    name = schedule_cfg.get("name", "constant")
    if name not in SCHEDULES:
        raise ValueError(f"unknown lr schedule {name!r}; known: {', '.join(SCHEDULES)}")
    warmup = steps_of(schedule_cfg.get("warmup", 0) or 0, total_steps, "train.schedule.warmup")
    if step < warmup:
        return warmup_factor(step, warmup)
    if name == "constant":
        return 1.0
    if name == "multistep":
        milestones = [
            steps_of(m, total_steps, "train.schedule.milestones") for m in schedule_cfg.get("milestones", []) or []
        ]
        return multistep_factor(step, milestones, float(schedule_cfg.get("gamma", 0.1)))
    if name == "warmup_linear":
        return linear_decay_factor(step, warmup, total_steps)
    return cosine_factor(step, warmup, total_steps)

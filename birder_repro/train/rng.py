"""The random number generators a run draws from (torch, Python, numpy, CUDA), saved and put back.

Checkpoints keep them so that a resumed run goes on as an uninterrupted one would; the compute calibration and
a mid-epoch resume put them back so that their extra draws leave no trace on training.
"""

from __future__ import annotations

import random

import numpy as np
import torch

__all__ = ["rng_state", "set_rng_state"]


def rng_state(device: torch.device) -> dict:
    state = {"torch": torch.get_rng_state(), "python": random.getstate(), "numpy": np.random.get_state()}
    if device.type == "cuda":
        state["cuda"] = torch.cuda.get_rng_state(device)
    return state


def set_rng_state(state: dict, device: torch.device) -> None:
    torch.set_rng_state(state["torch"].cpu())
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    if "cuda" in state and device.type == "cuda":
        torch.cuda.set_rng_state(state["cuda"].cpu(), device)

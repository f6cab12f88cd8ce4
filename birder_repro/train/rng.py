"""The random number generators a run draws from (torch, Python, numpy, CUDA), saved and put back.

Checkpoints keep them so that a resumed run goes on as an uninterrupted one would; the compute calibration and
a mid-epoch resume put them back so that their extra draws leave no trace on training.

The state is tensors and plain values only (numpy's key array as a tensor), so that a checkpoint loads with
``torch.load(weights_only=True)``: loading one never runs code from it.
"""

from __future__ import annotations

import random

import numpy as np
import torch

__all__ = ["rng_state", "set_rng_state"]


def rng_state(device: torch.device) -> dict:
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    state = {
        "torch": torch.get_rng_state(),
        "python": random.getstate(),
        "numpy": {
            "kind": str(kind),
            "keys": torch.from_numpy(keys.astype(np.int64)),
            "pos": int(pos),
            "has_gauss": int(has_gauss),
            "cached_gaussian": float(cached),
        },
    }
    if device.type == "cuda":
        state["cuda"] = torch.cuda.get_rng_state(device)
    return state


def set_rng_state(state: dict, device: torch.device) -> None:
    torch.set_rng_state(state["torch"].cpu())
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    npy = state["numpy"]
    np.random.set_state(
        (npy["kind"], npy["keys"].cpu().numpy().astype(np.uint32), npy["pos"], npy["has_gauss"], npy["cached_gaussian"])
    )
    if "cuda" in state and device.type == "cuda":
        torch.cuda.set_rng_state(state["cuda"].cpu(), device)

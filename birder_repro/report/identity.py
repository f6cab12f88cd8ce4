"""What makes two runs the same cell of a table: their resolved config, less the seed and the settings that
cannot change what a run measures.

A cell's runs are its seeds (aggregated: mean, spread, n); a run of any other setting is another row, never a
newer run in its place. The key is computed here from the record's ``config`` (every record has it, old ones
too), not read from the record: the checkpoint manifest's ``config_digest`` (birder_repro.train.checkpoint)
hashes the whole config, seed included, which is what resuming needs and not what a table needs.

:data:`IGNORED_KEYS` is the list of the config keys left out, each with why: the seed, ``probe`` (mode=probe's
records are not runs) and :data:`birder_repro.run.digest.NO_RESULT`, the one list of the settings that cannot change
a result, which the cell digest (``train.resume=auto``) leaves out too.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any

from birder_repro.run.digest import NO_RESULT

__all__ = ["IGNORED_KEYS", "MEASURED_ONLY_KEYS", "config_items", "config_key", "is_ignored"]

# Config keys (and every key under them) that are not part of a cell, and why: the seed, and the settings that
# cannot change a result (birder_repro.run.digest.NO_RESULT, the one list, which the cell digest leaves out too).
# Everything else is: a run that differs in any other key (steps, learning rate, eval cadence, precision, ...) is
# another row.
IGNORED_KEYS: dict[str, str] = {
    "seed": "the cell's runs are its seeds: they are aggregated (mean, spread, n), never a setting",
    "optim.seed": "the seed again (optim.seed: ${seed}, the quantizer's draws)",
    **NO_RESULT,
    "probe": "mode=probe only, whose records are not runs (the report leaves them out)",
}
# Kept for predicted records (mode=predict reads them), left out of measured runs (which never read them: an
# experiment file such as table1.yaml sets predict.implementation for its predictions).
MEASURED_ONLY_KEYS: dict[str, str] = {
    "predict": "mode=predict's settings: a measured run never reads them",
    "advise": "mode=advise's settings: a measured run never reads them",
    "cluster.perf": "the performance model's account of the links (mode=predict, refitted by mode=probe); a "
    "measured run's network is the cluster's name, interconnect, link_mbit and latency, which stay",
}


def is_ignored(key: str, source: str = "measured") -> bool:
    """Whether the dotted config ``key`` is left out of a cell (it or a key above it is listed)."""
    listed = {**IGNORED_KEYS, **(MEASURED_ONLY_KEYS if source != "predicted" else {})}
    parts = key.split(".")
    return any(".".join(parts[:i]) in listed for i in range(1, len(parts) + 1))


def _flat(config: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, value in config.items():
        key = f"{prefix}{name}"
        if isinstance(value, Mapping) and value:
            out.update(_flat(value, key + "."))
        else:
            out[key] = value
    return out


def config_items(config: Any, source: str = "measured") -> dict[str, Any]:
    """The record's resolved ``config`` as dotted keys -> values, less :data:`IGNORED_KEYS` and less the keys
    set to null: a setting added later with a null default that means "as before" (``cluster.cores_per_node``)
    must not split a cell between the runs made before it existed and those made after."""
    if not isinstance(config, Mapping):
        return {}
    return {k: v for k, v in sorted(_flat(config).items()) if v is not None and not is_ignored(k, source)}


def config_key(config: Any, source: str = "measured") -> str:
    """A short digest of :func:`config_items`: equal for two runs of one cell (their seeds), else different."""
    text = json.dumps(config_items(config, source), sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:12]

"""What SLURM's environment says about the allocation this process runs in.

Only the variables that ``srun`` and ``sbatch`` set are read (https://slurm.schedmd.com/srun.html, "OUTPUT
ENVIRONMENT VARIABLES"); within a job step the step's variables (``SLURM_STEP_*``) describe the nodes that
run this command, the job's variables the whole allocation.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

__all__ = ["in_allocation", "allocation_nodes", "node_id", "first_host", "expand_hostlist", "time_limit_s"]


def in_allocation(env: Mapping[str, str]) -> bool:
    return bool(env.get("SLURM_JOB_ID"))


def allocation_nodes(env: Mapping[str, str]) -> int:
    """Nodes that run this command: the job step's node count, else the allocation's (0 outside SLURM)."""
    if not in_allocation(env):
        return 0
    for key in ("SLURM_STEP_NUM_NODES", "SLURM_JOB_NUM_NODES", "SLURM_NNODES"):
        if env.get(key, "").isdigit():
            return int(env[key])
    return 1


def node_id(env: Mapping[str, str]) -> int | None:
    """This node's index in the job step (``SLURM_NODEID``), or None outside SLURM."""
    value = env.get("SLURM_NODEID", "")
    return int(value) if value.isdigit() else None


def first_host(env: Mapping[str, str]) -> str | None:
    """The first host of the step's (else the job's) node list: where node 0 runs, in SLURM's order."""
    for key in ("SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST"):
        if env.get(key):
            hosts = expand_hostlist(env[key])
            if hosts:
                return hosts[0]
    return None


def expand_hostlist(hostlist: str) -> list[str]:
    """Expand SLURM's compact host list, as ``scontrol show hostnames`` does for the common forms.

    ``node[01-03,07],gpu-a`` -> node01 node02 node03 node07 gpu-a; zero padding is kept; several bracket
    groups in one name (``r[1-2]n[1-2]``) expand as their product, in order.
    """
    hosts: list[str] = []
    for part in _split_top_level(hostlist):
        hosts.extend(_expand_one(part))
    return hosts


def _split_top_level(text: str) -> list[str]:
    """Split at the commas that are not inside brackets."""
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        depth += {"[": 1, "]": -1}.get(ch, 0)
        if ch == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    parts.append(text[start:])
    return [p.strip() for p in parts if p.strip()]


def _expand_one(name: str) -> list[str]:
    match = re.search(r"\[([^\]]*)\]", name)
    if match is None:
        return [name]
    prefix, rest = name[: match.start()], name[match.end() :]
    return [prefix + item + tail for item in _expand_ranges(match.group(1)) for tail in _expand_one(rest)]


def _expand_ranges(spec: str) -> list[str]:
    """``01-03,07`` -> 01 02 03 07 (the width of the first bound is kept)."""
    items = []
    for piece in spec.split(","):
        lo, _, hi = piece.partition("-")
        if not hi:
            items.append(lo)
            continue
        width = len(lo)
        items.extend(str(k).zfill(width) for k in range(int(lo), int(hi) + 1))
    return items


def time_limit_s(text: str) -> int | None:
    """A ``--time`` value in seconds; None for no limit (0, ``UNLIMITED``, ``INFINITE``).

    The forms ``man sbatch`` lists: ``minutes``, ``minutes:seconds``, ``hours:minutes:seconds``, ``days-hours``,
    ``days-hours:minutes``, ``days-hours:minutes:seconds``. Raises ValueError for anything else.
    """
    text = str(text).strip()
    if text.upper() in ("UNLIMITED", "INFINITE"):
        return None
    days, dash, rest = text.rpartition("-") if "-" in text else ("0", "", text)
    parts = rest.split(":")
    if not (days.isdigit() and all(p.isdigit() for p in parts) and 1 <= len(parts) <= 3):
        raise ValueError(f"{text!r} is not a SLURM time ([days-]hours:minutes:seconds, or minutes)")
    numbers = [int(p) for p in parts]
    if dash:  # after "days-" the first field is hours
        numbers += [0] * (3 - len(numbers))
        seconds = numbers[0] * 3600 + numbers[1] * 60 + numbers[2]
    elif len(numbers) == 3:
        seconds = numbers[0] * 3600 + numbers[1] * 60 + numbers[2]
    else:  # minutes, or minutes:seconds
        seconds = numbers[0] * 60 + (numbers[1] if len(numbers) == 2 else 0)
    seconds += int(days) * 86400
    return seconds or None

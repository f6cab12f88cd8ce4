"""What SLURM's environment says about the allocation this process runs in.

Only the variables that ``srun`` and ``sbatch`` set are read (https://slurm.schedmd.com/srun.html, "OUTPUT
ENVIRONMENT VARIABLES"); within a job step the step's variables (``SLURM_STEP_*``) describe the nodes that
run this command, the job's variables the whole allocation.
"""

from __future__ import annotations

import re
from typing import Mapping, Optional

__all__ = ["in_allocation", "allocation_nodes", "node_id", "first_host", "expand_hostlist"]


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


def node_id(env: Mapping[str, str]) -> Optional[int]:
    """This node's index in the job step (``SLURM_NODEID``), or None outside SLURM."""
    value = env.get("SLURM_NODEID", "")
    return int(value) if value.isdigit() else None


def first_host(env: Mapping[str, str]) -> Optional[str]:
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
    prefix, rest = name[:match.start()], name[match.end():]
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

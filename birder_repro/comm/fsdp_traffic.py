"""FSDP2's own collectives counted into a hook state's counters (:mod:`birder_repro.comm.fsdp`; the hooks count
what they send themselves, :mod:`birder_repro.comm.accounting`).

Counted: FSDP's collectives inside the node (the reduce-scatter and the parameters' all-gathers in forward and,
for units resharded after forward, in backward) and, for native HSDP (the baselines), its fp32 all-reduce
across the nodes.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from birder_repro.comm.accounting import allreduce_bytes, reduce_scatter_bytes
from birder_repro.comm.fsdp_units import Unit, param_group
from birder_repro.comm.state import CommState
from birder_repro.comm.topology import Topology

__all__ = ["FsdpTraffic"]


class FsdpTraffic:
    """Counts FSDP's own collectives into a hook state's counters (what FSDP sends; the hooks count theirs).

    Per unit and training step: one all-gather of the parameters in forward and one more in backward when the
    unit is resharded after forward (every unit but the root, by FSDP2's default), ``(m-1) * shard bytes``
    each; one reduce-scatter of the gradients, ``(m-1)/m * padded unit bytes``; with ``native_hsdp``, FSDP's
    fp32 all-reduce of the shard across the nodes, ``2 (n-1)/n * shard bytes``. Forward passes without grad
    (evaluation) or without reduction (the loop's compute calibration) are not counted: the counters are per
    training step.
    """

    def __init__(self, state: CommState, units: Sequence[Unit], topology: Topology, native_hsdp: bool = False):
        self.state, self.topology, self.native_hsdp = state, topology, native_hsdp
        self.handles = []
        for unit in units:
            self.handles.append(unit.module.register_forward_pre_hook(self._gathered(unit)))
            if native_hsdp:  # no all-reduce hook to count in: FSDP calls this after the unit's reduction
                first = unit.params[0]
                self.handles.append(first.register_post_accumulate_grad_hook(lambda _, u=unit: self.reduced(u)))

    def _gathered(self, unit: Unit):
        def count(module, args):
            group = param_group(unit.module)
            # not a training step's: evaluation, or compute calibration without reduction (model.no_sync())
            if not torch.is_grad_enabled() or self.topology.gpus_per_node == 1 or not group.reduce_grads:
                return
            times = 2 if getattr(group, "post_forward_mesh_info", None) is not None else 1
            self.state.add_bytes(times * (self.topology.gpus_per_node - 1) * unit.gather_nbytes, 0.0)

        return count

    def reduced(self, unit: Unit, shard_nbytes: int | None = None) -> None:
        """One unit's reduction: FSDP's reduce-scatter inside the node (and its HSDP all-reduce across)."""
        m = self.topology.gpus_per_node
        nbytes = shard_nbytes if shard_nbytes is not None else unit.numel * 4
        inter = allreduce_bytes(nbytes, self.topology.nodes) if self.native_hsdp else 0.0
        self.state.add_bytes(reduce_scatter_bytes(nbytes * m, m), inter)

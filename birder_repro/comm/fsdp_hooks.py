"""The 1-bit FSDP hooks' driver (:mod:`birder_repro.comm.fsdp`): a unit's work installed as FSDP2's all-reduce
hook of the unit, Step II's node flag, and where the work runs (inside the hook or on the state's
communication thread) with FSDP's divide undone around it.

Streams and order (:func:`runs_in_hook`). On CUDA the whole work of a unit runs inside the hook, on the
stream FSDP runs it on (its all-reduce stream, beside the compute stream: that is the overlap). So:

- every collective of a step is launched from the autograd thread, in FSDP's order (its reduce-scatters and
  all-gathers on the node's group; per unit, after its reduce-scatter, the flag's all-reduce on the node's
  group, then the all-to-all and all-gather, or 1-bit Adam's collectives, on the replicate group), the same
  on every rank: NCCL asks that collectives on several communicators be launched in one order on every rank
  (a device-wide synchronisation, e.g. the caching allocator's ``cudaFree`` under memory pressure, can
  otherwise wait on a collective whose peers wait on this rank: a cycle across ranks);
- the node's flag is made and read on that one stream (no other stream reads it, so no ``record_stream``
  is needed; made there and read on a side stream, its block could be handed to the next unit's flag while
  the side stream still waits behind the inter-node exchange);
- what FSDP does with the shard after the hook (the gradients' views, adding to existing gradients, the event
  the optimizer waits on) is ordered after the work on that stream.

The hook blocks the host for nothing: NCCL collectives and Triton kernels are queued, and the flags are read
once per step (:mod:`birder_repro.comm.nonfinite`). On CPU (gloo's collectives block the host) with
``overlap=True`` the hook queues the work on the state's communication thread and returns; the shard's memory
is the gradients' (FSDP makes them views of it), so the work writes them in place later, and the first hook of
a backward pass queues an autograd callback that waits for every queued unit when backward ends
(``loss.backward()`` returns with the gradients final and raises any failure of the thread). Each group is then
used from one thread, in the same order on every rank: the node's group by the autograd thread (FSDP and the
flags), the replicate group by the communication thread (tests/test_fsdp_order.py records them); gloo has no
device-wide synchronisation to tie the two groups together.

FSDP's divide (:func:`fsdp_postdivide`). With an fp32 or bf16 reduce dtype FSDP averages in its
reduce-scatter and the hook gets the node average. With an fp16 reduce dtype (or ``set_force_sum_reduction_for_
comms(True)``, or a ``set_gradient_divide_factor``) it sums instead, dividing by a pre-factor before and a
post-factor after the hook: the hook would see post x the node average and its +-1 would come out divided by
post. So the hook divides the shard by FSDP's post-factor before its work and multiplies the result by it after,
and FSDP's own divide then leaves the node average in and the +-1 (1-bit Adam: the averaged momentum) out.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
import torch.distributed as dist

from birder_repro.comm.accounting import allreduce_bytes
from birder_repro.comm.fsdp_traffic import FsdpTraffic
from birder_repro.comm.fsdp_units import Unit, as_fsdp_module, param_group
from birder_repro.comm.nonfinite import local_flag
from birder_repro.comm.topology import Topology

__all__ = ["runs_in_hook", "UnitHooks", "fsdp_postdivide"]


def runs_in_hook(device, overlap: bool) -> bool:
    """Whether a unit's work runs inside FSDP's all-reduce hook (True) or on the state's communication thread.

    On CUDA always inside (module doc, Streams and order): every collective of a step is then launched from
    the autograd thread in FSDP's order, the same on every rank, as NCCL asks of several communicators; the
    node's flag is made and read on the one stream the hook runs on; and FSDP orders what it does with the
    shard after the hook (the gradients' views, their accumulation, the event the optimizer waits on) after
    the work. Nothing there blocks the host: NCCL collectives and Triton kernels are queued, the flags are read
    once per step. On CPU (gloo, whose collectives block the host) the thread keeps backward going."""
    return not overlap or torch.device(device).type == "cuda"


class UnitHooks:
    """Installs ``work(unit, shard, node_flag)`` as every unit's all-reduce hook, run inside the hook or by
    ``state.runner`` (:func:`runs_in_hook`); the thread's work is waited for when backward ends (module doc,
    Streams and order)."""

    def __init__(self, state, units: Sequence[Unit], topology: Topology, traffic: FsdpTraffic, work):
        self.state, self.topology, self.traffic, self.work = state, topology, traffic, work
        self.pending: list[torch.futures.Future] = []
        self.callback_queued = False
        for unit in units:
            as_fsdp_module(unit.module).set_all_reduce_hook(self._hook_of(unit))

    def _hook_of(self, unit: Unit) -> Callable[[torch.Tensor], None]:
        return lambda shard: self.hook(unit, shard)

    def hook(self, unit: Unit, shard: torch.Tensor) -> None:
        if shard.numel() != unit.numel:
            raise RuntimeError(
                f"FSDP unit {unit.index} ({type(unit.module).__name__}) reduced {shard.numel()} "
                f"elements, its parameters' shards hold {unit.numel}: every parameter of a unit "
                "must get a gradient in every step with the 1-bit FSDP hooks"
            )
        # FSDP summed (module doc, FSDP's divide): the work then runs here, between FSDP's two divides; on the
        # thread it would race the divide FSDP applies to the shard as soon as this hook returns.
        post = fsdp_postdivide(unit, shard)
        inside = runs_in_hook(shard.device, self.state.runner.overlap) or post != 1.0
        if not inside and any(p.grad is not None for p in unit.params):
            raise RuntimeError(
                f"FSDP unit {unit.index} ({type(unit.module).__name__}) already has gradients: FSDP "
                "would add the shard to them before the communication thread writes it; call "
                "optimizer.zero_grad(set_to_none=True) before each backward, or set overlap=False"
            )
        self.traffic.reduced(unit, shard.numel() * shard.element_size())
        flag, work = self._node_flag(shard)
        if inside:  # Step III now, on the hook's stream
            self._drain()  # units still queued on the thread first: one thread at a time on a group
            with torch.no_grad():
                if work is not None:
                    work.wait()
                if post != 1.0:
                    shard.div_(post)  # the node average in
                self.work(unit, shard, flag)
                if post != 1.0:
                    shard.mul_(post)  # FSDP's divide leaves the result
            return

        def run() -> torch.Tensor:
            if work is not None:
                work.wait()
            self.work(unit, shard, flag)
            return shard

        self.pending.append(self.state.runner.run(run, shard.device))
        if not self.callback_queued:
            self.callback_queued = True
            torch.autograd.Variable._execution_engine.queue_callback(self.wait)

    def _node_flag(self, shard: torch.Tensor):
        """Step II: this process's non-finite flag for the shard and, with several processes per node, their
        sum over the node under way (the work to wait for; None: nothing to wait for). Issued here, on the
        autograd thread, on the node's group, which FSDP's own collectives use from this thread too."""
        flag = local_flag(shard)
        if self.topology.intra_group is None:
            return flag, None
        work = dist.all_reduce(flag, group=self.topology.intra_group, async_op=True)
        self.state.add_bytes(allreduce_bytes(4, self.topology.gpus_per_node), 0.0)
        return flag, work

    def wait(self) -> None:
        """Every unit's work of this backward pass done (re-raises a failure of the communication thread)."""
        self.callback_queued = False
        self._drain()

    def _drain(self) -> None:
        pending, self.pending = self.pending, []
        for fut in pending:
            fut.wait()


def fsdp_postdivide(unit: Unit, shard: torch.Tensor) -> float:
    """The factor FSDP2 divides ``unit``'s reduce-scatter output by after its all-reduce hook (1.0: none; it
    averaged in the collective). Asked of FSDP's own rule (its private ``_get_gradient_divide_factors``, with
    the unit's reduce dtype, divide factor and forced-sum setting), so that it follows the torch in use."""
    from torch.distributed.fsdp._fully_shard import _fsdp_collectives

    group = param_group(unit.module)
    factor = getattr(group, "gradient_divide_factor", None)
    force_sum = bool(getattr(group, "force_sum_reduction_for_comms", False))
    if shard.dtype in (torch.float32, torch.bfloat16) and factor is None and not force_sum:
        return 1.0  # FSDP's AVG reduce-scatter (every torch with set_all_reduce_hook)
    try:
        rule = _fsdp_collectives._get_gradient_divide_factors
        _, post, _, _ = rule(
            group.mesh_info.shard_process_group, None, shard.dtype, shard.device.type, factor, force_sum
        )
    except Exception as err:  # any change of the private rule: refuse in one line, naming the setting
        raise RuntimeError(
            f"FSDP unit {unit.index} reduces in {shard.dtype} with a sum (fp16 reduce dtype, a gradient divide "
            "factor or forced sum reduction): this torch's FSDP does not say what it divides by after the hook "
            f"({type(err).__name__}: {err}); reduce in float32 (MixedPrecisionPolicy(reduce_dtype=torch.float32))"
        ) from err
    return float(post) if post else 1.0

"""DiLoCo's outer exchange through Birder's Hierarchical-1-bit-All-Reduce (``optim=diloco_1bit``).

DiLoCo (Douillard et al. 2023, Algorithm 1) averages the nodes' pseudo-gradients delta_i = theta_{t-1} - theta_i
every H steps; :mod:`birder_repro.comm.diloco` does it in fp32. Here the average goes through the exchange of
the Birder paper's section 4 (:class:`~birder_repro.comm.birder.BirderState`, its Steps III-IV reused as they
are), with a scale so that a pseudo-gradient, which is not in [-1, 1] as Birder's m/b is, can be sent as signs.
For the outer step t (n nodes of m processes; every process of a node holds the same delta, DDP having averaged
the node's gradients every step)::

    Step I     the node's delta, fp32, cut into m shards: this process keeps shard r (its local rank); no bytes
               (the node's processes hold the same vector: what Birder's reduce-scatter would average is there)
    scales     x = delta + e (e: the node's worker error of the shard, parameter units);
               S_j = (1 / n) sum_i mean_{elements of tensor j} |x_i|      one number per parameter tensor, summed
               (float64) over the shards inside the node and over the nodes (:func:`outer_scales`); every element
               of tensor j is scaled by S_j, the same on every node, so that the server may average signs
    Step II    worker (node i) on its shard: u = Q(x / S);  e = x - S u                       (error feedback)
    Step III   Birder's Step III unchanged: all-to-all of the packed u among the nodes, the server of chunk k
               (node k): y = mean_i u_i + e_bar / S;  u_bar = Q(y);  e_bar = S (y - u_bar);  all-gather
    Step IV    Birder's Step IV unchanged: the node's processes all-gather the packed shards and unpack
    result     S u_bar: the outer gradient every rank then hands to the outer Nesterov step

``optim.comm.rounding=nearest`` (the run's default, conf/optim/diloco_1bit.yaml) replaces Q by the deterministic
sign (+1 for a positive argument, else -1) at the worker and the server, EF-SignSGD's compressor: the same bytes,
no draws (it ended higher on digits and on Fashion-MNIST: docs/optimizers.md); the class's own default stays the
paper's stochastic Q.
Q is Birder's quantizer (Eq. (5): +1 with probability clip((x+1)/2, 0, 1)) with Birder's counter-based draws:
element j of the outer step t draws ``uniform(derive_seed(seed, t, "worker", node), position_j)`` as a worker
and ``uniform(derive_seed(seed, t, "server", 0), position_j)`` as the server, position_j being j's place among
all the model's parameters (:mod:`birder_repro.comm.birder`). The errors e (per node, this process's shard) and
e_bar (per server chunk) are kept in parameter units across outer steps, and in the checkpoint (the
:class:`~birder_repro.comm.buckets.BucketStore` of the model as one bucket). The scale is the l1 mean, the scale
of EF-SignSGD (Karimireddy et al., "Error Feedback Fixes SignSGD and other Gradient Compression Schemes", 2019,
Algorithm 1), over the error-compensated x as there: elements larger than it are clipped by Q and their excess
carried by the error, and an error that grows raises the scale that sends it.

Bytes per process per outer step across nodes: (n - 1) (P'/(8mn) + 1) in the all-to-all (a flag byte per chunk),
(n - 1) P'/(8mn) in the all-gather and 2 (n - 1)/n 8T for the T scales' sums (P' the model's P elements padded
to a multiple of 8mn): ~2 (n-1)/n P/(8m), 1/32 of DiLoCo's fp32 2 (n-1)/n 4P/m. Inside the node: the sums'
all-reduce, 2 (m-1)/m 8T, and the all-gather of the packed shards, (m - 1) P'/(8m). With one node nothing is
exchanged (the average of one is itself).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch
import torch.distributed as dist

from birder_repro.comm import kernels
from birder_repro.comm.accounting import allreduce_bytes
from birder_repro.comm.birder import BirderState
from birder_repro.comm.buckets import Bucket, BucketStore, Field, Level, require_buckets
from birder_repro.comm.diloco import DiLoCoState, diloco_hook, worker_buffers
from birder_repro.comm.nonfinite import local_flag
from birder_repro.comm.pack import pack_bits, unpack_signs
from birder_repro.comm.topology import Topology, announce_layout, resolve_topology
from birder_repro.optim.birder import bits_to_signs, stochastic_sign_bits

ROUNDINGS = ("stochastic", "nearest")  # optim.comm.rounding

__all__ = [
    "ROUNDINGS",
    "OuterExchange",
    "DiLoCoOneBitState",
    "attach_diloco_1bit",
    "attach_from_config",
    "outer_scales",
]


def outer_scales(abs_sums: torch.Tensor, numels: Sequence[int], nodes: int) -> torch.Tensor:
    """S_j = sum over the nodes of sum |x_j| / (n numel_j), in float32: the nodes' mean |element| of each tensor j
    (the l1 scale of EF-SignSGD; module doc). ``abs_sums``: the per-tensor sums of |x| (float64), already summed
    over the nodes."""
    count = torch.tensor([float(k) for k in numels], dtype=abs_sums.dtype, device=abs_sums.device)
    return (abs_sums / (float(nodes) * count)).float()


def tensor_sums(x: torch.Tensor, numels: Sequence[int], lo: int) -> torch.Tensor:
    """Per tensor j, the float64 sum of |x| over the elements of j that ``x`` holds: ``x`` is the padded flat
    model's range [lo, lo + len(x)) (tensors laid out in order, then padding)."""
    sums = torch.zeros(len(numels), dtype=torch.float64, device=x.device)
    start, hi = 0, lo + x.numel()
    for j, k in enumerate(numels):
        a, b = max(start, lo), min(start + k, hi)
        if a < b:
            sums[j] = x[a - lo : b - lo].double().abs().sum()
        start += k
    return sums


def element_scales(scales: torch.Tensor, numels: Sequence[int], padded: int) -> torch.Tensor:
    """Each element's scale in the padded flat model: S_j on tensor j's elements, 0 on the padding."""
    out = torch.zeros(padded, device=scales.device)
    total = sum(numels)
    out[:total] = torch.repeat_interleave(scales, torch.tensor(list(numels), device=scales.device))
    return out


class OuterExchange(BirderState):
    """Birder's hierarchical exchange with Step II replaced by the scaled quantization of the module doc.

    Its store keeps e (the worker's, this process's shard) and e_bar (this process's server chunk) in parameter
    units; :meth:`exchange` takes the node's flat outer gradient and returns S u_bar.
    """

    __slots__ = ("_scales", "rounding")

    def __init__(
        self,
        topology: Topology,
        seed: int,
        param_numels: Sequence[int],
        kernel_backend: str = "auto",
        rounding: str = "stochastic",
    ):
        if rounding not in ROUNDINGS:
            raise ValueError(f"optim.comm.rounding must be one of {', '.join(ROUNDINGS)}, got {rounding!r}")
        super().__init__(
            topology,
            scheme="hierarchical",
            seed=seed,
            param_numels=param_numels,
            kernel_backend=kernel_backend,
            overlap=False,  # the optimizer's step waits for the result anyway
            nonfinite="raise",
        )
        worker = Level(self.worker_group, self.worker_size, self.worker_rank)
        server = Level(self.server_group, self.server_size, self.server_rank)
        self.store = BucketStore([Field("e", (worker,)), Field("e_bar", (worker, server))], self.padding_multiple())
        self._scales = torch.zeros(0)
        self.rounding = rounding

    def exchange(self, flat: torch.Tensor, numels: Sequence[int], signature: tuple) -> torch.Tensor:
        """The average over the nodes of ``flat`` (P elements, the same on the node's processes, ``numels``: its
        tensors' sizes in order), compressed. Returns a new (P,) tensor."""
        with torch.no_grad():
            numel = flat.numel()
            bucket = self.store.bucket(0, numel, signature, flat.device)
            bucket.step += 1
            shard = bucket.padded // self.worker_size
            lo = self.worker_rank * shard
            g = torch.zeros(shard, device=flat.device)
            g[: max(0, min(numel - lo, shard))] = flat[lo : lo + shard]
            sums = tensor_sums(g + bucket.state["e"], numels, lo)
            for group, size, where in (
                (self.worker_group, self.worker_size, 0),
                (self.server_group, self.server_size, 1),
            ):
                if group is not None:
                    with self.timing("comm", flat.device):
                        dist.all_reduce(sums, group=group)
                    nbytes = allreduce_bytes(sums.numel() * sums.element_size(), size)
                    self.add_bytes(*((nbytes, 0.0) if where == 0 else (0.0, nbytes)))
            scales = element_scales(outer_scales(sums, numels, self.server_size), numels, bucket.padded)
            self._scales = scales[lo : lo + shard]
            packed = self._step2_worker(bucket, g)
            e_bar = bucket.state["e_bar"]
            chunk_lo = e_bar.numel() * (self.worker_rank * self.server_size + self.server_rank)
            chunk_scales = scales[chunk_lo : chunk_lo + e_bar.numel()]
            e_bar.div_(torch.where(chunk_scales > 0, chunk_scales, 1.0))  # the server works in units of S
            shard_packed, flag = self._step3_server(packed, bucket, local_flag(g))
            e_bar.mul_(chunk_scales)  # back to parameter units (0 where S is 0: nothing was sent there)
            if float(flag) > 0:
                raise FloatingPointError("diloco_1bit: a NaN or Inf in some node's outer gradient")
            out = torch.empty(numel, device=flat.device)
            self._step4_gather_node(shard_packed, bucket, out)
            self.calls += 1
            return out.mul_(scales[:numel])

    def _step2_worker(self, bucket: Bucket, g: torch.Tensor) -> torch.Tensor:
        """Step II for an outer gradient: x = g + e; u = Q(x / S); e = x - S u (module doc). Returns u packed."""
        e, s = bucket.state["e"], self._scales
        with self.timing("compress", g.device):
            seed, where = self._draws(
                bucket, "worker", self.worker_rank * e.numel(), (self.worker_rank + 1) * e.numel()
            )
            x = g.add_(e)
            if self.rounding == "nearest":
                bits = x > 0
            else:
                rand = kernels.uniform(seed, where.positions(0, e.numel(), g.device))
                bits = stochastic_sign_bits(x / torch.where(s > 0, s, 1.0), rand)
            torch.sub(x, torch.where(bits, s, -s), out=e)
            return pack_bits(bits)

    def _server_compress(
        self, received: torch.Tensor, e_bar: torch.Tensor, seed: int, where: kernels.Segments, e_bar_out
    ) -> torch.Tensor:
        """Birder's server step (stochastic rounding), or with ``rounding=nearest`` its deterministic sign:
        y = mean + e_bar, u_bar = sign(y) (+1 for y > 0), e_bar = y - u_bar."""
        if self.rounding == "stochastic":
            return super()._server_compress(received, e_bar, seed, where, e_bar_out)
        y = unpack_signs(received).sum(dim=0).div_(received.shape[0]).add_(e_bar)
        bits = y > 0
        torch.sub(y, bits_to_signs(bits), out=e_bar if e_bar_out is None else e_bar_out)
        return pack_bits(bits)


class DiLoCoOneBitState(DiLoCoState):
    """DiLoCo's hook state (the node's fp32 average every step) whose outer average goes through
    :class:`OuterExchange`; its bytes and seconds are counted in this state's counters."""

    __slots__ = ("exchange", "numels")

    def __init__(
        self,
        topology: Topology,
        seed: int,
        param_numels: Sequence[int],
        kernel_backend: str = "auto",
        rounding: str = "stochastic",
        buffers: Sequence[torch.Tensor] = (),
    ):
        super().__init__(topology, buffers)  # the buffers: averaged exactly at each sync, as DiLoCo's
        self.numels = [int(k) for k in param_numels]
        if rounding not in ROUNDINGS:
            raise ValueError(f"optim.comm.rounding must be one of {', '.join(ROUNDINGS)}, got {rounding!r}")
        self.exchange = (
            OuterExchange(topology, seed, self.numels, kernel_backend, rounding)
            if topology.nodes > 1 and self.numels
            else None
        )

    @property
    def store(self) -> BucketStore | None:
        """The errors (for the run's memory figures)."""
        return None if self.exchange is None else self.exchange.store

    def average_over_nodes(self, tensors: list[torch.Tensor]) -> None:
        """Replace ``tensors`` (the model's outer gradient, one per parameter, the same on the node's processes)
        by their compressed average over the nodes, in place (module doc)."""
        self.outer_steps += 1
        ex = self.exchange
        if ex is None or not tensors:
            return
        if [t.numel() for t in tensors] != self.numels:
            raise ValueError("diloco_1bit: the outer gradient's tensors are not the model's parameters")
        before = ex.snapshot()
        flat = torch.cat([t.reshape(-1).float() for t in tensors])
        signature = tuple((i, off, k) for i, (off, k) in enumerate(zip(_offsets(self.numels), self.numels)))
        result = ex.exchange(flat, self.numels, signature)
        after = ex.snapshot()
        self.add_bytes(
            after["intra_node_bytes"] - before["intra_node_bytes"],
            after["inter_node_bytes"] - before["inter_node_bytes"],
        )
        for what in ("compress", "comm"):
            key = "compress_seconds" if what == "compress" else "collective_seconds"
            self.add_seconds(what, after[key] - before[key])
        offset = 0
        for t in tensors:
            t.copy_(result[offset : offset + t.numel()].view_as(t))
            offset += t.numel()

    def state_dict(self) -> dict[str, Any]:
        return {
            **super().state_dict(),  # the counters and the buffers, each process's and the synced ones
            "scheme": "diloco_1bit",
            "exchange": None if self.exchange is None else self.exchange.state_dict(),
        }

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        super().load_state_dict(state_dict)
        saved = state_dict.get("exchange")
        if (saved is None) != (self.exchange is None):
            raise ValueError("diloco_1bit: the checkpoint's hook state was saved on another number of nodes")
        if self.exchange is not None and saved is not None:
            self.exchange.load_state_dict(saved)


def _offsets(numels: Sequence[int]) -> list[int]:
    out, total = [], 0
    for k in numels:
        out.append(total)
        total += k
    return out


def attach_diloco_1bit(
    ddp_model: torch.nn.parallel.DistributedDataParallel,
    optimizer,
    gpus_per_node: int | None = None,
    topology: Topology | None = None,
    kernel_backend: str = "auto",
    rounding: str = "stochastic",
) -> DiLoCoOneBitState:
    """Make ``ddp_model`` average inside the node only (DiLoCo's hook) and have ``optimizer`` (a
    :class:`birder_repro.optim.diloco_1bit.DiLoCo1bit`) average its outer step over the nodes through the
    1-bit exchange. ``rounding``: ``stochastic`` (Birder's quantizer Q, the default) or ``nearest`` (the sign,
    deterministic, at the worker and the server). Collective: call it on every rank."""
    from birder_repro.optim.diloco_1bit import DiLoCo1bit  # at call time: optim.diloco_1bit imports this module

    require_buckets(ddp_model, "attach_diloco_1bit")
    if not isinstance(optimizer, DiLoCo1bit):
        raise TypeError(f"attach_diloco_1bit needs a DiLoCo1bit optimizer, got {type(optimizer).__name__}")
    kernel_backend = kernels.check_backend(kernel_backend, next(ddp_model.module.parameters()).device)
    topology, source, guessed = resolve_topology(gpus_per_node, topology)
    buffers = worker_buffers(ddp_model, topology, "attach_diloco_1bit")
    announce_layout(
        f"attach_diloco_1bit (H={optimizer.local_steps})", topology, source, between_nodes=True, guessed=guessed
    )
    numels = [p.numel() for p in optimizer._params()]
    state = DiLoCoOneBitState(topology, optimizer.seed, numels, kernel_backend, rounding, buffers)
    ddp_model.register_comm_hook(state, diloco_hook)
    optimizer.hook_state = state
    return state


def attach_from_config(ddp_model, optimizer, cfg: Mapping[str, Any], topology: Topology, scheme: str = "diloco_1bit"):
    """The runner's entry (birder_repro.comm.attach_comm): the layout is the run's topology."""
    if scheme != "diloco_1bit":
        raise ValueError(f"birder_repro.comm.diloco_onebit handles scheme 'diloco_1bit', not {scheme!r}")
    comm = cfg.get("comm") or {}
    return attach_diloco_1bit(
        ddp_model,
        optimizer,
        topology=topology,
        kernel_backend=str(comm.get("kernel_backend", "auto")),
        rounding=str(comm.get("rounding", "stochastic")),
    )

"""Every hook across processes (NCCL, one GPU each) against its single-process reference, and its byte counts.

The processes form ``nodes`` x ``gpus_per_node`` as the runner does (rank grouping), one per GPU. Each runs:

- Birder (``BirderState.allreduce_bucket``: Steps I-IV, the kernels, the collectives), every scheme and
  hierarchical with ``b_hat`` (Algorithm 1, line 6), 4 steps of two buckets whose sizes need padding; the
  gradients are multiples of 1/8, so the node averages are exact in any order and every rank's result must
  equal :class:`birder_repro.references.birder.ReferenceBirder` bit for bit;
- 1-bit Adam's compressed all-reduce (``comm.onebit_exchange.compressed_allreduce``), 3 steps, against
  :class:`birder_repro.references.onebit.CompressedAllReduceReference`: signs bit for bit, scales, errors and the
  average within 1e-5 (the norms are sums in another order on the GPU);
- the counted fp32 all-reduce hook against DDP's own all-reduce (bit for bit: the same collective), and the fp16
  hook within fp16 rounding of it;
- the hooks as a training script attaches them to DDP (``attach_birder`` with its communication thread and, on
  CUDA, its side stream; ``attach_onebit`` with 1-bit Adam and 1-bit LAMB through their freeze step): Birder's
  every bucket call replayed through the reference bit for bit, and every update exactly +-lr; 1-bit Adam's
  and LAMB's parameters after every step against :class:`~birder_repro.references.onebit.OneBitAdamReference`
  (:class:`~birder_repro.references.onebit.OneBitLambReference`) within 1e-5.

- Birder and 1-bit Adam as training runs them (:mod:`birder_repro.gpucheck.training`), compared by
  :mod:`birder_repro.gpucheck.training_checks` (:func:`check_training`).

Byte counts are checked against the formulas of :mod:`birder_repro.comm.accounting`. The same code runs with CPU
processes (the tests do): only the backend and the device differ. What each process runs is
:mod:`birder_repro.gpucheck.scenarios`; this module compares it.
"""

from __future__ import annotations

import torch

from birder_repro.comm.accounting import all_gather_bytes, all_to_all_bytes, flat_allreduce_split, reduce_scatter_bytes
from birder_repro.comm.pack import padded_size, unpack_signs
from birder_repro.gpucheck.scenarios import (
    BIRDER_SIZES,
    BIRDER_STEPS,
    BIRDER_VARIANTS,
    DDP_STEPS,
    ONEBIT_ADAM,
    ONEBIT_DDP_STEPS,
    ONEBIT_FREEZE,
    ONEBIT_LAMB,
    ONEBIT_SIZES,
    ONEBIT_STEPS,
    allreduce_model,
    birder_grads,
    layout,
    onebit_inputs,
    run_processes,
)
from birder_repro.gpucheck.table import FAIL, Check, failed_scenario, verdict
from birder_repro.gpucheck.training_checks import bucket_order, check_training

__all__ = [
    "birder_expected_bytes",
    "check_birder",
    "check_onebit",
    "check_allreduce",
    "check_birder_ddp",
    "check_onebit_ddp",
    "check_hooks",
    "layout",
]

FLAG_BYTES = 1  # Birder's non-finite flag: one byte more in each all-to-all chunk (comm/nonfinite.py)
SCALE_BYTES = 4  # 1-bit Adam's fp32 scale per worker and per server chunk


# ------------------------------------------------------------------------------------- the comparisons
def birder_expected_bytes(numel: int, nodes: int, m: int) -> tuple[float, float]:
    """(intra, inter) bytes one process sends for one hierarchical bucket (Birder paper, section 4): the fp32
    reduce-scatter in the node (with one fp32 flag a shard), the all-to-all of packed chunks (one flag byte
    each) and their all-gather among nodes, the all-gather of packed shards in the node."""
    padded = padded_size(numel, 8 * m * nodes)
    shard_bytes = padded // m // 8
    intra = reduce_scatter_bytes((padded + m) * 4, m) + all_gather_bytes(shard_bytes, m)
    inter = all_to_all_bytes(shard_bytes + nodes * FLAG_BYTES, nodes) + all_gather_bytes(shard_bytes // nodes, nodes)
    return intra, inter


def check_birder(per_rank: list[dict], nodes: int, m: int) -> list[Check]:
    from birder_repro.references.birder import ReferenceBirder

    failed = failed_scenario(per_rank, "birder")
    if failed:
        return [failed]
    rows, world = [], nodes * m
    for variant in BIRDER_VARIANTS:
        scheme = variant.partition("-")[0]
        ref = ReferenceBirder(
            nodes,
            m,
            scheme,
            beta=0.9,
            eps=1e-8,
            seed=7,
            param_numels=BIRDER_SIZES,
            amsgrad_after=2 if "amsgrad" in variant else None,
        )
        want = [
            ref.bucket(((bi, 0, n),), n, list(birder_grads(t, bi, world)))
            for t in range(BIRDER_STEPS)
            for bi, n in enumerate(BIRDER_SIZES)
        ]
        wrong = [
            (rank, i)
            for rank, r in enumerate(per_rank)
            for i, (got, w) in enumerate(zip(r["birder"][variant]["results"], want))
            if not torch.equal(got, w)
        ]
        rows.append(
            Check(
                "hooks",
                f"birder {variant}: {nodes}x{m} processes = reference",
                verdict(not wrong),
                measured="bit-identical"
                if not wrong
                else f"{len(wrong)} bucket results differ (first: rank {wrong[0][0]}, call {wrong[0][1]})",
                expected=f"{len(want)} bucket calls x {world} ranks equal",
            )
        )
    intra, inter = (sum(x) * BIRDER_STEPS for x in zip(*(birder_expected_bytes(n, nodes, m) for n in BIRDER_SIZES)))
    got = [(r["birder"]["hierarchical"]["intra"], r["birder"]["hierarchical"]["inter"]) for r in per_rank]
    ok = all(abs(a - intra) <= 1e-6 * max(1, intra) and abs(b - inter) <= 1e-6 * max(1, inter) for a, b in got)
    rows.append(
        Check(
            "hooks",
            f"birder hierarchical bytes, {nodes}x{m}",
            verdict(ok),
            measured=f"intra {got[0][0]:.0f}, inter {got[0][1]:.0f} B (rank 0)",
            expected=f"intra {intra:.0f}, inter {inter:.0f} B (comm.accounting)",
        )
    )
    return rows


def check_onebit(per_rank: list[dict]) -> list[Check]:
    from birder_repro.references.onebit import CompressedAllReduceReference

    failed = failed_scenario(per_rank, "onebit")
    if failed:
        return [failed]
    rows, world = [], len(per_rank)
    for numel in ONEBIT_SIZES:
        ref, problems = CompressedAllReduceReference(numel, world), []
        for step in range(ONEBIT_STEPS):
            inputs = [onebit_inputs(numel, step, r) for r in range(world)]
            want = ref([x for x, _ in inputs], inputs[0][1])
            for rank, r in enumerate(per_rank):
                got = r["onebit"][numel]["steps"][step]
                pairs = {
                    "result": (got["result"][:numel], want["result"]),
                    "worker scales": (got["worker_scales"], want["worker_scales"]),
                    "worker error": (got["worker_error"], ref.worker_errors[rank]),
                    "server error": (got["server_error"], ref.server_error[rank * ref.chunk :][: ref.chunk]),
                }
                problems += [
                    f"step {step} rank {rank}: {k}"
                    for k, (a, b) in pairs.items()
                    if not torch.allclose(a, b, rtol=1e-5, atol=1e-6)
                ]
                if not torch.equal(unpack_signs(got["worker_bits"]), want["worker_signs"][rank]):
                    problems.append(f"step {step} rank {rank}: worker signs")
                if not torch.equal(unpack_signs(got["server_bits"]).reshape(-1), want["server_signs"]):
                    problems.append(f"step {step} rank {rank}: server signs")
        rows.append(
            Check(
                "hooks",
                f"1-bit compressed all-reduce, {numel} elements, {world} processes = reference",
                verdict(not problems),
                measured="equal" if not problems else "; ".join(problems[:3]),
                expected="signs bit for bit; scales, errors, average within 1e-5",
            )
        )
        padded = padded_size(numel, 8 * world)
        expected = ONEBIT_STEPS * (
            all_to_all_bytes(padded // 8, world)
            + all_gather_bytes(padded // 8 // world, world)
            + 2 * all_gather_bytes(SCALE_BYTES, world)
        )
        got = [r["onebit"][numel]["bytes"] for r in per_rank]
        ok = all(abs(b - expected) < 1e-6 for b in got)
        rows.append(
            Check(
                "hooks",
                f"1-bit bytes, {numel} elements",
                verdict(ok),
                measured=f"{got[0]:.0f} B (rank 0)",
                expected=f"{expected:.0f} B (comm.accounting)",
            )
        )
    return rows


def check_allreduce(per_rank: list[dict], gpus_per_node: int) -> list[Check]:
    failed = failed_scenario(per_rank, "allreduce")
    if failed:
        return [failed]
    world = len(per_rank)
    numel = sum(p.numel() for p in allreduce_model("cpu").parameters())
    fp32_bytes = sum(flat_allreduce_split(numel * 4, world, gpus_per_node)) * DDP_STEPS
    rows = []
    for name, exact, nbytes in (("fp32", True, fp32_bytes), ("fp16", False, fp32_bytes / 2)):
        close = torch.equal if exact else (lambda a, b: torch.allclose(a, b, rtol=4e-3, atol=1e-4))
        steps = DDP_STEPS if exact else 1  # fp16 rounding changes the parameters after the first step
        ours = [r["allreduce"][name]["grads"] for r in per_rank]
        ddps = [r["allreduce"]["ddp"]["grads"] for r in per_rank]
        wrong = [
            (rank, s)
            for rank in range(world)
            for s in range(steps)
            if not all(close(a, b) for a, b in zip(ours[rank][s], ddps[rank][s]))
        ]
        rows.append(
            Check(
                "hooks",
                f"{name} all-reduce hook = DDP's all-reduce, {world} processes",
                verdict(not wrong),
                measured="equal" if not wrong else f"{len(wrong)} (rank, step) differ",
                expected="bit for bit (both scale by 1/n)" if exact else "within fp16 rounding (rtol 4e-3)",
            )
        )
        got = [r["allreduce"][name]["intra"] + r["allreduce"][name]["inter"] for r in per_rank]
        ok = all(abs(b - nbytes) < 1e-6 * nbytes for b in got)
        rows.append(
            Check(
                "hooks",
                f"{name} all-reduce bytes",
                verdict(ok),
                measured=f"{got[0]:.0f} B (rank 0)",
                expected=f"{nbytes:.0f} B (comm.accounting)",
            )
        )
    return rows


def check_birder_ddp(per_rank: list[dict], nodes: int, m: int) -> list[Check]:
    """Every bucket call of every rank through the reference, in the order the ranks made them."""
    from birder_repro.references.birder import ReferenceBirder

    failed = failed_scenario(per_rank, "birder_ddp")
    if failed:
        return [failed]
    runs = [r["birder_ddp"] for r in per_rank]
    ref = ReferenceBirder(nodes, m, "hierarchical", beta=0.9, eps=1e-8, seed=0, param_numels=runs[0]["numels"])
    problems = []
    if len({len(r["calls"]) for r in runs}) != 1:
        problems.append(f"the ranks made {sorted({len(r['calls']) for r in runs})} bucket calls")
    for i in range(min(len(r["calls"]) for r in runs)):
        signature, grad, _ = runs[0]["calls"][i]
        if any(r["calls"][i][0] != signature for r in runs):
            problems.append(f"call {i}: the ranks disagree on the bucket layout")
            break
        want = ref.bucket(signature, grad.numel(), [r["calls"][i][1] for r in runs])
        problems += [f"call {i}, rank {rank}" for rank, r in enumerate(runs) if not torch.equal(r["calls"][i][2], want)]
    problems += [f"rank {rank}: an update not +-lr" for rank, r in enumerate(runs) if not all(r["exact"])]
    problems += [
        f"rank {rank}: parameters differ across ranks" for rank, r in enumerate(runs) if not all(r["identical"])
    ]
    return [
        Check(
            "hooks",
            f"birder DDP hook (overlap {runs[0]['overlaps']}), {nodes}x{m} = reference",
            verdict(not problems),
            measured=f"{len(runs[0]['calls'])} bucket calls bit-identical" if not problems else "; ".join(problems[:3]),
            expected="every call = reference; updates +-lr; ranks identical",
        )
    ]


def check_onebit_ddp(per_rank: list[dict]) -> list[Check]:
    from birder_repro.references.onebit import OneBitAdamReference, OneBitLambReference

    failed = failed_scenario(per_rank, "onebit_ddp")
    if failed:
        return [failed]
    rows, world = [], len(per_rank)
    for name, cls, kwargs in (("adam", OneBitAdamReference, ONEBIT_ADAM), ("lamb", OneBitLambReference, ONEBIT_LAMB)):
        runs = [r["onebit_ddp"][name] for r in per_rank]
        ref = cls(runs[0]["initial"], [], world, freeze_step=ONEBIT_FREEZE, **kwargs)
        problems = []
        for step in range(ONEBIT_DDP_STEPS):
            ref.step([r["steps"][step]["grads"] for r in runs], bucket_order(runs[0]["steps"][step]["layout"]))
            want = torch.cat([x.reshape(-1) for x in ref.x])
            if not torch.allclose(runs[0]["steps"][step]["params"], want, rtol=1e-5, atol=1e-6):
                diff = float((runs[0]["steps"][step]["params"] - want).abs().max())
                problems.append(f"step {step + 1}: max difference {diff:.2e}")
            problems += [f"step {step + 1}: ranks differ" for r in runs[:1] if not r["steps"][step]["identical"]]
        rows.append(
            Check(
                "hooks",
                f"1-bit {name.upper() if name == 'lamb' else 'Adam'} DDP hook, {world} processes = reference",
                verdict(not problems),
                measured=f"{ONEBIT_DDP_STEPS} steps equal" if not problems else "; ".join(problems[:3]),
                expected=f"parameters within 1e-5 every step (freeze after {ONEBIT_FREEZE}); ranks identical",
            )
        )
    return rows


def check_hooks(
    world: int,
    backend: str = "nccl",
    training: bool = True,
    gpus_per_node: int | None = None,
    sanitizer: bool = False,
    stress: bool = False,
) -> list[Check]:
    """Every scenario on ``world`` processes (one spawn) as ``world // gpus_per_node`` nodes (default
    :func:`layout`), each compared with its reference and its byte formula; with ``training``, also Birder and
    1-bit Adam under DDP and FSDP2 in every precision (:mod:`.training`); with ``sanitizer``, under CSAN; with
    ``stress``, also the stream-ordering stress and the host-sync check (:mod:`.stress`) in the same processes.
    ``backend``: ``nccl`` (a GPU each), ``staged:cuda`` (all on one GPU), ``gloo`` or ``staged:cpu`` (CPUs)."""
    from birder_repro.gpucheck.scenarios import SCENARIOS
    from birder_repro.gpucheck.training import TRAINING

    m = gpus_per_node or layout(world)[1]
    nodes = world // m
    from birder_repro.gpucheck.stress import STRESS, check_stress

    names = (*SCENARIOS, *(TRAINING if training else ()), *(STRESS.values() if stress else ()))
    try:
        per_rank = run_processes(world, m, backend, names=names, sanitizer=sanitizer)
    except Exception as exc:  # noqa: BLE001 - processes that die (or time out) are one failed row
        return [Check("hooks", f"{nodes}x{m} {backend} processes", FAIL, detail=f"{type(exc).__name__}: {exc}")]
    rows = (
        check_birder(per_rank, nodes, m)
        + check_onebit(per_rank)
        + check_allreduce(per_rank, m)
        + check_birder_ddp(per_rank, nodes, m)
        + check_onebit_ddp(per_rank)
    )
    rows += check_training(per_rank, nodes, m) if training else []
    return rows + (check_stress(per_rank) if stress else [])

"""Birder and 1-bit Adam as training runs them (:mod:`birder_repro.gpucheck.training`), compared with their
single-process references: under DDP in fp32, bf16 and fp16 with GradScaler and under FSDP2 in fp32 and bf16,
every Birder call against the reference bit for bit (and, in fp32, FSDP2's parameters against DDP's), every
update +-lr; 1-bit Adam's parameters against its reference within 1e-5. :func:`check_training` is the hook
check's (:func:`birder_repro.gpucheck.hooks.check_hooks`) training section.
"""

from __future__ import annotations

import torch

from birder_repro.gpucheck.table import SKIP, Check, failed_scenario, verdict

__all__ = ["check_training", "check_birder_precisions", "check_onebit_precisions", "bucket_order"]


def bucket_order(layout: dict) -> list[list[int]]:
    """Parameter indices of each bucket in buffer order (the reference's layout of a step)."""
    return [[i for i, _, _ in sig] for _, sig in sorted(layout.items())]


def _birder_calls_rows(runs: list[dict], label: str, nodes: int, m: int) -> list[str]:
    """What is wrong with one precision's Birder run: each call against the reference, +-lr updates, ranks."""
    from birder_repro.gpucheck.training import LR
    from birder_repro.references.birder import ReferenceBirder

    ref = ReferenceBirder(nodes, m, "hierarchical", beta=0.9, eps=1e-8, seed=0, param_numels=runs[0]["numels"])
    problems = [f"rank {k}: {r['skipped']} steps skipped" for k, r in enumerate(runs) if r["skipped"]]
    if len({len(r["calls"]) for r in runs}) != 1 or not runs[0]["calls"]:
        problems.append(f"the ranks made {sorted({len(r['calls']) for r in runs})} calls")
    for i in range(min(len(r["calls"]) for r in runs)):
        signature, grad, _ = runs[0]["calls"][i]
        if signature is None:  # FSDP with 2+ processes a node: shards start inside parameters (see training.py)
            continue
        want = ref.bucket(signature, grad.numel(), [r["calls"][i][1] for r in runs])
        problems += [f"call {i}, rank {k}" for k, r in enumerate(runs) if not torch.equal(r["calls"][i][2], want)]
    params = runs[0]["params"]
    problems += [
        f"step {t + 2}: an update not +-lr"
        for t in range(len(params) - 1)
        if not torch.allclose((params[t + 1] - params[t]).abs(), torch.full_like(params[t], LR), atol=1e-6)
    ]
    problems += [f"rank {k}: ranks differ" for k, r in enumerate(runs) if not all(r["identical"])]
    return problems


def check_birder_precisions(per_rank: list[dict], nodes: int, m: int) -> list[Check]:
    """Birder under DDP and FSDP2 in each precision: every bucket (unit) call = the reference bit for bit, updates
    +-lr, ranks identical; in fp32 FSDP2's parameters = DDP's after every step, bit for bit."""
    from birder_repro.gpucheck.training import FSDP_PRECISIONS, PRECISIONS

    rows = []
    for key, label, precisions in (
        ("birder_ddp_precisions", "DDP", PRECISIONS),
        ("birder_fsdp_precisions", "FSDP2", FSDP_PRECISIONS),
    ):
        failed = failed_scenario(per_rank, key)
        if failed:
            rows.append(failed)
            continue
        for name in precisions:
            runs = [r[key][name] for r in per_rank]
            problems = _birder_calls_rows(runs, label, nodes, m)
            if label == "FSDP2" and name == "fp32" and "error" not in per_rank[0]["birder_ddp_precisions"]:
                ddp = [r["birder_ddp_precisions"]["fp32"]["params"] for r in per_rank]
                problems += [
                    f"rank {k} step {t + 1}: parameters differ from DDP's"
                    for k, r in enumerate(runs)
                    for t, (a, b) in enumerate(zip(r["params"], ddp[k]))
                    if not torch.equal(a, b)
                ]
            rows.append(
                Check(
                    "hooks",
                    f"birder {label}, {name}, {nodes}x{m} = reference",
                    verdict(not problems),
                    measured=f"{len(runs[0]['calls'])} calls bit-identical"
                    if not problems
                    else "; ".join(problems[:3]),
                    expected="every call = reference; +-lr; ranks identical"
                    + ("; = DDP bit for bit" if label == "FSDP2" and name == "fp32" else ""),
                )
            )
    return rows + [_fsdp_fp16_skip("birder")]


def _fsdp_fp16_skip(what: str) -> Check:
    return Check(
        "hooks",
        f"{what} FSDP2, fp16",
        SKIP,
        detail="train.precision=fp16 is refused under parallel=fsdp "
        "(birder_repro.train.parallel): the FSDP hooks do not take GradScaler's scale",
    )


def check_onebit_precisions(per_rank: list[dict], m: int = 1) -> list[Check]:
    """1-bit Adam under DDP and FSDP2 (the root its one unit) in each precision against the reference. Under
    FSDP2 with 2+ processes a node each exchanges its shard of every parameter, a layout this reference is not
    given here (tests/test_fsdp.py checks it on gloo): a skip row."""
    from birder_repro.gpucheck.training import FREEZE, FSDP_PRECISIONS, ONEBIT, PRECISIONS, TRAIN_STEPS
    from birder_repro.references.onebit import OneBitAdamReference

    rows, world = [], len(per_rank)
    for key, label in (("onebit_ddp_precisions", "DDP"), ("onebit_fsdp_precisions", "FSDP2")):
        if label == "FSDP2" and m > 1:
            rows.append(
                Check(
                    "hooks",
                    f"1-bit Adam FSDP2, {m} processes a node",
                    SKIP,
                    detail="shards inside a node: tests/test_fsdp.py compares that layout on gloo",
                )
            )
            continue
        failed = failed_scenario(per_rank, key)
        if failed:
            rows.append(failed)
            continue
        for name in FSDP_PRECISIONS if label == "FSDP2" else PRECISIONS:
            runs = [r[key][name] for r in per_rank]
            ref = OneBitAdamReference(
                runs[0]["initial"], [list(range(len(runs[0]["initial"])))], world, freeze_step=FREEZE, **ONEBIT
            )
            problems = [f"rank {k}: {r['skipped']} steps skipped" for k, r in enumerate(runs) if r["skipped"]]
            for step in range(TRAIN_STEPS):
                layout = bucket_order(runs[0]["layouts"][step]) if runs[0]["layouts"] else None
                ref.step([r["grads"][step] for r in runs], layout)
                want = torch.cat([x.reshape(-1) for x in ref.x])
                if not torch.allclose(runs[0]["params"][step], want, rtol=1e-5, atol=1e-6):
                    diff = float((runs[0]["params"][step] - want).abs().max())
                    problems.append(f"step {step + 1}: max difference {diff:.2e}")
            problems += [f"rank {k}: ranks differ" for k, r in enumerate(runs) if not all(r["identical"])]
            rows.append(
                Check(
                    "hooks",
                    f"1-bit Adam {label}, {name}, {world} processes = reference",
                    verdict(not problems),
                    measured=f"{TRAIN_STEPS} steps equal" if not problems else "; ".join(problems[:3]),
                    expected=f"parameters within 1e-5 every step (freeze after {FREEZE}); ranks identical",
                )
            )
    return rows + [_fsdp_fp16_skip("1-bit Adam")]


def check_training(per_rank: list[dict], nodes: int, m: int) -> list[Check]:
    return check_birder_precisions(per_rank, nodes, m) + check_onebit_precisions(per_rank, m)

"""Two checks of what the hooks' streams may get wrong on a GPU, run in the hook section's processes.

**Stream ordering under stress** (``stress_ordering``): Birder's hook with ``overlap`` on works on a side stream
and a communication thread while backward goes on. A missing wait (the hook reading a bucket before the
training stream wrote it, or the optimizer reading a result before the side stream wrote it) shows only when
the streams' timing changes, so the training stream is slowed on purpose: ``torch.cuda._sleep`` in backward
(a tensor hook on the first layer's output, so the last buckets' gradients come late) and before every
optimizer step. Then the parameters after :data:`STEPS` steps with overlap on must equal those with overlap off
(the hook's work inside backward, on the training stream) bit for bit on every rank. The negative control shows
that this slowdown exposes a missing wait: a copy on a side stream that does not wait for the slowed stream's
write must read the old values (and with the wait, the new ones). Without a GPU there is nothing to slow: the
scenario says so and its rows are skips.

**Host syncs in backward** (``host_syncs``): after :data:`WARMUP` steps (the kernels compiled, the buckets
rebuilt), backward runs under ``torch.cuda.set_sync_debug_mode("error")``, which raises at a host sync (a
``.item()``, a copy to the host): the hooks must read nothing on the host per bucket (docs/gpus.md, "Host syncs
per step"). Only on NCCL: the staged backend's collectives copy through the host by design (a skip row).
"""

from __future__ import annotations

import torch
from torch import nn

from birder_repro.comm import attach_birder
from birder_repro.gpucheck.table import FAIL, PASS, SKIP, Check, verdict
from birder_repro.gpucheck.training import Layers, _batch, _kernels
from birder_repro.optim import Birder

__all__ = ["STRESS", "check_stress", "STEPS", "WARMUP", "SLEEP_CYCLES"]

STEPS, WARMUP = 4, 3
SLEEP_CYCLES = 20_000_000  # about 10-20 ms at a GPU's clock: longer than a tiny bucket's whole hook


def _slowed_run(topology, device: torch.device, overlap: bool) -> list[torch.Tensor]:
    torch.manual_seed(0)
    model = Layers().to(device)
    ids = [device] if device.type == "cuda" else None
    ddp = nn.parallel.DistributedDataParallel(model, bucket_cap_mb=0.0003, device_ids=ids)
    opt = Birder(ddp.parameters(), lr=1e-2, beta=0.9, weight_decay=0.0)
    state = attach_birder(ddp, opt, topology=topology, kernel_backend=_kernels(), overlap=overlap)
    first = model.layers[0]

    def slow_backward(module, args, output):
        output.register_hook(lambda g: (torch.cuda._sleep(SLEEP_CYCLES), g)[1])

    handle = first.register_forward_hook(slow_backward)
    try:
        for step in range(STEPS):
            x, y = _batch(topology.rank, step, device)
            nn.functional.mse_loss(ddp(x), y).backward()
            torch.cuda._sleep(SLEEP_CYCLES)  # the step's reads must wait for the training stream, slowed
            opt.step()
            opt.zero_grad(set_to_none=True)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        return [p.detach().to("cpu", copy=True) for p in model.parameters()]
    finally:
        handle.remove()
        state.close()


def _negative_control(device: torch.device) -> dict:
    """A side stream's copy of a tensor the slowed training stream writes: without a wait it must see the old
    values (the slowdown exposes a missing wait), with one the new."""
    main, side = torch.cuda.current_stream(device), torch.cuda.Stream(device)
    out = {}
    for waits in (False, True):
        x = torch.zeros(1 << 16, device=device)
        torch.cuda.synchronize(device)
        torch.cuda._sleep(SLEEP_CYCLES)
        x.fill_(1.0)
        with torch.cuda.stream(side):
            if waits:
                side.wait_stream(main)
            y = x.clone()
        torch.cuda.synchronize(device)
        out["with the wait" if waits else "without a wait"] = float(y.mean())
    return out


def stress_ordering(topology, device: torch.device) -> dict:
    if device.type != "cuda":
        return {"skip": "no GPU: nothing to slow (torch.cuda._sleep)"}
    return {
        "overlap": _slowed_run(topology, device, overlap=True),
        "inside": _slowed_run(topology, device, overlap=False),
        "control": _negative_control(device),
    }


def host_syncs(topology, device: torch.device) -> dict:
    import torch.distributed as dist

    if device.type != "cuda" or dist.get_backend() != "nccl":
        return {"skip": "needs NCCL (2+ GPUs): the staged backend's collectives copy through the host by design"}
    torch.manual_seed(0)
    ddp = nn.parallel.DistributedDataParallel(Layers().to(device), bucket_cap_mb=0.0003, device_ids=[device])
    opt = Birder(ddp.parameters(), lr=1e-2, beta=0.9, weight_decay=0.0)
    state = attach_birder(ddp, opt, topology=topology, kernel_backend=_kernels(), overlap=True)
    try:
        for step in range(WARMUP + 1):
            x, y = _batch(topology.rank, step, device)
            loss = nn.functional.mse_loss(ddp(x), y)
            if step == WARMUP:
                torch.cuda.synchronize(device)
                torch.cuda.set_sync_debug_mode("error")
            try:
                loss.backward()
            except RuntimeError as exc:
                return {"error_in_backward": str(exc).strip().splitlines()[0]}
            finally:
                torch.cuda.set_sync_debug_mode(0)
            opt.step()
            opt.zero_grad(set_to_none=True)
        return {"ok": True}
    finally:
        state.close()


STRESS = {"stress_ordering": stress_ordering, "host_syncs": host_syncs}


def check_stress(per_rank: list[dict], label: str = "") -> list[Check]:
    """The rows of both checks from what every rank returned."""
    rows = []
    ordering = [r.get("stress_ordering", {}) for r in per_rank]
    if any("error" in o for o in ordering):
        err = next(o["error"] for o in ordering if "error" in o).strip().splitlines()[-1]
        rows.append(Check("stress", "stream ordering under stress", FAIL, detail=err))
    elif any("skip" in o for o in ordering):
        rows.append(Check("stress", "stream ordering under stress", SKIP, detail=ordering[0].get("skip", "")))
    else:
        same = all(
            all(torch.equal(a, b) for a, b in zip(o["overlap"], o["inside"])) and len(o["overlap"]) == len(o["inside"])
            for o in ordering
        )
        rows.append(
            Check(
                "stress",
                "Birder, overlap on = off with the training stream slowed (torch.cuda._sleep)",
                verdict(same),
                measured="equal bit for bit" if same else "differ",
                expected="equal bit for bit on every rank",
            )
        )
        control = ordering[0]["control"]
        exposed = control["without a wait"] < 1.0 and control["with the wait"] == 1.0
        rows.append(
            Check(
                "stress",
                "negative control: a side stream's read without a wait while the training stream is slowed",
                verdict(exposed),
                measured=", ".join(f"{k}: mean {v:g}" for k, v in control.items()),
                expected="without a wait < 1 (old values), with the wait = 1",
                detail="" if exposed else "the slowdown did not expose a missing wait: the stress proves nothing",
            )
        )
    syncs = [r.get("host_syncs", {}) for r in per_rank]
    name = "no host sync in backward (set_sync_debug_mode('error') after warm-up)"
    if any("error" in s or "error_in_backward" in s for s in syncs):
        bad = next(s for s in syncs if "error" in s or "error_in_backward" in s)
        detail = bad.get("error_in_backward") or bad["error"].strip().splitlines()[-1]
        rows.append(Check("stress", name, FAIL, detail=detail))
    elif any("skip" in s for s in syncs):
        rows.append(Check("stress", name, SKIP, detail=syncs[0].get("skip", "")))
    else:
        rows.append(Check("stress", name, PASS, measured="none", expected="none"))
    return [Check(r.section, f"{label}{r.name}", r.status, r.measured, r.expected, r.detail) for r in rows]

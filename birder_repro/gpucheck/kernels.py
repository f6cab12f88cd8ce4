"""Birder's compression kernels on the GPU: bit for bit against the CPU backend, and timed against a copy.

:func:`compare_kernels` runs every entry point of :mod:`birder_repro.comm.kernels` (``worker_compress`` in place,
with ``b_hat``, with ``state_out``, with both, over a buffer of several parameter segments; ``server_compress``
in place and with ``e_bar_out``; ``unpack``) with one backend on ``device`` and with the reference backend on
copies of the same inputs on the CPU, and compares every output with ``torch.equal``: the packed bytes and each
state tensor, and their dtypes. Inputs are hard on purpose: zeros in g and b, b near eps, |m/b + e| past 1,
b_hat on both sides of b, a segment past 2^32.

:func:`time_kernels` times each kernel, called as the hook calls it, against a device-to-device copy of a float32
buffer of the bucket's
size (the HBM floor: 8 bytes moved per element) with CUDA events (``birder_repro.bench.kernels.time_op``), and reports
the ratio beside the ratio of the bytes each kernel must move: a kernel far above its byte ratio is not
memory-bound (or stalls the host inside it).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from birder_repro.bench.kernels import time_op
from birder_repro.comm import kernels
from birder_repro.gpucheck.table import FAIL, Check, verdict

BETA, EPS = 0.9, 1e-8
SEED = kernels.derive_seed(11, 3, "worker", 1)
SERVER_SEED = kernels.derive_seed(11, 3, "server", 0)
# Worker step bytes per element in place: reads g, m, b, e, writes m, b, e and 1/8 byte (b_hat: 5 read, 4 written)
BYTES_PER_ELEMENT = {
    "copy": 8.0,
    "worker": 28.125,
    "worker b_hat": 36.125,
    "worker state_out": 28.125,
    "server": None,
    "unpack": 4.125,
}
SLACK = 4.0  # a kernel passes its timing when it takes at most SLACK x its byte ratio + 1 copy


def segments_of(numel: int, count: int = 5) -> kernels.Segments:
    """``count`` segments of uneven sizes over a buffer of ``numel`` elements, the last past 2^32."""
    cuts = sorted({0, *[max(1, numel * k // (count + 1) - 3 * k) for k in range(1, count)]})
    offsets = [10_000 + 7 * i for i in range(len(cuts) - 1)] + [(1 << 32) + 17]
    return kernels.Segments(torch.tensor(cuts), torch.tensor(offsets))


def make_inputs(numel: int, workers: int = 2) -> dict[str, torch.Tensor]:
    """CPU inputs of one bucket (numel a multiple of 8): the worker's g, m, b, e, b_hat and the server's chunks."""
    gen = torch.Generator().manual_seed(numel + workers)
    g = torch.randn(numel, generator=gen)
    g[::7] = 0
    g[5::17] *= 1e4
    b = torch.rand(numel, generator=gen) * 0.2
    b[::11] = 0
    b[3::13] *= 1e-7  # b near eps: the rounding of b + eps matters
    return {
        "g": g,
        "m": torch.randn(numel, generator=gen) * 0.1,
        "b": b,
        "e": torch.randn(numel, generator=gen) * 0.7,
        "b_hat": torch.rand(numel, generator=gen) * 0.2,
        "received": torch.randint(0, 256, (workers, numel // 8), dtype=torch.uint8, generator=gen),
        "e_bar": torch.randn(numel, generator=gen) * 0.6,
    }


def _worker(b_hat: bool = False, state_out: bool = False, segmented: bool = False) -> Callable:
    def case(t: dict, backend: str) -> dict:
        state = [t["m"], t["b"], t["e"]] + ([t["b_hat"]] if b_hat else [])
        outs = [torch.full_like(s, float("nan")) for s in state] if state_out else None
        offset = segments_of(t["g"].numel()) if segmented else 123_456_789
        bits = kernels.worker_compress(
            t["g"],
            *state[:3],
            beta=BETA,
            eps=EPS,
            seed=SEED,
            offset=offset,
            backend=backend,
            b_hat=state[3] if b_hat else None,
            state_out=outs,
        )
        names = ["m", "b", "e", "b_hat"][: len(state)]
        new = dict(zip(names, outs if state_out else state))
        old = dict(zip([f"old {n}" for n in names], state)) if state_out else {}  # must be left whole
        return {"packed": bits, **new, **old}

    return case


def _server(e_bar_out: bool = False) -> Callable:
    def case(t: dict, backend: str) -> dict:
        out = torch.full_like(t["e_bar"], float("nan")) if e_bar_out else None
        bits = kernels.server_compress(
            t["received"],
            t["e_bar"],
            seed=SERVER_SEED,
            offset=segments_of(t["e_bar"].numel()),
            backend=backend,
            e_bar_out=out,
        )
        return {
            "packed": bits,
            "e_bar": out if e_bar_out else t["e_bar"],
            **({"old e_bar": t["e_bar"]} if e_bar_out else {}),
        }

    return case


def _unpack(t: dict, backend: str) -> dict:
    return {
        "signs": kernels.unpack(t["received"], backend=backend),
        "signs into out": kernels.unpack(t["received"][0], backend=backend, out=torch.empty_like(t["g"])),
    }


CASES = {
    "worker": _worker(),
    "worker b_hat": _worker(b_hat=True),
    "worker state_out": _worker(state_out=True),
    "worker b_hat state_out": _worker(b_hat=True, state_out=True),
    "worker segments": _worker(segmented=True),
    "server segments": _server(),
    "server e_bar_out": _server(e_bar_out=True),
    "unpack": _unpack,
}


def _differences(got: dict, want: dict) -> list[str]:
    """What differs, output by output: dtype, shape, or the number of unequal elements."""
    if got.keys() != want.keys():
        return [f"outputs {sorted(got)} vs {sorted(want)}"]
    diffs = []
    for k in want:
        a, b = got[k].cpu(), want[k]
        if a.dtype != b.dtype or a.shape != b.shape:
            diffs.append(f"{k}: {a.dtype}{tuple(a.shape)} vs {b.dtype}{tuple(b.shape)}")
        elif not torch.equal(a, b):
            diffs.append(f"{k}: {int((a != b).sum())} of {b.numel()} differ")
    return diffs


def compare_kernels(
    numel: int,
    device: torch.device | str,
    backend: str = "triton",
    reference: str = "cpu",
    cases=None,
    workers: int = 2,
) -> list[Check]:
    """One row per case: ``backend`` on ``device`` against ``reference`` on the CPU, every output bit for bit."""
    device = torch.device(device)
    inputs = make_inputs(numel, workers)
    rows = []
    for name in cases or CASES:
        label = f"{name}, {numel:,} elements: {backend} on {device.type} = {reference} on cpu"
        try:
            got = CASES[name]({k: v.to(device, copy=True) for k, v in inputs.items()}, backend)
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            want = CASES[name]({k: v.clone() for k, v in inputs.items()}, reference)
        except Exception as exc:  # noqa: BLE001 - a kernel that does not run is a failed row, not a crash
            rows.append(Check("kernels", label, FAIL, detail=f"{type(exc).__name__}: {exc}"))
            continue
        diffs = _differences(got, want)
        rows.append(
            Check(
                "kernels",
                label,
                verdict(not diffs),
                measured="bit-identical" if not diffs else "; ".join(diffs),
                expected=f"{len(want)} outputs equal ({', '.join(want)})",
            )
        )
    return rows


def _ops(t: dict, backend: str, step: list) -> dict[str, Callable[[], object]]:
    """The timed calls as the hook makes them: a fresh seed per call (the hook draws one per step), and one
    Segments of several parameters kept across calls (the hook keeps one per bucket, its table on the device)."""
    out = {k: torch.empty_like(t["g"]) for k in ("m2", "b2", "e2", "copy")}
    seg = segments_of(t["g"].numel())

    def seed(role):
        step[0] += 1
        return kernels.derive_seed(0, step[0], role, 0)

    return {
        "copy": lambda: out["copy"].copy_(t["g"]),
        "worker": lambda: kernels.worker_compress(
            t["g"], t["m"], t["b"], t["e"], BETA, EPS, seed("worker"), seg, backend=backend
        ),
        "worker b_hat": lambda: kernels.worker_compress(
            t["g"], t["m"], t["b"], t["e"], BETA, EPS, seed("worker"), seg, backend=backend, b_hat=t["b_hat"]
        ),
        "worker state_out": lambda: kernels.worker_compress(
            t["g"],
            t["m"],
            t["b"],
            t["e"],
            BETA,
            EPS,
            seed("worker"),
            seg,
            backend=backend,
            state_out=(out["m2"], out["b2"], out["e2"]),
        ),
        "server": lambda: kernels.server_compress(t["received"], t["e_bar"], seed("server"), seg, backend=backend),
        "unpack": lambda: kernels.unpack(
            t["received"].reshape(-1)[: t["g"].numel() // 8], backend=backend, out=out["copy"]
        ),
    }


def time_kernels(
    numel: int,
    device: torch.device | str,
    backend: str = "triton",
    repeats: int = 20,
    warmup: int = 3,
    workers: int = 2,
) -> list[Check]:
    """One row per kernel: its time per call against the copy's, and the ratio of the bytes each moves."""
    device = torch.device(device)
    t = {k: v.to(device) for k, v in make_inputs(numel, workers).items()}
    ops = _ops(t, backend, [0])
    for fn in ops.values():  # compilation, allocator, and the first calls' variants
        for _ in range(warmup):
            fn()
    seconds = {name: time_op(fn, device, repeats) for name, fn in ops.items()}
    rows = []
    for name, s in seconds.items():
        if name == "copy":
            continue
        per_element = BYTES_PER_ELEMENT[name] or (workers / 8 + 8 + 1 / 8)  # server: chunks, e_bar, bits
        floor = per_element / BYTES_PER_ELEMENT["copy"]
        ratio = s / seconds["copy"]
        gbps = per_element * numel / s / 1e9
        rows.append(
            Check(
                "kernels",
                f"{name} time, {numel:,} elements ({backend}, {repeats} calls)",
                verdict(ratio <= SLACK * floor + 1),
                measured=f"{s * 1e3:.3f} ms = {ratio:.2f}x copy ({gbps:.0f} GB/s)",
                expected=f"<= {SLACK * floor + 1:.2f}x copy (bytes: {floor:.2f}x; copy {seconds['copy'] * 1e3:.3f} ms)",
                numbers={
                    "seconds": s,
                    "copy_seconds": seconds["copy"],
                    "ratio": ratio,
                    "bytes_ratio": floor,
                    "gb_per_s": gbps,
                },
            )
        )
    return rows

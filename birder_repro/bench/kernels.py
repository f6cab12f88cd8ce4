"""``make bench``: Birder's compression and decompression, per kernels backend, against a copy of the same buffer.

For a ResNet-50-sized (25.6M) and a BERT-base-sized (110M) fp32 bucket on one process (the collectives are not
timed here: that is what the emulated cluster is for), each backend of :mod:`birder_repro.comm.kernels`
available on the device is timed on:

    compression    Step II (m, b, e updates, stochastic sign, pack) and the server's part of Step III (unpack
                   the n nodes' chunks, average, re-quantize with e_bar, pack), n = --nodes;
    decompression  Step IV's unpack of the whole bucket to +-1 into a fresh tensor, against ``buffer.clone()``;
    into buffer    the same unpack into an existing tensor (``out=``), against ``out.copy_(buffer)``.

Beside the backends: ``copy`` (the reference row, ratio 1) and ``torch.rand``, the optimizer's own
functions with ``torch.rand`` uniforms (what the hook ran before the counter-based kernels). Each round times
everything back to back; the medians over rounds are reported, with the ratios to the copies. The torch
backend is the bit-exact reference and slow on CPU, so it runs ``--torch-rounds`` rounds.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch

from birder_repro.comm import kernels
from birder_repro.comm.pack import pack_bits, padded_size, unpack_signs
from birder_repro.optim.birder import server_step_, worker_step_

SIZES = {"resnet50 (25.6M)": 25_557_032, "bert-base (110M)": 109_482_240}
OPS = ("compress", "decompress", "into")


def time_op(fn: Callable[[], object], device: torch.device, repeats: int = 1) -> float:
    """Seconds per call of ``fn``, called ``repeats`` times back to back.

    On CUDA: the device is synchronized first (nothing queued before counts), the calls are bracketed by CUDA
    events on the current stream (the GPU's own clock; no host synchronization between the calls, so the host
    may queue ahead as it does in training) and the end event is waited for. On CPU: ``time.perf_counter``."""
    if device.type != "cuda":
        t0 = time.perf_counter()
        for _ in range(repeats):
            fn()
        return (time.perf_counter() - t0) / repeats
    torch.cuda.synchronize(device)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(repeats):
        fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / 1e3 / repeats


def _time(fn: Callable[[], object], device: torch.device) -> float:
    return time_op(fn, device)


def _backend_ops(backend: str, g, received, nodes: int, packed_result, out) -> dict[str, Callable[[], object]]:
    """compress / decompress / into for one kernels backend, on its own fresh state."""
    m, b, e = (torch.zeros_like(g) for _ in range(3))
    e_bar = torch.zeros(g.numel() // nodes, device=g.device)
    step = [0]

    def compress():
        step[0] += 1
        kernels.worker_compress(g, m, b, e, seed=kernels.derive_seed(0, step[0], "worker", 0), backend=backend)
        kernels.server_compress(received, e_bar, seed=kernels.derive_seed(0, step[0], "server", 0), backend=backend)

    return {
        "compress": compress,
        "decompress": lambda: kernels.unpack(packed_result, backend=backend),
        "into": lambda: kernels.unpack(packed_result, backend=backend, out=out),
    }


def _torch_rand_ops(g, received, nodes: int, packed_result, out) -> dict[str, Callable[[], object]]:
    """The optimizer's functions with torch.rand uniforms, as the hook composed them before the kernels."""
    m, b, e = (torch.zeros_like(g) for _ in range(3))
    e_bar = torch.zeros(g.numel() // nodes, device=g.device)
    gen = torch.Generator(device=g.device).manual_seed(0)

    def compress():
        rand = torch.rand(g.numel(), generator=gen, device=g.device)
        pack_bits(worker_step_(g, m, b, e, rand, beta=0.95, eps=1e-8))
        mean = unpack_signs(received).mean(dim=0)
        pack_bits(server_step_(mean, e_bar, torch.rand(mean.numel(), generator=gen, device=g.device)))

    return {
        "compress": compress,
        "decompress": lambda: unpack_signs(packed_result),
        "into": lambda: out.copy_(unpack_signs(packed_result)),
    }


def bench_bucket(
    numel: int, nodes: int, rounds: int, device: torch.device, torch_rounds: int = 1, backends=None
) -> dict[str, dict]:
    """Median seconds per row (copy, each backend, torch.rand) and op (compress, decompress, into)."""
    padded = padded_size(numel, 8 * nodes)
    gen = torch.Generator(device=device).manual_seed(0)
    g = torch.randn(padded, device=device, generator=gen)
    received = pack_bits(torch.rand(padded, device=device, generator=gen) < 0.5).view(nodes, -1)
    packed_result = received.reshape(-1).clone()
    out = torch.empty(padded, device=device)
    if backends is None:  # the interpreter is far too slow to time: triton only on a GPU
        backends = [b for b in kernels.available_backends(device) if device.type == "cuda" or b != "triton"]
    rows = {"copy": {"compress": g.clone, "decompress": g.clone, "into": lambda: out.copy_(g)}}
    rows.update({name: _backend_ops(name, g, received, nodes, packed_result, out) for name in backends})
    rows["torch.rand"] = _torch_rand_ops(g, received, nodes, packed_result, out)
    limit = {name: torch_rounds if name == "torch" else rounds for name in rows}
    for name, ops in rows.items():  # warm-up: compilation, allocator, lookup tables
        if name != "torch":
            for op in OPS:
                ops[op]()
    times = {name: {op: [] for op in OPS} for name in rows}
    for r in range(rounds):
        for name, ops in rows.items():
            if r < limit[name]:
                for op in OPS:
                    times[name][op].append(_time(ops[op], device))
    result = {name: {op: statistics.median(t) for op, t in per.items()} for name, per in times.items()}
    for name in rows:
        result[name]["threads"] = _threads(name, device)
        result[name]["rounds"] = min(rounds, limit[name])
    return result


def _threads(name: str, device: torch.device):
    if name in kernels.BACKENDS:
        return kernels.backend_threads(name, device)
    return "gpu" if device.type == "cuda" else torch.get_num_threads()


def _size(text: str) -> tuple[str, int]:
    if text in SIZES:
        return text, SIZES[text]
    try:
        return f"{int(text):,}", int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"size must be one of {sorted(SIZES)} or a number of elements") from None


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--torch-rounds", type=int, default=1, help="rounds of the (slow) torch reference")
    parser.add_argument("--nodes", type=int, default=2, help="nodes whose chunks the server step averages")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument(
        "--sizes",
        nargs="*",
        type=_size,
        default=list(SIZES.items()),
        help=f"bucket names ({', '.join(SIZES)}) or numbers of elements",
    )
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    print(
        f"birder-repro bench: device {device}, torch {torch.__version__}, {torch.get_num_threads()} CPU threads, "
        f"median of {args.rounds} rounds (torch reference: {min(args.rounds, args.torch_rounds)}), "
        f"server step over {args.nodes} nodes"
    )
    print(
        f"{'bucket':<18} {'row':<11} {'threads':>7} {'compress ms':>12} {'x copy':>7} {'decompress ms':>14} "
        f"{'x copy':>7} {'into buffer ms':>15} {'x copy_':>8}"
    )
    for label, numel in args.sizes:
        r = bench_bucket(numel, args.nodes, args.rounds, device, args.torch_rounds)
        c = r["copy"]
        for name, t in r.items():
            print(
                f"{label:<18} {name:<11} {t['threads']!s:>7} {t['compress'] * 1e3:12.1f} "
                f"{t['compress'] / c['compress']:7.1f} {t['decompress'] * 1e3:14.1f} "
                f"{t['decompress'] / c['decompress']:7.2f} {t['into'] * 1e3:15.1f} {t['into'] / c['into']:8.2f}"
            )


if __name__ == "__main__":
    main()

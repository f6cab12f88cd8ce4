"""``make bench``: the Birder hook's compression and decompression against a copy of the same fp32 buffer.

For a ResNet-50-sized (25.6M) and a BERT-base-sized (110M) bucket, on one process (the collectives are not
timed here: that is what the emulated cluster is for), this times with the hook's own functions:

    compression    Step II (m, b, e updates, stochastic sign, pack) and the server's part of Step III
                   (unpack the n chunks, average, re-quantize with e_bar, pack), n = --nodes;
    decompression  Step IV's unpack of the whole bucket to +-1;
    copy           ``buffer.clone()`` of the same fp32 bucket, timed in the same rounds.

Each round times all three back to back; the medians over rounds are reported, with the ratios to the copy.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from birder_repro.comm.pack import pack_bits, padded_size, unpack_signs
from birder_repro.optim.birder import server_step_, worker_step_

SIZES = {"resnet50 (25.6M)": 25_557_032, "bert-base (110M)": 109_482_240}


def _time(fn, device) -> float:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    t0 = time.perf_counter()
    fn()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter() - t0


def bench_bucket(numel: int, nodes: int, rounds: int, device: torch.device) -> dict[str, float]:
    """Median seconds of compression, decompression and copy for one bucket of ``numel`` elements."""
    padded = padded_size(numel, 8 * nodes)
    gen = torch.Generator(device=device).manual_seed(0)
    g = torch.randn(padded, device=device, generator=gen)
    m, b, e = (torch.zeros(padded, device=device) for _ in range(3))
    e_bar = torch.zeros(padded // nodes, device=device)
    received = pack_bits(torch.rand(padded, device=device, generator=gen) < 0.5)  # n chunks of P/n from n nodes
    packed_result = received.clone()

    def compress():
        rand = torch.rand(padded, generator=gen, device=device)
        pack_bits(worker_step_(g, m, b, e, rand, beta=0.95, eps=1e-8))
        mean = unpack_signs(received.view(nodes, -1)).mean(dim=0)
        pack_bits(server_step_(mean, e_bar, torch.rand(mean.numel(), generator=gen, device=device)))

    def decompress():
        unpack_signs(packed_result)

    def copy():
        g.clone()

    compress(), decompress(), copy()  # warm-up: allocator, lookup table
    times = {"compression": [], "decompression": [], "copy": []}
    for _ in range(rounds):
        times["compression"].append(_time(compress, device))
        times["decompression"].append(_time(decompress, device))
        times["copy"].append(_time(copy, device))
    return {k: statistics.median(v) for k, v in times.items()}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--nodes", type=int, default=2, help="nodes whose chunks the server step averages")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--sizes", nargs="*", choices=sorted(SIZES), default=list(SIZES))
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    print(f"birder-repro bench: device {device}, torch {torch.__version__}, {torch.get_num_threads()} CPU threads, "
          f"median of {args.rounds} rounds, server step over {args.nodes} nodes")
    print(f"{'bucket':<20} {'copy ms':>9} {'compress ms':>12} {'x copy':>7} {'decompress ms':>14} {'x copy':>7}")
    for name in args.sizes:
        r = bench_bucket(SIZES[name], args.nodes, args.rounds, device)
        c = r["copy"]
        print(f"{name:<20} {c * 1e3:9.1f} {r['compression'] * 1e3:12.1f} {r['compression'] / c:7.1f} "
              f"{r['decompression'] * 1e3:14.1f} {r['decompression'] / c:7.1f}")


if __name__ == "__main__":
    main()

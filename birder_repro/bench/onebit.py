"""``python -m birder_repro.bench.onebit``: the 1-bit Adam hook's compression time per DDP bucket with one scale
per bucket against one per tensor (``optim.comm.scale``), side by side in one run.

ResNet-50's parameters (torchvision, 161 tensors, 25.6M elements) are cut into DDP's buckets as DDP cuts them
(reverse parameter order, ``--bucket-cap-mb``, 25 by default as the hook's config). For each bucket, each round
runs the compressed all-reduce once with each scale, back to back, on a one-process gloo group, and reads the
seconds the hook itself times as compression (its ``compress_seconds``: worker compression, the server's
average and re-compression, the unpack; not the collectives, which are local copies here). With one process,
the server's chunk is the whole bucket, so the server side has every tensor's segment: the per-tensor scale's
most work. The medians over rounds are reported per bucket, and the ratio of their sums.
"""

from __future__ import annotations

import argparse
import os
import statistics

import torch
import torch.distributed as dist

from birder_repro.comm.onebit_exchange import compressed_allreduce
from birder_repro.comm.onebit_scales import compressed_allreduce_per_tensor, tensor_layout
from birder_repro.comm.pack import padded_size
from birder_repro.comm.state import CommState


def resnet50_buckets(cap_mb: float) -> list[tuple]:
    """DDP's bucket signatures ((parameter, offset, numel), ...) for ResNet-50 at ``cap_mb`` MiB per bucket."""
    from torchvision.models import resnet50

    sizes = [p.numel() for p in resnet50(weights=None).parameters()]
    buckets, current, filled = [], [], 0
    for index in reversed(range(len(sizes))):  # DDP fills buckets in reverse order of the parameters
        current.append((index, filled, sizes[index]))
        filled += sizes[index]
        if filled * 4 >= cap_mb * 2**20:
            buckets.append(tuple(current))
            current, filled = [], 0
    if current:
        buckets.append(tuple(current))
    return buckets


def time_bucket(signature: tuple, rounds: int) -> dict[str, float]:
    """Median compression seconds of one bucket per scale, the two timed alternately in each round."""
    numel = sum(n for _, _, n in signature)
    padded = padded_size(numel, 8)
    mask = torch.zeros(padded)
    mask[:numel] = 1.0
    x = torch.randn(padded) * mask
    layout = tensor_layout(signature, padded, mask, 1, 0)
    errors = {s: (torch.zeros(padded), torch.zeros(padded)) for s in ("bucket", "tensor")}
    seconds: dict[str, list[float]] = {"bucket": [], "tensor": []}
    for _ in range(rounds):
        for scale in ("bucket", "tensor"):
            stats = CommState()
            if scale == "bucket":
                compressed_allreduce(x, *errors[scale], mask, stats=stats)
            else:
                compressed_allreduce_per_tensor(x, *errors[scale], mask, layout, stats=stats)
            seconds[scale].append(stats.compress_seconds)
    return {scale: statistics.median(s) for scale, s in seconds.items()}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bucket-cap-mb", type=float, default=25.0)
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--threads", type=int, default=1, help="torch's intra-op threads (1: a shared machine)")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29533")
    dist.init_process_group("gloo", rank=0, world_size=1)
    try:
        totals = {"bucket": 0.0, "tensor": 0.0}
        print(f"{'bucket':>6} {'tensors':>7} {'elements':>10} {'bucket scale ms':>15} {'tensor scale ms':>15} ratio")
        for i, sig in enumerate(resnet50_buckets(args.bucket_cap_mb)):
            t = time_bucket(sig, args.rounds)
            totals = {k: totals[k] + t[k] for k in totals}
            print(
                f"{i:>6} {len(sig):>7} {sum(n for _, _, n in sig):>10} {t['bucket'] * 1e3:>15.2f} "
                f"{t['tensor'] * 1e3:>15.2f} {t['tensor'] / t['bucket']:.3f}"
            )
        print(
            f"all buckets: tensor / bucket = {totals['tensor'] / totals['bucket']:.3f} "
            f"(medians of {args.rounds} rounds, {args.threads} thread(s), torch {torch.__version__})"
        )
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()

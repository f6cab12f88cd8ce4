"""Birder (or 1-bit Adam) in a plain DDP script: the reference every other example is compared with.

    torchrun --standalone --nproc-per-node=2 examples/plain_ddp.py --optim birder
    torchrun --standalone --nproc-per-node=2 examples/plain_ddp.py --optim birder --save ckpt --stop-at 4
    torchrun --standalone --nproc-per-node=2 examples/plain_ddp.py --optim birder --resume ckpt

Every rank saves its own file (model, optimizer and the hook's per-rank state: Birder's m, b, e shards, 1-bit
Adam's error buffers), so a run stopped and resumed ends with the same parameters as one left alone.
"""

import argparse
import os
import sys

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import toy

from birder_repro.comm import attach_birder, attach_onebit

parser = argparse.ArgumentParser()
parser.add_argument("--optim", choices=["birder", "onebit_adam"], default="birder")
parser.add_argument("--save", help="directory for one checkpoint file per rank, written after --stop-at steps")
parser.add_argument("--stop-at", type=int, default=toy.STEPS, help="stop (and --save) after this many steps")
parser.add_argument("--resume", help="directory --save wrote: continue from there to toy.STEPS")
parser.add_argument("--autocast", choices=["none", "bf16"], default="none", help="forward and loss under bf16 autocast")
args = parser.parse_args()

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
dataset = toy.make_dataset()
loader = DataLoader(dataset, batch_size=toy.BATCH, sampler=toy.make_sampler(dataset, rank, world))

ddp = DistributedDataParallel(toy.make_model())
opt = toy.make_optimizer(args.optim, ddp.parameters())
if args.optim == "birder":
    state = attach_birder(ddp, opt, gpus_per_node=toy.GPUS_PER_NODE)
else:
    state = attach_onebit(ddp, opt)

start = 0
if args.resume:  # this rank's own file: the hook state is per rank
    # One pass first, its gradients dropped: DDP rebuilds its buckets after its first backward, so the resumed
    # run then cuts gradients into the buckets the saved run had (1-bit Adam's scales are per bucket).
    x, y = next(iter(loader))
    torch.nn.functional.cross_entropy(ddp(x), y).backward()
    opt.zero_grad()
    saved = torch.load(os.path.join(args.resume, f"rank{rank:05d}.pt"), weights_only=True)
    ddp.module.load_state_dict(saved["model"])
    opt.load_state_dict(saved["optimizer"])
    state.load_state_dict(saved["hook"])
    start = saved["step"]

for step, (x, y) in enumerate(loader):
    if step < start:  # the same data order as a run left alone
        continue
    if step == args.stop_at or step == toy.STEPS:
        break
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=args.autocast == "bf16"):
        loss = torch.nn.functional.cross_entropy(ddp(x), y)
    loss.backward()
    opt.step()
    opt.zero_grad()

if args.save:
    os.makedirs(args.save, exist_ok=True)
    torch.save(
        {
            "model": ddp.module.state_dict(),
            "optimizer": opt.state_dict(),
            "hook": state.state_dict(),
            "step": min(args.stop_at, toy.STEPS),
        },
        os.path.join(args.save, f"rank{rank:05d}.pt"),
    )
state.close()
dist.destroy_process_group()
if rank == 0:
    print(f"fingerprint={toy.fingerprint(ddp.module)}", flush=True)

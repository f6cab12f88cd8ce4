"""Birder (or 1-bit Adam) with torch.compile under DDP, in three modes, compared with examples/plain_ddp.py.

    torchrun --standalone --nproc-per-node=2 examples/compiled_ddp.py --optim birder --mode compile

--mode eager:     no compilation (plain_ddp.py's loop);
--mode compile:   torch.compile(ddp_model), as torch's DDP docs show it; on torch 2.14 (CPU) Dynamo breaks the
                  graph inside DDP's forward and compiles nothing (the last line says how many graphs it
                  compiled): the run is eager;
--mode compile_module: DistributedDataParallel(torch.compile(model)): Inductor compiles the model's forward and
                  backward; DDP's C++ reducer calls the hook per bucket as in eager;
--mode compiled_autograd: torch._dynamo.config.compiled_autograd = True with forward and backward in one
                  compiled function; torch refuses DDP's C++ reducer there and asks for its Python reducer
                  (optimize_ddp = "python_reducer"), which calls a hook per parameter with a (grad, param)
                  pair instead of a bucket: attach_birder / attach_onebit refuse that DDP model in one line.

What each mode gave: docs/integrations.md (torch.compile).
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
parser.add_argument("--mode", choices=["eager", "compile", "compile_module", "compiled_autograd"], default="compile")
parser.add_argument("--save", help="directory: rank 0 writes the final parameters there (model.pt)")
args = parser.parse_args()

if args.mode == "compiled_autograd":  # both before DDP is built: it picks its reducer then
    torch._dynamo.config.optimize_ddp = "python_reducer"
    torch._dynamo.config.compiled_autograd = True

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
dataset = toy.make_dataset()
loader = DataLoader(dataset, batch_size=toy.BATCH, sampler=toy.make_sampler(dataset, rank, world))

net = toy.make_model()
ddp = DistributedDataParallel(torch.compile(net) if args.mode == "compile_module" else net)
opt = toy.make_optimizer(args.optim, ddp.parameters())
if args.optim == "birder":
    state = attach_birder(ddp, opt, gpus_per_node=toy.GPUS_PER_NODE)
else:
    state = attach_onebit(ddp, opt)
model = torch.compile(ddp) if args.mode == "compile" else ddp


def forward_backward(x, y):
    torch.nn.functional.cross_entropy(model(x), y).backward()


if args.mode == "compiled_autograd":  # the backward inside the compiled function: compiled autograd traces it
    forward_backward = torch.compile(forward_backward)

for step, (x, y) in enumerate(loader):
    if step == toy.STEPS:
        break
    forward_backward(x, y)
    opt.step()
    opt.zero_grad()
state.close()
dist.destroy_process_group()
if rank == 0:
    if args.save:
        os.makedirs(args.save, exist_ok=True)
        torch.save(net.state_dict(), os.path.join(args.save, "model.pt"))
    from torch._dynamo.utils import counters

    print(f"compiled_graphs={counters['stats']['unique_graphs']}", flush=True)
    print(f"fingerprint={toy.fingerprint(net)}", flush=True)

"""Birder (or 1-bit Adam) under FSDP2: every unit sharded inside the node, the 1-bit exchange between the nodes.

    torchrun --standalone --nproc-per-node=2 examples/fsdp2.py --optim birder

The mesh is ("replicate", "shard") = (nodes, processes per node); here 2 nodes of toy.GPUS_PER_NODE = 1
process, so FSDP's reduce-scatter inside a node is the process's own gradient and the hook's exchange runs
between the two processes. Birder's result equals examples/plain_ddp.py bit for bit. 1-bit Adam's follows the
single-process reference with a scale per tensor (tests/test_examples.py), not plain DDP's run: its server scales
stop at the edges of each server's chunk of the exchanged vector, which here holds the parameters in the model's
order and in DDP's bucket in the order their gradients became ready.
"""

import argparse
import os
import sys

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.utils.data import DataLoader

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import toy

from birder_repro.comm import attach_birder_fsdp, attach_onebit_fsdp

parser = argparse.ArgumentParser()
parser.add_argument("--optim", choices=["birder", "onebit_adam"], default="birder")
parser.add_argument("--save", help="directory: rank 0 writes the final parameters there (model.pt)")
args = parser.parse_args()

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
dataset = toy.make_dataset()
loader = DataLoader(dataset, batch_size=toy.BATCH, sampler=toy.make_sampler(dataset, rank, world))

mesh = init_device_mesh("cpu", (world // toy.GPUS_PER_NODE, toy.GPUS_PER_NODE), mesh_dim_names=("replicate", "shard"))
model = toy.make_model()
# One unit, the root, holding every parameter, as plain DDP's one bucket does (a larger model shards each block
# first: fully_shard(block, mesh=mesh["shard"]) for every block, then the root).
fully_shard(model, mesh=mesh["shard"])
opt = toy.make_optimizer(args.optim, model.parameters())
attach = attach_birder_fsdp if args.optim == "birder" else attach_onebit_fsdp
state = attach(model, opt, mesh)

for step, (x, y) in enumerate(loader):
    if step == toy.STEPS:
        break
    torch.nn.functional.cross_entropy(model(x), y).backward()
    opt.step()
    opt.zero_grad()
state.close()

plain = toy.make_model()  # the whole parameters, gathered (collective), in a plain copy of the model
with torch.no_grad():
    for whole, sharded in zip(plain.parameters(), model.parameters()):
        whole.copy_(sharded.full_tensor())
dist.destroy_process_group()
if rank == 0:
    if args.save:
        os.makedirs(args.save, exist_ok=True)
        torch.save(plain.state_dict(), os.path.join(args.save, "model.pt"))
    print(f"fingerprint={toy.fingerprint(plain)}", flush=True)

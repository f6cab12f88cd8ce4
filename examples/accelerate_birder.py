"""Birder (or 1-bit Adam) with Hugging Face Accelerate: the hook goes on the model accelerator.prepare wrapped.

    torchrun --standalone --nproc-per-node=2 examples/accelerate_birder.py --optim birder
    torchrun --standalone --nproc-per-node=2 examples/accelerate_birder.py --accum 2   # 2 micro-batches of 4
    torchrun --standalone --nproc-per-node=2 examples/accelerate_birder.py --save ckpt --stop-at 4
    torchrun --standalone --nproc-per-node=2 examples/accelerate_birder.py --resume ckpt

(``accelerate launch --multi_gpu --num_processes 2 examples/accelerate_birder.py`` runs it the same way, on CPU too
and with no config file: it starts torchrun; ``--cpu --num_processes 2`` would start one process.) The loader is not
prepared, so the data order is toy's sampler's, as in every other example. accelerator.save_state /
load_state keep the model, optimizer, Accelerate's step counter and every rank's hook state.
"""

import argparse
import os
import sys

import torch
from accelerate import Accelerator
from torch.utils.data import DataLoader

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import toy

from birder_repro.integrations.accelerate import attach_accelerate, regroup_buckets

parser = argparse.ArgumentParser()
parser.add_argument("--optim", choices=["birder", "onebit_adam"], default="birder")
parser.add_argument("--accum", type=int, default=1, help="micro-batches per optimizer step (of BATCH / accum)")
parser.add_argument("--save", help="accelerator.save_state here after --stop-at optimizer steps")
parser.add_argument("--stop-at", type=int, default=toy.STEPS, help="stop (and --save) after this many steps")
parser.add_argument("--resume", help="accelerator.load_state from here, then train on to toy.STEPS")
parser.add_argument("--mixed-precision", default="no", help="Accelerate's mixed_precision (no, fp16, bf16)")
parser.add_argument("--dump", help="rank 0 saves the final parameters here (torch.save of a list)")
args = parser.parse_args()

accelerator = Accelerator(cpu=True, gradient_accumulation_steps=args.accum, mixed_precision=args.mixed_precision)
if accelerator.is_main_process:  # fp16 on a CPU: Accelerate makes no GradScaler and no autocast (fp32)
    print(f"mixed_precision={args.mixed_precision} scaler={type(accelerator.scaler).__name__}", flush=True)
dataset = toy.make_dataset()
sampler = toy.make_sampler(dataset, accelerator.process_index, accelerator.num_processes)
loader = DataLoader(dataset, batch_size=toy.BATCH // args.accum, sampler=sampler)

model = toy.make_model()
model, opt = accelerator.prepare(model, toy.make_optimizer(args.optim, model.parameters()))
state = attach_accelerate(accelerator, model, opt, gpus_per_node=toy.GPUS_PER_NODE)
if args.resume:  # one backward first, gradients dropped: DDP groups its buckets as the saved run had them
    x, y = next(iter(loader))
    regroup_buckets(model, lambda: torch.nn.functional.cross_entropy(model(x), y))
    accelerator.load_state(args.resume)  # also every rank's birder_hook_rank*.pt

done = accelerator.step  # micro-batches already trained: Accelerate's own counter, restored by load_state
for micro, (x, y) in enumerate(loader):
    if micro < done:  # the same data order as a run left alone
        continue
    if micro == min(args.stop_at, toy.STEPS) * args.accum:
        break
    with accelerator.accumulate(model):  # no_sync (no hook) until the last micro-batch of a step
        loss = torch.nn.functional.cross_entropy(model(x), y)
        accelerator.backward(loss)  # divides the loss by args.accum
        opt.step()
        opt.zero_grad()

if args.save:
    accelerator.save_state(args.save)
if state is not None:  # None in one process: no DDP, the optimizer runs alone
    accelerator.print(f"hook_calls={state.calls} optimizer_steps={min(args.stop_at, toy.STEPS)}", flush=True)
    state.close()
if args.dump and accelerator.is_main_process:
    torch.save([p.detach() for p in accelerator.unwrap_model(model).parameters()], args.dump)
accelerator.print(f"fingerprint={toy.fingerprint(accelerator.unwrap_model(model))}", flush=True)  # rank 0's

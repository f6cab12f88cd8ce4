"""Birder (or 1-bit Adam) in PyTorch Lightning: ``BirderStrategy`` attaches the hook to the model Lightning wraps.

    torchrun --standalone --nproc-per-node=2 examples/lightning_birder.py --optim birder
    torchrun --standalone --nproc-per-node=2 examples/lightning_birder.py --optim birder --save ckpt --stop-at 4
    torchrun --standalone --nproc-per-node=2 examples/lightning_birder.py --optim birder --resume ckpt/last.ckpt

Lightning detects torchrun's environment, or under plain ``python`` starts the second process itself. The same
model, data order and seed as examples/plain_ddp.py, so the last line, ``fingerprint=...``, is the same.
"""

import argparse
import os
import sys

import lightning as L
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from torch.utils.data import DataLoader, Subset

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import toy

from birder_repro.integrations.lightning import BirderStrategy

parser = argparse.ArgumentParser()
parser.add_argument("--optim", choices=["birder", "onebit_adam"], default="birder")
parser.add_argument("--save", help="directory for Lightning's checkpoint (and each rank's hook state)")
parser.add_argument("--stop-at", type=int, default=toy.STEPS, help="stop (and --save) after this many steps")
parser.add_argument("--resume", help="checkpoint file --save wrote: continue from there to toy.STEPS")
parser.add_argument("--precision", default="32-true", help="Lightning's precision (16-mixed: bf16-mixed on a CPU)")
args = parser.parse_args()


class ToyModule(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = toy.make_model()

    def training_step(self, batch, batch_idx):
        x, y = batch
        return torch.nn.functional.cross_entropy(self.net(x), y)

    def configure_optimizers(self):
        return toy.make_optimizer(args.optim, self.parameters())

    def train_dataloader(self):
        # toy's sampler (Lightning's own would reorder), from the step a resumed run is at: the order of a run
        # left alone (the checkpoint holds the step; the loader itself is not resumable).
        dataset = toy.make_dataset()
        order = list(toy.make_sampler(dataset, self.global_rank, self.trainer.world_size))
        done = self.trainer.global_step * toy.BATCH
        return DataLoader(Subset(dataset, order[done:]), batch_size=toy.BATCH, shuffle=False)


trainer = L.Trainer(
    accelerator="cpu",
    devices=2,
    num_nodes=1,
    max_steps=args.stop_at,
    # toy.GPUS_PER_NODE = 1 stands this one machine for 2 nodes; on a cluster leave it out (Lightning's devices)
    strategy=BirderStrategy(gpus_per_node=toy.GPUS_PER_NODE),
    use_distributed_sampler=False,
    logger=False,
    enable_progress_bar=False,
    enable_model_summary=False,
    # Lightning's own checkpointing: every step, the newest kept, plus last.ckpt (each with its ranks' hook state)
    callbacks=[ModelCheckpoint(dirpath=args.save, every_n_train_steps=1, save_last=True)] if args.save else [],
    enable_checkpointing=bool(args.save),
    num_sanity_val_steps=0,
    deterministic=True,
    precision=args.precision,
)
module = ToyModule()
trainer.fit(module, ckpt_path=args.resume)
if trainer.is_global_zero:
    print(f"fingerprint={toy.fingerprint(module.net)}", flush=True)

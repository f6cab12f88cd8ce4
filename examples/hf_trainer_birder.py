"""Birder (or 1-bit Adam) in the Hugging Face Trainer: BirderTrainer attaches the hook to the DDP model it builds.

    torchrun --standalone --nproc-per-node=2 examples/hf_trainer_birder.py --optim birder
    torchrun --standalone --nproc-per-node=2 examples/hf_trainer_birder.py --save ckpt --stop-at 4
    torchrun --standalone --nproc-per-node=2 examples/hf_trainer_birder.py --resume ckpt

The model takes dict batches ({"x", "labels"}) and returns {"loss", "logits"}, as a transformers model does; toy's
sampler gives the data order of every other example. --save writes the Trainer's checkpoint-<step> folder
(with every rank's hook state) and stops; --resume continues from the last one there.
"""

import argparse
import os
import sys
import tempfile

import torch
from transformers import TrainerCallback, TrainingArguments

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import toy

from birder_repro.integrations.hf_trainer import BirderTrainer

parser = argparse.ArgumentParser()
parser.add_argument("--optim", choices=["birder", "onebit_adam"], default="birder")
parser.add_argument("--save", help="output_dir: save a checkpoint after --stop-at steps, then stop")
parser.add_argument("--stop-at", type=int, default=toy.STEPS, help="stop (and --save) after this many steps")
parser.add_argument("--resume", help="output_dir of a --save run: resume from its last checkpoint")
args = parser.parse_args()


class ToyModel(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.net = toy.make_model()

    def forward(self, x, labels):
        logits = self.net(x)
        return {"loss": torch.nn.functional.cross_entropy(logits, labels), "logits": logits}


class StopAt(TrainerCallback):  # the Trainer saves at save_steps; this ends the run there
    def on_step_end(self, _args, state, control, **kwargs):
        control.should_training_stop = state.global_step >= args.stop_at


out = args.save or args.resume or os.path.join(tempfile.gettempdir(), "hf_trainer_birder")  # written with --save
training_args = TrainingArguments(
    output_dir=out,
    use_cpu=True,
    ddp_backend="gloo",
    per_device_train_batch_size=toy.BATCH,
    max_steps=toy.STEPS,
    lr_scheduler_type="constant",
    max_grad_norm=0,  # .grad holds Birder's +-1 update after the hook: never clip it (ddp_find_unused_parameters:
    # left at its default, BirderTrainer turns it off; True would deadlock and is refused)
    save_strategy="steps" if args.save else "no",
    save_steps=args.stop_at,
    report_to="none",
    disable_tqdm=True,
    log_level="warning",
    remove_unused_columns=False,
)
dataset, model = toy.make_dataset(), ToyModel()
trainer = BirderTrainer(
    model=model,
    args=training_args,
    train_dataset=dataset,
    data_collator=lambda rows: {"x": torch.stack([r[0] for r in rows]), "labels": torch.stack([r[1] for r in rows])},
    optimizers=(toy.make_optimizer(args.optim, model.parameters()), None),
    gpus_per_node=toy.GPUS_PER_NODE,
    train_sampler=toy.make_sampler(dataset, training_args.process_index, training_args.world_size),
    callbacks=[StopAt()],
)
trainer.train(resume_from_checkpoint=True if args.resume else None)
if trainer.hook_state is not None:  # None in one process: no DDP, the optimizer runs alone
    trainer.hook_state.close()
if trainer.is_world_process_zero():
    print(f"fingerprint={toy.fingerprint(model)}", flush=True)

"""A 3-layer LSTM language model on Penn Treebank: Birder paper, appendix B.2 (Figure 6).

The paper builds on the LSTM code of the AdaBelief paper (Zhuang et al., NeurIPS 2020; its footnote 7:
github.com/juntang-zhuang/Adabelief-Optimizer, ``PyTorch_Experiments/LSTM``), which is the AWD-LSTM of Merity
et al. ("Regularizing and Optimizing LSTM Language Models", ICLR 2018). What is taken from there:

Model (AdaBelief ``main.py`` defaults and ``run_all_layer3.py``; AWD-LSTM ``model.py``): word embedding 400,
3 LSTM layers of 1150 hidden units, the last one of 400 so that the decoder can share the embedding matrix
(tied weights, ``args.tied = True``; Press and Wolf 2017, Inan et al. 2017); embedding init uniform(-0.1, 0.1),
decoder bias 0, torch's LSTM init. Regularization as AWD-LSTM: embedding (word) dropout 0.1, locked (variational)
dropout on the embedding 0.4 (``--dropouti 0.4`` of the 3-layer runs), between layers 0.25 (``--dropouth
0.25``) and on the output 0.4, DropConnect on the hidden-to-hidden weights 0.5 (``wdrop``), activation
regularization alpha 2 and temporal activation regularization beta 1 on the last layer. With PTB's 10,000
words: 24,221,600 parameters (``model.size=full``). ``model.size=tiny`` is the same code at widths 16 / 32.

Data: PTB word-level text files ``ptb.{train,valid,test}.txt`` under ``data.root`` (Mikolov's preprocessed
copy, as AWD-LSTM's ``getdata.sh`` fetches it): every line's words, then ``<eos>``. The vocabulary is built
from the training file in order of first occurrence; a word of the validation or test file outside it reads
as ``<unk>`` (PTB's files are already closed over the training vocabulary, so this never happens on them).
Each process takes its contiguous shard of the token stream and batchifies it into ``train.batch_size``
columns (AWD-LSTM's ``batchify``); a training step is one BPTT window of ``data.bptt`` = 70 rows, and the
hidden state is carried from window to window within an epoch (truncated back-propagation through time).
A *sample* (for the global batch, throughput and ``train_size``) is one column of one window: one sequence of
up to 70 tokens. ``data.source=synthetic``: token streams of the same length from a fixed random Markov chain
over ``model.vocab_size`` words (every word has a few likely successors), which a model can learn.

Loss and metric: mean token cross-entropy plus the AR/TAR terms; evaluation returns, per split, the summed
token negative log-likelihood and the token count; ``finalize`` reports ``perplexity`` (test, what Figure 6
shows) and ``val_perplexity``, exp of the mean NLL. Validation uses the validation split (AdaBelief's script
evaluates on the test split every epoch and calls it "valid").

Departures from the AdaBelief runs, stated: BPTT windows have a fixed length of 70 (AWD-LSTM draws each
length from N(70, 5), 5 % of them around 35, and scales the learning rate by length / 70, which the shared
training loop cannot do per step); evaluation uses ``data.eval_batch_size`` = 10 columns for validation and
``data.test_batch_size`` = 1 for test as AdaBelief does; SGD's switch to averaged SGD (NT-ASGD) is left out.
Hyperparameters: conf/task/lstm_ptb.yaml and conf/recipe/lstm_ptb/.

Its parts: ``tasks.awd_lstm`` (the model), ``tasks.ptb_data`` (the token streams, shards and BPTT windows); this
module is the task.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from birder_repro.tasks.awd_lstm import Hidden, Regularization, lstm_lm
from birder_repro.tasks.base import Task, TaskData
from birder_repro.tasks.common import build_by_source
from birder_repro.tasks.data_files import check_ptb
from birder_repro.tasks.ptb_data import Window, build_ptb, build_synthetic

# --------------------------------------------------------------------------------------------------------------
# Task


def _bare(model: nn.Module) -> nn.Module:
    return model.module if isinstance(model, DistributedDataParallel) else model


class LSTMPTBTask(Task):
    """3-layer LSTM / Penn Treebank, Birder paper, appendix B.2."""

    name = "lstm_ptb"
    baseline = "sgdm"
    metrics = ("perplexity", "val_perplexity")
    headline_metric = "perplexity"  # on the test split

    def fsdp_units(self, model: nn.Module) -> list[nn.Module]:
        """The LSTM layers (the tied embedding / decoder stays with the root). With weight drop (model.wdrop > 0,
        AWD-LSTM's default) a layer cannot be a unit of its own: its forward swaps in the dropped hidden-to-hidden
        weight (torch.func.functional_call), and a unit's gradient for that weight is then lost (measured: the
        unit reduced no gradient for weight_hh_l0). Then the whole model is one unit, the root."""
        return [] if model.reg.wdrop > 0 else list(model.rnns)

    def build_model(self, cfg) -> nn.Module:
        return lstm_lm(int(cfg.model.vocab_size), cfg.model.size, Regularization.from_cfg(cfg.model))

    def build_data(self, cfg, rank: int, world_size: int) -> TaskData:
        return build_by_source(cfg, rank, world_size, {"real": build_ptb, "synthetic": build_synthetic})

    def check_data(self, cfg) -> None:
        check_ptb(cfg)

    def loss(self, model: nn.Module, batch: Window, device: torch.device) -> tuple[torch.Tensor, int]:
        lm = _bare(model)
        inputs, targets = batch.inputs.to(device), batch.targets.to(device)
        start = lm.carry.start_of(batch.index, lambda: lm.init_hidden(inputs.shape[1], device))
        logits, end, penalty = model(inputs, start)  # through DDP, so that its hooks reduce the gradients
        lm.carry.store(batch.index, start, end)
        nll = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))
        return nll + penalty, inputs.shape[1]

    @torch.no_grad()
    def evaluate(self, model: nn.Module, loader, device: torch.device) -> dict[str, tuple[float, float]]:
        # The bare module: shards differ in length between processes, and no collective may run here.
        lm = _bare(model)
        was_training = lm.training
        lm.eval()
        sums = {"val_nll": [0.0, 0.0], "test_nll": [0.0, 0.0]}
        hidden: dict[str, Hidden] = {}  # each split is one stream: its hidden state runs on across windows
        for split, window in loader:
            inputs, targets = window.inputs.to(device), window.targets.to(device)
            start = hidden.get(split) or lm.init_hidden(inputs.shape[1], device)
            logits, hidden[split], _ = lm(inputs, start)
            acc = sums[f"{split}_nll"]
            acc[0] += float(F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1), reduction="sum"))
            acc[1] += targets.numel()
        lm.train(was_training)
        return {k: (v[0], v[1]) for k, v in sums.items()}

    def finalize(self, means: dict[str, float]) -> dict[str, float]:
        return {
            "perplexity": perplexity(means["test_nll"]),
            "val_perplexity": perplexity(means["val_nll"]),
            "test_nll": means["test_nll"],
            "val_nll": means["val_nll"],
        }


def perplexity(mean_nll: float) -> float:
    """exp(mean token NLL); infinite rather than an OverflowError for a diverged model."""
    return math.exp(mean_nll) if mean_nll < 709.0 else math.inf


__all__ = ["LSTMPTBTask", "perplexity"]

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
"""

from __future__ import annotations

import contextlib
import itertools
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from birder_repro.tasks.base import Task, TaskData, small_eval_note
from birder_repro.tasks.common import build_by_source, pick_size
from birder_repro.tasks.data_files import PTB_SPLITS, check_ptb, ptb_path

EOS = "<eos>"
UNK = "<unk>"
SPLITS = PTB_SPLITS


def _fp16_autocast_on_cpu(x: torch.Tensor) -> bool:
    """fp16 autocast on the CPU has no LSTM (oneDNN: "could not create a primitive descriptor for the LSTM
    forward propagation primitive"): there the LSTM layers run in fp32 (autocast off inside them), the rest of
    the model in fp16. bf16 on the CPU and every precision on a GPU (cuDNN) keep autocast's own choice."""
    return (
        x.device.type == "cpu" and torch.is_autocast_enabled("cpu") and torch.get_autocast_dtype("cpu") == torch.float16
    )


@dataclass(frozen=True)
class LSTMSize:
    embedding: int
    hidden: int
    layers: int


# model.size -> widths. full: AdaBelief's --emsize 400 --nhid 1150 --nlayer 3; tiny: the same code, CPU smoke runs.
SIZES = {
    "full": LSTMSize(embedding=400, hidden=1150, layers=3),
    "tiny": LSTMSize(embedding=16, hidden=32, layers=3),
}


@dataclass(frozen=True)
class Regularization:
    """AWD-LSTM's dropouts and activation penalties (Merity et al. 2018, section 4), from ``cfg.model``."""

    dropout: float = 0.4  # locked dropout on the last layer's output
    dropouth: float = 0.25  # locked dropout between LSTM layers
    dropouti: float = 0.4  # locked dropout on the embedded input
    dropoute: float = 0.1  # dropout of whole words from the embedding matrix
    wdrop: float = 0.5  # DropConnect on every layer's hidden-to-hidden weights
    alpha: float = 2.0  # activation regularization (AR) on the last layer's dropped output
    beta: float = 1.0  # temporal activation regularization (TAR) on its raw output

    @classmethod
    def from_cfg(cls, model_cfg) -> Regularization:
        return cls(**{name: float(model_cfg[name]) for name in cls.__dataclass_fields__})


# --------------------------------------------------------------------------------------------------------------
# Model


def locked_dropout(x: torch.Tensor, p: float, training: bool) -> torch.Tensor:
    """Variational dropout (Gal and Ghahramani 2016): one mask per sequence, shared by all time steps of (T, B, H)."""
    if not training or p == 0:
        return x
    mask = x.new_empty(1, x.shape[1], x.shape[2]).bernoulli_(1 - p) / (1 - p)
    return x * mask


def embedding_dropout(weight: torch.Tensor, p: float, training: bool) -> torch.Tensor:
    """The embedding matrix with whole words (rows) dropped, as AWD-LSTM's ``embedded_dropout``."""
    if not training or p == 0:
        return weight
    return weight * (weight.new_empty(weight.shape[0], 1).bernoulli_(1 - p) / (1 - p))


Hidden = list[tuple[torch.Tensor, torch.Tensor]]


class HiddenCarry:
    """The hidden state handed from one training window to the next (truncated BPTT), kept on the model.

    A window starts from the state the previous window ended with; window 0 of an epoch (and a window after a
    gap, as on resuming mid-epoch) starts from zeros, as AWD-LSTM's ``init_hidden`` at every epoch. The same
    window seen again (the training loop's timing calibration runs forward + backward on one batch a few times)
    starts from the same state again, so those passes leave training as it would be without them.
    """

    def __init__(self):
        self.index: int | None = None
        self.start: Hidden | None = None
        self.end: Hidden | None = None

    def start_of(self, index: int, zeros) -> Hidden:
        if self.index is not None and index == self.index:
            return self.start
        if self.index is not None and index == self.index + 1:
            return self.end
        return zeros()

    def store(self, index: int, start: Hidden, end: Hidden) -> None:
        # Detached: back-propagation stops at the window's start.
        self.index, self.start = index, start
        self.end = [(h.detach(), c.detach()) for h, c in end]


class AWDLSTM(nn.Module):
    """Embedding, a stack of one-layer LSTMs, and a decoder tied to the embedding (AWD-LSTM's RNNModel).

    ``forward(tokens (T, B), hidden) -> (logits (T, B, V), new hidden, penalty)``: ``penalty`` is the AR + TAR
    term in training mode and 0 in evaluation mode; the model owns its coefficients as it owns its dropouts.
    """

    def __init__(self, vocab_size: int, size: LSTMSize, reg: Regularization):
        super().__init__()
        if size.layers < 1:
            raise ValueError(f"an LSTM needs at least one layer, got {size.layers}")
        self.size, self.reg = size, reg
        self.carry = HiddenCarry()  # training state, not a parameter or buffer: DDP neither syncs nor saves it
        self.encoder = nn.Embedding(vocab_size, size.embedding)
        self.rnns = nn.ModuleList(nn.LSTM(self._width(i - 1), self._width(i)) for i in range(size.layers))
        # The decoder's weight is the embedding matrix (tied), which is why the last layer is embedding-wide.
        self.decoder_bias = nn.Parameter(torch.zeros(vocab_size))
        nn.init.uniform_(self.encoder.weight, -0.1, 0.1)  # AWD-LSTM's init_weights (initrange 0.1)

    def _width(self, layer: int) -> int:
        """Input width of layer 0 (``layer=-1``), else the output width of ``layer``."""
        return self.size.embedding if layer in (-1, self.size.layers - 1) else self.size.hidden

    def init_hidden(self, batch: int, device: torch.device | None = None) -> Hidden:
        """Zero (h, c) for every layer: AWD-LSTM's ``init_hidden`` at the start of each epoch and evaluation."""
        device = device or self.encoder.weight.device

        def zeros(width: int) -> torch.Tensor:
            return torch.zeros(1, batch, width, device=device)

        return [(zeros(self._width(i)), zeros(self._width(i))) for i in range(self.size.layers)]

    def _run_layer(self, rnn: nn.LSTM, x: torch.Tensor, state) -> tuple[torch.Tensor, tuple]:
        """One LSTM layer, with DropConnect on its hidden-to-hidden weights while training (AWD-LSTM's WeightDrop).

        The dropped weight is passed in place of the parameter through ``torch.func.functional_call``, so the
        parameter itself stays a plain registered parameter (DDP reduces its gradient like any other).
        """
        fp32 = _fp16_autocast_on_cpu(x)
        if fp32:
            x, state = x.float(), tuple(s.float() for s in state)
        with torch.autocast("cpu", enabled=False) if fp32 else contextlib.nullcontext():
            if not (self.training and self.reg.wdrop > 0):
                return rnn(x, state)
            params = dict(rnn.named_parameters())
            params["weight_hh_l0"] = F.dropout(rnn.weight_hh_l0, p=self.reg.wdrop, training=True)
            return torch.func.functional_call(rnn, params, (x, state))

    def forward(self, tokens: torch.Tensor, hidden: Hidden) -> tuple[torch.Tensor, Hidden, torch.Tensor]:
        reg, training = self.reg, self.training
        weight = embedding_dropout(self.encoder.weight, reg.dropoute, training)
        x = locked_dropout(F.embedding(tokens, weight), reg.dropouti, training)
        new_hidden = []
        for layer, rnn in enumerate(self.rnns):
            raw, state = self._run_layer(rnn, x, hidden[layer])
            new_hidden.append(state)
            last = layer == len(self.rnns) - 1
            x = locked_dropout(raw, reg.dropout if last else reg.dropouth, training)
        logits = F.linear(x, self.encoder.weight, self.decoder_bias)
        penalty = self._activation_penalty(raw, x) if training else logits.new_zeros(())
        return logits, new_hidden, penalty

    def _activation_penalty(self, raw: torch.Tensor, dropped: torch.Tensor) -> torch.Tensor:
        """AR: alpha * mean(dropped output^2); TAR: beta * mean((h_t - h_{t-1})^2) (Merity et al. 2018, 4.6)."""
        penalty = self.reg.alpha * dropped.pow(2).mean()
        if raw.shape[0] > 1:  # TAR needs two time steps
            penalty = penalty + self.reg.beta * (raw[1:] - raw[:-1]).pow(2).mean()
        return penalty


def lstm_lm(vocab_size: int, size: str = "full", reg: Regularization = Regularization()) -> AWDLSTM:
    """The AWD-LSTM of AdaBelief's 3-layer PTB runs (``size="full"``) or its tiny CPU variant."""
    return AWDLSTM(vocab_size, pick_size(size, SIZES), reg)


# --------------------------------------------------------------------------------------------------------------
# Data: token streams, shards, BPTT windows


class Window(NamedTuple):
    """One BPTT window of a batchified stream: inputs and next-token targets (T, B), and its place in the epoch."""

    inputs: torch.Tensor
    targets: torch.Tensor
    index: int


def shard(stream: torch.Tensor, rank: int, world_size: int, equal: bool) -> torch.Tensor:
    """This process's contiguous part of a token stream.

    ``equal``: every process gets ``len // world_size`` tokens (training: every process must take as many steps,
    DDP runs in lockstep); else the parts differ by at most one token and together cover the stream (evaluation).
    """
    n = stream.numel()
    if equal:
        size = n // world_size
        return stream[rank * size : (rank + 1) * size]
    return stream[rank * n // world_size : (rank + 1) * n // world_size]


def batchify(stream: torch.Tensor, columns: int) -> torch.Tensor:
    """(rows, columns): the stream cut into ``columns`` contiguous pieces side by side; the rest dropped (AWD-LSTM)."""
    rows = stream.numel() // columns
    if rows < 2:
        raise ValueError(
            f"a stream of {stream.numel()} tokens cannot fill {columns} columns of at least 2 tokens "
            f"(one input, one target)"
        )
    return stream[: rows * columns].view(columns, rows).t().contiguous()


class BPTTWindows:
    """The windows of a batchified stream: rows ``i .. i + bptt`` as inputs, the next rows as targets (AWD-LSTM's
    ``get_batch``); the last window may be shorter. Iterable once per epoch, in order; ``len`` is windows per epoch.
    """

    def __init__(self, matrix: torch.Tensor, bptt: int):
        if bptt < 1:
            raise ValueError(f"data.bptt must be >= 1, got {bptt}")
        self.matrix, self.bptt = matrix, bptt

    @property
    def columns(self) -> int:
        return self.matrix.shape[1]

    def __len__(self) -> int:
        return math.ceil((self.matrix.shape[0] - 1) / self.bptt)

    def __iter__(self) -> Iterator[Window]:
        rows = self.matrix.shape[0]
        for index, start in enumerate(range(0, rows - 1, self.bptt)):
            length = min(self.bptt, rows - 1 - start)
            yield Window(self.matrix[start : start + length], self.matrix[start + 1 : start + 1 + length], index)


class EvalWindows:
    """Validation and test windows interleaved, ``(split, window)``: a cap on evaluation batches
    (``train.eval_max_batches``) then shortens both splits alike instead of leaving out the test split."""

    def __init__(self, splits: dict[str, BPTTWindows]):
        self.splits = splits

    def __iter__(self) -> Iterator[tuple[str, Window]]:
        streams = [zip(itertools.repeat(name), windows) for name, windows in self.splits.items()]
        for pair in itertools.chain.from_iterable(itertools.zip_longest(*streams)):
            if pair is not None:
                yield pair

    def __len__(self) -> int:
        return sum(len(w) for w in self.splits.values())


# --------------------------------------------------------------------------------------------------------------
# Real data: the PTB text files


class Vocabulary:
    """Words to ids, in order of first occurrence in the training file (AWD-LSTM's ``Dictionary``)."""

    def __init__(self, words: Sequence[str] = ()):
        self.ids: dict[str, int] = {}
        for word in words:
            self.ids.setdefault(word, len(self.ids))

    def __len__(self) -> int:
        return len(self.ids)

    def encode(self, words: Sequence[str], where: str) -> torch.Tensor:
        """Ids of ``words``; outside the vocabulary, ``<unk>`` where the vocabulary has it, else an error."""
        unk = self.ids.get(UNK)
        out = []
        for word in words:
            i = self.ids.get(word, unk)
            if i is None:
                raise ValueError(f"{where}: the word {word!r} is not in the training vocabulary, which has no {UNK}")
            out.append(i)
        return torch.tensor(out, dtype=torch.long)


def read_words(path: str) -> list[str]:
    """Every line's whitespace-separated words followed by ``<eos>`` (AWD-LSTM's ``Corpus.tokenize``)."""
    with open(path, encoding="utf-8") as f:
        return [word for line in f for word in line.split() + [EOS]]


def load_ptb(cfg) -> tuple[Vocabulary, dict[str, torch.Tensor]]:
    """The vocabulary (from the training file) and the three token streams."""
    paths = {split: ptb_path(cfg, split) for split in SPLITS}  # all three checked before any is read
    train_words = read_words(paths["train"])
    vocab = Vocabulary(train_words)
    streams = {"train": vocab.encode(train_words, paths["train"])}
    for split in SPLITS[1:]:
        streams[split] = vocab.encode(read_words(paths[split]), paths[split])
    return vocab, streams


def check_vocab_fits(vocab_size: int, cfg, where: str) -> None:
    """Word ids must fit the model's embedding: a vocabulary larger than ``model.vocab_size`` is a config error."""
    if vocab_size > int(cfg.model.vocab_size):
        raise ValueError(
            f"{where} has a vocabulary of {vocab_size} words but model.vocab_size="
            f"{cfg.model.vocab_size}: set model.vocab_size={vocab_size}"
        )


# --------------------------------------------------------------------------------------------------------------
# Synthetic data: a fixed random Markov chain


MIN_WALK = 1000  # tokens: the shortest walk markov_stream lays down (see there)


def markov_chain(vocab_size: int, successors: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(next words (V, k), their probabilities (V, k)): each word has ``k`` random successors with random weights."""
    g = torch.Generator().manual_seed(seed)
    nxt = torch.randint(vocab_size, (vocab_size, successors), generator=g)
    probs = torch.softmax(torch.randn(vocab_size, successors, generator=g), dim=1)
    return nxt, probs


def markov_stream(chain: tuple[torch.Tensor, torch.Tensor], length: int, seed: int) -> torch.Tensor:
    """``length`` tokens: up to 256 independent walks on the chain side by side (a vectorized loop of
    length / walkers steps instead of ``length``), laid end to end.

    Every walk is at least ``MIN_WALK`` tokens long (or the whole stream), so that the jumps between walks, where
    the next word is not the chain's, stay rare in short streams too.
    """
    nxt, probs = chain
    g = torch.Generator().manual_seed(seed)
    walkers = max(1, min(256, length // MIN_WALK))
    steps = math.ceil(length / walkers)
    state = torch.randint(nxt.shape[0], (walkers,), generator=g)
    out = torch.empty(steps, walkers, dtype=torch.long)
    for t in range(steps):
        out[t] = state
        choice = torch.multinomial(probs[state], 1, generator=g).squeeze(1)
        state = nxt[state, choice]
    return out.t().reshape(-1)[:length]


def synthetic_streams(cfg) -> dict[str, torch.Tensor]:
    """Train / valid / test streams of one chain (the same on every process), each from its own walks."""
    seed = int(cfg.seed)
    chain = markov_chain(int(cfg.model.vocab_size), int(cfg.data.synthetic_successors), seed)
    sizes = {
        "train": cfg.data.synthetic_train_tokens,
        "valid": cfg.data.synthetic_valid_tokens,
        "test": cfg.data.synthetic_test_tokens,
    }
    return {split: markov_stream(chain, int(n), seed * 3 + 1 + i) for i, (split, n) in enumerate(sizes.items())}


# --------------------------------------------------------------------------------------------------------------
# TaskData from streams


def streams_to_data(streams: dict[str, torch.Tensor], cfg, rank: int, world_size: int, what: str) -> TaskData:
    """This process's training windows and its shards of the validation and test streams."""
    batch = int(cfg.train.batch_size)
    train = BPTTWindows(batchify(shard(streams["train"], rank, world_size, equal=True), batch), int(cfg.data.bptt))
    evaluation = EvalWindows(
        {
            "val": BPTTWindows(
                batchify(shard(streams["valid"], rank, world_size, False), int(cfg.data.eval_batch_size)),
                int(cfg.data.bptt),
            ),
            "test": BPTTWindows(
                batchify(shard(streams["test"], rank, world_size, False), int(cfg.data.test_batch_size)),
                int(cfg.data.bptt),
            ),
        }
    )
    tokens = ", ".join(f"{streams[s].numel()} {s}" for s in SPLITS)
    description = (
        f"{what}: {tokens} tokens; {world_size} contiguous shards, {batch} columns each, BPTT "
        f"{cfg.data.bptt}: {len(train)} windows per epoch"
    )
    # A sample is one column of one window: every step takes batch x world of them.
    return TaskData(train, evaluation, len(train) * batch * world_size, description, sampler=None)


def build_ptb(cfg, rank: int, world_size: int) -> TaskData:
    vocab, streams = load_ptb(cfg)
    check_vocab_fits(len(vocab), cfg, f"{cfg.data.root}/ptb.train.txt")
    return streams_to_data(
        streams, cfg, rank, world_size, f"Penn Treebank (real) from {cfg.data.root}, vocabulary of {len(vocab)} words"
    )


def build_synthetic(cfg, rank: int, world_size: int) -> TaskData:
    what = (
        f"SYNTHETIC token streams (data.source=synthetic): a fixed random Markov chain over "
        f"{cfg.model.vocab_size} words, {cfg.data.synthetic_successors} successors each, seed {cfg.seed} "
        f"({small_eval_note('data.synthetic_valid_tokens, data.synthetic_test_tokens')}); perplexity on it "
        "says nothing about the paper's numbers"
    )
    return streams_to_data(synthetic_streams(cfg), cfg, rank, world_size, what)


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


__all__ = [
    "SIZES",
    "LSTMSize",
    "Regularization",
    "AWDLSTM",
    "lstm_lm",
    "Window",
    "shard",
    "batchify",
    "BPTTWindows",
    "EvalWindows",
    "Vocabulary",
    "read_words",
    "load_ptb",
    "markov_chain",
    "markov_stream",
    "HiddenCarry",
    "LSTMPTBTask",
    "perplexity",
]

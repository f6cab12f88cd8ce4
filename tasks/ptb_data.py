"""The lstm_ptb task's data: token streams (the Penn Treebank's text files, or a fixed random Markov chain),
shards per process, and BPTT windows of them (the task's docstring says how)."""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator, Sequence
from typing import NamedTuple

import torch

from birder_repro.tasks.base import TaskData, small_eval_note
from birder_repro.tasks.data_files import PTB_SPLITS, ptb_path

__all__ = [
    "EOS",
    "UNK",
    "SPLITS",
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
    "build_ptb",
    "build_synthetic",
]

EOS = "<eos>"
UNK = "<unk>"
SPLITS = PTB_SPLITS


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

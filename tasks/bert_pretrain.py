"""BERT-Base pretrained from scratch with masked-LM and next-sentence objectives: Birder paper, appendix C.

Model: ``transformers.BertForPreTraining`` (Devlin et al. 2019, section 3.1: a masked-LM head tied to the input
embeddings and a next-sentence head on [CLS]), built from a BertConfig, randomly initialised; ``model.nsp=false``
drops the next-sentence task (``BertForMaskedLM``, single-segment sequences). ``model.size=large`` is BERT-Large
(24 layers, 1024 wide: the 1-bit Adam and 1-bit LAMB papers' model), ``model.size=tiny`` a 2-layer, 32-wide BERT
for CPU smoke runs.

Data, real: text in the input format of Google's ``create_pretraining_data.py`` (github.com/google-research/bert):
UTF-8 files ``<data.root>/*.txt`` with one sentence per line and a blank line between documents; or, with
``data.hf_name`` (e.g. ``wikimedia/wikipedia`` and ``data.hf_config=20231101.en``), the ``text`` column of a
``datasets`` dataset, one article a document and its non-empty lines (paragraphs) as its sentences. The text is
tokenized once with the WordPiece tokenizer of ``model.tokenizer`` into a cache (``data.cache_dir``) that every
process memory-maps, and cut into training sequences as ``create_instances_from_document`` does:

- sentences are gathered until they fill ``max_seq_length`` - 3 tokens (the paper: 512); segment A is the first
  1..n-1 of them; B is the rest (label 0) or, half of the time, a run of sentences from a random other document
  (label 1; the unused sentences are put back and start the next sequence); ``[CLS] A [SEP] B [SEP]``, padded;
- too-long pairs lose tokens from the end of the longer segment (Google's code cuts the front or the back at
  random); Google's ``short_seq_prob`` (10 % shorter sequences) is left out: every sequence is filled;
- 15 % of the tokens of every sequence (``masked_lm_prob``, at least one, never [CLS], [SEP] or padding) are
  predicted: 80 % of those become [MASK], 10 % a random token and 10 % stay. Training sequences are masked
  afresh whenever they are drawn (as Hugging Face's ``DataCollatorForLanguageModeling``; Google masks once per
  copy of the data); evaluation sequences always the same way, from a generator seeded by their index.

The last ``data.eval_fraction`` of the documents (at least one) is held out for evaluation.

Data, synthetic (``data.source=synthetic``, said at start): sequences of random token ids from a fixed random
Markov chain (every token has four possible successors), so that masked tokens can be inferred from their
neighbours; B continues A's chain (label 0) or starts a new one (label 1).

Metrics: ``mlm_loss`` (mean cross-entropy of the masked tokens; the quantity of the paper's Figure 8),
``mlm_accuracy`` and ``nsp_accuracy`` in percent. Hyperparameters: conf/task/bert_pretrain.yaml (16 per GPU,
37,000 iterations, warm up over 12,500 then linear to 0) and conf/recipe/bert_pretrain/ (peak lr 4e-4, BertAdam
betas (0.9, 0.999), Birder beta 0.9).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import shutil
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, Dataset
from transformers import BertForMaskedLM, BertForPreTraining

from birder_repro.config import settings as layout
from birder_repro.tasks.base import Task, TaskData, small_eval_note
from birder_repro.tasks.bert_common import (
    SYNTHETIC_SPECIALS,
    SpecialIds,
    bert_config,
    load_tokenizer,
    to_device,
    vocab_size_for,
)
from birder_repro.tasks.common import ShardSampler, build_by_source, train_loader
from birder_repro.tasks.data_files import check_pretrain_text
from birder_repro.tasks.data_files import pretrain_text_files as text_files

MODEL_INPUTS = ("input_ids", "token_type_ids", "attention_mask")
CACHE_VERSION = 1  # bump when the cache's layout changes: old caches are then rebuilt, not misread


# --------------------------------------------------------------------------------------------------------------
# Model


def tokenizer_of(cfg):
    """The WordPiece tokenizer of ``model.tokenizer``: real data only (synthetic ids need none)."""
    if cfg.data.source != "real":
        return None
    return load_tokenizer(cfg.model.get("tokenizer"), cfg.model.get("lowercase"))


def build_model(cfg) -> nn.Module:
    """BertForPreTraining (MLM + NSP), or BertForMaskedLM with ``model.nsp=false``, from scratch."""
    tokenizer = tokenizer_of(cfg)
    pad = tokenizer.pad_token_id if tokenizer is not None else SYNTHETIC_SPECIALS.pad
    config = bert_config(cfg.model.size, vocab_size_for(cfg, tokenizer), int(cfg.data.max_seq_length), pad)
    return BertForPreTraining(config) if cfg.model.nsp else BertForMaskedLM(config)


# --------------------------------------------------------------------------------------------------------------
# Masking and sequence assembly


def mask_tokens(
    ids: torch.Tensor,
    maskable: torch.Tensor,
    n_tokens: int,
    vocab_size: int,
    mask_id: int,
    prob: float,
    generator: torch.Generator | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """BERT's masked-LM corruption of one sequence: (corrupted ids, labels with -100 where nothing is predicted).

    ``max(1, round(prob * n_tokens))`` of the ``maskable`` positions are predicted (create_pretraining_data.py:
    ``num_to_predict``, counted over the sequence's tokens with [CLS] and [SEP]); of those, 80 % become
    ``mask_id``, 10 % a token drawn uniformly from the vocabulary, 10 % stay as they were.
    """
    count = min(max(1, round(prob * n_tokens)), int(maskable.sum()))
    scores = torch.rand(ids.shape, generator=generator).masked_fill(~maskable, 2.0)  # never chosen: > 1
    chosen = scores.argsort()[:count]
    labels = torch.full_like(ids, -100)
    labels[chosen] = ids[chosen]
    corrupted = ids.clone()
    action = torch.rand(count, generator=generator)
    random_ids = torch.randint(vocab_size, (count,), generator=generator)
    corrupted[chosen] = torch.where(
        action < 0.8, torch.full_like(random_ids, mask_id), torch.where(action < 0.9, random_ids, ids[chosen])
    )
    return corrupted, labels


def truncate_pair(len_a: int, len_b: int, max_tokens: int) -> tuple[int, int]:
    """Lengths after cutting the longer segment, one token at a time, until both fit (truncate_seq_pair)."""
    excess = len_a + len_b - max_tokens
    if excess <= 0:
        return len_a, len_b
    gap = min(excess, abs(len_a - len_b))  # first level the longer one down to the shorter
    len_a, len_b = (len_a - gap, len_b) if len_a > len_b else (len_a, len_b - gap)
    excess -= gap
    # then alternately; on a tie the loop cuts B first, so B loses the odd token
    return len_a - excess // 2, len_b - (excess + 1) // 2


def assemble(a: Sequence[int], b: Sequence[int] | None, length: int, sp: SpecialIds) -> dict[str, torch.Tensor]:
    """``[CLS] A [SEP] B [SEP]`` (or ``[CLS] A [SEP]``) padded to ``length``, with token types and mask."""
    a, b = list(a), (list(b) if b is not None else None)
    ids = [sp.cls, *a, sp.sep] + ([*b, sp.sep] if b is not None else [])
    types = [0] * (len(a) + 2) + ([1] * (len(b) + 1) if b is not None else [])
    pad = length - len(ids)
    if pad < 0:
        raise ValueError(f"a sequence of {len(ids)} tokens does not fit max_seq_length={length}")
    return {
        "input_ids": torch.tensor(ids + [sp.pad] * pad),
        "token_type_ids": torch.tensor(types + [0] * pad),
        "attention_mask": torch.tensor([1] * len(ids) + [0] * pad),
    }


class MaskedSequences(Dataset):
    """Base of the real and synthetic datasets: segment pairs in, masked model inputs and labels out.

    Subclasses give ``segments(index) -> (A ids, B ids or None, next-sentence label)``. Training items draw
    their masks from torch's global generator (seeded per process and per loader worker), evaluation items
    from a generator seeded by (seed, index): every evaluation scores the same masked tokens.
    """

    def __init__(
        self,
        size: int,
        length: int,
        vocab_size: int,
        specials: SpecialIds,
        masked_lm_prob: float,
        nsp: bool,
        seed: int,
        split: str,
    ):
        if split not in ("train", "eval"):
            raise ValueError(f"split must be 'train' or 'eval', not {split!r}")
        self.size, self.length, self.vocab_size, self.specials = int(size), int(length), int(vocab_size), specials
        self.masked_lm_prob, self.nsp, self.seed, self.split = float(masked_lm_prob), bool(nsp), int(seed), split

    def __len__(self) -> int:
        return self.size

    def segments(self, index: int) -> tuple[Sequence[int], Sequence[int] | None, int]:
        raise NotImplementedError

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        if not 0 <= index < self.size:
            raise IndexError(index)
        a, b, label = self.segments(index)
        item = assemble(a, b if self.nsp else None, self.length, self.specials)
        ids, sp = item["input_ids"], self.specials
        maskable = (ids != sp.cls) & (ids != sp.sep) & (ids != sp.pad)
        generator = (
            None if self.split == "train" else torch.Generator().manual_seed((self.seed % 2**31) * 2**32 + index)
        )
        item["input_ids"], item["labels"] = mask_tokens(
            ids, maskable, int(item["attention_mask"].sum()), self.vocab_size, sp.mask, self.masked_lm_prob, generator
        )
        if self.nsp:
            item["next_sentence_label"] = torch.tensor(label)
        return item


# --------------------------------------------------------------------------------------------------------------
# Real text: documents, the token cache, training instances


def documents_from_files(paths: Sequence[str]) -> Iterator[list[str]]:
    """Documents as lists of sentences: one sentence per line, blank lines between documents."""
    for path in paths:
        doc: list[str] = []
        with open(path, encoding="utf-8") as f:
            for line in f:
                line = line.strip()
                if line:
                    doc.append(line)
                elif doc:
                    yield doc
                    doc = []
        if doc:  # a file ends a document
            yield doc


def documents_from_hf(name: str, config: str | None) -> Iterator[list[str]]:
    """Articles of a ``datasets`` corpus with a ``text`` column; their non-empty lines are the sentences."""
    try:
        import datasets  # optional: only this path needs it
    except ImportError as err:
        raise ImportError(
            f"data.hf_name={name!r} needs the datasets library (pip install datasets); or unset it "
            f"and read text files from data.root"
        ) from err
    for row in datasets.load_dataset(name, config, split="train"):
        lines = [line.strip() for line in row["text"].split("\n") if line.strip()]
        if lines:
            yield lines


def _source_fingerprint(cfg) -> dict:
    if cfg.data.get("hf_name"):  # a datasets corpus is named by its version (hf_config): names suffice
        return {"hf_name": str(cfg.data.hf_name), "hf_config": cfg.data.get("hf_config")}
    return {
        "root": os.path.abspath(str(cfg.data.root)),
        "files": [(os.path.basename(p), os.path.getsize(p), os.stat(p).st_mtime_ns) for p in text_files(cfg)],
    }


def cache_key(cfg, tokenizer) -> str:
    """What the token cache depends on: the text (names, sizes, times), the vocabulary and its casing."""
    vocab = hashlib.sha1(json.dumps(sorted(tokenizer.get_vocab().items())).encode()).hexdigest()
    lowercase = getattr(tokenizer, "do_lower_case", None)
    blob = json.dumps(
        {"v": CACHE_VERSION, "source": _source_fingerprint(cfg), "vocab": vocab, "lower": lowercase}, sort_keys=True
    )
    return hashlib.sha1(blob.encode()).hexdigest()[:16]


class CorpusWriter:
    """Writes the token cache: ``tokens.bin`` (every sentence's tokens back to back), ``sentences.bin`` (each
    sentence's first token offset, then the token count) and ``documents.bin`` (each document's first sentence,
    then the sentence count), with ``meta.json`` saying the dtype and sizes.

    Documents are tokenized ``batch_sentences`` sentences at a time and appended to the files, so a corpus of
    billions of tokens never sits in memory. Sentences that tokenize to nothing are dropped, and so are
    documents left without a sentence.
    """

    def __init__(self, tokenizer, folder: str, batch_sentences: int = 10_000):
        self.tokenizer, self.folder, self.batch_sentences = tokenizer, folder, batch_sentences
        self.dtype = np.uint16 if len(tokenizer) <= 2**16 else np.int32
        self.tokens_file = open(os.path.join(folder, "tokens.bin"), "wb")
        self.sentences_file = open(os.path.join(folder, "sentences.bin"), "wb")
        self.n_tokens, self.n_sentences, self.doc_starts = 0, 0, [0]
        self.pending: list[list[str]] = []

    def add(self, document: list[str]) -> None:
        self.pending.append(document)
        if sum(len(d) for d in self.pending) >= self.batch_sentences:
            self.flush()

    def flush(self) -> None:
        sentences = [s for doc in self.pending for s in doc]
        ids = self.tokenizer(sentences, add_special_tokens=False)["input_ids"] if sentences else []
        at = 0
        for doc in self.pending:
            kept = [t for t in ids[at : at + len(doc)] if t]
            at += len(doc)
            if kept:
                self._write(kept)
        self.pending.clear()

    def _write(self, sentences: list[list[int]]) -> None:
        lengths = np.array([len(t) for t in sentences], dtype=np.int64)
        np.fromiter((t for s in sentences for t in s), dtype=self.dtype, count=int(lengths.sum())).tofile(
            self.tokens_file
        )
        (self.n_tokens + np.cumsum(lengths) - lengths).tofile(self.sentences_file)  # first token of each
        self.n_tokens += int(lengths.sum())
        self.n_sentences += len(sentences)
        self.doc_starts.append(self.n_sentences)

    def close(self) -> None:
        self.flush()
        np.array([self.n_tokens], dtype=np.int64).tofile(self.sentences_file)
        self.tokens_file.close()
        self.sentences_file.close()
        np.array(self.doc_starts, dtype=np.int64).tofile(os.path.join(self.folder, "documents.bin"))
        meta = {
            "version": CACHE_VERSION,
            "dtype": np.dtype(self.dtype).name,
            "tokens": self.n_tokens,
            "sentences": self.n_sentences,
            "documents": len(self.doc_starts) - 1,
        }
        with open(os.path.join(self.folder, "meta.json"), "w") as f:
            json.dump(meta, f)


def write_corpus(documents: Iterable[list[str]], tokenizer, folder: str) -> None:
    """Tokenize ``documents`` (lists of sentences) into the cache files of :class:`CorpusWriter` in ``folder``."""
    writer = CorpusWriter(tokenizer, folder)
    for document in documents:
        writer.add(document)
    writer.close()


@dataclass
class Corpus:
    """The memory-mapped token cache (shared by every process on a machine through the page cache)."""

    tokens: np.ndarray  # all token ids
    sentences: np.ndarray  # token offset of each sentence, then the number of tokens
    documents: np.ndarray  # sentence index of each document, then the number of sentences

    @classmethod
    def open(cls, folder: str) -> Corpus:
        with open(os.path.join(folder, "meta.json")) as f:
            meta = json.load(f)
        tokens = (
            np.memmap(os.path.join(folder, "tokens.bin"), dtype=meta["dtype"], mode="r", shape=(meta["tokens"],))
            if meta["tokens"]
            else np.zeros(0, dtype=meta["dtype"])
        )
        sentences = np.fromfile(os.path.join(folder, "sentences.bin"), dtype=np.int64)
        documents = np.fromfile(os.path.join(folder, "documents.bin"), dtype=np.int64)
        return cls(tokens, sentences, documents)

    @property
    def num_documents(self) -> int:
        return len(self.documents) - 1


def create_instances(corpus: Corpus, docs: range, max_tokens: int, nsp: bool, rng: np.random.Generator) -> np.ndarray:
    """Training sequences of the documents ``docs`` as token ranges: rows (a0, a1, b0, b1, next-sentence label).

    Google's ``create_instances_from_document`` without short sequences (module docstring); random B segments
    come from other documents of the same split (the same document when the split has only one). Without
    ``nsp`` every row is one segment of whole sentences (b0 = b1, label -1).
    """
    starts = corpus.sentences
    lengths = np.diff(starts).tolist()
    rows: list[tuple[int, int, int, int, int]] = []
    for d in docs:
        first, stop = int(corpus.documents[d]), int(corpus.documents[d + 1])
        chunk, filled, i = first, 0, first
        while i < stop:
            filled += lengths[i]
            if i == stop - 1 or filled >= max_tokens:
                if not nsp:
                    rows.append((starts[chunk], starts[i + 1], 0, 0, -1))
                else:
                    n = i + 1 - chunk
                    a_end = chunk + (int(rng.integers(1, n)) if n >= 2 else 1)
                    if n == 1 or rng.random() < 0.5:
                        b0, b1 = _random_segment(
                            corpus, docs, d, max_tokens - (starts[a_end] - starts[chunk]), lengths, rng
                        )
                        rows.append((starts[chunk], starts[a_end], b0, b1, 1))
                        i = a_end - 1  # put back the sentences B did not use: the next sequence starts there
                    else:
                        rows.append((starts[chunk], starts[a_end], starts[a_end], starts[i + 1], 0))
                chunk, filled = i + 1, 0
            i += 1
    return np.asarray(rows, dtype=np.int64).reshape(-1, 5)


def _random_segment(
    corpus: Corpus, docs: range, current: int, target: int, lengths: list[int], rng: np.random.Generator
) -> tuple[int, int]:
    """Token range of sentences from a random other document, from a random sentence on, filling ``target``."""
    other = current
    for _ in range(10):  # create_pretraining_data.py tries 10 times for a different document
        other = int(rng.integers(docs.start, docs.stop))
        if other != current:
            break
    first, stop = int(corpus.documents[other]), int(corpus.documents[other + 1])
    j = k = int(rng.integers(first, stop))
    filled = 0
    while k < stop and (k == j or filled < target):
        filled += lengths[k]
        k += 1
    return int(corpus.sentences[j]), int(corpus.sentences[k])


def split_documents(n: int, eval_fraction: float) -> tuple[range, range]:
    """Training and evaluation documents: the last ``ceil(eval_fraction * n)`` (at least one) are held out."""
    n_eval = max(1, math.ceil(eval_fraction * n))
    if n - n_eval < 1:
        raise ValueError(
            f"the corpus has {n} document(s): at least 2 are needed to hold one out for evaluation "
            f"(data.eval_fraction={eval_fraction})"
        )
    return range(0, n - n_eval), range(n - n_eval, n)


# ----------------------------------------------------------------------------------------------- the cache


def _local_rank(rank: int) -> int:
    # torchrun's LOCAL_RANK: one process per machine builds the cache, so that every machine has one even
    # without a shared filesystem.
    return int(os.environ.get("LOCAL_RANK", rank))


def build_once(target: str, build, rank: int, poll_s: float = 2.0) -> None:
    """Make ``target`` (a file or folder) exist: local rank 0 builds it, the other processes wait for it.

    ``build(tmp_path)`` writes into a temporary path that is then renamed to ``target`` (atomic), so that a
    waiting process never reads a half-written cache and two machines sharing a filesystem may both build.
    Waiting polls the filesystem rather than a collective: tokenizing Wikipedia takes longer than the
    collectives' timeout.
    """
    if os.path.exists(target):
        return
    if _local_rank(rank) != 0:
        while not os.path.exists(target):
            time.sleep(poll_s)
        return
    tmp = f"{target}.tmp-{os.getpid()}"
    try:
        build(tmp)
        os.replace(tmp, target)  # fails, for a folder, when another machine's copy got there first
    except OSError:
        if not os.path.exists(target):
            raise
    finally:  # the loser of a race (or a failed build) leaves no temporary behind
        if os.path.isdir(tmp):
            shutil.rmtree(tmp)
        elif os.path.exists(tmp):
            os.remove(tmp)


def cache_dir(cfg) -> str:
    return str(cfg.data.cache_dir) if cfg.data.get("cache_dir") else os.path.join(str(cfg.data.root), "cache")


def prepared_corpus(cfg, tokenizer, rank: int) -> tuple[Corpus, str]:
    """The token cache of the configured text, built on first use (module docstring)."""
    source = _source_fingerprint(cfg)  # fails early, naming data.root, when there is no text
    folder = os.path.join(cache_dir(cfg), f"bert_pretrain-{cache_key(cfg, tokenizer)}")
    os.makedirs(os.path.dirname(folder), exist_ok=True)

    def build(tmp: str) -> None:
        os.makedirs(tmp)
        docs = (
            documents_from_hf(str(cfg.data.hf_name), cfg.data.get("hf_config"))
            if "hf_name" in source
            else documents_from_files(text_files(cfg))
        )
        write_corpus(docs, tokenizer, tmp)

    build_once(folder, build, rank)
    return Corpus.open(folder), folder


def prepared_instances(cfg, corpus: Corpus, folder: str, split: str, docs: range, rank: int) -> np.ndarray:
    """The split's sequences (:func:`create_instances`), cached beside the tokens; the same on every process."""
    length, nsp = int(cfg.data.max_seq_length), bool(cfg.model.nsp)
    name = f"instances-{split}-len{length}-nsp{int(nsp)}-seed{int(cfg.seed)}-docs{docs.start}_{docs.stop}.npy"
    path = os.path.join(folder, name)

    def build(tmp: str) -> None:
        rng = np.random.default_rng((int(cfg.seed), 0 if split == "train" else 1))
        rows = create_instances(corpus, docs, length - (3 if nsp else 2), nsp, rng)
        with open(tmp, "wb") as f:  # a file object: np.save would add ".npy" to the temporary name
            np.save(f, rows)

    build_once(path, build, rank)
    return np.load(path, mmap_mode="r")


class TextSequences(MaskedSequences):
    """Sequences of the real corpus: rows of :func:`create_instances` read from the token cache."""

    def __init__(self, corpus: Corpus, instances: np.ndarray, **kwargs):
        super().__init__(len(instances), **kwargs)
        self.corpus, self.instances = corpus, instances

    def segments(self, index: int):
        a0, a1, b0, b1, label = (int(v) for v in self.instances[index])
        budget = self.length - (3 if self.nsp else 2)
        len_a, len_b = truncate_pair(a1 - a0, b1 - b0, budget)
        tokens = self.corpus.tokens
        return tokens[a0 : a0 + len_a].tolist(), tokens[b0 : b0 + len_b].tolist(), label


def build_text(cfg, rank: int, world_size: int) -> TaskData:
    """Real text: the token cache, training and evaluation sequences of the two document splits."""
    tokenizer = tokenizer_of(cfg)
    corpus, folder = prepared_corpus(cfg, tokenizer, rank)
    train_docs, eval_docs = split_documents(corpus.num_documents, float(cfg.data.eval_fraction))
    common = dict(
        length=int(cfg.data.max_seq_length),
        vocab_size=len(tokenizer),
        specials=SpecialIds.of(tokenizer),
        masked_lm_prob=float(cfg.data.masked_lm_prob),
        nsp=bool(cfg.model.nsp),
        seed=int(cfg.seed),
    )
    train_set = TextSequences(
        corpus, prepared_instances(cfg, corpus, folder, "train", train_docs, rank), split="train", **common
    )
    eval_set = TextSequences(
        corpus, prepared_instances(cfg, corpus, folder, "eval", eval_docs, rank), split="eval", **common
    )
    if len(eval_set) == 0:
        raise ValueError(f"the held-out documents of {folder} give no evaluation sequence")
    loader, sampler = train_loader(train_set, cfg, rank, world_size)
    source = f"datasets {cfg.data.hf_name!r}" if cfg.data.get("hf_name") else f"{cfg.data.root}/*.txt"
    description = (
        f"pretraining text (real) from {source}: {corpus.num_documents} documents, "
        f"{len(corpus.tokens)} WordPiece tokens (cache {folder}); {len(train_set)} train / "
        f"{len(eval_set)} eval sequences of {common['length']} tokens from {len(train_docs)} / "
        f"{len(eval_docs)} documents, {cfg.data.masked_lm_prob:.0%} masked"
        f"{', next-sentence pairs' if cfg.model.nsp else ''}"
    )
    return TaskData(loader, eval_loader(eval_set, cfg, rank, world_size), len(train_set), description, sampler)


def eval_loader(dataset: Dataset, cfg, rank: int, world_size: int) -> DataLoader:
    """This process's evaluation sequences (tasks.common.ShardSampler), ``data.eval_batch_size`` a batch."""
    workers = layout.data_workers(cfg)
    return DataLoader(
        dataset,
        batch_size=int(cfg.data.eval_batch_size),
        sampler=ShardSampler(len(dataset), rank, world_size),
        num_workers=workers,
        persistent_workers=workers > 0,
    )


# --------------------------------------------------------------------------------------------------------------
# Synthetic data


class MarkovSequences(MaskedSequences):
    """Random token ids from a fixed random Markov chain with ``successors`` next tokens per token.

    The chain (drawn from ``seed``) is shared by both splits; sample ``i`` draws its own start tokens and
    steps from a generator seeded by (seed, split, i). B continues A's chain (label 0) or starts afresh (1).
    """

    def __init__(self, size: int, successors: int = 4, **kwargs):
        super().__init__(size, **kwargs)
        self.low = self.specials.first_ordinary
        if self.vocab_size < self.low + successors:
            raise ValueError(f"model.vocab_size={self.vocab_size} leaves too few ordinary tokens")
        rng = np.random.default_rng(self.seed)
        self.successors = rng.integers(self.low, self.vocab_size, (self.vocab_size, successors)).tolist()

    def chain(self, start: int, steps: list[int]) -> list[int]:
        out, token = [], start
        for step in steps:
            out.append(token)
            token = self.successors[token][step]
        return out

    def segments(self, index: int):
        rng = np.random.default_rng((self.seed, 0 if self.split == "train" else 1, index))
        k = len(self.successors[0])
        if not self.nsp:
            n = self.length - 2
            return self.chain(int(rng.integers(self.low, self.vocab_size)), rng.integers(0, k, n).tolist()), None, -1
        total = self.length - 3
        len_a = int(rng.integers(total // 4, 3 * total // 4 + 1))
        steps = rng.integers(0, k, total).tolist()
        whole = self.chain(int(rng.integers(self.low, self.vocab_size)), steps)
        a = whole[:len_a]
        if rng.random() < 0.5:
            return a, whole[len_a:], 0
        return a, self.chain(int(rng.integers(self.low, self.vocab_size)), steps[len_a:]), 1


def build_synthetic(cfg, rank: int, world_size: int) -> TaskData:
    length, seed = int(cfg.data.max_seq_length), int(cfg.seed)
    common = dict(
        length=length,
        vocab_size=int(cfg.model.vocab_size),
        specials=SYNTHETIC_SPECIALS,
        masked_lm_prob=float(cfg.data.masked_lm_prob),
        nsp=bool(cfg.model.nsp),
        seed=seed,
    )
    train_set = MarkovSequences(int(cfg.data.synthetic_train_size), split="train", **common)
    eval_set = MarkovSequences(int(cfg.data.synthetic_eval_size), split="eval", **common)
    loader, sampler = train_loader(train_set, cfg, rank, world_size)
    description = (
        f"SYNTHETIC pretraining data (data.source=synthetic): random token ids of a fixed random Markov "
        f"chain, {length} tokens a sequence, {cfg.data.masked_lm_prob:.0%} masked; {len(train_set)} "
        f"train / {len(eval_set)} eval sequences ({small_eval_note('data.synthetic_eval_size')}), "
        f"seed {seed}; its losses say nothing about the "
        f"paper's numbers"
    )
    return TaskData(loader, eval_loader(eval_set, cfg, rank, world_size), len(train_set), description, sampler)


# --------------------------------------------------------------------------------------------------------------
# Task


class BertPretrainTask(Task):
    """BERT-Base pretraining (MLM + NSP), Birder paper, appendix C."""

    name = "bert_pretrain"
    baseline = "bertadam"
    metrics = ("mlm_loss", "mlm_accuracy", "nsp_accuracy")
    headline_metric = "mlm_accuracy"

    def fsdp_units(self, model: nn.Module) -> list[nn.Module]:
        return list(model.bert.encoder.layer)  # the transformer layers

    def build_model(self, cfg) -> nn.Module:
        return build_model(cfg)

    def build_data(self, cfg, rank: int, world_size: int) -> TaskData:
        return build_by_source(cfg, rank, world_size, {"real": build_text, "synthetic": build_synthetic})

    def check_data(self, cfg) -> None:
        check_pretrain_text(cfg)

    def loss(self, model: nn.Module, batch, device: torch.device) -> tuple[torch.Tensor, int]:
        # The model's own loss: masked-LM cross-entropy over the predicted tokens (+ next-sentence cross-entropy).
        out = model(**to_device(batch, device, (*MODEL_INPUTS, "labels", "next_sentence_label")))
        return out.loss, batch["input_ids"].shape[0]

    @torch.no_grad()
    def evaluate(self, model: nn.Module, loader: Iterable, device: torch.device) -> dict[str, tuple[float, float]]:
        model = getattr(model, "module", model)  # bare module: shards may differ in length between processes
        was_training = model.training
        model.eval()
        with_nsp = isinstance(model, BertForPreTraining)
        sums = {"mlm_loss": 0.0, "mlm_accuracy": 0.0, "nsp_accuracy": 0.0}
        masked = sequences = 0
        for batch in loader:
            out = model(**to_device(batch, device, MODEL_INPUTS))
            labels = batch["labels"].to(device)
            picked = labels != -100
            logits = getattr(out, "prediction_logits", None)
            logits = (out.logits if logits is None else logits)[picked].float()
            sums["mlm_loss"] += float(F.cross_entropy(logits, labels[picked], reduction="sum"))
            sums["mlm_accuracy"] += float((logits.argmax(-1) == labels[picked]).sum())
            masked += int(picked.sum())
            if with_nsp:
                nsp = out.seq_relationship_logits.argmax(-1).cpu() == batch["next_sentence_label"]
                sums["nsp_accuracy"] += float(nsp.sum())
                sequences += len(nsp)
        model.train(was_training)
        result = {"mlm_loss": (sums["mlm_loss"], float(masked)), "mlm_accuracy": (sums["mlm_accuracy"], float(masked))}
        if with_nsp:  # every process returns the same names, even with an empty shard: the sum is positional
            result["nsp_accuracy"] = (sums["nsp_accuracy"], float(sequences))
        return result

    def finalize(self, means: dict[str, float]) -> dict[str, float]:
        return {k: (100.0 * v if k.endswith("accuracy") else v) for k, v in means.items()}

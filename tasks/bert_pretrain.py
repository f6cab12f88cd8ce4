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

Its parts: ``tasks.bert_masking`` (the masking and the sequences' assembly), ``tasks.bert_corpus`` (the documents,
the token cache and the training instances); this module holds the model, the datasets and the task.
"""

from __future__ import annotations

from collections.abc import Iterable

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
from birder_repro.tasks.bert_corpus import Corpus, prepared_corpus, prepared_instances, split_documents
from birder_repro.tasks.bert_masking import MaskedSequences, truncate_pair
from birder_repro.tasks.common import ShardSampler, build_by_source, train_loader
from birder_repro.tasks.data_files import check_pretrain_text

MODEL_INPUTS = ("input_ids", "token_type_ids", "attention_mask")


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
# Real text: sequences of the token cache (tasks.bert_corpus)


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

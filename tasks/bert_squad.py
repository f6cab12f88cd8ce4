"""BERT-Base fine-tuned on SQuAD 1.1: Birder paper, section 5.1 and Table 2 (also Figures 2-4 and Table 4).

Model: ``transformers.BertForQuestionAnswering``: BERT with a linear layer giving a start and an end logit per
token (Devlin et al. 2019, section 4.2), loaded from ``model.checkpoint`` (a hub name such as
``bert-base-uncased``, as the paper uses, or a local directory); its loss is the mean of the cross-entropies of
the start and end positions. ``model.checkpoint=null`` builds BERT-Base randomly initialised (throughput runs
without the weights); ``model.size=tiny`` a 2-layer, 32-wide BERT, randomly initialised, for CPU smoke runs.

Data: the official SQuAD 1.1 JSON files (``<data.root>/train-v1.1.json``, ``dev-v1.1.json``; Rajpurkar et al.
2016) or, with ``data.hf_name=squad``, the same data through the ``datasets`` library. Features follow Hugging
Face's ``examples/pytorch/question-answering/run_qa.py``: question (at most ``max_query_length`` = 64 tokens)
and context as a pair, the context cut into windows of ``max_seq_length`` = 384 tokens that overlap by
``doc_stride`` = 128 tokens (run_qa's meaning of doc_stride; Google's run_squad.py instead advances the window
by doc_stride), padded to 384. A training window is labelled with the answer's first and last token, or with
[CLS] (position 0) when the answer is not wholly inside it. Training samples are windows (features).

Evaluation: every window of a development question is scored; the n-best post-processing of run_qa
(``postprocess_qa_predictions``) takes the ``n_best_size`` = 20 highest start and end logits of each window,
keeps spans inside the context of at most ``max_answer_length`` = 30 tokens, and answers with the context text
under the best start + end logit over all windows. Predictions are scored with the official SQuAD 1.1 exact
match and F1 (tasks/squad_metric.py), in percent. Each process evaluates a shard of questions, all windows of a
question on the same process, so the summed (score, count) pairs are the scores over the development set.

``data.source=synthetic``: random token sequences of the real shape whose answer span is marked by two marker
tokens around it, scored by the same post-processing and metric (on the marked span), said at start.

Hyperparameters: conf/task/bert_squad.yaml (3 per GPU, 2 epochs, warm up to the peak lr over 500 steps, then
linear to 0) and conf/recipe/bert_squad/ (BertAdam betas (0.9, 0.999), Birder beta 0.9, 1-bit Adam's warmup
stage 0.2 of the steps, peak lr 1e-4 for all).

Its parts: ``tasks.squad_examples`` (the questions read), ``tasks.squad_features`` (the windows and the
answers' positions), ``tasks.squad_answers`` (the post-processing); this module holds the model, the data sets
(real and synthetic) and the task.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset
from transformers import BertForQuestionAnswering

from birder_repro.config import settings as layout
from birder_repro.tasks import squad_metric
from birder_repro.tasks.base import Task, TaskData, small_eval_note
from birder_repro.tasks.bert_common import (
    SYNTHETIC_SPECIALS,
    SpecialIds,
    bert_config,
    load_pretrained,
    load_tokenizer,
    to_device,
    tokenizer_source,
    vocab_size_for,
)
from birder_repro.tasks.common import ShardSampler, build_by_source, train_loader
from birder_repro.tasks.data_files import SQUAD_DEV_FILE, SQUAD_TRAIN_FILE, check_squad
from birder_repro.tasks.squad_answers import predict_answers
from birder_repro.tasks.squad_examples import squad_examples
from birder_repro.tasks.squad_features import (
    MODEL_INPUTS,
    CollateEval,
    EvalExamples,
    Settings,
    TrainFeatures,
    train_features,
)

TRAIN_FILE, DEV_FILE = SQUAD_TRAIN_FILE, SQUAD_DEV_FILE


# --------------------------------------------------------------------------------------------------------------
# Model


def build_model(cfg) -> nn.Module:
    """BertForQuestionAnswering: from ``model.checkpoint``, or randomly initialised (tiny, or checkpoint null)."""
    if cfg.model.size == "full" and cfg.model.get("checkpoint"):
        return load_pretrained(BertForQuestionAnswering, str(cfg.model.checkpoint))
    tokenizer = load_tokenizer(tokenizer_source(cfg), cfg.model.get("lowercase")) if cfg.data.source == "real" else None
    pad = tokenizer.pad_token_id if tokenizer is not None else SYNTHETIC_SPECIALS.pad
    config = bert_config(cfg.model.size, vocab_size_for(cfg, tokenizer), int(cfg.data.max_seq_length), pad)
    return BertForQuestionAnswering(config)


def eval_loader(dataset: Dataset, cfg, rank: int, world_size: int) -> DataLoader:
    """This process's questions (tasks.common.ShardSampler), ``data.eval_batch_size`` questions a batch.

    Batches hold whole questions, so a cap on evaluation batches (train.eval_max_batches) never splits one.
    """
    workers = layout.data_workers(cfg)
    return DataLoader(
        dataset,
        batch_size=int(cfg.data.eval_batch_size),
        collate_fn=CollateEval(Settings.of(cfg)),
        sampler=ShardSampler(len(dataset), rank, world_size),
        num_workers=workers,
        persistent_workers=workers > 0,
    )


def build_squad(cfg, rank: int, world_size: int) -> TaskData:
    """SQuAD 1.1: training windows of every question; this process's shard of development questions."""
    s = Settings.of(cfg)
    tokenizer = load_tokenizer(tokenizer_source(cfg), cfg.model.get("lowercase"))
    train_examples, train_from = squad_examples(cfg, train=True)
    dev_examples, dev_from = squad_examples(cfg, train=False)
    train_set = TrainFeatures(train_features(tokenizer, train_examples, s))
    loader, sampler = train_loader(train_set, cfg, rank, world_size)
    description = (
        f"SQuAD 1.1 (real): {len(train_examples)} training questions from {train_from} -> "
        f"{len(train_set)} windows of {s.max_seq_length} tokens (overlap {s.doc_stride}, question "
        f"<= {s.max_query_length}); {len(dev_examples)} development questions from {dev_from}"
    )
    eval_set = EvalExamples(dev_examples, tokenizer, s)
    return TaskData(loader, eval_loader(eval_set, cfg, rank, world_size), len(train_set), description, sampler)


# --------------------------------------------------------------------------------------------------------------
# Synthetic data


class SyntheticSquad(Dataset):
    """Question/context pairs of random tokens whose answer is the span between two marker tokens.

    Sample ``i`` is drawn from a generator seeded by (seed, split, i): [CLS] question [SEP] context [SEP] and
    padding to ``max_seq_length``; the context holds marker ``A`` right before the answer and marker ``B`` right
    after it (ordinary random tokens never take the marker ids), so a model learns the span from its
    neighbours. Training items carry start/end positions; evaluation items look like real evaluation items
    (the context as text ``"w<id> w<id> ..."`` with offsets), so the same post-processing and SQuAD metric score
    them: exact match is then the accuracy of the predicted span.
    """

    def __init__(
        self,
        size: int,
        vocab_size: int,
        settings: Settings,
        seed: int,
        split: str,
        specials: SpecialIds = SYNTHETIC_SPECIALS,
    ):
        if split not in ("train", "eval"):
            raise ValueError(f"split must be 'train' or 'eval', not {split!r}")
        self.marker_a, self.marker_b = specials.first_ordinary, specials.first_ordinary + 1
        self.low = specials.first_ordinary + 2
        if vocab_size < self.low + 8:
            raise ValueError(f"model.vocab_size={vocab_size} leaves too few ordinary tokens for synthetic data")
        self.size, self.vocab_size, self.s, self.specials, self.split = size, vocab_size, settings, specials, split
        self.seed = (int(seed), 0 if split == "train" else 1)

    def __len__(self) -> int:
        return self.size

    def sample(self, index: int) -> tuple[list[int], list[int], int, int, int]:
        """(question ids, context ids, answer start and end in the context, context offset in the sequence)."""
        rng = np.random.default_rng((*self.seed, index))
        length = self.s.max_seq_length
        q_len = int(rng.integers(4, min(16, self.s.max_query_length) + 1))
        c_len = int(rng.integers((length - q_len - 3) // 2, length - q_len - 3 + 1))
        a_len = int(rng.integers(1, min(self.s.max_answer_length, 8, c_len - 2) + 1))
        start = int(rng.integers(1, c_len - a_len))  # room for marker A before and marker B after
        question = rng.integers(self.low, self.vocab_size, q_len).tolist()
        context = rng.integers(self.low, self.vocab_size, c_len).tolist()
        context[start - 1], context[start + a_len] = self.marker_a, self.marker_b
        return question, context, start, start + a_len - 1, q_len + 2

    def __getitem__(self, index: int) -> dict[str, Any]:
        if not 0 <= index < self.size:
            raise IndexError(index)
        question, context, start, end, offset = self.sample(index)
        sp, length = self.specials, self.s.max_seq_length
        ids = [sp.cls, *question, sp.sep, *context, sp.sep]
        types = [0] * offset + [1] * (len(context) + 1)
        pad = length - len(ids)
        item = {
            "input_ids": torch.tensor(ids + [sp.pad] * pad),
            "token_type_ids": torch.tensor(types + [0] * pad),
            "attention_mask": torch.tensor([1] * len(ids) + [0] * pad),
        }
        if self.split == "train":
            item["start_positions"], item["end_positions"] = torch.tensor(offset + start), torch.tensor(offset + end)
            return item
        words = [f"w{t}" for t in context]
        starts = np.cumsum([0] + [len(w) + 1 for w in words[:-1]]).tolist()
        token_offsets = [(a, a + len(w)) for a, w in zip(starts, words)]
        offsets = [None] * offset + token_offsets + [None] * (length - offset - len(context))
        text = " ".join(words)
        answer = text[token_offsets[start][0] : token_offsets[end][1]]
        item = {k: v[None] for k, v in item.items()}
        item["meta"] = {"id": f"synthetic-{index}", "context": text, "answers": [answer], "offsets": [offsets]}
        return item


def build_synthetic(cfg, rank: int, world_size: int) -> TaskData:
    s, vocab, seed = Settings.of(cfg), int(cfg.model.vocab_size), int(cfg.seed)
    train_set = SyntheticSquad(int(cfg.data.synthetic_train_size), vocab, s, seed, "train")
    eval_set = SyntheticSquad(int(cfg.data.synthetic_eval_size), vocab, s, seed, "eval")
    loader, sampler = train_loader(train_set, cfg, rank, world_size)
    description = (
        f"SYNTHETIC SQuAD-shaped data (data.source=synthetic): random token ids, {s.max_seq_length} "
        f"per window, the answer span marked by two marker tokens; {len(train_set)} train / "
        f"{len(eval_set)} eval windows ({small_eval_note('data.synthetic_eval_size')}), seed {seed}; exact match "
        f"and F1 on it are span accuracy, "
        f"nothing to compare with the paper's numbers"
    )
    return TaskData(loader, eval_loader(eval_set, cfg, rank, world_size), len(train_set), description, sampler)


# --------------------------------------------------------------------------------------------------------------
# Task


class BertSquadTask(Task):
    """BERT-Base / SQuAD 1.1, Birder paper, section 5.1 and Table 2."""

    name = "bert_squad"
    baseline = "bertadam"
    metrics = ("exact_match", "f1")
    headline_metric = "f1"  # Table 2: F1-score, then exact match

    def fsdp_units(self, model: nn.Module) -> list[nn.Module]:
        return list(model.bert.encoder.layer)  # the transformer layers

    def build_model(self, cfg) -> nn.Module:
        return build_model(cfg)

    def build_data(self, cfg, rank: int, world_size: int) -> TaskData:
        return build_by_source(cfg, rank, world_size, {"real": build_squad, "synthetic": build_synthetic})

    def check_data(self, cfg) -> None:
        check_squad(cfg)

    def loss(self, model: nn.Module, batch, device: torch.device) -> tuple[torch.Tensor, int]:
        out = model(**to_device(batch, device, (*MODEL_INPUTS, "start_positions", "end_positions")))
        return out.loss, batch["input_ids"].shape[0]

    @torch.no_grad()
    def evaluate(self, model: nn.Module, loader: Iterable, device: torch.device) -> dict[str, tuple[float, float]]:
        model = getattr(model, "module", model)  # bare module: shards may differ in length between processes
        was_training = model.training
        model.eval()
        em = f1 = 0.0
        count = 0
        for batch in loader:
            out = model(**to_device(batch, device, MODEL_INPUTS))
            texts = predict_answers(out.start_logits, out.end_logits, batch["meta"], batch["settings"])
            for meta, text in zip(batch["meta"], texts):
                e, f = squad_metric.score(text, meta["answers"])
                em, f1, count = em + e, f1 + f, count + 1
        model.train(was_training)
        return {"exact_match": (em, float(count)), "f1": (f1, float(count))}

    def finalize(self, means: dict[str, float]) -> dict[str, float]:
        return {k: (100.0 * v if k in self.metrics else v) for k, v in means.items()}

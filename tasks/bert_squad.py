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
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, fields
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
from birder_repro.tasks.data_files import SQUAD_DEV_FILE, SQUAD_TRAIN_FILE, check_squad, squad_file

MODEL_INPUTS = ("input_ids", "token_type_ids", "attention_mask")
TRAIN_FILE, DEV_FILE = SQUAD_TRAIN_FILE, SQUAD_DEV_FILE


@dataclass(frozen=True)
class Settings:
    """Feature and post-processing lengths (conf/task/bert_squad.yaml, ``data.*``)."""

    max_seq_length: int = 384
    doc_stride: int = 128
    max_query_length: int = 64
    n_best_size: int = 20
    max_answer_length: int = 30

    @classmethod
    def of(cls, cfg) -> Settings:
        return cls(**{f.name: int(cfg.data[f.name]) for f in fields(cls)})


@dataclass
class Example:
    """One question: its context, gold answers (texts) and the first answer's character offset."""

    id: str
    question: str
    context: str
    answers: list[str]
    answer_start: int


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


# --------------------------------------------------------------------------------------------------------------
# SQuAD 1.1 examples: the official JSON files or `datasets`


def read_squad_json(path: str) -> list[Example]:
    """Every question of an official SQuAD 1.1 file (``{"data": [{"paragraphs": [{"context", "qas"}]}]}``)."""
    with open(path, encoding="utf-8") as f:
        articles = json.load(f)["data"]
    examples = []
    for article in articles:
        for paragraph in article["paragraphs"]:
            for qa in paragraph["qas"]:
                answers = qa["answers"]
                if not answers:
                    raise ValueError(
                        f"{path}: question {qa['id']} has no answer (SQuAD 2.0 data? this task is SQuAD 1.1)"
                    )
                examples.append(
                    Example(
                        qa["id"],
                        qa["question"],
                        paragraph["context"],
                        [a["text"] for a in answers],
                        int(answers[0]["answer_start"]),
                    )
                )
    return examples


def read_squad_hf(name: str, split: str) -> list[Example]:
    """The same examples through ``datasets.load_dataset(name)`` (columns of the hub's ``squad``)."""
    try:
        import datasets  # optional: only this path needs it
    except ImportError as err:
        raise ImportError(
            f"data.hf_name={name!r} needs the datasets library (pip install datasets); or unset "
            f"it and read the official JSON files from data.root"
        ) from err
    rows = datasets.load_dataset(name, split=split)
    return [
        Example(r["id"], r["question"], r["context"], list(r["answers"]["text"]), int(r["answers"]["answer_start"][0]))
        for r in rows
    ]


def squad_examples(cfg, train: bool) -> tuple[list[Example], str]:
    """The training or development questions and where they came from."""
    if cfg.data.get("hf_name"):
        split = "train" if train else "validation"
        return read_squad_hf(str(cfg.data.hf_name), split), f"datasets {cfg.data.hf_name!r} ({split})"
    path = squad_file(cfg, train)
    return read_squad_json(path), path


# --------------------------------------------------------------------------------------------------------------
# Features: question + context windows


def truncate_questions(tokenizer, questions: Sequence[str], max_query_length: int) -> list[str]:
    """Questions cut after their ``max_query_length``-th token (run_squad's max_query_length), left-stripped.

    Cutting the text at the token's character offset keeps the tokenizer's own word pieces.
    """
    questions = [q.lstrip() for q in questions]  # run_qa: leading blanks would only eat window space
    enc = tokenizer(questions, add_special_tokens=False, return_offsets_mapping=True)
    return [
        q if len(offsets) <= max_query_length else q[: offsets[max_query_length - 1][1]]
        for q, offsets in zip(questions, enc["offset_mapping"])
    ]


def tokenize_windows(tokenizer, examples: Sequence[Example], s: Settings):
    """The windows of each example as run_qa builds them (fast tokenizer: offsets and sequence ids)."""
    questions = truncate_questions(tokenizer, [e.question for e in examples], s.max_query_length)
    return tokenizer(
        questions,
        [e.context for e in examples],
        truncation="only_second",
        max_length=s.max_seq_length,
        stride=s.doc_stride,
        return_overflowing_tokens=True,
        return_offsets_mapping=True,
        padding="max_length",
    )


def context_span(sequence_ids: Sequence[int | None]) -> tuple[int, int]:
    """First and last token index of the context (sequence 1) in a window."""
    tokens = [i for i, s in enumerate(sequence_ids) if s == 1]
    if not tokens:
        raise ValueError("a window holds no context token: max_seq_length is too small for max_query_length")
    return tokens[0], tokens[-1]


def answer_positions(offsets, sequence_ids, start_char: int, end_char: int) -> tuple[int, int]:
    """Token positions of the answer characters [start_char, end_char) in a window; (0, 0) ([CLS]) if outside.

    run_qa's ``prepare_train_features`` rule, searched only among context tokens (its loop can run past the
    context into [SEP] and padding when the answer starts at the last context token).
    """
    first, last = context_span(sequence_ids)
    if offsets[first][0] > start_char or offsets[last][1] < end_char:
        return 0, 0
    start = first
    while start < last and offsets[start + 1][0] <= start_char:
        start += 1
    end = last
    while end > first and offsets[end - 1][1] >= end_char:
        end -= 1
    return start, end


def train_features(tokenizer, examples: Sequence[Example], s: Settings, chunk: int = 1000) -> dict[str, np.ndarray]:
    """All training windows as compact arrays (int32 ids, uint8 types and masks), labelled with positions.

    Tokenized ``chunk`` examples at a time: the Python lists of one call over all of SQuAD would take gigabytes.
    """
    parts: dict[str, list[np.ndarray]] = {k: [] for k in (*MODEL_INPUTS, "start_positions", "end_positions")}
    for lo in range(0, len(examples), chunk):
        batch = examples[lo : lo + chunk]
        enc = tokenize_windows(tokenizer, batch, s)
        positions = []
        for i, offsets in enumerate(enc["offset_mapping"]):
            ex = batch[enc["overflow_to_sample_mapping"][i]]
            start_char = ex.answer_start
            positions.append(
                answer_positions(offsets, enc.sequence_ids(i), start_char, start_char + len(ex.answers[0]))
            )
        parts["input_ids"].append(np.asarray(enc["input_ids"], dtype=np.int32))
        parts["token_type_ids"].append(np.asarray(enc["token_type_ids"], dtype=np.uint8))
        parts["attention_mask"].append(np.asarray(enc["attention_mask"], dtype=np.uint8))
        positions = np.asarray(positions, dtype=np.int64).reshape(-1, 2)
        parts["start_positions"].append(positions[:, 0])
        parts["end_positions"].append(positions[:, 1])
    return {k: np.concatenate(v) for k, v in parts.items()}


class TrainFeatures(Dataset):
    """Training windows: each item a dict of model inputs and answer positions (int64 tensors)."""

    def __init__(self, arrays: dict[str, np.ndarray]):
        self.arrays = arrays

    def __len__(self) -> int:
        return len(self.arrays["input_ids"])

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        return {k: torch.as_tensor(v[index], dtype=torch.long) for k, v in self.arrays.items()}


class EvalExamples(Dataset):
    """Development questions, tokenized on demand into all their windows (with the context's offsets)."""

    def __init__(self, examples: Sequence[Example], tokenizer, settings: Settings):
        self.examples, self.tokenizer, self.settings = examples, tokenizer, settings

    def __len__(self) -> int:
        return len(self.examples)

    def __getitem__(self, index: int) -> dict[str, Any]:
        ex = self.examples[index]
        enc = tokenize_windows(self.tokenizer, [ex], self.settings)
        item = {k: torch.as_tensor(enc[k], dtype=torch.long) for k in MODEL_INPUTS}
        # Offsets of context tokens only: the post-processing must never answer with question text.
        offsets = [
            [o if s == 1 else None for o, s in zip(enc["offset_mapping"][w], enc.sequence_ids(w))]
            for w in range(len(enc["input_ids"]))
        ]
        item["meta"] = {"id": ex.id, "context": ex.context, "answers": ex.answers, "offsets": offsets}
        return item


class CollateEval:
    """Windows of several questions stacked; ``meta`` keeps each question's context, answers and offsets, and
    ``settings`` the post-processing lengths of the run (a batch says how to score itself)."""

    def __init__(self, settings: Settings):
        self.settings = settings

    def __call__(self, items: list[dict[str, Any]]) -> dict[str, Any]:
        batch: dict[str, Any] = {k: torch.cat([it[k] for it in items]) for k in MODEL_INPUTS}
        batch["meta"] = [it["meta"] for it in items]
        batch["settings"] = self.settings
        return batch


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
# Post-processing and metric


def best_span(
    start_logits: np.ndarray,
    end_logits: np.ndarray,
    offsets: Sequence[Sequence[tuple | None]],
    n_best_size: int,
    max_answer_length: int,
) -> tuple[int, int] | None:
    """Character span of the best answer over all windows of one question (run_qa's n-best search).

    In each window the ``n_best_size`` highest start and end logits are paired; a pair counts when both tokens
    are context tokens (offset not None), end >= start, and the span is at most ``max_answer_length`` tokens.
    The pair with the highest start + end logit over all windows wins; None if no pair counts.
    """
    best_score, best = -np.inf, None
    for w, window_offsets in enumerate(offsets):
        starts = np.argsort(start_logits[w])[::-1][:n_best_size]
        ends = np.argsort(end_logits[w])[::-1][:n_best_size]
        for i in starts:
            if window_offsets[i] is None:
                continue
            for j in ends:
                if window_offsets[j] is None or j < i or j - i + 1 > max_answer_length:
                    continue
                score = start_logits[w][i] + end_logits[w][j]
                if score > best_score:
                    best_score, best = score, (window_offsets[i][0], window_offsets[j][1])
    return best


def predict_answers(
    start_logits: torch.Tensor, end_logits: torch.Tensor, metas: Sequence[dict], s: Settings
) -> list[str]:
    """The predicted text of each question of a batch (its windows are consecutive rows of the logits)."""
    start_logits, end_logits = start_logits.float().cpu().numpy(), end_logits.float().cpu().numpy()
    answers, row = [], 0
    for meta in metas:
        n = len(meta["offsets"])
        span = best_span(
            start_logits[row : row + n], end_logits[row : row + n], meta["offsets"], s.n_best_size, s.max_answer_length
        )
        answers.append("" if span is None else meta["context"][span[0] : span[1]])
        row += n
    return answers


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

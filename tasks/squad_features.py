"""SQuAD's features as Hugging Face's ``run_qa.py`` builds them: question + context windows (overlapping by
``doc_stride``), the answer's token positions in each training window, and the development questions' windows
with the context's character offsets, for the post-processing (tasks.squad_answers)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, fields
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset

from birder_repro.tasks.squad_examples import Example

__all__ = [
    "MODEL_INPUTS",
    "Settings",
    "truncate_questions",
    "tokenize_windows",
    "context_span",
    "answer_positions",
    "train_features",
    "TrainFeatures",
    "EvalExamples",
    "CollateEval",
]

MODEL_INPUTS = ("input_ids", "token_type_ids", "attention_mask")


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

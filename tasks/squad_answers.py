"""SQuAD's post-processing as ``run_qa.py`` does it: the best answer span over a question's windows (the n-best
search over start and end logits), and the predicted text of each question of a batch."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from birder_repro.tasks.squad_features import Settings

__all__ = ["best_span", "predict_answers"]


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

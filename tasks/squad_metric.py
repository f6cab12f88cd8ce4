"""The official SQuAD v1.1 evaluation: answer normalisation, exact match and token F1, max over gold answers.

A transcription of ``evaluate-v1.1.py``, the script the SQuAD 1.1 leaderboard scores with (Rajpurkar et al.,
"SQuAD: 100,000+ Questions for Machine Comprehension of Text", EMNLP 2016; the script is distributed with the
dataset at https://rajpurkar.github.io/SQuAD-explorer/). Birder paper, Table 2 reports these two numbers:
``exact_match`` and ``f1`` in percent over the 10,570 questions of the development set.

Both scores of one question are the maximum over its gold answers (the development set has three per question,
from different crowd workers). The functions below score one question; :func:`evaluate` scores a whole set.
"""

from __future__ import annotations

import re
import string
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence

__all__ = ["normalize_answer", "exact_match_score", "f1_score", "metric_max_over_ground_truths", "score", "evaluate"]

_PUNCTUATION = frozenset(string.punctuation)
_ARTICLES = re.compile(r"\b(a|an|the)\b")


def normalize_answer(s: str) -> str:
    """Lower case, drop punctuation, drop the articles a/an/the, collapse whitespace (evaluate-v1.1.py)."""
    s = s.lower()
    s = "".join(ch for ch in s if ch not in _PUNCTUATION)
    s = _ARTICLES.sub(" ", s)
    return " ".join(s.split())


def exact_match_score(prediction: str, ground_truth: str) -> bool:
    return normalize_answer(prediction) == normalize_answer(ground_truth)


def f1_score(prediction: str, ground_truth: str) -> float:
    """Harmonic mean of token precision and recall of the normalised answers (tokens as a multiset)."""
    prediction_tokens = normalize_answer(prediction).split()
    ground_truth_tokens = normalize_answer(ground_truth).split()
    num_same = sum((Counter(prediction_tokens) & Counter(ground_truth_tokens)).values())
    if num_same == 0:  # also when either side normalises to nothing
        return 0.0
    precision = num_same / len(prediction_tokens)
    recall = num_same / len(ground_truth_tokens)
    return 2 * precision * recall / (precision + recall)


def metric_max_over_ground_truths(
    metric_fn: Callable[[str, str], float], prediction: str, ground_truths: Sequence[str]
) -> float:
    """The best score of ``prediction`` against any of the gold answers."""
    if not ground_truths:
        raise ValueError("a question needs at least one gold answer")
    return max(float(metric_fn(prediction, gt)) for gt in ground_truths)


def score(prediction: str, ground_truths: Sequence[str]) -> tuple[float, float]:
    """(exact match, F1) of one question, each in [0, 1]."""
    return (
        metric_max_over_ground_truths(exact_match_score, prediction, ground_truths),
        metric_max_over_ground_truths(f1_score, prediction, ground_truths),
    )


def evaluate(gold: Iterable[tuple[str, Sequence[str]]], predictions: Mapping[str, str]) -> dict[str, float]:
    """``exact_match`` and ``f1`` in percent over ``gold`` = (question id, gold answers) pairs.

    As in evaluate-v1.1.py, a question without a prediction scores 0 and still counts.
    """
    em = f1 = 0.0
    total = 0
    for qid, answers in gold:
        total += 1
        if qid in predictions:
            e, f = score(predictions[qid], answers)
            em, f1 = em + e, f1 + f
    if total == 0:
        raise ValueError("no questions to evaluate")
    return {"exact_match": 100.0 * em / total, "f1": 100.0 * f1 / total}

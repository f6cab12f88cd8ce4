"""BERT pretraining's masking and sequence assembly: segment pairs in, masked model inputs and labels out.

BERT's masked-LM corruption as Google's ``create_pretraining_data.py`` (github.com/google-research/bert) does it
(Devlin et al. 2019, section 3.1, "Task #1: Masked LM"): 15 % of the tokens predicted, 80 % of those [MASK],
10 % a random token, 10 % unchanged; ``[CLS] A [SEP] B [SEP]`` padded; too-long pairs cut from the longer segment.
The tasks' datasets (``tasks.bert_pretrain``) derive from :class:`MaskedSequences`.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch.utils.data import Dataset

from birder_repro.tasks.bert_common import SpecialIds


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

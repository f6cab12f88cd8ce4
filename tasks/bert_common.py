"""Pieces the BERT tasks (``bert_squad``, ``bert_pretrain``) share: model sizes, tokenizer and checkpoint loading.

Models and tokenizers come from Hugging Face ``transformers`` (the paper fine-tunes "a pre-trained BERT-Base model
checkpoint from HuggingFace", Birder paper, section 5.1). Everything here works offline: ``model.checkpoint``
and ``model.tokenizer`` may name a local directory, and a missing directory is an error that names the setting,
raised before ``transformers`` is asked (a hub lookup without a network retries for minutes before failing).

Synthetic data needs no tokenizer: its token ids follow :data:`SYNTHETIC_SPECIALS`, the order in which a BERT
WordPiece ``vocab.txt`` written for tests lists its special tokens.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

try:
    import transformers
    from transformers import BertConfig, BertTokenizerFast
except ImportError as err:  # the BERT tasks are an optional extra; say which
    raise ImportError(
        "the BERT tasks (bert_squad, bert_pretrain) need transformers>=5 and tokenizers: "
        "pip install 'birder-repro[nlp]'"
    ) from err

from birder_repro.tasks.common import pick_size

__all__ = [
    "SIZES",
    "bert_config",
    "SpecialIds",
    "SYNTHETIC_SPECIALS",
    "is_local_path",
    "load_tokenizer",
    "load_pretrained",
    "tokenizer_source",
    "vocab_size_for",
    "to_device",
]

# model.size -> (layers, hidden size, attention heads, feed-forward size). full is BERT-Base (Devlin et al. 2019,
# "BERT: Pre-training of Deep Bidirectional Transformers", section 3: L=12, H=768, A=12, 4H feed-forward), the
# model of Birder paper, Table 2 and appendix C; large is BERT-Large (the same section: L=24, H=1024, A=16, 4H
# feed-forward), the model of the 1-bit Adam and 1-bit LAMB papers' pre-training; tiny is for CPU smoke runs,
# only ever chosen explicitly.
SIZES = {
    "full": (12, 768, 12, 3072),
    "large": (24, 1024, 16, 4096),
    "tiny": (2, 32, 2, 128),
}


def bert_config(size: str, vocab_size: int, max_positions: int = 512, pad_token_id: int = 0) -> BertConfig:
    """A BertConfig of the ``model.size`` preset; BERT's other defaults (GELU, dropout 0.1, 2 token types)."""
    layers, hidden, heads, ffn = pick_size(size, SIZES)
    return BertConfig(
        vocab_size=int(vocab_size),
        hidden_size=hidden,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        intermediate_size=ffn,
        max_position_embeddings=max(512, int(max_positions)),
        pad_token_id=int(pad_token_id),
    )


@dataclass(frozen=True)
class SpecialIds:
    """The special token ids a task builds sequences with."""

    pad: int
    unk: int
    cls: int
    sep: int
    mask: int

    @property
    def first_ordinary(self) -> int:
        """Synthetic data draws ordinary tokens from here on (above every special id)."""
        return max(self.pad, self.unk, self.cls, self.sep, self.mask) + 1

    @classmethod
    def of(cls, tokenizer) -> SpecialIds:
        return cls(
            tokenizer.pad_token_id,
            tokenizer.unk_token_id,
            tokenizer.cls_token_id,
            tokenizer.sep_token_id,
            tokenizer.mask_token_id,
        )


# [PAD] [UNK] [CLS] [SEP] [MASK] as the first five lines of a vocab.txt. (bert-base-uncased's own vocabulary puts
# them at 0, 100, 101, 102, 103; synthetic ids need not match any real vocabulary.)
SYNTHETIC_SPECIALS = SpecialIds(pad=0, unk=1, cls=2, sep=3, mask=4)


# --------------------------------------------------------------------------------------------------------------
# Local paths and hub names


def is_local_path(name: str) -> bool:
    """A local path rather than a hub id: it exists, or it is written as one (``/``, ``./``, ``../``, ``~``).

    ``google/bert_uncased_L-2_H-128_A-2`` is a hub id; ``./bert`` and ``/data/bert`` are paths, and a path that
    does not exist is an error here, never a hub lookup.
    """
    return os.path.exists(os.path.expanduser(name)) or name.startswith(("/", ".", "~"))


def _local_dir(name: str, setting: str, holds: str) -> str:
    path = os.path.expanduser(name)
    if not os.path.isdir(path):
        raise FileNotFoundError(
            f"{setting}={name!r}: no such directory. Point {setting}=<dir> at a local directory holding {holds}"
        )
    return path


def tokenizer_source(cfg) -> str | None:
    """Where the tokenizer comes from: ``model.tokenizer``, else the checkpoint (full size only), else None."""
    if cfg.model.get("tokenizer"):
        return str(cfg.model.tokenizer)
    if cfg.model.size == "full" and cfg.model.get("checkpoint"):
        return str(cfg.model.checkpoint)
    return None


def load_tokenizer(source: str | None, lowercase: bool | None = None, setting: str = "model.tokenizer"):
    """A fast WordPiece tokenizer from a local directory (with ``vocab.txt`` or ``tokenizer.json``) or a hub name.

    Fast tokenizers give the character offsets the SQuAD features need. ``lowercase`` (``model.lowercase``)
    overrides the tokenizer's own casing; None keeps it (a directory with only ``vocab.txt`` is uncased).
    transformers 5 ignores an unknown ``vocab_file=`` argument and builds a five-token vocabulary without a
    word of warning; loading through ``from_pretrained`` and checking the size against ``vocab.txt`` rules that
    out.
    """
    if not source:
        raise ValueError(
            f"this run needs a WordPiece tokenizer: set {setting}=<directory with vocab.txt> "
            f"(or model.checkpoint=<checkpoint directory or hub name> with model.size=full)"
        )
    kwargs = {} if lowercase is None else {"do_lower_case": bool(lowercase)}
    if is_local_path(source):
        path = _local_dir(source, setting, "vocab.txt (a BERT WordPiece vocabulary) or tokenizer.json")
        tokenizer = BertTokenizerFast.from_pretrained(path, **kwargs)
        _check_vocab_size(tokenizer, path, setting)
    else:
        tokenizer = _from_hub(BertTokenizerFast, source, setting, **kwargs)
    if not tokenizer.is_fast:
        raise TypeError(f"{setting}={source!r} gave a slow tokenizer; the SQuAD features need character offsets")
    return tokenizer


def _check_vocab_size(tokenizer, path: str, setting: str) -> None:
    vocab_file = os.path.join(path, "vocab.txt")
    if os.path.isfile(vocab_file) and not os.path.isfile(os.path.join(path, "tokenizer.json")):
        with open(vocab_file, encoding="utf-8") as f:
            lines = sum(1 for _ in f)
        if tokenizer.vocab_size != lines:
            raise RuntimeError(
                f"{setting}={path!r}: vocab.txt has {lines} entries but transformers "
                f"{transformers.__version__} built a tokenizer of {tokenizer.vocab_size}"
            )


def _from_hub(cls, name: str, setting: str, **kwargs):
    """``cls.from_pretrained(name)`` for a hub id; a failure says how to run without a network."""
    try:
        return cls.from_pretrained(name, **kwargs)
    except OSError as err:
        raise OSError(
            f"could not load {setting}={name!r} from the Hugging Face hub ({err}). Without a network, "
            f"download it elsewhere and set {setting}=<local directory>"
        ) from err


def load_pretrained(cls, checkpoint: str, setting: str = "model.checkpoint"):
    """``cls.from_pretrained`` on a local checkpoint directory or a hub name (the task's head is new)."""
    if is_local_path(checkpoint):
        return cls.from_pretrained(_local_dir(checkpoint, setting, "config.json and the model weights"))
    return _from_hub(cls, checkpoint, setting)


def vocab_size_for(cfg, tokenizer) -> int:
    """Real data: the tokenizer's vocabulary (with added tokens); synthetic data: ``model.vocab_size``."""
    return len(tokenizer) if tokenizer is not None else int(cfg.model.vocab_size)


def to_device(batch: dict[str, Any], device, keys) -> dict[str, Any]:
    """The model inputs of a batch, on ``device`` (metadata such as SQuAD contexts stays behind)."""
    return {k: batch[k].to(device, non_blocking=True) for k in keys if k in batch}

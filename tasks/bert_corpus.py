"""BERT pretraining's real text: documents, the token cache every process memory-maps, training instances.

The input format of Google's ``create_pretraining_data.py`` (github.com/google-research/bert), or a ``datasets``
corpus, tokenized once into a cache and cut into sequences as ``create_instances_from_document`` does (the
format and the cutting are described in ``tasks.bert_pretrain``'s docstring).
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

from birder_repro.tasks.data_files import pretrain_text_files as text_files

CACHE_VERSION = 1  # bump when the cache's layout changes: old caches are then rebuilt, not misread


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

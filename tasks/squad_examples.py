"""SQuAD 1.1's questions: the official JSON files, or a ``datasets`` corpus with the hub's ``squad`` columns."""

from __future__ import annotations

import json
from dataclasses import dataclass

from birder_repro.tasks.data_files import squad_file

__all__ = ["Example", "read_squad_json", "read_squad_hf", "squad_examples"]


@dataclass
class Example:
    """One question: its context, gold answers (texts) and the first answer's character offset."""

    id: str
    question: str
    context: str
    answers: list[str]
    answer_start: int


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

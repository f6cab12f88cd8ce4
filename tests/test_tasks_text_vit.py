"""The LSTM / Penn Treebank and ViT / ImageNet tasks: models, real-format loading, synthetic data, metrics.

PTB and ImageNet cannot be downloaded here, so the real loaders read small files in the datasets' own formats
that the tests write: PTB's word-level text files (a sentence a line), ImageNet's class folders of JPEGs.
"""

from __future__ import annotations

import math
import os
import random
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from PIL import Image
from torchvision.models.vision_transformer import VisionTransformer

from birder_repro.run import record
from birder_repro.tasks import DatasetNotFound, get_task, list_tasks
from birder_repro.tasks.awd_lstm import HiddenCarry, lstm_lm
from birder_repro.tasks.common import num_parameters
from birder_repro.tasks.ptb_data import (
    EOS,
    UNK,
    BPTTWindows,
    batchify,
    load_ptb,
    markov_chain,
    markov_stream,
    shard,
)
from birder_repro.tasks.vit import SIZES as VIT_SIZES
from birder_repro.tasks.vit import SoftTargets

CPU = torch.device("cpu")
REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(autouse=True)
def _one_thread():
    """One thread: these models are tiny, and on the busy 2-core machine a second thread only adds waiting (a tiny
    LSTM step measured 0.01 s on one thread and 0.38 s on two while other tests ran)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def test_both_tasks_are_registered():
    assert {"lstm_ptb", "vit"} <= set(list_tasks())
    assert get_task("lstm_ptb").name == "lstm_ptb" and get_task("vit").name == "vit"


# ================================================================================================ LSTM / PTB
# A small corpus in PTB's format: lowercase words, "<unk>" for rare ones, one sentence a line, a leading space
# as in Mikolov's files. A tiny grammar, so that a language model can learn it in a few steps.
SUBJECTS, VERBS = ["the cat", "a dog", "the bank"], ["sat", "ate", "bought"]
OBJECTS = ["the mat", "the <unk>", "N years"]
VOCAB = 13  # 12 words + <eos>; every line 5 words + <eos>


def sentences(count: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    return [" " + " ".join([rng.choice(SUBJECTS), rng.choice(VERBS), rng.choice(OBJECTS)]) + " " for _ in range(count)]


@pytest.fixture
def ptb_root(tmp_path):
    """ptb.{train,valid,test}.txt; the test split holds one word the training split lacks ("zebra")."""
    lines = {"train": sentences(400, 1), "valid": sentences(40, 2), "test": sentences(39, 3) + [" the zebra ate "]}
    for split, text in lines.items():
        (tmp_path / f"ptb.{split}.txt").write_text("\n".join(text) + "\n", encoding="utf-8")
    return tmp_path


def lstm_cfg(compose, *overrides: str):
    """The tiny LSTM with short windows, as ``birder-repro task=lstm_ptb model.size=tiny ...`` composes it."""
    return compose(
        [
            "task=lstm_ptb",
            "model.size=tiny",
            "train.batch_size=4",
            "data.bptt=10",
            "data.eval_batch_size=2",
            "data.test_batch_size=1",
            *overrides,
        ]
    )


def perplexities(task, model, loader) -> dict[str, float]:
    sums = task.evaluate(model, loader, CPU)
    return task.finalize({k: s / n for k, (s, n) in sums.items()})


def train_lstm(task, model, data, epochs: int, lr: float = 0.01) -> None:
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    for _ in range(epochs):
        for window in data.train:
            loss, _ = task.loss(model, window, CPU)
            opt.zero_grad()
            loss.backward()
            opt.step()


def test_ptb_vocabulary_comes_from_train_and_every_line_ends_with_eos(compose, ptb_root):
    vocab, streams = load_ptb(lstm_cfg(compose, f"data.root={ptb_root}"))
    first_line = (ptb_root / "ptb.train.txt").read_text().splitlines()[0].split()
    # Ids in order of first occurrence: the first line's distinct words, then <eos>.
    seen = list(dict.fromkeys(first_line + [EOS]))
    assert [vocab.ids[w] for w in seen] == list(range(len(seen)))
    assert len(vocab) == VOCAB
    assert streams["train"].numel() == 400 * 6
    assert (streams["train"] == vocab.ids[EOS]).sum() == 400
    # "zebra" is not in the training vocabulary: it reads as <unk>, as PTB's closed vocabulary would have it.
    assert streams["test"][-3] == vocab.ids[UNK] and streams["test"].numel() == 39 * 6 + 4


def test_ptb_word_outside_a_vocabulary_without_unk_is_an_error(compose, tmp_path):
    for split, text in {"train": " a b \n", "valid": " a b \n", "test": " a c \n"}.items():
        (tmp_path / f"ptb.{split}.txt").write_text(text)
    with pytest.raises(ValueError, match="'c' is not in the training vocabulary"):
        load_ptb(lstm_cfg(compose, f"data.root={tmp_path}"))


def test_missing_ptb_file_names_the_path_and_data_root(compose, ptb_root):
    os.remove(ptb_root / "ptb.valid.txt")
    cfg = lstm_cfg(compose, f"data.root={ptb_root}")
    with pytest.raises(DatasetNotFound) as err:
        get_task("lstm_ptb").build_data(cfg, 0, 1)
    assert str(ptb_root / "ptb.valid.txt") in str(err.value) and "data.root" in str(err.value)


def test_vocabulary_larger_than_the_model_names_model_vocab_size(compose, ptb_root):
    with pytest.raises(ValueError, match="set model.vocab_size=13"):
        get_task("lstm_ptb").build_data(lstm_cfg(compose, f"data.root={ptb_root}", "model.vocab_size=10"), 0, 1)


def test_batchify_and_windows_follow_awd_lstm():
    stream = torch.arange(23)
    matrix = batchify(stream, 2)  # 11 rows; token 22 dropped
    assert matrix[:, 0].tolist() == list(range(11)) and matrix[:, 1].tolist() == list(range(11, 22))
    windows = list(BPTTWindows(matrix, bptt=4))
    assert len(windows) == len(BPTTWindows(matrix, 4)) == 3  # rows 0-3, 4-7, 8-9 (+ targets one row on)
    assert [w.inputs.shape[0] for w in windows] == [4, 4, 2] and [w.index for w in windows] == [0, 1, 2]
    for w in windows:
        assert torch.equal(w.targets, w.inputs + 1)  # the next token of the same column
    with pytest.raises(ValueError, match="cannot fill 4 columns"):
        batchify(torch.arange(7), 4)


def test_training_shards_are_contiguous_and_equal_and_eval_shards_cover_the_stream():
    stream = torch.arange(103)
    train = [shard(stream, r, 3, equal=True) for r in range(3)]
    assert [s.numel() for s in train] == [34] * 3 and torch.equal(torch.cat(train), stream[:102])
    evaluation = [shard(stream, r, 3, equal=False) for r in range(3)]
    assert torch.equal(torch.cat(evaluation), stream)


def test_every_process_gets_as_many_windows_and_a_sample_is_a_window_column(compose, ptb_root):
    cfg = lstm_cfg(compose, f"data.root={ptb_root}", "model.vocab_size=13")
    parts = [get_task("lstm_ptb").build_data(cfg, r, 3) for r in range(3)]
    assert len({len(d.train) for d in parts}) == 1  # DDP runs in lockstep
    # 2,400 tokens / 3 processes = 800 each -> 200 rows of 4 -> 20 windows (199 input rows, 10 a window).
    assert len(parts[0].train) == 20 and parts[0].train_size == 20 * 4 * 3
    first = next(iter(parts[1].train))
    assert first.inputs.shape == (10, 4) and first.index == 0


def test_ptb_real_path_learns_and_reports_finite_perplexities(compose, ptb_root):
    task = get_task("lstm_ptb")
    cfg = lstm_cfg(compose, f"data.root={ptb_root}", "model.vocab_size=13")
    data = task.build_data(cfg, 0, 1)
    assert "Penn Treebank (real)" in data.description and "vocabulary of 13 words" in data.description
    torch.manual_seed(0)
    model = task.build_model(cfg)
    before = perplexities(task, model, data.eval)
    assert set(before) >= {"perplexity", "val_perplexity"}
    assert 8 < before["perplexity"] < 20  # an untrained model is about uniform over the 13 words
    train_lstm(task, model, data, epochs=3)
    after = perplexities(task, model, data.eval)
    # The grammar has 3 x 3 x 3 sentences and fixed word order: well under half the uniform perplexity.
    assert math.isfinite(after["perplexity"]) and after["perplexity"] < 0.5 * before["perplexity"]
    assert after["val_perplexity"] < 0.5 * before["val_perplexity"]


def test_eval_counts_every_predicted_token_once(compose, ptb_root):
    """(NLL sum, token count) per split: the count is the targets of every window of this process's shard."""
    task = get_task("lstm_ptb")
    cfg = lstm_cfg(compose, f"data.root={ptb_root}", "model.vocab_size=13")
    counts = [task.evaluate(task.build_model(cfg), task.build_data(cfg, r, 2).eval, CPU) for r in range(2)]
    # valid: 240 tokens, 120 a process, 2 columns of 60: 59 targets a column; test: 238, 119 a process, 1 column.
    assert [c["val_nll"][1] for c in counts] == [59 * 2] * 2
    assert [c["test_nll"][1] for c in counts] == [118] * 2


def test_hidden_state_carries_over_windows_and_repeats_leave_no_trace(compose):
    """The timing calibration runs forward + backward on one window several times: the carried state must be
    the same as without those passes (dropout off, so that the losses compare exactly)."""
    task = get_task("lstm_ptb")
    no_dropout = [f"model.{k}=0" for k in ("dropout", "dropouth", "dropouti", "dropoute", "wdrop")]
    cfg = lstm_cfg(
        compose,
        "data.source=synthetic",
        "model.vocab_size=20",
        "data.synthetic_train_tokens=800",
        "data.synthetic_valid_tokens=100",
        "data.synthetic_test_tokens=100",
        *no_dropout,
    )
    windows = list(task.build_data(cfg, 0, 1).train)[:3]
    torch.manual_seed(0)
    model = task.build_model(cfg)
    plain = [task.loss(model, w, CPU)[0].item() for w in windows]
    repeated = []
    for w in windows:
        for _ in range(3):  # as calibrate_forward_backward does
            loss = task.loss(model, w, CPU)[0].item()
        repeated.append(loss)
    assert repeated == pytest.approx(plain, abs=1e-6)
    # Window 1 from the carried state differs from window 1 from zeros: the state is really carried.
    fresh = task.loss(model, windows[1]._replace(index=7), CPU)[0].item()
    assert fresh != pytest.approx(plain[1], abs=1e-6)


def test_carry_rules():
    carry, zeros = HiddenCarry(), lambda: "zeros"
    assert carry.start_of(0, zeros) == "zeros"
    start, end = [(torch.zeros(1), torch.zeros(1))], [(torch.ones(1, requires_grad=True), torch.ones(1))]
    carry.store(4, start, end)
    assert carry.start_of(4, zeros) is start  # the same window again
    assert torch.equal(carry.start_of(5, zeros)[0][0], torch.ones(1)) and not carry.end[0][0].requires_grad
    assert carry.start_of(0, zeros) == "zeros" and carry.start_of(6, zeros) == "zeros"  # new epoch, gap


def test_synthetic_streams_are_said_to_be_synthetic_learnable_and_the_same_on_every_process(compose):
    task = get_task("lstm_ptb")
    cfg = lstm_cfg(
        compose,
        "data.source=synthetic",
        "model.vocab_size=30",
        "data.synthetic_train_tokens=4000",
        "data.synthetic_valid_tokens=400",
        "data.synthetic_test_tokens=400",
        "train.batch_size=8",
    )
    data = task.build_data(cfg, 0, 2)
    assert "SYNTHETIC" in data.description and "data.source=synthetic" in data.description
    chain = markov_chain(30, 4, 0)
    assert torch.equal(markov_stream(chain, 500, 1), markov_stream(chain, 500, 1))
    torch.manual_seed(0)
    model = task.build_model(cfg)
    before = perplexities(task, model, data.eval)["val_perplexity"]
    train_lstm(task, model, data, epochs=4, lr=0.02)
    after = perplexities(task, model, data.eval)["val_perplexity"]
    assert before > 25 and after < 0.7 * before  # 4 likely successors a word: far below 30 once learned


def test_full_lstm_has_awd_lstm_sizes_and_24_2m_parameters():
    model = lstm_lm(10000)
    # Embedding 10,000 x 400 (tied with the decoder) + decoder bias 10,000 + LSTMs 400->1150, 1150->1150,
    # 1150->400 (4 gates, input and hidden weights, two biases each): 24,221,600, AWD-LSTM's "24M" for PTB.
    assert (
        num_parameters(model)
        == 10000 * 400 + 10000 + sum(4 * h * (i + h) + 8 * h for i, h in [(400, 1150), (1150, 1150), (1150, 400)])
        == 24_221_600
    )
    assert model.decoder_bias.shape == (10000,) and len(model.rnns) == 3


# ================================================================================================ ViT / ImageNet


def vit_cfg(compose, *overrides: str):
    return compose(["task=vit", "model.size=tiny", "data.image_size=32", "data.num_workers=0", *overrides])


@pytest.fixture
def imagenet_root(tmp_path):
    """<root>/{train,val}/<wnid>/*.JPEG: 2 classes, 6 train and 2 val images each, of odd sizes."""
    rng = np.random.default_rng(0)
    for split, count in (("train", 6), ("val", 2)):
        for wnid in ("n01440764", "n01443537"):
            folder = tmp_path / split / wnid
            folder.mkdir(parents=True)
            for i in range(count):
                pixels = rng.integers(0, 256, size=(40 + i, 48, 3), dtype=np.uint8)
                Image.fromarray(pixels).save(folder / f"{wnid}_{i}.JPEG")
    return tmp_path


def test_full_vit_is_torchvision_vit_b_16_with_86_6m_parameters():
    model = VIT_SIZES["full"](1000, 224)
    assert num_parameters(model) == 86_567_656  # torchvision's ViT_B_16_Weights.IMAGENET1K_V1 num_params
    assert (model.patch_size, len(model.encoder.layers), model.hidden_dim) == (16, 12, 768)


def test_tiny_vit_is_the_same_class_and_runs_forward(compose):
    task = get_task("vit")
    model = task.build_model(vit_cfg(compose, "model.num_classes=7"))
    assert type(model) is VisionTransformer  # what torchvision's vit_b_16 builds
    assert model(torch.randn(3, 3, 32, 32)).shape == (3, 7)


def test_vit_reads_image_folders_with_the_recipe_augmentation(compose, imagenet_root):
    task = get_task("vit")
    cfg = vit_cfg(compose, f"data.root={imagenet_root}", "model.num_classes=2", "train.batch_size=4")
    data = task.build_data(cfg, 0, 1)
    assert "ImageNet (real)" in data.description and "RandAugment" in data.description
    assert "label smoothing 0.11" in data.description
    assert len(data.train) == 3  # 12 images / 4
    images, targets = next(iter(data.train))
    assert images.shape == (4, 3, 32, 32)
    # Soft targets: mixed one-hots, smoothed; every row a distribution with at least 0.11 / 2 on each class.
    assert targets.shape == (4, 2) and torch.allclose(targets.sum(1), torch.ones(4))
    assert (targets >= 0.11 / 2 - 1e-6).all()
    torch.manual_seed(0)
    model = task.build_model(cfg)
    loss, n = task.loss(model, (images, targets), CPU)
    assert n == 4 and math.isfinite(loss.item())
    sums = task.evaluate(model, data.eval, CPU)
    assert sums["top1"][1] == 4  # every validation image once, with its hard label
    metrics = task.finalize({k: s / c for k, (s, c) in sums.items()})
    assert 0 <= metrics["top1"] <= 100 and metrics["top5"] == 100  # 2 classes: always in the top 5


def test_missing_imagenet_names_the_path_and_data_root(compose, tmp_path):
    with pytest.raises(DatasetNotFound) as err:
        get_task("vit").build_data(vit_cfg(compose, f"data.root={tmp_path}"), 0, 1)
    assert str(tmp_path / "train") in str(err.value) and "data.root" in str(err.value)


def test_vit_synthetic_is_said_to_be_synthetic(compose):
    cfg = vit_cfg(
        compose,
        "data.source=synthetic",
        "model.num_classes=10",
        "data.synthetic_train_size=32",
        "data.synthetic_eval_size=8",
        "train.batch_size=8",
    )
    data = get_task("vit").build_data(cfg, 1, 2)
    assert "SYNTHETIC" in data.description and "data.source=synthetic" in data.description
    assert "RandAugment" not in data.description  # tensors, not pictures
    images, targets = next(iter(data.train))
    assert images.shape == (8, 3, 32, 32) and targets.shape == (8, 10)


def test_soft_targets_fold_label_smoothing_into_the_cross_entropy():
    """CE against (1 - e) one-hot + e / C is what F.cross_entropy(label_smoothing=e) computes."""
    logits, labels = torch.randn(5, 4), torch.tensor([0, 3, 1, 1, 2])
    _, smoothed = SoftTargets(4, 0.0, 0.0, 0.11)(torch.zeros(5, 3, 2, 2), labels)
    assert torch.allclose(F.cross_entropy(logits, smoothed), F.cross_entropy(logits, labels, label_smoothing=0.11))
    plain = SoftTargets(4, 0.0, 0.0, 0.0)
    assert plain.identity and plain(torch.zeros(5, 3, 2, 2), labels)[1] is labels
    with pytest.raises(ValueError, match="label_smoothing"):
        SoftTargets(4, 0.2, 1.0, 1.0)


# ================================================================================================ end to end


def birder_repro(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    """``birder-repro ARGS`` in a fresh interpreter, as a user runs it (BIRDER_RUNS: the test's runs directory)."""
    return subprocess.run(
        [sys.executable, "-m", "birder_repro.cli", "logger=none", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )


def only_record(runs_dir: Path) -> dict:
    (path,) = runs_dir.rglob(record.RECORD_FILE)
    return record.read_record(path.parent)


@pytest.mark.slow  # 21 s; PTB's files read and its perplexity stay by default (the loader and metric tests above)
def test_ptb_files_train_with_birder_on_two_nodes_and_record_perplexity(ptb_root, runs_dir):
    """The real-format path through the whole runner: DDP over 2 gloo processes, Birder's 1-bit hook, the
    carried hidden state, weight-dropped LSTMs and the tied decoder, evaluation summed over the processes."""
    out = birder_repro(
        "task=lstm_ptb",
        "optim=birder",
        "nodes=2",
        "gpus_per_node=1",
        "model.size=tiny",
        f"data.root={ptb_root}",
        "model.vocab_size=13",
        "train.batch_size=4",
        "data.bptt=10",
        "train.steps=8",
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "Penn Treebank (real)" in out.stdout
    rec = only_record(runs_dir)
    assert rec["status"] == "completed" and rec["world_size"] == 2 and rec["steps"] == 8
    assert rec["inter_node_bytes_per_step"] > 0
    assert 1 < rec["metrics"]["perplexity"] < 30 and 1 < rec["metrics"]["val_perplexity"] < 30


@pytest.mark.slow
def test_vit_image_folders_train_with_sgdm_on_two_nodes_and_record_top1(imagenet_root, runs_dir):
    out = birder_repro(
        "task=vit",
        "optim=sgdm",
        "nodes=2",
        "gpus_per_node=1",
        "model.size=tiny",
        f"data.root={imagenet_root}",
        "data.image_size=32",
        "data.num_workers=0",
        "model.num_classes=2",
        "train.batch_size=2",
        "train.steps=4",
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    rec = only_record(runs_dir)
    assert rec["status"] == "completed" and 0 <= rec["metrics"]["top1"] <= 100

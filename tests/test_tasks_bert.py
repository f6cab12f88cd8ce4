"""The BERT tasks (bert_squad, bert_pretrain): the SQuAD metric, real-format loading, synthetic data, recipes.

Checkpoints and datasets cannot be downloaded here: the tests write a WordPiece vocab.txt, SQuAD 1.1 JSON files
and pretraining text files in their real formats, and use a tiny randomly initialised BERT (model.size=tiny).
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import re
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from birder_repro.tasks import DatasetNotFound, get_task, list_tasks
from birder_repro.tasks import squad_metric as sm

CPU = torch.device("cpu")
needs_transformers = pytest.mark.skipif(
    importlib.util.find_spec("transformers") is None, reason="the BERT tasks need the nlp extra (transformers)"
)


@pytest.fixture(autouse=True)
def _one_thread():
    """Tiny BERTs gain nothing from a second thread, and while other processes share the machine's 2 cores,
    OpenMP threads waiting on each other made these steps 10x slower (measured: 0.7 s against 6.9 s)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


# ------------------------------------------------------------------------------------------ the SQuAD metric


def test_normalize_answer_as_the_official_script():
    assert sm.normalize_answer("The Cat!") == "cat"
    assert sm.normalize_answer("  an  Apple, a day ") == "apple day"
    assert sm.normalize_answer("theory") == "theory"  # articles only as whole words
    assert sm.normalize_answer("A.D. 1066") == "ad 1066"


def test_exact_match_and_f1_by_hand():
    assert sm.exact_match_score("The Cat", "cat")
    assert not sm.exact_match_score("black cat", "cat")
    # "in the park" -> [in, park]; "the big park" -> [big, park]: 1 common, precision 1/2, recall 1/2.
    assert sm.f1_score("in the park", "the big park") == pytest.approx(0.5)
    # [red, car, parked, outside] vs [red, car]: 2 common, precision 2/4, recall 2/2 -> 2 * 0.5 / 1.5.
    assert sm.f1_score("a red car parked outside", "the red car") == pytest.approx(2 / 3)
    assert sm.f1_score("", "cat") == 0.0 and sm.f1_score("the", "a") == 0.0  # nothing left after normalising
    assert sm.f1_score("cat cat", "cat") == pytest.approx(2 * 0.5 * 1 / 1.5)  # tokens count as a multiset


def test_max_over_gold_answers_and_whole_set():
    assert sm.score("Denver Broncos", ["Broncos", "Denver Broncos", "the Broncos"]) == (1.0, 1.0)
    em, f1 = sm.score("Broncos team", ["Denver Broncos", "Carolina Panthers"])
    assert em == 0.0 and f1 == pytest.approx(0.5)
    gold = [("q1", ["Paris"]), ("q2", ["on the mat", "the mat"]), ("q3", ["1066"])]
    # q1 exact, q2: [mat] vs [on, mat] -> F1 2/3, vs [mat] -> EM 1; q3 has no prediction: 0, still counted.
    result = sm.evaluate(gold, {"q1": "paris", "q2": "mat"})
    assert result["exact_match"] == pytest.approx(100 * 2 / 3)
    assert result["f1"] == pytest.approx(100 * 2 / 3)
    with pytest.raises(ValueError):
        sm.score("x", [])


# -------------------------------------------------------------------------------------------- files we write

SQUAD_ARTICLES = [
    (
        "Cats",
        "The cat sat on the mat in the big park. It was a sunny day in Paris, and the cat liked the sun.",
        [("Where did the cat sit?", "on the mat"), ("Which city was it in?", "Paris")],
    ),
    (
        "Normans",
        "The Normans were the people who in the 10th and 11th centuries gave their name to Normandy, a "
        "region in France. They were descended from Norse raiders and pirates from Denmark, Iceland and Norway "
        "who, under their leader Rollo, agreed to swear fealty to King Charles III of West Francia. Through "
        "generations of assimilation and mixing with the native Frankish and Roman-Gaulish populations, their "
        "descendants would gradually merge with the Carolingian-based cultures of West Francia. The distinct "
        "cultural and ethnic identity of the Normans emerged initially in the first half of the 10th century, "
        "and it continued to evolve over the succeeding centuries.",
        [
            ("In what country is Normandy located?", "France"),
            ("Who was the Norse leader?", "Rollo"),
            ("When did the identity of the Normans emerge?", "first half of the 10th century"),
        ],
    ),
    (
        "Rivers",
        "The Rhine flows from the Swiss Alps to the North Sea. It is one of the longest rivers in Europe.",
        [("Where does the Rhine flow to?", "the North Sea")],
    ),
]

PRETRAIN_DOCS = [
    ["The cat sat on the mat.", "It was a sunny day in Paris.", "The cat liked the sun.", "Then it slept."],
    [
        "The Rhine flows from the Swiss Alps to the North Sea.",
        "It is one of the longest rivers in Europe.",
        "Ships carry goods on it.",
    ],
    [
        "The Normans gave their name to Normandy.",
        "Normandy is a region in France.",
        "Rollo was their leader.",
        "They swore fealty to King Charles.",
        "Their identity emerged in the 10th century.",
    ],
    ["Paris is the capital of France.", "The city sits on the Seine."],
    ["Denmark, Iceland and Norway are Nordic countries.", "Their raiders sailed far."],
]


def squad_json(articles) -> dict:
    data = []
    for a, (title, context, qas) in enumerate(articles):
        entries = [
            {
                "id": f"{a}-{q}",
                "question": question,
                "answers": [{"text": answer, "answer_start": context.index(answer)}] * 2,
            }
            for q, (question, answer) in enumerate(qas)
        ]
        data.append({"title": title, "paragraphs": [{"context": context, "qas": entries}]})
    return {"version": "1.1", "data": data}


@pytest.fixture(scope="module")
def vocab_dir(tmp_path_factory):
    """A WordPiece vocab.txt: BERT's five special tokens, punctuation, and every word of the test texts."""
    texts = [c for _, c, qas in SQUAD_ARTICLES for q in qas for c in q] + [c for _, c, _ in SQUAD_ARTICLES]
    texts += [s for doc in PRETRAIN_DOCS for s in doc]
    words = sorted({w for t in texts for w in re.findall(r"\w+", t.lower())})
    folder = tmp_path_factory.mktemp("vocab")
    tokens = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *".,?!'-", *words, "##s", "##ed"]
    (folder / "vocab.txt").write_text("\n".join(tokens) + "\n")
    return folder


@pytest.fixture(scope="module")
def squad_root(tmp_path_factory):
    folder = tmp_path_factory.mktemp("squad")
    (folder / "train-v1.1.json").write_text(json.dumps(squad_json(SQUAD_ARTICLES)))
    (folder / "dev-v1.1.json").write_text(json.dumps(squad_json(SQUAD_ARTICLES[1:])))
    return folder


@pytest.fixture(scope="module")
def text_root(tmp_path_factory):
    """Pretraining text in create_pretraining_data.py's format, over two files (a file also ends a document)."""
    folder = tmp_path_factory.mktemp("wiki")
    blocks = ["\n".join(doc) for doc in PRETRAIN_DOCS]
    (folder / "a.txt").write_text("\n\n".join(blocks[:3]) + "\n")
    (folder / "b.txt").write_text("\n\n\n".join(blocks[3:]))  # several blank lines are one separator
    return folder


def squad_cfg(compose, *overrides):
    return compose(
        [
            "task=bert_squad",
            "model.size=tiny",
            "data.num_workers=0",
            "data.max_seq_length=64",
            "data.doc_stride=16",
            "data.max_query_length=12",
            "train.batch_size=2",
            "data.eval_batch_size=2",
            *overrides,
        ]
    )


def pretrain_cfg(compose, *overrides):
    return compose(
        [
            "task=bert_pretrain",
            "model.size=tiny",
            "data.num_workers=0",
            "data.max_seq_length=32",
            "train.batch_size=4",
            "data.eval_batch_size=4",
            *overrides,
        ]
    )


# ------------------------------------------------------------------------------------------------ configs


def test_tasks_registered_with_bertadam_baseline(compose):
    assert {"bert_squad", "bert_pretrain"} <= set(list_tasks())
    for name in ("bert_squad", "bert_pretrain"):
        cfg = compose([f"task={name}"])
        assert cfg.task.baseline == "bertadam" and cfg.model.size == "full" and cfg.data.source == "real"


def test_paper_recipes(compose):
    # Birder paper, section 5.1: 3 per GPU, 2 epochs, warm up to 1e-4 over 500 steps then linear to 0.
    cfg = compose(["task=bert_squad", "optim=bertadam"])
    assert (cfg.train.epochs, cfg.train.batch_size) == (2, 3)
    assert (cfg.train.schedule.name, cfg.train.schedule.warmup) == ("warmup_linear", 500)
    assert (cfg.optim.lr, list(cfg.optim.betas)) == (1e-4, [0.9, 0.999])
    assert (cfg.data.max_seq_length, cfg.data.doc_stride, cfg.data.max_query_length) == (384, 128, 64)
    assert (cfg.data.n_best_size, cfg.data.max_answer_length) == (20, 30)
    birder = compose(["task=bert_squad", "optim=birder"]).optim
    assert (birder.lr, birder.beta) == (1e-4, 0.9)
    onebit = compose(["task=bert_squad", "optim=onebit_adam"]).optim
    assert (onebit.lr, onebit.freeze, list(onebit.betas)) == (1e-4, 0.2, [0.9, 0.999])
    # appendix C: 16 per GPU, 37,000 iterations, 4e-4 warmed up over 12,500 then linear to 0, length 512.
    cfg = compose(["task=bert_pretrain", "optim=bertadam"])
    assert (cfg.train.steps, cfg.train.batch_size, cfg.data.max_seq_length) == (37000, 16, 512)
    assert (cfg.train.schedule.name, cfg.train.schedule.warmup) == ("warmup_linear", 12500)
    assert (cfg.optim.lr, list(cfg.optim.betas)) == (4e-4, [0.9, 0.999])
    birder = compose(["task=bert_pretrain", "optim=birder"]).optim
    assert (birder.lr, birder.beta) == (4e-4, 0.9)


@needs_transformers
def test_full_size_is_bert_base(compose):
    from birder_repro.tasks.common import num_parameters

    with torch.device("meta"):  # shapes only: no 110M random numbers to draw
        squad = get_task("bert_squad").build_model(
            compose(["task=bert_squad", "model.checkpoint=null", "data.source=synthetic"])
        )
        pretrain = get_task("bert_pretrain").build_model(compose(["task=bert_pretrain", "data.source=synthetic"]))
    # bert-base-uncased with a start/end layer and no pooler (Hugging Face's BertForQuestionAnswering).
    assert num_parameters(squad) == 108_893_186
    assert num_parameters(pretrain) == 110_106_428  # BERT-Base with its MLM (tied) and NSP heads


@needs_transformers
def test_large_size_is_bert_large(compose):
    """model.size=large: BERT-Large (Devlin et al. 2019, section 3: L=24, H=1024, A=16, 4H feed-forward), the
    same code path as full, built on the meta device (shapes only: no 1.3 GB of weights)."""
    from birder_repro.tasks.common import num_parameters

    cfg = compose(["task=bert_pretrain", "data.source=synthetic", "model.size=large"])
    with torch.device("meta"):
        model = get_task("bert_pretrain").build_model(cfg)
    c = model.config
    assert (c.num_hidden_layers, c.hidden_size, c.num_attention_heads, c.intermediate_size) == (24, 1024, 16, 4096)
    # embeddings 31,782,912 (30522 + 512 + 2 rows of 1024, LayerNorm) + 24 layers x 12,596,224 + pooler 1,049,600
    # + MLM head 1,082,170 (transform and LayerNorm, a bias per token; its decoder tied to the embeddings)
    # + NSP 2,050: the papers' "340M" (1-bit Adam paper, section 7.1) as built
    assert num_parameters(model) == 336_226_108
    # what mode=advise's BERT-Large profiles (perf/profiles/paper.yaml) price the exchange of
    from birder_repro.perf.paper_profiles import v100_rows

    assert {int(r["parameter_count"]) for r in v100_rows().values()} == {num_parameters(model)}


# ------------------------------------------------------------------------------------------- SQuAD pieces


@needs_transformers
def test_answer_positions_inside_outside_and_at_the_window_end():
    from birder_repro.tasks.squad_features import answer_positions

    # [CLS] q q [SEP] c0 c1 c2 [SEP] [PAD]; context words at characters 0-3, 4-7, 8-11.
    offsets = [(0, 0), (0, 3), (4, 6), (0, 0), (0, 3), (4, 7), (8, 11), (0, 0), (0, 0)]
    seq = [None, 0, 0, None, 1, 1, 1, None, None]
    assert answer_positions(offsets, seq, 4, 7) == (5, 5)
    assert answer_positions(offsets, seq, 0, 11) == (4, 6)
    assert answer_positions(offsets, seq, 8, 11) == (6, 6)  # the last context token: not run into padding
    assert answer_positions(offsets, seq, 9, 15) == (0, 0)  # not wholly inside the window: [CLS]


@needs_transformers
def test_best_span_keeps_context_length_and_order_over_windows():
    from birder_repro.tasks.squad_answers import best_span

    offsets = [[None, (0, 3), (4, 7), (8, 11), None]]
    start = np.array([[9.0, 1.0, 0.0, 5.0, 0.0]])  # [CLS] scores highest but is no context token
    end = np.array([[9.0, 4.0, 2.0, -1.0, 0.0]])
    # (1, 1) scores 1 + 4; (3, 1) would score 9 but ends before it starts; (3, 3) scores 4.
    assert best_span(start, end, offsets, n_best_size=5, max_answer_length=30) == (0, 3)
    start2 = np.array([[0.0, 0.0, 7.0, 0.0, 0.0]])  # a second window of the question, whose (2, 2) scores 9
    assert best_span(np.concatenate([start, start2]), np.concatenate([end, end]), offsets * 2, 5, 30) == (4, 7)
    end2 = np.array([[0.0, 0.0, 0.0, 8.0, 0.0]])  # (2, 3) scores 15 but is 2 tokens long
    assert best_span(start2, end2, offsets, 5, max_answer_length=2) == (4, 11)
    assert best_span(start2, end2, offsets, 5, max_answer_length=1) == (8, 11)
    assert best_span(start2, end2, offsets, n_best_size=1, max_answer_length=1) is None  # only (2, 3) is paired
    assert best_span(start, end, [[None] * 5], 5, 30) is None


@needs_transformers
def test_squad_real_json_train_windows_and_evaluation(compose, vocab_dir, squad_root):
    from birder_repro.tasks.bert_common import load_tokenizer
    from birder_repro.tasks.squad_features import Settings, answer_positions, tokenize_windows

    task = get_task("bert_squad")
    cfg = squad_cfg(compose, f"model.tokenizer={vocab_dir}", f"data.root={squad_root}")
    data = task.build_data(cfg, 0, 1)
    assert "(real)" in data.description and "SYNTHETIC" not in data.description
    assert "6 training questions" in data.description
    # The long Normans context does not fit 64 tokens: it is cut into overlapping windows.
    assert data.train_size > 6
    tokenizer = load_tokenizer(str(vocab_dir))
    arrays = data.train.dataset.arrays
    answers = [a for _, _, qas in SQUAD_ARTICLES for _, a in qas]
    labelled = 0
    for ids, s, e in zip(arrays["input_ids"], arrays["start_positions"], arrays["end_positions"]):
        if s > 0:  # the window holds the answer: its tokens decode to one of the answers
            assert tokenizer.decode(ids[s : e + 1].tolist()) in [a.lower() for a in answers]
            labelled += 1
    assert labelled >= 6
    batch = next(iter(data.train))
    assert batch["input_ids"].shape == (2, 64) and batch["start_positions"].shape == (2,)
    model = task.build_model(cfg)
    loss, n = task.loss(model, batch, CPU)
    assert n == 2 and math.isfinite(float(loss.detach()))

    # An oracle that puts the highest logits on the gold tokens of each window: the post-processing must map
    # them back to the answer text, exact match 100 %.
    s = Settings.of(cfg)
    gold = {}
    for _, context, qas in SQUAD_ARTICLES[1:]:
        for question, answer in qas:
            ex = SimpleNamespace(question=question, context=context)
            enc = tokenize_windows(tokenizer, [ex], s)
            for w, ids in enumerate(enc["input_ids"]):
                start = context.index(answer)
                gold[tuple(ids)] = answer_positions(
                    enc["offset_mapping"][w], enc.sequence_ids(w), start, start + len(answer)
                )

    class Oracle(torch.nn.Module):
        def forward(self, input_ids, token_type_ids, attention_mask):
            start, end = torch.zeros(input_ids.shape), torch.zeros(input_ids.shape)
            for row, ids in enumerate(input_ids.tolist()):
                a, b = gold[tuple(ids)]
                start[row, a] += 10 * (a > 0)
                end[row, b] += 10 * (b > 0)
            return SimpleNamespace(start_logits=start, end_logits=end)

    sums = task.evaluate(Oracle(), data.eval, CPU)
    assert sums == {"exact_match": (4.0, 4.0), "f1": (4.0, 4.0)}
    assert task.finalize({k: a / b for k, (a, b) in sums.items()}) == {"exact_match": 100.0, "f1": 100.0}
    sums = task.evaluate(model, data.eval, CPU)  # an untrained model: scores in range, every question counted
    assert sums["f1"][1] == 4.0 and 0.0 <= sums["exact_match"][0] <= sums["f1"][0] <= 4.0


@needs_transformers
def test_squad_evaluation_shards_keep_questions_whole(compose, vocab_dir, squad_root):
    task = get_task("bert_squad")
    cfg = squad_cfg(compose, f"model.tokenizer={vocab_dir}", f"data.root={squad_root}")
    seen = []
    for rank in range(2):
        for batch in task.build_data(cfg, rank, 2).eval:
            windows = sum(len(m["offsets"]) for m in batch["meta"])
            assert batch["input_ids"].shape[0] == windows  # every window of every question of the batch
            seen += [m["id"] for m in batch["meta"]]
    assert sorted(seen) == ["0-0", "0-1", "0-2", "1-0"]  # each question on exactly one process


@needs_transformers
def test_squad_synthetic_marks_the_answer_and_scores_it(compose):
    task = get_task("bert_squad")
    cfg = squad_cfg(
        compose,
        "data.source=synthetic",
        "model.vocab_size=64",
        "data.synthetic_train_size=64",
        "data.synthetic_eval_size=6",
    )
    data = task.build_data(cfg, 0, 1)
    assert data.description.startswith("SYNTHETIC") and "data.source=synthetic" in data.description
    batch = next(iter(data.train))
    ids, s, e = batch["input_ids"], batch["start_positions"], batch["end_positions"]
    for row in range(2):  # the markers sit right around the labelled span
        assert (int(ids[row, s[row] - 1]), int(ids[row, e[row] + 1])) == (5, 6)
        assert 0 < s[row] <= e[row]
    sums = task.evaluate(task.build_model(cfg), data.eval, CPU)
    assert sums["exact_match"][1] == sums["f1"][1] == 6.0


# --------------------------------------------------------------------------------------- pretraining pieces


@needs_transformers
def test_truncate_pair_matches_the_one_token_loop():
    from birder_repro.tasks.bert_masking import truncate_pair

    def loop(a, b, m):  # create_pretraining_data.py's truncate_seq_pair, always from the end
        while a + b > m:
            if a > b:
                a -= 1
            else:
                b -= 1
        return a, b

    rng = np.random.default_rng(0)
    for a, b, m in rng.integers(0, 40, (500, 3)).tolist():
        assert truncate_pair(a, b, m) == loop(a, b, m)


@needs_transformers
def test_mask_tokens_counts_and_80_10_10():
    from birder_repro.tasks.bert_masking import mask_tokens

    g = torch.Generator().manual_seed(0)
    ids = torch.arange(10, 110)
    maskable = torch.ones(100, dtype=torch.bool)
    maskable[:5] = False
    kinds = torch.zeros(3)
    for _ in range(400):
        corrupted, labels = mask_tokens(ids, maskable, 100, vocab_size=1000, mask_id=4, prob=0.15, generator=g)
        picked = labels != -100
        assert int(picked.sum()) == 15 and not picked[:5].any()
        assert torch.equal(labels[picked], ids[picked]) and torch.equal(corrupted[~picked], ids[~picked])
        kinds += torch.tensor([(corrupted[picked] == 4).sum(), (corrupted[picked] == ids[picked]).sum(), 0.0])
    kinds[2] = 400 * 15 - kinds[0] - kinds[1]
    assert torch.allclose(kinds / (400 * 15), torch.tensor([0.8, 0.1, 0.1]), atol=0.025)
    _, labels = mask_tokens(ids[:3], torch.tensor([False, True, False]), 3, 1000, 4, 0.15, g)
    assert int((labels != -100).sum()) == 1  # at least one, only where maskable


@needs_transformers
def test_create_instances_pairs_and_single_segments():
    from birder_repro.tasks.bert_corpus import Corpus, create_instances

    # 3 documents of 6, 4 and 5 sentences of 3..7 tokens; token ids = positions, so ranges are checkable.
    rng = np.random.default_rng(1)
    lengths = rng.integers(3, 8, 15)
    sentences = np.concatenate([[0], np.cumsum(lengths)])
    corpus = Corpus(np.arange(sentences[-1]), sentences, np.array([0, 6, 10, 15]))
    doc_of = (
        np.searchsorted(corpus.documents, np.searchsorted(sentences, np.arange(sentences[-1]), "right") - 1, "right")
        - 1
    )
    rows = create_instances(corpus, range(3), 12, True, np.random.default_rng(0))
    assert len(rows) > 3 and set(rows[:, 4]) == {0, 1}
    for a0, a1, b0, b1, label in rows:
        assert a0 < a1 and b0 < b1 and a0 in sentences and b0 in sentences
        assert doc_of[a0] == doc_of[a1 - 1]
        if label == 0:
            assert b0 == a1 and doc_of[b1 - 1] == doc_of[a0]  # B continues A in its document
        else:
            assert doc_of[b0] != doc_of[a0] and doc_of[b0] == doc_of[b1 - 1]  # B from another document
    single = create_instances(corpus, range(3), 12, False, np.random.default_rng(0))
    assert (single[:, 4] == -1).all()
    assert np.array_equal(single[1:, 0], single[:-1, 1]) and single[0, 0] == 0 and single[-1, 1] == sentences[-1]


@needs_transformers
def test_pretrain_real_text_masked_batches_and_cache(compose, vocab_dir, text_root, tmp_path):
    from birder_repro.tasks.bert_pretrain import load_tokenizer

    task = get_task("bert_pretrain")
    cfg = pretrain_cfg(
        compose,
        f"model.tokenizer={vocab_dir}",
        f"data.root={text_root}",
        f"data.cache_dir={tmp_path}/cache",
        "data.eval_fraction=0.2",
    )
    data = task.build_data(cfg, 0, 1)
    assert "(real)" in data.description and "5 documents" in data.description and "4 / 1 documents" in data.description
    tokenizer = load_tokenizer(str(vocab_dir))
    corpus = data.train.dataset.corpus  # the cache: every sentence, in order, documents delimited
    assert len(corpus.sentences) - 1 == sum(len(d) for d in PRETRAIN_DOCS) and corpus.num_documents == 5
    sentence = corpus.tokens[corpus.sentences[4] : corpus.sentences[5]].tolist()
    assert tokenizer.decode(sentence) == PRETRAIN_DOCS[1][0].lower()
    assert corpus.documents[1] == 4  # document 2 starts at sentence 4
    batch = next(iter(data.train))
    ids, labels, types = batch["input_ids"], batch["labels"], batch["token_type_ids"]
    assert ids.shape == labels.shape == types.shape == (4, 32)
    assert (ids[:, 0] == tokenizer.cls_token_id).all() and set(batch["next_sentence_label"].tolist()) <= {0, 1}
    real = batch["attention_mask"].sum(1)
    assert ((labels != -100).sum(1) == torch.clamp((real.double() * 0.15).round(), min=1)).all()
    restored = torch.where(labels != -100, labels, ids)  # undo the masking: text of the corpus
    text = tokenizer.decode(restored[0, 1 : int(real[0])].tolist()).replace(" [SEP]", " |")
    assert "[UNK]" not in text and "[MASK]" not in text
    model = task.build_model(cfg)
    loss, n = task.loss(model, batch, CPU)
    assert n == 4 and math.isfinite(float(loss.detach()))
    sums = task.evaluate(model, data.eval, CPU)
    assert set(sums) == {"mlm_loss", "mlm_accuracy", "nsp_accuracy"}
    assert sums["nsp_accuracy"][1] == len(data.eval.dataset) and sums["mlm_loss"][1] >= len(data.eval.dataset)
    assert task.evaluate(model, data.eval, CPU) == sums  # evaluation masks are fixed: the same numbers
    # The token cache is built once and reused.
    assert len(os.listdir(tmp_path / "cache")) == 1
    task.build_data(cfg, 0, 1)
    assert len(os.listdir(tmp_path / "cache")) == 1


def _loss_on(task, model, batch):
    with torch.no_grad():
        return float(task.loss(model, batch, CPU)[0])


@needs_transformers
@pytest.mark.parametrize("name", ["bert_pretrain", "bert_squad"])
def test_synthetic_data_is_said_and_learnable_by_a_tiny_bert(compose, name):
    task = get_task(name)
    make = pretrain_cfg if name == "bert_pretrain" else squad_cfg
    cfg = make(
        compose,
        "data.source=synthetic",
        "model.vocab_size=16",
        "data.synthetic_train_size=512",
        "data.synthetic_eval_size=8",
        "train.batch_size=16",
    )
    data = task.build_data(cfg, 0, 1)
    assert data.description.startswith("SYNTHETIC")
    torch.manual_seed(0)
    model = task.build_model(cfg)
    model.eval()  # no dropout while measuring
    fixed = next(iter(data.train))
    before = _loss_on(task, model, fixed)
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    model.train()
    for _, batch in zip(range(30), data.train):
        loss, _ = task.loss(model, batch, CPU)
        opt.zero_grad()
        loss.backward()
        opt.step()
    model.eval()
    assert _loss_on(task, model, fixed) < before - 0.3


# ------------------------------------------------------------------------------------------- missing files


@needs_transformers
def test_missing_data_and_model_files_name_the_setting(compose, vocab_dir, tmp_path):
    squad, pretrain = get_task("bert_squad"), get_task("bert_pretrain")
    with pytest.raises(DatasetNotFound, match=r"train-v1\.1\.json.*data\.root"):
        squad.build_data(squad_cfg(compose, f"model.tokenizer={vocab_dir}", f"data.root={tmp_path}/none"), 0, 1)
    with pytest.raises(FileNotFoundError, match="model.tokenizer"):
        squad.build_data(squad_cfg(compose, f"model.tokenizer={tmp_path}/no_vocab"), 0, 1)
    with pytest.raises(ValueError, match="model.tokenizer"):  # tiny + real needs a tokenizer: no hub fallback
        squad.build_model(squad_cfg(compose))
    with pytest.raises(FileNotFoundError, match="model.checkpoint"):
        squad.build_model(compose(["task=bert_squad", f"model.checkpoint={tmp_path}/bert-base"]))
    with pytest.raises(DatasetNotFound, match=r"empty.*data\.root"):
        os.makedirs(tmp_path / "empty")
        pretrain.build_data(pretrain_cfg(compose, f"model.tokenizer={vocab_dir}", f"data.root={tmp_path}/empty"), 0, 1)
    with pytest.raises(ValueError, match="model.tokenizer"):
        pretrain.build_model(pretrain_cfg(compose))
    if importlib.util.find_spec("datasets") is None:  # the datasets path is optional and says so
        with pytest.raises(ImportError, match="data.hf_name"):
            squad.build_data(squad_cfg(compose, f"model.tokenizer={vocab_dir}", "data.hf_name=squad"), 0, 1)

"""Pretrained word vectors (``data.vectors``): matching a vocabulary (lower-cased lookup for an uncased file, the
evaluation words the training data lacks as fixed rows), the file's mistakes named by file and line before training,
the coverage report, fine-tuned vs frozen embeddings, every classifier type trained and reloaded with them."""

from __future__ import annotations

import json
from collections import Counter

import pytest
import torch
from rich.console import Console

from _train_helpers import WORDS, tiny_config, write_conll, write_nli, write_sentiment
from maskattn.data import DataConfig, Vocabulary, load_vectors, tokenize
from maskattn.data.vectors import vector_coverage
from maskattn.errors import DataError
from maskattn.inference import load_model, predict
from maskattn.models.embedding import TokenEmbedding
from maskattn.models import build_model
from maskattn.train import Trainer, list_presets, load_config, preset_path
from maskattn.train.optim import build_optimizer, parameter_groups
from maskattn.train.config import OptimConfig


def write(tmp_path, name: str, text: str):
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def vector(word: str, dim: int = 3) -> list[float]:
    """A distinct, exactly representable vector per word."""
    base = sum(map(ord, word)) % 97
    return [base + i / 4 for i in range(dim)]


def glove_file(tmp_path, words, dim: int = 3, name: str = "glove.txt"):
    return write(tmp_path, name, "".join(f"{w} {' '.join(map(str, vector(w, dim)))}\n" for w in words))


def test_lookup_lowercases_for_an_uncased_file_and_the_model_keeps_its_casing(tmp_path):
    vocab = Vocabulary.build([["The", "the", "Cat", "zebra"]])
    path = glove_file(tmp_path, ["the", "cat", "dog"])
    same, vectors = load_vectors(path, vocab, 3)
    assert same is vocab  # nothing to add
    rows = {t: vectors.found[vocab.stoi[t]].item() for t in ("The", "the", "Cat", "zebra")}
    assert rows == {"The": True, "the": True, "Cat": True, "zebra": False}
    assert vectors.weight[vocab.stoi["The"]].tolist() == vector("the") == vectors.weight[vocab.stoi["the"]].tolist()
    assert not vectors.found[:2].any()  # padding, unknown
    _, exact = load_vectors(path, vocab, 3, lookup="exact")
    assert [t for t in vocab.itos if exact.found[vocab.stoi[t]]] == ["the"]


def test_a_cased_file_is_read_as_written_first(tmp_path):
    vocab = Vocabulary.build([["Apple", "apple", "APPLE"]])
    _, vectors = load_vectors(glove_file(tmp_path, ["Apple", "apple"]), vocab, 3)
    assert vectors.weight[vocab.stoi["Apple"]].tolist() == vector("Apple")
    assert vectors.weight[vocab.stoi["APPLE"]].tolist() == vector("apple")  # falls back to the lower-cased word


def test_evaluation_words_with_a_vector_join_the_vocabulary_as_fixed_rows(tmp_path):
    vocab = Vocabulary.build([["the", "cat"]])
    path = glove_file(tmp_path, ["the", "cat", "mouse", "owl"])
    full, vectors = load_vectors(path, vocab, 3, extra_tokens=["gnu", "owl", "the", "Mouse", "owl"])
    assert full.itos == vocab.itos + ["owl", "Mouse"] and vectors.fixed == 2  # order of first appearance
    assert vectors.weight[full.stoi["Mouse"]].tolist() == vector("mouse") and vectors.found[-2:].all()
    counts = Counter({"the": 5, "cat": 1, "rare": 4})  # "rare" is under min_freq: not in the vocabulary
    coverage = vector_coverage(vectors, full, counts)
    assert coverage["vocab_types"] == 2 and coverage["types_covered"] == 2 and coverage["fixed_eval_types"] == 2
    assert coverage["token_share"] == pytest.approx(6 / 10)


@pytest.mark.parametrize("text, message", [
    ("the 1 2\n", r"glove\.txt:1: its first line has 2 numbers per word, but the model's word embeddings are 3 wide "
                  r".*set model\.embed_dim=2"),
    ("the 1 2 3\ncat 1 2\n", r"glove\.txt:2: expected a word and 3 numbers \(the width of line 1\), got 2 fields"),
    ("the 1 2 3\ncat 1 2 3 4\n", r"glove\.txt:2: expected a word and 3 numbers \(the width of line 1\), got 4 fields"),
    ("the 1 2 3\ncat 1 x 3\n", r"glove\.txt:2: 'x' \(value 2\) is not a number"),
    ("the 1 2 3\ncat 1 nan 3\n", r"glove\.txt:2: value 2 is 'nan', not a finite number"),
    ("the 1 2 3\ncat 1 2 3\nthe 4 5 6\n", r"glove\.txt:3: the word 'the' appears a second time \(first on line 1\)"),
    ("thecat\n", r"glove\.txt:1: expected a word and its numbers separated by spaces"),
    ("", r"glove\.txt holds no vectors"),
    ("dog 1 2 3\nowl 4 5 6\n", r"glove\.txt covers none of the 2 training vocabulary types"),
    ("4 2\nthe 1 2\n", r"glove\.txt:1: the header line gives 2 numbers per word"),
])
def test_a_bad_vectors_file_is_named_with_its_line(tmp_path, text, message):
    vocab = Vocabulary.build([["the", "cat"]])
    with pytest.raises(DataError, match=message):
        load_vectors(write(tmp_path, "glove.txt", text), vocab, 3)


def test_headers_and_words_with_spaces(tmp_path):
    vocab = Vocabulary.build([["the", ". . ."]])
    _, vectors = load_vectors(write(tmp_path, "w2v.txt", "2 3\nthe 1 2 3\n. . . 4 5 6\n"), vocab, 3)
    assert vectors.weight[vocab.stoi[". . ."]].tolist() == [4, 5, 6]
    with pytest.raises(DataError, match="does not exist"):
        load_vectors(tmp_path / "missing.txt", vocab, 3)


def test_embedding_rows_fine_tuned_initialised_frozen_and_fixed():
    vocab_size, dim = 8, 3
    weight = torch.arange(vocab_size * dim, dtype=torch.float).reshape(vocab_size, dim)
    found = torch.tensor([False, False, True, False, True, True, True, True])

    class Rows:
        pass
    rows = Rows()
    rows.weight, rows.found, rows.fixed = weight, found, 2
    torch.manual_seed(0)
    embed = TokenEmbedding(vocab_size, dim, pretrained=rows, init=0.05)
    table = embed.embedding.weight
    assert table.shape == (6, dim) and embed.fixed.shape == (2, dim)
    assert torch.equal(table[[2, 4, 5]], weight[[2, 4, 5]]) and torch.equal(embed.fixed, weight[6:])
    assert table[0].abs().sum() == 0 and table[3].abs().max() <= 0.05  # padding; a word without a vector
    ids = torch.tensor([[2, 6, 7, 0]])
    torch.testing.assert_close(embed(ids)[0], torch.stack([weight[2], weight[6], weight[7], torch.zeros(dim)]))
    optimizer = build_optimizer(OptimConfig(name="adam", lr=0.1, weight_decay=0.1), embed)
    embed(ids).sum().backward()
    optimizer.step()
    assert not torch.equal(embed.embedding.weight[2], weight[2])  # fine-tuned (MTSA Appendix B)
    assert torch.equal(embed.fixed, weight[6:]) and "fixed" in embed.state_dict()  # never trained, saved
    frozen = TokenEmbedding(vocab_size, dim, pretrained=rows, freeze=True)
    assert not frozen.embedding.weight.requires_grad and not list(p for p in frozen.parameters() if p.requires_grad)


def test_weight_decay_can_spare_the_embedding_tables():
    model = torch.nn.Sequential(torch.nn.Embedding(5, 3), torch.nn.Linear(3, 2))
    groups = parameter_groups(OptimConfig(weight_decay=1e-4, weight_decay_on="except_embeddings"), model)
    decayed = {id(p) for g in groups if g["weight_decay"] for p in g["params"]}
    assert decayed == {id(model[1].weight), id(model[1].bias)}


def test_word_punct_tokenizer():
    assert tokenize("A man, in a red-shirt.", tokenizer="word_punct") == ("A", "man", ",", "in", "a", "red", "-",
                                                                          "shirt", ".")
    assert tokenize("A man, walking.", lowercase=True) == ("a", "man,", "walking.")
    with pytest.raises(ValueError, match="data.tokenizer 'word_punct' cannot apply to data.format 'conll'"):
        DataConfig(format="conll", tokenizer="word_punct")


@pytest.mark.parametrize("kind", ["sentence", "pair", "tagger"])
def test_every_classifier_trains_with_vectors_and_reloads(tmp_path, kind):
    words = [*WORDS, "good", "bad", "no", "new", "york"]
    vectors_path = glove_file(tmp_path, [w.lower() for w in words if w != "music"] + ["unseen"], dim=4)
    if kind == "sentence":
        data, extra = write_sentiment(tmp_path), {}
    elif kind == "pair":
        data, extra = write_nli(tmp_path), {"format": "nli", "train": "train.jsonl", "test": "test.jsonl"}
    else:
        data, extra = write_conll(tmp_path), {"format": "conll", "train": "train.txt", "test": "test.txt"}
    cfg = tiny_config(data, tmp_path / "run", data={**extra, "vectors": str(vectors_path)},
                      model={"type": kind, "embed_dim": 4})
    console = Console(record=True, width=300)
    summary = Trainer(cfg, console=console).fit()
    coverage = summary["data"]["vectors"]
    loaded = load_model(tmp_path / "run" / "best.safetensors")
    assert loaded.vocab == Trainer.resume(tmp_path / "run" / "last.safetensors").task.vocab
    trained_vocab = loaded.vocab.itos[2:2 + coverage["vocab_types"]]
    assert coverage["types_covered"] == len(trained_vocab) - ("music" in trained_vocab)  # the one word without a vector
    assert f"{coverage['types_covered']:,} of {coverage['vocab_types']:,} training vocabulary types" in console.export_text()
    assert summary["parameters"]["without_embeddings"] < summary["parameters"]["total"]
    text = {"sentence": ["the film was good"], "pair": ["the film ||| no film"], "tagger": ["new york plot"]}[kind]
    assert len(predict(loaded, text)) == 1


def test_the_coverage_counts_the_training_tokens(tmp_path):
    data = write_sentiment(tmp_path)
    covered = {"the", "film", "good"}
    cfg = tiny_config(data, tmp_path / "run", data={"vectors": str(glove_file(tmp_path, sorted(covered), dim=16))})
    summary = Trainer(cfg).fit()
    train = json.loads(json.dumps(summary))["data"]["vectors"]
    trainer_tokens = Trainer.resume(tmp_path / "run" / "last.safetensors").task.data.splits.train
    counts = Counter(t for e in trainer_tokens for t in e.tokens)
    assert train["train_tokens"] == sum(counts.values())
    assert train["token_share"] == pytest.approx(sum(counts[t] for t in covered) / sum(counts.values()))
    assert train["types_covered"] == len(covered & set(counts))


def test_frozen_vectors_stay_as_the_file_gives_them(tmp_path):
    data = write_sentiment(tmp_path)
    path = glove_file(tmp_path, [w for w in WORDS] + ["good", "bad"], dim=16)
    cfg = tiny_config(data, tmp_path / "run", data={"vectors": str(path)}, model={"freeze_embeddings": True},
                      optim={"weight_decay": 0.01})
    Trainer(cfg).fit()
    loaded = load_model(tmp_path / "run" / "last.safetensors")
    table = loaded.model.encoder.embed.embedding.weight
    for word in ("the", "good"):
        assert table[loaded.vocab.stoi[word]].tolist() == vector(word, 16)


#: the presets of classifiers trained from word embeddings (a pretrained encoder brings its own; a seq2seq model's
#: embeddings are over subwords)
WORD_PRESETS = [p for p in list_presets()
                if load_config(preset_path(p)).model.pretrained is None and load_config(preset_path(p)).model.type != "seq2seq"]


@pytest.mark.parametrize("preset", WORD_PRESETS)
def test_every_classifier_preset_takes_vectors(tmp_path, preset):
    cfg = load_config(preset_path(preset), ["data.vectors=glove.txt", "model.embed_dim=4"])
    vocab = Vocabulary.build([["the", "cat"]])
    _, vectors = load_vectors(glove_file(tmp_path, ["the"], dim=4), vocab, 4)
    model = build_model(cfg.model, len(vocab), 3, pretrained=vectors)
    assert model.encoder.embed.embedding.weight[vocab.stoi["the"]].tolist() == vector("the", 4)
    assert model.encoder.embed.proj.in_features == 4 and model.encoder.embed.proj.out_features == cfg.model.d_model


@pytest.mark.parametrize("given, vectors, expected", [(None, True, 1.0), (None, False, 16 ** 0.5), (3.0, True, 3.0)])
def test_pretrained_vectors_keep_their_scale_before_sinusoidal_positions(tmp_path, given, vectors, expected):
    # √d_model lifts the model's own ±0.05 vectors to the sinusoids' amplitude; on GloVe (std ~0.7) it multiplied
    # the word signal ×17 at d_model 300 and took multi-head attention on TREC from 88.6 to 79.4 % (docs/results.md)
    data = write_sentiment(tmp_path)
    cfg = tiny_config(data, tmp_path / "run",
                      data={"vectors": str(glove_file(tmp_path, WORDS, dim=4))} if vectors else {},
                      model={"encoder": "mha", "positional": "sinusoidal", "embed_dim": 4, "embed_scale": given})
    Trainer(cfg).fit()
    for name in ("best", "last"):  # the scale trained with is the one the run's checkpoints rebuild with
        assert load_model(tmp_path / "run" / f"{name}.safetensors").model.encoder.embed.scale == expected
    assert Trainer.resume(tmp_path / "run" / "last.safetensors").model.encoder.embed.scale == expected


def test_the_width_is_the_numbers_that_end_the_first_line(tmp_path):
    """Issue 42: a word followed by a tab, or a word with spaces on the first line, counted the wrong width (and
    advised model.embed_dim=2 or 4 for a file of width 3)."""
    vocab = Vocabulary.build([["the", ". . ."]])
    _, vectors = load_vectors(write(tmp_path, "tab.txt", "the\t1 2 3\n. . .\t4 5 6\n"), vocab, 3)
    assert vectors.weight[vocab.stoi["the"]].tolist() == [1, 2, 3]
    _, vectors = load_vectors(write(tmp_path, "first.txt", ". . . 4 5 6\nthe 1 2 3\n"), vocab, 3)
    assert vectors.weight[vocab.stoi[". . ."]].tolist() == [4, 5, 6]
    with pytest.raises(DataError, match=r"first\.txt:1: its first line has 3 numbers per word, .* 4 wide .*"
                                        r"set model.embed_dim=3"):
        load_vectors(tmp_path / "first.txt", vocab, 4)

"""Data: readers and their error messages, vocabulary, splits / k-fold, GloVe vectors, bucketed batching."""

from __future__ import annotations

import io
import json

import pytest
import torch

from maskattn.data import (BucketBatchSampler, DataConfig, LabelSet, OrderTask, Splits, TaggedExample, TextExample,
                           Vocabulary, check_label_sets, collate, encode_examples, holdout, kfold, kfold_indices,
                           load_glove, load_splits, read_conll, read_nli_jsonl, read_trec, read_tsv)
from maskattn.data.hf import hf_available
from maskattn.data.text import read_lines, read_stream_lines
from maskattn.errors import DataError


def write(tmp_path, name, text):
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


# --- the line policy ------------------------------------------------------------------------------------

def test_lines_split_on_newline_only(tmp_path):
    def lines(data: bytes) -> list[str]:
        (tmp_path / "f.txt").write_bytes(data)
        return read_lines(tmp_path / "f.txt")

    assert lines("a\n\nb\r\nc\u2028d\n".encode()) == ["a", "", "b", "c\u2028d"]  # str.splitlines would give 5
    assert lines(b"") == [] and lines(b"x") == ["x"]
    # a lone \r, a form feed, a vertical tab stay inside their line (text mode and splitlines split there)
    assert lines(b"one\rstill one\nform\x0cfeed\nv\x0btab\n") == ["one\rstill one", "form\x0cfeed", "v\x0btab"]
    assert lines(b"\n\n") == ["", ""]  # blank lines are lines
    assert read_stream_lines(io.BytesIO(b"a\r\n\nb")) == ["a", "", "b"]  # stdin: the same policy


def test_a_byte_order_mark_is_dropped_and_bad_bytes_name_file_and_line(tmp_path):
    bom = tmp_path / "bom.tsv"
    bom.write_bytes(b"\xef\xbb\xbfDESC\tWhat is it ?\nNUM\tHow many ?\n")
    assert [e.label for e in read_tsv(bom)] == ["DESC", "NUM"]  # not '\ufeffDESC'
    latin = tmp_path / "latin.tsv"
    latin.write_bytes(b"pos\tgood\nneg\tcaf\xe9 bad\n")
    with pytest.raises(DataError, match=r"latin\.tsv:2: not UTF-8 text \(byte 0xe9 at byte 8 of the line\)"):
        read_tsv(latin)
    with pytest.raises(DataError, match=r"<stdin>:1: not UTF-8 text"):
        read_stream_lines(io.BytesIO(b"\xff\n"))


# --- readers -----------------------------------------------------------------------------------------

def test_read_tsv_and_trec_formats(tmp_path):
    tsv = read_tsv(write(tmp_path, "a.tsv", "1\ta good film\n\n0\tbad .\n"), lowercase=True)
    assert tsv == [TextExample(("a", "good", "film"), "1"), TextExample(("bad", "."), "0")]
    trec = write(tmp_path, "t.tsv", "NUM\tdist\tHow far is it ?\nHUM\tdesc\tWho was Galileo ?\n")
    assert [e.label for e in read_trec(trec)] == ["NUM", "HUM"]
    assert [e.label for e in read_trec(trec, fine=True)] == ["NUM:dist", "HUM:desc"]
    assert read_trec(trec)[1].tokens == ("Who", "was", "Galileo", "?")


@pytest.mark.parametrize("text, kwargs, message", [
    ("1\tok\nno tab here\n", {}, r"bad\.tsv:2: expected 'label<TAB>text', found no tab"),
    # a third column is refused, not glued into the text (TREC read as tsv: issue 32 item 4)
    ("1\tok\nNUM\tdist\tHow far ?\n", {}, r"bad\.tsv:2: expected 'label<TAB>text', found 2 tabs .*format trec"),
    ("1\tok\t\n", {}, r"bad\.tsv:1: expected 'label<TAB>text', found 2 tabs"),
    ("1\tok\n7\tfine\n", {"labels": ["0", "1"]}, r"bad\.tsv:2: unknown label '7'"),
    ("1\tok\n0\t   \n", {}, r"bad\.tsv:2: empty text"),
    ("\n\n", {}, r"bad\.tsv holds no examples"),
])
def test_read_tsv_errors_name_file_and_line(tmp_path, text, kwargs, message):
    with pytest.raises(ValueError, match=message):
        read_tsv(write(tmp_path, "bad.tsv", text), **kwargs)


def test_read_tsv_skip_empty_and_missing_file(tmp_path):
    assert len(read_tsv(write(tmp_path, "e.tsv", "1\tok\n0\t\n"), skip_empty=True)) == 1
    with pytest.raises(ValueError, match="does not exist"):
        read_tsv(tmp_path / "nope.tsv")
    with pytest.raises(ValueError, match=r"t\.tsv:1: expected 'coarse<TAB>fine<TAB>text', found 1 tab"):
        read_trec(write(tmp_path, "t.tsv", "NUM\tHow far ?\n"))
    with pytest.raises(ValueError, match=r"u\.tsv:1: expected 'coarse<TAB>fine<TAB>text', found 3 tab"):
        read_trec(write(tmp_path, "u.tsv", "NUM\tdist\tx\tHow far ?\n"))


def test_read_nli_jsonl(tmp_path):
    rows = [{"premise": "A man sleeps .", "hypothesis": "A man rests .", "label": "entailment"},
            {"premise": "A dog runs .", "hypothesis": "A cat sits .", "label": "contradiction"}]
    path = write(tmp_path, "d.jsonl", "".join(json.dumps(r) + "\n" for r in rows))
    pairs = read_nli_jsonl(path)
    assert pairs[0].premise == ("A", "man", "sleeps", ".") and pairs[1].label == "contradiction"
    with pytest.raises(ValueError, match=r"x\.jsonl:1: missing field\(s\) \['label'\]"):
        read_nli_jsonl(write(tmp_path, "x.jsonl", '{"premise": "a", "hypothesis": "b"}\n'))
    with pytest.raises(ValueError, match=r"y\.jsonl:2: not valid JSON"):
        read_nli_jsonl(write(tmp_path, "y.jsonl", json.dumps(rows[0]) + "\n{oops\n"))
    with pytest.raises(ValueError, match=r"z\.jsonl:1: empty hypothesis"):
        read_nli_jsonl(write(tmp_path, "z.jsonl", '{"premise": "a", "hypothesis": " ", "label": "neutral"}\n'))


def test_read_conll(tmp_path):
    text = "-DOCSTART- O\n\nJohn B-PER\nSmith I-PER\nruns O\n\nParis B-LOC\n"
    sentences = read_conll(write(tmp_path, "c.txt", text))
    assert sentences == [TaggedExample(("John", "Smith", "runs"), ("B-PER", "I-PER", "O")),
                         TaggedExample(("Paris",), ("B-LOC",))]
    with pytest.raises(ValueError, match=r"c2\.txt:2: expected 'token <whitespace> tag'"):
        read_conll(write(tmp_path, "c2.txt", "John B-PER\nSmith\n"))


# --- vocabulary, labels, splits ---------------------------------------------------------------------------

def test_vocabulary_min_freq_unknown_and_roundtrip():
    vocab = Vocabulary.build([["a", "b", "a"], ["c", "a", "b"]], min_freq=2)
    assert vocab.to_list() == ["<pad>", "<unk>", "a", "b"]
    assert vocab.encode(["a", "c", "zzz"]) == [2, 1, 1]
    assert Vocabulary.from_list(vocab.to_list()) == vocab
    with pytest.raises(ValueError, match="min_freq"):
        Vocabulary.build([["a"]], min_freq=0)
    labels = LabelSet(["pos", "neg", "pos"])
    assert labels.itos == ["neg", "pos"] and labels.encode("pos") == 1
    with pytest.raises(ValueError, match="unknown label 'meh'"):
        labels.encode("meh")


def test_kfold_partitions_the_data():
    tests = []
    for fold in range(10):
        train, test = kfold_indices(103, 10, fold, seed=3)
        assert not set(train) & set(test) and len(train) + len(test) == 103
        tests += test
    assert sorted(tests) == list(range(103))
    examples = [TextExample(("w",), str(i % 2)) for i in range(20)]
    train, test = kfold(examples, 10, 3)
    assert len(test) == 2 and len(train) == 18
    with pytest.raises(ValueError, match="fold must be"):
        kfold_indices(10, 10, 10)
    rest, held = holdout(examples, 0.25)
    assert len(held) == 5 and len(rest) == 15


def test_label_set_mismatch_between_splits_is_an_error():
    train = [TextExample(("a",), "x"), TextExample(("b",), "y")]
    with pytest.raises(ValueError, match=r"test split \(t\.tsv\) has label\(s\) \['z'\]"):
        check_label_sets(Splits(train, train, [TextExample(("c",), "z")]), {"test": "t.tsv"})


def test_load_splits_cv_and_dev_holdout(tmp_path):
    lines = "".join(f"{'pos' if i % 2 else 'neg'}\tsentence number {i}\n" for i in range(50))
    write(tmp_path, "all.tsv", lines)
    cfg = DataConfig(dir=str(tmp_path), train="all.tsv", test=None, cv_folds=10, fold=2, dev_fraction=0.2)
    splits = load_splits(cfg)
    assert len(splits.test) == 5 and len(splits.dev) == 9 and len(splits.train) == 36
    with pytest.raises(ValueError, match="data.dir is not set"):
        load_splits(DataConfig(dir=None))


def test_dev_holdout_last_takes_the_end_of_the_train_file_in_order(tmp_path):
    lines = "".join(f"{'pos' if i % 2 else 'neg'}\tsentence number {i}\n" for i in range(50))
    write(tmp_path, "all.tsv", lines)
    cfg = DataConfig(dir=str(tmp_path), train="all.tsv", test=None, dev_fraction=0.2, dev_holdout="last")
    splits = load_splits(cfg)
    number = lambda examples: [int(e.tokens[-1]) for e in examples]
    assert number(splits.train) == list(range(40)) and number(splits.dev) == list(range(40, 50))
    random = load_splits(DataConfig(dir=str(tmp_path), train="all.tsv", test=None, dev_fraction=0.2))
    assert len(random.dev) == 10 and number(random.dev) != list(range(40, 50))  # the default: a seeded sample
    with pytest.raises(ValueError, match="unknown data.dev_holdout 'first'; expected one of random, last"):
        DataConfig(dev_holdout="first")
    with pytest.raises(ValueError, match="data.dev_holdout 'last' takes the end of the train file, but with "
                                         "data.cv_folds"):
        DataConfig(cv_folds=10, dev_holdout="last")


def test_load_glove_is_the_deprecated_spelling_of_load_vectors(tmp_path):
    vocab = Vocabulary.build([["the", "cat", "zebra"]])
    path = write(tmp_path, "glove.txt", "the 0.1 0.2 0.3\ncat 1 2 3\nunused 9 9 9\n")
    with pytest.warns(DeprecationWarning, match="load_glove is now maskattn.data.load_vectors"):
        weight, found = load_glove(path, vocab, 3)
    assert found == 2 and weight.shape == (len(vocab), 3)
    assert torch.allclose(weight[vocab.stoi["cat"]], torch.tensor([1.0, 2.0, 3.0]))
    assert weight[0].abs().sum() == 0 and weight[vocab.stoi["zebra"]].abs().max() <= 0.05


# --- batching -----------------------------------------------------------------------------------------------

def test_collate_padding_mask_is_true_at_padding():
    vocab = Vocabulary.build([["a", "b", "c"]])
    labels = LabelSet(["x", "y"])
    items = encode_examples([TextExample(("a", "b", "c"), "x"), TextExample(("c",), "y")], vocab, labels)
    batch = collate(items)
    assert batch.inputs["tokens"].tolist() == [[2, 3, 4], [4, 0, 0]]
    assert batch.inputs["padding_mask"].tolist() == [[False, False, False], [False, True, True]]
    assert batch.labels.tolist() == [0, 1] and batch.count == 2
    tags = collate(encode_examples([TaggedExample(("a", "b"), ("x", "y")), TaggedExample(("a",), ("y",))],
                                   vocab, labels))
    assert tags.labels.tolist() == [[0, 1], [1, -100]] and tags.count == 3


def test_bucket_sampler_is_deterministic_covers_everything_and_buckets_lengths():
    items = [{"tokens": [1] * (1 + (i * 7) % 40)} for i in range(500)]
    sampler = BucketBatchSampler(items, 16, seed=5, pool_factor=8)
    a, b, c = sampler.batches(0), sampler.batches(0), sampler.batches(1)
    assert a == b and a != c
    assert sorted(i for batch in a for i in batch) == list(range(500)) and len(a) == len(sampler)
    spread = sum(max(sampler.lengths[i] for i in batch) - min(sampler.lengths[i] for i in batch) for batch in a)
    unbucketed = BucketBatchSampler(items, 16, seed=5, pool_factor=1)
    spread_plain = sum(max(unbucketed.lengths[i] for i in batch) - min(unbucketed.lengths[i] for i in batch)
                       for batch in unbucketed.batches(0))
    assert spread < spread_plain / 3
    with pytest.raises(ValueError, match="empty dataset"):
        BucketBatchSampler([], 4)


def test_order_task_examples_match_labels():
    examples = OrderTask().examples(200, torch.Generator().manual_seed(0))
    for e in examples:
        assert (e.tokens.index("A") < e.tokens.index("B")) == (e.label == "before")
    assert {e.label for e in examples} == {"before", "after"}


@pytest.mark.skipif(not hf_available(), reason="optional dependency `datasets` not installed")
def test_hf_source_on_local_csv_files(tmp_path):
    write(tmp_path, "train.csv", "text,label\na good film,pos\na bad film,neg\nso good,pos\n")
    write(tmp_path, "test.csv", "text,label\ngood,pos\nbad,neg\n")
    cfg = DataConfig(source="hf", hf_name="csv", dev_fraction=0.34,
                     hf_data_files={"train": str(tmp_path / "train.csv"), "test": str(tmp_path / "test.csv")})
    splits = load_splits(cfg)
    assert len(splits.test) == 2 and len(splits.train) + len(splits.dev) == 3
    assert splits.test[0] == TextExample(("good",), "pos")

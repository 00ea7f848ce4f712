"""Tiny datasets and configurations written to tmp_path for the training tests."""

from __future__ import annotations

import json
import random

import pytest
import torch

from maskattn.train import Trainer, load_checkpoint
from maskattn.train.config import RunConfig, from_dict

WORDS = ["the", "film", "plot", "was", "very", "quite", "actors", "story", "music", "and"]


def sentiment_lines(n: int, seed: int) -> list[str]:
    """``label<TAB>text``: "pos" sentences contain "good", "neg" ones "bad"."""
    rng = random.Random(seed)
    lines = []
    for i in range(n):
        label = "pos" if i % 2 else "neg"
        words = rng.choices(WORDS, k=rng.randint(3, 9))
        words.insert(rng.randint(0, len(words)), "good" if label == "pos" else "bad")
        lines.append(f"{label}\t{' '.join(words)}")
    return lines


def write_sentiment(tmp_path, n_train: int = 96, n_test: int = 32):
    folder = tmp_path / "data"
    folder.mkdir(exist_ok=True)
    (folder / "train.tsv").write_text("\n".join(sentiment_lines(n_train, 0)) + "\n")
    (folder / "test.tsv").write_text("\n".join(sentiment_lines(n_test, 1)) + "\n")
    return folder


def _write_splits(tmp_path, name: str, n: int, suffix: str, make_block) -> object:
    """``<name>/train<suffix>`` (n blocks) and ``test<suffix>`` (n // 2 blocks) from ``make_block(rng, i)``."""
    folder = tmp_path / name
    folder.mkdir(exist_ok=True)
    rng = random.Random(0)
    for split, count in (("train", n), ("test", n // 2)):
        (folder / f"{split}{suffix}").write_text("".join(make_block(rng, i) for i in range(count)))
    return folder


def write_nli(tmp_path, n: int = 48):
    """NLI JSON lines: the hypothesis repeats the premise (entailment) or negates it (contradiction)."""
    def row(rng, i):
        words = rng.choices(WORDS, k=4)
        label = ["entailment", "contradiction"][i % 2]
        hyp = words if label == "entailment" else ["no"] + words[1:]
        return json.dumps({"premise": " ".join(words), "hypothesis": " ".join(hyp), "label": label}) + "\n"
    return _write_splits(tmp_path, "nli", n, ".jsonl", row)


def write_conll(tmp_path, n: int = 40):
    """CoNLL columns: one B-LOC I-LOC chunk ("new york") per sentence."""
    def sentence(rng, i):
        words, tags = rng.choices(WORDS, k=5), ["O"] * 5
        start = rng.randint(0, 3)
        words[start:start + 2], tags[start:start + 2] = ["new", "york"], ["B-LOC", "I-LOC"]
        return "".join(f"{w} {t}\n" for w, t in zip(words, tags)) + "\n"
    return _write_splits(tmp_path, "conll", n, ".txt", sentence)


LEXICON = {"the": "das", "cat": "Katze", "dog": "Hund", "small": "klein", "big": "groß", "red": "rot",
           "house": "Haus", "sees": "sieht", "green": "grün", "tree": "Baum"}


def sentence_pairs(n: int, seed: int) -> list[tuple[str, str]]:
    rng = random.Random(seed)
    pairs = []
    for _ in range(n):
        words = rng.choices(list(LEXICON), k=rng.randint(2, 6))
        pairs.append((" ".join(words).capitalize() + ".", " ".join(LEXICON[w] for w in words).capitalize() + "."))
    return pairs


def write_parallel(tmp_path, n_train: int = 160, n_eval: int = 12):
    """``train`` / ``val`` / ``test`` . ``en`` / ``de`` under ``tmp_path/para``; train has two empty lines."""
    folder = tmp_path / "para"
    folder.mkdir(exist_ok=True)
    for split, n, seed in (("train", n_train, 0), ("val", n_eval, 1), ("test", n_eval, 2)):
        pairs = sentence_pairs(n, seed)
        if split == "train":
            pairs[3] = ("", "Leer.")
            pairs[7] = ("   ", "")
        (folder / f"{split}.en").write_text("".join(src + "\n" for src, _ in pairs), encoding="utf-8")
        (folder / f"{split}.de").write_text("".join(tgt + "\n" for _, tgt in pairs), encoding="utf-8")
    return folder


def flat(text: str) -> str:
    """Command output with rich's line wrapping undone."""
    return " ".join(text.split())


def merged_config(base: dict, sections: dict) -> RunConfig:
    """``base`` (a dict of config sections) with each of ``sections`` updating its section, validated."""
    for section, values in sections.items():
        base[section] = {**base[section], **values}
    return from_dict(RunConfig, base)


def tiny_config(data_dir, out_dir, **sections) -> RunConfig:
    """A small sentence-classification run on ``write_sentiment`` data; ``sections`` update the defaults."""
    base = {
        "data": {"dir": str(data_dir), "format": "tsv", "train": "train.tsv", "test": "test.tsv", "dev_fraction": 0.25},
        "model": {"encoder": "mtsa", "d_model": 16, "num_heads": 2, "ffn": False, "dropout": 0.1},
        "optim": {"name": "adam", "lr": 0.01},
        "train": {"batch_size": 8, "max_steps": 12, "eval_every": 4, "log_every": 1, "out_dir": str(out_dir),
                  "progress": False, "num_threads": 1},
    }
    return merged_config(base, sections)


def fit_killed_before_step(monkeypatch, config, step: int) -> None:
    """``Trainer(config).fit()`` stopped by a ``KeyboardInterrupt`` (what Ctrl-C / SIGTERM raise) just before
    training step ``step`` (1-based); the run folder is left as a kill would leave it."""
    original = Trainer.train_step

    def crash(self, indices):
        if self.step == step - 1:
            raise KeyboardInterrupt
        return original(self, indices)

    monkeypatch.setattr(Trainer, "train_step", crash)
    with pytest.raises(KeyboardInterrupt):
        Trainer(config).fit()
    monkeypatch.setattr(Trainer, "train_step", original)


def assert_same_last_weights(run, other) -> None:
    """The model weights of the two run folders' ``last.safetensors``: the same names (none only in one of them) and
    bit-identical tensors."""
    a = load_checkpoint(run / "last.safetensors").model_state
    b = load_checkpoint(other / "last.safetensors").model_state
    assert a.keys() == b.keys(), (sorted(a.keys() - b.keys()), sorted(b.keys() - a.keys()))
    differ = [k for k in a if not torch.equal(a[k], b[k])]
    assert not differ, differ


NEWS = ["police", "said", "the", "minister", "of", "trade", "talks", "on", "monday", "china", "and", "japan", "agreed",
        "to", "cut", "tariffs", "after", "two", "days", "rain"]


def article_pairs(n: int, seed: int, unk: str = "<unk>") -> list[tuple[str, str]]:
    """Lower-cased "articles" of 6–12 words; the "headline" is the article's first four words (so LEAD-4 is perfect).
    Every fifth article holds the unknown-word placeholder ``unk``."""
    rng = random.Random(seed)
    pairs = []
    for i in range(n):
        words = rng.choices(NEWS, k=rng.randint(6, 12))
        if i % 5 == 0:
            words[rng.randint(0, len(words) - 1)] = unk
        pairs.append((" ".join(words), " ".join(words[:4])))
    return pairs


def write_summaries(tmp_path, n_train: int = 160, n_eval: int = 12):
    """Gigaword's layout under ``tmp_path/summ``: ``train`` and ``extra`` (train pairs in two files, ``<unk>``, one
    empty line in ``train``), ``valid`` (``<unk>``) and ``test`` (``UNK``, as Gigaword's test files), ``.src`` /
    ``.tgt``."""
    folder = tmp_path / "summ"
    folder.mkdir(exist_ok=True)
    for split, n, seed, unk in (("train", n_train // 2, 0, "<unk>"), ("extra", n_train - n_train // 2, 3, "<unk>"),
                                ("valid", n_eval, 1, "<unk>"), ("test", n_eval, 2, "UNK")):
        pairs = article_pairs(n, seed, unk)
        if split == "train":
            pairs[3] = ("", "empty article")
        (folder / f"{split}.src").write_text("".join(src + "\n" for src, _ in pairs), encoding="utf-8")
        (folder / f"{split}.tgt").write_text("".join(tgt + "\n" for _, tgt in pairs), encoding="utf-8")
    return folder

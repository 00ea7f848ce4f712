"""Tiny datasets and configurations written to tmp_path for the training tests."""

from __future__ import annotations

import json
import random

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


def write_nli(tmp_path, n: int = 48):
    folder = tmp_path / "nli"
    folder.mkdir(exist_ok=True)
    rng = random.Random(0)
    for split, count in (("train", n), ("test", n // 2)):
        rows = []
        for i in range(count):
            words = rng.choices(WORDS, k=4)
            label = ["entailment", "contradiction"][i % 2]
            hyp = words if label == "entailment" else ["no"] + words[1:]
            rows.append({"premise": " ".join(words), "hypothesis": " ".join(hyp), "label": label})
        (folder / f"{split}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return folder


def write_conll(tmp_path, n: int = 40):
    folder = tmp_path / "conll"
    folder.mkdir(exist_ok=True)
    rng = random.Random(0)
    for split, count in (("train", n), ("test", n // 2)):
        blocks = []
        for _ in range(count):
            words = rng.choices(WORDS, k=5)
            tags = ["O"] * 5
            start = rng.randint(0, 3)
            words[start], words[start + 1] = "new", "york"
            tags[start], tags[start + 1] = "B-LOC", "I-LOC"
            blocks.append("\n".join(f"{w} {t}" for w, t in zip(words, tags)))
        (folder / f"{split}.txt").write_text("\n\n".join(blocks) + "\n")
    return folder


def tiny_config(data_dir, out_dir, **sections) -> RunConfig:
    """A small sentence-classification run on ``write_sentiment`` data; ``sections`` update the defaults."""
    base = {
        "data": {"dir": str(data_dir), "format": "tsv", "train": "train.tsv", "test": "test.tsv", "dev_fraction": 0.25},
        "model": {"encoder": "mtsa", "d_model": 16, "num_heads": 2, "ffn": False, "dropout": 0.1},
        "optim": {"name": "adam", "lr": 0.01},
        "train": {"batch_size": 8, "max_steps": 12, "eval_every": 4, "log_every": 1, "out_dir": str(out_dir),
                  "progress": False, "num_threads": 1},
    }
    for section, values in sections.items():
        base[section] = {**base[section], **values}
    return from_dict(RunConfig, base)

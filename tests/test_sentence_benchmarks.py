"""scripts/sentence_benchmarks.py: every model of its table is a valid configuration that trains, the
per-model overrides win over --set (with a note), results are appended per run."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from _train_helpers import sentiment_lines
from maskattn.train import load_config, preset_path

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "sentence_benchmarks.py"
TINY = ["model.d_model=16", "model.num_heads=2", "train.max_steps=2", "train.max_epochs=0", "train.eval_every=2",
        "train.batch_size=16", "train.num_threads=1", "train.keep_last=false"]


def run_script(*args):
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=300)


@pytest.fixture
def data_root(tmp_path):
    folder = tmp_path / "data" / "sst5"
    folder.mkdir(parents=True)
    (folder / "train.tsv").write_text("\n".join(sentiment_lines(64, 0)) + "\n")
    (folder / "test.tsv").write_text("\n".join(sentiment_lines(16, 1)) + "\n")
    (folder / "dev.tsv").write_text("\n".join(sentiment_lines(16, 2)) + "\n")
    return folder.parent


def test_every_model_trains_and_its_own_overrides_win(data_root, tmp_path):
    out = tmp_path / "runs"
    sets = [a for item in TINY for a in ("--set", item)]
    done = run_script("--data-root", str(data_root), "--datasets", "sst5", "--seeds", "0", "--out", str(out), *sets)
    assert done.returncode == 0, done.stderr
    rows = [json.loads(line) for line in (out / "results.jsonl").open()]
    assert [r["model"] for r in rows] == ["mtsa", "mha", "bilstm", "multi_cnn", "disa", "cnn_rand"]
    assert all(0.0 <= r["test_accuracy"] <= 1.0 for r in rows)
    assert [r["steps"] for r in rows] == [2] * 5 + [25 * 2]  # cnn_rand keeps its 25 epochs of 2 batches of 50
    assert "note: for disa, --set model.num_heads=2 is replaced" not in done.stdout  # same value: no note
    assert "note: for cnn_rand, --set model.d_model=16 is replaced by model.d_model=300" in done.stdout
    cnn = load_config(preset_path("sst5"), rows[-1]["overrides"])
    assert (cnn.model.pool, cnn.model.mlp_layers, cnn.model.embed_dropout, cnn.optim.name, cnn.train.batch_size) == \
        ("max", 0, 0.0, "adadelta", 50)
    again = run_script("--data-root", str(data_root), "--datasets", "sst5", "--models", "mtsa", "--seeds", "0",
                       "--out", str(out), *sets)
    assert again.returncode == 0 and len((out / "results.jsonl").read_text().splitlines()) == 6  # claimed: skipped


def test_unknown_model_is_named(data_root, tmp_path):
    done = run_script("--data-root", str(data_root), "--models", "mtsa,cnn", "--out", str(tmp_path))
    assert done.returncode == 2 and "unknown model(s) cnn; models: mtsa" in done.stderr

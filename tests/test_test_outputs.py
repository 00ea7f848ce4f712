"""What a run was scored on, kept per test item (``test.pred.jsonl``, ``test.hyp.txt``): a classifier run and a
tagger run write their predictions with the gold labels, which rescore the run; ``maskattn eval --predictions``
writes the same file from the best checkpoint (classifiers and seq2seq models: the route for runs trained before
runs kept them); a damaged file is refused naming its line."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from _train_helpers import tiny_config, write_conll, write_sentiment, write_summaries
from maskattn.cli import app
from maskattn.errors import DataError
from maskattn.metrics import span_f1
from maskattn.metrics.test_outputs import HYPOTHESES, PREDICTIONS, read_hypotheses, read_predictions
from maskattn.train import Trainer

runner = CliRunner()


def test_a_classifier_run_keeps_its_predictions_and_eval_writes_the_same(tmp_path):
    data = write_sentiment(tmp_path)
    summary = Trainer(tiny_config(data, tmp_path / "run")).fit()
    kept = tmp_path / "run" / PREDICTIONS
    predictions = read_predictions(kept)
    gold = [line.split("\t")[0] for line in (data / "test.tsv").read_text().splitlines()]
    assert [p.label for p in predictions] == gold
    right = sum(p.prediction == p.label for p in predictions)
    assert right / len(gold) == pytest.approx(summary["test"]["accuracy"])
    assert PREDICTIONS in json.loads((tmp_path / "run" / ".run-files.json").read_text())["files"]
    again = tmp_path / "again.jsonl"
    result = runner.invoke(app, ["eval", "-k", str(tmp_path / "run" / "best.safetensors"), "--data",
                                 str(data / "test.tsv"), "--device", "cpu", "--predictions", str(again)])
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["accuracy"] == pytest.approx(summary["test"]["accuracy"])
    assert again.read_bytes() == kept.read_bytes()


def test_a_tagger_run_keeps_its_tags(tmp_path):
    conll = write_conll(tmp_path)
    cfg = tiny_config(conll, tmp_path / "run", data={"format": "conll", "train": "train.txt", "test": "test.txt"},
                      model={"type": "tagger", "encoder": "bilstm"}, train={"max_steps": 8, "eval_every": 4,
                                                                            "metric": "f1"})
    summary = Trainer(cfg).fit()
    predictions = read_predictions(tmp_path / "run" / PREDICTIONS)
    assert all(len(p.prediction) == len(p.label) == 5 for p in predictions)
    assert span_f1([p.prediction for p in predictions], [p.label for p in predictions]) == \
        pytest.approx(summary["test"]["f1"])


def test_eval_writes_a_seq2seq_models_hypotheses_as_its_run_did(tmp_path):
    from test_summarization import summarization_config

    data = write_summaries(tmp_path)
    Trainer(summarization_config(data, tmp_path / "run", train={"max_steps": 4, "eval_every": 4})).fit()
    kept = tmp_path / "run" / HYPOTHESES
    again = tmp_path / "again.txt"
    result = runner.invoke(app, ["eval", "-k", str(tmp_path / "run" / "best.safetensors"), "--src",
                                 str(data / "test.src"), "--ref", str(data / "test.tgt"), "--device", "cpu",
                                 "--predictions", str(again)])
    assert result.exit_code == 0, result.output
    assert again.read_bytes() == kept.read_bytes()
    assert len(read_hypotheses(again, 12)) == 12
    with pytest.raises(DataError, match="holds 12 hypotheses for 13 test references"):
        read_hypotheses(again, 13)


@pytest.mark.parametrize("line, problem", [
    ("not json", "not JSON"),
    ('{"prediction": "pos"}', "expected"),
    ('{"prediction": "pos", "label": 1}', "expected"),
    ('{"prediction": ["B-LOC"], "label": ["B-LOC", "O"]}', "equally long"),
    ('{"prediction": "pos", "label": ["O"]}', "expected"),
])
def test_a_damaged_predictions_file_is_refused_naming_its_line(tmp_path, line, problem):
    path = tmp_path / PREDICTIONS
    path.write_text('{"prediction": "pos", "label": "neg"}\n' + line + "\n")
    with pytest.raises(DataError, match=rf"{PREDICTIONS}:2: .*{problem}"):
        read_predictions(path)
    path.write_text("")
    with pytest.raises(DataError, match="holds no predictions"):
        read_predictions(path)


def test_records_with_bytes_that_are_not_utf8_or_lines_past_the_limit_name_file_and_line(tmp_path, monkeypatch):
    """Issue 55 items 2 and 3: a byte that is not UTF-8 in test.pred.jsonl / test.hyp.txt was a UnicodeDecodeError
    traceback, and a one-line file was read whole (2 GB: MemoryError). Both readers go through the bounded line
    reader: one line naming the file and the line."""
    predictions, hypotheses = tmp_path / PREDICTIONS, tmp_path / HYPOTHESES
    predictions.write_bytes(b'{"prediction": "pos", "label": "neg"}\n{"prediction": "caf\xe9", "label": "neg"}\n')
    hypotheses.write_bytes(b"ein Satz\nnoch ein S\xe4tz\n")
    with pytest.raises(DataError, match=rf"{PREDICTIONS}:2: not UTF-8 text \(byte 0xe9 at byte 20 of the line\)"):
        read_predictions(predictions)
    with pytest.raises(DataError, match=rf"{HYPOTHESES}:2: not UTF-8 text \(byte 0xe4 at byte 11 of the line\)"):
        read_hypotheses(hypotheses, 2)
    monkeypatch.setenv("MASKATTN_MAX_LINE_BYTES", "64")
    predictions.write_text('{"prediction": "pos", "label": "' + "x" * 100 + '"}\n')
    hypotheses.write_text("y" * 100)
    for read, path in ((read_predictions, predictions), (lambda p: read_hypotheses(p, 1), hypotheses)):
        with pytest.raises(DataError, match=rf"{path.name}:1: a line longer than 64 bytes"):
            read(path)

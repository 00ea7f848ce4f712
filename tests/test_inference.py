"""maskattn.inference on small trained models: the labels and metrics of a classifier checkpoint (checked against
the trained run, a loss computed by hand and the gold file), the truncation of over-long inputs, translation with a
Seq2Seq (checked against decoding each line alone, and against sacreBLEU called directly); and the package layout of
using a checkpoint: ``maskattn.inference`` (and ``maskattn.viz`` on top of it) works without the training toolkit."""

from __future__ import annotations

import subprocess
import sys

import pytest
import sacrebleu
import torch
import torch.nn.functional as F

from _train_helpers import tiny_config, write_sentiment
from maskattn.data.batching import IGNORE_INDEX
from maskattn.data.examples import TextExample
from maskattn.data.subword import BOS_ID, EOS_ID, PAD_ID, SubwordModel
from maskattn.errors import DataError
from maskattn.inference import (Translator, evaluate_file, evaluate_translation, greedy_decode, load_model,
                                predict)
from maskattn.metrics import summed_loss
from maskattn.models import Seq2Seq
from maskattn.train import Trainer

MAX_LEN = 8  # data.max_len of the classifier: longer sentences are cut to their first 8 tokens


@pytest.fixture(scope="module")
def classifier(tmp_path_factory):
    """A sentence classifier trained for 40 steps on "good" (pos) vs "bad" (neg): (data folder, best checkpoint,
    the run's summary)."""
    tmp = tmp_path_factory.mktemp("inference")
    data = write_sentiment(tmp)
    summary = Trainer(tiny_config(data, tmp / "run", data={"max_len": MAX_LEN},
                                  train={"max_steps": 40, "eval_every": 10})).fit()
    return data, tmp / "run" / "best.safetensors", summary


def read_tsv(path):
    pairs = [line.split("\t") for line in path.read_text().splitlines()]
    return [text for _, text in pairs], [label for label, _ in pairs]


def test_predict_gives_the_learned_labels_one_output_per_input(classifier):
    _, path, _ = classifier
    texts = ["the film was good", "", "the plot was bad", "   ", "good", "very bad music"]
    assert predict(path, texts) == ["pos", "", "neg", "", "pos", "neg"]  # blank in, blank out: outputs stay aligned
    loaded = load_model(path)
    assert predict(loaded, texts, batch_size=1) == predict(loaded, texts)  # padding in a batch changes nothing


def test_evaluate_file_is_the_runs_test_score_the_share_predict_gets_right_and_the_mean_loss(classifier):
    data, path, summary = classifier
    texts, gold = read_tsv(data / "test.tsv")
    metrics = evaluate_file(path, data / "test.tsv")
    assert metrics == summary["test"]  # the trainer's test evaluation of the best checkpoint, number for number
    predicted = predict(path, texts)
    assert metrics["accuracy"] == pytest.approx(sum(p == g for p, g in zip(predicted, gold)) / len(gold))
    assert metrics["accuracy"] >= 0.9  # "good" vs "bad" is learnable in 40 steps

    loaded = load_model(path)  # the loss by hand: one unpadded sentence at a time, averaged over the file
    loaded.model.eval()
    items, _ = loaded.encode([TextExample(tuple(t.split()), g) for t, g in zip(texts, gold)], loaded.labels)
    with torch.no_grad():
        losses = [F.cross_entropy(loaded.model(tokens=torch.tensor([it["tokens"]]),
                                               padding_mask=torch.zeros(1, len(it["tokens"]), dtype=torch.bool)),
                                  torch.tensor([it["label"]])).item() for it in items]
    assert metrics["loss"] == pytest.approx(sum(losses) / len(losses), rel=1e-5)


def test_over_long_inputs_are_cut_to_the_model_limit_and_reported_by_line(classifier, tmp_path):
    _, path, _ = classifier
    long = "the film was very good and the story and the music too"  # 12 tokens
    assert len(long.split()) > MAX_LEN
    seen = []
    out = predict(path, ["bad", long, "the plot was bad"], on_truncate=lambda lines, limit: seen.append((lines, limit)))
    assert seen == [([2], MAX_LEN)]  # 1-based input numbers, and the limit
    assert out[1] == predict(path, [" ".join(long.split()[:MAX_LEN])])[0]  # read as its first 8 tokens

    lines = ["pos\tthe film was good", f"pos\t{long}", "neg\tthe plot was bad", f"neg\t{long.replace('good', 'bad')}"]
    (tmp_path / "long.tsv").write_text("\n".join(lines) + "\n")
    seen.clear()
    evaluate_file(path, tmp_path / "long.tsv", on_truncate=lambda lines, limit: seen.append((lines, limit)))
    assert seen == [([2, 4], MAX_LEN)]  # line numbers of the file


def test_a_file_of_another_format_is_refused_naming_the_line_and_the_checkpoints_format(classifier, tmp_path):
    """Issue 32 item 4: TREC's three columns read as ``tsv`` glued the fine label into the text."""
    _, path, _ = classifier
    (tmp_path / "three.tsv").write_text("pos\tx\tthe film was good\nneg\ty\tthe plot was bad\n")
    with pytest.raises(DataError, match=r"three\.tsv:1: expected 'label<TAB>text', found 2 tabs"):
        evaluate_file(path, tmp_path / "three.tsv")
    (tmp_path / "two.tsv").write_text("pos\tthe film was good\n")
    with pytest.raises(DataError, match=r"two\.tsv:1: .*found 1 tab.* read as format 'trec', but the checkpoint was "
                                        r"trained on format 'tsv' \(leave out --format"):
        evaluate_file(path, tmp_path / "two.tsv", format="trec")


PAIRS = [("the small cat", "die kleine Katze"), ("a big red dog", "ein großer roter Hund"),
         ("the dog sees the cat", "der Hund sieht die Katze"), ("the red cat", "die rote Katze")]


def padded(rows: list[list[int]]) -> torch.Tensor:
    out = torch.full((len(rows), max(map(len, rows))), PAD_ID)
    for i, row in enumerate(rows):
        out[i, :len(row)] = torch.tensor(row)
    return out


@pytest.fixture(scope="module")
def translator():
    """A small Seq2Seq fitted for 60 steps to four sentence pairs (enough for outputs that differ from line to
    line), with its subword model."""
    subword = SubwordModel.train([s for pair in PAIRS for s in pair], vocab_size=48)
    torch.manual_seed(0)
    model = Seq2Seq.from_architecture("transformer", len(subword), len(subword), d_model=16, num_heads=2,
                                      encoder_layers=1, decoder_layers=1, share_embeddings=True, max_len=24)
    src = padded([subword.encode(s) + [EOS_ID] for s, _ in PAIRS])
    targets = [subword.encode(t) for _, t in PAIRS]
    tgt_in, tgt_out = padded([[BOS_ID, *t] for t in targets]), padded([[*t, EOS_ID] for t in targets])
    optimizer = torch.optim.Adam(model.parameters(), lr=0.02)
    model.train()
    for _ in range(60):
        loss = summed_loss(model(src, tgt_in), tgt_out.masked_fill(tgt_out == PAD_ID, IGNORE_INDEX))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return Translator(model, subword, max_len=24)


def test_translate_is_each_line_decoded_alone_with_blank_lines_kept(translator):
    lines = ["the small cat", "", "a big red dog sees the cat", "  ", "the red cat", "dog"]
    out = translator.translate(lines, beam=1, batch_size=8)
    assert len(out) == len(lines) and out[1] == "" and out[3] == ""
    assert out[0] == "die kleine Katze" and out[4] == "die rote Katze"  # two of the pairs it was fitted to
    for line, translation in zip(lines, out):
        if line.strip():
            ids, _ = translator.encode_source(line)
            alone = greedy_decode(translator.model, torch.tensor([ids]), bos_id=BOS_ID, eos_id=EOS_ID)[0]
            assert translation == translator.subword.decode(alone)
    assert translator.translate(lines, beam=3, batch_size=1) == translator.translate(lines, beam=3, batch_size=8)


def test_evaluate_translation_is_sacrebleu_of_the_translations(translator, tmp_path):
    sources = [s for s, _ in PAIRS] + ["the small dog"]
    references = [t for _, t in PAIRS] + ["der kleine Hund"]
    (tmp_path / "src.txt").write_text("\n".join(sources) + "\n")
    (tmp_path / "ref.txt").write_text("\n".join(references) + "\n")
    scores = evaluate_translation(translator, tmp_path / "src.txt", tmp_path / "ref.txt", beam=2)
    hypotheses = translator.translate(sources, beam=2)
    assert scores["sentences"] == 5 and 0 < scores["bleu"] < 100  # some lines right, some wrong
    assert scores["bleu"] == pytest.approx(sacrebleu.corpus_bleu(hypotheses, [references]).score)
    assert scores["chrf"] == pytest.approx(sacrebleu.corpus_chrf(hypotheses, [references]).score)
    (tmp_path / "self.txt").write_text("\n".join(hypotheses) + "\n")  # scored against itself: a perfect score
    assert evaluate_translation(translator, tmp_path / "src.txt", tmp_path / "self.txt", beam=2)["chrf"] == 100.0


def test_inference_and_viz_do_not_import_train():
    code = ("import sys, maskattn.inference, maskattn.viz\n"
            "print(sorted(m for m in sys.modules if m.startswith('maskattn.train')))\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"

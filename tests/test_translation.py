"""Translation: subwords, parallel files, token-count batches, label smoothing, training through the shared
Trainer (resume exactness), the translate / eval command line end to end, bad inputs, the Multi30k presets.

Everything runs on tiny synthetic parallel files written to tmp_path (a word-for-word "English → German"
lexicon) with tiny models and a few steps."""

from __future__ import annotations

import json
import math
import random

import pytest
import torch
import yaml
from typer.testing import CliRunner

from _train_helpers import (assert_same_last_weights, fit_killed_before_step, flat, merged_config, sentence_pairs,
                            tiny_config, write_parallel, write_sentiment)
from maskattn.cli import app
from maskattn.data.parallel import ParallelText, TokenBatchSampler, collate_pairs, encode_pairs, read_parallel
from maskattn.data.subword import BOS_ID, EOS_ID, PAD_ID, UNK_ID, SubwordModel
from maskattn.train import Trainer, load_checkpoint, load_config, read_metrics, resume
from maskattn.inference import load_translator
from maskattn.metrics import summed_loss
from maskattn.train.config import RunConfig, from_dict, preset_path

runner = CliRunner()


def translation_config(data_dir, out_dir, **sections) -> RunConfig:
    base = {
        "data": {"dir": str(data_dir), "format": "parallel", "src_lang": "en", "tgt_lang": "de", "train": "train",
                 "dev": "val", "test": "test", "subword_vocab": 80, "max_tokens": 160, "max_len": 24},
        "model": {"type": "seq2seq", "architecture": "transformer", "encoder_layers": 1, "decoder_layers": 1,
                  "d_model": 16, "num_heads": 2, "positional": "sinusoidal", "max_len": 24, "dropout": 0.1,
                  "share_embeddings": True},
        "optim": {"name": "adam", "lr": 0.01, "betas": [0.9, 0.98], "schedule": "inverse_sqrt", "warmup_steps": 4,
                  "clip_norm": 1.0},
        "train": {"max_steps": 12, "eval_every": 6, "metric": "bleu", "log_every": 1, "out_dir": str(out_dir),
                  "progress": False, "num_threads": 1, "test_beam": 2, "eval_batch_size": 8},
    }
    return merged_config(base, sections)


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """One small translation run shared by the command-line tests: (data folder, run folder, summary)."""
    tmp_path = tmp_path_factory.mktemp("translation")
    data = write_parallel(tmp_path)
    summary = Trainer(translation_config(data, tmp_path / "run")).fit()
    return data, tmp_path / "run", summary


# --- subwords ------------------------------------------------------------------------------------------

def test_subword_round_trip_special_ids_and_unseen_characters():
    texts = [s for pair in sentence_pairs(50, 0) for s in pair]
    model = SubwordModel.train(texts, vocab_size=60)
    assert model.pieces()[:4] == ["<pad>", "<unk>", "<s>", "</s>"]
    assert (PAD_ID, UNK_ID, BOS_ID, EOS_ID) == (0, 1, 2, 3)
    assert 4 < len(model) <= 60  # vocab_size is an upper bound on a small corpus
    for text in texts[:10]:
        assert model.decode(model.encode(text)) == text  # detokenised round trip
    ids = model.encode("The cat sees 猫 ☃.")
    assert UNK_ID in ids  # characters never seen in training → <unk>, not an error
    assert model.decode(ids).startswith("The cat sees") and "⁇" in model.decode(ids)
    assert model.decode([BOS_ID] + model.encode("Das Haus.") + [EOS_ID, PAD_ID]) == "Das Haus."
    assert SubwordModel(model.proto) == model
    with pytest.raises(ValueError, match="not a sentencepiece model"):
        SubwordModel(b"junk bytes")
    with pytest.raises(ValueError, match=r"ids \[999\] are outside the subword vocabulary"):
        model.decode([999])
    with pytest.raises(ValueError, match="unknown subword model_type 'wordpiece'"):
        SubwordModel.train(texts, model_type="wordpiece")
    assert len(SubwordModel.train(texts, vocab_size=40, model_type="unigram")) <= 40


def test_a_vocabulary_smaller_than_the_characters_is_refused_with_the_smallest_size_that_works(tmp_path):
    """Issue 55 item 9: data.subword_vocab=60 on Multi30k (104 characters and special pieces) was sentencepiece's
    RuntimeError traceback. Now one line giving the smallest size that works — and that size does work."""
    import re

    texts = [s for pair in sentence_pairs(50, 0) for s in pair] + ["Ünïcödé çharacters: ß, ø, å, 猫 ☃!"]
    with pytest.raises(ValueError, match=r"vocab_size=10 is smaller than this text needs") as refused:
        SubwordModel.train(texts, vocab_size=10)
    smallest = int(re.search(r"the smallest size that works is vocab_size=(\d+)$", str(refused.value)).group(1))
    assert len(SubwordModel.train(texts, vocab_size=smallest)) == smallest
    with pytest.raises(ValueError, match=f"the smallest size that works is vocab_size={smallest}$"):
        SubwordModel.train(texts, vocab_size=smallest - 1)
    data = write_parallel(tmp_path)
    config = tmp_path / "run.yaml"
    config.write_text(yaml.safe_dump(translation_config(data, tmp_path / "ignored").to_dict()))
    result = runner.invoke(app, ["train", "-c", str(config), "--out", str(tmp_path / "run"), "--set",
                                 "data.subword_vocab=10"])
    assert result.exit_code == 2 and result.output.count("\n") == 1, result.output
    assert re.fullmatch(r"error: data\.subword_vocab=10 is smaller than this text needs: .*; the smallest size that "
                        r"works is data\.subword_vocab=\d+\n", result.output), result.output


# --- parallel files and batches ------------------------------------------------------------------------

def test_mismatched_line_counts_name_both_files(tmp_path):
    (tmp_path / "a.en").write_text("one\ntwo\nthree\n")
    (tmp_path / "a.de").write_text("eins\nzwei\n")
    with pytest.raises(ValueError, match=r"a\.en has 3 lines, .*a\.de has 2 lines"):
        read_parallel(tmp_path / "a.en", tmp_path / "a.de")
    data = write_parallel(tmp_path)
    (data / "val.de").write_text("Nur eine Zeile.\n")
    with pytest.raises(ValueError, match=r"val\.en has 12 lines, .*val\.de has 1 lines"):
        Trainer(translation_config(data, tmp_path / "run"))


def test_encoding_skips_empty_training_pairs_and_filters_or_truncates_long_ones():
    model = SubwordModel.train(["a b c d e f g h", "A B C D E F G H"], vocab_size=40)
    text = ParallelText(["a b", "", "a b c d e f g h " * 4, "c d"], ["A B", "X", "A B", ""], None, None)
    train = encode_pairs(text, model, max_len=8, training=True)
    assert train.kept == [0] and train.skipped_empty == 2 and train.filtered == 1
    assert train.items[0]["src"][-1] == EOS_ID and train.items[0]["tgt"][0] == BOS_ID
    cut = encode_pairs(text, model, max_len=8, training=True, overlong="truncate")
    assert cut.kept == [0, 2] and cut.truncated == 1 and len(cut.items[1]["src"]) == 8
    dev = encode_pairs(text, model, max_len=8, training=False)  # dev / test keep every line
    assert dev.kept == [0, 1, 2, 3] and dev.items[1]["src"] == [EOS_ID] and len(dev.items[2]["src"]) == 8
    with pytest.raises(ValueError, match="unknown data.overlong 'drop'"):
        encode_pairs(text, model, max_len=8, training=True, overlong="drop")


def test_token_batches_respect_the_budget_cover_every_pair_and_are_deterministic():
    rng = random.Random(0)
    items = [{"src": [5] * rng.randint(1, 30) + [EOS_ID], "tgt": [BOS_ID] + [6] * rng.randint(1, 30) + [EOS_ID]}
             for _ in range(300)]
    sampler = TokenBatchSampler(items, 100, seed=3)
    epochs = [sampler.batches(e) for e in range(3)]
    for batches in epochs:
        assert len(batches) == len(sampler)  # same number of batches in every epoch
        assert sorted(i for b in batches for i in b) == list(range(300))
        for b in batches:
            width = max(max(len(items[i]["src"]), len(items[i]["tgt"]) - 1) for i in b)
            assert len(b) * width <= 100
            batch = collate_pairs([items[i] for i in b])
            assert batch.src.numel() <= 100 and batch.tgt_in.numel() <= 100
            assert batch.ntokens == int((batch.tgt_out != PAD_ID).sum())
    assert epochs[0] != epochs[1]
    assert TokenBatchSampler(items, 100, seed=3).batches(1) == epochs[1]  # a pure function of (seed, epoch)
    assert TokenBatchSampler(items, 100, seed=4).batches(1) != epochs[1]
    widest = max(max(len(it["src"]), len(it["tgt"]) - 1) for it in items)
    with pytest.raises(ValueError, match=f"a pair is {widest} tokens wide but max_tokens is 20"):
        TokenBatchSampler(items, 20)


# --- loss ---------------------------------------------------------------------------------------------

def test_label_smoothed_loss_matches_a_hand_computation():
    logits = torch.tensor([[[2.0, 0.5, -1.0, 0.0], [0.1, 0.2, 0.3, 0.4]],
                           [[1.0, 1.0, 1.0, 1.0], [3.0, -2.0, 0.0, 1.0]]])  # (B=2, T=2, V=4)
    targets = torch.tensor([[0, 3], [2, -100]])  # -100: padding
    eps = 0.1
    expected = 0.0
    for b, t in [(0, 0), (0, 1), (1, 0)]:
        row = logits[b, t].tolist()
        log_z = math.log(sum(math.exp(x) for x in row))
        nll = [log_z - x for x in row]  # -log p_c for every class c
        expected += (1 - eps) * nll[int(targets[b, t])] + eps * sum(nll) / 4
    assert float(summed_loss(logits, targets, label_smoothing=eps)) == pytest.approx(expected, rel=1e-6)
    plain = sum(math.log(sum(math.exp(x) for x in logits[b, t].tolist())) - float(logits[b, t, targets[b, t]])
                for b, t in [(0, 0), (0, 1), (1, 0)])
    assert float(summed_loss(logits, targets)) == pytest.approx(plain, rel=1e-6)


# --- training -----------------------------------------------------------------------------------------

def test_training_logs_bleu_and_tokens_per_second_and_stores_the_subword_model(trained):
    data, run, summary = trained
    assert summary["metric"] == "bleu" and summary["tokens_per_s"] > 0
    assert summary["data"] == {"subword_vocab": len(load_translator(run / "best.safetensors").subword),
                               "train_pairs": 158, "skipped_empty": 2, "filtered_overlong": 0, "truncated_overlong": 0}
    assert {"bleu", "chrf", "loss", "ppl"} <= set(summary["test"])
    rows = read_metrics(run / "metrics.jsonl")
    assert all(r["tokens_per_s"] > 0 for r in rows if r["split"] == "train")
    assert [r["step"] for r in rows if r["split"] == "dev"] == [6, 12]
    assert "tokens_per_s" in (run / "metrics.csv").read_text().splitlines()[0]
    best = load_checkpoint(run / "best.safetensors")
    assert best.model_type == "seq2seq" and best.vocab[:4] == ["<pad>", "<unk>", "<s>", "</s>"]
    translator = load_translator(run / "best.safetensors")  # self-contained: subword model inside
    assert translator.subword.decode(translator.subword.encode("The red house.")) == "The red house."
    assert len(translator.subword) == len(best.vocab)


def test_translation_learns_the_lexicon(tmp_path):
    data = write_parallel(tmp_path)
    cfg = translation_config(data, tmp_path / "run", model={"d_model": 32, "dropout": 0.0}, optim={"lr": 0.02},
                             train={"max_steps": 150, "eval_every": 150, "test_beam": 1})
    summary = Trainer(cfg).fit()
    assert summary["test"]["chrf"] > 45 and summary["test"]["bleu"] > 15  # an untrained model: chrF ~0–5


def test_resume_reproduces_the_uninterrupted_translation_loss_curve(tmp_path, monkeypatch):
    data = write_parallel(tmp_path)
    sections = {"train": {"max_steps": 10, "eval_every": 4, "metric": "loss"}}
    Trainer(translation_config(data, tmp_path / "full", **sections)).fit()

    fit_killed_before_step(monkeypatch, translation_config(data, tmp_path / "cut", **sections), 7)
    assert load_checkpoint(tmp_path / "cut" / "last.safetensors").step == 4
    resume(tmp_path / "cut" / "last.safetensors")

    def losses(run):
        return [(r["step"], r["loss"]) for r in read_metrics(tmp_path / run / "metrics.jsonl") if r["split"] == "train"]

    assert [s for s, _ in losses("cut")] == list(range(1, 11))
    assert losses("cut") == losses("full")  # bit-identical: data order, dropout RNG, Adam, subword model
    assert_same_last_weights(tmp_path / "full", tmp_path / "cut")

    (data / "train.de").write_text((data / "train.de").read_text().replace("Haus", "Gebäude"))
    with pytest.raises(ValueError, match="differ from the ones checkpoint .* was trained on"):
        resume(tmp_path / "cut" / "last.safetensors")


def test_translation_config_errors(tmp_path):
    data = write_parallel(tmp_path)
    with pytest.raises(ValueError, match="train.metric 'accuracy' is not computed for model.type 'seq2seq'; "
                                         "expected one of bleu, chrf, loss"):
        Trainer(translation_config(data, tmp_path / "r", train={"metric": "accuracy"}))
    with pytest.raises(ValueError, match="set data.format=parallel"):
        Trainer(translation_config(data, tmp_path / "r", data={"format": "tsv"}))
    with pytest.raises(ValueError, match="data.max_len 48 exceeds model.max_len 24"):
        Trainer(translation_config(data, tmp_path / "r", data={"max_len": 48}))
    with pytest.raises(ValueError, match="unknown architecture 'lstm'"):
        Trainer(translation_config(data, tmp_path / "r", model={"architecture": "lstm"}))
    old = translation_config(data, tmp_path / "r2").to_dict()
    old["model"]["preset"] = old["model"].pop("architecture")  # the key's name before 0.2
    with pytest.warns(DeprecationWarning, match="config key model.preset is now model.architecture"):
        assert from_dict(RunConfig, old).model.architecture == "transformer"
    old["model"]["architecture"] = "man"
    with pytest.raises(ValueError, match="model.preset and model.architecture are one setting"):
        from_dict(RunConfig, old)
    with pytest.raises(ValueError, match="unknown config key.*model.layers; valid keys of model: type, encoder"):
        load_config(None, ["model.type=seq2seq", "model.layers=3"])
    sentiment = write_sentiment(tmp_path)
    with pytest.raises(ValueError, match="data.format 'parallel' is data of a seq2seq model; set model.type=seq2seq"):
        Trainer(tiny_config(sentiment, tmp_path / "r", data={"format": "parallel"}))


# --- command line -------------------------------------------------------------------------------------

def test_cli_train_translate_eval_end_to_end(tmp_path):
    data = write_parallel(tmp_path)
    config = tmp_path / "mt.yaml"
    config.write_text(yaml.safe_dump(translation_config(data, tmp_path / "ignored").to_dict()))
    out = tmp_path / "run"
    result = runner.invoke(app, ["train", "--config", str(config), "--out", str(out), "--max-steps", "6",
                                 "--set", "train.eval_every=6", "--no-progress"])
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout[result.stdout.index("{"):])
    assert summary["steps"] == 6 and summary["tokens_per_s"] > 0 and "bleu" in summary["test"]

    source = tmp_path / "in.en"
    source.write_text("The cat sees the dog.\n\nThe red house.\n   \nBig tree.\n", encoding="utf-8")
    target = tmp_path / "out.de"
    result = runner.invoke(app, ["translate", "-k", str(out / "best.safetensors"), "-i", str(source), "-o",
                                 str(target), "--beam", "2"])
    assert result.exit_code == 0, result.output
    lines = target.read_text(encoding="utf-8").split("\n")
    assert len(lines) == 6 and lines[-1] == ""  # 5 lines, newline-terminated
    assert lines[1] == "" and lines[3] == ""  # empty input lines → empty output lines

    result = runner.invoke(app, ["translate", "-k", str(out / "best.safetensors"), "--beam", "1"],
                           input="Das ist egal.\n\n")
    assert result.exit_code == 0, result.output
    assert result.stdout.count("\n") == 2 and result.stdout.endswith("\n\n")  # stdin → stdout, count kept

    result = runner.invoke(app, ["eval", "-k", str(out / "best.safetensors"), "--src", str(data / "test.en"),
                                 "--ref", str(data / "test.de"), "--beam", "2"])
    assert result.exit_code == 0, result.output
    scores = json.loads(result.stdout)
    assert 0 <= scores["bleu"] <= 100 and 0 <= scores["chrf"] <= 100 and scores["sentences"] == 12
    assert scores["bleu_signature"].startswith("nrefs:1|case:mixed") and "tok:13a" in scores["bleu_signature"]
    assert scores["chrf_signature"].startswith("nrefs:1") and scores["bleu_detail"].startswith("BLEU = ")

    (tmp_path / "short.de").write_text("Eins.\n")
    result = runner.invoke(app, ["eval", "-k", str(out / "best.safetensors"), "--src", str(data / "test.en"),
                                 "--ref", str(tmp_path / "short.de")])
    message = flat(result.output)
    assert result.exit_code == 2 and "test.en has 12 lines" in message and "short.de has 1 lines" in message


def test_over_long_input_is_truncated_with_a_warning(trained):
    _, run, _ = trained
    long_line = " ".join(["the big red house sees the small green tree"] * 10)  # > max_len 24 subwords
    result = runner.invoke(app, ["translate", "-k", str(run / "best.safetensors"), "--beam", "1"],
                           input=f"The cat.\n{long_line}\n")
    assert result.exit_code == 0, result.output
    assert "1 input line(s) longer than the model's max_len were truncated" in flat(result.stderr)
    assert "line(s) 2" in flat(result.stderr)
    assert result.stdout.count("\n") == 2


def test_translate_and_eval_split_lines_on_newline_only(trained, tmp_path):
    data, run, _ = trained
    source = tmp_path / "cr.en"
    source.write_bytes(b"The cat.\rThe dog.\r\nThe tree.\n")  # a lone \r is inside line 1; \r\n ends line 2
    result = runner.invoke(app, ["translate", "-k", str(run / "best.safetensors"), "-i", str(source), "--beam", "1"])
    assert result.exit_code == 0, result.output
    assert result.stdout.count("\n") == 2  # two lines in, two out (a lone \r used to make three)
    reference = tmp_path / "cr.de"
    reference.write_bytes(b"Die Katze.\rDer Hund.\nDer Baum.\n")
    result = runner.invoke(app, ["eval", "-k", str(run / "best.safetensors"), "--src", str(source), "--ref",
                                 str(reference), "--beam", "1"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["sentences"] == 2


def test_bad_translation_input_is_a_message(trained, tmp_path):
    data, run, _ = trained
    result = runner.invoke(app, ["translate", "-k", str(run / "best.safetensors"), "--beam", "1"],
                           input=b"The cat.\nThe caf\xe9.\n")
    assert result.exit_code == 2 and "<stdin>:2: not UTF-8 text (byte 0xe9" in flat(result.output)
    for name in ("empty.en", "empty.de"):
        (tmp_path / name).write_text("")
    result = runner.invoke(app, ["eval", "-k", str(run / "best.safetensors"), "--src", str(tmp_path / "empty.en"),
                                 "--ref", str(tmp_path / "empty.de")])
    assert result.exit_code == 2 and "hold no lines: there is nothing to score" in flat(result.output)


def test_wrong_checkpoint_types_give_clear_errors(trained, tmp_path):
    data, run, _ = trained
    sentiment = write_sentiment(tmp_path)
    Trainer(tiny_config(sentiment, tmp_path / "clf", train={"max_steps": 2})).fit()
    classifier = tmp_path / "clf" / "best.safetensors"
    result = runner.invoke(app, ["translate", "-k", str(classifier)], input="hello\n")
    assert result.exit_code == 2 and "holds a 'sentence' model, not a translation model" in flat(result.output)
    result = runner.invoke(app, ["eval", "-k", str(classifier), "--src", str(data / "test.en"), "--ref",
                                 str(data / "test.de")])
    assert result.exit_code == 2 and "not a translation model" in flat(result.output)
    result = runner.invoke(app, ["eval", "-k", str(run / "best.safetensors"), "--data", str(sentiment / "test.tsv")])
    assert result.exit_code == 2 and "holds a seq2seq (translation or summarization) model" in flat(result.output)
    result = runner.invoke(app, ["predict", "-k", str(run / "best.safetensors"), "hello"])
    assert result.exit_code == 2 and "maskattn translate" in flat(result.output)
    result = runner.invoke(app, ["eval", "-k", str(run / "best.safetensors"), "--src", str(data / "test.en")])
    assert result.exit_code == 2 and "both --src FILE and --ref FILE" in flat(result.output)
    result = runner.invoke(app, ["eval", "-k", str(classifier), "--data", str(sentiment / "test.tsv")])
    assert result.exit_code == 0, result.output  # classifiers still evaluate as before


# --- presets ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("suffix", ["", "-gpu"])
def test_multi30k_presets_differ_only_in_the_model_architecture(suffix):
    names = ["transformer", "man", "csan", "mtsa-encoder"]
    configs = {name: load_config(preset_path(f"multi30k-{name}{suffix}")).to_dict() for name in names}
    for name, cfg in configs.items():
        assert cfg["model"]["type"] == "seq2seq" and cfg["model"]["architecture"] == name
        assert cfg["data"]["format"] == "parallel" and cfg["train"]["metric"] == "bleu"
        assert cfg["train"]["out_dir"] == f"runs/multi30k-{name}{suffix}"
        cfg["model"]["architecture"] = cfg["train"]["out_dir"] = None
    reference = configs["transformer"]
    assert all(cfg == reference for cfg in configs.values())
    assert reference["train"]["amp"] == (suffix == "-gpu")

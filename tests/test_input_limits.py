"""Bounded memory on any input (issue 23): a default length limit for every model, one warning counting what was
cut, a memory estimate that refuses a batch over the budget before it is built (training, predict / eval, viz),
run folders given as checkpoints, and truncation warnings numbered by source."""

from __future__ import annotations

import os

import pytest
from rich.console import Console
from typer.testing import CliRunner

from _train_helpers import tiny_config, write_sentiment
from maskattn import device as device_module
from maskattn.checkpoint import load_checkpoint
from maskattn.cli import app
from maskattn.data.config import DataConfig
from maskattn.device import (MEMORY_LIMIT_ENV, attention_memory_bytes, check_memory, format_bytes,
                             memory_budget)
from maskattn.errors import CheckpointError, ConfigError, DataError, InputError, MemoryLimitError
from maskattn.inference import evaluate_file, load_model, predict
from maskattn.metrics import input_limit
from maskattn.models.config import ModelConfig
from maskattn.models.memory import model_memory_bytes
from maskattn.train import Trainer

runner = CliRunner()


def flat(text: str) -> str:
    return " ".join(text.split())


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A tiny MTSA sentence classifier without positional encodings (the default job's kind of model)."""
    root = tmp_path_factory.mktemp("limits")
    data = write_sentiment(root)
    Trainer(tiny_config(data, root / "run", train={"max_steps": 8, "eval_every": 4})).fit()
    return data, root / "run"


# --- item 1: a default limit for every model ---------------------------------------------------------------

def test_every_model_has_a_default_length_limit():
    # was None for models without positional encodings: one long line grew memory quadratically
    assert input_limit(DataConfig(), ModelConfig()) == 512
    assert input_limit(DataConfig(max_len=40), ModelConfig()) == 40
    assert input_limit(DataConfig(max_len=5000), ModelConfig()) == 5000  # raised by hand: the memory check decides
    assert input_limit(DataConfig(), ModelConfig(max_len=64)) == 64
    assert input_limit(DataConfig(max_len=900), ModelConfig(positional="sinusoidal")) == 512


def test_a_long_training_line_is_truncated_with_one_warning_that_counts_it(tmp_path):
    data = write_sentiment(tmp_path)
    with (data / "train.tsv").open("a") as train:
        train.write("pos\t" + " ".join(["good"] * 700) + "\n")
        train.write("neg\t" + " ".join(["bad"] * 600) + "\n")
    console = Console(record=True, width=400)
    trainer = Trainer(tiny_config(data, tmp_path / "run", train={"max_steps": 2, "eval_every": 2}), console=console)
    longest = max(len(item["tokens"]) for split in ("train", "dev") for item in getattr(trainer.task.data, split))
    trainer.close()
    assert longest == 512
    text = flat(console.export_text())
    assert text.count("were truncated") == 1
    assert "2 example(s) longer than 512 tokens" in text and "model.max_len" in text


def test_memory_estimate_is_quadratic_and_counts_feature_wise_maps():
    one = attention_memory_bytes(1, 1000, heads=4, layers=1, width=64)
    assert attention_memory_bytes(1, 2000, heads=4, layers=1, width=64) > 3.9 * one
    assert attention_memory_bytes(1, 1000, heads=4, layers=2, width=64, training=True) > one
    assert attention_memory_bytes(1, 1000, heads=4, layers=1, width=64, score_features=16) > 15 * one
    assert format_bytes(3 * 2**30) == "3.0 GiB" and format_bytes(5 * 2**20) == "5 MiB"


def test_the_budget_is_a_share_of_available_memory_or_the_environment(monkeypatch):
    monkeypatch.delenv(MEMORY_LIMIT_ENV, raising=False)
    monkeypatch.setattr(device_module, "available_memory_bytes", lambda device="cpu": 10 * 2**30)
    assert memory_budget() == int(10 * 2**30 * device_module.MEMORY_FRACTION)
    monkeypatch.setattr(device_module, "available_memory_bytes", lambda device="cpu": None)
    assert memory_budget() is None
    for text, expected in (("8G", 8 * 2**30), ("512MiB", 512 * 2**20), ("1000", 1000), ("none", None)):
        monkeypatch.setenv(MEMORY_LIMIT_ENV, text)
        assert memory_budget() == expected
    monkeypatch.setenv(MEMORY_LIMIT_ENV, "lots")
    with pytest.raises(ConfigError, match="MASKATTN_MEMORY_LIMIT='lots' is not a memory size"):
        memory_budget()


@pytest.mark.skipif(not os.path.isfile("/proc/meminfo"), reason="reads /proc/meminfo (Linux)")
def test_available_memory_is_read_from_the_system():
    """On Linux the available memory is MemAvailable of /proc/meminfo (read here too, to a few percent: other
    processes allocate between the two readings), or the smallest other limit that applies when that is lower: what
    ``ulimit -v`` or a cgroup leaves (their readers: the ulimit and cgroup tests below, on known limits)."""
    free = device_module.available_memory_bytes("cpu")
    with open("/proc/meminfo", encoding="ascii") as meminfo:
        fields = dict(line.split(":", 1) for line in meminfo)
    mem_available = int(fields["MemAvailable"].split()[0]) * 1024  # "<number> kB"
    limits = device_module.memory_limits("cpu")
    assert [name for name, _ in limits].count("MemAvailable") == 1, limits
    assert dict(limits)["MemAvailable"] == pytest.approx(mem_available, rel=0.05)
    smallest = min([mem_available] + [room for name, room in limits if name != "MemAvailable"])
    assert free is not None and free == pytest.approx(smallest, rel=0.05), (free, limits)


def test_check_memory_names_the_estimate_the_budget_and_the_way_out(monkeypatch):
    monkeypatch.setenv(MEMORY_LIMIT_ENV, "1M")
    check_memory(2**19, what="x", advice="y")
    with pytest.raises(MemoryLimitError) as caught:
        check_memory(3 * 2**30, what="a batch of 4 sentences", advice="lower data.max_len")
    message = str(caught.value)
    assert "a batch of 4 sentences would need about 3.0 GiB, more than the 1 MiB budget" in message
    assert "lower data.max_len" in message and "MASKATTN_MEMORY_LIMIT" in message
    assert isinstance(caught.value, InputError)


def test_training_over_the_memory_budget_is_refused_before_the_first_step(tmp_path, monkeypatch):
    data = write_sentiment(tmp_path)
    with (data / "train.tsv").open("a") as train:
        for _ in range(6):  # some land in the train split (a quarter is held out for dev)
            train.write("pos\t" + " ".join(["good"] * 3000) + "\n")
    monkeypatch.setenv(MEMORY_LIMIT_ENV, "256M")  # a small budget instead of gigabytes
    cfg = tiny_config(data, tmp_path / "run", data={"max_len": 3000})
    with pytest.raises(MemoryLimitError, match=r"a training step on 8 sentences of 3000 tokens .* would need about "
                                                r"[\d.]+ GiB, more than the 256 MiB budget"):
        Trainer(cfg)
    assert not (tmp_path / "run" / "last.safetensors").exists()
    monkeypatch.setenv(MEMORY_LIMIT_ENV, "none")
    Trainer(tiny_config(data, tmp_path / "run2", data={"max_len": 3000}, train={"max_steps": 1})).close()


def test_predict_and_eval_batches_fit_the_budget_or_are_refused(trained, tmp_path, monkeypatch):
    data, run = trained
    loaded = load_model(run / "best.safetensors")
    texts = ["the film was good " * 50, "the plot was bad " * 50, "good", "bad"]  # 200 tokens: under the 512 limit
    expected = predict(loaded, texts)
    one = model_memory_bytes(loaded.model, 1, 200)
    monkeypatch.setenv(MEMORY_LIMIT_ENV, str(int(one * 1.5)))  # one sentence fits, a batch of two does not
    assert predict(loaded, texts) == expected  # cut into smaller batches, same answers
    metrics = evaluate_file(run / "best.safetensors", data / "test.tsv")
    monkeypatch.setenv(MEMORY_LIMIT_ENV, "1M")  # not even one long sentence fits
    with pytest.raises(MemoryLimitError, match="one input of 200 tokens would need about"):
        predict(loaded, texts)
    monkeypatch.delenv(MEMORY_LIMIT_ENV)
    assert evaluate_file(run / "best.safetensors", data / "test.tsv") == metrics
    result = runner.invoke(app, ["predict", "-k", str(run / "best.safetensors"), "good " * 300], env={
        MEMORY_LIMIT_ENV: "1M"})
    assert result.exit_code == 2 and "error:" in result.output and "more than the 1 MiB budget" in flat(result.output)


def test_viz_with_a_raised_max_length_is_refused_with_the_estimate(trained, monkeypatch):
    _, run = trained
    sentence = " ".join(["good"] * 3000)
    result = runner.invoke(app, ["viz", "attention", sentence, "-k", str(run / "best.safetensors"),
                                 "--max-length", "5000", "--no-terminal", "-o", "x.png"],
                           env={MEMORY_LIMIT_ENV: "512M"})
    assert result.exit_code == 2, result.output
    assert "the attention maps of 1 sentence(s) of 3000 positions would need about" in flat(result.output)
    assert "more than the 512 MiB budget" in flat(result.output)


def test_viz_masks_with_a_raised_length_is_refused_with_the_estimate():
    result = runner.invoke(app, ["viz", "masks", "--length", "3000", "--max-length", "3000", "--no-terminal",
                                 "-o", "x.png"], env={MEMORY_LIMIT_ENV: "64M"})
    assert result.exit_code == 2, result.output
    assert "10 mask panels of 3000 × 3000 would need about 1.3 GiB, more than the 64 MiB budget" in flat(result.output)


# --- item 2: a run folder given as a checkpoint ------------------------------------------------------------

def test_a_run_folder_as_checkpoint_takes_its_best_checkpoint(trained):
    data, run = trained
    result = runner.invoke(app, ["eval", "-k", str(run), "--data", str(data / "test.tsv")])
    assert result.exit_code == 0, result.output
    assert f"{run} is a folder; using {run / 'best.safetensors'}" in flat(result.stderr)
    result = runner.invoke(app, ["predict", "-k", str(run), "good"])
    assert result.exit_code == 0 and len(result.stdout.split()) == 1


def test_a_folder_without_best_names_the_checkpoints_inside(trained, tmp_path):
    _, run = trained
    folder = tmp_path / "runs" / "trec2"
    folder.mkdir(parents=True)
    (folder / "last.safetensors").write_bytes((run / "last.safetensors").read_bytes())
    result = runner.invoke(app, ["eval", "-k", str(folder), "--data", "x.tsv"])
    assert result.exit_code == 2
    message = flat(result.output)
    assert "does not exist" not in message  # was: "checkpoint runs/trec2 does not exist"
    assert f"checkpoint {folder} is a folder without best.safetensors: it holds last.safetensors" in message
    with pytest.raises(CheckpointError, match="is a folder, not a checkpoint file: it holds last.safetensors"):
        load_checkpoint(folder)
    with pytest.raises(CheckpointError, match="it holds no .safetensors checkpoint"):
        load_checkpoint(tmp_path / "runs")


# --- item 3: truncation warnings numbered by source ----------------------------------------------------------

def test_truncation_warning_numbers_file_lines_and_arguments_by_source(tmp_path):
    data = write_sentiment(tmp_path)
    Trainer(tiny_config(data, tmp_path / "run", model={"max_len": 8}, train={"max_steps": 4, "eval_every": 4})).fit()
    mix = tmp_path / "mix.txt"
    mix.write_text("good\nbad\nthe film was very very good and the plot too\n")
    result = runner.invoke(app, ["predict", "-k", str(tmp_path / "run" / "best.safetensors"), "-i", str(mix),
                                 "a", "the film was very very good and the plot too"])
    assert result.exit_code == 0, result.output
    warning = flat(result.stderr)
    assert "2 input line(s) longer than the model's max_len were truncated" in warning
    assert f"{mix} line(s) 3; argument(s) 2" in warning  # was: "line(s) 2, 5"
    assert len(result.stdout.splitlines()) == 5


def test_a_tagger_refuses_an_input_it_would_have_to_cut(tmp_path):
    from _train_helpers import write_conll

    data = write_conll(tmp_path)
    cfg = tiny_config(data, tmp_path / "run", data={"format": "conll", "train": "train.txt", "test": "test.txt"},
                      model={"type": "tagger", "max_len": 6}, train={"max_steps": 2, "eval_every": 2})
    Trainer(cfg).fit()
    with pytest.raises(InputError, match="input\\(s\\) 2: longer than the 6 tokens the tagger reads"):
        predict(tmp_path / "run" / "best.safetensors", ["new york", "the film in new york was very good"])


# --- issue 32 item 2: the estimate holds the weights and every sublayer's workspace ------------------------

def _model_cases():
    import maskattn
    from maskattn.models.fusion import BASELINES
    from maskattn.models.seq2seq import Seq2Seq

    cases = [("sentence", {"encoder": e, "num_heads": 2 if e == "disa" else 4})
             for e in [*maskattn.list_attentions(), *BASELINES, "dman>san>ffn x2"]]
    cases += [("tagger", {"encoder": "mha"}), ("pair", {"encoder": "mtsa"})]
    return cases + [("seq2seq", {"architecture": a, "encoder_layers": 2, "decoder_layers": 2})
                    for a in Seq2Seq.ARCHITECTURES]


@pytest.mark.parametrize("training", [True, False], ids=["train", "infer"])
@pytest.mark.parametrize("model_type, options", _model_cases(),
                         ids=[f"{t}-{o.get('encoder', o.get('architecture'))}" for t, o in _model_cases()])
def test_the_estimate_bounds_the_measured_peak_of_every_model(model_type, options, training):
    """Building the model and one step on it (training: forward, backward and Adam's first step, which allocates its
    moments; inference: one forward pass) peaks below the estimate of the model built on the meta device."""
    import torch
    import torch.nn.functional as F

    from maskattn.bench import peak_memory_bytes
    from maskattn.models.factory import build_model
    from maskattn.sections import from_dict

    B, n, vocab = 8, 32, 300
    cfg = from_dict(ModelConfig, {"type": model_type, "d_model": 32, **options})

    def step():
        torch.manual_seed(0)
        model = build_model(cfg, vocab, 5).train(training)
        tokens, pad = torch.randint(1, vocab, (B, n)), torch.zeros(B, n, dtype=torch.bool)
        with torch.set_grad_enabled(training):
            if model_type == "seq2seq":
                logits, gold = model(tokens, tokens).reshape(-1, vocab), tokens.reshape(-1)
            elif model_type == "pair":
                logits, gold = model(tokens, pad, tokens, pad), torch.zeros(B, dtype=torch.long)
            else:
                logits = model(tokens=tokens, padding_mask=pad).reshape(-1, 5)
                gold = torch.zeros(logits.shape[0], dtype=torch.long)
            if training:
                optimizer = torch.optim.Adam(model.parameters())
                F.cross_entropy(logits, gold).backward()
                optimizer.step()
        return model

    measured = peak_memory_bytes(step)
    with torch.device("meta"):
        probe = build_model(cfg, vocab, 5)
    assert model_memory_bytes(probe, B, n, training=training, parameters=True) >= measured


def test_a_model_no_machine_holds_is_refused_by_the_estimate_before_it_is_built(tmp_path, monkeypatch):
    """``--set model.d_model=100000`` ended in ``can't allocate 40000000000 bytes``: the weights were left out of
    the estimate, which ran after the model was built. Here d_model 2048 against a 64 MiB budget: the estimate of a
    model built on the meta device refuses it, and no real model is ever built."""
    import maskattn.train.tasks as tasks

    built = []
    original = tasks.build_model

    def recording(*args, **kwargs):
        model = original(*args, **kwargs)
        built.append(next(model.parameters()).device.type)
        return model

    monkeypatch.setattr(tasks, "build_model", recording)
    monkeypatch.setenv(MEMORY_LIMIT_ENV, "64M")
    data = write_sentiment(tmp_path)
    with pytest.raises(MemoryLimitError, match=r"a training step on 8 sentences of \d+ tokens .* with this model \(its "
                                                r"weights, gradients and optimiser state included\) would need about "
                                                r"[\d.]+ [MG]iB, more than the 64 MiB budget"):
        Trainer(tiny_config(data, tmp_path / "run", model={"d_model": 2048}))
    assert built == ["meta"]
    result = runner.invoke(app, ["train", "--data", str(data), "--out", str(tmp_path / "run"), "--set",
                                 "model.d_model=100000"], env={MEMORY_LIMIT_ENV: ""})
    assert result.exit_code == 2 and "with this model" in flat(result.output) and built[-1] == "meta"


def test_a_small_budget_is_written_in_the_unit_that_shows_it():
    assert format_bytes(1024) == "1 KiB" and format_bytes(600) == "600 bytes"  # was "0 MiB"


# --- issue 42 item 4: no reader holds an over-long line ------------------------------------------------------------

def sparse(path, size: int, head: bytes = b"the") -> object:
    """A file of ``size`` bytes without a line break: ``head`` then zeros, sparse (no disk used)."""
    with open(path, "wb") as f:
        f.write(head)
        f.truncate(size)
    return path


def peak_while(call) -> tuple[int, BaseException | None]:
    """The peak of Python's allocations while ``call()`` runs, and what it raised."""
    import tracemalloc

    tracemalloc.start()
    try:
        call()
        raised = None
    except BaseException as exc:  # noqa: BLE001 - returned to the test
        raised = exc
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    return peak, raised


def test_an_over_long_vectors_line_is_refused_without_reading_it_whole(tmp_path):
    from maskattn.data.text import MAX_LINE_BYTES
    from maskattn.data.vectors import read_vectors

    path = sparse(tmp_path / "glove.txt", 4 * MAX_LINE_BYTES)  # 64 MiB with no line break: before, read whole
    peak, raised = peak_while(lambda: read_vectors(path, 50, ["the"]))
    assert isinstance(raised, DataError), raised
    assert str(raised).startswith(f"{path}:1: a line longer than 16 MiB (no line break in its first 16,777,216 bytes)")
    assert "MASKATTN_MAX_LINE_BYTES" in str(raised)
    assert peak < 2.5 * MAX_LINE_BYTES  # before: the whole line twice (its bytes and its text), 128 MiB


@pytest.mark.parametrize("reader", ["tsv", "conll", "parallel", "references", "stdin", "predict"])
def test_every_text_reader_bounds_the_line_it_holds(tmp_path, monkeypatch, reader):
    import io

    from maskattn.data.parallel import read_parallel
    from maskattn.data.readers import read_conll, read_tsv
    from maskattn.data.text import read_lines, read_stream_lines

    monkeypatch.setenv("MASKATTN_MAX_LINE_BYTES", "4K")
    good = tmp_path / "good.txt"
    good.write_text("pos\tfine " * 400 + "\n")  # 3.6 KB: under the limit, read as before
    assert read_lines(good)[0].startswith("pos\tfine")
    path = tmp_path / "long.txt"
    path.write_text("pos\tshort\n" + "pos\t" + "word " * 1000 + "\n")  # line 2: 5 KB
    calls = {"tsv": lambda: read_tsv(path), "conll": lambda: read_conll(path),
             "parallel": lambda: read_parallel(good, path), "references": lambda: read_lines(path),
             "stdin": lambda: read_stream_lines(io.BytesIO(path.read_bytes())),
             "predict": lambda: runner.invoke(app, ["predict", "-k", "x.safetensors", "-i", str(path)])}
    if reader == "predict":
        result = calls[reader]()
        assert result.exit_code == 2 and "long.txt:2: a line longer than 4 KiB" in flat(result.output)
        return
    with pytest.raises(DataError, match=r"(long\.txt|<stdin>):2: a line longer than 4 KiB \(no line break in its first "
                                        r"4,096 bytes\)"):
        calls[reader]()


def test_a_whole_file_reader_refuses_a_file_larger_than_it_reads(tmp_path):
    from maskattn.data.text import read_text

    path = sparse(tmp_path / "run.yaml", 40 * 2**20, b"data: {}\n# ")
    peak, raised = peak_while(lambda: read_text(path, "config file"))
    assert isinstance(raised, DataError) and "config file" in str(raised) and "larger than 16 MiB" in str(raised)
    assert peak < 20 * 2**20
    with pytest.raises(DataError, match=r"config file .* is a folder, not a file"):
        read_text(tmp_path, "config file")


# --- issue 42 item 6: beam search has the memory budget batches have ------------------------------------------------

def test_a_huge_beam_is_refused_with_the_estimate_before_it_is_built(monkeypatch):
    import torch

    from maskattn.inference import beam_search, greedy_decode
    from maskattn.inference.decoding import decoding_memory_bytes
    from maskattn.models.seq2seq import Seq2Seq

    torch.manual_seed(0)
    model = Seq2Seq.from_architecture("transformer", 20, 30, d_model=16, num_heads=4, encoder_layers=1,
                                      decoder_layers=2, dropout=0.0, max_len=32).eval()
    src = torch.tensor([[3, 4, 5, 6, 2], [7, 8, 2, 0, 0]])
    monkeypatch.setenv(MEMORY_LIMIT_ENV, "64M")
    assert decoding_memory_bytes(model, 2, 5, 17, beam=5) < 2**20
    assert len(beam_search(model, src, beam_size=5, bos_id=1, eos_id=2)) == 2  # a beam that fits: decoded as before
    with pytest.raises(MemoryLimitError, match=r"decoding 2 source\(s\) of 5 tokens with beam 100000 \(200,000 "
                                               r"hypotheses of up to 17 tokens\) would need about .* GiB, more than "
                                               r"the "
                                               r"64 MiB budget \(MASKATTN_MEMORY_LIMIT\); lower the beam \(--beam\)"):
        beam_search(model, src, beam_size=100_000, bos_id=1, eos_id=2)
    with pytest.raises(MemoryLimitError, match=r"decoding 20000 source\(s\) of 5 tokens with beam 1 "):  # greedy
        greedy_decode(model, src[:1].repeat(20_000, 1), bos_id=1, eos_id=2)


def test_a_note_naming_a_long_path_stays_on_one_line(trained, tmp_path):
    """Issue 42: notes were wrapped at 80 columns, so their paths could not be pasted."""
    _, run = trained
    link = tmp_path / ("a-run-folder-with-a-long-name-" * 4)
    link.symlink_to(run)
    result = runner.invoke(app, ["predict", "-k", str(link), "good"])
    assert result.exit_code == 0, result.output
    assert f"note: {link} is a folder; using {link / 'best.safetensors'}\n" in result.stderr


# --- issue 55 item 5: budgets that see the real limit; an allocation that fails anyway is one line -----------------

def test_a_huge_beam_under_ulimit_v_is_refused_by_the_budget_not_the_allocator():
    """`generate --beam 100000` under `ulimit -v` ended in the allocator's traceback: the budget was 80 % of
    MemAvailable, blind to the address-space limit. Now the budget is a share of what the limit leaves."""
    import subprocess
    import sys

    script = """
import resource
import torch
from maskattn.device import memory_limits
from maskattn.errors import MemoryLimitError
from maskattn.inference import beam_search
from maskattn.models.seq2seq import Seq2Seq

torch.manual_seed(0)
model = Seq2Seq.from_architecture("transformer", 20, 30, d_model=16, num_heads=4, encoder_layers=1,
                                  decoder_layers=2, dropout=0.0, max_len=32).eval()
src = torch.tensor([[3, 4, 5, 6, 2], [7, 8, 2, 0, 0]])
in_use = int(open("/proc/self/statm").read().split()[0]) * resource.getpagesize()
resource.setrlimit(resource.RLIMIT_AS, (in_use + 2**30, resource.RLIM_INFINITY))  # 1 GiB more than in use
rooms = dict(memory_limits())
print("room", rooms["the address-space limit (ulimit -v, RLIMIT_AS)"])
try:
    beam_search(model, src, beam_size=100_000, bos_id=1, eos_id=2)
except MemoryLimitError as exc:
    print("refused", exc)
"""
    env = {key: value for key, value in os.environ.items() if key != MEMORY_LIMIT_ENV}
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 0, done.stderr[-2000:]
    room = int(done.stdout.split("\n")[0].split()[1])
    assert 0.5 * 2**30 < room <= 2**30  # the limit minus what the process had mapped when it was read
    assert "refused decoding 2 source(s) of 5 tokens with beam 100000" in done.stdout
    assert "budget (80% of the" in done.stdout and "that the address-space limit (ulimit -v, RLIMIT_AS) leaves now" \
        in done.stdout


def test_the_budget_sees_cgroup_v1_and_v2_limits(tmp_path, monkeypatch):
    """Slurm's --mem and containers limit a cgroup: v2 memory.max (of the process's cgroup or one above it) minus
    memory.current, v1 memory.limit_in_bytes minus memory.usage_in_bytes; reclaimable page cache is not counted
    as used. The budget is a share of the smallest room."""
    v2, v1 = tmp_path / "unified", tmp_path / "memory"
    (v2 / "slurm" / "job_7" / "step_0").mkdir(parents=True)
    (v2 / "cgroup.controllers").write_text("cpu memory\n")
    (v2 / "memory.max").write_text("max\n")  # the root: no limit
    (v2 / "slurm" / "job_7" / "memory.max").write_text(f"{3 * 2**30}\n")  # the job's --mem=3G
    (v2 / "slurm" / "job_7" / "memory.current").write_text(f"{2 * 2**30}\n")
    (v2 / "slurm" / "job_7" / "memory.stat").write_text(f"anon 1\ninactive_file {2**29}\n")
    (v1 / "docker" / "abc").mkdir(parents=True)
    (v1 / "memory.limit_in_bytes").write_text("9223372036854771712\n")  # no limit
    (v1 / "docker" / "abc" / "memory.limit_in_bytes").write_text(f"{8 * 2**30}\n")
    (v1 / "docker" / "abc" / "memory.usage_in_bytes").write_text(f"{2**30}\n")
    cgroup = tmp_path / "cgroup"
    cgroup.write_text("0::/slurm/job_7/step_0\n4:memory:/docker/abc\n1:cpu:/docker/abc\n")
    monkeypatch.setattr(device_module, "CGROUP_V2_ROOTS", (tmp_path / "missing", v2))
    monkeypatch.setattr(device_module, "CGROUP_V1_MEMORY", v1)
    monkeypatch.setattr(device_module, "PROC_CGROUP", cgroup)
    monkeypatch.setattr(device_module, "_meminfo_available", lambda: [("MemAvailable", 100 * 2**30)])
    monkeypatch.setattr(device_module, "_address_space_room", lambda: [])
    monkeypatch.delenv(MEMORY_LIMIT_ENV, raising=False)
    rooms = dict(device_module.memory_limits())
    assert rooms[f"the cgroup limit {v2 / 'slurm' / 'job_7' / 'memory.max'}"] == 3 * 2**30 - (2 * 2**30 - 2**29)
    assert rooms[f"the cgroup limit {v1 / 'docker' / 'abc' / 'memory.limit_in_bytes'}"] == 7 * 2**30
    assert len(rooms) == 3  # MemAvailable, and one limit per hierarchy: unlimited ones are no limit
    assert memory_budget() == int(1.5 * 2**30 * device_module.MEMORY_FRACTION)
    with pytest.raises(MemoryLimitError, match=r"more than the 1\.2 GiB budget \(80% of the 1\.5 GiB that the "
                                               r"cgroup limit .*job_7/memory\.max leaves now\)"):
        check_memory(2 * 2**30, what="a batch", advice="lower it")


@pytest.mark.parametrize("command", ["train", "eval", "predict", "generate"])
def test_an_allocation_that_fails_anyway_is_the_one_line_advice(trained, tmp_path, monkeypatch, command):
    """Where the estimate passes and the allocator still fails (a CPU RuntimeError "can't allocate memory",
    torch.OutOfMemoryError), each command ends with one line of MemoryLimitError advice, not a traceback."""
    import torch

    import maskattn.inference

    data, run = trained

    def allocate(*args, **kwargs):
        torch.empty(2**50, dtype=torch.uint8)  # the CPU allocator's real error

    monkeypatch.setattr(Trainer, "train_step", allocate)
    for name in ("evaluate_file", "predict", "load_translator"):
        monkeypatch.setattr(maskattn.inference, name, allocate)
    source = tmp_path / "src.txt"
    source.write_text("good\n")
    argv = {"train": ["train", "--data", str(data), "--out", str(tmp_path / "run"), "--set", "data.format=tsv",
                      "--set", "data.train=train.tsv", "--set", "model.d_model=16", "--set", "model.num_heads=2",
                      "--no-progress"],
            "eval": ["eval", "-k", str(run / "best.safetensors"), "--data", str(data / "test.tsv")],
            "predict": ["predict", "-k", str(run / "best.safetensors"), "good"],
            "generate": ["generate", "-k", str(run / "best.safetensors"), "-i", str(source)]}[command]
    result = runner.invoke(app, argv)
    assert result.exit_code == 2, result.output
    line = result.stderr.splitlines()[-1]
    assert line.startswith("error: out of memory (") and "DefaultCPUAllocator: can't allocate memory" in line
    assert "more than this machine could give: lower the batch size, the beam or the lengths, or set a smaller " \
           "budget" in line and MEMORY_LIMIT_ENV in line
    assert "Traceback" not in result.output


def test_a_gpu_out_of_memory_is_the_one_line_advice(trained, monkeypatch):
    import torch

    import maskattn.inference

    def allocate(*args, **kwargs):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB (GPU 0; 79.1 GiB total)")

    monkeypatch.setattr(maskattn.inference, "predict", allocate)
    _, run = trained
    result = runner.invoke(app, ["predict", "-k", str(run / "best.safetensors"), "good"])
    assert result.exit_code == 2 and result.stderr.count("\n") == 1, result.output
    assert result.stderr.startswith("error: out of memory (CUDA out of memory. Tried to allocate 20.00 GiB")

"""torch.compile: every registered mechanism compiles with ``fullgraph=True`` (no graph break) in training and
evaluation, forward and backward, and matches eager; variable lengths compile at most twice; ``train.compile``
trains, checkpoints the uncompiled names and resumes; a recompilation storm is reported.

The default run traces with ``backend="aot_eager"`` (dynamo + AOTAutograd's joint forward/backward graph, no
C++ code generation, seconds per case); the ``slow`` run compiles the same cases with Inductor.
"""

from __future__ import annotations

import pytest
import torch
from torch._dynamo.utils import counters

import maskattn
from maskattn.errors import ConfigError
from maskattn.train import Trainer, acceleration

from _train_helpers import tiny_config, write_sentiment

D_MODEL = 32
BACKENDS = ["aot_eager", pytest.param("inductor", marks=pytest.mark.slow)]


@pytest.fixture(autouse=True)
def fresh_dynamo():
    torch._dynamo.reset()
    counters.clear()
    yield
    torch._dynamo.reset()


def build(name, **options):
    torch.manual_seed(0)
    return maskattn.create_attention(name, D_MODEL, 2 if name == "disa" else 4, **options)


def batch(n, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(2, n, D_MODEL, generator=g)
    kpm = torch.zeros(2, n, dtype=torch.bool)
    kpm[1, max(1, n - 3):] = True  # the second row ends in padding (and keeps a real token)
    return x, kpm


def run(module, x, kpm, grad):
    x = x.clone().requires_grad_()
    out = module(x, kpm)
    out.backward(grad)
    return out, x.grad


@pytest.mark.parametrize("compiler", BACKENDS)
# evaluation mode in the slow run: every mechanism's inference graph also compiles, fullgraph under bf16 autocast,
# in test_every_mechanism_compiles_in_one_process_without_recompiling_a_shared_wrapper
@pytest.mark.parametrize("training", [True, pytest.param(False, marks=pytest.mark.slow)], ids=["train", "eval"])
@pytest.mark.parametrize("name", maskattn.list_attentions())
def test_every_mechanism_compiles_fullgraph_and_matches_eager(name, training, compiler):
    module = build(name).train(training)
    compiled = torch.compile(module, fullgraph=True, backend=compiler)
    for n in (19, 27):  # the second length makes the graph length-generic
        x, kpm = batch(n)
        grad = torch.randn(2, n, D_MODEL)
        out, dx = run(compiled, x, kpm, grad)
        params = [p.grad.clone() for p in module.parameters()]
        module.zero_grad()
        ref, dx_ref = run(module, x, kpm, grad)
        torch.testing.assert_close(out, ref, atol=2e-5, rtol=1e-4)
        torch.testing.assert_close(dx, dx_ref, atol=2e-5, rtol=1e-4)
        for a, p in zip(params, module.parameters()):
            torch.testing.assert_close(a, p.grad, atol=5e-5, rtol=1e-4)
        module.zero_grad()
    assert counters["stats"]["unique_graphs"] <= 2


@pytest.mark.parametrize("name", maskattn.list_attentions())
def test_dropout_paths_compile(name):
    """Attention dropout (MTSA's Appendix A.3 form included) traces into the graph: finite, and random."""
    module = build(name, dropout=0.3).train()
    compiled = torch.compile(module, fullgraph=True, backend="aot_eager")
    x, kpm = batch(17)
    a, b = compiled(x, kpm), compiled(x, kpm)
    assert torch.isfinite(a).all() and not torch.equal(a, b)
    a.sum().backward()
    assert all(torch.isfinite(p.grad).all() for p in module.parameters() if p.grad is not None)


@pytest.mark.parametrize("name", ["mha", "mtsa", "dman", "sman", "csan1d", "csan2d"])
def test_flex_inference_compiles_on_cpu(name):
    """The flex backend inside a compiled model (CPU: inference only; a padding mask is refused there)."""
    module = build(name, backend="flex").eval()
    reference = build(name, backend="reference").eval()
    compiled = torch.compile(module, fullgraph=True, backend="aot_eager")
    x, _ = batch(21)
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), reference(x), atol=2e-5, rtol=1e-4)


#: 16 lengths from 1 up, across the band kernel's block edges (16 → 17, 32 → 33, 64 → 65: a graph traced on one
#: block used to specialise on it and recompile at 17)
LENGTHS = (1, 2, 3, 5, 7, 9, 16, 17, 20, 31, 33, 44, 64, 65, 72, 80)


def test_a_compiled_band_serves_every_length():
    """A window wider than some of the lengths (clipped to the sequence in eager mode only): one static graph for
    the first length, one length-generic graph for every later one — a band clipped to a symbolic length made the
    banded kernel's tiling, and so the graph, specialise on each length."""
    torch.manual_seed(0)
    module = build("csan1d", window=11)
    compiled = torch.compile(module, fullgraph=True, backend="aot_eager")
    for i, n in enumerate((1, 2, 3, 5, 9, 17, 33)):
        x, kpm = batch(n, seed=i)
        compiled(x, kpm).sum().backward()
    assert counters["stats"]["unique_graphs"] <= 2


@pytest.mark.slow  # 90 s; test_a_compiled_band_serves_every_length is its fast part
@pytest.mark.parametrize("compiler", BACKENDS)
def test_compiled_encoder_sixteen_lengths_at_most_two_graphs(compiler):
    """Variable-length batches from length 1 up: the first length compiles a static graph, the second a
    length-generic one that serves every later length (dynamo's own counters)."""
    torch.manual_seed(0)
    encoder = maskattn.Encoder.from_recipe(D_MODEL, 4, "mtsa, dman>san>ffn, csan1d, csan2d, sman, mha", dropout=0.1)
    compiled = torch.compile(encoder, fullgraph=True, backend=compiler)
    for i, n in enumerate(LENGTHS):
        x, kpm = batch(n, seed=i)
        out = compiled(x, kpm)
        out.sum().backward()
        if n in (2, 17, 80):
            encoder.eval()
            torch.testing.assert_close(compiled(x, kpm), encoder(x, kpm), atol=5e-5, rtol=1e-4)
            encoder.train()
    assert counters["stats"]["unique_graphs"] <= 2 + 2  # training + evaluation mode (a guard on .training)


# ------------------------------------------------------------------------------------------------ training


@pytest.fixture
def quick_compile(monkeypatch):
    """train.compile through aot_eager (the trainer's wiring, without C++ code generation)."""
    monkeypatch.setattr(acceleration, "compile_model", lambda model: torch.compile(model, backend="aot_eager"))


def _losses(out_dir):
    import json
    rows = [json.loads(line) for line in (out_dir / "metrics.jsonl").read_text().splitlines()]
    return [r["loss"] for r in rows if r["split"] == "train"]


def test_train_compile_trains_checkpoints_uncompiled_names_and_resumes(tmp_path, quick_compile, monkeypatch):
    from _train_helpers import fit_killed_before_step
    from maskattn.checkpoint import load_checkpoint

    data = write_sentiment(tmp_path)
    whole = tiny_config(data, tmp_path / "whole", train={"compile": True, "max_steps": 8})
    Trainer(whole).fit()
    names = set(load_checkpoint(tmp_path / "whole" / "last.safetensors").model_state)
    assert not any("_orig_mod" in name for name in names)
    eager = tiny_config(data, tmp_path / "eager", train={"compile": False, "max_steps": 8})
    Trainer(eager).fit()
    assert _losses(tmp_path / "whole") == pytest.approx(_losses(tmp_path / "eager"), abs=1e-4)
    killed = tiny_config(data, tmp_path / "killed", train={"compile": True, "max_steps": 8})
    fit_killed_before_step(monkeypatch, killed, 6)
    Trainer.resume(tmp_path / "killed" / "last.safetensors").fit()
    assert _losses(tmp_path / "killed") == _losses(tmp_path / "whole")


@pytest.mark.slow
@pytest.mark.parametrize("model", ["sentence", "pair", "tagger", "seq2seq"])
def test_train_compile_with_inductor_for_every_model_type(tmp_path, model):
    from _train_helpers import write_conll, write_nli, write_parallel
    from test_translation import translation_config

    if model == "seq2seq":
        cfg = translation_config(write_parallel(tmp_path), tmp_path / "run",
                                 train={"compile": True, "max_steps": 4, "eval_every": 4, "metric": "loss"})
    else:
        data = {"sentence": lambda: write_sentiment(tmp_path), "pair": lambda: write_nli(tmp_path),
                "tagger": lambda: write_conll(tmp_path)}[model]()
        fmt = {"sentence": {}, "pair": {"format": "nli", "train": "train.jsonl", "test": "test.jsonl"},
               "tagger": {"format": "conll", "train": "train.txt", "test": "test.txt"}}[model]
        cfg = tiny_config(data, tmp_path / "run", data=fmt, model={"type": model},
                          train={"compile": True, "max_steps": 4, "eval_every": 4,
                                 "metric": "f1" if model == "tagger" else "accuracy"})
    summary = Trainer(cfg).fit()
    assert summary["steps"] == 4


def test_recompile_storm_is_reported(tmp_path, quick_compile, monkeypatch):
    """Every batch length recompiling (dynamic shapes off) passes the threshold: one warning, with the count and
    the cause."""
    monkeypatch.setattr(acceleration, "compile_model",
                        lambda model: torch.compile(model, backend="aot_eager", dynamic=False))
    monkeypatch.setattr(acceleration, "RECOMPILE_WARNING", 2)
    data = write_sentiment(tmp_path)
    trainer = Trainer(tiny_config(data, tmp_path / "run", train={"compile": True, "max_steps": 8}))
    warnings = []
    trainer._warn = warnings.append
    trainer.fit()
    storm = [w for w in warnings if "recompiled the model" in w]
    assert len(storm) == 1 and "latest cause" in storm[0] and "train.compile=false" in storm[0]


def test_flex_training_on_the_cpu_is_refused_before_the_first_step(tmp_path):
    data = write_sentiment(tmp_path)
    with pytest.raises(ConfigError, match="backend='flex', which cannot train on cpu.*model.backend=auto"):
        Trainer(tiny_config(data, tmp_path / "run", model={"backend": "flex"}, train={"device": "cpu"}))


@pytest.mark.parametrize("preset", ["transformer", pytest.param("man", marks=pytest.mark.slow)])
def test_seq2seq_compiles_fullgraph_over_batch_shapes(preset):
    """Token-budget batches change the batch size and both lengths every step: the translation model compiles
    without a graph break (its id range check used to read the tensor on the host, Tensor.item — on an H100 that
    was 16 recompilations in 50 steps, docs/gpu.md) and a handful of graphs serves every shape."""
    from maskattn.models.seq2seq import Seq2Seq

    torch.manual_seed(0)
    model = Seq2Seq.from_architecture(preset, 50, 50, encoder_layers=1, decoder_layers=1, d_model=D_MODEL, num_heads=4)
    compiled = torch.compile(model, fullgraph=True, dynamic=None, backend="aot_eager")
    g = torch.Generator().manual_seed(1)
    for batch_size, src_len, tgt_len in ((6, 9, 7), (4, 12, 10), (9, 5, 11), (3, 14, 6), (7, 8, 8), (5, 11, 13)):
        src = torch.randint(1, 50, (batch_size, src_len), generator=g)
        tgt = torch.randint(1, 50, (batch_size, tgt_len), generator=g)
        compiled(src, tgt).sum().backward()
    model.eval()
    torch.testing.assert_close(compiled(src, tgt), model(src, tgt), atol=5e-5, rtol=1e-4)
    assert counters["stats"]["unique_graphs"] <= 2 + 1  # static, shape-generic, evaluation mode


def test_every_mechanism_compiles_in_one_process_without_recompiling_a_shared_wrapper():
    """Issue 32 item 3: compiling the registry's mechanisms one after another (fullgraph, bf16 autocast) failed on
    the ninth with ``FailOnRecompileLimitHit``: every module's ``forward`` went through one shared entry-point
    wrapper, a code object Dynamo re-guarded per class. Each mechanism now compiles one graph per mode, and
    nothing recompiles."""
    names = maskattn.list_attentions()
    assert len(names) > torch._dynamo.config.recompile_limit  # the case that failed
    x, kpm = batch(11)
    for name in names:
        module = build(name).eval()
        compiled = torch.compile(module, fullgraph=True, backend="eager")
        with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
            assert torch.isfinite(compiled(x, kpm).float()).all()
    assert counters["stats"]["unique_graphs"] == len(names)
    assert not counters["recompiles"]

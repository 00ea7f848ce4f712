"""maskattn.viz and ``maskattn viz``: the drawn numbers are the library's own (masks, CSAN areas, a trained
model's MTSA / DMAN maps, MAN Table 5 localness), the commands write their files, bad input gives messages."""

from __future__ import annotations

import csv
import json
import time

import pytest
import torch
from safetensors.torch import save_file
from typer.testing import CliRunner

from _viz_helpers import fails_with, stack_sublayer_input
from _train_helpers import tiny_config, write_sentiment
from maskattn import masks, viz
from maskattn.analysis import localness
from maskattn.cli import app
from maskattn.data.readers import read_tsv
from maskattn.functional.local import local_attention_maps
from maskattn.train import Trainer
from maskattn.inference import load_model

runner = CliRunner()
SENTENCE = "the film was very good"


@pytest.fixture(scope="module")
def ckpts(tmp_path_factory):
    """Tiny checkpoints trained for a few steps: MTSA (data.max_len 10), MAN (DMAN>SAN>FFN x2, sinusoidal
    positions of max_len 12, lowercased data), a Transformer (SAN rows from a second model), a Bi-LSTM."""
    tmp = tmp_path_factory.mktemp("viz")
    data = write_sentiment(tmp)
    runs = {
        "mtsa": dict(data={"max_len": 10}),
        "man": dict(model={"encoder": "dman>san>ffn x2", "positional": "sinusoidal", "max_len": 12},
                    data={"lowercase": True}),
        "mha": dict(model={"encoder": "mha x2", "positional": "sinusoidal", "ffn": True}),
        "bilstm": dict(model={"encoder": "bilstm"}),
    }
    paths = {"data": data}
    for name, sections in runs.items():
        sections["train"] = {"max_steps": 3, "eval_every": 3}
        Trainer(tiny_config(data, tmp / name, **sections)).fit()
        paths[name] = tmp / name / "best.safetensors"
    return paths


def panel_of(grid, title_part):
    return next(p for row in grid for p in row if title_part in p.title)


# --- masks --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", [*masks.MASK_NAMES, "window:0", "window:2", "forward_strict&window:1"])
def test_mask_panels_are_the_library_materialisations(name):
    expected = masks.from_name(name.split("&")[0])
    if "&" in name:
        expected = expected & masks.from_name(name.split("&")[1])
    assert torch.equal(viz.mask_panel(name, 7).values, expected.materialize(7)[0, 0].float())


def test_drawn_images_hold_the_panel_values():
    grid = [viz.mask_panels(["forward", "window:1"], 5), [viz.mask_panel("csan2d:3x3", 5, num_heads=3)]]
    fig = viz.draw_grid(grid)
    for ax, panel in zip(fig.axes, [p for row in grid for p in row]):
        assert ax.get_title() == panel.title
        assert (ax.images[0].get_array() == panel.values.numpy()).all()


def test_key_padding_panel_hides_the_padded_keys():
    panel = viz.mask_panel("key_padding:3", 5)
    padding = torch.tensor([[False, False, False, True, True]])
    assert torch.equal(panel.values, masks.key_padding(padding).materialize(5)[0, 0].float())


@pytest.mark.parametrize("head_window,head_edges", [(1, "truncate"), (3, "truncate"), (3, "circular"), (5, "truncate")])
def test_csan_areas_are_the_support_of_local_attention(head_window, head_edges):
    n, H, window = 9, 5, 3
    q, k = torch.randn(1, H, n, 4), torch.randn(1, H, n, 4)
    maps = local_attention_maps(q, k, window=window, head_window=head_window, head_edges=head_edges)  # (1, H, n, H, n)
    for head, query in ((0, 0), (2, 4), (4, 8)):
        area = viz.csan_area(n, H, window=window, head_window=head_window, query=query, head=head, head_edges=head_edges)
        assert torch.equal(area, (maps[0, head, query] > 0).float())
    spec = "csan1d:3" if head_window == 1 else f"csan2d:3x{head_window}"
    panel = viz.mask_panel(spec, n, num_heads=H, query=4, head=2, head_edges=head_edges)
    assert torch.equal(panel.values, (maps[0, 2, 4] > 0).float()) and panel.highlight == (2, 4)


def test_terminal_view_shades_the_values():
    panel = viz.mask_panel("forward", 3)
    lines = panel_lines(panel)
    assert lines[2].endswith("██    ") and lines[4].endswith("██████")


def panel_lines(panel):
    return viz.panel_text(panel).plain.splitlines()


# --- attention maps of trained models -------------------------------------------------------------------

def module_input(loaded, ids, layer: int, sublayer: int):
    """The input of attention sublayer ``sublayer`` of encoder layer ``layer`` (0-based; the sublayers before
    it are attention too), recomputed layer by layer outside the encoder's forward (pre-LN residuals)."""
    enc = loaded.model.encoder
    stack = enc.fusion.encoder
    pad = torch.zeros_like(ids, dtype=torch.bool)
    x = enc.embed(ids)
    if stack.positional is not None:
        x = stack.positional(x)
    return stack_sublayer_input(stack, x, pad, layer, sublayer)


@torch.no_grad()
def test_mtsa_heatmaps_are_the_modules_own_maps(ckpts):
    loaded = load_model(ckpts["mtsa"])
    result = viz.sentence_maps(loaded, SENTENCE)
    ids = torch.tensor([loaded.vocab.encode(SENTENCE.split())])
    h, module, pad = module_input(loaded, ids, 0, 0)
    ref = module.attention_maps(h, key_padding_mask=pad)
    grid = viz.attention_grid(result, mechanism="mtsa")
    assert [p.title.split("\n")[1] for p in grid[0]] == ["token2token · head 0 forward", "token2token · head 1 backward",
                                                        "source2token (token level)"]
    for head in range(2):
        assert torch.equal(grid[0][head].values, ref.attention[0, head])
    assert torch.equal(grid[0][2].values, ref.source2token[0].mean(-1))
    assert grid[0][2].row_labels == ("0 forward", "1 backward") and grid[0][2].col_labels == tuple(SENTENCE.split())
    fig = viz.draw_grid(grid)
    for ax, panel in zip(fig.axes, grid[0]):
        assert (ax.images[0].get_array() == panel.values.numpy()).all()
    pool = loaded.model.encoder.pool.attention.weights(loaded.model.encoder.tokens(ids, pad), key_padding_mask=pad)
    assert torch.allclose(viz.attention_grid(result, mechanism="pool")[0][0].values, pool[0].mean(-1)[None])


@torch.no_grad()
def test_dman_masks_and_attention_are_the_models_own(ckpts):
    loaded = load_model(ckpts["man"])
    result = viz.sentence_maps(loaded, "The FILM was very good")
    assert result.tokens == tuple(SENTENCE.split())  # lowercased, as the model was trained
    ids = torch.tensor([loaded.vocab.encode(result.tokens)])
    h, dman, pad = module_input(loaded, ids, 1, 0)
    mask = dman.dynamic_mask(h, key_padding_mask=pad)[0]
    ref = dman.attention_maps(h, key_padding_mask=pad)
    (fig1,) = viz.man_mask_grid(result, 2)
    assert [p.title.split("\n")[0] for p in fig1] == ["(a) SAN", "(b) DMAN", "(b) DMAN", "(c) FFN"]
    assert torch.equal(fig1[0].values, torch.ones(5, 5)) and torch.equal(fig1[-1].values, torch.eye(5))
    for head in range(2):
        torch.testing.assert_close(fig1[1 + head].values, mask[head], rtol=0, atol=1e-6)
    # the maps come from the reference math on the input of the unchanged forward pass: agreement to rounding
    mask_row, attention_row = viz.attention_grid(result, layers=[2], mechanism="dman")
    for head in range(2):
        torch.testing.assert_close(mask_row[head].values, ref.mask[0, head], rtol=0, atol=1e-6)
        torch.testing.assert_close(attention_row[head].values, ref.attention[0, head], rtol=0, atol=1e-6)
    h_san, san, _ = module_input(loaded, ids, 1, 1)
    ref_san = san.attention_maps(h_san, key_padding_mask=pad)
    (san_row,) = viz.attention_grid(result, layers=[2], mechanism="san")
    torch.testing.assert_close(san_row[1].values, ref_san.attention[0, 1], rtol=0, atol=1e-6)


@torch.no_grad()
def test_localness_table_equals_analysis_localness(ckpts, tmp_path):
    test_file = ckpts["data"] / "test.tsv"
    table = viz.localness_table(ckpts["man"], test_file, layers=[1, 2], windows=[1, 2], batch_size=5)
    sentences = [" ".join(e.tokens) for e in read_tsv(test_file, lowercase=True)]
    man = load_model(ckpts["man"])
    per_sentence = [viz.sentence_maps(man, s).layers for s in sentences]
    for layer in (1, 2):
        for w in (1, 2):
            for mechanism, key in (("DMAN", "0:dman"), ("SAN", "1:san")):
                expected = 100 * float(localness([m[layer - 1][key].attention for m in per_sentence], w))
                assert table.value(mechanism, w, layer) == pytest.approx(expected, abs=1e-4)
    assert table.sentences == {str(ckpts["man"]): len(sentences)}
    two = viz.localness_table(ckpts["man"], test_file, san_checkpoint=ckpts["mha"], layers=[2], windows=[4])
    mha = load_model(ckpts["mha"])
    maps = [viz.sentence_maps(mha, " ".join(e.tokens)).layers[1]["0:mha"].attention for e in read_tsv(test_file)]
    assert two.value("SAN", 4, 2) == pytest.approx(100 * float(localness(maps, 4)), abs=1e-4)
    dman = [m[1]["0:dman"].attention for m in per_sentence]
    assert two.value("DMAN", 4, 2) == pytest.approx(100 * float(localness(dman, 4)), abs=1e-4)
    rows = list(csv.DictReader(two.write_csv(tmp_path / "t5.csv").open()))
    assert [(r["mechanism"], r["window"]) for r in rows] == [("DMAN", "4"), ("SAN", "4")]
    assert float(rows[1]["layer_2"]) == pytest.approx(two.value("SAN", 4, 2), abs=1e-3)
    assert rows[1]["checkpoint"] == str(ckpts["mha"])


# --- the command line ---------------------------------------------------------------------------------

def is_png(path) -> bool:
    return path.is_file() and path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_cli_writes_images_and_tables(ckpts, tmp_path):
    result = runner.invoke(app, ["viz", "masks", "-n", "6", "-o", str(tmp_path / "masks.png")])
    assert result.exit_code == 0, result.output
    assert is_png(tmp_path / "masks.png") and "CSAN 2D, area 3×3" in result.output
    result = runner.invoke(app, ["viz", "masks", "-k", str(ckpts["man"]), "-s", SENTENCE, "-l", "2", "--no-terminal",
                                 "-o", str(tmp_path / "man.png")])
    assert result.exit_code == 0, result.output
    assert is_png(tmp_path / "man.png")
    result = runner.invoke(app, ["viz", "attention", SENTENCE + " unseenword", "-k", str(ckpts["mtsa"]),
                                 "-o", str(tmp_path / "mtsa.png")])
    assert result.exit_code == 0, result.output
    assert is_png(tmp_path / "mtsa.png") and "token2token · head 1 backward" in result.output
    assert "not in the vocabulary (read as <unk>): unseenword" in result.output
    result = runner.invoke(app, ["viz", "localness", "-k", str(ckpts["man"]), "--data", str(ckpts["data"] / "test.tsv"),
                                 "-w", "1", "-l", "2", "--csv", str(tmp_path / "t.csv"), "--json", str(tmp_path / "t.json")])
    assert result.exit_code == 0, result.output
    saved = json.loads((tmp_path / "t.json").read_text())
    assert saved["layers"] == [2] and [r["mechanism"] for r in saved["rows"]] == ["DMAN", "SAN"]
    assert (tmp_path / "t.csv").read_text().startswith("mechanism,checkpoint,window,layer_2")
    assert f"{saved['rows'][0]['values']['2']:.2f}" in result.output


def test_cli_bad_input_gives_messages(ckpts, tmp_path):
    mtsa, man = str(ckpts["mtsa"]), str(ckpts["man"])
    fails_with(["viz", "attention", SENTENCE, "-k", str(tmp_path / "none.safetensors")], "does not exist")
    (tmp_path / "junk.safetensors").write_bytes(b"not a checkpoint")
    fails_with(["viz", "attention", SENTENCE, "-k", str(tmp_path / "junk.safetensors")],
               "is not a readable safetensors file")
    save_file({"weight": torch.zeros(2)}, str(tmp_path / "other.safetensors"))
    fails_with(["viz", "attention", SENTENCE, "-k", str(tmp_path / "other.safetensors")], "is not a maskattn checkpoint")
    fails_with(["viz", "attention", SENTENCE, "-k", man, "-m", "mtsa"], "has no 'mtsa' sublayers",
               "1: dman>san>ffn, 2: dman>san>ffn")
    fails_with(["viz", "attention", SENTENCE, "-k", str(ckpts["bilstm"])], "baseline 'bilstm'", "no attention maps")
    fails_with(["viz", "attention", " ".join(["good"] * 11), "-k", mtsa], "11 tokens", "at most 10", "data.max_len")
    fails_with(["viz", "attention", " ".join(["good"] * 13), "-k", man], "13 tokens", "at most 12", "model.max_len")
    fails_with(["viz", "attention", "   ", "-k", mtsa], "the sentence is empty")
    fails_with(["viz", "attention", SENTENCE, "-k", mtsa, "-m", "flash"], "unknown mechanism 'flash'",
               "mtsa", "dman", "csan2d", "san, pool")
    fails_with(["viz", "attention", SENTENCE, "-k", man, "-l", "3"], "layer 3 is out of range", "2 layers")
    fails_with(["viz", "masks", "-k", man, "-s", SENTENCE, "-l", "0"], "layer 0 is out of range")
    fails_with(["viz", "masks", "-k", mtsa, "-s", SENTENCE], "has no 'dman' sublayers")
    fails_with(["viz", "masks", "diagonal"], "unknown mask 'diagonal'", "forward_strict", "window:R", "csan2d:WxN")
    fails_with(["viz", "masks", "csan2d:3x5", "--heads", "4"], "head_window (5) must not exceed the number of heads (4)")
    fails_with(["viz", "masks", "forward", "-o", str(tmp_path / "masks.jpg")], "must end in one of .png")
    fails_with(["viz", "localness", "-k", mtsa, "--data", str(ckpts["data"] / "test.tsv")], "has no 'dman' sublayers")
    fails_with(["viz", "localness", "-k", man, "--data", str(ckpts["data"] / "test.tsv"), "-l", "5"],
               "layer 5 is out of range")
    fails_with(["viz", "localness", "-k", man, "--data", str(tmp_path / "missing.tsv")], "does not exist")


def test_cli_refuses_what_is_too_long_to_draw_before_any_model_work(ckpts, tmp_path):
    start = time.perf_counter()
    fails_with(["viz", "masks", "-n", "5000", "--no-terminal", "-o", str(tmp_path / "m.png")],
               "--length has 5000 positions but viz draws at most 256", "--max-length 5000")
    long_sentence = " ".join(["good"] * 300)
    missing = str(tmp_path / "missing.safetensors")  # the length is checked before the checkpoint is read
    fails_with(["viz", "attention", long_sentence, "-k", missing], "the sentence has 300 positions but viz draws at "
               "most 256")
    fails_with(["viz", "masks", "-k", missing, "-s", long_sentence], "the sentence has 300 positions")
    assert time.perf_counter() - start < 10  # was: minutes and gigabytes, then MemoryError
    fails_with(["viz", "attention", long_sentence, "-k", missing, "--max-length", "300"], "does not exist")
    fails_with(["viz", "attention", "good film", "-k", str(ckpts["mtsa"]), "--max-length", "1"],
               "the sentence has 2 positions but viz draws at most 1")

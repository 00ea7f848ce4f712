"""maskattn.viz on translation (Seq2Seq) checkpoints: the encoder self-attention maps drawn for a sentence are
the encoder modules' own for the subword ids training and translation feed it, MAN Table 5 over a source file
is analysis.localness of those maps (over-long and empty lines skipped and counted), bad input exits with 2.

Tiny models (2 encoder layers, d_model 16) trained for 3 steps on synthetic parallel files, as in
tests/test_translation.py."""

from __future__ import annotations

import json

import pytest
import torch
from typer.testing import CliRunner

from maskattn import viz
from maskattn.analysis import localness
from maskattn.cli import app
from maskattn.data.parallel import ParallelText, encode_pairs
from maskattn.data.text import read_lines
from maskattn.data.subword import EOS_ID, UNK_ID
from maskattn.train import Trainer
from maskattn.inference import load_translator
from _viz_helpers import fails_with, stack_sublayer_input
from test_translation import sentence_pairs, translation_config, write_parallel

runner = CliRunner()
SENTENCE = "The small cat sees the big red house."
OVERLONG = " ".join(["green tree"] * 20)  # far more than max_len - 1 = 23 subwords


@pytest.fixture(scope="module")
def ckpts(tmp_path_factory):
    """``man`` (DMAN>SAN>FFN x2 encoder) and ``transformer`` (mha x2) translation checkpoints, and a source
    file ``test.en``: twelve sentences, one empty line and one over-long sentence."""
    tmp = tmp_path_factory.mktemp("viz_translation")
    data = write_parallel(tmp, n_train=60)
    paths = {}
    for name in ("man", "transformer"):
        cfg = translation_config(data, tmp / name, model={"architecture": name, "encoder_layers": 2},
                                 data={"test": None}, train={"max_steps": 3, "eval_every": 3, "metric": "loss"})
        Trainer(cfg).fit()
        paths[name] = tmp / name / "best.safetensors"
    lines = [src for src, _ in sentence_pairs(12, 5)]
    lines[4:4] = ["", OVERLONG]
    paths["test"] = tmp / "test.en"
    paths["test"].write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return paths


def sublayer_input(model, ids, layer: int, sublayer: int):
    """The input of sublayer ``sublayer`` of encoder layer ``layer`` (0-based; the sublayers before it are
    attention) of a Seq2Seq, recomputed outside the encoder's forward: embeddings × √d + positions, pre-LN."""
    pad = ids == model.pad_id
    embedding = model.src_embed or model.tgt_embed
    x = model.src_positions(embedding(ids) * model.embed_scale)
    return stack_sublayer_input(model.encoder, x, pad, layer, sublayer)


@torch.no_grad()
def test_man_encoder_maps_are_the_modules_own_for_the_pipelines_subwords(ckpts):
    translator = load_translator(ckpts["man"])
    result = viz.sentence_maps(translator, SENTENCE)
    ids, truncated = translator.encode_source(SENTENCE)
    assert not truncated and ids[-1] == EOS_ID
    pieces = translator.subword.pieces()
    assert result.tokens == (*(pieces[i] for i in ids[:-1]), "</s>") and result.tokens[0].startswith("▁")
    assert result.layer_names == ["dman>san>ffn", "dman>san>ffn"] and result.pool is None
    src = torch.tensor([ids])
    for layer in (1, 2):
        h, dman, pad = sublayer_input(translator.model, src, layer - 1, 0)
        ref = dman.attention_maps(h, key_padding_mask=pad)
        mask_row, attention_row = viz.attention_grid(result, layers=[layer], mechanism="dman")
        h_san, san, _ = sublayer_input(translator.model, src, layer - 1, 1)
        ref_san = san.attention_maps(h_san, key_padding_mask=pad)
        (san_row,) = viz.attention_grid(result, layers=[layer], mechanism="san")
        for head in range(2):
            torch.testing.assert_close(mask_row[head].values, ref.mask[0, head], rtol=0, atol=1e-6)
            torch.testing.assert_close(attention_row[head].values, ref.attention[0, head], rtol=0, atol=1e-6)
            torch.testing.assert_close(san_row[head].values, ref_san.attention[0, head], rtol=0, atol=1e-6)
        assert attention_row[0].row_labels == attention_row[0].col_labels == result.tokens
        (fig1,) = viz.man_mask_grid(result, layer)
        n = len(ids)
        assert torch.equal(fig1[0].values, torch.ones(n, n)) and torch.equal(fig1[-1].values, torch.eye(n))
        mask = dman.dynamic_mask(h, key_padding_mask=pad)[0]
        for head in range(2):
            torch.testing.assert_close(fig1[1 + head].values, mask[head], rtol=0, atol=1e-6)
    fig = viz.draw_grid([mask_row])
    for ax, panel in zip(fig.axes, mask_row):
        assert (ax.images[0].get_array() == panel.values.numpy()).all()
        assert [t.get_text() for t in ax.get_xticklabels()] == list(result.tokens)


@torch.no_grad()
def test_transformer_encoder_maps_and_unknown_characters(ckpts):
    translator = load_translator(ckpts["transformer"])
    sentence = "The cat sees 猫."
    result = viz.sentence_maps(ckpts["transformer"], sentence)
    ids, _ = translator.encode_source(sentence)
    assert [ids[i] for i in result.unknown] == [UNK_ID] and result.tokens[result.unknown[0]] == "猫"
    src = torch.tensor([ids])
    for layer in (1, 2):
        h, mha, pad = sublayer_input(translator.model, src, layer - 1, 0)
        ref = mha.attention_maps(h, key_padding_mask=pad)
        (row,) = viz.attention_grid(result, layers=[layer])
        for head in range(2):
            torch.testing.assert_close(row[head].values, ref.attention[0, head], rtol=0, atol=1e-6)


def test_source_file_is_read_as_training_encodes_it(ckpts):
    source = viz.load_for_maps(ckpts["man"])
    assert isinstance(source, viz.TranslationSource)
    encoded = source.read_file(ckpts["test"])
    lines = read_lines(ckpts["test"])
    reference = encode_pairs(ParallelText(lines, lines, ckpts["test"], ckpts["test"]), source.translator.subword,
                             max_len=source.translator.max_len, training=True)  # training skips as viz does
    assert encoded.ids == [tuple(item["src"]) for item in reference.items] and len(encoded.ids) == 12
    assert encoded.skipped == {"empty": 1, "over-long": 1} == {"empty": reference.skipped_empty,
                                                                 "over-long": reference.filtered}


@torch.no_grad()
def test_localness_table_of_two_translation_models_is_analysis_localness(ckpts):
    table = viz.localness_table(ckpts["man"], ckpts["test"], san_checkpoint=ckpts["transformer"], batch_size=5)
    assert table.layers == (1, 2) and table.windows == (1, 2, 4)
    assert [(r.mechanism, r.window) for r in table.rows] == [("DMAN", 1), ("SAN", 1), ("DMAN", 2), ("SAN", 2),
                                                             ("DMAN", 4), ("SAN", 4)]
    per_model = {}
    for name in ("man", "transformer"):
        model = load_translator(ckpts[name]).model
        ids = viz.load_for_maps(ckpts[name]).read_file(ckpts["test"]).ids
        per_model[name] = [model.encoder_attention_maps(torch.tensor([row])) for row in ids]  # one sentence each
    for layer in (1, 2):
        for w in (1, 2, 4):
            dman = [maps[layer - 1]["0:dman"].attention for maps in per_model["man"]]
            san = [maps[layer - 1]["0:mha"].attention for maps in per_model["transformer"]]
            assert table.value("DMAN", w, layer) == pytest.approx(100 * float(localness(dman, w)), abs=1e-4)
            assert table.value("SAN", w, layer) == pytest.approx(100 * float(localness(san, w)), abs=1e-4)
    assert table.sentences == {str(ckpts["man"]): 12, str(ckpts["transformer"]): 12}
    assert table.skipped[str(ckpts["man"])] == {"empty": 1, "over-long": 1}
    assert "(12 sentences, 2 skipped: 1 empty, 1 over-long)" in table.summary()
    own = viz.localness_table(ckpts["man"], ckpts["test"], layers=[2], windows=[1])  # SAN rows: its own SAN sublayers
    san = [maps[1]["1:san"].attention for maps in per_model["man"]]
    assert own.value("SAN", 1, 2) == pytest.approx(100 * float(localness(san, 1)), abs=1e-4)


# --- the command line ---------------------------------------------------------------------------------

def test_cli_draws_and_tabulates_translation_encoders(ckpts, tmp_path):
    man, transformer = str(ckpts["man"]), str(ckpts["transformer"])
    result = runner.invoke(app, ["viz", "attention", SENTENCE, "-k", man, "-l", "2", "-m", "dman",
                                 "-o", str(tmp_path / "attention.png")])
    assert result.exit_code == 0, result.output
    assert (tmp_path / "attention.png").read_bytes()[:4] == b"\x89PNG" and "layer 2 · dman" in result.output
    assert "▁cat" in result.output and "</s>" in result.output
    result = runner.invoke(app, ["viz", "masks", "-k", man, "-s", SENTENCE, "--no-terminal",
                                 "-o", str(tmp_path / "masks.png")])
    assert result.exit_code == 0, result.output
    result = runner.invoke(app, ["viz", "localness", "-k", man, "--san-checkpoint", transformer,
                                 "--data", str(ckpts["test"]), "--json", str(tmp_path / "t5.json")])
    assert result.exit_code == 0, result.output
    saved = json.loads((tmp_path / "t5.json").read_text())
    assert saved["layers"] == [1, 2] and saved["sentences"] == {man: 12, transformer: 12}
    assert saved["skipped"][man] == {"empty": 1, "over-long": 1}
    assert "2 skipped: 1 empty, 1 over-long" in " ".join(result.output.split())


def test_cli_bad_input_on_translation_checkpoints(ckpts, tmp_path):
    man, transformer, test = str(ckpts["man"]), str(ckpts["transformer"]), str(ckpts["test"])
    fails_with(["viz", "attention", "   ", "-k", man], "the sentence is empty")
    fails_with(["viz", "masks", "-k", man, "-s", ""], "the sentence is empty")
    fails_with(["viz", "attention", OVERLONG, "-k", man], "subwords but the model takes at most 23 (+ </s>: max_len 24")
    fails_with(["viz", "masks", "-k", transformer, "-s", SENTENCE], "has no 'dman' sublayers", "1: mha, 2: mha")
    fails_with(["viz", "attention", SENTENCE, "-k", transformer, "-m", "dman"], "has no 'dman' sublayers")
    fails_with(["viz", "attention", SENTENCE, "-k", man, "-m", "pool"], "translation encoders never pool")
    fails_with(["viz", "attention", SENTENCE, "-k", man, "-l", "3"], "layer 3 is out of range", "2 layers")
    fails_with(["viz", "localness", "-k", transformer, "--data", test], "has no 'dman' sublayer")
    fails_with(["viz", "localness", "-k", man, "--data", test, "--format", "tsv"], "format must be 'lines'")
    (tmp_path / "blank.en").write_text("\n  \n" + OVERLONG + "\n")
    fails_with(["viz", "localness", "-k", man, "--data", str(tmp_path / "blank.en")],
               "holds no sentence the model can read (2 empty, 1 longer than 23 subwords)")


def test_python_boundary_checks(ckpts):
    with pytest.raises(TypeError, match="checkpoint must be a checkpoint path, a LoadedModel, a Translator"):
        viz.load_for_maps(42)
    source = viz.load_for_maps(ckpts["man"])
    with pytest.raises(TypeError, match="sentence must be a string, got int"):
        source.encode(7)
    with pytest.raises(ValueError, match="ids must be a non-empty list of non-empty id sequences"):
        source.maps([[5, 3], []])
    with pytest.raises(TypeError, match="translator must be a Translator of a Seq2Seq model"):
        viz.TranslationSource(source)
    with pytest.raises(TypeError, match="source must be a MapSource"):
        viz.localness_values(str(ckpts["man"]), [[5, 3]], "dman", [1], [1])

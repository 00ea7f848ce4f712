"""Layer recipes: grammar, repeats, options, MAN chains, the ffn flag, positional encodings."""

from __future__ import annotations

import re

import pytest
import torch

from maskattn import MANLayer
from maskattn.layers import ChainLayer, Encoder, LayerRecipe, PositionalEncoding, parse_recipe, recipe_string
from maskattn.layers import FeedForward

D, H = 16, 4


def inputs(B=2, n=7):
    x = torch.randn(B, n, D)
    pad = torch.zeros(B, n, dtype=torch.bool)
    pad[-1, 4:] = True
    return x, pad


def test_grammar_groups_repeats_chains_and_options():
    layers = parse_recipe("csan2d x3, mha x3")
    assert [l.sublayers[0][0] for l in layers] == ["csan2d"] * 3 + ["mha"] * 3
    assert not any(l.chain for l in layers)
    man = parse_recipe("dman>san>ffn x6")
    assert len(man) == 6 and man[0] == LayerRecipe((("dman", {}), ("san", {}), ("ffn", {})), True)
    opts = parse_recipe("csan1d(window=5, head_window=1)>ffn(dim=32), mtsa(head_masks=[forward, backward])")
    assert opts[0].sublayers[0] == ("csan1d", {"window": 5, "head_window": 1})
    assert opts[0].sublayers[1] == ("ffn", {"dim": 32})
    assert opts[1].sublayers[0][1] == {"head_masks": ["forward", "backward"]}
    assert parse_recipe(["mtsa x2", "mha"]) == parse_recipe("mtsa x2, mha")  # a YAML list of groups
    assert recipe_string(parse_recipe("mha, mha,dman>ffn x2")) == "mha x2, dman>ffn x2"


@pytest.mark.parametrize("recipe, message", [
    ("mtsa x2, nope", "unknown sublayer 'nope'; expected one of ffn, san, csan1d"),
    ("mtsa(window)", "must be written key=value"),
    ("mtsa(a=1", "unbalanced brackets"),
    ("mtsa x0", "repeat count must be in [1, 1000]"),
    ("mha x999, mtsa x2", "repeat count must be in [1, 1] (a recipe holds at most 1000 layers), got 2"),
    ("csan1d(window=5, window=7)", "option window is given twice"),
    ('csan1d(window="5)', 'option window="5: not valid YAML'),
    ("mtsa,,mha", "empty layer group"),
])
def test_grammar_errors(recipe, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        parse_recipe(recipe)


def test_recipe_type_error():
    with pytest.raises(TypeError, match="recipe must be a string"):
        parse_recipe(3)


def test_from_recipe_builds_the_right_layers():
    enc = Encoder.from_recipe(D, H, "dman>san>ffn x2, csan1d(window=3)>ffn, mha")
    assert [type(l) for l in enc.layers] == [ChainLayer] * 4  # one layer class for every recipe
    assert [l.kind for l in enc.layers] == ["man", "man", "man", "transformer"]
    assert enc.layers[0].order == ("dman", "san", "ffn") and enc.layers[3].order == ("mha", "ffn")
    assert enc.layers[2].sublayers[0].window == 3
    assert enc.recipe == "dman>san>ffn x2, csan1d(window=3)>ffn, mha"
    no_ffn = Encoder.from_recipe(D, H, "mtsa", ffn=False)
    assert isinstance(no_ffn.layers[0], ChainLayer) and not any(isinstance(m, FeedForward) for m in no_ffn.modules())
    with pytest.raises(ValueError, match="unknown option"):
        Encoder.from_recipe(D, H, "mha(window=3)")


def _structure(module):
    """Parameter shapes and every dropout probability, in module order."""
    return ([(name, tuple(p.shape)) for name, p in module.named_parameters()],
            [(name, m.p) for name, m in module.named_modules() if isinstance(m, torch.nn.Dropout)],
            [(name, m.dropout) for name, m in module.named_modules() if hasattr(m, "dropout")
             and isinstance(m.dropout, float)])


@pytest.mark.parametrize("written_out", ["dman(max_distance=128)>san>ffn", "dman>san>ffn(dim=32)",
                                         "dman(max_distance=128, dropout=0.05)>san(dropout=0.05)>ffn(dropout=0.1)"])
def test_a_recipe_builds_the_same_model_whether_or_not_its_defaults_are_written_out(written_out):
    """The default values written out change nothing: same classes, parameter shapes and dropout values
    (FFN width 2·d = 32, FFN inner dropout = the stack's dropout, attention dropout = attention_dropout)."""
    kw = dict(dropout=0.1, attention_dropout=0.05)
    plain = Encoder.from_recipe(D, H, "dman>san>ffn", **kw)
    spelled = Encoder.from_recipe(D, H, written_out, **kw)
    assert _structure(plain) == _structure(spelled)
    assert plain.layers[0].sublayers[2].fc1.out_features == 2 * D
    man = MANLayer(D, H, dropout=0.1, attention_dropout=0.05)  # the public constructor builds the same layer
    assert _structure(man) == _structure(plain.layers[0])


def test_decoder_layers_share_the_encoder_defaults():
    """A MAN chain gets the same FFN width and inner dropout in the encoder and the decoder (the man preset)."""
    from maskattn.models import Seq2Seq

    model = Seq2Seq.from_architecture("man", 20, 20, d_model=D, num_heads=H, dropout=0.3, encoder_layers=1, decoder_layers=1)
    enc_ffn, dec_ffn = model.encoder.layers[0].sublayers[-1], model.decoder.layers[0].sublayers[-1]
    assert enc_ffn.fc1.out_features == dec_ffn.fc1.out_features == 2 * D
    assert enc_ffn.dropout.p == dec_ffn.dropout.p == 0.3


@pytest.mark.parametrize("recipe", ["mtsa", "dman>san>ffn", "csan2d>ffn", "sman x2", "disa"])
@pytest.mark.parametrize("norm", ["pre", "post"])
def test_recipe_encoders_run_zero_padding_and_train(recipe, norm):
    enc = Encoder.from_recipe(D, H if recipe != "disa" else 2, recipe, norm=norm, dropout=0.1)
    x, pad = inputs()
    out = enc(x, key_padding_mask=pad)
    assert out.shape == x.shape and torch.isfinite(out).all()
    assert (out[-1, 4:] == 0).all()
    out.sum().backward()
    assert all(p.grad is not None for p in enc.parameters() if p.requires_grad)


def test_positional_encodings_break_permutation_equivariance():
    x, _ = inputs(B=1)
    perm = torch.tensor([3, 0, 6, 1, 5, 2, 4])
    plain = Encoder.from_recipe(D, H, "mha").eval()
    assert torch.allclose(plain(x)[:, perm], plain(x[:, perm]), atol=1e-5)  # no positions: equivariant
    for kind in ("sinusoidal", "learned"):
        enc = Encoder.from_recipe(D, H, "mha", positional=kind).eval()
        assert not torch.allclose(enc(x)[:, perm], enc(x[:, perm]), atol=1e-3)
    pe = PositionalEncoding(D, "sinusoidal", max_len=5)
    assert torch.allclose(pe.table[0, 1::2], torch.ones(D // 2))  # cos(0) = 1
    with pytest.raises(ValueError, match="exceeds the positional encoding's max_len 5"):
        pe(torch.zeros(1, 6, D))
    with pytest.raises(ValueError, match="unknown positional"):
        Encoder.from_recipe(D, H, "mha", positional="rotary")

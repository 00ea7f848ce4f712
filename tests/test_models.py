"""Models over every context fusion: shapes, finiteness, gradients to every parameter, padding invariance,
tied pair encoders, the baselines' structure (MTSA Table 1)."""

from __future__ import annotations

import pytest
import torch

from maskattn.models import (BiRNN, HierarchicalCNN, ModelConfig, MultiCNN, PairClassifier, Pool, build_model,
                             list_fusions, list_models)

V, C = 40, 3
ENCODERS = ["mtsa", "mha x2", "disa", "dman>san>ffn", "csan1d(window=3)", *list_fusions()]


def cfg(encoder, model_type="sentence", **kw):
    small = {"multi_cnn": {"channels": 8}}.get(encoder, {})
    kw = {"dropout": 0.0, **kw}
    return ModelConfig(type=model_type, encoder=encoder, d_model=16, num_heads=2, encoder_options=small,
                       positional="sinusoidal" if encoder.startswith("mha") else "none", **kw)


def batch(B=3, n=6, seed=0):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(2, V, (B, n), generator=g)
    pad = torch.zeros(B, n, dtype=torch.bool)
    pad[1, 3:] = True
    ids[pad] = 0
    return ids, pad


def call(model, ids, pad):
    return model(ids, pad, ids.flip(0), pad.flip(0)) if isinstance(model, PairClassifier) else model(ids, pad)


@pytest.mark.parametrize("encoder, model_type", [(e, "sentence") for e in ENCODERS]
                         + [(e, t) for e in ("mtsa", "bilstm", "hrchy_cnn") for t in ("pair", "tagger")])
def test_models_shapes_finite_and_gradients(encoder, model_type):
    model = build_model(cfg(encoder, model_type), V, C)
    ids, pad = batch()
    out = call(model, ids, pad)
    assert out.shape == ((3, 6, C) if model_type == "tagger" else (3, C)) and torch.isfinite(out).all()
    out.square().sum().backward()
    no_grad = [n for n, p in model.named_parameters() if p.requires_grad and (p.grad is None or not p.grad.abs().sum())]
    allowed = {"encoder.embed.embedding.weight"}  # the padding row only; other rows do get gradients
    assert set(no_grad) <= allowed


@pytest.mark.parametrize("encoder", ENCODERS)
def test_extra_padding_does_not_change_predictions(encoder):
    model = build_model(cfg(encoder), V, C).eval()
    ids, pad = batch()
    more_ids = torch.cat([ids, torch.zeros(3, 4, dtype=torch.long)], 1)
    more_pad = torch.cat([pad, torch.ones(3, 4, dtype=torch.bool)], 1)
    with torch.no_grad():
        assert torch.allclose(model(ids, pad), model(more_ids, more_pad), atol=1e-5)


def test_pair_classifier_ties_encoders_and_uses_the_four_features():
    single = build_model(cfg("mtsa"), V, C)
    pair = build_model(cfg("mtsa", "pair"), V, C)
    d = pair.encoder.out_dim
    assert pair.head.net[1].in_features == 4 * d
    encoder_params = sum(p.numel() for p in pair.encoder.parameters())
    assert encoder_params == sum(p.numel() for p in single.encoder.parameters())  # one encoder, not two
    ids, pad = batch()
    same = pair(ids, pad, ids, pad)  # s_p == s_h: swapping is a no-op
    assert torch.allclose(same, pair(ids, pad, ids, pad))


def test_baselines_follow_the_paper_structure():
    assert BiRNN(300).out_dim == 600  # 300D forward + 300D backward
    cnn = MultiCNN(300)
    assert [c.kernel_size[0] for c in cnn.convs] == [3, 4, 5] and cnn.out_dim == 600
    assert len(HierarchicalCNN(300).convs) == 3 and HierarchicalCNN(300).convs[0].kernel_size[0] == 5


def test_birnn_backward_direction_ignores_padding():
    rnn = BiRNN(8, hidden=4).eval()
    x = torch.randn(1, 5, 8)
    padded = torch.cat([x, torch.randn(1, 3, 8)], 1)
    pad = torch.tensor([[False] * 5 + [True] * 3])
    assert torch.allclose(rnn(x), rnn(padded, pad)[:, :5], atol=1e-6)


def test_pools():
    x = torch.tensor([[[1.0, 5.0], [3.0, -1.0], [100.0, 100.0]]])
    pad = torch.tensor([[False, False, True]])
    assert torch.allclose(Pool(2, "mean")(x, pad), torch.tensor([[2.0, 2.0]]))
    assert torch.allclose(Pool(2, "max")(x, pad), torch.tensor([[3.0, 5.0]]))
    with pytest.raises(ValueError, match="unknown model.pool"):
        Pool(2, "sum")


def test_bad_model_configs():
    with pytest.raises(ValueError, match="unknown model.type 'lstm'"):
        build_model(ModelConfig(type="lstm"), V, C)
    with pytest.raises(ValueError, match="model.type seq2seq needs model.architecture"):
        build_model(ModelConfig(type="seq2seq"), V, C)
    with pytest.raises(ValueError, match="encoder_options only apply to the baselines"):
        build_model(ModelConfig(encoder="mtsa", encoder_options={"hidden": 3}, d_model=8), V, C)
    with pytest.raises(ValueError, match="do not fit 'bilstm'"):
        build_model(ModelConfig(encoder="bilstm", encoder_options={"kernels": [3]}, d_model=8), V, C)
    assert set(list_models()) == {"sentence", "pair", "tagger", "seq2seq"}


def test_word_vectors_are_scaled_before_sinusoidal_positions():
    plain = build_model(cfg("mtsa"), V, C)
    with_positions = build_model(cfg("mha x2"), V, C)
    assert plain.encoder.embed.scale == 1.0 and with_positions.encoder.embed.scale == pytest.approx(16 ** 0.5)


def test_embed_dropout_defaults_to_dropout_and_can_be_set_apart():
    default = build_model(cfg("multi_cnn", dropout=0.5), V, C)
    assert default.encoder.embed.dropout.p == 0.5 and default.head.net[0].p == 0.5
    kim = build_model(cfg("multi_cnn", dropout=0.5, embed_dropout=0.0), V, C).train()
    assert kim.encoder.embed.dropout.p == 0.0 and kim.head.net[0].p == 0.5
    ids, _ = batch()
    torch.testing.assert_close(kim.encoder.embed(ids), kim.encoder.embed(ids))  # no dropout on the word vectors
    with pytest.raises(ValueError, match=r"model.embed_dropout must be in \[0, 1\), got 1.5"):
        build_model(cfg("mtsa", embed_dropout=1.5), V, C)


def test_embed_init_bounds_the_uniform_word_vectors():
    for bound in (0.05, 0.25):
        weight = build_model(cfg("mtsa", embed_init=bound), V, C).encoder.embed.embedding.weight
        assert weight[1:].abs().max() <= bound and weight[1:].abs().max() > 0.8 * bound
        assert weight[0].abs().max() == 0  # the padding row
    with pytest.raises(ValueError, match="model.embed_init must be a positive number.*got 0"):
        build_model(cfg("mtsa", embed_init=0), V, C)

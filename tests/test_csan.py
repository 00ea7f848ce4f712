"""ConvSelfAttention (CSAN 1D / 2D modules), its registry entries and the CSAN encoder recipe."""

from __future__ import annotations

import pytest
import torch

import maskattn
from maskattn import ConvSelfAttention, Encoder, MultiHeadAttention, create_attention, csan_encoder
from maskattn.functional import local_attention_maps
from maskattn.attention.base import split_heads


def inputs(B=2, n=10, d=16, lengths=(10, 6), seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(B, n, d, generator=g)
    kpm = torch.arange(n)[None, :] >= torch.tensor(lengths)[:, None]  # True = padding
    return x, kpm


def test_registered_with_paper_defaults():
    assert {"csan1d", "csan2d"} <= set(maskattn.list_attentions())
    one, two = create_attention("csan1d", 16, 4), create_attention("csan2d", 16, 4)
    assert isinstance(one, ConvSelfAttention) and (one.window, one.head_window) == (11, 1)
    assert isinstance(two, ConvSelfAttention) and (two.window, two.head_window) == (11, 3)
    assert create_attention("csan2d", 16, 4, head_window=1).head_window == 1
    assert "banded" in maskattn.attention_info("csan2d").backends


@pytest.mark.parametrize("name", ["csan1d", "csan2d"])
def test_parameter_free_beyond_multihead_projections(name):
    csan, mha = create_attention(name, 32, 4), MultiHeadAttention(32, 4)
    assert sum(p.numel() for p in csan.parameters()) == sum(p.numel() for p in mha.parameters())
    csan.load_state_dict(mha.state_dict())  # same keys and shapes: an MHA checkpoint loads as is


def test_window_covering_sequence_equals_multihead_attention():
    x, kpm = inputs()
    mha = MultiHeadAttention(16, 4)
    csan = ConvSelfAttention(16, 4, window=21)
    csan.load_state_dict(mha.state_dict())
    torch.testing.assert_close(csan(x, kpm), mha(x, kpm))


@pytest.mark.parametrize("name", ["csan1d", "csan2d"])
@pytest.mark.parametrize("backend", ["auto", "banded", "sdpa", "flex"])
def test_backends_match_reference(name, backend):
    x, kpm = inputs()
    torch.manual_seed(0)
    ref = create_attention(name, 16, 4, window=5, backend="reference")
    mod = create_attention(name, 16, 4, window=5, backend=backend)
    mod.load_state_dict(ref.state_dict())
    expected = ref(x, kpm)
    if backend == "flex":  # eager FlexAttention on CPU: inference only
        with torch.no_grad():
            out = mod(x, kpm)
    else:
        out = mod(x, kpm)
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name", ["csan1d", "csan2d"])
def test_banded_parameter_gradients_match_reference(name, monkeypatch):
    """The lean banded kernel (custom backward, several chunks of query blocks) trains like the explicit form."""
    from maskattn.kernels import banded as banded_kernel

    monkeypatch.setattr(banded_kernel, "CHUNK_ELEMENTS", 1)
    x, kpm = inputs(n=40, lengths=(40, 23))
    torch.manual_seed(0)
    ref = create_attention(name, 16, 4, window=5, backend="reference").double()
    mod = create_attention(name, 16, 4, window=5, backend="banded").double()
    mod.load_state_dict(ref.state_dict())
    x = x.double()
    grad = torch.randn_like(x)
    out_ref, out = ref(x, kpm), mod(x, kpm)
    torch.testing.assert_close(out, out_ref, rtol=1e-12, atol=1e-12)
    g_ref = torch.autograd.grad(out_ref, list(ref.parameters()), grad)
    g = torch.autograd.grad(out, list(mod.parameters()), grad)
    for a, b in zip(g, g_ref):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("name", ["csan1d", "csan2d"])
def test_padding_gives_zero_outputs_and_every_parameter_gets_a_gradient(name):
    x, kpm = inputs()
    mod = create_attention(name, 16, 4, window=3)
    out = mod(x, kpm)
    assert out.shape == x.shape and torch.isfinite(out).all()
    assert out[1, 6:].abs().max() == 0
    out.sum().backward()
    for pname, p in mod.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all() and p.grad.abs().sum() > 0, pname


@pytest.mark.parametrize("name", ["csan1d", "csan2d"])
def test_padding_invariance(name):
    mod = create_attention(name, 16, 4, window=5).eval()
    x, _ = inputs(B=1, n=7, lengths=(7,))
    padded = torch.cat([x, 50 * torch.randn(1, 5, 16)], dim=1)
    kpm = torch.arange(12)[None, :] >= 7
    torch.testing.assert_close(mod(padded, kpm)[:, :7], mod(x), rtol=1e-5, atol=1e-5)


def test_attention_maps_shapes_and_values():
    x, kpm = inputs()
    one = ConvSelfAttention(16, 4, window=3)
    maps = one.attention_maps(x, kpm)
    v = split_heads(one.in_proj(x).chunk(3, dim=-1)[2], 4)
    out = one.out_proj((maps.attention @ v).transpose(1, 2).reshape(2, 10, 16)).masked_fill(kpm[..., None], 0)
    torch.testing.assert_close(out, one(x, kpm), rtol=1e-5, atol=1e-5)  # the maps are the ones the output uses
    assert maps.attention.shape == (2, 4, 10, 10)
    assert maps.attention[0].triu(2).abs().max() == 0  # window 3: nothing beyond |i - j| = 1

    two = ConvSelfAttention(16, 4, window=3, head_window=3)
    maps = two.attention_maps(x, kpm)
    assert maps.attention.shape == (2, 4, 10, 4, 10)
    q, k, _ = (split_heads(t, 4) for t in two.in_proj(x).chunk(3, dim=-1))
    torch.testing.assert_close(maps.attention, local_attention_maps(q, k, window=3, head_window=3,
                                                                       key_padding_mask=kpm))
    assert maps.attention[:, 0, :, 2:].abs().max() == 0  # truncated area of head 0: heads 0 and 1 only


def test_circular_head_edges_reach_the_last_head():
    x, _ = inputs()
    mod = ConvSelfAttention(16, 4, window=3, head_window=3, head_edges="circular")
    maps = mod.attention_maps(x)
    assert maps.attention[:, 0, :, 3].sum() > 0  # head 0 wraps to head 3
    torch.testing.assert_close(maps.attention.sum((-1, -2)), torch.ones(2, 4, 10))


def test_dropout_is_training_only():
    x, _ = inputs()
    mod = ConvSelfAttention(16, 4, window=5, dropout=0.5)
    mod.eval()
    torch.testing.assert_close(mod(x), mod(x))
    mod.train()
    torch.manual_seed(0)
    assert not torch.allclose(mod(x), mod.eval()(x))


@pytest.mark.parametrize("kwargs,exc,match", [
    (dict(window=4), ValueError, "window.*4"),
    (dict(window=0), ValueError, "window.*0"),
    (dict(window=2.5), TypeError, "window.*2.5"),
    (dict(head_window=2), ValueError, "head_window.*2"),
    (dict(head_window=5), ValueError, r"head_window \(5\).*heads \(4\)"),
    (dict(head_edges="wrap"), ValueError, "head_edges"),
    (dict(backend="cuda"), ValueError, "backend 'cuda'"),
])
def test_bad_options(kwargs, exc, match):
    with pytest.raises(exc, match=match):
        ConvSelfAttention(16, 4, **kwargs)


def test_bad_forward_input():
    mod = ConvSelfAttention(16, 4)
    with pytest.raises(ValueError, match=r"x must have shape \(batch, seq_len, 16\)"):
        mod(torch.randn(2, 5, 8))
    with pytest.raises(ValueError, match=r"key_padding_mask has shape \(2, 4\)"):
        mod(torch.randn(2, 5, 16), torch.zeros(2, 4, dtype=torch.bool))


# ---------------------------------------------------------------------------------------------- encoder


def test_csan_encoder_puts_csan_in_the_lowest_layers():
    enc = csan_encoder(16, 4, num_layers=6, csan_layers=3, window=5)
    assert enc.layer_names == ["csan2d"] * 3 + ["mha"] * 3
    assert all(enc.layers[i].attention.window == 5 and enc.layers[i].attention.head_window == 3 for i in range(3))
    assert csan_encoder(16, 4, num_layers=2, csan_layers=1, head_window=1).layer_names == ["csan1d", "mha"]
    assert csan_encoder(16, 4, num_layers=2, csan_layers=0).layer_names == ["mha", "mha"]
    assert csan_encoder(16, 4, num_layers=2, csan_layers=2).layer_names == ["csan2d", "csan2d"]


def test_encoder_forward_padding_and_gradients():
    x, kpm = inputs()
    enc = csan_encoder(16, 4, num_layers=3, csan_layers=2, window=3, ffn_dim=32)
    out = enc(x, kpm)
    assert out.shape == x.shape and torch.isfinite(out).all()
    assert out[1, 6:].abs().max() == 0
    out.sum().backward()
    assert all(p.grad is not None for p in enc.parameters())
    short = enc(x[1:, :6])
    torch.testing.assert_close(out[1:, :6], short, rtol=1e-5, atol=1e-5)


def test_encoder_layer_specs():
    custom = maskattn.layers.EncoderLayer(16, 4, attention="mha")
    enc = Encoder(16, 4, ["mha", ("csan1d", {"window": 3}), custom], norm="post")
    assert enc.layer_names == ["mha", "csan1d", "EncoderLayer"]
    assert enc.final_norm is None and enc.layers[2] is custom
    assert enc(torch.randn(2, 5, 16)).shape == (2, 5, 16)
    with pytest.raises(TypeError, match=r"layers\[1\]"):
        Encoder(16, 4, ["mha", 3])
    with pytest.raises(TypeError, match="non-empty list"):
        Encoder(16, 4, "mha")
    with pytest.raises(ValueError, match="unknown attention 'nope'"):
        Encoder(16, 4, ["nope"])
    with pytest.raises(ValueError, match="csan_layers"):
        csan_encoder(16, 4, num_layers=2, csan_layers=3)
    with pytest.raises(ValueError, match="head_window"):
        csan_encoder(16, 4, head_window=2)

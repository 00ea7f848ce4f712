"""MANLayer (MAN §2.5, Fig. 2, Table 3): sublayer orders, FFN as the identity-mask MAN (Eq. 9),
padding, causal incremental decoding with beam reordering."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from maskattn import DynamicMaskAttention, LayerCache, MANLayer, MultiHeadAttention, StaticMaskAttention
from maskattn.functional import mask_attention
from maskattn.layers import FeedForward

D, H = 16, 4
TABLE3 = [("ffn", "san", "ffn"), ("san", "san", "ffn"), ("dman", "dman", "ffn"), ("san", "dman", "ffn"),
          ("dman", "san", "ffn")]


def data(B=2, n=7, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(B, n, D, generator=g)
    kpm = torch.zeros(B, n, dtype=torch.bool)
    kpm[1, n - 3:] = True
    return x, kpm


def test_default_is_dman_san_ffn_with_ffn_width_2d():
    layer = MANLayer(D, H)
    assert layer.order == ("dman", "san", "ffn")
    kinds = [type(m) for m in layer.sublayers]
    assert kinds == [DynamicMaskAttention, MultiHeadAttention, FeedForward]
    assert layer.sublayers[2].fc1.out_features == 2 * D
    assert "DMAN -> SAN -> FFN" in repr(layer)


@pytest.mark.parametrize("order", TABLE3 + [("sman", "san", "ffn")])
@pytest.mark.parametrize("norm", ["pre", "post"])
def test_table3_orders_run_and_train(order, norm):
    layer = MANLayer(D, H, order=order, norm=norm, dropout=0.1)
    x, kpm = data()
    out = layer(x, key_padding_mask=kpm)
    assert out.shape == x.shape and torch.isfinite(out).all()
    assert out[1, 4:].abs().max() == 0
    out.square().sum().backward()
    for name, p in layer.named_parameters():
        assert p.grad is not None and p.grad.abs().sum() > 0, name


@pytest.mark.parametrize("norm", ["pre", "post"])
def test_sublayers_are_residual_norm_blocks(norm):
    """Each sublayer is x + f(LN(x)) (pre) or LN(x + f(x)) (post), applied in order."""
    layer = MANLayer(D, H, order=("dman", "san", "ffn"), norm=norm).eval()
    x, _ = data()
    h = x
    for block, res in zip(layer.sublayers, layer.residuals):
        f = block if isinstance(block, FeedForward) else (lambda t, block=block: block(t))
        h = h + f(res.norm(h)) if norm == "pre" else res.norm(h + f(h))
    torch.testing.assert_close(layer(x), h)


def test_ffn_is_the_identity_mask_man_eq9():
    """FFN(x) = W2 ReLU(A_I(Q, K, V)) with V = x W1 + b1 and the identity mask (MAN Eq. 8–9): any Q, K."""
    ffn = FeedForward(D, 2 * D)
    x, _ = data()
    v = ffn.fc1(x).unsqueeze(1)  # (B, 1, n, d_f): one head, d_v = d_f
    q, k = torch.randn(2, 1, 7, 3), torch.randn(2, 1, 7, 3)
    eye = torch.eye(7)
    for backend in ("reference", "sdpa"):
        man = ffn.fc2(F.relu(mask_attention(q, k, v, eye, backend=backend).squeeze(1)))
        torch.testing.assert_close(man, ffn(x))


def test_ffn_sublayer_equals_identity_mask_man_sublayer_in_a_layer():
    layer = MANLayer(D, H, order=("ffn", "san", "ffn")).eval()
    x, _ = data()
    ffn, res = layer.sublayers[0], layer.residuals[0]

    def identity_mask_man(h):  # Eq. 9 with W_V = fc1 and W_H = fc2
        v = ffn.fc1(h).unsqueeze(1)
        eye = torch.eye(h.shape[1])
        return ffn.fc2(F.relu(mask_attention(v[..., :4], v[..., :4], v, eye).squeeze(1)))

    torch.testing.assert_close(res(x, identity_mask_man), res(x, ffn))


def test_padding_invariance_and_fully_padded_sequence():
    layer = MANLayer(D, H).eval()
    x, kpm = data()
    out = layer(x, key_padding_mask=kpm)
    x2 = x.clone()
    x2[1, 4:] = 50 * torch.randn(3, D)
    torch.testing.assert_close(layer(x2, key_padding_mask=kpm)[1, :4], out[1, :4])
    longer = torch.cat([x, torch.randn(2, 2, D)], 1)
    kpm2 = torch.cat([kpm, torch.ones(2, 2, dtype=torch.bool)], 1)
    torch.testing.assert_close(layer(longer, key_padding_mask=kpm2)[:, :7], out, atol=1e-5, rtol=1e-5)
    kpm[0] = True
    x.requires_grad_()
    out = layer(x, key_padding_mask=kpm)
    out.sum().backward()
    assert out[0].abs().max() == 0 and torch.isfinite(x.grad).all()


def test_attention_maps_collects_maps_per_sublayer():
    layer = MANLayer(D, H, order=("dman", "san", "sman", "ffn"))
    x, kpm = data()
    out, maps = layer.attention_maps(x, key_padding_mask=kpm)
    assert set(maps) == {"0:dman", "1:san", "2:sman"}
    assert {name for name, _ in maps["0:dman"].items()} == {"attention", "mask"}
    assert maps["1:san"].attention.shape == (2, H, 7, 7)
    torch.testing.assert_close(out, layer(x, key_padding_mask=kpm))


def test_options_reach_the_sublayers():
    layer = MANLayer(D, H, order=("dman", "sman", "ffn"), dman_options={"max_distance": 5, "activation": "relu"},
                     sman_options={"radius": "sqrt"}, ffn_dim=40)
    assert layer.sublayers[0].max_distance == 5 and layer.sublayers[0].activation == "relu"
    assert isinstance(layer.sublayers[1], StaticMaskAttention) and layer.sublayers[1].radius == "sqrt"
    assert layer.sublayers[2].fc1.out_features == 40


# --------------------------------------------------------------------------------------------------
# decoder use
# --------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("order", [("dman", "san", "ffn"), ("san", "dman", "ffn"), ("sman", "dman", "ffn")])
def test_causal_layer_incremental_equals_full(order):
    layer = MANLayer(D, H, order=order, causal=True).eval()
    x, kpm = data(n=8)
    kpm[:] = False
    kpm[1, 6:] = True
    with torch.no_grad():
        full = layer(x, key_padding_mask=kpm)
        cache, steps = layer.init_cache(), []
        for t in range(8):
            out, cache = layer.step(x[:, t:t + 1], cache, key_padding_mask=kpm[:, t:t + 1])
            steps.append(out)
    assert isinstance(cache, LayerCache) and len(cache) == 8
    torch.testing.assert_close(torch.cat(steps, 1), full, atol=1e-5, rtol=1e-5)


def test_causal_layer_no_leakage():
    layer = MANLayer(D, H, causal=True)
    x, _ = data(n=6)
    x.requires_grad_()
    layer(x)[0, 2].sum().backward()
    assert x.grad[0, 3:].abs().max() == 0 and x.grad[0, :3].abs().sum() > 0 and x.grad[1].abs().max() == 0


def test_layer_cache_reorder_for_beam_search():
    layer = MANLayer(D, H, causal=True).eval()
    x, _ = data(B=2, n=5)
    with torch.no_grad():
        _, cache = layer.step(x[:, :3], layer.init_cache())
        index = torch.tensor([0, 1, 1, 0])
        out, cache = layer.step(x[index, 3:5], cache.reorder(index))
        torch.testing.assert_close(out, layer(x[index])[:, 3:5], atol=1e-5, rtol=1e-5)
    assert len(cache) == 5 and cache.self_attention[2] is None


def test_bad_arguments():
    with pytest.raises(ValueError, match="unknown order element 'attn' at position 1"):
        MANLayer(D, H, order=("dman", "attn", "ffn"))
    with pytest.raises(ValueError, match="order must be a non-empty sequence"):
        MANLayer(D, H, order=())
    with pytest.raises(ValueError, match="order must be a non-empty sequence"):
        MANLayer(D, H, order="dman")
    with pytest.raises(ValueError, match="unknown norm 'mid'"):
        MANLayer(D, H, norm="mid")
    with pytest.raises(ValueError, match="max_distance must be >= 1, got 0"):
        MANLayer(D, H, dman_options={"max_distance": 0})
    with pytest.raises(ValueError, match="init_cache needs a causal layer"):
        MANLayer(D, H).init_cache()
    causal = MANLayer(D, H, causal=True)
    with pytest.raises(TypeError, match="cache must be a LayerCache"):
        causal.step(torch.randn(1, 2, D), MANLayer(D, H, order=("ffn",), causal=True).init_cache())
    with pytest.raises(ValueError, match="key_padding_mask has shape"):
        MANLayer(D, H, order=("ffn",))(torch.randn(2, 3, D), key_padding_mask=torch.zeros(2, 2, dtype=torch.bool))

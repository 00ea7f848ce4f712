"""The options that reproduce the authors' code (docs/fidelity.md), each against a float64 transcription of
that code written here: taoshen58/mtsa ``MTSA_API/mtsa.py`` (``multi_mask_tensorized_self_attn``, also
taoshen58/DiSAN ``Fast-DiSA/fast_disa.py``, the same function).

The transcriptions keep the authors' layout — per-head weight stacks ``(H, d_in, d_out)``, masks as 0/1
multipliers, ``exp`` without a shift, the ``where(Z > 0, Z, 1)`` guard, fairseq's relative-position
indexing — and take their weights from the maskattn module, so an agreement to float64 round-off says that
the option computes what the authors' code computes.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

import maskattn

ACT = {"linear": lambda t: t, "relu": torch.relu, "elu": F.elu, "sigmoid": torch.sigmoid, "exp": torch.exp}


def randomise(module, std=0.3, seed=0):
    """Every parameter random (biases too), so a missing or misplaced term changes the output."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.randn(p.shape, generator=g, dtype=p.dtype) * std)
    return module


def batch(B=2, n=7, d=16, seed=1):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(B, n, d, generator=g, dtype=torch.float64)
    kpm = torch.zeros(B, n, dtype=torch.bool)
    kpm[1, n - 3:] = True
    return x, kpm


# ------------------------------------------------------------------------------------------------ MTSA, authors


def authors_mask(rep_mask, head_num, attn_self):
    """``mask_generation`` (mtsa.py lines 269-302): forward heads first, then backward; padding rows and columns."""
    n = rep_mask.shape[1]
    row, col = torch.arange(n)[:, None], torch.arange(n)[None, :]  # tf.meshgrid: sl_row[i, j] = i, sl_col = j
    fw = row >= col if attn_self else row > col
    bw = col >= row if attn_self else col > row
    direct = torch.stack([fw] * (head_num // 2) + [bw] * (head_num // 2))  # (H, n, n)
    pairs = rep_mask[:, None, :] & rep_mask[:, :, None]  # (B, n, n)
    return (direct[:, None] & pairs[None]).double()  # (H, B, n, n)


def authors_tsa(x, rep_mask, w, *, head_num, attn_self=False, use_fusion_gate=True, dot_activation_name="sigmoid",
                use_input_for_attn=False, add_layer_for_multi=True, activation_func_name="relu",
                apply_act_for_v=True, output_hn=None, accelerate=False):
    """``multi_mask_tensorized_self_attn`` (mtsa.py lines 59-243), line by line, float64; ``w`` holds the
    weights in the authors' layout. Tensors are head-first ``(H, B, n, ·)`` as theirs."""
    act = ACT[activation_func_name]
    B, n, d_in = x.shape
    H = head_num
    mask_ft = authors_mask(rep_mask, H, attn_self)
    if not accelerate:
        tiled = x[None].expand(H, B, n, d_in)  # rep_tensor_tl
        v = ACT[activation_func_name if apply_act_for_v else "linear"](
            torch.einsum("hbni,hio->hbno", tiled, w["v_W"]) + w["v_b"][:, None, None])
        source = tiled if use_input_for_attn else v  # for_attn_score
        q = torch.einsum("hbni,hio->hbno", source, w["q_W"])  # no bias
        k = torch.einsum("hbni,hio->hbno", source, w["k_W"])
    else:  # use_input_for_attn (the only accelerated form the authors use: stacking_mtsa)
        q, k, v = (t.reshape(B, n, H, -1).permute(2, 0, 1, 3) for t in (x @ w["qkv_W"]).chunk(3, -1))
        source = None
        if apply_act_for_v:
            v = act(v)
    head_dim = v.shape[-1]
    e_dot = mask_ft * ACT[dot_activation_name](q @ k.transpose(-1, -2) / math.sqrt(head_dim))
    if not accelerate:
        t4m = act(torch.einsum("hbni,hio->hbno", source, w["t4m_W"]) + w["t4m_b"][:, None, None]) \
            if add_layer_for_multi else source
        multi = torch.einsum("hbni,hio->hbno", t4m, w["ml_W"]) + w["ml_b"][:, None, None]
    else:
        multi = (x @ w["t4m_W"] + w["t4m_b"]).reshape(B, n, H, -1).permute(2, 0, 1, 3)
        assert not add_layer_for_multi
    e_multi = torch.exp(multi) * rep_mask[None, :, :, None]
    z = e_dot @ e_multi
    z = torch.where(z > 0, z, torch.ones_like(z))
    attn = e_dot @ (v * e_multi) / z
    if use_fusion_gate:
        gate = torch.sigmoid(torch.einsum("hbni,hio->hbno", torch.cat([v, attn], -1), w["gate_W"])
                             + w["gate_b"][:, None, None])
        attn = gate * v + (1 - gate) * attn
    out = attn.permute(1, 2, 0, 3).reshape(B, n, -1)  # combine_head
    if output_hn is not None:
        out = act(out @ w["out_W"] + w["out_b"])
    return out * rep_mask[..., None]


def heads_of(linear, H):
    """An ``nn.Linear`` as the authors' per-head stack: ``(H, d_in, d_h)`` weights, ``(H, 1, d_h)`` biases."""
    W = linear.weight.T.reshape(linear.in_features, H, -1).transpose(0, 1)
    return W, (None if linear.bias is None else linear.bias.view(H, 1, -1))


def single_layer_weights(m, v_proj):
    H = m.num_heads
    v_W, v_b = heads_of(v_proj, H)
    q_lin, k_lin = (m.q_from_v, m.k_from_v) if hasattr(m, "q_from_v") else (m.query, m.key)
    assert q_lin.bias is None and k_lin.bias is None  # the authors' q_transform / k_transform have none
    w = {"v_W": v_W, "v_b": v_b[:, 0], "q_W": q_lin.weight, "k_W": k_lin.weight,
         "t4m_W": m.source2token.hidden.weight, "t4m_b": m.source2token.hidden.bias[:, 0],
         "ml_W": m.source2token.score.weight, "ml_b": m.source2token.score.bias[:, 0]}
    if m.fusion_gate is not None:
        w["gate_W"] = torch.cat([m.fusion_gate.from_input.weight, m.fusion_gate.from_attention.weight], dim=1)
        w["gate_b"] = m.fusion_gate.from_attention.bias[:, 0]
    return w


@pytest.mark.parametrize("script, act", [("sst", "relu"), ("snli", "elu")])
def test_mtsa_authors_config_is_the_authors_single_layer(script, act):
    m = randomise(maskattn.MTSA.authors_config(script, d_model=16, num_heads=2)).double().eval()
    x, kpm = batch()
    with torch.no_grad():
        expected = authors_tsa(x, ~kpm, single_layer_weights(m, m.v_proj), head_num=2, activation_func_name=act)
        torch.testing.assert_close(m(x, kpm), expected, rtol=1e-10, atol=1e-10)
        # the paper-faithful values (no activation on v) are a different function of the same weights
        linear_v = authors_tsa(x, ~kpm, single_layer_weights(m, m.v_proj), head_num=2, activation_func_name=act,
                               apply_act_for_v=False)
        assert (linear_v - expected).abs().max() > 1e-2


@pytest.mark.parametrize("act", ["elu", "relu"])
@pytest.mark.parametrize("apply_act_for_v", [False, True])
def test_v_activation_with_q_k_from_v_applies_once(act, apply_act_for_v):
    """q/k from v see the activated values, once (the authors' non-accelerated path, line 145; their
    accelerated path applies the activation twice, lines 166-173, and is not offered); 4 heads."""
    m = randomise(maskattn.MTSA(16, 4, strict_masks=True, fusion_gate=True, qk_input="v", qk_bias=False,
                                s2t_input="v", s2t_activation=act, out_proj=False,
                                v_activation=act if apply_act_for_v else None)).double().eval()
    x, kpm = batch()
    with torch.no_grad():
        expected = authors_tsa(x, ~kpm, single_layer_weights(m, m.v_proj), head_num=4, activation_func_name=act,
                               apply_act_for_v=apply_act_for_v)
        torch.testing.assert_close(m(x, kpm), expected, rtol=1e-10, atol=1e-10)


def test_mtsa_stacked_config_is_the_authors_stacking_layer():
    """``stacking_mtsa``'s attention (lines 47-53): q/k/v from one bias-free map of x, exp token2token
    scores, s2t a single linear map of x, no gate, an output dense layer with ReLU."""
    m = randomise(maskattn.MTSA.authors_config("stacked", d_model=16, num_heads=4)).double().eval()
    x, kpm = batch()
    qkv_W = torch.cat([m.q_proj.weight.T, m.k_proj.weight.T, m.v_proj.weight.T], dim=1)
    assert m.q_proj.bias is None and m.v_proj.bias is None and m.source2token.hidden is None
    w = {"qkv_W": qkv_W, "t4m_W": m.source2token.score.weight.transpose(0, 1).reshape(16, 16),
         "t4m_b": m.source2token.score.bias.reshape(16), "out_W": m.out_proj.weight.T, "out_b": m.out_proj.bias}
    with torch.no_grad():
        expected = authors_tsa(x, ~kpm, w, head_num=4, use_fusion_gate=False, dot_activation_name="exp",
                               use_input_for_attn=True, add_layer_for_multi=False, apply_act_for_v=False,
                               output_hn=16, accelerate=True)
        torch.testing.assert_close(m(x, kpm), expected, rtol=1e-10, atol=1e-10)


def test_s2t_input_x_with_two_layers_is_a_full_width_first_map():
    """The non-accelerated ``use_input_for_attn=True`` path: S from the tiled input through the per-head MLP."""
    m = randomise(maskattn.MTSA(16, 2, strict_masks=True, fusion_gate=True, qk_input="x", qk_bias=False,
                                s2t_input="x", s2t_activation="relu", out_proj=False)).double().eval()
    x, kpm = batch()
    v_W, v_b = heads_of(m.v_proj, 2)
    w = {"v_W": v_W, "v_b": v_b[:, 0], "q_W": heads_of(m.q_proj, 2)[0], "k_W": heads_of(m.k_proj, 2)[0],
         "t4m_W": m.source2token.hidden.weight, "t4m_b": m.source2token.hidden.bias[:, 0],
         "ml_W": m.source2token.score.weight, "ml_b": m.source2token.score.bias[:, 0],
         "gate_W": torch.cat([m.fusion_gate.from_input.weight, m.fusion_gate.from_attention.weight], dim=1),
         "gate_b": m.fusion_gate.from_attention.bias[:, 0]}
    with torch.no_grad():
        expected = authors_tsa(x, ~kpm, w, head_num=2, use_input_for_attn=True, apply_act_for_v=False)
        torch.testing.assert_close(m(x, kpm), expected, rtol=1e-10, atol=1e-10)


def test_fast_disa_authors_config_is_the_authors_function():
    """``fast_directional_self_attention`` with its defaults and the README's sigmoid scale."""
    m = randomise(maskattn.FastDiSA.authors_config(16, 2)).double().eval()
    x, kpm = batch()
    with torch.no_grad():
        expected = authors_tsa(x, ~kpm, single_layer_weights(m, m.head_proj), head_num=2)
        torch.testing.assert_close(m(x, kpm), expected, rtol=1e-10, atol=1e-10)
    paper = maskattn.FastDiSA(16, 2, strict_masks=True, fusion_gate=True, s2t_activation="relu").double().eval()
    paper.load_state_dict(m.state_dict())  # the same weights, values without the activation (Algorithm 1)
    with torch.no_grad():
        assert (paper(x, kpm) - expected).abs().max() > 1e-2


def test_backends_agree_with_the_new_options():
    x, kpm = batch(n=9)
    for m in (maskattn.MTSA.authors_config("sst", d_model=16), maskattn.MTSA.authors_config("stacked", d_model=16),
              maskattn.FastDiSA.authors_config(16)):
        m = randomise(m).double().eval()
        outs = {}
        for backend in ("reference", "sdpa", "flex"):
            m.backend = backend
            with torch.no_grad():
                outs[backend] = m(x, kpm)
        torch.testing.assert_close(outs["sdpa"], outs["reference"], rtol=1e-10, atol=1e-10)
        torch.testing.assert_close(outs["flex"], outs["reference"], rtol=1e-9, atol=1e-9)


def fake_dropout(input, p=0.5, training=True, inplace=False):
    """A deterministic stand-in: every dropped input is doubled, so an oracle can place it."""
    return input * 2.0 if training and p > 0 else input


def test_dense_dropout_drops_the_input_of_every_linear_map(monkeypatch):
    """``dense_keep_prob`` reaches v, q, k, both source2token maps and the gate (lines 138-201, 222-226)."""
    m = randomise(maskattn.MTSA.authors_config("sst", d_model=16)).double().train()
    x, kpm = batch()
    doubled = {key: (2 * t if key.endswith("_W") else t) for key, t in single_layer_weights(m, m.v_proj).items()}
    expected = authors_tsa(x, ~kpm, doubled, head_num=2)
    monkeypatch.setattr(F, "dropout", fake_dropout)
    with torch.no_grad():
        torch.testing.assert_close(m(x, kpm), expected, rtol=1e-10, atol=1e-10)
        m.eval()
        assert not torch.allclose(m(x, kpm), expected)  # eval: no dropout anywhere


def test_dense_dropout_output_layer(monkeypatch):
    """The output layer (``out_activation``, the authors' ``output_hn``) drops its input too."""
    from maskattn.functional import tensorized_attention_reference
    m = randomise(maskattn.MTSA(16, 4, out_activation="relu", dense_dropout=0.1)).double().eval()
    x, kpm = batch()
    with torch.no_grad():  # the heads without dropout, then σ(W_o · 2 heads + b_o)
        attended = tensorized_attention_reference(*m.project(x), m.mask, key_padding_mask=kpm)
        merged = attended.transpose(1, 2).reshape(2, 7, 16)
        expected = torch.relu((2 * merged) @ m.out_proj.weight.T + m.out_proj.bias).masked_fill(kpm[..., None], 0)
    m.train()
    calls = []

    def only_output(input, p=0.5, training=True, inplace=False):
        calls.append(tuple(input.shape))
        return input * 2.0 if input.dim() == 3 and training and p > 0 else input  # (B, n, d): the output layer's

    monkeypatch.setattr(F, "dropout", only_output)
    with torch.no_grad():
        torch.testing.assert_close(m(x, kpm), expected, rtol=1e-10, atol=1e-10)
    assert (2, 4, 7, 16) in calls  # the maps of x: one (B, H, n, d_model) mask per head


def test_dense_dropout_masks_differ_between_heads():
    """The authors tile the input per head "to make the dropout different for each head" (line 134)."""
    from maskattn.attention.headwise import project_heads
    linear = torch.nn.Linear(8, 16, bias=False)
    with torch.no_grad():
        linear.weight.copy_(torch.cat([torch.eye(8), torch.eye(8)]))  # both heads read x unchanged
    x = torch.ones(1, 50, 8)
    heads = project_heads(linear, x, 2, input_dropout=0.5, training=True)  # (1, 2, 50, 8)
    assert set(heads.unique().tolist()) <= {0.0, 2.0}
    assert not torch.equal(heads[:, 0], heads[:, 1])
    assert torch.equal(project_heads(linear, x, 2, input_dropout=0.5, training=False), torch.ones(1, 2, 50, 8))


# ------------------------------------------------------------------------------------------------ bad input


@pytest.mark.parametrize("make, exc, words", [
    (lambda: maskattn.MTSA(16, 2, out_activation="relu", out_proj=False), ValueError,
     ["out_activation='relu'", "out_proj=False"]),
    (lambda: maskattn.MTSA(16, 2, s2t_layers=1, s2t_hidden=8), ValueError, ["s2t_layers=1", "s2t_hidden=8"]),
    (lambda: maskattn.MTSA(16, 2, s2t_layers=1, s2t_activation="relu"), ValueError,
     ["s2t_layers=1", "s2t_activation='relu'"]),
    (lambda: maskattn.MTSA(16, 2, s2t_layers=3), ValueError, ["s2t_layers", "3"]),
    (lambda: maskattn.MTSA(16, 2, v_activation="tanh"), ValueError, ["v_activation", "'tanh'", "'elu'"]),
    (lambda: maskattn.MTSA(16, 2, out_activation="gelu"), ValueError, ["out_activation", "'gelu'"]),
    (lambda: maskattn.MTSA(16, 2, s2t_input="q"), ValueError, ["s2t_input", "'q'", "'x'"]),
    (lambda: maskattn.MTSA(16, 2, qk_bias=0), TypeError, ["qk_bias", "bool"]),
    (lambda: maskattn.MTSA(16, 2, dense_dropout=1.0), ValueError, ["dense_dropout"]),
    (lambda: maskattn.FastDiSA(16, 2, v_activation="gelu"), ValueError, ["v_activation", "'gelu'"]),
    (lambda: maskattn.MTSA.authors_config("imdb"), ValueError, ["'imdb'", "'sst'", "'stacked'"]),
    (lambda: maskattn.MTSA.authors_config("stacked"), ValueError, ["'stacked'", "d_model"]),
])
def test_bad_options_name_the_option_and_value(make, exc, words):
    with pytest.raises(exc) as info:
        make()
    for word in words:
        assert word in str(info.value), (word, str(info.value))

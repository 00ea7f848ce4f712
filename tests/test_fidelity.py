"""The options that reproduce the authors' code (docs/fidelity.md), each against a float64 transcription of
that code written here: taoshen58/mtsa ``MTSA_API/mtsa.py`` (``multi_mask_tensorized_self_attn``, also
taoshen58/DiSAN ``Fast-DiSA/fast_disa.py``, the same function), LibertFan/MAN
``translation/fairseq/modules/multihead_attention2.py`` and ``models/man.py`` (``MANEncoderLayer``).

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
from maskattn.attention.man import FullMaskAttention
from maskattn.layers import Encoder, MANLayer

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


def fake_dropout(x, p=0.5, training=True, inplace=False):
    """A deterministic stand-in: every dropped input is doubled, so an oracle can place it."""
    return x * 2.0 if training and p > 0 else x


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

    def only_output(x, p=0.5, training=True, inplace=False):
        calls.append(tuple(x.shape))
        return x * 2.0 if x.dim() == 3 and training and p > 0 else x  # (B, n, d): the output layer's

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


# ------------------------------------------------------------------------------------------------ MAN, authors


def authors_mha2(module, x, kpm, *, re_weight_m, forward_x=None, backward_x=None, head_x=None):
    """fairseq ``MultiheadAttention2.forward`` (lines 129-259) for self-attention, float64, weights from
    ``module`` (``in_proj``, ``out_proj``; ``mask_query`` as ``context_x_fc``); batch-first in and out."""
    B, n, d = x.shape
    H = module.num_heads
    q, k, v = F.linear(x, module.in_proj.weight, module.in_proj.bias).chunk(3, -1)
    q = q * (d // H) ** -0.5
    q, k, v = (t.reshape(B, n, H, -1).transpose(1, 2) for t in (q, k, v))
    scores = q @ k.transpose(-1, -2)  # (B, H, n, n)
    if re_weight_m == 1:  # build_mask, lines 86-127
        position_x = torch.cat([forward_x, torch.zeros(1, dtype=x.dtype), backward_x])
        half = (position_x.numel() + 1) // 2
        indices = (torch.arange(n)[None].repeat(n, 1) + torch.arange(half - n, half).flip(0)[:, None]).view(-1)
        position = position_x[indices].view(n, n)
        gamma = position[None].repeat(H, 1, 1) + head_x[:, None, None]
        context_x = module.mask_query(x)[:, None]  # (B, 1, n, 1)
        scores = scores + (context_x + gamma[None]).sigmoid().clamp(1e-10).log()
    scores = scores.masked_fill(kpm[:, None, None, :], float("-inf"))
    attn = (F.softmax(scores, -1) @ v).transpose(1, 2).reshape(B, n, d)
    return module.out_proj(attn.relu())


def dman_from_authors_tables(module, forward_x, backward_x, head_x):
    """Load fairseq's ``forward_position_x`` / ``backward_position_x`` / ``head_x`` into a DMAN whose table
    covers the same distances: ``P[t − s]`` is ``position_x[max_len − (t − s)]``. The entry of distance 0 is
    set to garbage: with ``self_distance="zero"`` it must not matter."""
    with torch.no_grad():
        module.distance_bias.copy_(torch.cat([forward_x, torch.tensor([7.0], dtype=forward_x.dtype), backward_x])
                                   .flip(0))
        module.head_bias.copy_(head_x)
    return module


def authors_tables(max_len, heads, seed=2, head_shift=0.0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(max_len, generator=g, dtype=torch.float64), torch.randn(max_len, generator=g,
            dtype=torch.float64), torch.randn(heads, generator=g, dtype=torch.float64) + head_shift)


@pytest.mark.parametrize("backend", ["reference", "sdpa", "flex"])
def test_dman_authors_options_are_multihead_attention2(backend):
    """``re_weight_m=1``: P[0] ≡ 0, M clamped at 1e-10 before the log, ReLU before ``out_proj``; one head
    bias far negative so that the clamp is active."""
    max_len = 12
    m = randomise(maskattn.DynamicMaskAttention(16, 4, max_distance=max_len, activation="relu", self_distance="zero",
                                                mask_floor=1e-10, backend=backend)).double().eval()
    tables = authors_tables(max_len, 4, head_shift=0.0)
    tables[2][1] = -40.0
    dman_from_authors_tables(m, *tables)
    x, kpm = batch(n=9)
    with torch.no_grad():
        expected = authors_mha2(m, x, kpm, re_weight_m=1, forward_x=tables[0], backward_x=tables[1],
                                head_x=tables[2]).masked_fill(kpm[..., None], 0)
        torch.testing.assert_close(m(x, kpm), expected, rtol=1e-10, atol=1e-10)


def test_mask_floor_changes_only_where_m_is_below_it_and_is_tested_to_fail():
    """The exact log (default) and the clamp differ where M < 1e-10 (head bias -40: by O(1)); with every
    M above the floor they agree."""
    max_len = 12
    tables = authors_tables(max_len, 4)
    tables[2][1] = -40.0
    x, kpm = batch(n=9)
    outs = {}
    for floor in (None, 1e-10):
        m = randomise(maskattn.DynamicMaskAttention(16, 4, max_distance=max_len, self_distance="zero",
                                                    activation="relu", mask_floor=floor)).double().eval()
        dman_from_authors_tables(m, *tables)
        with torch.no_grad():
            outs[floor] = m(x, kpm)
    assert (outs[None] - outs[1e-10]).abs().max() > 1e-2
    tables[2][1] = 0.0  # every M far above 1e-10 now
    same = []
    for floor in (None, 1e-10):
        m = randomise(maskattn.DynamicMaskAttention(16, 4, max_distance=max_len, mask_floor=floor)).double().eval()
        dman_from_authors_tables(m, *tables)
        with torch.no_grad():
            same.append(m(x, kpm))
    torch.testing.assert_close(same[0], same[1], rtol=0, atol=0)


@pytest.mark.parametrize("fused", [False, True])  # explicit softmax / the fused attention call per tile
@pytest.mark.parametrize("n, max_distance", [(10, 128), (40, 6)])  # log M built on the skewed view / the table
def test_mask_floor_gradients_of_the_kernel_equal_autograd(monkeypatch, n, max_distance, fused):
    """The tiled kernel's own backward (sdpa) against autograd through the float64 reference: no gradient
    reaches W, P, U through a floored entry."""
    monkeypatch.setattr(maskattn.kernels.dman, "SDPA_MIN_ELEMENTS", 0 if fused else 1 << 30)
    torch.manual_seed(3)
    B, H, d = 2, 4, 8
    q, k, v = (torch.randn(B, H, n, d, dtype=torch.float64, requires_grad=True) for _ in range(3))
    a = (torch.randn(B, n, dtype=torch.float64) * 3).requires_grad_()
    table = (torch.randn(2 * max_distance + 1, dtype=torch.float64) * 3).requires_grad_()
    # head 1 around the floor (M = 1e-10 at z ≈ -23), head 2 entirely below it: there the weights are the
    # plain softmax of the scores, so a gradient leaking through the floor would be of order one
    u = torch.tensor([0.0, -24.0, -60.0, 2.0], dtype=torch.float64, requires_grad=True)
    kpm = torch.zeros(B, n, dtype=torch.bool)
    kpm[1, -3:] = True
    grads = {}
    for backend in ("reference", "sdpa"):
        out = maskattn.functional.dynamic_mask_attention(q, k, v, a, table, u, key_padding_mask=kpm, backend=backend,
                                                         mask_floor=1e-10)
        grads[backend] = (out, *torch.autograd.grad(out.square().sum(), (q, k, v, a, table, u)))
    for got, want in zip(grads["sdpa"], grads["reference"]):  # the kernel's float64 round-off (exp2 of ~-60)
        torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-8)
    assert grads["sdpa"][-1][2] == 0 and grads["sdpa"][-1][1] != 0  # U of the floored head gets nothing
    mask = torch.sigmoid(maskattn.functional.dynamic_mask_logits(a, table, u)).detach()
    assert (mask[:, 1] < 1e-10).any() and (mask[:, 1] > 1e-10).any() and (mask[:, 2] < 1e-10).all()


def test_self_distance_zero_ignores_and_freezes_the_stored_entry():
    m = randomise(maskattn.DynamicMaskAttention(16, 4, max_distance=5, self_distance="zero")).double()
    x, kpm = batch()
    out = m(x, kpm)
    out.square().sum().backward()
    assert m.distance_bias.grad[5] == 0 and m.distance_bias.grad.abs().sum() > 0
    with torch.no_grad():
        m.distance_bias[5] += 3.0
        torch.testing.assert_close(m(x, kpm), out)
        torch.testing.assert_close(m.dynamic_mask(x)[0, 0, 2, 2], torch.sigmoid(m.mask_query(x)[0, 2, 0]
                                                                                + m.head_bias[0]))
    learned = maskattn.DynamicMaskAttention(16, 4, max_distance=5).double()
    learned.load_state_dict(m.state_dict())
    with torch.no_grad():
        assert (learned(x, kpm) - out).abs().max() > 1e-3  # the entry is used when learned


def test_man_san_with_relu_is_the_authors_san_and_without_it_is_mha():
    san = randomise(FullMaskAttention(16, 4, activation="relu")).double().eval()
    x, kpm = batch()
    with torch.no_grad():
        expected = authors_mha2(san, x, kpm, re_weight_m=0).masked_fill(kpm[..., None], 0)
        torch.testing.assert_close(san(x, kpm), expected, rtol=1e-10, atol=1e-10)
        plain = FullMaskAttention(16, 4).double().eval()
        mha = maskattn.MultiHeadAttention(16, 4).double().eval()
        plain.load_state_dict(san.state_dict())
        mha.load_state_dict(san.state_dict())
        torch.testing.assert_close(plain(x, kpm), mha(x, kpm), rtol=1e-12, atol=1e-12)


def test_man_san_decodes_incrementally():
    san = FullMaskAttention(16, 4, causal=True, activation="relu").eval()
    x = torch.randn(2, 6, 16)
    with torch.no_grad():
        full, cache, steps = san(x), san.init_cache(), []
        for t in range(6):
            out, cache = san.step(x[:, t:t + 1], cache)
            steps.append(out)
    torch.testing.assert_close(torch.cat(steps, 1), full, atol=1e-6, rtol=1e-6)


def authors_man_encoder_layer(layer, x, kpm, tables):
    """``MANEncoderLayer.forward`` (models/man.py lines 510-553) with ``mix=True``, ``normalize_before=True``,
    eval mode: LN → DMAN → +x, LN → SAN → +x, LN → fc2(relu(fc1)) → +x."""
    dman, san, ffn = layer.sublayers
    norms = [r.norm for r in layer.residuals]
    x = x + authors_mha2(dman, norms[0](x), kpm, re_weight_m=1, forward_x=tables[0], backward_x=tables[1],
                         head_x=tables[2])
    x = x + authors_mha2(san, norms[1](x), kpm, re_weight_m=0)
    return x + ffn.fc2(F.relu(ffn.fc1(norms[2](x))))


def test_man_layer_authors_config_is_the_authors_encoder_layer():
    layer = MANLayer.authors_config("iwslt", d_model=16, num_heads=4, ffn_dim=16,
                                    dman_options={"activation": "relu", "self_distance": "zero",
                                                  "mask_floor": 1e-10, "max_distance": 12})
    layer = randomise(layer).double().eval()
    tables = authors_tables(12, 4)
    dman_from_authors_tables(layer.sublayers[0], *tables)
    x, kpm = batch(n=9)
    with torch.no_grad():
        expected = authors_man_encoder_layer(layer, x, kpm, tables).masked_fill(kpm[..., None], 0)
        torch.testing.assert_close(layer(x, kpm), expected, rtol=1e-10, atol=1e-10)
    assert layer.order == ("dman", "man_san", "ffn")
    full = MANLayer.authors_config("iwslt")
    assert (full.d_model, full.sublayers[0].num_heads, full.sublayers[2].fc1.out_features) == (512, 4, 512)
    assert full.sublayers[0].max_distance == 1024 and full.residuals[0].dropout.p == 0.3


def test_recipes_and_registry_carry_the_options():
    enc = Encoder.from_recipe(16, 4, "dman(self_distance=zero, mask_floor=1.0e-10, activation=relu)"
                                     ">man_san(activation=relu)>ffn x2")
    dman, san, _ = enc.layers[1].sublayers
    assert (dman.self_distance, dman.mask_floor, dman.activation) == ("zero", 1e-10, "relu")
    assert isinstance(san, FullMaskAttention) and san.activation == "relu"
    enc = Encoder.from_recipe(16, 2, "mtsa(v_activation=elu, qk_input=v, s2t_layers=1, dense_dropout=0.3)", ffn=False)
    mtsa = enc.layers[0].sublayers[0]
    assert (mtsa.v_activation, mtsa.qk_input, mtsa.source2token.hidden, mtsa.dense_dropout) == ("elu", "v", None, 0.3)
    fast = maskattn.create_attention("fast_disa", 16, 2, v_activation="relu", dense_dropout=0.2)
    assert (fast.v_activation, fast.query.input_dropout) == ("relu", 0.2)


def test_presets_build_the_authors_sst_model():
    from maskattn.train import load_config, preset_path
    for name in ("sst5-mtsa-authors", "trec-mtsa-authors"):
        cfg = load_config(preset_path(name), [])
        enc = Encoder.from_recipe(cfg.model.d_model, cfg.model.num_heads, cfg.model.encoder, ffn=cfg.model.ffn)
        mtsa = enc.layers[0].sublayers[0]
        # the preset maps the 300-d vectors to 600 in front of MTSA (model.embed_dim → model.d_model), so its MTSA
        # is the authors' with a 600-d input
        expected = maskattn.MTSA.authors_config("sst", d_in=600)
        assert mtsa.config == expected.config
        assert {k: v.shape for k, v in mtsa.state_dict().items()} == {k: v.shape for k, v in
                                                                      expected.state_dict().items()}
        assert (mtsa.v_activation, mtsa.dense_dropout, cfg.model.dropout) == ("relu", 0.3, 0.3)


# ------------------------------------------------------------------------------------------------ bad input


@pytest.mark.parametrize("make, exc, words", [
    (lambda: maskattn.MTSA(16, 2, out_activation="relu", out_proj=False), ValueError,
     ["out_activation='relu'", "out_proj=False"]),
    (lambda: maskattn.MTSA(16, 2, s2t_layers=1, s2t_hidden=8), ValueError, ["s2t_layers=1", "s2t_hidden=8"]),
    (lambda: maskattn.MTSA(16, 2, s2t_layers=1, s2t_activation="relu"), ValueError,
     ["s2t_layers=1", "s2t_activation='relu'"]),
    (lambda: maskattn.MTSA(16, 2, s2t_layers=3), ValueError, ["s2t_layers", "3"]),
    (lambda: maskattn.MTSA(16, 2, v_activation="tanh"), ValueError, ["v_activation", "'tanh'", "'elu'"]),
    (lambda: maskattn.MTSA(16, 2, out_activation="tanh"), ValueError, ["out_activation", "'tanh'", "'swish'"]),
    (lambda: maskattn.MTSA(16, 2, s2t_input="q"), ValueError, ["s2t_input", "'q'", "'x'"]),
    (lambda: maskattn.MTSA(16, 2, qk_bias=0), TypeError, ["qk_bias", "bool"]),
    (lambda: maskattn.MTSA(16, 2, dense_dropout=1.0), ValueError, ["dense_dropout"]),
    (lambda: maskattn.FastDiSA(16, 2, v_activation="tanh"), ValueError, ["v_activation", "'tanh'"]),
    (lambda: maskattn.MTSA.authors_config("imdb"), ValueError, ["'imdb'", "'sst'", "'stacked'"]),
    (lambda: maskattn.MTSA.authors_config("stacked"), ValueError, ["'stacked'", "d_model"]),
    (lambda: maskattn.DynamicMaskAttention(16, 4, self_distance="fixed"), ValueError,
     ["self_distance", "'fixed'", "'zero'"]),
    (lambda: maskattn.DynamicMaskAttention(16, 4, mask_floor=0), ValueError, ["mask_floor", "got 0"]),
    (lambda: maskattn.DynamicMaskAttention(16, 4, mask_floor=1.0), ValueError, ["mask_floor", "(0, 1)"]),
    (lambda: maskattn.DynamicMaskAttention(16, 4, mask_floor="1e-10"), ValueError, ["mask_floor", "1.0e-10"]),
    (lambda: MANLayer(16, 4, cross_options={"activation": "relu"}), ValueError, ["cross_options", "causal=True"]),
    (lambda: MANLayer.authors_config("iwslt14"), ValueError, ["'iwslt14'", "'wmt_base'", "'summarization'"]),
    (lambda: maskattn.MTSA(16, 2, s2t_scale="sigmoid"), ValueError, ["s2t_scale", "'sigmoid'", "'scaled_log_sigmoid'"]),
    (lambda: maskattn.MTSA(16, 2, s2t_bias_init="5"), ValueError, ["s2t_bias_init", "'5'"]),
    (lambda: maskattn.MTSA(16, 2, in_activation="relu"), ValueError, ["in_activation='relu'", "in_hidden"]),
    (lambda: maskattn.MTSA(16, 2, d_out=8, out_proj=False), ValueError, ["d_out=8", "out_proj=True"]),
    (lambda: maskattn.MTSA(16, 2, out_bias=False, out_proj=False), ValueError, ["out_bias=False", "out_proj"]),
    (lambda: maskattn.MTSA(16, 2, d_in=0), ValueError, ["d_in"]),
    (lambda: maskattn.MTSA.authors_config("nmt"), ValueError, ["'nmt'", "'nmt_setup1'"]),
    (lambda: maskattn.DynamicMaskAttention(16, 4, mask_floor_mode="row_max"), ValueError,
     ["mask_floor_mode='row_max'", "mask_floor="]),
    (lambda: maskattn.DynamicMaskAttention(16, 4, mask_floor=1e-10, mask_floor_mode="row"), ValueError,
     ["mask_floor_mode", "'row'", "'row_max'"]),
    (lambda: maskattn.DynamicMaskAttention(16, 4, activation_dropout=1.5), ValueError, ["activation_dropout"]),
    (lambda: maskattn.CrossAttention(16, 4, activation="tanh"), ValueError, ["activation", "'tanh'"]),
    (lambda: Encoder.from_recipe(16, 2, "mtsa(d_in=8)"), ValueError, ["'mtsa'", "8", "d_in"]),
    (lambda: Encoder.from_recipe(16, 2, "mha", norm_eps="1e-6"), ValueError, ["norm_eps", "1.0e-6"]),
    (lambda: FullMaskAttention(16, 4, activation="tanh"), ValueError, ["activation", "'relu'", "'gelu'"]),
])
def test_bad_options_name_the_option_and_value(make, exc, words):
    with pytest.raises(exc) as info:
        make()
    for word in words:
        assert word in str(info.value), (word, str(info.value))


# ------------------------------------------------------------------------------------------------ issue 26: the
# configurations that were out of reach: the NMT MTSA, the activation table, input/output widths, the stacked
# MTSA's block, the MAN summarization model and the MAN decoder's activations

def authors_selu(t):  # MTSA_API/mtsa.py lines 396-400
    return 1.0507009873554804934193349852946 * torch.where(t >= 0.0, t, 1.6732632423543772848170429916717 * F.elu(t))


def authors_gelu_tanh(t):  # Proj_NLI_Trans_mtsa/src/nn_utils/mtsa.py line 403-404
    return 0.5 * t * (1 + torch.tanh(math.sqrt(2 / math.pi) * (t + 0.044715 * torch.pow(t, 3))))


ACT.update({
    "selu": authors_selu,
    "gelu_tanh": authors_gelu_tanh,
    "swish": lambda t: t * torch.sigmoid(t),  # line 406-407
    "lrelu": lambda t: torch.maximum(0.2 * t, t),  # tf.nn.leaky_relu, alpha=0.2
    "gelu": lambda t: t * 0.5 * (1.0 + torch.erf(t / math.sqrt(2.0))),  # fairseq's gelu (erf)
})


def authors_nmt_attention(m, x, kpm, *, afn_multi="scaled_sigmoid"):
    """tensor2tensor 1.9 ``multihead_attention`` (Proj_NMT/files/common_attention.py lines 3405-3568) calling
    ``dot_product_attention_mtsa`` (Proj_NMT/files/mtsa.py lines 9-121) with the README's hparams, float64:
    q/k/v dense layers without bias, ``q *= d_h**-0.5``, the padding bias -1e9, ``exp`` token2token scores, the
    source2token logits one biased dense layer of ``v`` per head, ``E = afn_multi(S · 1/√d_v)``, no positional
    masks, the output transform without bias."""
    B, n, d = x.shape
    H = m.num_heads
    q, k, v = (F.linear(x, lin.weight).reshape(B, n, H, -1).transpose(1, 2) for lin in (m.q_proj, m.k_proj, m.v_proj))
    q = q * (d // H) ** -0.5
    bias = torch.zeros(B, 1, 1, n, dtype=x.dtype).masked_fill(kpm[:, None, None, :], -1e9)
    dim_v = v.shape[-1]
    factor = 1.0 / math.sqrt(dim_v) if afn_multi.startswith("scaled") else 1.0  # line 58
    e_dot = torch.exp(q @ k.transpose(-1, -2) + bias)  # afn_dot='exp', line 71
    multi = torch.einsum("bhni,hio->bhno", v, m.source2token.score.weight) + m.source2token.score.bias  # line 86
    e_multi = (torch.sigmoid if afn_multi.endswith("sigmoid") else torch.exp)(multi * factor)  # line 90
    z = e_dot @ e_multi
    z = torch.where(z > 0, z, torch.ones_like(z))
    attn = e_dot @ (v * e_multi) / z
    return F.linear(attn.transpose(1, 2).reshape(B, n, d), m.out_proj.weight)  # output_transform, no bias


@pytest.mark.parametrize("setup", ["nmt_setup1", "nmt_setup2"])
def test_mtsa_nmt_config_is_the_authors_t2t_attention(setup):
    m = maskattn.MTSA.authors_config(setup)
    assert (m.d_model, m.num_heads, m.dropout, m.dense_dropout, m.s2t_scale) == (512, 8, 0.1, 0.0, "scaled_log_sigmoid")
    assert m.out_proj.bias is None and m.q_proj.bias is None and m.v_proj.bias is None
    assert torch.all(m.source2token.score.bias == (5.0 if setup == "nmt_setup1" else 0.0))  # bias_start
    m = randomise(maskattn.MTSA.authors_config(setup, d_model=16, num_heads=4)).double().eval()
    x, kpm = batch()
    with torch.no_grad():
        expected = authors_nmt_attention(m, x, kpm).masked_fill(kpm[..., None], 0)
        for backend in ("reference", "sdpa", "flex", "auto"):
            m.backend = backend
            torch.testing.assert_close(m(x, kpm), expected, rtol=1e-9, atol=1e-10)
        # the paper's σ_s (E = exp S) is a different function of the same weights
        paper = maskattn.MTSA.authors_config(setup, d_model=16, num_heads=4, s2t_scale="identity").double().eval()
        paper.load_state_dict(m.state_dict())
        assert (paper(x, kpm) - expected).abs().max() > 1e-2
        torch.testing.assert_close(paper(x, kpm), authors_nmt_attention(m, x, kpm, afn_multi="exp")
                                   .masked_fill(kpm[..., None], 0), rtol=1e-9, atol=1e-10)


def test_s2t_scale_log_sigmoid_is_sigmoid_weights():
    """``s2t_scale="log_sigmoid"``: ``E = σ(S)`` (afn_multi='sigmoid', the unscaled one)."""
    m = randomise(maskattn.MTSA.authors_config("nmt_setup2", d_model=16, num_heads=4, s2t_scale="log_sigmoid"))
    m = m.double().eval()
    x, kpm = batch()
    with torch.no_grad():
        torch.testing.assert_close(m(x, kpm), authors_nmt_attention(m, x, kpm, afn_multi="sigmoid")
                                   .masked_fill(kpm[..., None], 0), rtol=1e-9, atol=1e-10)


def test_mtsa_nmt_dropout_paths_are_the_authors(monkeypatch):
    """t2t drops ``e_dot_logits`` and ``e_multi_logits`` with keep ``√(1 − attention_dropout)`` each and nothing
    else inside the attention (mtsa.py lines 102-106; compute_qkv and output_transform have no dropout): maskattn
    drops ``v ⊙ E`` (the E factor, per key and feature) and the token2token weights of the numerator, with the same
    keep probability, and no input of a dense map."""
    import maskattn.functional.tensorized as tensorized
    m = maskattn.MTSA.authors_config("nmt_setup2", d_model=16, num_heads=4, backend="sdpa").double().train()
    calls, attention = [], []
    real_dropout, real_fused = F.dropout, tensorized.fused_attention
    monkeypatch.setattr(F, "dropout", lambda t, p=0.5, training=True, inplace=False:
                        calls.append((tuple(t.shape), p)) or real_dropout(t, p, training, inplace))
    monkeypatch.setattr(tensorized, "fused_attention", lambda *a, dropout_p=0.0, **kw:
                        attention.append(dropout_p) or real_fused(*a, dropout_p=dropout_p, **kw))
    x, kpm = batch()
    m(x, kpm)
    keep = math.sqrt(1 - 0.1)
    assert calls == [((2, 4, 7, 4), pytest.approx(1 - keep))]  # the E factor (v ⊙ E), (B, H, n, d_h)
    assert sorted(attention) == [0.0, pytest.approx(1 - keep)]  # the numerator's weights; the denominator undropped


# ------------------------------------------------------------------------------------------------ activations


@pytest.mark.parametrize("act", ["selu", "gelu_tanh", "swish", "lrelu", "gelu"])
def test_mtsa_activations_are_the_authors(act):
    """Every name of the table as the authors' ``activation_func_name`` (values, source2token hidden layer)."""
    m = randomise(maskattn.MTSA.authors_config("sst", d_model=16, num_heads=2, s2t_activation=act,
                                               v_activation=act)).double().eval()
    x, kpm = batch()
    with torch.no_grad():
        expected = authors_tsa(x, ~kpm, single_layer_weights(m, m.v_proj), head_num=2, activation_func_name=act)
        torch.testing.assert_close(m(x, kpm), expected, rtol=1e-10, atol=1e-10)


def authors_tsa_widths(x, rep_mask, m, *, act, input_hn, output_hn):
    """``multi_mask_tensorized_self_attn`` with ``input_hn`` (the input dense layer, lines 119-124) and
    ``output_hn`` (the output dense layer, lines 256-261): the single-layer path around it."""
    w = single_layer_weights(m, m.v_proj)
    w.update({"out_W": m.out_proj.weight.T, "out_b": m.out_proj.bias})
    h = ACT[act](x @ m.in_proj.weight.T + m.in_proj.bias) if input_hn is not None else x
    return authors_tsa(h, rep_mask, w, head_num=m.num_heads, activation_func_name=act, output_hn=output_hn)


@pytest.mark.parametrize("act", ["relu", "elu", "selu"])
def test_mtsa_d_in_input_hn_and_output_hn_are_one_authors_call(act):
    """``d_in`` (their input's width), ``in_hidden`` (``input_hn``) and ``d_out`` (``output_hn``): one module for one
    call ``multi_mask_tensorized_self_attn(x[10-d], hn=16, input_hn=12, output_hn=20)``."""
    m = randomise(maskattn.MTSA(16, 2, strict_masks=True, fusion_gate=True, qk_input="v", qk_bias=False,
                                s2t_input="v", s2t_activation=act, v_activation=act, d_in=10, in_hidden=12,
                                in_activation=act, d_out=20, out_activation=act)).double().eval()
    g = torch.Generator().manual_seed(5)
    x = torch.randn(2, 7, 10, generator=g, dtype=torch.float64)
    _, kpm = batch()
    with torch.no_grad():
        out = m(x, kpm)
        assert out.shape == (2, 7, 20)
        torch.testing.assert_close(out, authors_tsa_widths(x, ~kpm, m, act=act, input_hn=12, output_hn=20),
                                   rtol=1e-10, atol=1e-10)


def test_sst_config_takes_the_300_d_vectors():
    """``authors_config("sst")`` is one call of the SST script: 300-d GloVe in, ``hn = 600`` out."""
    m = randomise(maskattn.MTSA.authors_config("sst"), std=0.05).double().eval()
    assert (m.d_in, m.d_model, m.v_proj.in_features) == (300, 600, 300)
    g = torch.Generator().manual_seed(4)
    x = torch.randn(2, 5, 300, generator=g, dtype=torch.float64)
    kpm = torch.tensor([[False] * 5, [False] * 3 + [True] * 2])
    with torch.no_grad():
        expected = authors_tsa(x, ~kpm, single_layer_weights(m, m.v_proj), head_num=2, activation_func_name="relu")
        torch.testing.assert_close(m(x, kpm), expected, rtol=1e-10, atol=1e-10)
    assert maskattn.MTSA.authors_config("sst", d_model=16).d_in == 16  # a width of the caller's replaces both


# ------------------------------------------------------------------------------------------------ stacked MTSA block


def authors_layer_norm(t, ln, eps=1e-6):  # MTSA_API/mtsa.py lines 586-602
    mean = t.mean(-1, keepdim=True)
    variance = (t - mean).square().mean(-1, keepdim=True)
    return (t - mean) * torch.rsqrt(variance + eps) * ln.weight + ln.bias


def authors_stacking_layer(layer, x, kpm, dropout=lambda t: t):
    """One layer of ``stacking_mtsa`` (lines 40-54): ``bn_dense_layer(x, hn, 'relu', keep=dense_keep_prob)``, a
    residual connection (dropout, then ``layer_norm(x + y)``), the stacked attention, a residual connection."""
    ffn, mtsa = layer.sublayers
    norms = [r.norm for r in layer.residuals]
    H, d = mtsa.num_heads, mtsa.d_model
    y = torch.relu(F.linear(dropout(x), ffn.fc1.weight, ffn.fc1.bias))
    x = authors_layer_norm(x + dropout(y), norms[0])
    w = {"qkv_W": torch.cat([mtsa.q_proj.weight.T, mtsa.k_proj.weight.T, mtsa.v_proj.weight.T], dim=1),
         "t4m_W": mtsa.source2token.score.weight.transpose(0, 1).reshape(d, d),
         "t4m_b": mtsa.source2token.score.bias.reshape(d), "out_b": mtsa.out_proj.bias,
         # the output layer drops its input (bn_dense_layer, line 456): dropout(attn) @ W = attn @ dropout(W) here,
         # as the stand-in dropout is a scaling
         "out_W": dropout(mtsa.out_proj.weight.T)}
    y = authors_tsa(dropout(x), ~kpm, w, head_num=H, use_fusion_gate=False, dot_activation_name="exp",
                    use_input_for_attn=True, add_layer_for_multi=False, apply_act_for_v=False, output_hn=d,
                    accelerate=True)
    return authors_layer_norm(x + dropout(y), norms[1])


def test_stacked_recipe_is_the_authors_stacking_layer():
    from maskattn.attention.mtsa import STACKED_LAYER_SETTINGS, STACKED_RECIPE
    enc = Encoder.from_recipe(16, 4, STACKED_RECIPE, **STACKED_LAYER_SETTINGS)
    layer = randomise(enc.layers[0]).double().eval()
    ffn, mtsa = layer.sublayers
    assert ffn.fc2 is None and ffn.input_dropout.p == pytest.approx(0.1) and layer.residuals[0].norm.eps == 1e-6
    assert layer.residuals[0].dropout.p == pytest.approx(0.2) and enc.final_norm is None
    stacked = maskattn.MTSA.authors_config("stacked", d_model=16, num_heads=4)
    assert mtsa.config == stacked.config  # the recipe's attention is the named configuration
    x, kpm = batch()
    with torch.no_grad():
        expected = authors_stacking_layer(layer, x, kpm).masked_fill(kpm[..., None], 0)
        torch.testing.assert_close(enc(x, kpm), expected, rtol=1e-10, atol=1e-10)
        other = Encoder.from_recipe(16, 4, STACKED_RECIPE, **{**STACKED_LAYER_SETTINGS, "norm_eps": 1e-5}).double()
        other.load_state_dict(enc.state_dict())
        assert (other(x, kpm) - expected).abs().max() > 1e-8  # the epsilon is seen


def test_stacked_block_dropout_paths_are_the_authors(monkeypatch):
    """In training, with a dropout that doubles its input, the block equals the authors' layer with the same
    dropout at their places (the FFN's input, both residuals, every dense map's input); the attention dropout
    (0.2, keep √0.8 on both factors) is set to 0 here, it does not go through ``F.dropout``."""
    from maskattn.attention.mtsa import STACKED_LAYER_SETTINGS, STACKED_RECIPE
    enc = Encoder.from_recipe(16, 4, STACKED_RECIPE.replace("dropout=0.2, ", "dropout=0.0, "),
                              **STACKED_LAYER_SETTINGS)
    layer = randomise(enc.layers[0]).double()
    x, kpm = batch()
    with torch.no_grad():
        expected = authors_stacking_layer(layer, x, kpm, dropout=lambda t: 2 * t).masked_fill(kpm[..., None], 0)
    monkeypatch.setattr(F, "dropout", fake_dropout)
    with torch.no_grad():
        torch.testing.assert_close(enc.train()(x, kpm), expected, rtol=1e-10, atol=1e-10)
    assert maskattn.MTSA.authors_config("stacked", d_model=16).dropout == pytest.approx(0.2)


# ------------------------------------------------------------------------------------------------ MAN summarization


def authors_mha2_summ(module, query, memory, kpm, *, act, re_weight_m, forward_x=None, backward_x=None, head_x=None,
                      causal=False, dropout=lambda t: t, attention_dropout=lambda t: t):
    """``MultiheadAttention2.forward`` of LibertFan/MAN ``summarization/model/multihead_attention2.py`` (lines
    151-305), float64, batch-first; self-attention when ``memory`` is None (``in_proj``), else encoder-decoder
    attention (``q_proj`` / ``kv_proj`` of a :class:`~maskattn.CrossAttention`). ``build_mask`` (lines 112-149):
    ``M / max_s M`` (the maximum detached) clamped at 1e-10, then the log."""
    B, n, d = query.shape
    H = module.num_heads
    if memory is None:
        q, k, v = F.linear(query, module.in_proj.weight, module.in_proj.bias).chunk(3, -1)
    else:
        q = F.linear(query, module.q_proj.weight, module.q_proj.bias)
        k, v = F.linear(memory, module.kv_proj.weight, module.kv_proj.bias).chunk(2, -1)
    q = q * (d // H) ** -0.5
    m = k.shape[1]
    q, k, v = (t.reshape(B, -1, H, d // H).transpose(1, 2) for t in (q, k, v))
    scores = q @ k.transpose(-1, -2)
    if causal:  # buffered_future_mask: -inf above the diagonal (attn_mask)
        scores = scores + torch.triu(torch.full((n, m), float("-inf"), dtype=query.dtype), 1)
    if re_weight_m == 1:
        position_x = torch.cat([forward_x, torch.zeros(1, dtype=query.dtype), backward_x])
        max_len = forward_x.numel()
        indices = (torch.arange(max_len)[None] + torch.arange(0, max_len + 1).flip(0)[:, None])[:m, :m]
        position = position_x[indices]
        gamma = position[None].repeat(H, 1, 1) + head_x[:, None, None]
        context_x = module.mask_query(query)[:, None]  # (B, 1, n, 1)
        log_weights = (context_x + gamma[None]).sigmoid()
        log_weights = log_weights.div(log_weights.max(-1, keepdim=True)[0].detach()).clamp(1e-10).log()
        scores = scores + log_weights
    if kpm is not None:
        scores = scores.masked_fill(kpm[:, None, None, :], float("-inf"))
    attn = attention_dropout(F.softmax(scores, -1)) @ v  # line 284
    attn = dropout(ACT[act](attn.transpose(1, 2).reshape(B, n, d)))  # lines 294-295
    return module.out_proj(attn)


def authors_summ_encoder_layer(layer, x, kpm, tables, dropout=lambda t: t):
    """``MANEncoderLayer.forward`` with ``mix=True`` (summarization/model/man.py lines 241-290): post-LN,
    GELU everywhere, dropout after every sublayer and inside the FFN."""
    dman, san, ffn = layer.sublayers
    norms = [r.norm for r in layer.residuals]
    x = norms[0](x + dropout(authors_mha2_summ(dman, x, None, kpm, act="gelu", re_weight_m=1, forward_x=tables[0],
                                               backward_x=tables[1], head_x=tables[2], dropout=dropout,
                                               attention_dropout=dropout)))
    # SAN's attention dropout runs inside SDPA (dropout_p), not through F.dropout: the test sets it to 0
    x = norms[1](x + dropout(authors_mha2_summ(san, x, None, kpm, act="gelu", re_weight_m=0, dropout=dropout)))
    return norms[2](x + dropout(ffn.fc2(dropout(ACT["gelu"](ffn.fc1(x))))))


def summarization_layer(max_len=12, **overrides):
    layer = MANLayer.authors_config("summarization", d_model=16, num_heads=4, ffn_dim=24, **overrides)
    layer = randomise(layer).double()
    tables = authors_tables(max_len, 4)
    tables[2][1] = -30.0  # a head whose M sits below 1e-10 · max M for far keys: the floor is active
    dman_from_authors_tables(layer.sublayers[0], *tables)
    return layer, tables


def _summ_dman(**extra):
    return {"activation": "gelu", "activation_dropout": 0.1, "self_distance": "zero", "mask_floor": 1e-10,
            "mask_floor_mode": "row_max", "max_distance": 12, **extra}


@pytest.mark.parametrize("backend", ["reference", "sdpa", "flex"])
def test_man_summarization_config_is_the_authors_encoder_layer(backend):
    layer, tables = summarization_layer(dman_options=_summ_dman(backend=backend))
    full = MANLayer.authors_config("summarization")
    assert (full.d_model, full.sublayers[0].num_heads, full.sublayers[2].fc1.out_features) == (768, 12, 1536)
    assert (full.sublayers[0].mask_floor_mode, full.sublayers[0].max_distance, full.residuals[0].norm_position) == \
        ("row_max", 512, "post")
    x, kpm = batch(n=9)
    with torch.no_grad():
        expected = authors_summ_encoder_layer(layer.eval(), x, kpm, tables).masked_fill(kpm[..., None], 0)
        torch.testing.assert_close(layer(x, kpm), expected, rtol=1e-10, atol=1e-10)
        absolute = summarization_layer(dman_options=_summ_dman(mask_floor_mode="absolute"))[0].eval()
        absolute.load_state_dict(layer.state_dict())
        assert (absolute(x, kpm) - expected).abs().max() > 1e-3  # the row normalisation matters here


def test_man_summarization_dropout_paths_are_the_authors(monkeypatch):
    """Training with a dropout that doubles its input: residual, FFN-inner, attention-weight (DMAN's reference
    path) and the activation dropout after ``F`` sit where the authors' are."""
    layer, tables = summarization_layer(dman_options=_summ_dman(backend="reference"), attention_dropout=0.0)
    x, kpm = batch(n=9)
    with torch.no_grad():
        expected = authors_summ_encoder_layer(layer, x, kpm, tables, dropout=lambda t: 2 * t)
    layer.train()
    layer.sublayers[0].dropout = 0.1  # DMAN's reference path drops its probabilities through F.dropout
    monkeypatch.setattr(F, "dropout", fake_dropout)
    with torch.no_grad():
        torch.testing.assert_close(layer(x, kpm), expected.masked_fill(kpm[..., None], 0), rtol=1e-10, atol=1e-10)
    cfg = MANLayer.authors_config("summarization")
    assert [cfg.sublayers[i].activation_dropout for i in (0, 1)] == [0.1, 0.1] and cfg.sublayers[1].dropout == 0.1


def test_row_max_floor_gradients_are_the_authors():
    """Autograd through the transcription (``max`` detached, clamp) and through DMAN (reference, sdpa) agree."""
    tables = authors_tables(12, 4)
    tables[2][1] = -30.0
    x, kpm = batch(n=9)
    grads = {}
    for backend in ("reference", "sdpa"):
        m = randomise(maskattn.DynamicMaskAttention(16, 4, **_summ_dman(backend=backend))).double().eval()
        dman_from_authors_tables(m, *tables)
        m(x, kpm).masked_fill(kpm[..., None], 0).square().sum().backward()
        grads[backend] = {name: p.grad.clone() for name, p in m.named_parameters()}
    m.zero_grad()
    forward_x, backward_x, head_x = (t.clone().requires_grad_() for t in tables)
    out = authors_mha2_summ(m, x, None, kpm, act="gelu", re_weight_m=1, forward_x=forward_x, backward_x=backward_x,
                            head_x=head_x)
    out.masked_fill(kpm[..., None], 0).square().sum().backward()
    expected = {name: p.grad for name, p in m.named_parameters() if p.grad is not None}
    for got in grads.values():
        for name in ("in_proj.weight", "out_proj.weight", "mask_query.weight"):
            torch.testing.assert_close(got[name], expected[name], rtol=1e-9, atol=1e-10)
        torch.testing.assert_close(got["head_bias"], head_x.grad, rtol=1e-9, atol=1e-10)
        authors_p = torch.cat([forward_x.grad, torch.zeros(1, dtype=torch.float64), backward_x.grad]).flip(0)
        torch.testing.assert_close(got["distance_bias"], authors_p, rtol=1e-9, atol=1e-10)


def test_row_max_floor_decoding_steps_are_the_authors_incremental_rows():
    """Causal DMAN with the row-normalised floor: a decoding step's row takes the maximum over the keys so far, as
    the authors' incremental ``build_mask`` (its last row, lines 146-149); the full forward takes it over every key
    of the call, as their training pass (the future keys included)."""
    tables = authors_tables(12, 4)
    tables[2][1] = -30.0
    m = randomise(maskattn.DynamicMaskAttention(16, 4, causal=True, **_summ_dman())).double().eval()
    dman_from_authors_tables(m, *tables)
    x, _ = batch(n=8)
    with torch.no_grad():
        full = m(x)
        torch.testing.assert_close(full, authors_mha2_summ(m, x, None, None, act="gelu", re_weight_m=1, forward_x=tables[0],
                                                           backward_x=tables[1], head_x=tables[2], causal=True),
                                   rtol=1e-10, atol=1e-10)
        cache = m.init_cache()
        for t in range(8):
            out, cache = m.step(x[:, t:t + 1], cache)
            prefix = authors_mha2_summ(m, x[:, :t + 1], None, None, act="gelu", re_weight_m=1,
                                       forward_x=tables[0], backward_x=tables[1], head_x=tables[2], causal=True)
            torch.testing.assert_close(out[:, 0], prefix[:, -1], rtol=1e-10, atol=1e-10)


def test_man_summarization_decoder_layer_is_the_authors():
    """``MANDecoderLayer`` (summarization/model/man.py lines 370-465): causal DMAN → causal SAN → encoder-decoder
    attention → FFN, post-LN, GELU in every attention (the ReLU / GELU of the decoder attentions, issue item 5)."""
    layer = MANLayer.authors_config("summarization_decoder", d_model=16, num_heads=4, ffn_dim=24,
                                    dman_options=_summ_dman())
    layer = randomise(layer).double().eval()
    assert layer.order == ("dman", "man_san", "cross", "ffn")
    tables = authors_tables(12, 4)
    dman_from_authors_tables(layer.sublayers[0], *tables)
    dman, san, cross, ffn = layer.sublayers
    norms = [r.norm for r in layer.residuals]
    x, _ = batch(n=6)
    memory, memory_padding = batch(n=5, seed=3)
    with torch.no_grad():
        h = norms[0](x + authors_mha2_summ(dman, x, None, None, act="gelu", re_weight_m=1, forward_x=tables[0],
                                           backward_x=tables[1], head_x=tables[2], causal=True))
        h = norms[1](h + authors_mha2_summ(san, h, None, None, act="gelu", re_weight_m=0, causal=True))
        h = norms[2](h + authors_mha2_summ(cross, h, memory, memory_padding, act="gelu", re_weight_m=0))
        expected = norms[3](h + ffn.fc2(ACT["gelu"](ffn.fc1(h))))
        torch.testing.assert_close(layer(x, memory=memory, memory_padding=memory_padding), expected, rtol=1e-10,
                                   atol=1e-10)


def test_man_decoder_layer_with_relu_san_and_cross_decodes_incrementally():
    """``MANLayer(causal=True, san_options=…)`` (refused before) and an encoder-decoder attention with ReLU: the
    translation decoder's attentions; step by step equals the full forward."""
    layer = MANLayer(16, 4, causal=True, dman_options={"activation": "relu"}, san_options={"activation": "relu"},
                     cross_options={"activation": "relu"}).eval()
    assert isinstance(layer.sublayers[1], FullMaskAttention) and layer.sublayers[2].activation == "relu"
    x, memory = torch.randn(2, 5, 16), torch.randn(2, 4, 16)
    with torch.no_grad():
        full = layer(x, memory=memory)
        cache, steps = layer.init_cache(memory), []
        for t in range(5):
            out, cache = layer.step(x[:, t:t + 1], cache)
            steps.append(out)
    torch.testing.assert_close(torch.cat(steps, 1), full, atol=1e-6, rtol=1e-6)


def test_row_max_floor_backends():
    """reference / sdpa / flex run it; triton declines it with a reason (the registry's)."""
    from maskattn import backends
    from maskattn.kernels.triton import runtime
    situation = backends.Situation("cuda", torch.bfloat16, row_floor=True)
    with runtime.not_interpreted():
        why = backends.reasons("dman", "triton", situation, installed=True)
        assert any("row-normalised mask floor" in reason for reason in why)
        assert not backends.reasons("dman", "triton", backends.Situation("cuda", torch.bfloat16), installed=True)
    assert not backends.reasons("dman", "sdpa", backends.Situation(row_floor=True))
    m = maskattn.DynamicMaskAttention(16, 4, mask_floor=1e-10, mask_floor_mode="row_max", backend="triton")
    with pytest.raises(maskattn.errors.BackendError, match="row-normalised"):
        with runtime.not_interpreted():
            backends.resolve("dman", "triton", backends.Situation("cuda", torch.float32, row_floor=True))
    assert m.mask_floor_mode == "row_max"


def test_new_options_compile_fullgraph():
    """``torch.compile(fullgraph=True)`` takes the new options on the default path."""
    x, kpm = batch(n=9)
    x = x.float()
    for module in (maskattn.MTSA.authors_config("nmt_setup1", d_model=16, num_heads=4),
                   maskattn.MTSA(16, 2, d_in=16, in_hidden=12, in_activation="swish", d_out=16, s2t_activation="selu",
                                 v_activation="gelu_tanh", out_activation="lrelu", out_bias=False),
                   maskattn.DynamicMaskAttention(16, 4, **_summ_dman()),
                   FullMaskAttention(16, 4, activation="gelu", activation_dropout=0.1)):
        module = module.eval()
        compiled = torch.compile(module, fullgraph=True, backend="aot_eager")
        with torch.no_grad():
            torch.testing.assert_close(compiled(x, kpm), module(x, kpm), rtol=1e-5, atol=1e-6)


def test_new_options_train_under_cpu_bf16_autocast():
    """Forward and backward of the new options under CPU bfloat16 autocast agree with float32 to a few bfloat16
    epsilons in relative norm (as tests/test_mixed_precision.py asks of every registered mechanism); the
    parameters stay float32."""
    x, kpm = batch(n=9)
    x = x.float()
    grad = torch.randn(x.shape, generator=torch.Generator().manual_seed(1))
    tol = 4 * torch.finfo(torch.bfloat16).eps
    for module in (maskattn.MTSA.authors_config("nmt_setup1", d_model=16, num_heads=4),
                   maskattn.MTSA(16, 2, d_in=16, in_hidden=12, in_activation="swish", d_out=16, s2t_activation="selu",
                                 v_activation="gelu_tanh", out_activation="lrelu", out_bias=False),
                   maskattn.DynamicMaskAttention(16, 4, **_summ_dman()),
                   FullMaskAttention(16, 4, activation="gelu")):
        module = module.eval()
        results = []
        for bf16 in (False, True):
            inputs = x.clone().requires_grad_()
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
                out = module(inputs, kpm)
            out.backward(grad)
            results.append((out.float(), inputs.grad))
        (out32, dx32), (out16, dx16) = results
        assert all(p.dtype == torch.float32 for p in module.parameters())
        assert torch.isfinite(out16).all() and torch.isfinite(dx16).all()
        assert (out16 - out32).norm() <= tol * out32.norm(), type(module).__name__
        assert (dx16 - dx32).norm() <= tol * dx32.norm(), type(module).__name__

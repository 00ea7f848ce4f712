"""MTSA, Fast-DiSA, DiSA and Source2Token modules: wiring against hand-written equations, options, maps."""


import pytest
import torch
import torch.nn.functional as F

import maskattn
from maskattn import masks as M

from test_tensorized import oracle


def padded_batch(B=2, n=7, d=16, dtype=torch.float64):
    x = torch.randn(B, n, d, dtype=dtype)
    kpm = torch.zeros(B, n, dtype=torch.bool)
    if B > 1:
        kpm[1, 4:] = True
    return x, kpm


def headwise(lin, x):
    return torch.matmul(x, lin.weight.unsqueeze(0)) + (lin.bias if lin.bias is not None else 0)


def test_mtsa_default_matches_equations():
    """Eq. 7–13 written out from the module's own weights."""
    m = maskattn.MTSA(16, 4).double()
    x, kpm = padded_batch()
    B, n, _ = x.shape
    H, dh = 4, 4
    v = (x @ m.v_proj.weight.T + m.v_proj.bias).view(B, n, H, dh).transpose(1, 2)  # Eq. 7
    q, k = (x @ lin.weight.T + lin.bias for lin in (m.q_proj, m.k_proj))
    q, k = (t.reshape(B, n, H, dh).transpose(1, 2) for t in (q, k))
    s = headwise(m.source2token.score, F.elu(headwise(m.source2token.hidden, k)))  # Eq. 9
    allowed = torch.cat([M.forward_mask().materialize(n).expand(B, 2, n, n),
                         M.backward_mask().materialize(n).expand(B, 2, n, n)], dim=1) & ~kpm[:, None, None, :]
    heads = oracle(q, k, v, s, allowed, "log_sigmoid")  # Eq. 10–12
    expected = heads.transpose(1, 2).reshape(B, n, 16) @ m.out_proj.weight.T + m.out_proj.bias  # Eq. 13
    expected = expected.masked_fill(kpm[..., None], 0)
    torch.testing.assert_close(m(x, kpm), expected)


def test_fast_disa_matches_equations():
    m = maskattn.FastDiSA(16, 2).double()
    x, kpm = padded_batch()
    B, n, _ = x.shape
    xl = (x @ m.head_proj.weight.T + m.head_proj.bias).view(B, n, 2, 8).transpose(1, 2)  # Eq. 6
    q, k = headwise(m.query, xl), headwise(m.key, xl)  # Eq. 1
    s = headwise(m.source2token.score, F.elu(headwise(m.source2token.hidden, xl)))  # Eq. 2
    allowed = torch.cat([M.forward_mask().materialize(n).expand(B, 1, n, n),
                         M.backward_mask().materialize(n).expand(B, 1, n, n)], dim=1) & ~kpm[:, None, None, :]
    expected = oracle(q, k, xl, s, allowed, "log_sigmoid").transpose(1, 2).reshape(B, n, 16)  # Eq. 3–5, concat
    expected = expected.masked_fill(kpm[..., None], 0)
    torch.testing.assert_close(m(x, kpm), expected)
    assert not hasattr(m, "out_proj")


def test_disa_matches_explicit_loops():
    m = maskattn.DiSA(4, 2).double()
    x = torch.randn(1, 4, 4, dtype=torch.float64)
    h = F.elu(x @ m.input_proj.weight.T + m.input_proj.bias).view(1, 4, 2, 2).transpose(1, 2)[0]  # (H, n, d_h)
    out = torch.zeros(2, 4, 2, dtype=torch.float64)
    for c in range(2):
        W1, W2, b = m.query_score.weight[c], m.key_score.weight[c], m.query_score.bias[c, 0]
        for i in range(4):
            keys = [j for j in range(4) if (j < i if c == 0 else j > i)]  # strict forward / backward
            if not keys:
                s_i = torch.zeros(2, dtype=torch.float64)
            else:
                f = torch.stack([5 * torch.tanh((h[c, i] @ W1 + b + h[c, j] @ W2) / 5) for j in keys])
                p = torch.softmax(f, dim=0)
                s_i = (p * h[c, keys]).sum(0)
            g = torch.sigmoid(h[c, i] @ m.fusion_gate.from_input.weight[c] + s_i @ m.fusion_gate.from_attention.weight[c]
                              + m.fusion_gate.from_attention.bias[c, 0])
            out[c, i] = g * h[c, i] + (1 - g) * s_i
    torch.testing.assert_close(m(x)[0], out.transpose(0, 1).reshape(4, 4))


def test_source2token_pooling():
    pool = maskattn.Source2Token(6).double()
    x, kpm = padded_batch(d=6)
    kpm[0] = True  # an all-padding sequence pools to zeros
    pooled, w = pool(x, kpm), pool.weights(x, kpm)
    assert pooled.shape == (2, 6) and w.shape == (2, 7, 6)
    assert (pooled[0] == 0).all() and (w[0] == 0).all()
    torch.testing.assert_close(w[1].sum(0), torch.ones(6, dtype=torch.float64))
    assert (w[1, 4:] == 0).all()
    scores = F.elu(x[1, :4] @ pool.hidden.weight.T + pool.hidden.bias) @ pool.score.weight.T + pool.score.bias
    torch.testing.assert_close(pooled[1], (torch.softmax(scores, 0) * x[1, :4]).sum(0))


OPTIONS = [
    {},
    {"strict_masks": True},
    {"fusion_gate": True},
    {"qk_input": "v"},
    {"s2t_input": "v", "s2t_activation": "relu"},
    {"out_proj": False},
    {"scale": "identity"},
    {"d_k": 3, "s2t_hidden": 7},
    {"head_masks": ["forward", "window:1", M.backward_mask(False), "full"]},
]


@pytest.mark.parametrize("options", OPTIONS, ids=lambda o: ",".join(o) or "default")
def test_mtsa_options_backend_parity_and_gradients(options):
    m = maskattn.MTSA(16, 4, **options).double()
    x, kpm = padded_batch()
    x.requires_grad_(True)
    fast = m(x, kpm)
    m.backend = "reference"
    torch.testing.assert_close(fast, m(x, kpm))
    fast.square().sum().backward()
    missing = [name for name, p in m.named_parameters() if p.grad is None or not torch.isfinite(p.grad).all()]
    assert not missing
    assert (fast[1, 4:] == 0).all()


def test_forward_heads_do_not_leak_through_the_module():
    m = maskattn.MTSA(16, 2, head_masks=["forward", "forward"]).double()
    x, _ = padded_batch(B=1)
    base = m(x)
    x2 = x.clone()
    x2[:, 4:] = torch.randn_like(x2[:, 4:])
    torch.testing.assert_close(m(x2)[:, :4], base[:, :4])


def test_default_mask_split_and_strict_first_token():
    m = maskattn.MTSA(16, 4, strict_masks=True, out_proj=False).double()
    x, _ = padded_batch(B=1)
    out = m(x).view(1, 7, 4, 4)
    assert (out[0, 0, :2] == 0).all()  # forward heads: the first token has no strictly-earlier key
    assert (out[0, -1, 2:] == 0).all()  # backward heads: the last token has no later key
    t2t = m.attention_maps(x).attention[0]
    assert (t2t[:2].triu(0) == 0).all() and (t2t[2:].tril(0) == 0).all()


def test_padding_appended_does_not_change_outputs():
    m = maskattn.MTSA(16, 4).double().eval()
    x, _ = padded_batch(B=1, n=5)
    longer = torch.cat([x, torch.randn(1, 3, 16, dtype=torch.float64)], dim=1)
    kpm = torch.tensor([[False] * 5 + [True] * 3])
    out = m(longer, kpm)
    torch.testing.assert_close(out[:, :5], m(x))
    assert (out[:, 5:] == 0).all()


def test_dropout_train_vs_eval():
    m = maskattn.MTSA(16, 4, dropout=0.3)
    x, kpm = padded_batch(dtype=torch.float32)
    m.train()
    a, b = m(x, kpm), m(x, kpm)
    assert not torch.allclose(a, b)
    m.eval()
    torch.testing.assert_close(m(x, kpm), m(x, kpm))


def test_attention_maps_are_the_ones_used():
    m = maskattn.MTSA(16, 4).double()
    x, kpm = padded_batch()
    out, maps = m(x, kpm), m.attention_maps(x, kpm)
    q, k, v, s2t = m.project(x)
    t2t, s = maps.attention, maps.source2token
    w = t2t[..., None] * s[:, :, None]
    p = torch.nan_to_num(w / w.sum(3, keepdim=True))
    heads = (p * v[:, :, None]).sum(3)  # (B, H, n, d_h)
    expected = heads.transpose(1, 2).reshape(2, 7, 16) @ m.out_proj.weight.T + m.out_proj.bias
    torch.testing.assert_close(out, expected.masked_fill(kpm[..., None], 0))


def test_registry_creation_and_errors():
    assert {"mtsa", "fast_disa", "disa", "mha"} <= set(maskattn.list_attentions())
    m = maskattn.create_attention("mtsa", 8, 2, strict_masks=True)
    assert isinstance(m, maskattn.MTSA)
    with pytest.raises(ValueError, match="registered: .*mtsa"):
        maskattn.create_attention("mtsa2", 8, 2)
    with pytest.raises(ValueError, match="valid options: .*head_masks"):
        maskattn.create_attention("mtsa", 8, 2, heads_masks=None)


@pytest.mark.parametrize("make, exc, pattern", [
    (lambda: maskattn.MTSA(16, 3), ValueError, "divisible"),
    (lambda: maskattn.MTSA(18, 3), ValueError, "num_heads must be even .* got 3"),
    (lambda: maskattn.MTSA(16, 4, head_masks=["forward"]), ValueError, "head_masks has 1 entries"),
    (lambda: maskattn.MTSA(16, 2, head_masks="forward"), TypeError, "one mask .* per head"),
    (lambda: maskattn.MTSA(16, 2, head_masks=["forward", "up"]), ValueError, "unknown mask name 'up'"),
    (lambda: maskattn.MTSA(16, 2, scale="tanh"), ValueError, "unknown scale"),
    (lambda: maskattn.MTSA(16, 2, backend="gpu"), ValueError, "unknown backend"),
    (lambda: maskattn.MTSA(16, 2, dropout=1.5), ValueError, "dropout"),
    (lambda: maskattn.MTSA(16, 2, s2t_activation="tanh"), ValueError, "s2t_activation"),
    (lambda: maskattn.MTSA(0, 2), ValueError, "d_model"),
    (lambda: maskattn.MTSA(16.0, 2), TypeError, "d_model"),
    (lambda: maskattn.DiSA(16, 2, backend="sdpa"), ValueError, "backend"),
])
def test_constructor_errors(make, exc, pattern):
    with pytest.raises(exc, match=pattern):
        make()


def test_forward_errors_name_the_argument():
    m = maskattn.MTSA(16, 2)
    with pytest.raises(ValueError, match=r"key_padding_mask has shape \(4, 10\) but input is \(4, 12, 16\)"):
        m(torch.randn(4, 12, 16), torch.zeros(4, 10, dtype=torch.bool))
    with pytest.raises(ValueError, match=r"x must have shape \(batch, seq_len, 16\), got \(4, 12, 15\)"):
        m(torch.randn(4, 12, 15))
    with pytest.raises(TypeError, match=r"key_padding_mask must have dtype torch.bool"):
        m(torch.randn(2, 3, 16), torch.zeros(2, 3))
    with pytest.raises(TypeError, match="floating-point"):
        m(torch.ones(2, 3, 16, dtype=torch.long))


def test_bfloat16_module_runs():
    m = maskattn.MTSA(16, 4).to(torch.bfloat16)
    x, kpm = padded_batch(dtype=torch.bfloat16)
    out = m(x, kpm)
    assert out.dtype == torch.bfloat16 and torch.isfinite(out).all()


@pytest.mark.parametrize("scale", ["log_sigmoid", "identity"])
@pytest.mark.parametrize("head_masks", [["window:2"] * 4, [M.forward_mask() & M.window(3)] * 4,
                                        [M.backward_mask() & M.window(1)] * 4])
def test_window_heads_take_the_banded_path(monkeypatch, scale, head_masks):
    """Window masks run on the O(n·window) local path (``auto`` picks it, ``banded`` names it): no n × n mask is
    ever materialised."""
    m = maskattn.MTSA(16, 4, head_masks=head_masks, scale=scale, backend="reference").double()
    x, kpm = padded_batch(n=12)
    expected = m(x, kpm)
    monkeypatch.setattr(M, "materialize", lambda *a, **k: pytest.fail("dense mask materialised"))
    for backend in ("auto", "banded"):
        m.backend = backend
        torch.testing.assert_close(m(x, kpm), expected)


def test_explicit_sdpa_is_honoured_for_window_heads(monkeypatch):
    """An explicit backend runs what it names: sdpa materialises the window and runs the dense kernel."""
    m = maskattn.MTSA(16, 4, head_masks=["window:2"] * 4, backend="sdpa").double()
    x, kpm = padded_batch(n=12)
    calls = []
    original = M.materialize
    monkeypatch.setattr(M, "materialize", lambda *a, **k: calls.append(1) or original(*a, **k))
    out = m(x, kpm)
    assert calls, "sdpa must run the dense path"
    m.backend = "reference"
    torch.testing.assert_close(out, m(x, kpm))


@pytest.mark.parametrize("causal", [False, True])
def test_sman_fixed_radius_uses_the_banded_path(causal):
    sman = maskattn.StaticMaskAttention(16, 4, radius=2.5, causal=causal).double()
    x, kpm = padded_batch(n=11)
    banded = sman(x, kpm)  # backend "auto": the banded local kernel
    sman.backend = "sdpa"  # dense masked attention
    torch.testing.assert_close(banded, sman(x, kpm))

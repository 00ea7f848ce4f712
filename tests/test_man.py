"""DMAN and SMAN modules (MAN Eq. 11, 12): backends, gradients, padding, causality, caching, errors."""

from __future__ import annotations

import math

import pytest
import torch

import maskattn
from maskattn import AttentionCache, DynamicMaskAttention, StaticMaskAttention, create_attention
from maskattn.functional import dynamic_mask_attention_reference, mask_attention_reference

D_MODEL, HEADS = 16, 4
MAN_ATTENTIONS = {
    "dman": dict(max_distance=3),
    "dman_relu": dict(max_distance=3, activation="relu"),
    "sman": dict(radius=2),
    "sman_sqrt": dict(radius="sqrt"),
}
#: the backends a mechanism declares that refuse these options: sman's radius "sqrt" grows with the length, so its mask
#: is no fixed band, which the band kernels need (test_band_backends_refuse_a_growing_radius)
REFUSED = {("sman_sqrt", "triton"), ("sman_sqrt", "banded")}
#: every other backend of the registry but the reference, each compared with the reference (triton under its
#: interpreter on the CPU)
BACKEND_CASES = [(name, backend) for name in MAN_ATTENTIONS
                 for backend in maskattn.attention_info(name.split("_")[0]).backends
                 if backend != "reference" and (name, backend) not in REFUSED]


def build(name, **extra):
    options = {**MAN_ATTENTIONS[name], **extra}
    module = create_attention(name.split("_")[0], D_MODEL, HEADS, **options)
    with torch.no_grad():  # non-trivial P and U, so tests see their effect
        for p_name, p in module.named_parameters():
            if p_name in ("distance_bias", "head_bias"):
                p.normal_()
    return module


def inputs(B=2, n=7, seed=0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(B, n, D_MODEL, generator=g, dtype=dtype)
    kpm = torch.zeros(B, n, dtype=torch.bool)
    kpm[-1, n - 2:] = True
    return x, kpm


def test_registered():
    assert {"dman", "sman"} <= set(maskattn.list_attentions())
    assert isinstance(create_attention("dman", 8, 2), DynamicMaskAttention)
    assert isinstance(create_attention("sman", 8, 2), StaticMaskAttention)


@pytest.mark.parametrize("name, backend", BACKEND_CASES)
@pytest.mark.parametrize("causal", [False, True])
def test_backends_match_reference(name, backend, causal):
    module = build(name, causal=causal, backend="reference").eval()
    x, kpm = inputs()
    expected = module(x, key_padding_mask=kpm)
    module.backend = backend
    with torch.no_grad():  # flex on CPU is inference only
        out = module(x, key_padding_mask=kpm)
    torch.testing.assert_close(out, expected, atol=2e-5, rtol=1e-4)


@pytest.mark.parametrize("name, backend", sorted(REFUSED))
def test_band_backends_refuse_a_growing_radius(name, backend):
    module = build(name, backend=backend).eval()
    refusal = f"backend={backend!r} cannot run this local call: it needs a mask that is a fixed band"
    with torch.no_grad(), pytest.raises(maskattn.errors.BackendError, match=refusal):
        module(*inputs()[:1])


def test_dman_module_matches_eq12_oracle_float64():
    module = build("dman").double()
    x, kpm = inputs(dtype=torch.float64)
    out, maps = module(x, key_padding_mask=kpm), module.attention_maps(x, key_padding_mask=kpm)
    q, k, v = module.project(x)
    a = module.mask_query(x).squeeze(-1)
    ref, probs, mask = dynamic_mask_attention_reference(q, k, v, a, module.distance_bias, module.head_bias,
                                                        key_padding_mask=kpm)
    torch.testing.assert_close(maps.attention, probs)
    torch.testing.assert_close(maps.mask, mask)
    merged = ref.transpose(1, 2).reshape(2, 7, D_MODEL)  # (B, H, n, d_h) -> (B, n, d)
    expected = module.out_proj(merged).masked_fill(kpm[..., None], 0.0)
    torch.testing.assert_close(out, expected)
    torch.testing.assert_close(module(x, key_padding_mask=kpm), out)  # sdpa path, float64


def test_sman_matches_eq11_oracle():
    module = build("sman").double()
    x, _ = inputs(dtype=torch.float64)
    out, maps = module(x), module.attention_maps(x)
    sm = torch.tensor([[float(abs(t - s) <= 2) for s in range(7)] for t in range(7)], dtype=torch.float64)
    assert torch.equal(maps.mask[0, 0], sm)
    q, k, v = module.project(x)
    ref = mask_attention_reference(q, k, v, sm)
    torch.testing.assert_close(out, module.out_proj(ref.transpose(1, 2).reshape(2, 7, D_MODEL)))


def test_sman_sqrt_radius_uses_each_sequences_own_length():
    module = build("sman_sqrt")
    x = torch.randn(2, 10, D_MODEL)
    kpm = torch.zeros(2, 10, dtype=torch.bool)
    kpm[1, 4:] = True  # L = 10 → b = 1.58 ; L = 4 → b = 1
    sm = module.static_mask(x, key_padding_mask=kpm)
    assert sm.shape == (2, 1, 10, 10)
    for b, (L, radius) in enumerate([(10, math.sqrt(10) / 2), (4, 1.0)]):
        expected = torch.tensor([[float(abs(t - s) <= radius and s < L) for s in range(10)] for t in range(10)])
        assert torch.equal(sm[b, 0], expected)


@pytest.mark.parametrize("name", MAN_ATTENTIONS)
def test_every_parameter_gets_a_gradient(name):
    module = build(name)
    x, kpm = inputs()
    x.requires_grad_()
    module(x, key_padding_mask=kpm).square().sum().backward()
    for p_name, p in module.named_parameters():
        assert p.grad is not None and p.grad.abs().sum() > 0, p_name
    assert torch.isfinite(x.grad).all()


def test_dman_parameter_gradients_sdpa_equal_reference():
    """Gradients that reach W, P and U through the chunked sdpa kernel equal the materialised ones."""
    module = build("dman", causal=True)
    x, kpm = inputs(n=12)
    grads = {}
    for backend in ("sdpa", "reference"):
        module.backend = backend
        module.zero_grad()
        module(x, key_padding_mask=kpm).sin().sum().backward()
        grads[backend] = {n: p.grad.clone() for n, p in module.named_parameters()}
    for p_name in grads["sdpa"]:
        torch.testing.assert_close(grads["sdpa"][p_name], grads["reference"][p_name], atol=2e-5, rtol=1e-4)


@pytest.mark.parametrize("name", MAN_ATTENTIONS)
def test_gradcheck_module(name):
    module = build(name, causal=name.startswith("dman")).double()
    x, kpm = inputs(B=2, n=4, dtype=torch.float64)
    x.requires_grad_()
    assert torch.autograd.gradcheck(lambda t: module(t, key_padding_mask=kpm), (x,), fast_mode=True)


@pytest.mark.parametrize("name", ["dman", "dman_relu", "sman"])
@pytest.mark.parametrize("causal", [False, True])
def test_padding_invariance(name, causal):
    """Outputs at real positions do not change when padding content changes or more padding is appended."""
    module = build(name, causal=causal).eval()
    x, kpm = inputs(B=2, n=7)
    out = module(x, key_padding_mask=kpm)
    assert out[1, 5:].abs().max() == 0
    x2 = x.clone()
    x2[1, 5:] = 100 * torch.randn(2, D_MODEL)
    torch.testing.assert_close(module(x2, key_padding_mask=kpm)[1, :5], out[1, :5])
    longer = torch.cat([x, torch.randn(2, 3, D_MODEL)], dim=1)
    kpm_longer = torch.cat([kpm, torch.ones(2, 3, dtype=torch.bool)], dim=1)
    torch.testing.assert_close(module(longer, key_padding_mask=kpm_longer)[:, :7], out, atol=1e-6, rtol=1e-5)


def test_sman_sqrt_padding_invariance():
    module = build("sman_sqrt").eval()
    x = torch.randn(1, 9, D_MODEL)
    alone = module(x)
    padded = torch.cat([x, torch.randn(1, 7, D_MODEL)], dim=1)
    kpm = torch.zeros(1, 16, dtype=torch.bool)
    kpm[0, 9:] = True
    torch.testing.assert_close(module(padded, key_padding_mask=kpm)[:, :9], alone, atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("name", ["dman", "sman"])
@pytest.mark.parametrize("backend", ["reference", "sdpa"])
def test_causal_no_leakage(name, backend):
    module = build(name, causal=True, backend=backend)
    x, _ = inputs(B=1, n=8)
    x.requires_grad_()
    out = module(x)
    out[0, 3].sum().backward()
    assert x.grad[0, 4:].abs().max() == 0 and x.grad[0, :4].abs().sum() > 0
    x2 = x.detach().clone()
    x2[0, 5:] = torch.randn(3, D_MODEL)
    torch.testing.assert_close(module(x2)[0, :5], out[0, :5].detach())


@pytest.mark.parametrize("name", MAN_ATTENTIONS)
@pytest.mark.parametrize("backend", ["reference", "sdpa"])
def test_fully_padded_rows_no_nan(name, backend):
    module = build(name, backend=backend)
    x, _ = inputs()
    x.requires_grad_()
    kpm = torch.zeros(2, 7, dtype=torch.bool)
    kpm[0] = True
    out = module(x, key_padding_mask=kpm)
    assert torch.isfinite(out).all() and out[0].abs().max() == 0
    out.sum().backward()
    assert torch.isfinite(x.grad).all()
    assert all(torch.isfinite(p.grad).all() for p in module.parameters() if p.grad is not None)


def test_dynamic_mask_inspection():
    module = build("dman")
    x, kpm = inputs()
    m = module.dynamic_mask(x, key_padding_mask=kpm)
    assert m.shape == (2, HEADS, 7, 7)
    assert ((m >= 0) & (m <= 1)).all() and m[1, :, :, 5:].abs().max() == 0
    _, maps = module(x, key_padding_mask=kpm), module.attention_maps(x, key_padding_mask=kpm)
    torch.testing.assert_close(maps.mask, m)
    # Eq. 12 entrywise: sigmoid(x_t W + P[t − s] + U_h), clipped at |t − s| > max_distance = 3
    a = module.mask_query(x).squeeze(-1)
    t, s, h = 6, 0, 2
    expected = torch.sigmoid(a[0, t] + module.distance_bias[3 + 3] + module.head_bias[h])
    torch.testing.assert_close(m[0, h, t, s], expected)


def test_sequences_longer_than_the_table():
    module = build("dman", max_distance=2)
    x = torch.randn(1, 40, D_MODEL)
    out = module(x)
    assert out.shape == (1, 40, D_MODEL) and torch.isfinite(out).all()
    m = module.dynamic_mask(x)
    # every |t − s| >= 2 on one side shares P[±2]: the mask depends only on t there
    torch.testing.assert_close(m[0, :, 30, :28], m[0, :, 30, :1].expand(-1, 28))


def test_relu_option_applies_f_before_the_output_projection():
    """Eq. 5 with F = ReLU (authors' code): out_proj sees relu(concatenated heads)."""
    plain, relu = build("dman"), build("dman_relu")
    relu.load_state_dict(plain.state_dict())
    seen = {}
    for name, module in (("plain", plain), ("relu", relu)):
        module.out_proj.register_forward_pre_hook(lambda m, args, name=name: seen.__setitem__(name, args[0]))
    x, _ = inputs()
    out = relu(x)
    plain(x)
    assert (seen["plain"] < 0).any()
    torch.testing.assert_close(seen["relu"], torch.relu(seen["plain"]))
    torch.testing.assert_close(out, relu.out_proj(torch.relu(seen["plain"])))


# --------------------------------------------------------------------------------------------------
# incremental decoding
# --------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["dman", "dman_relu", "sman"])
@pytest.mark.parametrize("backend", ["reference", "sdpa", "flex"])
def test_incremental_decoding_equals_full_causal(name, backend):
    module = build(name, causal=True).eval()
    x, _ = inputs(B=2, n=9)
    full = module(x)
    module.backend = backend
    cache, steps = AttentionCache(), []
    with torch.no_grad():
        for t in range(9):
            out, cache = module.step(x[:, t:t + 1], cache)
            steps.append(out)
        assert len(cache) == 9 and cache.key.shape == (2, HEADS, 9, D_MODEL // HEADS)
        torch.testing.assert_close(torch.cat(steps, 1), full.detach(), atol=1e-5, rtol=1e-5)
        # chunks of several positions at once; the maps of the causal sequence cover every key decoded so far
        out_a, cache2 = module.step(x[:, :4], module.init_cache())
        out_b, cache2 = module.step(x[:, 4:], cache2)
        torch.testing.assert_close(torch.cat([out_a, out_b], 1), full.detach(), atol=1e-5, rtol=1e-5)
        maps = module.attention_maps(x)
        assert maps.attention[:, :, 4:].shape == (2, HEADS, 5, 9)
        assert (maps.attention[:, :, 4:, 5:].triu(1) == 0).all()  # causal: query t puts no weight on s > t


def test_incremental_decoding_with_padding_and_gradients():
    module = build("dman", causal=True)
    x, kpm = inputs(B=2, n=6)
    full = module(x, key_padding_mask=kpm)
    cache, steps = AttentionCache(), []
    for t in range(6):
        out, cache = module.step(x[:, t:t + 1], cache, key_padding_mask=kpm[:, t:t + 1])
        steps.append(out)
    stepped = torch.cat(steps, 1)
    torch.testing.assert_close(stepped, full, atol=1e-5, rtol=1e-5)
    stepped.sum().backward()  # the cached path is differentiable
    assert module.distance_bias.grad is not None


def test_cache_reorder_follows_beams():
    module = build("dman", causal=True).eval()
    x, _ = inputs(B=2, n=5)
    with torch.no_grad():
        _, cache = module.step(x[:, :3], AttentionCache())
        index = torch.tensor([1, 1, 0])
        beams = cache.reorder(index)
        assert beams.key.shape[0] == 3 and len(beams) == 3
        nxt = x[index, 3:4]
        out, _ = module.step(nxt, beams)
        full = module(x[index, :4])
        torch.testing.assert_close(out[:, 0], full[:, 3], atol=1e-5, rtol=1e-5)
    assert AttentionCache().reorder(index).key is None
    with pytest.raises(TypeError, match="index must be a 1-D integer tensor"):
        cache.reorder(torch.tensor([0.0]))


def test_cache_errors():
    x, _ = inputs(B=2, n=3)
    with pytest.raises(ValueError, match="needs a causal DynamicMaskAttention"):
        build("dman").step(x, AttentionCache())
    causal = build("dman", causal=True)
    _, cache = causal.step(x, AttentionCache())
    with pytest.raises(ValueError, match="cache holds batch size 2 but the input has batch size 1"):
        causal.step(x[:1], cache)
    with pytest.raises(TypeError, match="cache must be a maskattn.AttentionCache"):
        causal.step(x, {})
    with pytest.raises(ValueError, match="radius='sqrt'"):
        build("sman_sqrt", causal=True).step(x, AttentionCache())


# --------------------------------------------------------------------------------------------------
# bad input
# --------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("cls, options, exc, words", [
    (DynamicMaskAttention, dict(max_distance=0), ValueError, ["max_distance", ">= 1", "0"]),
    (DynamicMaskAttention, dict(max_distance=2.5), TypeError, ["max_distance", "2.5"]),
    (DynamicMaskAttention, dict(activation="tanh"), ValueError, ["activation", "'tanh'", "relu", "gelu"]),
    (DynamicMaskAttention, dict(backend="xla"), ValueError, ["backend", "'xla'", "'sdpa'"]),
    (DynamicMaskAttention, dict(causal=1), TypeError, ["causal", "bool"]),
    (StaticMaskAttention, dict(radius=-1), ValueError, ["radius", ">= 0", "-1"]),
    (StaticMaskAttention, dict(radius="log"), ValueError, ["radius", "'log'", "'sqrt'"]),
    (StaticMaskAttention, dict(radius=True), TypeError, ["radius", "bool"]),
])
def test_bad_options(cls, options, exc, words):
    with pytest.raises(exc) as err:
        cls(D_MODEL, HEADS, **options)
    for w in words:
        assert w in str(err.value)


def test_bad_forward_inputs():
    module = build("dman")
    with pytest.raises(ValueError, match="must have shape \\(batch, seq_len, 16\\)"):
        module(torch.randn(2, 5, 8))
    with pytest.raises(ValueError, match="key_padding_mask has shape \\(2, 4\\)"):
        module(torch.randn(2, 5, D_MODEL), key_padding_mask=torch.zeros(2, 4, dtype=torch.bool))
    with pytest.raises(ValueError, match="unknown option"):
        create_attention("dman", D_MODEL, HEADS, radius=3)
    module.backend = "flex"
    with pytest.raises(ValueError, match="backward only on CUDA"):
        module(torch.randn(2, 5, D_MODEL))


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["dman", "sman"])
def test_gpu_flex_training_matches_sdpa(name):
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    module = build(name, causal=True).cuda()
    x, kpm = inputs(n=130)
    x, kpm = x.cuda().requires_grad_(), kpm.cuda()
    grads = {}
    for backend in ("flex", "sdpa"):
        module.backend = backend
        module.zero_grad()
        x.grad = None
        out = module(x, key_padding_mask=kpm)
        out.sin().sum().backward()
        grads[backend] = [out.detach(), x.grad.clone()] + [p.grad.clone() for p in module.parameters()]
    for a, b in zip(grads["flex"], grads["sdpa"]):
        torch.testing.assert_close(a, b, atol=2e-3, rtol=2e-3)


# --------------------------------------------------------------------------------------------------
# localness analysis (Eq. 13, Table 5)
# --------------------------------------------------------------------------------------------------

def test_localness_hand_made_maps():
    from maskattn.analysis import localness, localness_per_sequence

    eye, uniform = torch.eye(4), torch.full((4, 4), 0.25)
    assert localness(eye, 0) == 1.0
    # uniform rows: |k − j| <= 1 holds 2, 3, 3, 2 keys out of 4 → (0.5 + 0.75 + 0.75 + 0.5) / 4
    assert localness(uniform, 1) == 0.625
    assert localness(uniform, 3) == 1.0
    # two heads are averaged first: s̄ = (I + U) / 2
    heads = torch.stack([eye, uniform])[None]  # (1, 2, 4, 4)
    assert localness(heads, 0) == pytest.approx(0.625)
    assert localness(heads, 1) == pytest.approx(0.8125)
    # a data set: each sentence counts once (1/|D| Σ_i 1/T_i Σ_j …), whatever its length
    short = torch.full((2, 2), 0.5)  # T = 2: everything within w = 1
    assert localness([uniform, short], 1) == pytest.approx((0.625 + 1.0) / 2)
    # the same sentences batched with padding: padded queries do not count, T_i is the real length
    padded = torch.zeros(2, 4, 4)
    padded[0], padded[1, :2, :2] = uniform, short
    padded[1, 2:] = 0.25  # whatever padded queries hold is ignored
    kpm = torch.tensor([[False] * 4, [False, False, True, True]])
    torch.testing.assert_close(localness_per_sequence(padded, 1, key_padding_mask=kpm), torch.tensor([0.625, 1.0]))
    assert localness(padded, 1, key_padding_mask=kpm) == pytest.approx(0.8125)


def test_localness_of_dman_maps_and_errors():
    from maskattn.analysis import localness

    module = build("dman")
    with torch.no_grad():
        module.distance_bias.copy_(torch.tensor([-9.0, -9.0, -9.0, 9.0, -9.0, -9.0, -9.0]))  # keep t = s only
    x, kpm = inputs()
    with torch.no_grad():
        _, maps = module(x, key_padding_mask=kpm), module.attention_maps(x, key_padding_mask=kpm)
    assert localness(maps.attention, 0, key_padding_mask=kpm) > 0.95
    assert localness(maps.attention, 6, key_padding_mask=kpm) == pytest.approx(1.0)
    with pytest.raises(ValueError, match="window must be >= 0, got -1"):
        localness(maps.attention, -1)
    with pytest.raises(TypeError, match="window must be an int"):
        localness(maps.attention, 1.5)
    with pytest.raises(ValueError, match="square"):
        localness(torch.rand(2, 3, 4), 1)
    with pytest.raises(ValueError, match="key_padding_mask has shape"):
        localness(maps.attention, 1, key_padding_mask=kpm[:, :3])

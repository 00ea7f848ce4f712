"""Every registered attention mechanism × every backend it declares: the contract of the registry.

A mechanism is covered here the moment it is registered.
"""

import pytest
import torch

import maskattn
from maskattn import backends

D_MODEL, HEADS = 16, 4


def compared_backends(name):
    """The backends of ``name`` that the reference is compared with: each one it declares but the reference, and
    ``auto`` where there is another (the test checks that ``auto`` ran one of them)."""
    others = tuple(backend for backend in maskattn.attention_info(name).backends if backend != "reference")
    return ("auto",) + others if others else ()


CASES = [(name, backend) for name in maskattn.list_attentions() for backend in compared_backends(name)]
#: options a mechanism needs for a backend to apply: the band kernel of the tensorized family runs window heads
BACKEND_OPTIONS = {("tensorized", "banded"): {"head_masks": ["window:2"] * HEADS}}


def build(name, **options):
    torch.manual_seed(0)
    return maskattn.create_attention(name, D_MODEL, HEADS, **options).double()


def batch(B=2, n=9):
    x = torch.randn(B, n, D_MODEL, dtype=torch.float64)
    kpm = torch.zeros(B, n, dtype=torch.bool)
    if B > 1:
        kpm[1, 6:] = True
    return x, kpm


def call(module, backend, *args, **kw):
    if backend == "flex":  # CPU FlexAttention is inference-only
        with torch.no_grad():
            return module(*args, **kw)
    return module(*args, **kw)


def test_registry_is_populated():
    assert {"mha", "mtsa", "fast_disa", "disa"} <= set(maskattn.list_attentions())


@pytest.mark.parametrize("name, backend", CASES)
def test_backend_matches_reference(name, backend, monkeypatch):
    x, kpm = batch()
    options = BACKEND_OPTIONS.get((maskattn.attention_info(name).family, backend), {})
    reference = build(name, backend="reference", **options).eval()
    module = build(name, backend=backend, **options).eval()
    module.load_state_dict(reference.state_dict())
    chosen, resolve = [], backends.resolve
    monkeypatch.setattr(backends, "resolve", lambda *args: chosen.append(resolve(*args)) or chosen[-1])
    out = call(module, backend, x, kpm)
    monkeypatch.undo()
    assert chosen and "reference" not in chosen, chosen  # what ran is not what it is compared with
    assert out.shape == x.shape and torch.isfinite(out).all()
    torch.testing.assert_close(out, reference(x, kpm), atol=1e-9, rtol=1e-9)
    assert (out[1, 6:] == 0).all()


@pytest.mark.parametrize("name", maskattn.list_attentions())
def test_every_parameter_gets_a_gradient(name):
    module = build(name).train()
    x, kpm = batch()
    module(x, kpm).square().sum().backward()
    missing = [p for p, t in module.named_parameters() if t.grad is None or not torch.isfinite(t.grad).all()]
    assert not missing, f"{name}: no finite gradient for {missing}"


@pytest.mark.parametrize("name", maskattn.list_attentions())
def test_padding_invariance(name):
    module = build(name).eval()
    x, _ = batch(B=1, n=6)
    extra = torch.randn(1, 4, D_MODEL, dtype=torch.float64)
    kpm = torch.tensor([[False] * 6 + [True] * 4])
    padded = module(torch.cat([x, extra], dim=1), kpm)
    torch.testing.assert_close(padded[:, :6], module(x))
    assert (padded[:, 6:] == 0).all()


@pytest.mark.parametrize("name", maskattn.list_attentions())
def test_attention_maps(name):
    module = build(name).eval()
    x, kpm = batch()
    out = module(x, kpm)
    maps = module.attention_maps(x, kpm)
    assert isinstance(maps, maskattn.AttentionMaps) and maps.attention.shape[:3] == (2, HEADS, x.shape[1])
    torch.testing.assert_close(out, module(x, kpm))  # asking for maps changes nothing
    for key, value in maps.items():
        assert torch.isfinite(value).all(), key


@pytest.mark.parametrize("name", maskattn.list_attentions())
def test_all_padding_and_single_token(name):
    module = build(name).eval()
    x = torch.randn(2, 1, D_MODEL, dtype=torch.float64)
    out = module(x, torch.tensor([[True], [False]]))
    assert torch.isfinite(out).all() and (out[0] == 0).all()


@pytest.mark.parametrize("name", maskattn.list_attentions())
def test_bad_input_is_reported(name):
    module = build(name)
    with pytest.raises(ValueError, match="key_padding_mask has shape"):
        module(torch.randn(2, 5, D_MODEL, dtype=torch.float64), torch.zeros(2, 4, dtype=torch.bool))
    with pytest.raises(ValueError, match=r"shape \(batch, seq_len, 16\)"):
        module(torch.randn(2, 5, D_MODEL + 1, dtype=torch.float64))
    with pytest.raises(ValueError, match="unknown option"):
        maskattn.create_attention(name, D_MODEL, HEADS, not_an_option=1)


@pytest.mark.parametrize("name", maskattn.list_attentions())
def test_an_input_of_another_dtype_than_the_parameters_is_named(name):
    """A bfloat16 input to a float32 module: one TypeError naming both dtypes and the two ways out, not PyTorch's
    matmul error from inside (issue 42); under autocast the same call is what the user meant and runs."""
    module = maskattn.create_attention(name, D_MODEL, HEADS)
    x = torch.randn(2, 5, D_MODEL, dtype=torch.bfloat16)
    with pytest.raises(TypeError, match=r"x has dtype torch.bfloat16 but the \w+'s parameters are torch.float32; "
                                        r"cast one to the other .* or run under torch.autocast\('cpu'\)"):
        module(x)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert module(x).shape == x.shape

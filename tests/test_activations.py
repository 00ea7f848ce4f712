"""The one activation table (maskattn.functional.activations): its functions, its checks, and every activation
option of the library accepting every name of it (docs/fidelity.md, issue 26 item 2)."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

import maskattn
from maskattn.attention.cross import CrossAttention
from maskattn.attention.man import FullMaskAttention
from maskattn.attention.source2token import Source2Token
from maskattn.functional.activations import ACTIVATIONS, activation, check_activation
from maskattn.layers import FeedForward

#: the authors' definitions (taoshen58/mtsa MTSA_API/mtsa.py, Proj_NLI_Trans_mtsa/src/nn_utils/mtsa.py; fairseq)
FORMULAS = {
    "relu": lambda t: torch.where(t > 0, t, torch.zeros_like(t)),
    "elu": lambda t: torch.where(t > 0, t, torch.exp(t) - 1),
    "selu": lambda t: 1.0507009873554804934193349852946 * torch.where(
        t >= 0.0, t, 1.6732632423543772848170429916717 * (torch.exp(t) - 1)),
    "gelu": lambda t: t * 0.5 * (1.0 + torch.erf(t / math.sqrt(2.0))),
    "gelu_tanh": lambda t: 0.5 * t * (1 + torch.tanh(math.sqrt(2 / math.pi) * (t + 0.044715 * t ** 3))),
    "swish": lambda t: t * torch.sigmoid(t),
    "lrelu": lambda t: torch.maximum(0.2 * t, t),
}


def test_the_table_has_the_authors_names_and_functions():
    assert set(ACTIVATIONS) == set(FORMULAS)
    t = torch.linspace(-6, 6, 241, dtype=torch.float64)
    for name, formula in FORMULAS.items():
        torch.testing.assert_close(ACTIVATIONS[name](t), formula(t), rtol=1e-12, atol=1e-12, msg=name)
    assert (ACTIVATIONS["gelu"](t) - ACTIVATIONS["gelu_tanh"](t)).abs().max() > 1e-5  # two names, two functions
    assert activation(None)(t) is t


@pytest.mark.parametrize("value, optional, words", [
    ("tanh", True, ["my_act", "'tanh'", "None", "'gelu_tanh'", "'lrelu'"]),
    (None, False, ["my_act", "None", "'relu'"]),
    (3, True, ["my_act", "3"]),
])
def test_check_activation_names_the_option(value, optional, words):
    with pytest.raises(ValueError) as info:
        check_activation(value, "my_act", optional=optional)
    for word in words:
        assert word in str(info.value)


@pytest.mark.parametrize("name", sorted(ACTIVATIONS))
def test_every_activation_option_takes_every_name(name):
    x = torch.randn(2, 6, 16)
    f = ACTIVATIONS[name]
    modules = [
        maskattn.MTSA(16, 2, s2t_activation=name, v_activation=name, out_activation=name),
        maskattn.MTSA(16, 2, in_hidden=16, in_activation=name),
        maskattn.FastDiSA(16, 2, s2t_activation=name, v_activation=name),
        maskattn.DynamicMaskAttention(16, 4, activation=name),
        maskattn.StaticMaskAttention(16, 4, activation=name),
        FullMaskAttention(16, 4, activation=name),
        FeedForward(16, 32, activation=name),
    ]
    for module in modules:
        assert module.eval()(x).shape == x.shape
    pool = Source2Token(16, activation=name)
    assert pool(x).shape == (2, 16)
    cross = CrossAttention(16, 4, activation=name).eval()
    memory = torch.randn(2, 3, 16)
    out = cross(x, cross.memory_kv(memory), None)
    plain = CrossAttention(16, 4).eval()
    plain.load_state_dict(cross.state_dict())
    q = plain.q_proj(x).view(2, 6, 4, 4).transpose(1, 2)
    k, v = plain.memory_kv(memory)
    heads = F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(2, 6, 16)
    torch.testing.assert_close(out, plain.out_proj(f(heads)), rtol=1e-5, atol=1e-6)


def test_old_names_keep_their_functions():
    """relu / elu (MTSA, Fast-DiSA, DMAN/SAN) and relu / gelu (FFN) compute what they did."""
    ffn = FeedForward(8, 16, activation="gelu")
    x = torch.randn(3, 8)
    torch.testing.assert_close(ffn(x), ffn.fc2(F.gelu(ffn.fc1(x))))
    san = FullMaskAttention(8, 2, activation="relu").eval()
    assert san.activation == "relu" and "activation=relu" in repr(san)


def test_ffn_with_one_layer_and_input_dropout():
    ffn = FeedForward(8, 8, layers=1, activation="relu", input_dropout=0.5)
    assert ffn.fc2 is None
    x = torch.randn(3, 8)
    torch.testing.assert_close(ffn.eval()(x), F.relu(ffn.fc1(x)))
    with pytest.raises(ValueError, match="ffn_dim must be 8"):
        FeedForward(8, 16, layers=1)
    with pytest.raises(ValueError, match="layers"):
        FeedForward(8, 16, layers=3)

"""Shared by the viz tests: recompute what an encoder sublayer receives, outside the encoder's forward; run
a command that must fail with a message."""

from __future__ import annotations

import torch
from typer.testing import CliRunner

from maskattn.cli import app


def fails_with(args, *messages):
    """``maskattn <args>`` exits with code 2 and its output contains every one of ``messages``."""
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2, result.output
    text = " ".join(result.output.split())
    for message in messages:
        assert message in text, text


def stack_sublayer_input(stack, x: torch.Tensor, pad: torch.Tensor, layer: int, sublayer: int):
    """From the encoder input ``x`` (embeddings and positions applied), run ``stack.layers[:layer]`` and the
    sublayers before ``sublayer`` of layer ``layer`` (0-based, pre-LN residuals); returns (the normalised
    input of that sublayer, the sublayer module, ``pad``). A Transformer layer (attention → FFN) gives its
    attention."""
    for below in stack.layers[:layer]:
        x = below(x, key_padding_mask=pad)
    target = stack.layers[layer]
    if not hasattr(target, "residuals"):
        return target.attention_residual.norm(x), target.attention, pad
    for j in range(sublayer):
        x = target.residuals[j](x, lambda h, j=j: target.sublayers[j](h, key_padding_mask=pad))
    return target.residuals[sublayer].norm(x), target.sublayers[sublayer], pad

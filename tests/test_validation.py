"""Checks run once, where data enters (docs/design.md §4): the outermost entry point validates, the layers,
modules and functions it calls trust it."""

from __future__ import annotations

import sys
import threading

import pytest
import torch

import maskattn
from maskattn import validation


def _calls_of(function, run) -> int:
    """How many times ``function`` ran during ``run()`` (however it was imported)."""
    code, count = function.__code__, 0

    def profile(frame, event, arg):
        nonlocal count
        if event == "call" and frame.f_code is code:
            count += 1

    sys.setprofile(profile)
    try:
        run()
    finally:
        sys.setprofile(None)
    return count


@pytest.mark.parametrize("recipe", ["mtsa x3", "dman>san>ffn x2", "csan2d, mha"])
def test_a_stack_checks_the_padding_mask_once_per_forward(recipe):
    encoder = maskattn.Encoder.from_recipe(16, 4, recipe).eval()
    x, kpm = torch.randn(2, 9, 16), torch.zeros(2, 9, dtype=torch.bool)
    kpm[1, 6:] = True
    assert _calls_of(validation.check_key_padding_mask, lambda: encoder(x, kpm)) == 1
    assert _calls_of(validation.check_qkv, lambda: encoder(x, kpm)) == 0  # the functions trust the modules


def test_a_module_called_by_a_user_still_checks_everything():
    layer = maskattn.layers.EncoderLayer(16, 4, attention="mtsa")
    with pytest.raises(ValueError, match=r"key_padding_mask has shape \(2, 8\) but input is \(2, 9, 16\)"):
        layer(torch.randn(2, 9, 16), torch.zeros(2, 8, dtype=torch.bool))
    with pytest.raises(ValueError, match=r"key_padding_mask has shape \(2, 8\) but input is \(2, 9, 16\)"):
        layer.attention(torch.randn(2, 9, 16), torch.zeros(2, 8, dtype=torch.bool))  # the sublayer on its own
    q = torch.randn(1, 2, 5, 4)
    with pytest.raises(ValueError, match=r"k has shape"):
        maskattn.functional.dot_product_attention(q, q[..., :3], q)
    assert validation.checking()  # every entry point left: the next call checks again


def test_an_error_inside_an_entry_point_leaves_checking_on():
    module = maskattn.create_attention("mha", 8, 2)
    with pytest.raises(ValueError):
        module(torch.randn(1, 3, 7))
    assert validation.checking()


def test_checking_is_per_thread():
    seen = {}

    @validation.entry_point
    def outer():
        thread = threading.Thread(target=lambda: seen.setdefault("other", validation.checking()))
        thread.start()
        thread.join()
        seen["inner"] = inner()

    @validation.entry_point
    def inner():
        return validation.checking()

    outer()
    assert seen == {"other": True, "inner": False}


def test_a_compiled_module_leaves_the_entry_point_count_alone():
    """While torch.compile traces, entry points neither count nor skip checks (a compiled frame's side effects on
    the count were not always undone: flex under compile left it at +2 per call, which then silenced every check)."""
    module = maskattn.create_attention("mha", 16, 4, backend="flex").eval()
    compiled = torch.compile(module, fullgraph=True, backend="aot_eager")
    with torch.no_grad():
        for _ in range(2):
            compiled(torch.randn(2, 21, 16))
    assert validation._calls.depth == 0 and validation.checking()
    with pytest.raises(ValueError, match=r"x must have shape \(batch, seq_len, 16\)"):
        module(torch.randn(2, 21, 15))

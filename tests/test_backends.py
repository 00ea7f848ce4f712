"""The backend policy (docs/design.md §2): one table decides ``auto``; an explicit backend runs as named or is
refused with a message — never swapped silently."""

from __future__ import annotations

import itertools
import re
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

import maskattn
from maskattn import backends
from maskattn.functional import banded_attention, local_attention, tensorized_attention

ROOT = Path(__file__).resolve().parents[1]


def _table_in(path: Path) -> str:
    lines = path.read_text(encoding="utf-8").splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("| family | mechanisms | backends"))
    end = next(i for i in range(start, len(lines)) if not lines[i].startswith("|"))
    return "\n".join(lines[start:end])


@pytest.mark.parametrize("doc", ["README.md", "docs/design.md"])
def test_documented_table_is_the_policy(doc):
    assert _table_in(ROOT / doc) == maskattn.backend_table()


def test_every_mechanism_has_a_family_and_its_backends():
    rows = {row["family"]: row for row in maskattn.backend_table_rows()}
    for name in maskattn.list_attentions():
        info = maskattn.attention_info(name)
        assert name in rows[info.family]["mechanisms"].split(", ")
        assert info.backends == backends.POLICIES[info.family].backends


SITUATIONS = list(itertools.product(("cpu", "cuda"), (False, True), (False, True), (False, True)))


@pytest.mark.parametrize("family", list(backends.POLICIES))
@pytest.mark.parametrize("device, training, dropout, band", SITUATIONS)
def test_auto_picks_a_backend_that_can_run(family, device, training, dropout, band):
    chosen = backends.resolve(family, "auto", device=device, training=training, dropout=dropout, band=band)
    assert chosen in backends.POLICIES[family].backends
    assert backends.refusal(chosen, device=device, training=training, dropout=dropout, band=band) is None


@pytest.mark.parametrize("family", list(backends.POLICIES))
def test_explicit_backends_are_honoured_or_refused(family):
    for backend in backends.POLICIES[family].backends:
        for device, training, dropout, band in SITUATIONS:
            context = dict(device=device, training=training, dropout=dropout, band=band)
            reason = backends.refusal(backend, **context)
            if reason is None:
                assert backends.resolve(family, backend, **context) == backend
            else:
                with pytest.raises(ValueError, match=re.escape(reason)):
                    backends.resolve(family, backend, **context)


def test_unknown_backend_lists_the_family_s_backends():
    with pytest.raises(ValueError, match="unknown backend 'banded'; expected one of 'auto', 'reference', 'sdpa', 'flex'"):
        maskattn.create_attention("mha", 16, 4, backend="banded")
    with pytest.raises(ValueError, match="expected one of 'auto', 'reference'"):
        maskattn.create_attention("disa", 16, 2, backend="sdpa")


def test_refusals_say_why():
    q = k = v = torch.randn(1, 2, 8, 4, requires_grad=True)
    s2t = torch.randn(1, 2, 8, 4)
    with pytest.raises(ValueError, match="does not support attention dropout"):
        local_attention(q, k, v, window=3, backend="flex", dropout_p=0.1, training=True)
    with pytest.raises(ValueError, match="backward only on CUDA"):
        local_attention(q, k, v, window=3, backend="flex")
    with pytest.raises(ValueError, match="needs a mask that is a fixed band"):
        tensorized_attention(q, k, v, s2t, maskattn.masks.forward(), backend="banded")
    with pytest.raises(ValueError, match="does not apply MTSA's attention dropout"):
        tensorized_attention(q, k, v, s2t, maskattn.masks.window(2), backend="banded", dropout_p=0.1, training=True)
    sman = maskattn.StaticMaskAttention(16, 4, radius="sqrt", backend="banded")
    with pytest.raises(ValueError, match="needs a mask that is a fixed band"):
        sman(torch.randn(1, 5, 16))


def _grad_fn_names(out: torch.Tensor) -> set[str]:
    names, seen, todo = set(), set(), [out.grad_fn]
    while todo:
        fn = todo.pop()
        if fn is None or id(fn) in seen:
            continue
        seen.add(id(fn))
        names.add(type(fn).__name__)
        todo += [next_fn for next_fn, _ in fn.next_functions]
    return names


def test_local_backends_run_what_they_name(monkeypatch):
    """auto and banded run the band kernel; sdpa runs dense F.scaled_dot_product_attention; nothing else."""
    q, k, v = (torch.randn(2, 4, 12, 8, requires_grad=True) for _ in range(3))
    dense_calls = []
    original = F.scaled_dot_product_attention
    monkeypatch.setattr(F, "scaled_dot_product_attention", lambda *a, **kw: dense_calls.append(1) or original(*a, **kw))
    for backend in ("auto", "banded"):
        out = local_attention(q, k, v, window=3, head_window=3, backend=backend)
        assert "_BandedAttentionBackward" in _grad_fn_names(out) and not dense_calls
    out = local_attention(q, k, v, window=3, head_window=3, backend="sdpa")
    assert dense_calls and "_BandedAttentionBackward" not in _grad_fn_names(out)
    out = banded_attention(q, k, v, 2, backend="reference")
    assert "_BandedAttentionBackward" not in _grad_fn_names(out)


@pytest.mark.parametrize("backend, kernel", [("auto", "_BandedAttentionBackward"), ("banded", "_BandedAttentionBackward"),
                                             ("sdpa", None)])
def test_sman_runs_the_backend_it_names(backend, kernel):
    module = maskattn.StaticMaskAttention(16, 4, radius=2, backend=backend)
    names = _grad_fn_names(module(torch.randn(2, 9, 16)))
    assert (kernel in names) if kernel else "_BandedAttentionBackward" not in names


def test_dman_sdpa_runs_the_tiled_kernel():
    module = maskattn.DynamicMaskAttention(16, 4)
    assert "_DynamicMaskAttentionBackward" in _grad_fn_names(module(torch.randn(2, 9, 16)))
    module.backend = "reference"
    assert "_DynamicMaskAttentionBackward" not in _grad_fn_names(module(torch.randn(2, 9, 16)))


def test_dman_training_on_cuda_does_not_choose_flex():
    """Upstream reports wrong gradients for learnable tensors captured by a compiled score_mod (pytorch/pytorch
    #158212), which is how DMAN's W, P and U enter the flex path: auto keeps DMAN's training on its own kernel
    until the GPU test of flex's gradients (tests/test_gpu.py) passes on a real device."""
    assert backends.resolve("dman", "auto", device="cuda", training=True) == "sdpa"
    assert backends.resolve("dman", "auto", device="cuda", training=False) == "flex"


def test_flex_block_masks_are_cached_and_shared(monkeypatch):
    """Static masks: one block mask per (mask, n, m, device), reused across calls; masks that depend on the batch
    (key padding): built once per forward of a stack and shared by its layers."""
    from torch.nn.attention import flex_attention as flex_module
    from maskattn.kernels import flex

    built = []
    original = flex_module.create_block_mask
    monkeypatch.setattr(flex_module, "create_block_mask", lambda *a, **kw: built.append(a[1:]) or original(*a, **kw))
    flex._static_block_masks.clear()
    module = maskattn.create_attention("csan1d", 16, 4, window=3, backend="flex").eval()
    x = torch.randn(2, 20, 16)
    with torch.no_grad():
        module(x)
        module(x)
        module(torch.randn(3, 20, 16))  # same n: the static block mask again
    assert len(built) == 1
    encoder = maskattn.Encoder.from_recipe(16, 4, "csan1d(window=3) x3", backend="flex").eval()
    kpm = torch.zeros(2, 20, dtype=torch.bool)
    kpm[1, 15:] = True
    built.clear()
    with torch.no_grad():
        encoder(x, kpm)
    assert len(built) == 1  # three layers, one padding-dependent block mask
    with torch.no_grad():
        encoder(x, kpm)
    assert len(built) == 2  # a new forward builds it again (the padding may differ)
    assert len(flex._static_block_masks) <= flex.BLOCK_MASK_CACHE_SIZE

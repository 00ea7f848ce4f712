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

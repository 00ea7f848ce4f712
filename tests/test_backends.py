"""The backend policy (docs/design.md §2): one table decides ``auto``; an explicit backend runs as named or is
refused with a message — never swapped silently."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

import maskattn
from maskattn import backends
from maskattn.functional import banded_attention, local_attention, tensorized_attention
from maskattn.kernels.triton import runtime as triton_runtime
from maskattn.kernels.triton.runtime import Target

ROOT = Path(__file__).resolve().parents[1]


def _table_in(path: Path) -> str:
    lines = path.read_text(encoding="utf-8").splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("| family | mechanisms | backends"))
    end = next(i for i in range(start, len(lines)) if not lines[i].startswith("|"))
    return "\n".join(lines[start:end])


@pytest.mark.parametrize("doc", ["README.md", "docs/design.md"])
def test_documented_table_is_the_policy(doc):
    assert _table_in(ROOT / doc) == maskattn.backend_table()


def test_what_the_table_says_of_mtsa_on_the_cpu_is_what_runs(monkeypatch):
    """Issue 32 item 8: the table's `banded` for MTSA on the CPU holds for window heads only (the note under the table
    says so); MTSA's default forward / backward heads run `sdpa`, and `banded` refuses them."""
    chosen = []
    resolve = backends.resolve
    monkeypatch.setattr(backends, "resolve", lambda family, backend, situation: chosen.append(
        resolve(family, backend, situation)) or chosen[-1])
    x = torch.randn(2, 9, 16)
    maskattn.MTSA(16, 4, head_masks=["window:2"] * 4)(x)
    assert chosen[0] == "banded"  # the tensorized call (then the band kernel's own, in the local family)
    chosen.clear()
    maskattn.MTSA(16, 4)(x)
    assert chosen == ["sdpa"]
    with pytest.raises(maskattn.errors.BackendError, match="backend='banded' cannot run this tensorized call"):
        maskattn.MTSA(16, 4, backend="banded")(x)
    readme = " ".join((ROOT / "README.md").read_text().split())
    assert 'MTSA\'s default forward / backward heads are a band per head: `triton` on CUDA, but `sdpa` on the CPU' \
        in readme


def test_every_mechanism_has_a_family_and_its_backends():
    rows = {row["family"]: row for row in maskattn.backend_table_rows()}
    for name in maskattn.list_attentions():
        info = maskattn.attention_info(name)
        assert name in rows[info.family]["mechanisms"].split(", ")
        assert info.backends == backends.FAMILIES[info.family].names


SITUATIONS = [backends.Situation(device, dtype, head_dims=dims, training=training, dropout=dropout, band=band,
                                 head_bands=band, batch_mask=not band)
              for device in ("cpu", "cuda") for dtype in (torch.float32, torch.bfloat16, torch.float64)
              for dims in ((16, 16), (512, 64)) for training in (False, True) for dropout in (False, True)
              for band in (False, True)]


@pytest.mark.parametrize("family", list(backends.FAMILIES))
def test_auto_picks_a_backend_that_can_run(family):
    for situation in SITUATIONS:
        chosen = backends.resolve(family, "auto", situation)
        assert chosen in backends.FAMILIES[family].names
        assert backends.reasons(family, chosen, situation) == []


@pytest.mark.parametrize("family", list(backends.FAMILIES))
def test_explicit_backends_are_honoured_or_refused_with_every_backend_s_reasons(family):
    for backend in backends.FAMILIES[family].names:
        for situation in SITUATIONS:
            why = backends.reasons(family, backend, situation)
            if not why:
                assert backends.resolve(family, backend, situation) == backend
                continue
            with pytest.raises(maskattn.errors.BackendError) as refused:
                backends.resolve(family, backend, situation)
            message = str(refused.value)
            assert "\n" not in message and all(reason in message for reason in why)
            for other in backends.FAMILIES[family].names:  # every backend's verdict, and what auto runs
                assert f"{other}: " in message
            assert f"backend='auto' runs {backends.resolve(family, 'auto', situation)!r}" in message


def test_auto_takes_the_first_backend_without_a_reason():
    """The order of a family is auto's preference: on CUDA the fused Triton kernels first, then flex; off CUDA the
    library's CPU kernels (Triton's interpreter and FlexAttention's unfused CPU path are passed over)."""
    cuda = backends.Situation("cuda", torch.bfloat16, training=True, band=True, head_bands=True)
    cpu = backends.Situation("cpu", torch.float32, training=True, band=True, head_bands=True)
    for family in ("dman", "local", "tensorized"):
        assert backends.auto_choice(family, cuda) == "triton"
    assert backends.auto_choice("local", cpu) == "banded"
    assert backends.auto_choice("tensorized", cpu) == "banded"
    assert backends.auto_choice("dman", cpu) == "sdpa"
    # a head dim beyond the Triton kernels: the next entry that can run
    wide = backends.Situation("cuda", torch.float16, head_dims=(512, 512), training=True, band=True, head_bands=True)
    assert backends.auto_choice("tensorized", wide) == "flex"
    assert backends.auto_choice("dman", wide) == "sdpa"
    assert backends.reasons("dman", "triton", wide) == ["takes head dims up to 256, got d_k = 512, d_v = 512"]


def test_every_backend_declares_its_limits():
    limits = {(f, b.name): backends.limits(f, b.name) for f, family in backends.FAMILIES.items()
              for b in family.backends}
    assert limits[("local", "reference")] == []
    assert any("does not support attention dropout" in r for r in limits[("dman", "flex")])
    assert any("head dims up to" in r for r in limits[("tensorized", "triton")])
    assert any("band per head" in r for r in limits[("tensorized", "triton")])
    table = maskattn.backend_limits_table()
    assert table.count("\n") == 1 + len(limits)


def test_unknown_backend_lists_the_family_s_backends():
    with pytest.raises(ValueError, match="unknown backend 'banded'; expected one of 'auto', 'sdpa', 'flex', 'reference'"):
        maskattn.create_attention("mha", 16, 4, backend="banded")
    with pytest.raises(ValueError, match="expected one of 'auto', 'reference'"):
        maskattn.create_attention("disa", 16, 2, backend="sdpa")


def test_refusals_say_why():
    q = k = v = torch.randn(1, 2, 8, 4, requires_grad=True)
    s2t = torch.randn(1, 2, 8, 4)
    with pytest.raises(maskattn.errors.BackendError, match="does not support attention dropout"):
        local_attention(q, k, v, window=3, backend="flex", dropout_p=0.1, training=True)
    with pytest.raises(ValueError, match="backward only on CUDA"):
        local_attention(q, k, v, window=3, backend="flex")
    with pytest.raises(ValueError, match="needs a mask that is a fixed band"):
        tensorized_attention(q, k, v, s2t, maskattn.masks.forward_mask(), backend="banded")
    with pytest.raises(ValueError, match="does not apply MTSA's attention dropout"):
        tensorized_attention(q, k, v, s2t, maskattn.masks.window(2), backend="banded", dropout_p=0.1, training=True)
    with pytest.raises(ValueError, match="cannot apply a score_mod"):
        banded_attention(q, k, v, 2, score_mod=F.logsigmoid, backend="sdpa")
    sman = maskattn.StaticMaskAttention(16, 4, radius="sqrt", backend="banded")
    with pytest.raises(ValueError, match="needs a mask that is a fixed band"):
        sman(torch.randn(1, 5, 16))
    with pytest.raises(ValueError, match="band per head"):
        tensorized_attention(q, k, v, s2t, torch.ones(8, 8, dtype=torch.bool), backend="triton")


def test_triton_is_refused_off_cuda_without_the_interpreter(monkeypatch):
    from maskattn.kernels.triton import runtime

    monkeypatch.setattr(runtime, "_loaded_interpreted", False)
    q = k = v = torch.randn(1, 2, 8, 4)
    with pytest.raises(maskattn.errors.BackendError, match=r"runs on CUDA devices .* TRITON_INTERPRET=1.*"
                                                           r"backend='auto' runs 'banded' here"):
        local_attention(q, k, v, window=3, backend="triton")


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


def test_dman_training_does_not_choose_flex():
    """Upstream reports wrong gradients for learnable tensors captured by a compiled score_mod (pytorch/pytorch
    #158212), which is how DMAN's W, P and U enter the flex path: without the Triton kernel, auto keeps DMAN's
    training on its own tiled kernel and uses flex for CUDA inference only."""
    training = backends.Situation("cuda", torch.bfloat16, training=True, head_dims=(512, 512))
    inference = backends.Situation("cuda", torch.bfloat16, head_dims=(512, 512))
    assert backends.resolve("dman", "auto", training) == "sdpa"
    assert backends.resolve("dman", "auto", inference) == "flex"
    assert backends.resolve("dman", "flex", training) == "flex"  # explicit: it can run


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


# --------------------------------------------------------------------------------------------------
# issue 41 "Bad input": what the Triton kernels cannot serve well — auto runs another backend and says why
# (maskattn list --backends), backend="triton" is refused in one line naming the reason
# --------------------------------------------------------------------------------------------------

_TRITON_FAMILIES = ("dman", "local", "tensorized")


def _cuda_call(**changes) -> backends.Situation:
    base = backends.Situation("cuda", torch.bfloat16, head_dims=(64, 64), training=True, band=True, head_bands=True)
    return replace(base, **changes)


@pytest.mark.parametrize("target, changes, words", [
    (Target(110, 227 * 1024), {}, "never compiled for compute capability 11.0 (sm_110)"),  # no CI compilation
    (Target(75, 64 * 1024), {}, "needs compute capability 8.0"),
    (Target(90, 227 * 1024), {"head_dims": (300, 300)}, "head dims up to 256, got d_k = 300"),  # the *-authors presets
    (Target(90, 227 * 1024), {"dtype": torch.float64}, "got float64"),
])
def test_what_triton_cannot_serve_goes_elsewhere_under_auto_and_is_refused_when_named(target, changes, words):
    situation = _cuda_call(**changes)
    with triton_runtime.assume_target(target):
        for family in _TRITON_FAMILIES:
            assert backends.resolve(family, "auto", situation) != "triton"
            with pytest.raises(maskattn.errors.BackendError) as refused:
                backends.resolve(family, "triton", situation)
            message = str(refused.value)
            assert "\n" not in message and message.startswith(f"backend='triton' cannot run this {family} call")
            assert words in message, message


@pytest.mark.parametrize("arch", sorted(triton_runtime.TARGETS))
def test_every_architecture_the_ci_compiles_is_accepted(arch):
    """The architectures ``auto`` accepts are exactly those the offline compile check compiles in CI
    (``--matrix ci``: tests/test_triton_compile.py)."""
    with triton_runtime.assume_target(triton_runtime.TARGETS[arch]):
        for family in _TRITON_FAMILIES:
            assert backends.resolve(family, "auto", _cuda_call()) == "triton", (family, arch)


def test_the_backend_list_says_which_architectures_triton_takes():
    """``maskattn list --backends`` prints :func:`backends.limits`: the architectures are named there."""
    for family in _TRITON_FAMILIES:
        listed = " | ".join(backends.limits(family, "triton"))
        assert "offline compile check compiles in CI" in listed
        assert all(target.name in listed for target in triton_runtime.TARGETS.values())

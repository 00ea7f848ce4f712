"""DMAN's Triton tiles (issue 41 §2; docs/design.md §3, docs/gpu.md): tiles sized per architecture and head width in
``runtime.TILE_TABLE`` (128-query forward tiles, 16 rows per warp; sm_90's backward holds 128 rows and
streams 32, FlashAttention-2's shapes — wgmma needs 64 rows per warpgroup in the held tile), the distance bias ``P``
read once per near tile as a strip, the query pass's diagonal sums per square of ``BLOCK_N`` queries, and the
kernels' near / far loops — checked against the float64 oracle with the tiles a GPU would use.

Under Triton's interpreter the launchers take 16 × 16 tiles (``runtime.tiles``); here every DMAN pass is given the
table's tiles of a shared-memory class instead (128 × 64 forward; sm_80's square backward, sm_90's 128 × 32 /
32 × 128), so the strip of P, the near tiles of wide and rectangular tiles with query offsets that are not tile multiples, and the
near loop / far loop split run at the size they have on a GPU. On CUDA the table's own tiles run."""

from __future__ import annotations

import pytest
import torch

from _triton_device import DEVICE, EXACT, INTERPRETED, needs_kernels, tol, use_table_tiles
from maskattn.functional.dman import dynamic_mask_attention_reference
from maskattn.kernels.triton import runtime

pytestmark = needs_kernels
GRAD_NAMES = ("q", "k", "v", "a", "P", "U")
DMAN = ("dman_fwd", "dman_bwd_kv", "dman_bwd_q")


def test_dman_tiles_fit_the_kernels_and_sm_90s_wgmma():
    """Every DMAN entry is a power of two per side (``tl.arange``), and the query pass's ``BLOCK_M`` a multiple of
    its ``BLOCK_N`` (its diagonal sums are per square of ``BLOCK_N`` queries). On the 227 KB class (sm_90) and the
    163 KB class (sm_80) the forward of 16-bit heads up to 128 wide — and at the split width 160 (d 150's 128 + 32
    features) — gives each warp 16 query rows of its own (Triton puts the warps of a chained dot along the rows: 64
    rows on 8 warps ran every product twice), in whole warpgroups of 64 rows on the 227 KB class; there the backward
    passes of those heads hold 64 rows per warpgroup (wgmma: the key pass's keys, the query pass's queries — every
    product has the held tile as its M dimension)."""
    for (kernel, cls, width), tiles in runtime.TILE_TABLE.items():
        if kernel not in DMAN:
            continue
        for side in (tiles.block_m, tiles.block_n):
            assert side & (side - 1) == 0 and side >= 16, (kernel, cls, width, tiles)
        if kernel == "dman_bwd_q":
            assert tiles.block_m % tiles.block_n == 0, (kernel, cls, width, tiles)
        if kernel == "dman_fwd" and cls in ("227K", "163K") and width <= 160:
            assert tiles.block_m >= 16 * tiles.warps and tiles.warps % 4 == 0, (kernel, cls, width, tiles)
            if cls == "227K":
                assert tiles.block_m >= 64 * (tiles.warps // 4), (kernel, cls, width, tiles)
        if kernel != "dman_fwd" and cls == "227K" and width <= 160:
            held = tiles.block_n if kernel == "dman_bwd_kv" else tiles.block_m
            assert tiles.warps % 4 == 0 and held >= 64 * (tiles.warps // 4), (kernel, cls, width, tiles)


def _inputs(n, m, D, *, B=1, H=2, d=16, seed=0):
    g = torch.Generator().manual_seed(seed)

    def rand(*shape):
        return torch.randn(*shape, generator=g, dtype=torch.float64).to(DEVICE, EXACT).requires_grad_()

    return [rand(B, H, n, d), rand(B, H, m, d), rand(B, H, m, d), rand(B, n), rand(2 * D + 1), rand(H)]


@pytest.fixture(params=[("163K", 64), ("227K", 64), ("163K", 128)], ids=["sm_80-d64", "sm_90-d64", "sm_80-d128"])
def gpu_tiles(request, monkeypatch):
    """The tiles :data:`runtime.TILE_TABLE` gives 16-bit heads of a width on a shared-memory class (sm_80, d 64:
    the 128 × 64 forward, 128 × 32 query pass and square 32 × 32 key pass; sm_90, d 64: 128 × 64, 128 × 32 and a
    64 × 128 key pass (64 streamed queries × 128 held keys); sm_80, d 128: 128 × 32,
    a square 32 × 32 query pass and 64 × 64) for every DMAN pass under the interpreter; on CUDA the device's own.
    Returns the launches' ``(BLOCK_M, BLOCK_N)`` per pass."""
    cls, width = request.param
    use_table_tiles(monkeypatch, "dman_", cls, width)
    from maskattn.kernels.triton.dman import _constants
    probe = torch.empty(1, 1, 1, 16, dtype=EXACT, device=DEVICE)
    chosen = {kernel: _constants(kernel, probe, probe, None, False, 0.0, None) for kernel in DMAN}
    return {kernel: (c["BLOCK_M"], c["BLOCK_N"]) for kernel, c in chosen.items()}


# (n, m, D, causal, q_offset): D below, inside and beyond a 64-wide tile; query offsets that are not tile multiples
# (a decoding-like step after a cache, a chunk of a longer sequence); lengths that end inside a tile
CASES = {
    "far_both_sides": (200, 200, 3, False, 0),
    "causal_far_left": (200, 200, 5, True, 0),
    "D_wider_than_a_tile": (150, 150, 90, True, 0),
    "offset_chunk": (70, 150, 20, True, 80),
    "offset_not_causal": (45, 130, 70, False, 37),
}


@pytest.mark.parametrize("case", list(CASES))
def test_matches_float64_reference_with_gpu_tiles(case, gpu_tiles):
    n, m, D, causal, q_offset = CASES[case]
    assert gpu_tiles["dman_fwd"][0] >= 128 or not INTERPRETED  # the GPU tiles, not the interpreter's 16 × 16
    from maskattn.kernels.triton.dman import dman_triton
    inputs = _inputs(n, m, D)
    out = dman_triton(*inputs, causal=causal, key_padding_mask=None, q_offset=q_offset, dropout_p=0.0,
                      mask_floor=None)
    grad_out = torch.randn(out.shape, generator=torch.Generator().manual_seed(7), dtype=torch.float64).to(DEVICE)
    grads = torch.autograd.grad(out, inputs, grad_out.to(out.dtype))
    exact = [x.detach().double().requires_grad_() for x in inputs]
    ref = dynamic_mask_attention_reference(*exact, causal=causal, q_offset=q_offset)[0]
    ref_grads = torch.autograd.grad(ref, exact, grad_out)
    torch.testing.assert_close(out.double(), ref, atol=tol(1e-10), rtol=tol(1e-8))
    for name, grad, ref_grad in zip(GRAD_NAMES, grads, ref_grads):
        torch.testing.assert_close(grad.double(), ref_grad, atol=tol(1e-10), rtol=tol(1e-8),
                                   msg=lambda s, name=name: f"d{name}: {s}")


def test_backward_with_gpu_tiles_is_bit_identical_across_runs(gpu_tiles):
    """No atomics: two backward runs (dropout on, the same seed) give bit-identical gradients with the GPU tiles.
    Under Triton's interpreter the programs of a launch run one after another, always in the same order, so on the
    CPU this fails only on a dropout mask that is not reproduced; an ordering dependence shows in
    tests/test_triton_program_order.py, which runs the programs in reversed order too."""
    from maskattn.kernels.triton.dman import dman_triton
    inputs = _inputs(150, 150, 20)

    def grads():
        torch.manual_seed(5)
        out = dman_triton(*inputs, causal=True, key_padding_mask=None, q_offset=0, dropout_p=0.2, mask_floor=1e-3)
        return torch.autograd.grad(out, inputs, torch.ones_like(out))

    for name, a, b in zip(GRAD_NAMES, grads(), grads()):
        assert torch.equal(a, b), name


# --------------------------------------------------------------------------------------------------
# feature-axis tiling (issue 52): d 150 as 128 + 32 feature blocks with the split width's tiles
# --------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("cls", ["227K", "163K", "99K"])
def test_split_width_with_gpu_tiles_matches_float64_and_repeats_bit_for_bit(cls, monkeypatch):
    """d 150 (160 = 128 + 32 features) with the tiles :data:`runtime.TILE_TABLE` gives each class at the split
    width 160 — sm_90: 128 × 64 forward, 128 × 32 query pass, 32 × 128 key pass; sm_80: 128 × 32, 64 × 32, 64 × 64;
    sm_86: 128 × 32, 64 × 32, 64 × 64 — with a query offset that is not a tile multiple, causal, lengths that end
    inside a tile: outputs and every gradient match the float64 reference, and a second backward (dropout on, the
    same seed) is bit-identical to the first."""
    use_table_tiles(monkeypatch, "dman_", cls, 160)
    from maskattn.kernels.triton.dman import dman_triton
    inputs = _inputs(70, 150, 20, d=150)
    options = dict(causal=True, key_padding_mask=None, q_offset=80, mask_floor=None)
    out = dman_triton(*inputs, dropout_p=0.0, **options)
    grad_out = torch.randn(out.shape, generator=torch.Generator().manual_seed(7), dtype=torch.float64).to(DEVICE)
    grads = torch.autograd.grad(out, inputs, grad_out.to(out.dtype))
    exact = [x.detach().double().requires_grad_() for x in inputs]
    ref = dynamic_mask_attention_reference(*exact, causal=True, q_offset=80)[0]
    torch.testing.assert_close(out.double(), ref, atol=tol(1e-10), rtol=tol(1e-8))
    for name, grad, ref_grad in zip(GRAD_NAMES, grads, torch.autograd.grad(ref, exact, grad_out)):
        torch.testing.assert_close(grad.double(), ref_grad, atol=tol(1e-10), rtol=tol(1e-8),
                                   msg=lambda s, name=name: f"d{name}: {s}")

    def dropped_grads():
        torch.manual_seed(5)
        out = dman_triton(*inputs, dropout_p=0.2, **options)
        return torch.autograd.grad(out, inputs, torch.ones_like(out))

    for name, a, b in zip(GRAD_NAMES, dropped_grads(), dropped_grads()):
        assert torch.equal(a, b), name


def _recorded_launches(arch: int, d: int) -> dict:
    """DMAN's launches of one bfloat16 call (forward and backward) at head width ``d``, recorded as on an ``arch``
    device: ``{kernel: launch}``."""
    from maskattn.kernels.triton.dman import dman_triton
    with runtime.recording(runtime.TARGETS[arch]) as recorded:
        q, k, v = (torch.randn(2, 40, 2, d).to(torch.bfloat16).transpose(1, 2).requires_grad_() for _ in range(3))
        a, table, u = torch.randn(2, 40), torch.randn(9), torch.randn(2)
        out = dman_triton(q, k, v, a, table, u, causal=True, key_padding_mask=None, q_offset=0, dropout_p=0.0,
                          mask_floor=None)
        torch.autograd.grad(out.float().sum(), (q, k, v))
    return {launch.kernel.fn.__name__: launch for launch in recorded}


def _tiles_of(launch) -> runtime.Tiles:
    kwargs = launch.kwargs
    return runtime.Tiles(kwargs["BLOCK_M"], kwargs["BLOCK_N"], kwargs["num_warps"], kwargs["num_stages"])


@pytest.mark.parametrize("arch", [80, 86, 90, 100])
@pytest.mark.parametrize("d", [64, 128, 256])
def test_power_of_two_widths_launch_exactly_as_before(arch, d):
    """A power-of-two head width takes one feature block: DMAN's launches carry ``BLOCK_DK`` / ``BLOCK_DV`` the width
    and no ``TAIL_DK`` / ``TAIL_DV`` (the kernels' default 0: no tail code is traced, the loops keep their
    loop-invariant code hoisted), with the tiles of the width's own entry — the constants of before the feature
    tiling, so the kernels compile to the code they compiled to (docs/gpu.md, "Feature-axis tiling")."""
    launches = _recorded_launches(arch, d)
    assert set(launches) == set(DMAN)
    cls = runtime.tile_class(runtime.TARGETS[arch])
    for kernel, launch in launches.items():
        assert launch.kwargs["BLOCK_DK"] == launch.kwargs["BLOCK_DV"] == d
        assert not {"TAIL_DK", "TAIL_DV"} & set(launch.kwargs), kernel
        assert _tiles_of(launch) == (runtime.ARCH_TILES.get((kernel, arch, d)) or runtime.TILE_TABLE[(kernel, cls, d)])


@pytest.mark.parametrize("arch", [80, 86, 90, 100])
def test_d150_launches_split_blocks_with_the_split_widths_tiles(arch):
    """d 150 runs every DMAN pass on 160 = 128 + 32 features (``BLOCK_D*`` 160, ``TAIL_D*`` 32; not one block of
    256) with the table's entries at the split width 160 on every class."""
    cls = runtime.tile_class(runtime.TARGETS[arch])
    for kernel, launch in _recorded_launches(arch, 150).items():
        assert (launch.kwargs["BLOCK_DK"], launch.kwargs["TAIL_DK"], launch.kwargs["BLOCK_DV"],
                launch.kwargs["TAIL_DV"]) == (160, 32, 160, 32), kernel
        assert _tiles_of(launch) == (runtime.ARCH_TILES.get((kernel, arch, 160))
                                     or runtime.TILE_TABLE[(kernel, cls, 160)]), kernel

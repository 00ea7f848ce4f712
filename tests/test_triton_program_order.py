"""The Triton kernels give the same bits whatever order the programs of a launch run in (issue 57 item 7).

Under Triton's interpreter the programs of a launch run one after another, always in the same order (its
``GridExecutor`` loops over the grid, x outermost, and sets each program's index with
``InterpreterBuilder.set_grid_idx``), so the determinism tests of test_triton_band, test_triton_dman,
test_triton_dman_tiles and test_triton_tensorized (a second backward bit-identical to the first) can only fail there
on a dropout seed that is not reproduced — not on an atomic float sum or on a program that reads what another one of
the same launch wrote. Here every launch of each kernel also runs with its programs in reversed order
(:func:`reverse_programs`), and the outputs and every gradient must be bit-identical to those of the normal order.
On a GPU the hardware chooses the order: these tests run under the interpreter only."""

from __future__ import annotations

import pytest
import torch

from _triton_device import DEVICE, EXACT, interpreter_only, needs_kernels, use_table_tiles
from maskattn import masks as M
from maskattn.functional import tensorized_attention
from test_triton_band import make as band_inputs, padding as band_padding, triton as band_triton
from test_triton_dman import dman_triton, make_inputs as dman_inputs, padding as dman_padding

pytestmark = [needs_kernels, interpreter_only]


def reverse_programs(patch) -> None:
    """With ``patch`` (a monkeypatch), make the interpreter run the programs of every launch last to first: its loop
    still visits ``(x, y, z)`` in order, and each visit becomes the program ``(nx − 1 − x, ny − 1 − y, nz − 1 − z)``,
    so the k-th program to run is the one that ran k-th from the end."""
    from triton.runtime import interpreter

    original = interpreter.InterpreterBuilder.set_grid_idx

    def mirrored(self, x, y, z):
        nx, ny, nz = self.grid_dim
        original(self, nx - 1 - x, ny - 1 - y, nz - 1 - z)

    patch.setattr(interpreter.InterpreterBuilder, "set_grid_idx", mirrored)


def in_both_orders(monkeypatch, run):
    """``run()`` (a tuple of tensors) with the programs of its launches in the interpreter's order, then reversed."""
    normal = run()
    with monkeypatch.context() as patch:
        reverse_programs(patch)
        reverse = run()
    return normal, reverse


def assert_order_free(monkeypatch, run, names):
    normal, reverse = in_both_orders(monkeypatch, run)
    assert len(normal) == len(reverse) == len(names)
    differ = [name for name, a, b in zip(names, normal, reverse) if not torch.equal(a, b)]
    assert not differ, f"differ when the programs run in reversed order: {differ}"


def forward_backward(inputs, forward, seed=0):
    """The output of ``forward()`` (dropout drawn from ``seed``) and the gradients of ``inputs`` for a fixed
    upstream gradient."""
    torch.manual_seed(seed)
    out = forward()
    grad = torch.randn(out.shape, generator=torch.Generator().manual_seed(7), dtype=torch.float64).to(out)
    return (out.detach(), *torch.autograd.grad(out, inputs, grad))


def _order_recorder():
    import triton
    import triton.language as tl

    @triton.jit
    def record_order(COUNTER, ORDER):
        """Each program writes its id at the next free place of ORDER: a kernel that depends on program order."""
        pid = tl.program_id(0) * tl.num_programs(1) + tl.program_id(1)
        k = tl.load(COUNTER)
        tl.store(ORDER + k, pid)
        tl.store(COUNTER, k + 1)

    return record_order


def test_the_programs_run_in_reversed_order_and_an_order_dependence_is_seen(monkeypatch):
    """The patch reverses the order on a two-axis grid (the ids the programs record), and the comparison fails on a
    kernel whose result depends on that order."""
    record_order = _order_recorder()

    def run():
        counter, order = torch.zeros(1, dtype=torch.int32), torch.full((12,), -1, dtype=torch.int32)
        record_order[(3, 4)](counter, order)
        return (order,)

    normal, reverse = in_both_orders(monkeypatch, run)
    assert normal[0].tolist() == list(range(12)) and reverse[0].tolist() == list(range(11, -1, -1))
    with pytest.raises(AssertionError, match=r"differ when the programs run in reversed order: \['order'\]"):
        assert_order_free(monkeypatch, run, ["order"])
    assert run()[0].tolist() == list(range(12))  # the interpreter's own order is back


def test_band_kernel(monkeypatch):
    """CSAN's band over a circular head area of 3, log-sigmoid scores, key padding and dropout: 3 heads × 3 query
    tiles."""
    q, k, v = band_inputs(1, 3, 37, 8, 8, EXACT)
    kpm = band_padding(1, 37, "random")

    def run():
        return forward_backward((q, k, v), lambda: band_triton(q, k, v, 5, 5, 3, "circular", kpm, logsigmoid=True,
                                                               dropout_p=0.2))

    assert_order_free(monkeypatch, run, ["out", "dq", "dk", "dv"])


def test_dman_kernels(monkeypatch):
    """DMAN's forward, key pass and query pass (with its diagonal and far-tile sums of the gate gradients), near and
    far tiles (D = 3), key padding and dropout: 2 × 2 heads × 3 tiles (causal: the GPU tiles' test below)."""
    inputs = dman_inputs(37, 37, 3)
    kpm = dman_padding("tail", 2, 37)

    def run():
        return forward_backward(inputs, lambda: dman_triton(*inputs, causal=False, key_padding_mask=kpm, q_offset=0,
                                                            dropout_p=0.2, mask_floor=None))

    assert_order_free(monkeypatch, run, ["out", "dq", "dk", "dv", "da", "dP", "dU"])


def test_dman_kernels_with_the_gpus_tiles(monkeypatch):
    """The three DMAN passes with the tiles sm_90 runs at head width 64 (test_triton_dman_tiles), causal, a floor on
    the mask and dropout."""
    use_table_tiles(monkeypatch, "dman_", "227K", 64)
    inputs = dman_inputs(150, 150, 20, B=1, d_k=16, d_v=16)

    def run():
        return forward_backward(inputs, lambda: dman_triton(*inputs, causal=True, key_padding_mask=None, q_offset=0,
                                                            dropout_p=0.2, mask_floor=1e-3))

    assert_order_free(monkeypatch, run, ["out", "dq", "dk", "dv", "da", "dP", "dU"])


def test_tensorized_kernels(monkeypatch):
    """MTSA's passes and its elementwise kernels, 5 heads in two launches (the window heads in a narrow one of their
    own) × 3 tiles, key padding and dropout."""
    g = torch.Generator().manual_seed(0)
    q, k, v, s2t = (torch.randn(1, 5, 37, d, generator=g, dtype=torch.float64).to(DEVICE, EXACT).requires_grad_()
                    for d in (8, 8, 12, 12))
    mask = M.per_head([M.forward_mask(False), M.window(3), M.full(), M.band(0, 32), M.band(16, 17)])
    kpm = torch.zeros(1, 37, dtype=torch.bool, device=DEVICE)
    kpm[0, 30:] = True

    def run():
        return forward_backward((q, k, v, s2t), lambda: tensorized_attention(
            q, k, v, s2t, mask, key_padding_mask=kpm, dropout_p=0.2, training=True, backend="triton"))

    assert_order_free(monkeypatch, run, ["out", "dq", "dk", "dv", "ds2t"])

import itertools

import pytest
import torch

from maskattn import masks as M


def brute(pred, n, heads=1, batch=1):
    out = torch.zeros(batch, heads, n, n, dtype=torch.bool)
    for b, h, i, j in itertools.product(range(batch), range(heads), range(n), range(n)):
        out[b, h, i, j] = pred(b, h, i, j)
    return out


CASES = {
    "full": (M.full(), lambda b, h, i, j: True),
    "forward": (M.forward(), lambda b, h, i, j: j <= i),
    "forward_strict": (M.forward(False), lambda b, h, i, j: j < i),
    "backward": (M.backward(), lambda b, h, i, j: j >= i),
    "backward_strict": (M.backward(False), lambda b, h, i, j: j > i),
    "causal": (M.causal(), lambda b, h, i, j: j <= i),
    "window2": (M.window(2), lambda b, h, i, j: abs(i - j) <= 2),
    "window0": (M.window(0), lambda b, h, i, j: i == j),
}


@pytest.mark.parametrize("name", CASES)
def test_materialize_matches_definition(name):
    mask, pred = CASES[name]
    assert torch.equal(mask.materialize(7), brute(pred, 7))


def test_rows_are_queries():
    # query 0 of a forward mask sees only key 0; query 0 of a backward mask sees every key
    assert M.forward().materialize(4)[0, 0, 0].tolist() == [True, False, False, False]
    assert M.backward().materialize(4)[0, 0, 0].tolist() == [True, True, True, True]


def test_composition_and_or_not():
    f, w = M.forward(), M.window(1)
    n = 6
    assert torch.equal((f & w).materialize(n), f.materialize(n) & w.materialize(n))
    assert torch.equal((f | w).materialize(n), f.materialize(n) | w.materialize(n))
    assert torch.equal((~f).materialize(n), ~f.materialize(n))
    assert torch.equal((M.forward(False) | M.backward(False)).materialize(n), ~torch.eye(n, dtype=torch.bool)[None, None])


def test_key_padding_and_batch():
    kpm = torch.tensor([[False, False, True], [False, True, True]])
    m = M.key_padding(kpm) & M.forward()
    dense = m.materialize(3, batch=2, heads=2)
    expected = brute(lambda b, h, i, j: (not kpm[b, j]) and j <= i, 3, heads=2, batch=2)
    assert torch.equal(dense, expected)
    assert not m.static


def test_per_head():
    m = M.per_head([M.forward(), M.backward(), M.window(1)])
    dense = m.materialize(5, heads=3)
    assert torch.equal(dense[0, 0], M.forward().materialize(5)[0, 0])
    assert torch.equal(dense[0, 1], M.backward().materialize(5)[0, 0])
    assert torch.equal(dense[0, 2], M.window(1).materialize(5)[0, 0])


@pytest.mark.parametrize("mask, heads", [
    (M.forward(), 2), (M.forward(False), 2), (M.backward(False), 1), (M.causal().shifted(3), 2), (M.window(2), 3),
    (M.full(), 2), (M.per_head([M.forward(False), M.backward(), M.window(1), M.full()]), 4),
    (M.per_head([M.forward(False), M.backward(False)]) & M.window(3), 2),
])
def test_bands_per_head_describe_the_predicate(mask, heads):
    """``bands_per_head`` (what the Triton kernels take instead of the predicate) says exactly what the predicate
    allows: head c attends to i − left <= j <= i + right."""
    bands = mask.bands_per_head(heads)
    assert bands is not None and len(bands) == heads
    i, j = torch.arange(9)[:, None], torch.arange(9)[None, :]
    dense = mask.materialize(9, heads=heads)[0]
    for c, (left, right) in enumerate(bands):
        assert torch.equal(dense[c], (j >= i - left) & (j <= i + right)), (c, left, right)


def test_bands_per_head_is_none_where_a_head_is_not_a_band():
    assert (M.forward() | M.backward(False)).bands_per_head(1) is None  # full, but not known as a band
    assert M.per_head([M.forward(), M.forward() | M.window(1)]).bands_per_head(2) is None
    assert M.per_head([M.forward(), M.backward()]).bands_per_head(3) is None  # not this many heads
    assert M.forward(False).finite_band is None and (M.forward(False) & M.window(2)).finite_band is None  # j < i


def test_rectangular_materialisation():
    assert M.causal().materialize(2, 4).shape == (1, 1, 2, 4)


def test_from_name():
    assert torch.equal(M.from_name("window:3").materialize(8), M.window(3).materialize(8))
    for name in M.MASK_NAMES:
        assert M.from_name(name).materialize(3).shape == (1, 1, 3, 3)


def test_works_as_flex_mask_mod():
    from torch.nn.attention.flex_attention import create_block_mask

    m = M.per_head([M.forward(), M.window(2)])
    block = create_block_mask(m.mask_mod, None, 2, 256, 256, device="cpu")
    dense = block.to_dense()  # (1, H, q_blocks, kv_blocks) of block occupancy
    assert dense.shape[1] == 2


@pytest.mark.parametrize("bad, exc", [
    (lambda: M.window(-1), ValueError),
    (lambda: M.window(1.5), TypeError),
    (lambda: M.forward("yes"), TypeError),
    (lambda: M.from_name("sideways"), ValueError),
    (lambda: M.from_name("window:x"), ValueError),
    (lambda: M.per_head([]), ValueError),
    (lambda: M.per_head([M.full(), "forward"]), TypeError),
    (lambda: M.key_padding(torch.zeros(2, 3)), TypeError),
    (lambda: M.key_padding(torch.zeros(3, dtype=torch.bool)), ValueError),
    (lambda: M.full() & "forward", TypeError),
    (lambda: M.full().materialize(-1), ValueError),
])
def test_bad_input(bad, exc):
    with pytest.raises(exc):
        bad()


def test_error_names_the_argument():
    with pytest.raises(ValueError, match="radius"):
        M.window(-3)
    with pytest.raises(ValueError, match="sideways"):
        M.from_name("sideways")

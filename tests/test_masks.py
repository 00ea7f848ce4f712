import itertools
import re

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
    "forward": (M.forward_mask(), lambda b, h, i, j: j <= i),
    "forward_strict": (M.forward_mask(False), lambda b, h, i, j: j < i),
    "backward": (M.backward_mask(), lambda b, h, i, j: j >= i),
    "backward_strict": (M.backward_mask(False), lambda b, h, i, j: j > i),
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
    assert M.forward_mask().materialize(4)[0, 0, 0].tolist() == [True, False, False, False]
    assert M.backward_mask().materialize(4)[0, 0, 0].tolist() == [True, True, True, True]


def test_composition_and_or_not():
    f, w = M.forward_mask(), M.window(1)
    n = 6
    assert torch.equal((f & w).materialize(n), f.materialize(n) & w.materialize(n))
    assert torch.equal((f | w).materialize(n), f.materialize(n) | w.materialize(n))
    assert torch.equal((~f).materialize(n), ~f.materialize(n))
    assert torch.equal((M.forward_mask(False) | M.backward_mask(False)).materialize(n), ~torch.eye(n, dtype=torch.bool)[None, None])


def test_key_padding_and_batch():
    kpm = torch.tensor([[False, False, True], [False, True, True]])
    m = M.key_padding(kpm) & M.forward_mask()
    dense = m.materialize(3, batch=2, heads=2)
    expected = brute(lambda b, h, i, j: (not kpm[b, j]) and j <= i, 3, heads=2, batch=2)
    assert torch.equal(dense, expected)
    assert not m.static


def test_per_head():
    m = M.per_head([M.forward_mask(), M.backward_mask(), M.window(1)])
    dense = m.materialize(5, heads=3)
    assert torch.equal(dense[0, 0], M.forward_mask().materialize(5)[0, 0])
    assert torch.equal(dense[0, 1], M.backward_mask().materialize(5)[0, 0])
    assert torch.equal(dense[0, 2], M.window(1).materialize(5)[0, 0])


@pytest.mark.parametrize("mask, heads", [
    (M.forward_mask(), 2), (M.forward_mask(False), 2), (M.backward_mask(False), 1), (M.causal().shifted(3), 2), (M.window(2), 3),
    (M.full(), 2), (M.per_head([M.forward_mask(False), M.backward_mask(), M.window(1), M.full()]), 4),
    (M.per_head([M.forward_mask(False), M.backward_mask(False)]) & M.window(3), 2),
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
    assert (M.forward_mask() | M.backward_mask(False)).bands_per_head(1) is None  # full, but not known as a band
    assert M.per_head([M.forward_mask(), M.forward_mask() | M.window(1)]).bands_per_head(2) is None
    assert M.per_head([M.forward_mask(), M.backward_mask()]).bands_per_head(3) is None  # not this many heads
    assert M.forward_mask(False).finite_band is None and (M.forward_mask(False) & M.window(2)).finite_band is None  # j < i


def test_rectangular_materialisation():
    assert M.causal().materialize(2, 4).shape == (1, 1, 2, 4)


#: what each name of MASK_NAMES means, written out (query i, key j)
NAMED = {
    "full": lambda b, h, i, j: True,
    "forward": lambda b, h, i, j: j <= i,
    "backward": lambda b, h, i, j: j >= i,
    "forward_strict": lambda b, h, i, j: j < i,
    "backward_strict": lambda b, h, i, j: j > i,
    "causal": lambda b, h, i, j: j <= i,
}


def test_from_name():
    assert set(NAMED) == set(M.MASK_NAMES)  # a new name needs its definition here
    for name, pred in NAMED.items():
        assert torch.equal(M.from_name(name).materialize(7), brute(pred, 7)), name
    for radius in (0, 1, 3):
        expected = brute(lambda b, h, i, j, radius=radius: abs(i - j) <= radius, 7)
        assert torch.equal(M.from_name(f"window:{radius}").materialize(7), expected), radius
    assert torch.equal(M.from_name("window:3").materialize(8), M.window(3).materialize(8))


def _block_occupancy(num_blocks, indices, kv_blocks):
    """``(B, H, q_blocks, kv_blocks)`` bool from a BlockMask's count of key blocks per query block and their
    indices (the first ``num_blocks`` entries of each row)."""
    out = torch.zeros(*num_blocks.shape, kv_blocks, dtype=torch.bool)
    for index in itertools.product(*map(range, num_blocks.shape)):
        out[index][indices[index][:int(num_blocks[index])].long()] = True
    return out


_LENGTHS = torch.tensor([[100], [48]])  # keys of two sequences: 100 real (a block cut inside), 48 (cut between)
FLEX_CASES = {  # mask, batch, heads
    "causal": (M.causal(), 1, 1),
    "window": (M.window(20), 1, 1),
    "per_head": (M.per_head([M.forward_mask(), M.window(2)]), 1, 2),
    "mtsa_heads": (M.per_head([M.forward_mask(False), M.backward_mask(False), M.window(20)]), 1, 3),
    "key_padding": (M.key_padding(torch.arange(128)[None, :] >= _LENGTHS), 2, 1),
    "key_padding_causal": (M.key_padding(torch.arange(128)[None, :] >= _LENGTHS) & M.causal(), 2, 2),
}


@pytest.mark.parametrize("name", FLEX_CASES)
def test_works_as_flex_mask_mod(name):
    """FlexAttention's block mask built from ``mask_mod`` marks exactly the blocks where the dense mask is all
    True as full, those with some True as partial, and skips the rest."""
    from torch.nn.attention.flex_attention import create_block_mask

    mask, batch, heads = FLEX_CASES[name]
    n, size = 128, 16
    block = create_block_mask(mask.mask_mod, batch, heads, n, n, device="cpu", BLOCK_SIZE=size)
    tiles = mask.materialize(n, batch=batch, heads=heads).view(batch, heads, n // size, size, n // size, size)
    some, every = tiles.any(5).any(3), tiles.all(5).all(3)  # (B, H, q_blocks, kv_blocks)
    assert every.any() and (some & ~every).any() and (~some).any()  # the case has full, partial and empty blocks
    assert torch.equal(_block_occupancy(block.full_kv_num_blocks, block.full_kv_indices, n // size), every)
    assert torch.equal(_block_occupancy(block.kv_num_blocks, block.kv_indices, n // size), some & ~every)
    assert torch.equal(block.to_dense(), some)


@pytest.mark.parametrize("bad, exc, message", [
    (lambda: M.window(-1), ValueError, "radius must be >= 0, got -1"),
    (lambda: M.window(1.5), TypeError, "radius must be an int >= 0, got float 1.5"),
    (lambda: M.forward_mask("yes"), TypeError, "include_diagonal must be a bool, got str 'yes'"),
    (lambda: M.from_name("sideways"), ValueError, "unknown mask name 'sideways'; expected one of full, forward,"),
    (lambda: M.from_name("window:x"), ValueError, "mask name 'window:x': expected 'window:R' with an integer R >= 0"),
    (lambda: M.per_head([]), ValueError, "head_masks must contain at least one Mask"),
    (lambda: M.per_head([M.full(), "forward"]), TypeError, "head_masks[1] must be a Mask, got str"),
    (lambda: M.key_padding(torch.zeros(2, 3)), TypeError,
     "key_padding_mask must be a bool tensor of shape (batch, seq_len) with True = padding, got a torch.float32 "
     "tensor of shape (2, 3)"),
    (lambda: M.key_padding(torch.zeros(3, dtype=torch.bool)), ValueError,
     "key_padding_mask must have shape (batch, seq_len), got (3,)"),
    (lambda: M.full() & "forward", TypeError, "cannot combine a Mask with str using '&'; expected a Mask"),
    (lambda: M.full().materialize(-1), ValueError, "q_len must be a non-negative int, got -1"),
])
def test_bad_input(bad, exc, message):
    """Each is refused by the library's own check, with its message (not some error of the same type from torch)."""
    with pytest.raises(exc, match=re.escape(message)):
        bad()


def test_error_names_the_argument():
    with pytest.raises(ValueError, match="radius"):
        M.window(-3)
    with pytest.raises(ValueError, match="sideways"):
        M.from_name("sideways")


def test_old_names_of_the_directional_masks_still_work_with_a_deprecation_warning():
    with pytest.warns(DeprecationWarning, match=r"masks.forward\(\) is now masks.forward_mask\(\)"):
        old = M.forward(False)
    assert torch.equal(old.materialize(6), M.forward_mask(False).materialize(6))
    with pytest.warns(DeprecationWarning, match=r"masks.backward\(\) is now masks.backward_mask\(\)"):
        old = M.backward()
    assert torch.equal(old.materialize(6), M.backward_mask().materialize(6))


def test_the_causal_predicate_is_causal_under_every_name():
    """``MultiHeadAttention(mask=…)`` decodes incrementally for the causal predicate, whatever it is called."""
    import maskattn

    for mask in (M.causal(), M.forward_mask(), "causal", "forward", M.per_head([M.causal(), M.forward_mask()])):
        assert maskattn.MultiHeadAttention(8, 2, mask=mask).causal, mask
    for mask in (None, M.forward_mask(False), M.backward_mask(), M.band(3, 0), "full"):
        assert not maskattn.MultiHeadAttention(8, 2, mask=mask).causal, mask

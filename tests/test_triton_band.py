"""The Triton band kernels (maskattn.kernels.triton.band: CSAN 1D / 2D, SMAN, MTSA window heads) against the
float64 reference of maskattn.functional.local, under Triton's CPU interpreter on machines without a GPU; on a CUDA
machine (without TRITON_INTERPRET) the compiled kernels on cuda tensors (tests/_triton_device.py)."""

import pytest
import torch
import torch.nn.functional as F

from _triton_device import (DEVICE, EXACT, assert_within_roundings, gpu_operand_dtypes, interpreter_only,
                            needs_kernels, tol, use_table_tiles)
from maskattn.functional.local import _reference, banded_attention, head_area, local_attention, local_attention_maps
from maskattn.kernels.triton import band, runtime

pytestmark = needs_kernels


def make(B, H, n, d_k, d_v, dtype=torch.float32, seed=1, requires_grad=True, transposed=False):
    """q, k, v in ``dtype``; ``transposed``: views of ``(B, n, H, d)`` tensors (the layout of a projection)."""
    g = torch.Generator().manual_seed(seed)
    ts = []
    for d in (d_k, d_k, d_v):
        t = torch.randn(B, n, H, d, generator=g, dtype=torch.float64) * 1.5
        t = t.to(DEVICE, dtype)
        t = t.transpose(1, 2) if transposed else t.transpose(1, 2).contiguous()
        ts.append(t.detach().requires_grad_(requires_grad))
    return ts


def padding(B, n, pattern, seed=2):
    """``(B, n)`` bool key padding: ``"random"``, ``"runs"`` (a run of 8 padded positions in the middle, so the
    band of the rows inside holds only padding; the last batch row fully padded)."""
    if pattern is None:
        return None
    if pattern == "random":
        g = torch.Generator().manual_seed(seed)
        return (torch.rand(B, n, generator=g) < 0.3).to(DEVICE)
    kpm = torch.zeros(B, n, dtype=torch.bool)
    kpm[:, n // 2 - 4:n // 2 + 4] = True
    kpm[-1] = True
    return kpm.to(DEVICE)


def reference(q, k, v, left, right, head_window, edges, kpm, score_mod=None, scale=None):
    """The float64 gathered-keys form (functional.local._reference); public entry points where they apply."""
    q, k, v = (t.detach().double().requires_grad_(True) for t in (q, k, v))
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    if head_window == 1 and score_mod is None and left == right:
        out = local_attention(q, k, v, window=2 * left + 1, key_padding_mask=kpm, scale=scale, backend="reference")
    elif head_window == 1:
        out = banded_attention(q, k, v, (left, right), score_mod=score_mod, key_padding_mask=kpm, scale=scale,
                               backend="reference")
    elif score_mod is None and left == right:
        out = local_attention(q, k, v, window=2 * left + 1, head_window=head_window, key_padding_mask=kpm,
                              head_edges=edges, scale=scale, backend="reference")
    else:
        index, valid = head_area(q.shape[1], head_window, edges, q.device)
        out = _reference(q, k, v, left, right, index, valid, kpm, scale, score_mod, 0.0)[0]
    return out, (q, k, v)


def triton(q, k, v, left, right, head_window, edges, kpm, logsigmoid=False, dropout_p=0.0, scale=None):
    index, valid = head_area(q.shape[1], head_window, edges, q.device)
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    return band.band_triton(q, k, v, left, right, index, valid, kpm, scale, logsigmoid, dropout_p)


def check_against_reference(q, k, v, left, right, head_window, edges, kpm, logsigmoid, tol, seed=3):
    out = triton(q, k, v, left, right, head_window, edges, kpm, logsigmoid)
    assert out.dtype == q.dtype and out.shape == (*q.shape[:3], v.shape[-1])
    ref, leaves = reference(q, k, v, left, right, head_window, edges, kpm, F.logsigmoid if logsigmoid else None)
    grad = torch.randn(ref.shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64).to(DEVICE)
    grads = torch.autograd.grad(out, (q, k, v), grad.to(out.dtype))
    ref_grads = torch.autograd.grad(ref, leaves, grad)
    torch.testing.assert_close(out.double(), ref, atol=tol, rtol=tol)
    for name, mine, theirs, x in zip("qkv", grads, ref_grads, (q, k, v)):
        assert mine.dtype == x.dtype and mine.shape == x.shape
        torch.testing.assert_close(mine.double(), theirs, atol=tol, rtol=tol, msg=lambda m, name=name: f"d{name}: {m}")
    return out, grads


# --------------------------------------------------------------------------------------------------
# the area tables
# --------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("edges", ["truncate", "circular"])
def test_area_tables_are_head_area_and_its_inverse(edges):
    for H in range(1, 8):
        for A in range(1, H + 1, 2):
            area = band.area_table(H, A, edges)
            index, valid = head_area(H, A, edges, "cpu")
            index = torch.arange(H)[:, None] if index is None else index
            valid = torch.ones_like(index, dtype=torch.bool) if valid is None else valid
            width = 1 + 2 * A
            assert len(area) == H * width
            expected_pairs = set()
            for h in range(H):
                row = area[h * width:(h + 1) * width]
                pairs = [(row[1 + 2 * e], row[2 + 2 * e]) for e in range(row[0])]
                assert pairs == [(a, int(index[h, a])) for a in range(A) if valid[h, a]]
                expected_pairs |= {(h, a, g) for a, g in pairs}
            owners = band.owner_table(area, H)
            width = len(owners) // H
            listed = []
            for g in range(H):
                row = owners[g * width:(g + 1) * width]
                listed += [(row[1 + 2 * e], row[2 + 2 * e], g) for e in range(row[0])]
            assert sorted(listed) == sorted(expected_pairs)  # every (h, a) once, under the head it holds


# --------------------------------------------------------------------------------------------------
# against the float64 reference
# --------------------------------------------------------------------------------------------------

# (n, left, right, head_window, head_edges, logsigmoid, H, d_k, d_v, transposed): a covering set over lengths
# 1, 37, 70, 130 (tiles are 16 × 16 under the interpreter), windows 1, 3, 11, an asymmetric band, head areas
# 1, 3 and H with both edges, the log-sigmoid score_mod, head dims that are not powers of 2 and strided inputs
CASES = [
    (1, 5, 5, 1, "truncate", False, 2, 8, 8, False),
    (1, 1, 1, 3, "circular", True, 3, 4, 6, False),
    (37, 0, 0, 1, "truncate", False, 2, 5, 7, True),
    (37, 1, 1, 3, "truncate", False, 4, 8, 8, False),
    (37, 5, 5, 3, "circular", False, 4, 8, 5, True),
    (37, 1, 1, 3, "truncate", False, 3, 6, 8, False),  # head_window = H
    (70, 5, 5, 1, "truncate", False, 2, 16, 16, False),
    (70, 5, 0, 1, "truncate", True, 2, 8, 8, False),
    (70, 3, 0, 3, "truncate", True, 3, 8, 8, True),
    (70, 5, 5, 3, "circular", False, 3, 8, 8, False),  # head_window = H, circular: every head in every area
    pytest.param((130, 5, 5, 1, "truncate", True, 2, 8, 8, False), marks=pytest.mark.slow),  # 10–20 s each
    pytest.param((130, 1, 1, 3, "circular", False, 3, 4, 4, False), marks=pytest.mark.slow),
    (37, 40, 40, 3, "truncate", False, 3, 4, 4, False),  # a band wider than the sequence
]


def case_id(c):
    return "n{}-l{}r{}-hw{}-{}-H{}".format(*c[:5], c[6]) + ("-logsig" if c[5] else "")


@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_float32_matches_reference(case):
    n, left, right, head_window, edges, logsigmoid, H, d_k, d_v, transposed = case
    q, k, v = make(2, H, n, d_k, d_v, transposed=transposed)
    check_against_reference(q, k, v, left, right, head_window, edges, None, logsigmoid, 1e-5)


def test_circular_area_holding_a_head_twice():
    """With more area slots than heads (H = 2, A = 3, circular: head h sees heads 1 − h, h, 1 − h) a head fills
    two slots of one area: its keys enter the softmax twice and the key pass sums both slots' gradients."""
    H, A = 2, 3
    q, k, v = make(1, H, 37, 8, 8)
    index = (torch.arange(H)[:, None] + torch.arange(A)[None, :] - A // 2).remainder(H).to(DEVICE)
    scale = 8 ** -0.5
    out = band.band_triton(q, k, v, 3, 2, index, None, None, scale, False, 0.0)
    leaves = [t.detach().double().requires_grad_(True) for t in (q, k, v)]
    ref = _reference(*leaves, 3, 2, index, None, None, scale, None, 0.0)[0]
    grad = torch.randn(ref.shape, generator=torch.Generator().manual_seed(3), dtype=torch.float64).to(DEVICE)
    torch.testing.assert_close(out.double(), ref, atol=1e-5, rtol=1e-5)
    grads, ref_grads = torch.autograd.grad(out, (q, k, v), grad.float()), torch.autograd.grad(ref, leaves, grad)
    for mine, theirs in zip(grads, ref_grads):
        torch.testing.assert_close(mine.double(), theirs, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("head_window,edges", [(1, "truncate"), (3, "truncate"), (3, "circular")])
def test_key_padding_and_empty_rows(head_window, edges):
    """Rows whose band holds only padding (a run of 8 padded keys, window 3) and a fully padded sequence give 0
    with zero, finite gradients; everything else matches the reference."""
    B, H, n = 3, 3, 37
    q, k, v = make(B, H, n, 8, 8)
    kpm = padding(B, n, "runs")
    kpm[1] |= padding(B, n, "random")[1]
    out, grads = check_against_reference(q, k, v, 1, 1, head_window, edges, kpm, False, 1e-5)
    empty = torch.zeros(B, n, dtype=torch.bool, device=DEVICE)
    empty[:, n // 2 - 3:n // 2 + 3] = True  # rows whose window [i − 1, i + 1] is all padding
    empty[-1] = True
    assert (out.permute(0, 2, 1, 3)[empty] == 0).all()
    for g in grads:
        assert torch.isfinite(g).all()
    dq, dk, dv = grads
    assert (dq.permute(0, 2, 1, 3)[empty] == 0).all()
    assert (dk[-1] == 0).all() and (dv[-1] == 0).all() and (dq[-1] == 0).all()
    assert (dk.permute(0, 2, 1, 3)[kpm] == 0).all() and (dv.permute(0, 2, 1, 3)[kpm] == 0).all()


def test_logsigmoid_with_padding_2d():
    q, k, v = make(2, 3, 70, 8, 8)
    check_against_reference(q, k, v, 5, 5, 3, "truncate", padding(2, 70, "random"), True, 1e-5)


@pytest.mark.parametrize("head_window", [1, 3])
def test_float16(head_window):
    """float16 inputs: float32 softmax and accumulators, float16 dot operands, results in float16."""
    q, k, v = make(2, 3, 70, 16, 16, dtype=torch.float16)
    check_against_reference(q, k, v, 5, 5, head_window, "truncate", padding(2, 70, "random"), head_window == 1,
                            2e-2)


@interpreter_only  # the kernels take float64 only under the interpreter
def test_float64_is_exact():
    q, k, v = make(1, 3, 37, 8, 8, dtype=torch.float64)
    check_against_reference(q, k, v, 5, 0, 3, "circular", padding(1, 37, "random"), True, 1e-12)


# --------------------------------------------------------------------------------------------------
# gradcheck, dropout, determinism
# --------------------------------------------------------------------------------------------------

# gradcheck's inputs are tiny (18 positions still cross a 16-row tile). A failing fast-mode gradcheck recomputes
# the full Jacobian for its message, one kernel call per element (minutes under the interpreter), so one
# directional derivative is checked first: a wrong backward fails there, at once.

def directional_check(fn, inputs, eps=1e-6):
    g = torch.Generator().manual_seed(7)
    directions = [torch.randn(x.shape, generator=g, dtype=x.dtype).to(x.device) for x in inputs]
    out = fn(*inputs)
    weight = torch.randn(out.shape, generator=g, dtype=out.dtype).to(out.device)
    grads = torch.autograd.grad(out, inputs, weight)
    analytical = sum((gr * u).sum() for gr, u in zip(grads, directions))
    with torch.no_grad():
        plus = fn(*(x + eps * u for x, u in zip(inputs, directions)))
        minus = fn(*(x - eps * u for x, u in zip(inputs, directions)))
    numerical = ((plus - minus) * weight).sum() / (2 * eps)
    torch.testing.assert_close(analytical, numerical, atol=1e-6, rtol=1e-6)


@interpreter_only  # gradcheck needs float64
def test_gradcheck_float64():
    q, k, v = make(1, 3, 18, 3, 2, dtype=torch.float64)
    kpm = padding(1, 18, "random")
    index, valid = head_area(3, 3, "circular", DEVICE)

    def fn(q, k, v):
        return band.band_triton(q, k, v, 2, 1, index, valid, kpm, 0.7, True, 0.0)

    directional_check(fn, (q, k, v))
    assert torch.autograd.gradcheck(fn, (q, k, v), fast_mode=True)


@pytest.mark.slow  # 30–45 s; DMAN's and MTSA's kernels redraw the same Philox mask in their default gradchecks
@interpreter_only
def test_gradcheck_float64_with_dropout():
    """The function re-seeds before each evaluation, so every evaluation draws the same keep-mask; backward
    must redraw exactly the mask forward used."""
    q, k, v = make(1, 3, 18, 3, 2, dtype=torch.float64)
    index, valid = head_area(3, 3, "truncate", DEVICE)

    def fn(q, k, v):
        torch.manual_seed(0)
        return band.band_triton(q, k, v, 2, 2, index, valid, None, 0.5, False, 0.3)

    assert not torch.equal(fn(q, k, v), band.band_triton(q, k, v, 2, 2, index, valid, None, 0.5, False, 0.0))
    directional_check(fn, (q, k, v))
    assert torch.autograd.gradcheck(fn, (q, k, v), fast_mode=True)


def test_dropout_drops_with_the_flash_attention_scheme():
    """With one-hot values (key j of head g → feature g·n + j) the output is the dropped probability map:
    each entry is either 0 or the undropped probability / (1 − p), and about p of the allowed ones are 0."""
    B, H, n, p = 2, 3, 20, 0.5
    q, k, _ = make(B, H, n, 4, 4, dtype=EXACT, requires_grad=False)
    v = torch.eye(H * n, dtype=EXACT, device=DEVICE).view(H, n, H * n).expand(B, H, n, H * n)
    maps = local_attention_maps(q, k, window=5, head_window=3, head_edges="truncate")  # (B, H, n, H, n)
    index, valid = head_area(H, 3, "truncate", DEVICE)
    torch.manual_seed(5)
    out = band.band_triton(q, k, v, 2, 2, index, valid, None, 0.5, False, p).view(B, H, n, H, n)
    allowed = maps > 0
    kept = out != 0
    assert not kept[~allowed].any()
    torch.testing.assert_close(out[kept], maps[kept].to(out.dtype) / (1 - p), atol=tol(1e-12), rtol=tol(1e-12))
    dropped = (~kept & allowed).sum() / allowed.sum()
    assert abs(dropped.item() - p) < 0.06, dropped
    torch.manual_seed(5)
    again = band.band_triton(q, k, v, 2, 2, index, valid, None, 0.5, False, p).view(B, H, n, H, n)
    assert torch.equal(out, again)  # the seed comes from PyTorch's generator
    other = band.band_triton(q, k, v, 2, 2, index, valid, None, 0.5, False, p).view(B, H, n, H, n)
    assert not torch.equal(out, other)


def test_backward_is_deterministic():
    """Two backward passes with the same dropout seed give bit-identical gradients (no atomics). Under Triton's
    interpreter the programs of a launch run one after another, always in the same order, so on the CPU this fails
    only on a dropout mask that is not reproduced; an ordering dependence shows in tests/test_triton_program_order.py,
    which runs the programs in reversed order too."""
    q, k, v = make(1, 4, 37, 8, 8)
    kpm = padding(1, 37, "random")
    torch.manual_seed(0)
    out = triton(q, k, v, 5, 5, 3, "circular", kpm, dropout_p=0.2)
    grad = torch.randn_like(out)
    first = torch.autograd.grad(out, (q, k, v), grad, retain_graph=True)
    second = torch.autograd.grad(out, (q, k, v), grad)
    for a, b in zip(first, second):
        assert torch.equal(a, b)


def check_tiles_against_reference_and_repeat(n, d, left, right):
    """Heads of ``d`` features over a head area of 3 with log-sigmoid scores, a run of padded keys and length ``n``:
    output and gradients match the float64 reference, and a second backward with dropout is bit-identical."""
    q, k, v = make(2, 3, n, d, d, EXACT)
    kpm = padding(2, n, "runs")
    check_against_reference(q, k, v, left, right, 3, "truncate", kpm, True, tol(1e-10))
    grads = []
    for _ in range(2):
        torch.manual_seed(0)
        out = triton(q, k, v, left, right, 3, "truncate", kpm, logsigmoid=True, dropout_p=0.2)
        grads.append(torch.autograd.grad(out, (q, k, v), torch.ones_like(out)))
    for a, b in zip(*grads):
        assert torch.equal(a, b)


@pytest.mark.parametrize("width, left, right, n", [(64, 40, 40, 150), (128, 40, 40, 150), (64, 5, 5, 70)],
                         ids=["wide-64", "wide-128", "narrow"])
def test_the_gpus_tiles_match_float64_reference(monkeypatch, width, left, right, n):
    """The tiles sm_90 runs for heads of ``width`` (the 227 KB entries of :data:`runtime.TILE_TABLE`: 64-row tiles
    for wide bands, the key pass 64 or 32 queries × 64 keys; narrow, the same at both widths: 16 × 32 and 32 × 16)
    under the interpreter, on a head area of 3 with log-sigmoid scores, a run of padded keys and a length that ends
    inside every tile: output and gradients match the float64 reference, and a second backward with dropout is
    bit-identical (no atomics; under the interpreter, where the programs run one after another in one order, only a
    dropout mask that is not reproduced can fail that: tests/test_triton_program_order.py reverses the order)."""
    use_table_tiles(monkeypatch, "band", "227K", width)
    check_tiles_against_reference_and_repeat(n, 8, left, right)


# --------------------------------------------------------------------------------------------------
# torch.compile, autocast, empty inputs, unsupported
# --------------------------------------------------------------------------------------------------

def test_compile_fullgraph_dynamic():
    from torch._dynamo.testing import CompileCounterWithBackend

    torch._dynamo.reset()
    counter = CompileCounterWithBackend("aot_eager")
    H = 3
    index, valid = head_area(H, 3, "truncate", DEVICE)

    def fn(q, k, v, kpm):
        return band.band_triton(q, k, v, 2, 1, index, valid, kpm, 0.4, True, 0.0)

    compiled = torch.compile(fn, fullgraph=True, dynamic=True, backend=counter)
    for n in (20, 37, 45):
        q, k, v = make(1, H, n, 8, 8)
        kpm = padding(1, n, "random")
        out = compiled(q, k, v, kpm)
        grads = torch.autograd.grad(out.square().sum(), (q, k, v))
        eager = fn(q, k, v, kpm)
        eager_grads = torch.autograd.grad(eager.square().sum(), (q, k, v))
        assert torch.equal(out, eager)
        for a, b in zip(grads, eager_grads):
            torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-6)
    assert counter.frame_count <= 2
    torch._dynamo.reset()


def test_autocast_is_switched_off_inside():
    q, k, v = make(1, 2, 37, 8, 8, requires_grad=False)
    plain = triton(q, k, v, 5, 5, 1, "truncate", None)
    with torch.autocast(DEVICE, dtype=torch.bfloat16 if DEVICE == "cpu" else torch.float16):
        under = triton(q, k, v, 5, 5, 1, "truncate", None)
    assert under.dtype == torch.float32 and torch.equal(under, plain)


def test_empty_sequence():
    q, k, v = make(2, 3, 0, 8, 8)
    out = triton(q, k, v, 5, 5, 3, "truncate", None)
    assert out.shape == (2, 3, 0, 8)
    grads = torch.autograd.grad(out.sum(), (q, k, v), allow_unused=True)
    assert all(g is None or g.shape == x.shape for g, x in zip(grads, (q, k, v)))


def test_custom_op_registration():
    q, k, v = make(1, 3, 20, 8, 8)
    area = band.area_table(3, 3, "truncate")
    kpm = padding(1, 20, "random").to(torch.uint8)
    torch.library.opcheck(torch.ops.maskattn.band_triton.default, (q, k, v, kpm, area, None, 2, 2, 0.3, True, 0.0),
                          test_utils=("test_schema", "test_faketensor", "test_autograd_registration"))


def test_unsupported():
    assert band.unsupported(device=DEVICE, dtype=torch.float32, head_dims={"d_k": 64, "d_v": 64},
                            score_mod=None) == []
    assert band.unsupported(device=DEVICE, dtype=torch.float32, head_dims={"d_k": 64, "d_v": 64},
                            score_mod="logsigmoid") == []
    reasons = band.unsupported(device=DEVICE, dtype=torch.int32, head_dims={"d_k": 300, "d_v": 64},
                               score_mod="other")
    assert len(reasons) == 3
    assert any("d_k = 300" in r for r in reasons)
    assert any("score_mod other than None or F.logsigmoid" in r for r in reasons)
    assert "CUDA" in band.unsupported(device="mps", dtype=torch.float32, head_dims={"d_k": 8}, score_mod=None)[0]


@interpreter_only
@pytest.mark.parametrize("head_window, logsigmoid", [(1, False), (3, True)])
def test_bfloat16_with_the_gpus_operand_dtypes_matches_float64(head_window, logsigmoid):
    """issue 41 §1.6: bfloat16 as the GPU computes it (tests/_triton_device.py ``gpu_operand_dtypes``: bfloat16
    tensors, loads, stores and casts; every ``tl.dot`` operand bfloat16, products exact, float32 accumulation)
    against the float64 oracle on the same bfloat16 inputs and upstream gradient.

    Tolerance, from bfloat16's unit roundoff u = 2⁻⁸: ``max |error| <= 2·K·u·max |reference|`` with K the
    roundings on the longest path — forward K = 2 (the probabilities before ``P·V``, the stored output); backward
    K = 4 (the recomputed probabilities before ``Pᵀ·dO``, ``dS`` before ``dS·K`` / ``dSᵀ·Q``, the stored output
    that ``Δ = rowsum(dO ⊙ O)`` reads, the stored gradient)."""
    q, k, v = make(2, 3, 70, 16, 16, dtype=torch.bfloat16)
    kpm = padding(2, 70, "random")
    with gpu_operand_dtypes():
        out = triton(q, k, v, 5, 5, head_window, "truncate", kpm, logsigmoid)
        grad = torch.randn(out.shape, generator=torch.Generator().manual_seed(3)).to(torch.bfloat16)
        got = torch.autograd.grad(out, (q, k, v), grad)
    ref, leaves = reference(q, k, v, 5, 5, head_window, "truncate", kpm, F.logsigmoid if logsigmoid else None)
    assert out.dtype == torch.bfloat16
    assert_within_roundings(out, ref, 2, "out")
    for name, mine, theirs in zip("qkv", got, torch.autograd.grad(ref, leaves, grad.double())):
        assert_within_roundings(mine, theirs, 4, f"d{name}")
    float32_path = triton(q, k, v, 5, 5, head_window, "truncate", kpm, logsigmoid)
    assert not torch.equal(float32_path, out)  # the hook changed what ran


# --------------------------------------------------------------------------------------------------
# d = 150: the feature axis as a main and a tail block (issue 52)
# --------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("cls, left, right, n", [("227K", 40, 40, 150), ("163K", 40, 40, 150), ("227K", 5, 5, 70)],
                         ids=["wide-227K", "wide-163K", "narrow"])
def test_d150_in_feature_blocks_with_the_gpus_tiles_matches_float64(monkeypatch, cls, left, right, n):
    """d 150 (the sentence presets' heads) runs as 160 = 128 + 32 features in every pass, with the tiles a GPU of
    class ``cls`` takes at the split width 160 (:data:`runtime.TILE_TABLE`: on the 227 KB class 64 × 64 on one
    warpgroup and the key pass's 128 streamed queries × 64 held keys; on the 163 KB class the key pass's 16 × 16;
    narrow, 16 × 32 and 16 × 16), on a head area of 3 with log-sigmoid scores, a run of padded keys and a length
    that ends inside every tile: output and every gradient match the float64 reference, and a second backward with
    dropout is bit-identical (no atomics)."""
    use_table_tiles(monkeypatch, "band", cls, 160)
    check_tiles_against_reference_and_repeat(n, 150, left, right)


@interpreter_only
def test_d150_in_one_block_where_a_pass_does_not_split(monkeypatch):
    """Where a pass does not split the features (``runtime.splits_features`` False: a class without an entry at the
    split width), it runs the 160 features in one block of 256, masked at the width: the same results, and keys and
    values of other widths (d_k 150, d_v 40) in their own blocks."""
    monkeypatch.setattr(runtime, "splits_features", lambda *args, **kwargs: False)
    q, k, v = make(1, 2, 37, 150, 40, EXACT)
    check_against_reference(q, k, v, 5, 3, 1, "truncate", padding(1, 37, "random"), False, tol(1e-10))


@interpreter_only
@pytest.mark.parametrize("left, right", [(40, 40), (5, 5)], ids=["wide", "narrow"])
def test_d150_bfloat16_with_the_gpus_operand_dtypes_matches_float64(left, right):
    """issue 52 (deliverable 6): d 150 in bfloat16 as the GPU computes it (``gpu_operand_dtypes``), every pass on its
    128 + 32 blocks: within ``2·K·u·max |reference|`` of the float64 oracle on the same bfloat16 inputs (K = 2
    forward, 4 backward, as at the one-block widths: :func:`test_bfloat16_with_the_gpus_operand_dtypes_matches_float64`)."""
    q, k, v = make(1, 3, 70, 150, 150, dtype=torch.bfloat16)
    kpm = padding(1, 70, "random")
    with gpu_operand_dtypes():
        out = triton(q, k, v, left, right, 3, "truncate", kpm, True)
        grad = torch.randn(out.shape, generator=torch.Generator().manual_seed(3)).to(torch.bfloat16)
        got = torch.autograd.grad(out, (q, k, v), grad)
    ref, leaves = reference(q, k, v, left, right, 3, "truncate", kpm, F.logsigmoid)
    assert out.dtype == torch.bfloat16
    assert_within_roundings(out, ref, 2, "out")
    for name, mine, theirs in zip("qkv", got, torch.autograd.grad(ref, leaves, grad.double())):
        assert_within_roundings(mine, theirs, 4, f"d{name}")


def _recorded_launches(arch: int, d: int, left: int):
    """The band's launches of one bfloat16 call (forward and backward) with heads of ``d`` features and the band
    ``i − left … i + left``, recorded as on an ``arch`` device: ``{kernel: launch}``."""
    with runtime.recording(runtime.TARGETS[arch]) as recorded:
        q, k, v = (torch.randn(2, 40, 2, d).to(torch.bfloat16).transpose(1, 2).requires_grad_() for _ in range(3))
        out = band.band_triton(q, k, v, left, left, None, None, None, d ** -0.5, False, 0.0)
        torch.autograd.grad(out.float().sum(), (q, k, v))
    return {la.kernel.fn.__name__: la for la in recorded}


@pytest.mark.parametrize("arch", [80, 86, 90, 100, 120])
@pytest.mark.parametrize("left", [40, 5], ids=["wide", "narrow"])
def test_band_launches_at_d150_and_at_powers_of_two(arch, left):
    """d 150: every pass launches 160 = 128 + 32 features (``BLOCK_D*`` 160, ``TAIL_D*`` 32, not 256) with its
    table entry at the split width 160 on every class (:func:`band.band_passes`); d 64 / 128 / 256 launch as before
    the feature-axis tiling — ``BLOCK_D*`` the width, no ``TAIL_D*`` (the kernels' default 0: no tail code is
    traced) — with their own width's tiles."""
    cls = runtime.tile_class(runtime.TARGETS[arch])
    for d in (150, 64, 128, 256):
        launches = _recorded_launches(arch, d, left)
        assert set(launches) == {"band_fwd", "band_bwd_q", "band_bwd_kv"}
        for name, entry in zip(("band_fwd", "band_bwd_q", "band_bwd_kv"), band.band_passes(left, left)):
            kwargs = launches[name].kwargs
            width = 160 if d == 150 else d
            tiles = runtime.ARCH_TILES.get((entry, arch, width)) or runtime.TILE_TABLE[(entry, cls, width)]
            assert (kwargs["BLOCK_M"], kwargs["BLOCK_N"], kwargs["num_warps"], kwargs["num_stages"]) == (
                tiles.block_m, tiles.block_n, tiles.warps, tiles.stages), (entry, d)
            if d == 150:
                assert (kwargs["BLOCK_DK"], kwargs["TAIL_DK"], kwargs["BLOCK_DV"], kwargs["TAIL_DV"]) == (160, 32, 160, 32)
            else:
                assert kwargs["BLOCK_DK"] == kwargs["BLOCK_DV"] == d and not {"TAIL_DK", "TAIL_DV"} & set(kwargs)

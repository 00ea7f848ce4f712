"""Where tests/test_triton_*.py run the Triton kernels (issue 41 §1 item 7; docs/design.md §2).

On a machine with CUDA and without ``TRITON_INTERPRET`` the tests run the compiled CUDA kernels on ``cuda`` tensors —
the first thing a lent GPU should run. Under Triton's interpreter (``TRITON_INTERPRET=1``, which tests/conftest.py
sets where there is no CUDA) they run the same kernels on ``cpu`` tensors. The kernels take float64 only under the
interpreter, so the oracle comparisons run in :data:`EXACT` — float64 there, float32 (IEEE ``tl.dot``) on CUDA — at
the tolerance :func:`tol` gives for it. Tests of what only the interpreter can show are marked
:data:`interpreter_only`; those that need the compiled kernels, :data:`cuda_only`."""

from __future__ import annotations

import contextlib

import pytest
import torch

from maskattn.kernels.triton import runtime

#: Triton's interpreter runs the kernels (on CPU tensors)
INTERPRETED = runtime.interpreted()
#: ``cuda`` where a GPU is present and the interpreter is off, else ``cpu``
DEVICE = "cuda" if torch.cuda.is_available() and not INTERPRETED else "cpu"
#: the dtype of the comparisons with the float64 oracles: float64 under the interpreter, float32 on CUDA
EXACT = torch.float64 if INTERPRETED else torch.float32
#: float32's unit roundoff (2⁻²⁴) times the growth of the sums in the tests' small problems (≤ 130 keys of ≤ 33
#: features, scores and gradients of order 1–10): the floor of the CUDA comparisons in :data:`EXACT`
CUDA_FLOOR = 1e-4

needs_kernels = pytest.mark.skipif(not runtime.installed() or runtime.device_reason(DEVICE) is not None,
                                   reason="needs triton (CUDA, or its interpreter on CPU: TRITON_INTERPRET=1)")
interpreter_only = pytest.mark.skipif(not INTERPRETED, reason="runs the kernels under Triton's interpreter")
cuda_only = pytest.mark.skipif(DEVICE != "cuda", reason="needs a CUDA GPU without TRITON_INTERPRET")


def tol(value: float) -> float:
    """``value`` (a tolerance of a comparison in :data:`EXACT`) under the interpreter; on CUDA, where :data:`EXACT`
    is float32, at least :data:`CUDA_FLOOR`."""
    return value if INTERPRETED else max(value, CUDA_FLOOR)


#: bfloat16's unit roundoff: 8 significant bits, so rounding to nearest is off by at most 2⁻⁸ of the value
BF16_U = 2.0 ** -8


@contextlib.contextmanager
def gpu_operand_dtypes():
    """Inside (under the interpreter only): the kernels run on bfloat16 tensors as on the GPU — every load, store
    and cast in bfloat16, every ``tl.dot`` operand in the dtype the GPU multiplies (bfloat16 for bfloat16 inputs;
    for float16 inputs MTSA's ``E``, ``v ⊙ E``, the weights and ``dO / D`` in bfloat16, q and k in float16).

    Outside, the wrappers compute bfloat16 in float32 under the interpreter (:func:`.runtime.kernel_dtype`), because
    the interpreter's ``tl.dot`` multiplies bfloat16 operands as their 16-bit integer storage. This test-only hook
    (nothing in the kernels or the GPU path changes) keeps bfloat16 tensors bfloat16 and decodes bfloat16
    ``tl.dot`` operands exactly to float32 before the product, as tensor cores do (exact products, float32
    accumulation)."""
    import triton.language as tl
    from triton.runtime import interpreter

    from maskattn.kernels.triton import runtime as rt

    assert INTERPRETED, "the hook emulates the GPU's operand dtypes under Triton's interpreter"
    original_dot, original_kernel_dtype = interpreter.InterpreterBuilder.create_dot, rt.kernel_dtype

    def create_dot(self, a, b, d, *args):
        a, b = (self.cast_impl(x, tl.float32) if x.dtype.scalar == tl.bfloat16 else x for x in (a, b))
        return original_dot(self, a, b, d, *args)

    interpreter.InterpreterBuilder.create_dot = create_dot
    rt.kernel_dtype = lambda dtype: dtype
    try:
        yield
    finally:
        interpreter.InterpreterBuilder.create_dot = original_dot
        rt.kernel_dtype = original_kernel_dtype


def use_table_tiles(monkeypatch, prefix: str, cls: str, width: int) -> None:
    """Under the interpreter, make the launchers of the kernels whose names start with ``prefix`` take the tiles
    :data:`runtime.TILE_TABLE` gives shared-memory class ``cls`` at head width ``width`` (the GPU's shapes, not the
    interpreter's 16 × 16), so parity tests run the tile shapes a GPU runs; on CUDA the device's own stay."""
    if not INTERPRETED:
        return
    original = runtime.tiles

    def tiles(kernel, head_dim, device, dtype=torch.float16):
        if kernel.startswith(prefix):
            return runtime.TILE_TABLE[(kernel, cls, width)]
        return original(kernel, head_dim, device, dtype)

    monkeypatch.setattr(runtime, "tiles", tiles)


def assert_within_roundings(got: torch.Tensor, want: torch.Tensor, roundings: int, name: str, u: float = BF16_U):
    """``max |got − want| <= 2·roundings·u·max |want|``: the float64 oracle ``want`` against a result computed with
    ``roundings`` successive roundings to a format of unit roundoff ``u`` on its longest path (each rounding moves a
    term by at most ``u`` of its size; the factor 2 allows the terms of a normalised row to add up to twice the
    row's largest value, as they do for a softmax row of outputs or gradients)."""
    scale = want.abs().max().item()
    error = (got.double() - want).abs().max().item()
    assert error <= 2 * roundings * u * scale, f"{name}: max error {error:.3g} > {2 * roundings} u × {scale:.3g}"

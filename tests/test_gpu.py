"""CUDA: the default paths run without a host synchronisation, every flex training path's gradients equal the
reference backend's, and every mechanism trains under bf16 / fp16 autocast. Marked ``gpu``: skipped without CUDA
(``python -m pytest -m gpu``; ``scripts/gpu_check.sh`` runs them and reports)."""

from __future__ import annotations

import pytest
import torch

import maskattn

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

D_MODEL, HEADS = 64, 4


def build(name, **options):
    torch.manual_seed(0)
    return maskattn.create_attention(name, D_MODEL, 2 if name == "disa" else HEADS, **options).cuda()


def batch(n=37, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(2, n, D_MODEL, device="cuda", generator=g)
    kpm = torch.zeros(2, n, dtype=torch.bool, device="cuda")
    kpm[1, n - 9:] = True
    return x, kpm


@pytest.mark.parametrize("name", [n for n in maskattn.list_attentions() if n != "disa"])
@pytest.mark.parametrize("training", [True, False], ids=["train", "eval"])
def test_default_paths_do_not_synchronise(name, training):
    module = build(name).train(training)
    x, kpm = batch()
    x.requires_grad_(training)
    module(x, kpm)  # warm-up: lazy initialisation (cuBLAS handles, compiled flex) may synchronise once
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        out = module(x, kpm)
        if training:
            out.backward(torch.ones_like(out))
    finally:
        torch.cuda.set_sync_debug_mode("default")


def _flex_cases():
    for name in maskattn.list_attentions():
        if "flex" in maskattn.attention_info(name).backends:
            yield name


@pytest.mark.parametrize("name", list(_flex_cases()))
def test_flex_gradients_equal_the_reference(name):
    """q, k, v (through the projections), the source2token map, DMAN's W, P and U: every parameter's gradient."""
    x, kpm = batch()
    grads = {}
    for backend in ("flex", "reference"):
        module = build(name, backend=backend).double() if backend == "reference" else build(name, backend=backend)
        inputs = (x.double() if backend == "reference" else x).clone().requires_grad_()
        out = module(inputs, kpm)
        out.backward(torch.ones_like(out))
        grads[backend] = {"x": inputs.grad.float(), **{n: p.grad.float() for n, p in module.named_parameters()
                                                         if p.grad is not None}}
    assert grads["flex"].keys() == grads["reference"].keys()
    for key, reference in grads["reference"].items():
        torch.testing.assert_close(grads["flex"][key], reference, atol=2e-4, rtol=2e-3, msg=f"{name}: {key}")


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("name", maskattn.list_attentions())
def test_cuda_autocast_training_is_finite_and_close_to_float32(name, dtype):
    module = build(name).train()
    x, kpm = batch()
    out32 = module(x, kpm)
    with torch.autocast("cuda", dtype=dtype):
        out = module(x, kpm)
    out.float().backward(torch.ones_like(out, dtype=torch.float32))
    assert torch.isfinite(out).all()
    assert all(torch.isfinite(p.grad).all() for p in module.parameters() if p.grad is not None)
    eps = torch.finfo(dtype).eps
    assert (out.float() - out32).norm() <= 8 * eps * out32.norm()


def test_compiled_flex_compiles_once_for_many_lengths():
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    module = build("csan2d", backend="flex").eval()
    with torch.no_grad():
        for n in range(64, 64 + 16 * 8, 8):
            module(*batch(n))
    assert counters["stats"]["unique_graphs"] <= 2

"""Mixed precision: every mechanism and every model type trains under ``torch.autocast`` (CPU bfloat16 here;
bf16 / fp16 on CUDA in the gpu tests), finite and close to float32, with float32 parameters; the ``-gpu``
presets' models take training steps through the same code path as ``train.amp: true``."""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import maskattn
from maskattn import masks as M
from maskattn.errors import ConfigError
from maskattn.functional import (dot_product_attention, dynamic_mask_attention, local_attention, mask_attention,
                                 tensorized_attention)
from maskattn.train import Trainer, load_config, preset_path

from _train_helpers import tiny_config, write_parallel, write_sentiment

D_MODEL = 32
BF16_EPS = torch.finfo(torch.bfloat16).eps  # 2**-7


def build(name, **options):
    torch.manual_seed(0)
    return maskattn.create_attention(name, D_MODEL, 2 if name == "disa" else 4, **options)


@pytest.mark.parametrize("name", maskattn.list_attentions())
def test_bf16_autocast_matches_float32_within_the_dtype_tolerance(name):
    """Forward and backward under CPU bfloat16 autocast agree with float32 to a few bfloat16 epsilons in relative
    norm (the projections run in bfloat16; the kernels accumulate in float32): the output, the input gradient, and
    every parameter gradient relative to the largest one (some true gradients are ~0 by the softmax's shift
    invariance, e.g. MTSA's source2token output bias, where only an absolute comparison means anything);
    parameters stay float32."""
    module = build(name).eval()
    x = torch.randn(2, 23, D_MODEL)
    kpm = torch.zeros(2, 23, dtype=torch.bool)
    kpm[1, 17:] = True
    grad = torch.randn(2, 23, D_MODEL)
    results = {}
    for precision in ("fp32", "bf16"):
        inputs = x.clone().requires_grad_()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "bf16"):
            out = module(inputs, kpm)
        out.backward(grad)
        results[precision] = (out.float(), inputs.grad, [p.grad.clone() for p in module.parameters()])
        module.zero_grad()
    (out32, dx32, dp32), (out16, dx16, dp16) = results["fp32"], results["bf16"]
    assert all(p.dtype == torch.float32 for p in module.parameters())
    tol = 4 * BF16_EPS
    assert (out16 - out32).norm() <= tol * out32.norm()
    assert (dx16 - dx32).norm() <= tol * dx32.norm()
    scale = max(b.norm() for b in dp32)
    for a, b in zip(dp16, dp32):
        assert torch.isfinite(a).all() and (a - b).norm() <= tol * scale


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(name=st.sampled_from(maskattn.list_attentions()), dtype=st.sampled_from(["bfloat16", "float16"]),
       n=st.integers(1, 24), seed=st.integers(0, 2**16), dropout=st.sampled_from([0.0, 0.2]))
def test_fuzz_half_precision_training_is_finite(name, dtype, n, seed, dropout):
    """bfloat16 with inputs ×100 and float16 with inputs ×10 (beyond that the projections' own weight
    gradients leave float16's range, as for any nn.Linear — the attention functions below take ×100):
    forward and backward finite, padded positions get no gradient."""
    torch.manual_seed(seed)
    module = build(name, dropout=dropout).train()
    x = (torch.randn(2, n, D_MODEL) * (100 if dtype == "bfloat16" else 10)).requires_grad_()
    kpm = torch.arange(n)[None, :] >= torch.tensor([[n], [max(1, n // 2)]])
    with torch.autocast("cpu", dtype=getattr(torch, dtype)):
        out = module(x, kpm)
    out.backward(torch.randn_like(out))
    assert torch.isfinite(out).all() and torch.isfinite(x.grad).all() and (x.grad[kpm] == 0).all()
    assert all(torch.isfinite(p.grad).all() for p in module.parameters() if p.grad is not None)


def _core_calls(q, k, v, s2t, kpm):
    B, H, n, _ = q.shape
    a, table, u = q.new_ones(B, n), q.new_zeros(9), q.new_zeros(H)
    return {
        "dot_product": lambda: dot_product_attention(q, k, v, M.causal(), key_padding_mask=kpm),
        "mask_attention": lambda: mask_attention(q, k, v, torch.rand(B, H, n, n, dtype=q.dtype)),
        "dman": lambda: dynamic_mask_attention(q, k, v, a, table, u, key_padding_mask=kpm),
        "csan2d": lambda: local_attention(q, k, v, window=5, head_window=3, key_padding_mask=kpm),
        "mtsa": lambda: tensorized_attention(q, k, v, s2t, M.per_head([M.forward_mask(), M.backward_mask()] * 2),
                                             key_padding_mask=kpm),
        "mtsa_window": lambda: tensorized_attention(q, k, v, s2t, M.window(3), key_padding_mask=kpm),
    }


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("call", list(_core_calls(*(torch.zeros(1, 4, 2, 8),) * 4, None)))
def test_attention_functions_take_half_precision_inputs_x100(dtype, call):
    """The kernels compute half-precision inputs in float32: q, k, v ×100 (scores of ±1e4) stay finite."""
    torch.manual_seed(0)
    q, k, v, s2t = (torch.randn(2, 4, 19, 8, dtype=dtype).mul(100).requires_grad_() for _ in range(4))
    kpm = torch.zeros(2, 19, dtype=torch.bool)
    kpm[1, 11:] = True
    out = _core_calls(q, k, v, s2t, kpm)[call]()
    assert out.dtype == dtype and torch.isfinite(out).all()
    out.backward(torch.randn_like(out))
    assert all(torch.isfinite(t.grad).all() for t in (q, k, v))


@pytest.mark.parametrize("preset", ["multi30k-man-gpu"] + [pytest.param(p, marks=pytest.mark.slow) for p in (
    "multi30k-transformer-gpu", "multi30k-csan-gpu", "multi30k-mtsa-encoder-gpu")])  # 20 s each
def test_gpu_presets_train_under_cpu_bf16_autocast(tmp_path, preset):
    """The preset's own model (6 + 6 layers, d_model 512) takes 2 training steps with ``amp: true`` on the CPU —
    the code path ``amp`` uses on a GPU, in bfloat16 — with finite losses and float32 parameters."""
    data = write_parallel(tmp_path, n_train=48, n_eval=4)
    cfg = load_config(preset_path(preset), [
        f"data.dir={data}", "data.subword_vocab=60", "data.max_tokens=96", "data.max_len=24", "data.test=null", "train.device=cpu",
        "train.compile=false",
        "train.max_steps=2", "train.eval_every=2", "train.metric=loss", "train.progress=false", "train.test_beam=1",
        "train.keep_last=false", f"train.out_dir={tmp_path / 'run'}", "train.num_threads=1"])
    assert cfg.train.amp is True
    trainer = Trainer(cfg)
    assert trainer.amp_dtype == torch.bfloat16
    summary = trainer.fit()
    assert summary["steps"] == 2
    assert all(p.dtype == torch.float32 and torch.isfinite(p).all() for p in trainer.model.parameters())


def test_amp_choices_and_refusals(tmp_path):
    data = write_sentiment(tmp_path)
    for amp, dtype in ((True, torch.bfloat16), ("bf16", torch.bfloat16), (False, None)):
        trainer = Trainer(tiny_config(data, tmp_path / f"run-{amp}", train={"amp": amp, "max_steps": 2}))
        assert trainer.amp_dtype == dtype
        summary = trainer.fit()
        assert summary["steps"] == 2
    with pytest.raises(ConfigError, match="train.amp=fp16 needs a CUDA device.*use train.amp=bf16"):
        Trainer(tiny_config(data, tmp_path / "fp16", train={"amp": "fp16"}))
    with pytest.raises(ConfigError, match="train.amp must be true, false, bf16 or fp16"):
        tiny_config(data, tmp_path / "x", train={"amp": "fp8"})

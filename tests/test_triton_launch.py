"""What a GPU enforces and Triton's interpreter does not, checked on the CPU (docs/gpu.md, "Offline compile
check"): grids within CUDA's limits, 64-bit offsets past 2³¹ elements, an accurate sigmoid over the whole float
range, the device limits the registry declares, the switch that takes Triton out of ``auto``, and a failing launch
that names it. The compilation itself is tests/test_triton_compile.py."""

from __future__ import annotations

import math
import os
import subprocess
import sys
import textwrap
from dataclasses import replace

import pytest
import torch

from maskattn import backends
from maskattn.errors import InputError
from maskattn.kernels import precision
from maskattn.kernels.triton import runtime

pytestmark = pytest.mark.skipif(not runtime.installed(), reason="needs the triton package")

CUDA_GRID_Y = 65535


def _heads(B, H, n, d, dtype=torch.float16):
    return torch.randn(B, n, H, d, dtype=torch.float32).to(dtype).transpose(1, 2).requires_grad_()


def _record_all(B, H, n, d):
    """Every launch of MTSA, DMAN and the band, forward and backward, as on an H100."""
    from maskattn.kernels.triton.band import band_triton
    from maskattn.kernels.triton.dman import dman_triton
    from maskattn.kernels.triton.tensorized import tensorized_triton
    launches = {}
    with runtime.recording(runtime.TARGETS[90]) as recorded:
        q, k, v, s2t = (_heads(B, H, n, d) for _ in range(4))
        out, _ = tensorized_triton(q, k, v, s2t, [(math.inf, 0)] * H, None, scale="log_sigmoid", dropout_p=0.0)
        torch.autograd.grad(out.sum(), (q, k, v, s2t))
        launches["mtsa"] = list(recorded)
        recorded.clear()
        a, table, u = torch.randn(B, n, requires_grad=True), torch.randn(9, requires_grad=True), torch.randn(H)
        out = dman_triton(q, k, v, a, table, u.requires_grad_(), causal=True, key_padding_mask=None, q_offset=0,
                          dropout_p=0.0, mask_floor=None)
        torch.autograd.grad(out.sum(), (q, k, v, a, table, u))
        launches["dman"] = list(recorded)
        recorded.clear()
        out = band_triton(q, k, v, 2, 2, None, None, None, d ** -0.5, False, 0.0)
        torch.autograd.grad(out.sum(), (q, k, v))
        launches["band"] = list(recorded)
    return launches


def test_grids_stay_within_cuda_limits_past_65535_heads_times_batch():
    """B·H = 70,000 (> 65,535, CUDA's limit on gridDim.y, where the pairs used to go): every launch is one grid
    axis of tiles × B·H programs."""
    B, H, n, d = 35_000, 2, 3, 16
    from maskattn.kernels.triton.tensorized import ELEMENTWISE_KERNELS
    launches = _record_all(B, H, n, d)
    for family, recorded in launches.items():
        # forward, key pass, query pass (and MTSA's fused elementwise kernels around them, whose grids are checked too)
        assert len([la for la in recorded if la.kernel.fn.__name__ not in ELEMENTWISE_KERNELS]) == 3, family
        for launch in recorded:
            assert len(launch.grid) == 1 and launch.grid[0] <= runtime.GRID_LIMIT, (family, launch.grid)
            assert all(size <= CUDA_GRID_Y for size in launch.grid[1:])
            assert launch.grid[0] >= B * H  # at least one tile per (batch, head) pair


def test_a_launch_past_the_grid_limit_is_refused_with_a_message():
    with pytest.raises(InputError, match="exceeds CUDA's grid limit"):
        runtime.launch(object(), runtime.GRID_LIMIT + 1)


def test_a_failing_launch_names_the_switch_that_takes_triton_out_of_auto():
    class Broken:
        def __getitem__(self, grid):
            def run(*args, **kwargs):
                raise RuntimeError("out of resources: shared memory")
            return run

    with pytest.raises(RuntimeError, match="out of resources") as info:
        runtime.launch(Broken(), 4)
    assert any(runtime.DISABLE_ENV in note for note in info.value.__notes__)


_BEYOND_INT32 = textwrap.dedent("""
    import math, sys, torch
    from maskattn import masks as M
    from maskattn.functional import tensorized_attention_reference
    from maskattn.functional.dman import dynamic_mask_attention_reference
    from maskattn.functional.local import local_attention
    from maskattn.kernels.triton.band import band_triton
    from maskattn.kernels.triton.dman import dman_triton
    from maskattn.kernels.triton.tensorized import tensorized_triton

    # one (1, 3, 4, 16) float32 tensor whose head 2 starts 2**31 + 128 elements after head 0: the storage is
    # reserved, not touched (8 GiB of address space, a few pages of memory)
    H, n, d, stride = 3, 4, 16, 2**30 + 64
    storage = torch.empty(2 * stride + n * d)
    q = storage.as_strided((1, H, n, d), (H * stride, stride, d, 1))
    g = torch.Generator().manual_seed(0)
    for h in range(H):
        q[0, h].copy_(torch.randn(n, d, generator=g))
    dense = q.contiguous()
    k, v, s2t = (torch.randn(1, H, n, d, generator=g) for _ in range(3))
    worst = 0.0
    out, _ = tensorized_triton(q, k, v, s2t, [(math.inf, math.inf)] * H, None, scale="log_sigmoid", dropout_p=0.0)
    ref = tensorized_attention_reference(dense, k, v, s2t, M.full())
    worst = max(worst, (out.double() - ref).abs().max().item())
    a, table, u = torch.randn(1, n, generator=g), torch.randn(5, generator=g), torch.randn(H, generator=g)
    out = dman_triton(q, k, v, a, table, u, causal=False, key_padding_mask=None, q_offset=0, dropout_p=0.0,
                      mask_floor=None)
    ref = dynamic_mask_attention_reference(dense, k, v, a, table, u)[0]
    worst = max(worst, (out.double() - ref).abs().max().item())
    out = band_triton(q, k, v, 1, 1, None, None, None, d ** -0.5, False, 0.0)
    ref = local_attention(dense.double(), k.double(), v.double(), window=3, backend="reference")
    worst = max(worst, (out.double() - ref).abs().max().item())
    print(worst)
    sys.exit(0 if worst < 1e-5 else 1)
""")


def test_offsets_past_two_to_the_31_elements_stay_exact():
    """A batch element of more than 2³¹ elements: the heads' offsets are int64 in every kernel (before, ``h * stride``
    in int32 wrapped and read outside the tensor: a segmentation fault). Run in a subprocess, so a crash is a
    failure, not the end of the test run."""
    env = dict(os.environ, TRITON_INTERPRET="1")
    done = subprocess.run([sys.executable, "-c", _BEYOND_INT32], capture_output=True, text=True, env=env, timeout=600)
    assert done.returncode == 0, (done.returncode, done.stdout[-500:], done.stderr[-2000:])


if runtime.installed():
    import triton
    import triton.language as tl

    from maskattn.kernels.triton.jit_helpers import sigmoid

    @triton.jit
    def _apply_sigmoid(X, Y, size, BLOCK: tl.constexpr):
        i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        tl.store(Y + i, sigmoid(tl.load(X + i, mask=i < size)), mask=i < size)


def _kernel_sigmoid(x: torch.Tensor) -> torch.Tensor:
    """The kernels' sigmoid helper run by Triton on ``x`` (float32, the interpreter on the CPU)."""
    y = torch.empty_like(x)
    _apply_sigmoid[(runtime.cdiv(x.numel(), 1024),)](x, y, x.numel(), BLOCK=1024)
    return y


def _float32_range() -> torch.Tensor:
    """Every float32 exponent from −128 to 128, dense near 0 and in the tails."""
    dense = torch.linspace(-130.0, 100.0, 200_001, dtype=torch.float64)
    tiny = torch.logspace(-30, 2, 2_001, dtype=torch.float64)
    return torch.cat([dense, tiny, -tiny]).float()


def _relative_error(y: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """|y − σ(x)| / σ(x) where σ(x) is a normal float32, divided by ``1 + |x|``: the float32 rounding of ``x·log₂e``
    costs ~|x| ulp of the exponential, as in every GPU exponential (Triton's ``exp`` is the same ``ex2.approx``)."""
    exact = torch.sigmoid(x.double())
    error = (y.double() - exact).abs() / exact / (1 + x.double().abs())
    return error.where(exact > torch.finfo(torch.float32).tiny, torch.zeros((), dtype=torch.float64))


@pytest.mark.skipif(not runtime.interpreted(), reason="runs the helper under Triton's interpreter")
def test_sigmoid_is_accurate_relative_to_its_value_over_the_float32_range():
    """σ(x) = 1 / (1 + 2^(−x·log₂e)), the formula every kernel runs on CUDA and on the CPU: within a few float32 ulp
    of σ per unit of |x| wherever σ is a normal float32 (σ ≥ 1.2e-38, x ≳ −87), also where σ is tiny; 0 or
    denormal below."""
    x = _float32_range()
    y = _kernel_sigmoid(x)
    assert _relative_error(y, x).max() < 3e-7
    assert (y[x < -104] == 0).all() and (y >= 0).all() and (y <= 1).all()


def test_the_hardware_tanh_sigmoid_it_replaces_fails_that_bound():
    """Why the ``tanh.approx`` sigmoid is gone: ``½·tanh(x/2) + ½`` cancels for negative x — with PTX's documented
    absolute error of 2⁻¹¹ for ``tanh.approx.f32`` (and even with an exact float32 tanh) it is 0 from x ≈ −17, so
    a row whose scores are all far negative got a zero denominator and an output of 0 on CUDA. The replacement's
    float32 transcription with ``ex2.approx``'s documented relative error (2⁻²²) perturbing every exponential stays
    within the bound."""
    x = _float32_range()
    tanh = torch.tanh(x / 2)
    old = 0.5 * (tanh + 2**-11 * torch.sign(tanh)).clamp(-1, 1) + 0.5
    assert _relative_error(old, x).max() > 0.01  # 100 % off (σ = 0) where σ is tiny
    assert (0.5 * torch.tanh(torch.tensor(-20.0) / 2) + 0.5) == 0  # even an exact float32 tanh cancels to 0
    for error in (-(2**-22), 2**-22):
        new = 1.0 / (1.0 + torch.exp2(-x * math.log2(math.e)) * (1 + error))
        assert _relative_error(new, x).max() < 3e-7


@pytest.mark.skipif(not runtime.interpreted(), reason="runs the kernel under Triton's interpreter")
def test_mtsa_rows_with_far_negative_scores_keep_their_output():
    """Scores around −40 (σ ≈ 4e-18): the output is the exact ratio, not 0 (the ``tanh.approx`` sigmoid gave 0)."""
    from maskattn import masks as M
    from maskattn.functional import tensorized_attention, tensorized_attention_reference
    g = torch.Generator().manual_seed(0)
    q = torch.randn(1, 2, 20, 8, generator=g)
    k = -q * 40 / q.norm(dim=-1, keepdim=True) ** 2 * math.sqrt(8)  # q_i · k_i · scale = −40 on the diagonal
    k = k + 0.01 * torch.randn(k.shape, generator=g)
    v, s2t = torch.randn(1, 2, 20, 8, generator=g), torch.randn(1, 2, 20, 8, generator=g)
    mask = M.per_head([M.window(0), M.window(0)])  # each query sees its own key only
    out = tensorized_attention(q, k, v, s2t, mask, backend="triton")
    torch.testing.assert_close(out.double(), tensorized_attention_reference(q, k, v, s2t, mask), atol=1e-5,
                               rtol=1e-5)
    assert (out.abs() > 0).float().mean() > 0.99


def _cuda_situation(**changes) -> backends.Situation:
    return replace(backends.Situation("cuda", torch.bfloat16, training=True, band=True, head_bands=True), **changes)


@pytest.mark.parametrize("family", ["tensorized", "dman", "local"])
def test_device_limits_decide_whether_triton_can_run(family):
    """The registry reads the device's compute capability and shared memory (here assumed): below sm_80 or 99 KB
    per block the Triton kernels are unsupported, with the reason; ``auto`` runs another backend."""
    with runtime.assume_target(runtime.TARGETS[86]):
        assert backends.reasons(family, "triton", _cuda_situation()) == []
    for target, words in ((runtime.Target(75, 64 * 1024), "compute capability 8.0"),
                          (runtime.Target(89, 48 * 1024), "99 KB of shared memory")):
        with runtime.assume_target(target):
            reasons = backends.reasons(family, "triton", _cuda_situation())
            assert any(words in r for r in reasons), reasons
            assert backends._auto(backends.FAMILIES[family], _cuda_situation(), installed=True) != "triton"


def test_limits_list_the_device_limits():
    listed = " | ".join(backends.limits("tensorized", "triton"))
    assert "compute capability 8.0" in listed and "shared memory per block" in listed


def test_the_environment_switch_takes_triton_out_of_auto(monkeypatch):
    situation = _cuda_situation()
    with runtime.assume_target(runtime.TARGETS[90]):
        assert backends._auto(backends.FAMILIES["dman"], situation, installed=True) == "triton"
        monkeypatch.setenv(runtime.DISABLE_ENV, "1")
        passed = backends.FAMILIES["dman"].backend("triton").passed_over(situation)
        assert any(runtime.DISABLE_ENV in reason for reason in passed)
        assert backends._auto(backends.FAMILIES["dman"], situation, installed=True) != "triton"
        assert backends.reasons("dman", "triton", situation) == []  # named explicitly, it still runs


@pytest.mark.parametrize("changes, words", [({"dtype": torch.float32}, "float32"),
                                            ({"decoding": True}, "decoding step")])
def test_auto_passes_triton_over_for_float32_and_decoding_steps(changes, words):
    situation = _cuda_situation(**changes)
    with runtime.assume_target(runtime.TARGETS[90]):
        passed = backends.FAMILIES["dman"].backend("triton").passed_over(situation)
        assert any(words in reason for reason in passed), passed
        assert backends._auto(backends.FAMILIES["dman"], situation, installed=True) == "sdpa"


def _attend(family, q, k, v, s2t, kpm, backend):
    from maskattn import masks as M
    from maskattn.functional import tensorized_attention, tensorized_attention_reference
    from maskattn.functional.dman import dynamic_mask_attention, dynamic_mask_attention_reference
    from maskattn.functional.local import local_attention
    if family == "mtsa":
        mask = M.per_head([M.forward_mask(), M.backward_mask()])
        if backend == "reference":
            return tensorized_attention_reference(q, k, v, s2t, mask, key_padding_mask=kpm)
        return tensorized_attention(q, k, v, s2t, mask, key_padding_mask=kpm, backend=backend)
    if family == "dman":
        g = torch.Generator().manual_seed(3)
        a, table = torch.randn(q.shape[0], q.shape[2], generator=g, dtype=q.dtype), torch.randn(7, generator=g).to(q)
        u = torch.zeros(q.shape[1], dtype=q.dtype)
        if backend == "reference":
            return dynamic_mask_attention_reference(q, k, v, a, table, u, key_padding_mask=kpm)[0]
        return dynamic_mask_attention(q, k, v, a, table, u, key_padding_mask=kpm, backend=backend)
    return local_attention(q, k, v, window=5, key_padding_mask=kpm, backend=backend)


def _inputs(B=2, H=2, n=37, d=8):
    g = torch.Generator().manual_seed(0)
    return [torch.randn(B, H, n, d, generator=g, dtype=torch.float64) for _ in range(4)]


@pytest.mark.skipif(not runtime.interpreted(), reason="runs the kernels under Triton's interpreter")
@pytest.mark.parametrize("family", ["mtsa", "dman", "band"])
def test_non_finite_padded_keys_reach_no_output(family):
    """NaN / inf in padded keys (junk under the padding; MTSA: also in their values) reach no output of a real
    position: the outputs match the reference computed with clean padding. (A padded value is multiplied by a zero
    weight in DMAN and the band, as on the reference: a NaN there is NaN on both.)"""
    q, k, v, s2t = _inputs()
    kpm = torch.zeros(2, 37, dtype=torch.bool)
    kpm[1, 30:] = True
    clean = _attend(family, q, k, v, s2t, kpm, "reference")
    k, v = k.clone(), v.clone()
    k[1, :, 30:] = float("nan")
    k[1, :, 33] = float("inf")
    if family == "mtsa":
        v[1, :, 31:] = float("nan")
    out = _attend(family, q, k, v, s2t, kpm, "triton")
    real = ~kpm[:, None, :, None].expand_as(out)
    torch.testing.assert_close(out[real], clean[real], atol=1e-10, rtol=1e-8)


@pytest.mark.skipif(not runtime.interpreted(), reason="runs the kernels under Triton's interpreter")
@pytest.mark.parametrize("family", ["mtsa", "dman", "band"])
def test_non_finite_real_inputs_behave_as_on_the_reference(family):
    """A NaN in a real key and an inf in a real query: the same outputs are non-finite as on the reference backend,
    and the others match it."""
    q, k, v, s2t = _inputs()
    k[0, 0, 5, 2] = float("nan")
    q[1, 1, 20, 0] = float("inf")
    out = _attend(family, q, k, v, s2t, None, "triton")
    ref = _attend(family, q, k, v, s2t, None, "reference")
    assert torch.equal(torch.isfinite(out), torch.isfinite(ref))
    finite = torch.isfinite(ref)
    assert (~finite).any() and finite.any()
    torch.testing.assert_close(out[finite], ref[finite], atol=1e-10, rtol=1e-8)


# --------------------------------------------------------------------------------------------------
# issue 41 §1.1: a launch runs on its tensors' device (and that device's stream), not on the current one
# --------------------------------------------------------------------------------------------------

class _OnSecondGpu(torch.Tensor):
    """A CPU tensor that claims to live on ``cuda:1`` — all a launch reads of its arguments' placement."""

    @property
    def device(self):
        return torch.device("cuda", 1)


def _on_second_gpu(*shape: int) -> torch.Tensor:
    return torch.Tensor._make_subclass(_OnSecondGpu, torch.zeros(*shape))


class _DeviceGuard:
    """Stands for ``torch.cuda.device``: the device made current inside, on a stack (device 0 outside)."""

    current = [torch.device("cuda", 0)]

    def __init__(self, device):
        self.device = torch.device(device)

    def __enter__(self):
        self.current.append(self.device)

    def __exit__(self, *exc):
        self.current.pop()


class _RecordsCurrentDevice:
    """A kernel whose launch notes the CUDA device current when it runs (Triton launches there)."""

    def __init__(self):
        self.ran_on: list[torch.device] = []

    def __getitem__(self, grid):
        return lambda *args, **kwargs: self.ran_on.append(_DeviceGuard.current[-1])


def test_a_launch_runs_on_the_tensors_device_not_the_current_one(monkeypatch):
    """Tensors on ``cuda:1`` while device 0 is current: the launch makes ``cuda:1`` current around the kernel (so
    Triton takes that device and its current stream) and restores device 0 after; the recording mode records the
    same device (docs/design.md §3, "One launch path"). Before, Triton launched on device 0: an illegal address or
    a silently wrong result."""
    monkeypatch.setattr(torch.cuda, "device", _DeviceGuard)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(_DeviceGuard, "current", [torch.device("cuda", 0)])
    q, out = _on_second_gpu(2, 8), _on_second_gpu(2, 8)
    with runtime.recording(runtime.TARGETS[90]) as recorded:
        runtime.launch(_RecordsCurrentDevice(), 4, q, out, 8, 0.5, BLOCK=16)
    assert [launch.device for launch in recorded] == [torch.device("cuda", 1)]
    kernel = _RecordsCurrentDevice()
    runtime.launch(kernel, 4, q, out, 8, 0.5, BLOCK=16)
    assert kernel.ran_on == [torch.device("cuda", 1)]
    assert _DeviceGuard.current == [torch.device("cuda", 0)]  # the caller's device is current again


def test_a_launch_on_cpu_tensors_enters_no_cuda_device(monkeypatch):
    """Under the interpreter (CPU tensors) no CUDA device is touched."""
    monkeypatch.setattr(torch.cuda, "device", lambda device: pytest.fail(f"entered {device}"))
    with runtime.recording(runtime.TARGETS[90]) as recorded:
        runtime.launch(_RecordsCurrentDevice(), 1, torch.zeros(3), 3)
    assert recorded[0].device == torch.device("cpu")


def test_a_launch_with_tensors_on_two_devices_is_refused():
    with pytest.raises(InputError, match="one device.*cuda:1, cpu"):
        runtime.launch(_RecordsCurrentDevice(), 4, _on_second_gpu(3), torch.zeros(3))


# --------------------------------------------------------------------------------------------------
# issue 41 §1.4: float32's tl.dot precision from torch's fp32_precision API (torch >= 2.9)
# --------------------------------------------------------------------------------------------------

_NEW_API = hasattr(torch.backends, "fp32_precision")  # torch >= 2.9


@pytest.fixture
def _default_precision():
    """The process's float32 matmul precision restored to torch's default after the test."""
    yield
    if _NEW_API:
        torch.backends.fp32_precision = "none"
        torch.backends.cuda.matmul.fp32_precision = "none"
    torch.backends.cuda.matmul.allow_tf32 = False
    if _NEW_API:
        torch.backends.cuda.matmul.fp32_precision = "none"


def _float32_precision() -> str:
    x = torch.zeros(1, 1, 2, 16)
    return runtime.launch_constants(x, x)["PRECISION"]


@pytest.mark.skipif(not _NEW_API, reason="torch < 2.9 has no fp32_precision API")
@pytest.mark.parametrize("settings, expected", [
    ({"matmul": "tf32"}, "tf32"), ({"matmul": "ieee"}, "ieee"), ({"global": "tf32"}, "tf32"),
    ({"global": "tf32", "matmul": "ieee"}, "ieee"), ({"global": "ieee"}, "ieee"), ({}, "ieee")])
def test_float32_precision_follows_torchs_fp32_precision_api(_default_precision, settings, expected):
    """``torch.backends.cuda.matmul.fp32_precision`` (and the global ``torch.backends.fp32_precision`` it inherits)
    decide IEEE or TF32 for float32 ``tl.dot``. Before, the launchers read ``allow_tf32``, which raises a
    RuntimeError once the new API set TF32: every float32 Triton call failed."""
    if "global" in settings:
        torch.backends.fp32_precision = settings["global"]
    if "matmul" in settings:
        torch.backends.cuda.matmul.fp32_precision = settings["matmul"]
    assert _float32_precision() == expected
    assert precision.tf32_matmul() is (expected == "tf32")
    half = torch.zeros(1, 1, 2, 16, dtype=torch.float16)
    assert runtime.launch_constants(half, half)["PRECISION"] == "tf32"  # half precision: tensor cores anyway


@pytest.mark.parametrize("flag", [False, True])
def test_float32_precision_reads_the_legacy_flag(_default_precision, monkeypatch, flag):
    """torch before 2.9 (no fp32_precision): ``allow_tf32`` decides; with the new API present, the legacy setter
    (which torch mirrors into it) decides too."""
    torch.backends.cuda.matmul.allow_tf32 = flag
    assert _float32_precision() == ("tf32" if flag else "ieee")
    monkeypatch.setattr(precision, "_new_api", lambda: False)
    assert _float32_precision() == ("tf32" if flag else "ieee")


def test_tf32_matmul_set_sets_what_tf32_matmul_reads(_default_precision):
    for enabled in (True, False):
        with precision.tf32_matmul_set(enabled):
            assert precision.tf32_matmul() is enabled
            assert _float32_precision() == ("tf32" if enabled else "ieee")
    assert precision.tf32_matmul() is False

"""The kernels' special-function helpers (``jit_helpers.log2_mufu``, ``reciprocal_mufu``, ``sigmoid_log2_rcp``):
compiled for sm_90 without a GPU, they are one ``MUFU.LG2`` / ``MUFU.RCP`` each (not libdevice's ~20-instruction
``log2f`` nor a division's refinement); on a CUDA GPU, their error against float64 is within the bounds
docs/gpu/offline-perf.md states — |log₂ error| ≤ 2⁻²² on [1, 2], relative reciprocal error ≤ 2⁻²², sigmoid relative
error ≤ 2⁻²⁰ over ±60. Under the interpreter they are the exact operations (the other kernel tests' float64 parity)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
import torch

from _triton_device import DEVICE, cuda_only
from maskattn.kernels.triton import runtime

triton = pytest.importorskip("triton")
tl = pytest.importorskip("triton.language")
jh = runtime.load("jit_helpers")

_KERNEL = textwrap.dedent("""
    import collections, json, sys, torch, triton, triton.language as tl
    from maskattn.kernels.triton import runtime
    jit = runtime.load("jit_helpers")
    from maskattn.kernels.triton.offline import sass

    @triton.jit
    def helpers(X, LOG, RCP, SIG, n, BLOCK: tl.constexpr):
        i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        x = tl.load(X + i, mask=i < n, other=1.0)
        tl.store(LOG + i, jit.log2_mufu(x), mask=i < n)
        tl.store(RCP + i, jit.reciprocal_mufu(x), mask=i < n)
        tl.store(SIG + i, jit.sigmoid_log2_rcp(x), mask=i < n)

    if sys.argv[1] == "compile":
        x = torch.empty(1024)
        launch = runtime.Launch(helpers, (8,), (x, x, x, x, 1024), dict(BLOCK=128, num_warps=4))
        cubin = sass.compile_launch(launch, 90)[0]
        text, _ = sass.disassemble(cubin)
        ops = collections.Counter(i.opcode for i in sass.parse_sass(text))
        print("OPS " + json.dumps(ops))
    else:
        x = torch.cat([torch.linspace(1.0, 2.0, 1 << 16), torch.linspace(-60.0, 60.0, 1 << 16)]).cuda()
        out = [torch.empty_like(x) for _ in range(3)]
        helpers[(triton.cdiv(x.numel(), 1024),)](x, *out, x.numel(), BLOCK=1024)
        xd = x.double()
        unit = (xd >= 1) & (xd <= 2)
        log_err = (out[0].double() - torch.log2(xd))[unit].abs().max().item()
        rcp_err = ((out[1].double() * xd - 1)[xd.abs() >= 1]).abs().max().item()
        sig = torch.sigmoid(xd / 1.4426950408889634)
        sig_err = ((out[2].double() - sig) / sig).abs().max().item()
        print("ERR " + json.dumps([log_err, rcp_err, sig_err]))
""")


def _run(mode: str, folder) -> str:
    script = folder / "helpers.py"  # Triton reads a @jit function's source from its file
    script.write_text(_KERNEL)
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    done = subprocess.run([sys.executable, str(script), mode], capture_output=True, text=True, env=env, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return next(line for line in done.stdout.splitlines() if line[:4] in ("OPS ", "ERR "))[4:]


def test_the_helpers_compile_to_one_special_function_instruction_each(tmp_path):
    import json
    ops = json.loads(_run("compile", tmp_path))
    mufu = {op: n for op, n in ops.items() if op.startswith("MUFU")}
    # log2_mufu → LG2; reciprocal_mufu and the sigmoid's reciprocal → RCP; the sigmoid's 2^(−|x|) → EX2
    assert set(mufu) == {"MUFU.LG2", "MUFU.RCP", "MUFU.EX2"}, ops
    assert sum(ops.values()) < 120, ops  # libdevice's log2f alone would add ~20 instructions per value


@cuda_only
def test_the_helpers_errors_are_within_the_stated_bounds(tmp_path):
    import json
    log_err, rcp_err, sig_err = json.loads(_run("measure", tmp_path))
    assert log_err <= 2.0 ** -22 and rcp_err <= 2.0 ** -22 and sig_err <= 2.0 ** -20, (log_err, rcp_err, sig_err)


@triton.jit
def _exact(X, LOG, RCP, BLOCK: tl.constexpr):
    i = tl.arange(0, BLOCK)
    v = tl.load(X + i)
    tl.store(LOG + i, jh.log2_mufu(v))
    tl.store(RCP + i, jh.reciprocal_mufu(v))


def test_under_the_interpreter_the_helpers_are_exact():
    """The interpreter takes the exact operations (the float64 parity of every kernel test rests on it)."""
    if not runtime.interpreted() or DEVICE != "cpu":
        pytest.skip("runs under Triton's interpreter")
    assert jh.INTERPRETED
    x = torch.linspace(1.0, 2.0, 64, dtype=torch.float64)
    log, rcp = torch.empty_like(x), torch.empty_like(x)
    _exact[(1,)](x, log, rcp, BLOCK=64)
    torch.testing.assert_close(log, torch.log2(x), rtol=0, atol=1e-15)
    torch.testing.assert_close(rcp, 1 / x, rtol=1e-15, atol=0)
